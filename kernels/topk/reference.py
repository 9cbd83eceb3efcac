"""Float64 NumPy reference of the exact top-k (docs/SPEC.md "Operation A": candidates, ties,
-1 padding). Importable with NumPy alone."""
from __future__ import annotations

import numpy as np


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
