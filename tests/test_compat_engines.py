"""The engines' real call-site argument patterns, run through the patched engine modules.

vLLM and SGLang are not installed here, so stand-in modules with the engines' module names and
their original (refusing) functions are put in ``sys.modules``; :func:`patch_vllm` /
:func:`patch_sglang` patch them exactly as they patch the real ones, and each call below copies
an engine call site's argument form (keywords, positional order, views, buffers) from the files
docs/COMPAT.md names. Every result is checked against the float64 reference.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

import test_compat_deep_gemm as dg_t
import test_compat_flash_mla as fm_t
from kernels import compare
from torch_impl.compat import engines

DEVICE = fm_t.DEVICE
Q_DTYPE = fm_t.Q_DTYPES[0]


def _refuse(*args, **kwargs):
    raise RuntimeError("vllm._flashmla_C is not available (stand-in for an sm_120 build)")


def _stub(monkeypatch, names: dict[str, dict]):
    mods = {}
    for mod_name, attrs in names.items():
        m = types.ModuleType(mod_name)
        for a, v in attrs.items():
            setattr(m, a, v)
        monkeypatch.setitem(sys.modules, mod_name, m)
        mods[mod_name] = m
    return mods


class _OpNamespace:
    """Stand-in for ``torch.ops._C`` with vLLM's two top-k ops registered."""
    persistent_topk = staticmethod(_refuse)
    cooperative_topk = staticmethod(_refuse)


@pytest.fixture
def vllm(monkeypatch):
    flashmla = dict(FlashMLASchedMeta=object, get_mla_metadata=_refuse,
                    flash_mla_with_kvcache=_refuse, flash_mla_sparse_fwd=_refuse,
                    is_flashmla_sparse_supported=lambda: (False, "only Hopper / Blackwell DC"),
                    _is_flashmla_available=lambda: (False, "not built"))
    mods = _stub(monkeypatch, {
        "vllm.v1.attention.ops.flashmla": flashmla,
        "vllm.v1.attention.backends.mla.flashmla_sparse": dict(
            FlashMLASchedMeta=object, get_mla_metadata=_refuse, flash_mla_with_kvcache=_refuse,
            flash_mla_sparse_fwd=_refuse),
        "vllm.utils.deep_gemm": dict(fp8_fp4_paged_mqa_logits=_refuse, fp8_paged_mqa_logits=_refuse,
                                     get_paged_mqa_logits_metadata=_refuse, has_deep_gemm=lambda: False),
        "vllm.model_executor.layers.sparse_attn_indexer": dict(fp8_fp4_paged_mqa_logits=_refuse,
                                                               has_deep_gemm=lambda: False),
        "vllm.v1.attention.backends.mla.indexer": dict(get_paged_mqa_logits_metadata=_refuse,
                                                       has_deep_gemm=lambda: False),
        "vllm._custom_ops": dict(top_k_per_row_decode=_refuse),
    })
    ns = _OpNamespace()
    patch = engines.patch_vllm(modules=mods, torch_ops_namespace=ns)
    yield mods, ns, patch
    patch.undo()


def test_vllm_patch_record_and_undo(vllm):
    mods, ns, patch = vllm
    fm = mods["vllm.v1.attention.ops.flashmla"]
    assert fm.is_flashmla_sparse_supported() == (True, None)
    assert mods["vllm.utils.deep_gemm"].has_deep_gemm() is True
    assert ("torch.ops._C", "persistent_topk") in patch.replaced and not patch.absent
    assert fm.flash_mla_sparse_fwd is _refuse, "prefill is left to the engine"
    patch.undo()
    assert fm.flash_mla_with_kvcache is _refuse and ns.persistent_topk is _refuse


