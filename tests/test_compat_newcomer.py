"""The newcomer's first hour (issue 18): the README's JAX example, the parity table and failure
lines as printed, the flag forms both CLIs share, bench's help and dry-run notice, and the JAX
binding's TypeError for a torch tensor. The parity CLI runs on the fake paths of
tests/test_parity_cli.py (correct = the float64 reference, broken = a perturbed copy)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import test_parity_cli as pcli
from parity import __main__ as cli
from parity import report, runners

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def registry(monkeypatch):
    reg: dict = {}
    monkeypatch.setattr(runners, "REGISTRY", reg)
    monkeypatch.setenv("DSA_FORCE_INTERPRET", "1")

    def install(*rs):
        reg.clear()
        for r in rs:
            runners.register(r)
    return install


# ============================================================================ README, JAX

def test_readme_jax_example_matches_the_reference():
    import jax.numpy as jnp
    import ml_dtypes

    from kernels import compare, reference
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text[text.index("## Use as a library"):], re.S)
    code = next(b for b in blocks if "import jax.numpy as jnp" in b)
    ns: dict = {}
    exec(compile(code, "README.md (JAX example)", "exec"), ns)            # noqa: S102
    q_idx = np.asarray(ns["q_idx"].astype(jnp.float32)).astype(ml_dtypes.float8_e4m3fn)
    ref_logits = reference.indexer_logits(q_idx, np.asarray(ns["w"]), np.asarray(ns["k_cache"]),
                                          np.asarray(ns["block_table"]),
                                          np.asarray(ns["context_lens"]))
    compare.assert_pass(compare.check_topk(np.asarray(ns["idx"]), ref_logits, 256))
    ro, rl = reference.sparse_mla_decode(np.asarray(ns["q"]), np.asarray(ns["kv_cache"]),
                                         np.asarray(ns["idx"]), 576 ** -0.5, kv_format="fp8_ds_mla",
                                         block_table=np.asarray(ns["block_table"]))
    compare.assert_pass(compare.check_mla(np.asarray(ns["out"]), np.asarray(ns["lse"]), ro, rl))


def test_readme_says_how_to_run_python_m_lines_and_w_scaling():
    text = (ROOT / "README.md").read_text()
    assert ".venv/bin/python -m parity" in text and "source .venv/bin/activate" in text
    assert "`H_I^-0.5` and `D_I^-0.5` already folded in" in text     # SPEC "Operation A"


def test_jax_impl_refuses_a_torch_tensor_naming_the_argument():
    import torch

    import jax_impl
    from kernels import cases, compare
    case = cases.make_mla_case(3, B=1, N=1, H=16, d_qk=576, K=16, P=16, kv_format="latent")
    kw = {k: v for k, v in case.kwargs().items()}
    with pytest.raises(TypeError, match=r"^q: expected a jax.Array or a NumPy array, got a torch"):
        jax_impl.sparse_mla_decode(torch.from_numpy(np.asarray(case.q, np.float32)), case.kv_cache,
                                   case.indices, case.sm_scale, **kw)
    with pytest.raises(TypeError, match=r"^indices: .*torch.Tensor"):
        jax_impl.sparse_mla_decode(case.q, case.kv_cache, torch.from_numpy(case.indices),
                                   case.sm_scale, **kw)
    out, lse = jax_impl.sparse_mla_decode(case.q, case.kv_cache, case.indices, case.sm_scale,
                                          path="xla", **kw)                    # NumPy accepted
    ro, rl = case.reference()
    compare.assert_pass(compare.check_mla(np.asarray(out), np.asarray(lse), ro, rl))


# ============================================================================ parity output

def test_failure_lines_print_fail_not_markup(registry, tmp_path, capsys):
    registry(pcli._fake("good", pcli._ref_outputs), pcli._fake("broken", pcli._broken_outputs))
    assert cli.main(["--case", pcli.MLA_CASE, "--no-progress"]) == 1
    printed = capsys.readouterr().out
    assert "[red]" not in printed and "[/red]" not in printed and "[bold" not in printed
    assert re.search(r"^  FAIL mla/fp8_ds_mla/invalid_middle \[sparse_mla_decode\] fake/broken: ",
                     printed, re.M)


def test_table_at_80_columns_never_cuts_a_case_name(registry, monkeypatch, capsys):
    """COLUMNS=80 with five paths: the table does not fit, so each case prints as a block (its
    name whole on its own line, then "path result" pairs packed into 80 columns); nothing is
    cut off with an ellipsis, and the rerun lines stay one line each (copyable). At 200 columns
    the same rows print as the table."""
    monkeypatch.setenv("COLUMNS", "80")
    registry(*(pcli._fake(p, pcli._ref_outputs) for p in ("triton", "torch", "pallas", "xla")),
             pcli._fake("broken", pcli._broken_outputs))
    names = ["mla/fp8_ds_mla/attn_sink_empty_row", "mla/fp8_model1/topk_length", pcli.IDX_CASE]
    argv = [a for n in names for a in ("--case", n)] + ["--no-progress"]
    assert cli.main(argv) == 1
    printed = capsys.readouterr().out
    body = printed[: printed.index("failing comparisons")]
    assert "…" not in printed
    assert max(len(ln) for ln in body.splitlines()) <= 80
    lines = body.splitlines()
    for n in names:
        assert any(ln.startswith(f"{n}  [") for ln in lines), (n, body)
    for ln in body.splitlines():
        if ln.startswith("      "):
            assert re.fullmatch(r"(\s+fake/\w+ (ok [\d.e-]+|FAIL( \d+)?)|\s+cross FAIL \S+)+", ln), ln
    reruns = [ln for ln in printed.splitlines() if ln.startswith("    rerun: ")]
    assert reruns and all(ln.rstrip().endswith("--seed 0") for ln in reruns)
    monkeypatch.setenv("COLUMNS", "200")
    cli.main(argv)
    wide = capsys.readouterr().out
    assert "┃ case" in wide and "…" not in wide


def test_strict_rerun_line_keeps_strict(registry, tmp_path, capsys):
    registry(pcli._fake("good", pcli._ref_outputs),
             pcli._raising("nogpu", NotImplementedError("needs sm_90")))
    out = tmp_path / "r.json"
    assert cli.main(["--case", pcli.MLA_CASE, "--strict", "--no-progress", "--json", str(out)]) == 1
    rows = json.loads(out.read_text())["rows"]
    bad = [r for r in rows if r["path"] == "nogpu"][0]
    assert bad["status"] == "fail" and bad["rerun"].endswith(" --strict")
    assert f"rerun: {bad['rerun']}" in capsys.readouterr().out
    assert report.rerun_command("c", "op", ["a/b"], 0, "full", strict=True).endswith("--full --strict")


def test_jobs_prints_a_line_per_case():
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", JAX_PLATFORMS="cpu",
               DSA_FORCE_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "parity", "-k", "duplicates", "--backend", "torch",
                        "--path", "torch", "--jobs", "2"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = re.findall(r"^\[(\d)/3\] (\S+) \[(\w+)\]: ok", r.stderr, re.M)
    assert sorted(int(k) for k, _, _ in lines) == [1, 2, 3], r.stderr
    assert len({n for _, n, _ in lines}) == 3


# ============================================================================ flags

def test_parity_and_bench_accept_the_same_flag_forms():
    from bench import __main__ as bench_cli
    for flag, a, b in (("--backend", "torch", "jax"), ("--path", "triton", "torch")):
        comma = cli.parse_args([flag, f"{a},{b}"])
        repeated = cli.parse_args([flag, a, flag, b])
        assert getattr(comma, flag[2:]) == getattr(repeated, flag[2:]) == [a, b]
        comma = bench_cli.parse([flag, f"{a},{b}"])
        repeated = bench_cli.parse([flag, a, flag, b, flag, a])
        assert getattr(comma, flag[2:]) == getattr(repeated, flag[2:]) == [a, b]
    assert cli.parse_args(["--op", "indexer_topk,sparse_mla_decode"]).op == \
        bench_cli.parse(["--op", "indexer_topk", "--op", "sparse_mla_decode"]).op
    for parse in (cli.parse_args, bench_cli.parse):
        with pytest.raises(SystemExit) as e:
            parse(["--backend", "torch,cuda"])
        assert e.value.code == 2


def test_bench_flags_have_help_and_defaults():
    from bench import __main__ as bench_cli
    ap = bench_cli.build_parser()
    text = ap.format_help()
    for action in ap._actions:
        assert action.help, f"{action.option_strings} has no help text"
    for flag, shown in (("--out", "bench/results"), ("--max-gb", "60.0"), ("--seed", "0"),
                        ("--ref-max-positions", "262144")):
        assert re.search(re.escape(flag) + r".*?\(default:\s+" + re.escape(shown) + r"\)", text, re.S)


def test_bench_without_a_gpu_says_it_ran_a_dry_run(monkeypatch, tmp_path, capsys):
    from bench import __main__ as bench_cli
    from bench import report as bench_report
    from bench import runner
    monkeypatch.setattr(bench_cli, "_has_cuda", lambda: False)
    monkeypatch.setattr(runner, "run", lambda cfg: {"rows": [], "meta": {}, "json": "x.json",
                                                    "png": None, "dispatch": None})
    monkeypatch.setattr(bench_report, "print_table", lambda rows, meta: None)
    assert bench_cli.main(["--out", str(tmp_path)]) == 0
    cap = capsys.readouterr()
    assert "this was a dry run (no CUDA GPU)" in cap.out
    assert "no CUDA GPU: running the CPU dry run" in cap.err
    assert bench_cli.main(["--dry-run", "--out", str(tmp_path)]) == 0
    assert "this was a dry run (--dry-run)" in capsys.readouterr().out


# ============================================================================ make report

@pytest.mark.skipif(not __import__("shutil").which("make"), reason="needs make")
def test_make_report_writes_one_file_with_every_section(tmp_path):
    """``make report`` with a stand-in interpreter (records its arguments; the parity run
    "fails"): one file with the four sections, each command as the target runs it, a failing
    step's exit status written in and the later steps still run."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()
    py = tmp_path / "py"
    py.write_text("#!/bin/sh\necho \"ran: $*\"\ncase \"$*\" in *--full*) exit 1;; esac\n")
    py.chmod(0o755)
    out = tmp_path / "report.txt"
    r = subprocess.run(["make", "-s", "report", f"VENV={venv}", f"PY={py}", f"REPORT={out}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert f"wrote {out}" in r.stdout
    for line in ("## environment: python -m parity --env", "ran: -m parity --env",
                 "## python -m parity --full --strict", "ran: -m parity --full --strict --no-progress",
                 "[exit status 1]", "## python -m bench --targets",
                 "ran: -m bench --targets --no-progress --no-plot",
                 "## dispatch tables (kernels/dispatch/*.json)", "### kernels/dispatch/sm_90.json"):
        assert line in text, (line, text[:2000])
    assert text.startswith("# dsa-kernels report, ")
