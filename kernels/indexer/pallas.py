"""Lightning-indexer logits and exact top-k as Pallas kernels (Triton lowering), for ``jax_impl``.

The JAX twin of ``kernels/indexer/triton.py`` + ``kernels/topk/triton.py``; read them side by side.

Operation (docs/SPEC.md, "Operation A"): for request b, draft i and logical position j

    logit[b, i, j] = k_scale[j] * sum_h weights[b, i, h] * relu(q[b, i, h, :] . k[j, :])

valid iff ``0 <= j < len[b, i]`` (``len = L_b - (N - 1 - i)``, or ``context_lens[b, i]``) and the
page entry ``block_table[b, j // P]`` is a real page (``0 <= entry < num_pages``); -inf elsewhere.
Top-k: the K largest logits among valid positions that are neither NaN nor -inf, ties to the
smaller position, -1 padding. Semantics from DeepSeek-V3.2-Exp ``inference/model.py``
(Indexer.forward), DeepGEMM ``fp8_paged_mqa_logits`` (paged layout, per-token scale, MTP mask).

Cache layouts read in-kernel (byte-exact with ``kernels/formats.py``):

* ``fp8_indexer``: uint8 ``[num_pages, P * (D_I + 4)]``: per page P rows of D_I e4m3 bytes, then
  P little-endian float32 scales. The kernel reads the uint8 bytes in place (an XLA-side slice
  or width-changing bitcast of the cache could copy it). When D_I divides 4P (P = 64, D_I = 128)
  the launcher passes the free reshape ``[num_pages, P + 4P/D_I, D_I]``: at one page per
  iteration the key tile is then a plain 2-D ``[P, D_I]`` load, otherwise a ``[P * D_I]`` byte
  load reshaped in registers; a group of pages is one gathered ``[pages * P, D_I]`` load in
  either layout (below). Keys are bitcast to e4m3; the scale bytes are assembled into 32-bit words
  (``b0 | b1 << 8 | b2 << 16 | b3 << 24``) and bitcast to float32 (the lowering only bitcasts
  between equal widths).
* ``dense``: ``[num_pages, P, D_I]`` float (fp32 / fp16 / bf16, same dtype as q), scale 1.

Kernel 1, ``_indexer_logits_kernel`` (grid ``(B, S)``; one program = request b, split s):

* The program loads q ``[NP * HP, D_I]`` (drafts padded to ``NP = next_pow2(N)``, heads to
  ``HP = max(16, next_pow2(H_I))``: dots need every dimension >= 16 and blocks are powers of
  two) and the weights once, then loops over its share of request b's pages with a *runtime* trip
  count: ``n_pages_b = ceil(max_i len[b, i] / P)``, split ``s`` takes pages
  ``[s * ceil(n_pages_b / S), ...) ∩ [0, n_pages_b)``. Programs past ``L_b`` run zero iterations
  and do no loads, so a 4K request in a table sized for 1M reads what it reads in a 4K table.
* Per iteration a group of ``cfg.pages`` consecutive pages (default 2), ``T = pages * P`` token
  rows: each row's page is resolved through the block table (one ``[T]`` load of the entries,
  rows of a page sharing one), and the keys arrive in one gathered load ``[T, D_I]``, every
  index an integer array (the lowering's ``concatenate`` only joins trailing size-1 axes, so
  per-page tiles cannot be stacked). At ``pages = 1`` the page is a scalar and the tile a
  plain slice load, as before the groups.
* One dot per group, tokens as M by default (``cfg.trans``): ``[T, D_I] x [D_I, NP*HP] -> fp32``,
  ReLU as ``where(s < 0, 0, s)`` (NaN propagates, as in the float64 reference), times the
  weight, padded rows zeroed with ``where`` (so a NaN key cannot leak through ``0 * NaN``), head
  sum along the last axis (``reshape [T, NP, HP] -> sum(axis=2)``), transposed to ``[NP, T]``;
  with ``trans=False`` q rows are M: ``[NP*HP, D_I] x [D_I, T]``, head sum
  ``reshape [NP, HP, T] -> sum(axis=1)``; at N = 1 (``NP = 1``) either orientation is a plain
  sum over the head axis of the accumulator, with no reshape or transpose (the Triton twin's
  ``tl.sum(relu(s) * w, axis=1)``: no layout conversion before the store). Then the k scale,
  draft mask, store ``[NP, T]``.
  Operands: fp8 q and keys are converted to fp16 first (exact for e4m3; products of two 11-bit
  significands are exact and the dot accumulates in fp32), because Hopper's fp8 x fp8 dot
  accumulates with ~14 mantissa bits, which reorders near-ties against the float64 reference
  (SPEC allows 1-ulp differences only); dense fp16 / bf16 / fp32 as is, ``Precision.HIGHEST``
  (IEEE for fp32, never TF32).
* Measured on the Triton twin only (``kernels/indexer/triton.py``, H200, B = 64, L = 64K, N = 1),
  not on this kernel: tokens as M 410 us against 539 us (the head sum stays within accumulator
  rows instead of crossing warps), two pages per iteration 342 us against 410 us; its fp8 dot
  put logits ~6e-5 (relative) off the fp16-operand result.
* A page whose entry is negative or ``>= num_pages``, or that lies past the split's end (the last
  group of a split may overhang it), is never read: its loads are masked off (a masked load
  issues no memory transaction; page ids and table indices are clamped so even the addresses
  stay in the buffers) and its logits are -inf. Positions of pages past the split's end belong
  to the next program: the group's stores are masked, and the logits buffer is padded by
  ``pages - 1`` pages so an overhang past the table's last page stays inside it. Masked loads
  instead of a branch keep the loop body straight-line for Triton's software pipelining.
* Bytes per request: ``L_b * (D_I + 4)`` read once (132 B per position at D_I = 128), plus
  ``N * L_b * 4`` logits written; q (``N * H_I * D_I``) is re-read per program from L2. FLOPs:
  ``2 * N * H_I * D_I`` per position (16.8 MFLOP per 1K positions at N = 1, H_I = 64); ~64
  FLOP/byte, memory bound on H200 and sm_120. Split count ``S ~ 2 * num_SMs / B`` (as the torch
  path) so B = 64 fills 132 SMs.
* With ``group_max=True`` (the top-k path) the epilogue also stores, per draft and per group of
  :data:`GROUP` = 4 positions, the max order key (below), 1/4 of the logits' size: the pruning
  input of the top-k (``pages * P / 4`` groups per iteration, masked like the logits).

Top-k, four kernels (:func:`launch_topk_select`), exact selection:

* The lowering has no sort, no top-k and no histogram, so the selection is built from
  compare-and-count passes, ``cumsum`` (``tt.scan``) and scatter stores (``plgpu.store`` through
  an integer-array index: one pointer tensor, masked lanes write nothing; the interpreter runs
  the same code, so one branch serves both).
* Keys: float32 -> order-preserving int32 (``bits`` for sign 0, ``bits ^ 0x7FFFFFFF`` for
  sign 1, -0 canonicalised to +0 so that -0 and +0 tie as in the reference); NaN, -inf and
  positions ``>= len`` get ``INT32_MIN`` (:data:`SENTINEL`), below every qualifying key.
* Radix select (``_radix_select``): first a *windowed* digit (:func:`window_bin`: 16 bins of
  1/8 binade at and below the source's maximum, everything lower clamped into bin 0; the
  monotone mapping of PERF_DESIGN's windowed first digit). If the K-th key lands in bins 1..15
  its top 12 bits (sign, exponent, 3 mantissa bits) are fixed after that one pass and the
  three most significant 4-bit passes are skipped (6 passes instead of 8); if it lands in bin 0
  (the window missed: the threshold lies more than ~2 binades below the maximum) the full 8
  passes run. Each pass counts, for the ``2^RADIX_BITS`` candidate prefixes, the keys ``>=``
  each (``[BLOCK, 2^R]`` compares), with *deferred counts*: a ``[BLOCK, 2^R]`` int32 partial
  count is carried through the pass's loop and reduced across threads once per pass (the
  previous kernel reduced per 256-element chunk: ~300-400 latency-bound reductions per row).
* ``_topk_prune_kernel`` (grid ``(B, N)``): over group maxima of ``G = 4 * R`` positions, the
  row's own group width: the kernel takes the max of ``R`` consecutive 4-position maxima the
  logits kernel emits, ``R`` (:func:`prune_merge`) the largest of 4, 2, 1 that leaves at least
  ``2 K`` groups in the row. It counts them and the row's max key (one deferred pass), then, if
  at least K groups hold a qualifying key, ``tau`` = the K-th largest group max rounded down to
  its 1/128-binade interval (the radix select stops after the window pass and one 4-bit digit):
  a lower bound of the K-th largest key (K groups each hold a key ``>= tau``), so only keys
  ``>= tau`` can be selected. On i.i.d. scores that leaves ``L (1 - (1 - K / n)^(1 / G))``
  candidates (``n = L / G`` groups): ~1.1-1.4 K at ``n >= 2 K``, at most ~3.5 K for any ``L``
  above the capacity (``bench.topk_sim --pallas``). A fixed 16-position group (before
  2026-12-05) pruned nothing below ``L = 16 K`` (fewer than K groups) and little just above it:
  every row of 8K-40K positions at K = 2048 overflowed the capacity and was selected from the
  whole row by one program (the jax decode layer at L 32K: 668 us of indexer at B 1).
  Identities of groups do not matter (only counts of group maxima ``>=`` thresholds), so the
  kernel holds one copy of its passes per ``R`` (``pl.when`` on the runtime ``R``, R static
  inside) and reads the emitted maxima with contiguous loads: a ``[BLOCK, R]`` tile per chunk,
  one 4R-byte load and an in-register max per group (:func:`_group_source`), the next
  iteration's loads in flight while one counts (:func:`_fold_chunks`). With ``R`` a runtime
  value (2026-12-05) every pass gathered ``[BLOCK, 4]`` words one by one (4 scalar loads and
  8 shuffles per group; V4-Flash B 1 L 1M 334 -> 709 us on the H200, ``bench/NOTES.md``).
* ``_topk_count_kernel`` (grid ``(B, N, S)``): split s of the row (a contiguous range of
  ``ceil(chunks / S)`` chunks) counts its keys ``>= tau`` and its qualifying keys (deferred,
  one reduction per program).
* ``_topk_compact_kernel`` (grid ``(B, N, S)``): split s starts at the exact offset
  ``sum_{s' < s} count[s']`` (read from the count pass, summed in the kernel) and scatters its
  candidates (key and position, in position order) into the row's ``CAP`` slots
  (``CAP = next_pow2(4 K)``, at most the row): per chunk one ``cumsum`` for the ranks and one
  sum for the running base. Candidates past CAP are dropped (the select then reads the row).
* ``_topk_select_kernel`` (grid ``(B, N)``): over the candidates (or over the whole row if they
  overflowed CAP: exact either way, only slower): radix select of the K-th largest key T
  (skipped when ``C <= K``: everything qualifying is taken), then emission in position order by
  scatter: keys ``> T``, and keys ``== T`` while their running rank (inclusive ``cumsum``
  carried across chunks) is ``<= K - #{key > T}``: exactly the SPEC tie rule. Slots
  ``[min(C, K), K_PAD)`` get -1 (disjoint from the data slots, so no two threads write one
  address). Output order: ascending position; the binding sorts (``sorted=True``) by
  descending logit in XLA over the K selected only.
* ``topk`` above the row's capacity: every kernel, the scratch and the binding's sort are sized
  by ``min(K, W_pad)``; the columns past it are written as -1 by an XLA pad.
* Cost per row of L valid positions (K = 2048, L = 64K, 4-bit digits, window hit): the
  prune kernel reads the L/4 group maxima (merged to L/16 groups) 3 times (one stats pass + 2
  radix passes; 16 compare-adds per group per pass); count and compact read the row's logits
  once each (2 x 4 B x L), split over S programs (``default_topk_splits``: about eight per SM
  over all rows); the select kernel reads the ~2-3K candidates 7 times and emits. Every
  counting loop issues the loads of 4 chunks together (the prune's a loop iteration ahead).
  Integer counting only, no atomics: bitwise reproducible.
* The scratch and counts are extra outputs of the calls (Pallas-Triton has no scratch
  buffers); the kernels of one top-k are ordered by their data dependencies, so no barrier is
  needed between the compaction's writes and the select's reads.

What the Triton lowering cannot do (and what replaces it): sort / top-k / histogram (counting
against ``2^R`` candidate thresholds), gathers in interpret mode unless every index is an
integer array (the page groups' gathers use integer arrays only), concatenation other than
joining two trailing size-1 axes (per-row page ids instead of stacked page tiles), bitcasts
between widths (byte assembly), scalar prefetch / data-dependent BlockSpecs (whole-array refs,
page ids read in the kernel), scratch buffers (extra outputs used as per-row scratch). Masked
scatter stores do run in interpret mode (jax 0.10), but as a read-modify-write of every lane's
address: masked lanes therefore get distinct dummy slots past the live ones (``_compact``).

Every ``pallas_call`` goes through :func:`kernels._pallas_call.triton_call`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels import layouts
from kernels._pallas_call import interpret_default, triton_call

SENTINEL = -(2 ** 31)          # INT32_MIN: key of NaN, -inf and positions past the valid length
_SLOTS = 16                    # output slots filled per one-hot compaction step
_UNROLL = 4                    # chunks whose loads one iteration of a counting pass issues together
_PREFETCH = 1                  # iterations ahead whose loads the prune's counting loops issue
GROUP = 4                      # positions per group maximum the logits kernel emits (top-k pruning)
PRUNE_MERGE = (4, 2, 1)        # group maxima the prune kernel may merge into one group (prune_merge)


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


def _cdiv(a, b):
    return (a + b - 1) // b


@dataclass(frozen=True)
class PallasIndexerConfig:
    """Launch configuration of :func:`launch_indexer_logits` / :func:`launch_topk_select`.

    Attributes:
      num_splits: programs per request of the logits kernel (grid ``(B, num_splits)``); None =
        heuristic ``ceil(2 * num_sms / B)`` clipped to ``[1, max_pages]``.
      num_warps: warps of the logits kernel; None = 4, or 8 when the score tile
        ``NP * HP * pages * P`` has >= 16384 elements.
      num_stages: Triton pipeline stages of the logits kernel.
      trans: tokens as the logits dot's M dimension (``[tokens, D_I] x [D_I, q rows]``), so the
        weighted head sum reduces along each accumulator row instead of across warps. Measured
        on the Triton twin (``kernels/indexer/triton.py``, H200, B = 64, L = 64K): 410 us
        against 539 us with q rows as M; not measured for this kernel. False: q rows as M.
      pages: pages scored per iteration of the logits kernel (``pages * P`` token rows per dot;
        a power of two). Triton twin, same shape: 342 us at 2 against 410 us at 1 (4 spills there).
      block: positions per chunk of the top-k kernel (power of two).
      radix_bits: bits per radix pass of the top-k kernel (1, 2, 4 or 8; 32 / radix_bits passes,
        ``2^radix_bits`` candidate thresholds counted per position and pass).
      topk_num_warps: warps of the top-k kernel.
      candidates: candidate capacity per row of the top-k kernels (power of two); None =
        ``next_pow2(4 * K)``; never more than the padded row. Rows whose pruned candidate set
        overflows it are selected from the full row instead (exact either way, slower).
      topk_splits: programs per row of the top-k count and compact passes (a power of two);
        None = :func:`default_topk_splits` (about eight programs per SM over all rows).
    """

    num_splits: int | None = None
    num_warps: int | None = None
    num_stages: int = 2
    block: int = 256
    radix_bits: int = 4
    topk_num_warps: int = 4
    candidates: int | None = None
    topk_splits: int | None = None
    trans: bool = True
    pages: int = 2

    SEARCH_SPACE = dict(num_splits=(None, 1, 2, 4, 8, 16, 32), num_warps=(None, 4, 8),
                        num_stages=(1, 2, 3), block=(128, 256, 512, 1024),
                        radix_bits=(2, 4, 8), topk_num_warps=(4, 8),
                        candidates=(None, 2048, 4096, 8192, 16384),
                        topk_splits=(None, 1, 2, 4, 8, 16, 32, 64, 128, 256),
                        trans=(False, True), pages=(1, 2))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "PallasIndexerConfig":
        """Config from a dispatch-table entry; unknown keys and values outside SEARCH_SPACE are
        ignored (a table can never select an unchecked config)."""
        kw = {}
        for f in fields(cls):
            if d and f.name in d and d[f.name] in cls.SEARCH_SPACE[f.name]:
                kw[f.name] = d[f.name]
        return cls(**kw)


def default_num_splits(batch: int, max_pages: int, num_sms: int) -> int:
    """About two programs per SM over the batch, at most one per page (as the torch path)."""
    return max(1, min(max_pages, _cdiv(2 * max(num_sms, 1), max(batch, 1))))


def order_key(x, valid):
    """Order-preserving int32 key of float32 ``x`` (signed compare = float compare, -0 == +0);
    :data:`SENTINEL` where ``valid`` is False or ``x`` is NaN or -inf. Used in-kernel and in XLA."""
    x = jnp.where(x == 0, jnp.float32(0.0), x)                  # -0 -> +0
    bits = lax.bitcast_convert_type(x, jnp.int32)
    key = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)
    ok = valid & (x == x) & (x != -jnp.inf)
    return jnp.where(ok, key, jnp.int32(SENTINEL))


# ============================================================================ logits kernel

def _scales_from_bytes(sb):
    """float32 ``[n]`` from the little-endian scale bytes ``[n, 4]`` (uint8): assembled into
    32-bit words and bitcast (the lowering only bitcasts between equal widths)."""
    sb = sb.astype(jnp.int32)
    shifts = lax.broadcasted_iota(jnp.int32, sb.shape, 1) * 8
    bits = jnp.sum(lax.shift_left(sb, shifts), axis=1)          # disjoint byte fields: sum == or
    return lax.bitcast_convert_type(bits, jnp.float32)


def _load_page(k_ref, page, ok, *, P: int, D: int, FP8: bool, ROWS: bool):
    """One page of keys ``[P, D]`` and its scales ``[P]`` float32 (1 for dense); ``pages = 1``.

    ``ok`` False: every load is masked off (no memory transaction; ``page`` must still be a
    clamped in-range id so the address arithmetic stays inside the buffer). Masked loads rather
    than a branch keep the page loop a straight-line body that Triton can software-pipeline.
    ``ROWS``: the fp8 cache arrives as ``[num_pages, P + 4P/D, D]`` (a free XLA reshape when D
    divides 4P, e.g. P = 64, D = 128: 64 token rows then 2 rows of scale bytes), so the key tile
    is a plain 2-D load; otherwise it is ``[num_pages, P*(D+4)]`` and the tile is a 1-D byte load
    reshaped in registers.
    """
    def load(view, shape, other):
        return plgpu.load(view, mask=jnp.full(shape, ok), other=other)

    if not FP8:
        k = load(k_ref.at[page], (P, D), 0)                                   # [P, D] float
        return k, jnp.ones((P,), jnp.float32)
    if ROWS:
        raw = load(k_ref.at[page, pl.ds(0, P), :], (P, D), 0)                 # [P, D] uint8
        sb = load(k_ref.at[page, pl.ds(P, (4 * P) // D), :], ((4 * P) // D, D), 0)  # scale bytes
    else:
        raw = load(k_ref.at[page, pl.ds(0, P * D)], (P * D,), 0)              # [P*D] uint8
        sb = load(k_ref.at[page, pl.ds(P * D, 4 * P)], (4 * P,), 0)           # [4P] scale bytes
    k = lax.bitcast_convert_type(raw, jnp.float8_e4m3fn).reshape(P, D)
    return k, _scales_from_bytes(sb.reshape(P, 4))              # [P, D] e4m3, [P] f32


def _load_pages(k_ref, page, ok, *, P: int, D: int, PAGES: int, FP8: bool, ROWS: bool):
    """Keys ``[T, D]`` and scales ``[T]`` of ``PAGES`` pages (``T = PAGES * P`` token rows; 1 for
    dense), each token row addressed through its own page id: one gathered load per tile.

    ``page`` / ``ok``: int32 / bool ``[T]``, the page id of each row (rows of one page share
    it; clamped in range where ``ok`` is False) and whether its page is read at all (rows of
    an invalid page or of a page past the split's end issue no memory transaction). Every
    index is an integer array (interpret mode runs such gathers; it cannot mix them with
    slices): the lowering turns them into one pointer tensor ``page * stride + offset``, as the
    Triton twin's ``k_ptr + page[:, None] * stride_kp + ...``. Layouts as :func:`_load_page`.
    """
    T = PAGES * P
    tok = lax.broadcasted_iota(jnp.int32, (T, 1), 0) % P                 # token in its page
    pg = page[:, None]                                                   # [T, 1]
    col = lax.broadcasted_iota(jnp.int32, (T, D), 1)
    mask = jnp.broadcast_to(ok[:, None], (T, D))
    if not FP8:
        k = plgpu.load(k_ref.at[jnp.broadcast_to(pg, (T, D)), jnp.broadcast_to(tok, (T, D)), col],
                       mask=mask, other=0)                               # [T, D] float
        return k, jnp.ones((T,), jnp.float32)

    lay = layouts.fp8_indexer(D)                      # trace-time constants
    if ROWS:                    # [num_pages, P + 4P/D, D]: token rows, then scale-byte rows
        raw = plgpu.load(k_ref.at[jnp.broadcast_to(pg, (T, D)), jnp.broadcast_to(tok, (T, D)), col],
                         mask=mask, other=0)                                          # [T, D] u8
    else:                       # [num_pages, P*(D+4)]
        raw = plgpu.load(k_ref.at[jnp.broadcast_to(pg, (T, D)), tok * lay.data.nbytes + col],
                         mask=mask, other=0)
    # scale bytes of each row (kernels.layouts.fp8_indexer: P data rows, then P float32 scales)
    byte = (lay.scale_offset(P, 0) + tok * lay.scale.nbytes
            + lax.broadcasted_iota(jnp.int32, (T, 4), 1))
    at = (jnp.broadcast_to(pg, (T, 4)),) + ((byte // D, byte % D) if ROWS else (byte,))
    sb = plgpu.load(k_ref.at[at], mask=jnp.broadcast_to(ok[:, None], (T, 4)), other=0)  # [T, 4] u8
    return lax.bitcast_convert_type(raw, jnp.float8_e4m3fn), _scales_from_bytes(sb)


def _indexer_logits_kernel(
    bt_ref,     # [B, max_pages] int32 block table
    lens_ref,   # [B, NP] int32 valid length per draft (0 for padded drafts)
    q_ref,      # [B, NP*HP, D] e4m3 / float, rows (draft, head)
    w_ref,      # [B, NP*HP] float32
    k_ref,      # fp8: [num_pages, P*(D+4)] or [num_pages, P + 4P/D, D] uint8; dense: [num_pages, P, D]
    o_ref,      # [B, NP, W_pad] float32 logits (only pages < n_pages_b written)
    *bm_refs,   # EMIT_BM: ([B, NP, BM_W] int32 max order key per GROUP-position group,)
    P: int, D: int, H: int, N: int, HP: int, NP: int, NUM_PAGES: int, MAX_PAGES: int,
    NUM_SPLITS: int, FP8: bool, ROWS: bool, EMIT_BM: bool, TRANS: bool, PAGES: int,
):
    b = pl.program_id(0)
    s = pl.program_id(1)
    lens = lens_ref[b, :]                                       # [NP]
    n_pages = (jnp.max(lens) + (P - 1)) // P
    per = (n_pages + (NUM_SPLITS - 1)) // NUM_SPLITS
    p0 = s * per
    p1 = jnp.maximum(jnp.minimum(p0 + per, n_pages), p0)
    q = q_ref[b]                                                # [R, D], R = NP*HP
    if FP8:
        # e4m3 -> fp16 is exact; the fp16 dot's products (11 x 11 bits) are exact and it
        # accumulates in fp32, where Hopper's fp8 x fp8 dot keeps ~14 mantissa bits (measured on
        # the Triton twin: logits off by ~6e-5 relative, enough to reorder near-ties).
        q = q.astype(jnp.float16)
    w = w_ref[b]                                                # [R]
    row = lax.broadcasted_iota(jnp.int32, (NP * HP,), 0)
    live = ((row % HP) < H) & ((row // HP) < N)                 # [R] real (draft, head)
    T = PAGES * P                                               # token rows per iteration
    t = lax.broadcasted_iota(jnp.int32, (T,), 0)
    G = P // GROUP                                              # groups per page

    def body(g, carry):
        g0 = p0 + g * PAGES                                     # first page of the group
        if PAGES == 1:
            page = bt_ref[b, g0]
            ok = (page >= 0) & (page < NUM_PAGES)
            k, scale = _load_page(k_ref, jnp.where(ok, page, 0), ok, P=P, D=D, FP8=FP8, ROWS=ROWS)
            ok_t = jnp.broadcast_to(ok, (T,))
        else:
            # Each row's page through the block table (rows of one page share the entry; the
            # index is clamped so even a masked address stays in the table). Pages past the
            # split's end belong to the next program: not read, not written.
            pg = g0 + t // P                                    # [T]
            in_split = pg < p1
            page = plgpu.load(bt_ref.at[b, jnp.minimum(pg, MAX_PAGES - 1)], mask=in_split,
                              other=-1)
            ok_t = (page >= 0) & (page < NUM_PAGES)             # False past the split's end
            k, scale = _load_pages(k_ref, jnp.where(ok_t, page, 0), ok_t, P=P, D=D,
                                   PAGES=PAGES, FP8=FP8, ROWS=ROWS)
        if FP8:
            k = k.astype(jnp.float16)
        if TRANS:
            # tokens as the dot's M: the head sum runs along each accumulator row
            sc = lax.dot_general(k, q, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                                 preferred_element_type=jnp.float32)          # [T, R]
            contrib = jnp.where(live[None, :], jnp.where(sc < 0, jnp.float32(0.0), sc) * w[None, :],
                                jnp.float32(0.0))
            if NP == 1:     # N = 1: a plain row sum, no reshape / transpose (layout converts)
                acc = jnp.sum(contrib, axis=1)[None, :]                       # [1, T]
            else:
                acc = jnp.sum(contrib.reshape(T, NP, HP), axis=2).T           # [NP, T]
        else:
            sc = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                                 preferred_element_type=jnp.float32)          # [R, T]
            contrib = jnp.where(live[:, None], jnp.where(sc < 0, jnp.float32(0.0), sc) * w[:, None],
                                jnp.float32(0.0))
            if NP == 1:
                acc = jnp.sum(contrib, axis=0)[None, :]                       # [1, T]
            else:
                acc = jnp.sum(contrib.reshape(NP, HP, T), axis=1)             # [NP, T]
        valid = (g0 * P + t[None, :] < lens[:, None]) & ok_t[None, :]         # [NP, T]
        logit = jnp.where(valid, acc * scale[None, :], -jnp.inf)
        if PAGES == 1:
            o_ref[b, :, pl.ds(g0 * P, P)] = logit
        else:
            plgpu.store(o_ref.at[b, :, pl.ds(g0 * P, T)], logit,
                        mask=jnp.broadcast_to(in_split[None, :], (NP, T)))
        if EMIT_BM:
            bm = jnp.max(order_key(logit, valid).reshape(NP, PAGES * G, GROUP), axis=2)
            if PAGES == 1:
                bm_refs[0][b, :, pl.ds(g0 * G, G)] = bm                       # [NP, G]
            else:
                gi = lax.broadcasted_iota(jnp.int32, (NP, PAGES * G), 1)
                plgpu.store(bm_refs[0].at[b, :, pl.ds(g0 * G, PAGES * G)], bm,
                            mask=g0 + gi // G < p1)                           # [NP, PAGES*G]
        return carry

    lax.fori_loop(0, (p1 - p0 + (PAGES - 1)) // PAGES, body, jnp.int32(0))


# ============================================================================ top-k kernels
#
# Four Pallas calls per top-k (see the module docstring, "Top-k"): _topk_prune_kernel (one
# program per row, over the row's group maxima), _topk_split_kernel twice (count, then compact;
# grid (B, N, S), S programs per row over contiguous ranges of the row), _topk_select_kernel (one
# program per row, over the <= CAP candidates). A *source* is a function c -> (key [BLOCK] int32,
# pos [BLOCK] int32) reading chunk c; keys past the source's length are SENTINEL.

WINDOW_SHIFT = 20              # key >> 20: sign, 8 exponent bits, 3 mantissa bits (1/8 binade)
_HI_MIN = -(1 << (31 - WINDOW_SHIFT))   # smallest key >> WINDOW_SHIFT (-2048: SENTINEL's)


def window_bin(key, top, nbins: int):
    """The windowed first digit: ``clamp((key >> WINDOW_SHIFT) - (top - (nbins - 1)), 0, nbins - 1)``.

    ``key``: order keys (:func:`order_key`, int32); ``top``: ``max_key >> WINDOW_SHIFT`` of the
    source (so no key lands above bin ``nbins - 1``). Bins ``1 .. nbins - 1`` are the 1/8-binade
    buckets of the ``nbins - 1`` buckets at and below the maximum's; bin 0 holds everything
    lower (clamped). Monotone in ``key``, so a threshold found among the bins is exact; a
    threshold in the clamped bin 0 means the window missed (the caller falls back to the full
    key). Same mapping as PERF_DESIGN's windowed first digit (there with 256 bins and a
    histogram); written with operators and ``jnp.clip`` only, so one definition can serve both
    stacks. :func:`window_lower` gives the bins' lower bounds, which is what the kernels compare
    against (counting ``key >= lower(d)`` per bin replaces the histogram Pallas lacks).
    """
    hi = lax.shift_right_arithmetic(key, jnp.int32(WINDOW_SHIFT))
    return jnp.clip(hi - (top - (nbins - 1)), 0, nbins - 1)


def window_lower(top, digit, nbins: int):
    """Smallest key whose :func:`window_bin` is ``>= digit`` (int32, elementwise over ``digit``):
    SENTINEL for bin 0, ``(top - (nbins - 1) + digit) << WINDOW_SHIFT`` above (a bucket below
    the smallest key's clamps to SENTINEL as well)."""
    hi = jnp.maximum(top - (nbins - 1) + digit, _HI_MIN)
    return jnp.where(digit == 0, jnp.int32(SENTINEL), lax.shift_left(hi, jnp.int32(WINDOW_SHIFT)))


def _fold_chunks(src, n_chunks, step, init):
    """``step(acc, key)`` folded over the keys (``[BLOCK]``) of chunks ``[0, n_chunks)`` of a
    source, :data:`_UNROLL` chunks per loop iteration, their loads issued together.

    A plain source (``src(c) -> (key, pos)``) is read inside the iteration; chunks past
    ``n_chunks`` (up to ``_UNROLL - 1``) read as SENTINEL (every source masks positions past
    its length). A source with ``load(c, on)`` / ``finish(c, raw)`` attributes
    (:func:`_group_source`) is software-pipelined: iteration c issues the loads of iteration
    ``c + _PREFETCH`` and folds the chunks whose loads iteration ``c - _PREFETCH`` issued.
    sm_90 AOT (ptxas of the CPU's Triton 3.9), R = 4: loaded and reduced in the same
    iteration, the SASS placed each 16-byte load next to its first use and had two of the
    eight in flight (four load latencies exposed per iteration); at ``_PREFETCH = 1`` it
    issues all eight back to back (at the end of the body, so about one latency is exposed
    per iteration), 168 registers, no spill; at 2 (a whole iteration of cover) 255 registers
    and spills inside the loops. Chunks at and past ``n_chunks`` are masked off by ``on`` (no
    memory transaction) and read as SENTINEL. SENTINEL keys only count towards a threshold of
    SENTINEL, whose count the radix select never uses as a count above the threshold."""
    n_it = (n_chunks + (_UNROLL - 1)) // _UNROLL
    load = getattr(src, "load", None)
    if load is None:
        def body(c, acc):
            keys = [src(c * _UNROLL + j)[0] for j in range(_UNROLL)]   # loads in flight together
            for key in keys:
                acc = step(acc, key)
            return acc
        return lax.fori_loop(0, n_it, body, init)

    def issue(c):
        return [load(c * _UNROLL + j, c * _UNROLL + j < n_chunks) for j in range(_UNROLL)]

    def body(c, carry):
        acc, ahead = carry                          # ahead[d]: the loads of iteration c + d
        nxt = issue(c + _PREFETCH)                  # in flight while the next iteration counts
        for j, r in enumerate(ahead[0]):
            acc = step(acc, src.finish(c * _UNROLL + j, r))
        return acc, ahead[1:] + [nxt]

    return lax.fori_loop(0, n_it, body, (init, [issue(d) for d in range(_PREFETCH)]))[0]


def _count_ge(src, n_chunks, cands, *, BLOCK: int):
    """For the thresholds ``cands`` (a list of int32 scalars), the number of keys ``>=`` each over
    chunks ``[0, n_chunks)``: an int32 ``[len(cands)]`` vector. Deferred counts: one
    ``[BLOCK, len(cands)]`` partial count is carried through the loop (per-thread compares and
    adds: no layout conversion or barrier per chunk) and reduced across threads once, after the
    loop, as one 2-D reduction (sixteen 1-D ones before 2026-12-05: 163 barriers in the prune
    kernel, 605 in the select kernel, by the sm_90 AOT compile).

    The loop is :func:`_fold_chunks`: :data:`_UNROLL` chunks per iteration, their loads issued
    together (at B = 1 the prune and select kernels are one program per row, so one dependent
    load per iteration left every pass latency-bound), and a step ahead for the prune's group
    maxima."""
    nb = len(cands)
    lane = lax.broadcasted_iota(jnp.int32, (nb,), 0)
    cvec = jnp.zeros((nb,), jnp.int32)
    for d, t in enumerate(cands):
        cvec = jnp.where(lane == d, t, cvec)

    acc = _fold_chunks(src, n_chunks,
                       lambda acc, key: acc + (key[:, None] >= cvec[None, :]).astype(jnp.int32),
                       jnp.zeros((BLOCK, nb), jnp.int32))
    return jnp.sum(acc, axis=0)


def _radix_select(src, n_chunks, kth, top, *, RADIX_BITS: int, BLOCK: int, MIN_SHIFT: int = 0):
    """``(T, #{key > T})`` for T the ``kth``-largest key of the source (``1 <= kth <= #keys``;
    anything when ``n_chunks`` is 0). ``top``: ``max_key >> WINDOW_SHIFT`` over the source.
    ``MIN_SHIFT > 0``: stop once the bits at and above it are fixed and return the smallest key
    of that interval, a lower bound of T (``#{key > T}`` is then meaningless).

    First a windowed pass (:func:`window_bin`, ``2^RADIX_BITS`` bins of 1/8 binade below the
    maximum): when the K-th key lands in bins ``1..`` its top 12 bits are known after that one
    pass and the three (at 4 bits) most significant radix passes run zero chunks; when it lands
    in the clamped bin 0 (the window missed) they run. Then most significant digit first over
    the remaining bits: each pass counts, for the ``2^RADIX_BITS`` candidate prefixes, the keys
    ``>=`` the candidate (:func:`_count_ge`: one 2-D cross-thread reduction per pass, none per
    chunk) and keeps the largest digit whose count still reaches ``kth``; the count
    strictly above the chosen interval is tracked, and after the last pass it is
    ``#{key > T}``. Integer counting only; the per-digit bookkeeping is scalar.
    """
    BINS = 1 << RADIX_BITS
    sent = jnp.int32(SENTINEL)

    digit = lax.broadcasted_iota(jnp.int32, (BINS,), 0)

    def pick(cnts):             # [BINS] counts, non-increasing in the digit
        dstar = jnp.sum((cnts >= kth).astype(jnp.int32)) - 1
        nxt = jnp.sum(jnp.where(digit == dstar + 1, cnts, 0))    # 0 past BINS - 1
        return dstar, nxt

    t_u = jnp.int32(0)          # threshold bits so far, in the unsigned (key ^ INT32_MIN) domain
    above = jnp.int32(0)        # keys strictly above the current threshold interval
    hit = jnp.bool_(False)
    window = WINDOW_SHIFT % RADIX_BITS == 0
    if window:
        lo = top - (BINS - 1)
        cands = [window_lower(top, d, BINS) for d in range(BINS)]
        dstar, nxt = pick(_count_ge(src, n_chunks, cands, BLOCK=BLOCK))
        hit = (dstar >= 1) & (lo + dstar >= _HI_MIN)
        t_u = jnp.where(hit, lax.shift_left(lo + dstar, jnp.int32(WINDOW_SHIFT)) ^ sent, 0)
        above = jnp.where(hit, nxt, 0)
    for p in range(32 // RADIX_BITS):
        shift = 32 - RADIX_BITS * (p + 1)
        if shift < MIN_SHIFT:
            break
        active = jnp.logical_not(hit) if (window and shift >= WINDOW_SHIFT) else jnp.bool_(True)
        cands = [(t_u | jnp.int32(d << shift if d << shift < 2 ** 31 else (d << shift) - 2 ** 32)) ^ sent
                 for d in range(BINS)]
        dstar, nxt = pick(_count_ge(src, jnp.where(active, n_chunks, 0), cands, BLOCK=BLOCK))
        above = jnp.where(active & (dstar + 1 < BINS), nxt, above)
        t_u = jnp.where(active, t_u | lax.shift_left(dstar, jnp.int32(shift)), t_u)
    return t_u ^ sent, above


def _compact(src, c0, n_chunks, take_fn, write, base, limit):
    """Write, in source order, what ``take_fn`` selects from chunks ``[c0, c0 + n_chunks)`` into
    slots ``base + rank`` below ``limit``: ``write(slot [BLOCK], key, pos, mask)`` is one
    scatter store (masked lanes write nothing on the GPU; their slots are
    ``limit + lane``, so the buffer needs ``limit + BLOCK`` slots). ``take_fn(key, eq_before)`` -> (take, eq)
    ``[BLOCK]`` bool, ``eq_before`` the running count of ``eq``. Per chunk: one ``cumsum`` (the
    ranks) and one sum (the running base), no other cross-thread work. Returns the counts of
    ``eq`` and of ``take``."""
    def body(c, carry):
        eq_before, sel = carry
        key, pos = src(c0 + c)
        take, eq = take_fn(key, eq_before)
        take_i = take.astype(jnp.int32)
        slot = sel + jnp.cumsum(take_i) - 1                                            # [BLOCK]
        ok = take & (slot < limit)
        # masked lanes get distinct addresses past the limit (the buffers hold BLOCK more
        # slots): the interpreter's masked scatter rewrites them with their old values, so a
        # shared dummy slot could undo a real write there
        write(jnp.where(ok, slot, limit + lax.broadcasted_iota(jnp.int32, slot.shape, 0)), key, pos, ok)
        return eq_before + jnp.sum(eq.astype(jnp.int32)), sel + jnp.sum(take_i)

    n_eq, end = lax.fori_loop(0, n_chunks, body, (jnp.int32(0), jnp.int32(base)))
    return n_eq, end - base


def _row_source(x_ref, b, i, L, *, BLOCK: int):
    """The logits row ``(b, i)`` as order keys, SENTINEL at and past ``L`` (never read there)."""
    offs = lax.broadcasted_iota(jnp.int32, (BLOCK,), 0)

    def src(c):
        pos = c * BLOCK + offs
        ok = pos < L
        x = plgpu.load(x_ref.at[b, i, pl.ds(c * BLOCK, BLOCK)], mask=ok, other=-jnp.inf)
        return order_key(x, ok), pos
    return src


def _split_counts(cnt_ref, b, i, *, S: int):
    """Per-split ``(candidates [S], valid [S])`` from the count pass's ``[S, 16]`` rows."""
    blk = cnt_ref[b, i]                                                               # [S, 16]
    col = lax.broadcasted_iota(jnp.int32, (S, _SLOTS), 1)
    return jnp.sum(jnp.where(col == 0, blk, 0), axis=1), jnp.sum(jnp.where(col == 1, blk, 0), axis=1)


def _stats_vec(*vals):
    """int32 ``[16]`` holding ``vals`` in its first lanes (one contiguous store of a small row)."""
    lane = lax.broadcasted_iota(jnp.int32, (_SLOTS,), 0)
    out = jnp.zeros((_SLOTS,), jnp.int32)
    for j, v in enumerate(vals):
        out = jnp.where(lane == j, v, out)
    return out


def prune_merge(n4, k):
    """Group maxima merged into one pruning group (``R``, the group is ``GROUP * R`` positions)
    for a row of ``n4`` emitted ``GROUP``-position maxima and top-k ``k``: the largest of
    :data:`PRUNE_MERGE` that leaves at least ``2 k`` groups, else 1. Works on Python ints and on
    traced int32 scalars alike (the kernel's rule and the tests' NumPy twin are this function).

    Why 2 k: with ``n`` groups of ``G`` i.i.d. keys the K-th largest group max leaves about
    ``L (1 - (1 - k / n)^(1 / G))`` keys at or above it: ``1.36 k`` at ``n = 2 k``, G = 16,
    and all ``L`` at ``n = k``. Longer groups read fewer maxima per pass (the prune kernel is
    one program per row), so the widest group that keeps ``n >= 2 k`` is taken."""
    r = 1
    for m in sorted(PRUNE_MERGE)[1:]:
        if isinstance(n4, numbers.Integral):
            r = m if n4 >= 2 * k * m else r
        else:
            r = jnp.where(n4 >= 2 * k * m, jnp.int32(m), r)
    return r


def _group_source(bm_ref, b, i, n4, *, R: int, BLOCK: int):
    """The pruning groups of one row, ``R`` (static) consecutive emitted maxima each, as a
    source: chunk c = groups ``[c * BLOCK, (c + 1) * BLOCK)`` = emitted maxima
    ``[c * BLOCK * R, (c + 1) * BLOCK * R)``, one *contiguous* load.

    ``R > 1``: a ``[BLOCK, R]`` load (row = one group, R consecutive words, the row's start a
    multiple of R), so the compiler sees runs of R contiguous, aligned words and issues one
    ``R * 4``-byte load per group; the group max is a reduction along the row, in registers.
    The load's mask is per group (``gi * R < n4``: constant along the row, which keeps the load
    vectorised); maxima at and past ``n4`` inside the row's last group are then replaced by
    SENTINEL (a ``where``), so a group holds exactly the maxima of the row's positions, as
    before: a group with no qualifying key is SENTINEL. ``R = 1`` takes the same form,
    ``[BLOCK, 1]`` (a 1-D ``[BLOCK]`` load reached the ``[BLOCK, 16]`` compares through a
    layout conversion in shared memory: 8 barriers per loop iteration at sm_90).
    ``load(c, on)``: the raw ``[BLOCK, R]`` tile (``on`` False: masked off whole);
    ``finish(c, x)``: its group maxima ``[BLOCK]``.

    Chunks past the group count (the counting loops' ``_UNROLL`` padding) are masked off whole
    and their address is clamped to the row's last chunk (a scalar clamp: the offsets stay
    contiguous), which :func:`group_max_width` keeps inside the buffer
    (``BM_W`` a multiple of ``BLOCK * max(PRUNE_MERGE)``)."""
    sent = jnp.int32(SENTINEL)
    last = bm_ref.shape[-1] // (BLOCK * R) - 1          # last whole chunk of the buffer
    offs = lax.broadcasted_iota(jnp.int32, (BLOCK,), 0)
    row = lax.broadcasted_iota(jnp.int32, (BLOCK, 1), 0)
    col = lax.broadcasted_iota(jnp.int32, (BLOCK, R), 1)

    def load(c, on=True):
        first = (c * BLOCK + row) * R                                   # [BLOCK, 1] group starts
        e = (jnp.minimum(c, last) * BLOCK + row) * R + col              # [BLOCK, R] contiguous
        live = jnp.broadcast_to((first < n4) & on, (BLOCK, R))          # per group, not per word
        return plgpu.load(bm_ref.at[b, i, e], mask=live, other=sent)

    def finish(c, x):
        if R > 1:               # maxima at and past n4 in the row's last group: SENTINEL
            x = jnp.where((c * BLOCK + row) * R + col < n4, x, sent)
        return jnp.max(x, axis=1)

    def src(c):
        return finish(c, load(c)), c * BLOCK + offs
    src.load, src.finish = load, finish
    return src


def _topk_prune_kernel(
    lens_ref,   # [B, NP] int32 valid length per draft
    bm_ref,     # [B, NP, BM_W] int32 max order key per group of GROUP positions
    st_ref,     # [B, NP, 16] int32 out: lane 0 tau (candidate bound), lane 1 the row's max key
    *, K: int, BLOCK: int, RADIX_BITS: int,
):
    b = pl.program_id(0)
    i = pl.program_id(1)
    L = lens_ref[b, i]
    n4 = (L + (GROUP - 1)) // GROUP                 # emitted group maxima of the row
    R = prune_merge(n4, K)                          # merged per pruning group (runtime)
    # One copy of the row's passes per merge width, each with R static, so that every pass
    # reads the emitted maxima with contiguous loads whatever R is (a runtime R made them a
    # 4-wide gather: scalar loads, 4x the load instructions per group, and the group max a
    # cross-lane shuffle reduction). Exactly one branch runs per row.
    for r in PRUNE_MERGE:
        pl.when(R == r)(lambda r=r: _prune_row(bm_ref, st_ref, b, i, n4, R=r, K=K, BLOCK=BLOCK,
                                                RADIX_BITS=RADIX_BITS))


def _prune_row(bm_ref, st_ref, b, i, n4, *, R: int, K: int, BLOCK: int, RADIX_BITS: int):
    """The prune of row ``(b, i)`` over groups of ``R`` (static) emitted maxima (module
    docstring): their count and the row's max key (one deferred pass), then tau."""
    sent = jnp.int32(SENTINEL)
    n_groups = (n4 + (R - 1)) // R
    n_gchunks = (n_groups + (BLOCK - 1)) // BLOCK
    group_src = _group_source(bm_ref, b, i, n4, R=R, BLOCK=BLOCK)

    def scan(carry, key):       # qualifying groups and the max key, reduced once after the loop
        n, mx = carry
        return n + (key != sent).astype(jnp.int32), jnp.maximum(mx, key)

    n, mx = _fold_chunks(group_src, n_gchunks, scan,
                         (jnp.zeros((BLOCK,), jnp.int32), jnp.full((BLOCK,), SENTINEL, jnp.int32)))
    n_vgroups, row_max = jnp.sum(n), jnp.max(mx)
    # If at least K groups hold a qualifying key, the K-th largest group max tau is a lower bound
    # of the K-th largest key (K groups each hold a key >= tau): only keys >= tau can be selected.
    # Any lower bound of the K-th group max serves, so the select stops after the window pass
    # and one more digit (3 passes when the window hits): the bound is then the K-th group max
    # rounded down to 1/128 binade (4-bit digits), which adds few candidates.
    prune = n_vgroups >= K
    top = lax.shift_right_arithmetic(row_max, jnp.int32(WINDOW_SHIFT))
    tau, _ = _radix_select(group_src, jnp.where(prune, n_gchunks, 0), K, top,
                           RADIX_BITS=RADIX_BITS, BLOCK=BLOCK,
                           MIN_SHIFT=max(0, WINDOW_SHIFT - RADIX_BITS))
    tau = jnp.where(prune, tau, sent + 1)          # sent + 1 is below every qualifying key
    st_ref[b, i, :] = _stats_vec(tau, row_max)


def _split_range(L, s, *, S: int, BLOCK: int):
    """Chunks ``[c0, c0 + n)`` of split ``s``: the row's ``ceil(L / BLOCK)`` chunks cut into S
    contiguous ranges of ``ceil(n_chunks / S)`` (programs past the row's end get none)."""
    n_chunks = (L + (BLOCK - 1)) // BLOCK
    per = (n_chunks + (S - 1)) // S
    c0 = s * per
    return c0, jnp.maximum(jnp.minimum(c0 + per, n_chunks) - c0, 0)


def _topk_count_kernel(
    lens_ref,   # [B, NP] int32
    st_ref,     # [B, NP, 16] int32 (lane 0: tau)
    x_ref,      # [B, NP, W_pad] float32 logits (read below lens only)
    cnt_ref,    # [B, NP, S, 16] int32 out: lane 0 keys >= tau, lane 1 qualifying keys, of split s
    *, S: int, BLOCK: int,
):
    b, i, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    L = lens_ref[b, i]
    tau = st_ref[b, i, 0]
    src = _row_source(x_ref, b, i, L, BLOCK=BLOCK)
    c0, n = _split_range(L, s, S=S, BLOCK=BLOCK)

    def body(c, carry):         # deferred: [BLOCK] partial counts, reduced once below
        nc, nv = carry
        key, _ = src(c0 + c)
        return nc + (key >= tau).astype(jnp.int32), nv + (key != SENTINEL).astype(jnp.int32)

    z = jnp.zeros((BLOCK,), jnp.int32)
    nc, nv = lax.fori_loop(0, n, body, (z, z))
    cnt_ref[b, i, s, :] = _stats_vec(jnp.sum(nc), jnp.sum(nv))


def _topk_compact_kernel(
    lens_ref,   # [B, NP] int32
    st_ref,     # [B, NP, 16] int32 (lane 0: tau)
    cnt_ref,    # [B, NP, S, 16] int32 per-split counts (count pass)
    x_ref,      # [B, NP, W_pad] float32 logits
    ck_ref,     # [B, NP, CAP + BLOCK] int32 out: candidate keys, in position order
    cp_ref,     # [B, NP, CAP + BLOCK] int32 out: candidate positions
    *, S: int, BLOCK: int, CAP: int,
):
    b, i, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    L = lens_ref[b, i]
    tau = st_ref[b, i, 0]
    cand, _ = _split_counts(cnt_ref, b, i, S=S)
    base = jnp.sum(jnp.where(lax.broadcasted_iota(jnp.int32, (S,), 0) < s, cand, 0))  # exact offset
    c0, n = _split_range(L, s, S=S, BLOCK=BLOCK)

    def write(slot, key, pos, mask):
        plgpu.store(ck_ref.at[b, i, slot], key, mask=mask)
        plgpu.store(cp_ref.at[b, i, slot], pos, mask=mask)

    _compact(_row_source(x_ref, b, i, L, BLOCK=BLOCK), c0, n,
             lambda key, e: (key >= tau, key >= tau), write, base, CAP)


def _topk_select_kernel(
    lens_ref,   # [B, NP] int32
    st_ref,     # [B, NP, 16] int32 (lane 1: the row's max key)
    cnt_ref,    # [B, NP, S, 16] int32 per-split counts
    x_ref,      # [B, NP, W_pad] float32 logits (read only if the candidates overflowed CAP)
    ck_ref,     # [B, NP, CAP + BLOCK] int32 candidate keys (position order)
    cp_ref,     # [B, NP, CAP + BLOCK] int32 candidate positions
    o_ref,      # [B, NP, K_PAD + BLOCK] int32 out: selected positions (ascending), -1 padded
    *, K: int, K_PAD: int, S: int, BLOCK: int, RADIX_BITS: int, CAP: int,
):
    b = pl.program_id(0)
    i = pl.program_id(1)
    L = lens_ref[b, i]
    top = lax.shift_right_arithmetic(st_ref[b, i, 1], jnp.int32(WINDOW_SHIFT))
    cand, valid = _split_counts(cnt_ref, b, i, S=S)
    n_cand, n_valid = jnp.sum(cand), jnp.sum(valid)
    sent = jnp.int32(SENTINEL)
    offs = lax.broadcasted_iota(jnp.int32, (BLOCK,), 0)
    k_eff = jnp.minimum(n_valid, K)

    def cand_src(c):
        j = c * BLOCK + offs
        ok = j < n_cand
        return (plgpu.load(ck_ref.at[b, i, pl.ds(c * BLOCK, BLOCK)], mask=ok, other=sent),
                plgpu.load(cp_ref.at[b, i, pl.ds(c * BLOCK, BLOCK)], mask=ok, other=-1))

    def write_out(slot, key, pos, mask):
        plgpu.store(o_ref.at[b, i, slot], pos, mask=mask)

    def select(src, n):
        # Exact threshold T over the candidates (or the whole row if they overflowed), then
        # emission in position order: keys > T, and keys == T while their running rank is
        # <= K - #{key > T} (ties to the smaller position).
        take_all = n_valid <= K
        thr, n_gt = _radix_select(src, jnp.where(take_all, 0, n), jnp.maximum(k_eff, 1), top,
                                  RADIX_BITS=RADIX_BITS, BLOCK=BLOCK)
        thr = jnp.where(take_all, sent + 1, thr)
        need_eq = k_eff - jnp.where(take_all, n_valid, n_gt)

        def take_fn(key, eq_before):
            eq = key == thr
            return (key > thr) | (eq & (eq_before + jnp.cumsum(eq.astype(jnp.int32)) <= need_eq)), eq

        _compact(src, 0, n, take_fn, write_out, 0, K_PAD)

    fits = n_cand <= CAP

    @pl.when(fits)
    def _from_candidates():
        select(cand_src, (n_cand + (BLOCK - 1)) // BLOCK)

    @pl.when(jnp.logical_not(fits))
    def _from_row():
        select(_row_source(x_ref, b, i, L, BLOCK=BLOCK), (L + (BLOCK - 1)) // BLOCK)

    def fill(g, carry):         # -1 in slots [k_eff, K_PAD): disjoint from the data slots
        ids = g * BLOCK + offs
        plgpu.store(o_ref.at[b, i, pl.ds(g * BLOCK, BLOCK)], jnp.full((BLOCK,), -1, jnp.int32),
                    mask=ids >= k_eff)
        return carry

    lax.fori_loop(k_eff // BLOCK, K_PAD // BLOCK, fill, jnp.int32(0))


# ============================================================================ launchers

def padded_width(width: int, page_size: int, block: int) -> int:
    """Logits row capacity: ``width`` rounded up to a multiple of ``block`` and of P."""
    m = max(block, page_size)
    return _cdiv(width, m) * m


def group_max_width(w_pad: int, block: int) -> int:
    """Width of the group-maximum rows (one per :data:`GROUP` positions): ``W_pad / GROUP``
    rounded up to ``block * max(PRUNE_MERGE)``, so that the prune kernel's chunks of
    ``block * R`` maxima (:func:`_group_source`) are each wholly inside the row."""
    m = block * max(PRUNE_MERGE)
    return _cdiv(w_pad // GROUP, m) * m


def candidate_capacity(topk: int, cfg: PallasIndexerConfig, w_pad: int | None = None) -> int:
    """Candidates kept per row by the top-k kernels: ``cfg.candidates`` or ``next_pow2(4 K)``,
    at least one block and at most ``w_pad`` (a multiple of the block: powers of two, and
    ``w_pad`` a multiple of the block)."""
    cap = max(cfg.block, cfg.candidates or _next_pow2(4 * topk))
    return cap if w_pad is None else max(cfg.block, min(cap, w_pad))


def default_topk_splits(rows: int, w_pad: int, block: int, num_sms: int) -> int:
    """Programs per row of the count / compact passes: about eight per SM over all rows (each
    program streams its chunks one dependent load at a time, so the loads in flight per SM
    come from resident programs), a power of two, at most one per chunk of ``block``
    positions and at most 128 (every compact program reads all S counts of its row to find its
    offset). Not measured yet: the sweep's ``topk_splits`` is the knob."""
    want = _cdiv(8 * max(num_sms, 1), max(rows, 1))
    return max(1, min(_next_pow2(want), 128, _next_pow2(max(1, w_pad // block))))


def launch_indexer_logits(q, weights, k_cache, block_table, lens, *, fp8: bool, page_size: int,
                          num_sms: int, cfg: PallasIndexerConfig = PallasIndexerConfig(),
                          group_max: bool = False, interpret: bool | None = None):
    """Run :func:`_indexer_logits_kernel`; inputs already validated by ``jax_impl.indexer``.

    Args:
      q: ``[B, N, H_I, D_I]`` float8_e4m3fn (fp8) or float (dense, same dtype as the cache).
      weights: ``[B, N, H_I]`` float32.
      k_cache: fp8 uint8 ``[num_pages, P * (D_I + 4)]`` or dense ``[num_pages, P, D_I]``.
      block_table: int32 ``[B, max_pages]``.
      lens: int32 ``[B, N]`` valid length per draft, already clamped to ``[0, max_pages * P]``.
      group_max: also return the per-group maximum order keys the top-k kernel prunes with.
    Returns:
      float32 ``[B, NP, W_pad]`` (``NP = next_pow2(N)``, ``W_pad = padded_width((max_pages +
      cfg.pages - 1) * P, P, cfg.block)``): logits of
      positions below ``ceil(max_i lens[b, i] / P) * P``, -inf there where invalid; every other
      element is unwritten (garbage) and must be masked by the caller. With ``group_max``, a
      tuple with int32 ``[B, NP, group_max_width(W_pad, cfg.block)]``: the max :func:`order_key`
      of each :data:`GROUP` positions (SENTINEL if none qualifies), written for the same pages.
    """
    B, N, H, D = q.shape
    P = page_size
    num_pages = k_cache.shape[0]
    max_pages = block_table.shape[1]
    NP, HP = _next_pow2(N), max(16, _next_pow2(H))
    PAGES = cfg.pages
    if PAGES < 1 or PAGES & (PAGES - 1):
        raise ValueError(f"cfg.pages: expected a power of two >= 1, got {PAGES}")
    # A page group starting at a split's last page may reach PAGES - 1 pages past the table:
    # those positions are masked off, and the padding keeps even their addresses in the buffer.
    W_pad = padded_width((max_pages + PAGES - 1) * P, P, cfg.block)
    qp = jnp.pad(q, ((0, 0), (0, NP - N), (0, HP - H), (0, 0))).reshape(B, NP * HP, D)
    wp = jnp.pad(weights, ((0, 0), (0, NP - N), (0, HP - H))).reshape(B, NP * HP)
    lp = jnp.pad(lens, ((0, 0), (0, NP - N)))
    S = cfg.num_splits or default_num_splits(B, max_pages, num_sms)
    S = max(1, min(S, max_pages))
    warps = cfg.num_warps or (8 if NP * HP * PAGES * P >= 16384 else 4)
    rows = fp8 and (4 * P) % D == 0
    if rows:                                     # free reshape: [num_pages, P + 4P/D, D]
        k_cache = k_cache.reshape(num_pages, P + (4 * P) // D, D)
    out_shape = [jax.ShapeDtypeStruct((B, NP, W_pad), jnp.float32)]
    if group_max:
        out_shape.append(jax.ShapeDtypeStruct((B, NP, group_max_width(W_pad, cfg.block)), jnp.int32))
    kernel = lambda *refs: _indexer_logits_kernel(  # noqa: E731
        *refs, P=P, D=D, H=H, N=N, HP=HP, NP=NP, NUM_PAGES=num_pages, MAX_PAGES=max_pages,
        NUM_SPLITS=S, FP8=fp8, ROWS=rows, EMIT_BM=group_max, TRANS=cfg.trans, PAGES=PAGES)
    call = triton_call(kernel, out_shape=tuple(out_shape) if group_max else out_shape[0],
                       grid=(B, S), num_warps=warps, num_stages=cfg.num_stages,
                       interpret=interpret, name="indexer_logits")
    return call(block_table, lp, qp, wp, k_cache)


def launch_topk_select(logits, group_max, lens, topk: int, *, num_rows: int,
                       cfg: PallasIndexerConfig = PallasIndexerConfig(), num_sms: int = 132,
                       interpret: bool | None = None, return_candidates: bool = False):
    """Exact top-k of rows ``[:, :num_rows]`` of ``logits``: four Pallas calls (module docstring).

    Args:
      logits: float32 ``[B, NP, W_pad]`` (``W_pad`` a multiple of ``cfg.block``), valid below
        ``lens``; anything at or past ``lens`` is never read.
      group_max: int32 ``[B, NP, group_max_width(W_pad, cfg.block)]`` from
        :func:`launch_indexer_logits` (max :func:`order_key` per :data:`GROUP` positions, valid
        below ``ceil(lens / GROUP)``).
      lens: int32 ``[B, N]`` valid lengths, ``0 <= lens <= W_pad``.
      topk: K. Work and scratch are sized by ``min(K, W_pad)`` (no row holds more); the columns
        past it are -1 (written by XLA's pad, not by the kernels).
      num_sms: streaming multiprocessors, for the split heuristic (:func:`default_topk_splits`).
      return_candidates: also return the pruned candidate count of each row (int32 ``[B, NP]``)
        and the capacity (Python int): a row whose count exceeds it was selected from the whole
        row by one program (exact, slow). For tests and the bench's fallback rate.
    Returns:
      int32 ``[B, NP, K_out]``, ``K_out >= topk``; ``[:, :num_rows, :topk]`` holds the exact SPEC
      selection in ascending position order, then -1 (with ``return_candidates``: a tuple
      ``(indices, counts, capacity)``).
    Memory: besides the output, ``8 * (CAP + block)`` bytes of candidate scratch per row
    (``CAP = candidate_capacity(min(K, W_pad), cfg, W_pad) <= W_pad``), ``16 * 4 * S`` bytes of
    per-split counts and 64 bytes of row statistics per row.
    """
    B, NP, W_pad = logits.shape
    BLOCK = cfg.block
    if W_pad % BLOCK:
        raise ValueError(f"logits: width {W_pad} is not a multiple of block {BLOCK}")
    if group_max.shape != (B, NP, group_max_width(W_pad, BLOCK)):
        raise ValueError(f"group_max: expected shape {(B, NP, group_max_width(W_pad, BLOCK))}, "
                         f"got {group_max.shape}")
    k_work = max(1, min(int(topk), W_pad))
    K_PAD = _cdiv(k_work, BLOCK) * BLOCK
    CAP = candidate_capacity(k_work, cfg, W_pad)
    S = cfg.topk_splits or default_topk_splits(B * num_rows, W_pad, BLOCK, num_sms)
    S = max(1, min(_next_pow2(S), _next_pow2(W_pad // BLOCK)))
    interp = interpret_default() if interpret is None else interpret
    lp = jnp.pad(lens, ((0, 0), (0, NP - lens.shape[1])))
    i32 = jnp.int32
    common = dict(num_warps=cfg.topk_num_warps, num_stages=1, interpret=interp)

    st = triton_call(
        lambda *r: _topk_prune_kernel(*r, K=k_work, BLOCK=BLOCK, RADIX_BITS=cfg.radix_bits),
        out_shape=jax.ShapeDtypeStruct((B, NP, _SLOTS), i32), grid=(B, num_rows),
        name="indexer_topk_prune", **common)(lp, group_max)
    cnt = triton_call(
        lambda *r: _topk_count_kernel(*r, S=S, BLOCK=BLOCK),
        out_shape=jax.ShapeDtypeStruct((B, NP, S, _SLOTS), i32), grid=(B, num_rows, S),
        name="indexer_topk_count", **common)(lp, st, logits)
    scratch = jax.ShapeDtypeStruct((B, NP, CAP + BLOCK), i32)
    ck, cp = triton_call(
        lambda *r: _topk_compact_kernel(*r, S=S, BLOCK=BLOCK, CAP=CAP),
        out_shape=(scratch, scratch), grid=(B, num_rows, S),
        name="indexer_topk_compact", **common)(lp, st, cnt, logits)
    idx = triton_call(
        lambda *r: _topk_select_kernel(*r, K=k_work, K_PAD=K_PAD, S=S, BLOCK=BLOCK,
                                       RADIX_BITS=cfg.radix_bits, CAP=CAP),
        out_shape=jax.ShapeDtypeStruct((B, NP, K_PAD + BLOCK), i32), grid=(B, num_rows),
        name="indexer_topk_select", **common)(lp, st, cnt, logits, ck, cp)[:, :, :K_PAD]
    if topk > K_PAD:
        idx = jnp.pad(idx, ((0, 0), (0, 0), (0, topk - K_PAD)), constant_values=-1)
    if return_candidates:
        return idx, jnp.sum(cnt[..., 0], axis=-1), CAP
    return idx
