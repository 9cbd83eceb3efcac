"""Comparison helpers implementing docs/SPEC.md "Tolerances", shared by tests, parity, bench.

Each check explains a failure the way FlashMLA's ``check_is_allclose`` does: the inf/NaN pattern
first, then abs-or-rel per element, then a cosine-style bound over the whole tensor, and always
the worst element. All inputs are NumPy arrays (see :func:`to_numpy` for torch / jax arrays).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.reference import topk_from_logits

# SPEC.md tolerances.
OUT_ABS, OUT_REL, OUT_COS = 1e-3, 2.01 / 128, 5e-6
LSE_ABS, LSE_REL = 1e-6, 8.01 / 65536
LOGITS_COS = 5e-6


@dataclass
class CheckResult:
    """Outcome of one check.

    ``worst_error`` is the largest |got - ref| among finite elements and ``tolerance`` the bound
    allowed at that element; ``ratio`` is the largest error / allowed over all elements (<= 1
    passes). ``message`` says what failed and where.
    """

    passed: bool
    worst_error: float
    tolerance: float
    ratio: float
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def merge(self, other: "CheckResult") -> "CheckResult":
        """Both must pass; the worse ratio is reported."""
        worst = self if self.ratio >= other.ratio else other
        msgs = "; ".join(m for m in (self.message, other.message) if m)
        return CheckResult(self.passed and other.passed, worst.worst_error, worst.tolerance,
                           max(self.ratio, other.ratio), msgs)


def to_numpy(x) -> np.ndarray:
    """torch / jax / NumPy array -> NumPy (low-precision floats widened to float32)."""
    if hasattr(x, "detach"):                     # torch
        t = x.detach()
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()
        return t.cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind == "V" or a.dtype.name in ("bfloat16", "float8_e4m3fn", "float16"):
        a = a.astype(np.float32)
    return a


def cos_diff(a: np.ndarray, b: np.ndarray) -> float:
    """``1 - 2<a,b> / (|a|^2 + |b|^2)`` over finite positions (0 for two empty / zero tensors)."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    den = float(a @ a + b @ b)
    return 0.0 if den == 0.0 else 1.0 - 2.0 * float(a @ b) / den


def check_close(name: str, got, ref, *, abs_tol: float, rel_tol: float,
                cos_tol: float | None = None) -> CheckResult:
    """Element-wise ``|got - ref| <= max(abs_tol, rel_tol * |ref|)`` after the inf/NaN pattern
    matches exactly (same positions, same signs of inf); optional cosine bound."""
    g = np.asarray(to_numpy(got), np.float64)
    r = np.asarray(ref, np.float64)
    if g.shape != r.shape:
        return CheckResult(False, np.inf, 0.0, np.inf, f"{name}: shape {g.shape} != reference {r.shape}")
    for what, fn in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = fn(g) != fn(r)
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            return CheckResult(False, np.inf, 0.0, np.inf,
                               f"{name}: {what} pattern differs at {int(bad.sum())} elements, first "
                               f"{i}: got {g[i]!r}, reference {r[i]!r}")
    fin = np.isfinite(r)
    if not fin.any():
        return CheckResult(True, 0.0, abs_tol, 0.0, "")
    with np.errstate(invalid="ignore"):
        err = np.where(fin, np.abs(g - r), 0.0)
    allowed = np.maximum(abs_tol, rel_tol * np.abs(np.where(fin, r, 0.0)))   # NaN/inf matched above
    ratio = err / allowed
    w = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    worst_ratio = float(ratio[w])
    msg = ""
    passed = worst_ratio <= 1.0
    if not passed:
        msg = (f"{name}: {int((ratio > 1).sum())} elements out of tolerance; worst at {tuple(int(v) for v in w)}: "
               f"got {g[w]!r}, reference {r[w]!r}, |err| {err[w]:.3g} > {allowed[w]:.3g}")
    if cos_tol is not None:
        cd = cos_diff(np.where(fin, g, 0.0), np.where(fin, r, 0.0))
        if cd > cos_tol:
            passed = False
            msg = (msg + "; " if msg else "") + f"{name}: cosine diff {cd:.3g} > {cos_tol:.3g}"
    return CheckResult(passed, float(err[w]), float(allowed[w]), worst_ratio, msg)


