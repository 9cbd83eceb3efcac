"""Exact, deterministic top-k over the valid prefix of float32 rows (radix select), in Triton.

Selection rule (docs/SPEC.md, ``indexer_topk``): among positions ``j < len[r]`` whose value
is neither NaN nor -inf (+inf qualifies), the ``topk`` largest; ties at the threshold go to the
smaller position, so the set is exact and deterministic. Rows with fewer qualifying positions
select all of them; the rest of the output row is -1. Output order: unspecified (deterministic;
the binding sorts by descending logit when ``sorted=True``). Same semantics as
``kernels.reference.topk_from_logits``.

Algorithm (no atomics, no sort):

1. Map each float to an order-preserving uint32 key (``u | 0x80000000`` for sign 0, ``~u`` for
   sign 1; -0.0 first becomes +0.0 so that the two zeros tie); NaN and -inf (and positions
   ``>= len``) get key 0, which no qualifying value has (the smallest, ``-FLT_MAX``, maps to
   ``0x00800000``), so "qualifies" is ``key != 0``.
2. First digit: **two windows**, one below the row max and one above the row min, at 1/8
   binade. The digit ``d = key >> 20`` (sign, 8 exponent bits and 3 mantissa bits: 4,096
   monotone values, 1/8 binade each, both signs) is binned against two bases: ``base = (max_key
   >> 20) - 255`` and ``lbase = min_key >> 20`` (of the qualifying keys): ``bin = d - base`` when
   that is ``>= 128`` (bins 128..255: the 16 binades below the row's largest value, one digit
   each), else ``clamp(d - lbase, 0, 127)`` (bins 0..126: the 16 binades above its smallest
   value, one digit each; bin 127, the middle, every digit between the windows)
   (:func:`window_bin`). The mapping is monotone in the key, so the selection stays exact
   whatever the bases. The lower window catches thresholds a window below the max cannot reach:
   a row whose K-th largest value is negative while its max is positive (fewer than K positive
   values: short rows, rows of mostly negative scores; the key space between the smallest
   positive and the smallest negative magnitudes spans ~250 binades). The bases come from the
   data of the same pass, not from the host or a guess: a histogram is accumulated against a
   running max and min and, when a block moves either, rebased (:func:`window_rebase`: every
   new bin but the middle is one digit, read from the old bin of that digit; the middle is the
   rest, exact since the old middle lies inside the new one). Partial histograms of one row
   (the logits kernel's splits) are brought to the row's bases, the largest base and the
   smallest lower base, the same way and summed. Pass A's histogram and the count C of
   qualifying positions give the threshold bin d: the largest bin whose suffix count reaches K.
   ``C <= K``: every qualifying position is taken.
3. Pass B over the valid prefix: keys in bins above d go straight to the output (slots from a
   running inclusive ``tl.cumsum``, so the write order is deterministic); keys in bin d are
   compacted, in position order, into the scratch row as **(logit, position) pairs** (the
   logits' float32 bits in the first half of the scratch row, positions in the second half; the
   levels make their keys) when they fit in half the row, else as positions only (the levels
   then gather the logits). Pass B compares the logits as floats against the bin's bounds
   (:func:`key_float`: the same sets as comparing keys), so no key is made for the ~95 % of
   positions below the bin.
4. Lower levels over the candidates only, 8 bits of the full key per level at bit offsets
   24, 16, 8 and 0, restricted to the keys matching the chosen high bits ``(key & mask) ==
   prefix``; a level whose bits the first digit already fixed is skipped. When d is a window
   bin the bucket fixes ``key >> 20`` (12 bits): three levels remain (bits 19..0). When d is the
   middle bin (a window miss: the threshold lies more than 16 binades below the max and above
   the min) the bucket is "every key between the windows" and the descent runs over the full
   key from bit 31 (four levels): the fallback, exact in every case, costs passes over that
   bucket. The descent stops early when the chosen bucket is taken whole. Up to ``BLOCK``
   candidates (the bench's rows: 0.1-1K) are read once (with the plan state, after a split
   pass B) and every level and the selection run on them in registers, on **5-bit** digits
   instead (``REG_BINS``: 32-bin histograms at bit offsets 30, 25, ..., 0; after a window digit
   the levels at 15, 10, 5 and 0): a 32-bin level is ~430 SASS and 3 barriers at 2,048
   candidates, a 256-bin one was ~760 and 15 (bench/NOTES.md, twentieth session). The digit
   widths change how the threshold is found, not the selected set or its order. Above
   ``COMPACT_MIN`` a level also compacts the candidates, in place and in
   position order, to its chosen bucket (keys above it go to the output then), so a miss or a
   wide tie costs two passes over the bucket and then passes over the old digit's bucket size
   (~1-16K).
5. Selection over the candidates in position order: keys above the final bucket are taken,
   keys in it while their running rank is ``<= need``: exactly the SPEC tie rule.
6. The tail ``[min(C, K), K)`` of the output row is filled with -1.

Lengths: every kernel computes its rows' valid lengths from the caller's lengths on the device
(``len = lengths[r]``, or with ``n_drafts = N`` and per-request lengths ``L_b - (N - 1 - i)``;
clamped to ``[0, W]`` in 64-bit arithmetic): no torch op runs in front of the launches.

Cost: two reads of the row's valid prefix (A and B; 8 bytes per position in all) plus a few
passes over the threshold bucket's candidates (typically under 1% of the row, see
``bench/topk_sim.py``), and only of the prefix: a row of ``len`` positions costs O(len) whatever
the row's capacity W, and K only enters through the digit choice and the -1 fill. Histograms
are integer counts (order independent), so results are bitwise reproducible. Rows up to 2^31
positions. Scratch: int32 ``[R, W]`` (4 bytes per table position), beside the float32 logits.

Fused with the indexer (``hist=``): the logits kernel already holds every logit in registers,
so it also builds pass A's windowed histogram per (request, split, draft) with its bases
(:func:`window_hist_add`, or the first tile's bases with headroom and a recount) and writes one
``HIST_ROW``-int32 block per draft (256 bins, then the two bases) instead of the top-k
re-reading the row. Given the logits kernel's page size as well (``page_size=``), pass B runs
split: ``_topk_scatter_kernel`` runs ``R x S`` programs, each over its split's positions only
from its output / candidate offsets, and writes in ascending position order exactly as the
one-program pass would. Up to ``SCATTER_PLAN_SPLITS`` splits a row (B >= 16-32) each scatter
program plans itself: it loads the row's S histogram blocks at the row's bases, picks the
threshold bin and starts after the counts of the splits before it (split 0 writes the row's
state): two launches in all. With more splits (B 1: 264) the plan first runs over groups of
``PLAN_GROUP`` splits, one program per (row, group): ``_topk_plan_part_kernel`` brings each
group's histograms to the row's bases (indexed loads, no register gather) and sums them; then
every scatter program sums the row's group partials, picks the threshold bin, and starts after
the keys above the bin and in it of the groups before its group (counted from their partials)
and of the splits before it in its group (their rebased histograms): three launches in all.
The per-row kernel then continues from the candidates (``FROM_PLAN``). On a GPU, splits of at
least ``SCATTER_SMEM_MIN_POSITIONS`` table positions (the B 64 rows) run the scatter as
``kernels.topk.gluon_scatter`` (``scatter_form="smem"``: each block's selected keys compacted
in shared memory, then one store a selected key; bitwise the same output, candidates and
state; 1-5 us less top-k at B 64 on an H100, bench/NOTES.md "Twenty-sixth session").

Split pass A (``launch_split_hist``): the same blocks from logits written without them, one
program per (row, split), where the indexer's warp-specialised logits kernel runs without the
histogram (``kernels.indexer.triton.fuse_hist``: at N > 1, where the fused histogram cost 45 %
of the kernel, and on an H200 for large tables: bench/NOTES.md, twenty-second to twenty-fourth
sessions) and for ``select_topk`` on few long rows (:func:`split_plan`); the split path then
runs as above. On a GPU it is ``kernels.topk.gluon_hist`` (two reads of the split, one
shared-memory atomic add a key: 0.5 warp-instructions a position, read-bound; 3.5-3.8x faster
than this module's ``_topk_hist_kernel``, Triton's ballot histogram, which the CPU interpreter
runs: bench/NOTES.md "Twenty-fifth session").
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from kernels.topk import window as _window
from kernels.topk.window import STATE_FIELDS  # noqa: F401 (re-exported: launch_topk's state)


# Bins of the first-digit histogram; the logits kernel (kernels/indexer/triton.py, fused pass A)
# histograms with the same bin function (window_hist_add).
HIST_BINS = tl.constexpr(_window.HIST_BINS)
# int32 words per (request, split, draft) histogram block: HIST_BINS counts, then the block's
# upper window base (word HIST_BINS) and lower window base (word HIST_BINS + 1), then padding.
# Hist buffers are [B, S, next_pow2(N), HIST_ROW].
HIST_ROW = tl.constexpr(_window.HIST_ROW)
# The first digit of a key is key >> WINDOW_SHIFT (12 bits: sign, 8 exponent bits, 3 mantissa
# bits; 1/8 binade).
WINDOW_SHIFT = tl.constexpr(_window.WINDOW_SHIFT)
# Bins UPPER_LO..255: the upper window, one digit each, base + UPPER_LO .. base + 255 (the 16
# binades below the largest key); bins 0..MID_BIN - 1: the lower window, one digit each,
# lbase .. lbase + MID_BIN - 1 (the 16 binades above the smallest key); bin MID_BIN: every digit
# between the two windows (window_bin).
UPPER_LO = tl.constexpr(_window.UPPER_LO)
MID_BIN = tl.constexpr(_window.MID_BIN)
# Window bases of a histogram that has seen no key yet (below / above every real base).
BASE_NONE = tl.constexpr(_window.BASE_NONE)
LBASE_NONE = tl.constexpr(_window.LBASE_NONE)
# Plan state words per row (launch_topk(state=...)): the fields of STATE_FIELDS (defined with
# the NumPy model, kernels.topk.window), then zeros.
STATE_WORDS = tl.constexpr(16)
# Candidates above which a radix level compacts them to its bucket before the next level.
COMPACT_MIN = tl.constexpr(8192)
# Bins of a level of the per-row kernel's descent over candidates held in registers (5-bit
# digits; _radix_topk_kernel).
REG_BINS = tl.constexpr(32)
# The largest per-row kernel block (TopkConfig.block / cand_block) launch_topk accepts:
# _select's packed scan holds a block's eq count in the high 16 bits of an int32.
TOPK_BLOCK_MAX = 16384
# The split top-k's plan runs over groups of PLAN_GROUP split histograms, one program per
# (row, group): B 1 L 128K has 264 splits, i.e. 33 programs; one program per row over all 264
# took 57-68 us on the H200 (ncu: one CTA, 10.8 cycles per issued instruction, 3.7 GB/s).
PLAN_GROUP = tl.constexpr(8)
# Split bases read per iteration by _topk_plan_part_kernel: next_pow2 of the count, at least
# PLAN_MIN, at most PLAN_BASES (plan_blocks).
PLAN_BASES = 1024
PLAN_MIN = 4
# The per-row kernel's histogram chunk when it sums the split histograms itself (no plan).
PLAN_SPLITS = 32


def _p2(n: int, lo: int, hi: int) -> int:
    return min(hi, max(lo, triton.next_power_of_2(max(n, 1))))


def plan_blocks(num_splits: int) -> tuple:
    """(groups, SBASE) of the split plan's first step for S splits: ``groups = ceil(S /
    PLAN_GROUP)`` programs of :func:`_topk_plan_part_kernel` per row, the split bases read
    SBASE at a time (B 1 L 128K: S 264 -> 33 groups, 512 bases)."""
    groups = -(-max(num_splits, 1) // PLAN_GROUP.value)
    return groups, _p2(num_splits, PLAN_MIN, PLAN_BASES)


def hist_shape(batch: int, num_splits: int, n_drafts: int) -> tuple:
    """Shape of the int32 histogram buffer the fused logits kernel writes for the top-k."""
    return (batch, num_splits, triton.next_power_of_2(n_drafts), HIST_ROW.value)


@dataclass(frozen=True)
class TopkConfig:
    """Launch configuration of :func:`launch_topk`.

    Attributes:
      block: positions per loop iteration (power of two) of the per-row kernel's passes over
        the row (no split pass B: no fused histogram or no page size).
      num_warps: Triton warps per program (one program per row).
      cand_block: candidates per loop iteration of the per-row kernel after a split pass B
        (the levels over the threshold bin's candidates, the selection and the -1 fill): the
        bench's rows have ~0.15-1.6K candidates (H200 sweeps: up to 1,129 at B 64 L 64K, 1,426
        at L 128K, 677 at V4 B 8 1M), so a 4,096 block ran several times the work per level;
        the registry picks 2,048 at top-k 2048 with >= 8 rows or L > 64K
        (``kernels.registry.TOPK_WIDE_CAND_BLOCK``), else this default.
    """

    block: int = 4096
    num_warps: int = 8
    cand_block: int = 1024

    # block 8192 at 4 warps spills (ptxas -v, sm_90 and sm_120); left out.
    SEARCH_SPACE = dict(block=(2048, 4096, 8192), num_warps=(8, 16), cand_block=(1024, 2048, 4096))


def _lengths_per_row(lengths, R: int, n_drafts: int) -> int:
    """The kernels' ``per_row`` flag for ``lengths`` of ``R`` rows: 1 for ``R`` row lengths, 0
    for ``R / n_drafts`` request lengths (the MTP rule). Raises ValueError otherwise."""
    if lengths.numel() == R:
        return 1
    if n_drafts >= 1 and lengths.numel() * n_drafts == R:
        return 0
    raise ValueError(f"lengths: expected {R} row lengths or {R // max(n_drafts, 1)} request "
                     f"lengths (n_drafts={n_drafts}), got shape {tuple(lengths.shape)}")


@triton.jit
def order_key(x):
    """Order-preserving uint32 key of float32 ``x``; 0 for NaN and -inf (never selected).

    -0.0 is mapped to +0.0 first: they compare equal, so they tie (by position) as in the
    reference.
    """
    x = tl.where(x == 0.0, 0.0, x)
    u = x.to(tl.uint32, bitcast=True)
    sign_bit = tl.full(u.shape, 0x80000000, tl.uint32)
    key = tl.where((u & sign_bit) != 0, ~u, u | sign_bit)
    ok = (x == x) & (x != float("-inf"))
    return tl.where(ok, key, tl.zeros_like(key))


@triton.jit
def window_base(kmax):
    """Upper window base (int32) for the largest key ``kmax``: its digit lands in bin 255."""
    return (kmax >> WINDOW_SHIFT).to(tl.int32) - (HIST_BINS - 1)


@triton.jit
def window_lbase(kmin):
    """Lower window base (int32) for the smallest qualifying key ``kmin``: its digit lands in
    bin 0."""
    return (kmin >> WINDOW_SHIFT).to(tl.int32)


@triton.jit
def min_key(key):
    """``key`` with 0 (not qualifying) replaced by 0xFFFFFFFF, for a min over qualifying keys."""
    return tl.where(key != 0, key, ~tl.zeros_like(key))


@triton.jit
def digit_bin(d, base, lbase):
    """Bin (int32 in ``[0, 256)``) of the first digit ``d`` (int32, ``key >> 20``) under window
    bases ``(base, lbase)``: ``d - base`` when that is ``>= UPPER_LO`` (the upper window; at most
    255), else ``d - lbase`` when that is ``< MID_BIN`` (the lower window; at least 0), else
    ``MID_BIN``. Monotone in ``d``: the selection stays exact whatever the bases; with ``base +
    255 >= `` every key's digit ``>= lbase`` no bin but the middle one spans two digits."""
    u = d - base
    low = tl.minimum(tl.maximum(d - lbase, 0), MID_BIN)
    return tl.where(u >= UPPER_LO, tl.minimum(u, HIST_BINS - 1), low)


