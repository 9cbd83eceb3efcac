"""The exact radix top-k kernel (kernels/topk/triton.py) on synthetic float32 rows.

Checked with kernels.compare.check_topk against kernels.reference.topk_from_logits (the exact
SPEC set: K largest among positions ``< len`` that are neither NaN nor -inf, ties to the smaller
position, -1 padding) on rows built to stress the select: heavy ties at the threshold, -0.0
against +0.0, NaN / +-inf, huge stale values past the valid length, lengths 0, 1, K-1, K, K+1,
K not a power of two, K = 512 / 1024 / 2048, and a 1M-position row. Runs in the interpreter on
the CPU and on the GPU unchanged.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import compare
from kernels.topk import window
from kernels.topk.triton import STATE_FIELDS, STATE_WORDS, TopkConfig, launch_topk

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _run(x: np.ndarray, lens, K: int, config=None) -> torch.Tensor:
    R = x.shape[0]
    out = torch.full((R, K), -7, dtype=torch.int32, device=DEVICE)
    scratch = torch.full(x.shape, -7, dtype=torch.int32, device=DEVICE)
    launch_topk(torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(DEVICE),
                torch.tensor(lens, dtype=torch.int32, device=DEVICE), K, out, scratch,
                config=config)
    return out


def _ref_rows(x: np.ndarray, lens) -> np.ndarray:
    """float64 rows with everything at or past the valid length set to -inf."""
    r = x.astype(np.float64)
    for i, L in enumerate(lens):
        r[i, max(0, min(L, r.shape[1])):] = -np.inf
    return r


def _check(x, lens, K, config=None):
    out = _run(x, lens, K, config)
    compare.assert_pass(compare.check_topk(out, _ref_rows(x, lens), K))
    return out


def _rows(seed, R, W):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((R, W)).astype(np.float32)
    return rng, x


@pytest.mark.parametrize("K", [1, 7, 64, 100, 512])
def test_lengths_around_K(K):
    """Lengths 0, 1, K-1, K, K+1, 3K+5 and one past the row (clamped to W)."""
    W = 3 * K + 5
    lens = [0, 1, max(0, K - 1), K, K + 1, W, W + 100]
    _, x = _rows(K, len(lens), W)
    out = _check(x, lens, K)
    assert (out[0] == -1).all()                          # empty row: all -1


@pytest.mark.parametrize("K", [512, 1024, 2048])
def test_model_K_with_ties(K):
    """K of both models over 2.5K-6K positions; one row with integer values (the threshold
    falls inside a tie of hundreds), one with -0.0 / +0.0 mixed in, one plain."""
    W = 3 * K
    rng, x = _rows(K + 1, 3, W)
    x[0] = np.round(x[0] * 2)
    x[1, ::2] = 0.0
    x[1, 1::4] = -0.0
    _check(x, [W, W - 3, W - K // 2], K)


def test_nan_inf_and_stale():
    """NaN and -inf never selected, +inf always selected, huge values past len never selected,
    rows where NaN/-inf leave fewer than K candidates (padded with -1)."""
    K = 64
    rng, x = _rows(5, 5, 400)
    x[0, 10:300] = np.nan
    x[0, 5] = np.inf
    x[1, :] = -np.inf
    x[1, 17:40] = 3.0                                     # 23 candidates < K
    x[2, 100:] = 1e30                                     # stale, len 100
    x[3, :] = np.nan                                      # nothing qualifies
    x[4, ::3] = np.inf                                    # 134 +inf ties: smallest positions win
    lens = [400, 400, 100, 400, 400]
    out = _check(x, lens, K)
    assert (out[3] == -1).all()
    assert sorted(out[4].tolist()) == list(range(0, 3 * K, 3))


def test_all_equal_and_extremes():
    """All values equal (pure position tie-break), denormals, +-FLT_MAX, every sign mix."""
    K = 50
    x = np.zeros((4, 300), np.float32)
    x[0] = 1.25
    x[1] = np.float32(1e-45) * np.arange(300, dtype=np.float32) % np.float32(5e-45)
    x[2, ::2] = np.finfo(np.float32).max
    x[2, 1::2] = -np.finfo(np.float32).max
    x[3] = -np.abs(np.random.default_rng(1).standard_normal(300)).astype(np.float32)
    out = _check(x, [300, 300, 300, 300], K)
    assert sorted(out[0].tolist()) == list(range(K))


@pytest.mark.parametrize("block", [1024, 4096])
def test_K_not_pow2_and_block(block):
    """Any K (here 777) and the loop block size do not change the result."""
    rng, x = _rows(9, 2, 5000)
    x[1] = np.round(x[1] * 4)
    a = _check(x, [5000, 4321], 777, TopkConfig(block=block))
    b = _run(x, [5000, 4321], 777, TopkConfig(block=8192 if block == 1024 else 2048))
    assert torch.equal(a, b)                              # output order independent of block


def test_repeatable():
    rng, x = _rows(11, 3, 3000)
    x[:, ::5] = x[0, 0]
    a = _run(x, [3000, 2000, 17], 256)
    b = _run(x, [3000, 2000, 17], 256)
    assert torch.equal(a, b)


@pytest.mark.slow
def test_million_positions():
    """A 1M-position row (V4-Flash context) with a tie at the threshold, K=512."""
    W = 1 << 20
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, W)).astype(np.float32)
    top = np.sort(x[0])[-600]
    x[0, rng.choice(W, 40, replace=False)] = top          # 40 extra copies of a value near the cut
    _check(x, [W], 512)


# ---------------------------------------------------------------------------- windowed first digit
# The first digit is 1/8 binade in two windows, the 16 binades below the row max and the 16 above
# the row min, with one middle bin between them (kernels.topk.triton.window_bin; NumPy model
# kernels.topk.window); a threshold in the middle bin is a window miss, and the lower levels then
# descend the full key over that bin. Both must give the exact set.


def _keys(x: np.ndarray) -> np.ndarray:
    """uint32 order keys (0 = NaN / -inf), as kernels.topk.triton.order_key."""
    return window.order_keys(x)


import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.topk.triton import _b_bounds, _b_flags  # noqa: E402 (used by _flags_kernel)


@triton.jit
def _flags_kernel(x_ptr, lo_ptr, hi_ptr, done_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Pass B's predicates (kernels.topk.triton._b_bounds / _b_flags) of ``x`` for case
    ``program_id``'s bin and ``done``: 1 direct, 2 keep, 0 neither."""
    c = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=float("-inf"))
    f_dir, f_lo, f_hi = _b_bounds(tl.load(lo_ptr + c), tl.load(hi_ptr + c), tl.load(done_ptr + c))
    direct, keep = _b_flags(x, f_dir, f_lo, f_hi)
    tl.store(out_ptr + c * BLOCK + offs, direct.to(tl.int32) + 2 * keep.to(tl.int32),
             mask=offs < n)


def test_pass_b_float_bounds_match_the_keys():
    """Pass B compares logits as floats against the threshold bin's bounds (``_b_bounds``,
    ``key_float``) instead of making each position's key: the direct / keep sets must be those
    of the keys (``direct``: key above ``key_hi`` and not NaN, or ``key >= key_lo`` once the
    descent is done; ``keep``: ``key_lo <= key <= key_hi`` while it is not), on +-0, the
    smallest denormals of both signs, +-FLT_MAX, +-inf and NaN of both signs, for bins at each
    of those (the bin whose top is the key below +0.0's, 0x7FFFFFFF, included), the lowest and
    highest bins, the "every key taken" range (``d0 = -1``) and bounds outside the qualifying
    keys (NaN keys: clamped first)."""
    from kernels.topk import triton as kt
    f = np.float32
    vals = np.array([0.0, -0.0, 1.0, -1.0, 1.5, -1.5, 3e38, -3e38, np.inf, -np.inf,
                     np.finfo(f).max, -np.finfo(f).max, np.finfo(f).tiny, -np.finfo(f).tiny],
                    dtype=f)
    den = np.array([1, 2, 0xFFFFF, 0x100000, 0x7FFFFF], dtype=np.uint32).view(f)
    nan = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001], dtype=np.uint32).view(f)
    rng = np.random.default_rng(5)
    x = np.concatenate([vals, den, -den, nan, rng.standard_normal(200).astype(f),
                        (rng.standard_normal(100) * 1e-39).astype(f)])
    keys = window.order_keys(x).astype(np.int64)
    qual = keys != 0
    # bins as bin_key_range makes them: digits << 20 .. | 0xFFFFF, clamped to the qualifying keys
    ranges = [(0xFFFFFFFF, 0x007FFFFF)]                                     # d0 = -1
    for d in (0x008, 0x7FF, 0x800, 0x801, 0x3F8, 0xC07, 0xFF7, 0xFF8, 0x000):
        lo, hi = max(d << 20, 0x00800000), min((d << 20) | 0xFFFFF, 0xFF800000)
        ranges.append((lo, hi))
    ranges += [(0x00800000, 0x7FFFFFFF), (0x80000000, 0xFF800000), (0x7FF00000, 0x800FFFFF),
               (0, 0xFFFFFFFF), (0x00800000, 0x000FFFFF), (0xFF900000, 0xFFFFFFFF)]  # unclamped
    cases = [(lo, hi, done) for lo, hi in ranges for done in (0, 1)]
    lo = torch.tensor(np.array([c[0] for c in cases], np.uint32).view(np.int32), device=DEVICE)
    hi = torch.tensor(np.array([c[1] for c in cases], np.uint32).view(np.int32), device=DEVICE)
    dn = torch.tensor([c[2] for c in cases], dtype=torch.int32, device=DEVICE)
    BLOCK = triton.next_power_of_2(x.size)
    out = torch.zeros((len(cases), BLOCK), dtype=torch.int32, device=DEVICE)
    _flags_kernel[(len(cases),)](torch.tensor(x, device=DEVICE), lo.view(torch.uint32),
                                 hi.view(torch.uint32), dn, out, x.size, BLOCK=BLOCK)
    got = out.cpu().numpy()[:, :x.size]
    for (klo, khi, done), g in zip(cases, got):
        eq = qual & (keys >= klo) & (keys <= khi)
        gt = qual & (keys > khi)
        want = np.where(gt | (eq & (done == 1)), 1, 0) + np.where(eq & (done == 0), 2, 0)
        bad = np.nonzero(g != want)[0]
        assert bad.size == 0, (hex(klo), hex(khi), done, x[bad][:4], g[bad][:4], want[bad][:4])
    assert kt.MID_BIN.value == window.MID_BIN


