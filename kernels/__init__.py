"""Shared core of the DSA decode kernels: model presets, cache formats, the float64 reference,
comparison helpers, case generators, hardware gates and per-GPU dispatch data, plus the kernel
sources of both stacks (``kernels/triton`` for PyTorch, ``kernels/pallas`` for JAX).

Importable with NumPy and ml_dtypes alone; the kernel subpackages import triton / jax lazily.
"""
from kernels.presets import DSV32, DSV4_FLASH, PRESETS, ModelPreset

__all__ = ["DSV32", "DSV4_FLASH", "PRESETS", "ModelPreset"]
