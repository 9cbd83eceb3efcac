"""Float64 NumPy reference of sparse MLA decode (docs/SPEC.md "Operation B").

Importable with NumPy and ml_dtypes alone. Semantics source: FlashMLA ``flash_mla_with_kvcache``
sparse decode (index semantics, natural-log LSE, attention sink); decisions where it is silent:
docs/SEMANTICS.md.
"""
from __future__ import annotations

import numpy as np

from kernels import formats


def resolve_indices(indices, *, num_slots, page_size, block_table=None, topk_length=None):
    """Turn sparse-MLA indices into slots, -1 for every entry that must be ignored.

    Args:
      indices: int32 ``[B, N, K]``: slots, or logical positions when ``block_table`` is given.
      num_slots: slots in the cache (num_pages * P).
      block_table: int32 ``[B, max_pages]`` or None.
      topk_length: int32 ``[B]`` or None: entries at list position >= topk_length[b] ignored.
    Returns:
      int64 ``[B, N, K]`` slots in ``[0, num_slots)`` or -1.
    """
    idx = np.asarray(indices, np.int64)
    if block_table is not None:
        slots = formats.logical_to_slot(idx, np.asarray(block_table), page_size)
    else:
        slots = idx.copy()
    slots = np.where((slots >= 0) & (slots < num_slots), slots, -1)
    if topk_length is not None:
        K = idx.shape[-1]
        keep = np.arange(K)[None, None, :] < np.asarray(topk_length, np.int64)[:, None, None]
        slots = np.where(keep, slots, -1)
    return slots


def sparse_mla_decode(q, kv_cache, indices, sm_scale, *, kv_format="latent", d_v=512,
                      block_table=None, topk_length=None, attn_sink=None):
    """Sparse MLA decode (absorbed MLA in MQA form), float64.

    Args:
      q: ``[B, N, H, D_qk]`` float (bf16 / fp16 / fp32 values).
      kv_cache: ``latent`` ``[num_pages, P, D_qk]``, ``fp8_ds_mla`` uint8 ``[num_pages, P, 656]``
        or ``fp8_model1`` uint8 ``[num_pages, page_bytes]``.
      indices: int32 ``[B, N, K]`` slots (or logical positions with ``block_table``).
      sm_scale: softmax scale applied to ``q . k`` (natural-log domain).
      d_v: value width, the first ``d_v`` latent dims.
      block_table: int32 ``[B, max_pages]`` or None.
      topk_length: int32 ``[B]`` or None.
      attn_sink: float32 ``[H]`` or None: ``out *= 1 / (1 + exp(sink_h - lse))``; lse excludes it.
    Returns:
      (out float64 ``[B, N, H, d_v]``, lse float64 ``[B, N, H]``, natural log). A row with no
      valid entry has out 0 and lse -inf. Duplicated valid indices count once per occurrence.
    """
    q64 = np.asarray(q).astype(np.float64)
    B, N, H, Dqk = q64.shape
    rows = formats.dequantize_kv(kv_cache, kv_format)
    P = formats.kv_page_size(kv_cache, kv_format)
    slots = resolve_indices(indices, num_slots=rows.shape[0], page_size=P,
                            block_table=block_table, topk_length=topk_length)
    out = np.zeros((B, N, H, d_v))
    lse = np.full((B, N, H), -np.inf)
    for b in range(B):
        for i in range(N):
            sel = slots[b, i][slots[b, i] >= 0]
            if sel.size == 0:
                continue
            kv = rows[sel]                                         # [T, D_qk]
            s = sm_scale * (q64[b, i] @ kv[:, :Dqk].T)             # [H, T]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            den = p.sum(axis=1, keepdims=True)
            lse[b, i] = (m + np.log(den))[:, 0]
            out[b, i] = (p / den) @ kv[:, :d_v]
    if attn_sink is not None:
        sink = np.asarray(attn_sink, np.float64)[None, None, :]
        # SPEC: a sink of -inf counts as the most negative float32: factor 1 on a non-empty
        # row (as -inf would give), 0 on an empty one (where -inf would give NaN)
        sink = np.where(sink == -np.inf, float(np.finfo(np.float32).min), sink)
        with np.errstate(over="ignore"):
            factor = 1.0 / (1.0 + np.exp(sink - lse))               # lse=-inf -> 0
        out *= factor[..., None]
    return out, lse


def lse_combine(partial_out, partial_lse):
    """Merge split-K partials: ``partial_out [S, ..., D]``, ``partial_lse [S, ...]`` (natural log)
    -> (out, lse) as one softmax over the union. Empty partials carry lse -inf."""
    po = np.asarray(partial_out, np.float64)
    pl = np.asarray(partial_lse, np.float64)
    m = pl.max(axis=0)
    safe_m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(pl - safe_m)                                         # -inf -> 0
    den = w.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(den > 0, safe_m + np.log(den), -np.inf)
        out = np.where(den[..., None] > 0, (w[..., None] * po).sum(axis=0) / den[..., None], 0.0)
    return out, lse
