"""Sparse MLA decode for sm_90 in Gluon, warp-specialised: a producer warpgroup gathers and
dequantizes, two consumer warpgroups run the wgmma dots and the softmax.

Semantics, numerics, arguments and outputs are those of ``kernels.sparse_mla.gluon`` (the same
kernel signature, so the launcher, the split count and the Triton combine are shared): fp8
caches (``fp8_ds_mla``, ``fp8_model1``), 16-bit q, fp16 nope dots over row blocks dequantized
into the program's running power-of-two unit (the same unit sequence: the largest valid scale
exponent of each block minus 6, never decreasing), q nope scaled per head by a power of two into
fp16, the rope dot in the rope's dtype, fp16 p; split-K partials (normalised fp32 out,
log2-domain LSE) or, with one split, the final output (times the sink factor).

* **Work.** One program: 64 heads of one (request, draft) over one split of its top-k list, as
  ``gluon.py``; grid ``(head_blocks, splits, B * N)``. 12 warps in two partitions
  (``gl.warp_specialize``): the *consumer* (the default partition, 8 warps = 2 warpgroups) and
  the *producer* (one worker partition, 4 warps).
* **Producer.** Per 64-row block: resolves the slots (indices two blocks ahead, page entries one
  block ahead, as the Triton kernel's three-deep chain), loads the scale words, computes the
  block's unit, gathers the e4m3 chunks and the rope (16-byte vectors, masked: an invalid entry is
  never dereferenced), converts them into fp16 (rope: its dtype) and stores them into one X slot
  of a ``NBUF``-deep ring, with the per-row validity and the unit beside it; then
  ``fence_async_shared`` + a partition barrier + ``mbarrier.arrive(full[slot])``. It waits on
  ``empty[slot]`` before overwriting a slot. Register budget: ``PRODUCER_REGS`` (setmaxnreg).
* **Consumer.** Loads q once into shared memory (fp16 nope chunks scaled per head, the rope chunk
  in its dtype), then per block: ``mbarrier.wait(full[slot])``, ``S = q . X^T`` by wgmma from
  shared memory with ``warps_per_cta = [4, 2]`` (each warpgroup the scores of 32 of the 64 rows:
  no repeated tensor work), the online softmax in the log2 domain, ``O += P . X`` per 64-dim
  value chunk (P fp16 as a register operand, X from shared memory; each warpgroup holds 32 of
  every chunk's 64 columns: 64 x 512 fp32 / 256 threads = 128 accumulator registers a thread),
  then ``mbarrier.arrive(empty[slot])`` once the value dots have completed. It gets the registers
  the producer gives up (``AllocateWarpGroups``: 168 a thread for 12 warps, the default partition
  ``168 + (168 - PRODUCER_REGS) / 2``, rounded down to 8).
* **Shared memory.** q 73,728 B (D_qk 576) + NBUF x 73,728 B X slots + NBUF x 512 B of row
  validity / unit words + the barriers: 221,184 + 1,024 + 32 B for NBUF 2 (fp8_ds_mla).
* **Masking.** As ``gluon.py`` / the Triton kernel: entries negative, beyond the cache or the
  table, with a negative page entry, or past ``topk_length`` are masked in every load (masked
  rows read scale 0) and excluded from the softmax (score -> -1e30 finite start, p = 0).

Only sm_90 (wgmma, setmaxnreg): the launcher (``kernels/sparse_mla/triton_launch.py``) runs it
for a config whose ``kernel`` is ``"gluon_ws"``; ``configs.gluon_ws_eligible`` says where (never
sm_120 / sm_100, never the CPU interpreter: Gluon kernels do not interpret); elsewhere the
binding substitutes the Triton 64-head tile.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma, warpgroup_mma_wait)

from kernels.sparse_mla.gluon import (NEG, _block_unit, _load_rope, _load_scales, _load_u8,
                                      _pv, _resolve, _row_base, _store_out, _tile)
from kernels.sparse_mla.triton import _exp_field, _page_entries, _pow2

# CTA-wide (in a partition: partition-wide) barrier: ``gl.thread_barrier`` in Triton 3.6,
# ``gl.barrier`` later
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

NUM_WARPS = 8           # the consumer (default partition): two warpgroups
PRODUCER_WARPS = gl.constexpr(4)  # the producer: one warpgroup (12 warps in all)
PRODUCER_REGS = 72      # the producer's setmaxnreg budget (the consumer gets 216)
EMPTY_ARRIVALS = 1      # consumer threads arriving on an ``empty`` barrier (see the kernel)


@gluon.jit
def _ws_indices(idx_row, k, end, ar):
    """One half block's top-k entries (``-1`` past the split) and its in-list mask."""
    inl = k + ar < end
    return gl.load(idx_row + k + ar, mask=inl, other=-1), inl


