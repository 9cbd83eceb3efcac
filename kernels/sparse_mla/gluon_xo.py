"""Sparse MLA decode for sm_90 in Gluon: the warp-specialised kernel with each row block
dequantized once for both head blocks of a request ("crossover": a cluster of two CTAs, each
converting half of the block's rows and copying its half into the other CTA's shared memory).

Source of the design: FlashMLA's Hopper FP8 sparse decode (deepseek-ai/FlashMLA,
docs/20250929-hopper-fp8-sparse-deep-dive.md): with 128 query heads, two CTAs of 64 heads each
read the same rows, so each dequantizes half and writes it into both CTAs' shared memory
(distributed shared memory of a 2-CTA cluster); measured there 250 -> 410 TFLOPS at B 128 H 128
N 2. Our warp-specialised kernel (``gluon_ws.py``) ran B 64 H 128 at 146-148 us on the H200 (~247
TFLOPS), its producer partition the critical path (gather latency + conversion in series,
bench/NOTES.md "Warp-specialised kernel under ncu").

Semantics, numerics, arguments and outputs are ``gluon_ws.py``'s for the fp8 formats
(``fp8_ds_mla``, ``fp8_model1``): the same unit sequence, the same conversion and dots, so the
output is bitwise that kernel's. Plus one argument block, the shared-memory byte offsets the
launcher reads off the compiled PTX (:func:`kernel_offsets`, ``gluon_cluster.mbarrier_inits``).

* **Work.** Grid ``(head_blocks, splits, B * N)`` as ``gluon_ws.py``, launched in clusters of
  two along the head blocks (``head_blocks`` even): CTA ``r`` of a cluster (``r`` = head block
  mod 2) and its peer run the same (split, request) on different heads, so they read the same
  row blocks.
* **Producer** (8 warps, one 8-byte vector of each 64-byte chunk a thread): per 64-row block it
  resolves all 64 rows (their validity and scale words give the block's unit, which both CTAs
  must share) and gathers only rows ``[32 r, 32 r + 32)`` (bytes and rope), waits until *both*
  CTAs' consumers released the slot (``empty`` counts the local consumer and the peer's), converts
  its half into its own X slot (a chunk buffer viewed as ``[2 NBUF, 32, 64]`` halves), stores the row
  words, fences, then arrives on its own ``full`` with the peer's byte count (``expect_tx``) and
  copies its half into the peer's slot (``cp.async.bulk`` per chunk, 4 KB each, completing on
  the peer's ``full``). Half the gathers and half the conversion of ``gluon_ws.py`` a CTA.
* **Consumer**: ``gluon_ws._ws_consumer`` with ``CROSS`` (cluster barrier at its start and end, a
  release to the peer's ``empty`` beside its own).
* **Shared memory**: ``gluon_ws.py``'s (the X slots the same bytes, addressed in halves).
* **Memory ordering.** A slot's local half: generic stores, ``fence.proxy.async``, a partition
  barrier, the release arrive (``expect_tx``) on ``full``, the consumer's acquire wait, then
  wgmma. Its peer half: the peer's bulk copy (async proxy) completes its bytes on this
  ``full``; the phase cannot complete before they land. Refill: a producer overwrites slot s
  only after both consumers arrived on its ``empty`` (after their wgmmas completed; the peer's
  arrival remote, default semantics, see below); its bulk copy of block j has landed before the peer consumer could read
  block j, so the copy's source is never overwritten early. Start: ``mbarrier.init`` +
  ``fence.mbarrier_init.release.cluster`` + a cluster barrier (relaxed arrive) in each
  partition before any remote operation; end: a cluster barrier (release) after the last, so no
  CTA exits while its peer may still arrive on it or copy into it. A launch that is not in
  clusters of two traps at the start (``gluon_cluster._require_cluster``).

Only sm_90 (``configs.kernel_eligible``) with Triton 3.6's PTX conventions (the launcher reads
them, ``kernel_offsets``); never the CPU interpreter. The remote releases use the default
``.release.cta`` semantics (as CUTLASS's cluster pipelines): not morally strong across CTAs in
the PTX model, but what they release are shared reads the wgmma wait has already retired. Not
picked by the heuristic until measured on the GPU (``configs.GLUON_XO_PICKED``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from kernels.sparse_mla.gluon import (_block_unit, _issue_rows, _l2_prefetch_rows, _load_rope,
                                      _load_scales, _pipeline_ahead, _pipeline_start, _resolve,
                                      _row_base, _tile)
from kernels.sparse_mla.gluon_cluster import (CLUSTER_CTAS, _cluster_sync, _copy_to_peer,
                                              _cta_rank, _fence_mbarrier_init, _lanes, _meta_word,
                                              _probe, _require_cluster, _smem_base, launch,
                                              mbarrier_inits)
from kernels.sparse_mla.gluon_ws import (NUM_WARPS, PRODUCER_REGS, PRODUCER_WARPS, _alloc_fp8_ring,
                                         _barrier, _producer_list, _ws_consumer)
from kernels.sparse_mla.triton import _pow2

HALF = gl.constexpr(32)             # rows of a block a CTA gathers and converts
HALF_BYTES = gl.constexpr(32 * 128)  # one chunk's half: 32 rows of 64 16-bit values (4,096 B)


def launch_constexprs(kv_format: str) -> dict:
    """The constexprs beyond the shared Gluon ones (as ``gluon_ws.launch_constexprs``)."""
    return dict(PRODUCER_REGS=PRODUCER_REGS, EMPTY_ARRIVALS=1)


@gluon.jit
def _halves(x, NBUF: gl.constexpr, SH: gl.constexpr):
    """The producer's view of an X chunk buffer (``[NBUF, 64, 64]`` slots): ``[2 NBUF, 32, 64]``
    halves, half ``h`` of slot ``s`` at index ``2 s + h`` (the same bytes: a 128-byte-swizzled
    16-bit tile repeats every 8 rows, so a slot's rows 0-31 are its first 4 KB)."""
    return x._reinterpret(x.dtype, [2 * NBUF, 32, 64], SH)


@gluon.jit
def _xo_producer(kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                 x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                 si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size, page_bytes,
                 chunk, meta, x_step, KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr,
                 HAS_TKL: gl.constexpr, ROPE_DTYPE: gl.constexpr, NBUF: gl.constexpr,
                 LOCAL_ROPE: gl.constexpr = 0, SPREAD_COPIES: gl.constexpr = 0,
                 L2_PREFETCH: gl.constexpr = 0):
    """The producer partition (module docstring). ``meta``: the kernel's shared words (words
    1 and 2: the shared addresses of chunk buffer 0 and of ``full``); ``x_step``: bytes between
    chunk buffers (the rope chunk's is the NC-th). ``LOCAL_ROPE`` (``gluon_xs``): each CTA
    gathers the rope of all 64 rows itself and copies only the nope halves to the peer, so no
    bulk copy ever reads the rope chunk (``gluon_xs``'s consumer writes P there once the block's
    scores are done, and a cluster copy's source read cannot be waited for: its only completion
    is the peer's mbarrier). ``SPREAD_COPIES`` (``gluon_xs``): chunk ``c``'s copy to the peer
    is issued by lane 0 of warp ``c`` instead of every copy by thread 0 (ncu of ``gluon_xo``:
    the one thread's nine issue loops held ~20 % of the producer's stall samples).
    ``L2_PREFETCH`` (``gluon_xs``, :data:`gluon_xs.L2_PREFETCH`): once a block's loads are
    issued, hint this CTA's 32 rows of the next block into L2 (``gluon._l2_prefetch_rows``; the
    peer hints the other 32), so the next block's gathers wait on L2, not on DRAM."""
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    # [32 rows, 64 B] of one chunk over 8 warps: one 8-byte vector a thread (the rope: [32, 64]
    # 16-bit, 16 bytes a thread); a 64-row vector wraps, two rows a thread
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, LD)
    # the block's 64 rows one a thread (4 copies over the 256 threads, against 8 in ROW: half
    # the replicated index / page / scale loads and registers)
    R64: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    XBYTES: gl.constexpr = (NC + 1 - LOCAL_ROPE) * HALF_BYTES  # the peer's half of a slot
    if SPREAD_COPIES:                         # a warp per chunk copy
        gl.static_assert(gl.num_warps() >= NC, "SPREAD_COPIES needs a producer warp a chunk")
    LD64: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])   # [64, 64] 16-bit

    rank = _cta_rank()
    _cluster_sync(True)                       # both CTAs' barriers are initialised
    x_addr = _meta_word(meta, 1)
    full_addr = _meta_word(meta, 2)
    lanes = _lanes(gl.num_warps())
    start, end, idx_row, bt_row = _producer_list(idx_ptr, bt_ptr, tkl_ptr, N, K, si_b, si_n,
                                                 sbt_b, chunk, HAS_TKL)
    # two chains, each three deep (gluon.py's pipeline): the block's 64 rows (validity, scale
    # words -> the unit both CTAs share) and this CTA's 32 (the gathers)
    ar = gl.arange(0, 64, layout=R64)
    ah = gl.arange(0, HALF, layout=ROW) + HALF * rank
    i2, pg, of, ok, pg_nx, of_nx, ok_nx = _pipeline_start(
        idx_row, bt_row, start, end, ar, num_slots, num_pages, max_pages, page_size, HAS_BT)
    h2, hpg, hof, hok, hpg_nx, hof_nx, hok_nx = _pipeline_start(
        idx_row, bt_row, start, end, ah, num_slots, num_pages, max_pages, page_size, HAS_BT)
    ub_i = start * 0 + 1

    for k0 in range(start, end, 64):
        j = (k0 - start) // 64
        buf = j % NBUF
        phase = (j // NBUF) & 1
        # the block's 64 scale-word rows; this CTA's 32 rows: scales, e4m3 chunks, rope
        c0, c1, c2, c3 = _load_scales(kv32_ptr, pg, of, _row_base(pg, of, page_bytes, KV_FORMAT),
                                      ok, page_size, page_bytes, KV_FORMAT)
        r0, r1, r2, r3, r4, r5, r6, r7, rr, d0, d1, d2, d3 = _issue_rows(
            kv_ptr, kv16_ptr, kv32_ptr, hpg, hof, hok, page_size, page_bytes, KV_FORMAT, NC, LD,
            LD)
        if LOCAL_ROPE:                                # all 64 rows' rope, from the 64-row chain
            rr = _load_rope(kv16_ptr, _row_base(pg, of, page_bytes, KV_FORMAT), ok, KV_FORMAT,
                            LD64)
        if L2_PREFETCH:                               # the next block's rows, into L2
            _l2_prefetch_rows(kv_ptr, hpg_nx, hof_nx, hok_nx, page_size, page_bytes,
                              KV_FORMAT, HALF)
        in2, e2, i3 = _pipeline_ahead(idx_row, bt_row, i2, k0, end, ar, max_pages, page_size,
                                      HAS_BT)
        hin2, he2, h3 = _pipeline_ahead(idx_row, bt_row, h2, k0, end, ah, max_pages, page_size,
                                        HAS_BT)
        ub = _block_unit(c0, c1, c2, c3, ok, ub_i, KV_FORMAT)
        shift = _pow2(254 - ub)

        mbarrier.wait(empty.index(buf), phase ^ 1)   # both CTAs' consumers are done with it
        hs = 2 * buf + rank                           # this CTA's half of slot buf
        _halves(x0, NBUF, SH).index(hs).store(_tile(r0, d0, d1, d2, d3, shift, 0, KV_FORMAT))
        _halves(x1, NBUF, SH).index(hs).store(_tile(r1, d0, d1, d2, d3, shift, 1, KV_FORMAT))
        _halves(x2, NBUF, SH).index(hs).store(_tile(r2, d0, d1, d2, d3, shift, 2, KV_FORMAT))
        _halves(x3, NBUF, SH).index(hs).store(_tile(r3, d0, d1, d2, d3, shift, 3, KV_FORMAT))
        _halves(x4, NBUF, SH).index(hs).store(_tile(r4, d0, d1, d2, d3, shift, 4, KV_FORMAT))
        _halves(x5, NBUF, SH).index(hs).store(_tile(r5, d0, d1, d2, d3, shift, 5, KV_FORMAT))
        _halves(x6, NBUF, SH).index(hs).store(_tile(r6, d0, d1, d2, d3, shift, 6, KV_FORMAT))
        if NC == 8:
            _halves(x7, NBUF, SH).index(hs).store(_tile(r7, d0, d1, d2, d3, shift, 7, KV_FORMAT))
        if LOCAL_ROPE:
            xr.index(buf).store(rr.to(gl.bfloat16, bitcast=True).to(ROPE_DTYPE))
        else:
            _halves(xr, NBUF, SH).index(hs).store(rr.to(gl.bfloat16, bitcast=True).to(ROPE_DTYPE))
        ok_s.index(buf).store(ok.to(gl.int32))
        ub_s.index(buf).store(gl.full([64], 0, gl.int32, layout=R64) + ub)
        fence_async_shared()                  # generic-proxy stores -> wgmma and the bulk copy
        _barrier()                            # every producer thread has stored
        mbarrier.expect(full.index(buf), XBYTES)   # arrive; the peer's half still to land
        src = x_addr + hs * HALF_BYTES
        bar = full_addr + 8 * buf
        for c in gl.static_range(NC):
            if SPREAD_COPIES:
                _copy_to_peer(src + c * x_step, bar, lanes - 32 * c, HALF_BYTES)
            else:
                _copy_to_peer(src + c * x_step, bar, lanes, HALF_BYTES)
        if not LOCAL_ROPE:
            _copy_to_peer(src + NC * x_step, bar, lanes, HALF_BYTES)   # the rope chunk
        ub_i = ub
        pg, of, ok = pg_nx, of_nx, ok_nx
        pg_nx, of_nx, ok_nx = _resolve(i2, e2, in2, num_slots, num_pages, max_pages, page_size,
                                       HAS_BT)
        i2 = i3
        hpg, hof, hok = hpg_nx, hof_nx, hok_nx
        hpg_nx, hof_nx, hok_nx = _resolve(h2, he2, hin2, num_slots, num_pages, max_pages,
                                          page_size, HAS_BT)
        h2 = h3
    _cluster_sync()                           # no peer arrives on this CTA after it exits


@gluon.jit
def _ring_setup(meta, x0, x1, x2, x3, x4, x5, x6, x7, xr, full, empty, x_off, full_off, empty_off,
                NC: gl.constexpr, NBUF: gl.constexpr, EMPTY_COUNT: gl.constexpr):
    """The crossover kernels' setup before their partitions: the shared addresses the
    partitions' PTX needs (empty, chunk 0, full) into ``meta`` (once, here: see
    ``gluon_cluster._smem_base``), the chunk buffers' probes for the launcher (in this order: x0
    .. x{NC-1}, the rope chunk), then per slot ``full`` (count 1: the local expect_tx) and
    ``empty`` (``EMPTY_COUNT``): the ``mbarrier.init`` order :func:`offsets_of_inits` reads."""
    ML: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    wi = gl.arange(0, 4, layout=ML)
    base = _smem_base()
    meta.store(gl.where(wi == 0, base + empty_off, gl.where(wi == 1, base + x_off,
                                                             base + full_off)))
    _probe(x0)
    _probe(x1)
    _probe(x2)
    _probe(x3)
    _probe(x4)
    _probe(x5)
    _probe(x6)
    if NC == 8:
        _probe(x7)
    _probe(xr)
    for i in gl.static_range(NBUF):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=EMPTY_COUNT)


