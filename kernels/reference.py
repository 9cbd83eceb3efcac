"""Float64 NumPy reference of both DSA decode operations (docs/SPEC.md).

Importable with NumPy and ml_dtypes alone. Every kernel, both backends, the parity suite and the
benchmark are checked against these functions, fed the same already-quantized inputs.

Semantics sources: DeepSeek-V3.2-Exp ``inference/model.py`` (indexer score, MTP mask), DeepGEMM
``fp8_paged_mqa_logits`` (paged layout, per-token k scale), FlashMLA ``flash_mla_with_kvcache``
sparse decode (index semantics, natural-log LSE, attention sink). Decisions where the sources are
silent are written in docs/SEMANTICS.md.
"""
from __future__ import annotations

import numpy as np

from kernels import formats


# ============================================================================ indexer

def valid_lengths(context_lens: np.ndarray, batch: int, next_n: int) -> np.ndarray:
    """Per-draft valid prefix lengths ``[B, N]`` int64.

    ``context_lens`` [B] (L_b, counting the N new tokens): draft i sees ``L_b - (N - 1 - i)``
    positions (DeepSeek's MTP causal mask). ``context_lens`` [B, N]: taken as given. Negative
    results are clamped to 0.
    """
    cl = np.asarray(context_lens, np.int64)
    if cl.shape == (batch,):
        lens = cl[:, None] - (next_n - 1 - np.arange(next_n))[None, :]
    elif cl.shape == (batch, next_n):
        lens = cl.copy()
    else:
        raise ValueError(f"context_lens: expected shape ({batch},) or ({batch}, {next_n}), got {cl.shape}")
    return np.maximum(lens, 0)


def _indexer_keys(k_cache: np.ndarray, k_format: str, head_dim: int):
    """(keys float64 [num_pages, P, D_I] without scale, scales float64 [num_pages, P])."""
    if k_format == "fp8_indexer":
        vals, scales = formats.split_fp8_indexer(k_cache, head_dim)
        return vals.astype(np.float64), scales.astype(np.float64)
    if k_format == "dense":
        k = np.asarray(k_cache).astype(np.float64)
        return k, np.ones(k.shape[:2])
    raise ValueError(f"k_format: expected one of {formats.K_FORMATS}, got {k_format!r}")


def indexer_logits(q, weights, k_cache, block_table, context_lens, *, k_format="fp8_indexer"):
    """Lightning-indexer logits over the paged cache, float64.

    Args:
      q: ``[B, N, H_I, D_I]`` float8_e4m3fn (ml_dtypes) or float (with ``k_format="dense"``).
      weights: ``[B, N, H_I]`` float32, q scale, ``H_I^-0.5`` and ``D_I^-0.5`` folded in.
      k_cache: ``fp8_indexer`` uint8 ``[num_pages, P*(D_I+4)]`` or ``dense`` ``[num_pages, P, D_I]``.
      block_table: int32 ``[B, max_pages]``, -1 past a request's pages.
      context_lens: int32 ``[B]`` (L_b, counting the N new tokens) or ``[B, N]``.
    Returns:
      float64 ``[B, N, max_pages * P]``:
      ``logit[b,i,j] = k_scale[j] * sum_h w[b,i,h] * relu(q[b,i,h] . k[j])`` for valid j, -inf
      elsewhere. j is valid iff ``0 <= j < len[b,i]`` and its page entry is a real page
      (``0 <= block_table[b, j // P] < num_pages``); an invalid page is never read.
    """
    q64 = np.asarray(q).astype(np.float64)
    w = np.asarray(weights).astype(np.float64)
    B, N, H, D = q64.shape
    keys, scales = _indexer_keys(k_cache, k_format, D)
    num_pages, P = scales.shape
    bt = np.asarray(block_table, np.int64)
    W = bt.shape[1] * P
    lens = valid_lengths(context_lens, B, N)
    out = np.full((B, N, W), -np.inf)
    for b in range(B):
        L = int(min(lens[b].max(initial=0), W))
        if L == 0:
            continue
        j = np.arange(L)
        page = bt[b, j // P]
        ok_page = (page >= 0) & (page < num_pages)
        safe = np.where(ok_page, page, 0)
        k = keys[safe, j % P]                                  # [L, D]
        s = scales[safe, j % P]                                # [L]
        with np.errstate(invalid="ignore", over="ignore"):
            dots = np.einsum("nhd,ld->nhl", q64[b], k)         # [N, H, L]
            logit = s[None] * np.einsum("nh,nhl->nl", w[b], np.maximum(dots, 0.0))
        for i in range(N):
            ok = ok_page & (j < lens[b, i])
            out[b, i, :L] = np.where(ok, logit[i], -np.inf)
    return out


def topk_from_logits(logits: np.ndarray, topk: int, *, sorted: bool = True) -> np.ndarray:
    """Exact top-k of each row by the SPEC rule.

    Candidates are the entries that are neither NaN nor -inf (+inf qualifies); among them the
    ``topk`` largest, ties going to the smaller position. Rows with fewer candidates select all
    of them and pad with -1. Output int32 ``[..., topk]``, in descending logit order (ties by
    position) followed by the -1 padding (``sorted`` is accepted for symmetry; the reference
    is always sorted).
    """
    lg = np.asarray(logits, np.float64)
    lead, W = lg.shape[:-1], lg.shape[-1]
    flat = lg.reshape(-1, W)
    out = np.full((flat.shape[0], topk), -1, np.int32)
    pos = np.arange(W)
    for r in range(flat.shape[0]):
        row = flat[r]
        ok = ~np.isnan(row) & (row != -np.inf)
        cand = pos[ok]
        order = np.lexsort((cand, -row[ok]))                    # by -logit, then position
        sel = cand[order][:topk]
        out[r, : sel.size] = sel
    return out.reshape(*lead, topk)


def indexer_topk(q, weights, k_cache, block_table, context_lens, topk, *, k_format="fp8_indexer"):
    """Indices of the ``topk`` largest indexer logits (sorted, -1 padded), int32 ``[B, N, topk]``.

    Same arguments as :func:`indexer_logits`. Every index is in ``[0, len[b,i])`` or -1.
    """
    return topk_from_logits(indexer_logits(q, weights, k_cache, block_table, context_lens,
                                           k_format=k_format), topk)


# ============================================================================ sparse MLA

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
