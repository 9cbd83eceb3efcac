"""torch_impl.compat.deep_gemm against the float64 reference, on DeepGEMM's own test set.

Cases follow DeepGEMM 54e2261 ``tests/test_attention.py::test_paged_mqa_logits``: next_n 1 / 2
/ 4, block_kv 64 (sm90) and 32 (sm100), random block tables (a permutation of the pages), 2-D
context_lens drawn as ``((L + 1) * rand(B, next_n)).int()`` with the last draft at L, the fused
kv_cache built by its ``kv_cache_cast_to_fp8`` (per-token ``max(amax, 1e-4) / 448`` float32
scales, e4m3 rows then scales in each page), weights ``[B * next_n, H]``. The reference is fed the
quantized bytes. On the CPU the Triton kernels run in the interpreter with small shapes.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import compare, reference
from torch_impl import formats as t_formats
from torch_impl.compat import deep_gemm

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _case(seed, B, N, H, D, P, avg_kv, *, two_d=True, page_pad=0):
    g = np.random.default_rng(seed)
    lens = g.integers(int(0.7 * avg_kv), int(1.3 * avg_kv), B)
    n_blocks = -(-lens // P)
    max_blocks = int(n_blocks.max())
    total = int(n_blocks.sum())
    k = torch.from_numpy(g.standard_normal((total, P, D)).astype(np.float32))
    pages = t_formats.quantize_fp8_indexer(k, scale_fmt=None)              # [total, P * (D + 4)]
    pool = g.permutation(total).astype(np.int32)
    bt = np.zeros((B, max_blocks), np.int32)
    off = 0
    for i, n in enumerate(n_blocks):
        bt[i, :n] = pool[off: off + n]
        off += n
    page_bytes = P * (D + 4)
    buf = torch.zeros((total, page_bytes + page_pad), dtype=torch.uint8, device=DEVICE)
    buf[:, :page_bytes] = pages.to(DEVICE)
    kv = torch.as_strided(buf, (total, P, 1, D + 4), (page_bytes + page_pad, D + 4, D + 4, 1))
    q = torch.from_numpy(g.standard_normal((B, N, H, D)).astype(np.float32)).to(torch.float8_e4m3fn)
    w = g.standard_normal((B * N, H)).astype(np.float32)
    if two_d:
        cl = ((lens[:, None] + 1) * g.random((B, N))).astype(np.int32)
        cl[:, -1] = lens
    else:
        cl = lens.astype(np.int32)
    ref = reference.indexer_logits(
        q.view(torch.uint8).numpy().view(_e4m3()),
        w.reshape(B, N, H), pages.numpy(), bt, cl)
    args = dict(q=(q.to(DEVICE), None), kv_cache=kv, weights=torch.from_numpy(w).to(DEVICE),
                context_lens=torch.from_numpy(cl).to(DEVICE),
                block_table=torch.from_numpy(bt).to(DEVICE))
    return args, ref.reshape(B * N, -1), max_blocks * P


def _e4m3():
    import ml_dtypes
    return ml_dtypes.float8_e4m3fn


def _call(args, max_context_len, **kw):
    meta = deep_gemm.get_paged_mqa_logits_metadata(args["context_lens"], args["kv_cache"].shape[1],
                                                   deep_gemm.get_num_sms())
    return deep_gemm.fp8_fp4_paged_mqa_logits(schedule_meta=meta, max_context_len=max_context_len,
                                              **args, **kw)


@pytest.mark.parametrize("next_n", [1, 2, 4])
@pytest.mark.parametrize("P,H", [(64, 32), (32, 8)])
def test_paged_mqa_logits(next_n, P, H):
    args, ref, W = _case(next_n * 7 + P, 3, next_n, H, 128, P, 200)
    logits = _call(args, W)
    assert logits.dtype == torch.float32 and logits.shape == (3 * next_n, W)
    compare.assert_pass(compare.check_logits(logits, ref))


def test_legacy_entry_1d_context_lens_and_strided_pages():
    args, ref, W = _case(3, 3, 2, 16, 64, 64, 150, two_d=False, page_pad=64)
    meta = deep_gemm.get_paged_mqa_logits_metadata(args["context_lens"], 64, 4)
    logits = deep_gemm.fp8_paged_mqa_logits(args["q"][0], args["kv_cache"], args["weights"],
                                            args["context_lens"], args["block_table"], meta, W,
                                            clean_logits=False)
    compare.assert_pass(compare.check_logits(logits, ref))


def test_max_context_len_wider_and_narrower_than_table():
    args, ref, W = _case(4, 2, 2, 8, 128, 64, 100)
    wide = _call(args, W + 100, clean_logits=True)
    assert wide.shape == (4, W + 100) and torch.isneginf(wide[:, W:]).all()
    compare.assert_pass(compare.check_logits(wide[:, :W], ref))
    narrow = _call(args, W - 5)
    compare.assert_pass(compare.check_logits(narrow, ref[:, : W - 5]))
    bf = _call(args, W, logits_dtype=torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    torch.testing.assert_close(bf, _call(args, W).to(torch.bfloat16), rtol=0, atol=0)


def test_metadata_and_refusals():
    cl = torch.ones((3, 2), dtype=torch.int32)
    meta = deep_gemm.get_paged_mqa_logits_metadata(cl, 64, 132)
    assert meta.shape == (133, 2) and meta.dtype == torch.int32
    assert isinstance(deep_gemm.get_num_sms(), int) and deep_gemm.get_num_sms() > 0
    with pytest.raises(NotImplementedError, match="varlen"):
        deep_gemm.get_paged_mqa_logits_metadata(cl, 64, 132, indices=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="context_lens"):
        deep_gemm.get_paged_mqa_logits_metadata(cl.long(), 64, 132)
    args, _, W = _case(5, 2, 1, 8, 128, 64, 80)
    with pytest.raises(NotImplementedError, match="FP4"):
        _call(dict(args, q=(args["q"][0], torch.zeros(1))), W)
    with pytest.raises(ValueError, match="weights"):
        _call(dict(args, weights=args["weights"][:1]), W)
    with pytest.raises(ValueError, match="kv_cache"):
        _call(dict(args, kv_cache=args["kv_cache"][..., :100]), W)
    with pytest.raises(ValueError, match="max_context_len"):
        _call(args, 0)
    # beyond int32 positions: a ValueError before anything is allocated (newcomer trial
    # 2026-12-03: 10**10 reached the allocator)
    with pytest.raises(ValueError, match=r"max_context_len: .*2147483647.*10000000000"):
        _call(args, 10**10)


def test_errors_name_the_callers_arguments():
    """Native errors name the DeepGEMM argument (kv_cache, not the native k_cache); the vLLM
    wrappers' errors name theirs (block_tables, schedule_metadata, max_model_len, block_size,
    q_fp8)."""
    from torch_impl.compat import engines
    args, _, W = _case(6, 2, 1, 8, 128, 64, 80)
    kv = args["kv_cache"]
    shifted = torch.as_strided(torch.zeros(kv.numel() + 1, dtype=torch.uint8, device=DEVICE),
                               kv.shape, kv.stride(), 1)            # starts at byte 1
    with pytest.raises(ValueError, match=r"^kv_cache: expected a byte offset"):
        _call(dict(args, kv_cache=shifted), W)
    meta = deep_gemm.get_paged_mqa_logits_metadata(args["context_lens"], 64, 4)
    q, w, cl, bt = args["q"], args["weights"], args["context_lens"], args["block_table"]
    with pytest.raises(TypeError, match=r"^block_tables: expected dtype"):
        engines.vllm_fp8_fp4_paged_mqa_logits(q, kv, w, cl, bt.long(), meta, W)
    with pytest.raises(ValueError, match=r"^max_model_len: expected an int >= 1"):
        engines.vllm_fp8_fp4_paged_mqa_logits(q, kv, w, cl, bt, meta, 0)
    with pytest.raises(TypeError, match=r"^schedule_metadata: expected dtype"):
        engines.vllm_fp8_fp4_paged_mqa_logits(q, kv, w, cl, bt, meta.long(), W)
    with pytest.raises(TypeError, match=r"^q_fp8: expected dtype"):
        engines.vllm_fp8_paged_mqa_logits(q[0].float(), kv, w, cl, bt, meta, W)
    with pytest.raises(ValueError, match=r"^kv_cache_fp8: expected"):
        engines.vllm_fp8_paged_mqa_logits(q[0], kv[..., :100], w, cl, bt, meta, W)
    with pytest.raises(ValueError, match=r"^block_size: expected an int >= 1"):
        engines.vllm_get_paged_mqa_logits_metadata(cl, 0, 4)
    with pytest.raises(TypeError, match=r"^block_kv: expected an int"):
        deep_gemm.get_paged_mqa_logits_metadata(cl, 16.0, 4)
    with pytest.raises(TypeError, match=r"^max_context_len: expected an int"):
        deep_gemm.fp8_paged_mqa_logits(q[0], kv, w, cl, bt, meta, 32.0)