def test_window_model_matches_the_kernels():
    """kernels.topk.window (the NumPy model the tests and bench/topk_sim.py use) has the
    kernels' constants, and its bins are monotone in the key for bases of both orders."""
    from kernels.topk import triton as kt
    assert (kt.HIST_BINS.value, kt.UPPER_LO.value, kt.MID_BIN.value, kt.WINDOW_SHIFT.value) == (
        window.HIST_BINS, window.UPPER_LO, window.MID_BIN, window.WINDOW_SHIFT)
    assert kt.STATE_FIELDS == window.STATE_FIELDS and len(kt.STATE_FIELDS) <= kt.STATE_WORDS.value
    d = np.arange(4096)
    for base, lbase in ((3000 - 255, 1000), (3000 - 255, 2900), (10 - 255, 0), (4095 - 255, 4000)):
        b = window.digit_bins(d, base, lbase)
        assert (np.diff(b) >= 0).all() and b.min() >= 0 and b.max() <= 255


def _window_bucket(row: np.ndarray, K: int) -> int:
    """Threshold bin of the windowed first digit for one valid row (-1: every key taken)."""
    return window.row_plan(row, K)["d0"]


def _heavy_rows(seed, R, W):
    rng = np.random.default_rng(seed)
    x = np.empty((R, W), np.float32)
    x[0] = rng.standard_t(1.0, W)                                  # Cauchy
    x[1] = rng.standard_normal(W) * np.exp(2.0 * rng.standard_normal(W))   # lognormal scales
    x[2] = np.abs(rng.standard_t(1.5, W))
    x[3] = -np.abs(rng.standard_t(1.0, W))                         # all negative
    return x.astype(np.float32)


@pytest.mark.parametrize("K", [64, 777])
def test_heavy_tailed(K):
    """Cauchy, lognormal-scaled, one-sided Student-t and all-negative heavy-tailed rows."""
    W = 4000
    x = _heavy_rows(20 + K, 4, W)
    _check(x, [W, W, W - 333, W], K)


def test_window_miss_fallback():
    """Thresholds in the middle bin (window misses): one +1e30 outlier above normal values, a
    few huge values, a +inf max, ties inside the missed bucket (candidates as positions only:
    more than half the scratch row); and two rows the lower window catches: a threshold among
    negatives (L < 2K of symmetric values: the one-sided window of 2026-12 missed it) and a
    threshold 32 binades below the max at the row's smallest values."""
    K = 100
    W = 1500
    rng = np.random.default_rng(21)
    x = rng.standard_normal((6, W)).astype(np.float32)
    x[0, 700] = 1e30                                              # threshold ~100 binades down
    x[1, [3, 900, 1400]] = [1e20, 3e25, 1e38]
    x[2] = rng.standard_normal(W)                                 # len 160: threshold negative
    x[3, 10] = np.inf                                             # +inf: window at +inf's bin
    x[4] = np.float32(2.0) ** -32                                 # max 1.0; the min 2^-32 and
    x[4, 100:150] = np.float32(1.25) * np.float32(2.0) ** -32     # 1.25 * 2^-32 in the lower
    x[4, 1000] = 1.0                                              # window (bins 0 and 2)
    x[5] = np.round(x[5] * 2)                                     # ties in the missed bucket
    x[5, 0] = 1e30
    lens = [W, W, 160, W, W, W]
    buckets = [_window_bucket(x[r, :lens[r]], K) for r in range(6)]
    M = window.MID_BIN
    assert buckets == [M, M, buckets[2], M, 0, M] and buckets[2] < M, buckets
    _check(x, lens, K)


def test_two_sided_window_edges():
    """Thresholds at the edges of the two windows: the lower window's top bin (MID_BIN - 1) and
    the first digit above it (the middle bin), the upper window's lowest bin (UPPER_LO),
    overlapping windows (a row spanning under 32 binades: no middle bin), a negative threshold
    in a row of mostly negative values with a positive max (the bench's B 64 N 2 row 33), all
    rows exact."""
    K = 64
    W = 3000
    rng = np.random.default_rng(29)
    x = np.empty((5, W), np.float32)
    one = np.float32(1.0)
    # (digit + 8 a + b of 1.0 is 2^a * (1 + b / 8): 3 mantissa bits a digit)
    # row 0: min 1.0 (digit m); K + 10 keys at digit m + 126 (bin 126), the rest 1.0; max far up
    x[0] = one
    x[0, 50:50 + K + 10] = np.float32(2.0 ** 15 * 1.75)           # m + 15 * 8 + 6
    x[0, 7] = np.float32(2.0) ** 60
    # row 1: the same one digit higher: the threshold's digit m + 127 is the middle bin
    x[1] = one
    x[1, 50:50 + K + 10] = np.float32(2.0 ** 15 * 1.875)          # m + 15 * 8 + 7
    x[1, 7] = np.float32(2.0) ** 60
    # row 2: max 2^20; K + 10 keys at its digit - 127 (bin UPPER_LO), the rest far below
    x[2] = np.float32(2.0) ** -80
    x[2, 0] = np.float32(2.0) ** 20
    x[2, 100:100 + K + 10] = np.float32(2.0 ** 4 * 1.125)         # max digit - 16 * 8 + 1
    # row 3: values within 4 binades: the windows overlap, no middle bin
    x[3] = (1.0 + rng.random(W) * 15.0).astype(np.float32)
    # row 4: mostly negative values, ~1% positive: the K-th largest is negative
    x[4] = (rng.standard_normal(W) * 0.1 - 0.3).astype(np.float32)
    plans = [window.row_plan(x[r], K) for r in range(5)]
    d0 = [p["d0"] for p in plans]
    assert d0[0] == window.MID_BIN - 1 and d0[1] == window.MID_BIN, d0
    assert d0[2] == window.UPPER_LO and d0[3] > window.MID_BIN, d0
    assert (x[4] > 0).sum() < K and d0[4] < window.MID_BIN, d0
    _check(x, [W] * 5, K)
    # the split path gives the same bits, its plan state the model's threshold bin (P 8 divides
    # W: at P 16 the split plan never read the last 8 positions, refused since 2026-12-06)
    P, S = 8, 3
    h = _split_hists(x, [W] * 5, 1, S, P, base_raise=2)
    state = torch.full((5, STATE_WORDS.value), -7, dtype=torch.int32, device=DEVICE)
    out = torch.full((5, K), -7, dtype=torch.int32, device=DEVICE)
    launch_topk(torch.from_numpy(x).to(DEVICE), torch.tensor([W] * 5, dtype=torch.int32,
                device=DEVICE), K, out, torch.empty((5, W), dtype=torch.int32, device=DEVICE),
                hist=torch.from_numpy(h).to(DEVICE), page_size=P, state=state)
    assert state[:, STATE_FIELDS.index("d0")].tolist() == d0
    assert torch.equal(out, _run(x, [W] * 5, K))


