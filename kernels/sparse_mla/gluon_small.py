"""Sparse MLA decode for few heads (H <= 32) on sm_90 in Gluon: rows on the wgmma M axis.

Semantics and numerics: those of ``kernels.sparse_mla.gluon`` (docs/SPEC.md "Operation B";
docs/SEMANTICS.md "fast-path numerics"): fp8 caches (``fp8_ds_mla``, ``fp8_model1``), 16-bit
q, each gathered block of 64 rows dequantized once into fp16 in the program's running
power-of-two unit, q nope scaled per head by a power of two into fp16, the rope dot in the
rope's dtype, fp16 p (fp8_model1's rope values: bf16 p plus its bf16 residual). Same split-K
partials (normalised fp32 out, log2-domain LSE) or, with one split, the final output; the
Triton combine kernel merges the partials. The helpers that gather, resolve and convert rows
are ``gluon.py``'s.

Why another kernel: a wgmma tile has 64 rows per warpgroup on M. ``gluon.py`` puts the heads on
M, so 8 or 16 heads would pad the tile to 64 (4-8x the tensor work) and every head block of a
request would convert the same rows; the Triton 16-head tile runs mma.sync at 247-255 registers,
2 CTAs an SM and 9-25 loop instructions per (row, head) (bench/NOTES.md "Small heads"). Here
the gathered rows are on M and the heads on N (wgmma N = 8 .. 256 in steps of 8):

* **Scores.** ``S^T = X . q^T`` [64 rows, HN heads]: A = X (the converted block, shared
  memory, K-major), B = q^T (shared, K-major). The nope chunks accumulate together, the rope
  chunk separately (different units), as in ``gluon.py``.
* **Softmax** along the rows (axis 0) per head: the running max, sum and unit are per head
  (the accumulator's column slice).
* **Values.** ``O^T_c += X_c^T . P^T`` per 64-dim chunk c of D_v: A = the transposed view of
  X_c (an MN-major fp16 operand, which wgmma reads for 16-bit types), B = P^T stored to shared
  memory as fp16 (``[HN, 64]``, K-major). The fp32 accumulator is 512 x HN / (32 x warps)
  registers a thread: 64 at HN 16 and 4 warps.
* **Work.** One program: HN heads of one (request, draft) over one split of its top-k list;
  grid ``(ceil(H / HN), splits, B * N)``. ``num_warps`` 4 (one warpgroup) or 8 (two, each
  computing HN / 2 of the heads of every dot).
* **Pipeline.** As ``gluon.py``: the next block's rows are loaded into registers while this
  block's dots and softmax run; slots are resolved one block and indices loaded two blocks
  ahead. The conversion into X runs chunk by chunk after a barrier (one 64 x 64 fp16 chunk
  live at a time), so a warpgroup holds the raw next block, O and S at once. ``NBUF`` 1
  (~94 KB of shared memory at HN 16: two CTAs an SM) or 2 (the next block is stored into the
  other buffer while the value dots run).
* **Gather and masking.** As ``gluon.py``: invalid entries (negative, beyond the cache or the
  table, a negative page entry, past ``topk_length``) are masked in every load and excluded
  from the softmax; pages may be strided (``page_bytes``).

Only sm_90 (wgmma): the launcher (``kernels/sparse_mla/triton_launch.py``) runs it for a config
whose ``kernel`` is ``"gluon_sh"`` (``configs.kernel_eligible``; never in the CPU interpreter).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from kernels.sparse_mla.gluon import (NEG, _alloc_x, _barrier, _block_unit, _epilogue, _issue_rows,
                                      _list_range, _pipeline_ahead, _pipeline_start, _program,
                                      _q_rows, _resolve, _store_q_scaled, _tile, _views)
from kernels.sparse_mla.triton import _pow2

@gluon.jit
def _pinned(r, z):
    """``r`` (e4m3 bytes) XOR ``z`` (zeros read from shared memory after a barrier), 4 bytes an
    instruction: the conversion then depends on a load ptxas cannot move above that barrier.
    Without it ptxas converts every chunk of the block ahead of the barrier, holding twice the
    raw block's registers (255 registers and 588 B spilled at 16 heads, 4 warps)."""
    return gl.inline_asm_elementwise("xor.b32 $0, $1, $2;", "=r,r,r", [r, z], dtype=gl.uint8,
                                     is_pure=True, pack=4)