def test_vllm_v32_decode_call_site(vllm):
    """flashmla_sparse.py decode: all tokens as the batch (q [T, 1, H, 576]), the cache
    `kv_c_and_k_pe_cache.view(torch.uint8).unsqueeze(-2)` of vLLM's [num_blocks, P, 656] fp8
    cache, a dummy block table and cache_lens, indices [T, 1, topk] global slots."""
    mods, _, _ = vllm
    fm = mods["vllm.v1.attention.backends.mla.flashmla_sparse"]
    g = np.random.default_rng(0)
    T, H, P, topk = 3, 16, 64, 64
    kc, idx, _, rows = fm_t._gen_scope(g, T, 1, 2 * topk, P, topk, 576, strided=False)
    kv_c_and_k_pe_cache = kc[:, :, 0, :]                      # vLLM's 3-D cache tensor
    q = fm_t._t(np.clip(g.standard_normal((T, 1, H, 576)), -1, 1).astype(np.float32), Q_DTYPE)
    meta, _ = fm.get_mla_metadata()
    out, lse = fm.flash_mla_with_kvcache(
        q=q, k_cache=kv_c_and_k_pe_cache.view(torch.uint8).unsqueeze(-2),
        block_table=torch.zeros((T, 1), dtype=torch.int32, device=DEVICE),
        cache_seqlens=torch.ones(T, dtype=torch.int32, device=DEVICE), head_dim_v=512,
        tile_scheduler_metadata=meta, is_fp8_kvcache=True, indices=fm_t._t(idx),
        softmax_scale=0.1352)
    ro, rl = fm_t._reference(q.float().cpu().numpy(), [(kc, idx, None, rows)], 0.1352, None)
    fm_t._check(out, lse, ro, rl, q)


def test_vllm_v4_swa_call_site(vllm):
    """DeepSeek V4 decode: the SWA cache with topk_length, the compressed cache as the extra
    cache with extra_topk_length, the sink, every argument by keyword, out= a view."""
    mods, _, _ = vllm
    fm = mods["vllm.v1.attention.ops.flashmla"]
    g = np.random.default_rng(1)
    T, H = 2, 8
    swa = fm_t._gen_scope(g, T, 1, 128, 64, 64, 512, topk_len=True)
    comp = fm_t._gen_scope(g, T, 1, 128, 2, 32, 512, topk_len=True, strided=False)
    q = fm_t._t(np.clip(g.standard_normal((T, 1, H, 512)), -1, 1).astype(np.float32), Q_DTYPE)
    sink = fm_t._t(fm_t._sink(g, H))
    output = torch.empty((T, H, 512), dtype=q.dtype, device=DEVICE)
    out, lse = fm.flash_mla_with_kvcache(
        q=q, k_cache=swa[0], block_table=None, head_dim_v=512,
        tile_scheduler_metadata=fm.FlashMLASchedMeta(), cache_seqlens=None, is_fp8_kvcache=True,
        indices=fm_t._t(swa[1]), topk_length=fm_t._t(swa[2]), softmax_scale=512 ** -0.5,
        attn_sink=sink, extra_k_cache=comp[0], extra_indices_in_kvcache=fm_t._t(comp[1]),
        extra_topk_length=fm_t._t(comp[2]), out=output.unsqueeze(1))
    assert out.data_ptr() == output.data_ptr()
    ro, rl = fm_t._reference(q.float().cpu().numpy(), [swa, comp], 512 ** -0.5, sink.cpu().numpy())
    fm_t._check(out, lse, ro, rl, q)


