"""The parity command line itself: exit codes, the JSON report's schema, ``--env``, rerun
commands, and that a deliberately broken path is caught (exit status 1) while a correct one
passes. The fake paths are registered through ``parity.runners`` (the registry hook) and return
the float64 reference (correct) or a perturbed copy (broken), so these tests need neither
backend and run in seconds (the decode-layer op included); one subprocess test runs
``python -m parity`` on the real torch
paths of one small case.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kernels import compare
from parity import __main__ as cli
from parity import cases as pcases
from parity import runners

ROOT = Path(__file__).resolve().parents[1]

MLA_CASE = "mla/fp8_ds_mla/invalid_middle"
SINK_CASE = "mla/fp8_ds_mla/attn_sink"        # a prefix of mla/fp8_ds_mla/attn_sink_empty_row
IDX_CASE = "idx/corner/nan_rows"
STEP_CASE = "step/DSV32/N1"
LAYER_CASE = "layer/DSV32/fp8_ds_mla_float32"
LAYER_TP_CASE = "layer/DSV4_FLASH/fp8_tp2_float32"


# ============================================================================ fake paths

def _ref_outputs(op, c):
    """What a correct path returns: the float64 reference rounded to float32 / int32."""
    if op == "sparse_mla_decode":
        out, lse = c.reference()
        return {"out": out.astype(np.float32), "lse": lse.astype(np.float32)}
    if op == "indexer_logits":
        return {"logits": c.reference_logits().astype(np.float32)}
    if op == "indexer_topk":
        return {"indices": c.reference().astype(np.int32)}
    if op == "dsa_decode_step":
        idx = c.indexer.reference().astype(np.int32)
        out, lse = c.mla_reference(idx)
        return {"indices": idx, "out": out.astype(np.float32), "lse": lse.astype(np.float32)}
    if op == "dsa_decode_layer":
        ranks = []
        for r in range(c.tp):
            ref = c.case.reference(r, c.tp)
            ranks.append({"out": ref.out.astype(np.float32), "kv_cache": ref.kv_cache, "k_cache": ref.k_cache,
                          "q": ref.q.astype(np.float32), "idx_q": ref.idx_q, "idx_weights": ref.idx_weights,
                          "indices": ref.indices, "idx_context_lens": ref.idx_context_lens,
                          "attn": ref.attn.astype(np.float32), "lse": ref.lse.astype(np.float32)})
        if c.tp == 1:
            return ranks[0]
        got = {f"r{r}.{k}": v for r, g in enumerate(ranks) for k, v in g.items()}
        got["out"] = np.sum([g["out"].astype(np.float64) for g in ranks], axis=0)
        return got
    raise AssertionError(op)


def _broken_outputs(op, c):
    """Plausible but wrong outputs: a shifted attention output, noisy logits, a wrong top-k."""
    got = _ref_outputs(op, c)
    if op == "dsa_decode_layer":
        for k in [k for k in got if k.endswith("out")]:
            got[k] = got[k] + np.float32(0.05)           # 50x the abs tolerance, every element
        return got
    if "out" in got:
        out = got["out"]
        finite_rows = np.isfinite(got["lse"])
        out[finite_rows] += np.float32(0.05)             # 50x the abs tolerance, on non-empty rows
    if "logits" in got:
        lg = got["logits"]
        fin = np.isfinite(lg)
        lg[fin] *= np.float32(1.01) + np.float32(0.02) * np.random.default_rng(0).random(int(fin.sum()), np.float32)
    if op == "indexer_topk":
        # replace the best-scored index of the first row with the worst qualifying position
        lg = c.reference_logits()
        row = got["indices"][0, 0]
        ok = np.flatnonzero(np.isfinite(lg[0, 0]))
        unselected = np.setdiff1d(ok, row)
        assert unselected.size, "case must have more qualifying positions than topk"
        row[0] = unselected[np.argmin(lg[0, 0][unselected])]
    return got


def _fake(path, fn):
    return runners.Runner("fake", path, {op: (lambda c, op=op: fn(op, c)) for op in runners.OPS})


def _raising(path, exc):
    def f(op, c):
        raise exc
    return _fake(path, f)


@pytest.fixture
def registry(monkeypatch):
    """Replace the registry by fakes for one test; returns a function that installs runners."""
    reg: dict = {}
    monkeypatch.setattr(runners, "REGISTRY", reg)

    def install(*rs):
        reg.clear()
        for r in rs:
            runners.register(r)
    return install



@pytest.fixture(autouse=True)
def _cpu_grid(monkeypatch):
    """The CLI is tested on the CPU grid (its case names are what these tests select), also on a
    GPU machine; the GPU grid is exercised by `python -m parity` itself there."""
    monkeypatch.setenv("DSA_FORCE_INTERPRET", "1")


def _run(argv, tmp_path):
    path = tmp_path / "parity.json"
    rc = cli.main([*argv, "--no-progress", "--json", str(path)])
    doc = json.loads(path.read_text()) if path.exists() else None
    return rc, doc


def _rows(doc, **match):
    return [r for r in doc["rows"] if all(r.get(k) == v for k, v in match.items())]


# ============================================================================ tests

def test_correct_paths_pass_with_exit_0_and_json_schema(registry, tmp_path):
    registry(_fake("good", _ref_outputs), _fake("good2", _ref_outputs))
    rc, doc = _run(["-k", f"{MLA_CASE},{IDX_CASE}"], tmp_path)
    assert rc == 0
    # top-level schema (SPEC "Result files")
    for key in ("gpu", "compute_capability", "versions", "date", "command", "rows"):
        assert key in doc, key
    assert doc["versions"]["numpy"] == np.__version__
    assert dt.datetime.fromisoformat(doc["date"]).tzinfo is not None
    assert doc["command"].startswith("python -m parity ") and MLA_CASE in doc["command"]
    assert doc["mode"] == "default" and doc["seed"] == 0
    # one reference row per (case, op, path), one cross row per (case, op) pair of paths
    ref = _rows(doc, against="reference")
    assert {(r["case"], r["op"]) for r in ref} == {
        (MLA_CASE, "sparse_mla_decode"), (IDX_CASE, "indexer_logits"), (IDX_CASE, "indexer_topk")}
    assert len(ref) == 6 and len(_rows(doc, against="fake/good2")) == 3
    for r in doc["rows"]:
        for key in ("case", "op", "backend", "path", "passed", "worst_error", "tolerance"):
            assert key in r, key
        assert r["passed"] is True and r["status"] == "pass"
    mla = _rows(doc, case=MLA_CASE, path="good", against="reference")[0]
    # float32 rounding of the reference: far inside the SPEC bound, and the bound is SPEC's
    assert 0.0 < mla["worst_error"] < 1e-5 and mla["ratio"] < 0.01
    assert mla["tolerance"] >= min(compare.LSE_ABS, compare.OUT_ABS)     # lse or out bound
    assert mla["kv_format"] == "fp8_ds_mla" and mla["H"] == 16
    # corner cases' shape fields come from the built case (were null): B, N, P for all, L for
    # the indexer (its context lengths)
    for r in doc["rows"]:
        for key in ("B", "N", "P"):
            assert isinstance(r[key], int) and r[key] >= 1, (r["case"], key, r[key])
    assert all(isinstance(r["L"], int) and r["L"] >= 0 for r in _rows(doc, case=IDX_CASE))
    topk = _rows(doc, case=IDX_CASE, op="indexer_topk", path="good", against="reference")[0]
    assert topk["ratio"] == 0.0


def test_broken_mla_path_fails_with_exit_1_and_rerun_command(registry, tmp_path, capsys):
    """A shifted output fails (exit 1); the printed rerun command selects exactly the failing
    case, even when ``-k`` with that name (a substring match) selects more, and rebuilds the same
    inputs (same worst error)."""
    registry(_fake("good", _ref_outputs), _fake("broken", _broken_outputs))
    rc, doc = _run(["-k", SINK_CASE], tmp_path)
    assert rc == 1
    # -k is a substring match: the name of one case selects its longer-named sibling too
    assert {r["case"] for r in doc["rows"]} == {SINK_CASE, SINK_CASE + "_empty_row"}
    good = _rows(doc, case=SINK_CASE, path="good", against="reference")[0]
    bad = _rows(doc, case=SINK_CASE, path="broken", against="reference")[0]
    assert good["passed"] is True
    assert bad["passed"] is False and bad["status"] == "fail"
    assert bad["ratio"] > 10 and abs(bad["worst_error"] - 0.05) < 1e-3
    cross = _rows(doc, case=SINK_CASE, against="fake/broken")[0]
    assert cross["path"] == "good" and cross["passed"] is False
    assert bad["rerun"] == (f"python -m parity --case {SINK_CASE} --op sparse_mla_decode "
                            f"--backend fake --path broken --seed 0")
    assert cross["rerun"] == (f"python -m parity --case {SINK_CASE} --op sparse_mla_decode "
                              f"--backend fake --path good,broken --seed 0")
    printed = capsys.readouterr().out
    assert "FAIL" in printed and bad["rerun"] in printed
    # the printed command, run as printed: exactly one case, op and path, the same failure
    argv = shlex.split(bad["rerun"])
    assert argv[:3] == ["python", "-m", "parity"]
    assert cli.main([*argv[3:], "--list"]) == 0
    assert capsys.readouterr().out.split("\n") == [f"{SINK_CASE}  [sparse_mla_decode]", ""]
    (tmp_path / "again").mkdir()
    rc, again = _run(argv[3:], tmp_path / "again")
    assert rc == 1
    assert [(r["case"], r["op"], r["path"], r["against"]) for r in again["rows"]] == [
        (SINK_CASE, "sparse_mla_decode", "broken", "reference")]
    assert again["rows"][0]["worst_error"] == bad["worst_error"]
    capsys.readouterr()
    # the cross row's command: the same one case on both paths of the pair
    assert cli.main([*shlex.split(cross["rerun"])[3:], "--list"]) == 0
    assert capsys.readouterr().out.split("\n") == [f"{SINK_CASE}  [sparse_mla_decode]", ""]


def test_case_selects_exact_names_and_lists_close_names(registry, capsys):
    """``--case`` is exact and repeatable, combines with ``-k`` / ``--op`` (all must match); an
    unknown name exits 2 naming the closest case names; ``-k`` stays a substring match."""
    registry(_fake("good", _ref_outputs))

    def listed(*argv):
        assert cli.main([*argv, "--list"]) == 0
        return capsys.readouterr().out.splitlines()

    assert listed("-k", "idx/corner/ties") == [
        "idx/corner/ties  [indexer_topk]", "idx/corner/ties_sorted  [indexer_topk]"]
    assert listed("--case", "idx/corner/ties") == ["idx/corner/ties  [indexer_topk]"]
    assert listed("--case", IDX_CASE) == [f"{IDX_CASE}  [indexer_logits]", f"{IDX_CASE}  [indexer_topk]"]
    assert listed("--case", IDX_CASE, "--op", "indexer_topk") == [f"{IDX_CASE}  [indexer_topk]"]
    assert listed("--case", IDX_CASE, "--case", SINK_CASE + "_empty_row") == [
        f"{SINK_CASE}_empty_row  [sparse_mla_decode]", f"{IDX_CASE}  [indexer_logits]",
        f"{IDX_CASE}  [indexer_topk]"]   # grid order, not argument order
    assert listed("--case", SINK_CASE, "--case", IDX_CASE, "-k", "idx/") == [
        f"{IDX_CASE}  [indexer_logits]", f"{IDX_CASE}  [indexer_topk]"]
    # a typo: usage error, the message names the flag, the bad name and the closest real names
    assert cli.main(["--case", "mla/fp8_ds_mla/atn_sink", "--case", IDX_CASE, "--list"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--case: expected the exact name of a case of this grid" in err
    assert f"got 'mla/fp8_ds_mla/atn_sink' (closest: {SINK_CASE}," in err
    assert IDX_CASE not in err                      # only the unknown name is reported
    assert cli.main(["--case", "zzz", "--list"]) == 2
    assert "got 'zzz' (no close name)" in " ".join(capsys.readouterr().err.split())
    # a real name that the other selectors exclude: nothing to run, also a usage error
    assert cli.main(["--case", SINK_CASE, "--op", "indexer_topk", "--list"]) == 2
    assert (f"no case of this grid matches --case {SINK_CASE} --op indexer_topk"
            in " ".join(capsys.readouterr().err.split()))
    with pytest.raises(TypeError, match="names: expected a list of case names, got the string"):
        pcases.filter_grid(pcases.build_grid(mode="quick", gpu=False), names=SINK_CASE)


def test_help_lists_every_registered_op_backend_and_path(registry, capsys):
    """--help's choices come from the registries, not a hand-written list."""
    registry(_fake("good", _ref_outputs), runners.Runner("other", "alt", {}))
    text = " ".join(cli.build_parser().format_help().split())
    assert f"comma-separated ops ({', '.join(runners.OPS)}; default all)" in text
    assert "dsa_decode_layer" in runners.OPS
    assert "comma-separated backends to run (fake, other; default all)" in text
    assert "comma-separated paths to run (good, alt; default all)" in text
    assert "a substring match like pytest -k" in text and "--case" in text


