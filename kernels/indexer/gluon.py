"""Lightning-indexer logits (+ the fused first-digit histogram) for sm_90 in Gluon: one
warpgroup, 128 tokens a step, wgmma with the tokens as M.

Semantics, inputs, outputs and the histogram blocks are those of
``kernels.indexer.triton._indexer_logits_kernel`` with ``trans=True, pages=2, hist="first"``
(docs/SPEC.md "Operation A"; DeepSeek-V3.2-Exp ``Indexer.forward``, DeepGEMM
``fp8_paged_mqa_logits``): for request b, draft i and position j

    logit[b, i, j] = k_scale[j] * sum_h weights[b, i, h] * relu(q[b, i, h, :] . k[j, :])

-inf where j is past the draft's length or its page entry is not a real page; the same grid
``(B, S)`` over page ranges, the same ``[B, S, NB, HIST_ROW]`` histogram blocks (256 windowed
first-digit counts and the two window bases per draft, from the first tile's max plus and min
minus ``HIST_HEAD`` bins, a recount at the final bases when a later key left the windows), so the
top-k (``kernels.topk.triton``) reads either kernel's output. e4m3 q and keys become fp16 (exact)
and the dot accumulates in fp32, as the Triton kernel's ``fp8_upcast``.

Why a second kernel (bench/NOTES.md, "Logits kernel"): the Triton kernel holds 227 registers a
thread (2 CTAs of 4 warps per SM) and issues ~840 SASS per warp per 128 tokens; ncu at B 64
L 64K (H200) shows 27 % issue efficiency, the warps waiting on each wgmma and on shared-memory
dependencies with nothing else resident to switch to. Here the layouts are explicit:

* **Work.** One program = one request, one contiguous range of its pages (``S`` programs a
  request), 4 warps. A step takes two pages (128 token rows); their block-table entries are
  loaded two steps ahead and their e4m3 rows one step ahead (16-byte vectors, 128 B a thread,
  carried in registers across the step), so no step waits on the entry -> rows chain.
* **Shared memory.** q once per program, fp16 ``[64 heads, 64 dims]`` chunks (2 a draft); the
  step's keys converted once into fp16 ``[128 tokens, 64 dims]`` chunks (32 KB).
* **Scores.** ``S[t, h] = K[t, :] . q[h, :]`` by wgmma from shared memory (A = keys, B = the
  transposed view of q), fp32 accumulator ``[128, 64]`` a draft (64 registers a thread). ReLU,
  the weights and the head sum run along each accumulator row (in-thread, then across a quad).
* **Epilogue.** The ``[128]`` logits are brought to one value a thread (a blocked layout: no
  replicated element, so the ``gl.histogram`` counts each position once and the store is one
  coalesced 512-byte row), scaled, masked, stored, and histogrammed.
* **Masking.** Entries negative or ``>= num_pages`` are never dereferenced (loads masked; their
  logits -inf); positions past a draft's length are -inf; pages past the program's range are
  not written (the next program's).

Built for exactly: fp8_indexer caches, ``H_I = 64``, ``D_I = 128``, ``P = 64``, ``N`` in
``{1, 2}`` (:func:`eligible`); every other call runs the Triton kernel. sm_90 only (wgmma),
never in the CPU interpreter (Gluon kernels do not interpret).
"""
from __future__ import annotations

import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from kernels.topk.triton import (BASE_NONE, HIST_BINS, HIST_ROW, LBASE_NONE, MID_BIN, UPPER_LO,
                                 WINDOW_SHIFT)

# CTA-wide barrier: ``gl.thread_barrier`` in Triton 3.6 (the H200 image), ``gl.barrier`` later
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
# cp.async of a pointer tensor into shared memory: ``async_copy_global_to_shared`` in Triton 3.6,
# ``async_load`` (the same arguments) later
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

