"""Sparse MLA decode for sm_90 in Gluon, warp-specialised: a producer warpgroup gathers (and, for
the fp8 caches, dequantizes), two consumer warpgroups run the wgmma dots and the softmax.

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

**Latent caches** (``KV_FORMAT`` 0: 16-bit rows of 576, q of the cache's dtype; issue 16). The
numerics are the Triton kernel's latent path (docs/SEMANTICS.md ``latent``): q as it is (no
per-head scaling: 16-bit products are exact in the fp32 accumulator), the nine 64-dim score dots
(eight nope chunks and the rope chunk) into one accumulator, the same online softmax without
units, and per value chunk ``p_hi = bf16(p)`` and ``p_lo = bf16(p - p_hi)`` (two wgmmas; fp16:
one, fp16 p keeps 11 bits). There is nothing to convert, so

* the **producer** is one warpgroup (``LATENT_PRODUCER_WARPS``, budget
  ``LATENT_PRODUCER_REGS``: it holds addresses, never the tile) that resolves the slots as
  above, waits on ``empty[slot]`` and copies the block's rows global -> shared with ``cp.async``
  (16 bytes a thread, 36 a thread a block) straight into the swizzled X slot; masked rows copy
  nothing (their source is never read) and are zero-filled. The slot is signalled full by the
  copies themselves (``cp.async.mbarrier.arrive.noinc``, :data:`LATENT_SIGNAL` 0) or after
  ``cp.async.wait_group`` (1); the kernel's comment states the memory-ordering argument of both.
  One block is in flight while the consumer works on the other slot.
* the **consumer** (8 warps, 232 registers, no spill) loads q once into shared memory (9 x
  [64, 64]), then per block: wait, 36 score wgmmas, softmax, P into the value dots' register
  layout (:data:`LATENT_P_SMEM`: through an 8 KB tile and the slot's dead rope chunk, one
  barrier), 64 value wgmmas (bf16), release.
* **shared memory**: q 73,728 B + 2 x 73,728 B slots + 8,192 B p_hi tile + 512 B of row words +
  barriers + reduction scratch: 230,436 B of the H200's 232,448 (AOT, Triton 3.6.0; 225,828 B
  with ``LATENT_P_SMEM`` 0).

Only sm_90 (wgmma, setmaxnreg): the launcher (``kernels/sparse_mla/triton_launch.py``) runs it
for a config whose ``kernel`` is ``"gluon_ws"``; ``configs.gluon_ws_eligible`` says where (never
sm_120 / sm_100, never the CPU interpreter: Gluon kernels do not interpret; a latent cache also
needs rows the producer can copy in place, ``configs.gluon_ws_latent_layout_ok``); elsewhere the
binding substitutes the Triton 64-head tile.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma, warpgroup_mma_wait)

from kernels.sparse_mla.gluon import (NEG, _alloc_x, _block_unit, _epilogue, _issue_scores,
                                      _issue_values, _l2_prefetch_rows, _list_range, _load_rope,
                                      _load_scales, _load_u8, _online_softmax, _program, _q_rows,
                                      _resolve, _row_base, _store_q_scaled, _tile)
from kernels.sparse_mla.gluon_cluster import _cluster_sync, _lanes, _meta_word, _peer_arrive
from kernels.sparse_mla.triton import _page_entries, _pow2

# CTA-wide (in a partition: partition-wide) barrier: ``gl.thread_barrier`` in Triton 3.6,
# ``gl.barrier`` later
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
# global -> shared cp.async: ``async_copy_global_to_shared`` in Triton 3.6 (the H200 image),
# ``async_load`` later (3.9 keeps the old name only to raise)
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

NUM_WARPS = 8           # the consumer (default partition): two warpgroups
PRODUCER_WARPS = gl.constexpr(8)  # the producer: two warpgroups (16 warps in all)
PRODUCER_REGS = 56      # the producer's setmaxnreg budget (the consumer gets 200)
EMPTY_ARRIVALS = 1      # consumer threads arriving on an ``empty`` barrier (see the kernel)
# latent (KV_FORMAT 0): the producer issues async copies only (no tile in its registers), so
# one warpgroup with a small budget; the 8 consumer warps get the rest (see the module docstring)
LATENT_PRODUCER_WARPS = gl.constexpr(4)
LATENT_PRODUCER_REGS = 40
# how the latent producer tells the consumer a slot is full (constexpr ``SIGNAL``; read at each
# launch, so bench.gluon_check can time both): 0 = every producer thread's
# ``cp.async.mbarrier.arrive.noinc`` (the barrier completes when the copies land) plus one
# release arrive for the row-validity words; 1 = ``cp.async.wait_group 0`` + fence + partition
# barrier + one arrive (the protocol of the fp8 producer, proven on the H200). Measured on the
# H200 (bench/results/gluon_check_latent_h200_20261205.json, 75/75 reference checks each): the
# pair (1, P_SMEM 0) 126.8 us at V3.2 B 64 H 128, 258.3 at B 128, the pair (0, P_SMEM 1) 128.6
# and 263.3, equal within 2 % elsewhere; the default is the first (the proven protocol, and no
# write into a slot the other warpgroup reads)
LATENT_SIGNAL = 1
# how the latent consumer brings P (each warpgroup computed the scores of 32 of the 64 rows) into
# the value dots' register layout (constexpr ``P_SMEM``, read at each launch): 1 = stmatrix into
# shared memory (p_hi an 8 KB tile of its own, p_lo the slot's rope chunk, dead by then), one
# barrier, ldmatrix; 0 = ``gl.convert_layout`` through the compiler's 4 KB scratch (two rounds a
# part, 8 barriers a block; what the fp8 consumer does)
LATENT_P_SMEM = 0
# the fp8 producer hints the next row block's gathered rows into L2 once this block's loads are
# issued (constexpr ``L2_PREFETCH``, read at each launch; ``gluon._l2_prefetch_rows``): the
# next block's gathers then wait on L2 rather than DRAM. Measured on an H100 (2026-12-06,
# bench/results/gluon_check_pf_h100_20261206.json, one call, against 0): fp8_ds_mla B 64 H 64
# 91.0 us / 95.8, B 16 H 128 50.3 / 51.4, B 1 16.2 / 16.0; slower at B 64 H 128 (146.0 / 142.9)
# and B 128 (287.1 / 280.6), which gluon_xs runs now, and fp8_model1 B 64 H 64 (56.2 / 55.1),
# which the Gluon kernel runs (bench/NOTES.md, sixteenth session). A second form, the hint from
# a three-deep slot chain so it never waits on the block-table entry loaded at the end of the
# previous block (mode 2), measured the same in the bench's rows (H100, 2026-12-06,
# bench/results/mla_sweep_l2hint_h100_20261206.json: B 64 H 64 92.7 / 92.6 us, B 1 17.7 / 17.7)
# and was removed (seventeenth session)
L2_PREFETCH = 1


def launch_constexprs(kv_format: str) -> dict:
    """The constexprs of ``_sparse_mla_gluon_ws_kernel`` beyond the shared Gluon ones for a
    cache of ``kv_format``, as the launcher and the AOT specs pass them: the producer's register
    budget, the consumer's ``empty`` arrivals, the latent full-slot signal
    (:data:`LATENT_SIGNAL`) and P exchange (:data:`LATENT_P_SMEM`); 0 for the fp8 formats,
    which read neither; the fp8 producer's L2 hint (:data:`L2_PREFETCH`; 0 for latent)."""
    if kv_format == "latent":
        return dict(PRODUCER_REGS=LATENT_PRODUCER_REGS, EMPTY_ARRIVALS=EMPTY_ARRIVALS,
                    SIGNAL=LATENT_SIGNAL, P_SMEM=LATENT_P_SMEM, L2_PREFETCH=0)
    return dict(PRODUCER_REGS=PRODUCER_REGS, EMPTY_ARRIVALS=EMPTY_ARRIVALS, SIGNAL=0, P_SMEM=0,
                L2_PREFETCH=L2_PREFETCH)