@gluon.jit(do_not_specialize=["x_off", "x_step", "full_off", "empty_off"])
def _sparse_mla_gluon_xo_kernel(
    q_ptr, kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr,
    out_ptr, lse_ptr,
    sq_b, sq_n, sq_h, si_b, si_n, sbt_b,
    N, H, K, num_slots, num_pages, max_pages, page_size, page_bytes, chunk, qk_scale_log2,
    x_off, x_step, full_off, empty_off,   # shared-memory byte offsets (the launcher's, from PTX)
    KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
    HAS_SINK: gl.constexpr, FINAL: gl.constexpr, ROPE_DTYPE: gl.constexpr,
    NBUF: gl.constexpr = 2, PRODUCER_REGS: gl.constexpr = 56, EMPTY_ARRIVALS: gl.constexpr = 1,
):
    """``gluon_ws._sparse_mla_gluon_ws_kernel``'s arguments (fp8 formats: ``KV_FORMAT`` 1 / 2)
    plus the four shared-memory offsets; launched in clusters of two along axis 0
    (:func:`launch_cluster`)."""
    gl.static_assert((KV_FORMAT == 1) | (KV_FORMAT == 2), "fp8_ds_mla or fp8_model1 only")
    META: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7
    _require_cluster(CLUSTER_CTAS)            # a plain launch traps instead of hanging
    qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty = _alloc_fp8_ring(
        KV_FORMAT, ROPE_DTYPE, NBUF)
    meta = gl.allocate_shared_memory(gl.int32, [4], META)
    _ring_setup(meta, x0, x1, x2, x3, x4, x5, x6, x7, xr, full, empty, x_off, full_off, empty_off,
                NC, NBUF, EMPTY_ARRIVALS + 1)             # empty: both CTAs' consumers
    _fence_mbarrier_init()

    gl.warp_specialize(
        [(_ws_consumer, (q_ptr, tkl_ptr, sink_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                         qn, qr, x0, x1, x2, x3, x4, x5, x6, x7, xr, ok_s, ub_s, full, empty,
                         sq_b, sq_n, sq_h, N, H, K, chunk, qk_scale_log2,
                         KV_FORMAT, HAS_TKL, HAS_SINK, FINAL, ROPE_DTYPE, NBUF,
                         EMPTY_ARRIVALS, meta, 1)),
         (_xo_producer, (kv_ptr, kv16_ptr, kv32_ptr, idx_ptr, bt_ptr, tkl_ptr,
                         x0, x1, x2, x3, x4, x5, x6, x7, xr,
                         ok_s, ub_s, full, empty,
                         si_b, si_n, sbt_b, N, K, num_slots, num_pages, max_pages, page_size,
                         page_bytes, chunk, meta, x_step, KV_FORMAT, HAS_BT,
                         HAS_TKL, ROPE_DTYPE, NBUF))],
        [PRODUCER_WARPS], [PRODUCER_REGS])


