"""The decode layer's preparation work between its projections and its two DSA ops, fused into
two Triton kernels per step, and V4-Flash's inverse rope on the attention output in a third
(``torch_impl.layer``, behind ``DSA_LAYER_FUSED_PREP``).

Where the work sits in one step (``kernels.layer_reference``'s module docstring writes the math
out; T = B * N new tokens, token ``t = b * N + i`` at position ``pos = L_b - N + i``)::

    x_proj GEMM -> xq [T, q_lora], xkv [T, D_kv], xk [T, D_I]          (dt = the layer dtype)
    _prep_x_kernel  (grid (T, 4))  qr = rmsnorm(xq) * q_norm; x32 = float(x);
                                    latent row -> kv_cache; indexer key -> k_cache
    wq_b GEMM (-> q), V3.2 q_nope absorption bmm (-> q_lat), indexer.wq_b GEMM (-> iq),
    weights_proj GEMM on x32 (-> w_raw, float32, alpha H_I^-0.5 D_I^-0.5)
    _prep_q_kernel  (grid (T, H_I / BLOCK_HI + H / BLOCK_HM))  indexer q -> (idx_q, idx_w);
                                    MLA q -> q_mla [T, H, D_qk]
    indexer_topk, sparse_mla_decode
    _rope_out_kernel (V4-Flash; grid (T, H / BLOCK_H))  o = attn, last r dims inverse-roped
    output projections

V4-Flash's window (indexer lengths and window positions before the indexer) is one more launch,
``_window_split_kernel`` (grid (T,)), shared with ``torch_impl.step.dsa_decode_step``.

``_prep_x_kernel`` programs, by ``program_id(1)`` (one token each, ``program_id(0)``):

0. ``qr[t] = dt(xq[t] * rsqrt(mean(xq[t]^2) + eps) * q_norm)``: DeepSeek ``MLA.q_norm``
   (RMSNorm, float32 math, one rounding to dt).
1. ``x32[t] = float32(x[t])``: the float32 input of the indexer's weights GEMM (DeepSeek runs
   ``weights_proj`` on ``x.float()``).
2. the latent row: V3.2 (``NORM_ROPE`` false) rmsnorm of the first C = 512 dims with ``kv_norm``
   and the last r = 64 dims (``k_pe``, the projection's dt values) roped; V4-Flash
   (``NORM_ROPE``) rmsnorm of all 512 dims with ``kv_norm``, then the last 64 roped from the
   float32 normed values; rope interleaved (pairs 2j, 2j + 1: ``apply_rotary_emb`` of
   ``MLA.forward``); the row rounded once to dt, then quantised and stored into the latent cache
   in its layout (``latent``, ``fp8_ds_mla``, ``fp8_model1``) with the stores of
   ``kernels/cache_write/triton.py`` (same bytes as its ``_cache_write_kernel`` given the dt row).
3. the indexer key: ``LayerNorm(xk[t])`` with weight and bias (float32), non-interleaved rope
   of dims ``[:r]`` (pairs j, j + r/2: ``Indexer.forward``'s ``apply_rotary_emb(...,
   interleaved=False)``), rounded to dt, the Hadamard rotation (``rotate_activation``: the +-1
   Sylvester matrix as a ``tl.dot`` with float32 accumulation, times ``D_I^-0.5``), rounded to
   dt, then quantised into the ``fp8_indexer`` page (``act_quant``: ``amax / 448`` or its
   power-of-two ceiling with ``UE8M0``) by ``_store_indexer``.

Programs 2 and 3 write the cache only for *mapped* tokens (``_new_token_target``: the position
inside the table and the page entry in ``[0, num_pages)``); an unmapped token's bytes stay
untouched, exactly as ``_cache_write_kernel`` drops it (docs/SEMANTICS.md "Decode layer").

``_prep_q_kernel`` programs, by ``program_id(1)`` (token ``program_id(0)``):

* ``< NUM_HI``: the indexer q heads ``[hb * BLOCK_HI, +BLOCK_HI)`` of the token: rope of dims
  ``[:r]`` (non-interleaved) from the dt projection, rounded to dt, the Hadamard rotation as
  above rounded to dt, then per head ``amax``, the scale (``torch_impl.formats.indexer_scale``:
  ``max(amax, 1e-4) / 448``, with ``UE8M0`` its power-of-two ceiling), ``idx_q = e4m3(clamp(
  q / scale, +-448))`` (round to nearest even) and ``idx_w = w_raw * scale`` (float32).
* the rest: the MLA q heads ``[hm * BLOCK_HM, +BLOCK_HM)``: V3.2 (``ABSORBED``) copies the
  absorbed ``q_lat[h, t, :C]`` (the bmm's dt result) into ``q_mla[t, h, :C]`` and writes the
  interleaved rope of ``q_pe = q[t, h, nope:]`` (from dt, float32 math, rounded to dt) into
  ``q_mla[t, h, C:]``; V4-Flash (``HEAD_NORM``) rms-normalises each head of ``q[t, h, :]``
  without weight, rounds it to dt (V4 keeps a bf16 activation there) and ropes its last r dims
  from those dt values (rounded to dt again).

Numerics: every rounding point is the one the composite torch code of ``torch_impl.layer``
has (docs/SEMANTICS.md "Decode layer", rounding points). Differences from that code, all within
float32 rounding: the norms' sums and the Hadamard's dot products are summed in another order
(a tree in registers / Triton's ``tl.dot`` against torch's kernels and cuBLAS), and the GPU may
contract a rope product and its sum into one FMA. So after the dt rounding a value can differ by
one dt ulp, and a quantised byte by one e4m3 step, from the composite's (tests compare at the
SPEC / layer tolerances, and bit for bit where the math is order-free: bytes of unmapped tokens,
the copied ``q_lat``). cos / sin are computed in the kernels from the position and the layer's
float64 ``rope_freqs`` exactly as the composite does: float64 angle, float64 cos / sin, one
rounding to float32. The Hadamard matrix is the caller's ``hadamard`` (the layer's
``hadamard_sign``: ``[D_I, D_I]`` +-1 in dt, Sylvester's order), loaded by every program that
rotates (an L2-resident 32 KiB in bf16; generating it in registers, ``(-1)^popcount(i & j)``,
took ~1,400 of an indexer program's ~3,300 instructions a warp at 4 warps, in a kernel whose
programs run one warp per scheduler: bench/NOTES.md "Layer prep: latency"); its scale
``D_I^-0.5`` multiplies the float32 accumulator, as the composite's GEMM alpha.
The e4m3 / scale encoders are those of ``kernels/cache_write/triton.py`` (integer RNE, IEEE
divisions, NumPy's power-of-two rule).

Layouts: every activation is row-major with the last dim contiguous; row (token) and head
strides are arguments. ``idx_q`` is written as its e4m3 bytes (a uint8 view). Caches: docs/SPEC.md
"Cache layouts" (``kernels.layouts``).
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from kernels.cache_write.triton import (_amax_rows, _e4m3_bits, _indexer_scale, _new_token_target,
                                        _store_ds_mla, _store_indexer, _store_latent, _store_model1)
from kernels.scalars import SPLIT_SHIFT_BITS

KV_FORMATS = ("latent", "fp8_ds_mla", "fp8_model1")
"""Latent cache layouts the ``FORMAT`` constexpr of :func:`_prep_x_kernel` takes."""

X_ROLES = 4
"""Programs per token of :func:`_prep_x_kernel` (q_norm, x cast, latent row, indexer key)."""

X_NUM_WARPS = 4
HADAMARD_M = tl.constexpr(16)
"""Rows of the indexer key's Hadamard dot (``tl.dot`` needs M >= 16; row 0 is the key)."""