def test_wrong_topk_is_caught(registry, tmp_path):
    registry(_fake("good", _ref_outputs), _fake("broken", _broken_outputs))
    rc, doc = _run(["-k", IDX_CASE, "--op", "indexer_topk"], tmp_path)
    assert rc == 1
    bad = _rows(doc, path="broken", against="reference")[0]
    assert bad["passed"] is False and "differs from the exact top-" in bad["message"]
    cross = _rows(doc, against="fake/broken")[0]
    assert cross["passed"] is False and "top-k sets differ in 1 rows" in cross["message"]
    assert _rows(doc, path="good", against="reference")[0]["passed"] is True


def test_broken_logits_and_step_are_caught(registry, tmp_path):
    registry(_fake("broken", _broken_outputs))
    rc, doc = _run(["-k", f"{IDX_CASE},{STEP_CASE}", "--op", "indexer_logits,dsa_decode_step"],
                   tmp_path)
    assert rc == 1
    by_op = {r["op"]: r for r in _rows(doc, against="reference")}
    assert set(by_op) == {"indexer_logits", "dsa_decode_step"}
    assert by_op["indexer_logits"]["passed"] is False and "cosine" in by_op["indexer_logits"]["message"]
    # the step's top-k is right, its attention output is not
    assert by_op["dsa_decode_step"]["passed"] is False and "out:" in by_op["dsa_decode_step"]["message"]


