"""Sparse MLA decode for few heads (H <= 16 a program) on sm_90 in Gluon, warp-specialised: one
producer converts row blocks, two consumer warpgroups take alternate blocks.

Semantics, arguments and outputs are those of ``kernels.sparse_mla.gluon_small`` (the same kernel
signature, so the launcher, the split count rule and the Triton combine are shared): fp8 caches
(``fp8_ds_mla``, ``fp8_model1``), 16-bit q, rows on wgmma M and ``HN`` heads on N, each 64-row
block dequantized once into fp16 in the program's running power-of-two unit (the same unit
sequence: the largest valid scale exponent of each block minus 6, never decreasing), q nope
scaled per head by a power of two into fp16, the rope dot in the rope's dtype, fp16 p
(``fp8_model1``'s rope values: p in the rope's dtype plus its bf16 residual); split-K partials
(normalised fp32 out, log2-domain LSE) or, with one split, the final output.

Why (bench/NOTES.md, "What the next GPU session measures first", item 5): the one-partition
few-heads kernel runs its block chain (gather, conversion, score dots, softmax, value dots) in
one warpgroup, two CTAs an SM; neither 16 warps an SM (seventh session) nor a second X buffer at
one CTA an SM (eighth) overlapped the conversion with the dots. Here the conversion leaves the
consumers' chain and two consumers' chains overlap each other:

* **Work.** One program: ``HN`` heads of one (request, draft) over one split of its top-k list,
  grid ``(ceil(H / HN), splits, B * N)``, as ``gluon_small.py``. 16 warps in three partitions
  (``gl.warp_specialize``): consumer 0 (the default partition, 4 warps), consumer 1 (a worker
  partition, 4 warps, ``CONSUMER_REGS``) and the producer (a worker partition of 8 warps,
  ``PRODUCER_REGS``).
* **Producer.** ``gluon_ws._ws_producer`` unchanged (the heads do not enter it): per 64-row block
  the slots resolved two blocks ahead, the block's loads issued before it waits on
  ``empty[slot]``, the unit, the conversion into one X slot of an ``NBUF``-deep ring with the
  row validity and the unit beside it, ``fence_async_shared``, a partition barrier,
  ``mbarrier.arrive(full[slot])``. Or (``STAGE`` 1, :data:`RAW_STAGE`; measured 2026-12-06 on an
  H100, off: a tie at V4 H 8, 6 % slower at V3.2 H 16) :func:`_staged_producer`: block j + 1's raw bytes are copied into a shared
  staging slot by ``cp.async`` while block j converts (its hand-over ``gluon_ws._ws_fill``, the
  same as ``_ws_producer``'s); consumer 1's merge state then lives in its own X slot.
* **Consumers.** Block j of the split goes to consumer ``j % 2`` (slot ``j % NBUF``). Consumer 0
  stores q once into shared memory (fp16 nope chunks scaled per head by a power of two, the
  rope chunk in its dtype), fences it to the async proxy and arrives on ``qbar``; consumer 1
  computes the same per-head scales from q (``_q_scale``) and waits on ``qbar``. Then per block:
  ``mbarrier.wait(full)``, ``S^T = X . q^T`` (``gluon_small._scores_t``), the online softmax along
  the rows per head with its own m, l and unit (``_softmax_t``), P^T into its own shared buffer
  and ``O^T_c += X_c^T . P^T`` (``_values_t``), the wait on the value dots, a partition barrier,
  ``mbarrier.arrive(empty)``. Each holds its own fp32 O^T: 512 x HN / 128 = 64 registers a
  thread at HN 16.
* **Merge.** Consumer 1 stores O^T (8 chunks), m, l and its unit into shared memory, then a
  partition barrier and ``mbarrier.arrive(done)``; consumer 0 waits on ``done`` and merges as the
  split-K combine merges splits: ``m = max(m0, m1)``, ``a_c = 2^(m_c - m)``, the nope chunks
  brought from each consumer's unit to the larger one (``2^(ub_c - ub)``), ``l = a0 l0 + a1 l1``,
  then ``gluon_small``'s epilogue. A consumer that got no block contributes m = -1e30, l = 0,
  O = 0 (``a_c`` = 0). ``done`` and ``qbar`` are invalidated after their one phase, once a
  partition barrier shows every waiting thread past its wait. Same numerics as two splits of interleaved blocks: within
  SPEC tolerance, not bitwise ``gluon_small.py``'s.
* **Shared memory** (``NBUF`` 2; AOT, Triton 3.6.0): X 2 x 73,728 B + q + P^T (fp16, rope hi /
  lo, one each a consumer) + the merge's O^T (32,768 B at HN 16) + row words and barriers:
  208,424 B at HN 16 (fp8_ds_mla), 163,144-178,504 at HN 8: one CTA an SM. Registers
  (setmaxnreg): consumers 184, producer 72 (16 warps x 128); no spill in any consumer loop.
  With ``STAGE`` 1: + the 41,984-byte staging slot - the merge's O^T: 217,744 B at HN 16
  (fp8_ds_mla), 200,592-219,280 B in all; the producer loop reloads 4-6 spilled words.

Only sm_90 (wgmma, setmaxnreg), never in the CPU interpreter (Gluon kernels do not interpret).
The launcher runs it for a config whose ``kernel`` is ``"gluon_shws"``: the 8-head config
(``configs.SPARSE_MLA_GLUON_SHWS8``) is in the sm_90 space and picked for ``fp8_model1`` up to 8
heads (H200, 2026-12-05: 24/24 GPU tests, 138/138 reference checks; V4 B 64 H 8 22.3 us against
28.7 for ``gluon_small.py``); the 16-head config (``configs.SPARSE_MLA_GLUON_SHWS16``) is picked
for ``fp8_ds_mla`` at 9..16 heads since the producer's L2 hint (H100, 2026-12-06: V3.2 B 64 H 16
61.6 us against 70.8 for ``gluon_small.py``; 69.1 without the hint).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma_wait)

from kernels.sparse_mla.gluon import (NEG, _alloc_x, _barrier, _l2_prefetch_rows, _max_exp,
                                      _list_range, _pipeline_start, _program, _q_exponent,
                                      _q_rows, _resolve, _rope_ptrs, _row_base, _scale_word,
                                      _store_q_scaled, _unit_of, _views)
from kernels.sparse_mla.gluon_small import _epilogue_t, _scores_t, _softmax_t, _values_t
from kernels.sparse_mla.gluon_ws import (PRODUCER_WARPS, _async_load, _producer_list,
                                         _ws_fill, _ws_producer)
from kernels.sparse_mla.triton import _page_entries, _pow2

NUM_WARPS = 4            # consumer 0 (the default partition): one warpgroup
CONSUMER_WARPS = gl.constexpr(4)
# the producer's setmaxnreg: no spill in its loop (at gluon_ws.py's 56 it reloaded 14 words, at 64 six)
PRODUCER_REGS = 72
CONSUMER_REGS = 184      # consumer 1's: 16 warps x 128 = 4 x 184 + 4 x 184 + 8 x 72


# the producer (gluon_ws._ws_producer) hints the next row block into L2 (``gluon_ws.L2_PREFETCH``;
# read at each launch, so bench.mla_sweep can time both: its ``--l2-hint`` mode). On since
# 2026-12-06 (seventeenth session; H100, bench/results/mla_sweep_l2hint_h100_20261206.json and
# mla_sweep_small_heads_h100_20261206.json, CUDA-graph timed over rotated block-table sets,
# checked against the reference): V4 B 64 H 8 fp8_model1 23.9 -> 22.9-23.0 us (8-head config);
# V3.2 B 64 H 16 fp8_ds_mla 16-head config 69.1 -> 61.6 (gluon_small.py: 70.8)
L2_PREFETCH = 1
# ... for these cache formats. fp8_model1 was held back from 2026-12-06 (seventeenth session): the
# H100's gluon_check stopped at its fp8_model1 H 5 K 300 3-split case (8-head config, one request
# of top-k length 0) when the child's 80 s limit ran out. Eighteenth session (H100, 2026-12-06): that
# case passes with the hint off and on, 1 and 3 splits (docs/logs/probe_shws_h5_h100_20261206.log),
# and gluon_check --kernels gluon_shws with the hint on for both formats passes 138 / 138
# (bench/results/gluon_check_shws_hint_h100_20261206.json): the stop was the time limit, not a hang
L2_PREFETCH_FORMATS: tuple = ("fp8_ds_mla", "fp8_model1")
# the producer's raw staging slot (constexpr ``STAGE``, read at each launch, so bench.mla_sweep and
# bench.gluon_check time both): 1 = the staged producer (:func:`_staged_producer`): block j + 1's
# raw bytes are copied global -> shared by ``cp.async`` while block j converts, so a block costs
# max(gather round trip, conversion) instead of their sum (bench/NOTES.md, eighteenth session);
# the 41,984-byte (fp8_ds_mla; 37,376 fp8_model1) slot is paid for by placing consumer 1's merge
# state in its own X slot, dead by then. 0 = ``gluon_ws._ws_producer`` (gathers into registers at
# the top of each block's iteration). Measured (H100, 2026-12-06, bench/NOTES.md "Nineteenth
# session"; mla_sweep_small_heads_staged{,2}_h100_20261206.json, checked against the reference):
# V3.2 B 64 H 16 60.9 us with 0, 64.4 with 1 (73.2 before the unit moved inside each warp,
# :func:`_staged_unit`); V4 B 64 H 8 23.1 / 22.8. The round trip is hidden, but issuing the
# copies (112 LDGSTS warp instructions a block, MIO-throttled) costs as much as it saved
RAW_STAGE = 0


def launch_constexprs(kv_format: str | None = None) -> dict:
    """The constexprs beyond the shared Gluon ones the launcher and the AOT specs pass for a cache
    of ``kv_format``: the partitions' register budgets, the producer's L2 hint
    (:data:`L2_PREFETCH` for the formats of :data:`L2_PREFETCH_FORMATS`, else 0) and its raw
    staging slot (:data:`RAW_STAGE`)."""
    hint = L2_PREFETCH if kv_format in L2_PREFETCH_FORMATS else 0
    return dict(PRODUCER_REGS=PRODUCER_REGS, CONSUMER_REGS=CONSUMER_REGS, L2_PREFETCH=hint,
                STAGE=RAW_STAGE)


@gluon.jit
def _alloc_raw(KV_FORMAT: gl.constexpr):
    """The staging slot of one raw row block (:func:`_stage_rows`), one buffer a copy: eight
    [64, 64] uint8 nope chunks (fp8_model1 uses seven), the [64, 64] int16 rope bits and four
    [64] int32 scale words (fp8_model1 uses two): 41,984 bytes."""
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    META: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    return (gl.allocate_shared_memory(gl.uint8, [64, 64], FLAT),
            gl.allocate_shared_memory(gl.uint8, [64, 64], FLAT),
            gl.allocate_shared_memory(gl.uint8, [64, 64], FLAT),
            gl.allocate_shared_memory(gl.uint8, [64, 64], FLAT),
            gl.allocate_shared_memory(gl.uint8, [64, 64], FLAT),
            gl.allocate_shared_memory(gl.uint8, [64, 64], FLAT),
            gl.allocate_shared_memory(gl.uint8, [64, 64], FLAT),
            gl.allocate_shared_memory(gl.uint8, [64, 64], FLAT),
            gl.allocate_shared_memory(gl.int16, [64, 64], FLAT),
            gl.allocate_shared_memory(gl.int32, [64], META),
            gl.allocate_shared_memory(gl.int32, [64], META),
            gl.allocate_shared_memory(gl.int32, [64], META),
            gl.allocate_shared_memory(gl.int32, [64], META))


@gluon.jit
def _stage_rows(kv_ptr, kv16_ptr, kv32_ptr, rn0, rn1, rn2, rn3, rn4, rn5, rn6, rn7, rr,
                rs0, rs1, rs2, rs3, pg, of, ok, page_size, page_bytes, KV_FORMAT: gl.constexpr,
                LD: gl.constexpr, LD16: gl.constexpr):
    """Copy one 64-row block's raw bytes global -> shared (``cp.async``, one commit group) into
    the staging slot: the ``NC`` e4m3 nope chunks ``rn0..`` ([64, 64] uint8 each, 16 bytes a
    thread), the bf16 rope bits ``rr`` ([64, 64] int16, two 16-byte copies a thread; where
    ``gluon._load_rope`` reads them, :func:`gluon._rope_ptrs`) and the scale words ``rs0..``
    ([64] int32 each from :func:`gluon._scale_word`: ds_mla's 4 float32 inside the row, model1's
    two ue8m0 words in the page tail; 4 bytes a copy). One
    buffer a copy: the compiler's barrier analysis treats two views of one buffer as overlapping
    and would put a partition barrier between their copies. Rows with ``ok`` false are
    zero-filled and their source never read."""
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    base = _row_base(pg, of, page_bytes, KV_FORMAT)
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, LD))
    src = kv_ptr + base[:, None] + d[None, :]
    m = ok[:, None] & (d[None, :] >= 0)          # constant along a row: 16-byte vectors
    _async_load(rn0, src, mask=m)
    _async_load(rn1, src + 64, mask=m)
    _async_load(rn2, src + 128, mask=m)
    _async_load(rn3, src + 192, mask=m)
    _async_load(rn4, src + 256, mask=m)
    _async_load(rn5, src + 320, mask=m)
    _async_load(rn6, src + 384, mask=m)
    if NC == 8:
        _async_load(rn7, src + 448, mask=m)
    rope_ptrs, rope_m = _rope_ptrs(kv16_ptr, base, ok, KV_FORMAT, LD16)
    _async_load(rr, rope_ptrs, mask=rope_m)
    w = _scale_word(pg, of, base, page_size, page_bytes, KV_FORMAT)
    _async_load(rs0, kv32_ptr + w, mask=ok)
    _async_load(rs1, kv32_ptr + w + 1, mask=ok)
    if KV_FORMAT == 1:
        _async_load(rs2, kv32_ptr + w + 2, mask=ok)
        _async_load(rs3, kv32_ptr + w + 3, mask=ok)
    async_copy.commit_group()


@gluon.jit
def _read_scale_words(rs0, rs1, rs2, rs3, LAYOUT: gl.constexpr, KV_FORMAT: gl.constexpr):
    """The staging slot's scale words in ``LAYOUT`` (``gluon._load_scales``'s four, model1's
    two repeated)."""
    w0 = rs0.load(LAYOUT)
    w1 = rs1.load(LAYOUT)
    if KV_FORMAT == 1:
        w2 = rs2.load(LAYOUT)
        w3 = rs3.load(LAYOUT)
    else:
        w2 = w0
        w3 = w1
    return w0, w1, w2, w3


@gluon.jit
def _staged_unit(rs0, rs1, rs2, rs3, ub_i, KV_FORMAT: gl.constexpr):
    """``gluon._block_unit`` of the row block in the staging slot, read from its scale words
    ``rs0..`` in a [64] layout replicated over the partition's warps (two rows a lane, every warp
    all 64), so the maximum is a reduction inside each warp: no shared-memory exchange and no
    partition barrier, where ``_block_unit`` on the rows' own layout (8 rows a warp) needs both.
    The copies zero-fill masked rows (scale word 0: exponent field 0), so no validity mask is
    needed: the same unit as ``_block_unit(c0, c1, c2, c3, ok, ub_i)``."""
    REP: gl.constexpr = gl.BlockedLayout([2], [32], [gl.num_warps()], [0])
    w0, w1, w2, w3 = _read_scale_words(rs0, rs1, rs2, rs3, REP, KV_FORMAT)
    return _unit_of(gl.max(_max_exp(w0, w1, w2, w3, KV_FORMAT), axis=0), ub_i)


@gluon.jit
def _staged_producer(kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                     x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                     rn0, rn1, rn2, rn3, rn4, rn5, rn6, rn7, rr, rs0, rs1, rs2, rs3,
                     si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                     page_bytes, chunk, KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr,
                     HAS_TKL: gl.constexpr, ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr,
                     L2_PREFETCH: gl.constexpr = 0):
    """The staged producer (:data:`RAW_STAGE` 1; 8 warps). Per 64-row block j: wait for its raw
    bytes in the staging slot (``cp.async.wait_group 0``, a partition barrier: every thread's
    copies), read them into registers (as ``gluon_ws._ws_producer`` gathers them) and take the
    block's unit (:func:`_staged_unit`), a partition barrier (every read done), then issue block
    j + 1's copies into the slot, so they are in flight while ``empty`` is awaited and block j
    converted into its X slot (fence, partition barrier, ``full``, as ``_ws_producer``). With ``L2_PREFETCH`` block
    j + 2's rows are hinted into L2 as j + 1's copies go out. The slot chain runs one block
    further ahead than ``_ws_producer``'s: indices three blocks ahead, page entries two, slots
    one."""
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    LD16: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, LD)

    start, end, idx_row, bt_row = _producer_list(idx_ptr, bt_ptr, tkl_ptr, N, K, si_b, si_n,
                                                 sbt_b, chunk, HAS_TKL)
    ar = gl.arange(0, 64, layout=ROW)
    i2, pg0, of0, ok0, pg, of, ok = _pipeline_start(idx_row, bt_row, start, end, ar, num_slots,
                                                    num_pages, max_pages, page_size, HAS_BT)
    _stage_rows(kv_ptr, kv16_ptr, kv32_ptr, rn0, rn1, rn2, rn3, rn4, rn5, rn6, rn7, rr,
                rs0, rs1, rs2, rs3, pg0, of0, ok0, page_size, page_bytes, KV_FORMAT, LD, LD16)
    ok_j = ok0                              # block j's row validity; pg, of, ok: block j + 1's
    in2 = start + 128 + ar < end
    e2 = _page_entries(bt_row, i2, in2, max_pages, page_size, HAS_BT)
    ub_i = start * 0 + 1

    for k0 in range(start, end, 64):
        j = (k0 - start) // 64
        buf = j % NBUF
        phase = (j // NBUF) & 1
        in3 = k0 + 192 + ar < end
        i3 = gl.load(idx_row + k0 + 192 + ar, mask=in3, other=-1)
        async_copy.wait_group(0)          # this thread's copies of block j have landed
        _barrier()                        # ... and every producer thread's
        r0 = rn0.load(LD)
        r1 = rn1.load(LD)
        r2 = rn2.load(LD)
        r3 = rn3.load(LD)
        r4 = rn4.load(LD)
        r5 = rn5.load(LD)
        r6 = rn6.load(LD)
        if NC == 8:
            r7 = rn7.load(LD)
        else:
            r7 = r6
        rope = rr.load(LD16)
        c0, c1, c2, c3 = _read_scale_words(rs0, rs1, rs2, rs3, ROW, KV_FORMAT)
        # the block's unit from all 64 rows' scale words, each warp reading them all (a layout
        # replicated over the warps): a reduction inside each warp, no partition barrier
        ub = _staged_unit(rs0, rs1, rs2, rs3, ub_i, KV_FORMAT)
        _barrier()                        # every thread's reads of the slot are done
        _stage_rows(kv_ptr, kv16_ptr, kv32_ptr, rn0, rn1, rn2, rn3, rn4, rn5, rn6, rn7, rr,
                    rs0, rs1, rs2, rs3, pg, of, ok, page_size, page_bytes, KV_FORMAT, LD,
                    LD16)                 # block j + 1, in flight while block j converts
        pg2, of2, ok2 = _resolve(i2, e2, in2, num_slots, num_pages, max_pages, page_size, HAS_BT)
        if L2_PREFETCH == 1:              # block j + 2's rows into L2
            _l2_prefetch_rows(kv_ptr, pg2, of2, ok2, page_size, page_bytes, KV_FORMAT, 64)
        _ws_fill(x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty, buf, phase,
                 r0, r1, r2, r3, r4, r5, r6, r7, rope, c0, c1, c2, c3, ok_j, ub, KV_FORMAT,
                 ROPE_DTYPE, ROW)
        ub_i = ub
        ok_j = ok
        pg, of, ok = pg2, of2, ok2
        e2 = _page_entries(bt_row, i3, in3, max_pages, page_size, HAS_BT)
        i2 = i3
        in2 = in3
    async_copy.wait_group(0)                  # the copies past the list (zero-fill) drained


@gluon.jit
def _shws_producer(kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                   x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                   rn0, rn1, rn2, rn3, rn4, rn5, rn6, rn7, rr, rs0, rs1, rs2, rs3,
                   si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                   page_bytes, chunk, KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr,
                   HAS_TKL: gl.constexpr, ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr,
                   L2_PREFETCH: gl.constexpr, STAGE: gl.constexpr):
    """The producer partition: :func:`_staged_producer` (``STAGE`` 1) or
    ``gluon_ws._ws_producer``."""
    if STAGE:
        _staged_producer(kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                         x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                         rn0, rn1, rn2, rn3, rn4, rn5, rn6, rn7, rr, rs0, rs1, rs2, rs3,
                         si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                         page_bytes, chunk, KV_FORMAT, HAS_BT, HAS_TKL, ROPE_DTYPE, NBUF,
                         L2_PREFETCH)
    else:
        _ws_producer(kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                     x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                     si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                     page_bytes, chunk, KV_FORMAT, HAS_BT, HAS_TKL, ROPE_DTYPE, NBUF,
                     L2_PREFETCH)


@gluon.jit
def _q_scale(q_row, qmask, NC: gl.constexpr, LDQ: gl.constexpr, MCOL: gl.constexpr,
             HN: gl.constexpr):
    """The per-head 2^-t of ``gluon._store_q_scaled`` (the same exponent, nothing stored), in
    the accumulator's head layout ``MCOL``."""
    return gl.convert_layout(_pow2(254 - _q_exponent(q_row, qmask, NC, LDQ, HN)), MCOL)


