"""The op contract, written once: one set of cases per op and one set of assertions, run on every
(backend, path) that ``kernels.registry.REGISTRY`` lists and on ``"auto"``.

Cases (small CPU shapes, the SPEC corners every path must get right):

* ``sparse_mla_decode``: in both fp8 formats (``fp8_ds_mla`` D_qk 576, ``fp8_model1`` D_qk 512),
  the corner cases of :func:`kernels.cases.mla_corner_cases` whose handling depends on the
  format's addressing: an all-invalid row beside valid ones (N = 2), invalid logical positions
  (-1, past the table, into -1 pages), ``topk_length`` with a 0, a sink on an empty row, P = 61,
  N = 4 drafts, a NaN in a selected row.
* ``indexer_logits`` / ``indexer_topk``: corner cases of :func:`kernels.cases.indexer_corner_cases`:
  a request of length 0 (an all-invalid row), N = 2 drafts, ties at the top-k threshold,
  -1 block-table pages (the logits also on NaN keys and K > L); the top-k unsorted and
  ``sorted=True`` (descending logit, ties to the smaller position, -1 last).
* ``dsa_decode_step``: :func:`parity.cases.make_step_case` at V3.2 (``fp8_ds_mla``, N = 1) and
  at V4-Flash (``fp8_model1`` with sink, N = 2) with its sliding window (``window=8``; one
  request shorter than the window, so its indexer sees no position).

Assertions: parity's (``parity.checks.against_reference``: the float64 reference with SPEC
tolerances, ``kernels.compare``) through parity's adapters (``parity.runners``: NumPy in, the
binding's public function with ``path=...``, NumPy out), plus the output dtypes and shapes of
SPEC. ``python -m parity`` runs the same adapters and checks on its own grid (GPU sizes there).

The (backend, path) parametrization is read from the registry, so a path added there is tested
here without an edit (:func:`test_targets_are_the_registrys`). The per-framework test files keep
what only one stack has: custom-op registration, ``torch.compile``, ``jax.jit``, tensor
parallelism, one binding's error types and dtype handling, kernel configs and internals.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from kernels import DSV32, DSV4_FLASH, cases as kcases, compare
from kernels.registry import AUTO, REGISTRY
from parity import cases as pcases, checks, runners

# ============================================================================ targets

TARGETS = [(b, p) for b in REGISTRY.backends for p in REGISTRY.path_choices(b)]
"""Every (backend, path) the registry lists, ``"auto"`` included."""

CONTRACT_OPS = tuple(op for op in REGISTRY.ops if op != "dsa_decode_layer")
"""The registry's ops but the decode layer (a module with weights and caches:
tests/test_layer_torch.py, tests/test_layer_jax.py)."""

targets = pytest.mark.parametrize("backend,path", TARGETS, ids=[f"{b}-{p}" for b, p in TARGETS])


# ============================================================================ cases

MLA_FORMATS = {"fp8_ds_mla": 576, "fp8_model1": 512}
MLA_CORNERS = ("all_invalid_row_in_batch", "logical_out_of_range", "topk_length",
               "attn_sink_empty_row", "odd_page_61", "mtp_N4", "nan_in_selected_row")
IDX_CORNERS = ("len_0", "mtp_N2", "ties", "nan_rows", "negative_page_entries", "K_gt_L")
TOPK_CORNERS = ("len_0", "mtp_N2", "ties", "negative_page_entries")
STEP_TOPK, STEP_WINDOW = 16, 8
STEP_CASES = {"dsv32_N1": (DSV32, 1, 0), f"dsv4_N2_window{STEP_WINDOW}": (DSV4_FLASH, 2, STEP_WINDOW)}


@functools.lru_cache(maxsize=None)
def mla_corner_cases(kv_format: str) -> dict:
    """``{name: MLACase}``: the SPEC corner cases in ``kv_format`` with float32 q (seed 7, H 16,
    K 64), built once per process."""
    return {c.name.split("[")[0]: c for c in kcases.mla_corner_cases(
        7, d_qk=MLA_FORMATS[kv_format], H=16, K=64, kv_format=kv_format)}


@functools.lru_cache(maxsize=None)
def indexer_corner_cases() -> dict:
    """``{name: IndexerCase}``: the SPEC indexer corner cases (seed 3, H_I 16, K 64, P 16)."""
    return {c.name: c for c in kcases.indexer_corner_cases(3, H_I=16, topk=64, P=16)}


@functools.lru_cache(maxsize=None)
def _sorted(name: str) -> kcases.IndexerCase:
    s = dataclasses.replace(indexer_corner_cases()[name])
    s.sorted = True                    # what parity's runner passes and parity's check requires
    return s


@functools.lru_cache(maxsize=None)
def step_case(name: str) -> pcases.StepCase:
    """A composed step: two requests on one page pool (one shorter than top-k), NaN latent rows
    and huge indexer keys outside them, a table twice the context; the top-k's order checked."""
    preset, N, window = STEP_CASES[name]
    return pcases.make_step_case(11, name=name, preset=preset, B=2, N=N, H=16, topk=STEP_TOPK,
                                 context=96, q_dtype="float32", H_I=8, P=16, window=window,
                                 sorted=True)


