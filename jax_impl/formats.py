"""Cache writers and readers in jax.numpy: byte-exact twins of ``kernels/formats.py``.

Same names, same layouts (docs/SPEC.md "Cache layouts"; the byte tables are in
``kernels/formats.py``, taken from FlashMLA ``tests/quant.py`` and DeepGEMM's paged MQA layout).
Every function is jit-compatible (shapes are static), allocates only output-sized arrays and
runs on any backend. Dequantizers return float32 and are exact.

Scale rule. The NumPy definition computes ``2^ceil(log2(s))`` with float32 ``np.log2``; XLA's
``log2`` is not guaranteed to be exact, even at powers of two, so here the exponent is taken from
the float32 bits: ``ceil(log2(s)) = e + (mantissa > T[e])`` where ``T[e]`` (computed once from
NumPy's own float32 ``log2``, :func:`_ceil_log2_table`) is the largest mantissa for which float32
``log2`` still rounds to the integer ``e``. This reproduces NumPy's result bit for bit, including
the few inputs just above a power of two where float32 ``log2`` rounds down.
"""
from __future__ import annotations

from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from jax_impl._common import check_array
from kernels import formats as _nf

FP8_MAX = _nf.FP8_MAX


def _check(name: str, a, *, ndim: int | None = None, last: int | None = None, dtype=None,
           floating: bool = False) -> None:
    check_array(name, a)          # a torch tensor, a list, ...: TypeError naming ``name``
    if ndim is not None and len(a.shape) != ndim:
        raise ValueError(f"{name}: expected rank {ndim}, got shape {tuple(a.shape)}")
    if last is not None and (len(a.shape) == 0 or a.shape[-1] != last):
        raise ValueError(f"{name}: expected last dim {last}, got shape {tuple(a.shape)}")
    if dtype is not None and jnp.dtype(a.dtype) != jnp.dtype(dtype):
        raise TypeError(f"{name}: expected dtype {jnp.dtype(dtype).name}, got {jnp.dtype(a.dtype).name}")
    if floating and not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(f"{name}: expected a floating-point array, got {jnp.dtype(a.dtype).name}")


@lru_cache(maxsize=None)
def _ceil_log2_table() -> np.ndarray:
    """int32 [256]: for each float32 biased exponent ``e``, the largest 23-bit mantissa ``m`` such
    that NumPy's float32 ``log2(2^(e-127) * (1 + m/2^23))`` rounds to exactly ``e - 127``
    (so ``ceil`` gives ``e - 127``). Found by bisection (float32 log2 is monotone)."""
    table = np.zeros(256, np.int32)
    for e in range(1, 255):
        j = np.float32(e - 127)

        def rounds_down(m: int) -> bool:
            bits = np.uint32((e << 23) | m)
            return bool(np.ceil(np.log2(bits.view(np.float32))) == j)

        lo, hi = 0, (1 << 23) - 1          # invariant: rounds_down(lo) (m=0 is exact)
        if rounds_down(hi):
            table[e] = hi
            continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if rounds_down(mid):
                lo = mid
            else:
                hi = mid
        table[e] = lo
    return table


def _pow2_ceil(s: jax.Array) -> jax.Array:
    """``2^ceil(log2(s))`` for positive normal float32 ``s``, bit-identical to NumPy's
    ``np.exp2(np.ceil(np.log2(s)))`` in float32; NaN and +inf pass through (as in NumPy; the
    exponent bump would otherwise carry a NaN into the sign bit: -0.0)."""
    s = s.astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(s, jnp.uint32)
    e = (bits >> 23) & 0xFF
    m = bits & 0x7FFFFF
    up = m > jnp.asarray(_ceil_log2_table())[e].astype(jnp.uint32)
    out = jax.lax.bitcast_convert_type((e + up.astype(jnp.uint32)) << 23, jnp.float32)
    return jnp.where(e == 0xFF, s, out)


def _div_448(x: jax.Array) -> jax.Array:
    """``x / 448`` correctly rounded, as NumPy computes it. XLA rewrites division by a constant
    into multiplication by its (inexact) reciprocal; an optimization barrier on a full-shape
    divisor keeps it a true division."""
    d = jax.lax.optimization_barrier(jnp.full(x.shape, FP8_MAX, jnp.float32))
    return x / d


