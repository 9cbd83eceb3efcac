"""The exact radix top-k kernel (kernels/triton/topk.py) on synthetic float32 rows.

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
from kernels.triton.topk import TopkConfig, launch_topk

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
