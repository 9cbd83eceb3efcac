"""JAX bindings of the DSA decode ops: Pallas kernels lowered through Triton (``path="pallas"``) and plain jax.numpy
(``path="xla"``), all jax.jit-compatible with static shapes.

Public names follow docs/SPEC.md: :func:`sparse_mla_decode`, :func:`indexer_logits`,
:func:`indexer_topk` and the cache writers :func:`quantize_fp8_ds_mla`,
:func:`quantize_fp8_model1`, :func:`quantize_fp8_indexer` with their ``dequantize_*`` inverses.
"""
from jax_impl.formats import (dequantize_fp8_ds_mla, dequantize_fp8_indexer,
                                dequantize_fp8_model1, quantize_fp8_ds_mla, quantize_fp8_indexer,
                                quantize_fp8_model1)
from jax_impl.indexer import indexer_logits, indexer_topk
from jax_impl.sparse_mla import sparse_mla_decode

__all__ = [
    "sparse_mla_decode", "indexer_logits", "indexer_topk",
    "quantize_fp8_ds_mla", "dequantize_fp8_ds_mla", "quantize_fp8_model1", "dequantize_fp8_model1",
    "quantize_fp8_indexer", "dequantize_fp8_indexer",
]

# The composed decode step and its tensor-parallel form (jax.shard_map).
from jax_impl.step import dsa_decode_step  # noqa: E402
from jax_impl.tp import dsa_decode_step_tp  # noqa: E402

__all__ += ["dsa_decode_step", "dsa_decode_step_tp"]

# One DSA attention decode layer (DeepSeek absorbed MLA + indexer), Flax NNX.
from jax_impl.layer import DSADecodeLayer  # noqa: E402

__all__ += ["DSADecodeLayer"]