@triton.jit
def window_bin(key, base, lbase):
    """First digit bin of ``key`` (:func:`digit_bin` of ``key >> 20``)."""
    return digit_bin((key >> WINDOW_SHIFT).to(tl.int32), base, lbase)


@triton.jit
def bin_digit(c, base, lbase):
    """The digit of single-digit bin ``c`` under ``(base, lbase)`` (not meaningful for
    ``MID_BIN``)."""
    return tl.where(c >= UPPER_LO, base + c, lbase + c)


@triton.jit
def bin_key_range(d0, base, lbase):
    """``(key_lo, key_hi)`` uint32: the qualifying keys of bin ``d0`` (any bin: a window digit,
    the middle, the clamped end bins) are exactly ``key_lo <= key <= key_hi``; keys above
    ``key_hi`` (up to +inf's key) are in higher bins. ``d0 = -1`` (every key taken): an empty
    range below every qualifying key. Qualifying keys lie in ``[0x00800000, 0xFF800000]``
    (-FLT_MAX .. +inf), so raw keys of NaN and -inf fall outside."""
    lo = tl.where(d0 == MID_BIN, lbase + MID_BIN, bin_digit(d0, base, lbase))
    hi = tl.where(d0 == MID_BIN, base + (UPPER_LO - 1), lo)
    lo = tl.where(d0 == 0, 0, lo)                              # bin 0: every digit below lbase
    hi = tl.where(d0 == HIST_BINS - 1, 4095, hi)               # bin 255: every digit above
    lo = tl.minimum(tl.maximum(lo, 0), 4095).to(tl.uint32) << WINDOW_SHIFT
    hi = (tl.minimum(tl.maximum(hi, 0), 4095).to(tl.uint32) << WINDOW_SHIFT) | 0xFFFFF
    key_lo = tl.maximum(lo, tl.full((), 0x00800000, tl.uint32))
    key_hi = tl.minimum(hi, tl.full((), 0xFF800000, tl.uint32))
    none = d0 < 0
    key_lo = tl.where(none, tl.full((), 0xFFFFFFFF, tl.uint32), key_lo)
    key_hi = tl.where(none, tl.full((), 0x007FFFFF, tl.uint32), key_hi)
    return key_lo, key_hi


@triton.jit
def rebase_index(c, base, lbase, b_old, l_old):
    """For the bins ``c`` of a histogram at ``(base, lbase)``, the bin of the same digit in a
    histogram taken at ``(b_old <= base, l_old >= lbase)`` and whether it holds that digit's
    count: every bin but ``MID_BIN`` is one digit, found in the old histogram as one digit too
    (its upper or lower window: the old middle lies inside the new one), or absent (above the
    old top, below the old bottom: no key there; or a lower-window digit the new upper window
    already holds). The new middle bin is the total minus the others."""
    d = bin_digit(c, base, lbase)
    ok = (c != MID_BIN) & ((c >= UPPER_LO) | (d < base + UPPER_LO))
    ok = ok & (d >= l_old) & (d <= b_old + (HIST_BINS - 1))
    return digit_bin(d, b_old, l_old), ok


@triton.jit
def window_rebase(hist, b_old, l_old, base, lbase):
    """Histograms ``hist`` int32 ``[M, 256]`` taken at bases ``(b_old, l_old)`` (int32 ``[M]``),
    brought to ``(base >= b_old, lbase <= l_old)``: exact, since each new bin is either one digit
    (an old bin of one digit, or empty) or the middle, which only grows (total minus the rest)."""
    c = tl.arange(0, HIST_BINS)[None, :]
    idx, ok = rebase_index(c, base[:, None], lbase[:, None], b_old[:, None], l_old[:, None])
    g = tl.gather(hist, tl.where(ok, idx, 0), axis=1)
    g = tl.where(ok, g, 0)
    mid = tl.sum(hist, axis=1) - tl.sum(g, axis=1)
    return tl.where(c == MID_BIN, mid[:, None], g)


@triton.jit
def window_hist_add(hist, base, lbase, key, NB: tl.constexpr, T: tl.constexpr):
    """Add the keys ``key`` uint32 ``[NB, T]`` (row n of ``key`` into histogram n; key 0 is not
    counted) to the windowed histograms ``hist`` int32 ``[NB * 256]`` (row n at ``n * 256``)
    of running bases ``base``, ``lbase`` int32 ``[NB]``; returns the new ``(hist, base,
    lbase)``. A block whose largest key lies above the upper window or whose smallest lies
    below the lower one moves the bases and rebases the histogram first, so no count is ever
    clamped at either end."""
    kmax = tl.max(key, axis=1)
    has = kmax != 0
    new_base = tl.where(has, tl.maximum(base, window_base(kmax)), base)
    new_lbase = tl.where(has, tl.minimum(lbase, window_lbase(tl.min(min_key(key), axis=1))), lbase)
    if tl.max((new_base - base) + (lbase - new_lbase), axis=0) > 0:
        h2 = window_rebase(tl.reshape(hist, (NB, HIST_BINS)), base, lbase, new_base, new_lbase)
        hist = tl.reshape(h2, (NB * HIST_BINS,))
    bins = (window_bin(key, new_base[:, None], new_lbase[:, None])
            + tl.arange(0, NB)[:, None] * HIST_BINS)
    hist += tl.histogram(tl.reshape(bins, (NB * T,)), NB * HIST_BINS,
                         mask=tl.reshape(key != 0, (NB * T,)))
    return hist, new_base, new_lbase


@triton.jit
def _window_hist(x_row, lo, hi, BLOCK: tl.constexpr):
    """Pass A over positions ``[lo, hi)`` of a row (one read): the windowed first-digit
    histogram (int32 ``[256]``) of its qualifying keys at their exact bases, and the bases
    (int32 scalars; ``BASE_NONE`` / ``LBASE_NONE`` without a qualifying key), accumulated
    against the running max / min (:func:`window_hist_add`)."""
    offs = tl.arange(0, BLOCK)
    hist = tl.zeros((HIST_BINS,), tl.int32)
    base = tl.full((1,), BASE_NONE, tl.int32)
    lbase = tl.full((1,), LBASE_NONE, tl.int32)
    for start in range(lo, hi, BLOCK):
        o = start + offs
        key = order_key(tl.load(x_row + o, mask=o < hi, other=float("-inf")))
        hist, base, lbase = window_hist_add(hist, base, lbase, tl.reshape(key, (1, BLOCK)), 1,
                                            BLOCK)
    return hist, tl.max(base, axis=0), tl.min(lbase, axis=0)


@triton.jit
def _row_len(len_ptr, row, n_drafts, per_row, W):
    """Valid length (int32) of row ``row = b * N + i``: ``len[row]`` when ``per_row``, else the
    MTP rule ``len[b] - (N - 1 - i)``; clamped to ``[0, W]`` (64-bit arithmetic)."""
    b = row // n_drafts
    i = row % n_drafts
    src = tl.where(per_row != 0, row, b)
    L = tl.load(len_ptr + src).to(tl.int64) - tl.where(per_row != 0, 0, n_drafts - 1 - i)
    return tl.maximum(tl.minimum(L, W), 0).to(tl.int32)


@triton.jit
def _load_rebased(h_row, s, ms, split_stride, base, lbase):
    """The histogram blocks of splits ``s`` (int32 ``[SB]``, mask ``ms``) at ``h_row + s *
    split_stride``, brought to the row's bases ``(base, lbase)`` (as :func:`window_rebase`) by
    indexed loads: each single-digit bin is read from the block's bin of the same digit, the
    middle bin is the block's total minus them. No register gather (``tl.gather`` of a
    ``[SB, 256]`` tile, with the per-split prefix store, was 68 us of the B 1 L 128K top-k on
    the H200: 264 splits). Returns int32 ``[SB, 256]``."""
    c = tl.arange(0, HIST_BINS)[None, :]
    blk = h_row + s.to(tl.int64)[:, None] * split_stride
    bs = tl.load(blk + HIST_BINS, mask=ms[:, None], other=BASE_NONE)            # [SB, 1]
    ls = tl.load(blk + (HIST_BINS + 1), mask=ms[:, None], other=LBASE_NONE)
    idx, ok = rebase_index(c, base, lbase, bs, ls)
    g = tl.load(blk + idx, mask=ms[:, None] & ok, other=0)
    tot = tl.sum(tl.load(blk + c, mask=ms[:, None], other=0), axis=1)
    return tl.where(c == MID_BIN, (tot - tl.sum(g, axis=1))[:, None], g)


@triton.jit
def _row_base(h_row, split_stride, num_splits, SBASE: tl.constexpr):
    """The row's window bases: the largest of its ``num_splits`` split bases (word HIST_BINS of
    each histogram block) and the smallest of their lower bases (word HIST_BINS + 1)."""
    base = tl.full((), BASE_NONE, tl.int32)
    lbase = tl.full((), LBASE_NONE, tl.int32)
    for s0 in range(0, num_splits, SBASE):
        s = s0 + tl.arange(0, SBASE)
        at = h_row + s.to(tl.int64) * split_stride + HIST_BINS
        bs = tl.load(at, mask=s < num_splits, other=BASE_NONE)
        ls = tl.load(at + 1, mask=s < num_splits, other=LBASE_NONE)
        base = tl.maximum(base, tl.max(bs, axis=0))
        lbase = tl.minimum(lbase, tl.min(ls, axis=0))
    return base, lbase


@triton.jit
def _sum_split_hists(h_row, split_stride, num_splits, base, lbase, SB: tl.constexpr):
    """Sum (int32 ``[256]``) of the ``num_splits`` histogram blocks at ``h_row + s *
    split_stride`` (each 256 counts then its bases), each brought to the row's bases."""
    sv = tl.arange(0, SB)
    hist = tl.zeros((HIST_BINS,), tl.int32)
    for s0 in range(0, num_splits, SB):
        s = s0 + sv
        hist += tl.sum(_load_rebased(h_row, s, s < num_splits, split_stride, base, lbase), axis=0)
    return hist


@triton.jit
def _pack_max(a_total, a_bin, b_total, b_bin):
    return tl.maximum(a_total, b_total), tl.maximum(a_bin, b_bin)


@triton.jit
def _threshold_bin(ge, hist, bins, need):
    """``(total, d_sel, n_gt, n_eq)`` of a histogram ``hist`` (counts < 2^27) and its reverse
    cumsum ``ge``: ``total = ge[0]``; ``d_sel`` the largest bin with ``ge >= need`` (-1 if none),
    ``n_gt`` the count above it and ``n_eq`` its own. One two-operand max reduction (one
    cross-warp exchange) instead of a max and three sums: bin ``d``'s word packs ``(d, ge[d],
    hist[d])`` into 62 bits (8 + 27 + 27; a row's counts are positions, far below 2^27), so the
    maximum over the qualifying bins is ``d_sel``'s word and ``n_gt = ge[d_sel] - hist[d_sel]``.
    No bin qualifies (``need > total``, which a consistent plan never asks): ``d_sel`` -1,
    ``n_gt = total``, ``n_eq`` 0, as the sums gave."""
    word = ((bins.to(tl.int64) << 54) | (ge.to(tl.int64) << 27) | hist.to(tl.int64))
    word = tl.where(ge >= need, word, -1)
    total, best = tl.reduce((ge, word), 0, _pack_max)
    hit = best >= 0
    d_sel = tl.where(hit, (best >> 54).to(tl.int32), -1)
    n_eq = tl.where(hit, (best & 0x7FFFFFF).to(tl.int32), 0)
    n_gt = tl.where(hit, ((best >> 27) & 0x7FFFFFF).to(tl.int32) - n_eq, total)
    return total, d_sel, n_gt, n_eq


@triton.jit
def _first_digit(hist, topk):
    """Threshold bin of the windowed histogram. Returns ``(d0, need, done, total, n_eq)``:
    ``d0`` -1 when every qualifying key is taken (``total <= topk``); ``need`` positions still
    to take from bin ``d0``; ``done`` when bin ``d0`` is taken whole."""
    bins = tl.arange(0, HIST_BINS)
    total = tl.sum(hist, axis=0)
    ge = tl.cumsum(hist, axis=0, reverse=True)                     # count with bin >= d
    # (a max and three sums, not _threshold_bin's one packed reduction: in the split pass B's
    # plan the packed words cost the pass B loop 20 bytes of spills at its 128-register cap;
    # AOT, Triton 3.6.0, sm_90)
    d_sel = tl.max(tl.where(ge >= topk, bins, -1), axis=0)
    n_gt = tl.sum(tl.where(bins > d_sel, hist, 0), axis=0)
    n_eq = tl.sum(tl.where(bins == d_sel, hist, 0), axis=0)
    all_in = total <= topk
    d0 = tl.where(all_in, -1, d_sel)
    need = tl.where(all_in, topk, topk - n_gt)
    done = (all_in | (n_eq == need)).to(tl.int32)
    n_eq = tl.where(all_in, 0, n_eq)
    return d0, need, done, total, n_eq


