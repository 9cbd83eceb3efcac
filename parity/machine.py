"""Which machine the harness runs on, decided once for ``python -m parity``, ``python -m
bench`` and the tests (``tests/conftest.py``): a CUDA GPU, or the CPU interpreters.

Standard library only: this runs before any kernel module is imported, because
``TRITON_INTERPRET`` is read when ``@triton.jit`` functions are created.
"""
from __future__ import annotations

import os
import shutil

FORCE_INTERPRET_ENV = "DSA_FORCE_INTERPRET"


def force_interpret() -> bool:
    """True when ``$DSA_FORCE_INTERPRET`` asks for interpreter mode on a GPU machine: any value
    but unset, ``""`` and ``"0"`` (``DSA_FORCE_INTERPRET=0`` means "do not force")."""
    return os.environ.get(FORCE_INTERPRET_ENV, "0").strip() not in ("", "0")


def has_cuda_gpu() -> bool:
    """True when an NVIDIA GPU is visible (``nvidia-smi`` on PATH or ``/dev/nvidia0``), checked
    without importing torch or jax; False when :func:`force_interpret`."""
    if force_interpret():
        return False
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


def prepare_environment(gpu: bool | None = None) -> bool:
    """Set the environment before any kernel module is imported; returns whether the run uses
    the GPU (``gpu``, default :func:`has_cuda_gpu`).

    Without the GPU: ``TRITON_INTERPRET=1`` (Triton kernels run in the interpreter; it must
    precede the ``torch_impl`` import) and ``JAX_PLATFORMS=cpu`` (Pallas interprets on the CPU
    backend). Always: JAX must not preallocate GPU memory (torch and JAX share one GPU). Values
    already set in the environment are kept.
    """
    gpu = has_cuda_gpu() if gpu is None else bool(gpu)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if not gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return gpu