# ================================================================================== config

@dataclass(frozen=True)
class PrepQConfig:
    """Launch shape of :func:`_prep_q_kernel`.

    Attributes:
      block_hi: indexer q heads per program (power of two >= 16: the rows of its Hadamard
        ``tl.dot``); programs per token ``ceil(H_I / block_hi)``.
      block_hm: MLA q heads per program (power of two); programs per token ``ceil(H / block_hm)``.
      num_warps: Triton launch option.
    """

    block_hi: int = 32
    block_hm: int = 16
    num_warps: int = 4


PREP_Q_SPACE = (PrepQConfig(16, 4, 4),)
"""Every :class:`PrepQConfig` the launcher may run (what :func:`prep_q_heuristic` returns: one
config today, for every shape and dtype); ``tests/test_triton_compile.py`` compiles it at each
shape the real dimensions reach (:func:`aot_specs`). A sweep that times others widens it (and
the fit check with it)."""


def prep_q_heuristic(index_heads: int, heads: int, dtype_bytes: int) -> PrepQConfig:
    """The default :class:`PrepQConfig` (a member of :data:`PREP_Q_SPACE`): 16 indexer heads and
    4 MLA heads per program, so one token is spread over H_I / 16 + H / 4 programs (V3.2: 4 +
    32, V4-Flash: 4 + 16 at TP 1).

    Why small programs: the kernel is latency-bound at every batch the layer runs. Nsight
    Compute on the H200 (2026-12-05, V4-Flash B 1, the earlier 32 + 16 heads: 6 programs of 4
    warps) measured 14.6 us with 7.8 cycles per issued instruction and one warp per scheduler:
    each warp's instruction count times the latency of its dependent chain is the time (the
    MLA programs' ~1,600 instructions a warp, the indexer programs' ~3,300), and B 64 took the
    same 12.7 us as B 1 in the layer bench (384 programs: one wave). A quarter of the heads a
    program leaves the MLA programs ~1/4 of their per-head instructions, half the indexer heads
    and the Hadamard matrix loaded instead of generated (:func:`_rotate_hadamard`) ~1/3 of the
    indexer programs' (counts: bench/NOTES.md "Layer prep: latency"). float32 operands keep 16
    indexer heads (the IEEE dot's operands: 72 KiB of shared memory)."""
    del index_heads, heads, dtype_bytes
    return PREP_Q_SPACE[0]


# ================================================================================== helpers

@triton.jit
def _position(cl_ptr, t, N):
    """Position ``L_b - N + i`` (int64) of new token ``t = b * N + i``."""
    b = t // N
    return tl.load(cl_ptr + b).to(tl.int64) - N + (t - b * N)


@triton.jit
def _cos_sin(pos, freqs_ptr, j, mask):
    """float32 cos / sin of the angle ``pos * freqs[j]`` (float64 product and trigonometry,
    one rounding to float32: the composite's ``_rope_tables``); lanes outside ``mask`` get
    angle 0."""
    ang = pos.to(tl.float64) * tl.load(freqs_ptr + j, mask=mask, other=0.0)
    return tl.cos(ang).to(tl.float32), tl.sin(ang).to(tl.float32)


@triton.jit
def _rotate(x, partner, cos, sin, first):
    """One rope output per lane: the first element of a pair ``x * cos - partner * sin``, the
    second ``partner * sin + x * cos`` (``partner`` the pair's other element; float32)."""
    return tl.where(first, x * cos - partner * sin, partner * sin + x * cos)


@triton.jit
def _round(x, DT: tl.constexpr):
    """float32 ``x`` rounded to ``DT`` (to nearest even) and back: where the layer stores dt."""
    return x.to(DT).to(tl.float32)


@triton.jit
def _rotate_hadamard(a, had_ptr, DT: tl.constexpr, D: tl.constexpr):
    """``dt(a @ H * D^-0.5)`` as float32 for ``a`` ``[M, D]`` in ``DT`` (M >= 16): ``H`` the
    contiguous ``[D, D]`` +-1 matrix at ``had_ptr`` (any float dtype: +-1 is exact in each) in
    ``DT``, float32 accumulation (IEEE products for float32 operands), the scale on the
    accumulator, one rounding to ``DT``."""
    i = tl.arange(0, D)
    h = tl.load(had_ptr + i[:, None] * D + i[None, :]).to(DT)
    if DT == tl.float32:
        acc = tl.dot(a, h, input_precision="ieee")
    else:
        acc = tl.dot(a, h)
    return _round(acc * (D ** -0.5), DT)


@triton.jit
def _indexer_rope_lanes(d, ROPE: tl.constexpr):
    """For dims ``d`` of an indexer row: (roped, first of its pair, partner dim, cos/sin index)
    of the non-interleaved rope over ``[:ROPE]`` (pairs j, j + ROPE/2)."""
    HALF: tl.constexpr = ROPE // 2
    roped = d < ROPE
    first = d < HALF
    partner = tl.where(first, d + HALF, tl.where(roped, d - HALF, d))
    return roped, first, partner, tl.where(roped, d % HALF, 0)


