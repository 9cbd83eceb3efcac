"""Sparse MLA decode for sm_90 in Gluon: the crossover kernel (``gluon_xo.py``) with a "seesaw"
consumer: two consumer warpgroups that own alternate row blocks, each computing a whole block's
scores and softmax and half of every block's value dots.

Source of the design: FlashMLA's Hopper decode ("seesaw" scheduling, deepseek-ai/FlashMLA,
docs/20250422-new-kernel-deep-dive.md), whose two warpgroups each hold half of the output and
take turns computing a whole block's scores. Why here (bench/NOTES.md "Fourteenth session"):
once the crossover halved the conversion, ``gluon_xo``'s consumer bounded it (its producer idles
~27 % on ``empty``), and that consumer runs each block's score dots, softmax and value dots in
series with both warpgroups in lockstep (each computes the scores of 32 of the 64 rows, so the
row max and P cross warpgroups through shared memory: 8 partition barriers a block).

fp8_ds_mla only (``KV_FORMAT`` 1; P goes into the block's rope chunk, which V does not use), 16-bit
q. Semantics, arguments and outputs are ``gluon_xo.py``'s; the numerics are its unit sequence,
conversion and dots, except that the rope dot accumulates onto the scaled nope scores inside the
wgmma (``gluon_ws`` adds two float32 results) and the row sums run over the block's 64 rows in one
warpgroup (``gluon_ws``: two halves of 32): scores, P and outputs match ``gluon_ws`` to float32
rounding, not bitwise.

* **Work.** As ``gluon_xo.py``: grid ``(head_blocks, splits, B * N)`` in clusters of two along the
  head blocks; 16 warps a CTA in three partitions: consumer warpgroup 0 (the default partition,
  ``num_warps`` 4), consumer warpgroup 1 (a worker, 4 warps) and ``gluon_xo``'s producer (a worker,
  8 warps).
* **Consumer warpgroup ``ME``** (0 / 1) holds O's value dims ``[256 ME, 256 ME + 256)`` (four
  64-dim accumulators, 128 fp32 registers a thread) and owns the blocks ``j`` with ``j % 2 ==
  ME``. For each block it owns it computes ``S = q . X^T`` over all 576 dims (``warps_per_cta =
  [4, 1]``: the whole 64 x 64 tile), the online softmax from the running max / sum the other
  warpgroup handed over for block ``j - 1``, writes P (fp16) into the block's dead rope chunk and
  the new max / sum into ``m_s`` / ``l_s[j % 2]``, and arrives on ``pready[j % 2]``. Both
  warpgroups then add ``P . X`` into their half of O (P from shared memory). Per owned block ``j``
  a warpgroup runs (:func:`_xs_consumer`): (0) its value dots of ``j - 2`` complete, release that
  slot; (B) the other's block ``j - 1``: ``pready``, rescale, issue ``P . X`` of ``j - 1``; (A)
  ``full[j]``, issue the score dots of ``j``; (C) wait (the value dots of ``j - 1`` too), release
  ``j - 1``'s slot, the softmax, publish; (D) rescale, issue ``P . X`` of ``j``. So the other
  warpgroup's half of block ``j``'s value dots runs beside this one's score dots of ``j + 1``, but
  a block's score dots start only after the previous block's softmax: (A) before (B) would issue
  them during it, and ptxas then serialises every wgmma of the kernel (O's rescale in (B) defines
  value-dot accumulators while the score dots are in flight; AOT: 168 warpgroup arrive / wait
  instructions a loop instead of 22).
* **Slots.** A slot is released (``empty``: 2 local + 2 peer arrivals) once both warpgroups of both
  CTAs have completed their value dots of its block; the producer (``gluon_xo._xo_producer`` with
  ``LOCAL_ROPE`` and ``SPREAD_COPIES``, below) refills it then. A warpgroup waits for its value
  dots of block ``j - 2`` before it waits ``full[j]`` (same slot): otherwise it would wait for
  its own release.
* **Memory ordering of the handover.** The owner's P stores (generic proxy) and max / sum
  stores, ``fence.proxy.async``, a partition barrier, then one release arrive on ``pready``; the
  other warpgroup's acquire wait (and its wait on ``full`` of the slot: the peer's half arrives
  by a cluster copy, visible for certain only to a thread that waits on that barrier), then its
  loads and its wgmma (async proxy) reading P. The owner reuses the rope chunk only after its
  score dots (which read it) completed, and no cluster copy reads it: the producer runs with
  ``LOCAL_ROPE`` (each CTA gathers all 64 rows' rope; a copy's source read has no completion this
  CTA could wait for, so the P stores could overwrite a rope half still on its way to the peer).
  The producer also spreads its 8 copies to the peer over its 8 warps (``SPREAD_COPIES``).
  ``m_s`` / ``l_s[j % 2]`` are overwritten for block ``j + 2`` only after the owner of ``j + 2``
  waited ``pready[j + 1]``, which the other warpgroup arrives on after its last read of them.
  q: warpgroup 0 stores it (as ``gluon_ws``), fences, arrives on ``qready``; warpgroup 1
  computes the same per-head scale from global q and waits ``qready`` before its first score
  dot.
* **Scores in one accumulator.** A warpgroup holds O's half (128 fp32 registers a thread) and a
  whole block's scores (32): the nope dots accumulate in q's scaled units, are brought to true
  units in registers (``* q_inv * 2^ub``), and the rope dot (true units) accumulates onto them
  (``gluon._issue_scores``' separate rope accumulator spilled 32 stores a loop, AOT).
* **Descriptors.** The loop steps 2 over 2 slots, so a warpgroup's own blocks sit in one slot
  and every wgmma descriptor would be loop invariant: LLVM hoisted all of them and ptxas spilled
  them (64-73 64-bit local loads a loop, AOT). The slot index and q's chunk index go through an
  opaque move each iteration (:func:`_opaque`).
* **Shared memory**: ``gluon_xo``'s plus 1 KB of max / sum words and three barriers (224,344 B,
  less than ``gluon_xo``'s: no cross-warpgroup reduction scratch).
* **Registers**: the producer 64 (:data:`PRODUCER_REGS`; ``gluon_ws``'s 56 spilled 13 local loads
  a block in this producer), each consumer warpgroup 192.
* **L2 hint** (:data:`L2_PREFETCH`): once a block's loads are issued, the producer hints its 32
  rows of the next block into L2 (``gluon._l2_prefetch_rows``: one ``prefetch.global.L2`` a
  thread, predicated off for invalid rows; producer loop 458 -> 473 SASS, local accesses 4 loads + 1 store -> 1 + 1).
* **Counts** (AOT, Triton 3.6.0, sm_90, bf16 q, partial): each consumer warpgroup's loop (one own
  block, one of the other's) 1,090 / 1,147 SASS a warp with 68 wgmma instructions and 0 / 3
  local loads (at 200 registers 1,080 / 1,093 and none); the consumers issue ~4,470
  warp-instructions a block against ``gluon_ws``'s ~6,020; the producer loop 458 with 4 local
  loads (``gluon_xo``'s 440: the whole rope gathered).
* **Measured** (H100, 2026-12-06; bench/NOTES.md, fifteenth session): correct (the gluon_check
  cases, the 39 GPU tests); B 64 H 128 132.3 us, B 128 259.9, B 16 49.8, B 1 18.2 in one call,
  against ``gluon_ws``'s 141.6-142.6, 277.7-279.5, 51.2-51.4 and 15.7-15.9 in the day's other
  calls on the same kind of card.

Only sm_90 (``configs.kernel_eligible``), Triton 3.6's PTX conventions (the offsets, as
``gluon_xo``), never the CPU interpreter. Picked for fp8_ds_mla at B x N >= 16
(``configs.GLUON_XS_PICKED``, ``GLUON_XS_MIN_ROWS``; the sm_90 dispatch table's H 128 entries)
since 2026-12-06, with the producer's L2 hint of the next block (:data:`L2_PREFETCH`): in the
bench's rows on an H100, one call each way, B 64 H 128 131.9 us against ``gluon_ws``'s 148.5,
B 16 46.6 / 53.8, B 128 257.5 / 291.7, B 64 N 2 255.7 / 289.9; 5,000 stress launches a shape
bitwise equal (bench/NOTES.md, sixteenth session).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma, warpgroup_mma_init,
                                                              warpgroup_mma_wait)

from kernels.sparse_mla.gluon import (NEG, _epilogue_rows, _issue_nope_scores, _list_range,
                                      _program, _q_exponent, _q_rows, _store_out,
                                      _store_q_scaled)
from kernels.sparse_mla.gluon_cluster import (CLUSTER_CTAS, _cluster_sync, _fence_mbarrier_init,
                                              _lanes, _meta_word, _peer_arrive, _require_cluster,
                                              mbarrier_inits)
from kernels.sparse_mla.gluon_ws import PRODUCER_WARPS, _alloc_fp8_ring, _barrier
from kernels.sparse_mla.gluon_xo import _ring_setup, _xo_producer, offsets_of_inits
from kernels.sparse_mla.gluon_xo import launch_cluster as xo_launch_cluster
from kernels.sparse_mla.triton import _pow2

NUM_WARPS = 4               # the default partition: consumer warpgroup 0
CONSUMER_WARPS = gl.constexpr(4)
EMPTY_COUNT = gl.constexpr(4)  # arrivals a slot release: both warpgroups of both CTAs
# The producer's setmaxnreg budget (read at each launch, so bench.gluon_check can time others:
# ``gluon_xs_p56``); each consumer warpgroup gets 256 - it (16 warps x 128 registers = 4 x 2 x
# (256 - P) + 8 x P). 64 against gluon_ws's 56: AOT (Triton 3.6.0, bf16 q, partial) the
# producer's loop 458 SASS a warp with 4 local loads and 1 store (at 56: 465, 13 and 6), the
# consumers' 1,090 / 1,147 with 3 local loads (at 200 registers: 1,080 / 1,093, none). Measured
# in one call on an H100 (2026-12-06, bench/results/gluon_check_xsroll_h100_20261206.json):
# B 64 H 128 132.3 us against 149.0 at 56 (gluon_ws: 141.6-142.6 in the day's other calls),
# B 128 259.9, B 16 49.8, B 1 18.2 (bench/NOTES.md, fifteenth session).
PRODUCER_REGS = 64
# the producer hints this CTA's 32 rows of the next block into L2 (``gluon_xo._xo_producer``'s
# ``L2_PREFETCH``, read at each launch). Why: in gluon_check's timing (slots, no block table)
# gluon_xs took 131.9 us at B 64 H 128 against gluon_ws's 142.0, and in the bench's (block
# tables) 162.2 against gluon_ws's 148.0-148.7 (H100, 2026-12-06): the
# producer-bound kernel waits on the gathers. With it (H100, 2026-12-06, one call each):
# gluon_check B 64 H 128 125.3 us against 132.6 (bench/results/gluon_check_pf_h100_20261206.json;
# B 16 45.5 / 49.5, B 128 245.5 / 260.2), the bench 131.9 against gluon_ws's 148.5
# (bench/NOTES.md, sixteenth session)
L2_PREFETCH = 1


def launch_constexprs(kv_format: str) -> dict:
    """The constexprs beyond the shared Gluon ones (as ``gluon_ws.launch_constexprs``): the
    partitions' register budgets (:data:`PRODUCER_REGS`, the consumers' the rest) and the
    producer's L2 hint (:data:`L2_PREFETCH`)."""
    return dict(PRODUCER_REGS=PRODUCER_REGS, CONSUMER_REGS=256 - PRODUCER_REGS,
                L2_PREFETCH=L2_PREFETCH)


