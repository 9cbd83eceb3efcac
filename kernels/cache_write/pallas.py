"""The new tokens' cache writes of one decode step (quantize + scatter into pages) as one Pallas
kernel per cache (Triton lowering; ``jax_impl.layer`` binding). The twin of
``kernels/cache_write/triton.py``: same operation, same unmapped-token drop, same bytes (those of
the NumPy writers in ``kernels/formats.py``; ``tests/test_cache_write.py`` checks them bit for bit).

Token ``t = b * N + i`` sits at position ``pos = L_b - N + i``, page ``block_table[b, pos // P]``,
offset ``pos % P``; unmapped (``pos`` outside ``[0, max_pages * P)`` or the page entry outside
``[0, num_pages)``): every store of the token is masked off (docs/SEMANTICS.md).

Expressing the byte scatter in Pallas: the cache is passed as ``uint8 [num_pages, page_bytes]``
(``latent``: ``[num_pages, P * D]`` of its float dtype; free XLA reshapes) and aliased to the
output (``input_output_aliases``), so the kernel writes only the token's bytes and, with the
cache donated by the caller's ``jit``, nothing is copied. Refs keep their dtype (no reinterpreting
views, see ``kernels/sparse_mla/pallas.py``), so float32 scales and bf16 rope dims are split into
bytes with shifts and stored through byte-index arrays (``[64, 2]`` for the rope, ``[G, 4]`` for
the scales). Encodings are integer bit manipulation, as in the Triton twin (e4m3 and bf16
round-to-nearest-even from the float32 bits; the power-of-two scale's exponent from the bits of
``s``, with float32 ``log2``'s rounding to an integer reproduced; true IEEE division by 448 and
by the scale). Block shapes are powers of two (a Triton requirement): 576-wide rows are loaded
as ``[4, 128]`` + ``[64]`` (``fp8_ds_mla``) or ``[8, 64]`` (7 groups, one masked) + ``[64]``.

Grid ``(B * N,)``, one program per new token, 4 warps.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels._pallas_call import interpret_default, triton_call
from kernels.layouts import FP8_DS_MLA as _DS, FP8_MODEL1 as _M1

FORMATS = ("latent", "fp8_ds_mla", "fp8_model1", "fp8_indexer")

# Byte layouts (kernels.layouts): offsets within a token's row, in bytes
DS_MLA_BYTES, DS_MLA_SCALE_AT, DS_MLA_ROPE_AT = (_DS.data.nbytes, _DS.field("scale").offset,
                                                 _DS.field("rope").offset)        # 656, 512, 528
MODEL1_DATA_BYTES, MODEL1_ROPE_AT, MODEL1_SCALE_BYTES = (_M1.data.nbytes, _M1.field("rope").offset,
                                                         _M1.scale.nbytes)        # 576, 448, 8


def _bits(x):
    return lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)


def bf16_bits(x):
    """Round-to-nearest-even bf16 bits (int32 in [0, 65535]) of float32 ``x``; NaN stays a quiet
    NaN with its sign."""
    u = _bits(x)
    r = lax.shift_right_arithmetic(u + 0x7FFF + (lax.shift_right_logical(u, 16) & 1), 16)
    r = jnp.where((u & 0x7FFFFFFF) > 0x7F800000, lax.shift_right_arithmetic(u, 16) | 0x40, r)
    return r & 0xFFFF


def e4m3_bits(y):
    """float8_e4m3fn bits (int32 in [0, 255]) of ``clamp(y, -448, 448)``, round to nearest even;
    NaN -> 0x7F with the sign of ``y``."""
    u = _bits(y)
    sign = jnp.where(u < 0, 0x80, 0)
    a = u & 0x7FFFFFFF
    nan = a > 0x7F800000
    a = jnp.minimum(a, 0x43E00000)
    normal = lax.shift_right_logical(a + 0x7FFFF + (lax.shift_right_logical(a, 20) & 1), 20) - 960
    e = lax.shift_right_logical(a, 23)
    m = (a & 0x7FFFFF) | 0x800000
    s = jnp.clip(141 - e, 1, 31)
    q = lax.shift_right_logical(m, s)
    rem = m & (lax.shift_left(jnp.ones_like(s), s) - 1)
    half = lax.shift_left(jnp.ones_like(s), s - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).astype(jnp.int32)
    out = jnp.where(a >= 0x3C800000, normal, jnp.where(e == 0, 0, q))
    return jnp.where(nan, 0x7F, out) | sign


def pow2_ceil(s):
    """(``2^ceil(log2(s))`` as NumPy computes it in float32, its ue8m0 byte) for ``s >= 1e-4``;
    inf -> inf, NaN -> NaN (byte 255)."""
    u = _bits(s)
    e = (lax.shift_right_logical(u, 23) & 0xFF) - 127
    m = u & 0x7FFFFF
    ef = e.astype(jnp.float32)
    lg = ef + (m.astype(jnp.float32) * jnp.float32(1.0 / 8388608.0)) * jnp.float32(1.4426950408889634)
    k = jnp.where((m == 0) | (lg == ef), e, e + 1)
    k = jnp.where(e == 128, 128, k)
    scale = lax.bitcast_convert_type(lax.shift_left(k + 127, 23), jnp.float32)
    return jnp.where(s != s, s, scale), k + 127


def _div(x, d, interpret: bool):
    """Correctly rounded ``x / d`` (float32; ``d`` a constant or an array broadcast to ``x``), as
    NumPy divides. Interpreted, the
    body is XLA, which rewrites division by a constant into a multiply by its inexact reciprocal:
    an optimization barrier on a full-shape divisor keeps it a division (as ``jax_impl.formats``).
    On the GPU Triton's float32 ``/`` is ``div.full.f32`` (not correctly rounded, the cause of the
    ``jax_impl`` writers' GPU caveat in docs/SEMANTICS.md), so the kernel emits ``div.rn.f32``."""
    x = x.astype(jnp.float32)
    den = jnp.broadcast_to(jnp.asarray(d, jnp.float32), jnp.shape(x))
    if interpret:
        return x / lax.optimization_barrier(den)
    return plgpu.elementwise_inline_asm("div.rn.f32 $0, $1, $2;", args=[x, den], constraints="=f,f,f",
                                        pack=1, result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.float32)])[0]


