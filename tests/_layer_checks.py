"""Checks shared by tests/test_layer_torch.py, tests/test_layer_jax.py and tests/test_checkpoint.py:
one decode step of a DSA layer (torch or Flax NNX) against kernels.layer_reference, with the SPEC
tolerances of kernels.compare. Inputs are NumPy arrays (callers convert with compare.to_numpy).

The checks and every bound (with its reason) live in :mod:`kernels.layer_compare`, which the
parity suite (``dsa_decode_layer``) and the bench use too; these helpers assert their results.
"""
from __future__ import annotations

from kernels import compare, layer_compare, layer_reference as lref

BF16_COS = layer_compare.BF16_COS


def check_caches(case: lref.LayerCase, ref: lref.LayerResult, kv_cache, k_cache):
    """Unwritten cache rows bit-identical, written rows within one e4m3 step (fp8) or rel 1e-5
    (float latent) of the reference's (:func:`kernels.layer_compare.check_caches`)."""
    compare.assert_pass(layer_compare.check_caches(case, ref, kv_cache, k_cache))


def check_step(case: lref.LayerCase, ref: lref.LayerResult, out, kv_cache, k_cache, inter=None, *,
               tp_rank: int = 0, tp_size: int = 1):
    """All checks of one step of rank ``tp_rank``; ``ref = case.reference(tp_rank, tp_size)``;
    ``out`` etc. NumPy (float32 or wider), ``inter`` the layer's intermediates dict (NumPy) or
    None to check only ``out`` and the caches (:func:`kernels.layer_compare.check_step`)."""
    got = {"out": out, "kv_cache": kv_cache, "k_cache": k_cache, **(inter or {})}
    compare.assert_pass(layer_compare.check_step(case, ref, got, tp_rank=tp_rank, tp_size=tp_size))


def check_bf16_step(case: lref.LayerCase, out, k_cache, inter, *, tp_rank: int = 0, tp_size: int = 1):
    """A bf16 layer: its top-k is the exact set for its own (exactly representable) fp8 q,
    float32 weights and cache (SPEC), and its output is within :data:`BF16_COS` of the float64
    reference attending the *same* indices
    (:func:`kernels.layer_compare.check_low_precision_step`)."""
    got = {"out": out, "k_cache": k_cache, **inter}
    compare.assert_pass(layer_compare.check_low_precision_step(case, got, tp_rank=tp_rank,
                                                               tp_size=tp_size))