def pow2_scale(amax: jax.Array) -> jax.Array:
    """FlashMLA's ue8m0 scale ``2^ceil(log2(max(amax / 448, 1e-4)))``, float32."""
    s = jnp.maximum(_div_448(amax.astype(jnp.float32)), jnp.float32(1e-4))
    return _pow2_ceil(s)


def to_e4m3_bytes(x: jax.Array) -> jax.Array:
    """Round-to-nearest-even e4m3 of ``x`` clamped to +-448, as uint8 bytes (same shape)."""
    q = jnp.clip(x.astype(jnp.float32), -FP8_MAX, FP8_MAX).astype(jnp.float8_e4m3fn)
    return jax.lax.bitcast_convert_type(q, jnp.uint8)


def _bytes_of(x: jax.Array) -> jax.Array:
    """Little-endian bytes of the last dim: ``[..., d]`` (itemsize n) -> uint8 ``[..., d * n]``."""
    b = jax.lax.bitcast_convert_type(x, jnp.uint8)
    if b.ndim == x.ndim:
        return b
    return b.reshape(*x.shape[:-1], x.shape[-1] * b.shape[-1])


def _from_bytes(b: jax.Array, dtype) -> jax.Array:
    """Inverse of :func:`_bytes_of`: uint8 ``[..., d * n]`` -> ``[..., d]`` of ``dtype``."""
    n = jnp.dtype(dtype).itemsize
    if n == 1:
        return jax.lax.bitcast_convert_type(b, dtype)
    return jax.lax.bitcast_convert_type(b.reshape(*b.shape[:-1], b.shape[-1] // n, n), dtype)


def _ue8m0_to_f32(e: jax.Array) -> jax.Array:
    """ue8m0 byte -> float32 ``2^(e-127)`` (0xFF -> NaN, 0 -> 2^-127), as ml_dtypes e8m0fnu."""
    e32 = e.astype(jnp.uint32)
    v = jax.lax.bitcast_convert_type(e32 << 23, jnp.float32)
    v = jnp.where(e32 == 0, jnp.float32(2.0 ** -127), v)
    return jnp.where(e32 == 0xFF, jnp.float32(jnp.nan), v)


# ----------------------------------------------------------------------------- fp8_ds_mla

def quantize_fp8_ds_mla(latent: jax.Array) -> jax.Array:
    """Quantize latent rows into the V3.2 ``fp8_ds_mla`` layout (byte-exact with
    ``kernels.formats.quantize_fp8_ds_mla``).

    Args:
      latent: ``[..., 576]`` float (fp32, fp16 or bf16): 512 nope dims then 64 rope dims.
    Returns:
      uint8 ``[..., 656]``: bytes 0..511 the nope dims as e4m3 (RNE, clamped to +-448) of
      ``x / scale``; bytes 512..527 four float32 scales ``2^ceil(log2(max(amax/448, 1e-4)))``,
      one per 128 nope dims; bytes 528..655 the 64 rope dims as bf16 (RNE).
    Raises:
      TypeError: ``latent`` is not a floating-point jax.Array.
      ValueError: its last dim is not 576.
    """
    _check("latent", latent, last=_nf.DS_MLA_NOPE + _nf.DS_MLA_ROPE, floating=True)
    x = latent.astype(jnp.float32)
    lead = x.shape[:-1]
    nope = x[..., :_nf.DS_MLA_NOPE].reshape(*lead, 4, _nf.DS_MLA_TILE)
    scale = pow2_scale(jnp.max(jnp.abs(nope), axis=-1))                     # [..., 4]
    q = to_e4m3_bytes(nope / scale[..., None]).reshape(*lead, _nf.DS_MLA_NOPE)
    rope = _bytes_of(x[..., _nf.DS_MLA_NOPE:].astype(jnp.bfloat16))         # [..., 128]
    return jnp.concatenate([q, _bytes_of(scale), rope], axis=-1)


def dequantize_fp8_ds_mla(cache: jax.Array) -> jax.Array:
    """Inverse of :func:`quantize_fp8_ds_mla`: uint8 ``[..., 656]`` -> float32 ``[..., 576]``
    (``float(e4m3) * scale`` for the nope dims, the bf16 rope dims widened; exact)."""
    _check("cache", cache, last=_nf.DS_MLA_BYTES, dtype=jnp.uint8)
    lead = cache.shape[:-1]
    q = _from_bytes(cache[..., :512], jnp.float8_e4m3fn).astype(jnp.float32)
    scale = _from_bytes(cache[..., 512:528], jnp.float32)                   # [..., 4]
    rope = _from_bytes(cache[..., 528:], jnp.bfloat16).astype(jnp.float32)
    nope = (q.reshape(*lead, 4, _nf.DS_MLA_TILE) * scale[..., None]).reshape(*lead, 512)
    return jnp.concatenate([nope, rope], axis=-1)


# ----------------------------------------------------------------------------- fp8_model1

def quantize_fp8_model1(latent: jax.Array) -> jax.Array:
    """Quantize latent pages into the V4-Flash ``fp8_model1`` layout (byte-exact with
    ``kernels.formats.quantize_fp8_model1``).

    Args:
      latent: ``[num_pages, P, 512]`` float: 448 nope dims then 64 rope dims.
    Returns:
      uint8 ``[num_pages, page_bytes]``, ``page_bytes = kernels.formats.model1_page_bytes(P)``
      (P * 584 rounded up to a multiple of 576): per page, P data rows of 576 bytes (448 e4m3
      bytes, then 64 bf16 rope dims), then P scale rows of 8 bytes (7 ue8m0 exponents
      ``127 + log2(scale)``, one per 64 nope dims, and a zero pad byte), then zero padding.
    Raises:
      TypeError / ValueError: ``latent`` not floating, not rank 3, or last dim not 512.
    """
    _check("latent", latent, ndim=3, last=_nf.MODEL1_NOPE + _nf.MODEL1_ROPE, floating=True)
    x = latent.astype(jnp.float32)
    n, p, _ = x.shape
    nope = x[..., :_nf.MODEL1_NOPE].reshape(n, p, 7, _nf.MODEL1_TILE)
    scale = pow2_scale(jnp.max(jnp.abs(nope), axis=-1))                     # [n, p, 7]
    q = to_e4m3_bytes(nope / scale[..., None]).reshape(n, p, _nf.MODEL1_NOPE)
    rope = _bytes_of(x[..., _nf.MODEL1_NOPE:].astype(jnp.bfloat16))         # [n, p, 128]
    data = jnp.concatenate([q, rope], axis=-1).reshape(n, p * _nf.MODEL1_DATA_BYTES)
    e = ((jax.lax.bitcast_convert_type(scale, jnp.uint32) >> 23) & 0xFF).astype(jnp.uint8)
    sc = jnp.concatenate([e, jnp.zeros((n, p, 1), jnp.uint8)], axis=-1).reshape(n, p * 8)
    pad = _nf.model1_page_bytes(p) - p * _nf.MODEL1_TOKEN_BYTES
    return jnp.concatenate([data, sc, jnp.zeros((n, pad), jnp.uint8)], axis=-1)


def dequantize_fp8_model1(cache: jax.Array, page_size: int | None = None) -> jax.Array:
    """Inverse of :func:`quantize_fp8_model1`: uint8 ``[num_pages, page_bytes]`` -> float32
    ``[num_pages, P, 512]`` (exact). ``page_size`` defaults to the P implied by page_bytes.

    Raises:
      TypeError / ValueError: ``cache`` not uint8 rank 2; ``page_size`` not an int, < 1, or not
        the P of the cache's page bytes (None: the P they imply; no P matches).
    """
    _check("cache", cache, ndim=2, dtype=jnp.uint8)
    p = _nf.resolve_model1_page_size(cache.shape[1], page_size)
    n = cache.shape[0]
    data = cache[:, : p * _nf.MODEL1_DATA_BYTES].reshape(n, p, _nf.MODEL1_DATA_BYTES)
    q = _from_bytes(data[..., :_nf.MODEL1_NOPE], jnp.float8_e4m3fn).astype(jnp.float32)
    rope = _from_bytes(data[..., _nf.MODEL1_NOPE:], jnp.bfloat16).astype(jnp.float32)
    sc = cache[:, p * _nf.MODEL1_DATA_BYTES: p * _nf.MODEL1_TOKEN_BYTES].reshape(n, p, 8)[..., :7]
    scale = _ue8m0_to_f32(sc)                                               # [n, p, 7]
    nope = (q.reshape(n, p, 7, _nf.MODEL1_TILE) * scale[..., None]).reshape(n, p, _nf.MODEL1_NOPE)
    return jnp.concatenate([nope, rope], axis=-1)


# ----------------------------------------------------------------------------- fp8_indexer

def indexer_scale(amax: jax.Array, scale_fmt: str | None) -> jax.Array:
    """Per-token indexer scale (DeepSeek ``act_quant``): ``max(amax, 1e-4) / 448``, or with
    ``scale_fmt="ue8m0"`` that rounded up to a power of two. float32.

    Raises:
      ValueError: ``scale_fmt`` is neither None nor ``"ue8m0"``.
    """
    if scale_fmt not in (None, "ue8m0"):
        raise ValueError(f"scale_fmt: expected None or 'ue8m0', got {scale_fmt!r}")
    s = _div_448(jnp.maximum(amax.astype(jnp.float32), jnp.float32(1e-4)))
    return _pow2_ceil(s) if scale_fmt == "ue8m0" else s


def quantize_fp8_indexer(k: jax.Array, scale_fmt: str | None = "ue8m0") -> jax.Array:
    """Quantize indexer keys into DeepGEMM's paged ``fp8_indexer`` layout (byte-exact with
    ``kernels.formats.quantize_fp8_indexer``).

    Args:
      k: ``[num_pages, P, D_I]`` float indexer keys.
      scale_fmt: ``"ue8m0"`` (the model's setting) or None (``amax / 448``).
    Returns:
      uint8 ``[num_pages, P * (D_I + 4)]``: per page, P rows of D_I e4m3 bytes (token t at
      bytes ``t*D_I .. (t+1)*D_I``), then P float32 scales (token t's at byte ``P*D_I + 4t``).
    Raises:
      TypeError / ValueError: ``k`` not floating or not rank 3; bad ``scale_fmt``.
    """
    _check("k", k, ndim=3, floating=True)
    x = k.astype(jnp.float32)
    n, p, d = x.shape
    scale = indexer_scale(jnp.max(jnp.abs(x), axis=-1), scale_fmt)          # [n, p]
    q = to_e4m3_bytes(x / scale[..., None]).reshape(n, p * d)
    return jnp.concatenate([q, _bytes_of(scale)], axis=-1)


def split_fp8_indexer(cache: jax.Array, head_dim: int = 128):
    """(e4m3 values ``[num_pages, P, D_I]`` float8_e4m3fn, float32 scales ``[num_pages, P]``).

    Raises:
      TypeError / ValueError: ``cache`` not uint8 rank 2; ``head_dim`` not an int or < 1; bytes
      per page not a positive multiple of ``head_dim + 4``.
    """
    _check("k_cache", cache, ndim=2, dtype=jnp.uint8)
    n, page_bytes = cache.shape
    p = _nf.indexer_page_size(page_bytes, head_dim)
    head_dim = int(head_dim)
    vals = _from_bytes(cache[:, : p * head_dim].reshape(n, p, head_dim), jnp.float8_e4m3fn)
    scales = _from_bytes(cache[:, p * head_dim:], jnp.float32)
    return vals, scales


def dequantize_fp8_indexer(cache: jax.Array, head_dim: int = 128) -> jax.Array:
    """Inverse of :func:`quantize_fp8_indexer`: -> float32 ``[num_pages, P, D_I]`` (e4m3 value
    times the token's scale)."""
    vals, scales = split_fp8_indexer(cache, head_dim)
    return vals.astype(jnp.float32) * scales[..., None]
