"""Validation, device gates and path dispatch shared by the jax_impl launchers."""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kernels import hardware
from kernels.registry import REGISTRY, Plan, run_path  # noqa: F401 - run_path re-exported
from kernels.scalars import check_int, check_real, check_shape  # noqa: F401 - re-exported

JAX_PATHS = REGISTRY.path_choices("jax")


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


def require_32bit_indices(op: str) -> None:
    """NotImplementedError (before launch) when JAX runs with 64-bit types (``jax_enable_x64``,
    ``JAX_ENABLE_X64=1`` or ``jax.enable_x64()``): the Pallas kernels compute their offsets in
    int32 and fail to lower with int64 indices; the xla path runs under x64."""
    if jax.dtypes.canonicalize_dtype(jnp.int64) == jnp.dtype(jnp.int64):
        raise NotImplementedError(
            f"{op}: pallas path: not supported with jax_enable_x64 (64-bit indices in the "
            f"kernel); use path='xla' or disable x64 (jax.config.update('jax_enable_x64', False))")


def reject_torch(name: str, a) -> None:
    """TypeError naming ``name`` when ``a`` is a torch.Tensor: it has ``.shape`` and ``.dtype``
    too, but ``jnp.dtype(torch.float32)`` fails later with an error naming no argument."""
    if type(a).__module__.split(".")[0] == "torch":
        raise TypeError(f"{name}: expected a jax.Array or a NumPy array, got a torch.Tensor "
                        f"(convert with jax.dlpack.from_dlpack(t) or jnp.asarray(t.cpu().numpy()), "
                        f"or call torch_impl, which has the same functions)")


def check_array(name: str, a, *, ndim: int | None = None, dtypes: Sequence | None = None,
                shape: Sequence[int | str | None] | None = None):
    """Raise TypeError / ValueError naming ``name``, what was expected and what came.

    ``shape``: an int per dimension it must equal; None or a label (``"num_pages"``, ``"K"``)
    where any size goes, printed as ``*`` or the label, unquoted (``(2, 1, K)``;
    ``kernels.scalars.check_shape``, the rule of both stacks)."""
    reject_torch(name, a)
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise TypeError(f"{name}: expected a jax.Array or a NumPy array, got {type(a).__name__}")
    if dtypes is not None and jnp.dtype(a.dtype) not in [jnp.dtype(d) for d in dtypes]:
        raise TypeError(f"{name}: expected dtype in {[jnp.dtype(d).name for d in dtypes]}, got {jnp.dtype(a.dtype).name}")
    if ndim is not None and len(a.shape) != ndim:
        raise ValueError(f"{name}: expected rank {ndim}, got shape {tuple(a.shape)}")
    if shape is not None:
        check_shape(name, a.shape, shape)


def check_sm_scale(sm_scale, *, static: bool = False):
    """Validate a softmax scale; the sm_scale rule of both stacks.

    Accepted: a Python int or float, a NumPy integer or floating scalar (``np.float32(0.1)``), or
    a 0-d floating array (NumPy or ``jax.Array``, also traced under ``jax.jit`` unless
    ``static``); never a bool. A concrete value must be finite (NaN / inf would turn every row's
    softmax into NaN or an empty row); zero and negative scales are accepted (the SPEC formula is
    defined for them, as torch_impl accepts them). Checking a concrete ``jax.Array`` reads its
    value back to the host.

    Args:
      sm_scale: the value to check.
      static: the caller compiles the scale in (the TP step): a traced value is refused and the
        scale is returned as a Python float.
    Returns:
      ``sm_scale`` unchanged, or ``float(sm_scale)`` when ``static``.
    Raises:
      TypeError: not a real scalar (a string, None, a bool, a complex or a non-0-d array), or
        traced while ``static``. ValueError: a concrete NaN or +-inf, or a value that overflows
        float32 (``kernels.scalars.check_real``: the kernels apply the scale in float32).
    """
    if isinstance(sm_scale, (bool, np.bool_, int, float, np.integer, np.floating)):
        value = check_real("sm_scale", sm_scale)     # the rule of both stacks (kernels.scalars)
        return value if static else sm_scale
    array_like = hasattr(sm_scale, "shape") and hasattr(sm_scale, "dtype")
    try:
        dt = jnp.dtype(sm_scale.dtype) if array_like else None
    except TypeError:                   # a dtype JAX does not know (a torch tensor's)
        dt = None
    if not (dt is not None and tuple(sm_scale.shape) == () and jnp.issubdtype(dt, jnp.floating)):
        what = type(sm_scale).__name__
        if array_like:
            if dt is None:              # name the foreign type's module: "torch.Tensor"
                what = f"{type(sm_scale).__module__}.{what}"
            what += f" of shape {tuple(sm_scale.shape)} dtype {dt.name if dt is not None else sm_scale.dtype}"
        raise TypeError(f"sm_scale: expected a real number (a Python int / float, a NumPy integer "
                        f"or floating scalar, or a 0-d float array), got {what}")
    if isinstance(sm_scale, jax.core.Tracer):
        if static:
            raise TypeError("sm_scale: expected a concrete value (this entry point compiles the "
                            "scale in), got a traced array; pass a Python float")
        return sm_scale
    value = check_real("sm_scale", np.float64(np.asarray(sm_scale, np.float64)))
    return value if static else sm_scale


def plan(op: str, path: str, **shape) -> Plan:
    """``kernels.registry`` plan of one JAX call on the default device: the paths to try and
    the config each runs (the dispatch table read once, at trace time under ``jax.jit``). On a
    platform the Pallas kernels do not target there is no device to plan for: the default
    order, no kernel config."""
    try:
        dev = device_info()
    except NotImplementedError:
        dev = None
    return REGISTRY.plan(op, "jax", dev, path=path, **shape)