NUM_WARPS = 4            # one warpgroup
TOKENS = 128             # token rows a step (two pages of 64)
NSTAGE = gl.constexpr(3)  # cp.async ring depth: steps i + 1 and i + 2 in flight while i is scored
# The shapes this kernel is built for (``eligible``): heads, dims, page size, drafts
HEADS, DIMS, PAGE = 64, 128, 64
DRAFTS = (1, 2)
# Programs per SM the default split count aims at (``logits_splits``): 100,864 B of shared
# memory a CTA at N 1 (117,248 at N 2; 157 / 213 registers; AOT, Triton 3.6.0) fit 2 per SM
CTAS_PER_SM = 2


# Programs per SM the default split count aims at (two waves of CTAS_PER_SM): H200, B 64 L 64K:
# 309 us at 8 splits against 352 at 4 (bench/results/indexer_sweep_h200_20261202.json)
SPLITS_PER_SM = 4


def device_ok(dev) -> bool:
    """Exactly sm_90 (wgmma) outside the CPU interpreter (Gluon kernels do not interpret)."""
    return not dev.interpret and tuple(dev.cc) == (9, 0)


def eligible(dev, k_format: str, n: int, h: int, d: int, p: int) -> bool:
    """Whether a call can run this kernel: :func:`device_ok`, an ``fp8_indexer`` cache,
    ``H_I = 64``, ``D_I = 128``, ``P = 64``, ``N`` in ``{1, 2}``."""
    return (device_ok(dev) and k_format == "fp8_indexer" and h == HEADS and d == DIMS
            and p == PAGE and n in DRAFTS)


@gluon.jit
def _order_key(x, LT: gl.constexpr):
    """``kernels.topk.triton.order_key`` in a Gluon layout: order-preserving uint32 key of
    float32 ``x``, 0 for NaN and -inf; -0.0 maps to +0.0."""
    x = gl.where(x == 0.0, 0.0, x)
    u = x.to(gl.uint32, bitcast=True)
    top = (gl.zeros_like(u) + 1) << 31                         # 0x80000000, any shape
    key = gl.where((u & top) != 0, ~u, u | top)
    ok = (x == x) & (x != float("-inf"))
    return gl.where(ok, key, gl.zeros_like(key))


@gluon.jit
def _window_base(kmax):
    """``kernels.topk.triton.window_base``: the base whose top bin holds ``kmax``."""
    return (kmax >> WINDOW_SHIFT).to(gl.int32) - (HIST_BINS - 1)


@gluon.jit
def _window_lbase(kmin):
    """``kernels.topk.triton.window_lbase``: the lower base whose bin 0 holds ``kmin``."""
    return (kmin >> WINDOW_SHIFT).to(gl.int32)


@gluon.jit
def _window_bin(key, base, lbase):
    """``kernels.topk.triton.window_bin``: ``d - base`` in the upper window (``>= UPPER_LO``),
    else ``clamp(d - lbase, 0, MID_BIN)``, ``d = key >> 20``."""
    d = (key >> WINDOW_SHIFT).to(gl.int32)
    u = d - base
    low = gl.minimum(gl.maximum(d - lbase, 0), MID_BIN)
    return gl.where(u >= UPPER_LO, gl.minimum(u, HIST_BINS - 1), low)


@gluon.jit
def _draft_len(cl_ptr, b, cap, i: gl.constexpr, N: gl.constexpr, CL_PER_DRAFT: gl.constexpr):
    """Valid-prefix length of draft ``i`` of request b (``draft_lengths`` of the Triton kernel:
    the loaded length clamped to ``[0, cap]``, ``cap`` the table's positions plus N, first)."""
    if CL_PER_DRAFT:
        n = gl.minimum(gl.maximum(gl.load(cl_ptr + b * N + i), 0), cap)
    else:
        n = gl.minimum(gl.maximum(gl.load(cl_ptr + b), 0), cap) - (N - 1 - i)
    return gl.maximum(n, 0)


