"""One DSA attention decode layer as a Flax NNX module (DeepSeek's absorbed form).

The math, the weight names and the tensor-parallel slicing are those of
:mod:`kernels.layer_reference` (whose module docstring writes the whole step out); this module
runs it with the project's JAX ops: ``indexer_topk`` and ``sparse_mla_decode`` (Pallas kernels
lowered through Triton, or plain XLA, ``path``) and the new tokens' cache writes as one fused
quantize + scatter per cache (:func:`write_new_tokens`: the Pallas kernel
``kernels/cache_write/pallas.py``, or one XLA scatter). Functional: the updated caches are
returned; :class:`DecodeStep` runs the whole step under one ``jax.jit`` with both caches donated,
so they are updated in place.

Sources: deepseek-ai/DeepSeek-V3.2-Exp ``inference/model.py`` (``MLA.forward`` decode branch,
``Indexer.forward``), ``inference/kernel.py`` (``act_quant``); V4-Flash assumptions are listed in
``kernels.layer_reference.DSV4_FLASH_LAYER``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_impl import formats as jformats
from jax_impl._common import JAX_PATHS, check_int, reject_torch
from jax_impl.indexer import indexer_topk
from jax_impl.sparse_mla import sparse_mla_decode
from jax_impl.step import window_split
from kernels import formats as np_formats
from kernels.ops import BACKEND_PATHS
from kernels import layer_reference as lref

__all__ = ["DSADecodeLayer", "DecodeStep", "new_token_targets", "write_new_tokens"]

_FLOAT = (jnp.float32, jnp.float16, jnp.bfloat16)
_ROPE_SPLIT = 1024


@functools.lru_cache(maxsize=8)
def _rope_tables(cfg: lref.LayerConfig):
    """cos / sin tables for ``pos = hi * 1024 + lo`` (float64 angles, stored float32): each
    ``[n, d_rope / 2]``. Angle addition keeps the error ~1e-7 at any position, where a float32
    ``pos * freq`` would be ~1e-5 rad off at 1M positions."""
    f = lref.rope_freqs(cfg)
    lo = np.arange(_ROPE_SPLIT, dtype=np.float64)[:, None] * f
    hi = np.arange(cfg.preset.max_context // _ROPE_SPLIT + 2, dtype=np.float64)[:, None] * (_ROPE_SPLIT * f)
    return tuple(np.asarray(t, np.float32) for t in (np.cos(lo), np.sin(lo), np.cos(hi), np.sin(hi)))


def _cos_sin(cfg, pos):
    clo, slo, chi, shi = (jnp.asarray(t) for t in _rope_tables(cfg))
    lo, hi = pos % _ROPE_SPLIT, pos // _ROPE_SPLIT
    a_c, a_s, b_c, b_s = chi[hi], shi[hi], clo[lo], slo[lo]
    return a_c * b_c - a_s * b_s, a_s * b_c + a_c * b_s


def _rope(x, cos, sin, interleaved: bool):
    d = x.shape[-1]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : d // 2], x[..., d // 2:]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if interleaved:
        return jnp.stack([ra, rb], axis=-1).reshape(x.shape)
    return jnp.concatenate([ra, rb], axis=-1)


ROPE_LANES_ENV = "DSA_JAX_LAYER_ROPE_LANES"


def rope_lanes_on() -> bool:
    """``DSA_JAX_LAYER_ROPE_LANES`` read once (when a layer is built): the step's rotary
    embeddings over whole rows (:func:`_rope_lanes`, default) or, with ``0`` (the bench's A/B),
    on the rope slice, concatenated back with the rest of the row. The same operations either way
    (bit for bit op by op; under ``jit`` up to XLA's FMA contraction); the first form has no
    ``concatenate`` for XLA to make a kernel of.

    Raises:
      ValueError: the variable holds anything but ``0``, ``1`` or nothing (named)."""
    from kernels.scalars import env_switch
    return env_switch(ROPE_LANES_ENV) is not False


def _rope_lanes(x, cos, sin, *, interleaved: bool, at_end: bool):
    """``x`` ``[..., D]`` with :func:`_rope` applied to its ``r = 2 * cos.shape[-1]`` rope lanes
    (the last r with ``at_end``, else the first r) and the other lanes unchanged, computed over
    the whole row without slicing and concatenating: each lane's rotation partner comes from a
    reshape and a reverse (``interleaved``: the pair ``2i, 2i + 1``; else the halves of the rope
    lanes, ``j`` and ``j + r / 2``), the per-lane cos / sign-folded sin from a repeat and a pad,
    and a select keeps the other lanes. The same float32 operations as :func:`_rope` lane for
    lane (``a cos - b sin`` is ``a cos + b (-sin)``, and ``a sin + b cos`` is summed in the other
    order, both exact rewrites): the same bits op by op. Under ``jit`` XLA may contract a
    multiply and an add into one FMA in either form, differently (~1 ulp of float32 apart on
    XLA:CPU, tested), as it may for any fusion.

    Why: at B 1 the JAX step's kernels idle ~1.5 us at each boundary (bench/NOTES.md, thirtieth
    session), and each ``concatenate`` became a kernel of its own (XLA's
    ``input_concatenate_fusion``, ~2 us each at B 1); an elementwise select can join the
    fusion of its producer or consumer."""
    D, h = x.shape[-1], cos.shape[-1]
    r = 2 * h
    lead = x.shape[:-1]
    if interleaved:
        partner = x.reshape(*lead, D // 2, 2)[..., ::-1].reshape(x.shape)
        c, s = jnp.repeat(cos, 2, axis=-1), jnp.repeat(sin, 2, axis=-1)
        sign = jnp.tile(jnp.asarray([-1.0, 1.0], jnp.float32), h)
    else:
        if D % r:
            raise ValueError(f"x: the last dim ({D}) must be a multiple of the rope dims ({r})")
        partner = x.reshape(*lead, D // r, 2, h)[..., ::-1, :].reshape(x.shape)
        c, s = jnp.tile(cos, 2), jnp.tile(sin, 2)
        sign = jnp.repeat(jnp.asarray([-1.0, 1.0], jnp.float32), h)
    pad = [(0, 0)] * (c.ndim - 1) + [(D - r, 0) if at_end else (0, D - r)]
    c, s = jnp.pad(c, pad), jnp.pad(s * sign, pad)
    lane = jnp.arange(D)
    rope = (lane >= D - r) if at_end else (lane < r)
    return jnp.where(rope, x * c + partner * s, x)


def _rmsnorm(x, w, eps):
    x = x.astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def _layernorm(x, w, b, eps):
    x = x.astype(jnp.float32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * w + b


def _host(a):
    """``a`` as a NumPy array, or None when it is traced (inside jit: values unknown)."""
    try:
        return np.asarray(a)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def new_token_targets(block_table, context_lens, N: int, page_size: int, num_pages: int):
    """Where the N new tokens of each request go (traceable; the twin of
    ``torch_impl.layer.new_token_targets``): token i of request b at ``pos = L_b - N + i``, page
    entry ``block_table[b, pos // P]``, offset ``pos % P``; mapped when
    ``0 <= pos < max_pages * P`` and the entry is in ``[0, num_pages)``.

    Returns ``(pos, page, off, ok)``, each ``[B, N]`` (int32 x 3, bool). Nothing is multiplied by
    a page entry, so no int32 product can wrap; ``L_b - N + i`` is formed so that ``L_b`` near
    INT32_MIN stays negative.
    """
    P, max_pages = page_size, block_table.shape[1]
    lens = context_lens[:, None]
    pos = lens - N + jnp.arange(N, dtype=jnp.int32)[None]                          # [B, N]
    pos = jnp.where(lens < jnp.int32(np.iinfo(np.int32).min + N), -1, pos)
    page_idx = jnp.clip(pos // P, 0, max_pages - 1)
    page = jnp.take_along_axis(block_table, page_idx, axis=1)
    ok = (pos >= 0) & (pos < max_pages * P) & (page >= 0) & (page < num_pages)
    return pos, page, pos % P, ok


def _xla_cache_write(src, cache, block_table, context_lens, N, fmt, page_size, scale_fmt):
    """One XLA scatter per cache (``mode="drop"``): the token's encoded bytes / elements (the
    ``jax_impl.formats`` writers) to their columns of the page, an unmapped token's page index set
    to ``num_pages`` (out of bounds, dropped). Caches are addressed ``[page, column]``, so no
    index is a flat product that could overflow int32."""
    P, num_pages = page_size, cache.shape[0]
    _, page, off, ok = new_token_targets(block_table, context_lens, N, P, num_pages)
    T, D = src.shape
    page, off = jnp.where(ok, page, num_pages).reshape(T), off.reshape(T)
    x = src.astype(jnp.float32)

    def cols(start, width):
        return start[:, None] + jnp.arange(width, dtype=jnp.int32)

    if fmt == "latent":
        rows, c = src.astype(cache.dtype), cols(off * D, D)
    elif fmt == "fp8_ds_mla":
        rows, c = jformats.quantize_fp8_ds_mla(x), cols(off * np_formats.DS_MLA_BYTES, np_formats.DS_MLA_BYTES)
    elif fmt == "fp8_model1":
        rows = jformats.quantize_fp8_model1(x[:, None])[:, :np_formats.MODEL1_TOKEN_BYTES]     # [T, 584]
        c = jnp.concatenate([cols(off * 576, 576), cols(P * 576 + off * 8, 8)], axis=1)
    else:
        rows = jformats.quantize_fp8_indexer(x[:, None], scale_fmt)                         # [T, D + 4]
        c = jnp.concatenate([cols(off * D, D), cols(P * D + 4 * off, 4)], axis=1)
    flat = cache.reshape(num_pages, -1)
    return flat.at[page[:, None], c].set(rows, mode="drop").reshape(cache.shape)


def _pallas_cache_write(src, cache, block_table, context_lens, N, fmt, page_size, scale_fmt):
    """One Pallas kernel (``kernels.cache_write.pallas``), the cache aliased to its output."""
    from jax_impl._common import device_info, require_32bit_indices
    from kernels.cache_write import pallas as pcw
    require_32bit_indices("cache_write")
    device_info()                                          # NotImplementedError off NVIDIA GPUs
    if fmt == "fp8_indexer" and src.shape[1] & (src.shape[1] - 1):
        raise NotImplementedError(f"cache_write: pallas path: D_I must be a power of two, got {src.shape[1]}")
    flat = cache.reshape(cache.shape[0], -1)
    out = pcw.launch_cache_write(src, flat, block_table, context_lens, N, fmt, page_size=page_size,
                                 scale_fmt=scale_fmt)
    return out.reshape(cache.shape)


_WRITE_FORMATS = ("latent", "fp8_ds_mla", "fp8_model1", "fp8_indexer")


def write_new_tokens(src, cache, block_table, context_lens, N: int, fmt: str, *, page_size: int,
                     scale_fmt: str | None = "ue8m0", path: str = "auto"):
    """The N new tokens' rows of each request quantized into ``cache``; returns the new cache.

    Functional (the JAX twin of ``torch_impl.layer.write_new_tokens``): inside a ``jax.jit`` that
    donates ``cache`` the update happens in the donated buffer (the Pallas kernel aliases its
    output to the cache input; XLA's scatter updates in place), so the cache is not copied.
    Token ``t = b * N + i`` goes to position ``L_b - N + i`` of request b; an unmapped token is
    dropped (no byte of the cache changes for it; docs/SEMANTICS.md). Bytes: the NumPy writers of
    ``kernels/formats.py`` (docs/SPEC.md "Cache layouts").

    Args:
      src: ``[B * N, D]`` float: latent rows (D = D_qk) or indexer keys (D = D_I).
      cache: ``"latent"`` ``[num_pages, P, D]`` float; ``"fp8_ds_mla"`` uint8
        ``[num_pages, P, 656]``; ``"fp8_model1"`` uint8 ``[num_pages, model1_page_bytes(P)]``;
        ``"fp8_indexer"`` uint8 ``[num_pages, P * (D + 4)]``.
      block_table: int32 ``[B, max_pages]``; context_lens: int32 ``[B]`` (L_b, counting the N
        new tokens); N: new tokens per request; page_size: P.
      scale_fmt: indexer scale, ``"ue8m0"`` or None (``amax / 448``).
      path: ``"auto"`` (Pallas, else XLA), ``"pallas"`` or ``"xla"``.
    Returns:
      the updated cache (same shape and dtype).
    Raises:
      TypeError / ValueError: bad dtype, shape, ``fmt`` or ``path`` (named).
      NotImplementedError: ``path="pallas"`` where it cannot run (not an NVIDIA GPU or the CPU
        interpreter; ``jax_enable_x64``).
    """
    from jax_impl._common import check_array, run_path
    if fmt not in _WRITE_FORMATS:
        raise ValueError(f"fmt: expected one of {_WRITE_FORMATS}, got {fmt!r}")
    if path not in JAX_PATHS:
        raise ValueError(f"path: expected one of {JAX_PATHS}, got {path!r}")
    check_array("src", src, ndim=2, dtypes=_FLOAT)
    check_array("block_table", block_table, ndim=2, dtypes=(jnp.int32,))
    check_array("context_lens", context_lens, shape=(block_table.shape[0],), dtypes=(jnp.int32,))
    if src.shape[0] != block_table.shape[0] * N:
        raise ValueError(f"src: expected [B * N = {block_table.shape[0] * N}, D], got {tuple(src.shape)}")
    check_array("cache", cache)
    D, P, n = src.shape[1], int(page_size), (cache.shape[0] if cache.ndim else 0)
    u8 = jnp.dtype(cache.dtype) == jnp.uint8
    want = np_formats.cache_shape(fmt, n, P, D)
    dtype_ok = {"latent": jnp.issubdtype(cache.dtype, jnp.floating), "fp8_ds_mla": u8 and D == 576,
                "fp8_model1": u8 and D == 512, "fp8_indexer": u8}[fmt]
    if tuple(cache.shape) != want or not dtype_ok:
        raise ValueError(f"cache: expected {'float' if fmt == 'latent' else 'uint8'} [num_pages, "
                         f"{', '.join(str(w) for w in want[1:])}] ({fmt!r}, P = {P}, D = {D}), got "
                         f"{jnp.dtype(cache.dtype).name} {tuple(cache.shape)}")
    args = (src, cache, block_table, context_lens, int(N), fmt, int(page_size), scale_fmt)
    impls = {"pallas": lambda: _pallas_cache_write(*args), "xla": lambda: _xla_cache_write(*args)}
    return run_path("cache_write", path, impls, BACKEND_PATHS["jax"])


class DSADecodeLayer(nnx.Module):
    """DeepSeek sparse-attention decode layer (V3.2 MLA or V4-Flash), one tensor-parallel rank.

    Args:
      cfg: :class:`kernels.layer_reference.LayerConfig` (``DSV32_LAYER``, ``DSV4_FLASH_LAYER`` or a
        ``scaled_down()`` variant).
      weights: full (unsharded) weights ``{name: array}``, DeepSeek ``inference/model.py`` names,
        ``[out, in]`` layout (:func:`kernels.layer_reference.weight_shapes`); None draws
        :func:`kernels.layer_reference.init_weights` (``seed``). :meth:`from_checkpoint` loads
        DeepSeek's safetensors checkpoint.
      tp_rank, tp_size: heads split over ranks (column-parallel ``wq_b`` / ``wkv_b`` / V4
        ``wo_a``, row-parallel ``wo`` / V4 ``wo_b``; indexer and latent projections replicated).
        With ``tp_size > 1`` the call returns this rank's partial output (sum = TP=1).
      kv_format: ``"latent"``, ``"fp8_ds_mla"`` (V3.2) or ``"fp8_model1"`` (V4); default
        ``cfg.kv_format``.
      dtype: activation / linear-weight dtype (float32, float16, bfloat16); norms, rope, indexer
        weights and softmax statistics stay float32.
      path: op path, ``"auto"``, ``"pallas"`` or ``"xla"``.
      seed: the seed of the random weights drawn when ``weights`` is None: an int >= 0 (a
        Python int or NumPy integer scalar, not a bool).
    Raises:
      TypeError: ``cfg`` not a LayerConfig, ``dtype`` not a float dtype, ``weights`` not a mapping
        (or None), a weight that is not a real float array (``weights['name']``); ``seed`` not
        an int.
      ValueError: bad ``tp_size`` / ``tp_rank``, ``kv_format`` or ``path``; a weight missing or
        of the wrong shape (``weights['name']: expected shape ..., got ...``); ``seed`` < 0;
        ``DSA_JAX_LAYER_ROPE_LANES`` set to something but ``0`` / ``1`` (:func:`rope_lanes_on`,
        read here, once).
    """

    def __init__(self, cfg: lref.LayerConfig, weights: dict | None = None, *, tp_rank: int = 0,
                 tp_size: int = 1, kv_format: str | None = None, dtype=jnp.float32,
                 path: str = "auto", seed: int = 0):
        if not isinstance(cfg, lref.LayerConfig):
            raise TypeError(f"cfg: expected a kernels.layer_reference.LayerConfig, got {type(cfg).__name__}")
        kv_format = kv_format or cfg.kv_format
        if kv_format not in np_formats.KV_FORMATS:
            raise ValueError(f"kv_format: expected one of {np_formats.KV_FORMATS}, got {kv_format!r}")
        if kv_format == "fp8_ds_mla" and cfg.d_qk != 576 or kv_format == "fp8_model1" and cfg.d_qk != 512:
            raise ValueError(f"kv_format: {kv_format!r} does not hold D_qk = {cfg.d_qk} ({cfg.name})")
        if jnp.dtype(dtype) not in [jnp.dtype(d) for d in _FLOAT]:
            raise TypeError(f"dtype: expected float32, float16 or bfloat16, got {dtype}")
        if path not in JAX_PATHS:
            raise ValueError(f"path: expected one of {JAX_PATHS}, got {path!r}")
        seed = check_int("seed", seed, minimum=0)
        self.cfg, self.kv_format, self.dtype, self.path = cfg, kv_format, jnp.dtype(dtype), path
        self.rope_lanes = rope_lanes_on()            # DSA_JAX_LAYER_ROPE_LANES, read now
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.local_heads = cfg.heads_per_rank(tp_size)
        weights = lref.init_weights(cfg, seed) if weights is None else lref.float32_weights(cfg, weights)
        shard = lref.shard_weights(cfg, weights, tp_rank, tp_size)
        # the three projections of x (q_lora, latent, indexer key) as one weight, one dot: rows
        # [wq_a; wkv_a (V4: wkv); indexer.wk]; w(name) of each is a row slice (torch_impl.layer
        # does the same)
        x_names = ("wq_a", "wkv_a" if cfg.absorbed else "wkv", "indexer.wk")
        rows, start = [], 0                      # a tuple of pairs: static and hashable under jit
        for name in x_names:
            rows.append((name, (start, start + shard[name].shape[0])))
            start += shard[name].shape[0]
        self._x_rows = tuple(rows)
        self.x_proj = nnx.Param(jnp.asarray(np.concatenate([shard[n] for n in x_names]), self.dtype))
        for name, arr in shard.items():
            if name in x_names:
                continue
            if name == "wkv_b" and cfg.absorbed:
                # its key and value halves as two parameters: the absorbed q and the value
                # up-projection each read one half, and a slice of one [H, nope + v, C] array
                # would be copied (an XLA slice fusion of both halves, every step) before the
                # batched dots
                kb = np.asarray(arr).reshape(self.local_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, -1)
                self.wkv_b_k = nnx.Param(jnp.asarray(kb[:, :cfg.qk_nope_head_dim], self.dtype))
                self.wkv_b_v = nnx.Param(jnp.asarray(kb[:, cfg.qk_nope_head_dim:], self.dtype))
                continue
            keep_f32 = "norm" in name or name in ("attn_sink", "indexer.weights_proj")
            setattr(self, name.replace(".", "_"),
                    nnx.Param(jnp.asarray(arr, jnp.float32 if keep_f32 else self.dtype)))

    def w(self, name: str) -> jax.Array:
        """This rank's weight ``name`` (DeepSeek naming, e.g. ``"wkv_b"``, ``"indexer.wk"``): a
        row slice of the fused ``x_proj`` for ``wq_a``, ``wkv_a`` / ``wkv`` and ``indexer.wk``;
        ``wkv_b`` (absorbed presets) re-assembled from its stored key / value halves."""
        for n, (a, b) in self._x_rows:
            if n == name:
                return self.x_proj[a:b]
        if name == "wkv_b" and self.cfg.absorbed:       # stored as its two halves
            kb = jnp.concatenate([self.wkv_b_k[...], self.wkv_b_v[...]], axis=1)
            return kb.reshape(-1, kb.shape[-1])
        return getattr(self, name.replace(".", "_"))[...]

    @classmethod
    def from_checkpoint(cls, checkpoint_path, layer_idx: int, cfg: lref.LayerConfig, **kwargs) -> "DSADecodeLayer":
        """Build the layer from a DeepSeek safetensors checkpoint (file or directory; FP8 e4m3
        weights with 128 x 128 ``weight_scale_inv`` blocks are dequantized)."""
        from kernels import checkpoint
        return cls(cfg, checkpoint.load_layer_weights(checkpoint_path, layer_idx, cfg), **kwargs)

    def _validate(self, x, kv_cache, k_cache, block_table, context_lens):
        """Types, dtypes, shapes and layouts (static: works on tracers)."""
        cfg = self.cfg
        # a torch.Tensor first (it has .shape and .dtype too, but JAX cannot read its dtype):
        # the ops' own named TypeError instead of one from inside JAX
        for name, t in (("x", x), ("kv_cache", kv_cache), ("k_cache", k_cache),
                        ("block_table", block_table), ("context_lens", context_lens)):
            reject_torch(name, t)
        if not hasattr(x, "shape") or not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"x: expected a floating-point jax.Array, got {getattr(x, 'dtype', type(x).__name__)}")
        if x.ndim != 3 or x.shape[-1] != cfg.hidden or min(x.shape) < 1:
            raise ValueError(f"x: expected shape [B, N, {cfg.hidden}], got {tuple(x.shape)}")
        B = x.shape[0]
        for name, t in (("block_table", block_table), ("context_lens", context_lens)):
            if not hasattr(t, "dtype") or jnp.dtype(t.dtype) != jnp.int32:
                raise TypeError(f"{name}: expected an int32 array, got {getattr(t, 'dtype', type(t).__name__)}")
        if block_table.ndim != 2 or block_table.shape[0] != B or block_table.shape[1] < 1:
            raise ValueError(f"block_table: expected shape [{B}, max_pages >= 1], got {tuple(block_table.shape)}")
        if tuple(context_lens.shape) != (B,):
            raise ValueError(f"context_lens: expected shape [{B}], got {tuple(context_lens.shape)}")
        for name, t in (("kv_cache", kv_cache), ("k_cache", k_cache)):
            if not hasattr(t, "shape") or not hasattr(t, "dtype"):
                raise TypeError(f"{name}: expected a jax.Array, got {type(t).__name__}")
        want = lref.kv_cache_shape(cfg, self.kv_format, kv_cache.shape[0] if kv_cache.ndim else 0)
        fmt_ok = (jnp.issubdtype(kv_cache.dtype, jnp.floating) if self.kv_format == "latent"
                  else jnp.dtype(kv_cache.dtype) == jnp.uint8)
        if tuple(kv_cache.shape) != want or not fmt_ok:
            raise ValueError(f"kv_cache: expected {'float' if self.kv_format == 'latent' else 'uint8'} "
                             f"{list(want)} ({self.kv_format!r}, P = cfg.page_size), got "
                             f"{jnp.dtype(kv_cache.dtype).name} {tuple(kv_cache.shape)}")
        if kv_cache.shape[0] < 1:
            raise ValueError(f"kv_cache: expected num_pages >= 1, got shape {tuple(kv_cache.shape)}")
        if (jnp.dtype(k_cache.dtype) != jnp.uint8 or k_cache.ndim != 2
                or k_cache.shape[1] != cfg.page_size * (cfg.index_head_dim + 4)):
            raise ValueError(f"k_cache: expected uint8 [num_pages, {cfg.page_size * (cfg.index_head_dim + 4)}] "
                             f"('fp8_indexer', P = cfg.page_size), got {jnp.dtype(k_cache.dtype).name} "
                             f"{tuple(k_cache.shape)}")
        if k_cache.shape[0] != kv_cache.shape[0]:
            raise ValueError(f"k_cache: expected num_pages = {kv_cache.shape[0]} (kv_cache's; the two "
                             f"caches share block_table), got {k_cache.shape[0]}")

    def _new_tokens(self, block_table, context_lens, N, num_pages):
        """Positions, pages and in-page offsets of the N new tokens, and which of them are mapped.

        Returns ``(pos, page, off, ok)``, each ``[B, N]`` (int32 x 3, bool): token i of request b
        sits at ``pos = L_b - N + i``, in page ``block_table[b, pos // P]`` at offset ``pos % P``;
        ``ok`` is ``0 <= pos < max_pages * P`` and ``0 <= page < num_pages``. With concrete inputs
        every token must be mapped (ValueError naming context_lens or block_table); traced (inside
        jit) nothing can raise on values and :meth:`_write_caches` drops unmapped tokens' writes.
        The concrete check reads ``ok`` (``[B, N]`` bool) back to the host.
        Nothing is multiplied by a page entry, so no int32 product can wrap.
        """
        P, max_pages = self.cfg.page_size, block_table.shape[1]
        pos = context_lens[:, None] - N + jnp.arange(N, dtype=jnp.int32)[None]           # [B, N]
        page_idx = jnp.clip(pos // P, 0, max_pages - 1)
        page = jnp.take_along_axis(block_table, page_idx, axis=1)
        ok = (pos >= 0) & (pos < max_pages * P) & (page >= 0) & (page < num_pages)
        host_ok = _host(ok)
        if host_ok is not None and not host_ok.all():
            lens = np.asarray(context_lens, np.int64)
            bad_len = np.flatnonzero((lens < N) | (lens > max_pages * P))
            if bad_len.size:
                b = int(bad_len[0])
                raise ValueError(f"context_lens: expected every L_b in [N, max_pages * P] = [{N}, "
                                 f"{max_pages * P}] (L_b counts the N new tokens), got {lens[b]} "
                                 f"for request {b}")
            b, i = (int(v) for v in np.argwhere(~host_ok)[0])
            j, e, p = (int(np.asarray(a)[b, i]) for a in (page_idx, page, pos))
            raise ValueError(f"block_table: expected page entries in [0, num_pages) = [0, {num_pages}) "
                             f"for every new token's page, got {e} at block_table[{b}, {j}] (new token "
                             f"{i} of request {b} at position {p}; allocate the pages before the step)")
        return pos, page, pos % P, ok

    def _write_caches(self, kv_cache, k_cache, latent, ik, block_table, context_lens, N):
        """Functional cache write of the new tokens' rows: one fused quantize + scatter per cache
        (:func:`write_new_tokens`); an unmapped token's write is dropped."""
        T, P = latent.shape[0] * latent.shape[1], self.cfg.page_size
        kv_cache = write_new_tokens(latent.reshape(T, -1), kv_cache, block_table, context_lens, N,
                                    self.kv_format, page_size=P, scale_fmt=None, path=self.path)
        k_cache = write_new_tokens(ik.reshape(T, -1), k_cache, block_table, context_lens, N,
                                   "fp8_indexer", page_size=P, scale_fmt=self.cfg.scale_fmt, path=self.path)
        return kv_cache, k_cache

    def __call__(self, x, kv_cache, k_cache, block_table, context_lens, *,
                 return_intermediates: bool = False):
        """One decode step (see :meth:`forward`). float32 layers run their matmuls at
        ``"highest"`` precision (no TF32 on GPUs), so float32 means float32 as in the torch layer."""
        prec = "highest" if self.dtype == jnp.dtype(jnp.float32) else "default"
        with jax.default_matmul_precision(prec):
            return self.forward(x, kv_cache, k_cache, block_table, context_lens,
                                return_intermediates=return_intermediates)

    def forward(self, x, kv_cache, k_cache, block_table, context_lens, *,
                return_intermediates: bool = False):
        """One decode step: project the N new tokens, write them into both caches, select
        top-k positions with the indexer, attend, project out.

        Args:
          x: ``[B, N, hidden]`` float, the new tokens' hidden states (N > 1: MTP drafts).
          kv_cache: latent cache in ``self.kv_format`` (SPEC layouts 1-3).
          k_cache: indexer K cache, ``fp8_indexer`` uint8 ``[num_pages, P * (D_I + 4)]``.
          block_table: int32 ``[B, max_pages]`` shared by both caches (P = ``cfg.page_size``).
          context_lens: int32 ``[B]``, L_b counting the N new tokens, in ``[N, max_pages * P]``;
            token i sits at position ``L_b - N + i``, whose page entry must be in
            ``[0, num_pages)``.
          return_intermediates: also return a dict (``q``, ``idx_q``, ``idx_weights``,
            ``indices``, ``idx_context_lens``, ``attn``, ``lse``).
        Returns:
          ``(out, kv_cache, k_cache)``: out ``[B, N, hidden]`` in ``self.dtype`` (this rank's
          row-parallel partial when ``tp_size > 1``) and the updated caches.
        Raises:
          TypeError: an argument of the wrong type or dtype (named: an argument that is not a
            jax.Array or NumPy array, e.g. a torch.Tensor; ``x`` not a float array,
            ``block_table`` / ``context_lens`` not int32).
          ValueError: a wrong shape or layout (named); ``k_cache`` with another page count than
            ``kv_cache``; ``context_lens`` outside ``[N, max_pages * P]``; a new token's page
            entry outside ``[0, num_pages)`` (``block_table``). The last two are value checks,
            made when ``context_lens`` and ``block_table`` are concrete; traced (inside
            ``jax.jit`` / ``nnx.jit``) they cannot run, and an unmapped new token's write is
            then dropped (neither cache changes for it) while the step still runs.
          NotImplementedError: a named ``path`` that cannot run.
        """
        self._validate(x, kv_cache, k_cache, block_table, context_lens)
        cfg, dt = self.cfg, self.dtype
        B, N, _ = x.shape
        r, D_I, H_I, P = cfg.d_rope, cfg.index_head_dim, cfg.index_heads, cfg.page_size
        x = x.astype(dt)
        pos, page, off, ok = self._new_tokens(block_table, context_lens, N, kv_cache.shape[0])
        cos, sin = _cos_sin(cfg, jnp.maximum(pos, 0))
        cos_h, sin_h = cos[:, :, None], sin[:, :, None]

        xp = x @ self.x_proj[...].T              # the three projections of x in one dot
        (a_q, b_q), (a_kv, b_kv), (a_k, b_k) = (ab for _, ab in self._x_rows)
        xq, xkv, xk = xp[..., a_q:b_q], xp[..., a_kv:b_kv], xp[..., a_k:b_k]
        qr = _rmsnorm(xq, self.w("q_norm"), cfg.eps).astype(dt)
        Hl = self.local_heads
        if cfg.absorbed:
            nope, C = cfg.qk_nope_head_dim, cfg.kv_lora_rank
            q = (qr @ self.w("wq_b").T).reshape(B, N, Hl, nope + r)
            q_pe = _rope(q[..., nope:].astype(jnp.float32), cos_h, sin_h, True)
            q_lat = jnp.einsum("bnhd,hdc->bnhc", q[..., :nope], self.wkv_b_k[...])
            q_mla = jnp.concatenate([q_lat.astype(jnp.float32), q_pe], axis=-1).astype(dt)
            kv = xkv
            if self.rope_lanes:      # the norm over the first C lanes, the rope over the last r
                k32 = kv.astype(jnp.float32)
                c = jnp.pad(_rmsnorm(k32[..., :C], self.w("kv_norm"), cfg.eps),
                            [(0, 0)] * (k32.ndim - 1) + [(0, r)])
                latent = jnp.where(jnp.arange(C + r) < C, c,
                                   _rope_lanes(k32, cos, sin, interleaved=True, at_end=True))
            else:
                c = _rmsnorm(kv[..., :C], self.w("kv_norm"), cfg.eps)
                latent = jnp.concatenate([c, _rope(kv[..., C:].astype(jnp.float32), cos, sin, True)],
                                         axis=-1)
        else:
            q = (qr @ self.w("wq_b").T).reshape(B, N, Hl, cfg.d_qk).astype(jnp.float32)
            if cfg.q_head_norm:
                q = _rmsnorm(q, None, cfg.eps)
            kv = _rmsnorm(xkv, self.w("kv_norm"), cfg.eps)
            if self.rope_lanes:
                q_mla = _rope_lanes(q, cos_h, sin_h, interleaved=True, at_end=True).astype(dt)
                latent = _rope_lanes(kv, cos, sin, interleaved=True, at_end=True)
            else:
                q_mla = jnp.concatenate([q[..., :-r], _rope(q[..., -r:], cos_h, sin_h, True)],
                                        axis=-1).astype(dt)
                latent = jnp.concatenate([kv[..., :-r], _rope(kv[..., -r:], cos, sin, True)], axis=-1)
        latent = latent.astype(dt)

        had = jnp.asarray(lref.hadamard_matrix(D_I), jnp.float32)
        iq = (qr @ self.w("indexer.wq_b").T).reshape(B, N, H_I, D_I).astype(jnp.float32)
        ik = _layernorm(xk, self.w("indexer.k_norm.weight"),
                        self.w("indexer.k_norm.bias"), cfg.eps)
        if self.rope_lanes:
            iq = _rope_lanes(iq, cos_h, sin_h, interleaved=False, at_end=False) @ had
            ik = _rope_lanes(ik, cos, sin, interleaved=False, at_end=False) @ had
        else:
            iq = jnp.concatenate([_rope(iq[..., :r], cos_h, sin_h, False), iq[..., r:]], axis=-1) @ had
            ik = jnp.concatenate([_rope(ik[..., :r], cos, sin, False), ik[..., r:]], axis=-1) @ had
        iq, ik = iq.astype(dt).astype(jnp.float32), ik.astype(dt).astype(jnp.float32)
        q_scale = jformats.indexer_scale(jnp.max(jnp.abs(iq), axis=-1), cfg.scale_fmt)     # [B, N, H_I]
        idx_q = jnp.clip(iq / q_scale[..., None], -np_formats.FP8_MAX, np_formats.FP8_MAX).astype(jnp.float8_e4m3fn)
        idx_w = (x.astype(jnp.float32) @ self.w("indexer.weights_proj").T) * (H_I ** -0.5 * D_I ** -0.5) * q_scale

        kv_cache, k_cache = self._write_caches(kv_cache, k_cache, latent, ik, block_table, context_lens, N)

        if cfg.window:
            idx_lens, win = window_split(context_lens, N, cfg.window)
            top = indexer_topk(idx_q, idx_w, k_cache, block_table, idx_lens, cfg.topk, path=self.path)
            indices = jnp.concatenate([top, win], axis=-1)
        else:
            idx_lens = window_split(context_lens, N, 0)[0]              # the drafts' lengths
            indices = indexer_topk(idx_q, idx_w, k_cache, block_table, context_lens, cfg.topk, path=self.path)

        sink = self.w("attn_sink") if cfg.attn_sink else None
        attn, lse = sparse_mla_decode(q_mla, kv_cache, indices, float(cfg.sm_scale), kv_format=self.kv_format,
                                      d_v=cfg.d_v, block_table=block_table, attn_sink=sink, path=self.path)
        if cfg.absorbed:
            o = jnp.einsum("bnhc,hdc->bnhd", attn.astype(dt), self.wkv_b_v[...])
            out = o.reshape(B, N, -1) @ self.w("wo").T
        else:
            o = attn.astype(jnp.float32)
            if cfg.inverse_rope_out and self.rope_lanes:
                o = _rope_lanes(o, cos_h, -sin_h, interleaved=True, at_end=True)
            elif cfg.inverse_rope_out:
                o = jnp.concatenate([o[..., :-r], _rope(o[..., -r:], cos_h, -sin_h, True)], axis=-1)
            gl = self.w("wo_a").shape[0] // cfg.o_lora_rank
            wo_a = self.w("wo_a").reshape(gl, cfg.o_lora_rank, -1)
            o = jnp.einsum("bngd,grd->bngr", o.astype(dt).reshape(B, N, gl, -1), wo_a)
            out = o.reshape(B, N, -1) @ self.w("wo_b").T
        if return_intermediates:
            inter = dict(q=q_mla, idx_q=idx_q, idx_weights=idx_w, indices=indices,
                         idx_context_lens=idx_lens, attn=attn, lse=lse)
            return out, kv_cache, k_cache, inter
        return out, kv_cache, k_cache


def _step_body(graphdef, return_intermediates, state, x, kv_cache, k_cache, block_table, context_lens):
    return nnx.merge(graphdef, state)(x, kv_cache, k_cache, block_table, context_lens,
                                      return_intermediates=return_intermediates)


_STEP_DONATED = (4, 5)          # kv_cache, k_cache in _step_body's arguments
_jit_step = jax.jit(_step_body, static_argnums=(0, 1), donate_argnums=_STEP_DONATED)


class DecodeStep:
    """The whole decode step of ``layer`` under one ``jax.jit``, the caches donated.

    ``step = DecodeStep(layer)``; ``out, kv_cache, k_cache = step(x, kv_cache, k_cache,
    block_table, context_lens)`` (plus the intermediates dict with ``return_intermediates=True``),
    arguments as :meth:`DSADecodeLayer.forward`.

    Donated: ``kv_cache`` and ``k_cache``. Their buffers become the returned caches (XLA's
    ``input_output_alias``; the fused cache writes update them in place), so a step does not copy
    either cache. The arrays passed in are consumed: JAX deletes them, and the caller threads the
    returned caches into the next step (as a serving loop does). Not donated: ``x``,
    ``block_table``, ``context_lens`` and the weights (``nnx.split(layer)`` state, held here and
    passed to the jitted function, not baked into it as constants).

    Traced, the value checks of :meth:`DSADecodeLayer._new_tokens` cannot run: an unmapped new
    token's write is dropped (docs/SEMANTICS.md). Compiled once per input shape.
    """

    def __init__(self, layer: DSADecodeLayer, *, return_intermediates: bool = False):
        self.graphdef, self.state = nnx.split(layer)
        self.return_intermediates = bool(return_intermediates)

    def __call__(self, x, kv_cache, k_cache, block_table, context_lens):
        return _jit_step(self.graphdef, self.return_intermediates, self.state, x, kv_cache, k_cache,
                         block_table, context_lens)

    def lower(self, x, kv_cache, k_cache, block_table, context_lens):
        """``jax.jit(...).lower`` of the step for these arguments (for inspecting the HLO)."""
        return _jit_step.lower(self.graphdef, self.return_intermediates, self.state, x, kv_cache,
                               k_cache, block_table, context_lens)
