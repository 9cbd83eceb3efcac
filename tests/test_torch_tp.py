"""torch_impl.step / torch_impl.tp: the composed decode step on one device and under tensor
parallelism (4 gloo processes on the CPU, interpreter kernels; the same bodies on CUDA).

Checks: the single-device step against the float64 reference (top-k as exact sets by
``check_topk`` with ``sorted=True``; out / lse by ``check_mla`` against the reference fed the
step's own indices); the TP step in both indexer modes against the single-device step (indices
bitwise, out / lse per head shard within SPEC tolerance, and bitwise between the two modes);
the candidate pack / merge of the sequence-sharded top-k against ``topk_from_logits`` on rows
full of ties, NaN, -inf and -0.0; set-up errors: a manual head split checked by a pure function
(``head_split``), an uneven split raising on every rank in ``gather_heads`` (4 gloo processes, no
kernels), the sm_scale / topk rule shared with jax_impl (NumPy scalars accepted bit for bit).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import _tp_worker as tp_worker
from _tp_worker import make_step_case, run_workers
from conftest import HAS_CUDA
from kernels import compare, reference
from torch_impl import tp
from torch_impl._common import as_tensor
from torch_impl.step import dsa_decode_step

Q_DTYPES = ["float16", "float32"] + (["bfloat16"] if HAS_CUDA else [])
DEVICE = "cuda" if HAS_CUDA and torch.cuda.is_available() else "cpu"

# (name, make_step_case kwargs): small shapes, real D_qk / D_I / formats.
STEP_CASES = [
    # block table 4x wider than the longest request: the sequence split follows each request's
    # own length, not the table's columns
    ("ds_mla_ties_len0_wide_table", dict(seed=1, B=3, H=16, lens=[0, 300, 130], ties=True,
                                         table_len=1280)),
    # V4-Flash-like: fp8_model1 (D_qk 512), attention sink, MTP N=2; 32 heads = 8 per rank at
    # TP 4, as V4-Flash's 64 heads at TP 8
    ("model1_mtp2_sink_nan_negpages", dict(seed=2, B=2, N=2, H=32, d_qk=512, kv_format="fp8_model1",
                                           q_dtype="float32", lens=[200, 257], attn_sink=True,
                                           nan_rows=True, neg_pages=True)),
]


def _tensors(c, device=DEVICE):
    return [as_tensor(a, device) for a in (c.q, c.kv_cache, c.idx_q, c.idx_weights, c.k_cache,
                                           c.block_table, c.context_lens)]


def _single(c, path="auto", device=DEVICE):
    t = _tensors(c, device)
    sink = None if c.attn_sink is None else as_tensor(c.attn_sink, device)
    out, lse, idx = dsa_decode_step(*t, c.sm_scale, c.topk, kv_format=c.kv_format, d_v=c.d_v,
                                    attn_sink=sink, path=path)
    return compare.to_numpy(out), lse.cpu().numpy(), idx.cpu().numpy()


def _check_against_reference(c, out, lse, idx):
    compare.assert_pass(compare.check_topk(idx, c.reference_logits(), c.topk, sorted=True))
    ref_out, ref_lse = c.reference_mla(idx)
    compare.assert_pass(compare.check_mla(out, lse, ref_out, ref_lse, q_dtype=c.params["q_dtype"]))


@pytest.mark.parametrize("q_dtype", Q_DTYPES)
def test_step_single_device(q_dtype):
    c = make_step_case(3, B=2, H=16, q_dtype=q_dtype, lens=[310, 90], structured=True)
    out, lse, idx = _single(c)
    _check_against_reference(c, out, lse, idx)
    # indices equal the reference top-k exactly (sorted: descending logit, -1 last)
    np.testing.assert_array_equal(idx, reference.topk_from_logits(c.reference_logits(), c.topk))


@pytest.mark.slow
def test_tp4_gloo_both_modes_equal_single_device(tmp_path):
    """4 ranks x 16 / 32 heads (4 / 8 heads per rank, below the dot tile: the launcher pads)."""
    world = 4
    # gloo ranks hold CPU tensors: interpreter kernels on a CPU machine; on a CUDA machine the
    # CPU tensors take the plain-PyTorch path (gloo has no CUDA all_gather), so the single-device
    # comparison runs that path on the CPU too (the NCCL / GPU run is bench/tp_bench.py).
    path = "torch" if HAS_CUDA else "auto"
    jobs = [(kw, path) for _, kw in STEP_CASES]
    results = run_workers(world, str(tmp_path), jobs)
    for (case_kw, path), ranks in zip(jobs, results):
        c = make_step_case(**case_kw)
        out, lse, idx = _single(c, path, device="cpu")
        _check_against_reference(c, out, lse, idx)
        h = c.q.shape[2] // world
        for r, res in enumerate(ranks):
            heads = slice(r * h, (r + 1) * h)
            for mode in tp.INDEXER_MODES:
                np.testing.assert_array_equal(res[f"{mode}_idx"], idx, err_msg=f"{mode} rank {r} {path}")
                compare.assert_pass(compare.check_mla(res[f"{mode}_out"], res[f"{mode}_lse"],
                                                      out[:, :, heads], lse[:, :, heads],
                                                      q_dtype=c.params["q_dtype"]))
            # same indices in both modes -> the same kernel launch -> bitwise identical outputs
            np.testing.assert_array_equal(res["replicated_out"], res["sequence_out"])
            np.testing.assert_array_equal(res["replicated_lse"], res["sequence_lse"])
            compare.assert_pass(compare.check_close("lse", res["gathered_lse"], lse,
                                                    abs_tol=compare.LSE_ABS, rel_tol=compare.LSE_REL))


@pytest.mark.parametrize("tp_size", [1, 2, 4, 8])
def test_sequence_merge_matches_reference_topk(tp_size):
    """Per-shard candidates + merge == exact SPEC top-k, on rows built to stress the tie rule."""
    rng = np.random.default_rng(tp_size)
    R, W, K = 6, 200, 24
    rows = rng.choice(np.array([1.5, 0.0, -0.0, 2.0, -1.0, 3.0], np.float32), size=(R, W))
    rows[0, ::3] = np.nan
    rows[1, 50:] = -np.inf
    rows[2, :] = -np.inf                                  # nothing qualifies
    rows[3, 7] = np.inf
    rows[4] = rng.standard_normal(W).astype(np.float32)   # no ties
    rows[5, : W - 5] = np.nan                              # fewer than K qualify
    logits = torch.from_numpy(rows).reshape(R, 1, W).to(DEVICE)
    per = -(-W // tp_size)
    keys = []
    for r in range(tp_size):
        shard = torch.full((R, 1, per), float("-inf"), device=DEVICE)
        part = logits[:, :, r * per:(r + 1) * per]
        shard[:, :, :part.shape[2]] = part
        lens = torch.full((R, 1), part.shape[2], dtype=torch.int64, device=DEVICE)
        for path in ("triton", "torch"):
            offset = torch.full((R,), r * per, dtype=torch.int64, device=DEVICE)
            got = tp._local_candidates(shard, lens, K, offset, path)
            if path == "triton":
                ref_keys = got
            else:   # both local selections give the same candidate set
                assert torch.equal(torch.sort(got, dim=-1).values, torch.sort(ref_keys, dim=-1).values)
        keys.append(ref_keys)
    merged = tp.merge_candidates(torch.cat(keys, dim=-1), K).reshape(R, K).cpu().numpy()
    np.testing.assert_array_equal(merged, reference.topk_from_logits(rows.astype(np.float64), K))


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shard_block_table_splits_each_request_evenly(world):
    P, max_pages = 16, 40
    lens = torch.tensor([[0, 0], [1, 3], [17, 17], [100, 101], [640, 640]], dtype=torch.int64)
    bt = torch.arange(5 * max_pages, dtype=torch.int32).view(5, max_pages)
    seen = [[] for _ in range(5)]
    for r in range(world):
        bt_l, ll, off = tp.shard_block_table(bt, lens, P, r, world)
        assert bt_l.shape == (5, -(-max_pages // world))
        for b in range(5):
            n_b = -(-int(lens[b].max()) // P)
            s_b = -(-n_b // world)
            pages = bt_l[b][bt_l[b] >= 0].tolist()
            assert len(pages) <= s_b                                   # balanced share
            assert int(off[b]) == r * s_b * P
            assert (ll[b] == (lens[b] - off[b]).clamp(0, s_b * P)).all()
            seen[b] += pages
    for b in range(5):   # the shares tile exactly the request's own pages, in order
        assert seen[b] == bt[b, : -(-int(lens[b].max()) // P)].tolist()


def test_setup_errors():
    q = torch.zeros(1, 1, 12, 576)
    with pytest.raises(ValueError, match=r"heads: 12 .*tp=8"):
        tp.shard_heads(q, 0, 8)
    with pytest.raises(ValueError, match="heads: 6 .*tp=4"):
        tp.heads_per_rank(6, 4)
    with pytest.raises(ValueError, match="rank"):
        tp.shard_heads(q, 4, 4)
    assert tp.shard_heads(q, 3, 4).shape == (1, 1, 3, 576)
    with pytest.raises(ValueError, match="indexer_mode"):
        c = make_step_case(0, B=1, H=16, lens=[70])
        tp.dsa_decode_step_tp(*_tensors(c), c.sm_scale, c.topk, kv_format=c.kv_format,
                              indexer_mode="pipeline")
    with pytest.raises(RuntimeError, match="not initialised"):
        tp.sequence_sharded_topk(*_tensors(c)[2:], c.topk)


# ============================================================================ bad input (new-user trial)

def test_head_split_manual_split_checked_without_collectives():
    """A manual head split is checked by a pure function of replicated values (the same verdict
    on every rank, before any collective); shard_heads(head_counts=...) applies it."""
    assert tp.head_split(16, 4) == (4, 4, 4, 4)
    assert tp.head_split(np.int64(32), np.int64(8), [4] * 8) == (4,) * 8
    bad = [
        ((18, 4, None), ValueError, r"heads: 18 query heads cannot be split evenly over tp=4"),
        ((18, 4, [5, 5, 4, 4]), ValueError, r"head_counts: \[5, 5, 4, 4\] is an uneven split; heads: 18"),
        ((18, 4, [4, 4, 4, 4]), ValueError,
         r"head_counts: the per-rank head counts \[4, 4, 4, 4\] sum to 16, expected heads = 18"),
        ((16, 4, [5, 5, 3, 3]), ValueError,
         r"head_counts: expected an even split, 4 heads on each of tp=4 ranks \(16 heads\), "
         r"got \[5, 5, 3, 3\]"),
        ((16, 4, [4, 4, 4]), ValueError, r"head_counts: expected 4 per-rank head counts .* got 3"),
        ((16, 4, 4), TypeError, r"head_counts: expected a sequence of 4 ints"),
        ((16, 4, [4, 4, 4.0, 4]), TypeError, r"head_counts\[2\]: expected an int .* got float"),
        ((16, 4.0, None), TypeError, r"tp: expected an int .* got float"),
        ((16, True, None), TypeError, r"tp: expected an int .*not a bool.* got bool"),
        ((16, 0, None), ValueError, r"tp: expected an int >= 1, got 0"),
        ((0, 4, None), ValueError, r"heads: expected an int >= 1, got 0"),
    ]
    for args, exc, match in bad:
        with pytest.raises(exc, match=match):
            tp.head_split(*args)
    q = torch.arange(16, dtype=torch.float32).view(1, 1, 16, 1)
    for r in range(4):
        got = tp.shard_heads(q, r, 4, head_counts=[4, 4, 4, 4])
        assert got.flatten().tolist() == list(range(4 * r, 4 * r + 4))
    sink = torch.arange(18, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"head_counts: \[5, 5, 4, 4\] is an uneven split"):
        tp.shard_heads(sink, 0, 4, dim=0, head_counts=[5, 5, 4, 4])
    with pytest.raises(ValueError, match=r"head_counts: the per-rank head counts \[4, 4, 4, 4\] sum to 16"):
        tp.shard_heads(sink, 3, 4, dim=0, head_counts=[4, 4, 4, 4])
    with pytest.raises(TypeError, match="rank: expected an int"):
        tp.shard_heads(q, 1.0, 4)


def test_uneven_manual_split_raises_on_every_rank_in_gather_heads(tmp_path):
    """18 heads split by hand over 4 gloo ranks (5, 5, 4, 4): gather_heads used to abort the
    processes in gloo's all-gather; now every rank gets the same ValueError naming x and each
    rank's shape, and the group still gathers an even split correctly afterwards."""
    ranks = tp_worker.run_uneven_gather(4, str(tmp_path), heads=18)
    msgs = [str(res["error"]) for res in ranks]
    assert len(set(msgs)) == 1, msgs
    assert msgs[0].startswith("x: gather_heads needs the same shard shape and dtype on every rank")
    assert "rank 0: (1, 1, 5, 3) x 4 bytes" in msgs[0] and "rank 3: (1, 1, 4, 3) x 4 bytes" in msgs[0]
    want = np.broadcast_to(np.repeat(np.arange(4, dtype=np.float32), 2)[None, None, :, None], (1, 1, 8, 3))
    for res in ranks:
        np.testing.assert_array_equal(res["gathered"], want)