@gluon.jit
def _range(cl_ptr, b, split, num_splits, max_pages, N: gl.constexpr, CL_PER_DRAFT: gl.constexpr):
    """``(len0, len1, start, end)``: the drafts' lengths and the program's page range
    ``[start, end)`` (the request's pages up to its longer draft, capped by the table, cut into
    ``num_splits`` contiguous ranges)."""
    cap = max_pages * 64 + N
    len0 = _draft_len(cl_ptr, b, cap, 0, N, CL_PER_DRAFT)
    len1 = len0
    if N == 2:
        len1 = _draft_len(cl_ptr, b, cap, 1, N, CL_PER_DRAFT)
    n_pages = gl.minimum((gl.maximum(len0, len1) + 63) // 64, max_pages)
    per = (n_pages + num_splits - 1) // num_splits
    start = split * per
    end = gl.minimum(start + per, n_pages)
    return len0, len1, start, end


@gluon.jit
def _entries(bt_row, pg0, end, num_pages, L: gl.constexpr):
    """Page of each of a step's 128 token rows (pages ``pg0``, ``pg0 + 1``) in layout ``L``, int32,
    -1 where the page is past ``end`` or its entry is not a real page."""
    t = gl.arange(0, 128, layout=L)
    pg = pg0 + t // 64
    ent = gl.load(bt_row + pg, mask=pg < end, other=-1)
    ok = (ent >= 0) & (ent < num_pages) & (pg < end)
    return gl.where(ok, ent, -1)


@gluon.jit
def _issue(k_ptr, ks_ptr, ent_r, ent_t, rw0, rw1, rsc, stride_kp, stride_sp, scale_off,
           LD: gl.constexpr, LT: gl.constexpr):
    """cp.async of one step into one ring slot: the e4m3 rows as two ``[128, 64]`` chunks
    (16-byte copies) and the per-token float32 scales; rows of a masked page (entry -1) are
    not read."""
    t = gl.arange(0, 128, layout=gl.SliceLayout(1, LD))
    dd = gl.arange(0, 64, layout=gl.SliceLayout(0, LD))
    ok = ent_r >= 0
    row = gl.where(ok, ent_r, 0).to(gl.int64) * stride_kp + (t % 64) * 128
    m = ok[:, None] & (dd[None, :] >= 0)
    _async_load(rw0, k_ptr + row[:, None] + dd[None, :], mask=m)
    _async_load(rw1, k_ptr + (row + 64)[:, None] + dd[None, :], mask=m)
    tt = gl.arange(0, 128, layout=LT)
    okt = ent_t >= 0
    sp = ks_ptr + gl.where(okt, ent_t, 0).to(gl.int64) * stride_sp + scale_off + tt % 64
    _async_load(rsc, sp, mask=okt)
    async_copy.commit_group()


@gluon.jit
def _scores(x0, x1, qd, d: gl.constexpr, MMA: gl.constexpr):
    """Issue (async) ``S = K . q_d^T`` over both 64-dim chunks, ``[128, 64]`` fp32."""
    acc = gl.zeros([128, 64], gl.float32, layout=MMA)
    acc = warpgroup_mma(x0, qd.index(2 * d).permute((1, 0)), acc, use_acc=False, is_async=True)
    return warpgroup_mma(x1, qd.index(2 * d + 1).permute((1, 0)), acc, is_async=True)


@gluon.jit
def _head_sum(acc, w, LT: gl.constexpr):
    """``sum_h w[h] * relu(acc[:, h])`` per token row, one value a thread (``LT``). ReLU keeps
    NaN (a NaN-propagating maximum, as the Triton kernel)."""
    s = gl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL) * w[None, :]
    return gl.convert_layout(gl.sum(s, axis=1), LT)


