"""Float64 NumPy reference of one DSA attention *decode layer* (DeepSeek's absorbed form).

The layer wraps the two SPEC operations (``kernels.reference.indexer_topk`` and
``kernels.reference.sparse_mla_decode``) with everything DeepSeek's ``MLA.forward`` /
``Indexer.forward`` do around them at decode: the query path, the latent-cache and indexer-cache
writes of the N new tokens, the indexer's q/k/weights, and the output projections. The torch
(``torch_impl.layer``) and Flax NNX (``jax_impl.layer``) layers are tested against
:func:`layer_reference`, and both build their weights and tensor-parallel slices from
:func:`init_weights` / :func:`shard_weights` here, so the three agree on names and layouts.

Sources (facts, not code): deepseek-ai/DeepSeek-V3.2-Exp ``inference/model.py`` (``MLA``,
``Indexer``, ``precompute_freqs_cis``, ``apply_rotary_emb(..., interleaved)``,
``rotate_activation``, ``weight_dequant``), ``inference/kernel.py`` (``act_quant``: one scale
per 128 values, ``amax/448`` or with ``scale_fmt="ue8m0"`` rounded up to a power of two) and
``config_671B_v3.2.json``. DeepSeek-V4-Flash: public configs and third-party ports (hidden
4096, 64 heads of width 512 over one shared K=V latent, q_lora 1024, o_groups 8 x o_lora 1024,
sliding window 128, attention sink, inverse rope on the output's rope dims). What is assumed for
V4 where no primary source was available is listed in :data:`DSV4_FLASH_LAYER`'s docstring.

Math of one decode step (per request b, new token i at position ``pos = L_b - N + i``):

V3.2 (``absorbed=True``)::

    qr     = rmsnorm(x @ wq_a.T) * q_norm                          [q_lora]
    q      = (qr @ wq_b.T).view(H, nope + rope); q_pe = rope_interleaved(q_pe, pos)
    q_lat  = einsum("hd,hdc->hc", q_nope, wkv_b.view(H, nope + v, C)[:, :nope])   (absorption)
    q_mla  = [q_lat, q_pe]                                           [H, C + rope] = [H, 576]
    kv     = x @ wkv_a.T = [c, k_pe]; latent = [rmsnorm(c) * kv_norm, rope_interleaved(k_pe)]
    out, lse = sparse_mla_decode(q_mla, cache, indexer_topk(...), sm_scale)          [H, C]
    y      = einsum("hc,hdc->hd", out, wkv_b[:, nope:]).flatten() @ wo.T  (value up-proj, wo)

V4-Flash (``absorbed=False``)::

    q      = (qr @ wq_b.T).view(H, D); q = q * rsqrt(mean(q^2) + eps) (per head, no weight)
    q[-rope:] = rope_interleaved(...); latent = rmsnorm(x @ wkv.T) * kv_norm; latent[-rope:] roped
    indices = [indexer top-k over positions < len - window, the last ``window`` positions]
    out, lse = sparse_mla_decode(q, cache, indices, sm_scale, attn_sink=attn_sink)   [H, D]
    out[-rope:] = inverse rope at the query position; grouped wo_a then wo_b

Indexer (both)::

    iq = (qr @ indexer.wq_b.T).view(H_I, D_I); iq[:rope] = rope_non_interleaved
    ik = layernorm(x @ indexer.wk.T) ; ik[:rope] = rope_non_interleaved
    iq, ik = hadamard(iq), hadamard(ik)                 (Sylvester order, scale D_I^-0.5)
    iq_fp8, q_scale = act_quant(iq, ue8m0) per head; ik -> fp8_indexer cache (ue8m0)
    w = (x @ indexer.weights_proj.T) * H_I^-0.5 * q_scale * D_I^-0.5   (float32)
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from kernels import cases, formats, reference
from kernels.scalars import check_int
from kernels.presets import DSV32, DSV4_FLASH, ModelPreset

__all__ = [
    "LayerConfig", "DSV32_LAYER", "DSV4_FLASH_LAYER", "LAYER_CONFIGS", "weight_shapes",
    "init_weights", "shard_weights", "rope_freqs", "hadamard_matrix", "LayerCase",
    "make_layer_case", "layer_reference", "LayerResult", "layer_parity_cases", "new_token_slots",
    "window_indices", "write_token_rows", "kv_cache_shape",
]


@dataclass(frozen=True)
class LayerConfig:
    """Dimensions of one DSA attention layer beyond :class:`kernels.presets.ModelPreset`.

    Attributes:
      preset: the op-level preset (heads, D_qk, d_v, top-k, window, indexer dims, page size,
        kv_format, attention sink).
      hidden: model width ``dim`` (7168 V3.2, 4096 V4-Flash).
      q_lora_rank: query low-rank width (1536 V3.2, 1024 V4-Flash).
      num_heads: query heads of the whole model (= preset.num_heads unless scaled down).
      absorbed: True for V3.2's MLA (wkv_b absorbed into q and applied to the output); False for
        V4-Flash (q lives in the latent space directly, grouped output projection).
      qk_nope_head_dim / v_head_dim: per-head nope / value width of wkv_b (V3.2: 128 / 128).
      o_groups / o_lora_rank: V4 grouped output projection (8 / 1024), 0 when absent.
      index_heads / index_head_dim: H_I, D_I (64 / 128).
      topk / window: indexer top-k and sliding-window width (V4: 512 / 128).
      rope_theta, rope_factor, original_seq_len, beta_fast, beta_slow: YaRN rope parameters.
      sm_scale: softmax scale of ``q . k`` (natural-log domain).
      q_head_norm: V4 per-head RMS normalisation of q (no learned weight: assumption).
      inverse_rope_out: V4 inverse rope on the output's last ``rope`` dims.
      eps: RMSNorm / LayerNorm epsilon (1e-6 in both models).
      scale_fmt: act_quant scale format of the indexer (``"ue8m0"``).
    """

    name: str
    preset: ModelPreset
    hidden: int
    q_lora_rank: int
    num_heads: int
    absorbed: bool
    qk_nope_head_dim: int
    v_head_dim: int
    o_groups: int
    o_lora_rank: int
    index_heads: int
    index_head_dim: int
    topk: int
    window: int
    rope_theta: float
    rope_factor: float
    original_seq_len: int
    beta_fast: int
    beta_slow: int
    sm_scale: float
    q_head_norm: bool
    inverse_rope_out: bool
    attn_sink: bool
    eps: float = 1e-6
    scale_fmt: str = "ue8m0"
    page_size: int = 64

    @property
    def d_qk(self) -> int:
        """Latent width seen by q: 576 (V3.2) or 512 (V4-Flash)."""
        return self.preset.d_qk

    @property
    def d_rope(self) -> int:
        return self.preset.d_rope

    @property
    def kv_lora_rank(self) -> int:
        """Latent dims before the rope dims (V3.2: 512 = d_v; V4: 448)."""
        return self.preset.d_nope

    @property
    def d_v(self) -> int:
        return self.preset.d_v

    @property
    def kv_format(self) -> str:
        return self.preset.kv_format

    def heads_per_rank(self, tp: int) -> int:
        """Query heads per rank at tensor-parallel size ``tp``.

        Raises:
          TypeError: ``tp`` not an int (kernels.scalars rule). ValueError: ``tp`` < 1 or not a
            divisor of ``num_heads`` (or V4's ``o_groups``).
        """
        tp = check_int("tp_size", tp, minimum=1)
        if self.num_heads % tp:
            raise ValueError(f"tp_size: expected a positive divisor of {self.name}.num_heads="
                             f"{self.num_heads}, got {tp!r}")
        if not self.absorbed and self.o_groups % tp:
            raise ValueError(f"tp_size: expected a divisor of {self.name}.o_groups={self.o_groups} "
                             f"(grouped wo_a is split by group), got {tp}")
        return self.num_heads // tp

    def scaled_down(self, *, num_heads: int = 4, hidden: int = 256, q_lora_rank: int = 64,
                    index_heads: int = 16, topk: int | None = None, window: int | None = None,
                    page_size: int = 16) -> "LayerConfig":
        """A small variant for CPU tests: fewer heads and a narrower model, the same D_qk
        (576 / 512), d_v 512, D_I 128, rope layout, scales and cache formats.

        V3.2 nope / v head dims become 32; V4 groups become 2 with o_lora 32. ``topk`` defaults
        to 64 (V3.2) or 32 (V4) and ``window`` to 16 (V4 only).
        """
        if self.absorbed:
            return replace(self, name=self.name + "_small", num_heads=num_heads, hidden=hidden,
                           q_lora_rank=q_lora_rank, qk_nope_head_dim=32, v_head_dim=32,
                           index_heads=index_heads, topk=topk or 64, window=0,
                           page_size=page_size)
        return replace(self, name=self.name + "_small", num_heads=num_heads, hidden=hidden,
                       q_lora_rank=q_lora_rank, o_groups=2, o_lora_rank=32,
                       index_heads=index_heads, topk=topk or 32,
                       window=16 if window is None else window, page_size=page_size)


DSV32_LAYER = LayerConfig(
    name="DSV32", preset=DSV32, hidden=7168, q_lora_rank=1536, num_heads=DSV32.num_heads,
    absorbed=True, qk_nope_head_dim=128, v_head_dim=128, o_groups=0, o_lora_rank=0,
    index_heads=DSV32.index_heads, index_head_dim=DSV32.index_head_dim, topk=DSV32.topk, window=0,
    rope_theta=10000.0, rope_factor=40.0, original_seq_len=4096, beta_fast=32, beta_slow=1,
    sm_scale=DSV32.sm_scale, q_head_norm=False, inverse_rope_out=False, attn_sink=False,
    page_size=DSV32.page_size)
"""DeepSeek-V3.2-Exp (config_671B_v3.2.json: dim 7168, q_lora_rank 1536, kv_lora_rank 512,
qk_nope 128, qk_rope 64, v_head 128, 128 heads, rope_theta 10000, YaRN factor 40 over 4096,
beta 32/1, mscale 1 -> sm_scale 192^-0.5 * mscale^2; indexer 64 x 128, top-k 2048)."""

DSV4_FLASH_LAYER = LayerConfig(
    name="DSV4_FLASH", preset=DSV4_FLASH, hidden=4096, q_lora_rank=1024,
    num_heads=DSV4_FLASH.num_heads, absorbed=False, qk_nope_head_dim=0, v_head_dim=0, o_groups=8,
    o_lora_rank=1024, index_heads=DSV4_FLASH.index_heads, index_head_dim=DSV4_FLASH.index_head_dim,
    topk=DSV4_FLASH.topk, window=DSV4_FLASH.window, rope_theta=160000.0, rope_factor=16.0,
    original_seq_len=65536, beta_fast=32, beta_slow=1, sm_scale=512 ** -0.5, q_head_norm=True,
    inverse_rope_out=True, attn_sink=True, page_size=DSV4_FLASH.page_size)
"""DeepSeek-V4-Flash as public configs describe it (hidden 4096, 64 heads, head_dim 512 over a
single K = V latent, q_lora 1024, o_groups 8, o_lora 1024, index 64 x 128, top-k 512, sliding
window 128, YaRN factor 16 over 65536, rms eps 1e-6).

Assumptions (no primary source was available; each is a switch in :class:`LayerConfig`):

* The layer is an indexer (compressed-attention) layer, but the latent cache holds one row per
  token: V4's KV *compressor* (one entry per 4 tokens) is out of scope; rope uses
  ``compress_rope_theta`` 160000 with the YaRN correction, as third-party ports do for these
  layers.
* ``wkv`` maps hidden -> 512, ``kv_norm`` (RMSNorm with weight) normalises all 512 dims, then
  the last 64 dims are roped (interleaved pairs); q is normalised per head by RMS without a
  learned weight before its last 64 dims are roped.
* The indexer is V3.2's (same projections, non-interleaved rope, Hadamard, ue8m0 fp8); it ranks
  positions before the window, and the last ``window`` positions are always attended; the two
  sets are disjoint, so no position is counted twice.
* ``sm_scale = 512^-0.5``; the attention sink is the per-head logit of SPEC's ``attn_sink``.
* Output: inverse rope on the last 64 dims of each head at the query position, then
  ``wo_a`` per group of ``H / o_groups`` heads (``[o_groups * o_lora, (H / o_groups) * 512]``)
  and ``wo_b`` (``[hidden, o_groups * o_lora]``).
"""

LAYER_CONFIGS = {c.name: c for c in (DSV32_LAYER, DSV4_FLASH_LAYER)}


# ============================================================================ weights

def weight_shapes(cfg: LayerConfig) -> dict[str, tuple[int, ...]]:
    """Full (unsharded) weight shapes, DeepSeek ``inference/model.py`` names, ``[out, in]``."""
    H, Dh, r = cfg.num_heads, cfg.index_head_dim, cfg.d_rope
    s = {"wq_a": (cfg.q_lora_rank, cfg.hidden), "q_norm": (cfg.q_lora_rank,)}
    if cfg.absorbed:
        C, nope, v = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
        s.update({"wq_b": (H * (nope + r), cfg.q_lora_rank), "wkv_a": (C + r, cfg.hidden),
                  "kv_norm": (C,), "wkv_b": (H * (nope + v), C), "wo": (cfg.hidden, H * v)})
    else:
        D, g = cfg.d_qk, cfg.o_groups
        s.update({"wq_b": (H * D, cfg.q_lora_rank), "wkv": (D, cfg.hidden), "kv_norm": (D,),
                  "wo_a": (g * cfg.o_lora_rank, (H // g) * D),
                  "wo_b": (cfg.hidden, g * cfg.o_lora_rank), "attn_sink": (H,)})
    s.update({"indexer.wq_b": (cfg.index_heads * Dh, cfg.q_lora_rank), "indexer.wk": (Dh, cfg.hidden),
              "indexer.k_norm.weight": (Dh,), "indexer.k_norm.bias": (Dh,),
              "indexer.weights_proj": (cfg.index_heads, cfg.hidden)})
    return s


def init_weights(cfg: LayerConfig, seed=0) -> dict[str, np.ndarray]:
    """Random float32 weights of the full layer with activations of order one.

    Linear weights ~ N(0, 1/fan_in); norm weights 1 + N(0, 0.1^2); LayerNorm bias and the
    attention sink N(0, 0.1^2) / N(0, 1).
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm") or name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif name == "attn_sink":
            w = rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / math.sqrt(shape[1])
        out[name] = w.astype(np.float32)
    return out


def float32_weights(cfg: LayerConfig, weights, convert=None) -> dict:
    """``{name: float32 ndarray}`` of the weights the layer uses, from a mapping of NumPy arrays
    (any real float dtype, ml_dtypes bfloat16 included) or framework arrays that ``convert``
    (the caller's; e.g. torch tensor -> NumPy) or ``np.asarray`` turns into NumPy. Names that are
    absent or of the wrong shape are left to :func:`shard_weights` to report.

    Raises:
      TypeError: ``weights`` not a mapping; a weight that is not a real floating-point array
        (names ``weights[name]``).
    """
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights: expected a mapping {{name: array}} (DeepSeek names, "
                        f"kernels.layer_reference.weight_shapes) or None, got {type(weights).__name__}")
    out = {}
    for name in weight_shapes(cfg):
        if name not in weights:
            continue
        v = weights[name]
        try:
            a = convert(v) if convert is not None else v
            if np.iscomplexobj(a):
                raise TypeError
            out[name] = np.asarray(a, np.float32)
        except (TypeError, ValueError):
            raise TypeError(f"weights[{name!r}]: expected a real floating-point array, got "
                            f"{type(v).__name__} {getattr(v, 'dtype', '')}".rstrip()) from None
    return out


def shard_weights(cfg: LayerConfig, weights: dict, tp_rank: int, tp_size: int) -> dict:
    """This rank's slices of the full weights (DeepSeek's tensor parallelism over heads).

    Column-parallel (output rows, by head): ``wq_b``, ``wkv_b``, V4 ``wo_a`` (by head group) and
    ``attn_sink``; row-parallel (input columns): ``wo`` / V4 ``wo_b``, whose partial outputs the
    ranks sum. Everything else (``wq_a``, norms, ``wkv_a`` / ``wkv``, the whole indexer) is
    replicated, as in DeepSeek's reference and the vLLM / SGLang DSA backends.

    Raises:
      ValueError: missing weight, wrong shape, or ``tp_rank`` / ``tp_size`` out of range.
    """
    Hl = cfg.heads_per_rank(tp_size)
    tp_rank = check_int("tp_rank", tp_rank)
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank: expected an int in [0, {tp_size}), got {tp_rank!r}")
    shapes = weight_shapes(cfg)
    for name, shape in shapes.items():
        if name not in weights:
            raise ValueError(f"weights: missing {name!r} (expected shape {shape})")
        if tuple(np.shape(weights[name])) != shape:
            raise ValueError(f"weights[{name!r}]: expected shape {shape}, got {tuple(np.shape(weights[name]))}")
    w = {k: np.asarray(weights[k]) for k in shapes}
    h0, h1 = tp_rank * Hl, (tp_rank + 1) * Hl
    r = cfg.d_rope
    if cfg.absorbed:
        qd, kvd, v = cfg.qk_nope_head_dim + r, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.v_head_dim
        w["wq_b"] = w["wq_b"][h0 * qd:h1 * qd]
        w["wkv_b"] = w["wkv_b"][h0 * kvd:h1 * kvd]
        w["wo"] = w["wo"][:, h0 * v:h1 * v]
    else:
        D, gl, ol = cfg.d_qk, cfg.o_groups // tp_size, cfg.o_lora_rank
        w["wq_b"] = w["wq_b"][h0 * D:h1 * D]
        w["attn_sink"] = w["attn_sink"][h0:h1]
        w["wo_a"] = w["wo_a"][tp_rank * gl * ol:(tp_rank + 1) * gl * ol]
        w["wo_b"] = w["wo_b"][:, tp_rank * gl * ol:(tp_rank + 1) * gl * ol]
    return {k: np.ascontiguousarray(a) for k, a in w.items()}


# ============================================================================ rope, hadamard

def rope_freqs(cfg: LayerConfig) -> np.ndarray:
    """Rotary frequencies ``[d_rope / 2]`` float64 with DeepSeek's YaRN correction
    (``precompute_freqs_cis``: applied because the model's context exceeds ``original_seq_len``)."""
    dim, base, factor = cfg.d_rope, cfg.rope_theta, cfg.rope_factor
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))

    def corr_dim(rot):
        return dim * math.log(cfg.original_seq_len / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(cfg.beta_fast)), 0)
    high = min(math.ceil(corr_dim(cfg.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    smooth = 1 - ramp
    return freqs / factor * (1 - smooth) + freqs * smooth


def hadamard_matrix(n: int) -> np.ndarray:
    """Sylvester Hadamard matrix ``[n, n]`` times ``n^-0.5`` (``fast_hadamard_transform`` with
    ``scale = n^-0.5``: y = x @ H, H symmetric), float64."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"n: expected a power of two, got {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def _rope(x, angle, *, interleaved: bool, inverse: bool = False):
    """Rotate ``x [..., d]`` by ``angle [..., d/2]`` (broadcast over heads by the caller)."""
    c, s = np.cos(angle), np.sin(angle)
    if inverse:
        s = -s
    d = x.shape[-1]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : d // 2], x[..., d // 2:]
    ra, rb = a * c - b * s, a * s + b * c
    if interleaved:
        return np.stack([ra, rb], axis=-1).reshape(x.shape)
    return np.concatenate([ra, rb], axis=-1)


def _rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 if w is None else w)


def _layernorm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def kv_cache_shape(cfg: LayerConfig, kv_format: str, num_pages: int) -> tuple[int, ...]:
    """Shape of a latent cache of ``num_pages`` pages of ``cfg.page_size`` tokens: latent
    ``[n, P, D_qk]``, ``fp8_ds_mla`` ``[n, P, 656]``, ``fp8_model1`` ``[n, model1_page_bytes(P)]``."""
    P = cfg.page_size
    if kv_format == "latent":
        return (num_pages, P, cfg.d_qk)
    if kv_format == "fp8_ds_mla":
        return (num_pages, P, formats.DS_MLA_BYTES)
    if kv_format == "fp8_model1":
        return (num_pages, formats.model1_page_bytes(P))
    raise ValueError(f"kv_format: expected one of {formats.KV_FORMATS}, got {kv_format!r}")


# ============================================================================ cases

@dataclass
class LayerCase:
    """One decode step of the layer: inputs as NumPy arrays, weights full (unsharded) float32.

    x ``[B, N, hidden]`` float32; kv_cache in ``kv_format`` (latent float32
    ``[num_pages, P, D_qk]``, ``fp8_ds_mla`` uint8 ``[num_pages, P, 656]``, ``fp8_model1`` uint8
    ``[num_pages, page_bytes]``); k_cache ``fp8_indexer`` uint8 ``[num_pages, P * 132]``;
    block_table int32 ``[B, max_pages]``; context_lens int32 ``[B]`` (L_b counting the N new
    tokens, whose slots the block table must map).
    """

    name: str
    cfg: LayerConfig
    weights: dict
    x: np.ndarray
    kv_cache: np.ndarray
    k_cache: np.ndarray
    block_table: np.ndarray
    context_lens: np.ndarray
    kv_format: str
    seed: int = 0

    def reference(self, tp_rank: int = 0, tp_size: int = 1, *, indices=None) -> "LayerResult":
        """:func:`layer_reference` of this case for rank ``tp_rank`` of ``tp_size``."""
        return layer_reference(self.cfg, shard_weights(self.cfg, self.weights, tp_rank, tp_size),
                               self.x, self.kv_cache, self.k_cache, self.block_table,
                               self.context_lens, kv_format=self.kv_format, indices=indices)


def make_layer_case(cfg: LayerConfig, *, seed=0, B=2, N=1, lens=(150, 90), kv_format=None,
                    name=None) -> LayerCase:
    """Random weights, inputs and a filled paged cache pool (older tokens and stale pages hold
    random latent / indexer rows of the magnitude the layer writes)."""
    rng = np.random.default_rng(seed)
    kv_format = kv_format or cfg.kv_format
    lens = [int(v) for v in lens][:B]
    if len(lens) != B or min(lens) < N:
        raise ValueError(f"lens: expected {B} lengths >= N={N}, got {lens}")
    P = cfg.page_size
    bt, num_pages, _ = cases.make_block_table(rng, lens, P, stale_pages=1)
    lat = rng.standard_normal((num_pages, P, cfg.d_qk)).astype(np.float32)
    kv_cache = formats.quantize_kv(lat, kv_format)
    k = rng.standard_normal((num_pages, P, cfg.index_head_dim)).astype(np.float32)
    k_cache = formats.quantize_fp8_indexer(k, cfg.scale_fmt)
    x = rng.standard_normal((B, N, cfg.hidden)).astype(np.float32)
    return LayerCase(name or f"{cfg.name}_{kv_format}_B{B}_N{N}", cfg, init_weights(cfg, seed + 1), x,
                     kv_cache, k_cache, bt, np.asarray(lens, np.int32), kv_format, seed)


def layer_parity_cases() -> list[dict]:
    """Named configurations for the parity suite: dicts with ``name``, ``cfg`` (a scaled-down
    :class:`LayerConfig`), ``kv_format``, ``B``, ``N``, ``lens``, ``seed`` and ``tp`` (compare the
    sum of ``tp`` rank outputs). Build one with ``make_layer_case(**{k: c[k] for k in
    ("cfg", "seed", "B", "N", "lens", "kv_format", "name")})``."""
    v32, v4 = DSV32_LAYER.scaled_down(), DSV4_FLASH_LAYER.scaled_down()
    return [
        dict(name="dsv32_fp8_ds_mla", cfg=v32, kv_format="fp8_ds_mla", B=2, N=1, lens=(150, 40), seed=0, tp=1),
        dict(name="dsv32_latent_mtp2", cfg=v32, kv_format="latent", B=2, N=2, lens=(130, 70), seed=1, tp=1),
        dict(name="dsv32_fp8_tp2", cfg=v32, kv_format="fp8_ds_mla", B=1, N=1, lens=(100,), seed=2, tp=2),
        dict(name="dsv4_fp8_model1", cfg=v4, kv_format="fp8_model1", B=2, N=1, lens=(120, 30), seed=3, tp=1),
        dict(name="dsv4_latent_mtp2", cfg=v4, kv_format="latent", B=1, N=2, lens=(90,), seed=4, tp=1),
        dict(name="dsv4_fp8_tp2", cfg=v4, kv_format="fp8_model1", B=1, N=1, lens=(100,), seed=5, tp=2),
    ]


# ============================================================================ the layer

@dataclass
class LayerResult:
    """Outputs and intermediates of :func:`layer_reference` (float64 unless noted).

    out ``[B, N, hidden]`` (this rank's partial sum when tp_size > 1); kv_cache / k_cache the
    updated caches (same layout and dtype as given); q ``[B, N, H, D_qk]`` the sparse-MLA query;
    idx_q float8_e4m3fn ``[B, N, H_I, D_I]``; idx_weights float32 ``[B, N, H_I]``; indices int32
    ``[B, N, K (+ window)]`` logical positions, -1 padded; attn ``[B, N, H, d_v]``, lse
    ``[B, N, H]`` (natural log); idx_context_lens int32 ``[B, N]`` the indexer's valid lengths.
    """

    out: np.ndarray
    kv_cache: np.ndarray
    k_cache: np.ndarray
    q: np.ndarray
    idx_q: np.ndarray
    idx_weights: np.ndarray
    indices: np.ndarray
    attn: np.ndarray
    lse: np.ndarray
    idx_context_lens: np.ndarray = field(default=None)


def new_token_slots(block_table, context_lens, N: int, P: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions ``[B, N]`` = ``L_b - N + i``, slots ``[B, N]``, -1 where unmapped)."""
    pos = np.asarray(context_lens, np.int64)[:, None] - N + np.arange(N)[None, :]
    return pos, formats.logical_to_slot(pos, np.asarray(block_table), P)


def window_indices(lens_bn: np.ndarray, window: int) -> np.ndarray:
    """The last ``window`` positions before each draft's valid length, ``[B, N, window]`` int32,
    -1 where negative."""
    j = np.asarray(lens_bn, np.int64)[..., None] - window + np.arange(window)
    return np.where(j >= 0, j, -1).astype(np.int32)


def write_token_rows(kv_cache, k_cache, latent, idx_k, slots, kv_format, P, D_I, scale_fmt):
    """Write the new tokens' rows into copies of both caches (reference semantics of the cache
    write). latent ``[T, D_qk]`` float, idx_k ``[T, D_I]`` float, slots ``[T]``."""
    kv = kv_cache.copy()
    kc = k_cache.copy()
    for t, slot in enumerate(np.asarray(slots).reshape(-1)):
        if slot < 0:
            continue
        page, off = divmod(int(slot), P)
        row = latent[t].astype(np.float32)
        if kv_format == "latent":
            kv[page, off] = row.astype(kv.dtype)
        elif kv_format == "fp8_ds_mla":
            kv[page, off] = formats.quantize_fp8_ds_mla(row[None])[0]
        else:
            one = formats.quantize_fp8_model1(row[None, None])[0]
            kv[page, off * 576:(off + 1) * 576] = one[:576]
            kv[page, P * 576 + off * 8:P * 576 + off * 8 + 8] = one[576:584]
        one = formats.quantize_fp8_indexer(idx_k[t].astype(np.float32)[None, None], scale_fmt)[0]
        kc[page, off * D_I:(off + 1) * D_I] = one[:D_I]
        kc[page, P * D_I + 4 * off:P * D_I + 4 * off + 4] = one[D_I:]
    return kv, kc


def layer_reference(cfg: LayerConfig, weights: dict, x, kv_cache, k_cache, block_table,
                    context_lens, *, kv_format: str | None = None, indices=None) -> LayerResult:
    """One decode step of the DSA attention layer in float64 (module docstring for the math).

    Args:
      cfg: the layer's dimensions.
      weights: this rank's weights (:func:`shard_weights`), float arrays, DeepSeek names.
      x: ``[B, N, hidden]`` float, the N new tokens of each request (N > 1: MTP drafts).
      kv_cache, k_cache, block_table, context_lens: as in :class:`LayerCase`; not modified.
      kv_format: the latent cache layout (default ``cfg.kv_format``).
      indices: optional int32 ``[B, N, K (+ window)]`` logical positions to attend instead of the
        reference's own selection (to compare a low-precision layer whose indexer legitimately
        picked a different near-tie set; its selection is checked separately).
    Returns:
      :class:`LayerResult`; ``out`` is this rank's row-parallel partial (sum over ranks = TP=1).
    Quantization points (fp8 caches, indexer q) use ``kernels.formats``, i.e. they round the
    float64 value to float32 first, exactly as the float32 layers do.
    """
    kv_format = kv_format or cfg.kv_format
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    x = np.asarray(x, np.float64)
    B, N, _ = x.shape
    P, r, D_I, H_I = cfg.page_size, cfg.d_rope, cfg.index_head_dim, cfg.index_heads
    pos, slots = new_token_slots(block_table, context_lens, N, P)
    ang = pos[..., None].astype(np.float64) * rope_freqs(cfg)           # [B, N, r/2]
    ang_h = ang[:, :, None, :]

    qr = _rmsnorm(x @ w["wq_a"].T, w["q_norm"], cfg.eps)               # [B, N, q_lora]
    if cfg.absorbed:
        nope, C = cfg.qk_nope_head_dim, cfg.kv_lora_rank
        q = (qr @ w["wq_b"].T).reshape(B, N, -1, nope + r)
        H = q.shape[2]
        q_pe = _rope(q[..., nope:], ang_h, interleaved=True)
        wkv_b = w["wkv_b"].reshape(H, nope + cfg.v_head_dim, C)
        q_lat = np.einsum("bnhd,hdc->bnhc", q[..., :nope], wkv_b[:, :nope])
        q_mla = np.concatenate([q_lat, q_pe], axis=-1)
        kv = x @ w["wkv_a"].T
        c = _rmsnorm(kv[..., :C], w["kv_norm"], cfg.eps)
        latent = np.concatenate([c, _rope(kv[..., C:], ang, interleaved=True)], axis=-1)
    else:
        D = cfg.d_qk
        q = (qr @ w["wq_b"].T).reshape(B, N, -1, D)
        H = q.shape[2]
        if cfg.q_head_norm:
            q = _rmsnorm(q, None, cfg.eps)
        q_mla = np.concatenate([q[..., :-r], _rope(q[..., -r:], ang_h, interleaved=True)], axis=-1)
        kv = _rmsnorm(x @ w["wkv"].T, w["kv_norm"], cfg.eps)
        latent = np.concatenate([kv[..., :-r], _rope(kv[..., -r:], ang, interleaved=True)], axis=-1)

    # indexer q / k / weights
    had = hadamard_matrix(D_I)
    iq = (qr @ w["indexer.wq_b"].T).reshape(B, N, H_I, D_I)
    iq = np.concatenate([_rope(iq[..., :r], ang_h, interleaved=False), iq[..., r:]], axis=-1) @ had
    ik = _layernorm(x @ w["indexer.wk"].T, w["indexer.k_norm.weight"], w["indexer.k_norm.bias"], cfg.eps)
    ik = np.concatenate([_rope(ik[..., :r], ang, interleaved=False), ik[..., r:]], axis=-1) @ had
    q_scale = formats.indexer_scale(np.abs(iq.astype(np.float32)).max(axis=-1), cfg.scale_fmt)
    idx_q = formats.to_e4m3(iq.astype(np.float32) / q_scale[..., None])
    idx_w = ((x @ w["indexer.weights_proj"].T) * H_I ** -0.5 * q_scale * D_I ** -0.5).astype(np.float32)

    kv_new, kc_new = write_token_rows(np.asarray(kv_cache), np.asarray(k_cache),
                                      latent.reshape(B * N, -1), ik.reshape(B * N, -1), slots,
                                      kv_format, P, D_I, cfg.scale_fmt)
    lens_bn = reference.valid_lengths(context_lens, B, N)
    if cfg.window:
        idx_lens = np.maximum(lens_bn - cfg.window, 0).astype(np.int32)
        if indices is None:
            top = reference.indexer_topk(idx_q, idx_w, kc_new, block_table, idx_lens, cfg.topk)
            indices = np.concatenate([top, window_indices(lens_bn, cfg.window)], axis=-1)
    else:
        idx_lens = lens_bn.astype(np.int32)
        top = reference.indexer_topk(idx_q, idx_w, kc_new, block_table, context_lens, cfg.topk)
        indices = top if indices is None else indices

    if indices is not None:
        indices = np.asarray(indices, np.int32)
    sink = w["attn_sink"] if cfg.attn_sink else None
    attn, lse = reference.sparse_mla_decode(q_mla, kv_new, indices, cfg.sm_scale, kv_format=kv_format,
                                            d_v=cfg.d_v, block_table=block_table, attn_sink=sink)
    if cfg.absorbed:
        o = np.einsum("bnhc,hdc->bnhd", attn, wkv_b[:, nope:]).reshape(B, N, -1)
        out = o @ w["wo"].T
    else:
        o = attn.copy()
        if cfg.inverse_rope_out:
            o[..., -r:] = _rope(o[..., -r:], ang_h, interleaved=True, inverse=True)
        gl = w["wo_a"].shape[0] // cfg.o_lora_rank
        o = o.reshape(B, N, gl, -1)
        wo_a = w["wo_a"].reshape(gl, cfg.o_lora_rank, -1)
        out = np.einsum("bngd,grd->bngr", o, wo_a).reshape(B, N, -1) @ w["wo_b"].T
    return LayerResult(out, kv_new, kc_new, q_mla, idx_q, idx_w, indices, attn, lse, idx_lens)
