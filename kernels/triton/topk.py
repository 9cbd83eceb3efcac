"""Exact, deterministic top-k over the valid prefix of float32 rows (radix select), in Triton.

Selection rule (../shared/SPEC.md, ``indexer_topk``): among positions ``j < len[r]`` whose value
is neither NaN nor -inf (+inf qualifies), the ``topk`` largest; ties at the threshold go to the
smaller position, so the set is exact and deterministic. Rows with fewer qualifying positions
select all of them; the rest of the output row is -1. Output order: ascending position (the
binding sorts by descending logit when ``sorted=True``). Same semantics as
``kernels.reference.topk_from_logits``.

Algorithm (one program per row, no atomics, no sort):

1. Map each float to an order-preserving uint32 key (``u | 0x80000000`` for sign 0, ``~u`` for
   sign 1); NaN and -inf (and positions ``>= len``) get key 0, which no qualifying value has
   (the smallest, ``-FLT_MAX``, maps to ``0x00800000``), so "qualifies" is ``key != 0``.
2. Radix select, most significant digit first, ``RADIX_BITS = 8`` -> 4 passes over the row:
   pass p builds a 256-bin ``tl.histogram`` of digit p among keys whose higher digits equal the
   prefix chosen so far, then picks the largest digit d whose suffix count reaches the number
   still needed, and subtracts the count of keys in larger digits. Pass 0 also counts the
   qualifying positions C; if ``C <= topk`` every qualifying position is selected and the
   remaining passes read nothing (their loop bound is 0). A pass also stops the descent when the
   chosen bucket must be taken whole (its count equals the number needed).
3. One selection pass in position order: keys whose bucket (key >> shift) is above the threshold
   bucket are taken, keys in the threshold bucket are taken while their running rank (an
   inclusive ``tl.cumsum`` carried across blocks) is ``<= need``: exactly the SPEC tie rule.
   Output slots come from a second running ``tl.cumsum``, so the write order is deterministic.
4. The tail ``[min(C, topk), topk)`` is filled with -1.

Cost: at most 5 reads of the row's valid prefix (4 histogram passes + 1 selection pass) and only
of the prefix: a row of ``len`` positions costs O(len) whatever the row's capacity W, and K
(any value, 512/1024/2048 or not) only enters through the -1 fill. The histogram is integer
counting (order-independent), so results are bitwise reproducible. Rows up to 2^31 positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl


@dataclass(frozen=True)
class TopkConfig:
    """Launch configuration of :func:`launch_topk`.

    Attributes:
      block: positions per loop iteration (power of two).
      num_warps: Triton warps per program (one program per row).
    """

    block: int = 4096
    num_warps: int = 8

    SEARCH_SPACE = dict(block=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16))


@triton.jit
def order_key(x):
    """Order-preserving uint32 key of float32 ``x``; 0 for NaN and -inf (never selected)."""
    u = x.to(tl.uint32, bitcast=True)
    sign_bit = tl.full(u.shape, 0x80000000, tl.uint32)
    key = tl.where((u & sign_bit) != 0, ~u, u | sign_bit)
    ok = (x == x) & (x != float("-inf"))
    return tl.where(ok, key, tl.zeros_like(key))


@triton.jit
def _radix_topk_kernel(
    x_ptr,            # [R, W] float32 rows (only [0, len[r]) is read)
    len_ptr,          # [R] int32 valid-prefix lengths
    out_ptr,          # [R, topk] int32 selected positions, -1 padded
    W, topk,
    stride_x, stride_o,
    BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    L = tl.maximum(tl.minimum(tl.load(len_ptr + row), W), 0)
    x_row = x_ptr + row * stride_x
    o_row = out_ptr + row * stride_o
    offs = tl.arange(0, BLOCK)
    BINS: tl.constexpr = 1 << RADIX_BITS
    NUM_PASSES: tl.constexpr = 32 // RADIX_BITS
    bins = tl.arange(0, BINS)

    prefix = tl.zeros((), tl.uint32)       # chosen high digits of the threshold key
    shift = tl.zeros((), tl.uint32)        # the threshold bucket is key >> shift == prefix >> shift
    need = topk                            # positions still to take from the current bucket
    done = L < 0                           # False: descent finished
    take_all = L < 0                       # False: C <= topk, every qualifying position is taken
    total = tl.zeros((), tl.int32)
    for p in tl.static_range(NUM_PASSES):
        SHIFT: tl.constexpr = 32 - (p + 1) * RADIX_BITS
        hist = tl.zeros((BINS,), tl.int32)
        end = tl.where(done, 0, L)
        for start in range(0, end, BLOCK):
            o = start + offs
            key = order_key(tl.load(x_row + o, mask=o < L, other=float("-inf")))
            m = key != 0
            if p > 0:
                m = m & ((key >> (SHIFT + RADIX_BITS)) == (prefix >> (SHIFT + RADIX_BITS)))
            digit = ((key >> SHIFT) & (BINS - 1)).to(tl.int32)
            hist += tl.histogram(digit, BINS, mask=m)
        if p == 0:
            total = tl.sum(hist, axis=0)
            take_all = total <= topk
            done = take_all
        ge = tl.cumsum(hist, axis=0, reverse=True)                 # count with digit >= d
        d_sel = tl.max(tl.where(ge >= need, bins, -1), axis=0)
        n_gt = tl.sum(tl.where(bins > d_sel, hist, 0), axis=0)
        n_eq = tl.sum(tl.where(bins == d_sel, hist, 0), axis=0)
        upd = (not done) if isinstance(done, bool) else (done == 0)
        prefix = tl.where(upd, prefix | (d_sel.to(tl.uint32) << SHIFT), prefix)
        shift = tl.where(upd, tl.full((), SHIFT, tl.uint32), shift)
        need = tl.where(upd, need - n_gt, need)
        done = done | (upd & (n_eq == need))

    # Selection pass in position order (deterministic output slots).
    p_bucket = prefix >> shift
    eq_seen = tl.zeros((), tl.int32)
    n_out = tl.zeros((), tl.int32)
    for start in range(0, L, BLOCK):
        o = start + offs
        key = order_key(tl.load(x_row + o, mask=o < L, other=float("-inf")))
        cand = key != 0
        k_bucket = key >> shift
        gt = cand & (k_bucket > p_bucket)
        eq = cand & (k_bucket == p_bucket)
        eq_rank = tl.cumsum(eq.to(tl.int32), axis=0) + eq_seen
        sel = cand & (take_all | gt | (eq & (eq_rank <= need)))
        slot = tl.cumsum(sel.to(tl.int32), axis=0) + n_out - 1
        tl.store(o_row + slot, o.to(tl.int32), mask=sel)
        eq_seen += tl.sum(eq.to(tl.int32), axis=0)
        n_out += tl.sum(sel.to(tl.int32), axis=0)

    # -1 padding of [min(C, topk), topk).
    n_sel = tl.minimum(total, topk)
    for start in range(n_sel, topk, BLOCK):
        o = start + offs
        tl.store(o_row + o, tl.full((BLOCK,), -1, tl.int32), mask=o < topk)


def launch_topk(logits, lengths, topk: int, out, *, config: TopkConfig | None = None):
    """Exact top-k positions of each row's valid prefix (no host sync, graph capturable).

    Args:
      logits: float32 ``[R, W]`` with contiguous last dim; only ``[r, :lengths[r]]`` is read.
      lengths: int32 ``[R]`` contiguous valid-prefix lengths (clamped to ``[0, W]`` in-kernel).
      topk: K >= 1, any value.
      out: int32 ``[R, topk]`` with contiguous last dim; receives the selected positions in
        ascending order, then -1.
    """
    cfg = config or TopkConfig()
    R, W = logits.shape
    if R == 0 or topk == 0:
        return out
    _radix_topk_kernel[(R,)](logits, lengths, out, W, topk, logits.stride(0), out.stride(0),
                             BLOCK=cfg.block, RADIX_BITS=8, num_warps=cfg.num_warps)
    return out