def kernel_offsets(ptx: str, kv_format: str, nbuf: int) -> tuple[int, int, int, int]:
    """``(x_off, x_step, full_off, empty_off)`` of a compiled ``_sparse_mla_gluon_xo_kernel``
    from its PTX: the ``mbarrier.init``s in program order are the chunk buffers' probes (NC nope
    chunks, then the rope chunk; count 1), then ``full[i]`` (count 1), ``empty[i]`` (count 2)
    per slot. ``ValueError`` if they are not that shape (the chunk buffers equally spaced by at
    least a buffer, 16-byte aligned, the barrier slots 8 bytes apart and outside the chunks):
    the launcher then refuses the kernel."""
    return offsets_of_inits(mbarrier_inits(ptx), kv_format, nbuf)


def offsets_of_inits(inits, kv_format: str, nbuf: int, empty_count: int = 2,
                     extra: int = 0) -> tuple[int, int, int, int]:
    """:func:`kernel_offsets` from the kernel's ``(offset, count)`` mbarrier inits
    (``gluon_cluster.mbarrier_inits``, or an AOT compile report's ``mbarrier_inits``).
    ``empty_count``: the arrivals an ``empty`` barrier counts (2 here; ``gluon_xs`` 4);
    ``extra``: barriers of count 1 initialised after the slots' (``gluon_xs``: 3), checked to lie
    outside the chunk buffers."""
    nc = 8 if kv_format == "fp8_ds_mla" else 7
    n = nc + 1 + 2 * nbuf + extra
    if len(inits) != n:
        raise ValueError(f"expected {n} mbarrier.init in the crossover kernel's PTX, found "
                         f"{len(inits)}")
    counts = [c for _, c in inits]
    if counts != [1] * (nc + 1) + [1, empty_count] * nbuf + [1] * extra:
        raise ValueError(f"mbarrier.init counts {counts} are not the crossover kernel's")
    offs = [o for o, _ in inits]
    xs, bars, more = offs[:nc + 1], offs[nc + 1:nc + 1 + 2 * nbuf], offs[nc + 1 + 2 * nbuf:]
    step = xs[1] - xs[0]
    if any(b - a != step for a, b in zip(xs, xs[1:])) or step < 2 * nbuf * HALF_BYTES.value:
        raise ValueError(f"chunk buffers not equally spaced by a whole buffer: {xs}")
    full, empty = bars[0::2], bars[1::2]
    if any(f != full[0] + 8 * i for i, f in enumerate(full)) or \
            any(e != empty[0] + 8 * i for i, e in enumerate(empty)):
        raise ValueError(f"barrier slots not 8 bytes apart: full {full}, empty {empty}")
    if any(o % 16 for o in xs):
        raise ValueError(f"chunk buffers not 16-byte aligned: {xs}")
    if any(xs[0] <= b < xs[-1] + step for b in bars + more):
        raise ValueError(f"barriers {bars + more} inside the chunk buffers {xs[0]}.."
                         f"{xs[-1] + step}")
    return xs[0], step, full[0], empty[0]


