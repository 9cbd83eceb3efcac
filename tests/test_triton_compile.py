"""Every launch config the torch_impl launchers can choose compiles for sm_120 and sm_90 and fits
the shared memory per block of that GPU (kernels.hardware.SMEM_PER_BLOCK). sm_120 (the target)
is checked everywhere; sm_90 on GPU machines or with ``DSA_AOT_SM90=1`` (tests/conftest.py).

No GPU is needed: ``kernels._triton_aot`` compiles with Triton's bundled ptxas for
``GPUTarget("cuda", cc, 32)`` in a subprocess without ``TRITON_INTERPRET`` (this test process
has it set on CPU machines, and ``@triton.jit`` would return interpreter objects).

Registry: :data:`LAUNCHERS` maps a launcher name to a function ``smem_class -> [LaunchSpec]``
listing every (kernel, signature, constexprs, num_warps, num_stages) that launcher can launch on
a GPU of that shared-memory class (``kernels.sparse_mla.configs.smem_class``), from the module
beside each kernel.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from kernels import _triton_aot as _aot
from kernels import hardware
from kernels.cache_write import triton as _cache_write
from kernels.indexer import triton_aot as _indexer_aot
from kernels.layer_prep import triton as _layer_prep
from kernels.sparse_mla import configs, triton_launch as _sparse_mla
from kernels.topk import triton_aot as _topk_aot

# launcher name -> specs(smem_class); each lives beside its kernel.
LAUNCHERS = {
    "sparse_mla_decode": _sparse_mla.aot_specs,
    "indexer_logits": _indexer_aot.aot_specs,
    "indexer_topk": _topk_aot.aot_specs,
    "cache_write": _cache_write.aot_specs,
    "layer_prep": _layer_prep.aot_specs,
}

# (cc as an int for GPUTarget, compute capability tuple for the smem table)
TARGETS = {120: (12, 0), 90: (9, 0)}

# The GPU image's Triton (the Makefile unpacks it into .venv/triton-gpu-image on machines without
# a GPU): sm_120 fit is also checked with the compiler the GPU runs, not only the one installed.
GPU_IMAGE_TRITON = "3.6.0"
_GPU_IMAGE_DIR = Path(os.environ.get("DSA_TRITON_GPU_IMAGE_DIR")
                      or Path(__file__).resolve().parents[1] / ".venv" / "triton-gpu-image")


def _gpu_image_triton_is_other() -> bool:
    """Whether the installed Triton is another version than the GPU image's."""
    import triton
    return triton.__version__.split("+")[0] != GPU_IMAGE_TRITON


def _gpu_image_triton() -> str | None:
    """The folder holding the GPU image's Triton, or None when the installed Triton is that
    version (a GPU machine) and the second compile would repeat the first."""
    if not _gpu_image_triton_is_other():
        return None
    if not (_GPU_IMAGE_DIR / "triton" / "__init__.py").exists():
        pytest.fail(f"Triton {GPU_IMAGE_TRITON} (the GPU image's) is not unpacked in "
                    f"{_GPU_IMAGE_DIR}: run `make env` (the Makefile installs it there on "
                    f"machines without a GPU), or point DSA_TRITON_GPU_IMAGE_DIR at a folder "
                    f"holding it (pip install --no-deps --target DIR triton=={GPU_IMAGE_TRITON})")
    return str(_GPU_IMAGE_DIR)


# sm_90 (the H200; not the target) is checked on GPU machines or with DSA_AOT_SM90=1
# (tests/conftest.py); sm_120 always.
CCS = [pytest.param(cc, marks=pytest.mark.sm90, id=f"sm_{cc}") if cc == 90
       else pytest.param(cc, id=f"sm_{cc}") for cc in sorted(TARGETS)]


@functools.lru_cache(maxsize=None)
def _compiled(cc: int, launcher: str, triton_path: str | None = None) -> tuple:
    limit = hardware.smem_limit(TARGETS[cc])
    specs = LAUNCHERS[launcher](configs.smem_class(limit))
    return tuple(_aot.compile_specs(specs, (cc,), triton_path=triton_path))


