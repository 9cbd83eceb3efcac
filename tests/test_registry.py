"""kernels.registry: one registry object that every consumer holds, its plan (paths and configs
of a call), the committed dispatch table's configs, and the import direction of the packages
(bench -> parity -> bindings -> kernels; no loops).

The import graph is read from the source (every ``import`` statement, also the ones inside
functions), so a lazy import that points the wrong way is caught too.
"""
import ast
import json
import os
import dataclasses
from dataclasses import asdict
from pathlib import Path

import pytest

from kernels import dispatch, hardware, ops, registry
from kernels.sparse_mla import configs
from kernels.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
H200 = hardware.DeviceInfo(name="NVIDIA H200", cc=(9, 0), num_sms=132,
                           smem_per_block=hardware.smem_limit((9, 0)))
MLA = dict(B=64, N=1, H=128, K=2048, d_qk=576, kv_format="fp8_ds_mla")
TOPK = dict(B=64, N=1, L=65536, topk=2048)


def _write(entries, directory, arch="sm_90"):
    return dispatch.write_table(arch, entries, gpu="test", compute_capability="9.0",
                                command="pytest", directory=directory, merge=False)


# ----------------------------------------------------------------------------- one registry

def test_every_consumer_holds_the_one_registry():
    """Bindings, dispatch table, parity and bench hold this very object and its lists."""
    import bench.grid
    import bench.paths
    import bench.report
    import jax_impl._common as jc
    import parity.runners
    import torch_impl._common as tc

    assert tc.REGISTRY is REGISTRY and jc.REGISTRY is REGISTRY
    assert parity.runners.OP_REGISTRY is REGISTRY
    assert bench.paths.OP_REGISTRY is REGISTRY and bench.grid.OP_REGISTRY is REGISTRY
    assert bench.report.OP_REGISTRY is REGISTRY
    # the lists they use are the registry's objects, not copies
    assert parity.runners.OPS is REGISTRY.ops is ops.OPS
    assert bench.paths.OPS is REGISTRY.timed_ops and bench.grid.OPS is REGISTRY.timed_ops
    assert dispatch.BUCKET_KEYS is REGISTRY.bucket_keys and dispatch.BACKEND_PATHS is ops.BACKEND_PATHS
    assert tc.TORCH_PATHS == ("auto",) + REGISTRY.paths("torch") == ("auto", "triton", "torch")
    assert jc.JAX_PATHS == ("auto",) + REGISTRY.paths("jax") == ("auto", "pallas", "xla")
    assert tc.run_path is registry.run_path and jc.run_path is registry.run_path
    for name, adapter in bench.paths.REGISTRY.items():
        assert adapter.paths is REGISTRY.paths(name)
    assert [r.key for r in parity.runners.REGISTRY.values()] == [
        f"{b}/{p}" for b in REGISTRY.backends for p in REGISTRY.paths(b)]
    assert REGISTRY.bucket is not None and registry.plan == REGISTRY.plan


def _literal_strings(node):
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return {e.value for e in node.elts}
    return None


