"""Shared core of the DSA decode kernels: model presets, cache formats, the float64 reference,
comparison helpers, case generators, hardware gates, the op registry and per-GPU dispatch data,
plus one folder per algorithm holding its Triton and Pallas kernels side by side
(``kernels/sparse_mla``, ``kernels/indexer``, ``kernels/topk``, ``kernels/cache_write``,
``kernels/layer_prep``).

Importable with NumPy and ml_dtypes alone; the kernel modules import triton / jax lazily.
"""
from kernels.presets import DSV32, DSV4_FLASH, PRESETS, ModelPreset

__all__ = ["DSV32", "DSV4_FLASH", "PRESETS", "ModelPreset"]
