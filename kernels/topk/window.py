"""NumPy model of the Triton radix top-k's first digit (``kernels/topk/triton.py``): order keys,
the two-sided window's bases and bins, and the threshold bin a row's histogram gives. Shared by
the bucket simulation (``bench/topk_sim.py``) and the tests, which check the kernels' histogram
blocks and plan state against it. Importable with NumPy alone.

The digit of a key is ``key >> 20`` (12 bits: sign, 8 exponent bits, 3 mantissa bits; 1/8
binade). Bins ``UPPER_LO..255`` hold one digit each, ``base + bin`` (``base = max digit - 255``:
the 16 binades below the largest key); bins ``0..MID_BIN - 1`` one digit each, ``lbase + bin``
(``lbase`` = the smallest key's digit: the 16 binades above it); bin ``MID_BIN`` every digit
between the two windows. A threshold in the middle bin is a *window miss*.
"""
from __future__ import annotations

import numpy as np

WINDOW_SHIFT = 20
HIST_BINS = 256
UPPER_LO = 128
MID_BIN = 127
# int32 words of one (request, split, draft) histogram block (HIST_BINS counts, the upper and
# the lower base, padding), and the bases of a block that has seen no key. The kernels' constants
# (kernels.topk.triton, kernels.topk.gluon_hist) are these values.
HIST_ROW = 264
BASE_NONE = -(1 << 20)
LBASE_NONE = 1 << 20


def order_keys(x: np.ndarray) -> np.ndarray:
    """uint32 order keys of float32 ``x`` (``kernels.topk.triton.order_key``): monotone in the
    value, -0.0 as +0.0, 0 for NaN and -inf (never selected)."""
    x = np.where(x == 0, np.float32(0), np.asarray(x, np.float32))
    u = x.view(np.uint32)
    key = np.where(u >> 31 == 1, ~u, u | np.uint32(0x80000000)).astype(np.uint32)
    return np.where(np.isnan(x) | (x == -np.inf), np.uint32(0), key)


def digits(keys: np.ndarray) -> np.ndarray:
    """First digits (int64) of uint32 keys."""
    return (np.asarray(keys, np.uint32) >> WINDOW_SHIFT).astype(np.int64)


def window_bases(keys: np.ndarray) -> tuple[int, int]:
    """``(base, lbase)`` of the exact windows of the qualifying keys (``keys != 0``): the
    largest key's digit in bin 255, the smallest's in bin 0 (``window_base`` /
    ``window_lbase`` of the kernels)."""
    d = digits(keys[keys != 0])
    return int(d.max()) - (HIST_BINS - 1), int(d.min())


def digit_bins(d: np.ndarray, base: int, lbase: int) -> np.ndarray:
    """Bins of digits ``d`` under ``(base, lbase)`` (``kernels.topk.triton.digit_bin``)."""
    d = np.asarray(d, np.int64)
    u = d - base
    return np.where(u >= UPPER_LO, np.minimum(u, HIST_BINS - 1),
                    np.clip(d - lbase, 0, MID_BIN)).astype(np.int64)


def histogram(keys: np.ndarray, base: int, lbase: int) -> np.ndarray:
    """int64 ``[256]`` counts of the qualifying keys' bins."""
    return np.bincount(digit_bins(digits(keys[keys != 0]), base, lbase), minlength=HIST_BINS)


def threshold_bin(hist: np.ndarray, K: int) -> tuple[int, int]:
    """``(d0, n)`` of a histogram: the largest bin whose suffix count reaches K and its count;
    ``(-1, 0)`` when every qualifying key is taken (``sum <= K``)."""
    if hist.sum() <= K:
        return -1, 0
    ge = np.cumsum(hist[::-1])[::-1]
    d = int(np.nonzero(ge >= K)[0].max())
    return d, int(hist[d])


def row_plan(row: np.ndarray, K: int) -> dict:
    """The first digit's outcome for one row of float32 values (the valid prefix): the threshold
    bin ``d0`` at the exact bases, the keys in it (the candidates of the lower levels unless the
    bin is taken whole; 0 when every key is taken), and whether it is the middle bin (a window
    miss)."""
    k = order_keys(np.asarray(row, np.float32))
    if (k != 0).sum() <= K:
        return dict(d0=-1, n_cand=0, miss=False)
    base, lbase = window_bases(k)
    d0, n = threshold_bin(histogram(k, base, lbase), K)
    return dict(d0=d0, n_cand=n, miss=d0 == MID_BIN)


# Fields of the split plan's per-row state (kernels.topk.triton.STATE_FIELDS, launch_topk(state=)).
STATE_FIELDS = ("base", "lbase", "d0", "need", "done", "total", "n_out", "n_cand", "pairs",
                "visits")


def state_summary(state) -> dict:
    """Per-call summary of the split plan's state (int ``[R, STATE_WORDS]``, any array-like):
    rows, window misses (``d0 == MID_BIN``: the threshold between the windows), rows taken
    whole (``d0 == -1``), rows whose candidates are positions only (``pairs == 0``), and the
    median / largest candidates and candidate reads (``visits``) per row: what the per-row
    kernel's time follows (its slowest row)."""
    st = np.asarray(state, np.int64)
    col = {f: st[:, i] for i, f in enumerate(STATE_FIELDS)}
    d0 = col["d0"]
    return {"rows": int(st.shape[0]), "misses": int((d0 == MID_BIN).sum()),
            "taken_whole": int((d0 == -1).sum()), "positions_only": int((col["pairs"] == 0).sum()),
            "n_cand_median": int(np.median(col["n_cand"])) if st.size else 0,
            "n_cand_max": int(col["n_cand"].max()) if st.size else 0,
            "visits_max": int(col["visits"].max()) if st.size else 0,
            "worst_row": int(col["visits"].argmax()) if st.size else -1}