@pytest.mark.parametrize("next_n", [1, 2])
def test_vllm_indexer_call_site(vllm, next_n):
    """sparse_attn_indexer.py decode: fp8_fp4_paged_mqa_logits((q, None), 4-D kv view,
    weights[:num_padded_tokens], 2-D seq_lens, block_table, schedule_metadata,
    max_model_len=..., clean_logits=False), then persistent_topk and top_k_per_row_decode into
    slices of the persistent topk_indices_buffer."""
    mods, ns, _ = vllm
    ind = mods["vllm.model_executor.layers.sparse_attn_indexer"]
    meta_mod = mods["vllm.v1.attention.backends.mla.indexer"]
    ops = mods["vllm._custom_ops"]
    args, ref, W = dg_t._case(10 + next_n, 3, next_n, 16, 128, 64, 150)
    B = 3
    kv_3d = args["kv_cache"][:, :, 0, :]                     # vLLM's [num_blocks, P, 132] cache
    seq_lens = args["context_lens"]
    schedule = meta_mod.get_paged_mqa_logits_metadata(seq_lens, 64, 132)
    weights = torch.cat([args["weights"], torch.zeros_like(args["weights"][:2])])   # padded
    logits = ind.fp8_fp4_paged_mqa_logits(args["q"], kv_3d.unsqueeze(-2),
                                          weights[: B * next_n], seq_lens, args["block_table"],
                                          schedule, max_model_len=W, clean_logits=False)
    compare.assert_pass(compare.check_logits(logits, ref))
    topk = 64
    buf = torch.full((8, 2048), -7, dtype=torch.int32, device=DEVICE)
    topk_indices = buf[: B * next_n, :topk]
    ns.persistent_topk(logits, seq_lens, topk_indices,
                       torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE), topk, logits.shape[1])
    compare.assert_pass(compare.check_topk(topk_indices, ref, topk))
    buf.fill_(-7)
    ops.top_k_per_row_decode(logits, next_n, seq_lens, topk_indices, B * next_n,
                             logits.stride(0), logits.stride(1), topk)
    compare.assert_pass(compare.check_topk(topk_indices, ref, topk))
    assert (buf[B * next_n:] == -7).all()


def test_sglang_call_sites(monkeypatch):
    """SGLang NSA decode: deep_gemm.get_paged_mqa_logits_metadata(seqlens_32 [B], 64, sm_count),
    fp8_paged_mqa_logits(q_fp8 [B, 1, H, D], kv.view(pages, 64, 1, 132), weights [B, H],
    seqlens_32, block_tables, schedule, max_seq_len, clean_logits=False), the fused top-k
    transform, then sgl_kernel.flash_mla.flash_mla_with_kvcache with keywords."""
    mods = _stub(monkeypatch, {
        "sgl_kernel.flash_mla": dict(get_mla_metadata=_refuse, flash_mla_with_kvcache=_refuse),
        "deep_gemm": dict(get_num_sms=_refuse, get_paged_mqa_logits_metadata=_refuse,
                          fp8_paged_mqa_logits=_refuse, fp8_fp4_paged_mqa_logits=_refuse),
        "sgl_kernel": dict(fast_topk_v2=_refuse, fast_topk_transform_fused=_refuse),
    })
    patch = engines.patch_sglang(modules=mods)
    try:
        dg, sk, skfm = mods["deep_gemm"], mods["sgl_kernel"], mods["sgl_kernel.flash_mla"]
        args, ref, W = dg_t._case(21, 2, 1, 16, 128, 64, 120, two_d=False)
        seqlens_32 = args["context_lens"]
        kv_2d = args["kv_cache"].reshape(args["kv_cache"].shape[0], -1)   # [pages, 64 * 132]
        schedule = dg.get_paged_mqa_logits_metadata(seqlens_32, 64, dg.get_num_sms())
        logits = dg.fp8_paged_mqa_logits(args["q"][0], kv_2d.view(kv_2d.shape[0], 64, 1, 132),
                                         args["weights"], seqlens_32, args["block_table"],
                                         schedule, W, clean_logits=False)
        compare.assert_pass(compare.check_logits(logits, ref))
        topk = 32
        pos = sk.fast_topk_v2(logits, seqlens_32, topk)
        compare.assert_pass(compare.check_topk(pos, ref, topk))
        # page_table_size_1 of the MLA cache: request b's logical position j -> slot
        g = np.random.default_rng(2)
        nb = 6
        lat = torch.from_numpy(np.clip(g.standard_normal((nb, 64, 576)) / 10, -1, 1).astype(np.float32))
        q8 = fm_t.t_formats.quantize_fp8_ds_mla(lat)                   # [nb, 64, 656]
        rows = fm_t.np_formats.dequantize_fp8_ds_mla(q8.numpy()).reshape(nb * 64, 576)
        kc = q8.to(DEVICE).unsqueeze(2)
        n_slots = nb * 64
        table = torch.from_numpy(g.permutation(n_slots)[: 2 * W].astype(np.int32).reshape(2, W)).to(DEVICE)
        cu = torch.arange(3, dtype=torch.int32, device=DEVICE)
        slots = sk.fast_topk_transform_fused(score=logits, lengths=seqlens_32,
                                             page_table_size_1=table, cu_seqlens_q=cu, topk=topk)
        assert slots.shape == (2, topk)
        H = 16
        q = fm_t._t(np.clip(g.standard_normal((2, 1, H, 576)), -1, 1).astype(np.float32), Q_DTYPE)
        meta, num_splits = skfm.get_mla_metadata(seqlens_32, H, 1)
        out, lse = skfm.flash_mla_with_kvcache(
            q=q, k_cache=kc, block_table=None, cache_seqlens=None, head_dim_v=512,
            tile_scheduler_metadata=meta, num_splits=num_splits, softmax_scale=0.1352,
            causal=False, is_fp8_kvcache=True, indices=slots.unsqueeze(1))
        ro, rl = fm_t._reference(q.float().cpu().numpy(),
                                 [(kc, slots.unsqueeze(1).cpu().numpy(), None, rows)], 0.1352, None)
        fm_t._check(out, lse, ro, rl, q)
    finally:
        patch.undo()


