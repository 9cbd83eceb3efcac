"""Lightning indexer + exact top-k for JAX: ``indexer_logits`` and ``indexer_topk``.

Semantics: docs/SPEC.md "Operation A" (DeepSeek-V3.2-Exp ``inference/model.py``
Indexer.forward, DeepGEMM ``fp8_paged_mqa_logits``, vLLM / SGLang -1 padding); the float64
definition is :mod:`kernels.reference`. Paths:

* ``"pallas"``: :mod:`kernels.indexer.pallas` (Pallas, Triton lowering; interpret mode on the
  CPU): a paged logits kernel and an exact radix-select kernel, both with runtime trip counts
  bounded by the actual lengths.
* ``"xla"``: plain ``jax.numpy``: a ``lax.fori_loop`` with a runtime trip count
  ``ceil(max_b,i len / chunk)`` over chunks of pages; each iteration gathers the chunk's pages
  through the block table, scores them, and merges them into a running exact top-k with a
  two-key ``lax.sort`` (descending key, then ascending position: the SPEC tie rule by
  construction, independent of ``lax.top_k``'s tie order). Work scales with ``max(L_b)``, the
  most static shapes allow (a batch shares one trip count). Numerics: float32 operands decoded
  from the e4m3 bytes by a table gather and an explicit ``F32_F32_F32`` dot algorithm, so that
  XLA:GPU neither turns the dot into an fp8 cuBLASLt matmul nor picks TF32 / bf16x3
  (:func:`_e4m3_bytes_to_f32`).
* ``"auto"``: the ``kernels/dispatch`` entry for this GPU and shape bucket if any, else
  ``"pallas"`` then ``"xla"`` (falls through on NotImplementedError only).

Both functions are ``jax.jit``-compatible with ``topk``, ``k_format``, ``sorted`` and ``path``
static (e.g. ``jax.jit(indexer_topk, static_argnames=("topk", "k_format", "sorted", "path"))``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_impl._common import (check_array, check_int, device_info, plan, require_32bit_indices,
                              run_path)
from jax_impl.formats import split_fp8_indexer
from kernels import hardware
from kernels.scalars import topk_maximum
from kernels.formats import K_FORMATS
from kernels.indexer import pallas as _pallas

__all__ = ["indexer_logits", "indexer_topk"]

_FLOAT_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16)
_XLA_CHUNK = 4096            # positions per iteration of the XLA path (rounded to whole pages)


# ============================================================================ validation

def _validate(q, weights, k_cache, block_table, context_lens, k_format, names=("q", "weights")):
    """Check every argument against SPEC; returns ``(B, N, H_I, D_I, P, num_pages)``.

    ``names``: what the errors call ``q`` and ``weights`` (the composed steps pass
    ``("idx_q", "idx_weights")``, their own argument names)."""
    qn, wn = names
    if k_format not in K_FORMATS:
        raise ValueError(f"k_format: expected one of {K_FORMATS}, got {k_format!r}")
    check_array(qn, q, ndim=4)
    B, N, H, D = (int(d) for d in q.shape)
    if k_format == "fp8_indexer":
        check_array(qn, q, dtypes=(jnp.float8_e4m3fn,))
        check_array("k_cache", k_cache, ndim=2, dtypes=(jnp.uint8,))
        page_bytes = int(k_cache.shape[1])
        if page_bytes == 0 or page_bytes % (D + 4):
            raise ValueError(f"k_cache: fp8_indexer pages hold P * (D_I + 4) bytes with D_I = {D}; "
                             f"got {page_bytes} bytes per page (shape {tuple(k_cache.shape)})")
        P = page_bytes // (D + 4)
    else:
        check_array(qn, q, dtypes=_FLOAT_DTYPES)
        check_array("k_cache", k_cache, ndim=3, shape=("num_pages", "P", D))
        if jnp.dtype(k_cache.dtype) != jnp.dtype(q.dtype):
            raise TypeError(f"k_cache: dense cache must have {qn}'s dtype {jnp.dtype(q.dtype).name}, "
                            f"got {jnp.dtype(k_cache.dtype).name}")
        P = int(k_cache.shape[1])
    if int(k_cache.shape[0]) < 1:
        raise ValueError(f"k_cache: expected at least one page, got shape {tuple(k_cache.shape)}")
    if min(B, N, H, D, P) == 0:
        raise ValueError(f"{qn} / k_cache: empty dimension ({qn} {tuple(q.shape)}, k_cache {tuple(k_cache.shape)})")
    check_array(wn, weights, dtypes=(jnp.float32,), shape=(B, N, H))
    check_array("block_table", block_table, ndim=2, dtypes=(jnp.int32,), shape=(B, "max_pages"))
    if int(block_table.shape[1]) == 0:
        raise ValueError(f"block_table: expected shape ({B}, max_pages) with max_pages >= 1, got "
                         f"{tuple(block_table.shape)}")
    check_array("context_lens", context_lens, dtypes=(jnp.int32,))
    if tuple(context_lens.shape) not in ((B,), (B, N)):
        raise ValueError(f"context_lens: expected shape ({B},) or ({B}, {N}), got {tuple(context_lens.shape)}")
    return B, N, H, D, P, int(k_cache.shape[0])


def _check_topk(topk, sorted, B, N):
    check_int("topk", topk, minimum=1, maximum=topk_maximum(B, N),
              why=f"B * N * topk < 2^31 with B={B}, N={N}: int32 offsets of the output")
    if not isinstance(sorted, (bool, np.bool_)):
        raise TypeError(f"sorted: expected a bool, got {type(sorted).__name__}")


def _draft_lengths(context_lens, B, N, width):
    """int32 ``[B, N]``: draft i of request b sees ``L_b - (N - 1 - i)`` positions (or
    ``context_lens[b, i]``), clamped to ``[0, width]``."""
    cl = context_lens.astype(jnp.int32)
    if cl.ndim == 1:
        # clamp before the MTP offset: INT32_MIN - 1 would wrap to INT32_MAX (the whole table)
        cl = jnp.clip(cl, 0, width + N)[:, None] - (N - 1 - jnp.arange(N, dtype=jnp.int32))[None, :]
    return jnp.clip(cl, 0, width)


# ============================================================================ pallas path

def _pallas_gate(dev: hardware.DeviceInfo, *, D, P, H, N, fp8, pages=2):
    """NotImplementedError (before launch) for what the Pallas kernels cannot run."""
    require_32bit_indices("jax indexer")
    hardware.require_arch(dev, "jax indexer (pallas)")
    where = f"{dev.name} (compute capability {dev.cc[0]}.{dev.cc[1]})"
    if P < 16 or P & (P - 1):
        raise NotImplementedError(f"jax indexer (pallas) on {where}: page size P={P} unsupported; "
                                  f"supported: powers of two >= 16 (use path='xla')")
    if D < 16 or D & (D - 1):
        raise NotImplementedError(f"jax indexer (pallas) on {where}: D_I={D} unsupported; "
                                  f"supported: powers of two >= 16 (use path='xla')")
    NP, HP = _pallas._next_pow2(N), max(16, _pallas._next_pow2(H))
    # q tile + one page group, staged in the dot operand dtype (fp8 as fp16; dense up to fp32):
    # an upper bound of the sizes measured by compiling for sm_90 / sm_120 (32 KiB at N=1,
    # 82 KiB at N=4 for H_I=64, D_I=128, P=64, 2 pages)
    elt = 2 if fp8 else 4
    need = (NP * HP + pages * P) * D * elt
    if not fp8:
        need = NP * HP * D * elt + 2 * P * (D + 4) * elt   # dense: q tile + two pipelined pages
    hardware.require_smem(dev, f"jax indexer (pallas) with N={N}, H_I={H}, D_I={D}, P={P}", need)


def _pallas_logits(q, weights, k_cache, block_table, lens, *, k_format, P, cfg, group_max=False):
    dev = device_info()
    B, N, H, D = q.shape
    _pallas_gate(dev, D=D, P=P, H=H, N=N, fp8=k_format == "fp8_indexer",
                 pages=(cfg.pages if cfg is not None else _pallas.PallasIndexerConfig().pages))
    W = block_table.shape[1] * P
    hardware.require_int32_addressing(dev, "jax indexer (pallas)",
                                      max(k_cache.size * k_cache.dtype.itemsize, B * N * W * 4))
    return _pallas.launch_indexer_logits(q, weights, k_cache, block_table, lens,
                                         fp8=k_format == "fp8_indexer", page_size=P,
                                         num_sms=dev.num_sms, cfg=cfg, group_max=group_max)


def _mask_logits(raw, lens, N, W):
    """Pallas logits ``[B, NP, W_pad]`` -> SPEC logits ``[B, N, W]`` (-inf at and past lens)."""
    pos = jnp.arange(W, dtype=jnp.int32)
    return jnp.where(pos[None, None, :] < lens[:, :, None], raw[:, :N, :W], -jnp.inf)


# ============================================================================ xla path

def _xla_chunk_pages(P: int, max_pages: int, chunk: int | None) -> int:
    return max(1, min(max_pages, -(-(chunk or _XLA_CHUNK) // P)))


@functools.lru_cache(maxsize=None)
def _e4m3_table() -> np.ndarray:
    """float32 ``[256]``: the value of every e4m3 (float8_e4m3fn) byte (exact; 0x7F / 0xFF NaN)."""
    return np.arange(256, dtype=np.uint8).view(jnp.float8_e4m3fn).astype(np.float32)


def _e4m3_bytes_to_f32(b):
    """uint8 e4m3 bytes -> their float32 values, by a 256-entry table gather.

    Not ``astype``: XLA:GPU's GEMM rewriter (``gemm_rewriter.cc`` ``MatchFp8Param``) follows a
    dot operand back through converts / reshapes / slices to an F8-typed instruction and, when
    both operands lead to one, replaces the dot by a cuBLASLt FP8 matmul (``__cublas$lt$matmul$f8``)
    whatever the dot's precision or output type; Hopper's fp8 tensor-core accumulation then puts
    the logits ~5e-5 relative off. A gather has two operands, so the search stops there and no
    F8 type reaches the dot.
    """
    return jnp.asarray(_e4m3_table())[b.astype(jnp.int32)]


# float32 operands, float32 products and accumulation on every backend: never TF32 / bf16x3 /
# an fp8 tensor-core dot (an explicit algorithm is binding; Precision.HIGHEST is only a hint).
_F32_DOT = lax.DotAlgorithmPreset.F32_F32_F32


def _xla_chunk_logits(q, weights, k_cache, block_table, lens, c, *, k_format, P, CP, num_pages):
    """Logits of positions ``[c * CP * P, (c + 1) * CP * P)``: float32 ``[B, N, CP * P]``.

    Numerics: e4m3 q and keys decoded to float32 (exact) by :func:`_e4m3_bytes_to_f32`, dense
    caches cast to float32 (exact); ``q . k`` one float32 dot (``F32_F32_F32``: IEEE products
    and sums, 128 terms); ReLU; the weighted head sum ``sum_h w_h * relu(s_h)`` as an
    elementwise float32 multiply and reduce over H_I (not a dot, so no dot algorithm applies to
    it); times the token's scale: the reference's association, each step in float32.
    """
    B, N, H, D = q.shape
    pages = lax.dynamic_slice_in_dim(block_table, c * CP, CP, axis=1)          # [B, CP]
    ok_page = (pages >= 0) & (pages < num_pages)
    safe = jnp.where(ok_page, pages, 0)
    if k_format == "fp8_indexer":
        raw = jnp.take(k_cache, safe.reshape(-1), axis=0)                      # [B*CP, P*(D+4)] u8
        _, scale = split_fp8_indexer(raw, D)                  # the chunk's pages only, not the cache
        kf = _e4m3_bytes_to_f32(raw[:, :P * D].reshape(B, CP, P, D))           # [B, CP, P, D] f32
        scale = scale.reshape(B, CP, P)
        qf = _e4m3_bytes_to_f32(lax.bitcast_convert_type(q, jnp.uint8))        # [B, N, H, D] f32
    else:
        kf = jnp.take(k_cache, safe, axis=0).astype(jnp.float32)               # [B, CP, P, D]
        scale = jnp.ones((B, CP, P), jnp.float32)
        qf = q.astype(jnp.float32)
    s = jnp.einsum("bnhd,bcpd->bnhcp", qf, kf, precision=_F32_DOT,
                   preferred_element_type=jnp.float32)
    s = jnp.where(s < 0, jnp.float32(0.0), s)                                  # NaN propagates
    # the weighted head sum elementwise in float32 (as a dot it would be one more place for a
    # reduced-precision algorithm)
    logit = jnp.sum(s * weights[:, :, :, None, None], axis=2)
    logit = (logit * scale[:, None]).reshape(B, N, CP * P)
    pos = c * CP * P + jnp.arange(CP * P, dtype=jnp.int32)
    ok = (pos[None, None, :] < lens[:, :, None]) & jnp.repeat(ok_page, P, axis=1)[:, None, :]
    return jnp.where(ok, logit, -jnp.inf)


def _xla_logits(q, weights, k_cache, block_table, lens, *, k_format, P, chunk=None):
    B, N = q.shape[:2]
    max_pages = block_table.shape[1]
    CP = _xla_chunk_pages(P, max_pages, chunk)
    n_total = -(-max_pages // CP)
    bt = jnp.pad(block_table, ((0, 0), (0, n_total * CP - max_pages)), constant_values=-1)
    W = max_pages * P
    n_iter = (jnp.max(lens) + CP * P - 1) // (CP * P)

    def body(c, out):
        lg = _xla_chunk_logits(q, weights, k_cache, bt, lens, c, k_format=k_format, P=P, CP=CP,
                               num_pages=k_cache.shape[0])
        return lax.dynamic_update_slice_in_dim(out, lg, c * CP * P, axis=2)

    out = jnp.full((B, N, n_total * CP * P), -jnp.inf, jnp.float32)
    return lax.fori_loop(0, n_iter, body, out)[:, :, :W]


def canonical_scores(scores):
    """float32 scores with NaN -> -inf and -0.0 -> +0.0 (equal logits compare equal): how the
    SPEC top-k rule orders candidates (NaN never selected, the two zeros tie)."""
    s = scores.astype(jnp.float32)
    s = jnp.where(jnp.isnan(s), -jnp.inf, s)
    return jnp.where(s == 0.0, jnp.float32(0.0), s)


def _sort_desc(keys, pos):
    """Sort ``(keys, pos)`` rows by descending key, then ascending position."""
    return lax.sort((jnp.bitwise_not(keys), pos), dimension=-1, num_keys=2)


def _xla_topk(q, weights, k_cache, block_table, lens, topk, *, k_format, P, chunk=None):
    B, N = q.shape[:2]
    max_pages = block_table.shape[1]
    CP = _xla_chunk_pages(P, max_pages, chunk)
    n_total = -(-max_pages // CP)
    bt = jnp.pad(block_table, ((0, 0), (0, n_total * CP - max_pages)), constant_values=-1)
    n_iter = (jnp.max(lens) + CP * P - 1) // (CP * P)
    C = CP * P

    def body(c, carry):
        rkey, rpos = carry                                                     # [B, N, K]
        lg = _xla_chunk_logits(q, weights, k_cache, bt, lens, c, k_format=k_format, P=P, CP=CP,
                               num_pages=k_cache.shape[0])
        ckey = _pallas.order_key(lg, jnp.ones(lg.shape, bool))
        cpos = jnp.broadcast_to(c * C + jnp.arange(C, dtype=jnp.int32), (B, N, C))
        nkey, npos = _sort_desc(jnp.concatenate([rkey, ckey], -1), jnp.concatenate([rpos, cpos], -1))
        return jnp.bitwise_not(nkey[..., :topk]), npos[..., :topk]

    init = (jnp.full((B, N, topk), _pallas.SENTINEL, jnp.int32), jnp.full((B, N, topk), -1, jnp.int32))
    rkey, rpos = lax.fori_loop(0, n_iter, body, init)
    return jnp.where(rkey == _pallas.SENTINEL, -1, rpos)      # already sorted (desc, then position)


# ============================================================================ public API

def _plan(op, B, N, W, topk, path):
    """``kernels.registry`` plan of one call (the dispatch table read once, at trace time under
    ``jax.jit``). The bucket's L is the block table's capacity W, as in torch_impl: the lengths
    are device data, not read back."""
    dims = dict(B=B, N=N, L=W) if topk is None else dict(B=B, N=N, L=W, topk=topk)
    return plan(op, path, **dims)


def indexer_logits(q, weights, k_cache, block_table, context_lens, *, k_format="fp8_indexer",
                   path="auto"):
    """Lightning-indexer logits over a paged K cache (debugging / parity; the top-k path does not
    return them).

    Args:
      q: ``[B, N, H_I, D_I]`` ``float8_e4m3fn`` (``k_format="fp8_indexer"``) or float16 / bfloat16
        / float32 (``"dense"``, the cache's dtype). N = query tokens per request (MTP drafts).
      weights: ``[B, N, H_I]`` float32 per-head weights with the q scale, ``H_I^-0.5`` and
        ``D_I^-0.5`` already folded in (as DeepSeek's reference and DeepGEMM do).
      k_cache: ``"fp8_indexer"``: uint8 ``[num_pages, P * (D_I + 4)]``, per page P rows of D_I
        e4m3 bytes then P little-endian float32 scales (DeepGEMM's layout; P is inferred as
        ``bytes_per_page / (D_I + 4)``). ``"dense"``: ``[num_pages, P, D_I]`` float, scale 1.
      block_table: int32 ``[B, max_pages]``: logical position j of request b lives at slot
        ``block_table[b, j // P] * P + j % P``; entries past a request's pages may be -1. Pages
        whose entry is negative or ``>= num_pages`` are never read (their logits are -inf).
      context_lens: int32 ``[B]`` (L_b, counting the N new tokens; draft i sees
        ``L_b - (N - 1 - i)`` positions, DeepSeek's MTP causal mask) or ``[B, N]`` (per-draft
        lengths as given).
      k_format: ``"fp8_indexer"`` or ``"dense"``.
      path: ``"auto"``, ``"pallas"`` or ``"xla"``.
    Returns:
      float32 ``[B, N, W]``, ``W = max_pages * P``:
      ``logit[b,i,j] = k_scale[j] * sum_h weights[b,i,h] * relu(q[b,i,h,:] . k[j,:])`` (float32
      accumulation) for valid j, -inf elsewhere. NaN keys give NaN logits.
    Raises:
      TypeError / ValueError: an argument's dtype, rank or shape (named, expected and received),
        an unknown ``k_format`` or ``path``.
      NotImplementedError: ``path="pallas"`` on a GPU / page size / head dim the kernel does not
        support (names the GPU, its compute capability and what is supported), or with
        ``jax_enable_x64`` on (raised before launch; ``"auto"`` then runs the xla path).
    """
    B, N, H, D, P, _ = _validate(q, weights, k_cache, block_table, context_lens, k_format)
    W = int(block_table.shape[1]) * P
    lens = _draft_lengths(context_lens, B, N, W)

    def pallas():
        cfg = _pallas.PallasIndexerConfig.from_dict(cfg_auto)
        raw = _pallas_logits(q, weights, k_cache, block_table, lens, k_format=k_format, P=P, cfg=cfg)
        return _mask_logits(raw, lens, N, W)

    def xla():
        return _xla_logits(q, weights, k_cache, block_table, lens, k_format=k_format, P=P)

    pl = _plan("indexer_logits", B, N, W, None, path)
    cfg_auto = pl.configs.get("pallas")
    return run_path("indexer_logits", path, {"pallas": pallas, "xla": xla}, pl.order)


def _topk_setup(q, weights, k_cache, block_table, context_lens, topk, sorted, k_format):
    """Validated ``(B, N, P, W, lens, topk, k_work)`` of a top-k call: ``lens`` the per-draft
    valid lengths, ``k_work = min(topk, W)`` (no row holds more than W positions: the selection,
    sort and scratch are sized by it, the columns past it are -1 padding)."""
    B, N, H, D, P, _ = _validate(q, weights, k_cache, block_table, context_lens, k_format)
    _check_topk(topk, sorted, B, N)
    topk = int(topk)
    W = int(block_table.shape[1]) * P
    return B, N, P, W, _draft_lengths(context_lens, B, N, W), topk, min(topk, W)


@functools.partial(jax.jit, static_argnames=("k_work", "k_format", "P", "cfg"))
def _pallas_select(q, weights, k_cache, block_table, lens, k_work, *, k_format, P, cfg):
    """The Pallas logits (with their group maxima) and top-k kernels: ``(raw, idx)``, raw float32
    ``[B, NP, W_pad]`` logits (valid below ``lens``) and int32 ``[B, N, k_work]`` selected
    positions in ascending order, -1 padded.

    Jitted on its own so that a program calling it twice with the same shapes and statics
    (``indexer_topk`` sorted and unsorted, ``topk_candidates``) traces and lowers the kernels
    once; XLA inlines it."""
    N = q.shape[1]
    raw, gmax = _pallas_logits(q, weights, k_cache, block_table, lens, k_format=k_format, P=P,
                               cfg=cfg, group_max=True)
    idx = _pallas.launch_topk_select(raw, gmax, lens, k_work, num_rows=N, cfg=cfg,
                                     num_sms=device_info().num_sms)[:, :N, :k_work]
    return raw, idx


def indexer_topk(q, weights, k_cache, block_table, context_lens, topk, *, k_format="fp8_indexer",
                 sorted=False, path="auto"):
    """Exact top-k of the lightning-indexer logits: indices ``[B, N, topk]`` int32.

    Args:
      q, weights, k_cache, block_table, context_lens, k_format, path: as :func:`indexer_logits`.
      topk: K (a Python int >= 1, static under ``jax.jit``).
      sorted: if True, each row is in descending logit order (ties by smaller position), then
        the -1 padding; if False the order is unspecified (the pallas path emits ascending
        positions, the xla path descending logits).
    Returns:
      int32 ``[B, N, topk]``: logical positions (not slots) of the K largest logits among the
      valid positions whose logit is neither NaN nor -inf (+inf qualifies); ties at the
      threshold go to the smaller position, so the set is exact and deterministic. When fewer
      than K positions qualify all are selected and the rest of the row is -1. Every index is in
      ``[0, len[b, i])`` or -1, whatever the cache holds past the lengths. ``topk`` may exceed
      the table's capacity ``W = max_pages * P``: both paths select over ``min(topk, W)`` (the
      work, scratch and sort of that K) and pad the rest of the row with -1.
    Raises:
      TypeError / ValueError: as :func:`indexer_logits`; ``topk`` not an int >= 1, ``sorted``
        not a bool.
      NotImplementedError: as :func:`indexer_logits`.
    """
    B, N, P, W, lens, topk, k_work = _topk_setup(q, weights, k_cache, block_table, context_lens,
                                                 topk, sorted, k_format)

    def pad(idx):
        return jnp.pad(idx, ((0, 0), (0, 0), (0, topk - k_work)), constant_values=-1)

    def pallas():
        raw, idx = _pallas_select(q, weights, k_cache, block_table, lens, k_work, k_format=k_format,
                                  P=P, cfg=_pallas.PallasIndexerConfig.from_dict(cfg_auto))
        if not sorted:
            return pad(idx)
        vals = jnp.take_along_axis(raw[:, :N], jnp.maximum(idx, 0), axis=-1)
        keys = _pallas.order_key(vals, idx >= 0)
        return pad(_sort_desc(keys, idx)[1])

    def xla():
        return pad(_xla_topk(q, weights, k_cache, block_table, lens, k_work, k_format=k_format, P=P))

    pl = _plan("indexer_topk", B, N, W, topk, path)
    cfg_auto = pl.configs.get("pallas")
    return run_path("indexer_topk", path, {"pallas": pallas, "xla": xla}, pl.order)


def topk_candidates(q, weights, k_cache, block_table, context_lens, topk, *,
                    k_format="fp8_indexer", path="auto"):
    """The top-k of :func:`indexer_topk` with their logits, for a merge across shards
    (``jax_impl.tp.sequence_sharded_topk``): ``(scores, positions)``.

    Args: as :func:`indexer_topk` (``context_lens`` usually ``[B, N]`` per-draft lengths).
    Returns:
      ``scores`` float32 ``[B, N, topk]`` (the selected positions' logits, -inf on padding) and
      ``positions`` int32 ``[B, N, topk]`` (-1 padding last). Pallas path: the selection of the
      Pallas top-k kernels in ascending position order, scores gathered from the logits the
      logits kernel wrote (no second pass over the row); xla path: the masked logits row and
      ``lax.top_k`` (descending score, ties to the smaller position). Either way, among equal
      scores the positions ascend, which the shard merge needs. Same set as
      :func:`indexer_topk`.
    Raises: as :func:`indexer_topk`.
    """
    B, N, P, W, lens, topk, k_work = _topk_setup(q, weights, k_cache, block_table, context_lens,
                                                 topk, False, k_format)

    def pad(s, pos):
        w = ((0, 0), (0, 0), (0, topk - k_work))
        return (jnp.pad(s, w, constant_values=-jnp.inf), jnp.pad(pos, w, constant_values=-1))

    def pallas():
        raw, idx = _pallas_select(q, weights, k_cache, block_table, lens, k_work, k_format=k_format,
                                  P=P, cfg=_pallas.PallasIndexerConfig.from_dict(cfg_auto))
        vals = jnp.take_along_axis(raw[:, :N], jnp.maximum(idx, 0), axis=-1)
        return pad(jnp.where(idx >= 0, vals, -jnp.inf), idx)

    def xla():
        logits = canonical_scores(_mask_logits(
            _xla_logits(q, weights, k_cache, block_table, lens, k_format=k_format, P=P), lens, N, W))
        vals, ci = lax.top_k(logits, k_work)                        # stable: ties to the smaller
        return pad(vals, jnp.where(vals == -jnp.inf, -1, ci).astype(jnp.int32))

    pl = _plan("indexer_topk", B, N, W, topk, path)
    cfg_auto = pl.configs.get("pallas")
    return run_path("indexer_topk", path, {"pallas": pallas, "xla": xla}, pl.order)
