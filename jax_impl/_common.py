"""Validation, device gates and path dispatch shared by the jax_impl launchers."""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kernels import hardware

JAX_PATHS = ("auto", "pallas", "xla")


def device_info() -> hardware.DeviceInfo:
    """DeviceInfo of JAX's default device (the CPU interpreter when the backend is the CPU)."""
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return hardware.CPU_INTERPRETER
    if dev.platform != "gpu":
        raise NotImplementedError(f"the pallas path runs on NVIDIA GPUs (Triton lowering); got {dev.platform}")
    cc_str = getattr(dev, "compute_capability", "0.0")
    cc = tuple(int(x) for x in str(cc_str).split("."))[:2]
    return hardware.DeviceInfo(name=getattr(dev, "device_kind", str(dev)), cc=cc,
                               num_sms=int(getattr(dev, "core_count", 0) or 0),
                               smem_per_block=hardware.smem_limit(cc))


def check_array(name: str, a, *, ndim: int | None = None, dtypes: Sequence | None = None,
                shape: Sequence[int | None] | None = None):
    """Raise TypeError / ValueError naming ``name``, what was expected and what came."""
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise TypeError(f"{name}: expected a jax.Array, got {type(a).__name__}")
    if dtypes is not None and jnp.dtype(a.dtype) not in [jnp.dtype(d) for d in dtypes]:
        raise TypeError(f"{name}: expected dtype in {[jnp.dtype(d).name for d in dtypes]}, got {jnp.dtype(a.dtype).name}")
    if ndim is not None and len(a.shape) != ndim:
        raise ValueError(f"{name}: expected rank {ndim}, got shape {tuple(a.shape)}")
    if shape is not None:
        want = tuple(shape)
        if len(want) != len(a.shape) or any(w is not None and w != s for w, s in zip(want, a.shape)):
            pretty = tuple("*" if w is None else w for w in want)
            raise ValueError(f"{name}: expected shape {pretty}, got {tuple(a.shape)}")


def run_path(op: str, path: str, impls: dict[str, Callable], order: Sequence[str]):
    """Run ``impls[path]``; ``"auto"`` tries ``order`` and falls through on NotImplementedError."""
    if path == "auto":
        errors = []
        for name in order:
            try:
                return impls[name]()
            except NotImplementedError as e:  # noqa: PERF203
                errors.append(f"{name}: {e}")
        raise NotImplementedError(f"{op}: no path can run: " + "; ".join(errors))
    if path not in impls:
        raise ValueError(f"path: expected one of {('auto',) + tuple(impls)}, got {path!r}")
    return impls[path]()