def test_unavailable_is_not_a_failure_unless_strict(registry, tmp_path):
    registry(_fake("good", _ref_outputs),
             _raising("nogpu", NotImplementedError("needs sm_90, this is a toaster")))
    rc, doc = _run(["-k", MLA_CASE], tmp_path)
    assert rc == 0
    na = _rows(doc, path="nogpu")[0]
    assert na["status"] == "unavailable" and na["passed"] is None
    assert "toaster" in na["message"]
    assert _rows(doc, path="good")[0]["passed"] is True
    rc, doc = _run(["-k", MLA_CASE, "--strict"], tmp_path)
    assert rc == 1 and _rows(doc, path="nogpu")[0]["status"] == "fail"


def test_exception_in_a_path_is_a_failure(registry, tmp_path):
    registry(_raising("crash", RuntimeError("illegal memory access")))
    rc, doc = _run(["-k", MLA_CASE], tmp_path)
    assert rc == 1
    row = _rows(doc, path="crash")[0]
    assert row["status"] == "error" and row["passed"] is False
    assert row["message"] == "RuntimeError: illegal memory access"


def test_budget_reports_the_cases_that_ran_and_lists_the_rest(registry, tmp_path):
    """``--budget-s``: no case starts after the budget; the report holds the cases that ran
    (checked as usual), the JSON names the others under ``not_run``, exit status 3 (none
    failed); a failure among the cases that ran still exits 1."""
    import time as _time

    def slow(op, c):
        _time.sleep(1.2)                        # past the 1 s budget after the first case
        return _ref_outputs(op, c)
    registry(_fake("slow", slow))
    rc, doc = _run(["-k", f"{MLA_CASE},{IDX_CASE}", "--budget-s", "1"], tmp_path)
    assert rc == 3
    ran = {(r["case"], r["op"]) for r in doc["rows"]}
    assert ran == {(MLA_CASE, "sparse_mla_decode")}
    assert all(r["status"] == "pass" for r in doc["rows"])
    assert doc["budget_s"] == 1
    assert doc["not_run"] == [{"case": IDX_CASE, "op": "indexer_logits"},
                              {"case": IDX_CASE, "op": "indexer_topk"}]
    registry(_raising("crash", RuntimeError("illegal memory access")))
    rc, doc = _run(["-k", f"{MLA_CASE},{IDX_CASE}", "--budget-s", "1"], tmp_path)
    assert rc == 1 and not doc["not_run"]      # the fake fails at once: every case ran
    rc, doc = _run(["-k", MLA_CASE, "--budget-s", "100"], tmp_path)
    assert rc == 1 and doc["not_run"] == []