def test_step_scalar_rule():
    """One rule for sm_scale / topk in both stacks: Python or NumPy scalars of the right kind,
    never bool; topk >= 1; sm_scale finite."""
    from torch_impl.step import check_step_scalars
    scale, k = check_step_scalars(np.float32(0.1), np.int64(64))
    assert type(scale) is float and scale == float(np.float32(0.1))
    assert type(k) is int and k == 64
    assert check_step_scalars(2, np.int32(1)) == (2.0, 1)
    assert check_step_scalars(-0.5, 3) == (-0.5, 3)          # the ops accept any finite scale
    bad = [
        (("0.1", 64), TypeError, "sm_scale: expected a real number"),
        ((None, 64), TypeError, "sm_scale: expected a real number .* got NoneType"),
        ((True, 64), TypeError, "sm_scale: .*not a bool"),
        ((np.bool_(True), 64), TypeError, "sm_scale"),
        ((torch.tensor(0.1), 64), TypeError, "sm_scale: .* got Tensor"),
        ((float("nan"), 64), ValueError, "sm_scale: expected a finite value, got nan"),
        ((np.float32("inf"), 64), ValueError, "sm_scale: expected a finite value, got inf"),
        ((0.1, 2.5), TypeError, "topk: expected an int .* got float 2.5"),
        ((0.1, 64.0), TypeError, "topk: expected an int .* got float"),
        ((0.1, True), TypeError, "topk: expected an int .*not a bool.* got bool"),
        ((0.1, np.bool_(True)), TypeError, "topk"),
        ((0.1, 0), ValueError, "topk: expected an int >= 1, got 0"),
        ((0.1, np.int64(-3)), ValueError, "topk: expected an int >= 1"),
    ]
    for args, exc, match in bad:
        with pytest.raises(exc, match=match):
            check_step_scalars(*args)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(topk=2.5), TypeError, "topk: expected an int"),
    (dict(topk=True), TypeError, "topk: expected an int"),
    (dict(topk=0), ValueError, "topk: expected an int >= 1"),
    (dict(sm_scale="0.1"), TypeError, "sm_scale: expected a real number"),
    (dict(sm_scale=None), TypeError, "sm_scale: expected a real number"),
    (dict(sm_scale=float("inf")), ValueError, "sm_scale: expected a finite value"),
])
@pytest.mark.parametrize("mode", ["replicated", "sequence"])
def test_tp_and_step_bad_scalars_raise_before_any_work(kw, exc, match, mode):
    """Checked first: no indexer, no collective (the sequence mode without torch.distributed
    would raise RuntimeError at its first collective; the scalar error comes before it)."""
    c = make_step_case(0, B=1, H=16, lens=[70])
    args = dict(sm_scale=c.sm_scale, topk=c.topk)
    args.update(kw)
    with pytest.raises(exc, match=match):
        tp.dsa_decode_step_tp(*_tensors(c), args["sm_scale"], args["topk"], kv_format=c.kv_format,
                              indexer_mode=mode)
    with pytest.raises(exc, match=match):
        dsa_decode_step(*_tensors(c), args["sm_scale"], args["topk"], kv_format=c.kv_format)


def test_step_numpy_scalars_match_python_scalars():
    """np.float32 sm_scale and np.int64 topk give the bits of the equal Python scalars."""
    c = make_step_case(5, B=2, H=16, lens=[150, 70])
    scale = float(np.float32(c.sm_scale))
    t = _tensors(c, "cpu")
    ref = dsa_decode_step(*t, scale, c.topk, kv_format=c.kv_format, path="torch")
    got = dsa_decode_step(*t, np.float32(scale), np.int64(c.topk), kv_format=c.kv_format, path="torch")
    tpo = tp.dsa_decode_step_tp(*t, np.float32(scale), np.int64(c.topk), kv_format=c.kv_format,
                                path="torch")
    for a, b, d in zip(ref, got, tpo):
        assert torch.equal(a, b) and torch.equal(a, d)
    c.sm_scale = scale
    _check_against_reference(c, compare.to_numpy(ref[0]), ref[1].numpy(), ref[2].numpy())