@gluon.jit
def _opaque(x):
    """``x`` through an opaque move. The owned blocks of a warpgroup all sit in one slot (the
    loop steps 2 over 2 slots), so without it every wgmma descriptor of the loop is loop
    invariant: LLVM hoists all ~130 of them (64-bit each) out of the loop and ptxas spills them
    (AOT: 171 local loads a loop iteration)."""
    return gl.inline_asm_elementwise("mov.u32 $0, $1;", "=r,r", [x], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _unit_rescale(m_o, ub_o, m_j, ub):
    """The factor that brings a half of O from (max ``m_o``, unit ``2^ub_o``) to the block's
    (``m_j``, ``2^ub``): ``gluon._online_softmax``'s ``an``."""
    return gl.exp2(m_o - m_j) * _pow2(gl.maximum(ub_o - ub + 127, 1))


@gluon.jit
def _pv4(o0, o1, o2, o3, an, p, v0, v1, v2, v3):
    """``O_c = O_c * an + P . V_c`` for this warpgroup's four value chunks (``o*`` waited
    tensors), issued async: returns the four accumulators in flight."""
    o0 = warpgroup_mma(p, v0, o0 * an[:, None], is_async=True)
    o1 = warpgroup_mma(p, v1, o1 * an[:, None], is_async=True)
    o2 = warpgroup_mma(p, v2, o2 * an[:, None], is_async=True)
    o3 = warpgroup_mma(p, v3, o3 * an[:, None], is_async=True)
    return o0, o1, o2, o3


@gluon.jit
def _settled(o0, o1, o2, o3):
    """Wait for every wgmma of this warpgroup; the four accumulators, still typed as in flight
    (the loop carries them so)."""
    o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
    return (warpgroup_mma_init(o0), warpgroup_mma_init(o1), warpgroup_mma_init(o2),
            warpgroup_mma_init(o3))


@gluon.jit
def _other_block(o0, o1, o2, o3, m_o, ub_o, xr, v0, v1, v2, v3, ub_s, full, pready, m_s, l_s,
                 jo, NBUF: gl.constexpr, MMA: gl.constexpr):
    """Step (B): the other warpgroup's block ``jo`` into this warpgroup's half of O: wait for its
    P (``pready``), read its running max / sum, rescale O (this warpgroup's value dots are
    complete) and issue ``P . V`` (P from the slot's rope chunk). Returns the accumulators in
    flight, O's new (max, unit) and the running (max, sum) after block ``jo``."""
    MROW: gl.constexpr = gl.SliceLayout(1, MMA)
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    bo = _opaque(jo) % NBUF
    # the slot's bytes, the peer's half included (a cluster copy completes on ``full`` with
    # relaxed semantics: only a thread that waits on it is sure to see them); complete already
    mbarrier.wait(full.index(bo), (jo // NBUF) & 1)
    mbarrier.wait(pready.index(jo % 2), (jo // 2) & 1)
    m_run = m_s.index(jo % 2).load(MROW)
    l_run = l_s.index(jo % 2).load(MROW)
    ub = ub_s.index(bo).load(MROW)
    t0, t1, t2, t3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
    an = _unit_rescale(m_o, ub_o, m_run, ub)
    o0, o1, o2, o3 = _pv4(t0, t1, t2, t3, an, xr.index(bo)._reinterpret(gl.float16, [64, 64], SH),
                          v0.index(bo), v1.index(bo), v2.index(bo), v3.index(bo))
    return o0, o1, o2, o3, m_run, ub, m_run, l_run


@gluon.jit
def _release(empty, empty_addr, buf, lanes):
    """This warpgroup is done with slot ``buf`` (its value dots of the slot's block completed):
    one arrival on the local ``empty[buf]`` and one on the peer CTA's."""
    _barrier()
    mbarrier.arrive(empty.index(buf))
    _peer_arrive(empty_addr + 8 * buf, lanes)


@gluon.jit
def _xs_consumer(q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                 qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                 pready, qready, m_s, l_s, meta,
                 sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                 HAS_TKL: gl.constexpr, HAS_SINK: gl.constexpr, FINAL: gl.constexpr,
                 ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr, ME: gl.constexpr):
    """Consumer warpgroup ``ME`` (module docstring). Per owned block ``j`` (and, last, the
    other's ``nblk - 1`` alone): (0) its value dots of ``j - 2`` complete -> release that slot;
    (B) the other's block ``j - 1``: ``full`` and ``pready``, rescale, issue its value dots; (A)
    ``full[j]``, issue the score dots of ``j``; (C) wait everything (the value dots of ``j - 1``,
    the scores) -> release ``j - 1``'s slot, the scores into true units and the rope dot onto
    them, the softmax, publish P and the max / sum; (D) rescale, issue the value dots of ``j``."""
    NC: gl.constexpr = 8
    LDQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    MROW: gl.constexpr = gl.SliceLayout(1, MMA)
    MCOL: gl.constexpr = gl.SliceLayout(0, MMA)
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    pid_h, pid_s, pid_bn, nbn, b, n = _program(N)
    _cluster_sync(True)                       # both CTAs' barriers are initialised
    empty_addr = _meta_word(meta, 0)
    lanes = _lanes(gl.num_warps())

    q_row, qmask = _q_rows(q_ptr, pid_h, b, n, H, sq_b, sq_n, sq_h, LDQ)
    if ME == 0:
        q_inv = _store_q_scaled(q_row, qmask, qn, qr, NC, ROPE_DTYPE, LDQ, MROW)
        fence_async_shared()
        _barrier()
        mbarrier.arrive(qready.index(0))
    else:
        q_inv = gl.convert_layout(_pow2(254 - _q_exponent(q_row, qmask, NC, LDQ)), MROW)
        mbarrier.wait(qready.index(0), 0)

    if ME == 0:                               # this warpgroup's value chunks
        v0 = x0
        v1 = x1
        v2 = x2
        v3 = x3
    else:
        v0 = x4
        v1 = x5
        v2 = x6
        v3 = x7

    start, end = _list_range(tkl_ptr, b, K, pid_s, chunk, HAS_TKL)
    nblk = gl.maximum(end - start + 63, 0) // 64

    zero = warpgroup_mma_init(gl.zeros([64, 64], gl.float32, layout=MMA))
    o0, o1, o2, o3 = zero, zero, zero, zero
    m_o = gl.full([64], NEG, gl.float32, layout=MROW)     # the (max, unit) O is kept in
    ub_o = gl.full([64], 1, gl.int32, layout=MROW)
    m_run = gl.full([64], NEG, gl.float32, layout=MROW)   # running max / sum after the last
    l_run = gl.zeros([64], gl.float32, layout=MROW)       # block seen (own or handed over)

    for j in range(ME, nblk + 1, 2):
        # (0) own block j - 2: its value dots (issued in the last iteration) complete
        if j >= 2:
            o0, o1, o2, o3 = _settled(o0, o1, o2, o3)
            _release(empty, empty_addr, (j - 2) % NBUF, lanes)
        # (B) the other's block j - 1 (the last iteration may have only this)
        if j >= 1:
            o0, o1, o2, o3, m_o, ub_o, m_run, l_run = _other_block(
                o0, o1, o2, o3, m_o, ub_o, xr, v0, v1, v2, v3, ub_s, full, pready, m_s, l_s, j - 1,
                NBUF, MMA)
        if j < nblk:
            # (A) own block j, in block j - 2's slot
            jz = _opaque(j)
            buf = jz % NBUF
            mbarrier.wait(full.index(buf), (j // NBUF) & 1)
            s = _issue_nope_scores(qn, jz - j, x0.index(buf), x1.index(buf), x2.index(buf),
                                   x3.index(buf), x4.index(buf), x5.index(buf), x6.index(buf),
                                   x7.index(buf), NC, MMA)
            # (C) everything issued completes (in order): the value dots of j - 1, the nope
            # scores; into true units, then the rope dot onto them (one accumulator)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            if j >= 1:
                _release(empty, empty_addr, (j - 1) % NBUF, lanes)
            ub = ub_s.index(buf).load(MROW)
            s = warpgroup_mma(qr, xr.index(buf).permute((1, 0)), s * (q_inv * _pow2(ub))[:, None],
                              is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            okc = ok_s.index(buf).load(MCOL) != 0
            s = gl.where(okc[None, :], s * qk_scale_log2, NEG)
            m_new = gl.maximum(m_run, gl.max(s, axis=1))
            p = gl.where(okc[None, :], gl.exp2(s - m_new[:, None]), 0.0)
            l_run = l_run * gl.exp2(m_run - m_new) + gl.sum(p, axis=1)
            m_run = m_new
            ps = xr.index(buf)._reinterpret(gl.float16, [64, 64], SH)   # the scores read it
            ps.store(p.to(gl.float16))
            m_s.index(j % 2).store(m_run)
            l_s.index(j % 2).store(l_run)
            fence_async_shared()              # generic stores -> the wgmmas reading P
            _barrier()
            mbarrier.arrive(pready.index(j % 2))
            # (D) own block j
            t0, t1, t2, t3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
            an = _unit_rescale(m_o, ub_o, m_run, ub)
            o0, o1, o2, o3 = _pv4(t0, t1, t2, t3, an, ps, v0.index(buf), v1.index(buf),
                                  v2.index(buf), v3.index(buf))
            m_o = m_run
            ub_o = ub
    o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
    if nblk >= 1:                             # block nblk - 1 (own, or the other's in (B))
        _release(empty, empty_addr, (nblk - 1) % NBUF, lanes)

    # ---- epilogue: this warpgroup's four chunks (gluon._epilogue's); warpgroup 0 the LSE
    heads, h_ok, has, inv_l, inv_n, sink_f = _epilogue_rows(
        m_run, l_run, ub_o, pid_h, pid_s, pid_bn, H, nbn, sink_ptr, lse_ptr, pl_ptr, FINAL,
        HAS_SINK, MROW, 64, ME == 0)
    C0: gl.constexpr = 4 * ME
    _store_out(o0, inv_n, has, sink_f, C0, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr,
               FINAL, MMA)
    _store_out(o1, inv_n, has, sink_f, C0 + 1, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr,
               out_ptr, FINAL, MMA)
    _store_out(o2, inv_n, has, sink_f, C0 + 2, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr,
               out_ptr, FINAL, MMA)
    _store_out(o3, inv_n, has, sink_f, C0 + 3, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr,
               out_ptr, FINAL, MMA)
    _cluster_sync()                           # no peer arrives on this CTA after it exits


@gluon.jit(do_not_specialize=["x_off", "x_step", "full_off", "empty_off"])
def _sparse_mla_gluon_xs_kernel(
    q_ptr, kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr,
    out_ptr, lse_ptr,
    sq_b, sq_n, sq_h, si_b, si_n, sbt_b,
    N, H, K, num_slots, num_pages, max_pages, page_size, page_bytes, chunk, qk_scale_log2,
    x_off, x_step, full_off, empty_off,   # shared-memory byte offsets (the launcher's, from PTX)
    KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
    HAS_SINK: gl.constexpr, FINAL: gl.constexpr, ROPE_DTYPE: gl.constexpr,
    NBUF: gl.constexpr = 2, PRODUCER_REGS: gl.constexpr = 64, CONSUMER_REGS: gl.constexpr = 192,
    L2_PREFETCH: gl.constexpr = 0,
):
    """``gluon_xo._sparse_mla_gluon_xo_kernel``'s arguments (fp8_ds_mla: ``KV_FORMAT`` 1), launched
    with ``num_warps`` 4 in clusters of two along axis 0 (:func:`launch_cluster`)."""
    gl.static_assert(KV_FORMAT == 1, "fp8_ds_mla only (P reuses the rope chunk)")
    # two slots: with one, (A) would wait for a refill that needs (C)'s release; three do not fit
    gl.static_assert(NBUF == 2, "two slots only")
    META: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    _require_cluster(CLUSTER_CTAS)            # a plain launch traps instead of hanging
    qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty = _alloc_fp8_ring(
        KV_FORMAT, ROPE_DTYPE, NBUF)
    meta = gl.allocate_shared_memory(gl.int32, [4], META)
    m_s = gl.allocate_shared_memory(gl.float32, [2, 64], META)
    l_s = gl.allocate_shared_memory(gl.float32, [2, 64], META)
    pready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    qready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    _ring_setup(meta, x0, x1, x2, x3, x4, x5, x6, x7, xr, full, empty, x_off, full_off, empty_off,
                8, NBUF, EMPTY_COUNT)                     # empty: both warpgroups, both CTAs
    mbarrier.init(pready.index(0), count=1)
    mbarrier.init(pready.index(1), count=1)
    mbarrier.init(qready.index(0), count=1)
    _fence_mbarrier_init()

    gl.warp_specialize(
        [(_xs_consumer, (q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                         qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                         pready, qready, m_s, l_s, meta,
                         sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                         HAS_TKL, HAS_SINK, FINAL, ROPE_DTYPE, NBUF, 0)),
         (_xs_consumer, (q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                         qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                         pready, qready, m_s, l_s, meta,
                         sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                         HAS_TKL, HAS_SINK, FINAL, ROPE_DTYPE, NBUF, 1)),
         (_xo_producer, (kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                         x0, x1, x2, x3, x4, x5, x6, x7, xr,
                         ok_s, ub_s, full, empty,
                         si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                         page_bytes, chunk, meta, x_step, KV_FORMAT, HAS_BT,
                         HAS_TKL, ROPE_DTYPE, NBUF, 1, 1, L2_PREFETCH))],
        [CONSUMER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])


def kernel_offsets(ptx: str, kv_format: str, nbuf: int) -> tuple[int, int, int, int]:
    """``(x_off, x_step, full_off, empty_off)`` of a compiled ``_sparse_mla_gluon_xs_kernel``
    from its PTX (:func:`offsets_of_xs_inits` of its ``mbarrier.init``s)."""
    return offsets_of_xs_inits(mbarrier_inits(ptx), kv_format, nbuf)


def offsets_of_xs_inits(inits, kv_format: str, nbuf: int) -> tuple[int, int, int, int]:
    """``gluon_xo.offsets_of_inits`` for this kernel's ``(offset, count)`` mbarrier inits (from
    the PTX, or an AOT compile report's ``mbarrier_inits``): ``empty`` counting
    :data:`EMPTY_COUNT` and the three handover barriers (count 1) after the slots'."""
    return offsets_of_inits(inits, kv_format, nbuf, empty_count=EMPTY_COUNT.value, extra=3)


def launch_cluster(fn, grid: tuple, args: tuple, kwargs: dict, kv_format: str, nbuf: int):
    """Launch ``_sparse_mla_gluon_xs_kernel`` (``fn``) through ``gluon_xo.launch_cluster`` with
    this kernel's offset reader (:func:`kernel_offsets`); ``NotImplementedError`` where the
    offsets cannot be read: then run ``configs.SPARSE_MLA_GLUON_WS``."""
    xo_launch_cluster(fn, grid, args, kwargs, kv_format, nbuf, offsets=kernel_offsets,
                      name="gluon_xs")
