"""jax_impl.step / jax_impl.tp: the composed decode step on one device and under ``jax.shard_map``
(4 and 8 fake CPU devices from tests/conftest.py, Pallas in interpret mode; the same bodies on
GPUs).

Checks: the single-device step against the float64 reference (top-k as exact sets by
``check_topk`` with ``sorted=True``; out / lse by ``check_mla`` against the reference fed the
step's own indices); the sharded step in both indexer modes against the single-device step
(indices bitwise, out / lse within SPEC tolerance, and bitwise between the two modes); the
candidate merge of the sequence-sharded top-k against ``topk_from_logits`` on rows full of
ties, NaN, -inf and -0.0; set-up errors (heads not divisible by tp); the scalar rule shared with
torch_impl (sm_scale / topk / d_v named TypeError / ValueError before tracing, NumPy scalars
accepted bit for bit like Python ones).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tp_worker import make_step_case
from conftest import HAS_CUDA
from jax_impl import tp
from jax_impl.step import dsa_decode_step
from kernels import compare, reference

STEP_CASES = {
    # 16 heads: 4 per device at TP 4, 2 at TP 8 (below the dot tile: the launcher pads)
    # block table 4x wider than the longest request: the sequence split follows each request's
    # own length, not the table's columns
    "ds_mla_ties_len0": dict(seed=1, B=3, H=16, lens=[0, 300, 130], ties=True, table_len=1280),
    # V4-Flash-like: fp8_model1 (D_qk 512), attention sink, MTP N=2; 32 heads = 8 per rank at
    # TP 4, as V4-Flash's 64 heads at TP 8
    "model1_mtp2_sink_nan_negpages": dict(seed=2, B=2, N=2, H=32, d_qk=512, kv_format="fp8_model1",
                                          q_dtype="float32", lens=[200, 257], attn_sink=True,
                                          nan_rows=True, neg_pages=True),
}
if HAS_CUDA:
    STEP_CASES["ds_mla_bf16"] = dict(seed=4, B=2, H=16, q_dtype="bfloat16", lens=[300, 200])


def _needs_devices(n):
    return pytest.mark.skipif(len(jax.devices()) < n, reason=f"needs {n} JAX devices")


def _arrays(c):
    return [jnp.asarray(a) for a in (c.q, c.kv_cache, c.idx_q, c.idx_weights, c.k_cache,
                                     c.block_table, c.context_lens)]


def _sink(c):
    return None if c.attn_sink is None else jnp.asarray(c.attn_sink)


@functools.lru_cache(maxsize=None)
def _single(name, path):
    c = make_step_case(**STEP_CASES[name])
    out, lse, idx = dsa_decode_step(*_arrays(c), c.sm_scale, c.topk, kv_format=c.kv_format,
                                    d_v=c.d_v, attn_sink=_sink(c), path=path)
    return c, compare.to_numpy(out), np.asarray(lse), np.asarray(idx)


@pytest.mark.parametrize("name,path", [("ds_mla_ties_len0", "pallas"), ("ds_mla_ties_len0", "xla"),
                                       ("model1_mtp2_sink_nan_negpages", "xla")]
                         + ([("ds_mla_bf16", "pallas")] if HAS_CUDA else []))
def test_step_single_device(name, path):
    c, out, lse, idx = _single(name, path)
    compare.assert_pass(compare.check_topk(idx, c.reference_logits(), c.topk, sorted=True))
    ref_out, ref_lse = c.reference_mla(idx)
    compare.assert_pass(compare.check_mla(out, lse, ref_out, ref_lse, q_dtype=c.params["q_dtype"]))


@pytest.mark.parametrize("tp_size,name,path", [
    # 2 heads per device: the Pallas sparse-MLA launcher pads heads to its dot tile
    pytest.param(8, "ds_mla_ties_len0", "pallas", marks=_needs_devices(8)),
    pytest.param(4, "model1_mtp2_sink_nan_negpages", "xla", marks=_needs_devices(4)),
    pytest.param(2, "ds_mla_ties_len0", "xla", marks=_needs_devices(2)),
    pytest.param(1, "ds_mla_ties_len0", "xla"),
] + ([pytest.param(8, "ds_mla_bf16", "pallas", marks=_needs_devices(8))] if HAS_CUDA else []))
def test_tp_both_modes_equal_single_device(tp_size, name, path):
    c, out, lse, idx = _single(name, path)
    mesh = tp.make_tp_mesh(tp_size)
    res = {}
    for mode in tp.INDEXER_MODES:
        o, l, i = tp.dsa_decode_step_tp(mesh, *_arrays(c), c.sm_scale, c.topk,
                                        kv_format=c.kv_format, d_v=c.d_v, attn_sink=_sink(c),
                                        indexer_mode=mode, path=path)
        if tp_size > 1:
            assert o.sharding.spec[2] == "tp"                       # head-sharded output
        res[mode] = (compare.to_numpy(o), np.asarray(l), np.asarray(i))
        np.testing.assert_array_equal(res[mode][2], idx, err_msg=f"{mode} indices")
        compare.assert_pass(compare.check_mla(res[mode][0], res[mode][1], out, lse,
                                              q_dtype=c.params["q_dtype"]))
    # same indices -> the same per-device kernel launches -> bitwise identical outputs
    np.testing.assert_array_equal(res["replicated"][0], res["sequence"][0])
    np.testing.assert_array_equal(res["replicated"][1], res["sequence"][1])


@pytest.mark.parametrize("tp_size", [1, 2, 4, 8])
def test_sequence_merge_matches_reference_topk(tp_size):
    """Per-shard local top-K + merge of the gathered candidates == exact SPEC top-k."""
    rng = np.random.default_rng(tp_size)
    R, W, K = 6, 200, 24
    rows = rng.choice(np.array([1.5, 0.0, -0.0, 2.0, -1.0, 3.0], np.float32), size=(R, W))
    rows[0, ::3] = np.nan
    rows[1, 50:] = -np.inf
    rows[2, :] = -np.inf                                  # nothing qualifies
    rows[3, 7] = np.inf
    rows[4] = rng.standard_normal(W).astype(np.float32)   # no ties
    rows[5, : W - 5] = np.nan                              # fewer than K qualify
    per = -(-W // tp_size)
    padded = np.full((R, per * tp_size), -np.inf, np.float32)
    padded[:, :W] = rows
    scores, positions = [], []
    for r in range(tp_size):
        pos = np.broadcast_to(np.arange(r * per, (r + 1) * per, dtype=np.int32), (R, per))
        s, p = tp.merge_candidates(jnp.asarray(padded[:, r * per:(r + 1) * per]), jnp.asarray(pos), K)
        scores.append(s)
        positions.append(p)
    _, merged = tp.merge_candidates(jnp.concatenate(scores, -1), jnp.concatenate(positions, -1), K)
    np.testing.assert_array_equal(np.asarray(merged), reference.topk_from_logits(rows.astype(np.float64), K))


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shard_block_table_splits_each_request_evenly(world):
    P, max_pages = 16, 40
    lens = np.array([[0, 0], [1, 3], [17, 17], [100, 101], [640, 640]], np.int32)
    bt = np.arange(5 * max_pages, dtype=np.int32).reshape(5, max_pages)
    seen = [[] for _ in range(5)]
    for r in range(world):
        bt_l, ll, off = (np.asarray(a) for a in tp.shard_block_table(jnp.asarray(bt), jnp.asarray(lens), P,
                                                                     jnp.int32(r), world))
        assert bt_l.shape == (5, -(-max_pages // world))
        for b in range(5):
            n_b = -(-int(lens[b].max()) // P)
            s_b = -(-n_b // world)
            pages = bt_l[b][bt_l[b] >= 0].tolist()
            assert len(pages) <= s_b                                   # balanced share
            assert int(off[b]) == r * s_b * P
            np.testing.assert_array_equal(ll[b], np.clip(lens[b] - off[b], 0, s_b * P))
            seen[b] += pages
    for b in range(5):   # the shares tile exactly the request's own pages, in order
        assert seen[b] == bt[b, : -(-int(lens[b].max()) // P)].tolist()


@_needs_devices(8)
def test_setup_errors():
    c = make_step_case(0, B=1, H=12, lens=[70])
    mesh = tp.make_tp_mesh(8)
    with pytest.raises(ValueError, match=r"heads: 12 .*tp=8"):
        tp.dsa_decode_step_tp(mesh, *_arrays(c), c.sm_scale, c.topk, kv_format=c.kv_format)
    with pytest.raises(ValueError, match="heads: 6 .*tp=4"):
        tp.heads_per_rank(6, 4)
    with pytest.raises(ValueError, match="indexer_mode"):
        tp.dsa_decode_step_tp(mesh, *_arrays(c), c.sm_scale, c.topk, indexer_mode="pipeline")
    with pytest.raises(ValueError, match="axis_name"):
        tp.dsa_decode_step_tp(mesh, *_arrays(c), c.sm_scale, c.topk, axis_name="model")
    with pytest.raises(ValueError, match="tp: expected an int in"):
        tp.make_tp_mesh(len(jax.devices()) + 1)


# ============================================================================ bad input (new-user trial)

@pytest.mark.parametrize("kw,exc,match", [
    # topk used to go through int(): 2.5 ran as 2, True as 1
    (dict(topk=2.5), TypeError, r"topk: expected an int .* got float 2.5"),
    (dict(topk=True), TypeError, r"topk: expected an int .*not a bool.* got bool"),
    (dict(topk=np.bool_(True)), TypeError, "topk: expected an int"),
    (dict(topk="64"), TypeError, "topk: expected an int"),
    (dict(topk=0), ValueError, "topk: expected an int >= 1, got 0"),
    # sm_scale used to go through float(): "abc" / None gave unnamed errors
    (dict(sm_scale="abc"), TypeError, "sm_scale: expected a real number"),
    (dict(sm_scale=None), TypeError, "sm_scale: expected a real number .* got NoneType"),
    (dict(sm_scale=True), TypeError, "sm_scale: expected a real number"),
    (dict(sm_scale=jnp.ones((2,), jnp.float32)), TypeError, r"sm_scale: .* shape \(2,\)"),
    (dict(sm_scale=float("nan")), ValueError, "sm_scale: expected a finite value, got nan"),
    (dict(sm_scale=np.float32("inf")), ValueError, "sm_scale: expected a finite value, got inf"),
    (dict(sm_scale=jnp.float32(float("nan"))), ValueError, "sm_scale: expected a finite value"),
    (dict(d_v=512.0), TypeError, "d_v: expected an int"),
    (dict(kv_format=["latent"]), ValueError, "kv_format: expected one of"),
    (dict(k_format="fp8"), ValueError, "k_format: expected one of"),
    (dict(path="cuda"), ValueError, "path: expected one of"),
])
def test_tp_bad_scalars_named_before_tracing(kw, exc, match):
    c = make_step_case(0, B=1, H=16, lens=[70])
    mesh = tp.make_tp_mesh(1)
    args = dict(sm_scale=c.sm_scale, topk=c.topk)
    opts = dict(kv_format=c.kv_format, path="xla")
    for k, v in kw.items():
        (args if k in args else opts)[k] = v
    with pytest.raises(exc, match=match):
        tp.dsa_decode_step_tp(mesh, *_arrays(c), args["sm_scale"], args["topk"], **opts)
    if set(kw) <= {"sm_scale", "topk"}:
        with pytest.raises(exc, match=match):   # the one-device step checks them before the indexer
            dsa_decode_step(*_arrays(c), args["sm_scale"], args["topk"], kv_format=c.kv_format,
                            path="xla")


def test_tp_traced_sm_scale_refused_and_heads_type():
    """The TP step compiles sm_scale in: a traced scale is a TypeError naming it (not a
    ConcretizationTypeError from float()); heads_per_rank / make_tp_mesh name a bad type."""
    c = make_step_case(0, B=1, H=16, lens=[70])
    mesh = tp.make_tp_mesh(1)
    arrs = _arrays(c)
    with pytest.raises(TypeError, match="sm_scale: expected a concrete value"):
        jax.jit(lambda s: tp.dsa_decode_step_tp(mesh, *arrs, s, c.topk, kv_format=c.kv_format))(0.1)
    with pytest.raises(TypeError, match="tp: expected an int"):
        tp.heads_per_rank(16, 4.0)
    with pytest.raises(TypeError, match="heads: expected an int"):
        tp.heads_per_rank(16.0, 4)
    with pytest.raises(TypeError, match="tp: expected an int"):
        tp.make_tp_mesh(True)
    assert tp.heads_per_rank(np.int64(16), np.int64(4)) == 4


def test_tp_numpy_scalars_match_python_scalars():
    """np.float32 sm_scale and np.int64 topk are accepted (the rule of both stacks) and give the
    bits of the equal Python scalars, on one device and through the TP step."""
    c = make_step_case(5, B=2, H=16, lens=[150, 70])
    scale = float(np.float32(c.sm_scale))
    arrs = _arrays(c)
    ref = dsa_decode_step(*arrs, scale, c.topk, kv_format=c.kv_format, path="xla")
    got = dsa_decode_step(*arrs, np.float32(scale), np.int64(c.topk), kv_format=c.kv_format, path="xla")
    tpo = tp.dsa_decode_step_tp(tp.make_tp_mesh(1), *arrs, np.float32(scale), np.int64(c.topk),
                                kv_format=c.kv_format, path="xla")
    for a, b, d in zip(ref, got, tpo):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(d))
    compare.assert_pass(compare.check_topk(np.asarray(ref[2]), c.reference_logits(), c.topk, sorted=True))
    c.sm_scale = scale
    ref_out, ref_lse = c.reference_mla(np.asarray(ref[2]))
    compare.assert_pass(compare.check_mla(compare.to_numpy(ref[0]), np.asarray(ref[1]), ref_out, ref_lse,
                                          q_dtype=c.params["q_dtype"]))