@gluon.jit
def _merge_buf(mo, xc, C: gl.constexpr, HN: gl.constexpr, ALIAS: gl.constexpr):
    """Consumer 1's O^T chunk ``C`` for the merge ([64, HN] float32): ``mo.index(C)``, or with
    ``ALIAS`` (the staged producer's kernel) the start of chunk ``C``'s X slot 1 (``xc``), which
    only consumer 1's blocks use (NBUF 2: blocks 1, 3, ...) and which is dead once its last value
    dots have completed (8,192 bytes a slot; 4,096 at HN 16). This rests on one tile a program and
    on blocks dealt ``j % 2``: consumer 0's read of it after ``done`` is not ordered by ``empty[1]``,
    so a persistent variant or another dealing of the blocks must give it its own buffer again."""
    if ALIAS:
        FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        v = xc.index(1)._reinterpret(gl.float32, [64, HN], FLAT)
    else:
        v = mo.index(C)
    return v


@gluon.jit
def _shws_consumer(q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                   qn, qr, pt, pth, ptl, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s,
                   full, empty, mo, ml, ubm, done, qbar,
                   sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                   KV_FORMAT: gl.constexpr, HAS_TKL: gl.constexpr, HAS_SINK: gl.constexpr,
                   FINAL: gl.constexpr, ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr,
                   HN: gl.constexpr, C: gl.constexpr, ALIAS: gl.constexpr = 0):
    """Consumer ``C`` (0: the default partition, which merges and stores; 1: a worker that hands
    its state to consumer 0): blocks ``C, C + 2, ...`` of the program's split. ``ALIAS``: consumer
    1's O^T goes into its own X slot (:func:`_merge_buf`)."""
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    ROPE_IN_V: gl.constexpr = KV_FORMAT == 2
    R_SPLIT: gl.constexpr = ROPE_DTYPE == gl.bfloat16
    LDQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, HN, 16])
    MROW: gl.constexpr = gl.SliceLayout(1, MMA)
    MCOL: gl.constexpr = gl.SliceLayout(0, MMA)
    OUT: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])

    pid_h, pid_s, pid_bn, nbn, b, n = _program(N)

    # ---- q^T: consumer 0 stores it (fence, partition barrier, arrive on qbar: the producer's
    # protocol for X); consumer 1 computes the same per-head scales and waits for the store
    q_row, qmask = _q_rows(q_ptr, pid_h, b, n, H, sq_b, sq_n, sq_h, LDQ, HN)
    if C == 0:
        q_inv = _store_q_scaled(q_row, qmask, qn, qr.index(0), NC, ROPE_DTYPE, LDQ, MCOL, HN)
        fence_async_shared()
        _barrier()
        mbarrier.arrive(qbar)
    else:
        q_inv = _q_scale(q_row, qmask, NC, LDQ, MCOL, HN)
        mbarrier.wait(qbar, 0)
        _barrier()                  # every consumer-1 thread is past its wait, then
        mbarrier.invalidate(qbar)   # never used again

    start, end = _list_range(tkl_ptr, b, K, pid_s, chunk, HAS_TKL)

    m_i = gl.full([HN], NEG, gl.float32, layout=MCOL)
    l_i = gl.zeros([HN], gl.float32, layout=MCOL)
    ub_i = pid_h * 0 + 1
    zero = gl.zeros([64, HN], gl.float32, layout=MMA)
    o0, o1, o2, o3, o4, o5, o6, o7 = zero, zero, zero, zero, zero, zero, zero, zero
    pc = pt.index(C)
    phc = pth.index(C)
    plc = ptl.index(C)

    for k0 in range(start + C * 64, end, 128):
        j = (k0 - start) // 64
        buf = j % NBUF
        phase = (j // NBUF) & 1
        # 0, but not provably so: the q descriptors are built in the loop (gluon_small.py)
        oz = (k0 >> 31) & 1
        mbarrier.wait(full.index(buf), phase)            # the producer has filled this slot
        y0, y1, y2, y3, y4, y5, y6, y7, yr = _views(x0, x1, x2, x3, x4, x5, x6, x7, xr, buf)
        s, r = _scores_t(qn, qr, y0, y1, y2, y3, y4, y5, y6, y7, yr, oz, NC, HN, MMA)
        okr = ok_s.index(buf).load(MROW) != 0
        ub = gl.max(ub_s.index(buf).load(MROW), axis=0)  # the block's unit (one value a row)
        p, alpha, an, m_i, l_i = _softmax_t(s, r, okr, q_inv, ub, ub_i, m_i, l_i, qk_scale_log2)
        ub_i = ub
        o0, o1, o2, o3, o4, o5, o6, o7 = _values_t(
            o0, o1, o2, o3, o4, o5, o6, o7, p, alpha, an, y0, y1, y2, y3, y4, y5, y6, y7, yr,
            pc, phc, plc, ROPE_IN_V, R_SPLIT, ROPE_DTYPE)
        o0, o1, o2, o3, o4, o5, o6, o7 = warpgroup_mma_wait(
            num_outstanding=0, deps=(o0, o1, o2, o3, o4, o5, o6, o7))
        _barrier()              # every warp's dots have read the slot (one arriving thread)
        mbarrier.arrive(empty.index(buf))                # the slot may be refilled

    if C == 1:
        # ---- hand the state to consumer 0 (generic stores and loads: no proxy fence)
        _merge_buf(mo, x0, 0, HN, ALIAS).store(o0)
        _merge_buf(mo, x1, 1, HN, ALIAS).store(o1)
        _merge_buf(mo, x2, 2, HN, ALIAS).store(o2)
        _merge_buf(mo, x3, 3, HN, ALIAS).store(o3)
        _merge_buf(mo, x4, 4, HN, ALIAS).store(o4)
        _merge_buf(mo, x5, 5, HN, ALIAS).store(o5)
        _merge_buf(mo, x6, 6, HN, ALIAS).store(o6)
        _merge_buf(mo, x7, 7, HN, ALIAS).store(o7)
        ml.index(0).store(m_i)
        ml.index(1).store(l_i)
        ubm.store(gl.full([HN], 0, gl.int32, layout=MCOL) + ub_i)
        _barrier()              # every consumer-1 thread has stored
        mbarrier.arrive(done)
    else:
        # ---- merge consumer 1's state (as the combine merges splits), then the epilogue
        mbarrier.wait(done, 0)
        _barrier()                  # every consumer-0 thread is past its wait, then
        mbarrier.invalidate(done)   # never used again
        m1 = ml.index(0).load(MCOL)
        l1 = ml.index(1).load(MCOL)
        ub1 = gl.max(ubm.load(MCOL), axis=0)
        m = gl.maximum(m_i, m1)
        a0 = gl.exp2(m_i - m)
        a1 = gl.exp2(m1 - m)
        ub = gl.maximum(ub_i, ub1)
        f0 = a0 * _pow2(gl.maximum(ub_i - ub + 127, 1))    # nope chunks: to the larger unit
        f1 = a1 * _pow2(gl.maximum(ub1 - ub + 127, 1))
        o0 = o0 * f0[None, :] + _merge_buf(mo, x0, 0, HN, ALIAS).load(MMA) * f1[None, :]
        o1 = o1 * f0[None, :] + _merge_buf(mo, x1, 1, HN, ALIAS).load(MMA) * f1[None, :]
        o2 = o2 * f0[None, :] + _merge_buf(mo, x2, 2, HN, ALIAS).load(MMA) * f1[None, :]
        o3 = o3 * f0[None, :] + _merge_buf(mo, x3, 3, HN, ALIAS).load(MMA) * f1[None, :]
        o4 = o4 * f0[None, :] + _merge_buf(mo, x4, 4, HN, ALIAS).load(MMA) * f1[None, :]
        o5 = o5 * f0[None, :] + _merge_buf(mo, x5, 5, HN, ALIAS).load(MMA) * f1[None, :]
        o6 = o6 * f0[None, :] + _merge_buf(mo, x6, 6, HN, ALIAS).load(MMA) * f1[None, :]
        if ROPE_IN_V:           # model1's rope values are in true units (gluon_small._values_t)
            o7 = o7 * a0[None, :] + _merge_buf(mo, x7, 7, HN, ALIAS).load(MMA) * a1[None, :]
        else:
            o7 = o7 * f0[None, :] + _merge_buf(mo, x7, 7, HN, ALIAS).load(MMA) * f1[None, :]
        l_i = l_i * a0 + l1 * a1
        _epilogue_t(o0, o1, o2, o3, o4, o5, o6, o7, m, l_i, ub, pid_h, pid_s, pid_bn, H, nbn,
                    sink_ptr, lse_ptr, pl_ptr, po_ptr, out_ptr, FINAL, HAS_SINK, ROPE_IN_V, OUT,
                    HN)


@gluon.jit
def _sparse_mla_gluon_shws_kernel(
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
    NBUF: gl.constexpr = 2, HN: gl.constexpr = 16, PRODUCER_REGS: gl.constexpr = 56,
    CONSUMER_REGS: gl.constexpr = 200, L2_PREFETCH: gl.constexpr = 0, STAGE: gl.constexpr = 0,
):
    """Same arguments as ``gluon_small._sparse_mla_gluon_sh_kernel`` (``NBUF``: X slots in the
    ring, at least 2; ``HN``: heads a program, 8 or 16; the partitions' register budgets; ``STAGE``
    1: the staged producer and its raw slot, consumer 1's merge state in its X slot)."""
    gl.static_assert((KV_FORMAT == 1) | (KV_FORMAT == 2), "fp8_ds_mla or fp8_model1 only")
    gl.static_assert(NBUF >= 2, "two consumers: at least two X slots")
    gl.static_assert((STAGE == 0) | (NBUF == 2), "the staged kernel: consumer 1 owns X slot 1")
    gl.static_assert((HN == 8) | (HN == 16), "8 or 16 heads a program")
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    META: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])

    qn = gl.allocate_shared_memory(gl.float16, [NC, HN, 64], SH)
    qr = gl.allocate_shared_memory(ROPE_DTYPE, [1, HN, 64], SH)
    pt = gl.allocate_shared_memory(gl.float16, [2, HN, 64], SH)     # P^T, one a consumer
    pth = gl.allocate_shared_memory(ROPE_DTYPE, [2, HN, 64], SH)    # model1 rope values: hi
    ptl = gl.allocate_shared_memory(ROPE_DTYPE, [2, HN, 64], SH)    # ... and the residual
    x0, x1, x2, x3, x4, x5, x6, x7, xr = _alloc_x(gl.float16, ROPE_DTYPE, NBUF, SH)
    ok_s = gl.allocate_shared_memory(gl.int32, [NBUF, 64], META)
    ub_s = gl.allocate_shared_memory(gl.int32, [NBUF, 64], META)
    if STAGE:
        rn0, rn1, rn2, rn3, rn4, rn5, rn6, rn7, rr, rs0, rs1, rs2, rs3 = _alloc_raw(KV_FORMAT)
        mo = rs0                # (a placeholder: consumer 1's O^T is in its X slot)
    else:
        mo = gl.allocate_shared_memory(gl.float32, [8, 64, HN], FLAT)   # consumer 1's O^T
        rn0, rn1, rn2, rn3, rn4, rn5, rn6, rn7 = mo, mo, mo, mo, mo, mo, mo, mo  # (no raw
        rr, rs0, rs1, rs2, rs3 = mo, mo, mo, mo, mo                             # slot)
    ml = gl.allocate_shared_memory(gl.float32, [2, HN], META)       # ... its m and l
    ubm = gl.allocate_shared_memory(gl.int32, [HN], META)           # ... its unit
    full = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NBUF):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    mbarrier.init(done, count=1)
    mbarrier.init(qbar, count=1)

    gl.warp_specialize(
        [(_shws_consumer, (q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                           qn, qr, pt, pth, ptl, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s,
                           full, empty, mo, ml, ubm, done, qbar,
                           sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                           KV_FORMAT, HAS_TKL, HAS_SINK, FINAL, ROPE_DTYPE, NBUF, HN, 0, STAGE)),
         (_shws_consumer, (q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                           qn, qr, pt, pth, ptl, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s,
                           full, empty, mo, ml, ubm, done, qbar,
                           sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                           KV_FORMAT, HAS_TKL, HAS_SINK, FINAL, ROPE_DTYPE, NBUF, HN, 1, STAGE)),
         (_shws_producer, (kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                           x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                           rn0, rn1, rn2, rn3, rn4, rn5, rn6, rn7, rr, rs0, rs1, rs2, rs3,
                           si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                           page_bytes, chunk, KV_FORMAT, HAS_BT, HAS_TKL, ROPE_DTYPE, NBUF,
                           L2_PREFETCH, STAGE))],
        [CONSUMER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
