"""Float64 NumPy reference of the lightning indexer (docs/SPEC.md "Operation A").

Importable with NumPy and ml_dtypes alone. Semantics sources: DeepSeek-V3.2-Exp
``inference/model.py`` (indexer score, MTP mask), DeepGEMM ``fp8_paged_mqa_logits`` (paged
layout, per-token k scale); decisions where they are silent: docs/SEMANTICS.md.
"""
from __future__ import annotations

import numpy as np

from kernels import formats
from kernels.topk.reference import topk_from_logits


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


def indexer_topk(q, weights, k_cache, block_table, context_lens, topk, *, k_format="fp8_indexer"):
    """Indices of the ``topk`` largest indexer logits (sorted, -1 padded), int32 ``[B, N, topk]``.

    Same arguments as :func:`indexer_logits`. Every index is in ``[0, len[b,i])`` or -1.
    """
    return topk_from_logits(indexer_logits(q, weights, k_cache, block_table, context_lens,
                                           k_format=k_format), topk)
