"""kernels.dispatch: buckets, lookup rules, the table writer, and proof that ``path="auto"`` in
both backends follows the table.

How "auto follows the table" is proved without a GPU: the CPU interpreter's DeviceInfo
(``kernels.hardware.CPU_INTERPRETER``, which both backends' ``_common.device_info`` return on the
CPU) is replaced by a fake sm_90 device that is *not* marked interpret, so the launchers consult
``kernels/dispatch/sm_90.json``; ``$DSA_DISPATCH_DIR`` points at a temporary folder holding a
table written here. Which path ran is observed from outside the op: Triton launches are counted
at the interpreter's GridExecutor, Pallas kernels at ``kernels._pallas_call``'s
``pl.pallas_call``. A table naming the plain path must give zero kernel launches, one naming the
kernel path at least one; both results are checked against the float64 reference.
"""
import json
import os

import numpy as np
import pytest
import torch

from kernels import cases, compare, dispatch, hardware

FAKE_H200 = hardware.DeviceInfo(name="Fake H200 (test)", cc=(9, 0), num_sms=132,
                                smem_per_block=232_448, interpret=False)


def _write(arch, entries, directory):
    return dispatch.write_table(arch, entries, gpu="Fake H200 (test)", compute_capability="9.0",
                                command="pytest", directory=directory, merge=False)


def _entry(op, backend, bkt, path, config=None):
    """A table entry; ``config`` defaults to ``{}`` (a plain path's, or the kernel path's
    heuristic: a kernel path fills an empty config with its defaults)."""
    return {"op": op, "backend": backend, "bucket": bkt, "path": path,
            "config": {} if config is None else config}


# ----------------------------------------------------------------------------- lookup rules

def test_bucket_rounds_batch_and_length_only():
    b = dispatch.bucket("sparse_mla_decode", B=33, N=2, H=24, K=640, d_qk=512, kv_format="fp8_model1")
    assert b == {"B": 64, "H": 24, "K": 640, "N": 2, "d_qk": 512, "kv_format": "fp8_model1"}
    assert dispatch.bucket("indexer_topk", B=1, N=1, L=4097, topk=2048) == {"B": 1, "L": 8192, "N": 1, "topk": 2048}
    assert dispatch.bucket("indexer_topk", B=0, N=1, L=1 << 20, topk=512)["B"] == 1


def test_lookup_exact_extra_keys_nearest_and_missing(table_dir):
    mk = lambda B: dispatch.bucket("sparse_mla_decode", B=B, N=1, H=128, K=2048, d_qk=576,  # noqa: E731
                                   kv_format="fp8_ds_mla")
    _write("sm_90", [_entry("sparse_mla_decode", "torch", mk(8), "torch"),
                     _entry("sparse_mla_decode", "torch", mk(64), "triton", {"block_h": 64}),
                     _entry("sparse_mla_decode", "jax", mk(64), "xla")], table_dir)
    assert dispatch.lookup("sparse_mla_decode", "torch", "sm_90", mk(64))["config"] == {"block_h": 64}
    assert dispatch.lookup("sparse_mla_decode", "torch", "sm_90", mk(5))["path"] == "torch"     # B=8 bucket
    assert dispatch.lookup("sparse_mla_decode", "jax", "sm_90", mk(64))["path"] == "xla"
    # extra keys a launcher might add do not break the match
    assert dispatch.lookup("sparse_mla_decode", "torch", "sm_90", {**mk(64), "dtype": "bf16"})["path"] == "triton"
    # nearest in log2(B): 128 -> 64, 2 -> 8 (distance 2 vs 5)
    assert dispatch.lookup("sparse_mla_decode", "torch", "sm_90", mk(128))["path"] == "triton"
    assert dispatch.lookup("sparse_mla_decode", "torch", "sm_90", mk(2))["path"] == "torch"
    assert dispatch.lookup("sparse_mla_decode", "torch", "sm_90", mk(128), nearest=False) is None
    # other keys must match exactly, even for the nearest fallback
    other = dispatch.bucket("sparse_mla_decode", B=64, N=1, H=64, K=2048, d_qk=576, kv_format="fp8_ds_mla")
    assert dispatch.lookup("sparse_mla_decode", "torch", "sm_90", other) is None
    assert dispatch.lookup("indexer_topk", "torch", "sm_90", mk(64)) is None
    assert dispatch.lookup("sparse_mla_decode", "torch", "sm_120", mk(64)) is None     # no table