@gluon.jit
def _producer_list(idx_ptr, bt_ptr, tkl_ptr, N, K, si_b, si_n, sbt_b, chunk,
                   HAS_TKL: gl.constexpr):
    """A producer partition's share of the top-k list: ``(start, end, idx_row, bt_row)``, its
    split's ``[start, end)`` (``gluon._list_range``) and the pointers to its (request, draft)
    row of indices and its request's block-table row (grid ``(head_blocks, splits, B * N)``)."""
    pid_s = gl.program_id(1)
    pid_bn = gl.program_id(2)
    b = pid_bn // N
    n = pid_bn % N
    start, end = _list_range(tkl_ptr, b, K, pid_s, chunk, HAS_TKL)
    return (start, end, idx_ptr + b.to(gl.int64) * si_b + n * si_n,
            bt_ptr + b.to(gl.int64) * sbt_b)


@gluon.jit
def _alloc_fp8_ring(KV_FORMAT: gl.constexpr, ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr):
    """The fp8 kernels' shared memory, in this order (the allocator's offsets follow it): q's
    NC fp16 nope chunks and its rope chunk, the ``NBUF`` X slots (``gluon._alloc_x``), the
    per-slot row validity and unit words, the ``full`` and ``empty`` barriers."""
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    META: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    qn = gl.allocate_shared_memory(gl.float16, [NC, 64, 64], SH)
    qr = gl.allocate_shared_memory(ROPE_DTYPE, [64, 64], SH)
    x0, x1, x2, x3, x4, x5, x6, x7, xr = _alloc_x(gl.float16, ROPE_DTYPE, NBUF, SH)
    ok_s = gl.allocate_shared_memory(gl.int32, [NBUF, 64], META)
    ub_s = gl.allocate_shared_memory(gl.int32, [NBUF, 64], META)
    full = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    return qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty


