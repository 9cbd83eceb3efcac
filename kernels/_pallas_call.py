"""The one place that calls ``pl.pallas_call``.

JAX's Pallas-Triton lowering is deprecated upstream; keeping every call behind
:func:`triton_call` means a later lowering (Mosaic GPU) is a change to this module alone.
Passing ``plgpu.CompilerParams`` is what selects the Triton lowering on jax 0.10 / 0.11 / 0.12
(without it they lower through Mosaic GPU).
"""
from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def interpret_default() -> bool:
    """Interpret (run the kernel body with jax.numpy on the CPU) when JAX's backend is the CPU."""
    return jax.default_backend() == "cpu"


def triton_call(kernel, *, out_shape, grid, in_specs=None, out_specs=None, num_warps: int = 4,
                num_stages: int = 2, interpret: bool | None = None, name: str | None = None,
                input_output_aliases: dict | None = None):
    """``pl.pallas_call`` with the Triton lowering's compiler params always set.

    Args mirror ``pl.pallas_call`` (``input_output_aliases``: ``{input index: output index}``,
    the output written into the input's buffer); ``num_warps`` / ``num_stages`` go into
    ``plgpu.CompilerParams``; ``interpret=None`` picks :func:`interpret_default`.
    """
    kwargs = {}
    if in_specs is not None:
        kwargs["in_specs"] = in_specs
    if out_specs is not None:
        kwargs["out_specs"] = out_specs
    if input_output_aliases:
        kwargs["input_output_aliases"] = input_output_aliases
    return pl.pallas_call(
        kernel, out_shape=out_shape, grid=grid, name=name,
        interpret=interpret_default() if interpret is None else interpret,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        **kwargs)