def test_running_max_rebase():
    """Pass A's histogram with the max rising block after block (ascending rows: the upper window
    moves at every block, its lower bins merging into the middle one) and the min falling
    (descending rows: the lower window moves), at blocks smaller than the row."""
    K = 300
    W = 9000
    rng = np.random.default_rng(22)
    up = np.sort(rng.standard_normal(W)).astype(np.float32) * np.float32(8.0)
    up = up * np.exp2(np.linspace(-40, 10, W)).astype(np.float32)
    x = np.stack([up, up[::-1].copy(), np.sort(np.abs(rng.standard_t(1.0, W))).astype(np.float32)])
    for block in (1024, 4096):
        _check(x, [W, W, W], K, TopkConfig(block=block))


def test_all_invalid_rows_and_repeatable():
    """All -inf, all NaN, all invalid but one, a length-0 row: -1 padding; repeated calls and
    block sizes give identical bits."""
    K = 32
    W = 2500
    x = np.full((4, W), -np.inf, np.float32)
    x[1] = np.nan
    x[2, 1234] = -3.0
    x[3] = 1.0
    out = _check(x, [W, W, W, 0], K)
    assert (out[0] == -1).all() and (out[1] == -1).all() and (out[3] == -1).all()
    assert out[2, 0].item() == 1234 and (out[2, 1:] == -1).all()
    y = _heavy_rows(23, 4, W)
    a = _run(y, [W] * 4, 200)
    b = _run(y, [W] * 4, 200)
    c = _run(y, [W] * 4, 200, TopkConfig(block=2048))
    assert torch.equal(a, b) and torch.equal(a, c)


def test_request_lengths_mtp_rule():
    """lengths given per request with n_drafts = N: row b * N + i has length L_b - (N - 1 - i),
    computed in the kernel (negative and past-W lengths clamp)."""
    K = 40
    N = 3
    W = 600
    rng = np.random.default_rng(24)
    x = rng.standard_normal((3 * N, W)).astype(np.float32)
    req = [500, 1, W + 50]
    out = torch.full((3 * N, K), -7, dtype=torch.int32, device=DEVICE)
    scratch = torch.empty((3 * N, W), dtype=torch.int32, device=DEVICE)
    launch_topk(torch.from_numpy(x).to(DEVICE), torch.tensor(req, dtype=torch.int32, device=DEVICE),
                K, out, scratch, n_drafts=N)
    rows = [max(0, min(W, L - (N - 1 - i))) for L in req for i in range(N)]
    compare.assert_pass(compare.check_topk(out, _ref_rows(x, rows), K))


