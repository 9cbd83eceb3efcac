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


# ============================================================================ bad input, named

def _rows(R=2, W=40):
    g = torch.Generator().manual_seed(7)
    return (torch.randn(R, W, generator=g).to(DEVICE),
            torch.tensor([30, 5], dtype=torch.int32, device=DEVICE))


def test_persistent_topk_bad_input():
    logits, lens = _rows()
    buf = lambda: torch.full((4, 8), 7, dtype=torch.int32, device=DEVICE)  # noqa: E731
    call = lambda **kw: ctk.persistent_topk(**dict(dict(  # noqa: E731
        logits=logits, seq_lens=lens, topk_indices=buf(), workspace=None, k=8, max_seq_len=40), **kw))
    for op in (ctk.persistent_topk, ctk.cooperative_topk):
        with pytest.raises(ValueError, match=r"^max_seq_len: expected an int >= 0, got -5"):
            op(logits, lens, buf(), None, 8, -5)
    with pytest.raises(TypeError, match=r"^max_seq_len: expected an int"):
        call(max_seq_len=40.0)
    with pytest.raises(TypeError, match=r"^k: expected an int.*float 8\.0"):
        call(k=8.0)
    with pytest.raises(ValueError, match=r"^k: expected an int >= 1"):
        call(k=0)
    with pytest.raises(ValueError, match=r"^topk_indices: expected shape \(>= 2, >= 16\).*\(4, 8\)"):
        call(k=16)
    with pytest.raises(TypeError, match=r"^topk_indices: expected dtype in \['torch.int32'\], "
                                        r"got torch.int64"):
        call(topk_indices=torch.zeros((4, 8), dtype=torch.int64, device=DEVICE))
    with pytest.raises(TypeError, match=r"^seq_lens: expected dtype"):
        call(seq_lens=lens.float())
    with pytest.raises(TypeError, match=r"^logits: expected a torch.Tensor"):
        call(logits=logits.cpu().numpy())
    # a max_seq_len of the width or above reads the whole row (vLLM passes the longest sequence)
    full, wide = buf(), buf()
    ctk.persistent_topk(logits, lens, full, None, 8, 40)
    ctk.persistent_topk(logits, lens, wide, None, 8, 1000)
    assert torch.equal(full, wide)


def test_top_k_per_row_decode_bad_input():
    logits, lens = _rows()
    buf = lambda: torch.full((4, 8), 7, dtype=torch.int32, device=DEVICE)  # noqa: E731

    def call(**kw):
        a = dict(logits=logits, next_n=1, seq_lens=lens, topk_indices=buf(), num_rows=2,
                 stride0=40, stride1=1, topk_tokens=8)
        a.update(kw)
        ctk.top_k_per_row_decode(**a)
        return a["topk_indices"]

    ok = call()
    with pytest.raises(ValueError, match=r"^num_rows: expected <= logits.shape\[0\] = 2, got 4"):
        call(num_rows=4)
    with pytest.raises(ValueError, match=r"^num_rows: expected an int >= 0"):
        call(num_rows=-1)
    with pytest.raises(ValueError, match=r"^stride0: .*inside logits.*got stride0 = 1000"):
        call(stride0=1000)
    with pytest.raises(ValueError, match=r"^stride1: .*inside logits"):
        call(stride1=100)
    with pytest.raises(ValueError, match=r"^stride0: expected an int >= 0"):
        call(stride0=-40)
    with pytest.raises(TypeError, match=r"^logits: expected a torch.Tensor, got ndarray"):
        call(logits=logits.cpu().numpy())
    with pytest.raises(ValueError, match=r"^topk_indices: expected shape \(>= 2, >= 16\)"):
        call(topk_tokens=16)
    with pytest.raises(TypeError, match=r"^topk_indices: expected dtype"):
        call(topk_indices=torch.zeros((4, 8), dtype=torch.int64, device=DEVICE))
    with pytest.raises(TypeError, match=r"^topk_tokens: expected an int"):
        call(topk_tokens=8.0)
    with pytest.raises(ValueError, match=r"^next_n: expected an int >= 1"):
        call(next_n=0)
    # a view inside a wider logits buffer (vLLM's strided logits) is still accepted
    wide = torch.zeros((2, 56), device=DEVICE)
    wide[:, :40] = logits
    assert torch.equal(call(logits=wide[:, :40], stride0=56), ok)