def test_usage_errors_exit_2(registry, capsys):
    registry(_fake("good", _ref_outputs))
    assert cli.main(["-k", "no/such/case", "--no-progress"]) == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["--op", "not_an_op"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["--quick", "--full"])
    assert e.value.code == 2


@pytest.mark.parametrize("argv, option", [(["--backend", ""], "--backend"), (["--op", ""], "--op"),
                                           (["--path", ""], "--path"), (["--path", ","], "--path"),
                                           (["-k", ""], "-k"), (["-k", ","], "-k")])
def test_empty_selector_is_a_usage_error_naming_the_option(registry, capsys, argv, option):
    """An empty value would select the whole grid; it is rejected (exit 2) before anything runs."""
    registry(_fake("good", _ref_outputs))
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--list"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: expected a non-empty" in err, err
    assert "got ''" in err or "got ','" in err, err


def test_unwritable_json_is_a_usage_error_before_any_case_runs(registry, tmp_path, capsys):
    calls = []
    registry(_fake("good", lambda op, c: calls.append(op) or _ref_outputs(op, c)))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for target, why in [("/proc/x.json", "cannot create files in /proc"),
                        (str(a_file / "x.json"), "is not a directory"),
                        (str(tmp_path), "is a directory"),
                        ("", "an empty path")]:
        with pytest.raises(SystemExit) as e:
            cli.main(["-k", MLA_CASE, "--no-progress", "--json", target])
        assert e.value.code == 2, target
        err = capsys.readouterr().err
        assert "argument --json: expected a writable file path" in err and why in err, err
    assert calls == []                                   # checked before the first case
    assert a_file.read_text() == "x"
    # a directory that does not exist yet is created by the report writer, as before
    rc, doc = _run(["-k", MLA_CASE], tmp_path / "new" / "dir")
    assert rc == 0 and doc["summary"]["failed"] == 0 and calls


