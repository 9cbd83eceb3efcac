"""Test modes: on a machine without a CUDA GPU, Triton kernels run in the interpreter
(TRITON_INTERPRET=1, set here before any kernel module is imported) and Pallas kernels in
interpret mode (automatic on JAX's CPU backend). JAX gets 8 fake CPU devices for the
tensor-parallel tests. The same test bodies run on the GPU, where bf16 cases are added."""
import os

from parity.machine import prepare_environment   # the harness's device detection (stdlib only)

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
HAS_CUDA = prepare_environment()   # on CPU: TRITON_INTERPRET=1, JAX_PLATFORMS=cpu; no preallocation
if not HAS_CUDA and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    # XLA:CPU compile time dominates the Pallas interpret-mode tests (each case is a fresh jitted
    # program run once); LLVM -O0 cut up to 20 % off some of them on the 2-core machine
    # (2026-12-02, e.g. test_corner_other[mtp_N2-pallas] 10.4 -> 8.2 s; others within noise) and left the XLA-path
    # tests unchanged. Numerics are unaffected (no fast-math either way). Child processes
    # (parity / bench CLIs under test) inherit it. GPU machines keep XLA's defaults.
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
if not HAS_CUDA and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # One compile per distinct XLA program and run: JAX's persistent compilation cache in a
    # folder of this run (made here, before pytest-xdist starts its workers, which inherit it
    # and share it; removed at exit, so every run starts cold as before). Eager Pallas calls
    # compile their interpret-mode program on every call (the kernel closures are new objects
    # each time), and path="auto" compiles the same program as the path it picks: the contract
    # tests (tests/test_contract.py) run both. Programs that compile in under 0.2 s (eager
    # jnp ops) are not written.
    import atexit
    import shutil
    import tempfile
    _jax_cache = tempfile.mkdtemp(prefix="dsa-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _jax_cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    atexit.register(shutil.rmtree, _jax_cache, True)
if not HAS_CUDA and os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # One pytest-xdist worker per core (the Makefile's -n auto): each worker's OpenMP (torch),
    # MKL and OpenBLAS (NumPy) pools would otherwise start a thread per core as well, 2 x 2
    # spinning threads on the 2-core CI machine. Set in the worker before torch or NumPy loads
    # (pytest-xdist sets the count before it imports this file); child processes (the parity /
    # bench CLIs under test, the AOT compiles, the TP ranks) inherit it. JAX's XLA:CPU pools are
    # left alone (--xla_cpu_multi_thread_eigen=false made tests/test_jax_sparse_mla.py slower,
    # 97 -> 139 s). 2026-12-07, 2-core AMD EPYC, tests/test_torch_sparse_mla.py with -n 2:
    # 170 -> 148 s and 193 -> 157 s (tests/TEST_TIME.md, run CC).
    _per_worker = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, str(_per_worker))


if not HAS_CUDA:
    # Python's cyclic GC runs a full collection about every 70,000 net allocations (thresholds
    # 700, 10, 10), and a full collection walks every live object: JAX's traced and lowered
    # programs and caches make that heap large. 10,000 / 20 / 20 (every ~4 M): 4.2 -> 0.9 s of GC in
    # 41-49 s of tests/test_jax_indexer.py -k "row_split or far_above" (gc.callbacks, 2026-12-07,
    # 24 -> 2 full collections); torch interpreter tests spend ~4 % in GC. Only when garbage
    # cycles are freed changes, nothing the tests compute.
    import gc
    gc.set_threshold(10_000, 20, 20)

# Triton's interpreter without its repeated work (tests/_interp_fast.py; the same interpreted
# operations). DSA_TESTS_PLAIN_INTERPRETER=1: the interpreter as shipped.
if not HAS_CUDA:
    from _interp_fast import speed_up_triton_interpreter
    speed_up_triton_interpreter()


def pytest_collection_modifyitems(config, items):
    """The sm_90 ahead-of-time compile checks (``@pytest.mark.sm90``: the H200's arch, not the
    target sm_120) run on GPU machines or with ``DSA_AOT_SM90=1``; on CPU machines they are
    skipped, which keeps CI's time down (with cold compile caches they are ~5 minutes of the
    suite on 2 cores). The sm_120 checks always run. Likewise ``@pytest.mark.cpu_heavy``: variants
    whose interpreter runs (or XLA:CPU compiles of interpret-mode Pallas programs) cost CI tens
    of seconds to minutes each on 2 cores, each with a lighter twin that runs everywhere (named
    beside the mark), run on GPU machines or with ``DSA_HEAVY=1``."""
    # Longest first (the ``slow`` marker; the sm_120 AOT compile checks, minutes each with a cold
    # Triton cache, ahead of the rest): pytest-xdist hands the first worker the first half of
    # the collection (--dist worksteal in the Makefile) and an idle worker steals from the end
    # of the other's queue, so the long ones start at once and the workers finish together
    # instead of one running the AOT checks alone at the end (2026-12-02, 2 cores: they came
    # last by file name and were the run's last ~3 minutes).
    items.sort(key=lambda it: 0 if "slow" not in it.keywords
               else (-2 if it.nodeid.startswith("tests/test_triton_compile.py") else -1))
    if HAS_CUDA:
        return
    import pytest
    skip = pytest.mark.skip(reason="sm_90 AOT compile check: runs on GPU machines or with DSA_AOT_SM90=1")
    heavy = pytest.mark.skip(reason="interpreter-heavy variant with a lighter twin that runs here (CPU "
                                    "time in the Triton / Pallas interpreter or XLA:CPU's compile): "
                                    "runs on GPU machines or with DSA_HEAVY=1")
    for item in items:
        if "sm90" in item.keywords and not os.environ.get("DSA_AOT_SM90"):
            item.add_marker(skip)
        if "cpu_heavy" in item.keywords and not os.environ.get("DSA_HEAVY"):
            item.add_marker(heavy)


import pytest  # noqa: E402


@pytest.fixture
def table_dir(tmp_path, monkeypatch):
    """An empty dispatch-table directory (``kernels.dispatch``) for one test, caches cleared."""
    from kernels import dispatch
    monkeypatch.setenv(dispatch.DISPATCH_DIR_ENV, str(tmp_path))
    dispatch.clear_cache()
    yield tmp_path
    dispatch.clear_cache()
