"""The composed DSA decode step for PyTorch: lightning indexer + exact top-k -> sparse MLA decode.

One decode step of DeepSeek sparse attention on one device (docs/SPEC.md operations A and B
chained as DeepSeek-V3.2-Exp ``inference/model.py`` ``MLA.forward`` chains them, and as the vLLM /
SGLang DSA backends do at decode):

1. ``indexer_topk`` scores every valid logical position of each request's indexer K cache and
   selects the ``topk`` best (SPEC tie rule; -1 padding);
2. ``sparse_mla_decode`` attends those logical positions through the block table (the
   logical-to-slot conversion happens inside it, ``block_table=...``).

The top-k is requested ``sorted=True`` (descending logit, ties to the smaller position, -1 last),
so the index list handed to sparse MLA has one canonical order: the tensor-parallel step
(:mod:`torch_impl.tp`) produces exactly this list with its sequence-sharded indexer, and sparse
MLA sums the entries in list order, so both give bitwise identical outputs.
"""
from __future__ import annotations

import torch

from kernels.scalars import check_int, check_real
from torch_impl.indexer import indexer_topk
from torch_impl.sparse_mla import sparse_mla_decode

__all__ = ["dsa_decode_step"]


def check_step_scalars(sm_scale, topk) -> tuple[float, int]:
    """``(float(sm_scale), int(topk))`` after the scalar rule both stacks share
    (:mod:`kernels.scalars`; topk >= 1). NumPy scalars are converted here,
    so the ops (whose own checks want Python scalars) receive Python ones.

    Raises:
      TypeError: sm_scale or topk of the wrong type (names it, the accepted types, what came).
      ValueError: sm_scale NaN or inf; topk < 1.
    """
    return check_real("sm_scale", sm_scale), check_int("topk", topk, minimum=1)


def dsa_decode_step(q: torch.Tensor, kv_cache: torch.Tensor, idx_q: torch.Tensor,
                    idx_weights: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                    context_lens: torch.Tensor, sm_scale: float, topk: int, *,
                    kv_format: str = "latent", d_v: int = 512,
                    attn_sink: torch.Tensor | None = None, k_format: str = "fp8_indexer",
                    path: str = "auto"):
    """One DSA decode step: indexer top-k over the paged indexer cache, then sparse MLA decode.

    Args:
      q: MLA query (absorbed, MQA form), ``[B, N, H, D_qk]`` bf16 / fp16 / fp32, H = query heads
        on this device (model heads / TP), D_qk 576 (V3.2) or 512 (V4-Flash).
      kv_cache: latent cache, SPEC layout 1 ``"latent"`` ``[num_pages, P, D_qk]`` float, 2
        ``"fp8_ds_mla"`` uint8 ``[num_pages, P, 656]`` or 3 ``"fp8_model1"`` uint8
        ``[num_pages, page_bytes]`` (named by ``kv_format``).
      idx_q: indexer query ``[B, N, H_I, D_I]`` float8_e4m3fn (a float dtype with
        ``k_format="dense"``).
      idx_weights: ``[B, N, H_I]`` float32 per-head indexer weights with the q scale,
        ``H_I^-0.5`` and ``D_I^-0.5`` already folded in (DeepSeek / DeepGEMM convention).
      k_cache: indexer K cache, SPEC layout 4 ``"fp8_indexer"`` uint8
        ``[num_pages, P * (D_I + 4)]`` (or ``"dense"`` ``[num_pages, P, D_I]`` float).
      block_table: int32 ``[B, max_pages]``: logical position j of request b lives in slot
        ``block_table[b, j // P] * P + j % P``; -1 past a request's pages. The same table
        addresses both caches (they share the page pool and P).
      context_lens: int32 ``[B]`` (L_b, counting the N new tokens; draft i sees positions
        ``j < L_b - (N - 1 - i)``) or ``[B, N]`` (per-draft valid lengths).
      sm_scale: softmax scale of ``q . k`` (natural-log domain), e.g. ``DSV32.sm_scale``: a
        Python int / float or NumPy integer / floating scalar, never a bool, finite.
      topk: K >= 1, the number of positions attended per draft (``index_topk``; 2048 for
        V3.2): a Python int or NumPy integer scalar, never a bool.
      kv_format: ``"latent"``, ``"fp8_ds_mla"`` or ``"fp8_model1"``.
      d_v: value width, the first ``d_v`` latent dims (512).
      attn_sink: float32 ``[H]`` or None (V4-Flash): ``out *= 1 / (1 + exp(sink_h - lse))``.
      k_format: ``"fp8_indexer"`` (default) or ``"dense"``.
      path: ``"auto"``, ``"triton"`` or ``"torch"``, passed to both ops (a named path that cannot
        run raises; ``"auto"`` falls through).

    Returns:
      ``(out, lse, indices)``:

      * out ``[B, N, H, d_v]`` in q's dtype: softmax-weighted sum of the selected latent rows;
        0 for a draft with no valid position.
      * lse ``[B, N, H]`` float32, natural log of the softmax denominator (sink excluded);
        -inf for a draft with no valid position.
      * indices ``[B, N, topk]`` int32 logical positions in descending indexer logit (ties to
        the smaller position), -1 padding last (fewer than ``topk`` qualifying positions).

    Raises:
      TypeError / ValueError: bad argument (named) from either op's validation; ``sm_scale``
        and ``topk`` are checked first, before the indexer runs (:func:`check_step_scalars`).
      NotImplementedError: the named ``path`` cannot run on this device / shape.

    Semantics: docs/SPEC.md operations A and B; DeepSeek-V3.2-Exp ``inference/model.py``.
    """
    sm_scale, topk = check_step_scalars(sm_scale, topk)
    indices = indexer_topk(idx_q, idx_weights, k_cache, block_table, context_lens, topk,
                           k_format=k_format, sorted=True, path=path)
    out, lse = sparse_mla_decode(q, kv_cache, indices, sm_scale, kv_format=kv_format, d_v=d_v,
                                 block_table=block_table, attn_sink=attn_sink, path=path)
    return out, lse, indices
