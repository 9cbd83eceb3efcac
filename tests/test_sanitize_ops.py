"""scripts/sanitize_ops.py (the adversarial-input run that scripts/gpu_run.sh sanitize:* wraps in
compute-sanitizer memcheck): a few of its torch cases run here (strided fp8 pages among them),
in the interpreter on a CPU, so the script cannot rot; a wrong result must print FAIL and exit 1.
On a GPU every torch case runs."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_PATH = Path(__file__).resolve().parent.parent / "scripts" / "sanitize_ops.py"


def _script():
    spec = importlib.util.spec_from_file_location("sanitize_ops", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cases_pass_against_the_reference(capsys):
    mod = _script()
    ks = [] if torch.cuda.is_available() else ["-k", "mla_table_fp8_model1", "-k", "idx_pages_past",
                                               "-k", "mla_strided_pages"]
    assert mod.main(ks) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "SKIP" not in out and out.count("PASS torch/") >= 4
    assert "PASS torch/mla_strided_pages_native" in out
    assert "PASS torch/mla_strided_pages_fp8_model1" in out


def test_a_wrong_result_fails(capsys, monkeypatch):
    import torch_impl
    mod = _script()
    real = torch_impl.sparse_mla_decode

    def off_by_a_bit(*a, **kw):
        out, lse = real(*a, **kw)
        return out * 1.01, lse

    monkeypatch.setattr(torch_impl, "sparse_mla_decode", off_by_a_bit)
    assert mod.main(["-k", "mla_slots_fp8_model1"]) == 1
    assert "FAIL torch/mla_slots_fp8_model1" in capsys.readouterr().out
    torch_names = [n for n, _ in mod.cases_for("torch")]
    jax_names = [n for n, _ in mod.cases_for("jax")]
    assert len(set(torch_names)) == len(torch_names) and set(jax_names) <= set(torch_names)
