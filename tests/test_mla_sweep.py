"""bench.mla_sweep: the small-head variant space (tied to its AOT counts), the dry run in the
interpreter (every variant checked against the reference) and the child-process isolation (a
variant that crashes or hangs is a row; the next variant still runs)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import mla_aot_counts as counts
from bench import mla_sweep as sw
from kernels import hardware
from kernels.sparse_mla import configs

ROOT = Path(__file__).resolve().parents[1]
COUNTS = ROOT / "bench" / "results" / "mla_aot_counts_small_heads_20261205.json"
H200 = hardware.DeviceInfo(name="NVIDIA H200", cc=(9, 0), num_sms=132,
                           smem_per_block=hardware.smem_limit((9, 0)))
interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                 reason="the dry run is the CPU interpreter's plumbing check")


def _count_rows():
    rows = json.loads(COUNTS.read_text())["rows"]
    return {(r["format"], r["cc"], tuple(sorted(r["config"].items()))): r for r in rows}


def test_sweep_only_gluon_configs_are_in_no_space():
    """The sweep-only few-heads configs stay out of every space until a sweep picks one (so
    neither a dispatch table nor the heuristic can choose them), and their split plan uses the
    residency they were counted at: 2 CTAs an SM at 128 registers, 1 with two X buffers (the
    warp-specialised ``gluon_shws``: two X slots, ~165-208 KB of shared memory, one CTA)."""
    for cfg in sw.SWEEP_ONLY_GLUON:
        assert cfg.kernel in ("gluon_sh", "gluon_shws")
        assert all(cfg not in space for space in configs.SPARSE_MLA_SPACE.values()), cfg
        assert configs.sparse_mla_from_dict(cfg.to_dict(), configs.LARGE_SMEM) is None
        want = 2 if cfg.maxnreg == 128 else 1
        assert configs.sparse_mla_ctas_per_sm(cfg, configs.LARGE_SMEM) == want, cfg


def test_small_head_variants_come_from_the_counts():
    """Every ``--small-heads`` Triton variant has a committed sm_90 count (the format its shape
    runs) without spills that fits the H200, its ``ctas_per_sm`` is that count's residency, its
    split count the launcher's rule at that residency, and it compiled for sm_120 too; the
    Gluon variants are members of the H200's space or of the sweep-only configs (counted in
    bench/NOTES.md, none in a space); names are unique per shape."""
    shapes = sw.small_head_shapes()
    assert set(sw.SMALL_HEAD_VARIANTS) == set(shapes)
    got = _count_rows()
    for key, variants in sw.SMALL_HEAD_VARIANTS.items():
        shape = shapes[key]
        assert variants, key
        names = [v["name"] for v in variants]
        assert len(set(names)) == len(names) and "baseline" not in names, key
        for v in variants:
            cfg = configs.SparseMLAConfig(**v["config"])
            if cfg.kernel != "triton":          # a Gluon kernel of the space (no Triton count)
                assert (cfg in configs.SPARSE_MLA_SPACE[("large", 2)]
                        or cfg in sw.SWEEP_ONLY_GLUON) and v["ctas_per_sm"] is None, (key, v["name"])
                continue
            assert cfg.block_h in (16, 32) and cfg.block_k in (16, 32, 64)
            row = got[(shape.kv_format, 90, tuple(sorted(cfg.to_dict().items())))]
            assert not row.get("error") and row["spill_store_bytes"] == 0, (key, v["name"], row)
            assert row["ctas"] >= 1 and v["ctas_per_sm"] == row["ctas"], (key, v["name"])
            # the split count the launcher's rule gives at the counted residency (times scale)
            rows = shape.B * -(-shape.H // cfg.block_h)
            fill = configs.sparse_mla_num_splits(rows, shape.K, cfg.block_k, H200.num_sms,
                                                 ctas_per_sm=row["ctas"])
            assert sw.resolve_splits(v, shape, cfg, H200) == max(1, round(fill * v["scale"]))
            # every Triton variant also compiles for sm_120 (fit or not: bench/NOTES.md says which)
            r120 = got[(shape.kv_format, 120, tuple(sorted(cfg.to_dict().items())))]
            assert not r120.get("error") and r120["shared"] > 0, (key, v["name"])


def test_occupancy_and_model_by_hand():
    """Residency: today's H16 tile (254 registers, 105,984 B, 4 warps) is 2 CTAs per SM on the
    H200 (registers and shared memory both), none on sm_120; 128 registers and 40 KB at 4
    warps: 4 CTAs (registers), 16 warps. The issue model's time scales with the loop length
    and with resident warps only up to the issue cap."""
    assert counts.occupancy(254, 105_984, 4, 90) == {"ctas": 2, "warps": 8, "limit": "registers+shared"}
    assert counts.occupancy(254, 105_984, 4, 120)["ctas"] == 0
    assert counts.occupancy(128, 40_000, 4, 90)["ctas"] == 4
    cfg = configs.SparseMLAConfig(16, 32, 4, 2, prefetch=False)
    row = {"ctas": 2, "loop": {"total": 1500}}
    p = counts.plan(64, 16, 2048, cfg, 4, 2, 132)
    assert p == {"splits": 4, "ctas": 256, "waves": 256 / 264, "iters": 16, "head_fill": 1.0}
    base = ((64, 16, 2048), cfg, 4, row, 100.0)
    lo, hi = counts.predict((64, 16, 2048), cfg, 4, row, base)
    assert lo == pytest.approx(100.0) and hi == pytest.approx(100.0)
    fast = {"ctas": 4, "loop": {"total": 1500}}       # twice the warps, same loop
    lo, hi = counts.predict((64, 16, 2048), cfg, 8, fast, base)
    assert 50.0 <= lo <= hi <= 100.0


@interpreter
def test_dry_run_small_heads(tmp_path):
    """``--small-heads --dry-run`` on the tiny V4-Flash H8 shape, in this process: every variant
    runs (or shares the interpreter program of an earlier one) and passes the reference check;
    the JSON has the rows and the summary. (The V3.2 H16 row runs the same harness over the same
    kind of variants, ~12 s more of interpreter time on the CI machine: left to a manual
    ``python -m bench.mla_sweep --small-heads --dry-run``; its kernels' configs are checked by
    tests/test_torch_sparse_mla.py.)"""
    out = tmp_path / "s.json"
    rc = sw.main(["--small-heads", "--dry-run", "--no-isolate", "--shapes", "v4_h8",
                  "--out", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["dry_run"] and not doc["partial"]
    for key in ("v4_h8",):
        rows = [r for r in doc["rows"] if r["shape_key"] == key]
        assert len(rows) == 1 + len(sw.SMALL_HEAD_VARIANTS[key]), key
        assert rows[0]["variant"] == "baseline"
        for r in rows:
            if r["status"].startswith("same interpreter program"):
                continue
            assert r["status"] == "ok" and r["check"]["passed"] and r["median_us"] > 0, r
            assert r["splits"] >= 1 and r["config"]["block_h"] >= 16


def test_variant_constants_are_set_for_the_variant_only():
    """A sweep variant's ``constants`` (``bench.mla_sweep._set_constants``) set module constants
    of ``kernels.sparse_mla`` and give back the previous values; a name the module lacks is a
    ValueError naming it (else a typo would time the default twice)."""
    from kernels.sparse_mla import gluon_small_ws, gluon_ws, gluon_xs
    before = (gluon_ws.L2_PREFETCH, gluon_xs.L2_PREFETCH, gluon_small_ws.L2_PREFETCH)
    off, on = (v["constants"] for v in sw.L2_HINT_VARIANTS)
    assert set(off) == set(on) == set(sw.L2_HINT_CONSTANTS)
    assert set(off.values()) == {0} and set(on.values()) == {1}
    old = sw._set_constants(on)
    try:
        assert (gluon_ws.L2_PREFETCH, gluon_xs.L2_PREFETCH, gluon_small_ws.L2_PREFETCH) == (1, 1, 1)
        assert gluon_small_ws.launch_constexprs("fp8_ds_mla")["L2_PREFETCH"] == 1
        # the hint's formats: both since 2026-12-06 (eighteenth session)
        assert gluon_small_ws.launch_constexprs("fp8_model1")["L2_PREFETCH"] == 1
        assert gluon_small_ws.launch_constexprs(None)["L2_PREFETCH"] == 0
        assert gluon_ws.launch_constexprs("fp8_ds_mla")["L2_PREFETCH"] == 1
    finally:
        sw._restore_constants(old)
    assert (gluon_ws.L2_PREFETCH, gluon_xs.L2_PREFETCH, gluon_small_ws.L2_PREFETCH) == before
    with pytest.raises(ValueError, match="gluon_ws has no 'L2_PREFETCHH'"):
        sw._set_constants({"gluon_xs.L2_PREFETCH": 1 - before[1], "gluon_ws.L2_PREFETCHH": 1})
    assert gluon_xs.L2_PREFETCH == before[1]        # nothing set when one name is wrong
    assert sw._shws(configs.SPARSE_MLA_GLUON_SHWS8, l2_hint=True)["constants"] == {
        "gluon_small_ws.L2_PREFETCH": 1,
        "gluon_small_ws.L2_PREFETCH_FORMATS": ("fp8_ds_mla", "fp8_model1")}
    assert sw._shws(configs.SPARSE_MLA_GLUON_SHWS8)["constants"] == {"gluon_small_ws.L2_PREFETCH": 0}
    staged = sw._shws(configs.SPARSE_MLA_GLUON_SHWS16, l2_hint=True, stage=True)
    assert staged["name"] == "gluon_shws_h16_l2_st"
    assert staged["constants"]["gluon_small_ws.RAW_STAGE"] == 1
    old = sw._set_constants(staged["constants"])
    try:
        assert gluon_small_ws.launch_constexprs("fp8_ds_mla")["STAGE"] == 1
    finally:
        sw._restore_constants(old)
    assert gluon_small_ws.launch_constexprs("fp8_ds_mla")["STAGE"] == gluon_small_ws.RAW_STAGE


@interpreter
def test_dry_run_l2_hint(tmp_path):
    """``--l2-hint --dry-run``: per shape the baseline, then the same call with the hint off and
    on, each row recording its constants (the interpreter runs no Gluon kernel, so the two share
    the baseline's program)."""
    out = tmp_path / "s.json"
    assert sw.main(["--l2-hint", "--dry-run", "--no-isolate", "--shapes", "v4_h8",
                    "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["baseline", "baseline_l2hint_off", "baseline_l2hint_on"]
    assert rows[0]["status"] == "ok" and rows[0]["check"]["passed"]
    assert [r.get("constants", {}).get("gluon_ws.L2_PREFETCH") for r in rows] == [None, 0, 1]
    assert all(r["status"].startswith("same interpreter program as baseline") for r in rows[1:])


@interpreter
def test_isolated_children_survive_a_crash_and_a_hang(monkeypatch):
    """``run_isolated`` (each shape's variants in a child): a variant that kills its process and
    one that hangs past ``variant_timeout`` are error rows naming the cause; the variant after
    them runs in a fresh child and passes its reference check."""
    monkeypatch.setenv("MLA_SWEEP_FAULT", "crashes:crash,hangs:hang")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    cfg = dict(block_h=16, block_k=32, num_warps=4, num_stages=2, prefetch=False)
    variants = [dict(sw.BASELINE, name=n, config=cfg) for n in ("crashes", "hangs", "runs")]
    got = {}
    info = sw.run_isolated(sw.small_head_shapes(dry=True)["v32_h16"], variants, dry=True, seed=0,
                           # 4 s: the "runs" variant takes < 1 s once its child is up (2026-12-07,
                           # the interpreter on 2 cores; its start-up is under setup_timeout)
                           deadline=None, variant_timeout=4, setup_timeout=120, max_gb=1,
                           on_row=lambda i, rec: got.setdefault(i, rec))
    assert sorted(got) == [0, 1, 2] and info["gpu"] == "CPU interpreter"
    assert "exit status 7" in got[0]["status"]
    assert "no result after 4 s" in got[1]["status"]
    assert got[2]["status"] == "ok" and got[2]["check"]["passed"], got[2]


@interpreter
def test_pallas_mla_sweep_dry_run(tmp_path):
    """``bench.pallas_mla_sweep --dry-run`` on the tiny V4-Flash H 8 row in the Pallas
    interpreter: the heuristic's choice first, then every config of the CPU's Pallas space, each
    checked against the float64 reference (all pass) and timed; the summary names the fastest."""
    import json as _json
    from bench import pallas_mla_sweep as ps
    out = tmp_path / "p.json"
    assert ps.main(["--dry-run", "--rows", "v4_h8", "--out", str(out)]) == 0
    doc = _json.loads(out.read_text())
    assert doc["dry_run"] and not doc["partial"]
    rows = doc["rows"]
    assert rows[0]["variant"] == "heuristic" and len(rows) == len(ps.variants(hardware.CPU_INTERPRETER))
    assert all(r["status"] == "ok" and r["check"]["passed"] for r in rows), rows
    s = doc["summary"]["v4_h8"]
    assert s["best"]["variant"] in {r["variant"] for r in rows} and s["baseline_us"] > 0



def test_gluon_check_stress_counts_differing_results():
    """bench.gluon_check._stress compares every ``every``-th launch's result bitwise with the
    first: a kernel whose 7th result differs in one bit of the output (or of the LSE) is
    caught on the comparison that covers it, the others match."""
    import torch

    from bench import gluon_check as gc
    out = torch.arange(8, dtype=torch.bfloat16)
    lse = torch.zeros(4, dtype=torch.float32)
    calls = {"n": 0}

    def fn(flip_out=True):
        calls["n"] += 1
        o, l = out.clone(), lse.clone()
        if calls["n"] == 7:        # one launch gives a result one ulp off
            if flip_out:
                o[3] = torch.tensor(3.015625, dtype=torch.bfloat16)   # 3 + 1 ulp
            else:
                l[1] = torch.tensor(1e-45, dtype=torch.float32)
        return o, l

    assert gc._stress(fn, out, lse, 10, every=1)[:2] == (10, 1)
    calls["n"] = 0
    assert gc._stress(lambda: fn(False), out, lse, 10, every=7)[:2] == (2, 1)
    calls["n"] = 0
    assert gc._stress(fn, out, lse, 10, every=5)[:2] == (2, 0)     # 7 is never compared


def test_gluon_check_variants_set_their_module_constants():
    """A gluon_check kernel variant names the module constants it runs with: ``gluon_xs_p56``
    sets ``gluon_xs.PRODUCER_REGS`` (so ``launch_constexprs`` gives the producer 56 registers
    and each consumer warpgroup 200, against the default 64 / 192) and runs clustered, in a
    child process of its own (where the constant stays set)."""
    from bench import gluon_check as gc
    from kernels.sparse_mla import gluon_xs
    assert {"gluon_xo", "gluon_xs", "gluon_xs_p56"} <= set(gc.CLUSTERED) <= set(gc.ISOLATED)
    assert gluon_xs.launch_constexprs("fp8_ds_mla") == dict(PRODUCER_REGS=64, CONSUMER_REGS=192,
                                                            L2_PREFETCH=1)
    try:
        gc._use("gluon_xs_p56")
        assert gluon_xs.launch_constexprs("fp8_ds_mla") == dict(PRODUCER_REGS=56,
                                                                CONSUMER_REGS=200, L2_PREFETCH=1)
    finally:
        gluon_xs.PRODUCER_REGS = 64
    # the L2-hint variants: gluon_xs's own constant, and gluon_ws's (fp8 only; latent keeps 0)
    from kernels.sparse_mla import gluon_ws
    try:
        gluon_xs.L2_PREFETCH = gluon_ws.L2_PREFETCH = 0
        gc._use("gluon_xs_pf")
        assert gluon_xs.launch_constexprs("fp8_ds_mla")["L2_PREFETCH"] == 1
        gc._use("gluon_ws_pf")
        assert gluon_ws.launch_constexprs("fp8_ds_mla")["L2_PREFETCH"] == 1
        assert gluon_ws.launch_constexprs("latent")["L2_PREFETCH"] == 0
    finally:
        gluon_xs.L2_PREFETCH = gluon_ws.L2_PREFETCH = 1