@gluon.jit
def _ws_store_half(x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, buf, h: gl.constexpr,
                   kv_ptr, kv16_ptr, pg, of, ok, c0, c1, c2, c3, ub, shift, page_bytes,
                   KV_FORMAT: gl.constexpr, NC: gl.constexpr, ROPE_DTYPE: gl.constexpr,
                   LD: gl.constexpr, LD16: gl.constexpr):
    """Gather, dequantize and store rows ``[32 h, 32 h + 32)`` of one X slot: each chunk loaded,
    converted into the unit and stored in turn (ptxas overlaps the next chunks' loads as far as
    the register budget allows), then the rope chunk, the validity and the unit words."""
    base = _row_base(pg, of, page_bytes, KV_FORMAT)
    r0: gl.constexpr = h * 32
    x0.index(buf).slice(r0, 32).store(_tile(_load_u8(kv_ptr, base, ok, 0, LD), c0, c1, c2, c3, shift, 0, KV_FORMAT))
    x1.index(buf).slice(r0, 32).store(_tile(_load_u8(kv_ptr, base, ok, 1, LD), c0, c1, c2, c3, shift, 1, KV_FORMAT))
    x2.index(buf).slice(r0, 32).store(_tile(_load_u8(kv_ptr, base, ok, 2, LD), c0, c1, c2, c3, shift, 2, KV_FORMAT))
    x3.index(buf).slice(r0, 32).store(_tile(_load_u8(kv_ptr, base, ok, 3, LD), c0, c1, c2, c3, shift, 3, KV_FORMAT))
    x4.index(buf).slice(r0, 32).store(_tile(_load_u8(kv_ptr, base, ok, 4, LD), c0, c1, c2, c3, shift, 4, KV_FORMAT))
    x5.index(buf).slice(r0, 32).store(_tile(_load_u8(kv_ptr, base, ok, 5, LD), c0, c1, c2, c3, shift, 5, KV_FORMAT))
    x6.index(buf).slice(r0, 32).store(_tile(_load_u8(kv_ptr, base, ok, 6, LD), c0, c1, c2, c3, shift, 6, KV_FORMAT))
    if NC == 8:
        x7.index(buf).slice(r0, 32).store(_tile(_load_u8(kv_ptr, base, ok, 7, LD), c0, c1, c2, c3, shift, 7, KV_FORMAT))
    rr = _load_rope(kv16_ptr, base, ok, KV_FORMAT, LD16)
    xr.index(buf).slice(r0, 32).store(rr.to(gl.bfloat16, bitcast=True).to(ROPE_DTYPE))
    ok_s.index(buf).slice(r0, 32).store(ok.to(gl.int32))
    ub_s.index(buf).slice(r0, 32).store(gl.full([32], 0, gl.int32, layout=gl.SliceLayout(1, LD)) + ub)


