"""Lightning-indexer logits over a paged K cache, as one Triton kernel (``torch_impl`` binding).

Operation (docs/SPEC.md, "Operation A"): for request b, draft i and logical position j

    logit[b, i, j] = k_scale[j] * sum_h weights[b, i, h] * relu(q[b, i, h, :] . k[j, :])

valid iff ``0 <= j < len[b, i]`` (``len = L_b - (N - 1 - i)``, or ``context_lens[b, i]``) and the
page entry ``block_table[b, j // P]`` is a real page (``0 <= entry < num_pages``); -inf elsewhere.
Semantics from DeepSeek-V3.2-Exp ``inference/model.py`` (Indexer.forward) and DeepGEMM
``fp8_paged_mqa_logits`` (paged layout, per-token scale, MTP mask).

Cache layouts read in-kernel (byte-exact with ``kernels/formats.py``):

* ``fp8_indexer``: uint8 ``[num_pages, P * (D_I + 4)]``; per page P rows of D_I e4m3 bytes, then
  P float32 scales (``kernels.layouts.fp8_indexer``, from which the launcher takes the row stride
  and the scale offset). The launcher passes two views of the same storage: an e4m3 view (values)
  and a float32 view (scales, at float offset ``P * D_I / 4 + t`` of the page).
* ``dense``: ``[num_pages, P, D_I]`` float (fp32 / fp16 / bf16), scale 1.

Design (one program = one request b and one contiguous chunk of its pages; grid ``(B, S)``):

* Each page of K is loaded **once** (``P x D_I`` e4m3 + P float32 scales, 132 bytes per token)
  and scored against all ``N * H_I`` query rows of request b. An iteration takes ``PAGES``
  pages (default 2, each resolved through the block table) as ``T = PAGES * BLOCK_P`` token
  rows and does one dot with the tokens as M: ``[T, D_I] x [D_I, NB * BLOCK_H] -> fp32``, so
  ReLU, the per-head weights and the head sum (``reshape [T, NB, BLOCK_H] -> sum(axis=2)``) run
  along each accumulator row (in-thread and across a quad) instead of across warps
  (``trans=False`` is the heads-as-M form). Then the per-token k scale and the draft mask; the
  ``[N, T]`` logits are stored. e4m3 q and keys are converted to fp16 for the dot (exact, one
  cvt per two values, products exact in fp32): Hopper's fp8 tensor-core dot accumulates with
  ~14 mantissa bits, which reordered near-ties against the float64 reference on the H200.
* The loop keeps the next page group's key tile and scales in flight while it scores this one
  (loop-carried loads) and loads the block-table entries a group further ahead, so no iteration
  waits on the dependent entry -> tile chain (the tile is converted before the dot, so Triton's
  pipeliner would not overlap it). Measured on the H200 (B=64, L=64K, N=1): 698 us for the
  first form (heads as M, 1 page, 3 stages), 410 us tokens as M, 342 us with 2 pages; the
  kernel is then instruction-bound (fp8 -> fp16 conversion and the score epilogue), see
  bench/NOTES.md.
* Bytes: ``L_b * (D_I + 4)`` per request read once (+ ``N * L_b * 4`` logits written);
  FLOPs: ``2 * N * H_I * D_I`` per position (16,384 at N=1, H_I=64, D_I=128), i.e. ~124 FLOP
  per cache byte at N=1 (~100 counting the logits write). The H200's fp8 ridge is ~370 FLOP/B
  (~1,580 dense fp8 TFLOP/s / ~4.3 TB/s), so N=1 and N=2 are memory bound and the kernel's job
  is to stream pages at HBM speed; at N=4 (~500 FLOP/B) the tensor cores become the limit.
  B=64, L=64K, N=1: 553 MB read + 17 MB of logits, HBM floor ~0.13 ms; 69 GFLOP.
* Work scales with L_b, not with the block table's width: each program computes
  ``n_pages_b = ceil(max_i len[b, i] / P)`` on the device and loops over its share
  ``[s * ceil(n_pages_b / S), ...)`` of pages with a **runtime** loop bound. The grid
  ``(B, S)`` depends only on B and the SM count (S = floor(2 * num_SMs / B) >= 1, never more
  than max_pages), so a 4K request in a table sized for 1M launches the same programs and reads the
  same pages as in a table sized for 4K. No host synchronisation: CUDA-graph capturable.
* Pages whose entry is negative or ``>= num_pages`` are never read (loads masked) and their
  logits are -inf. Positions of pages this kernel does not visit (``j >= n_pages_b * P``) are not
  written: ``indexer_logits`` pre-fills its output with -inf; the top-k never reads them.
* Fused pass A of the radix top-k (``hist=``, used by ``indexer_topk``): the logits are in
  registers anyway, so each program also histograms the first digit of their order keys
  (``kernels.topk.triton.window_bin``: 1/8-binade bins in a window below the max and one above
  the min of the keys, the bases from the first tile, recounted when a later key leaves them)
  per draft with ``tl.histogram`` and writes one ``[NB, HIST_ROW]`` int32 block (256 counts
  and the two window bases per draft) per (request, split): the top-k then skips one full read
  of the row.
* No atomics: every output element is written by exactly one program, so results are bitwise
  reproducible.
* Padding: heads are padded to ``BLOCK_H = max(16, next_pow2(H_I))`` (dots need M >= 16),
  drafts to ``NB = next_pow2(N)``, tokens to ``BLOCK_P = max(16, next_pow2(P))``; padded rows
  get weight 0 and are excluded with ``tl.where`` (so a NaN key cannot leak through ``0 * NaN``
  from a padded row into a real one).
  With no padded row (``N`` and ``H_I`` powers of two, ``H_I >= 16``) the mask is compiled out.
* NaN keys propagate (ReLU is a NaN-propagating max), as in the float64 reference.

Shared memory: every config the launcher can choose is compiled for sm_120 and sm_90 in CI
(``tests/test_triton_compile.py``, which reports each size) and fits sm_120's 99 KiB.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import triton
import triton.language as tl

from kernels import layouts
from kernels.topk.triton import (BASE_NONE, HIST_BINS, HIST_ROW, LBASE_NONE, min_key, order_key,
                                 window_base, window_bin, window_hist_add, window_lbase)


@dataclass(frozen=True)
class IndexerLogitsConfig:
    """Launch configuration of :func:`launch_indexer_logits`.

    Attributes:
      num_splits: programs per request (grid ``(B, num_splits)``); None = heuristic
        :func:`default_num_splits` (``floor(2 * num_sms / B)`` clipped to ``[1, max_pages]``).
      num_warps: Triton warps; None = 4 below 128 q rows (``next_pow2(N) * H_I``), else 8.
      num_stages: Triton pipeline stages. The loop already keeps the next page group's loads
        in flight by hand, so 1 (measured equal to 3 on the H200, with less shared memory);
        with ``prefetch=False`` the stages of Triton's own pipeliner (cp.async of the K tile).
      trans: tokens as the dot's M dimension (``[tokens, D] x [D, q rows]``), so the weighted
        head sum reduces along each accumulator row instead of across warps (H200, B = 64,
        L = 64K: 410 us against 539 us at one page per iteration).
      pages: pages scored per iteration (``pages * P`` token rows per dot; 2: 342 us against
        410 us at 1; 4 spills).
      hist: window bases of the fused first-digit histogram (``WRITE_HIST``).
        ``"running"``: the running max and min, reduced over every tile (CTA-wide reductions
        and a conditional exact rebase per tile). ``"first"``: the bases are set once from the
        first tile's max and min with ``HIST_HEAD`` bins of headroom; later tiles only take an
        elementwise running max and min of their keys (no reduction); at the end, if a key
        left a window (its end bin would have clamped), the program re-reads the logits it
        wrote and recounts them at the final bases (exact either way; the recount runs only
        then).
      prefetch: True: the hand pipeline (the next group's tile and scales carried in
        registers across the iteration); False: plain loads in the loop for Triton's
        pipeliner (cp.async of the K tile at ``num_stages >= 2``).
      evict_first: K tile and scale loads with ``eviction_policy="evict_first"`` (the logits
        the top-k reads next stay in L2).
      kernel: ``"triton"`` (this module's kernel), ``"gluon"`` (``kernels.indexer.gluon``:
        sm_90, fp8_indexer, H_I 64, D_I 128, P 64, N 1 or 2; the other fields but
        ``num_splits`` do not apply to it) or ``"gluon_ws"`` (``kernels.indexer.gluon_ws``, the
        warp-specialised one: the same calls, a cache TMA can address, else ``"gluon"`` runs;
        ``num_splits`` and the ``ws_*`` fields apply). :func:`resolve_kernel` substitutes
        ``"triton"`` where a Gluon kernel cannot run. Never the heuristic's choice for
        ``"gluon_ws"`` until measured (bench/NOTES.md, "Warp-specialised logits kernel").
      ws_consumers: ``"gluon_ws"``: consumer warpgroups a CTA (1: two CTAs per SM; 2: one CTA,
        ping-pong; 3: one CTA, 160 registers each; 4: one CTA, each consumer one page of every
        other step, 112-120 registers each, ``ws_convert="regs"`` only). 1 with more programs
        than SMs (two CTAs an SM) is refused with NotImplementedError, and 4 everywhere until its
        GPU tests pass (``kernels.indexer.gluon_ws.unverified``: 1 faulted on the H200; 4 ran
        exact in one H100 sweep row, 2026-12-06).
      ws_convert: ``"gluon_ws"``: ``"regs"`` (e4m3 rows straight into wgmma's register A
        operand) or ``"smem"`` (fp16 rows through shared memory, as ``"gluon"``).
    """

    num_splits: int | None = None
    num_warps: int | None = None
    num_stages: int = 1
    trans: bool = True
    pages: int = 2
    hist: str = "first"
    prefetch: bool = True
    evict_first: bool = False
    kernel: str = "triton"
    ws_consumers: int = 2
    ws_convert: str = "regs"

    SEARCH_SPACE = dict(num_splits=(None, 1, 2, 4, 8, 16, 32), num_warps=(4, 8), num_stages=(1, 2, 3),
                        trans=(False, True), pages=(1, 2), hist=("running", "first"),
                        prefetch=(True, False), evict_first=(False, True),
                        kernel=("triton", "gluon", "gluon_ws"), ws_consumers=(1, 2, 3, 4),
                        ws_convert=("regs", "smem"))


# Headroom of the "first" histogram mode: the first tile's max lands HIST_HEAD bins (1/8 binade
# each) below the upper window's top and its min HIST_HEAD bins above the lower window's bottom,
# so a later key up to 2^(HIST_HEAD / 8) times larger (or, on the min's side, further down) is
# still counted without a recount; each window then reaches 16 - HIST_HEAD / 8 binades past
# that max / min (the bench's logits never recount at 32: bench/NOTES.md).
HIST_HEAD = tl.constexpr(32)
HIST_MODES = {"running": 0, "first": 1}
# The largest next_n at which the warp-specialised logits kernel (``kernel="gluon_ws"``) fuses the
# top-k's first-digit histogram; above it ``indexer_topk`` launches the logits kernel without the
# histogram and the top-k makes its own (``kernels.topk.triton.launch_split_hist``: one more pass
# over the logits, split over programs). See :func:`fuse_hist`. 1 since 2026-12-07: at B 64 N 2
# L 64K the op took 393.6 us unfused against 500.7 fused on an H100 even with the per-row
# kernel's own pass A (one program a row, ~94 us; bench/NOTES.md "Twenty-third session"); the
# split pass A replaces it.
WS_FUSED_HIST_MAX_N = 1
WS_FUSED_HIST_ENV = "DSA_IDX_WS_FUSED_HIST_MAX_N"
"""Overrides :data:`WS_FUSED_HIST_MAX_N` for an A/B in one process (``0``: never fused, ``1``:
at N 1 only, ``2``: at N 1 and 2) and turns :data:`UNFUSED_DEVICES` off; unset or empty: the
constants."""
# ... and not even at N 1 on these GPUs (a substring of the device name) once a call's table
# holds UNFUSED_MIN_POSITIONS positions or more (B x W): there the logits kernel is bound by its
# consumers, not by the cache reads, and the fused histogram is what they add. Measured on an
# H200 (2026-12-07, bench/NOTES.md "Twenty-fourth session"; op medians fused -> unfused): B 64
# L 64K 228.7 -> 208.7 us, L 128K 432.7 -> 384.0, V4 B 8 1M 423.8 -> 382.4, V4 B 1 1M 82.1 ->
# 78.9; smaller tables lose (B 1 L 128K 28.3 -> 30.3, B 1 L 64K 23.5 -> 26.2). V4 B 64 with 4K
# of a 1M table (64M table positions, 262K read) loses 1.3 us (34.8 -> 36.1): the host sees the
# table, not the lengths. (Those A/Bs ran the ballot split pass A, 27.7 / 52.3 us at L 64K / 128K;
# the shared-atomic one, kernels.topk.gluon_hist, is ~4x faster: "Twenty-fifth session"; the
# H200 rule with it is not yet measured.) On an H100 the kernel runs near the cache's read rate
# and the histogram costs little; with the shared-atomic pass an A/B on one H100 (2026-12-07,
# fused -> unfused) gave B 64 L 64K 253.5 -> 245.9, V4 B 1 1M 91.3 -> 87.7, but L 128K 445.4 ->
# 467.1, V4 B 8 1M 449.4 -> 465.9, B 1 L 128K / 64K +1.1 / +1.2, so it stays fused there. (The
# substring also matches a GH200, whose HBM3e reads at the H200's rate: unmeasured.)
UNFUSED_DEVICES = ("H200",)
UNFUSED_MIN_POSITIONS = 1 << 20


def ws_fused_hist_max_n() -> int:
    """:data:`WS_FUSED_HIST_ENV` as an int, else :data:`WS_FUSED_HIST_MAX_N`.

    Raises:
      ValueError: the variable is set and not 0, 1 or 2 (named, with the value).
    """
    v = os.environ.get(WS_FUSED_HIST_ENV, "").strip()
    if v == "":
        return WS_FUSED_HIST_MAX_N
    if v not in ("0", "1", "2"):
        raise ValueError(f"{WS_FUSED_HIST_ENV}: expected '0', '1', '2' or unset, got {v!r}")
    return int(v)


def fuse_hist(config: "IndexerLogitsConfig", n: int, positions: int = 0,
              device_name: str = "") -> bool:
    """Whether ``indexer_topk`` fuses the top-k's first-digit histogram into the logits kernel of
    the resolved ``config`` (:func:`resolve_kernel`) at next_n ``n``: always, except the
    warp-specialised kernel above :func:`ws_fused_hist_max_n` drafts (at N 2 its histogram was
    45 % of the kernel on an H100, 1-11 % at N 1: bench/NOTES.md "Twenty-second session",
    "Twenty-third session"), and at any ``n`` on a GPU whose ``device_name`` contains one of
    :data:`UNFUSED_DEVICES` when the call's ``positions`` (B x W, the table's positions over the
    batch) reach :data:`UNFUSED_MIN_POSITIONS` (unless :data:`WS_FUSED_HIST_ENV` is set);
    unfused, the top-k runs ``launch_split_hist`` first. Either way the same set is selected.

    Raises:
      ValueError: as :func:`ws_fused_hist_max_n`.
    """
    if config.kernel != "gluon_ws":
        return True
    if n > ws_fused_hist_max_n():
        return False
    if os.environ.get(WS_FUSED_HIST_ENV, "").strip():
        return True
    return not (positions >= UNFUSED_MIN_POSITIONS
                and any(d in device_name for d in UNFUSED_DEVICES))


def default_num_splits(batch: int, max_pages: int, num_sms: int, per_sm: int = 2) -> int:
    """Heuristic split count: at most ``per_sm`` programs per SM over the whole batch (the
    Triton kernel: two CTAs of ~40 KiB shared memory and ~200 registers x 128-256 threads fit
    one SM), so the grid is a single wave (``B * S <= per_sm * num_sms``; a partial second wave
    would idle most SMs), at least one program per request and at most one per page."""
    return max(1, min(max_pages, (per_sm * num_sms) // max(batch, 1)))


def logits_splits(batch: int, max_pages: int, num_sms: int,
                  config: IndexerLogitsConfig | None = None) -> int:
    """Programs per request of the logits grid ``(B, S)`` for this call (shape-only): the
    config's count, else two programs an SM (the Triton kernel: one wave),
    ``kernels.indexer.gluon.SPLITS_PER_SM`` (the Gluon kernel: two waves, measured faster) or
    ``kernels.indexer.gluon_ws.SPLITS_PER_SM`` (two waves of the CTAs an SM holds; one wave
    where each split then holds at most ``gluon_ws.ONE_WAVE_MAX_PAGES`` pages)."""
    cfg = config or IndexerLogitsConfig()
    per_sm = 2
    if cfg.kernel == "gluon":
        from kernels.indexer import gluon
        per_sm = gluon.SPLITS_PER_SM
    elif cfg.kernel == "gluon_ws":
        from kernels.indexer import gluon_ws
        per_sm = gluon_ws.SPLITS_PER_SM[cfg.ws_consumers]
        one_wave = default_num_splits(batch, max_pages, num_sms, per_sm // 2)
        if max_pages <= one_wave * gluon_ws.ONE_WAVE_MAX_PAGES:
            per_sm //= 2
    splits = cfg.num_splits or default_num_splits(batch, max_pages, num_sms, per_sm)
    return max(1, min(splits, max(max_pages, 1)))


def resolve_kernel(config: IndexerLogitsConfig, dev, k_format: str, n: int, h: int, d: int,
                   p: int) -> IndexerLogitsConfig:
    """``config``, with ``kernel="triton"`` where it names a Gluon kernel (``"gluon"``,
    ``"gluon_ws"``) and the call or the device is not one it is built for
    (``kernels.indexer.gluon.eligible``: both are built for the same calls). Raises
    ValueError for an unknown kernel or ``ws_*`` value."""
    if config.kernel in ("gluon", "gluon_ws"):
        from kernels.indexer import gluon
        if not gluon.eligible(dev, k_format, n, h, d, p):
            return dataclasses.replace(config, kernel="triton")
    elif config.kernel != "triton":
        raise ValueError(f"IndexerLogitsConfig.kernel: expected 'triton', 'gluon' or 'gluon_ws', "
                         f"got {config.kernel!r}")
    if config.kernel == "gluon_ws":
        space = IndexerLogitsConfig.SEARCH_SPACE
        if config.ws_consumers not in space["ws_consumers"]:
            raise ValueError(f"IndexerLogitsConfig.ws_consumers: expected one of "
                             f"{space['ws_consumers']}, got {config.ws_consumers!r}")
        if config.ws_convert not in space["ws_convert"]:
            raise ValueError(f"IndexerLogitsConfig.ws_convert: expected one of "
                             f"{space['ws_convert']}, got {config.ws_convert!r}")
        if config.ws_consumers == 4 and config.ws_convert != "regs":
            raise ValueError(f"IndexerLogitsConfig.ws_convert: ws_consumers=4 converts in "
                             f"registers only (expected 'regs'), got {config.ws_convert!r}")
    return config


@triton.jit
def draft_lengths(cl_ptr, b, max_pages, P, N: tl.constexpr, NB: tl.constexpr,
                  CL_PER_DRAFT: tl.constexpr):
    """Valid-prefix length of each draft of request b, int32 ``[NB]`` (0 for padded drafts).

    ``CL_PER_DRAFT``: context_lens is ``[B, N]`` (taken as given) else ``[B]`` (MTP mask
    ``L_b - (N - 1 - i)``). Each loaded length is first clamped to ``[0, max_pages * P + N]``
    (the table's capacity plus the MTP offset: a length near 2^31 would overflow the int32 page
    arithmetic), here rather than by a torch op in front of the launch; negative draft lengths
    clamp to 0.
    """
    i = tl.arange(0, NB)
    cap = max_pages * P + N
    if CL_PER_DRAFT:
        lens = tl.load(cl_ptr + b * N + i, mask=i < N, other=0)
        lens = tl.minimum(tl.maximum(lens, 0), cap)
    else:
        lens = tl.minimum(tl.maximum(tl.load(cl_ptr + b), 0), cap) - (N - 1 - i)
    lens = tl.maximum(lens, 0)
    return tl.where(i < N, lens, 0)


@triton.jit
def _indexer_logits_kernel(
    q_ptr,            # [B, N, H, D] e4m3 (fp8_indexer) or float (dense)
    w_ptr,            # [B, N, H] float32
    k_ptr,            # fp8_indexer: e4m3 view [num_pages, P*(D+4)]; dense: [num_pages, P, D]
    ks_ptr,           # fp8_indexer: float32 view [num_pages, P*(D+4)/4] (unused for dense)
    bt_ptr,           # [B, max_pages] int32
    cl_ptr,           # [B] or [B, N] int32
    out_ptr,          # [B, N, W] float32, W = max_pages * P
    hist_ptr,         # [B, S, NB, HIST_ROW] int32 windowed first-digit histograms (WRITE_HIST)
    num_pages, max_pages,
    stride_qb, stride_qn, stride_qh,
    stride_wb, stride_wn,
    stride_kp, stride_kt,
    stride_sp, scale_off,
    stride_bt,
    stride_ob, stride_on,
    N: tl.constexpr, NB: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr,
    D: tl.constexpr, P: tl.constexpr, BLOCK_P: tl.constexpr,
    HAS_SCALE: tl.constexpr, CL_PER_DRAFT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr, FP8_NAN_FIX: tl.constexpr, WRITE_HIST: tl.constexpr,
    FP8_UPCAST: tl.constexpr, TRANS: tl.constexpr, PAGES: tl.constexpr,
    HIST_MODE: tl.constexpr = 0, PREFETCH: tl.constexpr = True, EVICT: tl.constexpr = False,
):
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)

    lens = draft_lengths(cl_ptr, b, max_pages, P, N, NB, CL_PER_DRAFT)    # [NB]
    n_pages = tl.minimum(tl.cdiv(tl.max(lens, axis=0), P), max_pages)
    per = tl.cdiv(n_pages, num_splits)
    start = split * per
    end = tl.minimum(start + per, n_pages)

    # q tile [NB * BLOCK_H, D] and weights [NB * BLOCK_H], rows (draft, head); loaded once.
    r = tl.arange(0, NB * BLOCK_H)
    ri = r // BLOCK_H
    rh = r % BLOCK_H
    row_ok = (ri < N) & (rh < H)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qb + ri[:, None] * stride_qn + rh[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None], other=0.0)                              # [R, D]
    if DOT_F32:
        q = q.to(tl.float32)
    if FP8_NAN_FIX:
        # CPU interpreter only (see below): q rows holding an e4m3 NaN byte make their scores NaN.
        q_nan = tl.max(((q.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F).to(tl.int32), axis=1)  # [R]
    if FP8_UPCAST:
        # e4m3 -> fp16 is exact (one cvt per two values); Hopper's fp8 tensor-core dot
        # accumulates with ~14 mantissa bits (measured on the H200: logits off by ~6e-5
        # relative, enough to reorder near-ties against the float64 reference), the fp16 dot
        # accumulates in full fp32 and its products (11 x 11 bits) are exact.
        q = q.to(tl.float16)
    w = tl.load(w_ptr + b * stride_wb + ri * stride_wn + rh, mask=row_ok, other=0.0)  # [R]

    # One iteration scores PAGES pages: BLOCK_T = PAGES * BLOCK_P token rows, each row's page
    # resolved through the block table (rows of one page share the entry; the loads are cached).
    BLOCK_T: tl.constexpr = PAGES * BLOCK_P
    PADDED: tl.constexpr = (NB != N) or (BLOCK_H != H)
    t = tl.arange(0, BLOCK_T)
    t_pg = t // BLOCK_P                                                     # page of the group
    t_off = t % BLOCK_P                                                     # token in the page
    t_ok = t_off < P
    i_out = tl.arange(0, NB)
    out_row = out_ptr + b * stride_ob + i_out[:, None] * stride_on             # [NB, 1]
    HB: tl.constexpr = HIST_BINS
    hist = tl.zeros((NB * HB,), tl.int32)
    hbase = tl.full((NB,), BASE_NONE, tl.int32)                              # window bases
    lbase = tl.full((NB,), LBASE_NONE, tl.int32)
    kmax = tl.zeros((NB, BLOCK_T), tl.uint32)               # HIST_MODE 1: elementwise key max
    kmin = ~tl.zeros((NB, BLOCK_T), tl.uint32)              # and min (of qualifying keys)
    # Software pipeline by hand (PREFETCH): the K tile (and scales) of the next page group are
    # loaded while this one is scored, and the block-table entries one group further ahead, so
    # no iteration waits on a dependent chain of global loads (the tile feeds a conversion
    # before the dot, which Triton's own pipeliner does not turn into async copies).
    # Without PREFETCH: plain loads in the loop (Triton's pipeliner at num_stages >= 2).
    bt_row = bt_ptr + b * stride_bt
    sc_nxt = tl.full([BLOCK_T], 1.0, tl.float32)
    if PREFETCH:
        pg = start + t_pg
        entry = tl.load(bt_row + pg, mask=pg < end, other=-1)               # group 0 entries
        page_ok = (entry >= 0) & (entry < num_pages) & (pg < end)
        page = tl.where(page_ok, entry, 0).to(tl.int64)
        k_nxt = _load_k(k_ptr, page, t_off, d, stride_kp, stride_kt, t_ok & page_ok, EVICT)
        if HAS_SCALE:
            sc_nxt = _load_sc(ks_ptr, page, t_off, stride_sp, scale_off, t_ok & page_ok, EVICT)
        ok_nxt = page_ok
        ent_nxt = tl.load(bt_row + pg + PAGES, mask=pg + PAGES < end, other=-1)  # group 1 entries
    for pg0 in range(start, end, PAGES):
        pg = pg0 + t_pg                                                       # [BLOCK_T]
        pg_in = pg < end
        if PREFETCH:
            k = k_nxt
            sc = sc_nxt
            page_ok = ok_nxt
            # issue group +1's tile and group +2's entries (masked off past the end: no traffic)
            pg1 = pg + PAGES
            ok_nxt = (ent_nxt >= 0) & (ent_nxt < num_pages) & (pg1 < end)
            page1 = tl.where(ok_nxt, ent_nxt, 0).to(tl.int64)
            k_nxt = _load_k(k_ptr, page1, t_off, d, stride_kp, stride_kt, t_ok & ok_nxt, EVICT)
            if HAS_SCALE:
                sc_nxt = _load_sc(ks_ptr, page1, t_off, stride_sp, scale_off, t_ok & ok_nxt, EVICT)
            ent_nxt = tl.load(bt_row + pg1 + PAGES, mask=pg1 + PAGES < end, other=-1)
        else:
            entry = tl.load(bt_row + pg, mask=pg_in, other=-1)
            page_ok = (entry >= 0) & (entry < num_pages) & pg_in
            page = tl.where(page_ok, entry, 0).to(tl.int64)
            k = _load_k(k_ptr, page, t_off, d, stride_kp, stride_kt, t_ok & page_ok, EVICT)
            sc = sc_nxt
            if HAS_SCALE:
                sc = _load_sc(ks_ptr, page, t_off, stride_sp, scale_off, t_ok & page_ok, EVICT)
        if FP8_NAN_FIX:
            # CPU interpreter only: it decodes e4m3 NaN (0x7F / 0xFF) as 480; on the GPU the
            # conversion gives NaN and the dot propagates it.
            nan_tok = tl.max(((k.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F).to(tl.int32), axis=1)
        if DOT_F32:
            k = k.to(tl.float32)
        if FP8_UPCAST:
            k = k.to(tl.float16)
        if TRANS:
            # tokens as the dot's M: the head sum runs along the accumulator's rows (in-thread
            # and across a quad), not across warps
            s = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)         # [BLOCK_T, R] fp32
            if FP8_NAN_FIX:
                s = tl.where((nan_tok[:, None] != 0) | (q_nan[None, :] != 0), float("nan"), s)
            s = tl.maximum(s, 0.0, propagate_nan=tl.PropagateNan.ALL)        # ReLU keeping NaN
            if PADDED:      # padded (draft, head) rows: excluded (a NaN key must not leak via 0 * NaN)
                s = tl.where(row_ok[None, :], s * w[None, :], 0.0)
            else:
                s = s * w[None, :]
            # (at N = 1 Triton compiles this to the same SASS as tl.sum(s, axis=1): counted)
            logit = tl.trans(tl.sum(tl.reshape(s, (BLOCK_T, NB, BLOCK_H)), axis=2))  # [NB, BLOCK_T]
        else:
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)         # [R, BLOCK_T] fp32
            if FP8_NAN_FIX:
                s = tl.where((nan_tok[None, :] != 0) | (q_nan[:, None] != 0), float("nan"), s)
            s = tl.maximum(s, 0.0, propagate_nan=tl.PropagateNan.ALL)        # ReLU keeping NaN
            if PADDED:
                s = tl.where(row_ok[:, None], s * w[:, None], 0.0)
            else:
                s = s * w[:, None]
            logit = tl.sum(tl.reshape(s, (NB, BLOCK_H, BLOCK_T)), axis=1)     # [NB, BLOCK_T]
        if HAS_SCALE:
            logit = logit * sc[None, :]
        j = pg * P + t_off                                                    # logical positions
        valid = (j[None, :] < lens[:, None]) & (page_ok & t_ok)[None, :]
        logit = tl.where(valid, logit, float("-inf"))
        tl.store(out_row + j[None, :], logit, mask=(i_out[:, None] < N) & (t_ok & pg_in)[None, :])
        if WRITE_HIST:
            # Pass A of the radix top-k, fused: per-draft windowed histogram of the keys' first
            # digit (kernels.topk.triton.window_bin; key 0 = NaN / -inf / invalid is not
            # counted). Bin = draft * HB + digit.
            key = order_key(logit)
            if HIST_MODE == 0:
                # running max / min: every tile reduces its max and min; a move rebases the
                # histogram exactly
                hist, hbase, lbase = window_hist_add(hist, hbase, lbase, key, NB, BLOCK_T)
            else:
                # bases fixed by the first tile (HIST_HEAD bins of headroom at either end); keys
                # beyond a window clamp into its end bin and are caught by the elementwise max /
                # min below
                kq = min_key(key)
                if pg0 == start:
                    hbase = window_base(tl.max(key, axis=1)) + HIST_HEAD
                    lbase = window_lbase(tl.min(kq, axis=1)) - HIST_HEAD
                kmax = tl.maximum(kmax, key)
                kmin = tl.minimum(kmin, kq)
                bins = window_bin(key, hbase[:, None], lbase[:, None]) + i_out[:, None] * HB
                hist += tl.histogram(tl.reshape(bins, (NB * BLOCK_T,)), NB * HB,
                                     mask=tl.reshape(key != 0, (NB * BLOCK_T,)))
    if WRITE_HIST:
        if HIST_MODE == 1:
            # A key above the first tile's upper window or below its lower one (clamped into
            # an end bin) means the counts are not exact at these bases: recount this
            # program's logits (just written, read back from L2) at the bases of the largest
            # and smallest keys. Only when it happened.
            kmx = tl.max(kmax, axis=1)
            kmn = tl.min(kmin, axis=1)
            fbase = tl.where(kmx != 0, tl.maximum(hbase, window_base(kmx)), hbase)
            flbase = tl.where(kmx != 0, tl.minimum(lbase, window_lbase(kmn)), lbase)
            if tl.max((fbase - hbase) + (lbase - flbase), axis=0) > 0:
                hist = _recount(out_row, lens, start, end, fbase, flbase, N, NB, P, BLOCK_T)
                hbase = fbase
                lbase = flbase
        # Every program writes its block (zeros and BASE_NONE / LBASE_NONE for an empty page
        # range): no fill needed. Block (b, split, draft): HB counts, then the window bases
        # (HIST_ROW words).
        hb = hist_ptr + (b * num_splits + split) * (NB * HIST_ROW)
        hi = tl.arange(0, NB * HB)
        tl.store(hb + (hi // HB) * HIST_ROW + hi % HB, hist)
        tl.store(hb + i_out * HIST_ROW + HB, hbase)
        tl.store(hb + i_out * HIST_ROW + HB + 1, lbase)


@triton.jit
def _load_k(k_ptr, page, t_off, d, stride_kp, stride_kt, ok, EVICT: tl.constexpr):
    """K tile ``[T, D]`` of the token rows ``(page, t_off)`` (masked rows read 0)."""
    ptrs = k_ptr + page[:, None] * stride_kp + t_off[:, None] * stride_kt + d[None, :]
    if EVICT:
        return tl.load(ptrs, mask=ok[:, None], other=0.0, eviction_policy="evict_first")
    return tl.load(ptrs, mask=ok[:, None], other=0.0)


@triton.jit
def _load_sc(ks_ptr, page, t_off, stride_sp, scale_off, ok, EVICT: tl.constexpr):
    """Per-token float32 k scales ``[T]`` (masked rows read 1)."""
    ptrs = ks_ptr + page * stride_sp + scale_off + t_off
    if EVICT:
        return tl.load(ptrs, mask=ok, other=1.0, eviction_policy="evict_first")
    return tl.load(ptrs, mask=ok, other=1.0)


@triton.jit
def _recount(out_row, lens, start, end, base, lbase, N: tl.constexpr, NB: tl.constexpr,
             P: tl.constexpr, BLOCK_T: tl.constexpr):
    """Windowed histograms ``hist [NB * 256]`` at bases ``(base, lbase)`` [NB] of the logits this
    program wrote at positions ``[start * P, end * P)`` of each draft row (``out_row`` [NB, 1]
    pointers), re-read from global memory after a CTA barrier (stores by other threads of this
    program are visible after it). Invalid positions hold -inf (key 0, not counted)."""
    tl.debug_barrier()
    HB: tl.constexpr = HIST_BINS
    i_out = tl.arange(0, NB)
    t = tl.arange(0, BLOCK_T)
    hist = tl.zeros((NB * HB,), tl.int32)
    lo = start * P
    hi = end * P
    for j0 in range(lo, hi, BLOCK_T):
        j = j0 + t
        m = (i_out[:, None] < N) & (j[None, :] < hi) & (j[None, :] < lens[:, None])
        x = tl.load(out_row + j[None, :], mask=m, other=float("-inf"))
        key = order_key(x)
        bins = window_bin(key, base[:, None], lbase[:, None]) + i_out[:, None] * HB
        hist += tl.histogram(tl.reshape(bins, (NB * BLOCK_T,)), NB * HB,
                             mask=tl.reshape(key != 0, (NB * BLOCK_T,)))
    return hist


def launch_indexer_logits(q, weights, k_vals, k_scales, block_table, context_lens, out, *,
                          page_size: int, num_sms: int, config: IndexerLogitsConfig | None = None,
                          dot_f32: bool = False, fp8_nan_fix: bool = False, hist=None,
                          fp8_upcast: bool = False):
    """Launch :func:`_indexer_logits_kernel` on already-validated tensors (no host sync).

    Args:
      q: ``[B, N, H_I, D_I]`` e4m3 (with k_scales) or float (dense, same dtype as k_vals); last
        dim contiguous.
      weights: ``[B, N, H_I]`` float32, last dim contiguous.
      k_vals: e4m3 view ``[num_pages, P * (D_I + 4)]`` of the fp8_indexer cache, or dense
        ``[num_pages, P, D_I]`` float with contiguous last dim.
      k_scales: float32 view ``[num_pages, P * (D_I + 4) / 4]`` of the same storage, or None (dense).
      block_table: ``[B, max_pages]`` int32, last dim contiguous.
      context_lens: contiguous int32 ``[B]`` or ``[B, N]``.
      out: float32 ``[B, N, max_pages * P]``, last dim contiguous; only positions of the pages a
        request spans (``j < ceil(max_i len[b, i] / P) * P``) are written.
      page_size: P. num_sms: SM count for the split heuristic.
      dot_f32: widen q and k to float32 before the dot (bf16 in the CPU interpreter, which
        computes bf16 arithmetic on raw bits).
      fp8_upcast: convert e4m3 q and k to fp16 (exact) before the dot, so the dot accumulates in
        full fp32 (the launcher always sets it for fp8 caches; the interpreter computes fp16).
      fp8_nan_fix: make e4m3 NaN keys give NaN scores (the CPU interpreter decodes them as 480).
      hist: None, or int32 ``kernels.topk.triton.hist_shape(B, S, N)`` = ``[B, S, NB,
        HIST_ROW]`` (``S = logits_splits(...)``, ``NB = next_pow2(N)``), contiguous and
        uninitialised: receives per-split windowed first-digit histograms of the logits' order
        keys and their window bases (pass A of ``kernels.topk.triton``, fused).
    Returns:
      ``out``.
    """
    cfg = config or IndexerLogitsConfig()
    B, N, H, D = q.shape
    max_pages = block_table.shape[1]
    NB = triton.next_power_of_2(N)
    BLOCK_H = max(16, triton.next_power_of_2(H))
    BLOCK_P = max(16, triton.next_power_of_2(page_size))
    splits = logits_splits(B, max_pages, num_sms, cfg)
    # 8 warps from 128 q rows on: at 4 warps the [128, 64] fp32 accumulator plus the q tile
    # reach 255 registers and spill on sm_90 (kernels/_triton_aot.py, ptxas -v).
    num_warps = cfg.num_warps or (8 if NB * BLOCK_H >= 128 else 4)
    has_scale = k_scales is not None
    if has_scale:
        # the byte layout (kernels.layouts.fp8_indexer): token t's D_I e4m3 bytes at t * D_I of
        # its page, its float32 scale at byte P * D_I + 4 t (float offset scale_off + t)
        lay = layouts.fp8_indexer(D)
        stride_kp, stride_kt = k_vals.stride(0), lay.data_offset(1)
        stride_sp = k_scales.stride(0)
        scale_off = lay.scale_offset(page_size, 0) // lay.scale.nbytes
    else:
        stride_kp, stride_kt = k_vals.stride(0), k_vals.stride(1)
        stride_sp, scale_off = 0, 0
    precision = "ieee" if (dot_f32 or str(q.dtype) == "torch.float32") else "tf32"
    if B == 0 or max_pages == 0:
        return out
    if cfg.kernel == "gluon_ws":     # the caller resolved it (resolve_kernel): eligible here
        from kernels.indexer import gluon_ws
        if gluon_ws.tma_ok(k_vals):
            why = gluon_ws.unverified(B, splits, num_sms, cfg.ws_consumers)
            if why and not gluon_ws.ALLOW_UNVERIFIED:
                raise NotImplementedError(
                    f"indexer logits kernel 'gluon_ws' (B={B}, N={N}, table {max_pages} pages, "
                    f"{splits} splits, {num_sms} SMs, ws_consumers={cfg.ws_consumers}, "
                    f"ws_convert={cfg.ws_convert!r}): {why}; use ws_consumers=2 or "
                    f"kernel='gluon'")
            return gluon_ws.launch(q, weights, k_vals, k_scales, block_table, context_lens, out,
                                   hist, splits, consumers=cfg.ws_consumers,
                                   convert=gluon_ws.CONVERTS[cfg.ws_convert])
        cfg = dataclasses.replace(cfg, kernel="gluon")    # a cache TMA cannot address
    if cfg.kernel == "gluon":        # the caller resolved it (resolve_kernel): eligible here
        from kernels.indexer import gluon
        return gluon.launch(q, weights, k_vals, k_scales, block_table, context_lens, out, hist,
                            splits)
    _indexer_logits_kernel[(B, splits)](
        q, weights, k_vals, k_scales if has_scale else k_vals, block_table, context_lens, out,
        hist if hist is not None else out,
        k_vals.shape[0], max_pages,
        q.stride(0), q.stride(1), q.stride(2),
        weights.stride(0), weights.stride(1),
        stride_kp, stride_kt, stride_sp, scale_off,
        block_table.stride(0),
        out.stride(0), out.stride(1),
        N=N, NB=NB, H=H, BLOCK_H=BLOCK_H, D=D, P=page_size, BLOCK_P=BLOCK_P,
        HAS_SCALE=has_scale, CL_PER_DRAFT=context_lens.dim() == 2, DOT_PRECISION=precision,
        DOT_F32=dot_f32, FP8_NAN_FIX=fp8_nan_fix and has_scale, WRITE_HIST=hist is not None,
        FP8_UPCAST=fp8_upcast and has_scale, TRANS=cfg.trans, PAGES=cfg.pages,
        HIST_MODE=HIST_MODES[cfg.hist], PREFETCH=cfg.prefetch, EVICT=cfg.evict_first,
        num_warps=num_warps, num_stages=cfg.num_stages,
    )
    return out
