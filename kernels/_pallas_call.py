"""The one place that calls ``pl.pallas_call``.

JAX's Pallas-Triton lowering is deprecated upstream; keeping every call behind
:func:`triton_call` means a later lowering (Mosaic GPU) is a change to this module alone.
Passing ``plgpu.CompilerParams`` is what selects the Triton lowering on jax 0.10 / 0.11 / 0.12
(without it they lower through Mosaic GPU).

Large arrays. The Triton lowering computes every load / store offset in *elements* and picks
the offsets' width from the array's size in *bytes*: 64-bit when it is over 2^32 bytes, else
32-bit, and ``tt.addptr`` sign-extends a 32-bit offset. An array of more than 2^31 - 1
elements and at most 2^32 bytes (a 2-4 GiB uint8 cache: fp8_ds_mla / fp8_model1) therefore
got 32-bit offsets that wrap negative past 2 GiB (illegal address on the H200 at 2.75 GB).
:func:`_wide_offsets` (installed below, once) makes the lowering take its own 64-bit branch
for such arrays too; arrays over 2^32 bytes already take it, smaller ones keep 32-bit offsets
(the same code as before). ``WIDE_OFFSETS`` says whether it is installed (False only on a jax
whose lowering no longer has the hook, where the launchers' gate keeps refusing the window);
tests/test_jax_sparse_mla.py checks the TTIR of 1, 3 and 5 GiB caches.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types

import jax
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.scalars import INT32_MAX


def _install_wide_offsets() -> bool:
    try:
        from jax._src.pallas.triton import lowering as tl_lowering
        orig = tl_lowering._compute_offsets_from_indices
        fields = {f.name for f in dataclasses.fields(tl_lowering.BlockInfo)}
    except (ImportError, AttributeError, TypeError):
        return False
    if getattr(orig, "_dsa_wide_offsets", False):
        return True
    if "full_shape_dtype" not in fields:
        return False

    @functools.wraps(orig)
    def _wide_offsets(block_info, nd_indexer):
        fsd = block_info.full_shape_dtype
        shape = tuple(fsd.shape)
        nbytes = math.prod(shape) * np.dtype(fsd.dtype).itemsize
        if math.prod(shape) > INT32_MAX and nbytes <= 2 ** 32:
            # only the offsets' width reads the dtype: present 8-byte elements so that the
            # lowering's "over 2^32 bytes" rule picks 64-bit offsets (strides come from the shape)
            fake = types.SimpleNamespace(shape=shape, dtype=np.dtype(np.int64))
            block_info = dataclasses.replace(block_info, full_shape_dtype=fake)
        return orig(block_info, nd_indexer)

    _wide_offsets._dsa_wide_offsets = True
    tl_lowering._compute_offsets_from_indices = _wide_offsets
    return True


WIDE_OFFSETS = _install_wide_offsets()


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