def test_env_lists_versions_and_probes_paths(registry, capsys):
    registry(_fake("good", _ref_outputs), _fake("broken", _broken_outputs),
             _raising("nogpu", NotImplementedError("no such GPU")))
    assert cli.main(["--env"]) == 0
    out = capsys.readouterr().out
    assert f"numpy: {np.__version__}" in out
    assert "compute capability" in out
    lines = {tuple(line.split()[:2]): line for line in out.splitlines() if line.startswith("  fake/")}
    assert set(cli._probe_cases()) == set(runners.OPS)
    for op in runners.OPS:
        assert lines[("fake/good", op)].split()[2] == "ok"
        assert "unavailable: NotImplementedError: no such GPU" in lines[("fake/nogpu", op)]
    assert "WRONG" in lines[("fake/broken", "sparse_mla_decode")]
    assert "WRONG" in lines[("fake/broken", "indexer_topk")]


def test_layer_op_catches_a_wrong_output_and_checks_every_rank(registry, tmp_path):
    """``--op dsa_decode_layer``: the reference's own outputs pass (also split over 2 ranks,
    whose partial outputs sum to the TP = 1 reference), a shifted output fails against the
    reference and against the correct path."""
    registry(_fake("good", _ref_outputs), _fake("broken", _broken_outputs))
    rc, doc = _run(["-k", LAYER_CASE, "--op", "dsa_decode_layer"], tmp_path)
    assert rc == 1
    good = _rows(doc, path="good", against="reference")[0]
    bad = _rows(doc, path="broken", against="reference")[0]
    assert good["passed"] is True and good["ratio"] < 0.01
    assert (good["preset"], good["kv_format"], good["q_dtype"], good["H"]) == \
        ("DSV32", "fp8_ds_mla", "float32", 4)
    assert bad["passed"] is False and "out:" in bad["message"]
    assert _rows(doc, against="fake/broken")[0]["passed"] is False
    assert bad["rerun"] == (f"python -m parity --case {LAYER_CASE} --op dsa_decode_layer --backend fake "
                            f"--path broken --seed 0")
    registry(_fake("good", _ref_outputs), _fake("good2", _ref_outputs))
    rc, doc = _run(["-k", LAYER_TP_CASE, "--op", "dsa_decode_layer"], tmp_path)
    assert rc == 0 and all(r["passed"] for r in doc["rows"]) and len(doc["rows"]) == 3
    assert _rows(doc, path="good", against="reference")[0]["tp"] == 2


