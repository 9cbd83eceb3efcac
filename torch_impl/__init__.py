"""PyTorch bindings of the DSA decode ops: Triton kernels (``path="triton"``) and plain PyTorch
(``path="torch"``), registered as ``torch.library`` custom ops under the ``dsa`` namespace.

Public names follow docs/SPEC.md: :func:`sparse_mla_decode`, :func:`indexer_logits`,
:func:`indexer_topk` and the cache writers :func:`quantize_fp8_ds_mla`,
:func:`quantize_fp8_model1`, :func:`quantize_fp8_indexer` with their ``dequantize_*`` inverses.
"""
from torch_impl.formats import (dequantize_fp8_ds_mla, dequantize_fp8_indexer,
                                dequantize_fp8_model1, quantize_fp8_ds_mla, quantize_fp8_indexer,
                                quantize_fp8_model1)
from torch_impl.indexer import indexer_logits, indexer_topk
from torch_impl.sparse_mla import sparse_mla_decode

__all__ = [
    "sparse_mla_decode", "indexer_logits", "indexer_topk",
    "quantize_fp8_ds_mla", "dequantize_fp8_ds_mla", "quantize_fp8_model1", "dequantize_fp8_model1",
    "quantize_fp8_indexer", "dequantize_fp8_indexer",
]

# The composed decode step and its tensor-parallel form (torch.distributed).
from torch_impl.step import dsa_decode_step  # noqa: E402
from torch_impl.tp import dsa_decode_step_tp, shard_heads  # noqa: E402

__all__ += ["dsa_decode_step", "dsa_decode_step_tp", "shard_heads"]

# One DSA attention decode layer (DeepSeek absorbed MLA + indexer), torch.nn.Module.
from torch_impl.layer import DSADecodeLayer  # noqa: E402

__all__ += ["DSADecodeLayer"]
