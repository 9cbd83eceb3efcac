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
            "kernels.presets, kernels.hardware, kernels.dispatch, kernels.ops, kernels.registry, "
            "kernels.layer_config\n"
            "from kernels.registry import REGISTRY\n"
            "assert REGISTRY.plan('sparse_mla_decode', 'torch', kernels.hardware.CPU_INTERPRETER, "
            "B=1, N=1, H=16, K=64, d_qk=576, kv_format='latent').order == ('triton', 'torch')\n"
            "print(kernels.DSV32.d_qk, kernels.DSV4_FLASH.d_qk)\n")
    r = _run(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["576", "512"]


def test_readme_library_example_matches_the_reference():
    """The README's library example runs as written and its results are the SPEC's: the top-k
    set against the float64 reference logits, out / lse against the float64 sparse MLA."""
    import re
    from pathlib import Path

    import ml_dtypes
    import numpy as np
    import torch

    from kernels import compare, reference

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"## Use as a library\n\n```python\n(.*?)```", text, re.S).group(1)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)                            # noqa: S102
    q_idx = ns["q_idx"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    ref_logits = reference.indexer_logits(q_idx, ns["w"].numpy(), ns["k_cache"].numpy(),
                                          ns["block_table"].numpy(), ns["context_lens"].numpy())
    compare.assert_pass(compare.check_topk(ns["idx"], ref_logits, 256))
    ref_out, ref_lse = reference.sparse_mla_decode(
        ns["q"].numpy(), ns["kv_cache"].numpy(), ns["idx"].numpy(), 576 ** -0.5,
        kv_format="fp8_ds_mla", block_table=ns["block_table"].numpy())
    compare.assert_pass(compare.check_mla(ns["out"], ns["lse"], ref_out, ref_lse))
    assert np.isfinite(ns["out"].numpy()).all()