@gluon.jit
def _convert_store(x0, x1, x2, x3, x4, x5, x6, x7, xr, r0, r1, r2, r3, r4, r5, r6, r7, rr,
                   c0, c1, c2, c3, ub, zs, KV_FORMAT: gl.constexpr, NC: gl.constexpr,
                   ROPE_DTYPE: gl.constexpr, ROW: gl.constexpr):
    """Convert one gathered row block into X chunk by chunk (e4m3 * scale in the unit
    ``2^(ub - 127)`` as fp16, the rope chunk in its dtype) after every warp is done reading X,
    then make it visible to the async proxy (wgmma) and to every warp. ``zs``: 64 int32 zeros
    in shared memory (:func:`_pinned`)."""
    shift = _pow2(254 - ub)
    _barrier()
    z, _ = gl.broadcast(zs.load(ROW).to(gl.uint8)[:, None], r0)
    x0.store(_tile(_pinned(r0, z), c0, c1, c2, c3, shift, 0, KV_FORMAT))
    x1.store(_tile(_pinned(r1, z), c0, c1, c2, c3, shift, 1, KV_FORMAT))
    x2.store(_tile(_pinned(r2, z), c0, c1, c2, c3, shift, 2, KV_FORMAT))
    x3.store(_tile(_pinned(r3, z), c0, c1, c2, c3, shift, 3, KV_FORMAT))
    x4.store(_tile(_pinned(r4, z), c0, c1, c2, c3, shift, 4, KV_FORMAT))
    x5.store(_tile(_pinned(r5, z), c0, c1, c2, c3, shift, 5, KV_FORMAT))
    x6.store(_tile(_pinned(r6, z), c0, c1, c2, c3, shift, 6, KV_FORMAT))
    if NC == 8:
        x7.store(_tile(_pinned(r7, z), c0, c1, c2, c3, shift, 7, KV_FORMAT))
    xr.store(rr.to(gl.bfloat16, bitcast=True).to(ROPE_DTYPE))
    fence_async_shared()
    _barrier()