@gluon.jit
def _ws_slot_store(xc, raw, c0, c1, c2, c3, shift, C: gl.constexpr, KV_FORMAT: gl.constexpr):
    xc.store(_tile(raw, c0, c1, c2, c3, shift, C, KV_FORMAT))


@gluon.jit
def _ws_fill(x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty, buf, phase,
             r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2, c3, ok, ub, KV_FORMAT: gl.constexpr,
             ROPE_DTYPE: gl.constexpr, ROW: gl.constexpr):
    """A producer's hand-over of one converted row block (the fp8 producers): wait until the
    consumer is done with X slot ``buf`` (``empty``, ``phase``), the nope chunks dequantized into
    the unit ``2^(ub - 127)`` and the rope bits in ``ROPE_DTYPE`` stored into it, the row
    validity ``ok`` and the unit beside it (``ROW`` layout), ``fence_async_shared`` (the generic
    proxy's stores before the consumers' wgmma), a partition barrier (every producer thread has
    stored), ``mbarrier.arrive(full)``."""
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
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


@gluon.jit
def _ws_producer(kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                 x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                 si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size, page_bytes,
                 chunk, KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
                 ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr, L2_PREFETCH: gl.constexpr = 0):
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    # [64 rows, 64 B] per chunk over 8 warps: one 16-byte vector a thread
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    LD16: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, LD)

    start, end, idx_row, bt_row = _producer_list(idx_ptr, bt_ptr, tkl_ptr, N, K, si_b, si_n,
                                                 sbt_b, chunk, HAS_TKL)
    ar = gl.arange(0, 64, layout=ROW)
    in0 = start + ar < end
    i0 = gl.load(idx_row + start + ar, mask=in0, other=-1)
    in1 = start + 64 + ar < end
    i1 = gl.load(idx_row + start + 64 + ar, mask=in1, other=-1)
    pg, of, ok = _resolve(i0, _page_entries(bt_row, i0, in0, max_pages, page_size, HAS_BT),
                          in0, num_slots, num_pages, max_pages, page_size, HAS_BT)
    e1 = _page_entries(bt_row, i1, in1, max_pages, page_size, HAS_BT)
    ub_i = start * 0 + 1

    for k0 in range(start, end, 64):
        j = (k0 - start) // 64
        buf = j % NBUF
        phase = (j // NBUF) & 1
        # this block's scales and rows (slots resolved last iteration), the next block's slots'
        # inputs one step further down the chain
        if L2_PREFETCH == 1:              # the next block's slots now, for the hint (their
            pg_n, of_n, ok_n = _resolve(i1, e1, in1, num_slots, num_pages, max_pages,  # inputs
                                        page_size, HAS_BT)                             # die here)
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
        if L2_PREFETCH == 1:              # the next block's rows into L2 (:data:`L2_PREFETCH`)
            _l2_prefetch_rows(kv_ptr, pg_n, of_n, ok_n, page_size, page_bytes, KV_FORMAT, 64)
        ub = _block_unit(c0, c1, c2, c3, ok, ub_i, KV_FORMAT)
        _ws_fill(x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty, buf, phase,
                 r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2, c3, ok, ub, KV_FORMAT,
                 ROPE_DTYPE, ROW)
        ub_i = ub
        if L2_PREFETCH == 1:
            pg, of, ok = pg_n, of_n, ok_n
        else:
            pg, of, ok = _resolve(i1, e1, in1, num_slots, num_pages, max_pages, page_size,
                                  HAS_BT)
        e1 = _page_entries(bt_row, i2, in2, max_pages, page_size, HAS_BT)
        i1 = i2
        in1 = in2


@gluon.jit
def _ws_consumer(q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                 qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                 sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                 KV_FORMAT: gl.constexpr, HAS_TKL: gl.constexpr, HAS_SINK: gl.constexpr,
                 FINAL: gl.constexpr, ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr,
                 EMPTY_ARRIVALS: gl.constexpr, meta=None, CROSS: gl.constexpr = 0):
    """The consumer partition (see the module docstring). ``CROSS`` 1: one CTA of a crossover
    pair (``gluon_xo.py``): it joins the cluster barrier at its start and end, and releases each
    slot to the other CTA's producer too (``meta``: ``gluon_xo``'s shared words, the address of
    ``empty`` first), whose half of every block it reads."""
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    ROPE_IN_V: gl.constexpr = KV_FORMAT == 2
    R_SPLIT: gl.constexpr = ROPE_DTYPE == gl.bfloat16
    LDQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 32, 16])
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    MROW: gl.constexpr = gl.SliceLayout(1, MMA)
    MCOL: gl.constexpr = gl.SliceLayout(0, MMA)

    pid_h, pid_s, pid_bn, nbn, b, n = _program(N)
    if CROSS:
        _cluster_sync(True)     # both CTAs' barriers are initialised
        empty_addr = _meta_word(meta, 0)

    # ---- q (as gluon.py): per head 2^t putting max|q_nope| in [2^14, 2^15), fp16 chunks
    q_row, qmask = _q_rows(q_ptr, pid_h, b, n, H, sq_b, sq_n, sq_h, LDQ)
    q_inv = _store_q_scaled(q_row, qmask, qn, qr, NC, ROPE_DTYPE, LDQ, MROW)
    fence_async_shared()
    _barrier()

    start, end = _list_range(tkl_ptr, b, K, pid_s, chunk, HAS_TKL)

    m_i = gl.full([64], NEG, gl.float32, layout=MROW)
    l_i = gl.zeros([64], gl.float32, layout=MROW)
    ub_i = gl.full([64], 1, gl.int32, layout=MROW)
    zero = gl.zeros([64, 64], gl.float32, layout=MMA)
    o0, o1, o2, o3, o4, o5, o6, o7 = zero, zero, zero, zero, zero, zero, zero, zero

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
        if CROSS:               # ... by the other CTA's producer too (its half of the slot)
            _peer_arrive(empty_addr + 8 * buf, _lanes(gl.num_warps()))

    # ---- epilogue (as gluon.py)
    _epilogue(o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, ub_i, pid_h, pid_s, pid_bn, H, nbn,
              sink_ptr, lse_ptr, pl_ptr, po_ptr, out_ptr, FINAL, HAS_SINK, ROPE_IN_V, MMA)
    if CROSS:
        _cluster_sync()         # no peer arrives on this CTA's barriers after it exits