def test_compat_md_example(monkeypatch, capsys):
    """docs/COMPAT.md's patch example, run as written against stand-in vLLM modules."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).parent.parent / "docs" / "COMPAT.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "patch_vllm()" in block
    mods = _stub(monkeypatch, {
        "vllm.v1.attention.ops.flashmla": dict(
            FlashMLASchedMeta=object, get_mla_metadata=_refuse, flash_mla_with_kvcache=_refuse,
            is_flashmla_sparse_supported=lambda: (False, "Hopper / Blackwell DC only"),
            _is_flashmla_available=lambda: (False, "not built")),
        "vllm.utils.deep_gemm": dict(fp8_fp4_paged_mqa_logits=_refuse, has_deep_gemm=lambda: False),
        "vllm._custom_ops": dict(top_k_per_row_decode=_refuse),
    })
    scope: dict = {}
    exec(compile(block, "docs/COMPAT.md", "exec"), scope)   # noqa: S102 - the documented example
    try:
        fm = mods["vllm.v1.attention.ops.flashmla"]
        assert fm.is_flashmla_sparse_supported() == (True, None)
        assert fm.flash_mla_with_kvcache is engines.c_flash_mla.flash_mla_with_kvcache
        assert mods["vllm.utils.deep_gemm"].has_deep_gemm() is True
        assert mods["vllm._custom_ops"].top_k_per_row_decode is engines.c_topk.top_k_per_row_decode
        assert "patched:" in capsys.readouterr().out
    finally:
        scope["patch"].undo()


def test_sglang_gets_the_compat_deep_gemm_module_when_none_is_installed(monkeypatch):
    import importlib.util
    if importlib.util.find_spec("deep_gemm") is not None:
        pytest.skip("a real deep_gemm is installed here")
    monkeypatch.delitem(sys.modules, "deep_gemm", raising=False)
    patch = engines.patch_sglang()
    try:
        import deep_gemm                                   # what SGLang's indexer does
        assert deep_gemm.fp8_paged_mqa_logits is engines.c_deep_gemm.fp8_paged_mqa_logits
        assert ("deep_gemm", "<module>") in patch.replaced
    finally:
        patch.undo()
    assert "deep_gemm" not in sys.modules