def _split_hists(x, lens, n_drafts, S, P, base_raise=0):
    """NumPy model of the logits kernel's fused histograms: int32 hist_shape(B, S, N) with each
    (request, split, draft) block's windowed histogram at its exact bases, the upper base
    raised and the lower one lowered by ``base_raise`` bins (capped at the row's bases: still a
    valid block, its windows beyond its keys) so that the plan's rebase moves more blocks by
    other amounts."""
    from kernels.topk.triton import BASE_NONE, HIST_ROW, LBASE_NONE, hist_shape
    R, W = x.shape
    B = R // n_drafts
    h = np.zeros(hist_shape(B, S, n_drafts), np.int32)
    h[..., 256] = BASE_NONE.value
    h[..., 257] = LBASE_NONE.value
    for b in range(B):
        n_pages = min(-(-max(lens[b * n_drafts:(b + 1) * n_drafts]) // P), W // P)
        per = -(-n_pages // S)
        for i in range(n_drafts):
            r = b * n_drafts + i
            keys, bases = {}, {}
            for s in range(S):
                lo, hi = min(s * per * P, lens[r]), min(s * per * P + per * P, lens[r])
                k = _keys(x[r, lo:hi])
                keys[s] = k[k != 0]
                if keys[s].size:
                    bases[s] = window.window_bases(keys[s])
            row_base = max((v[0] for v in bases.values()), default=0)
            row_lbase = min((v[1] for v in bases.values()), default=0)
            for s, k in keys.items():
                if s not in bases:
                    if s * per < n_pages:                  # the first tile's bases of no key
                        h[b, s, i, 256:258] = [-255 + 32, 4095 - 32]
                    continue
                base = min(bases[s][0] + base_raise, row_base)
                lbase = max(bases[s][1] - base_raise, row_lbase)
                h[b, s, i, :256] = window.histogram(k, base, lbase)
                h[b, s, i, 256:258] = [base, lbase]
    assert h.shape[-1] == HIST_ROW.value
    return h


@pytest.mark.parametrize("S", [1, 5, 150])
def test_split_plan_with_window_miss(S):
    """Plan + split pass B (R x S programs) from per-split windowed histograms whose bases
    differ (the plan brings them to the row's): a heavy-tailed row, a window miss, a tied row
    and a short row, N = 2 drafts per request; 150 splits (19 plan groups of PLAN_GROUP, summed
    by every scatter program in two tiles of SCATTER_PART_GB, the second partial; 300 splits
    and three tiles took 33 s of the CPU CI's interpreter: tests/TEST_TIME.md); same bits as
    the one-program path."""
    K, P, N = 64, 16, 2
    W = 1600
    x = _heavy_rows(25, 4, W)
    x[1, 77] = 1e30                                               # window miss
    x[2] = np.round(x[2])                                         # ties
    lens = [W, W - 5, 1200, 90]
    h = _split_hists(x, lens, N, S, P, base_raise=3 if S > 1 else 0)
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    ht = torch.from_numpy(h).to(DEVICE)
    scratch = torch.empty((4, W), dtype=torch.int32, device=DEVICE)
    split = torch.full((4, K), -7, dtype=torch.int32, device=DEVICE)
    state = torch.full((4, STATE_WORDS.value), -7, dtype=torch.int32, device=DEVICE)
    launch_topk(xt, lt, K, split, scratch, hist=ht, n_drafts=N, page_size=P, state=state)
    assert torch.equal(ht, torch.from_numpy(h).to(DEVICE))       # the histograms are only read
    # the plan's state (STATE_FIELDS), as the caller's buffer receives it: every row's output
    # count plus what its threshold bin still owes is K
    for row in state.cpu().tolist():
        st = dict(zip(STATE_FIELDS, row))
        need, done, n_out, d0 = st["need"], st["done"], st["n_out"], st["d0"]
        assert st["pairs"] in (0, 1) and 0 <= need <= K and done in (0, 1) and st["n_cand"] >= 0
        assert n_out + (0 if done else need) == (K if d0 >= 0 else st["total"]), st
        assert row[len(STATE_FIELDS):] == [0] * (STATE_WORDS.value - len(STATE_FIELDS))
    compare.assert_pass(compare.check_topk(split, _ref_rows(x, lens), K))
    fused = torch.full((4, K), -7, dtype=torch.int32, device=DEVICE)
    launch_topk(xt, lt, K, fused, scratch, hist=ht, n_drafts=N)
    plain = _run(x, lens, K)
    assert torch.equal(split, plain) and torch.equal(fused, plain)


# (one case on the CPU CI; test_part_pre_blocks_and_subsplits covers more on GPU machines)
@pytest.mark.parametrize("S,N", [(20, 2)])
def test_part_pre_prologue_same_bits(S, N, monkeypatch):
    """After the plan part kernel (S > 16) the Triton split pass B takes its split's pre block
    (the row's bases and its group's earlier splits summed, written by the part kernel) instead
    of planning them itself (``DSA_TOPK_PART_PRE``): the output, the candidates and the state
    bitwise those of the old prologue, on rows whose split bases differ, a window miss, ties
    and a short row; a bad switch value is a ValueError naming it."""
    from kernels.topk.triton import SCATTER_PART_PRE_ENV
    K, P, W = 64, 16, 1600
    x = _heavy_rows(27, 4, W)[: 2 * N].copy()
    x[1, 77] = 1e30                                               # window miss
    x[2 * N - 2] = np.round(x[2 * N - 2])                         # ties
    lens = [W, W - 5, 1200, 90] if N == 2 else [W, 700]
    h = torch.from_numpy(_split_hists(x, lens, N, S, P, base_raise=3)).to(DEVICE)
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    R = len(lens)

    def run(pre):
        monkeypatch.setenv(SCATTER_PART_PRE_ENV, pre)
        out = torch.full((R, K), -7, dtype=torch.int32, device=DEVICE)
        scratch = torch.full((R, W), -7, dtype=torch.int32, device=DEVICE)
        state = torch.full((R, STATE_WORDS.value), -7, dtype=torch.int32, device=DEVICE)
        launch_topk(xt, lt, K, out, scratch, hist=h, n_drafts=N, page_size=P, state=state)
        return out, scratch, state
    on, off = run("1"), run("0")
    compare.assert_pass(compare.check_topk(on[0], _ref_rows(x, lens), K))
    for a, b in zip(on, off):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(run(""), on))   # unset: on
    monkeypatch.setenv(SCATTER_PART_PRE_ENV, "yes")
    with pytest.raises(ValueError, match=SCATTER_PART_PRE_ENV):
        launch_topk(xt, lt, K, on[0], on[1], hist=h, n_drafts=N, page_size=P)


@pytest.mark.parametrize("S", [1, 4])
def test_split_descent_in_registers_every_level(S):
    """The per-row kernel's descent over candidates held in registers (5-bit digits, REG_BINS)
    at every level it can run: keys that differ only in their low 20 bits (one window digit,
    all four lower levels), ties down to the last bit (taken by position), a window miss on a
    short row (all seven levels) and rows whose threshold digit lands on each side of a level's
    boundary; state read back, set exact, and bitwise the one-program path's output (8-bit
    levels)."""
    K, P, N, W = 64, 16, 1, 1024            # W a whole number of pages, as the logits' is
    rng = np.random.default_rng(31)
    one = np.float32(1.0)
    ulp = np.spacing(one)
    x = np.empty((6, W), np.float32)
    x[0] = one + ulp * rng.integers(0, 1 << 20, W)                 # bits 19..0 only
    x[0, rng.integers(0, W, 200)] = x[0, rng.integers(0, W, 200)]  # repeated keys
    x[1] = one + ulp * rng.integers(0, 4, W)                       # ties down to the last bit
    x[2] = -(one + ulp * rng.integers(0, 1 << 12, W))              # negative, low bits
    x[3] = rng.standard_normal(W).astype(np.float32)
    x[3, 11] = 1e30                                                # window miss, short row
    x[4] = one + ulp * (rng.integers(0, 2, W) << 15)               # boundary of the 15-bit level
    x[5] = one + ulp * (np.arange(W) % 33)                         # 33 keys, K ties across 5 bits
    lens = [W, W, W - 3, 300, W, W]
    h = _split_hists(x, lens, N, S, P)
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    scratch = torch.empty((6, 2 * W), dtype=torch.int32, device=DEVICE)
    split = torch.full((6, K), -7, dtype=torch.int32, device=DEVICE)
    state = torch.full((6, STATE_WORDS.value), -7, dtype=torch.int32, device=DEVICE)
    launch_topk(xt, lt, K, split, scratch, hist=torch.from_numpy(h).to(DEVICE), n_drafts=N,
                page_size=P, state=state, config=TopkConfig(cand_block=1024))
    st = [dict(zip(STATE_FIELDS, row)) for row in state.cpu().tolist()]
    assert all(0 < r["n_cand"] <= 1024 for r in st[:3]), st        # the in-register path
    compare.assert_pass(compare.check_topk(split, _ref_rows(x, lens), K))
    assert torch.equal(split, _run(x, lens, K))


@pytest.mark.parametrize("W,P", [(9, 1), (9, 3), (33, 1)])
def test_split_descent_odd_scratch_without_pairs(W, P):
    """A scratch row exactly W wide with W odd (an odd page size): the pairs do not fit (cap =
    (W - 1) / 2), so the candidate positions fill [0, n_cand) with n_cand up to W = 2 cap + 1,
    and the per-row kernel's candidate words loaded with the state must reach word W - 1 (a
    fresh helper's review found it masked at 2 cap, which repeated position 0)."""
    K = 4
    x = (1 + np.spacing(np.float32(1)) * np.arange(W)[::-1]).astype(np.float32)[None]
    h = torch.from_numpy(_split_hists(x, [W], 1, 1, P)).to(DEVICE)
    out = torch.full((1, K), -7, dtype=torch.int32, device=DEVICE)
    state = torch.full((1, STATE_WORDS.value), -7, dtype=torch.int32, device=DEVICE)
    launch_topk(torch.from_numpy(x).to(DEVICE), torch.tensor([W], dtype=torch.int32, device=DEVICE),
                K, out, torch.empty((1, W), dtype=torch.int32, device=DEVICE), hist=h,
                page_size=P, state=state, config=TopkConfig(cand_block=64))
    st = dict(zip(STATE_FIELDS, state[0].tolist()))
    assert st["pairs"] == 0 and st["n_cand"] == W, st
    compare.assert_pass(compare.check_topk(out, _ref_rows(x, [W]), K))
    assert torch.equal(out, _run(x, [W], K))


@pytest.mark.parametrize("field,value", [("block", 32768), ("cand_block", 32768), ("block", 3),
                                         ("cand_block", 8), ("block", 1024.0)])
def test_config_blocks_checked(field, value):
    """launch_topk refuses a per-row kernel block outside the powers of two in [16,
    TOPK_BLOCK_MAX] (its packed scan counts a block's keys in 16-bit halves), naming it."""
    from kernels.topk.triton import TOPK_BLOCK_MAX
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match=f"config.{field}.*{TOPK_BLOCK_MAX}.*{value!r}"):
        _run(x, [64], 4, TopkConfig(**{field: value}))


@pytest.mark.parametrize("page_size", [3, 0, 16.0])
def test_split_page_size_must_divide_the_width(page_size):
    """With ``hist`` the split plan covers ``W // page_size`` whole pages, so a page size that
    does not divide W (a partial last page, never read) or is not a positive int is refused
    before launch, naming it (found by a fresh helper's review, 2026-12-06)."""
    from kernels.topk.triton import hist_shape
    W = 64
    x = torch.zeros((1, W), dtype=torch.float32, device=DEVICE)
    h = torch.zeros(hist_shape(1, 2, 1), dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=f"page_size: expected a positive int dividing.*W={W}"):
        launch_topk(x, torch.tensor([W], dtype=torch.int32, device=DEVICE), 4,
                    torch.empty((1, 4), dtype=torch.int32, device=DEVICE),
                    torch.empty((1, W), dtype=torch.int32, device=DEVICE), hist=h,
                    page_size=page_size)


@pytest.mark.parametrize("pairs", [False, True])
def test_many_candidates_compacted(pairs):
    """More than COMPACT_MIN candidates (window misses: a 1e30 outlier over 20K normal or
    rounded values; all values tied): the levels compact them in place; exact set, candidates
    as (logit, position) pairs (scratch twice the row) or positions, same bits at every block."""
    from kernels.topk.triton import COMPACT_MIN
    K, W = 1000, 20000
    rng = np.random.default_rng(27)
    x = rng.standard_normal((3, W)).astype(np.float32)
    x[0, 5] = 1e30
    x[1] = np.round(x[1] * 8)
    x[1, W - 1] = 1e30
    x[2] = 0.5
    assert W - 1 > COMPACT_MIN.value
    lens = [W, W, W - 7]
    outs = []
    for block in (2048, 4096):
        out = torch.full((3, K), -7, dtype=torch.int32, device=DEVICE)
        scratch = torch.full((3, 2 * W if pairs else W), -7, dtype=torch.int32, device=DEVICE)
        launch_topk(torch.from_numpy(x).to(DEVICE), torch.tensor(lens, dtype=torch.int32,
                    device=DEVICE), K, out, scratch, config=TopkConfig(block=block))
        compare.assert_pass(compare.check_topk(out, _ref_rows(x, lens), K))
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert sorted(outs[0][2].tolist()) == list(range(K))


@pytest.mark.parametrize("S", [4, 20])
def test_split_launches_and_state_summary(S):
    """The split top-k launches two kernels up to SCATTER_PLAN_SPLITS splits a row (the scatter
    plans itself, B >= 16-32 on the H200), four beyond (the plan kernels first); same bits
    either way; kernels.topk.window.state_summary reads its state (no miss on normal rows)."""
    from bench.indexer_sweep import _launches
    from kernels.topk.triton import SCATTER_PLAN_SPLITS
    K, P, W = 32, 16, 1024
    _, x = _rows(31, 3, W)
    lens = [W, W - 100, 500]
    h = torch.from_numpy(_split_hists(x, lens, 1, S, P)).to(DEVICE)
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    out = torch.full((3, K), -7, dtype=torch.int32, device=DEVICE)
    state = torch.full((3, STATE_WORDS.value), -7, dtype=torch.int32, device=DEVICE)
    names = _launches(lambda: launch_topk(xt, lt, K, out, torch.empty((3, W), dtype=torch.int32,
                                                                        device=DEVICE),
                                          hist=h, page_size=P, state=state))
    expect = ["_topk_scatter_kernel", "_radix_topk_kernel"]
    if S > SCATTER_PLAN_SPLITS:
        expect = ["_topk_plan_part_kernel"] + expect
    assert names == expect
    assert torch.equal(out, _run(x, lens, K))
    summ = window.state_summary(state.cpu().numpy())
    assert summ["rows"] == 3 and summ["misses"] == 0 and summ["taken_whole"] == 0
    assert 0 < summ["n_cand_max"] == summ["visits_max"] <= W // 8


@pytest.mark.parametrize("S", [1, 40])
def test_vec_pass_b_whole_blocks_and_splits_far_past_the_prefix(S):
    """The VEC pass B runs its whole blocks without a position mask (the next block's loads
    unmasked while it is whole) and its last, partial block after the loop (twenty-first
    session). S 1: a 2,560-position split is two whole 1,024 blocks (the first prefetches
    unmasked, the second masked) and a partial one. S 40 (one page a split): a split that
    starts past the row's prefix has an empty range ``hi <= lo`` more than a block below ``lo``
    (rows of 100 / 70 / 0 positions: split 39 starts at 2,496), where a floor-rounded block
    count would run a block over another split's positions. The set is exact and bitwise the
    scalar launch's."""
    K, P, W = 48, 64, 2560
    rng = np.random.default_rng(41)
    x = rng.standard_normal((5, W)).astype(np.float32)
    lens = [100, 70, 0, 1088, 2560]
    h = torch.from_numpy(_split_hists(x, lens, 1, S, P)).to(DEVICE)
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)

    def run(scatter):
        out = torch.full((5, K), -7, dtype=torch.int32, device=DEVICE)
        launch_topk(xt, lt, K, out, torch.full((5, W), -7, dtype=torch.int32, device=DEVICE),
                    hist=h, page_size=P, scatter=scatter)
        return out
    vec = run((1024, 4, True))
    compare.assert_pass(compare.check_topk(vec, _ref_rows(x, lens), K))
    assert torch.equal(vec, run((1024, 4, False)))


