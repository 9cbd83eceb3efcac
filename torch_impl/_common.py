"""Validation, device gates and path dispatch shared by the torch_impl launchers."""
from __future__ import annotations

import functools
import os
from typing import Sequence

import numpy as np
import torch

from kernels import hardware
from kernels.registry import REGISTRY, Plan, run_path  # noqa: F401 - run_path re-exported
from kernels.scalars import check_shape

TORCH_PATHS = REGISTRY.path_choices("torch")


def interpret_mode() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _cuda_device_info(index: int) -> hardware.DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    return hardware.DeviceInfo(name=props.name, cc=cc, num_sms=props.multi_processor_count,
                               smem_per_block=hardware.smem_limit(cc))


def device_info(device: torch.device) -> hardware.DeviceInfo:
    """DeviceInfo of a tensor's device (cached per CUDA device, so launchers can call it every
    time); raises NotImplementedError where Triton cannot run."""
    if device.type == "cuda":
        return _cuda_device_info(device.index if device.index is not None else torch.cuda.current_device())
    if device.type == "cpu" and interpret_mode():
        return hardware.CPU_INTERPRETER
    raise NotImplementedError(
        f"the triton path runs on CUDA GPUs (or on the CPU with TRITON_INTERPRET=1); "
        f"got tensors on {device}")


def require_no_interpreted_bf16(dev: hardware.DeviceInfo, op: str, *tensors: torch.Tensor) -> None:
    """NotImplementedError before launch when a Triton kernel would run bf16 operands in the
    interpreter (``TRITON_INTERPRET=1``): it evaluates bf16 arithmetic on raw bit patterns, so
    results drift past the SPEC tolerances. ``path="auto"`` then falls through to ``"torch"``;
    bf16 runs on the GPU."""
    if dev.interpret and any(t is not None and t.dtype == torch.bfloat16 for t in tensors):
        raise NotImplementedError(f"{op} in the Triton CPU interpreter: bf16 operands are not "
                                  f"supported there (it computes bf16 on raw bits); use fp16 / "
                                  f"fp32 or path='torch' on the CPU, bf16 on a GPU")


def capturing() -> bool:
    """Whether this call is being traced by torch.compile or captured into a CUDA graph on the
    current stream: then no tensor value may be read on the host (eager value checks are
    skipped, as documented where they are made)."""
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_tensor(name: str, t, *, ndim: int | None = None, dtypes: Sequence[torch.dtype] | None = None,
                 shape: Sequence[int | str | None] | None = None, device: torch.device | None = None):
    """Raise TypeError / ValueError naming ``name``, what was expected and what came.

    ``shape``: an int per dimension it must equal; None or a label (``"num_pages"``) where any
    size goes, printed as ``*`` or the label, unquoted (``(2, 1, K)``;
    ``kernels.scalars.check_shape``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected rank {ndim}, got shape {tuple(t.shape)}")
    if shape is not None:
        check_shape(name, t.shape, shape)
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got {t.device}")


def check_byte_offset(name: str, t: torch.Tensor, why: str, align: int = 4) -> None:
    """ValueError naming ``name`` when ``t`` starts at a byte offset into its storage that is not
    a multiple of ``align``: the kernels read a uint8 cache's wider fields (float32 scales, bf16
    rope dims) through views of the same storage, and those views need aligned starts. ``why``
    says which fields. Eager only (``storage_offset()`` is an int Dynamo cannot trace)."""
    off = t.storage_offset() * t.element_size()
    if off % align:
        raise ValueError(f"{name}: expected a byte offset into its storage that is a multiple of "
                         f"{align} ({why}), got {off}")


def plan(op: str, device: torch.device, path: str, **shape) -> Plan:
    """``kernels.registry`` plan of one torch call on ``device``: the paths to try and the
    config each runs (the dispatch table read once). Where Triton cannot run (CPU without the
    interpreter) there is no device to plan for: the default order, no kernel config."""
    try:
        dev = device_info(device)
    except NotImplementedError:
        dev = None
    return REGISTRY.plan(op, "torch", dev, path=path, **shape)


_NP_TO_TORCH_VIEW = {"bfloat16": (np.uint16, torch.bfloat16), "float8_e4m3fn": (np.uint8, torch.float8_e4m3fn)}


def as_tensor(arr, device="cpu") -> torch.Tensor:
    """NumPy (incl. ml_dtypes bfloat16 / float8_e4m3fn) -> torch tensor on ``device``, bit-exact."""
    if arr is None:
        return None
    a = np.ascontiguousarray(arr)
    if a.dtype.name in _NP_TO_TORCH_VIEW:
        raw, tdt = _NP_TO_TORCH_VIEW[a.dtype.name]
        return torch.from_numpy(a.view(raw).copy()).view(tdt).to(device)
    return torch.from_numpy(a.copy()).to(device)