def test_op_and_path_lists_are_written_once():
    """No module but kernels/ops.py spells a backend's path list, paths of both backends, or
    the op lists as a literal (membership tests of single decisions, e.g. "which ops read the
    indexer cache", are not lists of ops and pass)."""
    path_sets = [set(p) for p in ops.BACKEND_PATHS.values()]
    all_paths = set(REGISTRY.all_paths())
    op_sets = [set(ops.OPS), set(ops.TIMED_OPS), set(ops.BUCKET_KEYS)]
    found = []
    for pkg in ("kernels", "torch_impl", "jax_impl", "parity", "bench"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            if f == ROOT / "kernels" / "ops.py":
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                vals = _literal_strings(node)
                if vals is None:
                    continue
                mixed = vals <= all_paths | {"auto"} and any(vals & p for p in path_sets) and all(
                    vals & p for p in path_sets)
                if any(vals - {"auto"} == p for p in path_sets) or mixed or vals in op_sets:
                    found.append(f"{f.relative_to(ROOT)}:{node.lineno}: {sorted(vals)}")
    assert not found, "op / path lists defined outside kernels/ops.py:\n" + "\n".join(found)


# ----------------------------------------------------------------------------- buckets and plan

def test_bucket_uses_the_bucket_keys_only():
    b = REGISTRY.bucket("sparse_mla_decode", **MLA, operand_bytes=4, L=123)
    assert b == dict(MLA) and tuple(sorted(b)) == tuple(sorted(ops.BUCKET_KEYS["sparse_mla_decode"]))
    assert REGISTRY.bucket("indexer_topk", B=33, N=2, L=4097, topk=7) == {"B": 64, "L": 8192, "N": 2, "topk": 7}
    assert REGISTRY.bucket("dsa_decode_step") == {}
    with pytest.raises(ValueError, match=r"missing \['topk'\]"):
        REGISTRY.bucket("indexer_topk", B=1, N=1, L=8)
    with pytest.raises(ValueError, match="op: expected one of"):
        REGISTRY.bucket("indexer", B=1)


def test_plan_without_a_table_is_the_default_order_and_the_heuristics(table_dir):
    p = REGISTRY.plan("sparse_mla_decode", "torch", H200, **MLA)
    assert p.order == ("triton", "torch") and p.entry is None
    # an H200 with an fp8_ds_mla cache and 16-bit q at B x N >= GLUON_XS_MIN_ROWS: the seesaw
    # Gluon kernel (configs.sparse_mla_heuristic, configs.GLUON_XS_PICKED); below that the
    # warp-specialised one (configs.GLUON_WS_PICKED); fp8_model1: the Gluon kernel
    assert MLA["B"] * MLA["N"] >= configs.GLUON_XS_MIN_ROWS
    assert p.config == configs.sparse_mla_heuristic(128, H200.smem_per_block, rows=MLA["B"] * MLA["N"],
                                                    topk=MLA["K"], gluon=True, gluon_ws=True,
                                                    gluon_xs=True).to_dict()
    assert p.config == configs.SPARSE_MLA_GLUON_XS.to_dict()
    few = REGISTRY.plan("sparse_mla_decode", "torch", H200, **dict(MLA, B=1, N=1))
    assert few.config == configs.SPARSE_MLA_GLUON_WS.to_dict()
    m1 = REGISTRY.plan("sparse_mla_decode", "torch", H200, **dict(MLA, H=64, K=640, d_qk=512,
                                                                    kv_format="fp8_model1"))
    assert m1.config == configs.SPARSE_MLA_GLUON.to_dict()
    # a 16-bit latent cache: the warp-specialised Gluon kernel too (measured 2026-12-05)
    latent = REGISTRY.plan("sparse_mla_decode", "torch", H200, **dict(MLA, kv_format="latent"))
    assert latent.config == configs.SPARSE_MLA_GLUON_WS.to_dict()
    assert p.config_for("torch") == {}
    p = REGISTRY.plan("sparse_mla_decode", "jax", H200, **MLA, operand_bytes=4)
    assert p.config == configs.PALLAS_SPARSE_MLA_FP32.to_dict()
    assert REGISTRY.plan("indexer_topk", "jax", H200, path="xla", **TOPK).configs == {"xla": {}}
    # no device to plan for: default order, no kernel config, no table read
    p = REGISTRY.plan("indexer_topk", "torch", None, **TOPK)
    assert p.order == ("triton", "torch") and p.configs == {"triton": None, "torch": {}}
    with pytest.raises(ValueError, match="path: expected one of"):
        REGISTRY.plan("indexer_topk", "torch", H200, path="pallas", **TOPK)


def test_indexer_heuristics_are_the_launchers_defaults():
    pytest.importorskip("triton")
    from kernels.indexer.triton import IndexerLogitsConfig
    from kernels.topk.triton import TopkConfig
    # the default kernel ("triton") is a selector: omitted from the config dict, as the
    # warp-specialised kernel's variant fields; on sm_90 the heuristic names the
    # warp-specialised Gluon logits kernel (kernels.indexer.gluon_ws.PICKED, measured 2026-12-05)
    logits = {k: v for k, v in asdict(IndexerLogitsConfig()).items()
              if k not in ("kernel", "ws_consumers", "ws_convert")}
    sm120 = dataclasses.replace(H200, name="RTX PRO 6000", cc=(12, 0), num_sms=188)
    assert REGISTRY.heuristic("indexer_logits", "torch", "triton", sm120, **TOPK) == logits
    assert REGISTRY.heuristic("indexer_logits", "torch", "triton", H200, **TOPK) == {
        **logits, "kernel": "gluon_ws"}
    # top-k 2048 at B 64: the candidate block 2,048 (registry.TOPK_WIDE_CAND_BLOCK, measured on
    # the H200); top-k 512: the TopkConfig default (1,024); the same on sm_120
    topk = {f"topk_{k}": v for k, v in asdict(TopkConfig()).items()}
    assert TopkConfig().cand_block == 1024
    assert REGISTRY.heuristic("indexer_topk", "torch", "triton", H200, **TOPK) == {
        **logits, "kernel": "gluon_ws", **topk, "topk_cand_block": 2048}
    assert REGISTRY.heuristic("indexer_topk", "torch", "triton", sm120, **TOPK) == {
        **logits, **topk, "topk_cand_block": 2048}
    assert REGISTRY.heuristic("indexer_topk", "torch", "triton", H200, **{**TOPK, "topk": 512}) \
        == {**logits, "kernel": "gluon_ws", **topk}
    # one row at L 64K keeps 1,024 (B 1 L 64K measured slower with 2,048); one row at 128K and
    # 8 rows at 64K take 2,048
    one = dict(B=1, N=1, L=65536, topk=2048)
    assert REGISTRY.heuristic("indexer_topk", "torch", "triton", H200, **one)["topk_cand_block"] == 1024
    assert REGISTRY.heuristic("indexer_topk", "torch", "triton", H200,
                              **{**one, "L": 131072})["topk_cand_block"] == 2048
    assert REGISTRY.heuristic("indexer_topk", "torch", "triton", H200,
                              **{**one, "B": 4, "N": 2})["topk_cand_block"] == 2048
    assert REGISTRY.heuristic("indexer_topk", "torch", "triton", H200,
                              **{**one, "L": 100_000})["topk_cand_block"] == 2048  # the 128K bucket
    pl = pytest.importorskip("kernels.indexer.pallas")
    assert REGISTRY.heuristic("indexer_topk", "jax", "pallas", H200, **TOPK) == pl.PallasIndexerConfig().to_dict()


def test_indexer_heuristic_follows_the_ws_logits_kernel_switch(monkeypatch):
    """kernels.indexer.gluon_ws.PICKED (True since the 2026-12-05 sweep) picks between the
    warp-specialised and the one-partition Gluon logits kernel on sm_90; never on sm_120."""
    pytest.importorskip("triton")
    from kernels.indexer import gluon_ws
    from kernels.indexer.triton import IndexerLogitsConfig
    logits = {k: v for k, v in asdict(IndexerLogitsConfig()).items()
              if k not in ("kernel", "ws_consumers", "ws_convert")}
    monkeypatch.setattr(gluon_ws, "PICKED", True)
    assert REGISTRY.heuristic("indexer_logits", "torch", "triton", H200, **TOPK) == {
        **logits, "kernel": "gluon_ws"}
    monkeypatch.setattr(gluon_ws, "PICKED", False)
    assert REGISTRY.heuristic("indexer_logits", "torch", "triton", H200, **TOPK) == {
        **logits, "kernel": "gluon"}
    sm120 = dataclasses.replace(H200, name="RTX PRO 6000", cc=(12, 0), num_sms=188)
    assert REGISTRY.heuristic("indexer_logits", "torch", "triton", sm120, **TOPK) == logits


def test_plan_follows_the_table_and_applies_its_config_when_in_the_space(table_dir):
    mla_b = REGISTRY.bucket("sparse_mla_decode", **MLA)
    other = configs.SparseMLAConfig(block_h=16, block_k=64, num_warps=4, num_stages=1).to_dict()
    assert other in REGISTRY.space("sparse_mla_decode", "torch", "triton", H200, **MLA)
    unchecked = dict(other, block_k=128)
    _write([{"op": "sparse_mla_decode", "backend": "torch", "bucket": mla_b, "path": "triton",
             "config": other},
            {"op": "sparse_mla_decode", "backend": "jax", "bucket": mla_b, "path": "pallas",
             "config": unchecked},
            {"op": "indexer_topk", "backend": "torch", "bucket": REGISTRY.bucket("indexer_topk", **TOPK),
             "path": "torch", "config": {}}], table_dir)
    p = REGISTRY.plan("sparse_mla_decode", "torch", H200, **MLA)
    assert p.order == ("triton", "torch") and p.config == other and p.entry["config"] == other
    # the named path runs the entry's config too (the entry chose it); fp32 dots are another
    # space, where the bf16 config is refused and the heuristic runs
    assert REGISTRY.plan("sparse_mla_decode", "torch", H200, path="triton", **MLA).config == other
    assert REGISTRY.plan("sparse_mla_decode", "torch", H200, **MLA, operand_bytes=4).config == \
        configs.sparse_mla_heuristic(128, H200.smem_per_block, 4).to_dict()
    # a config outside the space is never run
    assert REGISTRY.plan("sparse_mla_decode", "jax", H200, **MLA).config == \
        configs.pallas_sparse_mla_heuristic(128, H200.smem_per_block, rows=64, topk=2048,
                                            kv_format="fp8_ds_mla").to_dict()
    # the table's plain path goes first under auto; the kernel path keeps its heuristic
    p = REGISTRY.plan("indexer_topk", "torch", H200, **TOPK)
    assert p.order == ("torch", "triton") and p.config == {}
    pytest.importorskip("triton")
    assert p.config_for("triton") == REGISTRY.heuristic("indexer_topk", "torch", "triton", H200, **TOPK)


def test_a_nearest_entry_decides_the_path_and_the_heuristic_the_config(table_dir):
    """An entry of another B bucket (the nearest in log2 B) puts its path first, but its config
    is not run: the heuristic's config at the call's own shape is (it depends on B x N: the
    Pallas head tiles at B 16 against B 8, H200 2026-12-05)."""
    pytest.importorskip("triton")
    b8 = dict(MLA, B=8)
    n16p = configs.PALLAS_N16P.to_dict()
    assert REGISTRY.heuristic("sparse_mla_decode", "jax", "pallas", H200, **b8) == n16p
    _write([{"op": "sparse_mla_decode", "backend": "jax", "bucket": REGISTRY.bucket("sparse_mla_decode", **b8),
             "path": "pallas", "config": n16p}], table_dir)
    assert REGISTRY.plan("sparse_mla_decode", "jax", H200, **b8).config == n16p          # exact: the entry's
    p = REGISTRY.plan("sparse_mla_decode", "jax", H200, **dict(MLA, B=16))              # nearest: B 8
    assert p.entry is not None and p.path == "pallas"
    assert p.config == configs.PALLAS_W64.to_dict() != n16p
    assert p.config == REGISTRY.heuristic("sparse_mla_decode", "jax", "pallas", H200, **dict(MLA, B=16))


def test_accept_checks_indexer_fields_against_the_search_space():
    pytest.importorskip("triton")
    base = REGISTRY.heuristic("indexer_topk", "torch", "triton", H200, **TOPK)
    ok = REGISTRY.accept("indexer_topk", "torch", "triton", H200, {"pages": 1, "topk_block": 2048}, **TOPK)
    # a table config that does not name the kernel selector runs the default (Triton) kernel
    assert ok == {**{k: v for k, v in base.items() if k != "kernel"}, "pages": 1, "topk_block": 2048}
    assert REGISTRY.accept("indexer_topk", "torch", "triton", H200, {"kernel": "gluon_ws"},
                           **TOPK) == base
    assert REGISTRY.accept("indexer_topk", "torch", "triton", H200, {"kernel": "gluon"},
                           **TOPK) == {**base, "kernel": "gluon"}
    assert REGISTRY.accept("indexer_topk", "torch", "triton", H200, {"pages": 3}, **TOPK) is None
    assert REGISTRY.accept("indexer_topk", "torch", "triton", H200, {"bogus": 1}, **TOPK) is None
    assert REGISTRY.accept("indexer_topk", "torch", "torch", H200, {}, **TOPK) == {}
    assert REGISTRY.accept("indexer_topk", "torch", "torch", H200, {"pages": 1}, **TOPK) is None
    assert REGISTRY.accept("indexer_topk", "torch", "triton", H200, None, **TOPK) is None


def test_accept_fills_the_fields_a_table_leaves_out_from_the_heuristic():
    # a latent cache with fp32 q: no Gluon kernel (16-bit operands only); the heuristic is the
    # Triton 16 x 16 tile, 4 warps, 1 stage, prefetch, and a table naming the head tile alone is
    # filled in from it
    lat = dict(MLA, kv_format="latent", operand_bytes=4)
    heur = REGISTRY.heuristic("sparse_mla_decode", "torch", "triton", H200, **lat)
    assert "kernel" not in heur
    assert REGISTRY.accept("sparse_mla_decode", "torch", "triton", H200, {}, **lat) == heur
    assert REGISTRY.accept("sparse_mla_decode", "torch", "triton", H200, {"block_h": 16},
                           **lat) == {**heur, "block_h": 16}
    part = {"block_h": 64, "block_k": 32, "num_stages": 1}        # not in the fp32 space
    assert REGISTRY.accept("sparse_mla_decode", "torch", "triton", H200, part, **lat) is None
    assert REGISTRY.accept("sparse_mla_decode", "torch", "triton", H200, {"tile": 1}, **lat) is None
    # a 16-bit latent cache: the warp-specialised Gluon kernel, kept by {}
    assert REGISTRY.accept("sparse_mla_decode", "torch", "triton", H200, {},
                           **dict(MLA, kv_format="latent")) == configs.SPARSE_MLA_GLUON_WS.to_dict()
    # fp8 on sm_90 at B 64: the heuristic is the seesaw Gluon kernel (GLUON_XS_PICKED); {} keeps
    # it, a config without "kernel" names a Triton tile (the field selects the kernel, it is not
    # filled in)
    assert REGISTRY.accept("sparse_mla_decode", "torch", "triton", H200, {}, **MLA) == \
        configs.SPARSE_MLA_GLUON_XS.to_dict()
    # (the warps named: the seesaw heuristic's 4 would fill a tile outside the space)
    assert REGISTRY.accept("sparse_mla_decode", "torch", "triton", H200, {**part, "num_warps": 8},
                           **MLA) == configs.SparseMLAConfig(64, 32, 8, 1).to_dict()
    assert REGISTRY.accept("sparse_mla_decode", "torch", "triton", H200, {"kernel": "gluon"},
                           **lat) is None                     # fp32 q: no Gluon kernel


def test_seesaw_kernel_is_planned_only_where_picked(table_dir, monkeypatch):
    """The seesaw kernel (``configs.SPARSE_MLA_GLUON_XS``) is in the H200's space but planned
    only for the formats of ``configs.GLUON_XS_PICKED``: with fp8_ds_mla picked, H 128 and H 100
    (two 64-head blocks) at B x N >= ``GLUON_XS_MIN_ROWS`` plan it; B x N below that, H 64 (one
    block: no cluster pair) and fp8_model1 (not built) plan what they did; with nothing picked
    H 128 plans the warp-specialised kernel."""
    assert configs.SPARSE_MLA_GLUON_XS in configs.sparse_mla_space(H200.smem_per_block)
    assert configs.SPARSE_MLA_GLUON_XS not in configs.sparse_mla_space(configs.SMALL_SMEM)
    plan = lambda **kw: REGISTRY.plan("sparse_mla_decode", "torch", H200,  # noqa: E731
                                      **dict(MLA, **kw)).config
    rows = configs.GLUON_XS_MIN_ROWS
    monkeypatch.setattr(configs, "GLUON_XS_PICKED", ())
    assert plan(H=128, B=rows, N=1) == configs.SPARSE_MLA_GLUON_WS.to_dict()
    monkeypatch.setattr(configs, "GLUON_XS_PICKED", ("fp8_ds_mla",))
    assert plan(H=128, B=rows, N=1) == configs.SPARSE_MLA_GLUON_XS.to_dict()
    assert plan(H=100, B=rows // 2, N=2) == configs.SPARSE_MLA_GLUON_XS.to_dict()
    assert plan(H=128, B=rows - 1, N=1) == configs.SPARSE_MLA_GLUON_WS.to_dict()
    assert plan(H=64, B=64, N=1) == configs.SPARSE_MLA_GLUON_WS.to_dict()
    assert plan(H=128, B=64, N=1, K=640, d_qk=512, kv_format="fp8_model1") == \
        configs.SPARSE_MLA_GLUON.to_dict()


def test_cluster_kernels_listed_only_for_their_triton(monkeypatch):
    """The sm_90 AOT listing of the large space holds the seesaw kernel's launches only with the
    Triton the cluster kernels are written for (3.6: the GPU image's), so the AOT compile of the
    space with another installed Triton (3.9 on CPU machines, which cannot compile them) skips
    them; the other Gluon kernels are listed either way."""
    from kernels.sparse_mla import gluon_cluster, triton_launch
    labels = {}
    for version in ("3.6.0", "3.9.0"):
        monkeypatch.setattr(gluon_cluster, "cluster_kernels_supported",
                            lambda v=None, _ver=version: _ver.startswith("3.6"))
        labels[version] = [s.label for s in triton_launch.aot_specs("large")]
    xs = [lb for lb in labels["3.6.0"] if lb.startswith("gluon_xs ")]
    assert xs and not any(lb.startswith("gluon_xs ") for lb in labels["3.9.0"])
    assert sorted(set(labels["3.6.0"]) - set(labels["3.9.0"])) == sorted(xs)


def test_write_table_merges_old_null_configs_as_empty(table_dir):
    """A table written before every entry carried a config (null) still merges: its kept
    entries get ``{}`` (the plain path's config, the kernel path's heuristic)."""
    b = REGISTRY.bucket("indexer_topk", **TOPK)
    old = {"arch": "sm_90", "gpu": "x", "compute_capability": "9.0", "entries": [
        {"op": "indexer_topk", "backend": "jax", "bucket": b, "path": "pallas", "config": None},
        {"op": "indexer_topk", "backend": "torch", "bucket": b, "path": "torch", "config": None}]}
    (table_dir / "sm_90.json").write_text(json.dumps(old))
    mb = REGISTRY.bucket("sparse_mla_decode", **MLA)
    dispatch.write_table("sm_90", [{"op": "sparse_mla_decode", "backend": "jax", "bucket": mb,
                                    "path": "xla", "config": {}}], gpu="x", compute_capability="9.0",
                         command="pytest", directory=table_dir)
    got = {(e["op"], e["backend"]): e["config"] for e in json.loads((table_dir / "sm_90.json").read_text())["entries"]}
    assert got == {("indexer_topk", "jax"): {}, ("indexer_topk", "torch"): {}, ("sparse_mla_decode", "jax"): {}}
    pytest.importorskip("jax")
    assert REGISTRY.plan("indexer_topk", "jax", H200, **TOPK).config == \
        REGISTRY.heuristic("indexer_topk", "jax", "pallas", H200, **TOPK)


def test_committed_sm90_table_records_a_config_for_every_entry(monkeypatch):
    """Every entry of kernels/dispatch/sm_90.json carries the config its path runs: ``{}`` for a
    plain path, for a kernel path the config its fastest checked row ran (the bench writes it;
    those runs used the heuristic's config, so it equals today's heuristic), which the plan then
    applies."""
    monkeypatch.delenv(dispatch.DISPATCH_DIR_ENV, raising=False)
    dispatch.clear_cache()
    table = json.loads((ROOT / "kernels" / "dispatch" / "sm_90.json").read_text())
    dispatch.validate_table(table)
    has_triton = True
    try:
        import triton  # noqa: F401
        import jax  # noqa: F401
    except ImportError:
        has_triton = False
    for e in table["entries"]:
        assert isinstance(e["config"], dict), e
        if REGISTRY.is_plain(e["backend"], e["path"]):
            assert e["config"] == {}, e
            continue
        if not has_triton:
            continue
        shape = dict(e["bucket"], operand_bytes=2)
        assert e["config"] == REGISTRY.heuristic(e["op"], e["backend"], e["path"], H200, **shape)
        p = REGISTRY.plan(e["op"], e["backend"], H200, **shape)
        assert (p.path, p.config) == (e["path"], e["config"])
    dispatch.clear_cache()


def test_validate_table_wants_a_dict_config_and_empty_for_plain_paths(table_dir):
    b = REGISTRY.bucket("indexer_topk", **TOPK)
    with pytest.raises(ValueError, match="config: expected a dict"):
        _write([{"op": "indexer_topk", "backend": "jax", "bucket": b, "path": "pallas", "config": None}],
               table_dir)
    with pytest.raises(ValueError, match="plain path"):
        _write([{"op": "indexer_topk", "backend": "jax", "bucket": b, "path": "xla",
                 "config": {"pages": 1}}], table_dir)


def test_run_path_falls_through_only_under_auto():
    def nope():
        raise NotImplementedError("not here")
    impls = {"a": nope, "b": lambda: 2}
    assert registry.run_path("op", "auto", impls, ("a", "b")) == 2
    with pytest.raises(NotImplementedError, match="not here"):
        registry.run_path("op", "a", impls, ("a", "b"))
    with pytest.raises(NotImplementedError, match="op: no path can run: a: not here"):
        registry.run_path("op", "auto", {"a": nope}, ("a",))
    with pytest.raises(ValueError, match="path: expected one of"):
        registry.run_path("op", "c", impls, ("a", "b"))


# ----------------------------------------------------------------------------- import direction

LAYERS = {"kernels": 0, "torch_impl": 1, "jax_impl": 1, "parity": 2, "bench": 3}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in LAYERS:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _imports(name: str, f: Path, mods) -> list[tuple[str, bool, int]]:
    """``(imported project module, at module level, line)`` of every import statement."""
    package = name if f.name == "__init__.py" else name.rpartition(".")[0]
    out = []

    def resolve(mod):
        while mod and mod not in mods:
            mod = mod.rpartition(".")[0]
        return mod

    def visit(node, top):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((resolve(a.name), top, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for a in child.names:
                    full = f"{base}.{a.name}"
                    out.append((full if full in mods else resolve(base), top, child.lineno))
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                        ast.Lambda)))
    visit(ast.parse(f.read_text()), True)
    return [(m, top, line) for m, top, line in out if m and m != name]


def test_imports_point_one_way():
    """bench -> parity -> bindings -> kernels: no module imports a higher layer (lazy imports
    included), the two bindings never import each other, nothing imports a ``__main__``."""
    mods = _modules()
    bad = []
    for name, f in mods.items():
        src = name.split(".")[0]
        for target, _, line in _imports(name, f, mods):
            dst = target.split(".")[0]
            if LAYERS[dst] > LAYERS[src] or (LAYERS[dst] == LAYERS[src] == 1 and dst != src):
                bad.append(f"{name}:{line} imports {target}")
            if target.endswith("__main__"):
                bad.append(f"{name}:{line} imports the entry point {target}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_no_import_cycles():
    """No cycle among the project's modules, counting imports inside functions too (the
    ``parity.__main__`` <-> ``parity.jobs`` pair was one)."""
    mods = _modules()
    graph = {n: sorted({t for t, _, _ in _imports(n, f, mods)}) for n, f in mods.items()}
    state: dict[str, int] = {}
    cycles = []

    def dfs(n, stack):
        state[n] = 1
        for t in graph.get(n, ()):
            # a package's __init__ re-exporting its submodules is not a loop with them
            if t.startswith(n + ".") or n.startswith(t + "."):
                continue
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif not state.get(t):
                dfs(t, stack + [t])
        state[n] = 2
    for n in graph:
        if not state.get(n):
            dfs(n, [n])
    assert not cycles, "\n".join(cycles)


def test_plan_reads_the_table_once_per_auto_call(table_dir, monkeypatch):
    """``path="auto"`` in both stacks plans once: one dispatch lookup per call (torch: eager;
    JAX: at trace time), on tables that send each op to its plain path (cheap on the CPU)."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("the CPU interpreter's device plans here; on a GPU the real table is read")
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    import jax

    from kernels import cases, compare
    ti = pytest.importorskip("torch_impl")
    jx = pytest.importorskip("jax_impl")
    from torch_impl._common import as_tensor, device_info

    arch = device_info(torch.device("cpu")).arch
    mla = cases.make_mla_case(3, B=2, N=1, H=16, d_qk=576, K=64, P=16, kv_format="latent",
                              q_dtype="float16", kv_dtype="float16", logical=True)
    idx = cases.make_indexer_case(5, B=2, N=1, H_I=16, P=16, lens=[90, 120], table_len=128, topk=32)
    mb = REGISTRY.bucket("sparse_mla_decode", B=2, N=1, H=16, K=64, d_qk=576, kv_format="latent")
    ib = REGISTRY.bucket("indexer_topk", B=2, N=1, L=128, topk=32)
    lb = REGISTRY.bucket("indexer_logits", B=2, N=1, L=128)
    entries = [{"op": op, "backend": be, "bucket": bkt, "path": REGISTRY.paths(be)[1], "config": {}}
               for op, bkt in (("sparse_mla_decode", mb), ("indexer_topk", ib), ("indexer_logits", lb))
               for be in REGISTRY.backends]
    _write(entries, table_dir, arch=arch)
    calls = []
    real = dispatch.lookup
    monkeypatch.setattr(dispatch, "lookup", lambda *a, **k: calls.append(a[:2]) or real(*a, **k))
    jax.clear_caches()

    kw = {k: v for k, v in mla.kwargs().items() if k != "sm_scale"}
    ref_out, ref_lse = mla.reference()
    out, lse = ti.sparse_mla_decode(as_tensor(mla.q), as_tensor(mla.kv_cache), as_tensor(mla.indices),
                                    mla.sm_scale, path="auto",
                                    **{k: as_tensor(v) if hasattr(v, "shape") else v for k, v in kw.items()})
    compare.assert_pass(compare.check_mla(out, lse, ref_out, ref_lse, q_dtype=mla.q_dtype))
    t_idx = ti.indexer_topk(*(as_tensor(a) for a in idx.args()), idx.topk, k_format=idx.k_format)
    compare.assert_pass(compare.check_topk(t_idx, idx.reference_logits(), idx.topk))
    t_lg = ti.indexer_logits(*(as_tensor(a) for a in idx.args()), k_format=idx.k_format)
    compare.assert_pass(compare.check_logits(t_lg, idx.reference_logits()))
    assert calls == [("sparse_mla_decode", "torch"), ("indexer_topk", "torch"), ("indexer_logits", "torch")]

    calls.clear()
    out, lse = jx.sparse_mla_decode(jnp.asarray(mla.q), jnp.asarray(mla.kv_cache), jnp.asarray(mla.indices),
                                    mla.sm_scale, path="auto",
                                    **{k: jnp.asarray(v) if hasattr(v, "shape") else v for k, v in kw.items()})
    compare.assert_pass(compare.check_mla(out, lse, ref_out, ref_lse, q_dtype=mla.q_dtype))
    j_idx = jx.indexer_topk(*(jnp.asarray(a) for a in idx.args()), idx.topk, k_format=idx.k_format)
    compare.assert_pass(compare.check_topk(j_idx, idx.reference_logits(), idx.topk))
    j_lg = jx.indexer_logits(*(jnp.asarray(a) for a in idx.args()), k_format=idx.k_format)
    compare.assert_pass(compare.check_logits(j_lg, idx.reference_logits()))
    assert calls == [("sparse_mla_decode", "jax"), ("indexer_topk", "jax"), ("indexer_logits", "jax")]
    dispatch.clear_cache()


def test_layer_config_needs_no_test_tooling():
    """The layers' config and weight helpers (``kernels.layer_config``) import neither the case
    generators nor the float64 references, at module level or lazily; ``kernels.layer_reference``
    re-exports them under the old names."""
    from kernels import layer_config, layer_reference

    mods = _modules()
    seen, todo = set(), ["kernels.layer_config", "kernels.checkpoint"]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(t for t, _, _ in _imports(n, mods[n], mods))
    tooling = {"kernels.cases", "kernels.reference", "kernels.compare", "kernels.layer_reference",
               "kernels.layer_compare", "kernels.indexer.reference", "kernels.topk.reference",
               "kernels.sparse_mla.reference"}
    assert not seen & tooling, sorted(seen & tooling)
    for name in layer_config.__all__:
        assert getattr(layer_reference, name) is getattr(layer_config, name), name
