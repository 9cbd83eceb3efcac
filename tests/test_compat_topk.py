"""torch_impl.compat.topk: the engines' top-k calls, checked as exact sets against the float64
rule (kernels.compare.check_topk: NaN / -inf never selected, ties to the smaller position,
-1 padding), on rows with NaN, -inf, ties, lengths 0 / < k / > k, and MTP row lengths."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import compare
from torch_impl.compat import topk as ctk

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PATHS = ("triton", "torch")


def _logits(seed, R, W, *, ties=True):
    g = np.random.default_rng(seed)
    x = g.standard_normal((R, W)).astype(np.float32)
    if ties:
        x = np.round(x * 4) / 4                          # many exact ties
    x[0, 3] = np.nan
    x[0, 5] = -np.inf
    x[min(1, R - 1), :7] = np.inf
    return x


def _ref(x, lens):
    r = x.astype(np.float64).copy()
    pos = np.arange(x.shape[1])[None, :]
    r[pos >= np.asarray(lens)[:, None]] = -np.inf
    return r


@pytest.mark.parametrize("path", PATHS)
def test_select_topk_exact(path):
    R, W, k = 6, 300, 64
    x = _logits(1, R, W)
    lens = np.array([300, 250, 0, 10, 64, 65], np.int32)
    got = ctk.select_topk(torch.from_numpy(x).to(DEVICE), torch.from_numpy(lens).to(DEVICE), k,
                          path=path)
    compare.assert_pass(compare.check_topk(got, _ref(x, lens), k))


@pytest.mark.parametrize("next_n", [1, 2, 4])
def test_top_k_per_row_decode_vllm(next_n):
    """vLLM's call: logits of fp8_paged_mqa_logits (a strided view), 1-D seq_lens, output a
    slice of the persistent [max_tokens, 2048] buffer."""
    B, W, k = 3, 200, 32
    seq = np.array([200, 31, 90], np.int32)
    x = _logits(2, B * next_n, W + 56)
    logits = torch.from_numpy(x).to(DEVICE)[:, :W]         # row stride W + 56
    buf = torch.full((16, 48), 7, dtype=torch.int32, device=DEVICE)
    ctk.top_k_per_row_decode(logits, next_n, torch.from_numpy(seq).to(DEVICE), buf, B * next_n,
                             logits.stride(0), logits.stride(1), k)
    r = np.arange(B * next_n)
    lens = seq[r // next_n] - next_n + r % next_n + 1
    compare.assert_pass(compare.check_topk(buf[: B * next_n, :k], _ref(x[:, :W], lens), k))
    assert (buf[B * next_n:] == 7).all() and (buf[:, k:] == 7).all(), "only the slice is written"


def test_persistent_topk_2d_seq_lens():
    B, N, W, k = 2, 2, 256, 512
    x = _logits(3, B * N, W)
    seq = np.array([[100, 101], [0, 256]], np.int32)
    buf = torch.empty((B * N, k), dtype=torch.int32, device=DEVICE)
    ctk.persistent_topk(torch.from_numpy(x).to(DEVICE), torch.from_numpy(seq).to(DEVICE), buf,
                        torch.empty(16, dtype=torch.uint8, device=DEVICE), k, W)
    compare.assert_pass(compare.check_topk(buf, _ref(x, seq.reshape(-1)), k))


def test_sglang_fast_topk_and_transform():
    R, W, k = 4, 300, 48
    x = _logits(4, R, W)
    lens = np.array([300, 20, 0, 299], np.int32)
    xt, lt = torch.from_numpy(x).to(DEVICE), torch.from_numpy(lens).to(DEVICE)
    pos = ctk.fast_topk_v2(xt, lt, k)
    compare.assert_pass(compare.check_topk(pos, _ref(x, lens), k))
    table = torch.from_numpy(np.random.default_rng(5).permutation(2 * W).astype(np.int32)
                             .reshape(2, W)).to(DEVICE)
    cu = torch.tensor([0, 2, 4], dtype=torch.int32, device=DEVICE)     # two requests, 2 rows each
    dst = ctk.fast_topk_transform_fused(xt, lt, table, cu, k)
    p = pos.cpu().numpy()
    # the selected set is exact, so map the reference selection row by row
    for r in range(R):
        sel = np.sort(p[r][p[r] >= 0])
        want = np.sort(table.cpu().numpy()[r // 2][sel])
        got = dst[r].cpu().numpy()
        assert np.array_equal(np.sort(got[got >= 0]), want) and (got < 0).sum() == (p[r] < 0).sum()
    with pytest.raises(NotImplementedError, match="row_starts"):
        ctk.fast_topk_v2(xt, lt, k, row_starts=lt)
