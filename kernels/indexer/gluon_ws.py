"""Lightning-indexer logits (+ the fused first-digit histogram) for sm_90 in Gluon,
warp-specialised: one producer warp streams whole pages by TMA into a ring, one to four
consumer warpgroups convert, score and histogram them.

Semantics, arguments (of :func:`launch`), outputs and numerics are those of
``kernels.indexer.gluon`` (docs/SPEC.md "Operation A"): for request b, draft i and position j

    logit[b, i, j] = k_scale[j] * sum_h weights[b, i, h] * relu(q[b, i, h, :] . k[j, :])

-inf past the draft's length or on a page entry that is not a real page; the grid ``(B, S)`` over
the same page ranges; the same ``[B, S, NB, HIST_ROW]`` histogram blocks (``hist="first"``: the
two window bases from the first 128-token tile of the program's range, its max plus and its
min minus ``HIST_HEAD`` bins, a recount at the final bases when a later key left the windows). Each logit is the same fp32
sum in the same order as ``gluon.py`` (the same wgmma k16 instructions over the same 64-dim
chunks in the same order, the same ReLU / weight / head-sum reduction over the same accumulator
layout), so the logits and the histogram blocks are bitwise ``gluon.py``'s.

Why (bench/NOTES.md, "Gluon logits kernel"): ``gluon.py`` runs a serial chain in one warpgroup
a step (cp.async wait, barrier, convert, barrier, wgmma, wait, epilogue with ~10 barriers), 2
CTAs per SM. Here the loads leave the consumers' chain:

* **Work.** One program = one request, one contiguous range of its pages, as ``gluon.py``. A
  *step* is two pages (128 token rows, one ``[128, 64]`` fp32 accumulator a draft); step ``i`` of
  the range goes to ring slot ``i % NSLOT`` and to consumer ``i % CONSUMERS`` (ping-pong: one
  consumer's wgmma runs while the other converts or runs its epilogue); with ``CONSUMERS = 4``
  page ``c % 2`` of step ``i`` goes to consumer ``c = 2 (i % 2) + page`` (``_ws_half_consumer``:
  a ``[64, 64]`` accumulator, the slot released by both pages' consumers).
* **Producer** (a worker partition of one warp, ``PRODUCER_REGS`` registers). Per step: the two
  block-table entries, a wait on the slot's ``empty`` barrier, ``mbarrier.expect`` of the bytes
  of the step's real pages (a plain arrive when none is real), then per real page three TMA
  copies: the page's 64 e4m3 rows as two ``[64, 64]`` boxes of the cache viewed as
  ``[num_pages * 66, 128]`` bytes (64-byte swizzle: conflict-free reads below) and its 64 float32
  scales as one 256-byte box of the cache viewed as float32. An entry that is negative or
  ``>= num_pages`` is never dereferenced (its copies are predicated off; the consumer masks the
  page's logits to -inf from the entry); a page past the range is neither read nor written.
* **Consumers** (the default partition and, with ``CONSUMERS`` 2 or 3, worker partitions of 4
  warps). Per step: the entries (global, issued before the wait), a wait on ``full``, then the
  conversion of the e4m3 rows to fp16 and ``S[t, h] = K[t, :] . q[h, :]`` by wgmma with q in
  shared memory (B operand, fp16 ``[64, 64]`` chunks as ``gluon.py``). ``CONVERT = 0`` (default):
  the rows are loaded straight into wgmma's register A-operand layout (2-byte shared loads),
  converted in registers, no fp16 copy in shared memory and no barrier before the dot;
  ``CONVERT = 1``: ``gluon.py``'s way (16-byte loads, fp16 store into a per-consumer shared
  buffer, fence, barrier, A from shared memory). The slot is released (``fence_async_shared``,
  partition barrier, arrive on ``empty``) once its bytes are in registers, while the dot runs.
  The epilogue is ``gluon.py``'s ``_draft_step`` (ReLU keeping NaN, weights, head sum along the
  accumulator rows, scale, masks, store, windowed histogram).
* **First tile, merge.** Step 0 (the first tile) is consumer 0's, which also loads q (the others
  wait on ``q_bar``): it sets the window bases and, with more consumers, publishes them (shared
  memory, ``base_bar``); the others wait for them before their first histogram. At the end each
  other consumer hands its counts and its elementwise key max and min over (``done_bar``, one
  arrival each, after its logit stores), consumer 0 adds them and finishes the block as
  ``gluon.py`` (recount at the final bases if a key left the windows, then the store). Integer counts:
  the block is exactly ``gluon.py``'s whatever the order.
* **Occupancy** (AOT, Triton 3.6.0, sm_90, N 1 / N 2). ``CONSUMERS = 2`` (default): 9 warps (12
  with the producer's warpgroup padded), ``maxnreg`` 168, setmaxnreg 240 / 240 / 24, 8 ring
  slots, 157,856 / 174,240 B: 1 CTA per SM, two consumer warpgroups in ping-pong (8 warps of
  consumers an SM, as ``gluon.py``'s 2 CTAs of 4 warps). ``CONSUMERS = 1``: 5 warps (8
  padded), ``maxnreg`` 128, setmaxnreg 232 / 24, 5 / 4 slots, 101,980 / 101,444 B: 2 CTAs per
  SM (the same 8 consumer warps, q twice). ``CONSUMERS = 3``: 13 warps (16), ``maxnreg`` 128,
  160 registers a consumer, weights reloaded each step (spills: 76 B at N 1, 232 B at N 2),
  producer 32. Counts and predictions:
  bench/NOTES.md ("Warp-specialised logits kernel").
* **Refused** (:func:`unverified`): ``CONSUMERS = 4`` everywhere until its GPU tests pass (one
  H100 sweep row ran exact, 2026-12-06); ``CONSUMERS = 1`` with more programs than SMs (two CTAs an
  SM) raised an illegal memory access on the H200 at B 64 L 64K (8 splits); the launcher
  raises NotImplementedError there until a GPU run shows it exact
  (docs/logs/gluon_ws_c1_fault_20261205.md; the address arithmetic is in range:
  ``bench.gluon_ws_model``).

Built for what ``gluon.py`` is (``kernels.indexer.gluon.eligible``: fp8_indexer, ``H_I = 64``,
``D_I = 128``, ``P = 64``, ``N`` in ``{1, 2}``, sm_90) and for a cache TMA can address
(:func:`tma_ok`: contiguous pages of 8,448 bytes, 16-byte aligned, fewer than 2^31 / 2112
pages); the launcher (``kernels.indexer.triton``) runs ``gluon.py`` where :func:`tma_ok` is
false. Never in the CPU interpreter (Gluon kernels do not interpret).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

from kernels.indexer.gluon import (DIMS, DRAFTS, PAGE, _barrier, _draft_step, _entries,
                                   _finish_hist, _head_sum, _hist_init, _order_key, _range,
                                   _scores, _window_base, _window_bin, _window_lbase)
from kernels.topk.triton import BASE_NONE, HIST_BINS, HIST_ROW, LBASE_NONE

# TMA load of a descriptor box into shared memory: ``async_copy_global_to_shared`` in Triton 3.6
# (the H200 image), ``async_load`` (the same arguments) later
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

NUM_WARPS = 4            # the default partition: consumer 0, one warpgroup
CONSUMER_WARPS = gl.constexpr(4)   # consumers 1, 2 (worker partitions), with CONSUMERS >= 2
PRODUCER_WARPS = gl.constexpr(1)
PRODUCER_REGS = 24       # setmaxnreg of the producer (the minimum; PRODUCER_REGS_BY below)
CONSUMERS = 2            # consumer warpgroups a CTA (1: two CTAs per SM; 3: one at 160 registers)
CONVERT = 0              # 0: e4m3 rows into wgmma's register A operand; 1: fp16 via shared memory
CONVERTS = {"regs": 0, "smem": 1}   # IndexerLogitsConfig.ws_convert -> CONVERT
# The fused histogram's counts (consumers 1-3): 0, ``gl.histogram`` a step (a ballot per bin bit,
# a popcount per bin, shared-memory atomics and barriers of the warpgroup) summed in registers,
# the consumers' sums handed to consumer 0; 1, one relaxed CTA-scope atomic add a key into the
# program's histogram block in global memory (zeroed first; the recount overwrites it). Counted
# and measured: bench/NOTES.md "Twenty-second session".
HIST_ATOMIC = 0
# (maxnreg of the launch, the consumer worker's setmaxnreg) per consumer count: the registers of
# an SM over the CTAs it holds (12 warps at 1 CTA / SM; 8 warps at 2 CTAs / SM)
REGS = {4: (96, 112), 3: (128, 160), 2: (168, 240), 1: (128, 232)}
# the producer's setmaxnreg per consumer count (three consumers leave it 32 of 16 warps' 128)
PRODUCER_REGS_BY = {4: 24, 3: 32, 2: 24, 1: 24}
PAGE_BYTES = gl.constexpr(PAGE * (DIMS + 4))   # 8,448: one page of the cache, its TMA bytes
ROWS_PER_PAGE = PAGE_BYTES.value // DIMS   # 66 rows of 128 bytes a page (64 keys, 2 of scales)
SCALE_WORDS = PAGE_BYTES.value // 4        # 2,112 float32 words a page
# Programs per SM the default split count aims at (kernels.indexer.triton.logits_splits):
# two waves of the CTAs an SM holds, as gluon.py's SPLITS_PER_SM
SPLITS_PER_SM = {4: 2, 3: 2, 2: 2, 1: 4}
# ... except where one wave leaves each split at most ONE_WAVE_MAX_PAGES pages: then one wave
# (the per-CTA start, ~2 us, is paid once, and the top-k merges half the partials). Measured
# (bench/results/indexer_sweep_ws_h100_20261205.json, H100, isolated): B 1 L 128K (2,048
# pages) at 132 splits (15.5 pages a split) 13.8 us of logits and 21.3 of top-k against 18.0
# and 23.4 at 264; at B 64 L 64K one wave (2 splits, 512 pages a split) took 344.9 us
# against 205.4 at 4 (indexer_sweep_ws_h200_20261205b.json): long splits stay at two waves.
ONE_WAVE_MAX_PAGES = 16
SMEM_PER_SM = 233472      # sm_90: 228 KB a multiprocessor, 227 KB (232,448 B) a block
SMEM_PER_BLOCK = 232448
# Whether the registry's sm_90 heuristic picks this kernel (its default ``CONSUMERS``, ``CONVERT``)
# over ``gluon.py``: only after the GPU tests and ``bench.indexer_sweep --ws`` show it exact and
# faster at every bench shape (bench/NOTES.md "Warp-specialised logits kernel").
PICKED = True
# Launches :func:`unverified` names are refused by the launcher unless this is set (the sweep's
# isolated children with ``--unguarded``, the GPU test that runs them in a child process).
ALLOW_UNVERIFIED = False


def unverified(batch: int, splits: int, num_sms: int, consumers: int) -> str | None:
    """Why the launcher refuses a launch of this kernel, or None.

    One consumer (``ws_consumers=1``: 101,980 B of shared memory and 8 x 128 registers a CTA,
    so two CTAs an SM) with more programs than SMs (``batch * splits > num_sms``), i.e. two
    CTAs resident on one SM: at B 64, L 64K, 8 splits (512 CTAs on 132 SMs) the H200 raised an
    illegal memory access in the first such row (bench/results/indexer_sweep_ws_h200_20261205.json,
    2026-12-05), while every grid the GPU tests launched (at most 30 CTAs, one an SM) was exact.
    The kernel's address arithmetic is in range there (``bench.gluon_ws_model``), the
    cause is not established (docs/logs/gluon_ws_c1_fault_20261205.md); refused until a GPU run
    shows the class exact (``python -m bench.indexer_sweep --ws --unguarded``, the test
    ``test_gluon_ws_c1_two_ctas_an_sm_unguarded``). Two or three consumers (one CTA an SM) are
    not refused (two: exact and repeatable at B 64 L 64K on the H200). Four consumers
    (``ws_consumers=4``) are refused everywhere until a GPU run has checked them."""
    if consumers == 1 and batch * splits > num_sms:
        return (f"ws_consumers=1 with {batch * splits} programs ({batch} requests x {splits} "
                f"splits) on {num_sms} SMs puts two CTAs on an SM, where this config faulted on "
                f"the H200 (illegal memory access, B 64 L 64K, 8 splits) and is not verified")
    if consumers == 4:
        return ("ws_consumers=4 (four consumers, a page each) is not verified: one H100 sweep "
                "row ran exact (2026-12-06), its GPU tests have not run (bench/NOTES.md \"Four "
                "consumers in the WS logits kernel\"; `python -m bench.indexer_sweep --ws "
                "--unguarded` runs it)")
    return None


def hist_atomic(consumers: int) -> int:
    """The kernel's ``HIST_ATOMIC`` for a launch of ``consumers`` consumer warpgroups:
    :data:`HIST_ATOMIC`, except 0 with four (the half-step consumers keep ``gl.histogram``)."""
    return int(bool(HIST_ATOMIC) and consumers != 4)


def ring_slots(consumers: int, convert: int, n: int) -> int:
    """Ring slots (steps of two pages, 16,896 B of TMA bytes and two barriers each, at most 8)
    that fit the shared memory a CTA gets (one CTA per SM with two or three consumers, two with
    one) beside q (16 KB a draft), the consumers' fp16 tiles (``convert = 1``: 32 KB each), the
    hand-over buffers and the compiler's scratch (6 KB)."""
    per_cta = SMEM_PER_SM // (2 if consumers == 1 else 1) - 1024
    fixed = n * 16384 + (consumers * 32768 if convert else 0) + 6144
    return max(2, min(8, (min(per_cta, SMEM_PER_BLOCK) - fixed) // (16896 + 16)))


def tma_ok(k_vals) -> bool:
    """Whether TMA can address the cache (``k_vals``: its e4m3 view ``[num_pages, 8448]``):
    contiguous pages, a 16-byte aligned base, and page coordinates in int32
    (``num_pages * 2112 < 2^31``)."""
    return (k_vals.dim() == 2 and k_vals.shape[1] == PAGE_BYTES.value and k_vals.stride(1) == 1
            and k_vals.stride(0) == PAGE_BYTES.value and k_vals.data_ptr() % 16 == 0
            and k_vals.shape[0] * SCALE_WORDS < 2 ** 31)


def layouts():
    """(e4m3 box layout, scale box layout) of the two TMA descriptors: ``[64, 64]`` bytes with
    the 64-byte swizzle, ``[64]`` float32 unswizzled."""
    return (gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1))


@gluon.jit
def _tma_page(kv_desc, ks_desc, ent, ok, bar, v0, v1, sc, p: gl.constexpr):
    """TMA copies of one page (entry ``ent``, skipped unless ``ok``) into rows ``64 p ..`` of a
    slot: its e4m3 rows as two 64-dim boxes and its 64 scales."""
    e = gl.where(ok, ent, 0)
    row = e * 66
    _tma_load(kv_desc, [row, 0], bar, v0.slice(64 * p, 64), pred=ok)
    _tma_load(kv_desc, [row, 64], bar, v1.slice(64 * p, 64), pred=ok)
    _tma_load(ks_desc, [e * 2112 + 2048], bar, sc.slice(64 * p, 64),
                                    pred=ok)


@gluon.jit
def _ws_producer(kv_desc, ks_desc, bt_ptr, cl_ptr, v0, v1, sc, full, empty,
                 num_pages, max_pages, stride_bt,
                 N: gl.constexpr, CL_PER_DRAFT: gl.constexpr, NSLOT: gl.constexpr):
    b = gl.program_id(0).to(gl.int64)
    split = gl.program_id(1)
    len0, len1, start, end = _range(cl_ptr, b, split, gl.num_programs(1), max_pages, N,
                                    CL_PER_DRAFT)
    bt_row = bt_ptr + b * stride_bt
    n_steps = (gl.maximum(end - start, 0) + 1) // 2
    for i in range(n_steps):
        slot = i % NSLOT
        pg = start + 2 * i
        e0 = gl.load(bt_row + pg)
        ok0 = (e0 >= 0) & (e0 < num_pages)
        has1 = pg + 1 < end
        e1 = gl.load(bt_row + pg + 1, mask=has1, other=-1)
        ok1 = (e1 >= 0) & (e1 < num_pages) & has1
        bar = full.index(slot)
        mbarrier.wait(empty.index(slot), ((i // NSLOT) & 1) ^ 1)   # the slot's last step consumed
        # one arrival a step on ``full``: with the bytes of its real pages, or plain
        n_ok = ok0.to(gl.int32) + ok1.to(gl.int32)
        mbarrier.expect(bar, 2 * PAGE_BYTES, pred=n_ok == 2)
        mbarrier.expect(bar, PAGE_BYTES, pred=n_ok == 1)
        mbarrier.arrive(bar, pred=n_ok == 0)
        _tma_page(kv_desc, ks_desc, e0, ok0, bar, v0.index(slot), v1.index(slot), sc.index(slot), 0)
        _tma_page(kv_desc, ks_desc, e1, ok1, bar, v0.index(slot), v1.index(slot), sc.index(slot), 1)


@gluon.jit
def _load_q(q_ptr, b, stride_qb, stride_qn, stride_qh, qd, N: gl.constexpr, LQ: gl.constexpr):
    """q once into shared memory: fp16 ``[64 heads, 64 dims]`` chunks, index ``2 * draft +
    chunk`` (as gluon.py), made visible to wgmma and to the partition."""
    hq = gl.arange(0, 64, layout=gl.SliceLayout(1, LQ))
    dq = gl.arange(0, 64, layout=gl.SliceLayout(0, LQ))
    for d in gl.static_range(N):
        q_row = q_ptr + b * stride_qb + d * stride_qn + hq[:, None] * stride_qh + dq[None, :]
        for c in gl.static_range(2):
            qd.index(2 * d + c).store(gl.load(q_row + c * 64).to(gl.float16))
    fence_async_shared()             # generic stores -> wgmma (async proxy)
    _barrier()


@gluon.jit
def _scores_regs(v0, v1, qd, d: gl.constexpr, AOP: gl.constexpr, MMA: gl.constexpr):
    """Issue (async) ``S = K . q_d^T`` with K as wgmma's register A operand: ``(a0, a1, acc)``."""
    a0 = v0.load(AOP).to(gl.float16)
    a1 = v1.load(AOP).to(gl.float16)
    return a0, a1, _scores(a0, a1, qd, d, MMA)


@gluon.jit
def _release(empty_bar):
    """This consumer has read its slot: order the reads before the next TMA write (async proxy),
    wait for every thread of the partition, arrive once on the slot's ``empty`` barrier."""
    fence_async_shared()
    _barrier()
    mbarrier.arrive(empty_bar)


@gluon.jit
def _ws_consumer(q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, v0, v1, sc, x0, x1, xb, xh,
                 xk, full, empty, sync, num_pages, max_pages, stride_qb, stride_qn, stride_qh,
                 stride_wb, stride_wn, stride_bt, stride_ob, stride_on,
                 C: gl.constexpr, CONSUMERS: gl.constexpr, N: gl.constexpr,
                 CL_PER_DRAFT: gl.constexpr, WRITE_HIST: gl.constexpr, NSLOT: gl.constexpr,
                 CONVERT: gl.constexpr, HIST_ATOMIC: gl.constexpr):
    LT: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])                  # [128] one a thread
    HL: gl.constexpr = gl.BlockedLayout([2], [32], [4], [0])                  # [256] bins
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])     # [128, 64] bytes
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)

    LQ: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])     # [64, 64] q bytes
    q_bar = sync.index(0)
    base_bar = sync.index(1)
    done_bar = sync.index(2)

    b = gl.program_id(0).to(gl.int64)
    split = gl.program_id(1)
    num_splits = gl.num_programs(1)
    if C == 0:
        _load_q(q_ptr, b, stride_qb, stride_qn, stride_qh, qd, N, LQ)
        if CONSUMERS > 1:
            mbarrier.arrive(q_bar)
    else:
        mbarrier.wait(q_bar, 0)
    len0, len1, start, end = _range(cl_ptr, b, split, num_splits, max_pages, N, CL_PER_DRAFT)
    n_steps = (gl.maximum(end - start, 0) + 1) // 2

    hw = gl.arange(0, 64, layout=gl.SliceLayout(0, MMA))
    w0 = gl.load(w_ptr + b * stride_wb + hw)
    w1 = w0
    if N == 2:
        w1 = gl.load(w_ptr + b * stride_wb + stride_wn + hw)
    t = gl.arange(0, 128, layout=LT)
    bt_row = bt_ptr + b * stride_bt
    out0 = out_ptr + b * stride_ob
    out1 = out0 + stride_on
    h0, base0, lb0, km0, kn0 = _hist_init(split, HL, LT)
    h1, base1, lb1, km1, kn1 = h0, base0, lb0, km0, kn0
    hb = hist_ptr + (b * num_splits + split) * (N * HIST_ROW)    # this program's blocks
    if WRITE_HIST:
        if HIST_ATOMIC:
            if C == 0:
                # the counts are added in place (HIST_ATOMIC): zeroed before any consumer's
                # first add (consumer 0's own after the barrier; the others' after base_bar,
                # which consumer 0 arrives on after step 0)
                hz = gl.arange(0, HIST_BINS, layout=HL)
                gl.store(hb + hz, gl.zeros([HIST_BINS], gl.int32, layout=HL))
                if N == 2:
                    gl.store(hb + HIST_ROW + hz, gl.zeros([HIST_BINS], gl.int32, layout=HL))
                _barrier()

    for i in range(C, n_steps, CONSUMERS):
        slot = i % NSLOT
        pg0 = start + 2 * i
        page_ok = _entries(bt_row, pg0, end, num_pages, LT) >= 0
        j = pg0 * 64 + t
        pg_in = j < end * 64
        first = i == 0
        mbarrier.wait(full.index(slot), (i // NSLOT) & 1)       # the step's pages have landed
        s_sc = sc.index(slot).load(LT)
        if CONVERT == 0:
            a0, a1, acc = _scores_regs(v0.index(slot), v1.index(slot), qd, 0, AOP, MMA)
            _release(empty.index(slot))
        else:
            _barrier()                   # the previous step's dots have read x0 / x1
            x0.store(v0.index(slot).load(LD).to(gl.float16))
            x1.store(v1.index(slot).load(LD).to(gl.float16))
            _release(empty.index(slot))  # (its fence also orders the stores before the dots)
            acc = _scores(x0, x1, qd, 0, MMA)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if CONSUMERS > 1:
            if WRITE_HIST:
                if C > 0:
                    if i == C:           # this consumer's first tile: the bases of step 0
                        mbarrier.wait(base_bar, 0)
                        base0 = gl.max(xb.index(0).load(LT), axis=0)
                        base1 = gl.max(xb.index(1).load(LT), axis=0)
                        lb0 = gl.max(xb.index(2).load(LT), axis=0)
                        lb1 = gl.max(xb.index(3).load(LT), axis=0)
        if CONSUMERS == 3:               # 160 registers: the weights from L1 each step
            w0 = gl.load(w_ptr + b * stride_wb + hw)
        h0, base0, lb0, km0, kn0 = _draft_step(acc, w0, s_sc, page_ok, j, len0, pg_in, out0, h0,
                                               base0, lb0, km0, kn0, first, WRITE_HIST, HL, LT,
                                               hb, HIST_ATOMIC)
        if N == 2:
            if CONVERT == 0:
                acc = _scores(a0, a1, qd, 1, MMA)
            else:
                acc = _scores(x0, x1, qd, 1, MMA)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            if CONSUMERS == 3:
                w1 = gl.load(w_ptr + b * stride_wb + stride_wn + hw)
            h1, base1, lb1, km1, kn1 = _draft_step(acc, w1, s_sc, page_ok, j, len1, pg_in, out1,
                                                   h1, base1, lb1, km1, kn1, first, WRITE_HIST,
                                                   HL, LT, hb + HIST_ROW, HIST_ATOMIC)
        if CONSUMERS > 1:
            if WRITE_HIST:
                if C == 0:
                    if i == 0:           # publish step 0's bases to the other consumers
                        xb.index(0).store(gl.full([128], 0, gl.int32, layout=LT) + base0)
                        xb.index(1).store(gl.full([128], 0, gl.int32, layout=LT) + base1)
                        xb.index(2).store(gl.full([128], 0, gl.int32, layout=LT) + lb0)
                        xb.index(3).store(gl.full([128], 0, gl.int32, layout=LT) + lb1)
                        _barrier()
                        mbarrier.arrive(base_bar)

    if WRITE_HIST:
        if CONSUMERS > 1:
            if C > 0:                    # hand the counts and key maxima / minima to consumer 0
                XC: gl.constexpr = 2 * CONSUMERS - 2
                if not HIST_ATOMIC:      # (else the counts are in the blocks already)
                    xh.index(2 * C - 2).store(h0)
                    if N == 2:
                        xh.index(2 * C - 1).store(h1)
                xk.index(2 * C - 2).store(km0)
                xk.index(XC + 2 * C - 2).store(kn0)
                if N == 2:
                    xk.index(2 * C - 1).store(km1)
                    xk.index(XC + 2 * C - 1).store(kn1)
                _barrier()               # (also: this partition's logit stores before the arrive)
                mbarrier.arrive(done_bar)
            else:
                mbarrier.wait(done_bar, 0)          # every other consumer has arrived
                XK: gl.constexpr = 2 * CONSUMERS - 2
                for c in gl.static_range(1, CONSUMERS):
                    if not HIST_ATOMIC:
                        h0 += xh.index(2 * c - 2).load(HL)
                        if N == 2:
                            h1 += xh.index(2 * c - 1).load(HL)
                    km0 = gl.maximum(km0, xk.index(2 * c - 2).load(LT))
                    kn0 = gl.minimum(kn0, xk.index(XK + 2 * c - 2).load(LT))
                    if N == 2:
                        km1 = gl.maximum(km1, xk.index(2 * c - 1).load(LT))
                        kn1 = gl.minimum(kn1, xk.index(XK + 2 * c - 1).load(LT))
        if C == 0:
            _finish_hist(out0, len0, start, end, h0, base0, lb0, km0, kn0, hb, HL, LT,
                         HIST_ATOMIC)
            if N == 2:
                _finish_hist(out1, len1, start, end, h1, base1, lb1, km1, kn1, hb + HIST_ROW, HL,
                             LT, HIST_ATOMIC)


# Four consumers (``CONSUMERS = 4``): each owns one page (64 token rows) of every other step,
# page ``C % 2`` of steps ``C // 2, C // 2 + 2, ...``; a slot is released when both of its
# pages' consumers have read it (``empty`` counts two arrivals). A consumer's accumulator and A
# operand are half of a two-page consumer's ([64, 64] fp32, 32 registers; [64, 128] fp16, 32), so
# four warpgroups (16 consumer warps an SM, against 8) fit the register file beside the producer.
HALF_XM = gl.constexpr(4)   # step 0's key maximum / minimum of each draft, consumer 1 -> consumer 0


@gluon.jit
def _half_bases(key0, kq0, key1, kq1, xm, xb, half_bar, base_bar, C: gl.constexpr,
                LT128: gl.constexpr):
    """Step 0's window bases (``(base0, lbase0, base1, lbase1)``) from its 128 keys, the pages of
    consumers 0 and 1: consumer 1 hands its page's key maximum and minimum per draft to consumer
    0 (``xm``, ``half_bar``) and reads the bases later like the other consumers (what it
    returns here is not used); consumer 0 takes the maximum / minimum over both pages, sets the
    bases as ``gluon._draft_step`` does (``HIST_HEAD`` = 32 bins of headroom) and publishes them
    (``xb``, ``base_bar``)."""
    mx0 = gl.max(key0, axis=0)
    mn0 = gl.min(kq0, axis=0)
    mx1 = gl.max(key1, axis=0)
    mn1 = gl.min(kq1, axis=0)
    if C == 1:
        xm.index(0).store(gl.zeros([128], gl.uint32, layout=LT128) + mx0)
        xm.index(1).store(gl.zeros([128], gl.uint32, layout=LT128) + mn0)
        xm.index(2).store(gl.zeros([128], gl.uint32, layout=LT128) + mx1)
        xm.index(3).store(gl.zeros([128], gl.uint32, layout=LT128) + mn1)
        _barrier()
        mbarrier.arrive(half_bar)
    else:
        mbarrier.wait(half_bar, 0)
        mx0 = gl.maximum(mx0, gl.max(xm.index(0).load(LT128), axis=0))
        mn0 = gl.minimum(mn0, gl.min(xm.index(1).load(LT128), axis=0))
        mx1 = gl.maximum(mx1, gl.max(xm.index(2).load(LT128), axis=0))
        mn1 = gl.minimum(mn1, gl.min(xm.index(3).load(LT128), axis=0))
    base0 = _window_base(mx0) + 32
    lb0 = _window_lbase(mn0) - 32
    base1 = _window_base(mx1) + 32
    lb1 = _window_lbase(mn1) - 32
    if C == 0:
        xb.index(0).store(gl.full([128], 0, gl.int32, layout=LT128) + base0)
        xb.index(1).store(gl.full([128], 0, gl.int32, layout=LT128) + base1)
        xb.index(2).store(gl.full([128], 0, gl.int32, layout=LT128) + lb0)
        xb.index(3).store(gl.full([128], 0, gl.int32, layout=LT128) + lb1)
        _barrier()
        mbarrier.arrive(base_bar)
    return base0, lb0, base1, lb1


@gluon.jit
def _half_keys(acc, w, s_sc, ok, j, len_d, out_d, pg_in, LT: gl.constexpr):
    """One draft's logits of a half step (64 rows): stored, and their keys (``order_key``) and
    the keys with 0 (not qualifying) as the largest key, for the window minimum."""
    logit = _head_sum(acc, w, LT) * s_sc
    logit = gl.where((j < len_d) & ok, logit, float("-inf"))
    gl.store(out_d + j, logit, mask=pg_in)
    key = _order_key(logit, LT)
    return key, gl.where(key != 0, key, ~gl.zeros_like(key))


@gluon.jit
def _ws_half_consumer(q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, wsm, v0, v1, sc, xb,
                      xh, xk, xm, full, empty, sync, num_pages, max_pages, stride_qb, stride_qn,
                      stride_qh, stride_wb, stride_wn, stride_bt, stride_ob, stride_on,
                      C: gl.constexpr, N: gl.constexpr, CL_PER_DRAFT: gl.constexpr,
                      WRITE_HIST: gl.constexpr, NSLOT: gl.constexpr):
    """Consumer ``C`` of four (``CONSUMERS = 4``): page ``C % 2`` of steps ``C // 2, C // 2 + 2,
    ...``. Per page: the same wgmma k16 instructions over the same 64-dim chunks as the two-page
    consumer (rows are independent in a wgmma), the same head-sum reduction per row, so the
    logits are bitwise those of :func:`_ws_consumer`; the histogram counts are integers and the
    window bases come from the same 128 keys of step 0 (consumer 1 hands its page's key maximum
    and minimum to consumer 0 through ``xm`` / ``half_bar``), so the blocks are bitwise too."""
    LT128: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])            # [128] one a thread
    HL: gl.constexpr = gl.BlockedLayout([2], [32], [4], [0])               # [256] bins
    # [64] rows: warps 0-1 hold one row a thread, warps 2-3 the same rows (a slice of a [64, 2]
    # layout, so gl.histogram divides the replicated counts out)
    LT: gl.constexpr = gl.SliceLayout(1, gl.BlockedLayout([1, 1], [32, 1], [2, 2], [0, 1]))
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    LQ: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])     # [64, 64] q bytes
    PG: gl.constexpr = C % 2
    q_bar = sync.index(0)
    base_bar = sync.index(1)
    done_bar = sync.index(2)
    half_bar = sync.index(3)

    b = gl.program_id(0).to(gl.int64)
    split = gl.program_id(1)
    num_splits = gl.num_programs(1)
    WL: gl.constexpr = gl.SliceLayout(0, MMA)                                # [64] heads
    if C == 0:
        # the weights too, read each step from shared memory (16 registers less than holding
        # them, so four consumers fit the register file)
        hw = gl.arange(0, 64, layout=gl.BlockedLayout([1], [32], [4], [0]))
        for d in gl.static_range(N):
            wsm.index(d).store(gl.load(w_ptr + b * stride_wb + d * stride_wn + hw))
        _load_q(q_ptr, b, stride_qb, stride_qn, stride_qh, qd, N, LQ)
        mbarrier.arrive(q_bar)
    else:
        mbarrier.wait(q_bar, 0)
    len0, len1, start, end = _range(cl_ptr, b, split, num_splits, max_pages, N, CL_PER_DRAFT)
    n_steps = (gl.maximum(end - start, 0) + 1) // 2

    t = gl.arange(0, 64, layout=LT)
    bt_row = bt_ptr + b * stride_bt
    out0 = out_ptr + b * stride_ob
    out1 = out0 + stride_on
    h0 = gl.zeros([HIST_BINS], gl.int32, layout=HL)
    base0 = split * 0 + BASE_NONE
    lb0 = split * 0 + LBASE_NONE
    km0 = gl.zeros([64], gl.uint32, layout=LT)
    kn0 = ~gl.zeros([64], gl.uint32, layout=LT)
    h1, base1, lb1, km1, kn1 = h0, base0, lb0, km0, kn0

    for i in range(C // 2, n_steps, 2):
        slot = i % NSLOT
        pg = start + 2 * i + PG
        ent = gl.load(bt_row + pg, mask=pg < end, other=-1)
        ok = (ent >= 0) & (ent < num_pages) & (pg < end)
        j = pg * 64 + t
        pg_in = j < end * 64
        mbarrier.wait(full.index(slot), (i // NSLOT) & 1)       # the step's pages have landed
        s_sc = sc.index(slot).slice(64 * PG, 64).load(LT)
        a0 = v0.index(slot).slice(64 * PG, 64).load(AOP).to(gl.float16)
        a1 = v1.index(slot).slice(64 * PG, 64).load(AOP).to(gl.float16)
        acc = gl.zeros([64, 64], gl.float32, layout=MMA)
        acc = warpgroup_mma(a0, qd.index(0).permute((1, 0)), acc, use_acc=False, is_async=True)
        acc = warpgroup_mma(a1, qd.index(1).permute((1, 0)), acc, is_async=True)
        _release(empty.index(slot))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        key0, kq0 = _half_keys(acc, wsm.index(0).load(WL), s_sc, ok, j, len0, out0, pg_in, LT)
        key1, kq1 = key0, kq0
        if N == 2:
            acc = gl.zeros([64, 64], gl.float32, layout=MMA)
            acc = warpgroup_mma(a0, qd.index(2).permute((1, 0)), acc, use_acc=False, is_async=True)
            acc = warpgroup_mma(a1, qd.index(3).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            key1, kq1 = _half_keys(acc, wsm.index(1).load(WL), s_sc, ok, j, len1, out1, pg_in,
                                   LT)
        if WRITE_HIST:
            if C < 2:
                if i == 0:
                    base0, lb0, base1, lb1 = _half_bases(key0, kq0, key1, kq1, xm, xb, half_bar,
                                                         base_bar, C, LT128)
            if C > 0:
                if i == C // 2:          # this consumer's first step: the bases of step 0
                    mbarrier.wait(base_bar, 0)
                    base0 = gl.max(xb.index(0).load(LT128), axis=0)
                    base1 = gl.max(xb.index(1).load(LT128), axis=0)
                    lb0 = gl.max(xb.index(2).load(LT128), axis=0)
                    lb1 = gl.max(xb.index(3).load(LT128), axis=0)
            km0 = gl.maximum(km0, key0)
            kn0 = gl.minimum(kn0, kq0)
            h0 += gl.histogram(_window_bin(key0, base0, lb0), HIST_BINS, mask=key0 != 0,
                               layout=HL)
            if N == 2:
                km1 = gl.maximum(km1, key1)
                kn1 = gl.minimum(kn1, kq1)
                h1 += gl.histogram(_window_bin(key1, base1, lb1), HIST_BINS, mask=key1 != 0,
                                   layout=HL)

    if WRITE_HIST:
        if C > 0:                        # hand the counts and key maxima / minima to consumer 0
            xh.index(2 * C - 2).store(h0)
            xk.index(2 * C - 2).store(km0)
            xk.index(6 + 2 * C - 2).store(kn0)
            if N == 2:
                xh.index(2 * C - 1).store(h1)
                xk.index(2 * C - 1).store(km1)
                xk.index(6 + 2 * C - 1).store(kn1)
            _barrier()                   # (also: this partition's logit stores before the arrive)
            mbarrier.arrive(done_bar)
        else:
            mbarrier.wait(done_bar, 0)              # every other consumer has arrived
            for c in gl.static_range(1, 4):
                h0 += xh.index(2 * c - 2).load(HL)
                km0 = gl.maximum(km0, xk.index(2 * c - 2).load(LT))
                kn0 = gl.minimum(kn0, xk.index(6 + 2 * c - 2).load(LT))
                if N == 2:
                    h1 += xh.index(2 * c - 1).load(HL)
                    km1 = gl.maximum(km1, xk.index(2 * c - 1).load(LT))
                    kn1 = gl.minimum(kn1, xk.index(6 + 2 * c - 1).load(LT))
            hb = hist_ptr + (b * num_splits + split) * (N * HIST_ROW)
            _finish_hist(out0, len0, start, end, h0, base0, lb0, km0, kn0, hb, HL, LT128)
            if N == 2:
                _finish_hist(out1, len1, start, end, h1, base1, lb1, km1, kn1, hb + HIST_ROW, HL,
                             LT128)


@gluon.jit
def _indexer_logits_gluon_ws_kernel(
    q_ptr,            # [B, N, 64, 128] e4m3, strides stride_q*; last dim contiguous
    w_ptr,            # [B, N, 64] float32
    kv_desc,          # TMA: the cache as e4m3 [num_pages * 66, 128], boxes [64, 64]
    ks_desc,          # TMA: the cache as float32 [num_pages * 2112], boxes [64]
    bt_ptr,           # [B, max_pages] int32
    cl_ptr,           # [B] or [B, N] int32
    out_ptr,          # [B, N, W] float32
    hist_ptr,         # [B, S, N, HIST_ROW] int32 (WRITE_HIST)
    num_pages, max_pages,
    stride_qb, stride_qn, stride_qh,
    stride_wb, stride_wn,
    stride_bt,
    stride_ob, stride_on,
    N: gl.constexpr, CL_PER_DRAFT: gl.constexpr, WRITE_HIST: gl.constexpr,
    CONSUMERS: gl.constexpr = 2, CONVERT: gl.constexpr = 0, NSLOT: gl.constexpr = 8,
    CONSUMER_REGS: gl.constexpr = 240, PRODUCER_REGS: gl.constexpr = 24,
    HIST_ATOMIC: gl.constexpr = 0,
):
    """Arguments of ``gluon._indexer_logits_gluon_kernel`` with the cache as two TMA
    descriptors (:func:`descriptors`) instead of pointers and strides. ``CONSUMERS``: consumer
    warpgroups (1-4; 4: a page each, ``CONVERT`` 0 only); ``CONVERT``: 0 registers, 1 shared memory; ``NSLOT``: ring slots (steps,
    :func:`ring_slots`); ``CONSUMER_REGS`` / ``PRODUCER_REGS``: the worker partitions'
    setmaxnreg (the default partition gets the rest of the launch's ``maxnreg``, :data:`REGS`)."""
    gl.static_assert((N == 1) | (N == 2), "N (next_n) 1 or 2")
    gl.static_assert((CONSUMERS >= 1) & (CONSUMERS <= 4), "one to four consumer warpgroups")
    gl.static_assert((CONSUMERS < 4) | (CONVERT == 0), "four consumers convert in registers")
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    KL: gl.constexpr = kv_desc.layout
    SL: gl.constexpr = ks_desc.layout

    qd = gl.allocate_shared_memory(gl.float16, [2 * N, 64, 64], SH)
    # the ring: per slot two pages' e4m3 rows (dims 0-63 in v0, 64-127 in v1) and scales
    v0 = gl.allocate_shared_memory(gl.float8e4nv, [NSLOT, 128, 64], KL)
    v1 = gl.allocate_shared_memory(gl.float8e4nv, [NSLOT, 128, 64], KL)
    sc = gl.allocate_shared_memory(gl.float32, [NSLOT, 128], SL)
    full = gl.allocate_shared_memory(gl.int64, [NSLOT, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NSLOT, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NSLOT):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=2 if CONSUMERS == 4 else 1)   # 4: a page each
    # the fp16 tiles of each consumer (CONVERT 1; unused otherwise)
    if CONVERT == 1:
        x0 = gl.allocate_shared_memory(gl.float16, [CONSUMERS, 128, 64], SH)
        x1 = gl.allocate_shared_memory(gl.float16, [CONSUMERS, 128, 64], SH)
    else:
        x0 = qd
        x1 = qd
    # consumer 0 -> the others: q is in shared memory (q_bar), step 0's window bases (xb: the
    # upper bases of drafts 0 / 1, then the lower ones; base_bar); the others -> consumer 0:
    # their counts and key maxima (xk [c]) and minima (xk [XC + c]) (xh, xk, done_bar: one
    # arrival each)
    XC: gl.constexpr = 2 * CONSUMERS - 2 if CONSUMERS > 1 else 1
    xb = gl.allocate_shared_memory(gl.int32, [4, 128], FLAT)
    xh = gl.allocate_shared_memory(gl.int32, [XC, HIST_BINS], FLAT)
    TK: gl.constexpr = 64 if CONSUMERS == 4 else 128        # token rows a consumer's step
    xk = gl.allocate_shared_memory(gl.uint32, [2 * XC, TK], FLAT)
    # four consumers: consumer 1 -> 0, its half of step 0's key maxima / minima (half_bar)
    NSYNC: gl.constexpr = 4 if CONSUMERS == 4 else 3
    sync = gl.allocate_shared_memory(gl.int64, [NSYNC, 1], mbarrier.MBarrierLayout())
    if CONSUMERS > 1:
        # One consumer never touches these barriers after this point, and the compiler then
        # reuses their bytes as the consumer's scratch (the histogram's shared atomics, the
        # logits' layout change: Triton 3.6.0, sm_90, offset 100,864 at N 1). Initialised and
        # never invalidated, they would be live mbarrier objects overwritten by plain stores
        # (undefined in PTX: a barrier's memory is repurposed only after mbarrier.inval), so
        # with one consumer they are not initialised at all.
        mbarrier.init(sync.index(0), count=1)
        mbarrier.init(sync.index(1), count=1)
        mbarrier.init(sync.index(2), count=CONSUMERS - 1)
    if CONSUMERS == 4:
        mbarrier.init(sync.index(3), count=1)
        xm = gl.allocate_shared_memory(gl.uint32, [HALF_XM, 128], FLAT)
        wsm = gl.allocate_shared_memory(gl.float32, [N, 64], FLAT)      # the weights
    fence_async_shared()             # the barriers initialised before any TMA completes on them

    C0: gl.constexpr = 0
    C1: gl.constexpr = 1
    C2: gl.constexpr = 2
    X1: gl.constexpr = 1 if CONVERT == 1 else 0
    X2: gl.constexpr = 2 if CONVERT == 1 else 0
    if CONSUMERS == 1:
        gl.warp_specialize(
            [(_ws_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, v0, v1, sc,
                             x0.index(0), x1.index(0), xb, xh, xk, full, empty, sync, num_pages,
                             max_pages, stride_qb, stride_qn, stride_qh, stride_wb, stride_wn,
                             stride_bt, stride_ob, stride_on,
                             C0, CONSUMERS, N, CL_PER_DRAFT, WRITE_HIST, NSLOT, CONVERT,
                             HIST_ATOMIC)),
             (_ws_producer, (kv_desc, ks_desc, bt_ptr, cl_ptr, v0, v1, sc, full, empty, num_pages,
                             max_pages, stride_bt, N, CL_PER_DRAFT, NSLOT))],
            [PRODUCER_WARPS], [PRODUCER_REGS])
    elif CONSUMERS == 2:
        gl.warp_specialize(
            [(_ws_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, v0, v1, sc,
                             x0.index(0), x1.index(0), xb, xh, xk, full, empty, sync, num_pages,
                             max_pages, stride_qb, stride_qn, stride_qh, stride_wb, stride_wn,
                             stride_bt, stride_ob, stride_on,
                             C0, CONSUMERS, N, CL_PER_DRAFT, WRITE_HIST, NSLOT, CONVERT,
                             HIST_ATOMIC)),
             (_ws_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, v0, v1, sc,
                             x0.index(X1), x1.index(X1), xb, xh, xk, full, empty, sync,
                             num_pages, max_pages, stride_qb, stride_qn, stride_qh, stride_wb,
                             stride_wn, stride_bt, stride_ob, stride_on,
                             C1, CONSUMERS, N, CL_PER_DRAFT, WRITE_HIST, NSLOT, CONVERT,
                             HIST_ATOMIC)),
             (_ws_producer, (kv_desc, ks_desc, bt_ptr, cl_ptr, v0, v1, sc, full, empty, num_pages,
                             max_pages, stride_bt, N, CL_PER_DRAFT, NSLOT))],
            [CONSUMER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    elif CONSUMERS == 4:
        C3: gl.constexpr = 3
        # the four argument tuples written out: one built with ``+`` from a shared prefix loses
        # the constexpr-ness of N and the other constexpr members (Triton 3.6.0: "not a
        # constexpr" at the first static_range)
        gl.warp_specialize(
            [(_ws_half_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, wsm, v0, v1,
                                  sc, xb, xh, xk, xm, full, empty, sync, num_pages, max_pages, stride_qb,
                                  stride_qn, stride_qh, stride_wb, stride_wn, stride_bt,
                                  stride_ob, stride_on, C0, N, CL_PER_DRAFT, WRITE_HIST, NSLOT)),
             (_ws_half_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, wsm, v0, v1,
                                  sc, xb, xh, xk, xm, full, empty, sync, num_pages, max_pages, stride_qb,
                                  stride_qn, stride_qh, stride_wb, stride_wn, stride_bt,
                                  stride_ob, stride_on, C1, N, CL_PER_DRAFT, WRITE_HIST, NSLOT)),
             (_ws_half_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, wsm, v0, v1,
                                  sc, xb, xh, xk, xm, full, empty, sync, num_pages, max_pages, stride_qb,
                                  stride_qn, stride_qh, stride_wb, stride_wn, stride_bt,
                                  stride_ob, stride_on, C2, N, CL_PER_DRAFT, WRITE_HIST, NSLOT)),
             (_ws_half_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, wsm, v0, v1,
                                  sc, xb, xh, xk, xm, full, empty, sync, num_pages, max_pages, stride_qb,
                                  stride_qn, stride_qh, stride_wb, stride_wn, stride_bt,
                                  stride_ob, stride_on, C3, N, CL_PER_DRAFT, WRITE_HIST, NSLOT)),
             (_ws_producer, (kv_desc, ks_desc, bt_ptr, cl_ptr, v0, v1, sc, full, empty, num_pages,
                             max_pages, stride_bt, N, CL_PER_DRAFT, NSLOT))],
            [CONSUMER_WARPS, CONSUMER_WARPS, CONSUMER_WARPS, PRODUCER_WARPS],
            [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize(
            [(_ws_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, v0, v1, sc,
                             x0.index(0), x1.index(0), xb, xh, xk, full, empty, sync, num_pages,
                             max_pages, stride_qb, stride_qn, stride_qh, stride_wb, stride_wn,
                             stride_bt, stride_ob, stride_on,
                             C0, CONSUMERS, N, CL_PER_DRAFT, WRITE_HIST, NSLOT, CONVERT,
                             HIST_ATOMIC)),
             (_ws_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, v0, v1, sc,
                             x0.index(X1), x1.index(X1), xb, xh, xk, full, empty, sync,
                             num_pages, max_pages, stride_qb, stride_qn, stride_qh, stride_wb,
                             stride_wn, stride_bt, stride_ob, stride_on,
                             C1, CONSUMERS, N, CL_PER_DRAFT, WRITE_HIST, NSLOT, CONVERT,
                             HIST_ATOMIC)),
             (_ws_consumer, (q_ptr, w_ptr, bt_ptr, cl_ptr, out_ptr, hist_ptr, qd, v0, v1, sc,
                             x0.index(X2), x1.index(X2), xb, xh, xk, full, empty, sync,
                             num_pages, max_pages, stride_qb, stride_qn, stride_qh, stride_wb,
                             stride_wn, stride_bt, stride_ob, stride_on,
                             C2, CONSUMERS, N, CL_PER_DRAFT, WRITE_HIST, NSLOT, CONVERT,
                             HIST_ATOMIC)),
             (_ws_producer, (kv_desc, ks_desc, bt_ptr, cl_ptr, v0, v1, sc, full, empty, num_pages,
                             max_pages, stride_bt, N, CL_PER_DRAFT, NSLOT))],
            [CONSUMER_WARPS, CONSUMER_WARPS, PRODUCER_WARPS],
            [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


def descriptors(k_vals, k_scales):
    """The two TMA descriptors of an fp8_indexer cache (:func:`tma_ok` true): its e4m3 bytes as
    ``[num_pages * 66, 128]`` with ``[64, 64]`` boxes, its float32 words as
    ``[num_pages * 2112]`` with 64-word boxes."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    kl, sl = layouts()
    n = k_vals.shape[0]
    kv = k_vals.view(n * ROWS_PER_PAGE, DIMS)
    ks = k_scales.reshape(n * SCALE_WORDS)
    return (TensorDescriptor(kv, list(kv.shape), list(kv.stride()), [64, 64], kl),
            TensorDescriptor(ks, list(ks.shape), list(ks.stride()), [64], sl))


def launch(q, weights, k_vals, k_scales, block_table, context_lens, out, hist, splits: int,
           consumers: int = CONSUMERS, convert: int = CONVERT):
    """Launch :func:`_indexer_logits_gluon_ws_kernel` on validated tensors
    (``kernels.indexer.gluon.eligible`` and :func:`tma_ok` true): the arguments of
    ``kernels.indexer.gluon.launch``; ``consumers`` / ``convert`` as the kernel's ``CONSUMERS``
    / ``CONVERT`` (ring slots, register budgets and ``maxnreg`` follow from them)."""
    B, N, H, D = q.shape
    kv_desc, ks_desc = descriptors(k_vals, k_scales)
    maxnreg, cregs = REGS[consumers]
    _indexer_logits_gluon_ws_kernel[(B, splits)](
        q, weights, kv_desc, ks_desc, block_table, context_lens, out,
        hist if hist is not None else out,
        k_vals.shape[0], block_table.shape[1],
        q.stride(0), q.stride(1), q.stride(2),
        weights.stride(0), weights.stride(1),
        block_table.stride(0),
        out.stride(0), out.stride(1),
        N=N, CL_PER_DRAFT=context_lens.dim() == 2, WRITE_HIST=hist is not None,
        CONSUMERS=consumers, CONVERT=convert, NSLOT=ring_slots(consumers, convert, N),
        CONSUMER_REGS=cregs, PRODUCER_REGS=PRODUCER_REGS_BY[consumers],
        HIST_ATOMIC=hist_atomic(consumers),
        num_warps=NUM_WARPS, maxnreg=maxnreg,
    )
    return out