@pytest.mark.parametrize("S", [3, 20])
def test_every_scatter_launch_same_bits(S):
    """Every split pass B launch ``launch_topk(scatter=...)`` accepts (SCATTER_SPACE: 512-2,048
    positions an iteration, 2 or 4 warps) gives the exact set and the same bits as the shape's
    own pick, planning itself (S 3) or after the plan kernels (S 20), on a tied row and a row
    with a window miss; anything else is refused before launch."""
    from kernels.topk.triton import SCATTER_SPACE
    K, P, W = 48, 16, 2400
    x = _heavy_rows(33, 4, W)[1:]                                 # lognormal, |t|, all negative
    x[1] = np.round(x[1])                                         # ties
    x[2, 11] = 1e30                                               # window miss
    lens = [W, W - 37, 1500]
    h = torch.from_numpy(_split_hists(x, lens, 1, S, P)).to(DEVICE)
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)

    def run(scatter):
        out = torch.full((3, K), -7, dtype=torch.int32, device=DEVICE)
        launch_topk(xt, lt, K, out, torch.empty((3, W), dtype=torch.int32, device=DEVICE),
                    hist=h, page_size=P, scatter=scatter)
        return out
    base = run(None)
    compare.assert_pass(compare.check_topk(base, _ref_rows(x, lens), K))
    for sc in SCATTER_SPACE:
        assert torch.equal(run(sc), base), sc
    assert torch.equal(run(list(SCATTER_SPACE[0])), base)         # a list is a tuple
    for bad in ((4096, 8), (1024, 3), (1000, 4), (2048, 4), 2048, 1.5, "2048w4",
                (2048, 4, 0), (2048.0, 4, False), (np.int64(2048), 4, False),
                np.array([2048, 4, 0]), torch.tensor([2048, 4, 0]), {2048: 0, 4: 0, False: 0}):
        with pytest.raises(ValueError, match="scatter: expected None or one of"):
            run(bad)
    # a tuple subclass of the right values is a tuple; a bad value is refused even when there
    # is nothing to launch (topk 0)
    import collections
    Sc = collections.namedtuple("Sc", "block warps vec")
    assert torch.equal(run(Sc(*SCATTER_SPACE[0])), base)
    with pytest.raises(ValueError, match="scatter: expected None or one of"):
        launch_topk(xt, lt, 0, torch.empty((3, 0), dtype=torch.int32, device=DEVICE),
                    torch.empty((3, W), dtype=torch.int32, device=DEVICE), hist=h, page_size=P,
                    scatter="garbage")


@pytest.mark.parametrize("S,N", [(3, 1), (20, 2)])
def test_scatter_subsplits_same_bits(S, N, monkeypatch):
    """``launch_topk(scatter_sub=...)`` / ``DSA_TOPK_SCATTER_SUB``: each split's pass B cut into
    2, 3 or 5 programs (sub-ranges of its pages, the split's keys before each counted again)
    gives the exact set and the same bits and plan state as one program a split: planning
    itself (S 3) or after the plan kernels (S 20), MTP rows (N 2), a tied row, a window miss, a
    length mid-page, more sub-ranges than a split has pages (empty programs), the VEC and the
    scalar pass B; a bad value is a ValueError naming the argument or the variable."""
    from kernels.topk.triton import SCATTER_SUB_ENV, STATE_WORDS
    K, P, W = 24, 16, 352
    x = _heavy_rows(35, 4, W)[1:]                                 # lognormal, |t|, all negative
    x[1] = np.round(x[1])                                         # ties
    x[2, 11] = 1e30                                               # window miss
    if N == 2:                                                    # request lengths, MTP rule
        x = np.concatenate([x, x[:1]])
        lens, R = [W - 5, 201], 4
        row_lens = [W - 6, W - 5, 200, 201]
    else:
        lens, R = [W, W - 37, 200], 3
        row_lens = lens
    h = torch.from_numpy(_split_hists(x, row_lens, N, S, P)).to(DEVICE)
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)

    def run(sub, scatter=None):
        out = torch.full((R, K), -7, dtype=torch.int32, device=DEVICE)
        state = torch.zeros((R, STATE_WORDS.value), dtype=torch.int32, device=DEVICE)
        launch_topk(xt, lt, K, out, torch.empty((R, W), dtype=torch.int32, device=DEVICE),
                    hist=h, n_drafts=N, page_size=P, state=state, scatter=scatter,
                    scatter_sub=sub)
        return out, state
    monkeypatch.delenv(SCATTER_SUB_ENV, raising=False)
    base, st = run(None)
    compare.assert_pass(compare.check_topk(base, _ref_rows(x, row_lens), K))
    # after the plan kernels (S 20: 2 pages a split, so the third sub-range is empty) one run
    # (the interpreter runs those programs slowly); planning itself, two and the switch
    for sub, scatter in ((3, None),) if S > 3 else ((2, None), (5, (512, 4, False))):
        got, gst = run(sub, scatter)
        assert torch.equal(got, base) and torch.equal(gst, st), (sub, scatter)
    if S > 3:
        return
    monkeypatch.setenv(SCATTER_SUB_ENV, "3")
    got, gst = run(None)
    assert torch.equal(got, base) and torch.equal(gst, st)
    for bad in ("0", "17", "two", "\u00b2"):
        monkeypatch.setenv(SCATTER_SUB_ENV, bad)
        with pytest.raises(ValueError, match=f"^{SCATTER_SUB_ENV}: expected an integer in"):
            run(None)
    monkeypatch.delenv(SCATTER_SUB_ENV)
    for bad in (0, 17, 2.0, True, "2"):
        with pytest.raises(ValueError, match="^scatter_sub: expected an int in"):
            run(bad)


def test_scatter_form_switch(monkeypatch):
    """``launch_topk(scatter_form=...)`` / ``DSA_TOPK_SCATTER_FORM``: ``"triton"`` and ``"smem"``
    give the same bits (here, in the interpreter, both run the Triton kernel: the Gluon one does
    not interpret; the GPU test below compares the two kernels); anything else is a ValueError
    naming the argument or the variable, even with nothing to launch. The Gluon kernel's
    constants are the Triton module's."""
    from kernels.topk import gluon_scatter
    from kernels.topk.triton import (PLAN_GROUP, SCATTER_FORM_ENV, STATE_WORDS,
                                     scatter_form_default, scatter_form_for)
    assert gluon_scatter.STATE_WORDS.value == STATE_WORDS.value
    assert gluon_scatter.PLAN_GROUP.value == PLAN_GROUP.value
    # the rule: the smem form on splits of at least 4,096 table positions (the B 64 rows)
    assert scatter_form_for(65536, 64, 4) == "smem"               # B 64 L 64K: 16K a split
    assert scatter_form_for(1 << 20, 64, 33) == "smem"            # V4 B 8 1M
    assert scatter_form_for(131072, 64, 264) == "triton"          # B 1 L 128K: 512
    assert scatter_form_for(4096 * 64, 64, 64) == "smem"          # exactly 4,096
    assert scatter_form_for(63 * 64 * 64, 64, 64) == "triton"       # 63 pages: 4,032
    K, P, W, S = 24, 16, 352, 3
    x = _heavy_rows(36, 4, W)[:3]
    lens = [W, 200, 0]
    h = torch.from_numpy(_split_hists(x, lens, 1, S, P)).to(DEVICE)
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)

    def run(form, k=K):
        out = torch.full((3, k), -7, dtype=torch.int32, device=DEVICE)
        launch_topk(xt, lt, k, out, torch.empty((3, W), dtype=torch.int32, device=DEVICE),
                    hist=h, page_size=P, scatter_form=form)
        return out
    monkeypatch.delenv(SCATTER_FORM_ENV, raising=False)
    assert scatter_form_default() is None
    base = run("triton")
    assert torch.equal(run(None), base)
    compare.assert_pass(compare.check_topk(base, _ref_rows(x, lens), K))
    assert torch.equal(run("smem"), base)
    monkeypatch.setenv(SCATTER_FORM_ENV, "smem")
    assert scatter_form_default() == "smem"
    assert torch.equal(run(None), base)
    for bad in ("gluon", "SMEM", "1"):
        monkeypatch.setenv(SCATTER_FORM_ENV, bad)
        with pytest.raises(ValueError, match=f"^{SCATTER_FORM_ENV}: expected one of"):
            run(None)
    monkeypatch.delenv(SCATTER_FORM_ENV)
    for bad in ("gluon", 1, True, ("smem",)):
        with pytest.raises(ValueError, match="^scatter_form: expected None or one of"):
            run(bad)
        with pytest.raises(ValueError, match="^scatter_form: expected None or one of"):
            run(bad, 0)


