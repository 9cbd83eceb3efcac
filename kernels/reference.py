"""Float64 NumPy reference of both DSA decode operations (docs/SPEC.md).

Importable with NumPy and ml_dtypes alone. Every kernel, both backends, the parity suite and the
benchmark are checked against these functions, fed the same already-quantized inputs.

Semantics sources: DeepSeek-V3.2-Exp ``inference/model.py`` (indexer score, MTP mask), DeepGEMM
``fp8_paged_mqa_logits`` (paged layout, per-token k scale), FlashMLA ``flash_mla_with_kvcache``
sparse decode (index semantics, natural-log LSE, attention sink). Decisions where the sources are
silent are written in docs/SEMANTICS.md.

The functions live beside their kernels (``kernels/indexer/reference.py``,
``kernels/topk/reference.py``, ``kernels/sparse_mla/reference.py``); this module gathers them
under the one public name.
"""
from __future__ import annotations

from kernels.indexer.reference import indexer_logits, indexer_topk, valid_lengths
from kernels.sparse_mla.reference import lse_combine, resolve_indices, sparse_mla_decode
from kernels.topk.reference import topk_from_logits

__all__ = ["indexer_logits", "indexer_topk", "lse_combine", "resolve_indices", "sparse_mla_decode",
           "topk_from_logits", "valid_lengths"]