MLA_IDS = [f"{f}/{n}" for f in MLA_FORMATS for n in MLA_CORNERS]
TOPK_IDS = list(TOPK_CORNERS) + [f"{n}/sorted" for n in TOPK_CORNERS]


def _case(op: str, name: str):
    if op == "sparse_mla_decode":
        fmt, corner = name.split("/")
        return mla_corner_cases(fmt)[corner]
    if op == "indexer_topk" and name.endswith("/sorted"):
        return _sorted(name.split("/")[0])
    if op in ("indexer_logits", "indexer_topk"):
        return indexer_corner_cases()[name]
    return step_case(name)


# ============================================================================ assertions

_REFS = checks.References()            # float64 references, computed once per case and process


def _shapes(op: str, case) -> dict:
    """SPEC's output dtypes and shapes of ``op`` on ``case`` (float32 q: out is float32)."""
    if op == "sparse_mla_decode":
        B, N, H = case.q.shape[:3]
        return {"out": (np.float32, (B, N, H, case.d_v)), "lse": (np.float32, (B, N, H))}
    if op == "indexer_logits":
        return {"logits": (np.float32, (*case.q.shape[:2], case.params["table_len"]))}
    if op == "indexer_topk":
        return {"indices": (np.int32, (*case.q.shape[:2], case.topk))}
    B, N, H = case.mla.q.shape[:3]
    return {"indices": (np.int32, (B, N, case.indexer.topk + case.window)),
            "out": (np.float32, (B, N, H, case.mla.d_v)), "lse": (np.float32, (B, N, H))}


# Without a GPU, ``"auto"`` reads no dispatch table (``kernels/dispatch`` holds GPU tables only)
# and tries the backend's paths in registry order, the kernel path first: on a case the kernel
# path runs, that is the kernel-path call of the same case, which its own parametrization holds to
# the contract. There ``"auto"`` runs on these cases only (its dispatch and fallback wiring, both
# fp8 formats, an unsorted and a sorted top-k): on every case it was ~105 s of the CPU machine's
# interpreter time (2026-12-06, tests/TEST_TIME.md) for no call the kernel path had not made.
AUTO_CPU_CASES = {"sparse_mla_decode": ("fp8_ds_mla/all_invalid_row_in_batch",
                                        "fp8_model1/all_invalid_row_in_batch"),
                  "indexer_logits": ("len_0",), "indexer_topk": ("len_0", "len_0/sorted"),
                  "dsa_decode_step": ("dsv32_N1",)}


def _auto_is_the_kernel_path(backend: str) -> bool:
    """Whether ``path="auto"`` of ``backend`` plans the kernel path first on this machine."""
    from conftest import HAS_CUDA
    from kernels import dispatch, hardware
    return (not HAS_CUDA and dispatch.load_table(hardware.CPU_INTERPRETER.arch) is None
            and REGISTRY.paths(backend)[0] == REGISTRY.kernel_path(backend))