# ---------------------------------------------------------------------------- latent (KV_FORMAT 0)

@gluon.jit
def _latent_rows(pg, of, page_bytes):
    """Element offset (int64) of each row's first latent dim: ``page * page_bytes / 2 + off *
    576`` (16-bit latent, rows of 576 packed in a page, pages ``page_bytes`` apart). A multiple
    of 8 elements (16 bytes) because the launcher runs this kernel only on pages whose byte
    stride is a multiple of 16 from a 16-byte aligned base (``configs.gluon_ws_latent_layout_ok``):
    stated to the compiler, so every 64-dim chunk copies as 16-byte vectors."""
    return gl.multiple_of(pg.to(gl.int64) * (page_bytes // 2) + of * 576, 8)


@gluon.jit
def _ws_latent_producer(kv_ptr, idx_ptr, bt_ptr, tkl_ptr,
                        x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, full, empty,
                        si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                        page_bytes, chunk, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
                        NBUF: gl.constexpr, SIGNAL: gl.constexpr):
    """Latent producer (one warpgroup): per 64-row block, the slots (indices two blocks ahead,
    page entries one, as the fp8 producer), then ``mbarrier.wait(empty[slot])``, the nine
    64-dim chunks copied global -> shared (``cp.async``, 16 bytes a thread, straight into the
    swizzled X slot: no registers hold the tile), the row-validity words, and the full signal
    (``SIGNAL``, see the kernel's comment on the protocol). Invalid rows are masked in every
    copy: their source is never read and their 1,152 bytes of the slot are zero-filled."""
    PW: gl.constexpr = LATENT_PRODUCER_WARPS
    # [64 rows, 64 dims] 16-bit per chunk over PW warps: one 16-byte vector a thread, 64 / (4 PW)
    # rows a thread
    LDX: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, LDX)

    start, end, idx_row, bt_row = _producer_list(idx_ptr, bt_ptr, tkl_ptr, N, K, si_b, si_n,
                                                 sbt_b, chunk, HAS_TKL)
    ar = gl.arange(0, 64, layout=ROW)
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, LDX))
    in0 = start + ar < end
    i0 = gl.load(idx_row + start + ar, mask=in0, other=-1)
    in1 = start + 64 + ar < end
    i1 = gl.load(idx_row + start + 64 + ar, mask=in1, other=-1)
    pg, of, ok = _resolve(i0, _page_entries(bt_row, i0, in0, max_pages, page_size, HAS_BT), in0,
                          num_slots, num_pages, max_pages, page_size, HAS_BT)
    e1 = _page_entries(bt_row, i1, in1, max_pages, page_size, HAS_BT)

    for k0 in range(start, end, 64):
        j = (k0 - start) // 64
        buf = j % NBUF
        phase = (j // NBUF) & 1
        in2 = k0 + 128 + ar < end
        i2 = gl.load(idx_row + k0 + 128 + ar, mask=in2, other=-1)
        src = kv_ptr + _latent_rows(pg, of, page_bytes)[:, None] + d[None, :]
        m = ok[:, None] & (d[None, :] >= 0)          # constant along a row: 16-byte vectors
        mbarrier.wait(empty.index(buf), phase ^ 1)   # the consumer is done with this slot
        _async_load(x0.index(buf), src, mask=m)
        _async_load(x1.index(buf), src + 64, mask=m)
        _async_load(x2.index(buf), src + 128, mask=m)
        _async_load(x3.index(buf), src + 192, mask=m)
        _async_load(x4.index(buf), src + 256, mask=m)
        _async_load(x5.index(buf), src + 320, mask=m)
        _async_load(x6.index(buf), src + 384, mask=m)
        _async_load(x7.index(buf), src + 448, mask=m)
        _async_load(xr.index(buf), src + 512, mask=m)
        ok_s.index(buf).store(ok.to(gl.int32))
        if SIGNAL == 0:
            # each thread's copies arrive on full[buf] when they land (count: PW * 32 of the
            # barrier's PW * 32 + 1); the validity words by one release arrive after the barrier
            async_copy.mbarrier_arrive(full.index(buf), increment_count=False)
            _barrier()                        # every producer thread has stored its words
            mbarrier.arrive(full.index(buf))
        else:
            async_copy.commit_group()
            async_copy.wait_group(0)          # this thread's copies have landed
            fence_async_shared()              # generic-proxy writes -> wgmma (async proxy)
            _barrier()                        # every producer thread's copies and words
            mbarrier.arrive(full.index(buf))
        pg, of, ok = _resolve(i1, e1, in1, num_slots, num_pages, max_pages, page_size, HAS_BT)
        e1 = _page_entries(bt_row, i2, in2, max_pages, page_size, HAS_BT)
        i1 = i2
        in1 = in2


@gluon.jit
def _latent_scores(qs, y0, y1, y2, y3, y4, y5, y6, y7, yr, MMA: gl.constexpr):
    """Issue (async, not waited) the nine score wgmmas of one row block into one fp32
    accumulator: the eight nope chunks, then the rope chunk (latent rows carry no scales, so
    one accumulator, as the Triton kernel's chained dots)."""
    s = gl.zeros([64, 64], gl.float32, layout=MMA)
    s = warpgroup_mma(qs.index(0), y0.permute((1, 0)), s, use_acc=False, is_async=True)
    s = warpgroup_mma(qs.index(1), y1.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qs.index(2), y2.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qs.index(3), y3.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qs.index(4), y4.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qs.index(5), y5.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qs.index(6), y6.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qs.index(7), y7.permute((1, 0)), s, is_async=True)
    return warpgroup_mma(qs.index(8), yr.permute((1, 0)), s, is_async=True)


@gluon.jit
def _latent_softmax(s, okc, m_i, l_i, qk_scale_log2):
    """The Triton kernel's online-softmax step (exp2 domain, no units) over the waited scores:
    ``(p, alpha, m_i, l_i)``; masked rows get p = 0."""
    s = gl.where(okc[None, :], s * qk_scale_log2, NEG)
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.where(okc[None, :], gl.exp2(s - m_new[:, None]), 0.0)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _latent_pv(o, alpha, p_hi, p_lo, x, P_SPLIT: gl.constexpr):
    """``o * alpha + p_hi . X_c (+ p_lo . X_c)`` issued asynchronously (the caller waits)."""
    o = warpgroup_mma(p_hi, x, o * alpha[:, None], is_async=True)
    if P_SPLIT:
        o = warpgroup_mma(p_lo, x, o, is_async=True)
    return o


@gluon.jit
def _ws_latent_consumer(q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                        qs, ps, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, full, empty,
                        sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                        HAS_TKL: gl.constexpr, HAS_SINK: gl.constexpr, FINAL: gl.constexpr,
                        DT: gl.constexpr, NBUF: gl.constexpr, SIGNAL: gl.constexpr,
                        EMPTY_ARRIVALS: gl.constexpr, P_SMEM: gl.constexpr):
    """Latent consumer (8 warps): q once into shared memory as it is (``DT``, no per-head
    scaling: 16-bit x 16-bit products are exact in the fp32 accumulator), then per block the
    nine score wgmmas into one accumulator, the online softmax, and per 64-dim value chunk
    ``O = O * alpha + p_hi . X_c + p_lo . X_c`` (bf16: ``p_hi = bf16(p)``, ``p_lo = bf16(p -
    p_hi)``, the Triton kernel's split; fp16: one dot, fp16 p keeps 11 bits)."""
    P_SPLIT: gl.constexpr = DT == gl.bfloat16
    LDQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 32, 16])
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    MROW: gl.constexpr = gl.SliceLayout(1, MMA)
    MCOL: gl.constexpr = gl.SliceLayout(0, MMA)

    pid_h, pid_s, pid_bn, nbn, b, n = _program(N)

    q_row, qmask = _q_rows(q_ptr, pid_h, b, n, H, sq_b, sq_n, sq_h, LDQ)
    for c in gl.static_range(9):
        qs.index(c).store(gl.load(q_row + c * 64, mask=qmask, other=0.0).to(DT))
    fence_async_shared()
    _barrier()

    start, end = _list_range(tkl_ptr, b, K, pid_s, chunk, HAS_TKL)

    m_i = gl.full([64], NEG, gl.float32, layout=MROW)
    l_i = gl.zeros([64], gl.float32, layout=MROW)
    zero = gl.zeros([64, 64], gl.float32, layout=MMA)
    o0, o1, o2, o3, o4, o5, o6, o7 = zero, zero, zero, zero, zero, zero, zero, zero

    for k0 in range(start, end, 64):
        j = (k0 - start) // 64
        buf = j % NBUF
        phase = (j // NBUF) & 1
        mbarrier.wait(full.index(buf), phase)            # the producer has filled this slot
        if SIGNAL == 0:
            fence_async_shared()     # cp.async writes (generic proxy) -> wgmma reads (async)
        y0 = x0.index(buf)
        y1 = x1.index(buf)
        y2 = x2.index(buf)
        y3 = x3.index(buf)
        y4 = x4.index(buf)
        y5 = x5.index(buf)
        y6 = x6.index(buf)
        y7 = x7.index(buf)
        s = _latent_scores(qs, y0, y1, y2, y3, y4, y5, y6, y7, xr.index(buf), MMA)
        okc = ok_s.index(buf).load(MCOL) != 0        # read while the score dots run
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _latent_softmax(s, okc, m_i, l_i, qk_scale_log2)
        p_hi = p.to(DT)
        if P_SMEM:
            # P to the value dots' register layout through shared memory in one round: p_hi
            # into its own 8 KB tile, p_lo into this slot's rope chunk (read only by the score
            # dots, which both warpgroups have waited for before the softmax's cross-warpgroup
            # reductions; refilled only after this block's release); one barrier, stmatrix /
            # ldmatrix, instead of convert_layout's two rounds a part through 4 KB of scratch
            # (15 -> 8 barriers a block)
            ps.store(p_hi)
            if P_SPLIT:
                xr.index(buf).store((p - p_hi.to(gl.float32)).to(DT))
            _barrier()
            a_hi = ps.load(P_OP)
            a_lo = a_hi
            if P_SPLIT:
                a_lo = xr.index(buf).load(P_OP)
        else:
            a_hi = gl.convert_layout(p_hi, P_OP)
            a_lo = a_hi
            if P_SPLIT:
                a_lo = gl.convert_layout((p - p_hi.to(gl.float32)).to(DT), P_OP)
        o0 = _latent_pv(o0, alpha, a_hi, a_lo, y0, P_SPLIT)
        o1 = _latent_pv(o1, alpha, a_hi, a_lo, y1, P_SPLIT)
        o2 = _latent_pv(o2, alpha, a_hi, a_lo, y2, P_SPLIT)
        o3 = _latent_pv(o3, alpha, a_hi, a_lo, y3, P_SPLIT)
        o4 = _latent_pv(o4, alpha, a_hi, a_lo, y4, P_SPLIT)
        o5 = _latent_pv(o5, alpha, a_hi, a_lo, y5, P_SPLIT)
        o6 = _latent_pv(o6, alpha, a_hi, a_lo, y6, P_SPLIT)
        o7 = _latent_pv(o7, alpha, a_hi, a_lo, y7, P_SPLIT)
        o0, o1, o2, o3, o4, o5, o6, o7 = warpgroup_mma_wait(
            num_outstanding=0, deps=(o0, o1, o2, o3, o4, o5, o6, o7))
        if EMPTY_ARRIVALS == 1:
            _barrier()          # one arriving thread: both warpgroups' dots have completed
        mbarrier.arrive(empty.index(buf))                # the slot may be refilled

    # no unit: the epilogue's 2^(ub - 127) factor is 1 (ub 127)
    _epilogue(o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, gl.full([64], 127, gl.int32, layout=MROW),
              pid_h, pid_s, pid_bn, H, nbn, sink_ptr, lse_ptr, pl_ptr, po_ptr, out_ptr, FINAL,
              HAS_SINK, False, MMA)


@gluon.jit
def _sparse_mla_gluon_ws_kernel(
    q_ptr,            # [B, N, H, D_qk] bf16 / fp16, strides sq_*; last dim contiguous
    kv_ptr,           # fp8: the cache as uint8 bytes; latent: [num_pages, P, 576] in q's dtype
    kv16_ptr,         # fp8: the same bytes as int16 (bf16 rope bits); latent: unused
    kv32_ptr,         # fp8: the same bytes as int32 (ds_mla scales as float32 bits; model1
                      # ue8m0 words); latent: unused
    idx_ptr,          # [B, N, K] int32 slots (or logical positions with HAS_BT), strides si_*
    bt_ptr,           # [B, max_pages] int32 block table (HAS_BT)
    tkl_ptr,          # [B] int32 topk_length (HAS_TKL)
    sink_ptr,         # [H] float32 attention sink (HAS_SINK, FINAL only)
    po_ptr,           # [S, B*N, H, 512] float32 partial out (not FINAL)
    pl_ptr,           # [S, B*N, H] float32 partial LSE, log2 domain (not FINAL)
    out_ptr,          # [B, N, H, 512] q dtype (FINAL)
    lse_ptr,          # [B, N, H] float32 natural-log LSE (FINAL)
    sq_b, sq_n, sq_h, si_b, si_n, sbt_b,
    N, H, K, num_slots, num_pages, max_pages, page_size,
    page_bytes,       # byte stride of one page (fp8 and latent alike)
    chunk, qk_scale_log2,
    KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
    HAS_SINK: gl.constexpr, FINAL: gl.constexpr, ROPE_DTYPE: gl.constexpr,
    NBUF: gl.constexpr = 2, PRODUCER_REGS: gl.constexpr = 56,
    EMPTY_ARRIVALS: gl.constexpr = 1, SIGNAL: gl.constexpr = 0, P_SMEM: gl.constexpr = 1,
    L2_PREFETCH: gl.constexpr = 0,
):
    """Same arguments as ``gluon._sparse_mla_gluon_kernel`` (``NBUF``: X slots in the ring;
    ``PRODUCER_REGS``: the producer's register budget; ``EMPTY_ARRIVALS``: threads of the
    consumer that arrive on an ``empty`` barrier, 1 for Triton 3.6's thread-0 arrive;
    ``SIGNAL``: the latent producer's full-slot protocol, :data:`LATENT_SIGNAL`; ``P_SMEM``:
    the latent consumer's P exchange, :data:`LATENT_P_SMEM`). ``KV_FORMAT``
    0 is the latent cache (D_qk 576, ``ROPE_DTYPE`` = q's and the cache's dtype, bf16 or fp16),
    1 / 2 the fp8 formats."""
    gl.static_assert((KV_FORMAT == 0) | (KV_FORMAT == 1) | (KV_FORMAT == 2),
                     "latent, fp8_ds_mla or fp8_model1 only")
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    META: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

    if KV_FORMAT == 0:
        # Latent: q 9 x [64, 64] + NBUF slots of 9 x [64, 64] in the cache's dtype (73,728 B
        # each), one validity word a row, the p_hi tile (P_SMEM). Memory ordering of a slot
        # (producer -> consumer):
        # * SIGNAL 0: ``full`` counts LATENT_PRODUCER_WARPS * 32 + 1 arrivals a phase. Each
        #   producer thread's ``cp.async.mbarrier.arrive.noinc`` arrives once all of that
        #   thread's earlier cp.async copies have completed (PTX: the copies' writes are then
        #   performed for the threads that observe the phase), so the phase cannot complete
        #   before every row of the slot has landed. The validity words are ordinary st.shared:
        #   a partition barrier orders every producer thread's words before thread 0's release
        #   ``mbarrier.arrive``, the +1. The consumer's ``mbarrier.wait`` (acquire) then sees
        #   words and rows; cp.async writes are generic-proxy writes and wgmma reads through the
        #   async proxy, so the consumer issues ``fence.proxy.async`` after its wait, before the
        #   first wgmma (FlashMLA's sm90 sparse prefill and FlashAttention-3's paged non-TMA
        #   path feed wgmma from cp.async + mbarrier the same way, without that fence; it costs
        #   one instruction a block here).
        # * SIGNAL 1: every producer thread waits for its own copies (``cp.async.wait_group 0``:
        #   complete and visible to it), fences them to the async proxy, the partition barrier
        #   collects all threads, thread 0 arrives (release, count 1): the protocol of the fp8
        #   producer with its st.shared replaced by cp.async.
        # Refill (consumer -> producer) as the fp8 path: the consumer waits for its wgmmas
        # (which have then read the slot), a partition barrier, thread 0 arrives on ``empty``.
        qs = gl.allocate_shared_memory(ROPE_DTYPE, [9, 64, 64], SH)
        if P_SMEM:
            ps = gl.allocate_shared_memory(ROPE_DTYPE, [64, 64], SH)    # p_hi, 8 KB
        else:
            ps = qs                                                      # unused
        x0, x1, x2, x3, x4, x5, x6, x7, xr = _alloc_x(ROPE_DTYPE, ROPE_DTYPE, NBUF, SH)
        ok_s = gl.allocate_shared_memory(gl.int32, [NBUF, 64], META)
        full = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NBUF):
            if SIGNAL == 0:
                mbarrier.init(full.index(i), count=LATENT_PRODUCER_WARPS * 32 + 1)
            else:
                mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=EMPTY_ARRIVALS)
        gl.warp_specialize(
            [(_ws_latent_consumer, (q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                                    qs, ps, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, full, empty,
                                    sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                                    HAS_TKL, HAS_SINK, FINAL, ROPE_DTYPE, NBUF, SIGNAL,
                                    EMPTY_ARRIVALS, P_SMEM)),
             (_ws_latent_producer, (kv_ptr, idx_ptr, bt_ptr, tkl_ptr,
                                    x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, full, empty,
                                    si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages,
                                    page_size, page_bytes, chunk, HAS_BT, HAS_TKL, NBUF,
                                    SIGNAL))],
            [LATENT_PRODUCER_WARPS], [PRODUCER_REGS])
    else:
        qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty = _alloc_fp8_ring(
            KV_FORMAT, ROPE_DTYPE, NBUF)
        for i in gl.static_range(NBUF):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=EMPTY_ARRIVALS)

        gl.warp_specialize(
            [(_ws_consumer, (q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                             qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                             sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                             KV_FORMAT, HAS_TKL, HAS_SINK, FINAL, ROPE_DTYPE, NBUF,
                             EMPTY_ARRIVALS)),
             (_ws_producer, (kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                             x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                             si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                             page_bytes, chunk, KV_FORMAT, HAS_BT, HAS_TKL, ROPE_DTYPE, NBUF,
                             L2_PREFETCH))],
            [PRODUCER_WARPS], [PRODUCER_REGS])