def test_layer_cases_per_mode_and_machine():
    """--quick on the CPU adds at most 2 layer cases (scaled-down, float32); a GPU runs the
    two fp8 cases at the real preset dimensions in bf16 (``--full``: also float32)."""
    def layer(mode, gpu):
        return [c for c in pcases.build_grid(mode=mode, gpu=gpu) if c.op == "dsa_decode_layer"]
    assert [c.name for c in layer("quick", False)] == [LAYER_CASE, "layer/DSV4_FLASH/fp8_model1_float32"]
    assert len(layer("default", False)) == 4 and len(layer("full", False)) == 6
    assert all(c.params["hidden"] == 256 and c.params["q_dtype"] == "float32" for c in layer("full", False))
    for mode, n in (("quick", 2), ("default", 2), ("full", 4)):
        cs = layer(mode, True)
        assert len(cs) == n
        by = {c.params["preset"]: c.params for c in cs}
        v32, v4 = by["DSV32"], by["DSV4_FLASH"]
        assert (v32["H"], v32["hidden"], v32["K"], v32["B"], v32["L"]) == (128, 7168, 2048, 2, 3072)
        assert (v4["H"], v4["hidden"], v4["K"], v4["B"], v4["L"]) == (64, 4096, 512 + 128, 2, 1664)
        want = {"bfloat16"} if mode != "full" else {"bfloat16", "float32"}
        assert {c.params["q_dtype"] for c in cs} == want


def test_case_inputs_depend_only_on_name_seed_and_mode():
    a = {c.name + c.op: c for c in pcases.build_grid(mode="default", gpu=False, seed=3)}
    b = pcases.filter_grid(pcases.build_grid(mode="default", gpu=False, seed=3), names=[MLA_CASE])
    assert [c.name for c in b] == [MLA_CASE]          # an exact name (--case) selects only that case
    x, y = a[MLA_CASE + "sparse_mla_decode"].build(), b[0].build()
    assert np.array_equal(x.q, y.q) and np.array_equal(x.indices, y.indices)
    assert x.kv_cache.tobytes() == y.kv_cache.tobytes()
    z = pcases.filter_grid(pcases.build_grid(mode="default", gpu=False, seed=4), names=[MLA_CASE])[0].build()
    assert not np.array_equal(x.q, z.q)
    # names are unique per op, and the grid covers every op and both presets
    grid = pcases.build_grid(mode="default", gpu=False, seed=0)
    keys = [(c.name, c.op) for c in grid]
    assert len(keys) == len(set(keys))
    assert {c.op for c in grid} == set(runners.OPS)
    assert {c.params.get("preset") for c in grid} >= {"DSV32", "DSV4_FLASH"}


def test_step_case_has_serving_structure():
    """Sinks and recent tokens win the reference top-k; nothing outside [0, L_b) is valid."""
    step = pcases.filter_grid(pcases.build_grid(seed=0), pattern=STEP_CASE)[0].build()
    c = step.indexer
    idx = c.reference()
    L = int(c.context_lens[0])
    sel = set(idx[0, 0][idx[0, 0] >= 0].tolist())
    assert {0, 1, 2, 3} <= sel                                  # the sink tokens
    assert len(sel & set(range(L - 64, L))) >= 60               # the recent window
    assert (idx[-1, 0] == -1).any()                             # one request shorter than K
    out, lse = step.mla_reference(idx)
    assert np.isfinite(out).all() and np.isfinite(lse).all()    # no NaN row was selected


