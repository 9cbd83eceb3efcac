"""The split pass A of the top-k in Gluon: the per-split windowed first-digit histograms with one
shared-memory atomic add a key.

Semantics, grid and output are those of ``kernels.topk.triton._topk_hist_kernel`` (bitwise the
same ``[B, S, NB, HIST_ROW]`` blocks: the 256 counts of split ``s`` of row ``b * N + i`` at the
split's own window bases, the largest qualifying key's digit in bin 255 and the smallest's in
bin 0, then the upper and the lower base; ``(BASE_NONE, LBASE_NONE)`` and zero counts for a split
without a qualifying key). Only the way the counts are made differs:

* **Two reads of the split.** The first takes the float max and the min over the qualifying
  logits (not NaN, not -inf) in registers; each warp's largest and smallest key go to two shared
  words (``red.shared.max/min.u32``), whose values fix the split's bases. The second (mostly from
  L2: a program's split is at most a few hundred KB, just read) bins every key at those bases.
  The Triton kernel reads once and rebases its histogram as the running max / min move, two
  CTA-wide reductions an iteration.
* **One ``red.shared.add.u32`` a key** into a 256-word histogram in shared memory (zeroed
  first; keys that do not qualify go to a trash word), where ``tl.histogram`` spends a ballot
  per bin bit and eight popcounts a 32-key slot (~46 warp-instructions of the ~98 a 32-key slot
  costs there, bench/NOTES.md "Twenty-fourth session"). Gluon (Triton 3.6) has no shared-memory
  atomic and a shared buffer has no address a program can read, so the atomics are inline PTX
  at ``global_smem`` (the kernel's dynamic shared memory, the symbol Triton's PTX declares; as
  ``kernels.sparse_mla.gluon_cluster``) plus :data:`HIST_SMEM_OFFSET`. That offset is 0 because
  the kernel's one shared buffer is all the shared memory it takes: the loads are ``[num_warps,
  BLOCK / num_warps]``, one warp a row, so no reduction crosses warps, and the lengths are read
  as scalars. ``tests/test_triton_compile.py`` checks the size (exactly ``SMEM_WORDS * 4``
  bytes) of every compiled launch for sm_90 and sm_120.

Measured (H100, 2026-12-07, bench/NOTES.md "Twenty-fifth session"): 3.5-3.8x faster than the
ballot kernel (B 64 L 64K 27.8 -> 7.4 us, N 2 48.0 -> 13.6, L 128K 53.5 -> 14.9), about the read
time of its two passes. Since then the qualifying test became an integer one and the bin got
``digit_bin``'s clamps (3 more SASS a key in the second read, AOT): not yet run on a GPU.

Keys that share an address in a warp serialise in the shared atomic unit (a tied row: 32 passes
a warp-instruction). The counts are integers, so the result does not depend on the order.

Never in the CPU interpreter (Gluon kernels do not interpret): ``launch_split_hist`` runs the
Triton kernel there. Any CUDA GPU Triton targets from sm_80 (``red.shared.add.u32``: PTX ISA
1.2+, every target).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kernels.sparse_mla.gluon_cluster import _smem_base   # global_smem's shared address
from kernels.topk import window as _window

# The histogram block's layout and the first digit (kernels.topk.window's values, as
# kernels.topk.triton's constants; not imported from there: its launcher imports this module)
BASE_NONE = gl.constexpr(_window.BASE_NONE)
LBASE_NONE = gl.constexpr(_window.LBASE_NONE)
HIST_BINS = gl.constexpr(_window.HIST_BINS)
HIST_ROW = gl.constexpr(_window.HIST_ROW)
MID_BIN = gl.constexpr(_window.MID_BIN)
UPPER_LO = gl.constexpr(_window.UPPER_LO)
WINDOW_SHIFT = gl.constexpr(_window.WINDOW_SHIFT)

# CTA-wide barrier: ``gl.thread_barrier`` in Triton 3.6 (the H200 image), ``gl.barrier`` later
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

# Byte offset of the histogram buffer from ``global_smem``: the kernel's one shared buffer and no
# other shared memory (no cross-warp reduction, no layout conversion through shared memory), so
# it sits at 0: tests/test_triton_compile.py checks that every compiled launch (sm_90, sm_120)
# takes exactly SMEM_WORDS * 4 bytes.
HIST_SMEM_OFFSET = gl.constexpr(0)
# Words of the shared buffer: the 256 bins; TRASH_BIN, which the keys that do not qualify add to
# (so the add needs no predicate); KMAX_WORD / KMIN_WORD, the split's largest and smallest
# qualifying key (a shared atomic max / min of each warp's); padded to a power of two.
SMEM_WORDS = gl.constexpr(512)
TRASH_BIN = gl.constexpr(256)
KMAX_WORD = gl.constexpr(384)
KMIN_WORD = gl.constexpr(385)


@gluon.jit
def _shared_max_min(addr, kmax, kmin):
    """``red.shared.max.u32 [addr], kmax`` and ``red.shared.min.u32 [addr + 4], kmin`` for every
    element (a replicated element repeats them: max and min are idempotent)."""
    return gl.inline_asm_elementwise(
        "red.shared.max.u32 [$1], $2;\n\tred.shared.min.u32 [$1+4], $3;\n\tmov.u32 $0, 0;",
        "=r,r,r,r", [addr, kmax, kmin], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _shared_load(addr):
    """``ld.shared.u32`` of the word at ``addr`` (int32 shared-window address), after a barrier
    (not pure: it must stay after the barrier that orders the atomics before it)."""
    return gl.inline_asm_elementwise("ld.shared.u32 $0, [$1];", "=r,r", [addr],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gdc_wait():
    """``griddepcontrol.wait`` (programmatic dependent launch, sm_90+): the writes of the kernel
    before this one in the stream are visible after it (``triton.language.extra.cuda.gdc_wait``
    for Gluon)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _shared_add_one(addr):
    """``red.shared.add.u32 [addr], 1`` for every element of ``addr`` (int32 shared-window
    addresses); the result is a dummy zero (an elementwise asm needs one output)."""
    return gl.inline_asm_elementwise("red.shared.add.u32 [$1], 1;\n\tmov.u32 $0, 0;", "=r,r",
                                     [addr], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _key_digit(x):
    """``(key, ok)`` of float32 ``x``: the order-preserving uint32 key of
    ``kernels.topk.triton.order_key`` (-0.0 as +0.0) where ``ok`` (x qualifies: not NaN, not
    -inf), anything where not. ``x + 0.0`` turns -0.0 into +0.0 (IEEE round to nearest); the
    key is ``u ^ 0x80000000`` for a sign bit 0 and ``~u`` for 1, ``u ^ ((u >> 31) | 2^31)``
    with an arithmetic shift. ``ok`` is an integer test on the key (the qualifying keys are
    ``[0x00800000, 0xFF800000]``: -FLT_MAX .. +inf; NaNs key above or below, -inf at
    0x007FFFFF), not a float compare, which a compiler assuming no NaN could invert."""
    u = (x + 0.0).to(gl.int32, bitcast=True)
    key = (u ^ ((u >> 31) | (-2147483647 - 1))).to(gl.uint32, bitcast=True)
    return key, (key - 0x00800000) <= 0xFF000000


@gluon.jit
def _order_key(x):
    """``kernels.topk.triton.order_key``: order-preserving uint32 key of float32 ``x``, 0 for NaN
    and -inf; -0.0 maps to +0.0."""
    key, ok = _key_digit(x)
    return gl.where(ok, key, gl.zeros_like(key))


@gluon.jit
def _min_max(x, mx, mn):
    """The running float max and the min over the qualifying values (maximum / minimum ignore
    NaN; -inf is lifted to +inf for the min)."""
    return gl.maximum(mx, x), gl.minimum(mn, gl.where(x > float("-inf"), x, float("inf")))


@gluon.jit
def _digit_bin(d, base, lbase):
    """``kernels.topk.triton.digit_bin``: the bin of first digit ``d`` under window bases
    ``(base, lbase)``, clamped to ``[0, 256)``."""
    u = d - base
    low = gl.minimum(gl.maximum(d - lbase, 0), MID_BIN)
    return gl.where(u >= UPPER_LO, gl.minimum(u, HIST_BINS - 1), low)


@gluon.jit
def _add_keys(x, sbase, base, lbase):
    """One shared add a value of ``x`` to its bin at the split's bases; values that do not
    qualify add to :data:`TRASH_BIN`. The bin is ``kernels.topk.triton.digit_bin``, clamps
    included: at the split's own bases they never bind (``d - base <= 255`` and ``d - lbase >=
    0`` for every qualifying key), and they keep every address inside the buffer whatever the
    keys."""
    key, ok = _key_digit(x)
    c = gl.where(ok, _digit_bin((key >> WINDOW_SHIFT).to(gl.int32), base, lbase), TRASH_BIN)
    _shared_add_one(sbase + c * 4)


@gluon.jit
def _clamped_len(len_ptr, idx, minus, W):
    """``clamp(len[idx] - minus, 0, W)`` (int64 scalar)."""
    return gl.maximum(gl.minimum(gl.load(len_ptr + idx).to(gl.int64) - minus, W), 0)


@gluon.jit
def _split_bounds(len_ptr, row, n_drafts, per_row, s, num_splits, W, P):
    """``(lo, hi)``: the positions of logits split ``s`` of row ``row = b * N + i``, clipped to
    the row's valid prefix (``kernels.topk.triton._split_range`` with ``k = 0, sub = 1``); ``lo``
    a multiple of ``P`` (``lo >= hi``: an empty split). Scalar code (no reduction through
    shared memory)."""
    b = row // n_drafts
    i = row % n_drafts
    if per_row != 0:
        longest = _clamped_len(len_ptr, b * n_drafts, 0, W)
        for d in range(1, n_drafts):
            longest = gl.maximum(longest, _clamped_len(len_ptr, b * n_drafts + d, 0, W))
        L = _clamped_len(len_ptr, row, 0, W)
    else:                          # the MTP rule: draft d's length len[b] - (N - 1 - d)
        longest = _clamped_len(len_ptr, b, 0, W)
        L = _clamped_len(len_ptr, b, n_drafts - 1 - i, W)
    n_pages = gl.minimum((longest + P - 1) // P, W // P).to(gl.int32)
    per = (n_pages + num_splits - 1) // num_splits
    lo = s * per * P
    hi = gl.minimum((s * per + per) * P, L.to(gl.int32))
    return lo, hi


@gluon.jit
def _topk_hist_smem_kernel(
    x_ptr,            # [R, W] float32 rows (only [0, len[r]) is read)
    len_ptr,          # [R] int32 row lengths (per_row), or [B] request lengths (MTP rule)
    hist_ptr,         # [B, S, NB, HIST_ROW] int32 out: per-split windowed histograms
    W, P, stride_x, n_drafts, per_row, n_drafts_pow2, num_splits,
    BLOCK: gl.constexpr, PDL: gl.constexpr = False,
):
    """Split pass A (grid ``(R, S)``), ``kernels.topk.triton._topk_hist_kernel``'s blocks with
    a shared-memory atomic add a key (module docstring)."""
    if PDL:                         # (see kernels.topk.triton._radix_topk_kernel)
        _gdc_wait()
    NW: gl.constexpr = gl.num_warps()
    C: gl.constexpr = BLOCK // NW
    # each warp's row at least one 4 x 32 tile: no element held twice, so no key added twice
    gl.static_assert(C >= 128, "BLOCK must be at least 128 x num_warps")
    # [NW, C]: warp r reads positions [r C, (r + 1) C) of a block, four a thread (16-byte loads),
    # so a row reduction stays inside the warp (shuffles, no shared memory)
    LX: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [NW, 1], [1, 0])
    LS: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    smem = gl.allocate_shared_memory(gl.int32, [SMEM_WORDS], SL)
    w = gl.arange(0, SMEM_WORDS, layout=LS)
    smem.store(gl.where(w == KMIN_WORD, -1, 0))       # counts 0, key max 0, key min 0xFFFFFFFF
    row = gl.program_id(0).to(gl.int64)
    s = gl.program_id(1)
    lo, hi = _split_bounds(len_ptr, row, n_drafts, per_row, s, num_splits, W, P)
    x_row = x_ptr + row * stride_x
    offs = (gl.arange(0, NW, layout=gl.SliceLayout(1, LX))[:, None] * C
            + gl.arange(0, C, layout=gl.SliceLayout(0, LX))[None, :])
    n_full = gl.maximum(hi - lo, 0) // BLOCK
    full_end = lo + n_full * BLOCK
    # read 1: the float max and the min over the qualifying logits; whole blocks unmasked (lo is
    # a multiple of P: 16-byte loads when P is a multiple of 16), then the tail
    mx = gl.full([NW, C], float("-inf"), gl.float32, LX)
    mn = gl.full([NW, C], float("inf"), gl.float32, LX)
    for start in range(lo, full_end, BLOCK):
        mx, mn = _min_max(gl.load(x_row + start + offs), mx, mn)
    if full_end < hi:
        o = full_end + offs
        mx, mn = _min_max(gl.load(x_row + o, mask=o < hi, other=float("-inf")), mx, mn)
    # [NW]: each warp's largest and smallest key (mn is +inf or a qualifying value, never NaN
    # or -inf, so its key is never 0; +inf's key is above every qualifying one)
    kmax_w = gl.max(_order_key(mx), axis=1)
    kmin_w = gl.min(_order_key(mn), axis=1)
    sbase = _smem_base() + HIST_SMEM_OFFSET
    _barrier()                                       # the initialised words, before any atomic
    _shared_max_min(gl.zeros_like(kmax_w.to(gl.int32)) + (sbase + KMAX_WORD * 4),
                    kmax_w.to(gl.int32, bitcast=True), kmin_w.to(gl.int32, bitcast=True))
    _barrier()                                       # every warp's max / min, before the read
    kmax = _shared_load(sbase + KMAX_WORD * 4).to(gl.uint32, bitcast=True)
    kmin = _shared_load(sbase + KMIN_WORD * 4).to(gl.uint32, bitcast=True)
    has = kmax != 0
    base = gl.where(has, (kmax >> WINDOW_SHIFT).to(gl.int32) - (HIST_BINS - 1), BASE_NONE)
    lbase = gl.where(has, (kmin >> WINDOW_SHIFT).to(gl.int32), LBASE_NONE)
    # read 2: every key binned at the split's bases
    for start in range(lo, full_end, BLOCK):
        _add_keys(gl.load(x_row + start + offs), sbase, base, lbase)
    if full_end < hi:
        o = full_end + offs
        _add_keys(gl.load(x_row + o, mask=o < hi, other=float("-inf")), sbase, base, lbase)
    _barrier()                                       # every add, before the read
    b = row // n_drafts
    i = row % n_drafts
    blk = hist_ptr + ((b * num_splits + s) * n_drafts_pow2 + i) * HIST_ROW
    h = smem.load(LS)
    v = gl.where(w == HIST_BINS, base, gl.where(w == HIST_BINS + 1, lbase, h))
    gl.store(blk + w, v, mask=w < HIST_BINS + 2)