@pytest.mark.slow
@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_every_config_fits_shared_memory(launcher, cc):
    """Every config compiled with the installed Triton. For sm_120 on a machine whose Triton is
    not the GPU image's (CPU CI: 3.9 against 3.6.0) only with DSA_AOT_INSTALLED=1: there the
    sm_120 fit is checked with the GPU image's Triton (the next test), and compiling every spec
    twice took ~700 s of a 1,815 s CI pytest run on a 2-core AMD EPYC (tests/TEST_TIME.md, run G)."""
    if cc == 120 and _gpu_image_triton_is_other() and os.environ.get("DSA_AOT_INSTALLED", "") in ("", "0"):
        pytest.skip(f"sm_120 fit checked with the GPU image's Triton {GPU_IMAGE_TRITON} "
                    f"(test_every_config_fits_sm120_with_the_gpu_image_triton); "
                    f"DSA_AOT_INSTALLED=1 compiles with the installed Triton as well")
    limit = hardware.smem_limit(TARGETS[cc])
    _check_fit(_compiled(cc, launcher), cc, limit)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_every_config_fits_sm120_with_the_gpu_image_triton(launcher):
    """The same sm_120 check compiled with the GPU image's Triton (GPU_IMAGE_TRITON): the
    registers, spills and shared memory the GPU's compiler gives, where they differ from the
    installed one's (a Gluon or layout change between versions)."""
    path = _gpu_image_triton()
    if path is None:
        pytest.skip(f"the installed Triton is {GPU_IMAGE_TRITON}: test_every_config_fits_shared_memory "
                    f"already compiled with it")
    results = _compiled(120, launcher, path)
    assert {r.get("triton") for r in results if "error" not in r} <= {GPU_IMAGE_TRITON}
    _check_fit(results, 120, hardware.smem_limit(TARGETS[120]))


def _check_fit(results, cc: int, limit: int) -> None:
    assert results, "no launch specs"
    errors = [r for r in results if "error" in r]
    assert not errors, "compile failed: " + "; ".join(f"{r['label']}: {r['error']}" for r in errors[:3])
    too_big = [r for r in results if r["shared"] > limit]
    assert not too_big, (f"sm_{cc} allows {limit} B of shared memory per block; "
                         + "; ".join(f"{r['label']} needs {r['shared']}" for r in too_big))


def test_aot_compile_one_kernel_without_gpu():
    """Fast check that AOT compilation works here (subprocess, TRITON_INTERPRET cleared): the
    heuristic's config for 64 heads on the fp8_ds_mla split kernel, for sm_120, reports a
    positive shared-memory size within the sm_120 limit."""
    limit = hardware.smem_limit((12, 0))
    cfg = configs.sparse_mla_heuristic(64, limit)
    specs = [s for s in _sparse_mla.aot_specs(configs.smem_class(limit))
             if s.label.startswith("split fp8_ds_mla D576 q=bfloat16 partial block table")
             and str(cfg) in s.label]
    assert len(specs) == 1
    (res,) = _aot.compile_specs(specs, (120,))
    assert "error" not in res, res.get("error")
    assert 0 < res["shared"] <= limit


def test_gluon_ws_specs_listed_for_sm90_only():
    """The warp-specialised Gluon kernel (sm_90 only) is in the large class's AOT specs (so the
    sm90-marked compile test above compiles it), for both fp8 formats, partial and final, with
    and without a block table; never in the small class's (sm_120)."""
    large = [s for s in _sparse_mla.aot_specs("large") if s.kernel == "_sparse_mla_gluon_ws_kernel"]
    small = [s for s in _sparse_mla.aot_specs("small") if s.kernel == "_sparse_mla_gluon_ws_kernel"]
    assert not small
    labels = {s.label for s in large}
    for fmt in ("fp8_ds_mla", "fp8_model1"):
        for bt in ("block table", "slots"):
            assert f"gluon_ws x2 {fmt} q=bfloat16 partial {bt}" in labels
    assert "gluon_ws x2 fp8_ds_mla q=bfloat16 final block table" in labels
    assert all(s.num_warps == 8 and s.constexprs["NBUF"] == 2 for s in large)
