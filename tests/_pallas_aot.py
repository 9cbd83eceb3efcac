"""Ahead-of-time compile of a Pallas (Triton lowering) kernel without a GPU, for the tests: lower
a jitted function for CUDA, capture the Triton IR jax's lowering produced, and compile it with
Triton for a chosen ``sm_<cc>`` (the shared memory, registers and PTX a GPU would run)."""
from __future__ import annotations

import tempfile


def compile_pallas_for_gpu(fn, args, cc: int, *, num_warps: int, num_stages: int):
    """``triton.compile`` of the first Triton module that ``jax.jit(fn).trace(*args)`` lowers for
    CUDA, for ``GPUTarget("cuda", cc, 32)``. Raises AssertionError when nothing was lowered."""
    import jax
    import triton
    from jax._src.pallas.triton import pallas_call_registration as reg
    from triton.backends.compiler import GPUTarget

    captured = []
    orig = reg.lowering.lower_jaxpr_to_triton_module

    def capture(*a, **k):
        res = orig(*a, **k)
        captured.append(res.module.operation.get_asm())
        return res

    reg.lowering.lower_jaxpr_to_triton_module = capture
    try:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    finally:
        reg.lowering.lower_jaxpr_to_triton_module = orig
    assert captured, "no Triton module was lowered"
    with tempfile.NamedTemporaryFile("w", suffix=".ttir", delete=False) as fh:
        fh.write(captured[0])
    return triton.compile(fh.name, target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})