def lse_tolerance(q_dtype: str) -> tuple[float, float]:
    """(abs, rel) LSE tolerance. float32 math gives SPEC's abs 1e-6 / rel 8.01/65536. With fp16 or
    bf16 q the kernel's dot operands are the same rounded values the reference is fed, but the
    fp32 accumulation of 576 products and the exp2/log2 rewrite add a few float32 ulps of the
    *score* scale, so the bound stays the SPEC one; no loosening is needed or applied here."""
    return LSE_ABS, LSE_REL


def check_mla(out, lse, ref_out, ref_lse, *, q_dtype: str = "float32") -> CheckResult:
    """Sparse MLA decode: out (abs 1e-3 or rel 2.01/128, cosine 5e-6) and lse (abs 1e-6 or rel
    8.01/65536), empty rows must be exactly out 0 / lse -inf."""
    la, lr = lse_tolerance(q_dtype)
    res = check_close("out", out, ref_out, abs_tol=OUT_ABS, rel_tol=OUT_REL, cos_tol=OUT_COS)
    res = res.merge(check_close("lse", lse, ref_lse, abs_tol=la, rel_tol=lr))
    r_lse = np.asarray(ref_lse, np.float64)
    empty = np.isneginf(r_lse)
    if empty.any():
        g = np.asarray(to_numpy(out), np.float64)
        nz = np.abs(g[empty]).max() if g[empty].size else 0.0
        if nz != 0.0:
            res = res.merge(CheckResult(False, float(nz), 0.0, np.inf,
                                        f"out: rows with no valid index must be exactly 0, got max |out| {nz}"))
    return res


