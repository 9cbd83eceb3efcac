"""torch_impl.compat.flash_mla against the float64 reference, on FlashMLA's own test set.

Cases follow FlashMLA 9241ae3 ``tests/test_flash_mla_sparse_decoding.py`` / ``tests/lib.py``:
page sizes 2 / 53 / 61 / 64 / 69 / 576, s_q 1 and 3, b 4 and 74, h_q 8..128, random block
tables, indices as global slots with -1 padding, all-invalid rows, zero-length requests,
unused cache rows filled with NaN (every byte 0xFF: NaN e4m3, NaN scales, NaN bf16 rope), attn
sink with +-inf entries, topk_length, MODEL1 with an extra cache. Caches are quantized, and the
reference is fed the dequantized bytes (FlashMLA's quantize -> dequantize reference). V3.2
caches use FlashMLA's quantizer layout: pages strided by one padding token row.

On the CPU the Triton kernels run in the interpreter with fp16 / fp32 q (bf16 only on a GPU),
with small b and topk (the interpreter is slow); on a CUDA GPU the same bodies run with bf16.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import compare, formats as np_formats, reference
from torch_impl import formats as t_formats
from torch_impl.compat import flash_mla

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# fp32 q runs the fp32-dot kernel variant: on CPU machines it is a cpu_heavy twin of the fp16 case
# (same shapes, ~2x the interpreter time; tests/conftest.py)
Q_DTYPES = (torch.bfloat16,) if CUDA else (torch.float16, torch.float32)
Q_DTYPE_PARAMS = (torch.bfloat16,) if CUDA else (
    torch.float16, pytest.param(torch.float32, marks=pytest.mark.cpu_heavy))


# ============================================================================ FlashMLA-style data

class _Rows:
    """Dequantized float64 rows of a quantized scope, gathered on demand by slot (the cache is
    never dequantized whole: FlashMLA's b 321 production case has ~1.6M slots)."""

    def __init__(self, cache_bytes: np.ndarray, d_qk: int, P: int):
        self.bytes, self.d_qk, self.P = cache_bytes, d_qk, P     # [nb*P, 656] | [nb, padded]
        self.num_slots = cache_bytes.shape[0] * (1 if d_qk == 576 else P)

    def __call__(self, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, np.int64)
        if self.d_qk == 576:
            return np_formats.dequantize_fp8_ds_mla(self.bytes[slots]).astype(np.float64)
        pages, inv = np.unique(slots // self.P, return_inverse=True)
        deq = np_formats.dequantize_fp8_model1(self.bytes[pages], self.P)      # [n, P, 512]
        return deq[inv.reshape(-1), slots % self.P].astype(np.float64)


def _gen_scope(g, b, s_q, s_k, P, topk, d_qk, *, varlen=True, zero_len=False, all_invalid=False,
               topk_len=False, strided=True):
    """One KV scope as FlashMLA's ``generate_one_k_scope``: (k_cache view, indices [b, s_q,
    topk] int32 global slots, topk_length or None, :class:`_Rows` of the dequantized cache).
    The latent is drawn and quantized on DEVICE (GB-sized at the production shapes)."""
    lens = np.full(b, s_k)
    if varlen:
        lens = np.maximum(g.normal(s_k, s_k / 2, b), s_q).astype(np.int64)
    if zero_len:
        lens[g.standard_normal(b) > 0] = 0
    align = 4 * P
    max_pad = max(-(-int(lens.max()) // align), 1) * align
    bt = g.permutation(b * max_pad // P).astype(np.int32).reshape(b, -1)
    nb = bt.size
    tg = torch.Generator(device=DEVICE).manual_seed(int(g.integers(1 << 31)))
    t_lat = (torch.randn((nb, P, d_qk), generator=tg, device=DEVICE) / 10).clamp_(-1, 1)
    abs_idx = np.full((b, s_q, topk), -1, np.int64)
    if not all_invalid:
        for i in range(b):
            for j in range(s_q):
                sel = g.permutation(int(lens[i]))[:topk]
                abs_idx[i, j, : sel.size] = sel
    slots = np.where(abs_idx >= 0, bt[np.arange(b)[:, None, None], np.maximum(abs_idx, 0) // P] * P
                     + np.maximum(abs_idx, 0) % P, -1)
    tkl = g.integers(0, topk + 1, b).astype(np.int32) if topk_len else None
    used = slots if tkl is None else np.where(np.arange(topk)[None, None] < tkl[:, None, None], slots, -1)
    unused = np.ones(nb * P, bool)
    unused[used[used >= 0]] = False
    unused_t = torch.from_numpy(unused).to(DEVICE)

    if d_qk == 576:
        q8 = t_formats.quantize_fp8_ds_mla(t_lat).reshape(nb * P, 656)     # [nb * P, 656]
        del t_lat
        q8[unused_t] = 0xFF                                                # NaN everywhere
        rows = _Rows(q8.cpu().numpy(), d_qk, P)
        q8 = q8.reshape(nb, P, 656)
        if strided:   # FlashMLA tests/quant.py: empty((nb, P + 1, 656))[:, :P]
            buf = torch.zeros((nb, P + 1, 656), dtype=torch.uint8, device=DEVICE)
            buf[:, :P] = q8
            q8 = buf[:, :P]
        k_cache = q8.view(torch.float8_e4m3fn).unsqueeze(2)               # [nb, P, 1, 656]
    else:
        pages = t_formats.quantize_fp8_model1(t_lat)                        # [nb, padded]
        del t_lat
        data = pages[:, : P * 576].view(nb, P, 576)
        scl = pages[:, P * 576: P * 584].view(nb, P, 8)
        um = unused_t.reshape(nb, P)
        data[um] = 0xFF
        scl[um] = 0xFF
        rows = _Rows(pages.cpu().numpy(), d_qk, P)
        padded = pages.shape[1]
        k_cache = torch.as_strided(pages.view(torch.float8_e4m3fn), (nb, P, 1, 584),
                                   (padded, 584, 584, 1))
    return k_cache, slots.astype(np.int32), tkl, rows


def _sink(g, h):
    s = g.standard_normal(h).astype(np.float32)
    m = g.standard_normal(h)
    s[m < -0.5] = -np.inf
    s[m > 0.5] = np.inf
    return s


class _RowsOf:
    """A dequantized ``[slots, D]`` array in the lazy dequantizer's interface (``num_slots``;
    called with slot ids, returns their rows)."""

    def __init__(self, rows: np.ndarray):
        self.rows, self.num_slots = rows, rows.shape[0]

    def __call__(self, sel):
        return self.rows[sel]


def _reference(q, scopes, sm_scale, sink):
    """float64 FlashMLA reference (tests/ref.py ref_sparse_attn_decode): both caches' gathered
    rows in one softmax, the sink once, empty rows out 0 / lse -inf (native orientation
    [b, s_q, h_q]; the caller converts). Runs ``kernels.reference.sparse_mla_decode`` one
    request at a time over a compact cache of that request's selected rows."""
    q = np.asarray(q, np.float64)
    b = q.shape[0]
    outs, lses = [], []
    for i in range(b):
        rows, idx, off = [], [], 0
        for _, ind, tkl, deq in scopes:
            if isinstance(deq, np.ndarray):       # an already dequantized [slots, D] cache
                deq = _RowsOf(deq)
            ind = ind[i:i + 1].astype(np.int64)
            if tkl is not None:
                ind = np.where(np.arange(ind.shape[2])[None, None] < tkl[i], ind, -1)
            ind = np.where((ind >= 0) & (ind < deq.num_slots), ind, -1)
            sel, inv = np.unique(ind[ind >= 0], return_inverse=True)
            compact = np.full(ind.shape, -1, np.int64)
            compact[ind >= 0] = inv.reshape(-1) + off
            idx.append(compact)
            rows.append(deq(sel) if sel.size else np.zeros((0, q.shape[3])))
            off += sel.size
        cache = np.concatenate(rows + [np.zeros((1, q.shape[3]))])[:, None, :]   # >= 1 row
        with np.errstate(invalid="ignore"):   # -inf sink on an empty row: NaN, zeroed below
            ro, rl = reference.sparse_mla_decode(q[i:i + 1], cache, np.concatenate(idx, axis=2),
                                                 sm_scale, kv_format="latent", d_v=512,
                                                 attn_sink=sink)
        outs.append(ro)
        lses.append(rl)
    ro, rl = np.concatenate(outs), np.concatenate(lses)
    ro = np.where(np.isneginf(rl)[..., None], 0.0, ro)   # FlashMLA zeroes lonely rows after the sink
    return ro, rl


def _t(x, dtype=None):
    if x is None:
        return None
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    return t.to(DEVICE) if dtype is None else t.to(DEVICE, dtype)


def _check(out, lse, ref_out, ref_lse, q):
    b, s_q, h_q, _ = q.shape
    assert out.shape == (b, s_q, h_q, 512) and out.dtype == q.dtype
    assert lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32 and lse.is_contiguous()
    got_lse = compare.to_numpy(lse).transpose(0, 2, 1)
    assert (np.isposinf(got_lse) == np.isneginf(ref_lse)).all(), "+inf lse exactly on empty rows"
    got_lse = np.where(np.isposinf(got_lse), -np.inf, got_lse)
    compare.assert_pass(compare.check_mla(out, got_lse, ref_out, ref_lse,
                                          q_dtype=str(q.dtype).replace("torch.", "")))


def _run(seed, b, s_q, h_q, P, topk, d_qk, q_dtype, *, s_k=None, extra=None, sink=True,
         path="triton", **scope_kw):
    g = np.random.default_rng(seed)
    q = np.clip(g.standard_normal((b, s_q, h_q, d_qk)), -1, 1).astype(np.float32)
    qt = _t(q, q_dtype)
    q_ref = qt.float().cpu().numpy()
    scopes = [_gen_scope(g, b, s_q, s_k or 2 * topk, P, topk, d_qk, **scope_kw)]
    if extra is not None:
        eP, etopk, ekw = extra
        scopes.append(_gen_scope(g, b, s_q, 2 * etopk, eP, etopk, d_qk, strided=False, **ekw))
    sk = _sink(g, h_q) if sink else None
    sm_scale = d_qk ** -0.55
    meta, _ = flash_mla.get_mla_metadata()
    kw = {}
    if extra is not None:
        kw = dict(extra_k_cache=_t(scopes[1][0]), extra_indices_in_kvcache=_t(scopes[1][1]),
                  extra_topk_length=_t(scopes[1][2]))
    out, lse = flash_mla.flash_mla_with_kvcache(
        qt, _t(scopes[0][0]), None, None, 512, meta, None, sm_scale, False, True,
        _t(scopes[0][1]), _t(sk), topk_length=_t(scopes[0][2]), path=path, **kw)
    ro, rl = _reference(q_ref, scopes, sm_scale, sk)
    _check(out, lse, ro, rl, qt)
    return out, lse, rl


# ============================================================================ V3.2 (D_qk 576)

# (page size, s_q, h_q): every FlashMLA page size with both s_q and h_q from 8 to 128.
_V32 = [(2, 1, 8), (2, 3, 16), (53, 3, 8), (61, 1, 24), (61, 3, 8), (64, 1, 128), (64, 3, 16),
        (69, 1, 8), (69, 3, 64), (576, 1, 8), (576, 3, 16)]


@pytest.mark.parametrize("q_dtype", Q_DTYPE_PARAMS, ids=str)
@pytest.mark.parametrize("P,s_q,h_q", _V32)
def test_v32_sparse_decode(P, s_q, h_q, q_dtype):
    _run(P * 10 + s_q, 4, s_q, h_q, P, 64, 576, q_dtype, sink=False)


@pytest.mark.parametrize("corner", ["all_invalid", "zero_len", "sink"])
def test_v32_corner_cases(corner):
    kw = dict(all_invalid=corner == "all_invalid", zero_len=corner == "zero_len")
    _, lse, rl = _run(7, 4, 3, 16, 61, 64, 576, Q_DTYPES[0], sink=True, **kw)
    if corner != "sink":
        assert np.isneginf(rl).any(), "the case must hold an empty row"


def test_v32_contiguous_pages_and_torch_path():
    _run(3, 4, 2, 8, 64, 64, 576, Q_DTYPES[-1], sink=True, strided=False, path="torch")
    _run(3, 4, 2, 8, 64, 64, 576, Q_DTYPES[-1], sink=True, strided=True, path="torch")


@pytest.mark.cpu_heavy
def test_v32_batch_74():
    _run(74, 74, 1, 8, 64, 16, 576, torch.bfloat16 if CUDA else torch.float16, s_k=40, sink=True)


# ============================================================================ MODEL1 (D_qk 512)

# (main P, main topk, extra (P, topk) or None, topk_length, extra_topk_length)
_MODEL1 = [(64, 64, None, False, False), (2, 64, None, True, False), (61, 64, (53, 64), False, False),
           (69, 64, (2, 64), True, True), (64, 32, (64, 64), False, True)]


@pytest.mark.parametrize("q_dtype", Q_DTYPE_PARAMS, ids=str)
@pytest.mark.parametrize("P,topk,extra,tkl,etkl", _MODEL1)
def test_model1_sparse_decode(P, topk, extra, tkl, etkl, q_dtype):
    ex = None if extra is None else (extra[0], extra[1], dict(topk_len=etkl))
    _run(P + topk, 4, 3, 16, P, topk, 512, q_dtype, extra=ex, sink=True, topk_len=tkl)


@pytest.mark.parametrize("corner", ["all_invalid", "zero_len"])
def test_model1_two_caches_empty_rows(corner):
    kw = dict(all_invalid=corner == "all_invalid", zero_len=corner == "zero_len")
    _, _, rl = _run(11, 4, 3, 8, 61, 64, 512, Q_DTYPES[0], sink=True,
                    extra=(53, 64, dict(kw)), **kw)
    assert np.isneginf(rl).any()


def test_two_caches_equal_one_concatenated_cache():
    """extra_k_cache merged through the two LSEs equals one call over both rows (torch path,
    fp32, both through the compat entry point)."""
    g = np.random.default_rng(5)
    b, s_q, h, P = 2, 2, 8, 64
    q = _t(np.clip(g.standard_normal((b, s_q, h, 576)), -1, 1).astype(np.float32))
    a = _gen_scope(g, b, s_q, 128, P, 32, 576, strided=False, varlen=False)
    c = _gen_scope(g, b, s_q, 128, P, 32, 576, strided=False, varlen=False)
    sink = _t(_sink(g, h))
    meta, _ = flash_mla.get_mla_metadata()
    o2, l2 = flash_mla.flash_mla_with_kvcache(
        q, a[0], None, None, 512, meta, is_fp8_kvcache=True, indices=_t(a[1]),
        attn_sink=sink, extra_k_cache=c[0], extra_indices_in_kvcache=_t(c[1]),
        path="torch")
    both = torch.cat([a[0], c[0]])                                   # one cache, pages appended
    nslots = a[0].shape[0] * P
    idx = torch.cat([_t(a[1]), torch.where(_t(c[1]) >= 0, _t(c[1]) + nslots, -1)], 2)
    o1, l1 = flash_mla.flash_mla_with_kvcache(q, both, None, None, 512, flash_mla.get_mla_metadata()[0],
                                              is_fp8_kvcache=True, indices=idx.int(),
                                              attn_sink=sink, path="torch")
    torch.testing.assert_close(o2, o1, rtol=1e-5, atol=1e-6)   # fp32: merge vs one softmax
    torch.testing.assert_close(l2, l1, rtol=1e-6, atol=1e-6)


# ============================================================================ conventions

def test_strided_pages_are_not_copied(monkeypatch):
    """The cache handed to the native op shares the FlashMLA view's storage."""
    import torch_impl.compat.flash_mla as fm
    seen = []
    real = fm.sparse_mla_decode

    def spy(q, kv_cache, indices, sm_scale, **kw):
        seen.append(kv_cache.untyped_storage().data_ptr())
        return real(q, kv_cache, indices, sm_scale, **kw)

    monkeypatch.setattr(fm, "sparse_mla_decode", spy)
    g = np.random.default_rng(1)
    kc, idx, _, _ = _gen_scope(g, 2, 1, 64, 61, 16, 576, strided=True)
    q = torch.zeros((2, 1, 8, 576), dtype=torch.float32, device=DEVICE)
    fm.flash_mla_with_kvcache(q, kc, None, None, 512, fm.get_mla_metadata()[0], None, None, False,
                              True, _t(idx), path="torch")
    assert seen and all(p == kc.untyped_storage().data_ptr() for p in seen)


def _padded_model1(kc: torch.Tensor, pad: int) -> torch.Tensor:
    """A MODEL1 FlashMLA view ``[nb, P, 1, 584]`` over pages ``pad`` bytes further apart than
    FlashMLA's padded page (the extra bytes 0xFF: NaN if ever read)."""
    nb, P = kc.shape[:2]
    padded = np_formats.model1_page_bytes(P)
    pages = torch.as_strided(kc.view(torch.uint8), (nb, padded), (kc.stride(0), 1))
    pool = torch.full((nb, padded + pad), 0xFF, dtype=torch.uint8, device=kc.device)
    pool[:, :padded] = pages
    return torch.as_strided(pool.view(torch.float8_e4m3fn), (nb, P, 1, 584),
                            (padded + pad, 584, 584, 1))


@pytest.mark.parametrize("d_qk", [576, 512], ids=["v32", "model1"])
def test_strided_pages_run_the_native_kernel_in_place(d_qk, monkeypatch):
    """Padded pages (V3.2: FlashMLA's quantizer layout, pages of P + 1 rows sliced to P;
    MODEL1: pages 576 bytes further apart than the padded page) through the compat call: one
    native call on the strided view itself, with the caller's indices (no copy of the cache, no
    pass over the indices), so bitwise the compat call on a contiguous copy of the pages and
    the native op on the same strided cache (triton path: the same kernel and config)."""
    import torch_impl.compat.flash_mla as fm
    from torch_impl import sparse_mla_decode
    g = np.random.default_rng(23)
    b, s_q, h, P = 2, 1, 16, 16
    if d_qk == 576:
        kc, idx, tkl, rows = _gen_scope(g, b, s_q, 64, P, 32, 576, strided=True, topk_len=True)
        contig = kc.contiguous()
    else:
        contig, idx, tkl, rows = _gen_scope(g, b, s_q, 64, P, 32, 512, topk_len=True)
        kc = _padded_model1(contig, 576)
    assert not kc.is_contiguous()
    q = _t(np.clip(g.standard_normal((b, s_q, h, d_qk)), -1, 1).astype(np.float32), Q_DTYPES[0])
    it, tk = _t(idx), _t(tkl)
    seen = []
    real = fm.sparse_mla_decode

    def spy(q_, kv_cache, indices, sm_scale, **kw):
        seen.append((kv_cache.stride(0), kv_cache.data_ptr(), indices is it))
        return real(q_, kv_cache, indices, sm_scale, **kw)

    monkeypatch.setattr(fm, "sparse_mla_decode", spy)
    call = lambda cache: fm.flash_mla_with_kvcache(  # noqa: E731
        q, cache, None, None, 512, fm.get_mla_metadata()[0], None, None, False, True, it,
        topk_length=tk, path="triton")
    out, lse = call(kc)
    assert seen == [(kc.stride(0), kc.data_ptr(), True)]
    out_c, lse_c = call(contig)
    assert torch.equal(out, out_c) and torch.equal(lse, lse_c)
    native = fm._native_cache("k_cache", kc, d_qk, True, q.device)
    assert native[0].data_ptr() == kc.data_ptr() and not native[0].is_contiguous()
    out_n, lse_n = sparse_mla_decode(q, native[0], it, d_qk ** -0.5, kv_format=native[1],
                                     topk_length=tk, path="triton")
    lse_fm = torch.where(lse_n == float("-inf"), float("inf"), lse_n).transpose(1, 2)
    assert torch.equal(out, out_n) and torch.equal(lse, lse_fm)
    ro, rl = _reference(q.float().cpu().numpy(), [(kc, idx, tkl, rows)], d_qk ** -0.5, None)
    _check(out, lse, ro, rl, q)


def test_bad_page_strides_raise_naming_the_cache():
    """A page stride the kernels cannot read in place (not a multiple of 16 bytes, or pages
    overlapping) is a ValueError naming ``k_cache`` / ``extra_k_cache``, expected and got."""
    g = np.random.default_rng(29)
    kc, idx, _, _ = _gen_scope(g, 2, 1, 64, 16, 32, 576, strided=False)
    nb, P = kc.shape[:2]
    pool = torch.zeros((nb, P * 656 + 8), dtype=torch.uint8, device=DEVICE)
    odd = torch.as_strided(pool, (nb, P, 1, 656), (P * 656 + 8, 656, 656, 1))
    q = torch.zeros((2, 1, 8, 576), dtype=Q_DTYPES[0], device=DEVICE)
    call = flash_mla.flash_mla_with_kvcache
    fresh = lambda: flash_mla.get_mla_metadata()[0]  # noqa: E731
    with pytest.raises(ValueError, match=rf"^k_cache: expected a page stride .*multiple of 16 "
                                         rf"and at least the {P * 656} bytes.* got {P * 656 + 8}"):
        call(q, odd, None, None, 512, fresh(), is_fp8_kvcache=True, indices=_t(idx))
    overlap = torch.as_strided(kc, kc.shape, (P * 656 - 656, 656, 656, 1))
    with pytest.raises(ValueError,
                       match=rf"^k_cache: expected a page stride .* got {P * 656 - 656}"):
        call(q, overlap, None, None, 512, fresh(), is_fp8_kvcache=True, indices=_t(idx))
    with pytest.raises(ValueError, match=rf"^extra_k_cache: expected a page stride .* got "
                                         rf"{P * 656 + 8}"):
        call(q, kc, None, None, 512, fresh(), is_fp8_kvcache=True, indices=_t(idx),
             extra_k_cache=odd, extra_indices_in_kvcache=_t(idx))
    m1, idx1, _, _ = _gen_scope(g, 2, 1, 64, 16, 32, 512)
    pb = np_formats.model1_page_bytes(16)
    with pytest.raises(ValueError, match=rf"^k_cache: expected a page stride .* at least the "
                                         rf"{pb} bytes of one 'fp8_model1' page of P = 16 .* "
                                         rf"got {pb + 8}$"):
        call(q[..., :512], _padded_model1(m1, 8), None, None, 512, fresh(), is_fp8_kvcache=True,
             indices=_t(idx1))


def test_softmax_scale_default_and_metadata_forms():
    meta, none = flash_mla.get_mla_metadata()
    assert isinstance(meta, flash_mla.FlashMLASchedMeta) and none is None and not meta.have_initialized
    old, _ = flash_mla.get_mla_metadata(torch.ones(4, dtype=torch.int32), 128, 1, num_heads_q=128,
                                        is_fp8_kvcache=True, topk=2048)
    assert isinstance(old, flash_mla.FlashMLASchedMeta)
    g = np.random.default_rng(2)
    kc, idx, _, rows = _gen_scope(g, 2, 1, 64, 64, 32, 576, strided=False)
    q = _t(np.clip(g.standard_normal((2, 1, 8, 576)), -1, 1).astype(np.float32))
    out, lse = flash_mla.flash_mla_with_kvcache(q, kc, None, None, 512, meta, is_fp8_kvcache=True,
                                                indices=_t(idx), path="torch")
    assert meta.have_initialized and meta.config.topk == 32 and meta.config.h_q == 8
    ro, rl = _reference(q.cpu().numpy(), [(kc, idx, None, rows)], 576 ** -0.5, None)
    _check(out, lse, ro, rl, q)


def test_sched_meta_mismatch_and_bad_input():
    g = np.random.default_rng(4)
    kc, idx, _, _ = _gen_scope(g, 2, 1, 64, 64, 32, 576, strided=False)
    q = torch.zeros((2, 1, 8, 576), device=DEVICE)
    it = _t(idx)
    meta, _ = flash_mla.get_mla_metadata()
    call = flash_mla.flash_mla_with_kvcache
    call(q, kc, None, None, 512, meta, is_fp8_kvcache=True, indices=it, path="torch")
    with pytest.raises(ValueError, match="tile_scheduler_metadata.*h_q"):
        call(torch.zeros((2, 1, 16, 576), device=DEVICE), kc, None, None, 512, meta, is_fp8_kvcache=True,
             indices=it, path="torch")
    fresh = lambda: flash_mla.get_mla_metadata()[0]  # noqa: E731
    with pytest.raises(ValueError, match="k_cache.*656"):
        call(q, kc[..., :600], None, None, 512, fresh(),
             is_fp8_kvcache=True, indices=it)
    with pytest.raises(TypeError, match="indices"):
        call(q, kc, None, None, 512, fresh(), is_fp8_kvcache=True, indices=it.long())
    with pytest.raises(ValueError, match="head_dim_v"):
        call(q, kc, None, None, 576, fresh(), is_fp8_kvcache=True, indices=it)
    with pytest.raises(ValueError, match="num_splits"):
        call(q, kc, None, None, 512, fresh(), torch.zeros(1), is_fp8_kvcache=True, indices=it)
    with pytest.raises(TypeError, match="tile_scheduler_metadata"):
        call(q, kc, None, None, 512, None, is_fp8_kvcache=True, indices=it)
    with pytest.raises(TypeError, match="attn_sink"):
        call(q, kc, None, None, 512, fresh(), is_fp8_kvcache=True, indices=it,
             attn_sink=torch.zeros(8, dtype=torch.float16, device=DEVICE))


def test_not_provided_modes_raise():
    g = np.random.default_rng(6)
    kc, idx, _, _ = _gen_scope(g, 2, 1, 64, 64, 32, 576, strided=False)
    q = torch.zeros((2, 1, 8, 576), device=DEVICE)
    meta = flash_mla.get_mla_metadata()[0]
    with pytest.raises(NotImplementedError, match="dense decode"):
        flash_mla.flash_mla_with_kvcache(q, kc, torch.zeros((2, 1), dtype=torch.int32),
                                         torch.ones(2, dtype=torch.int32), 512, meta)
    with pytest.raises(NotImplementedError, match="causal"):
        flash_mla.flash_mla_with_kvcache(q, kc, None, None, 512, meta, causal=True,
                                         is_fp8_kvcache=True, indices=_t(idx))
    with pytest.raises(NotImplementedError, match="flash_mla_sparse_fwd"):
        flash_mla.flash_mla_sparse_fwd(q[:, 0], kc, _t(idx), 0.1)
    with pytest.raises(NotImplementedError, match="flash_attn_varlen_func"):
        flash_mla.flash_attn_varlen_func()


# ============================================================================ GPU: production shapes

gpu_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (bf16, production sizes)")


@gpu_only
@pytest.mark.parametrize("b", [74, 321])
def test_v32_production_shapes_gpu(b):
    """FlashMLA's V3.2 production case (h_q 128, topk 2048, s_q 2) at b 74 and 321, strided
    pages as FlashMLA's quantizer writes them."""
    _run(b, b, 2, 128, 64, 2048, 576, torch.bfloat16, s_k=2048, sink=False)


@gpu_only
@pytest.mark.parametrize("h_q", [64, 128])
def test_model1_production_shapes_gpu(h_q):
    """FlashMLA's MODEL1 CONFIG1 / CONFIG2 shape family: main cache P 256 topk 128, extra cache
    P 64 topk 512 with extra_topk_length, sink, b 74, s_q 2."""
    _run(h_q, 74, 2, h_q, 256, 128, 512, torch.bfloat16, s_k=1024, sink=True,
         extra=(64, 512, dict(topk_len=True)))


# ============================================================================ two caches: cancellation

def _cancelling_caches(b, P=16, n_rows=3, A=40.0, seed=21):
    """Two MODEL1 caches whose partial outputs nearly cancel (the mechanism of the bf16
    failure of ``compat_model1_two_caches`` on the H200, docs/COMPAT.md).

    Every used row of both caches has the same key (dims 0..63; q is 0 elsewhere), so every
    score of a query row is equal: p = 1 exactly in the kernels' 16-bit value dots and both
    caches weigh 1/2. The value signal lives in the bf16 rope dims 448..511: cache 0's rows are
    ``A + k/4`` and cache 1's rows ``-(A + k/4) - d/4`` (k, d small integers), so each cache's
    mean over its ``n_rows`` rows is ~A (a division by 3, not exact in fp16: rounding error up
    to 2^-6) while the merged value is ``-sum(d) / (8 n_rows)`` (at most 0.25).
    Returns (q float32 [b, 1, 8, 512], [(k_cache view, indices, None, _Rows)] x 2)."""
    g = np.random.default_rng(seed)
    h = 8
    key = np.clip(g.standard_normal(64), -2, 2) / 4
    rope0 = A + g.integers(0, 33, (b, n_rows, 64)) / 4
    rope1 = -rope0[:, ::-1] - g.integers(0, 3, (b, n_rows, 64)) / 4
    scopes = []
    for rope in (rope0, rope1):
        lat = np.zeros((1, P, 512), np.float32)
        idx = np.full((b, 1, 8), -1, np.int32)
        for i in range(b):
            rows = i * n_rows + np.arange(n_rows)
            lat[0, rows, :64] = key
            lat[0, rows, 448:] = rope[i]
            idx[i, 0, [1, 4, 6]] = rows                                       # -1 around them
        pages = t_formats.quantize_fp8_model1(torch.from_numpy(lat).to(DEVICE))   # [1, padded]
        unused = torch.ones(P, dtype=torch.bool, device=DEVICE)
        unused[: b * n_rows] = False
        pages[:, : P * 576].view(1, P, 576)[0, unused] = 0xFF                  # NaN, never read
        padded = pages.shape[1]
        kc = torch.as_strided(pages.view(torch.float8_e4m3fn), (1, P, 1, 584), (padded, 584, 584, 1))
        scopes.append((kc, idx, None, _Rows(pages.cpu().numpy(), 512, P)))
    q = np.zeros((b, 1, h, 512), np.float32)
    q[..., :64] = np.clip(g.standard_normal((b, 1, h, 64)), -1, 1)
    return q, scopes


@pytest.mark.parametrize("path", ["triton", "torch"])
def test_two_caches_cancelling_partials_fp16(path):
    """The two-cache merge of nearly cancelling partial outputs with fp16 q: the result meets
    SPEC's out bound against the float64 reference, where merging the partial outputs rounded
    to q's dtype (the old composition: two native calls, then the merge) misses it; two calls
    give the same bits."""
    from torch_impl import sparse_mla_decode
    b, q_dtype = 2, torch.float16
    q_np, scopes = _cancelling_caches(b)
    qt = _t(q_np, q_dtype)
    sm_scale = 512 ** -0.55
    sink = np.array([0.0, 1.5, -2.0, 3.0, -np.inf, 0.5, -1.0, 2.0], np.float32)
    ro, rl = _reference(qt.float().cpu().numpy(), scopes, sm_scale, sink)
    fm = lambda: flash_mla.flash_mla_with_kvcache(  # noqa: E731
        qt, scopes[0][0], None, None, 512, flash_mla.get_mla_metadata()[0], None, sm_scale,
        False, True, _t(scopes[0][1]), _t(sink), extra_k_cache=scopes[1][0],
        extra_indices_in_kvcache=_t(scopes[1][1]), path=path)
    out, lse = fm()
    # the case is what it claims: large partials of opposite sign, a small merged value
    parts = [sparse_mla_decode(qt, flash_mla._native_cache("k_cache", sc[0], 512, True, qt.device)[0],
                               _t(sc[1]), sm_scale, kv_format="fp8_model1", d_v=512, path=path)
             for sc in scopes]                      # the old composition's two native calls
    (o0, l0), (o1, l1) = parts
    assert (o0[..., 448:].float() > 30).all() and (o1[..., 448:].float() < -30).all()
    assert np.abs(ro[..., 448:]).max() <= 0.25 and np.abs(ro[..., 448:]).max() > 0.01
    _check(out, lse, ro, rl, qt)            # the fp32-partials merge: within SPEC
    # the old merge of rounded partials (float64 arithmetic, so only the rounding of the
    # partials to fp16 differs): outside SPEC's out bound on the cancelling dims
    l0d, l1d = l0.double().cpu().numpy(), l1.double().cpu().numpy()
    m = np.maximum(l0d, l1d)
    w0, w1 = np.exp(l0d - m), np.exp(l1d - m)
    lse_old = m + np.log(w0 + w1)
    old = (o0.double().cpu().numpy() * w0[..., None] + o1.double().cpu().numpy() * w1[..., None])
    old = old / (w0 + w1)[..., None] / (1.0 + np.exp(sink.astype(np.float64) - lse_old))[..., None]
    old = torch.from_numpy(old).to(q_dtype)
    res_old = compare.check_mla(old, lse_old, ro, rl, q_dtype="float16")
    assert not res_old.passed and res_old.ratio > 4, res_old.message     # CPU: ~10
    res_new = compare.check_mla(out, np.where(np.isposinf(compare.to_numpy(lse)), -np.inf,
                                              compare.to_numpy(lse)).transpose(0, 2, 1),
                                ro, rl, q_dtype="float16")
    assert res_new.ratio < 0.25, res_new.message                            # CPU: ~0.03
    # same inputs, same bits (out and lse), and out= written in place gives them too
    out2, lse2 = fm()
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), lse2.view(torch.int32))
    dst = torch.full_like(out, float("nan"))
    out3, _ = flash_mla.flash_mla_with_kvcache(
        qt, scopes[0][0], None, None, 512, flash_mla.get_mla_metadata()[0], None, sm_scale,
        False, True, _t(scopes[0][1]), _t(sink), extra_k_cache=scopes[1][0],
        extra_indices_in_kvcache=_t(scopes[1][1]), out=dst, path=path)
    assert out3 is dst and torch.equal(dst.view(torch.int16), out.view(torch.int16))


@pytest.mark.parametrize("path", ["triton", "torch"])
def test_two_caches_strided_v32_pages(path):
    """Two V3.2 caches in FlashMLA's quantizer layout (pages of P + 1 rows sliced to P, so
    strided): each is read in place by the native op and both go through the one float32
    merge: the float64 reference."""
    g = np.random.default_rng(17)
    b, s_q, h = 2, 2, 8
    q = np.clip(g.standard_normal((b, s_q, h, 576)), -1, 1).astype(np.float32)
    qt = _t(q, Q_DTYPES[0])
    sc = [_gen_scope(g, b, s_q, 96, 61, 32, 576, strided=True, topk_len=True),
          _gen_scope(g, b, s_q, 64, 16, 32, 576, strided=True)]
    assert all(not c[0].is_contiguous() for c in sc)
    sink = _sink(g, h)
    sm_scale = 576 ** -0.55
    out, lse = flash_mla.flash_mla_with_kvcache(
        qt, sc[0][0], None, None, 512, flash_mla.get_mla_metadata()[0], None, sm_scale, False,
        True, _t(sc[0][1]), _t(sink), extra_k_cache=sc[1][0],
        extra_indices_in_kvcache=_t(sc[1][1]), topk_length=_t(sc[0][2]), path=path)
    ro, rl = _reference(qt.float().cpu().numpy(), sc, sm_scale, sink)
    _check(out, lse, ro, rl, qt)


def test_launch_sources_split_offsets():
    """``triton_launch.launch_sources``: each source's splits land after the previous sources'
    in one partial buffer (forced split counts 2 and 3, different page sizes and topk), one
    combine over all of them: the float64 reference of one softmax over both caches, with the
    sink once; equal within float32 to the default split counts, bitwise repeatable."""
    from kernels.sparse_mla import triton_launch
    from torch_impl import sparse_mla as tsm
    if not CUDA and not tsm._common.interpret_mode():
        pytest.skip("Triton cannot run here")
    g = np.random.default_rng(31)
    b, s_q, h = 2, 2, 16
    q_dtype = Q_DTYPES[0]
    q = np.clip(g.standard_normal((b, s_q, h, 512)), -1, 1).astype(np.float32)
    qt = _t(q, q_dtype)
    sc = [_gen_scope(g, b, s_q, 128, 61, 64, 512, topk_len=True, strided=False),
          _gen_scope(g, b, s_q, 96, 16, 48, 512, strided=False)]
    sink = _sink(g, h)
    sm_scale = 512 ** -0.55
    dev = tsm._common.device_info(qt.device)

    def run(splits):
        srcs = []
        for (kc, idx, tkl, _), ns in zip(sc, splits):
            cache, fmt = flash_mla._native_cache("k_cache", kc, 512, True, qt.device)
            P = kc.shape[1]
            cfg = tsm._triton_config(dev, qt, cache, fmt, idx.shape[2], None)
            srcs.append(triton_launch.Source(cache, _t(idx), fmt, P, kc.shape[0], cfg, None,
                                             _t(tkl), ns))
        return triton_launch.launch_sources(qt, srcs, sm_scale, 512, _t(sink).clamp(min=-3e38),
                                            num_sms=dev.num_sms, smem_per_block=dev.smem_per_block)

    out, lse = run((2, 3))
    ro, rl = _reference(qt.float().cpu().numpy(), sc, sm_scale, sink)
    compare.assert_pass(compare.check_mla(out, compare.to_numpy(lse), ro, rl,
                                          q_dtype=str(q_dtype).replace("torch.", "")))
    out2, lse2 = run((2, 3))
    assert torch.equal(out.view(torch.int16 if out.element_size() == 2 else torch.int32),
                       out2.view(torch.int16 if out.element_size() == 2 else torch.int32))
    assert torch.equal(lse.view(torch.int32), lse2.view(torch.int32))
    o1, l1 = run((None, None))
    # other split counts give float32 results that differ in the last float32 bits; each is
    # rounded once to q's dtype, so the outputs may differ by one ulp of that dtype (bf16 on the
    # GPU: 2^-7 relative; measured 0.0077 on the H200) and no more
    torch.testing.assert_close(o1.float(), out.float(), rtol=torch.finfo(out.dtype).eps,
                               atol=1e-4, equal_nan=True)
    torch.testing.assert_close(l1, lse, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_sources_bad_input():
    """``sparse_mla_decode_sources`` names the source of a bad argument."""
    from torch_impl.sparse_mla import KVSource, sparse_mla_decode_sources
    q = torch.zeros((2, 1, 8, 512), device=DEVICE)
    pages = torch.zeros((1, np_formats.model1_page_bytes(16)), dtype=torch.uint8, device=DEVICE)
    idx = torch.zeros((2, 1, 4), dtype=torch.int32, device=DEVICE)
    ok = KVSource(pages, idx, "fp8_model1")
    with pytest.raises(TypeError, match=r"sources\[1\]\.indices"):
        sparse_mla_decode_sources(q, [ok, KVSource(pages, idx.long(), "fp8_model1")], 0.1)
    with pytest.raises(ValueError, match=r"sources\[0\]\.kv_cache"):
        sparse_mla_decode_sources(q, [KVSource(pages[:, :-1], idx, "fp8_model1"), ok], 0.1)
    with pytest.raises(ValueError, match="sources: expected at least one"):
        sparse_mla_decode_sources(q, [], 0.1)
    with pytest.raises(TypeError, match="sources"):
        sparse_mla_decode_sources(q, ok, 0.1)
    with pytest.raises(ValueError, match="out"):
        sparse_mla_decode_sources(q, [ok, ok], 0.1, out=torch.zeros((2, 1, 8, 256), device=DEVICE))


# ============================================================================ bad input, named

def _small_v32(seed=6):
    g = torch.Generator().manual_seed(seed)
    kc = t_formats.quantize_fp8_ds_mla(torch.randn(2, 16, 576, generator=g)).unsqueeze(2).to(DEVICE)
    q = torch.randn(1, 1, 16, 576, generator=g).to(DEVICE)
    idx = torch.tensor([[[0, 5, 17, -1]]], dtype=torch.int32, device=DEVICE)
    return q, kc, idx


@pytest.mark.parametrize("two", [False, True], ids=["one_cache", "two_caches"])
def test_out_dtype_must_be_the_output_dtype(two):
    """out= of another dtype than the output (q's) is refused, not cast; a correct one is
    written in place and returned."""
    q, kc, idx = _small_v32()
    extra = dict(extra_k_cache=kc, extra_indices_in_kvcache=idx) if two else {}
    call = lambda **kw: flash_mla.flash_mla_with_kvcache(  # noqa: E731
        q, kc, None, None, 512, flash_mla.get_mla_metadata()[0], is_fp8_kvcache=True,
        indices=idx, path="torch", **extra, **kw)
    for dt in (torch.int32, torch.float16 if q.dtype != torch.float16 else torch.float32):
        with pytest.raises(TypeError, match=rf"out: expected dtype in \['{q.dtype}'\], got {dt}"):
            call(out=torch.empty((1, 1, 16, 512), dtype=dt, device=DEVICE))
    with pytest.raises(ValueError, match="out: expected shape"):
        call(out=torch.empty((1, 1, 16, 256), dtype=q.dtype, device=DEVICE))
    ref, ref_lse = call()
    buf = torch.full((1, 1, 16, 512), 7.0, dtype=q.dtype, device=DEVICE)
    o, lse = call(out=buf)
    assert o is buf
    torch.testing.assert_close(buf, ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
    strided = torch.full((1, 1, 16, 1024), 7.0, dtype=q.dtype, device=DEVICE)[..., ::2]
    o, _ = call(out=strided)
    assert o is strided
    torch.testing.assert_close(strided, ref, rtol=0, atol=0)


def test_native_errors_name_the_flash_mla_arguments():
    """Errors the native op raises name flash_mla_with_kvcache's arguments (softmax_scale, not
    sm_scale; extra_indices_in_kvcache, not sources[1].indices)."""
    q, kc, idx = _small_v32()
    call = lambda **kw: flash_mla.flash_mla_with_kvcache(  # noqa: E731
        q, kc, None, None, 512, flash_mla.get_mla_metadata()[0], **dict(
            dict(is_fp8_kvcache=True, indices=idx, path="torch"), **kw))
    with pytest.raises(ValueError, match=r"^softmax_scale: expected a finite value, got nan"):
        call(softmax_scale=float("nan"))
    with pytest.raises(TypeError, match=r"^softmax_scale: expected a real number.*got str"):
        call(softmax_scale="0.1")
    for two in (False, True):
        extra = dict(extra_k_cache=kc, extra_indices_in_kvcache=idx) if two else {}
        with pytest.raises(ValueError, match=r"^softmax_scale:"):
            call(softmax_scale=float("inf"), **extra)
        with pytest.raises(ValueError, match=r"^indices: expected shape \(1, 1, K >= 1\)"):
            call(indices=idx[..., :0], **extra)
    with pytest.raises(ValueError, match=r"^extra_indices_in_kvcache: expected shape"):
        call(extra_k_cache=kc, extra_indices_in_kvcache=idx[..., :0])