def launch_cluster(fn, grid: tuple, args: tuple, kwargs: dict, kv_format: str, nbuf: int,
                   offsets=None, name: str = "gluon_xo"):
    """Launch ``_sparse_mla_gluon_xo_kernel`` (``fn``) over ``grid`` (``grid[0]``: 64-head
    blocks, even) in clusters of two along axis 0, ``args`` / ``kwargs`` as ``gluon_ws``'s
    launch, the four shared-memory offsets appended from the compiled kernel's PTX
    (``offsets(ptx, kv_format, nbuf)``, default :func:`kernel_offsets`, through
    ``gluon_cluster.launch``; ``gluon_xs`` passes its own reader and ``name``). Raises
    ``ValueError`` for an odd ``grid[0]`` and ``NotImplementedError`` where the offsets cannot
    be read (another Triton version, a cache without PTX) or the kernel needs scratch: then run
    ``configs.SPARSE_MLA_GLUON_WS``."""
    read = offsets or kernel_offsets
    try:
        launch(fn, grid, args, kwargs, 4, lambda ptx: read(ptx, kv_format, nbuf))
    except NotImplementedError as e:
        raise NotImplementedError(f"sparse_mla_decode kernel '{name}': {e}; use "
                                  f"configs.SPARSE_MLA_GLUON_WS") from e
