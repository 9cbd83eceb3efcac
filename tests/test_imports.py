"""Both backends import in the project's environment, and each imports without the other
installed (simulated by making the other framework unimportable in a fresh interpreter)."""
import subprocess
import sys

import pytest

PUBLIC = ["sparse_mla_decode", "indexer_logits", "indexer_topk", "quantize_fp8_ds_mla",
          "dequantize_fp8_ds_mla", "quantize_fp8_indexer", "dequantize_fp8_indexer"]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("backend,blocked", [("torch_impl", "jax"), ("jax_impl", "torch")])
def test_backend_imports_without_the_other(backend, blocked):
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            f"import {backend} as m\n"
            f"missing = [n for n in {PUBLIC!r} if not callable(getattr(m, n, None))]\n"
            f"print('MISSING', missing)\n")
    r = _run(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "MISSING []" in r.stdout


def test_kernels_core_needs_only_numpy_and_ml_dtypes():
    code = ("import sys\n"
            "for m in ('torch', 'jax', 'triton'): sys.modules[m] = None\n"
            "import kernels, kernels.formats, kernels.reference, kernels.compare, kernels.cases, "
            "kernels.presets, kernels.hardware, kernels.dispatch\n"
            "print(kernels.DSV32.d_qk, kernels.DSV4_FLASH.d_qk)\n")
    r = _run(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["576", "512"]