@gluon.jit
def _scores_t(qn, qr, y0, y1, y2, y3, y4, y5, y6, y7, yr, oz, NC: gl.constexpr,
              HN: gl.constexpr, MMA: gl.constexpr):
    """``(s, r)``: ``S^T`` of one row block, [64 rows, HN heads], waited: ``s`` the nope chunks'
    dots accumulated together (units ``q_inv * 2^ub``), ``r`` the rope dot (true units)."""
    s0 = gl.zeros([64, HN], gl.float32, layout=MMA)
    s = warpgroup_mma(y0, qn.index(0 + oz).permute((1, 0)), s0, use_acc=False, is_async=True)
    s = warpgroup_mma(y1, qn.index(1 + oz).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(y2, qn.index(2 + oz).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(y3, qn.index(3 + oz).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(y4, qn.index(4 + oz).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(y5, qn.index(5 + oz).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(y6, qn.index(6 + oz).permute((1, 0)), s, is_async=True)
    if NC == 8:
        s = warpgroup_mma(y7, qn.index(7 + oz).permute((1, 0)), s, is_async=True)
    r = warpgroup_mma(yr, qr.index(oz).permute((1, 0)), s0, use_acc=False, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(s, r))


@gluon.jit
def _softmax_t(s, r, okr, q_inv, ub, ub_i, m_i, l_i, qk_scale_log2):
    """``gluon._online_softmax`` with the rows on axis 0: per head (column) the running max
    ``m_i`` and sum ``l_i``; returns ``(p, alpha, an, m_i, l_i)``, ``an`` = alpha times the
    factor that brings the nope accumulators from unit ``2^ub_i`` to ``2^ub``; masked rows get
    p = 0."""
    s = s * (q_inv * _pow2(ub))[None, :] + r
    s = gl.where(okr[:, None], s * qk_scale_log2, NEG)
    m_new = gl.maximum(m_i, gl.max(s, axis=0))
    alpha = gl.exp2(m_i - m_new)
    p = gl.where(okr[:, None], gl.exp2(s - m_new[None, :]), 0.0)
    l_i = l_i * alpha + gl.sum(p, axis=0)
    an = alpha * _pow2(gl.maximum(ub_i - ub + 127, 1))
    return p, alpha, an, m_new, l_i


@gluon.jit
def _pv_t(o, an, x, pt):
    """``o * an + X_c^T . P^T`` issued asynchronously (the caller waits)."""
    return warpgroup_mma(x.permute((1, 0)), pt.permute((1, 0)), o * an[None, :], is_async=True)


@gluon.jit
def _values_t(o0, o1, o2, o3, o4, o5, o6, o7, p, alpha, an, y0, y1, y2, y3, y4, y5, y6, y7, yr,
              pt, pth, ptl, ROPE_IN_V: gl.constexpr, R_SPLIT: gl.constexpr,
              ROPE_DTYPE: gl.constexpr):
    """Store P^T (fp16; fp8_model1's rope values: P in the rope's dtype and, bf16, its residual)
    and issue (async) the value wgmmas ``O^T_c += X_c^T . P^T`` per 64-dim chunk."""
    pt.store(gl.permute(p.to(gl.float16), (1, 0)))
    if ROPE_IN_V:
        p_hi = p.to(ROPE_DTYPE)
        pth.store(gl.permute(p_hi, (1, 0)))
        if R_SPLIT:
            ptl.store(gl.permute((p - p_hi.to(gl.float32)).to(ROPE_DTYPE), (1, 0)))
    fence_async_shared()
    _barrier()
    o0 = _pv_t(o0, an, y0, pt)
    o1 = _pv_t(o1, an, y1, pt)
    o2 = _pv_t(o2, an, y2, pt)
    o3 = _pv_t(o3, an, y3, pt)
    o4 = _pv_t(o4, an, y4, pt)
    o5 = _pv_t(o5, an, y5, pt)
    o6 = _pv_t(o6, an, y6, pt)
    if ROPE_IN_V:
        o7 = _pv_t(o7, alpha, yr, pth)
        if R_SPLIT:
            o7 = warpgroup_mma(yr.permute((1, 0)), ptl.permute((1, 0)), o7, is_async=True)
    else:
        o7 = _pv_t(o7, an, y7, pt)
    return o0, o1, o2, o3, o4, o5, o6, o7


@gluon.jit
def _epilogue_t(o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, ub_i, pid_h, pid_s, pid_bn, H, nbn,
                sink_ptr, lse_ptr, pl_ptr, po_ptr, out_ptr, FINAL: gl.constexpr,
                HAS_SINK: gl.constexpr, ROPE_IN_V: gl.constexpr, OUT: gl.constexpr,
                HN: gl.constexpr):
    """``gluon._epilogue`` of the ``O^T_c`` chunks (``[64 dims, HN heads]``) turned heads-first
    in the store layout ``OUT``, with the per-head ``m_i`` / ``l_i`` (the accumulator's column
    layout) and the unit ``ub_i``."""
    HL: gl.constexpr = gl.SliceLayout(1, OUT)
    _epilogue(_heads_first(o0, OUT), _heads_first(o1, OUT), _heads_first(o2, OUT),
              _heads_first(o3, OUT), _heads_first(o4, OUT), _heads_first(o5, OUT),
              _heads_first(o6, OUT), _heads_first(o7, OUT), gl.convert_layout(m_i, HL),
              gl.convert_layout(l_i, HL), ub_i, pid_h, pid_s, pid_bn, H, nbn, sink_ptr, lse_ptr,
              pl_ptr, po_ptr, out_ptr, FINAL, HAS_SINK, ROPE_IN_V, OUT, HN)


@gluon.jit
def _heads_first(o, OUT: gl.constexpr):
    """``O^T_c`` [64 dims, HN heads] as ``[HN, 64]`` in the store layout ``OUT`` (4 consecutive
    dims a thread: 16-byte stores), the orientation of ``gluon._epilogue``."""
    return gl.convert_layout(gl.permute(o, (1, 0)), OUT)


@gluon.jit
def _sparse_mla_gluon_sh_kernel(
    q_ptr,            # [B, N, H, D_qk] bf16 / fp16, strides sq_*; last dim contiguous
    kv_ptr,           # the cache as uint8 bytes
    kv16_ptr,         # the same bytes as int16 (bf16 rope bits)
    kv32_ptr,         # the same bytes as int32 (ds_mla scales as float32 bits; model1 ue8m0 words)
    idx_ptr,          # [B, N, K] int32 slots (or logical positions with HAS_BT), strides si_*
    bt_ptr,           # [B, max_pages] int32 block table (HAS_BT)
    tkl_ptr,          # [B] int32 topk_length (HAS_TKL)
    sink_ptr,         # [H] float32 attention sink (HAS_SINK, FINAL only)
    po_ptr,           # [S, B*N, H, 512] float32 partial out (not FINAL)
    pl_ptr,           # [S, B*N, H] float32 partial LSE, log2 domain (not FINAL)
    out_ptr,          # [B, N, H, 512] q dtype (FINAL)
    lse_ptr,          # [B, N, H] float32 natural-log LSE (FINAL)
    sq_b, sq_n, sq_h, si_b, si_n, sbt_b,
    N, H, K, num_slots, num_pages, max_pages, page_size, page_bytes, chunk, qk_scale_log2,
    KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
    HAS_SINK: gl.constexpr, FINAL: gl.constexpr, ROPE_DTYPE: gl.constexpr,
    NBUF: gl.constexpr = 1, HN: gl.constexpr = 16,
):
    gl.static_assert((KV_FORMAT == 1) | (KV_FORMAT == 2), "fp8_ds_mla or fp8_model1 only")
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7     # fp16 nope chunks; then one rope chunk
    ROPE_IN_V: gl.constexpr = KV_FORMAT == 2          # model1's rope dims are part of V
    R_SPLIT: gl.constexpr = ROPE_DTYPE == gl.bfloat16  # bf16 p + its residual on the rope values
    NW: gl.constexpr = gl.num_warps()
    WG: gl.constexpr = NW // 4                         # warpgroups, side by side along the heads
    gl.static_assert((NW == 4) | (NW == 8), "one or two warpgroups")
    gl.static_assert((HN // WG) % 8 == 0, "wgmma N (heads a warpgroup) is a multiple of 8")

    # Register layouts: LD gathers a [64 rows, 64 B] chunk as 16-byte vectors; MMA is the wgmma
    # accumulator [64 rows or dims, HN heads], the warpgroups side by side along the heads;
    # OUT stores the output heads-first ([HN, 64]) with 4 consecutive dims a thread.
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [NW, 1], [1, 0])
    LD16: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [NW, 1], [1, 0])
    LDQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, LD)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG],
                                                  instr_shape=[16, HN // WG, 16])
    MROW: gl.constexpr = gl.SliceLayout(1, MMA)
    MCOL: gl.constexpr = gl.SliceLayout(0, MMA)
    OUT: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [NW, 1], [1, 0])
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    pid_h, pid_s, pid_bn, nbn, b, n = _program(N)

    qn = gl.allocate_shared_memory(gl.float16, [NC, HN, 64], SH)
    qr = gl.allocate_shared_memory(ROPE_DTYPE, [1, HN, 64], SH)
    pt = gl.allocate_shared_memory(gl.float16, [HN, 64], SH)      # P^T of the block (fp16)
    pth = gl.allocate_shared_memory(ROPE_DTYPE, [HN, 64], SH)     # model1 rope values: P^T, hi
    ptl = gl.allocate_shared_memory(ROPE_DTYPE, [HN, 64], SH)     # ... and its residual (bf16)
    # X: one buffer a chunk (the barrier analysis treats views of one buffer as overlapping)
    x0, x1, x2, x3, x4, x5, x6, x7, xr = _alloc_x(gl.float16, ROPE_DTYPE, NBUF, SH)
    zs = gl.allocate_shared_memory(gl.int32, [64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    zs.store(gl.zeros([64], gl.int32, layout=ROW))      # zeros for _pinned

    # ---- q^T: per head a power of two 2^t that puts max|q_nope| in [2^14, 2^15), fp16 chunks
    q_row, qmask = _q_rows(q_ptr, pid_h, b, n, H, sq_b, sq_n, sq_h, LDQ, HN)
    q_inv = _store_q_scaled(q_row, qmask, qn, qr.index(0), NC, ROPE_DTYPE, LDQ, MCOL, HN)

    start, end = _list_range(tkl_ptr, b, K, pid_s, chunk, HAS_TKL)

    m_i = gl.full([HN], NEG, gl.float32, layout=MCOL)
    l_i = gl.zeros([HN], gl.float32, layout=MCOL)
    ub_i = pid_h * 0 + 1
    zero = gl.zeros([64, HN], gl.float32, layout=MMA)
    o0, o1, o2, o3, o4, o5, o6, o7 = zero, zero, zero, zero, zero, zero, zero, zero

    idx_row = idx_ptr + b.to(gl.int64) * si_b + n * si_n
    bt_row = bt_ptr + b.to(gl.int64) * sbt_b
    ar = gl.arange(0, 64, layout=ROW)
    i2, pg, of, ok, pg_nx, of_nx, ok_nx = _pipeline_start(
        idx_row, bt_row, start, end, ar, num_slots, num_pages, max_pages, page_size, HAS_BT)
    r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2, c3 = _issue_rows(
        kv_ptr, kv16_ptr, kv32_ptr, pg, of, ok, page_size, page_bytes, KV_FORMAT, NC, LD, LD16)
    ub = _block_unit(c0, c1, c2, c3, ok, ub_i, KV_FORMAT)
    _convert_store(x0.index(0), x1.index(0), x2.index(0), x3.index(0), x4.index(0), x5.index(0),
                   x6.index(0), x7.index(0), xr.index(0), r0, r1, r2, r3, r4, r5, r6, r7, rr,
                   c0, c1, c2, c3, ub, zs, KV_FORMAT, NC, ROPE_DTYPE, ROW)

    for k0 in range(start, end, 64):
        # this block's X and (NBUF 2) the other buffer, which the next block is stored into
        # 0, but not provably so: the wgmma descriptors of X and q are then built in the loop
        # instead of hoisted as ~70 loop-invariant 64-bit values (spilled at 255 registers)
        oz = (k0 >> 31) & 1
        if NBUF == 2:
            buf = ((k0 - start) // 64) % 2
        else:
            buf = oz
        nxt = (buf + 1) % NBUF
        y0, y1, y2, y3, y4, y5, y6, y7, yr = _views(x0, x1, x2, x3, x4, x5, x6, x7, xr, buf)
        # X holds this block (in units 2^(ub - 127)). Issue the next block's rows (slots resolved
        # last iteration), its successor's page entries and the indices after that: all in
        # flight during this block's dots, consumed at the end of the iteration.
        ok_cur = ok
        ok = ok_nx
        r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2, c3 = _issue_rows(
            kv_ptr, kv16_ptr, kv32_ptr, pg_nx, of_nx, ok, page_size, page_bytes, KV_FORMAT, NC,
            LD, LD16)
        in2, e2, i3 = _pipeline_ahead(idx_row, bt_row, i2, k0, end, ar, max_pages, page_size,
                                      HAS_BT)

        s, r = _scores_t(qn, qr, y0, y1, y2, y3, y4, y5, y6, y7, yr, oz, NC, HN, MMA)
        okr = gl.convert_layout(ok_cur, MROW)
        p, alpha, an, m_i, l_i = _softmax_t(s, r, okr, q_inv, ub, ub_i, m_i, l_i, qk_scale_log2)
        ub_i = ub
        o0, o1, o2, o3, o4, o5, o6, o7 = _values_t(
            o0, o1, o2, o3, o4, o5, o6, o7, p, alpha, an, y0, y1, y2, y3, y4, y5, y6, y7, yr,
            pt, pth, ptl, ROPE_IN_V, R_SPLIT, ROPE_DTYPE)
        ub = _block_unit(c0, c1, c2, c3, ok, ub_i, KV_FORMAT)
        if NBUF == 2:       # stored into the other buffer while the value dots run
            _convert_store(x0.index(nxt), x1.index(nxt), x2.index(nxt), x3.index(nxt),
                           x4.index(nxt), x5.index(nxt), x6.index(nxt), x7.index(nxt),
                           xr.index(nxt), r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2, c3,
                           ub, zs, KV_FORMAT, NC, ROPE_DTYPE, ROW)
        o0, o1, o2, o3, o4, o5, o6, o7 = warpgroup_mma_wait(
            num_outstanding=0, deps=(o0, o1, o2, o3, o4, o5, o6, o7))
        if NBUF == 1:       # (its first barrier: every warp is done with X and P^T)
            _convert_store(y0, y1, y2, y3, y4, y5, y6, y7, yr, r0, r1, r2, r3, r4, r5, r6, r7,
                           rr, c0, c1, c2, c3, ub, zs, KV_FORMAT, NC, ROPE_DTYPE, ROW)
        else:               # every warpgroup's value dots are done before P^T is rewritten
            _barrier()
        pg_nx, of_nx, ok_nx = _resolve(i2, e2, in2, num_slots, num_pages, max_pages, page_size,
                                       HAS_BT)
        i2 = i3

    # ---- epilogue: gluon.py's, on the chunks turned heads-first
    _epilogue_t(o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, ub_i, pid_h, pid_s, pid_bn, H, nbn,
                sink_ptr, lse_ptr, pl_ptr, po_ptr, out_ptr, FINAL, HAS_SINK, ROPE_IN_V, OUT, HN)
