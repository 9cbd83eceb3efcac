"""Drop-in entry points with the vendor libraries' signatures and conventions, running this
project's kernels (docs/COMPAT.md: which engine modules to patch, the pinned versions and every
remaining difference).

- :mod:`torch_impl.compat.flash_mla`: FlashMLA 9241ae3 ``get_mla_metadata`` /
  ``flash_mla_with_kvcache`` (sparse fp8 decode), on :func:`torch_impl.sparse_mla_decode`.
- :mod:`torch_impl.compat.deep_gemm`: DeepGEMM 54e2261 ``get_num_sms``,
  ``get_paged_mqa_logits_metadata``, ``fp8_paged_mqa_logits``, ``fp8_fp4_paged_mqa_logits``,
  on :func:`torch_impl.indexer_logits`.
- :mod:`torch_impl.compat.topk`: the top-k calls vLLM and SGLang make after the logits
  (``top_k_per_row_decode``, ``persistent_topk``, ``fast_topk_v2``,
  ``fast_topk_transform_fused``), on this project's exact radix top-k.
"""
from torch_impl.compat import deep_gemm, flash_mla, topk

__all__ = ["flash_mla", "deep_gemm", "topk"]
