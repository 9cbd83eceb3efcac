"""The new tokens' cache writes of one decode step (quantize + scatter into pages) as one Triton
kernel per cache (``torch_impl.layer`` binding).

Operation: token ``t = b * N + i`` (request b, draft i) sits at logical position
``pos = L_b - N + i`` (``L_b = context_lens[b]``, counting the N new tokens), i.e. in page
``block_table[b, pos // P]`` at offset ``pos % P``. Its row (``src[t]``: a latent row of D_qk
floats, or an indexer key of D_I floats) is quantized into the cache's layout and stored there.
A token is *unmapped* when ``pos < 0``, ``pos >= max_pages * P`` or its page entry is outside
``[0, num_pages)``: its write is dropped (masked stores: no byte of the cache changes, nothing
outside the cache is addressed; nothing is wrapped onto another page, since the slot is formed
in int64 only from checked entries). Semantics of the drop: docs/SEMANTICS.md ("Unmapped new
tokens"); of the layouts: docs/SPEC.md "Cache layouts" and the NumPy writers of
``kernels/formats.py``, whose bytes these kernels reproduce bit for bit
(``tests/test_cache_write.py``):

* ``latent``: the row cast to the cache dtype (fp32, fp16, or bf16 by round-to-nearest-even on
  the float32 bits).
* ``fp8_ds_mla`` (656 bytes per token): 4 x 128 e4m3 bytes, 4 float32 power-of-two scales, 64
  bf16 rope dims.
* ``fp8_model1``: in the page's data area 448 e4m3 bytes + 64 bf16 rope dims (576 bytes at
  ``off * 576``), in its scale area 7 ue8m0 bytes and one zero pad byte (at ``P * 576 + off * 8``).
* ``fp8_indexer``: D_I e4m3 bytes at ``off * D_I`` and one float32 scale at ``P * D_I + 4 * off``
  (``amax / 448``, or its power-of-two ceiling with ``scale_fmt="ue8m0"``).

Numerics are integer bit manipulation wherever a float unit could round differently from NumPy:
e4m3 and bf16 are encoded round-to-nearest-even from the float32 bits (the Triton interpreter's
own fp8 cast does not round to nearest even, and this keeps the GPU and interpreter bytes
identical); the power-of-two scale ``2^ceil(log2(s))`` takes its exponent from the bits of ``s``
and reproduces float32 ``log2`` rounding to an integer for ``s`` a few ulp above a power of two
(``e + log2(1 + f)`` rounded to float32 equals ``e``: NumPy then gives the scale ``2^e`` and the
value saturates at 448). Divisions are IEEE (``div_rn``). Every value a kernel reads comes from
the row being written, so the result does not depend on launch order; two mapped tokens aimed at
the same slot (a block table with duplicate entries) is the caller's error (last writer wins).

Launch: grid ``(B * N,)``, one program per new token, 4 warps; the work is ~1.3 KiB in and out per
token (B = 64: 42 KiB of kv rows), so the launch latency is the cost.

The quantize + store of one row is a ``@triton.jit`` helper per layout (:func:`_store_latent`,
:func:`_store_ds_mla`, :func:`_store_model1`, :func:`_store_indexer`) taking the row's float32
values in registers, with the target from :func:`_new_token_target`: the decode layer's fused
preparation kernels (``kernels/layer_prep/triton.py``), which compute the rows themselves (norm,
rope, Hadamard), store them with the same code, so their bytes follow the same rules.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.layouts import FP8_DS_MLA as _DS, FP8_MODEL1 as _M1

FORMATS = ("latent", "fp8_ds_mla", "fp8_model1", "fp8_indexer")
"""The ``FORMAT`` constexpr values of :func:`_cache_write_kernel`."""

NUM_WARPS = 4

# Byte layouts (kernels.layouts): offsets within a token's row, in bytes
DS_MLA_BYTES = tl.constexpr(_DS.data.nbytes)                    # 656
DS_MLA_SCALE_AT = tl.constexpr(_DS.field("scale").offset)       # 512
DS_MLA_ROPE_AT = tl.constexpr(_DS.field("rope").offset)         # 528
MODEL1_DATA_BYTES = tl.constexpr(_M1.data.nbytes)               # 576
MODEL1_ROPE_AT = tl.constexpr(_M1.field("rope").offset)         # 448
MODEL1_SCALE_BYTES = tl.constexpr(_M1.scale.nbytes)             # 8


@triton.jit
def _new_token_target(bt_ptr, cl_ptr, t, N, max_pages, num_pages, bt_stride, P: tl.constexpr):
    """(mapped, page int64, offset int64) of new token ``t`` (module docstring)."""
    b = t // N
    i = t - b * N
    pos = tl.load(cl_ptr + b).to(tl.int64) - N + i                 # int64: L_b = INT32_MIN is fine
    col = tl.where(pos >= 0, pos // P, 0)
    ok = (pos >= 0) & (col < max_pages)
    entry = tl.load(bt_ptr + b.to(tl.int64) * bt_stride + tl.where(ok, col, 0))
    ok = ok & (entry >= 0) & (entry < num_pages)
    page = tl.where(ok, entry, 0).to(tl.int64)
    return ok, page, tl.where(ok, pos - col * P, 0)


@triton.jit
def _masked(cond, ok):
    """Block mask ``cond & ok`` for a scalar ``ok`` (the interpreter rejects scalar & block)."""
    return cond & ((cond.to(tl.int32) * 0 + ok.to(tl.int32)) != 0)


@triton.jit
def _bf16_bits(x):
    """Round-to-nearest-even bf16 bits of float32 ``x`` (int32 in [0, 65535]); NaN stays a quiet
    NaN with its sign (as ml_dtypes / torch convert)."""
    u = x.to(tl.int32, bitcast=True)
    a = u & 0x7FFFFFFF
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16                       # two's complement = unsigned add
    r = tl.where(a > 0x7F800000, (u >> 16) | 0x40, r)
    return r & 0xFFFF


@triton.jit
def _e4m3_bits(y):
    """float8_e4m3fn bits (int32 in [0, 255]) of ``clamp(y, -448, 448)``, round to nearest even;
    NaN -> 0x7F with the sign bit of ``y``."""
    u = y.to(tl.int32, bitcast=True)
    sign = tl.where(u < 0, 0x80, 0)
    a = u & 0x7FFFFFFF
    nan = a > 0x7F800000
    a = tl.minimum(a, 0x43E00000)                                  # |y| <= 448.0 (inf -> 448)
    # |y| >= 2^-6: e4m3 normal, keep 3 of the 23 mantissa bits (RNE), rebias 127 -> 7
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - 960
    # |y| < 2^-6: multiples of 2^-9: RNE(M >> (141 - e)) with the implicit bit (shift >= 21)
    e = a >> 23
    m = (a & 0x7FFFFF) | 0x800000
    s = tl.maximum(tl.minimum(141 - e, 31), 1)
    one = s * 0 + 1
    q = m >> s
    rem = m & ((one << s) - 1)
    half = one << (s - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    sub = tl.where(e == 0, 0, q)                                   # float32 zero / denormal -> 0
    out = tl.where(a >= 0x3C800000, normal, sub)
    return tl.where(nan, 0x7F, out) | sign


@triton.jit
def _pow2_ceil(s):
    """``2^ceil(log2(s))`` as NumPy computes it in float32 (module docstring), for ``s >= 1e-4``;
    inf -> inf, NaN -> NaN. Returns (scale float32, biased exponent int32 = ue8m0 byte)."""
    u = s.to(tl.int32, bitcast=True)
    e = ((u >> 23) & 0xFF) - 127
    m = u & 0x7FFFFF
    ef = e.to(tl.float32)
    lg = ef + (m.to(tl.float32) * (1.0 / 8388608.0)) * 1.4426950408889634
    k = tl.where((m == 0) | (lg == ef), e, e + 1)
    k = tl.where(e == 128, 128, k)                                 # inf / NaN: exponent 255
    scale = ((k + 127) << 23).to(tl.float32, bitcast=True)
    scale = tl.where(s != s, s, scale)
    return scale, k + 127


@triton.jit
def _amax_rows(x, axis: tl.constexpr):
    """max |x| along ``axis``, NaN if the row holds a NaN (NumPy's max propagates it)."""
    amax = tl.max(tl.abs(x), axis=axis)
    nan = tl.max((x != x).to(tl.int32), axis=axis) > 0
    return tl.where(nan, float("nan"), amax)


@triton.jit
def _store_latent(cache_ptr, page, off, ok, x, d, D: tl.constexpr, P: tl.constexpr,
                  BF16_CACHE: tl.constexpr):
    """Store float32 values ``x`` (any block shape) of dims ``d`` (same shape, ``< D`` stored) of
    one ``latent`` row at page ``page``, offset ``off``, cast to the cache dtype (bf16 through the
    cache's uint16 view, round to nearest even); nothing when ``ok`` is false."""
    m = _masked(d < D, ok)
    base = (page * P + off) * D                                    # elements
    if BF16_CACHE:
        tl.store(cache_ptr.to(tl.pointer_type(tl.uint16)) + base + d, _bf16_bits(x).to(tl.uint16), mask=m)
    else:
        tl.store(cache_ptr + base + d, x.to(cache_ptr.dtype.element_ty), mask=m)


@triton.jit
def _store_ds_mla(cache_ptr, page, off, ok, nope, rope, P: tl.constexpr):
    """Quantize one ``fp8_ds_mla`` row and store its 656 bytes: ``nope`` ``[4, 128]`` float32 (dim
    128g + c), ``rope`` ``[64]`` float32 (rope dim j, stored as bf16); nothing when ``ok`` is false."""
    u8 = cache_ptr.to(tl.pointer_type(tl.uint8))
    g = tl.arange(0, 4)
    c = tl.arange(0, 128)
    m = _masked((g[:, None] < 4) & (c[None, :] < 128), ok)
    scale, _ = _pow2_ceil(tl.maximum(tl.math.div_rn(_amax_rows(nope, 1), 448.0), 1e-4,
                                      propagate_nan=tl.PropagateNan.ALL))
    q = _e4m3_bits(tl.math.div_rn(nope, scale[:, None]))
    base = (page * P + off) * DS_MLA_BYTES                         # bytes
    tl.store(u8 + base + g[:, None] * 128 + c[None, :], q.to(tl.uint8), mask=m)
    tl.store(cache_ptr.to(tl.pointer_type(tl.float32)) + (base + DS_MLA_SCALE_AT) // 4 + g, scale,
             mask=_masked(g < 4, ok))
    r = tl.arange(0, 64)
    tl.store(cache_ptr.to(tl.pointer_type(tl.uint16)) + (base + DS_MLA_ROPE_AT) // 2 + r,
             _bf16_bits(rope).to(tl.uint16), mask=_masked(r < 64, ok))


@triton.jit
def _store_model1(cache_ptr, page, off, ok, nope, rope, P: tl.constexpr, PAGE_BYTES: tl.constexpr):
    """Quantize one ``fp8_model1`` row and store it: ``nope`` ``[8, 64]`` float32 (dim 64g + c; row
    7 is not stored, its scale byte is the zero pad), ``rope`` ``[64]`` float32 (bf16 in the data
    row); the 7 ue8m0 scale bytes and the pad go to the page's scale area. Nothing when ``ok`` is
    false."""
    u8 = cache_ptr.to(tl.pointer_type(tl.uint8))
    g = tl.arange(0, 8)                                            # 7 groups of 64, one pad
    c = tl.arange(0, 64)
    gm = _masked((g[:, None] < 7) & (c[None, :] < 64), ok)
    scale, byte = _pow2_ceil(tl.maximum(tl.math.div_rn(_amax_rows(nope, 1), 448.0), 1e-4,
                                        propagate_nan=tl.PropagateNan.ALL))
    q = _e4m3_bits(tl.math.div_rn(nope, scale[:, None]))
    base = page * PAGE_BYTES
    data = base + off * MODEL1_DATA_BYTES
    tl.store(u8 + data + g[:, None] * 64 + c[None, :], q.to(tl.uint8), mask=gm)
    r = tl.arange(0, 64)
    tl.store(cache_ptr.to(tl.pointer_type(tl.uint16)) + (data + MODEL1_ROPE_AT) // 2 + r,
             _bf16_bits(rope).to(tl.uint16), mask=_masked(r < 64, ok))
    tl.store(u8 + base + P * MODEL1_DATA_BYTES + off * MODEL1_SCALE_BYTES + g,
             tl.where(g < 7, byte, 0).to(tl.uint8), mask=_masked(g < 8, ok))


@triton.jit
def _indexer_scale(amax, UE8M0: tl.constexpr):
    """The indexer's fp8 scale of a row with max |x| ``amax`` (any block shape): DeepSeek
    ``act_quant``'s ``max(amax, 1e-4) / 448`` (NaN propagates), rounded up to a power of two
    with ``UE8M0`` (``torch_impl.formats.indexer_scale``)."""
    s = tl.math.div_rn(tl.maximum(amax, 1e-4, propagate_nan=tl.PropagateNan.ALL), 448.0)
    if UE8M0:
        s, _ = _pow2_ceil(s)
    return s


@triton.jit
def _store_indexer(cache_ptr, page, off, ok, x, d, D: tl.constexpr, P: tl.constexpr,
                   PAGE_BYTES: tl.constexpr, UE8M0: tl.constexpr):
    """Quantize one indexer key and store it in the ``fp8_indexer`` page: ``x`` ``[BLOCK_D]``
    float32 of dims ``d`` (lanes ``d >= D`` must hold 0), D e4m3 bytes at ``off * D`` and the
    float32 scale at ``P * D + 4 * off``. Nothing when ``ok`` is false."""
    m = _masked(d < D, ok)
    s = _indexer_scale(_amax_rows(x, 0), UE8M0)
    q = _e4m3_bits(tl.math.div_rn(x, s))
    base = page * PAGE_BYTES
    tl.store(cache_ptr.to(tl.pointer_type(tl.uint8)) + base + off * D + d, q.to(tl.uint8), mask=m)
    tl.store(cache_ptr.to(tl.pointer_type(tl.float32)) + (base + P * D) // 4 + off + d,
             s + tl.zeros(d.shape, tl.float32), mask=_masked(d < 1, ok))


@triton.jit
def _cache_write_kernel(src_ptr,        # [T, D] float: the new tokens' rows, T = B * N
                        cache_ptr,      # the cache, flat (uint8, or the latent's float dtype)
                        bt_ptr,         # [B, max_pages] int32 block table
                        cl_ptr,         # [B] int32 context lengths (counting the new tokens)
                        N, max_pages, num_pages, bt_stride, src_stride,
                        FORMAT: tl.constexpr, P: tl.constexpr, D: tl.constexpr,
                        BLOCK_D: tl.constexpr, PAGE_BYTES: tl.constexpr,
                        UE8M0: tl.constexpr, BF16_CACHE: tl.constexpr):
    t = tl.program_id(0)
    ok, page, off = _new_token_target(bt_ptr, cl_ptr, t, N, max_pages, num_pages, bt_stride, P)
    row = src_ptr + t.to(tl.int64) * src_stride
    if FORMAT == "latent":
        d = tl.arange(0, BLOCK_D)
        x = tl.load(row + d, mask=_masked(d < D, ok)).to(tl.float32)
        _store_latent(cache_ptr, page, off, ok, x, d, D, P, BF16_CACHE)
    elif FORMAT == "fp8_ds_mla":
        g = tl.arange(0, 4)
        c = tl.arange(0, 128)
        m = _masked((g[:, None] < 4) & (c[None, :] < 128), ok)
        x = tl.load(row + g[:, None] * 128 + c[None, :], mask=m, other=0.0).to(tl.float32)  # [4, 128]
        r = tl.arange(0, 64)
        rope = tl.load(row + 512 + r, mask=_masked(r < 64, ok), other=0.0).to(tl.float32)
        _store_ds_mla(cache_ptr, page, off, ok, x, rope, P)
    elif FORMAT == "fp8_model1":
        g = tl.arange(0, 8)
        c = tl.arange(0, 64)
        gm = _masked((g[:, None] < 7) & (c[None, :] < 64), ok)
        x = tl.load(row + g[:, None] * 64 + c[None, :], mask=gm, other=0.0).to(tl.float32)
        r = tl.arange(0, 64)
        rope = tl.load(row + 448 + r, mask=_masked(r < 64, ok), other=0.0).to(tl.float32)
        _store_model1(cache_ptr, page, off, ok, x, rope, P, PAGE_BYTES)
    else:                                                          # fp8_indexer
        d = tl.arange(0, BLOCK_D)
        x = tl.load(row + d, mask=_masked(d < D, ok), other=0.0).to(tl.float32)
        _store_indexer(cache_ptr, page, off, ok, x, d, D, P, PAGE_BYTES, UE8M0)


def cache_write_constexprs(fmt: str, *, page_size: int, dim: int, page_bytes: int,
                           scale_fmt: str | None = "ue8m0", bf16_cache: bool = False) -> dict:
    """The constexprs of :func:`_cache_write_kernel` for one cache (also the AOT specs')."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt: expected one of {FORMATS}, got {fmt!r}")
    return dict(FORMAT=fmt, P=page_size, D=dim, BLOCK_D=triton.next_power_of_2(dim),
                PAGE_BYTES=page_bytes, UE8M0=scale_fmt == "ue8m0", BF16_CACHE=bf16_cache)


def aot_specs(smem_class: str) -> list:
    """Every launch :func:`torch_impl.layer.write_new_tokens` can make at the real dimensions
    (P = 64; D_qk 576 / 512, D_I 128; fp32 / fp16 / bf16 rows; the latent cache in each float
    dtype, bf16 as its uint16 view), for ``tests/test_triton_compile.py``. No shared memory
    beyond the reductions' scratch, whatever ``smem_class``."""
    from kernels import formats as nf
    from kernels._triton_aot import LaunchSpec
    del smem_class
    P = 64
    ints = {n: "i32" for n in ("N", "max_pages", "num_pages", "bt_stride", "src_stride")}
    specs = []
    for src in ("fp32", "fp16", "bf16"):
        cases = [("fp8_ds_mla", 576, "*u8", P * 656, False), ("fp8_model1", 512, "*u8", nf.model1_page_bytes(P), False),
                 ("fp8_indexer", 128, "*u8", P * 132, False)]
        cases += [("latent", d, ptr, P * d, ptr == "*u16") for d in (576, 512)
                  for ptr in ("*fp32", "*fp16", "*u16")]
        for fmt, dim, cache, page_bytes, bf16 in cases:
            for ue8m0 in ((True, False) if fmt == "fp8_indexer" else (True,)):
                ce = cache_write_constexprs(fmt, page_size=P, dim=dim, page_bytes=page_bytes,
                                            scale_fmt="ue8m0" if ue8m0 else None, bf16_cache=bf16)
                specs.append(LaunchSpec(
                    label=f"cache_write {fmt} D{dim} src={src} cache={cache[1:]} ue8m0={ue8m0}",
                    module="kernels.cache_write.triton", kernel="_cache_write_kernel",
                    signature={"src_ptr": f"*{src}", "cache_ptr": cache, "bt_ptr": "*i32",
                               "cl_ptr": "*i32", **ints},
                    constexprs=ce, num_warps=NUM_WARPS, num_stages=1))
    return specs