def test_nearest_ties_go_to_the_smaller_bucket_and_batch_must_be_an_int(table_dir):
    mk = lambda B: dispatch.bucket("sparse_mla_decode", B=B, N=1, H=128, K=2048, d_qk=576,  # noqa: E731
                                   kv_format="fp8_ds_mla")
    _write("sm_90", [_entry("sparse_mla_decode", "torch", mk(128), "triton"),
                     _entry("sparse_mla_decode", "torch", mk(2), "torch")], table_dir)
    # B 16 is 3 binades from both: the smaller bucket, whatever the table's (text) order
    assert dispatch.lookup("sparse_mla_decode", "torch", "sm_90", mk(16))["path"] == "torch"
    assert mk(np.int64(33))["B"] == 64                        # a NumPy integer is an int
    for bad in (33.0, 3.5, float("nan"), True, "17", None):
        with pytest.raises(TypeError, match=r"^dims: B: expected an int, got "):
            mk(bad)


def test_write_table_merges_and_reloads(table_dir):
    b1 = dispatch.bucket("indexer_topk", B=64, N=1, L=65536, topk=2048)
    b2 = dispatch.bucket("indexer_topk", B=1, N=1, L=65536, topk=2048)
    _write("sm_120", [_entry("indexer_topk", "torch", b1, "torch"), _entry("indexer_topk", "torch", b2, "torch")],
           table_dir)
    assert dispatch.lookup("indexer_topk", "torch", "sm_120", b1)["path"] == "torch"
    p = dispatch.write_table("sm_120", [_entry("indexer_topk", "torch", b1, "triton")], gpu="RTX PRO 6000",
                             compute_capability="12.0", command="python -m bench", directory=table_dir)
    table = json.loads(p.read_text())
    assert table["arch"] == "sm_120" and table["gpu"] == "RTX PRO 6000" and len(table["entries"]) == 2
    # write_table drops the cache: the next lookup sees the new file
    assert dispatch.lookup("indexer_topk", "torch", "sm_120", b1)["path"] == "triton"
    assert dispatch.lookup("indexer_topk", "torch", "sm_120", b2)["path"] == "torch"


def test_validate_table_rejects_bad_entries(table_dir):
    with pytest.raises(ValueError, match="path 'pallas' is no path of backend 'torch'"):
        _write("sm_90", [_entry("indexer_topk", "torch", {"B": 1}, "pallas")], table_dir)
    with pytest.raises(ValueError, match="missing key 'entries'"):
        dispatch.validate_table({"arch": "sm_90", "gpu": "x", "compute_capability": "9.0"})
    with pytest.raises(ValueError, match="arch"):
        dispatch.table_path("../evil")
    (table_dir / "sm_89.json").write_text("{not json")
    dispatch.clear_cache()
    assert dispatch.lookup("indexer_topk", "torch", "sm_89", {"B": 1}) is None


# ----------------------------------------------------------------------------- auto follows the table

@pytest.fixture
def fake_gpu(monkeypatch, table_dir):
    """Both backends see a non-interpret sm_90 device on the CPU (kernels still interpret)."""
    if not os.environ.get("TRITON_INTERPRET"):
        pytest.skip("needs the CPU interpreter (on a GPU the real table would be consulted)")
    monkeypatch.setattr(hardware, "CPU_INTERPRETER", FAKE_H200)
    return table_dir


@pytest.fixture
def triton_launches(monkeypatch):
    from triton.runtime import interpreter
    count = {"n": 0}
    orig = interpreter.GridExecutor.__call__

    def counting(self, *a, **k):
        count["n"] += 1
        return orig(self, *a, **k)
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", counting)
    return count


@pytest.fixture
def pallas_calls(monkeypatch):
    pc = pytest.importorskip("kernels._pallas_call")
    count = {"n": 0}
    real = pc.pl

    class CountingPl:
        def __getattr__(self, name):
            return getattr(real, name)

        def pallas_call(self, *a, **k):
            count["n"] += 1
            return real.pallas_call(*a, **k)
    monkeypatch.setattr(pc, "pl", CountingPl())
    return count