# ================================================================================== kernels

@triton.jit
def _x_q_norm(xq_ptr, qr_ptr, q_norm_ptr, t64, xq_stride, eps, Q_LORA: tl.constexpr,
              BLOCK_Q: tl.constexpr, DT: tl.constexpr):
    """``qr[t] = dt(xq[t] * rsqrt(mean(xq[t]^2) + eps) * q_norm)`` (one token)."""
    c = tl.arange(0, BLOCK_Q)
    m = c < Q_LORA
    x = tl.load(xq_ptr + t64 * xq_stride + c, mask=m, other=0.0).to(DT).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, 0) / Q_LORA + eps)
    y = x * rstd * tl.load(q_norm_ptr + c, mask=m, other=0.0)
    tl.store(qr_ptr + t64 * Q_LORA + c, y.to(DT), mask=m)


@triton.jit
def _x_to_float32(x_ptr, x32_ptr, t64, x_stride, hidden, BLOCK_X: tl.constexpr):
    """``x32[t] = float32(x[t])`` (one token, ``BLOCK_X`` columns at a time)."""
    for c0 in range(0, hidden, BLOCK_X):
        c = c0 + tl.arange(0, BLOCK_X)
        m = c < hidden
        x = tl.load(x_ptr + t64 * x_stride + c, mask=m)
        tl.store(x32_ptr + t64 * hidden + c, x.to(tl.float32), mask=m)