@gluon.jit
def _draft_step(acc, w, sc, page_ok, j, len_d, pg_in, out_d, hist, hbase, lbase, kmax, kmin,
                first, WRITE_HIST: gl.constexpr, HL: gl.constexpr, LT: gl.constexpr,
                hrow=None, HIST_ATOMIC: gl.constexpr = False):
    """One draft's epilogue of one step: logits stored, histogram and running key max / min
    (of the qualifying keys) updated. ``HIST_ATOMIC`` (``gluon_ws.HIST_ATOMIC``): the counts go
    to the draft's histogram block ``hrow`` (int32 ``[HIST_BINS]``, zeroed before the first
    step) as one relaxed CTA-scope atomic add a key, and ``hist`` is returned as it came, instead
    of ``gl.histogram`` (a ballot per bin bit, a popcount per bin, shared-memory atomics and two
    barriers of the warpgroup a call)."""
    logit = _head_sum(acc, w, LT) * sc
    logit = gl.where((j < len_d) & page_ok, logit, float("-inf"))
    gl.store(out_d + j, logit, mask=pg_in)
    if WRITE_HIST:
        key = _order_key(logit, LT)
        kq = gl.where(key != 0, key, ~gl.zeros_like(key))
        if first:
            hbase = _window_base(gl.max(key, axis=0)) + 32          # HIST_HEAD bins of headroom
            lbase = _window_lbase(gl.min(kq, axis=0)) - 32
        kmax = gl.maximum(kmax, key)
        kmin = gl.minimum(kmin, kq)
        if HIST_ATOMIC:
            gl.atomic_add(hrow + _window_bin(key, hbase, lbase), gl.full(key.shape, 1, gl.int32, LT),
                          mask=key != 0, sem="relaxed", scope="cta")
        else:
            hist += gl.histogram(_window_bin(key, hbase, lbase), HIST_BINS, mask=key != 0,
                                 layout=HL)
    return hist, hbase, lbase, kmax, kmin


@gluon.jit
def _hist_init(split, HL: gl.constexpr, LT: gl.constexpr):
    """One draft's histogram state before its first tile: ``(counts, upper base, lower base,
    running key max, running key min)`` (no base yet; the max starts at 0, the key of nothing,
    the min at the largest key)."""
    return (gl.zeros([HIST_BINS], gl.int32, layout=HL), split * 0 + BASE_NONE,
            split * 0 + LBASE_NONE, gl.zeros([128], gl.uint32, layout=LT),
            ~gl.zeros([128], gl.uint32, layout=LT))


@gluon.jit
def _finish_hist(out_d, len_d, start, end, hist, hbase, lbase, kmax, kmin, hb,
                 HL: gl.constexpr, LT: gl.constexpr, HIST_ATOMIC: gl.constexpr = False):
    """Recount this program's logits of one draft at the final bases when a key rose above
    the first tile's upper window or fell below its lower one
    (``kernels.indexer.triton._recount``), then store its histogram block. ``HIST_ATOMIC``: the
    counts are already in the block (:func:`_draft_step`; every consumer's atomics ordered
    before this by the caller's barriers), so only a recount stores them (over the old ones)."""
    kmx = gl.max(kmax, axis=0)
    kmn = gl.min(kmin, axis=0)
    fbase = hbase
    flbase = lbase
    if kmx != 0:
        fbase = gl.maximum(hbase, _window_base(kmx))
        flbase = gl.minimum(lbase, _window_lbase(kmn))
    if (fbase > hbase) | (flbase < lbase):
        _barrier()                       # this CTA's logit stores are visible after it
        hist = gl.zeros([HIST_BINS], gl.int32, layout=HL)
        t = gl.arange(0, 128, layout=LT)
        for j0 in range(start * 64, end * 64, 128):
            j = j0 + t
            x = gl.load(out_d + j, mask=(j < end * 64) & (j < len_d), other=float("-inf"))
            key = _order_key(x, LT)
            hist += gl.histogram(_window_bin(key, fbase, flbase), HIST_BINS, mask=key != 0,
                                 layout=HL)
        hbase = fbase
        lbase = flbase
        if HIST_ATOMIC:
            gl.store(hb + gl.arange(0, HIST_BINS, layout=HL), hist)
    if not HIST_ATOMIC:
        gl.store(hb + gl.arange(0, HIST_BINS, layout=HL), hist)
    gl.store(hb + HIST_BINS, hbase)
    gl.store(hb + (HIST_BINS + 1), lbase)