def check_logits(got, ref) -> CheckResult:
    """Indexer logits: the same -inf/NaN pattern, then ``cos_diff < 5e-6`` over finite entries.

    ``worst_error`` reports the largest absolute difference relative to the row's max |logit|.
    """
    g = np.asarray(to_numpy(got), np.float64)
    r = np.asarray(ref, np.float64)
    if g.shape != r.shape:
        return CheckResult(False, np.inf, 0.0, np.inf, f"logits: shape {g.shape} != reference {r.shape}")
    for what, fn in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = fn(g) != fn(r)
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            return CheckResult(False, np.inf, 0.0, np.inf,
                               f"logits: {what} pattern differs at {int(bad.sum())} positions, first "
                               f"{i}: got {g[i]!r}, reference {r[i]!r}")
    fin = np.isfinite(r)
    gf, rf = np.where(fin, g, 0.0), np.where(fin, r, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        cd = cos_diff(gf, rf)
    err = np.abs(gf - rf)
    w = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
    worst = float(err[w]) if err.size else 0.0
    passed = cd < LOGITS_COS
    msg = "" if passed else (f"logits: cosine diff {cd:.3g} >= {LOGITS_COS}; worst at {tuple(int(v) for v in w)}: "
                             f"got {g[w]!r}, reference {r[w]!r}")
    return CheckResult(passed, worst, LOGITS_COS, cd / LOGITS_COS, msg)


def _f32_ulp(x: float) -> float:
    x32 = np.float32(x)
    if not np.isfinite(x32):
        return 0.0
    return float(np.spacing(np.abs(x32)))


def check_topk(got, ref_logits, topk: int, *, sorted: bool = False) -> CheckResult:
    """Top-k indices against the exact SPEC selection from float64 reference logits.

    ``got`` int ``[..., topk]`` (any order within a row), ``ref_logits`` float64 ``[..., W]``.
    Passes when, per row: every emitted index is a qualifying position (logit neither NaN nor
    -inf) or -1, no index repeats, the number of -1 is ``max(0, topk - #qualifying)``, and the
    selected set equals the exact one except for swaps whose logits differ from the threshold by
    less than one float32 ulp of the threshold (SPEC; such rows are counted in the message).
    With ``sorted=True`` the emitted indices must also come first, in descending logit order
    (ties by smaller position; neighbours closer than one float32 ulp may swap).
    """
    g = np.asarray(to_numpy(got)).astype(np.int64)
    lg = np.asarray(ref_logits, np.float64)
    lead, W = lg.shape[:-1], lg.shape[-1]
    if g.shape != (*lead, topk):
        return CheckResult(False, np.inf, 0.0, np.inf, f"indices: expected shape {(*lead, topk)}, got {g.shape}")
    G, L = g.reshape(-1, topk), lg.reshape(-1, W)
    near_ties = 0
    for r in range(G.shape[0]):
        row, sel = L[r], G[r]
        qual = ~np.isnan(row) & (row != -np.inf)
        n_q = int(qual.sum())
        emitted = sel[sel != -1]
        where = f"row {np.unravel_index(r, lead) if lead else r}"
        if ((emitted < 0) | (emitted >= W)).any():
            return CheckResult(False, np.inf, 0.0, np.inf, f"indices: {where} emits out-of-range {emitted[(emitted < 0) | (emitted >= W)][:4]}")
        if (~qual[emitted]).any():
            bad = emitted[~qual[emitted]][:4]
            return CheckResult(False, np.inf, 0.0, np.inf, f"indices: {where} selects non-qualifying positions {bad} (logits {row[bad]})")
        if np.unique(emitted).size != emitted.size:
            return CheckResult(False, np.inf, 0.0, np.inf, f"indices: {where} repeats an index")
        want_n = min(topk, n_q)
        if emitted.size != want_n:
            return CheckResult(False, np.inf, 0.0, np.inf,
                               f"indices: {where} emits {emitted.size} indices, expected {want_n} ({n_q} qualify, topk {topk})")
        if sorted:
            if (sel[: emitted.size] == -1).any():
                return CheckResult(False, np.inf, 0.0, np.inf, f"indices: {where} has -1 before a valid index (sorted=True)")
            v = row[emitted]
            for k in range(emitted.size - 1):
                a_, b_ = v[k], v[k + 1]
                in_order = a_ > b_ or (a_ == b_ and emitted[k] < emitted[k + 1])
                if not in_order and not abs(a_ - b_) < max(_f32_ulp(a_), _f32_ulp(b_)):
                    return CheckResult(False, np.inf, 0.0, np.inf,
                                       f"indices: {where} not sorted at {k}: {emitted[k]} ({a_}) before {emitted[k + 1]} ({b_})")
        exact = topk_from_logits(row[None], topk)[0]
        exact = exact[exact != -1]
        a, b = set(emitted.tolist()), set(exact.tolist())
        if a != b:
            thr = row[exact[-1]]
            extra, missing = np.sort(list(a - b)).astype(np.int64), np.sort(list(b - a)).astype(np.int64)
            gap = max(np.abs(row[extra] - thr).max(), np.abs(row[missing] - thr).max())
            if not gap < _f32_ulp(thr):
                return CheckResult(False, float(gap), _f32_ulp(thr), np.inf,
                                   f"indices: {where} set differs from the exact top-{topk}: extra {extra[:4]} "
                                   f"(logits {row[extra[:4]]}), missing {missing[:4]} (logits {row[missing[:4]]}), threshold {thr}")
            near_ties += 1
    msg = f"{near_ties} rows differ only by sub-ulp near-ties at the threshold" if near_ties else ""
    return CheckResult(True, 0.0, 0.0, 0.0, msg)


def assert_pass(result: CheckResult) -> None:
    """pytest helper: raise AssertionError with the explanation when ``result`` failed."""
    if not result.passed:
        raise AssertionError(result.message)