@triton.jit
def _x_latent(xkv_ptr, kv_norm_ptr, freqs_ptr, kv_cache_ptr, bt_ptr, cl_ptr, t, t64, N, max_pages,
              num_pages, bt_stride, xkv_stride, eps, D_QK: tl.constexpr, NOPE: tl.constexpr,
              ROPE: tl.constexpr, NORM_ROPE: tl.constexpr, GROUPS: tl.constexpr,
              TILE: tl.constexpr, FORMAT: tl.constexpr, P: tl.constexpr,
              KV_PAGE_BYTES: tl.constexpr, BF16_CACHE: tl.constexpr, DT: tl.constexpr):
    """The latent row of token t (rms norm, interleaved rope, dt) quantised into ``kv_cache``
    at its slot; nothing is stored for an unmapped token (module docstring, program 2)."""
    ok, page, off = _new_token_target(bt_ptr, cl_ptr, t, N, max_pages, num_pages, bt_stride, P)
    pos = _position(cl_ptr, t, N)
    row = xkv_ptr + t64 * xkv_stride
    g = tl.arange(0, GROUPS)
    dn = g[:, None] * TILE + tl.arange(0, TILE)[None, :]           # [GROUPS, TILE] nope dims
    mn = dn < NOPE
    xn = tl.load(row + dn, mask=mn, other=0.0).to(DT).to(tl.float32)
    j = tl.arange(0, ROPE)
    pj = j ^ 1                                                     # interleaved pairs
    xr = tl.load(row + NOPE + j).to(DT).to(tl.float32)
    xp = tl.load(row + NOPE + pj).to(DT).to(tl.float32)
    if NORM_ROPE:                                                  # V4: all D_qk dims normed
        ss = tl.sum(tl.sum(xn * xn, 1), 0) + tl.sum(xr * xr, 0)
        rstd = tl.math.rsqrt(ss / D_QK + eps)
        xn = xn * rstd * tl.load(kv_norm_ptr + dn, mask=mn, other=0.0)
        xr = xr * rstd * tl.load(kv_norm_ptr + NOPE + j)
        xp = xp * rstd * tl.load(kv_norm_ptr + NOPE + pj)
    else:                                                          # V3.2: the first NOPE dims
        rstd = tl.math.rsqrt(tl.sum(tl.sum(xn * xn, 1), 0) / NOPE + eps)
        xn = xn * rstd * tl.load(kv_norm_ptr + dn, mask=mn, other=0.0)
    cos, sin = _cos_sin(pos, freqs_ptr, j // 2, j < ROPE)
    nope = _round(xn, DT)
    rope = _round(_rotate(xr, xp, cos, sin, (j & 1) == 0), DT)
    if FORMAT == "latent":
        _store_latent(kv_cache_ptr, page, off, ok, nope, tl.where(mn, dn, D_QK), D_QK, P, BF16_CACHE)
        _store_latent(kv_cache_ptr, page, off, ok, rope, NOPE + j, D_QK, P, BF16_CACHE)
    elif FORMAT == "fp8_ds_mla":
        _store_ds_mla(kv_cache_ptr, page, off, ok, nope, rope, P)
    else:
        _store_model1(kv_cache_ptr, page, off, ok, nope, rope, P, KV_PAGE_BYTES)


@triton.jit
def _x_index_key(xk_ptr, k_norm_w_ptr, k_norm_b_ptr, freqs_ptr, had_ptr, k_cache_ptr, bt_ptr, cl_ptr,
                 t, t64, N, max_pages, num_pages, bt_stride, xk_stride, eps, ROPE: tl.constexpr,
                 P: tl.constexpr, D_I: tl.constexpr, K_PAGE_BYTES: tl.constexpr,
                 UE8M0: tl.constexpr, DT: tl.constexpr):
    """The indexer key of token t (layer norm, non-interleaved rope, dt, Hadamard, dt)
    quantised into ``k_cache`` at its slot; nothing for an unmapped token (program 3)."""
    ok, page, off = _new_token_target(bt_ptr, cl_ptr, t, N, max_pages, num_pages, bt_stride, P)
    pos = _position(cl_ptr, t, N)
    row = xk_ptr + t64 * xk_stride
    d = tl.arange(0, D_I)
    roped, first, pd, fj = _indexer_rope_lanes(d, ROPE)
    x = tl.load(row + d).to(DT).to(tl.float32)
    xp = tl.load(row + pd).to(DT).to(tl.float32)
    mu = tl.sum(x, 0) / D_I
    xc = x - mu
    rstd = tl.math.rsqrt(tl.sum(xc * xc, 0) / D_I + eps)
    y = xc * rstd * tl.load(k_norm_w_ptr + d) + tl.load(k_norm_b_ptr + d)
    yp = (xp - mu) * rstd * tl.load(k_norm_w_ptr + pd) + tl.load(k_norm_b_ptr + pd)
    cos, sin = _cos_sin(pos, freqs_ptr, fj, roped)
    k = tl.where(roped, _rotate(y, yp, cos, sin, first), y).to(DT)
    rows = tl.arange(0, HADAMARD_M)
    a = tl.where(rows[:, None] == 0, k[None, :], tl.zeros([HADAMARD_M, D_I], DT))
    kh = _rotate_hadamard(a, had_ptr, DT, D_I)                     # [16, D_I], row 0 the key
    kh = tl.sum(tl.where(rows[:, None] == 0, kh, -0.0), 0)         # -0.0 + v == v for every v
    _store_indexer(k_cache_ptr, page, off, ok, kh, d, D_I, P, K_PAGE_BYTES, UE8M0)


@triton.jit
def _prep_x_kernel(xq_ptr,        # [T, q_lora] dt or float32: the x projection's q columns
                   xkv_ptr,       # [T, D_qk] dt or float32: its latent columns (kv)
                   xk_ptr,        # [T, D_I] dt or float32: its indexer-key columns
                   x_ptr,         # [T, hidden] dt: the layer input
                   qr_ptr,        # [T, q_lora] dt, written: q_norm(xq)
                   x32_ptr,       # [T, hidden] float32, written: x
                   q_norm_ptr,    # [q_lora] float32
                   kv_norm_ptr,   # [C] (V3.2) / [D_qk] (V4) float32
                   k_norm_w_ptr,  # [D_I] float32 (indexer.k_norm.weight)
                   k_norm_b_ptr,  # [D_I] float32 (indexer.k_norm.bias)
                   freqs_ptr,     # [ROPE / 2] float64 rope frequencies
                   had_ptr,       # [D_I, D_I] +-1 (the layer's hadamard_sign), contiguous
                   kv_cache_ptr,  # latent cache, flat (FORMAT; bf16 latent as its uint16 view)
                   k_cache_ptr,   # fp8_indexer cache, flat uint8
                   bt_ptr,        # [B, max_pages] int32 block table
                   cl_ptr,        # [B] int32 context lengths (counting the N new tokens)
                   N, max_pages, num_pages, bt_stride, xq_stride, xkv_stride, xk_stride,
                   x_stride, hidden, eps,
                   Q_LORA: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_X: tl.constexpr,
                   D_QK: tl.constexpr, NOPE: tl.constexpr, ROPE: tl.constexpr,
                   NORM_ROPE: tl.constexpr, GROUPS: tl.constexpr, TILE: tl.constexpr,
                   FORMAT: tl.constexpr, P: tl.constexpr, KV_PAGE_BYTES: tl.constexpr,
                   BF16_CACHE: tl.constexpr, D_I: tl.constexpr, K_PAGE_BYTES: tl.constexpr,
                   UE8M0: tl.constexpr):
    t = tl.program_id(0)
    role = tl.program_id(1)
    t64 = t.to(tl.int64)
    DT: tl.constexpr = x_ptr.dtype.element_ty     # xq / xkv / xk: dt, or float32 rounded to dt on load
    if role == 0:
        _x_q_norm(xq_ptr, qr_ptr, q_norm_ptr, t64, xq_stride, eps, Q_LORA, BLOCK_Q, DT)
    elif role == 1:
        _x_to_float32(x_ptr, x32_ptr, t64, x_stride, hidden, BLOCK_X)
    elif role == 2:
        _x_latent(xkv_ptr, kv_norm_ptr, freqs_ptr, kv_cache_ptr, bt_ptr, cl_ptr, t, t64, N, max_pages,
                  num_pages, bt_stride, xkv_stride, eps, D_QK, NOPE, ROPE, NORM_ROPE, GROUPS, TILE,
                  FORMAT, P, KV_PAGE_BYTES, BF16_CACHE, DT)
    else:
        _x_index_key(xk_ptr, k_norm_w_ptr, k_norm_b_ptr, freqs_ptr, had_ptr, k_cache_ptr, bt_ptr,
                     cl_ptr, t, t64, N, max_pages, num_pages, bt_stride, xk_stride, eps, ROPE, P, D_I,
                     K_PAGE_BYTES, UE8M0, DT)


@triton.jit
def _q_index_heads(iq_ptr, w_ptr, idxq_ptr, idxw_ptr, freqs_ptr, had_ptr, pos, hb, t64, iq_stride,
                   w_stride, H_I: tl.constexpr, D_I: tl.constexpr, ROPE: tl.constexpr,
                   BLOCK_HI: tl.constexpr, UE8M0: tl.constexpr, DT: tl.constexpr,
                   W_PARTS: tl.constexpr, W_SHIFT: tl.constexpr):
    """Indexer q heads ``[hb * BLOCK_HI, +BLOCK_HI)`` of one token: rope, dt, Hadamard, dt,
    per-head scale, e4m3 bytes into ``idx_q``, ``w * scale`` into ``idx_w``. ``W_PARTS`` 3: the
    token's ``w`` row holds three ``H_I`` parts (the split ``weights_proj``, part ``j`` scaled by
    ``2^(j W_SHIFT)``), summed as ``(o0 + o1 2^-S) + o2 2^-2S`` in float32 (exact scalings)."""
    h = hb * BLOCK_HI + tl.arange(0, BLOCK_HI)
    mh = h < H_I
    d = tl.arange(0, D_I)
    roped, first, pd, fj = _indexer_rope_lanes(d, ROPE)
    rows = iq_ptr + t64 * iq_stride + h[:, None] * D_I              # [BLOCK_HI, 1]
    x = tl.load(rows + d[None, :], mask=mh[:, None], other=0.0).to(tl.float32)
    xp = tl.load(rows + pd[None, :], mask=mh[:, None] & roped[None, :], other=0.0).to(tl.float32)
    cos, sin = _cos_sin(pos, freqs_ptr, fj, roped)
    a = tl.where(roped[None, :], _rotate(x, xp, cos[None, :], sin[None, :], first[None, :]), x)
    y = _rotate_hadamard(a.to(DT), had_ptr, DT, D_I)               # [BLOCK_HI, D_I]
    s = _indexer_scale(_amax_rows(y, 1), UE8M0)                     # [BLOCK_HI]
    q = _e4m3_bits(tl.math.div_rn(y, s[:, None]))
    tl.store(idxq_ptr + t64 * (H_I * D_I) + h[:, None] * D_I + d[None, :], q.to(tl.uint8),
             mask=mh[:, None])
    w = tl.load(w_ptr + t64 * w_stride + h, mask=mh, other=0.0)
    if W_PARTS == 3:
        u1: tl.constexpr = 1.0 / (1 << W_SHIFT)                    # 2^-S, exact
        u2: tl.constexpr = 1.0 / (1 << (2 * W_SHIFT))
        w1 = tl.load(w_ptr + t64 * w_stride + H_I + h, mask=mh, other=0.0)
        w2 = tl.load(w_ptr + t64 * w_stride + 2 * H_I + h, mask=mh, other=0.0)
        w = (w + w1 * u1) + w2 * u2
    tl.store(idxw_ptr + t64 * H_I + h, w * s, mask=mh)


@triton.jit
def _q_mla_heads(qsrc_ptr, qlat_ptr, qmla_ptr, freqs_ptr, pos, hb, t64, H, qsrc_stride, qsrc_hstride,
                 qlat_hstride, eps, ROPE: tl.constexpr, ABSORBED: tl.constexpr,
                 QK_NOPE: tl.constexpr, NOPE: tl.constexpr, D_QK: tl.constexpr,
                 BLOCK_HM: tl.constexpr, HEAD_NORM: tl.constexpr, DT: tl.constexpr):
    """MLA q heads ``[hb * BLOCK_HM, +BLOCK_HM)`` of one token into ``q_mla[t]``: V3.2 the
    ``q_lat`` copy and the rope of ``q_pe``; V4 the head norm and the rope (module docstring)."""
    h = hb * BLOCK_HM + tl.arange(0, BLOCK_HM)
    mh = h < H
    h64 = h.to(tl.int64)
    out = qmla_ptr + t64 * H * D_QK + h64[:, None] * D_QK           # [BLOCK_HM, 1]
    src = qsrc_ptr + t64 * qsrc_stride + h64[:, None] * qsrc_hstride
    j = tl.arange(0, ROPE)
    pj = j ^ 1
    mr = mh[:, None] & (j[None, :] < ROPE)
    cos, sin = _cos_sin(pos, freqs_ptr, j // 2, j < ROPE)
    if ABSORBED:                                                   # copy q_lat, rope q_pe
        c = tl.arange(0, NOPE)
        mc = mh[:, None] & (c[None, :] < NOPE)
        lat = tl.load(qlat_ptr + h64[:, None] * qlat_hstride + t64 * NOPE + c[None, :], mask=mc)
        tl.store(out + c[None, :], lat, mask=mc)
        xr = tl.load(src + QK_NOPE + j[None, :], mask=mr, other=0.0).to(tl.float32)
        xp = tl.load(src + QK_NOPE + pj[None, :], mask=mr, other=0.0).to(tl.float32)
    else:                                                          # per-head rms norm, rope
        c = tl.arange(0, D_QK)
        mc = mh[:, None] & (c[None, :] < D_QK)
        x = tl.load(src + c[None, :], mask=mc, other=0.0).to(tl.float32)
        if HEAD_NORM:
            rstd = tl.math.rsqrt(tl.sum(x * x, 1) / D_QK + eps)   # [BLOCK_HM]
        else:                                                      # x * 1 and dt(dt): exact
            rstd = tl.full([BLOCK_HM], 1.0, tl.float32)
        tl.store(out + c[None, :], (x * rstd[:, None]).to(DT), mask=mc & (c[None, :] < NOPE))
        xr = tl.load(src + NOPE + j[None, :], mask=mr, other=0.0).to(tl.float32)
        xp = tl.load(src + NOPE + pj[None, :], mask=mr, other=0.0).to(tl.float32)
        xr = _round(xr * rstd[:, None], DT)
        xp = _round(xp * rstd[:, None], DT)
    rope = _rotate(xr, xp, cos[None, :], sin[None, :], (j[None, :] & 1) == 0)
    tl.store(out + NOPE + j[None, :], rope.to(DT), mask=mr)


@triton.jit
def _prep_q_kernel(iq_ptr,        # [T, H_I, D_I] dt: the indexer.wq_b projection
                   w_ptr,         # [T, W_PARTS * H_I] float32: the weights_proj GEMM (alpha folded)
                   qsrc_ptr,      # V3.2: [T, H, nope + ROPE] dt (wq_b's q); V4: [T, H, D_qk] dt
                   qlat_ptr,      # V3.2: [H, T, NOPE] dt (the absorption bmm); V4: unused
                   qmla_ptr,      # [T, H, D_qk] dt, written: the sparse-MLA query
                   idxq_ptr,      # [T, H_I, D_I] uint8, written: e4m3 bytes of idx_q
                   idxw_ptr,      # [T, H_I] float32, written: idx_w
                   freqs_ptr,     # [ROPE / 2] float64
                   had_ptr,       # [D_I, D_I] +-1 (the layer's hadamard_sign), contiguous
                   cl_ptr,        # [B] int32 context lengths
                   N, H, iq_stride, w_stride, qsrc_stride, qsrc_hstride, qlat_hstride, eps,
                   H_I: tl.constexpr, D_I: tl.constexpr, ROPE: tl.constexpr,
                   BLOCK_HI: tl.constexpr, NUM_HI: tl.constexpr,
                   ABSORBED: tl.constexpr, QK_NOPE: tl.constexpr, NOPE: tl.constexpr,
                   D_QK: tl.constexpr, BLOCK_HM: tl.constexpr, HEAD_NORM: tl.constexpr,
                   UE8M0: tl.constexpr, W_PARTS: tl.constexpr = 1, W_SHIFT: tl.constexpr = 0):
    t = tl.program_id(0)
    blk = tl.program_id(1)
    t64 = t.to(tl.int64)
    DT: tl.constexpr = iq_ptr.dtype.element_ty
    pos = _position(cl_ptr, t, N)
    if NUM_HI > 0 and blk < NUM_HI:         # (NUM_HI 0: the MLA half alone, no indexer code)
        _q_index_heads(iq_ptr, w_ptr, idxq_ptr, idxw_ptr, freqs_ptr, had_ptr, pos, blk, t64, iq_stride,
                       w_stride, H_I, D_I, ROPE, BLOCK_HI, UE8M0, DT, W_PARTS, W_SHIFT)
    else:
        _q_mla_heads(qsrc_ptr, qlat_ptr, qmla_ptr, freqs_ptr, pos, blk - NUM_HI, t64, H, qsrc_stride,
                     qsrc_hstride, qlat_hstride, eps, ROPE, ABSORBED, QK_NOPE, NOPE, D_QK, BLOCK_HM,
                     HEAD_NORM, DT)


@triton.jit
def _rope_out_kernel(attn_ptr,     # [T, H, D] dt: the sparse-MLA output (V4-Flash)
                     o_ptr,        # [T, H, D] dt, written: attn with its last ROPE dims roped back
                     freqs_ptr,    # [ROPE / 2] float64
                     cl_ptr,       # [B] int32 context lengths
                     N, H, attn_stride,
                     D: tl.constexpr, ROPE: tl.constexpr, BLOCK_H: tl.constexpr):
    """V4-Flash's inverse rope on the attention output (``MLA.forward``'s ``apply_rotary_emb(o,
    freqs_cis, inverse=True)`` at the query position): heads ``[program_id(1) * BLOCK_H,
    +BLOCK_H)`` of token ``program_id(0)``; the first ``D - ROPE`` dims copied, the last ``ROPE``
    rotated by minus the angle (interleaved pairs, float32 math from the dt values, one rounding
    to dt: the composite ``_rope_into(o, o, cos, -sin)``)."""
    t = tl.program_id(0)
    t64 = t.to(tl.int64)
    DT: tl.constexpr = attn_ptr.dtype.element_ty
    h = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    mh = h < H
    src = attn_ptr + t64 * attn_stride + h[:, None] * D             # [BLOCK_H, 1]
    dst = o_ptr + t64 * H * D + h[:, None] * D
    c = tl.arange(0, D)
    mc = mh[:, None] & (c[None, :] < D - ROPE)
    tl.store(dst + c[None, :], tl.load(src + c[None, :], mask=mc), mask=mc)
    j = tl.arange(0, ROPE)
    mr = mh[:, None] & (j[None, :] < ROPE)
    xr = tl.load(src + (D - ROPE) + j[None, :], mask=mr, other=0.0).to(tl.float32)
    xp = tl.load(src + (D - ROPE) + (j ^ 1)[None, :], mask=mr, other=0.0).to(tl.float32)
    cos, sin = _cos_sin(_position(cl_ptr, t, N), freqs_ptr, j // 2, j < ROPE)
    rope = _rotate(xr, xp, cos[None, :], -sin[None, :], (j[None, :] & 1) == 0)
    tl.store(dst + (D - ROPE) + j[None, :], rope.to(DT), mask=mr)


ROPE_OUT_BLOCK_H = 8
"""Heads per program of :func:`_rope_out_kernel` (4 warps; a [16, 512] tile took ~200 registers
per thread in the sm_90 / sm_120 compile, 8 heads ~85)."""


# ================================================================================== launch args

def latent_tile(nope: int) -> tuple[int, int]:
    """(GROUPS, TILE) of the latent row's nope dims in :func:`_prep_x_kernel`: the quantisation
    tile of the fp8 layouts (128 for ``fp8_ds_mla``'s 512 dims, 64 for ``fp8_model1``'s 448),
    GROUPS the next power of two of ``nope / TILE`` (extra groups masked)."""
    tile = 128 if nope % 128 == 0 else 64
    if nope % tile:
        raise ValueError(f"nope: expected a multiple of 64, got {nope}")
    return triton.next_power_of_2(nope // tile), tile


def prep_x_constexprs(*, q_lora: int, d_qk: int, nope: int, rope: int, norm_rope: bool,
                      kv_format: str, page_size: int, kv_page_bytes: int, bf16_cache: bool,
                      index_head_dim: int, scale_fmt: str | None) -> dict:
    """The constexprs of :func:`_prep_x_kernel` (also the AOT specs').

    Raises:
      ValueError: ``kv_format`` not one of :data:`KV_FORMATS`, or a latent width the fp8 layout
        does not hold (``fp8_ds_mla``: nope 512 + rope 64; ``fp8_model1``: 448 + 64).
    """
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format: expected one of {KV_FORMATS}, got {kv_format!r}")
    groups, tile = latent_tile(nope)
    want = {"fp8_ds_mla": (512, 64, 4, 128), "fp8_model1": (448, 64, 8, 64)}.get(kv_format)
    if want is not None and (nope, rope, groups, tile) != want:
        raise ValueError(f"kv_format: {kv_format!r} holds nope {want[0]} + rope {want[1]} dims, got "
                         f"{nope} + {rope}")
    return dict(Q_LORA=q_lora, BLOCK_Q=triton.next_power_of_2(q_lora), BLOCK_X=1024, D_QK=d_qk,
                NOPE=nope, ROPE=rope, NORM_ROPE=norm_rope, GROUPS=groups, TILE=tile,
                FORMAT=kv_format, P=page_size, KV_PAGE_BYTES=kv_page_bytes, BF16_CACHE=bf16_cache,
                D_I=index_head_dim, K_PAGE_BYTES=page_size * (index_head_dim + 4),
                UE8M0=scale_fmt == "ue8m0")


def prep_q_constexprs(cfg: PrepQConfig, *, index_heads: int, index_head_dim: int, rope: int,
                      absorbed: bool, head_norm: bool, qk_nope: int, nope: int, d_qk: int,
                      scale_fmt: str | None, part: str = "all", w_parts: int = 1,
                      w_shift: int = 0) -> dict:
    """The constexprs of :func:`_prep_q_kernel` (also the AOT specs'). ``nope``: the q_mla
    columns before its rope dims (V3.2 C = 512, V4 D_qk - rope = 448); ``qk_nope``: V3.2's
    per-head column of q_pe in wq_b's output (0 for V4).

    ``w_parts``: 1, or 3 for the split ``weights_proj``'s three float32 products a token
    (``torch_impl.layer.split_wproj_on``), summed in the kernel, part ``j`` unscaled by
    ``2^-(j w_shift)`` (``kernels.scalars.SPLIT_SHIFT_BITS``: bf16 8, fp16 11); an MLA-only compile
    ignores both.

    ``part``: ``"all"`` or ``"index"`` (the same compile: an ``"index"`` launch's grid stops
    after the ``NUM_HI`` indexer programs), or ``"mla"``: ``NUM_HI = 0``, so every program is an
    MLA program; its indexer constexprs are fixed (``UE8M0`` False) since that branch is dead,
    so one compile serves both scale formats (the layer's overlapped step,
    ``torch_impl.layer.DSADecodeLayer(overlap=...)``).

    Raises:
      ValueError: ``part`` not one of ``"all"``, ``"index"``, ``"mla"``; ``w_parts`` not the int
        1 or 3; ``w_shift`` not an int in [1, 16] with ``w_parts`` 3 (not the MLA part).
    """
    if part not in ("all", "index", "mla"):
        raise ValueError(f"part: expected 'all', 'index' or 'mla', got {part!r}")
    if type(w_parts) is not int or w_parts not in (1, 3):
        raise ValueError(f"w_parts: expected the int 1 or 3, got {w_parts!r}")
    mla_only = part == "mla"
    if w_parts == 3 and not mla_only and (type(w_shift) is not int or not 1 <= w_shift <= 16):
        raise ValueError(f"w_shift: expected an int in [1, 16] with w_parts 3, got {w_shift!r}")
    return dict(H_I=index_heads, D_I=index_head_dim, ROPE=rope, BLOCK_HI=cfg.block_hi,
                NUM_HI=0 if mla_only else -(-index_heads // cfg.block_hi), ABSORBED=absorbed,
                QK_NOPE=qk_nope, NOPE=nope, D_QK=d_qk, BLOCK_HM=cfg.block_hm,
                HEAD_NORM=head_norm and not absorbed, UE8M0=scale_fmt == "ue8m0" and not mla_only,
                W_PARTS=1 if mla_only else w_parts, W_SHIFT=0 if mla_only or w_parts == 1 else w_shift)


def supported(*, index_head_dim: int, rope: int, latent_nope: int | None = None,
              mla_row: int | None = None) -> str | None:
    """None when the kernels handle these dimensions, else the reason (the launchers raise
    NotImplementedError with it): D_I a power of two in [16, 65536] and rope a power of two in
    [2, D_I) (both kernels); for :func:`_prep_x_kernel` the latent's nope dims
    (``latent_nope``) a multiple of 64; for :func:`_prep_q_kernel` the MLA q row it holds in one
    register tile per head (``mla_row``: V3.2 C, V4 D_qk) a power of two."""
    def p2(v):
        return v >= 1 and v & (v - 1) == 0
    if not (p2(index_head_dim) and 16 <= index_head_dim <= 65536):
        return f"D_I = {index_head_dim} is not a power of two in [16, 65536]"
    if not (p2(rope) and 2 <= rope < index_head_dim):
        return f"rope = {rope} is not a power of two in [2, D_I)"
    if latent_nope is not None and (latent_nope < 64 or latent_nope % 64):
        return f"the latent's nope dims ({latent_nope}) are not a positive multiple of 64"
    if mla_row is not None and not p2(mla_row):
        return f"the MLA q row ({mla_row} dims) is not a power of two"
    return None


@triton.jit
def _window_split_kernel(cl_ptr,     # int32 [B] (L_b, the MTP rule) or [B, N] (per-draft lengths)
                         lens_ptr,   # int32 [B * N] out: max(len_i - W, 0), the indexer's lengths
                         win_ptr,    # int32 [B * N, W] out (row stride stride_w): len_i - W + w,
                                     # -1 where negative
                         N, W, cl_sb, cl_sn, stride_w,
                         CL_2D: tl.constexpr, BLOCK_W: tl.constexpr):
    """The V4 sliding window of one step in one launch (``torch_impl.step.window_split``), one
    program per (request, draft) row ``t = b * N + i``: the draft's valid length ``len_i``
    (``L_b - (N - 1 - i)``, or ``cl[b, i]``) in int64, then its indexer length and its window
    positions. Replaces nine small torch launches (arange, add, sub, clamp, casts). With
    ``stride_w`` > W the rows are the tail of the step's ``[top-k, window]`` index list
    (``dsa::indexer_topk_window``: the top-k kernels write the head; no concatenation)."""
    t = tl.program_id(0)
    b = t // N
    i = t - b * N
    if CL_2D:
        ln = tl.load(cl_ptr + b.to(tl.int64) * cl_sb + i * cl_sn).to(tl.int64)
    else:
        ln = tl.load(cl_ptr + b.to(tl.int64) * cl_sb).to(tl.int64) - (N - 1 - i)
    tl.store(lens_ptr + t, tl.maximum(ln - W, 0).to(tl.int32))
    for w0 in range(0, W, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        tl.store(win_ptr + t.to(tl.int64) * stride_w + w, tl.maximum(ln - W + w, -1).to(tl.int32),
                 mask=w < W)


def window_block(window: int) -> int:
    """Window positions per loop iteration of :func:`_window_split_kernel`: the window rounded
    up to a power of two, at least 16, at most 1,024 (V4-Flash's 128: one iteration)."""
    return min(1024, max(16, 1 << max(0, int(window) - 1).bit_length()))


def rope_out_block_h(heads: int) -> int:
    """Heads per program of :func:`_rope_out_kernel` for a rank of ``heads`` heads (every V4-Flash
    rank has 8 or more)."""
    del heads
    return ROPE_OUT_BLOCK_H


# ================================================================================== AOT specs

def aot_specs(smem_class: str) -> list:
    """Every launch of the four kernels :func:`torch_impl.layer` can make at the real dimensions
    (``kernels.layer_config``: V3.2 and V4-Flash, P = 64, D_I 128, rope 64; every TP head count
    of the presets; fp32 / fp16 / bf16 layers; each latent layout, the ``latent`` cache in the
    layer's dtype; both scale formats; V4's window split for 1-D and 2-D lengths), with
    :func:`prep_q_heuristic`'s configs, for
    ``tests/test_triton_compile.py``. ``smem_class`` does not change the choice (the float32
    Hadamard operands, the largest, fit 99 KiB)."""
    from kernels import formats as nf
    from kernels._triton_aot import LaunchSpec
    from kernels.layer_config import DSV32_LAYER, DSV4_FLASH_LAYER
    del smem_class
    P = 64
    specs = []
    xints = {n: "i32" for n in ("N", "max_pages", "num_pages", "bt_stride", "xq_stride", "xkv_stride",
                                "xk_stride", "x_stride", "hidden")}
    qints = {n: "i32" for n in ("N", "H", "iq_stride", "w_stride", "qsrc_stride", "qsrc_hstride",
                                "qlat_hstride")}
    tys = {"fp32": 4, "fp16": 2, "bf16": 2}
    # the latent cache's store dtype: the layer's own (fp32, fp16, bf16 as u16 bits). Another
    # dtype only changes the final store's conversion, not the tiles or loops: compiled for
    # sm_120 with Triton 3.6.0 (2026-12-05), all three cache dtypes of each (preset, layer dtype,
    # scale format) took the same shared memory (36,864 B 16-bit, 73,728 B fp32), so the CI fit
    # check compiles the pairing a layer of each dtype writes (45 launches instead of 69).
    latent_cache = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*u16"}
    for cfg in (DSV32_LAYER, DSV4_FLASH_LAYER):
        fp8 = "fp8_ds_mla" if cfg.absorbed else "fp8_model1"
        nope_q = cfg.kv_lora_rank if cfg.absorbed else cfg.d_qk - cfg.d_rope
        heads = sorted({cfg.heads_per_rank(tp) for tp in (1, 2, 4, 8)})
        for dt, nbytes in tys.items():
            caches = [(fp8, "*u8", False), ("latent", latent_cache[dt], dt == "bf16")]
            for ue8m0 in (True, False):
                sf = "ue8m0" if ue8m0 else None
                for fmt, cache, bf16 in caches:
                    kv_page = nf.model1_page_bytes(P) if fmt == "fp8_model1" else \
                        P * (656 if fmt == "fp8_ds_mla" else cfg.d_qk)
                    ce = prep_x_constexprs(q_lora=cfg.q_lora_rank, d_qk=cfg.d_qk, nope=cfg.kv_lora_rank,
                                           rope=cfg.d_rope, norm_rope=not cfg.absorbed, kv_format=fmt,
                                           page_size=P, kv_page_bytes=kv_page, bf16_cache=bf16,
                                           index_head_dim=cfg.index_head_dim, scale_fmt=sf)
                    # the x projection's output in dt, or float32 (the layer's joint x_proj +
                    # split weights_proj GEMM, 16-bit layers): rounded to dt on load
                    for xt in [dt] + (["fp32"] if dt != "fp32" else []):
                        specs.append(LaunchSpec(
                          label=f"prep_x {cfg.name} dt={dt} {fmt} cache={cache[1:]} ue8m0={ue8m0}"
                                + ("" if xt == dt else " xp=fp32"),
                          module="kernels.layer_prep.triton", kernel="_prep_x_kernel",
                          signature={"xq_ptr": f"*{xt}", "xkv_ptr": f"*{xt}", "xk_ptr": f"*{xt}",
                                     "x_ptr": f"*{dt}", "qr_ptr": f"*{dt}", "x32_ptr": "*fp32",
                                     "q_norm_ptr": "*fp32", "kv_norm_ptr": "*fp32", "k_norm_w_ptr": "*fp32",
                                     "k_norm_b_ptr": "*fp32", "freqs_ptr": "*fp64", "had_ptr": f"*{dt}",
                                     "kv_cache_ptr": cache, "k_cache_ptr": "*u8", "bt_ptr": "*i32",
                                     "cl_ptr": "*i32", **xints, "eps": "fp32"},
                          constexprs=ce, num_warps=X_NUM_WARPS, num_stages=1))
                qcs = sorted({prep_q_heuristic(cfg.index_heads, h, nbytes) for h in heads},
                             key=lambda c: (c.block_hi, c.block_hm))
                # the overlapped step's MLA-only launch (NUM_HI 0) is one compile for both scale
                # formats: listed with ue8m0 only
                # the split weights_proj (three parts a token) with 16-bit activations only
                for qc, part, wp in ([(c, "all", 1) for c in qcs] + [(c, "mla", 1) for c in qcs if ue8m0]
                                     + [(c, "all", 3) for c in qcs if dt != "fp32"]):
                    ce = prep_q_constexprs(qc, index_heads=cfg.index_heads, index_head_dim=cfg.index_head_dim,
                                           rope=cfg.d_rope, absorbed=cfg.absorbed,
                                           head_norm=cfg.q_head_norm, qk_nope=cfg.qk_nope_head_dim,
                                           nope=nope_q, d_qk=cfg.d_qk,
                                           scale_fmt=sf, part=part, w_parts=wp,
                                           w_shift=SPLIT_SHIFT_BITS.get(dt, 0))
                    tag = ("" if part == "all" else " part=mla") + ("" if wp == 1 else " w_parts=3")
                    specs.append(LaunchSpec(
                        label=f"prep_q {cfg.name} dt={dt} ue8m0={ue8m0}{tag} {qc}",
                        module="kernels.layer_prep.triton", kernel="_prep_q_kernel",
                        signature={"iq_ptr": f"*{dt}", "w_ptr": "*fp32", "qsrc_ptr": f"*{dt}",
                                   "qlat_ptr": f"*{dt}", "qmla_ptr": f"*{dt}", "idxq_ptr": "*u8",
                                   "idxw_ptr": "*fp32", "freqs_ptr": "*fp64", "had_ptr": f"*{dt}",
                                   "cl_ptr": "*i32", **qints, "eps": "fp32"},
                        constexprs=ce, num_warps=qc.num_warps, num_stages=1))
                if ue8m0 and dt == "bf16" and cfg.window:
                    for cl_2d in (False, True):
                        specs.append(LaunchSpec(
                            label=f"window_split {cfg.name} cl_2d={cl_2d}",
                            module="kernels.layer_prep.triton", kernel="_window_split_kernel",
                            signature={"cl_ptr": "*i32", "lens_ptr": "*i32", "win_ptr": "*i32",
                                       "N": "i32", "W": "i32", "cl_sb": "i32", "cl_sn": "i32",
                                       "stride_w": "i32"},
                            constexprs=dict(CL_2D=cl_2d, BLOCK_W=window_block(cfg.window)),
                            num_warps=1, num_stages=1))
                if ue8m0 and cfg.inverse_rope_out:
                    for bh in sorted({rope_out_block_h(h) for h in heads}):
                        specs.append(LaunchSpec(
                            label=f"rope_out {cfg.name} dt={dt} block_h={bh}",
                            module="kernels.layer_prep.triton", kernel="_rope_out_kernel",
                            signature={"attn_ptr": f"*{dt}", "o_ptr": f"*{dt}", "freqs_ptr": "*fp64",
                                       "cl_ptr": "*i32", "N": "i32", "H": "i32", "attn_stride": "i32"},
                            constexprs=dict(D=cfg.d_qk, ROPE=cfg.d_rope, BLOCK_H=bh), num_warps=4,
                            num_stages=1))
    return specs