@gluon.jit
def _ws_producer(kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                 x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                 si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size, page_bytes,
                 chunk, KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
                 ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr):
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    # a [32 rows, 64 B] half chunk over 4 warps: one 16-byte vector a thread
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    LD16: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, LD)

    pid_s = gl.program_id(1)
    pid_bn = gl.program_id(2)
    b = pid_bn // N
    n = pid_bn % N
    k_len = K
    if HAS_TKL:
        k_len = gl.maximum(gl.minimum(gl.load(tkl_ptr + b), K), 0)
    start = pid_s * chunk
    end = gl.minimum(start + chunk, k_len)

    # the three-deep chain per half block (a = rows 0..31, b = rows 32..63): slots of this
    # block, page entries of the next, indices of the one after
    idx_row = idx_ptr + b.to(gl.int64) * si_b + n * si_n
    bt_row = bt_ptr + b.to(gl.int64) * sbt_b
    ar = gl.arange(0, 32, layout=ROW)
    ia, ina = _ws_indices(idx_row, start, end, ar)
    ib, inb = _ws_indices(idx_row, start + 32, end, ar)
    pga, ofa, oka = _resolve(ia, _page_entries(bt_row, ia, ina, max_pages, page_size, HAS_BT),
                             ina, num_slots, num_pages, max_pages, page_size, HAS_BT)
    pgb, ofb, okb = _resolve(ib, _page_entries(bt_row, ib, inb, max_pages, page_size, HAS_BT),
                             inb, num_slots, num_pages, max_pages, page_size, HAS_BT)
    ia, ina = _ws_indices(idx_row, start + 64, end, ar)
    ib, inb = _ws_indices(idx_row, start + 96, end, ar)
    ea = _page_entries(bt_row, ia, ina, max_pages, page_size, HAS_BT)
    eb = _page_entries(bt_row, ib, inb, max_pages, page_size, HAS_BT)
    ub_i = pid_s * 0 + 1

    for k0 in range(start, end, 64):
        j = (k0 - start) // 64
        buf = j % NBUF
        phase = (j // NBUF) & 1
        # this block's scale words (both halves) and unit, the indices two blocks ahead
        ba = _row_base(pga, ofa, page_bytes, KV_FORMAT)
        bb = _row_base(pgb, ofb, page_bytes, KV_FORMAT)
        a0, a1, a2, a3 = _load_scales(kv32_ptr, pga, ofa, ba, oka, page_size, page_bytes,
                                      KV_FORMAT)
        b0, b1, b2, b3 = _load_scales(kv32_ptr, pgb, ofb, bb, okb, page_size, page_bytes,
                                      KV_FORMAT)
        ia2, ina2 = _ws_indices(idx_row, k0 + 128, end, ar)
        ib2, inb2 = _ws_indices(idx_row, k0 + 160, end, ar)
        ub = gl.maximum(_block_unit(a0, a1, a2, a3, oka, ub_i, KV_FORMAT),
                        _block_unit(b0, b1, b2, b3, okb, ub_i, KV_FORMAT))
        shift = _pow2(254 - ub)

        mbarrier.wait(empty.index(buf), phase ^ 1)       # the consumer is done with this slot
        _ws_store_half(x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, buf, 0, kv_ptr, kv16_ptr,
                       pga, ofa, oka, a0, a1, a2, a3, ub, shift, page_bytes, KV_FORMAT, NC,
                       ROPE_DTYPE, LD, LD16)
        _ws_store_half(x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, buf, 1, kv_ptr, kv16_ptr,
                       pgb, ofb, okb, b0, b1, b2, b3, ub, shift, page_bytes, KV_FORMAT, NC,
                       ROPE_DTYPE, LD, LD16)
        fence_async_shared()                  # generic-proxy stores -> wgmma (async proxy)
        _barrier()                            # every producer thread has stored
        mbarrier.arrive(full.index(buf))
        ub_i = ub
        pga, ofa, oka = _resolve(ia, ea, ina, num_slots, num_pages, max_pages, page_size, HAS_BT)
        pgb, ofb, okb = _resolve(ib, eb, inb, num_slots, num_pages, max_pages, page_size, HAS_BT)
        ea = _page_entries(bt_row, ia2, ina2, max_pages, page_size, HAS_BT)
        eb = _page_entries(bt_row, ib2, inb2, max_pages, page_size, HAS_BT)
        ia = ia2
        ina = ina2
        ib = ib2
        inb = inb2


@gluon.jit
def _ws_consumer(q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                 qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                 sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                 KV_FORMAT: gl.constexpr, HAS_TKL: gl.constexpr, HAS_SINK: gl.constexpr,
                 FINAL: gl.constexpr, ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr,
                 EMPTY_ARRIVALS: gl.constexpr):
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    ROPE_IN_V: gl.constexpr = KV_FORMAT == 2
    R_SPLIT: gl.constexpr = ROPE_DTYPE == gl.bfloat16
    LDQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 32, 16])
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    MROW: gl.constexpr = gl.SliceLayout(1, MMA)
    MCOL: gl.constexpr = gl.SliceLayout(0, MMA)

    pid_h = gl.program_id(0)
    pid_s = gl.program_id(1)
    pid_bn = gl.program_id(2)
    nbn = gl.num_programs(2)
    b = pid_bn // N
    n = pid_bn % N

    # ---- q (as gluon.py): per head 2^t putting max|q_nope| in [2^14, 2^15), fp16 chunks
    hq = pid_h * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, LDQ))
    dq = gl.arange(0, 64, layout=gl.SliceLayout(0, LDQ))
    qmask = (hq < H)[:, None] & (dq[None, :] >= 0)
    q_row = q_ptr + b.to(gl.int64) * sq_b + n * sq_n + hq[:, None] * sq_h + dq[None, :]
    am = gl.zeros([64], gl.float32, layout=gl.SliceLayout(1, LDQ))
    for c in gl.static_range(NC):
        f = gl.load(q_row + c * 64, mask=qmask, other=0.0).to(gl.float32)
        am = gl.maximum(am, gl.max(gl.abs(f), axis=1))
    am = gl.where(am != am, float("inf"), am)
    qb = gl.minimum(gl.maximum(268 - _exp_field(am), 1), 253)
    q_sc = _pow2(qb)
    for c in gl.static_range(NC):
        f = gl.load(q_row + c * 64, mask=qmask, other=0.0).to(gl.float32)
        qn.index(c).store((f * q_sc[:, None]).to(gl.float16))
    qr.store(gl.load(q_row + NC * 64, mask=qmask, other=0.0).to(ROPE_DTYPE))
    q_inv = gl.convert_layout(_pow2(254 - qb), MROW)
    fence_async_shared()
    _barrier()

    k_len = K
    if HAS_TKL:
        k_len = gl.maximum(gl.minimum(gl.load(tkl_ptr + b), K), 0)
    start = pid_s * chunk
    end = gl.minimum(start + chunk, k_len)

    m_i = gl.full([64], NEG, gl.float32, layout=MROW)
    l_i = gl.zeros([64], gl.float32, layout=MROW)
    ub_i = gl.full([64], 1, gl.int32, layout=MROW)
    zero = gl.zeros([64, 64], gl.float32, layout=MMA)
    o0 = zero
    o1 = zero
    o2 = zero
    o3 = zero
    o4 = zero
    o5 = zero
    o6 = zero
    o7 = zero

    for k0 in range(start, end, 64):
        j = (k0 - start) // 64
        buf = j % NBUF
        phase = (j // NBUF) & 1
        mbarrier.wait(full.index(buf), phase)            # the producer has filled this slot
        y0 = x0.index(buf)
        y1 = x1.index(buf)
        y2 = x2.index(buf)
        y3 = x3.index(buf)
        y4 = x4.index(buf)
        y5 = x5.index(buf)
        y6 = x6.index(buf)
        y7 = x7.index(buf)
        yr = xr.index(buf)
        s0 = gl.zeros([64, 64], gl.float32, layout=MMA)
        s = warpgroup_mma(qn.index(0), y0.permute((1, 0)), s0, use_acc=False, is_async=True)
        s = warpgroup_mma(qn.index(1), y1.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(qn.index(2), y2.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(qn.index(3), y3.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(qn.index(4), y4.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(qn.index(5), y5.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(qn.index(6), y6.permute((1, 0)), s, is_async=True)
        if NC == 8:
            s = warpgroup_mma(qn.index(7), y7.permute((1, 0)), s, is_async=True)
        r = warpgroup_mma(qr, yr.permute((1, 0)), s0, use_acc=False, is_async=True)
        okc = ok_s.index(buf).load(MCOL) != 0        # read while the score dots run
        ub = ub_s.index(buf).load(MROW)
        s, r = warpgroup_mma_wait(num_outstanding=0, deps=(s, r))
        s = s * (q_inv * _pow2(ub))[:, None] + r
        s = gl.where(okc[None, :], s * qk_scale_log2, NEG)
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.where(okc[None, :], gl.exp2(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        an = alpha * _pow2(gl.maximum(ub_i - ub + 127, 1))
        ub_i = ub

        p16 = gl.convert_layout(p.to(gl.float16), P_OP)
        o0 = _pv(o0, an, p16, y0)
        o1 = _pv(o1, an, p16, y1)
        o2 = _pv(o2, an, p16, y2)
        o3 = _pv(o3, an, p16, y3)
        o4 = _pv(o4, an, p16, y4)
        o5 = _pv(o5, an, p16, y5)
        o6 = _pv(o6, an, p16, y6)
        if ROPE_IN_V:
            o7 = o7 * alpha[:, None]
            p_hi = p.to(ROPE_DTYPE)
            o7 = warpgroup_mma(gl.convert_layout(p_hi, P_OP), yr, o7, is_async=True)
            if R_SPLIT:
                p_lo = (p - p_hi.to(gl.float32)).to(ROPE_DTYPE)
                o7 = warpgroup_mma(gl.convert_layout(p_lo, P_OP), yr, o7, is_async=True)
        else:
            o7 = _pv(o7, an, p16, y7)
        o0, o1, o2, o3, o4, o5, o6, o7 = warpgroup_mma_wait(
            num_outstanding=0, deps=(o0, o1, o2, o3, o4, o5, o6, o7))
        if EMPTY_ARRIVALS == 1:
            _barrier()          # one arriving thread: both warpgroups' dots have completed
        mbarrier.arrive(empty.index(buf))                # the slot may be refilled

    # ---- epilogue (as gluon.py)
    heads = pid_h * 64 + gl.arange(0, 64, layout=MROW)
    h_ok = heads < H
    has = l_i != 0.0
    l_safe = gl.where(has, l_i, 1.0)
    inv_l = 1.0 / l_safe
    inv_n = inv_l * _pow2(ub_i)
    lse2 = gl.where(has, m_i + gl.log2(l_safe), float("-inf"))
    sink_f = gl.full([64], 1.0, gl.float32, layout=MROW)
    if FINAL:
        lse = lse2 * 0.6931471805599453
        if HAS_SINK:
            sink = gl.load(sink_ptr + heads, mask=h_ok, other=0.0)
            sink_f = 1.0 / (1.0 + gl.exp(sink - lse))
        gl.store(lse_ptr + pid_bn.to(gl.int64) * H + heads, lse, mask=h_ok)
    else:
        gl.store(pl_ptr + (pid_s.to(gl.int64) * nbn + pid_bn) * H + heads, lse2, mask=h_ok)
    _store_out(o0, inv_n, has, sink_f, 0, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o1, inv_n, has, sink_f, 1, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o2, inv_n, has, sink_f, 2, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o3, inv_n, has, sink_f, 3, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o4, inv_n, has, sink_f, 4, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o5, inv_n, has, sink_f, 5, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o6, inv_n, has, sink_f, 6, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    if ROPE_IN_V:
        _store_out(o7, inv_l, has, sink_f, 7, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    else:
        _store_out(o7, inv_n, has, sink_f, 7, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)


@gluon.jit
def _sparse_mla_gluon_ws_kernel(
    q_ptr, kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr, sink_ptr,
    po_ptr, pl_ptr, out_ptr, lse_ptr,
    sq_b, sq_n, sq_h, si_b, si_n, sbt_b,
    N, H, K, num_slots, num_pages, max_pages, page_size, page_bytes, chunk, qk_scale_log2,
    KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
    HAS_SINK: gl.constexpr, FINAL: gl.constexpr, ROPE_DTYPE: gl.constexpr,
    NBUF: gl.constexpr = 2, PRODUCER_REGS: gl.constexpr = 72,
    EMPTY_ARRIVALS: gl.constexpr = 1,
):
    """Same arguments as ``gluon._sparse_mla_gluon_kernel`` (``NBUF``: X slots in the ring;
    ``PRODUCER_REGS``: the producer's register budget; ``EMPTY_ARRIVALS``: threads of the
    consumer that arrive on an ``empty`` barrier, 1 for Triton 3.6's thread-0 arrive)."""
    gl.static_assert((KV_FORMAT == 1) | (KV_FORMAT == 2), "fp8_ds_mla or fp8_model1 only")
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    META: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

    qn = gl.allocate_shared_memory(gl.float16, [NC, 64, 64], SH)
    qr = gl.allocate_shared_memory(ROPE_DTYPE, [64, 64], SH)
    x0 = gl.allocate_shared_memory(gl.float16, [NBUF, 64, 64], SH)
    x1 = gl.allocate_shared_memory(gl.float16, [NBUF, 64, 64], SH)
    x2 = gl.allocate_shared_memory(gl.float16, [NBUF, 64, 64], SH)
    x3 = gl.allocate_shared_memory(gl.float16, [NBUF, 64, 64], SH)
    x4 = gl.allocate_shared_memory(gl.float16, [NBUF, 64, 64], SH)
    x5 = gl.allocate_shared_memory(gl.float16, [NBUF, 64, 64], SH)
    x6 = gl.allocate_shared_memory(gl.float16, [NBUF, 64, 64], SH)
    x7 = gl.allocate_shared_memory(gl.float16, [NBUF, 64, 64], SH)
    xr = gl.allocate_shared_memory(ROPE_DTYPE, [NBUF, 64, 64], SH)
    ok_s = gl.allocate_shared_memory(gl.int32, [NBUF, 64], META)
    ub_s = gl.allocate_shared_memory(gl.int32, [NBUF, 64], META)
    full = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NBUF):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=EMPTY_ARRIVALS)

    gl.warp_specialize(
        [(_ws_consumer, (q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                         qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                         sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                         KV_FORMAT, HAS_TKL, HAS_SINK, FINAL, ROPE_DTYPE, NBUF, EMPTY_ARRIVALS)),
         (_ws_producer, (kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                         x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                         si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                         page_bytes, chunk, KV_FORMAT, HAS_BT, HAS_TKL, ROPE_DTYPE, NBUF))],
        [PRODUCER_WARPS], [PRODUCER_REGS])