@triton.jit
def _descend(hist, SHIFT: tl.constexpr, bins, prefix, mask, need, done,
             DIGIT: tl.constexpr = 0xFF):
    """One radix level over bits ``[SHIFT, SHIFT + w)`` of the key (``DIGIT = 2^w - 1``; bits
    past 31 are none): pick the threshold digit from ``hist`` (counts of that digit among keys
    with ``key & mask == prefix``) unless ``done``. Returns (prefix, mask, need, done)."""
    ge = tl.cumsum(hist, axis=0, reverse=True)                     # count with digit >= d
    _, d_sel, n_gt, n_eq = _threshold_bin(ge, hist, bins, need)
    upd = done == 0
    prefix = tl.where(upd, prefix | (d_sel.to(tl.uint32) << SHIFT), prefix)
    mask = tl.where(upd, mask | (tl.full((), DIGIT, tl.uint32) << SHIFT), mask)
    need = tl.where(upd, need - n_gt, need)
    # The chosen bucket is taken whole: no need to look at lower digits.
    done = tl.where(upd & (n_eq == need), 1, done)
    return prefix, mask, need, done


@triton.jit
def key_float(key):
    """The float32 whose :func:`order_key` is ``key`` (uint32, a qualifying key in
    ``[0x00800000, 0xFF800000]``, or 0x007FFFFF: -inf's), for comparing floats instead of keys:
    for every non-NaN float ``x`` and such ``k``, ``order_key(x) > k`` iff ``x > key_float(k)``
    and ``order_key(x) >= k`` iff ``x >= key_float(k)``, except at ``k = 0x7FFFFFFF`` (no float
    has that key: -0.0 is keyed as +0.0), which is read as 0x7FFFFFFE (-denorm_min), so both
    zeros fall on the +0.0 side. Keys of NaN (above +inf's, below -inf's) give NaN, which no
    comparison passes."""
    key = tl.where(key == 0x7FFFFFFF, tl.full(key.shape, 0x7FFFFFFE, tl.uint32), key)
    u = tl.where(key >= 0x80000000, key ^ 0x80000000, ~key)
    return u.to(tl.float32, bitcast=True)


@triton.jit
def _b_bounds(key_lo, key_hi, done):
    """Pass B's float thresholds for the threshold bin ``[key_lo, key_hi]`` (uint32 scalars,
    :func:`bin_key_range`) and ``done`` (int32 scalar): ``(f_dir, f_lo, f_hi)`` with ``direct
    = x > f_dir`` (above the bin, or in it once the descent is done: the keys above ``key_lo -
    1``; with ``d0 = -1``, ``key_hi`` is -inf's key and every qualifying key is direct) and
    ``keep = (x >= f_lo) & (x <= f_hi)`` (in the bin while the descent is not done; ``f_lo``
    NaN when it is, so no key is kept). The same sets as comparing the keys (:func:`order_key`) with
    the bin (:func:`key_float`); NaN and -inf pass neither comparison. The bounds are first
    clamped to the qualifying keys (``key_lo >= 0x00800000``, ``0x007FFFFF <= key_hi <=
    0xFF800000``: the same sets), so no bound is a NaN key."""
    key_lo = tl.maximum(key_lo, tl.full((), 0x00800000, tl.uint32))
    key_hi = tl.minimum(tl.maximum(key_hi, tl.full((), 0x007FFFFF, tl.uint32)),
                        tl.full((), 0xFF800000, tl.uint32))
    key_dir = tl.where(done != 0, tl.minimum(key_lo - 1, key_hi), key_hi)
    f_lo = tl.where(done != 0, float("nan"), key_float(key_lo))
    return key_float(key_dir), f_lo, key_float(key_hi)


@triton.jit
def _b_flags(x, f_dir, f_lo, f_hi):
    """Pass B's two predicates of float32 logits ``x`` (:func:`_b_bounds`): ``direct`` (to the
    output) and ``keep`` (into the candidate row). Float comparisons, not keys: the key
    transform (five instructions a position) is left to the candidates (:func:`_cand_keys`)."""
    return x > f_dir, (x >= f_lo) & (x <= f_hi)


@triton.jit
def _b_block(x, pos, o_row, c_row, f_dir, f_lo, f_hi, pairs_v, pos_off, n_out, n_cand,
             VEC: tl.constexpr):
    """One block of :func:`_pass_b`: logits ``x`` at positions ``pos`` (masked to -inf where
    they take no part), stored from the offsets ``(n_out, n_cand)``; returns the new offsets."""
    direct, keep = _b_flags(x, f_dir, f_lo, f_hi)
    both = direct.to(tl.int32) + (keep.to(tl.int32) << 16)
    cs = tl.cumsum(both, axis=0)
    if VEC:                         # layout hints only (see _pass_b): stores stay scalar
        slot = tl.max_contiguous(tl.multiple_of((cs & 0xFFFF) + n_out - 1, 4), 4)
        cslot = (cs >> 16) + n_cand - 1
        pslot = tl.max_contiguous(tl.multiple_of(cslot + pos_off, 4), 4)
        cslot = tl.max_contiguous(tl.multiple_of(cslot, 4), 4)
        tl.store(o_row + slot, pos, mask=direct)
        tl.store(c_row + pslot, pos, mask=keep)
    else:                           # the scalar path as it was (same SASS as before VEC)
        slot = (cs & 0xFFFF) + n_out - 1
        tl.store(o_row + slot, pos, mask=direct)
        cslot = (cs >> 16) + n_cand - 1
        tl.store(c_row + pos_off + cslot, pos, mask=keep)
    # the pair's first word: the logit's bits (its key is made where it is read, _cand_keys)
    tl.store(c_row + cslot, x.to(tl.int32, bitcast=True), mask=keep & pairs_v)
    tot = tl.sum(both, axis=0)
    return n_out + (tot & 0xFFFF), n_cand + (tot >> 16)