def _spy(monkeypatch, obj, name, record):
    """Wrap ``obj.name`` so every call's keyword arguments land in ``record``."""
    real = getattr(obj, name)

    def wrapper(*a, **k):
        record.append(k)
        return real(*a, **k)
    monkeypatch.setattr(obj, name, wrapper)


# Configs the kernel-path tables carry: members of the H200's spaces other than the heuristic's,
# so a launch with them proves the table's config (not the default) reached the launcher.
TABLE_MLA_TRITON = {"block_h": 16, "block_k": 64, "num_warps": 4, "num_stages": 1, "prefetch": True}
TABLE_MLA_PALLAS = {"block_h": 16, "block_k": 32, "num_warps": 4, "num_stages": 1, "prefetch": True}
TABLE_IDX_TRITON = {"num_splits": 2, "pages": 1, "topk_block": 2048}
TABLE_IDX_PALLAS = {"num_splits": 2, "pages": 1, "block": 128}


def _import(mod):
    try:
        return __import__(mod, fromlist=["_"])
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"{mod} does not import yet: {type(e).__name__}: {e}")


def _mla_case():
    return cases.make_mla_case(3, B=2, N=1, H=16, d_qk=576, K=64, P=16, kv_format="latent",
                               q_dtype="float16", kv_dtype="float16", logical=True)


def _mla_bucket(c):
    B, N, H, D = c.q.shape
    return dispatch.bucket("sparse_mla_decode", B=B, N=N, H=H, K=c.indices.shape[2], d_qk=D, kv_format=c.kv_format)


def _idx_case():
    # lens and the table capacity share a power-of-two bucket (launchers bucket by either)
    return cases.make_indexer_case(5, B=2, N=1, H_I=16, P=16, lens=[90, 120], table_len=128, topk=32)


def _idx_bucket(c):
    W = c.block_table.shape[1] * 16             # both stacks bucket L by the table's capacity
    return dispatch.bucket("indexer_topk", B=2, N=1, L=W, topk=c.topk)


# The torch cases run the Triton interpreter on CPU tensors under a fake sm_90 device: on a CUDA
# machine the kernels would compile for the real GPU instead (the bench checks real tables there).
_interp_only = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter plumbing check")


@_interp_only
@pytest.mark.parametrize("named, kernel_runs", [("torch", False), ("triton", True)])
def test_torch_sparse_mla_auto_follows_table(fake_gpu, triton_launches, named, kernel_runs,
                                             monkeypatch):
    ti = _import("torch_impl")
    import torch_impl.sparse_mla as tsm
    from torch_impl._common import as_tensor
    c = _mla_case()
    cfg = TABLE_MLA_TRITON if kernel_runs else {}
    _write("sm_90", [_entry("sparse_mla_decode", "torch", _mla_bucket(c), named, cfg)], fake_gpu)
    launched, lookups = [], []
    _spy(monkeypatch, tsm, "_triton_impl", launched)
    _spy(monkeypatch, dispatch, "lookup", lookups)
    kw = {k: as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in c.kwargs().items()}
    out, lse = ti.sparse_mla_decode(as_tensor(c.q), as_tensor(c.kv_cache), as_tensor(c.indices), c.sm_scale,
                                    path="auto", **{k: v for k, v in kw.items() if k != "sm_scale"})
    assert (triton_launches["n"] > 0) == kernel_runs, (named, triton_launches["n"])
    assert len(lookups) == 1                                    # one plan, one table read
    if kernel_runs:                                             # the table's config ran
        assert [k["config"].to_dict() for k in launched] == [TABLE_MLA_TRITON]
    ref_out, ref_lse = c.reference()
    compare.assert_pass(compare.check_mla(out, lse, ref_out, ref_lse, q_dtype=c.q_dtype))


