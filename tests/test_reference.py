"""The float64 reference checked against hand-computed cases and independent formulations
(dense softmax over a mask, a sort-based top-k); one named test per SPEC.md corner case."""
import math

import numpy as np
import pytest

from kernels import cases, compare, formats, reference


# ----------------------------------------------------------------------------- sparse MLA

def _dense_mla(case):
    """Independent formulation: dense scores over every slot, weighted by how many times each
    slot occurs among the entries that count (validity decided by explicit loops)."""
    rows = formats.dequantize_kv(case.kv_cache, case.kv_format)
    P = formats.kv_page_size(case.kv_cache, case.kv_format)
    nslots = rows.shape[0]
    q = np.asarray(case.q).astype(np.float64)
    B, N, H, D = q.shape
    out = np.zeros((B, N, H, case.d_v))
    lse = np.full((B, N, H), -np.inf)
    for b in range(B):
        for i in range(N):
            count = np.zeros(nslots)
            for t, j in enumerate(case.indices[b, i]):
                j = int(j)
                if case.topk_length is not None and t >= case.topk_length[b]:
                    continue
                if case.block_table is not None:
                    bt = case.block_table[b]
                    if j < 0 or j >= bt.size * P or bt[j // P] < 0:
                        continue
                    j = int(bt[j // P]) * P + j % P
                if 0 <= j < nslots:
                    count[j] += 1
            if not count.any():
                continue
            sel = count > 0
            s = case.sm_scale * q[b, i] @ rows[sel, :D].T
            w = count[sel] * np.exp(s)
            lse[b, i] = np.log(w.sum(-1))
            out[b, i] = (w / w.sum(-1, keepdims=True)) @ rows[sel, :case.d_v]
    if case.attn_sink is not None:
        # SPEC: a sink of -inf counts as the most negative float32
        sink = np.where(case.attn_sink == -np.inf, np.finfo(np.float32).min, case.attn_sink)
        with np.errstate(over="ignore"):
            out *= (1 / (1 + np.exp(sink.astype(np.float64)[None, None] - lse)))[..., None]
    return out, lse


def test_mla_by_hand():
    kv = np.array([[[1.0, 0.0], [0.0, 1.0]]], np.float32)        # 1 page, P=2, D=2
    q = np.array([[[[1.0, 0.0]]]], np.float32)
    out, lse = reference.sparse_mla_decode(q, kv, np.array([[[0, 1]]], np.int32), 1.0, d_v=2)
    e = math.e
    np.testing.assert_allclose(lse[0, 0, 0], math.log(e + 1), rtol=1e-15)
    np.testing.assert_allclose(out[0, 0, 0], [e / (e + 1), 1 / (e + 1)], rtol=1e-15)


def test_mla_duplicates_count_per_occurrence_by_hand():
    kv = np.array([[[1.0, 0.0], [0.0, 1.0]]], np.float32)
    q = np.array([[[[1.0, 0.0]]]], np.float32)
    out, lse = reference.sparse_mla_decode(q, kv, np.array([[[0, 0, 1]]], np.int32), 1.0, d_v=2)
    e = math.e
    np.testing.assert_allclose(lse[0, 0, 0], math.log(2 * e + 1), rtol=1e-15)
    np.testing.assert_allclose(out[0, 0, 0], [2 * e / (2 * e + 1), 1 / (2 * e + 1)], rtol=1e-15)


def test_mla_empty_row_is_zero_and_minus_inf():
    kv = np.ones((1, 4, 8), np.float32)
    q = np.ones((1, 1, 2, 8), np.float32)
    out, lse = reference.sparse_mla_decode(q, kv, np.full((1, 1, 3), -1, np.int32), 0.1, d_v=4,
                                           attn_sink=np.zeros(2, np.float32))
    assert (out == 0).all() and np.isneginf(lse).all()


def test_mla_attn_sink_by_hand():
    kv = np.array([[[2.0, 3.0]]], np.float32)
    q = np.array([[[[0.5, 0.0]]]], np.float32)
    out, lse = reference.sparse_mla_decode(q, kv, np.array([[[0]]], np.int32), 1.0, d_v=2,
                                           attn_sink=np.array([0.25], np.float32))
    assert lse[0, 0, 0] == pytest.approx(1.0)                       # lse excludes the sink
    np.testing.assert_allclose(out[0, 0, 0], np.array([2.0, 3.0]) / (1 + math.exp(0.25 - 1.0)))


def test_mla_invalid_indices_never_dereferenced():
    # every slot the indices do not select holds NaN; out-of-range indices would read past the
    # buffer; neither may show up in the result.
    c = cases.make_mla_case(3, invalid="mix", nan_unselected=True)
    out, lse = c.reference()
    assert np.isfinite(out).all() and not np.isnan(lse).any()


@pytest.mark.parametrize("case", cases.mla_corner_cases(0, d_qk=576, kv_format="latent")
                         + cases.mla_corner_cases(1, d_qk=576, kv_format="fp8_ds_mla")
                         + cases.mla_corner_cases(2, d_qk=512, kv_format="fp8_model1"),
                         ids=lambda c: c.name)
def test_mla_corner_cases_vs_dense_formulation(case):
    out, lse = case.reference()
    d_out, d_lse = _dense_mla(case)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(d_lse))
    fin = np.isfinite(d_lse)
    np.testing.assert_allclose(lse[fin], d_lse[fin], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out, d_out, rtol=1e-10, atol=1e-12)
    assert (out[np.isneginf(d_lse)] == 0).all()


def test_lse_combine_equals_single_pass():
    c = cases.make_mla_case(5, B=2, N=2, H=8, K=96, invalid="random")
    out, lse = c.reference()
    parts = [replace_indices(c, c.indices[..., s:s + 32]) for s in range(0, 96, 32)]
    po, pl_ = zip(*(p.reference() for p in parts))
    m_out, m_lse = reference.lse_combine(np.stack(po), np.stack(pl_))
    np.testing.assert_allclose(m_lse, lse, rtol=1e-12)
    np.testing.assert_allclose(m_out, out, rtol=1e-10, atol=1e-12)


def replace_indices(case, idx):
    from dataclasses import replace
    return replace(case, indices=np.ascontiguousarray(idx))


# ----------------------------------------------------------------------------- indexer

def _loop_logits(case):
    """Independent formulation: explicit loops over requests, drafts and positions."""
    q = np.asarray(case.q).astype(np.float64)
    B, N, H, D = q.shape
    if case.k_format == "fp8_indexer":
        k = formats.dequantize_fp8_indexer(case.k_cache, D).astype(np.float64)
        _, sc = formats.split_fp8_indexer(case.k_cache, D)
        kraw = k / sc[..., None]
    else:
        kraw = np.asarray(case.k_cache).astype(np.float64)
        sc = np.ones(kraw.shape[:2])
    num_pages, P = sc.shape
    W = case.block_table.shape[1] * P
    out = np.full((B, N, W), -np.inf)
    cl = np.asarray(case.context_lens)
    for b in range(B):
        for i in range(N):
            L = cl[b, i] if cl.ndim == 2 else cl[b] - (N - 1 - i)
            for j in range(min(max(L, 0), W)):
                page = case.block_table[b, j // P]
                if page < 0 or page >= num_pages:
                    continue
                kk, s = kraw[page, j % P], sc[page, j % P]
                with np.errstate(invalid="ignore"):
                    out[b, i, j] = s * sum(case.weights[b, i, h] * max(q[b, i, h] @ kk, 0.0)
                                           if not np.isnan(q[b, i, h] @ kk) else np.nan for h in range(H))
    return out


def _sorted_topk(row, k):
    cand = [(-v, j) for j, v in enumerate(row) if not np.isnan(v) and v != -np.inf]
    sel = [j for _, j in sorted(cand)[:k]]
    return np.array(sel + [-1] * (k - len(sel)), np.int32)


def test_indexer_by_hand():
    # one request, P=2, D_I=2, two heads; scores computed by hand
    q = np.array([[[[1.0, 0.0], [0.0, 2.0]]]], np.float32)
    w = np.array([[[0.5, 1.0]]], np.float32)
    k = np.array([[[1.0, 1.0], [-1.0, 3.0]], [[2.0, -1.0], [9.0, 9.0]]], np.float32)
    bt = np.array([[1, 0]], np.int32)                 # logical page 0 -> physical 1
    lg = reference.indexer_logits(q, w, k, bt, np.array([3], np.int32), k_format="dense")
    # j=0: k=[2,-1]: 0.5*relu(2) + 1*relu(-2) = 1 ; j=1: [9,9]: 4.5 + 18 = 22.5 ; j=2: [1,1]: 0.5+2
    np.testing.assert_allclose(lg[0, 0], [1.0, 22.5, 2.5, -np.inf])
    np.testing.assert_array_equal(reference.topk_from_logits(lg, 2)[0, 0], [1, 2])


def test_indexer_mtp_mask_by_hand():
    lens = reference.valid_lengths(np.array([10, 1], np.int32), 2, 3)
    np.testing.assert_array_equal(lens, [[8, 9, 10], [0, 0, 1]])
    two_d = np.array([[4, 5, 6], [1, 1, 1]], np.int32)
    np.testing.assert_array_equal(reference.valid_lengths(two_d, 2, 3), two_d)
    with pytest.raises(ValueError, match="context_lens"):
        reference.valid_lengths(np.zeros((3,), np.int32), 2, 3)


def test_topk_tie_rule_and_specials_by_hand():
    row = np.array([1.0, 3.0, np.nan, 3.0, -np.inf, np.inf, 1.0, 0.5])
    np.testing.assert_array_equal(reference.topk_from_logits(row[None], 4)[0], [5, 1, 3, 0])
    np.testing.assert_array_equal(reference.topk_from_logits(row[None], 8)[0], [5, 1, 3, 0, 6, 7, -1, -1])
    assert (reference.topk_from_logits(np.full((1, 5), -np.inf), 3) == -1).all()


@pytest.mark.parametrize("case", cases.indexer_corner_cases(0), ids=lambda c: c.name)
def test_indexer_corner_cases_vs_loops_and_sorted_topk(case):
    lg = case.reference_logits()
    np.testing.assert_allclose(lg, _loop_logits(case), rtol=1e-12, atol=1e-12)
    got = case.reference()
    want = np.stack([_sorted_topk(r, case.topk) for r in lg.reshape(-1, lg.shape[-1])]).reshape(got.shape)
    np.testing.assert_array_equal(got, want)
    # every emitted index is a valid position of its draft, whatever the cache holds beyond L_b
    lens = reference.valid_lengths(case.context_lens, *case.q.shape[:2])
    assert ((got == -1) | ((got >= 0) & (got < lens[..., None]))).all()
    compare.assert_pass(compare.check_topk(got, lg, case.topk, sorted=True))


def test_stale_values_are_larger_than_any_valid_logit():
    # the stale pages must be tempting: if the mask were dropped they would win
    c = cases.make_indexer_case(4, lens=[40, 70], P=16, topk=8, stale=True)
    lg = c.reference_logits()
    P = 16
    from dataclasses import replace
    unmasked = replace(c, context_lens=np.full(2, c.block_table.shape[1] * P, np.int32))
    lg_all = unmasked.reference_logits()
    for b, L in enumerate([40, 70]):
        assert np.nanmax(lg_all[b, 0, L:][np.isfinite(lg_all[b, 0, L:])]) > np.nanmax(lg[b, 0, :L])


def test_ties_reach_the_threshold():
    c = cases.make_indexer_case(7, lens=[256, 200], P=16, topk=32, ties=True)
    lg = c.reference_logits()
    sel = c.reference()
    for b in range(2):
        thr = lg[b, 0, sel[b, 0, -1]]
        assert (lg[b, 0] == thr).sum() > 1          # the threshold sits inside a tie group


# ----------------------------------------------------------------------------- compare helpers

def test_check_topk_rejects_wrong_sets_and_accepts_subulp_swaps():
    row = np.array([[5.0, 4.0, 3.0, 3.0 + 1e-12, 1.0, -np.inf, np.nan]])
    ok = compare.check_topk(np.array([[0, 1, 3]]), row, 3)
    assert ok.passed and ok.message == ""
    near = compare.check_topk(np.array([[0, 1, 2]]), row, 3)       # sub-ulp swap at threshold
    assert near.passed and "near-ties" in near.message
    assert not compare.check_topk(np.array([[0, 1, 4]]), row, 3).passed
    assert not compare.check_topk(np.array([[0, 1, 5]]), row, 3).passed      # -inf selected
    assert not compare.check_topk(np.array([[0, 1, 6]]), row, 3).passed      # NaN selected
    assert not compare.check_topk(np.array([[0, 0, 1]]), row, 3).passed      # repeat
    assert compare.check_topk(np.array([[3, 1, 0, 2, 4, -1, -1]]), row, 7).passed
    assert not compare.check_topk(np.array([[3, 1, 0, 2, -1, 4, -1]]), row, 7, sorted=True).passed
    assert not compare.check_topk(np.array([[1, 0, 3, 2, 4, -1, -1]]), row, 7, sorted=True).passed


def test_check_mla_explains_failures():
    ref_out = np.ones((1, 1, 2, 4))
    ref_lse = np.array([[[0.5, -np.inf]]])
    ref_out[0, 0, 1] = 0
    assert compare.check_mla(ref_out.astype(np.float32), ref_lse.astype(np.float32), ref_out, ref_lse).passed
    bad = ref_out.copy()
    bad[0, 0, 0, 2] = 1.1
    r = compare.check_mla(bad, ref_lse, ref_out, ref_lse)
    assert not r.passed and "(0, 0, 0, 2)" in r.message
    r = compare.check_mla(ref_out, np.array([[[0.5, 0.0]]]), ref_out, ref_lse)
    assert not r.passed and "-inf pattern" in r.message
    nz = ref_out.copy()
    nz[0, 0, 1, 0] = 1e-9
    assert not compare.check_mla(nz, ref_lse, ref_out, ref_lse).passed