@triton.jit
def _pass_b(x_row, o_row, c_row, lo, hi, key_lo, key_hi, done, pairs, cap, n_out, n_cand,
            BLOCK: tl.constexpr, W=0, VEC: tl.constexpr = False):
    """Pass B over positions ``[lo, hi)`` of one row: keys above the threshold bin (``key >
    key_hi``, :func:`bin_key_range`) go to the output at ``n_out, n_out + 1, ...``, keys in it
    (``key_lo <= key <= key_hi``) too when the descent is ``done``, else they are compacted
    into the candidate row at ``n_cand, ...`` (the logit's bits at ``c_row[c]`` and position at
    ``c_row[cap + c]`` when ``pairs``, else the position at ``c_row[c]``); both in ascending
    position order. One inclusive scan per block gives both slot sequences (output count in
    the low 16 bits, candidate count in the high 16; BLOCK < 2^16) and one sum both totals.

    ``VEC`` (the split pass B with ``lo`` a multiple of 16 and ``W`` the row's width, a
    multiple of 16): the loads run to ``hi`` rounded up to 16 positions (at most ``W``; keys at
    or past ``hi`` are masked to -inf after the load, in the last, partial block only: the
    whole blocks run without a mask, the partial one after the loop, :func:`_b_block` for
    both), so each thread's keys come as 16-byte
    loads, 4 contiguous keys a thread, and the scan runs over those runs instead of one warp scan
    a key. The three scattered stores keep that layout: their slot tensors carry a
    ``multiple_of`` / ``max_contiguous`` hint of 4, which only steers Triton's coalescing pass
    (without it the stores get a one-key-a-thread layout and every block converts its slots
    through shared memory); the hint is not true of the slots, and it is safe because every
    store is masked by a per-key predicate (constancy 1), which caps the store's vector width at
    one key, so each key is stored at its own address (bench/NOTES.md "Top-k pass B: one layout
    for loads, scan and stores"; the AOT count checks that no vector store is emitted).
    Each block's loads are issued one iteration ahead (a register copy of the next block), so a
    program's blocks are no longer one DRAM round trip each; the last prefetch is masked off
    whole (no memory transaction).
    Returns the new ``(n_out, n_cand)``."""
    offs = tl.arange(0, BLOCK)
    zero = tl.zeros((BLOCK,), tl.int32)
    pairs_v = (zero + pairs) != 0                                    # [BLOCK] (see NOTE below)
    pos_off = tl.where(pairs != 0, cap, 0)
    f_dir, f_lo, f_hi = _b_bounds(key_lo, key_hi, done)
    if VEC:
        hi_ld = tl.minimum((hi + 15) // 16 * 16, W)
    else:
        hi_ld = hi
    # the next block's loads are issued before this block's scan and stores (one block in
    # flight: the loop was a chain of DRAM round trips, one a block)
    x_next = tl.load(x_row + lo + offs, mask=lo + offs < hi_ld, other=float("-inf"))
    if VEC:
        # Whole blocks first, without a mask on a position (every one is below hi), their next
        # block's loads unmasked while it is whole; the last, partial block after the loop.
        # (Per key, the mask, the -inf fill of the masked loads and their copies were ~3 of
        # ~41 SASS a key, the mask's ISETP / FSEL on the ALU pipe, the loop's limit: Nsight
        # Compute, H100, 2026-12-06, bench/NOTES.md "Twenty-first session"; as a branch in
        # the loop ptxas predicated it, so the tail is peeled.)
        # (hi <= lo, an empty range past the row's prefix, can be more than a block below lo:
        # clamped, so no block runs whichever way the division rounds)
        whole_end = lo + tl.maximum(hi - lo, 0) // BLOCK * BLOCK
        for start in range(lo, whole_end, BLOCK):
            pos = start + offs
            x = x_next
            if start + 2 * BLOCK <= hi_ld:
                x_next = tl.load(x_row + pos + BLOCK)
            else:
                x_next = tl.load(x_row + pos + BLOCK, mask=pos + BLOCK < hi_ld,
                                 other=float("-inf"))
            n_out, n_cand = _b_block(x, pos, o_row, c_row, f_dir, f_lo, f_hi, pairs_v, pos_off,
                                     n_out, n_cand, True)
        if whole_end < hi:          # loaded positions past hi take no part
            pos = whole_end + offs
            x = tl.where(pos < hi, x_next, float("-inf"))
            n_out, n_cand = _b_block(x, pos, o_row, c_row, f_dir, f_lo, f_hi, pairs_v, pos_off,
                                     n_out, n_cand, True)
    else:
        for start in range(lo, hi, BLOCK):
            pos = start + offs
            x = x_next
            x_next = tl.load(x_row + pos + BLOCK, mask=pos + BLOCK < hi_ld, other=float("-inf"))
            n_out, n_cand = _b_block(x, pos, o_row, c_row, f_dir, f_lo, f_hi, pairs_v, pos_off,
                                     n_out, n_cand, False)
    return n_out, n_cand


@triton.jit
def _count_b(x_row, lo, hi, key_lo, key_hi, done, BLOCK: tl.constexpr):
    """What :func:`_pass_b` over positions ``[lo, hi)`` would add to its two offsets, without
    storing anything: ``(n_out, n_cand)`` int32, the keys it would write to the output and to
    the candidate row (the same predicates, loads and masking). A sub-split of a logits split
    (:func:`_topk_scatter_kernel`, ``sub > 1``) counts the positions of its split before its own
    range this way."""
    offs = tl.arange(0, BLOCK)
    f_dir, f_lo, f_hi = _b_bounds(key_lo, key_hi, done)
    n_out = tl.zeros((), tl.int32)
    n_cand = tl.zeros((), tl.int32)
    for start in range(lo, hi, BLOCK):
        pos = start + offs
        x = tl.load(x_row + pos, mask=pos < hi, other=float("-inf"))
        direct, keep = _b_flags(x, f_dir, f_lo, f_hi)
        tot = tl.sum(direct.to(tl.int32) + (keep.to(tl.int32) << 16), axis=0)
        n_out += tot & 0xFFFF
        n_cand += tot >> 16
    return n_out, n_cand


@triton.jit
def _cand_word_keys(x_row, first, second, m, pairs_v):
    """Keys and positions of candidates (mask ``m``) from their scratch words: ``first`` at
    ``c_row[c]`` (the logit's bits with pairs, as pass B and the compaction store them, else the
    position) and ``second`` at ``c_row[cap + c]`` (the position, with pairs); without pairs the
    key is gathered from the logits through the position. Either way :func:`order_key` of the
    logit; key 0 where ``m`` is off. The per-row kernel's register path uses it on the words it
    loads with the plan state; :func:`_cand_keys` (the passes over more candidates) keeps its
    own loads, masked per layout: built on this helper it took 8 more registers (104 -> 112,
    AOT, Triton 3.6.0, sm_90)."""
    kx = order_key(tl.load(x_row + first, mask=m & (pairs_v == 0), other=float("-inf")))
    kp = order_key(first.to(tl.float32, bitcast=True))
    return tl.where(m, tl.where(pairs_v, kp, kx), 0), tl.where(pairs_v, second, first)


@triton.jit
def _cand_keys(x_row, c_row, o, m, pairs_v, pos_off, NEED_POS: tl.constexpr):
    """Keys (and positions if ``NEED_POS``) of candidates ``o`` (mask ``m``): from the pairs'
    first words (the logits' bits, as pass B and the compaction store them), or gathered from
    the logits through the positions; either way :func:`order_key` of the logit."""
    kp = order_key(tl.load(c_row + o, mask=m & pairs_v, other=-8388608)   # -inf's bits: key 0
                   .to(tl.float32, bitcast=True))
    if NEED_POS:
        pos = tl.load(c_row + pos_off + o, mask=m, other=0)
    else:
        pos = tl.load(c_row + o, mask=m & (pairs_v == 0), other=0)
    kx = order_key(tl.load(x_row + pos, mask=m & (pairs_v == 0), other=float("-inf")))
    return tl.where(pairs_v, kp, kx), pos


@triton.jit
def _select(key, pos, m, prefix, mask, need, eq_seen, n_out, o_row):
    """Selection over candidates ``(key, pos)`` (mask ``m``) in position order: keys above the
    final bucket ``prefix`` (bits ``mask``) are taken, keys in it while their running rank
    ``eq_seen + ...`` is ``<= need`` (the SPEC tie rule: smaller position wins). Writes them to
    ``o_row`` from ``n_out``; returns the new ``(eq_seen, n_out)``."""
    hi_bits = key & mask
    gt = m & (hi_bits > prefix)
    eq = m & (hi_bits == prefix)
    # one scan for both running counts: gt in the low 16 bits, eq in the high (a block has at
    # most TOPK_BLOCK_MAX = 16,384 elements, so the low count never carries and the high one
    # stays positive). The eq keys are taken in position order while their rank is <= need, so
    # the eq keys taken up to i are max(min(eq_rank_i, need) - eq_seen, 0) and the slot of a
    # taken key follows without a second scan over ``sel``.
    both = gt.to(tl.int32) | (eq.to(tl.int32) << 16)
    c = tl.cumsum(both, axis=0)
    eq_rank = (c >> 16) + eq_seen
    sel = gt | (eq & (eq_rank <= need))
    slot = (c & 0xFFFF) + tl.maximum(tl.minimum(eq_rank, need) - eq_seen, 0) + n_out - 1
    tl.store(o_row + slot, pos, mask=sel)
    t = tl.sum(both, axis=0)
    eq_all = eq_seen + (t >> 16)
    return eq_all, n_out + (t & 0xFFFF) + tl.maximum(tl.minimum(eq_all, need) - eq_seen, 0)


@triton.jit
def _radix_topk_kernel(
    x_ptr,            # [R, W] float32 rows (only [0, len[r]) is read)
    len_ptr,          # [R] int32 row lengths (per_row), or [B] request lengths (MTP rule)
    out_ptr,          # [R, topk] int32 selected positions, -1 padded
    cand_ptr,         # [R, >= W] int32 scratch: level-0 threshold-bin candidates
    hist_ptr,         # [B, S, NB, HIST_ROW] int32 per-split windowed histograms (HAS_HIST)
    W, topk,
    stride_x, stride_o, stride_c, cap,
    n_drafts, per_row, n_drafts_pow2, num_splits,
    state_ptr,        # [R, STATE_WORDS] int32 plan (FROM_PLAN; STATE_FIELDS); word 9 written here
    BLOCK: tl.constexpr, HAS_HIST: tl.constexpr, FROM_PLAN: tl.constexpr,
    PLAN_SB: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:                         # launched early (programmatic dependent launch): wait for the
        gdc_wait()                  # previous kernel's writes before touching memory
    row = tl.program_id(0).to(tl.int64)
    L = _row_len(len_ptr, row, n_drafts, per_row, W)
    x_row = x_ptr + row * stride_x
    o_row = out_ptr + row * stride_o
    c_row = cand_ptr + row * stride_c
    offs = tl.arange(0, BLOCK)
    bins = tl.arange(0, 256)

    if FROM_PLAN:
        # Passes A and B ran as the plan + _topk_scatter_kernel (split over programs).
        st = state_ptr + row * STATE_WORDS
        base = tl.load(st + 0)
        lbase = tl.load(st + 1)
        d0 = tl.load(st + 2)
        need = tl.load(st + 3)
        done = tl.load(st + 4)
        total = tl.load(st + 5)
        n_out = tl.load(st + 6)
        n_cand = tl.load(st + 7)
        pairs = tl.load(st + 8)
        # The candidate row's first BLOCK words of both halves, issued with the state (not after
        # it: the count and the layout come from the state, so these loads were a second L2
        # round trip): the pairs' logit bits (or positions, without pairs) and the pairs'
        # positions. Words past the count are stale and masked where they are used.
        # (the row holds >= max(W, 2 cap) words: without pairs the positions fill [0, n_cand)
        # with n_cand up to W, which is 2 cap + 1 for an odd scratch width)
        w_first = tl.load(c_row + offs, mask=(offs < 2 * cap) | (offs < W), other=0)
        w_pos = tl.load(c_row + cap + offs, mask=offs < cap, other=0)
    else:
        # Pass A: windowed histogram of the first digit, summed from the logits kernel's
        # per-split histograms (fused) or built by reading the whole prefix.
        if HAS_HIST:
            h_row, split_stride, base, lbase = _plan_row(hist_ptr, row, n_drafts, n_drafts_pow2,
                                                         num_splits, PLAN_SB)
            hist = _sum_split_hists(h_row, split_stride, num_splits, base, lbase, PLAN_SB)
        else:
            hist, base, lbase = _window_hist(x_row, 0, L, BLOCK)
        d0, need, done, total, n_eq = _first_digit(hist, topk)
        pairs = (n_eq <= cap).to(tl.int32)
        # Pass B (whole prefix): keys above the threshold bin go straight to the output; keys in
        # it go to the output too when the descent is over, else they are compacted (in
        # position order) into the scratch row for the lower digits.
        key_lo, key_hi = bin_key_range(d0, base, lbase)
        n_out, n_cand = _pass_b(x_row, o_row, c_row, 0, L, key_lo, key_hi, done, pairs, cap,
                                tl.zeros((), tl.int32), tl.zeros((), tl.int32), BLOCK)
        # The candidate row is read back below by other threads of this program: make every store
        # of pass B visible first (bar.sync orders global memory within the CTA).
        tl.debug_barrier()

    # The level-0 bucket as high bits of the key: a single-digit bin (either window) fixes
    # key >> 20; the middle bin (a window miss) fixes nothing: the candidates are exactly the
    # keys between the windows, and the descent runs over the full key.
    hit = (d0 >= 0) & (d0 != MID_BIN)
    digit = bin_digit(d0, base, lbase)
    prefix = tl.where(hit, digit.to(tl.uint32) << WINDOW_SHIFT, tl.zeros((), tl.uint32))
    mask = tl.where(hit, tl.full((), 0xFFF00000, tl.uint32), tl.zeros((), tl.uint32))
    zero = tl.zeros((BLOCK,), tl.int32)
    pairs_v = (zero + pairs) != 0
    pos_off = tl.where(pairs != 0, cap, 0)
    visits = tl.zeros((), tl.int32)           # candidate reads (elements) of the passes below
    n_sel = tl.minimum(total, topk)

    in_regs = n_cand < 0                      # (False) the candidates were handled in registers
    if FROM_PLAN:                             # (the split path's cand_block: at most 4,096)
        if n_cand <= BLOCK:
            # The bench's rows (~0.1-1K candidates): read them once, descend and select in
            # registers.
            m = offs < n_cand
            key, pos = _cand_word_keys(x_row, w_first, w_pos, m, pairs_v)   # loaded with the state
            visits += n_cand
            # 5-bit digits (32-bin histograms) from bit 30 down: after a window digit (bits
            # 31..20 fixed) the levels at 15, 10, 5, 0; after a window miss all seven. Triton's
            # histogram (a ballot a bit, then each lane's bins) costs ~12 SASS an element at 32
            # bins against ~45 at 256, and its bins are at least a warp's 32 lanes.
            bins_r = tl.arange(0, REG_BINS)
            for lvl in tl.static_range(0, 7):
                SHIFT = 30 - 5 * lvl                               # constexpr (static loop)
                full = (tl.full((), 0xFFFFFFFF, tl.uint32) >> SHIFT) & (REG_BINS - 1)
                open_ = ((mask >> SHIFT) & (REG_BINS - 1)) != full   # digit not yet fixed
                if (done == 0) & open_:
                    hist = tl.histogram(((key >> SHIFT) & (REG_BINS - 1)).to(tl.int32),
                                        REG_BINS, mask=m & ((key & mask) == prefix))
                    prefix, mask, need, done = _descend(hist, SHIFT, bins_r, prefix, mask,
                                                        need, done, REG_BINS - 1)
            _, n_out = _select(key, pos, m, prefix, mask, need, tl.zeros((), tl.int32), n_out,
                               o_row)
            in_regs = n_cand >= 0
    if in_regs == 0:
        # Lower digits over the compacted candidates only (empty when the descent is over).
        for lvl in tl.static_range(0, 4):
            SHIFT = 24 - 8 * lvl                                   # constexpr (static loop)
            open_ = ((mask >> SHIFT) & 0xFF) != 0xFF
            if (done == 0) & open_:
                hist = tl.zeros((256,), tl.int32)
                for start in range(0, n_cand, BLOCK):
                    o = start + offs
                    m = o < n_cand
                    key, _ = _cand_keys(x_row, c_row, o, m, pairs_v, pos_off, False)
                    m = m & ((key & mask) == prefix)
                    hist += tl.histogram(((key >> SHIFT) & 0xFF).to(tl.int32), 256, mask=m)
                visits += n_cand
                prefix, mask, need, done = _descend(hist, SHIFT, bins, prefix, mask, need, done)
                # Many candidates (a window miss, wide ties): compact them in place to the new
                # bucket, in position order, writing the keys above it to the output now, so the
                # next levels read only the bucket. The threshold is independent of BLOCK, and so
                # is the output order.
                if SHIFT > 0:
                    if n_cand > COMPACT_MIN:
                        kept = tl.zeros((), tl.int32)
                        for start in range(0, n_cand, BLOCK):
                            o = start + offs
                            m = o < n_cand
                            key, pos = _cand_keys(x_row, c_row, o, m, pairs_v, pos_off, True)
                            tl.debug_barrier()      # every thread has read its slots before stores
                            hi_bits = key & mask
                            gt = m & (hi_bits > prefix)
                            eq = m & (hi_bits == prefix)
                            slot = tl.cumsum(gt.to(tl.int32), axis=0) + n_out - 1
                            tl.store(o_row + slot, pos, mask=gt)
                            # in place: slot <= o
                            cslot = tl.cumsum(eq.to(tl.int32), axis=0) + kept - 1
                            tl.store(c_row + pos_off + cslot, pos, mask=eq)
                            tl.store(c_row + cslot,
                                     key_float(key).to(tl.int32, bitcast=True),
                                     mask=eq & pairs_v)
                            n_out += tl.sum(gt.to(tl.int32), axis=0)
                            kept += tl.sum(eq.to(tl.int32), axis=0)
                        tl.debug_barrier()          # the compacted row is read by other threads
                        visits += n_cand
                        n_cand = kept

        # Selection over the candidates in position order.
        eq_seen = tl.zeros((), tl.int32)
        for start in range(0, n_cand, BLOCK):
            o = start + offs
            m = o < n_cand
            key, pos = _cand_keys(x_row, c_row, o, m, pairs_v, pos_off, True)
            eq_seen, n_out = _select(key, pos, m, prefix, mask, need, eq_seen, n_out, o_row)
        visits += n_cand

    # -1 padding of [min(C, topk), topk).
    for start in range(n_sel, topk, BLOCK):
        o = start + offs
        tl.store(o_row + o, tl.full((BLOCK,), -1, tl.int32), mask=o < topk)
    if FROM_PLAN:
        tl.store(state_ptr + row * STATE_WORDS + 9, visits)


# NOTE: scalar flags are broadcast through an int32 block before mixing with block masks: the
# CPU interpreter types ``scalar_bool | block_bool`` as int32 and then rejects it as a mask.


@triton.jit
def _split_range(len_ptr, row, n_drafts, per_row, s, num_splits, W, P, k, sub,
                 ALIGNED: tl.constexpr = False):
    """``(lo_split, lo, hi)``: the first position of logits split ``s`` of row ``row`` (the page
    range the logits kernel gives that split: ``n_pages = ceil(max_i len[b, i] / P)`` over the
    drafts of request ``b``, ``per = ceil(n_pages / S)`` pages per split) and the positions
    ``[lo, hi)`` of its sub-range ``k`` of ``sub`` (``ceil(per / sub)`` pages each, the last
    ones possibly empty; ``sub = 1``: the whole split), clipped to the row's valid prefix; with
    ``ALIGNED`` only ``hi`` is (an empty range, ``hi <= lo``, past it), so ``lo_split`` and
    ``lo`` stay multiples of ``P`` that the compiler can see (pass B's ``VEC`` loads)."""
    b = row // n_drafts
    dr = tl.arange(0, 4)            # N <= 4 drafts per request
    src = tl.where(per_row != 0, b * n_drafts + dr, b)
    lens = tl.load(len_ptr + src, mask=dr < n_drafts, other=0).to(tl.int64)
    lens = lens - tl.where(per_row != 0, 0, n_drafts - 1 - dr)
    lens = tl.where(dr < n_drafts, tl.maximum(tl.minimum(lens, W), 0), 0)
    n_pages = tl.minimum(tl.cdiv(tl.max(lens, axis=0), P), W // P).to(tl.int32)
    per = tl.cdiv(n_pages, num_splits)
    L = _row_len(len_ptr, row, n_drafts, per_row, W)
    sub_per = tl.cdiv(per, sub)
    first = s * per
    p0 = first + tl.minimum(k * sub_per, per)              # the sub-range's pages: [p0, p1)
    p1 = first + tl.minimum((k + 1) * sub_per, per)
    if ALIGNED:
        lo_split = first * P
        lo = p0 * P
    else:
        lo_split = tl.minimum(first * P, L)
        lo = tl.minimum(p0 * P, L)
    hi = tl.minimum(p1 * P, L)
    return lo_split, lo, hi


@triton.jit
def _plan_row(hist_ptr, row, n_drafts, n_drafts_pow2, num_splits, SBASE: tl.constexpr):
    """Row ``row = b * N + i``'s first split histogram, the stride between its splits and its
    window bases (the largest split base, the smallest lower base)."""
    b = row // n_drafts
    i = row % n_drafts
    split_stride = n_drafts_pow2 * HIST_ROW
    h_row = hist_ptr + (b * num_splits * n_drafts_pow2 + i) * HIST_ROW
    base, lbase = _row_base(h_row, split_stride, num_splits, SBASE)
    return h_row, split_stride, base, lbase


@triton.jit
def _prefix_counts(before, d0, done):
    """The output offset and the candidate offset of a split (int32 scalars) from ``before``
    (int32 ``[256]``: the summed histograms, at the row's bases, of the splits before it): its
    keys above bin ``d0`` (and in it when the descent is ``done``) and in bin ``d0`` otherwise.
    Counts add, so summing the histograms first gives each split's counts summed."""
    c = tl.arange(0, HIST_BINS)
    gt = tl.sum(tl.where(c > d0, before, 0), axis=0)
    eq = tl.sum(tl.where(c == d0, before, 0), axis=0)
    return tl.where(done != 0, gt + eq, gt), tl.where(done != 0, 0, eq)


@triton.jit
def _store_state(st, base, lbase, d0, need, done, total, n_eq, run, pairs):
    """The row's plan state (STATE_FIELDS; words past them zero) at ``st``."""
    c = tl.arange(0, HIST_BINS)
    n_gt = tl.sum(tl.where(c > d0, run, 0), axis=0)
    w = tl.arange(0, STATE_WORDS)
    v = tl.where(w == 0, base, 0)
    v = tl.where(w == 1, lbase, v)
    v = tl.where(w == 2, d0, v)
    v = tl.where(w == 3, need, v)
    v = tl.where(w == 4, done, v)
    v = tl.where(w == 5, total, v)
    v = tl.where(w == 6, n_gt + tl.where(done != 0, n_eq, 0), v)
    v = tl.where(w == 7, tl.where(done != 0, 0, n_eq), v)
    v = tl.where(w == 8, pairs, v)
    tl.store(st + w, v)


@triton.jit
def _topk_plan_part_kernel(
    hist_ptr,         # [B, S, NB, HIST_ROW] int32 per-split windowed histograms, row = b * N + i
    part_ptr,         # [R, G, 256] int32 out: group g's histograms at the row's bases, summed
    pre_ptr,          # [R, S, HIST_ROW] int32 out: per split, its group's splits before it
    n_drafts, n_drafts_pow2, num_splits, num_groups,
    SBASE: tl.constexpr, PDL: tl.constexpr = False,
):
    """Split plan, step 1 (grid ``(R, G)``): the PLAN_GROUP split histograms of group ``g``
    brought to the row's bases (the largest split base, the smallest lower base) and summed
    into ``part``; and for each split ``s`` of the group, the block ``pre[row, s]``: at words
    ``[0, 256)`` the sum of the rebased histograms of the splits before ``s`` in its group, at
    ``HIST_BINS`` and ``HIST_BINS + 1`` the row's bases (the split pass B's ``PRE`` prologue:
    one load of its own block instead of the bases and the rebased group histograms)."""
    if PDL:                         # (see _radix_topk_kernel)
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    c = tl.arange(0, HIST_BINS)
    h_row, split_stride, base, lbase = _plan_row(hist_ptr, row, n_drafts, n_drafts_pow2,
                                                 num_splits, SBASE)
    s = g * PLAN_GROUP + tl.arange(0, PLAN_GROUP)
    ms = s < num_splits
    hs = _load_rebased(h_row, s, ms, split_stride, base, lbase)           # [PLAN_GROUP, 256]
    h = tl.sum(hs, axis=0)
    tl.store(part_ptr + (row * num_groups + g) * HIST_BINS + c, h)
    before = tl.cumsum(hs, axis=0) - hs                      # exclusive, within the group
    blk = pre_ptr + (row * num_splits + s.to(tl.int64))[:, None] * HIST_ROW
    tl.store(blk + c[None, :], before, mask=ms[:, None])
    w = tl.arange(0, 2)[None, :]
    tl.store(blk + HIST_BINS + w, tl.where(w == 0, base, lbase), mask=ms[:, None])


@triton.jit
def _topk_scatter_kernel(
    x_ptr, len_ptr, out_ptr, cand_ptr,
    state_ptr,        # [R, STATE_WORDS] int32 out: the plan state (written by split 0)
    part_ptr,         # [R, G, 256] int32: the groups' histograms at the row's bases (not PLAN)
    pre_ptr,          # [R, S, HIST_ROW] int32: _topk_plan_part_kernel's pre blocks (PRE)
    hist_ptr,         # [B, S, NB, HIST_ROW] int32 per-split windowed histograms
    W, P, stride_x, stride_o, stride_c, cap, topk, n_drafts, per_row, n_drafts_pow2,
    num_splits, num_groups, sub,
    BLOCK: tl.constexpr, GB: tl.constexpr, PLAN: tl.constexpr, SP: tl.constexpr,
    VEC: tl.constexpr = False, PDL: tl.constexpr = False, SUB: tl.constexpr = False,
    PRE: tl.constexpr = False,
):
    """Pass B of the split top-k (grid ``(R, S)``): the program of split ``s`` reads only that
    split's positions, writes keys above the threshold bin to the output and compacts the
    bin's keys into the candidate row, from its offsets. Every program plans (split 0 writes
    the row's state): with ``PLAN`` (``S <= SP``, a power of two) from the row's S split
    histograms (rebased to the row's bases), starting after the counts of the splits before
    it; else from the G group partials of :func:`_topk_plan_part_kernel` (``GB`` at a time;
    the row's bases read ``SP`` at a time): their sum gives the threshold bin, the partials of
    the groups before its group and the rebased histograms of the splits before it in its
    group give its offsets. Both give every program the same bin and the same offsets as one
    plan over the row would (integer counts), so the output is bitwise the same. With ``PRE``
    (not ``PLAN``) the row's bases and the histograms of the splits before it in its group come
    summed in one block the plan part kernel wrote (``pre[row, s]``), one load instead of the
    bases' and then the rebased histograms' dependent loads.

    ``SUB`` with ``sub`` (grid ``(R, S * sub)``; without ``SUB`` ``sub`` is 1 and none of this
    is compiled): each split's pages cut into ``sub`` contiguous sub-ranges,
    one program each (program ``s * sub + k``); a sub-range's offsets are its split's plus the
    keys of the split's positions before it (:func:`_count_b`), so the output is bitwise that of
    ``sub = 1``. More, shorter programs: the B 64 scatter is an instruction chain on 7.5 warps an
    SM (Nsight Compute, H100, 2026-12-06; bench/NOTES.md "The B 64 scatter under Nsight
    Compute")."""
    if PDL:                         # (see _radix_topk_kernel)
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    pid = tl.program_id(1)
    s, k, n_sub = pid, 0, 1
    if SUB:
        s, k, n_sub = pid // sub, pid % sub, sub
    lo_split, lo, hi = _split_range(len_ptr, row, n_drafts, per_row, s, num_splits, W, P, k, n_sub,
                                    VEC)
    if PRE:
        tl.static_assert(not PLAN, "PRE reads the plan part kernel's blocks")
        pb = pre_ptr + (row * num_splits + s) * HIST_ROW
        base = tl.load(pb + HIST_BINS)
        lbase = tl.load(pb + (HIST_BINS + 1))
    else:
        h_row, split_stride, base, lbase = _plan_row(hist_ptr, row, n_drafts, n_drafts_pow2,
                                                     num_splits, SP)
    if PLAN:
        sv = tl.arange(0, SP)
        h = _load_rebased(h_row, sv, sv < num_splits, split_stride, base, lbase)   # [SP, 256]
        run = tl.sum(h, axis=0)
        before = tl.sum(tl.where((sv < s)[:, None], h, 0), axis=0)   # the splits before s
    else:
        grp = s // PLAN_GROUP
        if PRE:                     # the splits before s in its group, summed by the part kernel
            before = tl.load(pb + tl.arange(0, HIST_BINS))
        else:                       # ... rebased here (issued first: they need only the bases)
            sg = grp * PLAN_GROUP + tl.arange(0, PLAN_GROUP)
            before = tl.sum(_load_rebased(h_row, sg, sg < s, split_stride, base, lbase), axis=0)
        c = tl.arange(0, HIST_BINS)[None, :]
        p_row = part_ptr + row * num_groups * HIST_BINS
        run = tl.zeros((HIST_BINS,), tl.int32)
        for g0 in range(0, num_groups, GB):            # every group, and the groups before grp
            gv = g0 + tl.arange(0, GB)
            t = tl.load(p_row + gv.to(tl.int64)[:, None] * HIST_BINS + c,
                        mask=(gv < num_groups)[:, None], other=0)
            run += tl.sum(t, axis=0)
            before += tl.sum(tl.where((gv < grp)[:, None], t, 0), axis=0)
    # the row's histogram ``run`` and the splits-before histogram ``before``, both at the row's
    # bases, whichever way they were summed
    d0, need, done, total, n_eq = _first_digit(run, topk)
    pairs = (n_eq <= cap).to(tl.int32)
    n_out, n_cand = _prefix_counts(before, d0, done)
    if pid == 0:
        _store_state(state_ptr + row * STATE_WORDS, base, lbase, d0, need, done, total, n_eq,
                     run, pairs)
    key_lo, key_hi = bin_key_range(d0, base, lbase)
    if SUB:
        if (k > 0) & (hi > lo):      # the split's keys before this (non-empty) sub-range
            c_out, c_cand = _count_b(x_ptr + row * stride_x, lo_split, lo, key_lo, key_hi, done,
                                     BLOCK)
            n_out += c_out
            n_cand += c_cand
    _pass_b(x_ptr + row * stride_x, out_ptr + row * stride_o, cand_ptr + row * stride_c, lo, hi,
            key_lo, key_hi, done, pairs, cap, n_out, n_cand, BLOCK, W, VEC)


@triton.jit
def _topk_hist_kernel(
    x_ptr,            # [R, W] float32 rows (only [0, len[r]) is read)
    len_ptr,          # [R] int32 row lengths (per_row), or [B] request lengths (MTP rule)
    hist_ptr,         # [B, S, NB, HIST_ROW] int32 out: per-split windowed histograms
    W, P, stride_x, n_drafts, per_row, n_drafts_pow2, num_splits,
    BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    """Split pass A (grid ``(R, S)``): the windowed first-digit histogram of logits split ``s``
    of row ``row = b * N + i`` (the positions :func:`_split_range` gives that split, clipped to
    the row's valid prefix), written as the fused logits kernel writes it: the 256 counts at
    the split's own bases (the largest key's digit in bin 255, the smallest's in bin 0), then
    the upper and the lower base, at ``hist[b, s, i]``. A split with no qualifying key writes
    zero counts and ``(BASE_NONE, LBASE_NONE)``, which the plan's rebase reads as empty. For
    the top-k of logits whose kernel did not fuse the histogram (:func:`launch_split_hist`).
    One read: :func:`_window_hist` (the per-row kernel's pass A over the split: Triton's
    histogram, rebased as the running max / min move). A form with two reads and one relaxed
    CTA-scope atomic add a key instead of the histogram (the same blocks, half the
    instructions) was 1.6-1.8x slower on the H200 and was removed (bench/NOTES.md,
    "Twenty-fourth session"; commit 7ac1970 has it)."""
    if PDL:                         # (see _radix_topk_kernel)
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    _, lo, hi = _split_range(len_ptr, row, n_drafts, per_row, s, num_splits, W, P, 0, 1)
    x_row = x_ptr + row * stride_x
    b = row // n_drafts
    i = row % n_drafts
    blk = hist_ptr + ((b * num_splits + s) * n_drafts_pow2 + i) * HIST_ROW
    c = tl.arange(0, HIST_BINS)
    w = tl.arange(0, 2)
    hist, base, lbase = _window_hist(x_row, lo, hi, BLOCK)
    tl.store(blk + c, hist)
    tl.store(blk + HIST_BINS + w, tl.where(w == 0, base, lbase))


# (positions per loop iteration, num_warps, form) of the split pass A. Form "ballot":
# _topk_hist_kernel (Triton's tl.histogram, one read, rebased as the running max / min move);
# "smem": kernels.topk.gluon_hist._topk_hist_smem_kernel (two reads, the float max / min then one
# shared-memory atomic add a key; GPU only: in the CPU interpreter a "smem" config runs the
# ballot kernel at the same BLOCK and num_warps). The same blocks either way.
# Ballot, AOT (Triton 3.6.0, sm_90; the loop's SASS a warp, the warp-instructions a position):
# 1,024 x 4 warps 1,125, 4.39, 96 registers; 2,048 x 4 1,597, 3.12, 108 (4 CTAs an SM); 4,096 x 4
# 2,947, 2.88, 168 (3 CTAs an SM). Triton's 256-bin histogram (a ballot per bin bit, then each
# lane's eight bins: VOTE, LOP3, POPC) is ~2 of the ~3 a position. Measured (H200, 2026-12-07,
# L 64K / N 2 / L 128K) 2,048 x 4 27.7 / 47.9 / 52.3 us, 4,096 x 4 27.1 / 50.6 / 51.4, 1,024 x 4
# 38.1 / 61.2 / 70.7: ~2 cycles an integer instruction of Hopper's ALU pipe (ncu, H100, N 2:
# ALU pipe 72.8 % of the elapsed cycles, bench/NOTES.md "Twenty-fifth session").
# Smem, AOT (sm_90): 2,048 x 4 the first read's loop 75 SASS a warp (4.7 a 32-key slot), the
# second's 187 (11.7): 0.51 warp-instructions a position against 3.07, 80 registers, 2,048 B of
# shared memory; 2,048 x 8 62 registers. Measured (H100, 2026-12-07, L 64K / N 2 / L 128K / V4
# B 8 1M, us; bench/results/indexer_sweep_smem_pass_a_c_h100_20261207.json): 2,048 x 8 7.4 /
# 13.6 / 14.9 / 14.6, 2,048 x 4 7.5 / 13.4 / 17.2 / 16.4, 4,096 x 8 7.5 / 16.0 / 13.4 / 13.5,
# 1,024 x 4 7.7 / 15.0 / 21.3 / 21.4; the ballot form at 2,048 x 4 27.8 / 48.0 / 53.5 / 51.7.
SPLIT_HIST_CONFIG = (2048, 8, "smem")
# The configs bench.indexer_sweep times (the first is SPLIT_HIST_CONFIG; 1,024 x 4 smem and
# 4,096 x 4 ballot, measured above, left out: AOT-checked for sm_120 in CI, ~3.5 s a spec).
SPLIT_HIST_SPACE = ((2048, 8, "smem"), (2048, 4, "smem"), (4096, 8, "smem"), (2048, 4, "ballot"))
SPLIT_HIST_FORMS = ("smem", "ballot")


# Rows without a fused histogram (launch_split_hist then the split path, split_plan): the
# programs an SM the split count aims at, and the fewest positions a split holds (one
# SPLIT_HIST_CONFIG block).
SPLIT_PLAN_PER_SM = 2
SPLIT_PLAN_MIN_POSITIONS = 2048
SPLIT_PLAN_ENV = "DSA_TOPK_SPLIT_PLAN"
"""``0``: :func:`split_plan` returns None (one program a row everywhere), for an A/B in one
process; unset, empty or ``1``: the rule."""


def split_plan(rows: int, W: int, num_sms: int) -> tuple | None:
    """``(page_size, splits)`` for the top-k of ``rows`` logits rows of width ``W`` that come
    without a fused histogram (``torch_impl.compat.topk.select_topk``): :func:`launch_split_hist`
    then ``launch_topk(hist=..., page_size=...)`` over ``rows x splits`` programs, where the
    per-row kernel would run one program a row; None (one program a row) when that gives fewer
    than two splits: ``rows >= SPLIT_PLAN_PER_SM x num_sms`` (the per-row kernel already
    fills the GPU) or rows shorter than two ``SPLIT_PLAN_MIN_POSITIONS`` splits. The page size
    only sets the split boundaries: the largest power of two up to 64 dividing ``W``.
    Measured on an H200 through ``select_topk`` (bench/NOTES.md "Twenty-fourth session", A/B
    with :data:`SPLIT_PLAN_ENV`): L 32K, B 1 26.5 us against 68.3 one program a row, B 64 51.7
    against 74.3.

    Raises:
      ValueError: :data:`SPLIT_PLAN_ENV` holds something other than ``0``, ``1`` or nothing.
    """
    from kernels.scalars import env_switch
    if env_switch(SPLIT_PLAN_ENV) is False:
        return None
    want = -(-SPLIT_PLAN_PER_SM * max(num_sms, 1) // max(rows, 1))
    splits = min(want, W // SPLIT_PLAN_MIN_POSITIONS)
    if splits < 2:
        return None
    page = next(p for p in (64, 32, 16, 8, 4, 2, 1) if W % p == 0)
    return page, splits


# The split count of the top-k where ``indexer_topk`` runs the logits kernel without the fused
# histogram (kernels.indexer.triton.fuse_hist false): launch_split_hist then writes the blocks
# at any split count, so the split passes A and B need not run on the logits kernel's S (4 at
# B 64 L 64K: 256 programs, two an SM, the split pass B's four-warp programs then a latency
# chain on 1.86 warps a scheduler, Nsight Compute, H100, bench/NOTES.md "Twenty-sixth
# session"). 0: the logits kernel's S (the rule); n > 0: at least n programs an SM over the
# call's rows (``unfused_topk_splits``). Measured slower (H100, 2026-12-07, unfused everywhere,
# op us (topk_us), n = 0 / 4 / 8: B 64 L 64K 249.3 (32.0) / 261.7 (44.7) / 269.6 (52.7), L 128K
# 472.7 (51.0) / 483.8 (62.6) / 488.8 (66.9), N 2 306.9 (48.8) / 314.5 (58.3) / 328.3 (71.9);
# bench/results/bench_h100_targets_idx_unfused_s{0,4,8}_20261207.json): the planning scatter
# sums its S histograms a tile at a time and each program pays that chain, so more programs
# did not buy the occupancy they were for. Kept as the A/B switch (bench/NOTES.md
# "Twenty-seventh session").
UNFUSED_SPLITS_PER_SM = 0
UNFUSED_SPLITS_ENV = "DSA_TOPK_UNFUSED_PER_SM"
"""Overrides :data:`UNFUSED_SPLITS_PER_SM` (an int in ``[0, 64]``) for an A/B in one process;
unset or empty: the constant."""


def unfused_topk_splits(rows: int, n_pages: int, num_sms: int, logits_splits: int) -> int:
    """The split count of the split passes A and B (``launch_split_hist`` then
    ``launch_topk(hist=...)``) for ``rows`` logits rows of ``n_pages`` pages whose logits kernel
    ran ``logits_splits`` programs a request without the fused histogram: ``logits_splits``
    where the per-SM target (:data:`UNFUSED_SPLITS_ENV`, else :data:`UNFUSED_SPLITS_PER_SM`) is
    0, else ``max(logits_splits, min(ceil(per_sm x num_sms / rows), cap))`` with ``cap`` the
    planning scatter's :data:`SCATTER_PLAN_SPLITS` (more would add the plan part kernel) and
    ``n_pages // 2`` (splits of at least two pages). Any split count selects the same set in the
    same order (the row's window bases are those of its largest and smallest keys whatever the
    splits: ``tests/test_torch_topk.py``).

    Raises:
      ValueError: :data:`UNFUSED_SPLITS_ENV` is not an int in ``[0, 64]``.
    """
    from kernels.scalars import env_int
    per_sm = env_int(UNFUSED_SPLITS_ENV, 0, 64, UNFUSED_SPLITS_PER_SM)
    if per_sm == 0:
        return logits_splits
    want = -(-per_sm * max(num_sms, 1) // max(rows, 1))
    return max(logits_splits, min(want, SCATTER_PLAN_SPLITS, max(n_pages // 2, 1)))


def launch_split_hist(logits, lengths, hist, *, n_drafts: int = 1, page_size: int,
                      config: tuple | None = None):
    """Pass A of the split top-k as its own launch: the per-split windowed histograms that
    ``kernels.indexer.triton.launch_indexer_logits(hist=...)`` fuses into the logits kernel,
    for logits written without them; ``launch_topk(hist=hist, page_size=page_size)`` then runs
    its split path as after the fused kernel and selects the same set. The order of the output
    row (unspecified in the SPEC) can differ from the fused pipeline's: these blocks are at
    each split's exact bases, the fused kernel's ``"first"`` mode leaves ``HIST_HEAD`` bins of
    headroom, so the row's threshold bucket (and so which selected positions come first) can
    differ. Grid ``(R, S)``: the program of split ``s`` reads that split's positions of its row
    once (4 bytes a position), so the pass spreads over ``R x S`` programs where the per-row
    kernel's own pass A is one program a row.

    Args:
      logits: float32 ``[R, W]`` with contiguous last dim (``R = B * N``, row ``b * N + i``);
        only ``[r, :len[r]]`` is read.
      lengths: contiguous int32 ``[R]`` row lengths, or ``[B]`` request lengths (the MTP rule,
        as :func:`launch_topk`).
      hist: int32 ``[B, S, next_pow2(N), HIST_ROW]`` (:func:`hist_shape`), contiguous: receives
        block ``[b, s, i]`` of every row and split (padding words and the blocks of padded
        drafts are not written). Any ``S >= 1`` (the split pass B after it runs over the same
        S; ``indexer_topk`` uses the logits kernel's count: at B 64 N 2 L 64K 5 splits took
        104.8 us of top-k against 88.8 at its 4 on an H100, bench/NOTES.md "Twenty-third
        session"): split ``s`` covers pages ``[s * per, (s + 1) * per)``, ``per =
        ceil(ceil(max_i len[b, i] / P) / S)``, as the logits kernel's splits.
      n_drafts: N, at most 4.
      page_size: P, a positive int dividing ``W``.
      config: ``(BLOCK, num_warps, form)`` (:data:`SPLIT_HIST_SPACE`; form ``"smem"``: the
        Gluon kernel ``kernels.topk.gluon_hist``, on a GPU only: in the CPU interpreter the
        ballot kernel runs at the same BLOCK and num_warps); None: :data:`SPLIT_HIST_CONFIG`.
    Raises:
      TypeError: ``logits`` is not a float32 tensor, ``lengths`` or ``hist`` not an int32 one.
      ValueError: ``logits`` is not 2-D with a contiguous last dim, ``lengths`` is not
        contiguous, the tensors are on different devices, ``hist`` is not a contiguous tensor
        of ``hist_shape(B, S, N)`` for some S >= 1, ``page_size`` does not divide W,
        ``logits`` has no ``B * n_drafts`` rows, ``lengths`` has neither R nor R / N elements,
        ``n_drafts`` is outside [1, 4], or ``config`` is not a triple (power-of-two BLOCK in
        [16, TOPK_BLOCK_MAX], num_warps in 1, 2, 4, 8, 16, a form of
        :data:`SPLIT_HIST_FORMS`; the smem form's BLOCK at least 128 x num_warps).
    """
    import torch
    for name, t, dt in (("logits", logits, torch.float32), ("lengths", lengths, torch.int32),
                        ("hist", hist, torch.int32)):
        if not isinstance(t, torch.Tensor) or t.dtype != dt:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name}: expected a {dt} tensor, got {got}")
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits: expected a 2-D [R, W] tensor with a contiguous last dim, got "
                         f"shape {tuple(logits.shape)} strides {tuple(logits.stride())}")
    if not lengths.is_contiguous():
        raise ValueError("lengths: expected a contiguous tensor")
    if lengths.device != logits.device or hist.device != logits.device:
        raise ValueError(f"lengths, hist: expected on the logits' device {logits.device}, got "
                         f"{lengths.device}, {hist.device}")
    if config is not None:
        ok = (isinstance(config, (tuple, list)) and len(config) == 3
              and tuple(map(type, config)) == (int, int, str))
        if not ok or not (16 <= config[0] <= TOPK_BLOCK_MAX and config[0] & (config[0] - 1) == 0
                          and config[1] in (1, 2, 4, 8, 16) and config[2] in SPLIT_HIST_FORMS
                          and (config[2] != "smem" or config[0] >= 128 * config[1])):
            raise ValueError(f"config: expected None or (BLOCK, num_warps, form): a power of two "
                             f"in [16, {TOPK_BLOCK_MAX}], 1, 2, 4, 8 or 16, one of "
                             f"{SPLIT_HIST_FORMS} (smem: BLOCK >= 128 x num_warps), got "
                             f"{config!r}")
    R, W = logits.shape
    if type(n_drafts) is not int or not 1 <= n_drafts <= 4:
        raise ValueError(f"n_drafts: expected an int in [1, 4], got {n_drafts!r}")
    if type(page_size) is not int or page_size < 1 or W % page_size:
        raise ValueError(f"page_size: expected a positive int dividing the logits' width W={W}, "
                         f"got {page_size!r}")
    if R % n_drafts:
        raise ValueError(f"logits: expected B * n_drafts rows (n_drafts={n_drafts}), got {R}")
    B = R // n_drafts
    nb = triton.next_power_of_2(n_drafts)
    if (hist.dim() != 4 or hist.shape[1] < 1
            or tuple(hist.shape) != (B, hist.shape[1], nb, HIST_ROW.value)
            or not hist.is_contiguous()):
        raise ValueError(f"hist: expected a contiguous int32 [{B}, S, {nb}, {HIST_ROW.value}] "
                         f"tensor (S >= 1), got {hist.dtype} {tuple(hist.shape)}")
    per_row = _lengths_per_row(lengths, R, n_drafts)
    if R == 0:
        return hist
    block, warps, form = config or SPLIT_HIST_CONFIG
    launch = dict(PDL=True, launch_pdl=True) if pdl_enabled(logits.device) else {}
    kernel = _topk_hist_kernel
    if form == "smem" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        from kernels.topk.gluon_hist import _topk_hist_smem_kernel as kernel
    kernel[(R, hist.shape[1])](logits, lengths, hist, W, page_size, logits.stride(0), n_drafts,
                               per_row, nb, hist.shape[1], BLOCK=block, num_warps=warps, **launch)
    return hist


# The split pass B plans in its own programs (no plan kernels) up to this many splits a row:
# each of the R x S programs then reads the row's S histogram blocks (S x 2 KB from L2).
SCATTER_PLAN_SPLITS = 16
# With more splits (after _topk_plan_part_kernel) each scatter program reads the row's split
# bases SCATTER_PART_SBASE at a time and the group partials SCATTER_PART_GB at a time (one
# compile for every split count; B 1 L 128K at one wave: 132 splits, 17 groups, two partial
# tiles). AOT (Triton 3.6.0, sm_90): 16 partials a tile kept the scatter at 115 registers (512 x
# 4 warps; 143 at 2,048 VEC), 4 CTAs an SM; 32 took 198-226 (2 CTAs an SM: B 1 N 2's 528
# programs in two waves), 8 111-128 with twice the dependent tile loads. Since the partials are
# read once (the histogram of the groups before summed in the same loop): 90 registers at 1,024
# VEC, 126 at 2,048 VEC.
SCATTER_PART_SBASE = PLAN_BASES
SCATTER_PART_GB = 16
# After the plan part kernel the Triton split pass B reads its split's pre block (the row's
# bases and the summed histograms of the splits before it in its group, written by the part
# kernel) instead of the row's split bases and then its group's rebased histograms: two
# dependent L2 round trips fewer in each program's prologue, which is most of the B 1 scatter
# (one block a split: 6.3-6.5 us at B 1 L 128K on H100s before). Same counts, so the same bits.
# Measured (H100, 2026-12-07, one machine, op us against DSA_TOPK_PART_PRE=0, whose part kernel
# writes the blocks too): B 1 L 128K 29.2 -> 27.4, B 1 L 64K 24.2 -> 22.3, V4 B 1 1M 92.2 ->
# 90.1. Per kernel (profiles, other H100 starts): the scatter at B 1 L 128K 6.26-6.52 us before
# (2026-12-06 / 12-07) -> 4.69, the part kernel 3.00-3.01 -> 3.12 (bench/NOTES.md
# "Twenty-seventh session"). DSA_TOPK_PART_PRE=0 turns it off (an A/B in one process). The part
# kernel writes the blocks whether or not a scatter reads them (the Gluon form, PRE off): R x S
# x 1 KB, ~0.1 MB at B 1 L 128K.
SCATTER_PART_PRE_ENV = "DSA_TOPK_PART_PRE"


def scatter_part_pre() -> bool:
    """Whether the Triton split pass B after the plan part kernel takes its ``PRE`` prologue:
    :data:`SCATTER_PART_PRE_ENV` unset, empty or ``1``: yes; ``0``: no.

    Raises:
      ValueError: the variable holds something else.
    """
    from kernels.scalars import env_switch
    return env_switch(SCATTER_PART_PRE_ENV) is not False


def scatter_plan_blocks() -> tuple:
    """The split tiles ``SP`` (powers of two, 2..SCATTER_PLAN_SPLITS) the planning scatter is
    compiled for (``_p2(S, 2, SCATTER_PLAN_SPLITS)``)."""
    return tuple(1 << e for e in range(1, SCATTER_PLAN_SPLITS.bit_length()))


def launch_topk(logits, lengths, topk: int, out, scratch, *, config: TopkConfig | None = None,
                hist=None, n_drafts: int = 1, page_size: int | None = None, state=None,
                scatter: tuple | None = None, scatter_sub: int | None = None,
                num_sms: int | None = None, scatter_form: str | None = None):
    """Exact top-k positions of each row's valid prefix (no host sync, graph capturable).

    Args:
      logits: float32 ``[R, W]`` with contiguous last dim; only ``[r, :len[r]]`` is read.
      lengths: contiguous int32, either ``[R]`` (``len[r] = lengths[r]``; a ``[B, N]``
        context_lens flattens to this), or ``[B]`` with ``R = B * n_drafts`` (request lengths:
        draft i of request b gets ``lengths[b] - (n_drafts - 1 - i)``, the MTP rule). Clamped to
        ``[0, W]`` in-kernel (64-bit arithmetic); no torch op runs here.
      topk: K >= 1, any value.
      out: int32 ``[R, topk]`` with contiguous last dim; receives the selected positions (those
        above the threshold bucket in ascending position order, then the rest of the selection
        in ascending position order), then -1.
      scratch: int32 ``[R, C]`` (``C >= W``) with contiguous last dim, uninitialised: the
        threshold bin's candidates, as (logit, position) pairs (the logits' float32 bits at
        ``[0, n)``, positions at ``[C // 2, C // 2 + n)``) when ``n <= C // 2``, else positions
        at ``[0, n)``.
      hist: None, or the int32 :func:`hist_shape` ``[B, S, next_pow2(N), HIST_ROW]`` windowed
        histograms written by ``kernels.indexer.triton.launch_indexer_logits(hist=...)`` for
        these rows (``R = B * N``, row ``b * N + i``); replaces pass A over the row.
      n_drafts: N (rows per request; N <= 4 with ``page_size``).
      page_size: P of the logits kernel's pages (an int dividing W), with ``hist``: pass B
        then runs split over ``R x S`` programs, each over the positions of one logits split
        (the split histograms give every program its output offsets), instead of one program
        per row.
      state: None, or an int32 ``[R, STATE_WORDS]`` buffer for the split plan's per-row state
        (:data:`STATE_FIELDS`: the window bases, the threshold bin ``d0`` (``MID_BIN``: a
        window miss), need, done, total, n_out, n_cand, pairs, and ``visits``, the candidate
        reads of the per-row kernel's passes; written with ``hist`` and ``page_size``), for
        diagnostics and tests (``scripts/topk_state.py``); None allocates it here.
      scatter: None (:func:`scatter_config` picks by shape), or the split pass B's
        ``(BLOCK, num_warps, vec)`` (a tuple or list of int, int, bool), one of
        :data:`SCATTER_SPACE` (``bench.indexer_sweep`` times them; ``vec``: :func:`_pass_b`'s
        ``VEC`` loads and layout, which need ``W``, the page size and the logits' row stride to
        be multiples of 16, else the launch falls back to the scalar loads). Only the split
        pass B (``hist`` and ``page_size`` given) has this launch; elsewhere it is unused.
      scatter_sub: programs of the split pass B per logits split (an int in ``[1, 16]``; each
        takes a contiguous sub-range of the split's pages and counts the split's keys before
        it); None: :func:`scatter_subsplits` (``DSA_TOPK_SCATTER_SUB``, default 1). The output
        is bitwise the same for every value.
      num_sms: the GPU's SM count (the caller's ``device_info``), for the split pass B's register
        cap rule (:data:`SCATTER_MAXNREG_ENV`); None: no rule (the variable's explicit values
        still apply).
      scatter_form: the split pass B's kernel, one of :data:`SCATTER_FORMS`: ``"triton"``
        (:func:`_topk_scatter_kernel`) or ``"smem"`` (``kernels.topk.gluon_scatter``: each
        block's selected keys compacted in shared memory first, then one store a selected key;
        bitwise the same output, candidates and state). The smem form runs where it is built
        for: a CUDA tensor outside the CPU interpreter, no sub-ranges (``scatter_sub`` 1),
        16-byte loads (``W``, the page size and the logits' row stride multiples of 16) and a
        (BLOCK, warps) of :data:`SCATTER_SMEM_SPACE`; the Triton kernel runs elsewhere.
        None: :data:`SCATTER_FORM_ENV` when set, else :func:`scatter_form_for` (the smem form
        on the B 64 rows' long splits).
    Raises:
      ValueError: ``lengths`` has neither ``R`` nor ``R / n_drafts`` elements, the scratch
        is narrower than W, ``page_size`` (with ``hist``) does not divide W, ``state`` is not a
        contiguous int32 ``[R, STATE_WORDS]`` tensor, or ``scatter`` is not in
        :data:`SCATTER_SPACE`, ``scatter_sub`` (or ``DSA_TOPK_SCATTER_SUB``) is not an int in
        ``[1, 16]``, or ``config.block`` / ``config.cand_block`` is not a power of two in
        ``[16, TOPK_BLOCK_MAX]``, or ``scatter_form`` (or ``DSA_TOPK_SCATTER_FORM``) is not
        one of :data:`SCATTER_FORMS`, or (the split path) :data:`SCATTER_PART_PRE_ENV` holds
        something other than ``0``, ``1`` or nothing.
    """
    cfg = config or TopkConfig()
    if scatter_form is None:
        scatter_form = scatter_form_default()
    elif scatter_form not in SCATTER_FORMS:
        raise ValueError(f"scatter_form: expected None or one of {SCATTER_FORMS}, got "
                         f"{scatter_form!r}")
    for name in ("block", "cand_block"):
        v = getattr(cfg, name)
        # _select's one packed scan counts a block's keys in 16-bit halves of an int32 (eq in
        # the high half): at most 16,384 keys a block
        if type(v) is not int or v < 16 or v > TOPK_BLOCK_MAX or v & (v - 1):
            raise ValueError(f"config.{name}: expected a power of two in [16, {TOPK_BLOCK_MAX}], "
                             f"got {v!r}")
    if scatter_sub is None:
        scatter_sub = scatter_subsplits()
    elif type(scatter_sub) is not int or not 1 <= scatter_sub <= SCATTER_SUB_MAX:
        raise ValueError(f"scatter_sub: expected an int in [1, {SCATTER_SUB_MAX}], got "
                         f"{scatter_sub!r}")
    R, W = logits.shape
    if scatter is not None:
        sc = tuple(scatter) if isinstance(scatter, (tuple, list)) else None
        # exact Python types: equal values of other types (1024.0, NumPy scalars, arrays)
        # would pass `in` and then fail inside the launch
        if (sc is None or len(sc) != 3 or tuple(map(type, sc)) != (int, int, bool)
                or (sc not in SCATTER_SPACE and not (sc[2] and sc[:2] in SCATTER_SMEM_SPACE))):
            raise ValueError(f"scatter: expected None or one of {SCATTER_SPACE} (a tuple of "
                             f"int, int, bool), or (BLOCK, num_warps, True) with (BLOCK, "
                             f"num_warps) one of {SCATTER_SMEM_SPACE}, got {scatter!r}")
        scatter = sc
    if R == 0 or topk == 0:
        return out
    per_row = _lengths_per_row(lengths, R, n_drafts)
    if scratch.shape[1] < W:
        raise ValueError(f"scratch: expected at least {W} columns, got shape {tuple(scratch.shape)}")
    if hist is not None and page_size is not None and (
            type(page_size) is not int or page_size < 1 or W % page_size):
        # the split plan covers W // page_size whole pages (the logits kernel's rows are whole
        # pages): a partial last page would never be read (found by a review, 2026-12-06)
        raise ValueError(f"page_size: expected a positive int dividing the logits' width W={W} "
                         f"(its rows are whole pages), got {page_size!r}")
    cap = scratch.shape[1] // 2
    if hist is not None:
        num_splits, nb = hist.shape[1], hist.shape[2]
    else:
        num_splits, nb = 1, 1
    split = hist is not None and page_size is not None
    pdl = pdl_enabled(logits.device)
    launch = dict(PDL=True, launch_pdl=True) if pdl else {}
    if not split:
        state = out                      # an unused pointer argument of the one-program path
    else:
        import torch
        if state is None:
            state = torch.empty((R, STATE_WORDS.value), dtype=torch.int32,
                                device=logits.device)
        elif (state.dtype != torch.int32 or tuple(state.shape) != (R, STATE_WORDS.value)
              or not state.is_contiguous()):
            raise ValueError(f"state: expected a contiguous int32 [{R}, {STATE_WORDS.value}] "
                             f"tensor, got {state.dtype} {tuple(state.shape)}")
        if type(n_drafts) is not int or not 1 <= n_drafts <= 4:
            # _split_range reads at most 4 drafts' lengths (tl.arange(0, 4))
            raise ValueError(f"n_drafts: expected an int in [1, 4] with page_size, got "
                             f"{n_drafts!r}")
        _split_pass_b(logits, lengths, out, scratch, state, hist, topk=topk, n_drafts=n_drafts,
                      per_row=per_row, page_size=page_size, cap=cap, num_splits=num_splits,
                      nb=nb, scatter=scatter, scatter_sub=scatter_sub,
                      scatter_form=scatter_form, num_sms=num_sms, launch=launch)
    _radix_topk_kernel[(R,)](logits, lengths, out, scratch, hist if hist is not None else out,
                             W, topk, logits.stride(0), out.stride(0), scratch.stride(0), cap,
                             n_drafts, per_row, nb, num_splits, state,
                             BLOCK=cfg.cand_block if split else cfg.block,
                             HAS_HIST=hist is not None, FROM_PLAN=split,
                             PLAN_SB=PLAN_SPLITS, num_warps=cfg.num_warps, **launch)
    return out


def _split_pass_b(logits, lengths, out, scratch, state, hist, *, topk: int, n_drafts: int,
                  per_row: int, page_size: int, cap: int, num_splits: int, nb: int,
                  scatter, scatter_sub: int, scatter_form, num_sms, launch: dict):
    """The split pass B of :func:`launch_topk` (its arguments, checked there): the plan part
    kernel where the plan runs over groups, then the scatter, ``scatter_form``'s kernel where it
    runs (:func:`_smem_scatter_runs`), else the Triton one. Writes ``out``'s selected head, the
    candidates in ``scratch`` and the plan ``state``; returns the scatter kernel launched (the
    GPU tests check which ran)."""
    import torch
    R, W = logits.shape
    if scatter_form is None:
        scatter_form = scatter_form_for(W, page_size, num_splits)
    part_pre = scatter_part_pre()          # (read before any launch: a bad value raises first)
    smem_runs = _smem_scatter_runs(scatter_form, W, page_size, logits, scatter_sub)
    if scatter is not None and scatter not in SCATTER_SPACE and not smem_runs:
        scatter = None          # a launch of the smem form's space only, where it cannot run
    sblock, swarps, svec = scatter or scatter_config(W, page_size, num_splits)
    # the cap rule only where it was measured: the 2,048-position VEC launch, no sub-ranges
    # (capped, the SUB twin spills and the smaller blocks lose a CTA an SM: AOT, sm_90)
    ruled = (num_sms is not None and scatter_sub == 1
             and (sblock, swarps, svec) == SCATTER_CAP_CONFIG)
    cap_regs = scatter_maxnreg(R * num_splits if ruled else 0, num_sms or 1)
    slaunch = dict(launch)                                # the scatter launches' options
    if cap_regs is not None and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        slaunch["maxnreg"] = cap_regs                     # (the interpreter has no cap)
    aligned = W % 16 == 0 and page_size % 16 == 0 and logits.stride(0) % 16 == 0
    svec = bool(svec) and aligned
    scatter_kernel = _topk_scatter_kernel
    if smem_runs and (sblock, swarps) in SCATTER_SMEM_SPACE:
        # the Gluon form: always its 16-byte loads, no register cap (95-163 registers, AOT)
        from kernels.topk.gluon_scatter import _topk_scatter_smem_kernel as scatter_kernel
        svec = True
        slaunch = dict(launch)
    if num_splits <= SCATTER_PLAN_SPLITS:
        sp = _p2(num_splits, 2, SCATTER_PLAN_SPLITS)
        scatter_kernel[(R, num_splits * scatter_sub)](
            logits, lengths, out, scratch, state, state, state, hist, W, page_size,
            logits.stride(0), out.stride(0), scratch.stride(0), cap, topk, n_drafts,
            per_row, nb, num_splits, 1, scatter_sub, BLOCK=sblock, GB=PLAN_MIN, PLAN=True,
            SP=sp, VEC=svec, SUB=scatter_sub > 1, num_warps=swarps, **slaunch)
    else:
        groups, sbase = plan_blocks(num_splits)
        part = torch.empty((R, groups, HIST_BINS.value), dtype=torch.int32,
                           device=logits.device)
        pre = torch.empty((R, num_splits, HIST_ROW.value), dtype=torch.int32,
                          device=logits.device)
        _topk_plan_part_kernel[(R, groups)](hist, part, pre, n_drafts, nb, num_splits, groups,
                                            SBASE=sbase, num_warps=4, **launch)
        extra = {}
        if scatter_kernel is _topk_scatter_kernel:      # (the Gluon form plans as before)
            extra["PRE"] = part_pre
        scatter_kernel[(R, num_splits * scatter_sub)](
            logits, lengths, out, scratch, state, part, pre, hist, W, page_size,
            logits.stride(0), out.stride(0), scratch.stride(0), cap, topk, n_drafts,
            per_row, nb, num_splits, groups, scatter_sub, BLOCK=sblock, GB=SCATTER_PART_GB,
            PLAN=False, SP=SCATTER_PART_SBASE, VEC=svec, SUB=scatter_sub > 1,
            num_warps=swarps, **extra, **slaunch)
    return scatter_kernel


# The split pass B's kernels (launch_topk(scatter_form=...)): "triton", _topk_scatter_kernel;
# "smem", kernels.topk.gluon_scatter._topk_scatter_smem_kernel (the block's selected keys
# compacted in shared memory, then one store a selected key). AOT (Triton 3.6.0, sm_90, 2,048
# positions at 4 warps, the block loop to its second barrier): 346 SASS a warp an iteration, 21.6
# a key-slot, against the Triton kernel's 651 (40.7); 95-163 registers, 2 x BLOCK x 4 bytes of
# shared memory (bench/NOTES.md "Twenty-sixth session").
SCATTER_FORMS = ("triton", "smem")
# (BLOCK, num_warps) of the smem form (launch_topk(scatter=(BLOCK, num_warps, True)), AOT-checked
# for sm_90 and sm_120): 2,048 at 4 warps, the rule's (scatter_config on splits of >= 4,096
# positions), one smaller and one larger block (4,096 x 4: two 16-key chains a lane, 203
# registers, AOT sm_90). A launch of the smem form at any other (BLOCK, warps) runs the Triton
# kernel; a launch outside SCATTER_SPACE where the Triton kernel runs takes scatter_config's.
# Measured and dropped (H100, 2026-12-07, bench/NOTES.md "Twenty-sixth session"): 512 x 4,
# 1,024 x 2, 2,048 x 8 and 4,096 x 8 (slower than 2,048 x 4 on every B 64 row but one).
SCATTER_SMEM_SPACE = ((1024, 4), (2048, 4), (4096, 4))
# The rule (launch_topk without a form): the smem form where a logits split holds at least this
# many table positions (``ceil(W / P / S) * P``: the B 64 rows, 16-32K), the Triton kernel on
# shorter splits (B 1: 256-512 positions, one block, where the smem form's plan prologue costs
# more than its loop saves). Measured (H100, 2026-12-07, CUDA-graph timed top-k, us; Triton
# 2,048 VEC -> smem 2,048 x 4; bench/results/indexer_sweep_smem_scatter_h100_20261207.json):
# B 64 L 64K 24.7 -> 23.5, N 2 38.3 -> 34.6, L 128K 37.8 -> 34.3, V4 B 8 1M 33.0 -> 30.0,
# V4 B 64 4K in a 1M table 10.3 -> 11.0 (its W is the table's: the rule cannot tell), B 1 L 128K
# 19.5 -> 22.0.
SCATTER_SMEM_MIN_POSITIONS = 4096
SCATTER_FORM_ENV = "DSA_TOPK_SCATTER_FORM"
"""One of :data:`SCATTER_FORMS`: the split pass B's kernel where ``launch_topk`` is given none;
unset or empty: the rule (:func:`scatter_form_for`)."""


def _smem_scatter_runs(form: str, W: int, page_size: int, logits, scatter_sub: int) -> bool:
    """Whether the split pass B's smem form (the Gluon kernel) runs for this launch: asked for,
    16-byte loads (``W``, the page size and the logits' row stride multiples of 16), no
    sub-ranges, a CUDA tensor outside the CPU interpreter."""
    return (form == "smem" and W % 16 == 0 and page_size % 16 == 0
            and logits.stride(0) % 16 == 0 and scatter_sub == 1 and logits.is_cuda
            and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))


def scatter_form_for(W: int, page_size: int, num_splits: int) -> str:
    """The split pass B's form from the shape alone: ``"smem"`` where a logits split holds at
    least :data:`SCATTER_SMEM_MIN_POSITIONS` table positions (``ceil(W / P / S) * P``), else
    ``"triton"``."""
    return ("smem" if _split_positions(W, page_size, num_splits) >= SCATTER_SMEM_MIN_POSITIONS
            else "triton")


def scatter_form_default() -> str | None:
    """:data:`SCATTER_FORM_ENV` when set, else None (the rule, :func:`scatter_form_for`).

    Raises:
      ValueError: the variable holds something other than one of :data:`SCATTER_FORMS`.
    """
    v = os.environ.get(SCATTER_FORM_ENV, "").strip()
    if not v:
        return None
    if v not in SCATTER_FORMS:
        raise ValueError(f"{SCATTER_FORM_ENV}: expected one of {SCATTER_FORMS} or unset, got {v!r}")
    return v


SCATTER_SUB_ENV = "DSA_TOPK_SCATTER_SUB"
"""Programs of the split pass B per logits split (``launch_topk(scatter_sub=None)``): unset or
empty 1 (default until measured), else an integer in ``[1, SCATTER_SUB_MAX]``. Why: at B 64 the
scatter runs ``B x S`` programs (256 at L 64K) of one long dependent instruction chain each, on
7.5 warps an SM (Nsight Compute, H100, 2026-12-06); sub-ranges halve or quarter each chain and
fill the SMs, at the cost of counting the split's keys before a sub-range once more
(bench/NOTES.md "The B 64 scatter under Nsight Compute")."""

SCATTER_SUB_MAX = 16

SCATTER_MAXNREG_ENV = "DSA_TOPK_SCATTER_MAXNREG"
"""ptxas ``.maxnreg`` of the split pass B's launches (``_topk_scatter_kernel``; not the plan
part or the per-row kernel): unset or empty: :data:`SCATTER_CAP_REGS` where the grid has more
than :data:`SCATTER_CAP_CTAS` programs an SM of the caller's ``num_sms``, else none (the rule;
none without ``num_sms``); ``0``: never; an integer in
``[64, 255]``: always that. Why: since pass B compares floats (2026-12-06) its 2,048-position VEC
loop is 664 SASS a warp (833 before) at 160 registers, 3 CTAs of 4 warps an SM where it had 4 at
124; held to 128 it is 719 SASS, no spill (AOT, Triton 3.6.0, sm_90), 4 CTAs an SM. Measured
(H100, 2026-12-06, bench/results/bench_h100_targets_torch_20261206_fcmp.json against
..._fcmp_r128.json): B 64 N 2 L 64K (512 programs) top-k 42.1 us uncapped, 37.6 capped; the
rows of at most 264 programs 26.5 / 27.0 (B 64 L 64K), 37.8 / 39.3 (L 128K), 37.6 / 38.0 (V4 B 8
1M): uncapped. The rule applies to that launch (:data:`SCATTER_CAP_CONFIG`, no sub-ranges) only:
capped, the ``SUB`` twin spills 8 bytes and the 512 / 1,024-position launches rise from 48 / 80
to 62 / 96 registers (a CTA an SM fewer; AOT, Triton 3.6.0, sm_90), neither measured. The
smem form (``scatter_form="smem"``, the Gluon kernel: 95-203 registers) takes no cap, explicit
or by rule."""
SCATTER_CAP_REGS = 128
SCATTER_CAP_CTAS = 3
SCATTER_CAP_CONFIG = (2048, 4, True)


def scatter_maxnreg(programs: int = 0, num_sms: int = 1) -> int | None:
    """The split pass B's register cap for a grid of ``programs`` on ``num_sms`` SMs
    (:data:`SCATTER_MAXNREG_ENV`), or None for none.

    Raises:
      ValueError: the variable is not empty, 0 or an integer in ``[64, 255]`` (named, with the
        value).
    """
    from kernels.scalars import env_int
    v = os.environ.get(SCATTER_MAXNREG_ENV, "").strip()
    if v == "":
        return SCATTER_CAP_REGS if programs > SCATTER_CAP_CTAS * num_sms else None
    if v == "0":
        return None
    return env_int(SCATTER_MAXNREG_ENV, 64, 255, what="0 or an integer in [64, 255]")


def scatter_subsplits() -> int:
    """:data:`SCATTER_SUB_ENV` as an int (unset or empty: 1).

    Raises:
      ValueError: the variable is not an integer in ``[1, SCATTER_SUB_MAX]`` (named, with the
        value).
    """
    from kernels.scalars import env_int
    return env_int(SCATTER_SUB_ENV, 1, SCATTER_SUB_MAX, 1)


PDL_ENV = "DSA_TOPK_PDL"
"""``1``: the top-k's launches (the plan part, the split pass B, the per-row kernel) use
programmatic dependent launch on sm_90 and later: each may start while the kernel before it in
the stream finishes, and waits (``griddepcontrol.wait``, its first instruction) for that
kernel's writes before touching memory. No kernel triggers its dependents early
(``griddepcontrol.launch_dependents``), so each grid triggers when it completes. Unset or ``0``
(the default): plain launches. At B 1 the top-k is three short launches after the logits kernel
(~6 us each on the H200); each boundary costs the drain of one grid and the start of the next
(bench/NOTES.md, tenth session). Measured (H100): no effect as built (2026-12-06); with an early
trigger after each kernel's wait and at the WS logits kernel's start, slower everywhere (B 1 L
128K 27.4 -> 32.4 us, B 64 L 128K 457.5 -> 464.1; 2026-12-07, bench/NOTES.md "Twenty-seventh
session"), so the trigger was removed."""


def pdl_enabled(device) -> bool:
    """Whether :func:`launch_topk` launches with programmatic dependent launch on ``device``:
    :data:`PDL_ENV` is ``1``, the device is CUDA with compute capability >= 9.0, and Triton is
    not interpreting.

    Raises:
      ValueError: :data:`PDL_ENV` holds something other than ``0``, ``1`` or nothing.
    """
    from kernels.scalars import env_switch
    if not env_switch(PDL_ENV) or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    if getattr(device, "type", None) != "cuda":
        return False
    import torch
    return torch.cuda.get_device_capability(device)[0] >= 9


# (positions per loop iteration, warps) of _topk_scatter_kernel, smallest first. The loop's
# SASS per position (AOT, Triton 3.6.0, sm_90) falls with positions per thread and rises with
# warps (the scan's cross-warp part): 2,048 at 4 warps 2.28 warp-instructions a position, 128
# registers (4 CTAs per SM); 2,048 at 8 warps 2.71, 4,096 at 8 warps 2.59 (150 registers).
SCATTER_CONFIGS = ((512, 4), (1024, 4), (2048, 4))
# Every (BLOCK, num_warps, vec) ``launch_topk(scatter=...)`` accepts: the heuristic's, a
# two-warp program (AOT, sm_90: 1,024 at 2 warps 1.98 warp-instructions a position at 128
# registers; H200 2026-12-05: 33.5 / 49.3 / 13.5 us against the heuristic's 31.9 / 58.3 / 15.6
# at B 64 L 64K / N 2 / V4 4K in 1M; 512 at 2 warps, 34.6 / 51.7 / 12.7, was dropped to keep the
# CI compile short), and the ``VEC`` layout (:func:`_pass_b`) at 1,024 and 2,048 positions.
# 2,048 VEC at 8 warps (80 registers, 432 SASS a warp an iteration) was swept on the H200
# (2026-12-05, indexer_sweep_ws_h200_20261205e.json: 29.4 / 44.8 / 22.3 us against 2,048 VEC at
# 4 warps 29.0 / 46.3 / 20.9 at B 64 L 64K / B 64 L 128K / B 1 L 128K) and dropped. Swept again
# on the H200 with the peeled pass B (2026-12-06, indexer_sweep_scatter_peel_h200_20261206_after.json,
# 80 registers: 16 warps an SM at B 64 L 128K's 256 programs against 8): 38.9 / 44.9 / 34.4 / 26.3
# us against 2,048 VEC at 4 warps 37.1 / 37.7 / 32.1 / 24.7 at B 64 L 128K / N 2 / V4 B 8 1M /
# L 64K; 4,096 VEC at 8 warps 48.0 / 56.3 / 41.9 / 31.2: twice the warps do not pay (Nsight
# Compute of the 4-warp launch, ncu_topk_scatter_b64_l128k_h200_20261206_peel.txt: the ALU pipe
# the busiest at 50 %, issue slots 43 % busy, 7.6 warps an SM).
SCATTER_SPACE = (tuple((b, w, False) for b, w in SCATTER_CONFIGS)
                 + ((1024, 2, False), (1024, 4, True), (2048, 4, True)))


def _split_positions(W: int, page_size: int, num_splits: int) -> int:
    """Table positions of a logits split: ``ceil(W / P / S) * P`` (the largest page range a
    split of a full row holds)."""
    return -(-(W // page_size) // max(num_splits, 1)) * page_size


def scatter_config(W: int, page_size: int, num_splits: int) -> tuple:
    """(BLOCK, num_warps, vec) of the split pass B from the shape alone: the smallest block
    that covers a split's largest page range (``ceil(W / P / S)`` pages) in one iteration,
    capped at 2,048 positions (B 64, L 64K: 16K positions per split with the WS logits
    kernel's 4 splits, 8 iterations; B 1, L 128K, 264 splits: 512 positions, one iteration),
    with :func:`_pass_b`'s ``VEC`` layout at 1,024 and 2,048 positions (the launch falls back
    to scalar loads where W, P or the row stride is not a multiple of 16). H200, 2026-12-05
    (bench/results/indexer_sweep_vec_h200_20261205.json, top-k time, indices bitwise equal):
    2,048 VEC 29.7 us against 34.6 scalar at B 64 L 64K, 42.9 against 52.0 at N 2; 1,024 VEC
    11.7 against 11.9 at V4 4K in a 1M table."""
    if W < 0 or page_size < 1:
        raise ValueError(f"scatter_config: expected W >= 0 and page_size >= 1, got W={W}, "
                         f"page_size={page_size}")
    per = _split_positions(W, page_size, num_splits)
    for blk, nw in SCATTER_CONFIGS:
        if blk >= per:
            return blk, nw, blk >= 1024
    return SCATTER_CONFIGS[-1] + (True,)
