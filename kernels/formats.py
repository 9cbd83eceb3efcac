"""The cache byte layouts of docs/SPEC.md as NumPy / ml_dtypes code.

Every function here is the definition the kernels are tested against: the Triton and Pallas
kernels dequantize in-kernel and must agree with :func:`dequantize_fp8_ds_mla`,
:func:`dequantize_fp8_model1` and :func:`dequantize_fp8_indexer` bit for bit. The byte offsets
come from the layout descriptors of :mod:`kernels.layouts`, as the kernels' do.

Layouts (bytes little-endian; P = page size in tokens):

==============  ==============================  ============================================
name            array                           per token / per page
==============  ==============================  ============================================
``latent``      [num_pages, P, D_qk] float      plain latent rows (bf16, fp16 or fp32)
``fp8_ds_mla``  uint8 [num_pages, P, 656]       bytes 0..511 e4m3 nope dims; 512..527 four
                                                float32 scales (dims 128g..128g+127);
                                                528..655 the 64 rope dims as bf16
``fp8_model1``  uint8 [num_pages, page_bytes]   per page: P data rows of 576 bytes (448 e4m3
                                                nope + 64 bf16 rope), then P scale rows of 8
                                                bytes (7 ue8m0 scales, dims 64g..64g+63, and
                                                one zero pad byte); page_bytes = P*584 rounded
                                                up to a multiple of 576 (FlashMLA allocation)
``fp8_indexer`` uint8 [num_pages, P*(D_I+4)]    per page: P rows of D_I e4m3 bytes, then P
                                                float32 scales (DeepGEMM paged MQA layout)
==============  ==============================  ============================================

Pages of ``fp8_ds_mla`` / ``fp8_model1`` may lie further apart than their own bytes (a page
stride, in bytes, that is a multiple of :data:`FP8_PAGE_ALIGN` and at least ``P * 656`` /
``page_bytes``: FlashMLA's quantizer pads each V3.2 page by one token row); the sparse MLA
decode of ``torch_impl`` reads such strided pages in place. Everything inside a page is packed
as above.

Sources: FlashMLA ``tests/quant.py`` (V32_FP8Sparse, MODEL1_FP8Sparse), DeepGEMM
``fp8_paged_mqa_logits`` cache layout, DeepSeek-V3.2-Exp ``inference/kernel.py`` (``act_quant``).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from kernels import layouts
from kernels.scalars import check_int

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
E8M0 = ml_dtypes.float8_e8m0fnu
FP8_MAX = 448.0

_DS, _M1 = layouts.FP8_DS_MLA, layouts.FP8_MODEL1
_DS_NOPE, _DS_SCALE, _DS_ROPE = _DS.field("nope"), _DS.field("scale"), _DS.field("rope")
_M1_NOPE, _M1_ROPE, _M1_SCALE = _M1.field("nope"), _M1.field("rope"), _M1.field("scale")

DS_MLA_BYTES = _DS.data.nbytes                          # 656 bytes per token of fp8_ds_mla
DS_MLA_NOPE, DS_MLA_ROPE, DS_MLA_TILE = _DS_NOPE.count, _DS_ROPE.count, _DS.tile   # 512, 64, 128
MODEL1_NOPE, MODEL1_ROPE, MODEL1_TILE = _M1_NOPE.count, _M1_ROPE.count, _M1.tile   # 448, 64, 64
MODEL1_DATA_BYTES = _M1.data.nbytes                     # 576
MODEL1_SCALE_BYTES = _M1.scale.nbytes                   # 7 ue8m0 + 1 pad = 8
MODEL1_TOKEN_BYTES = _M1.token_bytes                    # 584
# Byte alignment of an fp8 cache's page stride (``stride(0)`` of a torch cache view): pages may
# be padded (FlashMLA's V3.2 quantizer allocates P + 1 rows a page and slices P), the sparse MLA
# kernels read them in place, and a multiple of 16 keeps every row start 16-byte aligned (656 and
# 576 are multiples of 16) for their 16-byte vector loads.
FP8_PAGE_ALIGN = 16

KV_FORMATS = ("latent", "fp8_ds_mla", "fp8_model1")
K_FORMATS = ("fp8_indexer", "dense")


def _check(name, arr, ndim=None, last=None, dtype=None):
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(arr).__name__}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name}: expected rank {ndim}, got shape {arr.shape}")
    if last is not None and arr.shape[-1] != last:
        raise ValueError(f"{name}: expected last dim {last}, got shape {arr.shape}")
    if dtype is not None and arr.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype).name}, got {arr.dtype}")


def pow2_scale(amax: np.ndarray) -> np.ndarray:
    """FlashMLA's ue8m0 scale: ``2^ceil(log2(max(amax / 448, 1e-4)))`` in float32."""
    s = np.maximum(np.asarray(amax, np.float32) / np.float32(FP8_MAX), np.float32(1e-4))
    return np.exp2(np.ceil(np.log2(s))).astype(np.float32)


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float8_e4m3fn of ``x`` clamped to +-448 (NaN stays NaN)."""
    return np.clip(np.asarray(x, np.float32), -FP8_MAX, FP8_MAX).astype(E4M3)


# ----------------------------------------------------------------------------- fp8_ds_mla

def quantize_fp8_ds_mla(latent: np.ndarray) -> np.ndarray:
    """Quantize latent rows into the V3.2 ``fp8_ds_mla`` layout.

    Args:
      latent: ``[..., 576]`` float (fp32, fp16 or bf16): 512 nope dims then 64 rope dims.
    Returns:
      uint8 ``[..., 656]``: 512 e4m3 bytes, four float32 scales (one per 128 nope dims,
      ``2^ceil(log2(max(amax/448, 1e-4)))``), 64 bf16 rope dims (RNE from the input).
    Raises:
      TypeError / ValueError: ``latent`` not an ndarray or last dim not 576.
    """
    _check("latent", latent, last=DS_MLA_NOPE + DS_MLA_ROPE)
    x = latent.astype(np.float32)
    lead = x.shape[:-1]
    nope = x[..., :DS_MLA_NOPE].reshape(*lead, _DS_SCALE.count, DS_MLA_TILE)
    scale = pow2_scale(np.abs(nope).max(axis=-1))                         # [..., 4]
    q = to_e4m3(nope / scale[..., None]).reshape(*lead, DS_MLA_NOPE)
    out = np.empty((*lead, DS_MLA_BYTES), np.uint8)
    out[..., _DS_NOPE.offset:_DS_NOPE.end] = q.view(np.uint8)
    out[..., _DS_SCALE.offset:_DS_SCALE.end] = (
        np.ascontiguousarray(scale).view(np.uint8).reshape(*lead, _DS_SCALE.nbytes))
    out[..., _DS_ROPE.offset:_DS_ROPE.end] = np.ascontiguousarray(
        x[..., DS_MLA_NOPE:].astype(BF16)).view(np.uint8).reshape(*lead, _DS_ROPE.nbytes)
    return out


def dequantize_fp8_ds_mla(cache: np.ndarray) -> np.ndarray:
    """Inverse of :func:`quantize_fp8_ds_mla`: uint8 ``[..., 656]`` -> float32 ``[..., 576]``.

    Every value is exact (e4m3 times a power of two, and bf16, both fit float32).
    """
    _check("cache", cache, last=DS_MLA_BYTES, dtype=np.uint8)
    c = np.ascontiguousarray(cache)
    lead = c.shape[:-1]
    q = c[..., _DS_NOPE.offset:_DS_NOPE.end].view(E4M3).astype(np.float32)
    q = q.reshape(*lead, _DS_SCALE.count, DS_MLA_TILE)
    scale = c[..., _DS_SCALE.offset:_DS_SCALE.end].copy().view(np.float32)
    rope = c[..., _DS_ROPE.offset:_DS_ROPE.end].copy().view(BF16).astype(np.float32)
    return np.concatenate([(q * scale[..., None]).reshape(*lead, DS_MLA_NOPE), rope], axis=-1)


# ----------------------------------------------------------------------------- fp8_model1

def model1_page_bytes(page_size: int) -> int:
    """Bytes per page of ``fp8_model1``: ``P * 584`` rounded up to a multiple of 576."""
    return _M1.page_bytes(page_size)


def model1_page_size(page_bytes: int) -> int:
    """Inverse of :func:`model1_page_bytes` (raises ValueError if no page size matches)."""
    p = page_bytes // MODEL1_TOKEN_BYTES
    for cand in (p, p - 1, p + 1):
        if cand > 0 and model1_page_bytes(cand) == page_bytes:
            return cand
    raise ValueError(f"kv_cache: {page_bytes} bytes per page is no fp8_model1 page "
                     f"(P*584 rounded up to a multiple of 576)")


def resolve_model1_page_size(page_bytes: int, page_size=None) -> int:
    """P of an ``fp8_model1`` page of ``page_bytes`` bytes: ``page_size`` checked against it, or
    the P it implies when ``page_size`` is None.

    Raises:
      TypeError: ``page_size`` not an int (kernels.scalars rule). ValueError: ``page_size`` < 1,
        or its page would not be ``page_bytes`` bytes; no P matches ``page_bytes``.
    """
    if page_size is None:
        return model1_page_size(page_bytes)
    p = check_int("page_size", page_size, minimum=1)
    if model1_page_bytes(p) != page_bytes:
        raise ValueError(f"page_size: {p} slots make an fp8_model1 page of {model1_page_bytes(p)} "
                         f"bytes, the cache's pages have {page_bytes}")
    return p


def indexer_page_size(page_bytes: int, head_dim) -> int:
    """P of an ``fp8_indexer`` page of ``page_bytes`` bytes (``P * (head_dim + 4)``).

    Raises:
      TypeError: ``head_dim`` not an int. ValueError: ``head_dim`` < 1, or ``page_bytes`` not a
        positive multiple of ``head_dim + 4``.
    """
    d = check_int("head_dim", head_dim, minimum=1)
    token = layouts.fp8_indexer(d).token_bytes                           # D_I + 4
    if page_bytes < 1 or page_bytes % token:
        raise ValueError(f"k_cache: {page_bytes} bytes per page is not a positive multiple of "
                         f"D_I + 4 = {token}")
    return page_bytes // token


def quantize_fp8_model1(latent: np.ndarray) -> np.ndarray:
    """Quantize latent pages into the V4-Flash ``fp8_model1`` layout.

    Args:
      latent: ``[num_pages, P, 512]`` float: 448 nope dims then 64 rope dims.
    Returns:
      uint8 ``[num_pages, model1_page_bytes(P)]`` (layout in the module docstring); scales are
      ue8m0 bytes ``127 + ceil(log2(max(amax/448, 1e-4)))`` per 64 nope dims.
    """
    _check("latent", latent, ndim=3, last=MODEL1_NOPE + MODEL1_ROPE)
    x = latent.astype(np.float32)
    n, p, _ = x.shape
    nope = x[..., :MODEL1_NOPE].reshape(n, p, _M1_SCALE.count, MODEL1_TILE)
    scale = pow2_scale(np.abs(nope).max(axis=-1))                         # [n, p, 7]
    q = to_e4m3(nope / scale[..., None]).reshape(n, p, MODEL1_NOPE)
    out = np.zeros((n, model1_page_bytes(p)), np.uint8)                  # pad bytes stay 0
    data = out[:, : p * MODEL1_DATA_BYTES].reshape(n, p, MODEL1_DATA_BYTES)
    data[..., _M1_NOPE.offset:_M1_NOPE.end] = q.view(np.uint8)
    data[..., _M1_ROPE.offset:_M1_ROPE.end] = np.ascontiguousarray(
        x[..., MODEL1_NOPE:].astype(BF16)).view(np.uint8).reshape(n, p, _M1_ROPE.nbytes)
    sc = out[:, _M1.scale_offset(p, 0): _M1.scale_offset(p, p)].reshape(n, p, MODEL1_SCALE_BYTES)
    sc[..., _M1_SCALE.offset:_M1_SCALE.end] = scale.astype(E8M0).view(np.uint8)
    return out


def dequantize_fp8_model1(cache: np.ndarray, page_size: int | None = None) -> np.ndarray:
    """Inverse of :func:`quantize_fp8_model1`: uint8 ``[num_pages, page_bytes]`` -> float32
    ``[num_pages, P, 512]`` (exact)."""
    _check("cache", cache, ndim=2, dtype=np.uint8)
    p = resolve_model1_page_size(cache.shape[1], page_size)
    n = cache.shape[0]
    c = np.ascontiguousarray(cache)
    data = c[:, : p * MODEL1_DATA_BYTES].reshape(n, p, MODEL1_DATA_BYTES)
    q = data[..., _M1_NOPE.offset:_M1_NOPE.end].copy().view(E4M3).astype(np.float32)
    q = q.reshape(n, p, _M1_SCALE.count, MODEL1_TILE)
    rope = data[..., _M1_ROPE.offset:_M1_ROPE.end].copy().view(BF16).astype(np.float32)
    sc = c[:, _M1.scale_offset(p, 0): _M1.scale_offset(p, p)].reshape(n, p, MODEL1_SCALE_BYTES)
    scale = sc[..., _M1_SCALE.offset:_M1_SCALE.end].copy().view(E8M0).astype(np.float32)
    return np.concatenate([(q * scale[..., None]).reshape(n, p, MODEL1_NOPE), rope], axis=-1)


# ----------------------------------------------------------------------------- fp8_indexer

def indexer_scale(amax: np.ndarray, scale_fmt: str | None) -> np.ndarray:
    """Per-token indexer scale, DeepSeek ``act_quant``: ``max(amax, 1e-4) / 448``, or with
    ``scale_fmt="ue8m0"`` that rounded up to a power of two."""
    if scale_fmt not in (None, "ue8m0"):
        raise ValueError(f"scale_fmt: expected None or 'ue8m0', got {scale_fmt!r}")
    s = np.maximum(np.asarray(amax, np.float32), np.float32(1e-4)) / np.float32(FP8_MAX)
    if scale_fmt == "ue8m0":
        s = np.exp2(np.ceil(np.log2(s)))
    return s.astype(np.float32)


def quantize_fp8_indexer(k: np.ndarray, scale_fmt: str | None = "ue8m0") -> np.ndarray:
    """Quantize indexer keys into DeepGEMM's paged ``fp8_indexer`` layout.

    Args:
      k: ``[num_pages, P, D_I]`` float indexer keys.
      scale_fmt: ``"ue8m0"`` (the model's setting) or None (``amax / 448``).
    Returns:
      uint8 ``[num_pages, P * (D_I + 4)]``: P rows of D_I e4m3 bytes, then P float32 scales.
    """
    _check("k", k, ndim=3)
    x = k.astype(np.float32)
    n, p, d = x.shape
    scale = indexer_scale(np.abs(x).max(axis=-1), scale_fmt)              # [n, p]
    q = to_e4m3(x / scale[..., None])
    lay = layouts.fp8_indexer(d)
    out = np.empty((n, lay.page_bytes(p)), np.uint8)
    out[:, : lay.scale_offset(p, 0)] = q.view(np.uint8).reshape(n, p * d)
    out[:, lay.scale_offset(p, 0):] = np.ascontiguousarray(scale).view(np.uint8).reshape(n, -1)
    return out


def split_fp8_indexer(cache: np.ndarray, head_dim: int = 128):
    """Views of an ``fp8_indexer`` cache: (e4m3 values ``[n, P, D_I]``, float32 scales ``[n, P]``)."""
    _check("k_cache", cache, ndim=2, dtype=np.uint8)
    n, page_bytes = cache.shape
    p = indexer_page_size(page_bytes, head_dim)
    head_dim = int(head_dim)
    s0 = layouts.fp8_indexer(head_dim).scale_offset(p, 0)
    c = np.ascontiguousarray(cache)
    vals = c[:, :s0].reshape(n, p, head_dim).copy().view(E4M3)
    scales = c[:, s0:].copy().view(np.float32).reshape(n, p)
    return vals, scales


def dequantize_fp8_indexer(cache: np.ndarray, head_dim: int = 128) -> np.ndarray:
    """Inverse of :func:`quantize_fp8_indexer`: -> float32 ``[num_pages, P, D_I]`` (value x scale)."""
    vals, scales = split_fp8_indexer(cache, head_dim)
    return vals.astype(np.float32) * scales[..., None]


# ----------------------------------------------------------------------------- latent views

def dequantize_kv(kv_cache: np.ndarray, kv_format: str, d_qk: int | None = None) -> np.ndarray:
    """Any latent cache -> float64 rows ``[num_slots, D_qk]`` (slot = page * P + offset)."""
    if kv_format == "latent":
        _check("kv_cache", kv_cache, ndim=3)
        rows = kv_cache.astype(np.float64)
    elif kv_format == "fp8_ds_mla":
        _check("kv_cache", kv_cache, ndim=3, last=DS_MLA_BYTES, dtype=np.uint8)
        rows = dequantize_fp8_ds_mla(kv_cache).astype(np.float64)
    elif kv_format == "fp8_model1":
        rows = dequantize_fp8_model1(kv_cache).astype(np.float64)
    else:
        raise ValueError(f"kv_format: expected one of {KV_FORMATS}, got {kv_format!r}")
    return rows.reshape(-1, rows.shape[-1])


def quantize_kv(latent: np.ndarray, kv_format: str, latent_dtype=np.float32) -> np.ndarray:
    """Latent pages ``[num_pages, P, D_qk]`` float -> a cache in ``kv_format``: the rows cast to
    ``latent_dtype`` (``"latent"``), or :func:`quantize_fp8_ds_mla` / :func:`quantize_fp8_model1`.

    Raises:
      ValueError: unknown ``kv_format`` (or a D_qk the layout does not hold).
    """
    if kv_format == "latent":
        return latent.astype(latent_dtype)
    if kv_format == "fp8_ds_mla":
        return quantize_fp8_ds_mla(latent)
    if kv_format == "fp8_model1":
        return quantize_fp8_model1(latent)
    raise ValueError(f"kv_format: expected one of {KV_FORMATS}, got {kv_format!r}")


CACHE_FORMATS = KV_FORMATS + ("fp8_indexer",)


def cache_shape(fmt: str, num_pages: int, page_size: int, dim: int) -> tuple[int, ...]:
    """Shape of a cache of ``num_pages`` pages of ``page_size`` tokens holding rows of ``dim``
    values: ``latent`` ``[n, P, dim]``, ``fp8_ds_mla`` ``[n, P, 656]``, ``fp8_model1``
    ``[n, model1_page_bytes(P)]``, ``fp8_indexer`` ``[n, P * (dim + 4)]`` (the layouts of
    :mod:`kernels.layouts`; the fp8 latent formats fix ``dim``, which is not checked here).

    Raises:
      ValueError: ``fmt`` not in :data:`CACHE_FORMATS`.
    """
    if fmt == "latent":
        return (num_pages, page_size, dim)
    if fmt == "fp8_ds_mla":
        return (num_pages, page_size, DS_MLA_BYTES)
    if fmt == "fp8_model1":
        return (num_pages, model1_page_bytes(page_size))
    if fmt == "fp8_indexer":
        return (num_pages, layouts.fp8_indexer(dim).page_bytes(page_size))
    raise ValueError(f"fmt: expected one of {CACHE_FORMATS}, got {fmt!r}")


def kv_page_size(kv_cache: np.ndarray, kv_format: str) -> int:
    """Page size P of a latent cache in any layout."""
    if kv_format == "fp8_model1":
        return model1_page_size(kv_cache.shape[1])
    return kv_cache.shape[1]


def kv_num_slots(kv_cache: np.ndarray, kv_format: str) -> int:
    """Number of addressable slots (num_pages * P)."""
    return kv_cache.shape[0] * kv_page_size(kv_cache, kv_format)


def check_shared_page_pool(kv_shape, kv_format: str, k_shape, k_format: str, index_head_dim) -> None:
    """``dsa_decode_step``'s caches share one block table, so their page pools must match:
    the same page count and page size P. Shapes only (no values read); shapes malformed for
    their format are left to the ops' own checks (nothing is raised for them here).

    Args:
      kv_shape: the latent cache's shape in ``kv_format``'s layout (``[num_pages, P, D]`` or
        fp8_model1's ``[num_pages, page_bytes]``).
      k_shape: the indexer cache's shape (``fp8_indexer`` ``[num_pages, P * (D_I + 4)]``,
        ``dense`` ``[num_pages, P, D_I]``); ``index_head_dim``: D_I (idx_q's last dim).
    Raises:
      ValueError: naming ``k_cache``, the two page counts / page sizes differ.
    """
    try:
        kv_pages = int(kv_shape[0])
        P_kv = (model1_page_size(int(kv_shape[1])) if kv_format == "fp8_model1"
                else int(kv_shape[1]))
        k_pages = int(k_shape[0])
        P_k = (indexer_page_size(int(k_shape[1]), int(index_head_dim)) if k_format == "fp8_indexer"
               else int(k_shape[1]))
    except (IndexError, TypeError, ValueError):
        return
    if (kv_pages, P_kv) != (k_pages, P_k):
        raise ValueError(f"k_cache: expected the page pool of kv_cache (num_pages {kv_pages}, page "
                         f"size {P_kv}: one block_table addresses both caches), got num_pages "
                         f"{k_pages}, page size {P_k}")


# ----------------------------------------------------------------------------- paging

def logical_to_slot(positions: np.ndarray, block_table: np.ndarray, page_size: int) -> np.ndarray:
    """Map logical positions of each request to cache slots through its block table.

    Args:
      positions: int ``[B, ...]`` logical positions of request b (any trailing shape).
      block_table: int32 ``[B, max_pages]``; entries past a request's pages may be -1.
      page_size: P.
    Returns:
      int64 ``[B, ...]`` slots ``block_table[b, j // P] * P + j % P``; -1 where the position is
      negative, ``>= max_pages * P``, or its page entry is negative (never dereferenced).
    """
    pos = np.asarray(positions, np.int64)
    bt = np.asarray(block_table, np.int64)
    b, max_pages = bt.shape
    flat = pos.reshape(b, -1)
    ok = (flat >= 0) & (flat < max_pages * page_size)
    page = np.where(ok, flat // page_size, 0)
    entry = np.take_along_axis(bt, page, axis=1)
    ok &= entry >= 0
    slot = np.where(ok, entry * page_size + flat % page_size, -1)
    return slot.reshape(pos.shape)


def slot_to_page_offset(slots: np.ndarray, page_size: int):
    """Split slots into (page, offset); negative slots give (-1, -1)."""
    s = np.asarray(slots, np.int64)
    neg = s < 0
    return np.where(neg, -1, s // page_size), np.where(neg, -1, s % page_size)