def _parity_cli(args, out, timeout):
    """``python -m parity --backend torch --no-progress --json out`` + ``args`` in the CPU grid
    in the interpreter (also on a GPU machine: the case names are CPU-grid names)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", JAX_PLATFORMS="cpu",
               DSA_FORCE_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "parity", *args, "--backend", "torch",
                        "--no-progress", "--json", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.exists(), r.stderr[-2000:] + r.stdout[-2000:]
    return r, json.loads(out.read_text())


@pytest.fixture(scope="module")
def duplicates_one_process(tmp_path_factory):
    """``-k duplicates --jobs 1`` (the three ``mla/*/duplicates`` cases in one process), run once
    per module: the one-process side of the ``--jobs`` test, and its ``mla/fp8_model1/duplicates``
    rows the end-to-end check of the real torch paths (which ran that case alone before:
    the same rows, case inputs depend only on name, seed and mode; 2026-12-07, ~11 s of CPU run)."""
    return _parity_cli(["-k", "duplicates", "--jobs", "1"],
                       tmp_path_factory.mktemp("parity_dup") / "r1.json", 600)


def test_python_m_parity_on_real_torch_paths(duplicates_one_process):
    """End to end through ``python -m parity`` on one small case of the torch backend
    (``mla/fp8_model1/duplicates``, in the run of the three duplicates cases): each path either
    passes against the reference or is reported unavailable with its reason."""
    r, doc = duplicates_one_process
    ref = _rows(doc, case="mla/fp8_model1/duplicates", against="reference")
    assert [r_["path"] for r_ in ref] == ["triton", "torch"]
    for row in ref:
        if row["status"] == "unavailable":
            assert row["message"], "an unavailable path must say why"
        else:
            assert row["passed"] is True, row["message"]
            assert 0.0 < row["ratio"] <= 1.0
    assert r.returncode == (1 if any(x["status"] in ("fail", "error") for x in doc["rows"]) else 0), r.stderr[-2000:]


def test_jobs_gives_the_rows_of_one_process(tmp_path, duplicates_one_process):
    """``--jobs 2`` (spawned workers, round-robin cases) writes the same rows, in the same
    order and with the same verdicts and errors, as one process."""
    docs = [duplicates_one_process[1],
            _parity_cli(["-k", "duplicates", "--jobs", "2"], tmp_path / "r2.json", 600)[1]]
    key = lambda row: (row["case"], row["path"], row["against"], row["status"], row["worst_error"])  # noqa: E731
    assert [key(x) for x in docs[0]["rows"]] == [key(x) for x in docs[1]["rows"]]
    assert len({row["case"] for row in docs[0]["rows"]}) == 3


def shutil_which(name):
    import shutil
    return shutil.which(name)


def test_jobs_budget_stops_the_workers_and_lists_what_did_not_run(tmp_path):
    """``--jobs 2 --budget-s 1``: the spawned workers (each imports torch first, which takes
    longer than the budget) are stopped when it is spent; the JSON is still written, every case
    the run did not finish is under ``not_run`` and the exit status is 3."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", JAX_PLATFORMS="cpu",
               DSA_FORCE_INTERPRET="1")
    out = tmp_path / "r.json"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "parity", "-k", "duplicates", "--backend", "torch",
                        "--jobs", "2", "--budget-s", "1", "--json", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert time.perf_counter() - t0 < 120, "the workers were not stopped"
    doc = json.loads(out.read_text())
    assert r.returncode == 3, r.stderr[-2000:]
    ran = {row["case"] for row in doc["rows"]}
    missing = {x["case"] for x in doc["not_run"]}
    assert len(ran | missing) == 3 and not ran & missing and missing
    assert "did not run" in r.stderr
    # a budget past threading.TIMEOUT_MAX (the wait on the workers): every case runs, exit 0
    r = subprocess.run([sys.executable, "-m", "parity", "-k", "duplicates", "--backend", "torch",
                        "--path", "torch", "--jobs", "2", "--budget-s", str(10 ** 20),
                        "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    doc = json.loads(out.read_text())
    assert r.returncode == 0, r.stderr[-2000:]
    assert doc["not_run"] == [] and len({row["case"] for row in doc["rows"]}) == 3
