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
  ``gluon.py``; grid ``(head_blocks, splits, B * N)``. 16 warps in two partitions
  (``gl.warp_specialize``): the *consumer* (the default partition, 8 warps = 2 warpgroups) and
  the *producer* (one worker partition, 8 warps = 2 warpgroups; one 16-byte vector of each
  64-byte chunk a thread).
* **Producer.** Per 64-row block: resolves the slots (indices two blocks ahead, page entries one
  block ahead, as the Triton kernel's three-deep chain), issues every load of the block (the
  scale words, the 8 (7) e4m3 chunks and the rope: 16-byte vectors, masked, so an invalid entry
  is never dereferenced) *before* waiting on ``empty[slot]`` (the gather's latency overlaps the
  wait), computes the block's unit, converts the chunks into fp16 (rope: its dtype) and stores
  them into one X slot of a ``NBUF``-deep ring, with the per-row validity and the unit beside
  it; then ``fence_async_shared`` + a partition barrier + ``mbarrier.arrive(full[slot])``.
  Register budget: ``PRODUCER_REGS`` (setmaxnreg; 40 of them hold the raw block).
* **Consumer.** Loads q once into shared memory (fp16 nope chunks scaled per head, the rope chunk
  in its dtype), then per block: ``mbarrier.wait(full[slot])``, ``S = q . X^T`` by wgmma from
  shared memory with ``warps_per_cta = [4, 2]`` (each warpgroup the scores of 32 of the 64 rows:
  no repeated tensor work), the online softmax in the log2 domain, ``O += P . X`` per 64-dim
  value chunk (P fp16 as a register operand, X from shared memory; each warpgroup holds 32 of
  every chunk's 64 columns: 64 x 512 fp32 / 256 threads = 128 accumulator registers a thread),
  then ``mbarrier.arrive(empty[slot])`` once the value dots have completed. It gets the registers
  the producer gives up (Triton's ``AllocateWarpGroups``: 128 a thread for 16 warps, the default
  partition ``256 - PRODUCER_REGS``, rounded down to 8: 200 for the producer's 56).
* **Shared memory.** q 73,728 B (D_qk 576) + NBUF x 73,728 B X slots + NBUF x 512 B of row
  validity / unit words + the barriers + reduction scratch: 226,376 B for NBUF 2 (fp8_ds_mla;
  fp8_model1 201,800 B; AOT, Triton 3.6.0). 1 CTA per SM.
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

from kernels.sparse_mla.gluon import (NEG, _block_unit, _epilogue, _issue_scores, _issue_values,
                                      _load_rope, _load_scales, _load_u8, _online_softmax,
                                      _resolve, _row_base, _tile)
from kernels.sparse_mla.triton import _exp_field, _page_entries, _pow2

# CTA-wide (in a partition: partition-wide) barrier: ``gl.thread_barrier`` in Triton 3.6,
# ``gl.barrier`` later
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

NUM_WARPS = 8           # the consumer (default partition): two warpgroups
PRODUCER_WARPS = gl.constexpr(8)  # the producer: two warpgroups (16 warps in all)
PRODUCER_REGS = 56      # the producer's setmaxnreg budget (the consumer gets 200)
EMPTY_ARRIVALS = 1      # consumer threads arriving on an ``empty`` barrier (see the kernel)


@gluon.jit
def _ws_slot_store(xc, raw, c0, c1, c2, c3, shift, C: gl.constexpr, KV_FORMAT: gl.constexpr):
    xc.store(_tile(raw, c0, c1, c2, c3, shift, C, KV_FORMAT))


@gluon.jit
def _ws_producer(kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                 x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                 si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size, page_bytes,
                 chunk, KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
                 ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr):
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    # [64 rows, 64 B] per chunk over 8 warps: one 16-byte vector a thread
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    LD16: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])
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

    idx_row = idx_ptr + b.to(gl.int64) * si_b + n * si_n
    bt_row = bt_ptr + b.to(gl.int64) * sbt_b
    ar = gl.arange(0, 64, layout=ROW)
    in0 = start + ar < end
    i0 = gl.load(idx_row + start + ar, mask=in0, other=-1)
    in1 = start + 64 + ar < end
    i1 = gl.load(idx_row + start + 64 + ar, mask=in1, other=-1)
    pg, of, ok = _resolve(i0, _page_entries(bt_row, i0, in0, max_pages, page_size, HAS_BT), in0,
                          num_slots, num_pages, max_pages, page_size, HAS_BT)
    e1 = _page_entries(bt_row, i1, in1, max_pages, page_size, HAS_BT)
    ub_i = pid_s * 0 + 1

    for k0 in range(start, end, 64):
        j = (k0 - start) // 64
        buf = j % NBUF
        phase = (j // NBUF) & 1
        # this block's scales and rows (slots resolved last iteration), the next block's slots'
        # inputs one step further down the chain
        base = _row_base(pg, of, page_bytes, KV_FORMAT)
        c0, c1, c2, c3 = _load_scales(kv32_ptr, pg, of, base, ok, page_size, page_bytes,
                                      KV_FORMAT)
        in2 = k0 + 128 + ar < end
        i2 = gl.load(idx_row + k0 + 128 + ar, mask=in2, other=-1)
        r0 = _load_u8(kv_ptr, base, ok, 0, LD)
        r1 = _load_u8(kv_ptr, base, ok, 1, LD)
        r2 = _load_u8(kv_ptr, base, ok, 2, LD)
        r3 = _load_u8(kv_ptr, base, ok, 3, LD)
        r4 = _load_u8(kv_ptr, base, ok, 4, LD)
        r5 = _load_u8(kv_ptr, base, ok, 5, LD)
        r6 = _load_u8(kv_ptr, base, ok, 6, LD)
        if NC == 8:
            r7 = _load_u8(kv_ptr, base, ok, 7, LD)
        else:
            r7 = r6
        rr = _load_rope(kv16_ptr, base, ok, KV_FORMAT, LD16)
        ub = _block_unit(c0, c1, c2, c3, ok, ub_i, KV_FORMAT)
        shift = _pow2(254 - ub)

        mbarrier.wait(empty.index(buf), phase ^ 1)       # the consumer is done with this slot
        _ws_slot_store(x0.index(buf), r0, c0, c1, c2, c3, shift, 0, KV_FORMAT)
        _ws_slot_store(x1.index(buf), r1, c0, c1, c2, c3, shift, 1, KV_FORMAT)
        _ws_slot_store(x2.index(buf), r2, c0, c1, c2, c3, shift, 2, KV_FORMAT)
        _ws_slot_store(x3.index(buf), r3, c0, c1, c2, c3, shift, 3, KV_FORMAT)
        _ws_slot_store(x4.index(buf), r4, c0, c1, c2, c3, shift, 4, KV_FORMAT)
        _ws_slot_store(x5.index(buf), r5, c0, c1, c2, c3, shift, 5, KV_FORMAT)
        _ws_slot_store(x6.index(buf), r6, c0, c1, c2, c3, shift, 6, KV_FORMAT)
        if NC == 8:
            _ws_slot_store(x7.index(buf), r7, c0, c1, c2, c3, shift, 7, KV_FORMAT)
        xr.index(buf).store(rr.to(gl.bfloat16, bitcast=True).to(ROPE_DTYPE))
        ok_s.index(buf).store(ok.to(gl.int32))
        ub_s.index(buf).store(gl.full([64], 0, gl.int32, layout=ROW) + ub)
        fence_async_shared()                  # generic-proxy stores -> wgmma (async proxy)
        _barrier()                            # every producer thread has stored
        mbarrier.arrive(full.index(buf))
        ub_i = ub
        pg, of, ok = _resolve(i1, e1, in1, num_slots, num_pages, max_pages, page_size, HAS_BT)
        e1 = _page_entries(bt_row, i2, in2, max_pages, page_size, HAS_BT)
        i1 = i2
        in1 = in2


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
        s, r = _issue_scores(qn, qr, y0, y1, y2, y3, y4, y5, y6, y7, yr, NC, MMA)
        okc = ok_s.index(buf).load(MCOL) != 0        # read while the score dots run
        ub = ub_s.index(buf).load(MROW)
        s, r = warpgroup_mma_wait(num_outstanding=0, deps=(s, r))
        p, alpha, an, m_i, l_i = _online_softmax(s, r, okc, q_inv, ub, ub_i, m_i, l_i, qk_scale_log2)
        ub_i = ub

        o0, o1, o2, o3, o4, o5, o6, o7 = _issue_values(
            o0, o1, o2, o3, o4, o5, o6, o7, p, alpha, an, y0, y1, y2, y3, y4, y5, y6, y7, yr,
            ROPE_IN_V, R_SPLIT, ROPE_DTYPE, P_OP)
        o0, o1, o2, o3, o4, o5, o6, o7 = warpgroup_mma_wait(
            num_outstanding=0, deps=(o0, o1, o2, o3, o4, o5, o6, o7))
        if EMPTY_ARRIVALS == 1:
            _barrier()          # one arriving thread: both warpgroups' dots have completed
        mbarrier.arrive(empty.index(buf))                # the slot may be refilled

    # ---- epilogue (as gluon.py)
    _epilogue(o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, ub_i, pid_h, pid_s, pid_bn, H, nbn,
              sink_ptr, lse_ptr, pl_ptr, po_ptr, out_ptr, FINAL, HAS_SINK, ROPE_IN_V, MMA)


@gluon.jit
def _sparse_mla_gluon_ws_kernel(
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
    NBUF: gl.constexpr = 2, PRODUCER_REGS: gl.constexpr = 56,
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