def check_contract(op: str, name: str, backend: str, path: str) -> None:
    """Run ``op`` on the named case through parity's adapter for (backend, path) and hold it to
    the float64 reference with parity's check, and to SPEC's output dtypes and shapes."""
    if path == AUTO and name not in AUTO_CPU_CASES[op] and _auto_is_the_kernel_path(backend):
        pytest.skip(f"{backend}/auto plans {REGISTRY.kernel_path(backend)} first here (no GPU, "
                    f"no dispatch table): the {REGISTRY.kernel_path(backend)} case of {name!r} "
                    f"holds that call to the contract")
    case = _case(op, name)
    try:
        got = runners.runner(backend, path).call(op, case)
    except runners.Unavailable as e:
        pytest.skip(f"{backend}/{path} cannot run here: {e}")
    for key, (dtype, shape) in _shapes(op, case).items():
        assert got[key].dtype == dtype and got[key].shape == shape, \
            (key, got[key].dtype, got[key].shape, np.dtype(dtype), shape)
    compare.assert_pass(checks.against_reference(op, case, got, _REFS))


@targets
@pytest.mark.parametrize("name", MLA_IDS)
def test_sparse_mla_decode(name, backend, path):
    check_contract("sparse_mla_decode", name, backend, path)


@targets
@pytest.mark.parametrize("name", IDX_CORNERS)
def test_indexer_logits(name, backend, path):
    check_contract("indexer_logits", name, backend, path)


@targets
@pytest.mark.parametrize("name", TOPK_IDS)
def test_indexer_topk(name, backend, path):
    check_contract("indexer_topk", name, backend, path)


@targets
@pytest.mark.parametrize("name", list(STEP_CASES))
def test_dsa_decode_step(name, backend, path):
    check_contract("dsa_decode_step", name, backend, path)


# ============================================================================ the parametrization

CONTRACT_TESTS = {"sparse_mla_decode": test_sparse_mla_decode, "indexer_logits": test_indexer_logits,
                  "indexer_topk": test_indexer_topk, "dsa_decode_step": test_dsa_decode_step}


def test_targets_are_the_registrys():
    """Each contract test runs on exactly the registry's paths of every backend, in its order,
    plus ``"auto"`` per backend; every op but the layer has one; every path has a parity runner."""
    assert tuple(CONTRACT_TESTS) == CONTRACT_OPS
    want = [(b, p) for b in REGISTRY.backends for p in (AUTO,) + REGISTRY.paths(b)]
    for op, fn in CONTRACT_TESTS.items():
        marks = [m for m in fn.pytestmark if m.name == "parametrize" and m.args[0] == "backend,path"]
        assert len(marks) == 1, op
        got = [tuple(v) for v in marks[0].args[1]]
        assert got == want, op
        assert [p for _, p in got if p != AUTO] == list(REGISTRY.all_paths()), op
    for b, p in want:
        assert runners.runner(b, p).key == f"{b}/{p}"
    names = {"sparse_mla_decode": MLA_IDS, "indexer_logits": IDX_CORNERS, "indexer_topk": TOPK_IDS,
             "dsa_decode_step": list(STEP_CASES)}
    assert set(AUTO_CPU_CASES) == set(CONTRACT_OPS)
    for op, keep in AUTO_CPU_CASES.items():            # the cases "auto" keeps without a GPU exist
        assert keep and set(keep) <= set(names[op]), op


# ============================================================================ the scale rule

@targets
def test_sm_scale_that_overflows_float32_is_refused(backend, path):
    """``sm_scale`` finite as a Python float but inf in float32 (the kernels apply it in float32)
    is a ValueError naming sm_scale on every path, before launch; it used to return all-NaN
    output silently (newcomer trial 2026-12-05, D3). float32's largest value is accepted."""
    c = mla_corner_cases("fp8_ds_mla")["mtp_N4"]
    if backend == "torch":
        from torch_impl import sparse_mla_decode
        from torch_impl._common import as_tensor as conv
    else:
        import jax.numpy as jnp
        from jax_impl import sparse_mla_decode
        conv = jnp.asarray
    args = (conv(c.q), conv(c.kv_cache), conv(c.indices))
    for bad in (1e39, -1e39, np.float64(3.5e38), 10 ** 40):
        with pytest.raises(ValueError, match=r"^sm_scale: expected a value finite in float32"):
            sparse_mla_decode(*args, bad, kv_format="fp8_ds_mla", path=path)
    if backend == "jax":                           # a concrete 0-d float64 array
        with pytest.raises(ValueError, match=r"^sm_scale: expected a value finite in float32"):
            sparse_mla_decode(*args, np.array(1e39), kv_format="fp8_ds_mla", path=path)
    from kernels.scalars import FLOAT32_MAX, check_real
    assert check_real("sm_scale", FLOAT32_MAX) == FLOAT32_MAX