def test_fast_topk_transform_fused_bad_input():
    score, lens = _rows()
    pt = torch.arange(80, dtype=torch.int32, device=DEVICE).reshape(2, 40) + 1000
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    call = lambda table, c, k=4: ctk.fast_topk_transform_fused(score, lens, table, c, k)  # noqa: E731
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: required when page_table_size_1 has 1 "
                                         r"rows and score has 2.*got None"):
        call(pt[:1], None)
    with pytest.raises(ValueError, match=r"^page_table_size_1: expected at least one row"):
        call(pt[:0], cu)
    with pytest.raises(TypeError, match=r"^cu_seqlens_q: expected dtype.*got torch.float32"):
        call(pt[:1], cu[:2].float())
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected rank 1"):
        call(pt[:1], cu[None, :2])
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected shape \(2,\)"):
        call(pt[:1], cu)
    for bad in ([5, -3], [1, 2], [0, 1], [0, 3]):
        with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected non-decreasing offsets "
                                             r"from 0 to the 2 score rows"):
            call(pt[:1], torch.tensor(bad, dtype=torch.int32, device=DEVICE))
    big = torch.arange(120, dtype=torch.int32, device=DEVICE).reshape(3, 40)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected non-decreasing"):
        call(big, torch.tensor([0, 2, 1, 2], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"^topk: expected an int >= 1"):
        call(pt, cu, 0)
    with pytest.raises(TypeError, match=r"^score: expected a torch.Tensor"):
        ctk.fast_topk_transform_fused(score.cpu().numpy(), lens, pt, cu, 4)
    with pytest.raises(ValueError, match=r"^topk: expected an int >= 1"):
        ctk.fast_topk_v2(score, lens, -1)
    with pytest.raises(TypeError, match=r"^topk: expected an int"):
        ctk.fast_topk_v2(score, lens, 4.0)
    # one request owning both rows: both map through table row 0; int64 offsets accepted
    one = call(pt[:1], torch.tensor([0, 2], dtype=torch.int64, device=DEVICE))
    pos = ctk.fast_topk_v2(score, lens, 4)
    assert torch.equal(one, torch.where(pos >= 0, pos + 1000, -1))


@pytest.mark.parametrize("W", [4608, 4097])
def test_select_topk_few_long_rows_split(W, monkeypatch):
    """``select_topk`` on the Triton path with few long rows: ``split_plan`` splits them over
    programs (the split pass A, then the split top-k; page size 64, or 1 for an odd width);
    the exact set, ties at the threshold, NaN / +-inf, a short and an empty row, and the same
    set as one program a row."""
    from kernels.topk import triton as kt
    R, k = 3, 96
    x = _logits(6, R, W)
    lens = np.array([W, W - 700, 0], np.int32)
    assert kt.split_plan(R, W, 4) == ((64 if W % 64 == 0 else 1), 2)
    xt, lt = torch.from_numpy(x).to(DEVICE), torch.from_numpy(lens).to(DEVICE)
    calls = []
    real = kt.launch_split_hist
    monkeypatch.setattr(kt, "launch_split_hist",
                        lambda *a, **kw: calls.append(kw["page_size"]) or real(*a, **kw))
    got = ctk.select_topk(xt, lt, k, path="triton")
    assert calls == [64 if W % 64 == 0 else 1]      # split (2 splits on any GPU of >= 3 SMs)
    compare.assert_pass(compare.check_topk(got, _ref(x, lens), k))
    monkeypatch.setenv(kt.SPLIT_PLAN_ENV, "0")                  # the A/B switch: one program a row
    assert kt.split_plan(R, W, 4) is None
    one = ctk.select_topk(xt, lt, k, path="triton")
    assert len(calls) == 1
    assert torch.equal(got.sort(-1).values, one.sort(-1).values)