def _amax(x, axis):
    """max |x| along ``axis``, NaN where the row holds a NaN (as NumPy's max)."""
    nan = jnp.max((x != x).astype(jnp.int32), axis=axis) > 0
    return jnp.where(nan, jnp.float32(jnp.nan), jnp.max(jnp.abs(x), axis=axis))


def _scalar_bytes(bits):
    """int32 scalar -> its 4 little-endian bytes ``[4]`` uint8."""
    sh = lax.broadcasted_iota(jnp.int32, (4,), 0) * 8
    return (lax.shift_right_logical(jnp.full((4,), bits), sh) & 0xFF).astype(jnp.uint8)


def _word_bytes(bits, nbytes: int):
    """``[..., n]`` int32 words -> ``[..., n, nbytes]`` their little-endian bytes (uint8)."""
    sh = lax.broadcasted_iota(jnp.int32, bits.shape + (nbytes,), bits.ndim) * 8
    return (lax.shift_right_logical(bits[..., None], sh) & 0xFF).astype(jnp.uint8)


def _cache_write_kernel(bt_ref,       # [B, max_pages] int32 block table
                        cl_ref,       # [B] int32 context lengths
                        src_ref,      # [T, D] float: the new tokens' rows
                        cache_in,     # [num_pages, page_elems] (aliased to cache_ref)
                        cache_ref,    # [num_pages, page_elems] uint8 / latent float
                        *, N: int, P: int, D: int, FORMAT: str, UE8M0: bool, MAX_PAGES: int,
                        NUM_PAGES: int, INTERPRET: bool):
    del cache_in
    t = pl.program_id(0)
    b = t // N
    pos = cl_ref[b] - N + t % N                       # int32; L_b >= INT32_MIN + N is a position < 0
    pos = jnp.where(cl_ref[b] < jnp.int32(-2 ** 31 + N), -1, pos)
    col = jnp.where(pos >= 0, pos // P, 0)
    ok = (pos >= 0) & (col < MAX_PAGES)
    entry = bt_ref[b, jnp.where(ok, col, 0)]
    ok = ok & (entry >= 0) & (entry < NUM_PAGES)
    page = jnp.where(ok, entry, 0)
    off = jnp.where(ok, pos - col * P, 0)

    def load(shape, cols, mask=None):
        m = jnp.full(shape, ok) if mask is None else mask & ok
        return plgpu.load(src_ref.at[jnp.full(shape, t), cols], mask=m, other=0).astype(jnp.float32)

    def store(byte, val, mask=None):
        m = jnp.full(byte.shape, ok) if mask is None else mask & ok
        plgpu.store(cache_ref.at[jnp.full(byte.shape, page), byte], val, mask=m)

    def rope(start, dst):                              # 64 bf16 dims -> 128 bytes at dst
        r = lax.broadcasted_iota(jnp.int32, (64,), 0)
        bits = bf16_bits(load((64,), start + r))
        store(dst + 2 * r[:, None] + lax.broadcasted_iota(jnp.int32, (64, 2), 1), _word_bytes(bits, 2))

    if FORMAT == "latent":
        BD = 1 << (D - 1).bit_length()
        d = lax.broadcasted_iota(jnp.int32, (BD,), 0)
        x = load((BD,), jnp.minimum(d, D - 1), d < D)
        store(off * D + d, x.astype(cache_ref.dtype), d < D)
    elif FORMAT in ("fp8_ds_mla", "fp8_model1"):
        G, W, BG = (4, 128, 4) if FORMAT == "fp8_ds_mla" else (7, 64, 8)
        g = lax.broadcasted_iota(jnp.int32, (BG, W), 0)
        c = lax.broadcasted_iota(jnp.int32, (BG, W), 1)
        x = load((BG, W), jnp.minimum(g, G - 1) * W + c, g < G)
        scale, byte = pow2_ceil(jnp.maximum(_div(_amax(x, 1), 448.0, INTERPRET), jnp.float32(1e-4)))
        q = e4m3_bits(x / scale[:, None]).astype(jnp.uint8)     # exact: scale is a power of two
        if FORMAT == "fp8_ds_mla":
            base = off * DS_MLA_BYTES
            store(base + g * W + c, q)
            k4 = lax.broadcasted_iota(jnp.int32, (4, 4), 1)
            store(base + DS_MLA_SCALE_AT + 4 * lax.broadcasted_iota(jnp.int32, (4, 4), 0) + k4,
                  _word_bytes(_bits(scale), 4))
            rope(512, base + DS_MLA_ROPE_AT)
        else:
            data = off * MODEL1_DATA_BYTES
            store(data + g * W + c, q, g < G)
            rope(448, data + MODEL1_ROPE_AT)
            gi = lax.broadcasted_iota(jnp.int32, (8,), 0)
            store(P * MODEL1_DATA_BYTES + off * MODEL1_SCALE_BYTES + gi,
                  jnp.where(gi < 7, byte, 0).astype(jnp.uint8))
    else:                                              # fp8_indexer
        d = lax.broadcasted_iota(jnp.int32, (D,), 0)
        x = load((D,), d)
        # the scale is computed on a [D] splat (inline asm takes no scalars), all lanes equal
        s = _div(jnp.full((D,), jnp.maximum(_amax(x, 0), jnp.float32(1e-4))), 448.0, INTERPRET)
        if UE8M0:
            s, _ = pow2_ceil(s)
        store(off * D + d, e4m3_bits(_div(x, s, INTERPRET)).astype(jnp.uint8))
        k4 = lax.broadcasted_iota(jnp.int32, (4,), 0)
        store(P * D + 4 * off + k4, _scalar_bytes(_bits(jnp.max(s))))


def launch_cache_write(src, cache2d, block_table, context_lens, N: int, fmt: str, *, page_size: int,
                       scale_fmt: str | None = "ue8m0", interpret: bool | None = None):
    """Write the new tokens' rows into ``cache2d`` (returned; aliased to the input buffer).

    Args:
      src: ``[B * N, D]`` float rows (latent D_qk or indexer D_I; D_I a power of two).
      cache2d: ``[num_pages, page_elems]``: uint8 pages of ``fmt`` (``fp8_ds_mla`` as
        ``[num_pages, P * 656]``), or the latent cache as ``[num_pages, P * D]``.
      block_table: int32 ``[B, max_pages]``; context_lens: int32 ``[B]``; N, page_size (P).
    Returns:
      the updated ``cache2d`` (same shape and dtype).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt: expected one of {FORMATS}, got {fmt!r}")
    B, max_pages = block_table.shape
    interp = interpret_default() if interpret is None else interpret
    kernel = functools.partial(_cache_write_kernel, N=N, P=page_size, D=src.shape[1], FORMAT=fmt,
                               UE8M0=scale_fmt == "ue8m0", MAX_PAGES=max_pages,
                               NUM_PAGES=cache2d.shape[0], INTERPRET=interp)
    call = triton_call(kernel, out_shape=jax.ShapeDtypeStruct(cache2d.shape, cache2d.dtype),
                       grid=(B * N,), num_warps=4, num_stages=1, interpret=interp,
                       name=f"cache_write_{fmt}", input_output_aliases={3: 0})
    return call(block_table, context_lens, src, cache2d)
