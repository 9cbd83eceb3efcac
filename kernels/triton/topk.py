"""Exact, deterministic top-k over the valid prefix of float32 rows (radix select), in Triton.

Selection rule (docs/SPEC.md, ``indexer_topk``): among positions ``j < len[r]`` whose value
is neither NaN nor -inf (+inf qualifies), the ``topk`` largest; ties at the threshold go to the
smaller position, so the set is exact and deterministic. Rows with fewer qualifying positions
select all of them; the rest of the output row is -1. Output order: unspecified (deterministic;
the binding sorts by descending logit when ``sorted=True``). Same semantics as
``kernels.reference.topk_from_logits``.

Algorithm (one program per row, no atomics, no sort):

1. Map each float to an order-preserving uint32 key (``u | 0x80000000`` for sign 0, ``~u`` for
   sign 1; -0.0 first becomes +0.0 so that the two zeros tie); NaN and -inf (and positions
   ``>= len``) get key 0, which no qualifying value has (the smallest, ``-FLT_MAX``, maps to
   ``0x00800000``), so "qualifies" is ``key != 0``.
2. Pass A over the valid prefix: a 256-bin ``tl.histogram`` of the top 8 bits and the count C of
   qualifying positions. The threshold digit is the largest d whose suffix count reaches K.
   If ``C <= K`` every qualifying position is taken.
3. Pass B over the valid prefix: keys whose top digit is above d go straight to the output
   (slots from a running inclusive ``tl.cumsum``, so the write order is deterministic); keys in
   the threshold bucket are compacted, in position order, into an int32 scratch row.
4. Radix levels 2..4 (8 bits each) run over the compacted candidates only (typically a few
   percent of the row): histogram of the next digit among keys matching the prefix, pick the
   digit, subtract the count above it. The descent stops early when the chosen bucket must be
   taken whole.
5. Selection over the candidates in position order: keys above the final bucket are taken,
   keys in it while their running rank is ``<= need``: exactly the SPEC tie rule.
6. The tail ``[min(C, K), K)`` of the output row is filled with -1.

Cost: two reads of the row's valid prefix (A and B; 8 bytes per position in all) plus a few
passes over the threshold bucket's candidates, and only of the prefix: a row of ``len``
positions costs O(len) whatever the row's capacity W, and K (any value, 512/1024/2048 or not)
only enters through the digit choice and the -1 fill. Histograms are integer counts (order
independent), so results are bitwise reproducible. Rows up to 2^31 positions. At B*N = 64 rows
of 64K positions the logits (16 MiB) stay in the H200's L2 between the logits kernel and both
passes. The worst case (all values tied) makes the candidate passes read the whole row again.

Fused with the indexer (``hist=``): the logits kernel already holds every logit in registers,
so it also builds pass A's histogram per (request, split, draft) and writes 1 KiB per draft
instead of the top-k re-reading the row. Given the logits kernel's page size as well
(``page_size=``), pass B runs split: ``_topk_plan_kernel`` (one program per row) sums the S
histograms, picks the threshold digit and hands each split its output and candidate offsets
(the counts above and in the threshold bucket of a split are read off its own histogram), then
``_topk_scatter_kernel`` runs ``R x S`` programs, each over its split's positions only, and
writes in ascending position order exactly as the one-program pass would. The per-row kernel
then continues from the candidates (``FROM_PLAN``). At B = 1 the row is spread over as many
programs as the logits kernel used, instead of one.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl


# Bins of the top-digit histogram (8 radix bits); also the layout of the per-split histograms the
# logits kernel writes (kernels/triton/indexer.py, fused pass A).
HIST_BINS = tl.constexpr(256)


@dataclass(frozen=True)
class TopkConfig:
    """Launch configuration of :func:`launch_topk`.

    Attributes:
      block: positions per loop iteration (power of two).
      num_warps: Triton warps per program (one program per row).
    """

    block: int = 4096
    num_warps: int = 8

    # block 8192 at 4 warps spills (ptxas -v, sm_90 and sm_120); left out.
    SEARCH_SPACE = dict(block=(2048, 4096, 8192), num_warps=(8, 16))


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
def _descend(hist, SHIFT: tl.constexpr, bins, prefix, shift, need, done):
    """One radix level: pick the threshold digit from ``hist`` (counts of digit ``SHIFT`` among
    keys in the current bucket) unless ``done``. Returns (prefix, shift, need, done)."""
    ge = tl.cumsum(hist, axis=0, reverse=True)                     # count with digit >= d
    d_sel = tl.max(tl.where(ge >= need, bins, -1), axis=0)
    n_gt = tl.sum(tl.where(bins > d_sel, hist, 0), axis=0)
    n_eq = tl.sum(tl.where(bins == d_sel, hist, 0), axis=0)
    upd = done == 0
    prefix = tl.where(upd, prefix | (d_sel.to(tl.uint32) << SHIFT), prefix)
    shift = tl.where(upd, tl.full((), SHIFT, tl.uint32), shift)
    need = tl.where(upd, need - n_gt, need)
    # The chosen bucket is taken whole: no need to look at lower digits.
    done = tl.where(upd & (n_eq == need), 1, done)
    return prefix, shift, need, done


@triton.jit
def _pass_b(x_row, o_row, c_row, lo, hi, prefix, shift, done, n_out, n_cand,
            BLOCK: tl.constexpr):
    """Pass B over positions ``[lo, hi)`` of one row: keys above the threshold bucket
    (``key >> shift > prefix >> shift``) go to the output at ``n_out, n_out + 1, ...``, keys in
    it too when the descent is ``done``, else their positions are compacted into the candidate
    row at ``n_cand, ...``; both in ascending position order. Returns the new
    ``(n_out, n_cand)``."""
    offs = tl.arange(0, BLOCK)
    p_bucket = prefix >> shift
    done_v = (tl.zeros((BLOCK,), tl.int32) + done) != 0              # [BLOCK] (see NOTE below)
    for start in range(lo, hi, BLOCK):
        pos = start + offs
        key = order_key(tl.load(x_row + pos, mask=pos < hi, other=float("-inf")))
        k_bucket = key >> shift
        qual = key != 0
        gt = qual & (k_bucket > p_bucket)
        eq = qual & (k_bucket == p_bucket)
        direct = gt | (eq & done_v)
        keep = eq & (done_v == 0)
        slot = tl.cumsum(direct.to(tl.int32), axis=0) + n_out - 1
        tl.store(o_row + slot, pos.to(tl.int32), mask=direct)
        cslot = tl.cumsum(keep.to(tl.int32), axis=0) + n_cand - 1
        tl.store(c_row + cslot, pos.to(tl.int32), mask=keep)
        n_out += tl.sum(direct.to(tl.int32), axis=0)
        n_cand += tl.sum(keep.to(tl.int32), axis=0)
    return n_out, n_cand


@triton.jit
def _radix_topk_kernel(
    x_ptr,            # [R, W] float32 rows (only [0, len[r]) is read)
    len_ptr,          # [R] int32 valid-prefix lengths
    out_ptr,          # [R, topk] int32 selected positions, -1 padded
    cand_ptr,         # [R, W] int32 scratch: positions in the level-0 threshold bucket
    hist_ptr,         # [B, S, NB, 256] int32 per-split top-digit histograms (HAS_HIST), row = b*N+i
    W, topk,
    stride_x, stride_o, stride_c,
    n_drafts, n_drafts_pow2, num_splits,
    state_ptr,        # [R, 8] int32 plan (FROM_PLAN): prefix, shift, need, done, total, n_out, n_cand
    BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr, HAS_HIST: tl.constexpr,
    FROM_PLAN: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    L = tl.maximum(tl.minimum(tl.load(len_ptr + row), W), 0)
    x_row = x_ptr + row * stride_x
    o_row = out_ptr + row * stride_o
    c_row = cand_ptr + row * stride_c
    offs = tl.arange(0, BLOCK)
    BINS: tl.constexpr = 1 << RADIX_BITS
    NUM_LEVELS: tl.constexpr = 32 // RADIX_BITS
    SHIFT0: tl.constexpr = 32 - RADIX_BITS
    bins = tl.arange(0, BINS)

    if FROM_PLAN:
        # Passes A and B ran as _topk_plan_kernel + _topk_scatter_kernel (split over programs).
        st = state_ptr + row * 8
        prefix = tl.load(st + 0).to(tl.uint32)
        shift = tl.load(st + 1).to(tl.uint32)
        need = tl.load(st + 2)
        done = tl.load(st + 3)
        total = tl.load(st + 4)
        n_out = tl.load(st + 5)
        n_cand = tl.load(st + 6)
    else:
        # Pass A: histogram of the top digit, count of qualifying positions C; either summed from the
        # logits kernel's per-split histograms (fused) or by reading the whole prefix.
        hist = tl.zeros((BINS,), tl.int32)
        if HAS_HIST:
            b = row // n_drafts
            i = row % n_drafts
            h_row = hist_ptr + (b * num_splits * n_drafts_pow2 + i) * BINS + bins
            for sp in range(0, num_splits):
                hist += tl.load(h_row + sp * (n_drafts_pow2 * BINS))
        else:
            for start in range(0, L, BLOCK):
                o = start + offs
                key = order_key(tl.load(x_row + o, mask=o < L, other=float("-inf")))
                hist += tl.histogram((key >> SHIFT0).to(tl.int32), BINS, mask=key != 0)
        total = tl.sum(hist, axis=0)
        # C <= topk: every qualifying position is taken (prefix = shift = 0: bucket "key > 0").
        done = (total <= topk).to(tl.int32)
        prefix = tl.zeros((), tl.uint32)       # chosen high digits of the threshold key
        shift = tl.zeros((), tl.uint32)        # threshold bucket: key >> shift == prefix >> shift
        need = topk                            # positions still to take from the threshold bucket
        prefix, shift, need, done = _descend(hist, SHIFT0, bins, prefix, shift, need, done)

        # Pass B (whole prefix): keys above the threshold bucket go straight to the output; keys in
        # it go to the output too when the descent is over, else their positions are compacted (in
        # position order) into the scratch row for the lower digits.
        n_out, n_cand = _pass_b(x_row, o_row, c_row, 0, L, prefix, shift, done,
                                tl.zeros((), tl.int32), tl.zeros((), tl.int32), BLOCK)
        # The candidate row is read back below by other threads of this program: make every store
        # of pass B visible first (bar.sync orders global memory within the CTA).
        tl.debug_barrier()

    # Lower digits over the compacted candidates only (empty when the descent is over).
    for lvl in tl.static_range(1, NUM_LEVELS):
        SHIFT = 32 - (lvl + 1) * RADIX_BITS                       # constexpr (static loop)
        hist = tl.zeros((BINS,), tl.int32)
        end = tl.where(done != 0, 0, n_cand)
        for start in range(0, end, BLOCK):
            o = start + offs
            m = o < n_cand
            pos = tl.load(c_row + o, mask=m, other=0)
            key = order_key(tl.load(x_row + pos, mask=m, other=float("-inf")))
            m = m & ((key >> (SHIFT + RADIX_BITS)) == (prefix >> (SHIFT + RADIX_BITS)))
            hist += tl.histogram(((key >> SHIFT) & (BINS - 1)).to(tl.int32), BINS, mask=m)
        prefix, shift, need, done = _descend(hist, SHIFT, bins, prefix, shift, need, done)

    # Selection over the candidates in position order: the SPEC tie rule (smaller position wins)
    # is the running rank within the threshold bucket.
    p_bucket = prefix >> shift
    eq_seen = tl.zeros((), tl.int32)
    for start in range(0, n_cand, BLOCK):
        o = start + offs
        m = o < n_cand
        pos = tl.load(c_row + o, mask=m, other=0)
        key = order_key(tl.load(x_row + pos, mask=m, other=float("-inf")))
        k_bucket = key >> shift
        gt = m & (k_bucket > p_bucket)
        eq = m & (k_bucket == p_bucket)
        eq_rank = tl.cumsum(eq.to(tl.int32), axis=0) + eq_seen
        sel = gt | (eq & (eq_rank <= need))
        slot = tl.cumsum(sel.to(tl.int32), axis=0) + n_out - 1
        tl.store(o_row + slot, pos, mask=sel)
        eq_seen += tl.sum(eq.to(tl.int32), axis=0)
        n_out += tl.sum(sel.to(tl.int32), axis=0)

    # -1 padding of [min(C, topk), topk).
    n_sel = tl.minimum(total, topk)
    for start in range(n_sel, topk, BLOCK):
        o = start + offs
        tl.store(o_row + o, tl.full((BLOCK,), -1, tl.int32), mask=o < topk)


# NOTE: scalar flags are broadcast through an int32 block before mixing with block masks: the
# CPU interpreter types ``scalar_bool | block_bool`` as int32 and then rejects it as a mask.


@triton.jit
def _split_range(len_ptr, row, n_drafts, s, num_splits, W, P):
    """Positions ``[lo, hi)`` of row ``row`` covered by logits split ``s`` (the page range the
    logits kernel gives that split: ``n_pages = ceil(max_i len[b, i] / P)`` over the drafts of
    request ``b``, ``ceil(n_pages / S)`` pages per split), clipped to the row's valid prefix."""
    b = row // n_drafts
    dr = tl.arange(0, 4)            # N <= 4 drafts per request
    lens = tl.load(len_ptr + b * n_drafts + dr, mask=dr < n_drafts, other=0)
    lens = tl.maximum(tl.minimum(lens, W), 0)
    n_pages = tl.minimum(tl.cdiv(tl.max(lens, axis=0), P), W // P)
    per = tl.cdiv(n_pages, num_splits)
    L = tl.maximum(tl.minimum(tl.load(len_ptr + row), W), 0)
    lo = tl.minimum(s * per * P, L)
    hi = tl.minimum(lo + per * P, L)
    return lo, hi


@triton.jit
def _topk_plan_kernel(
    hist_ptr,         # [B, S, NB, 256] int32 per-split top-digit histograms, row = b * N + i
    state_ptr,        # [R, 8] int32 out: prefix, shift, need, done, total, n_out, n_cand, -
    offs_ptr,         # [R, S, 2] int32 out: exclusive output / candidate offsets of each split
    topk, n_drafts, n_drafts_pow2, num_splits,
):
    """Pass A of the split top-k (grid ``(R,)``): sum the per-split histograms, choose the top
    digit of the threshold, and give each split the offsets at which pass B writes its direct
    selections and its candidates, so that every row keeps ascending position order whatever
    program writes it (the counts per split come straight from its histogram)."""
    row = tl.program_id(0).to(tl.int64)
    BINS: tl.constexpr = HIST_BINS
    bins = tl.arange(0, BINS)
    b = row // n_drafts
    i = row % n_drafts
    h_row = hist_ptr + (b * num_splits * n_drafts_pow2 + i) * BINS + bins
    hist = tl.zeros((BINS,), tl.int32)
    for sp in range(0, num_splits):
        hist += tl.load(h_row + sp * (n_drafts_pow2 * BINS))
    total = tl.sum(hist, axis=0)
    done = (total <= topk).to(tl.int32)
    all_in = done                       # every qualifying key is taken: no threshold digit
    prefix = tl.zeros((), tl.uint32)
    shift = tl.zeros((), tl.uint32)
    need = topk
    prefix, shift, need, done = _descend(hist, 32 - 8, bins, prefix, shift, need, done)
    d_sel = tl.where(all_in != 0, -1, (prefix >> 24).to(tl.int32))
    n_out = tl.zeros((), tl.int32)
    n_cand = tl.zeros((), tl.int32)
    for sp in range(0, num_splits):
        h = tl.load(h_row + sp * (n_drafts_pow2 * BINS))
        gt = tl.sum(tl.where(bins > d_sel, h, 0), axis=0)
        eq = tl.sum(tl.where(bins == d_sel, h, 0), axis=0)
        o = offs_ptr + (row * num_splits + sp) * 2
        tl.store(o, n_out)
        tl.store(o + 1, n_cand)
        n_out += gt + tl.where(done != 0, eq, 0)
        n_cand += tl.where(done != 0, 0, eq)
    st = state_ptr + row * 8
    tl.store(st + 0, prefix.to(tl.int32))
    tl.store(st + 1, shift.to(tl.int32))
    tl.store(st + 2, need)
    tl.store(st + 3, done)
    tl.store(st + 4, total)
    tl.store(st + 5, n_out)
    tl.store(st + 6, n_cand)


@triton.jit
def _topk_scatter_kernel(
    x_ptr, len_ptr, out_ptr, cand_ptr, state_ptr, offs_ptr,
    W, P, stride_x, stride_o, stride_c, n_drafts, num_splits,
    BLOCK: tl.constexpr,
):
    """Pass B of the split top-k (grid ``(R, S)``): the program of split ``s`` reads only that
    split's positions, writes keys above the threshold bucket to the output and compacts the
    bucket's positions into the candidate row, at the offsets of :func:`_topk_plan_kernel`."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    lo, hi = _split_range(len_ptr, row, n_drafts, s, num_splits, W, P)
    st = state_ptr + row * 8
    prefix = tl.load(st + 0).to(tl.uint32)
    shift = tl.load(st + 1).to(tl.uint32)
    done = tl.load(st + 3)
    o = offs_ptr + (row * num_splits + s) * 2
    n_out = tl.load(o)
    n_cand = tl.load(o + 1)
    _pass_b(x_ptr + row * stride_x, out_ptr + row * stride_o, cand_ptr + row * stride_c, lo, hi,
            prefix, shift, done, n_out, n_cand, BLOCK)


def launch_topk(logits, lengths, topk: int, out, scratch, *, config: TopkConfig | None = None,
                hist=None, n_drafts: int = 1, page_size: int | None = None):
    """Exact top-k positions of each row's valid prefix (no host sync, graph capturable).

    Args:
      logits: float32 ``[R, W]`` with contiguous last dim; only ``[r, :lengths[r]]`` is read.
      lengths: int32 ``[R]`` contiguous valid-prefix lengths (clamped to ``[0, W]`` in-kernel).
      topk: K >= 1, any value.
      out: int32 ``[R, topk]`` with contiguous last dim; receives the selected positions (those
        above the threshold bucket in ascending position order, then the rest of the selection
        in ascending position order), then -1.
      scratch: int32 ``[R, W]`` (or wider) with contiguous last dim, uninitialised: candidate
        positions of the threshold bucket (at most ``lengths[r]`` are written per row).
      hist: None, or the int32 ``[B, S, next_pow2(N), 256]`` histograms written by
        ``kernels.triton.indexer.launch_indexer_logits(hist=...)`` for these rows
        (``R = B * N``, row ``b * N + i``); replaces pass A over the row.
      n_drafts: N (rows per request) when ``hist`` is given (N <= 4).
      page_size: P of the logits kernel's pages, with ``hist``: pass B then runs split over
        ``R x S`` programs, each over the positions of one logits split (the split histograms
        give every program its output offsets), instead of one program per row.
    """
    cfg = config or TopkConfig()
    R, W = logits.shape
    if R == 0 or topk == 0:
        return out
    if hist is not None:
        num_splits, nb = hist.shape[1], hist.shape[2]
    else:
        num_splits, nb = 1, 1
    split = hist is not None and page_size is not None
    state = offs = out
    if split:
        import torch
        state = torch.empty((R, 8), dtype=torch.int32, device=logits.device)
        offs = torch.empty((R, num_splits, 2), dtype=torch.int32, device=logits.device)
        _topk_plan_kernel[(R,)](hist, state, offs, topk, n_drafts, nb, num_splits, num_warps=4)
        _topk_scatter_kernel[(R, num_splits)](
            logits, lengths, out, scratch, state, offs, W, page_size, logits.stride(0),
            out.stride(0), scratch.stride(0), n_drafts, num_splits,
            BLOCK=SCATTER_BLOCK, num_warps=4)
    _radix_topk_kernel[(R,)](logits, lengths, out, scratch, hist if hist is not None else out,
                             W, topk, logits.stride(0), out.stride(0), scratch.stride(0),
                             n_drafts, nb, num_splits, state,
                             BLOCK=cfg.block, RADIX_BITS=8, HAS_HIST=hist is not None,
                             FROM_PLAN=split, num_warps=cfg.num_warps)
    return out


# Positions per loop iteration of _topk_scatter_kernel (a split covers ceil(n_pages / S) pages).
SCATTER_BLOCK = 1024
