"""Ahead-of-time compile of a Pallas (Triton lowering) kernel without a GPU, for the tests: lower
a jitted function for CUDA, capture the Triton IR jax's lowering produced, and compile it with
Triton for a chosen ``sm_<cc>`` (the shared memory, registers and PTX a GPU would run).

``triton.compile`` of a ``.ttir`` file starts *after* the TTIR stage, so it would skip Triton's
``make_ttir`` passes (inliner, canonicalize, combine -- ``acc + dot(a, b, 0)`` -> ``dot(a, b,
acc)`` --, CSE, loop unroll); XLA's Triton pipeline runs their equivalents on the IR jax emits
(``compilation_pipeline_cuda``: "based on make_ttir()"), so they are applied here first."""
from __future__ import annotations

import tempfile


def compile_pallas_for_gpu(fn, args, cc: int, *, num_warps: int, num_stages: int):
    """``triton.compile`` of the first Triton module that ``jax.jit(fn).trace(*args)`` lowers for
    CUDA, for ``GPUTarget("cuda", cc, 32)``. Raises AssertionError when nothing was lowered."""
    captured = lower_pallas_ttir(fn, args)
    assert captured, "no Triton module was lowered"
    return compile_ttir(captured[0], cc, num_warps=num_warps, num_stages=num_stages)


def lower_pallas_ttir(fn, args) -> list[str]:
    """The Triton IR (text) of every Pallas kernel ``jax.jit(fn)`` lowers for CUDA; ``args`` may
    be ``jax.ShapeDtypeStruct`` (nothing is allocated)."""
    import jax
    from jax._src.pallas.triton import pallas_call_registration as reg

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
    return captured


def compile_ttir(ttir: str, cc: int, *, num_warps: int, num_stages: int):
    """``triton.compile`` of jax-emitted TTIR text for ``sm_<cc>``, after ``make_ttir``."""
    import triton
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler as nvc

    with tempfile.NamedTemporaryFile("w", suffix=".ttir", delete=False) as fh:
        fh.write(ttir)
    ctx = ir.context()
    ir.load_dialects(ctx)
    nvc.nvidia.load_dialects(ctx)
    mod = ir.parse_mlir_module(fh.name, ctx)
    mod.context = ctx
    nvc.CUDABackend.make_ttir(mod, {}, None, cc)
    with tempfile.NamedTemporaryFile("w", suffix=".ttir", delete=False) as fh:
        fh.write(str(mod))
    return triton.compile(fh.name, target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})