@_interp_only
@pytest.mark.parametrize("named, kernel_runs", [("torch", False), ("triton", True)])
def test_torch_indexer_topk_auto_follows_table(fake_gpu, triton_launches, named, kernel_runs,
                                               monkeypatch):
    ti = _import("torch_impl")
    from kernels.indexer import triton as tix
    from kernels.topk import triton as ttk
    from torch_impl._common import as_tensor
    c = _idx_case()
    cfg = TABLE_IDX_TRITON if kernel_runs else {}
    _write("sm_90", [_entry("indexer_topk", "torch", _idx_bucket(c), named, cfg)], fake_gpu)
    logits_cfg, topk_cfg, lookups = [], [], []
    _spy(monkeypatch, tix, "launch_indexer_logits", logits_cfg)
    _spy(monkeypatch, ttk, "launch_topk", topk_cfg)
    _spy(monkeypatch, dispatch, "lookup", lookups)
    idx = ti.indexer_topk(*(as_tensor(a) for a in c.args()), c.topk, k_format=c.k_format, path="auto")
    assert (triton_launches["n"] > 0) == kernel_runs, (named, triton_launches["n"])
    assert len(lookups) == 1
    if kernel_runs:
        (lk,), (tk,) = logits_cfg, topk_cfg
        assert (lk["config"].num_splits, lk["config"].pages, tk["config"].block) == (2, 1, 2048)
    compare.assert_pass(compare.check_topk(idx, c.reference_logits(), c.topk))


@pytest.mark.parametrize("named, kernel_runs", [("xla", False), ("pallas", True)])
def test_jax_sparse_mla_auto_follows_table(fake_gpu, pallas_calls, named, kernel_runs, monkeypatch):
    jx = _import("jax_impl")
    import jax
    import jax.numpy as jnp
    from kernels.sparse_mla import pallas as pk
    jax.clear_caches()                       # the table is read at trace time
    c = _mla_case()
    cfg = TABLE_MLA_PALLAS if kernel_runs else {}
    _write("sm_90", [_entry("sparse_mla_decode", "jax", _mla_bucket(c), named, cfg)], fake_gpu)
    launched, lookups = [], []
    _spy(monkeypatch, pk, "sparse_mla_decode_pallas", launched)
    _spy(monkeypatch, dispatch, "lookup", lookups)
    kw = {k: (jnp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in c.kwargs().items() if k != "sm_scale"}
    out, lse = jx.sparse_mla_decode(jnp.asarray(c.q), jnp.asarray(c.kv_cache), jnp.asarray(c.indices), c.sm_scale,
                                    path="auto", **kw)
    assert (pallas_calls["n"] > 0) == kernel_runs, (named, pallas_calls["n"])
    assert len(lookups) == 1                                    # one plan at trace time
    if kernel_runs:
        (k,) = launched
        assert {f: k[f] for f in ("block_h", "block_k", "num_warps", "num_stages", "prefetch")} \
            == TABLE_MLA_PALLAS
    ref_out, ref_lse = c.reference()
    compare.assert_pass(compare.check_mla(np.asarray(out), np.asarray(lse), ref_out, ref_lse, q_dtype=c.q_dtype))


@pytest.mark.parametrize("named, kernel_runs", [("xla", False), ("pallas", True)])
def test_jax_indexer_topk_auto_follows_table(fake_gpu, pallas_calls, named, kernel_runs, monkeypatch):
    jx = _import("jax_impl")
    import jax
    import jax.numpy as jnp
    from kernels.indexer import pallas as pix
    jax.clear_caches()
    c = _idx_case()
    cfg = TABLE_IDX_PALLAS if kernel_runs else {}
    _write("sm_90", [_entry("indexer_topk", "jax", _idx_bucket(c), named, cfg)], fake_gpu)
    launched, lookups = [], []
    _spy(monkeypatch, pix, "launch_indexer_logits", launched)
    _spy(monkeypatch, dispatch, "lookup", lookups)
    idx = jx.indexer_topk(*(jnp.asarray(a) for a in c.args()), c.topk, k_format=c.k_format, path="auto")
    assert (pallas_calls["n"] > 0) == kernel_runs, (named, pallas_calls["n"])
    assert len(lookups) == 1
    if kernel_runs:
        (k,) = launched
        assert (k["cfg"].num_splits, k["cfg"].pages, k["cfg"].block) == (2, 1, 128)
    compare.assert_pass(compare.check_topk(np.asarray(idx), c.reference_logits(), c.topk))