@gluon.jit
def _indexer_logits_gluon_kernel(
    q_ptr,            # [B, N, 64, 128] e4m3, strides stride_q*; last dim contiguous
    w_ptr,            # [B, N, 64] float32
    k_ptr,            # e4m3 view of the fp8_indexer cache [num_pages, 64 * 132]
    ks_ptr,           # float32 view of the same storage [num_pages, 64 * 132 / 4]
    bt_ptr,           # [B, max_pages] int32
    cl_ptr,           # [B] or [B, N] int32
    out_ptr,          # [B, N, W] float32
    hist_ptr,         # [B, S, N, HIST_ROW] int32 (WRITE_HIST)
    num_pages, max_pages,
    stride_qb, stride_qn, stride_qh,
    stride_wb, stride_wn,
    stride_kp, stride_sp, scale_off,
    stride_bt,
    stride_ob, stride_on,
    N: gl.constexpr, CL_PER_DRAFT: gl.constexpr, WRITE_HIST: gl.constexpr,
):
    gl.static_assert((N == 1) | (N == 2), "N (next_n) 1 or 2")
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])     # [128, 64] bytes
    LQ: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])     # [64, 64] q bytes
    LT: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])                  # [128] one a thread
    HL: gl.constexpr = gl.BlockedLayout([2], [32], [4], [0])                  # [256] bins
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    b = gl.program_id(0).to(gl.int64)
    split = gl.program_id(1)
    num_splits = gl.num_programs(1)

    len0, len1, start, end = _range(cl_ptr, b, split, num_splits, max_pages, N, CL_PER_DRAFT)

    # q once: fp16 [64 heads, 64 dims] chunks, index 2 * draft + chunk
    qd = gl.allocate_shared_memory(gl.float16, [2 * N, 64, 64], SH)
    hq = gl.arange(0, 64, layout=gl.SliceLayout(1, LQ))
    dq = gl.arange(0, 64, layout=gl.SliceLayout(0, LQ))
    for i in gl.static_range(N):
        q_row = q_ptr + b * stride_qb + i * stride_qn + hq[:, None] * stride_qh + dq[None, :]
        for c in gl.static_range(2):
            qb = gl.load(q_row + c * 64)
            qd.index(2 * i + c).store(qb.to(gl.float16))
    hw = gl.arange(0, 64, layout=gl.SliceLayout(0, MMA))
    w0 = gl.load(w_ptr + b * stride_wb + hw)
    w1 = w0
    if N == 2:
        w1 = gl.load(w_ptr + b * stride_wb + stride_wn + hw)

    x0 = gl.allocate_shared_memory(gl.float16, [128, 64], SH)
    x1 = gl.allocate_shared_memory(gl.float16, [128, 64], SH)
    # the cp.async ring: raw e4m3 chunks and scales of NSTAGE steps (64-byte rows, unswizzled:
    # a quarter-warp's 16-byte accesses cover two whole rows, no bank conflict)
    RAW: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    RSC: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    rw0 = gl.allocate_shared_memory(gl.float8e4nv, [NSTAGE, 128, 64], RAW)
    rw1 = gl.allocate_shared_memory(gl.float8e4nv, [NSTAGE, 128, 64], RAW)
    rsc = gl.allocate_shared_memory(gl.float32, [NSTAGE, 128], RSC)

    t = gl.arange(0, 128, layout=LT)
    out0 = out_ptr + b * stride_ob
    out1 = out0 + stride_on
    h0, base0, lb0, km0, kn0 = _hist_init(split, HL, LT)
    h1, base1, lb1, km1, kn1 = h0, base0, lb0, km0, kn0

    # prologue: steps 0 .. NSTAGE - 2 in flight, the entries of step NSTAGE - 1 in registers
    bt_row = bt_ptr + b * stride_bt
    ROWS: gl.constexpr = gl.SliceLayout(1, LD)
    for i in gl.static_range(NSTAGE - 1):
        _issue(k_ptr, ks_ptr, _entries(bt_row, start + 2 * i, end, num_pages, ROWS),
               _entries(bt_row, start + 2 * i, end, num_pages, LT), rw0.index(i), rw1.index(i),
               rsc.index(i), stride_kp, stride_sp, scale_off, LD, LT)
    e_r = _entries(bt_row, start + 2 * (NSTAGE - 1), end, num_pages, ROWS)
    e_t = _entries(bt_row, start + 2 * (NSTAGE - 1), end, num_pages, LT)
    for pg0 in range(start, end, 2):
        step = (pg0 - start) // 2
        # step + NSTAGE - 1 into the slot step - 1 used (read before the last barrier), then
        # this step's copies waited for (this thread's) and made visible (the barrier)
        nslot = (step + NSTAGE - 1) % NSTAGE
        _issue(k_ptr, ks_ptr, e_r, e_t, rw0.index(nslot), rw1.index(nslot), rsc.index(nslot),
               stride_kp, stride_sp, scale_off, LD, LT)
        e_r = _entries(bt_row, pg0 + 2 * NSTAGE, end, num_pages, ROWS)
        e_t = _entries(bt_row, pg0 + 2 * NSTAGE, end, num_pages, LT)
        async_copy.wait_group(NSTAGE - 1)
        _barrier()
        slot = step % NSTAGE
        x0.store(rw0.index(slot).load(LD).to(gl.float16))
        x1.store(rw1.index(slot).load(LD).to(gl.float16))
        sc = rsc.index(slot).load(LT)
        fence_async_shared()
        _barrier()
        j = pg0 * 64 + t
        pg_in = j < end * 64
        page_ok = _entries(bt_row, pg0, end, num_pages, LT) >= 0
        first = pg0 == start
        # one draft at a time: one [128, 64] accumulator live (two spill at N 2)
        a0 = warpgroup_mma_wait(num_outstanding=0, deps=(_scores(x0, x1, qd, 0, MMA),))
        h0, base0, lb0, km0, kn0 = _draft_step(a0, w0, sc, page_ok, j, len0, pg_in, out0, h0,
                                               base0, lb0, km0, kn0, first, WRITE_HIST, HL, LT)
        if N == 2:
            a1 = warpgroup_mma_wait(num_outstanding=0, deps=(_scores(x0, x1, qd, 1, MMA),))
            h1, base1, lb1, km1, kn1 = _draft_step(a1, w1, sc, page_ok, j, len1, pg_in, out1,
                                                   h1, base1, lb1, km1, kn1, first, WRITE_HIST,
                                                   HL, LT)
    async_copy.wait_group(0)
    if WRITE_HIST:
        hb = hist_ptr + (b * num_splits + split) * (N * HIST_ROW)
        _finish_hist(out0, len0, start, end, h0, base0, lb0, km0, kn0, hb, HL, LT)
        if N == 2:
            _finish_hist(out1, len1, start, end, h1, base1, lb1, km1, kn1, hb + HIST_ROW, HL,
                         LT)


def launch(q, weights, k_vals, k_scales, block_table, context_lens, out, hist, splits: int):
    """Launch :func:`_indexer_logits_gluon_kernel` on validated tensors (:func:`eligible` true):
    the arguments of ``kernels.indexer.triton.launch_indexer_logits`` (q e4m3, ``k_vals`` the
    cache's e4m3 view, ``k_scales`` its float32 view), ``splits`` programs a request (``hist``
    sized for it, or None)."""
    from kernels import layouts
    B, N, H, D = q.shape
    lay = layouts.fp8_indexer(D)
    _indexer_logits_gluon_kernel[(B, splits)](
        q, weights, k_vals, k_scales, block_table, context_lens, out,
        hist if hist is not None else out,
        k_vals.shape[0], block_table.shape[1],
        q.stride(0), q.stride(1), q.stride(2),
        weights.stride(0), weights.stride(1),
        k_vals.stride(0), k_scales.stride(0), lay.scale_offset(PAGE, 0) // lay.scale.nbytes,
        block_table.stride(0),
        out.stride(0), out.stride(1),
        N=N, CL_PER_DRAFT=context_lens.dim() == 2, WRITE_HIST=hist is not None,
        num_warps=NUM_WARPS,
    )
    return out