# (S, N, per-row lengths, PDL) of the smem split pass B's GPU test: planning itself in one tile
# of 4 splits and in three (S 11), after the plan kernels in one tile of group partials (S 20)
# and in two (S 150: 19 groups, GB 16); MTP request lengths at N 2 and N 3 (padded to 4 draft
# slots), per-row lengths at N 1; programmatic dependent launch once
_SMEM_SCATTER_CASES = [(3, 2, False, False), (11, 1, True, True), (20, 3, False, False),
                       (150, 1, True, False)]


@pytest.mark.skipif(not CUDA, reason="the Gluon smem split pass B runs on the GPU only")
@pytest.mark.parametrize("S,N,per_row,pdl", _SMEM_SCATTER_CASES)
@pytest.mark.parametrize("dist", ["normal", "heavy", "ties", "specials", "one_bin", "exact_k"])
def test_split_pass_b_smem_form_bitwise_triton(dist, S, N, per_row, pdl, monkeypatch):
    """The split pass B's two forms (``scatter_form="smem"``, the Gluon kernel that compacts each
    block's selected keys in shared memory, against ``"triton"``) write bitwise the same output
    head, plan state and scratch, compared right after the scatter (before the per-row kernel
    rewrites any of it), and the smem launch is the Gluon kernel; then the whole top-k is the
    reference's. Every (BLOCK, warps) of ``SCATTER_SMEM_SPACE`` at S 3, 2,048 x 4 elsewhere. Rows of 256 pages of 64 (whole blocks and a masked tail; lengths mid-page, one
    empty, one shorter than K: every key taken) of i.i.d. normal, heavy-tailed, tied (the bin
    taken whole or not), special values (NaN payloads, +-inf, -0.0, subnormals, +-FLT_MAX; a
    row of -inf), one-bin (more candidates than the pairs' half of the scratch: positions only)
    and exactly K copies of each row's largest value (the threshold bin taken whole, ``done``
    with a bin); the plan modes and length modes of ``_SMEM_SCATTER_CASES``."""
    from kernels.topk import gluon_scatter
    from kernels.topk import triton as tk
    monkeypatch.delenv("DSA_TOPK_SCATTER_SUB", raising=False)
    monkeypatch.setenv("DSA_TOPK_PDL", "1" if pdl else "0")
    B, P, K = 4, 64, 2048
    W = 256 * P
    R = B * N
    rng = np.random.default_rng(11 + S)
    if dist == "normal":
        x = rng.standard_normal((R, W)).astype(np.float32)
    elif dist == "heavy":
        x = np.concatenate([_heavy_rows(9, 4, W)] * N)[:R]
    elif dist == "ties":
        x = rng.integers(-3, 4, (R, W)).astype(np.float32)
    elif dist == "specials":
        x = rng.standard_normal((R, W)).astype(np.float32)
        pick = rng.integers(0, W, (R, 1600))
        vals = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-42, -1e-42,
                         np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
        nans = np.array([0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0xFF800001], np.uint32)
        vals = np.concatenate([vals, nans.view(np.float32)])
        for r in range(R):
            x[r, pick[r]] = vals[rng.integers(0, len(vals), 1600)]
        x[1, :] = -np.inf
    elif dist == "one_bin":
        x = np.full((R, W), 1.5, np.float32) + rng.random((R, W)).astype(np.float32) * 0.1
    else:                           # exactly K copies of 9.0 in each row, the rest below 1
        x = rng.random((R, W)).astype(np.float32)
        for r in range(R):
            x[r, rng.choice(W, K, replace=False)] = 9.0
    req = [W - 37, 0, W // 2 + 5, 1000]
    if per_row:
        row_lens = [req[r % B] for r in range(R)]
        lens = row_lens
    else:
        row_lens = [max(L - (N - 1 - i), 0) for L in req for i in range(N)]
        lens = req
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    h = torch.full(tk.hist_shape(B, S, N), -7, dtype=torch.int32, device=DEVICE)
    tk.launch_split_hist(xt, lt, h, n_drafts=N, page_size=P)
    launch = dict(PDL=True, launch_pdl=True) if tk.pdl_enabled(xt.device) else {}
    assert bool(launch) == pdl

    def scatter_only(form, sc):
        out = torch.full((R, K), -7, dtype=torch.int32, device=DEVICE)
        state = torch.full((R, tk.STATE_WORDS.value), -7, dtype=torch.int32, device=DEVICE)
        scratch = torch.full((R, W), -7, dtype=torch.int32, device=DEVICE)
        kernel = tk._split_pass_b(xt, lt, out, scratch, state, h, topk=K, n_drafts=N,
                                  per_row=int(per_row), page_size=P, cap=W // 2, num_splits=S,
                                  nb=h.shape[2], scatter=sc, scatter_sub=1, scatter_form=form,
                                  num_sms=None, launch=launch)
        return kernel, out, state, scratch
    k_t, *want = scatter_only("triton", None)
    assert k_t is tk._topk_scatter_kernel
    for b_w in tk.SCATTER_SMEM_SPACE if S == 3 else ((2048, 4),):
        k_s, *got = scatter_only("smem", (*b_w, True))
        assert k_s is gluon_scatter._topk_scatter_smem_kernel
        for name, g, t in zip(("out", "state", "scratch"), got, want):
            assert torch.equal(g, t), (dist, S, N, b_w, name)
    out = torch.full((R, K), -7, dtype=torch.int32, device=DEVICE)
    tk.launch_topk(xt, lt, K, out, torch.empty((R, W), dtype=torch.int32, device=DEVICE),
                   hist=h, n_drafts=N, page_size=P, scatter_form="smem")
    compare.assert_pass(compare.check_topk(out, _ref_rows(x, row_lens), K))


def test_smem_scatter_routing(monkeypatch):
    """Where the split pass B's smem form runs (``_smem_scatter_runs``, and ``_split_pass_b``'s
    check of ``SCATTER_SMEM_SPACE``): asked for, a CUDA tensor outside the interpreter, no
    sub-ranges, W, the page size and the row stride multiples of 16; anything else runs the
    Triton kernel. Checked with a stand-in tensor (no GPU here)."""
    from kernels.topk import triton as tk

    class FakeLogits:
        def __init__(self, stride=65536, is_cuda=True):
            self._s, self.is_cuda = stride, is_cuda

        def stride(self, dim):
            return self._s
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ok = FakeLogits()
    assert tk._smem_scatter_runs("smem", 65536, 64, ok, 1)
    assert not tk._smem_scatter_runs("triton", 65536, 64, ok, 1)
    assert not tk._smem_scatter_runs("smem", 65536, 64, ok, 2)               # sub-ranges
    assert not tk._smem_scatter_runs("smem", 65536 - 8, 8, ok, 1)            # W % 16
    assert not tk._smem_scatter_runs("smem", 65536, 8, ok, 1)                # P % 16
    assert not tk._smem_scatter_runs("smem", 65536, 64, FakeLogits(65544), 1)  # stride % 16
    assert not tk._smem_scatter_runs("smem", 65536, 64, FakeLogits(is_cuda=False), 1)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not tk._smem_scatter_runs("smem", 65536, 64, ok, 1)
    # the rule's launch is in the smem space; SCATTER_SPACE's smaller blocks are not
    assert tk.scatter_config(65536, 64, 4)[:2] in tk.SCATTER_SMEM_SPACE
    assert (512, 4) not in tk.SCATTER_SMEM_SPACE


def test_pdl_switch_and_twins(monkeypatch):
    """``DSA_TOPK_PDL``: only ``1`` turns programmatic dependent launch on, and only for a CUDA
    device of compute capability >= 9 outside the interpreter (never here); a bad value is a
    ValueError naming the variable. Each launch compiled with ``PDL=True`` for the fit check has
    its twin in the AOT specs, the same launch but for ``PDL``."""
    from kernels.topk.triton import pdl_enabled
    from kernels.topk.triton_aot import PDL_TWINS, aot_specs
    for v in ("", "0", "1"):
        monkeypatch.setenv("DSA_TOPK_PDL", v)
        assert pdl_enabled(torch.device("cpu")) is False
    monkeypatch.setenv("DSA_TOPK_PDL", "yes")
    with pytest.raises(ValueError, match=r"^DSA_TOPK_PDL: expected '0', '1' or unset, got 'yes'"):
        pdl_enabled(torch.device("cpu"))
    specs = {s.label: s for s in aot_specs("big")}
    assert all(s.constexprs.get("PDL") in (False, True) for s in specs.values())
    for label in PDL_TWINS:
        a, b = specs[label], specs[label + " pdl"]
        assert (a.constexprs["PDL"], b.constexprs["PDL"]) == (False, True)
        assert {**a.constexprs, "PDL": True} == b.constexprs and a.signature == b.signature
        assert (a.kernel, a.num_warps) == (b.kernel, b.num_warps)


def test_scatter_maxnreg_switch(monkeypatch):
    """``DSA_TOPK_SCATTER_MAXNREG`` (the split pass B's register cap): unset or empty is the
    rule (128 registers where the grid has more than 3 programs an SM: B 64 N 2's 512 on 132
    SMs; none at 256), 0 is no cap, an integer in [64, 255] is the cap; anything else is a
    ValueError naming the variable and the value, raised by the launch before any kernel runs.
    The output is the same with a cap (the interpreter ignores it; the GPU runs it)."""
    from kernels.topk import triton as kt
    for v, want in (("", None), ("0", None), ("128", 128), (" 255 ", 255)):
        monkeypatch.setenv(kt.SCATTER_MAXNREG_ENV, v)
        assert kt.scatter_maxnreg(256, 132) == want
    monkeypatch.delenv(kt.SCATTER_MAXNREG_ENV)
    assert kt.scatter_maxnreg(256, 132) is None and kt.scatter_maxnreg(396, 132) is None
    assert kt.scatter_maxnreg(512, 132) == kt.SCATTER_CAP_REGS == 128
    monkeypatch.setenv(kt.SCATTER_MAXNREG_ENV, "0")
    assert kt.scatter_maxnreg(512, 132) is None
    for bad in ("63", "256", "x", "-1", "1e2", "\u00b2"):
        monkeypatch.setenv(kt.SCATTER_MAXNREG_ENV, bad)
        with pytest.raises(ValueError, match="DSA_TOPK_SCATTER_MAXNREG.*" + repr(bad.strip())[1:-1]):
            kt.scatter_maxnreg()
    S, P, W, K = 4, 64, 2048, 64
    _, x = _rows(11, 3, W)
    lens = [W, 1000, 77]
    ht = torch.from_numpy(_split_hists(x, lens, 1, S, P)).to(DEVICE)
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    outs = []
    for v in ("", "128"):
        monkeypatch.setenv(kt.SCATTER_MAXNREG_ENV, v)
        out = torch.full((3, K), -7, dtype=torch.int32, device=DEVICE)
        launch_topk(xt, lt, K, out, torch.empty((3, W), dtype=torch.int32, device=DEVICE),
                    hist=ht, page_size=P)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    compare.assert_pass(compare.check_topk(outs[0], _ref_rows(x, lens), K))
    monkeypatch.setenv(kt.SCATTER_MAXNREG_ENV, "7")
    with pytest.raises(ValueError, match="DSA_TOPK_SCATTER_MAXNREG"):
        launch_topk(xt, lt, K, outs[0], torch.empty((3, W), dtype=torch.int32, device=DEVICE),
                    hist=ht, page_size=P)


@pytest.mark.parametrize("S,N,cfg,P", [(1, 1, None, 16), (4, 2, (64, 4, "ballot"), 16),
                                        (6, 3, (128, 4, "ballot"), 16),
                                        (1, 1, (128, 1, "smem"), 16),
                                        (4, 2, (256, 2, "smem"), 8),
                                        (3, 1, (512, 4, "smem"), 16)])
def test_split_pass_a_blocks_and_same_bits(S, N, cfg, P):
    """``launch_split_hist`` (the split pass A, for logits written without the fused
    histogram): every (request, split, draft) block is the NumPy model's at the split's exact
    bases (a split without a qualifying key: zero counts and ``BASE_NONE`` / ``LBASE_NONE``),
    at the default config and at other BLOCK sizes of both forms (the ballot kernel: several
    blocks a split, rebases as the running max / min move; the Gluon smem kernel on the GPU:
    whole blocks and a masked tail, a page size that is not a multiple of 16, so scalar loads;
    in the interpreter a smem config runs the ballot kernel), heavy-tailed rows, a tied row, a
    window miss,
    NaN / -inf, a length mid-page, splits past the prefix and MTP request lengths; ``launch_topk`` from those blocks gives the reference set and the same bits
    as the per-row kernel's own pass A (both at the row's exact bases). Bad arguments are
    ValueErrors / TypeErrors naming them."""
    from kernels.topk.triton import BASE_NONE, LBASE_NONE, hist_shape, launch_split_hist
    K, W = 24, 352
    pool = np.concatenate([_heavy_rows(41, 4, W), _rows(42, 2, W)[1]])
    pool[4] = np.round(pool[4])                                   # ties
    pool[1, 11] = 1e30                                            # window miss
    pool[0, 5], pool[0, 9] = np.nan, -np.inf
    x = np.ascontiguousarray(pool[[0, 1, 2, 3, 4, 5][: 2 * N]])   # B 2
    if N == 1:
        lens = row_lens = [W - 3, 37]                             # per row; mid-page, short
    else:                                                         # request lengths, MTP rule
        lens = [W - 5, 201]
        row_lens = [L - (N - 1 - i) for L in lens for i in range(N)]
    want = _split_hists(x, row_lens, N, S, P)
    empty = want[..., :256].sum(-1) == 0
    want[..., 256][empty] = BASE_NONE.value
    want[..., 257][empty] = LBASE_NONE.value
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    h = torch.full(hist_shape(2, S, N), -7, dtype=torch.int32, device=DEVICE)
    launch_split_hist(xt, lt, h, n_drafts=N, page_size=P, config=cfg)
    got = h.cpu().numpy()
    np.testing.assert_array_equal(got[:, :, :N, :258], want[:, :, :N, :258], str(cfg))
    assert (got[:, :, :N, 258:] == -7).all() and (got[:, :, N:] == -7).all()   # not written
    out = torch.full((2 * N, K), -7, dtype=torch.int32, device=DEVICE)
    launch_topk(xt, lt, K, out, torch.empty((2 * N, W), dtype=torch.int32, device=DEVICE),
                hist=h, n_drafts=N, page_size=P)
    compare.assert_pass(compare.check_topk(out, _ref_rows(x, row_lens), K))
    plain = torch.full((2 * N, K), -7, dtype=torch.int32, device=DEVICE)
    launch_topk(xt, lt, K, plain, torch.empty((2 * N, W), dtype=torch.int32, device=DEVICE),
                n_drafts=N)
    assert torch.equal(out, plain)
    if S != 1 or cfg is not None:
        return
    for kw, match in ((dict(hist=h[:1]), "hist: expected a contiguous int32"),
                      (dict(hist=h[:, :, :, :8]), "hist: expected a contiguous int32"),
                      (dict(page_size=24), "page_size: expected a positive int dividing"),
                      (dict(page_size=16.0), "page_size: expected a positive int dividing"),
                      (dict(n_drafts=5), "n_drafts: expected an int in"),
                      (dict(lengths=lt[:1]), "lengths: expected 2 row lengths or 2 request")):
        args = {**dict(lengths=lt, hist=h, n_drafts=N, page_size=P), **kw}
        with pytest.raises(ValueError, match=match):
            launch_split_hist(xt, args.pop("lengths"), args.pop("hist"), **args)
    for bad in ((64, 4), (64, 4, "ballot", 1), (48, 4, "ballot"), (2048, 3, "smem"),
                (2048.0, 4, "smem"), (64, True, "ballot"), "2048x4", (256, 4, "smem"),
                (2048, 4, "fast"), (2048, 4, None)):
        with pytest.raises(ValueError, match="config: expected None or"):
            launch_split_hist(xt, lt, h, page_size=P, config=bad)
    with pytest.raises(ValueError, match="logits: expected a 2-D"):
        launch_split_hist(xt.t(), lt, h, page_size=P)
    with pytest.raises(ValueError, match="lengths: expected a contiguous"):
        launch_split_hist(xt, torch.stack([lt, lt], 1)[:, 0], h, page_size=P)
    with pytest.raises(TypeError, match="logits: expected a torch.float32 tensor, got torch.float64"):
        launch_split_hist(xt.double(), lt, h, page_size=P)
    with pytest.raises(TypeError, match="lengths: expected a torch.int32 tensor, got torch.int64"):
        launch_split_hist(xt, lt.long(), h, page_size=P)
    with pytest.raises(TypeError, match="hist: expected a torch.int32 tensor, got torch.int64"):
        launch_split_hist(xt, lt, h.long(), page_size=P)


@pytest.mark.skipif(not CUDA, reason="the Gluon smem split pass A runs on the GPU only")
@pytest.mark.parametrize("dist", ["normal", "heavy", "ties", "specials", "one_bin"])
def test_split_pass_a_smem_form_bitwise_ballot(dist):
    """The split pass A's two forms at the default BLOCK / warps (``SPLIT_HIST_CONFIG``, the
    Gluon kernel with a shared atomic add a key, against the same BLOCK / warps in the
    ``"ballot"`` form, Triton's histogram) write bitwise the same blocks at an indexer-like shape (B 3,
    N 2, rows of 256 pages of 64 in 3 splits: ~5.5K positions a split, so whole unmasked blocks
    and a masked tail; request lengths mid-page, one request empty) on rows that stress the atomics and the bases: i.i.d. normal, heavy-tailed,
    a few tied values, NaN / +-inf / -0.0 / +0.0 / subnormals / +-FLT_MAX mixed in, and every key
    in one bin (all conflicting in the shared atomic unit); and the top-k from them is the
    reference set."""
    from kernels.topk.triton import SPLIT_HIST_CONFIG, hist_shape, launch_split_hist
    B, N, P, S, K = 3, 2, 64, 3, 512
    assert SPLIT_HIST_CONFIG[2] == "smem"
    W = 256 * P
    assert W // S > 2 * SPLIT_HIST_CONFIG[0]                   # whole blocks in every full split
    rng = np.random.default_rng(7)
    if dist == "normal":
        x = rng.standard_normal((B * N, W)).astype(np.float32)
    elif dist == "heavy":
        x = np.concatenate([_heavy_rows(8, 4, W), rng.standard_normal((2, W)).astype(np.float32)])
    elif dist == "ties":
        x = rng.integers(-3, 4, (B * N, W)).astype(np.float32)
    elif dist == "specials":
        x = rng.standard_normal((B * N, W)).astype(np.float32)
        pick = rng.integers(0, W, (B * N, 1600))
        vals = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-42, -1e-42,
                         np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
        nans = np.array([0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0xFF800001], np.uint32)
        vals = np.concatenate([vals, nans.view(np.float32)])  # NaN payloads of either sign
        for r in range(B * N):
            x[r, pick[r]] = vals[rng.integers(0, len(vals), 1600)]
        x[1, :] = -np.inf                                      # a row with no qualifying key
    else:
        x = np.full((B * N, W), 1.5, np.float32) + rng.random((B * N, W)).astype(np.float32) * 0.1
    lens = [W - 37, 0, W // 2 + 5]
    row_lens = [max(L - (N - 1 - i), 0) for L in lens for i in range(N)]
    xt = torch.from_numpy(x).to(DEVICE)
    lt = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    got = {}
    for form in ("smem", "ballot"):
        h = torch.full(hist_shape(B, S, N), -7, dtype=torch.int32, device=DEVICE)
        launch_split_hist(xt, lt, h, n_drafts=N, page_size=P, config=(*SPLIT_HIST_CONFIG[:2], form))
        got[form] = h
    assert torch.equal(got["smem"], got["ballot"])
    want = _split_hists(x, row_lens, N, S, P)
    np.testing.assert_array_equal(got["smem"].cpu().numpy()[:, :, :N, :256], want[:, :, :N, :256])
    out = torch.full((B * N, K), -7, dtype=torch.int32, device=DEVICE)
    launch_topk(xt, lt, K, out, torch.empty((B * N, W), dtype=torch.int32, device=DEVICE),
                hist=got["smem"], n_drafts=N, page_size=P)
    compare.assert_pass(compare.check_topk(out, _ref_rows(x, row_lens), K))


# ~1.5 min a case in the CPU interpreter (CI is over its 15-minute budget: tests/TEST_TIME.md):
# cpu_heavy, so it runs on GPU machines and with DSA_HEAVY=1
@pytest.mark.cpu_heavy
@pytest.mark.parametrize("S,N,per_row,sub", [(17, 3, False, 3), (25, 2, True, 2)])
def test_part_pre_blocks_and_subsplits(S, N, per_row, sub, monkeypatch):
    """PRE (review, 2026-12-07): the pre blocks hold exactly the rebased counts of the splits
    before each split in its group and the row's bases (NumPy model), nothing outside them is
    written, the launch really takes PRE=True / False, and with sub-splits, the MTP rule, a
    padded draft (N 3), a one-split last group (S 17), empty and short rows the output,
    candidates and state are bitwise those of DSA_TOPK_PART_PRE=0."""
    import kernels.topk.triton as tk
    K, P, W, G = 48, 8, 8 * 40, 512
    rng = np.random.default_rng(S * 10 + N)
    B = 2
    R = B * N
    x = rng.standard_normal((R, W)).astype(np.float32)
    x[0, 5] = 1e30                                               # window miss
    x[1] = np.round(x[1])                                        # ties
    x[R - 1, ::7] = np.nan
    lens = ([W, 3 * S] if not per_row else [W, 0, 2 * S, W - 3][:R] + [W] * max(0, R - 4))
    xt, lt = torch.from_numpy(x).to(DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    h = torch.full(tk.hist_shape(B, S, N), 99, dtype=torch.int32, device=DEVICE)
    tk.launch_split_hist(xt, lt, h, n_drafts=N, page_size=P)
    row_lens = ([lens[r] for r in range(R)] if per_row
                else [max(0, min(lens[r // N] - (N - 1 - r % N), W)) for r in range(R)])
    seen, real_empty, real_kernel = {}, torch.empty, tk._topk_scatter_kernel

    class Spy:                                   # records the scatter's PRE (same object test)
        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen["PRE"] = kw.get("PRE")
                return real_kernel[grid](*a, **kw)
            return launch

    def guarded_empty(*shape, dtype=None, device=None, **kw):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        n = int(np.prod(shape))
        buf = torch.full((n + 2 * G,), -555, dtype=dtype, device=device)
        seen.setdefault("bufs", []).append(buf)
        return buf[G:G + n].view(*shape)

    monkeypatch.setattr(tk, "_topk_scatter_kernel", Spy())
    res = {}
    for pre in ("1", "0"):
        monkeypatch.setenv(tk.SCATTER_PART_PRE_ENV, pre)
        seen.clear()
        out = torch.full((R, K), -7, dtype=torch.int32, device=DEVICE)
        scratch = torch.full((R, W), -7, dtype=torch.int32, device=DEVICE)
        state = torch.full((R, STATE_WORDS.value), -7, dtype=torch.int32, device=DEVICE)
        monkeypatch.setattr(torch, "empty", guarded_empty)
        try:
            launch_topk(xt, lt, K, out, scratch, hist=h, n_drafts=N, page_size=P, state=state,
                        scatter_sub=sub)
        finally:
            monkeypatch.setattr(torch, "empty", real_empty)
        assert seen["PRE"] is (pre == "1")
        for buf in seen["bufs"]:                 # part and pre: nothing written outside
            assert (buf[:G] == -555).all() and (buf[-G:] == -555).all()
        pre_blk = seen["bufs"][1][G:-G].view(R, S, tk.HIST_ROW.value)
        res[pre] = (out, scratch, state, pre_blk)
    for a, b in zip(res["1"][:3], res["0"][:3]):
        assert torch.equal(a, b)
    compare.assert_pass(compare.check_topk(res["1"][0], _ref_rows(x, row_lens), K))
    hn = h.cpu().numpy()
    got = res["1"][3].cpu().numpy()
    n_pages = [min(-(-max(row_lens[b * N:(b + 1) * N]) // P), W // P) for b in range(B)]
    for r in range(R):
        b, i = divmod(r, N)
        base, lbase = int(hn[b, :, i, 256].max()), int(hn[b, :, i, 257].min())
        per = -(-n_pages[b] // S)
        hs = []
        for s in range(S):
            lo, hi = min(s * per * P, row_lens[r]), min((s + 1) * per * P, row_lens[r])
            k = window.order_keys(x[r, lo:hi])
            hs.append(window.histogram(k, base, lbase))
        for s in range(S):
            want = sum((hs[j] for j in range((s // 8) * 8, s)), np.zeros(256, np.int64))
            assert np.array_equal(got[r, s, :256], want), (r, s)
            assert (got[r, s, 256], got[r, s, 257]) == (base, lbase), (r, s)
