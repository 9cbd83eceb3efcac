"""Which :mod:`kernels.compare` check each parity op gets, against the reference and across paths.

No tolerance lives here: every number comes from ``kernels.compare`` (SPEC "Tolerances") or,
for the decode layer, from ``kernels.layer_compare`` (the layer tests' bounds, with reasons).

Against the float64 reference (fed the same, already quantized inputs):

* ``sparse_mla_decode``: ``check_mla(out, lse, ref_out, ref_lse, q_dtype=...)``.
* ``indexer_logits``: ``check_logits`` (same -inf / NaN pattern, cosine bound).
* ``indexer_topk``: ``check_topk`` (the exact SPEC set; sub-ulp threshold near-ties reported).
* ``dsa_decode_step``: the path's top-k by ``check_topk`` (``sorted=`` the case's ``sorted``)
  and its output by ``check_mla`` against the reference attention over *the path's own* index
  set, so a legal sub-ulp near-tie in the top-k does not show up as an attention error (the
  top-k check already judged that set). With a V4 window the top-k part is checked against the
  logits of the positions before the window, and the window columns must equal the reference
  window positions exactly.
* ``dsa_decode_layer``: :mod:`kernels.layer_compare` against
  :func:`kernels.layer_reference.layer_reference`, the checks of the layer tests: float32 layers
  ``check_step`` (out with SPEC's bound, caches, indexer weights, exact top-k for the layer's own
  fp8 q / cache, window columns, attention ``check_mla``); bf16 / fp16 layers
  ``check_low_precision_step`` (exact top-k, out within ``BF16_COS`` of the reference attending
  the layer's indices). With tp > 1 every rank is checked against its own reference, the ranks
  must write identical caches, and the sum of their outputs must match the TP = 1 reference.

Across paths (path A against path B; B plays the reference's role):

* ``sparse_mla_decode``: ``check_mla`` with B as the reference.
* ``indexer_logits``: ``check_logits`` with B as the reference.
* ``indexer_topk``: the selected sets must be identical row by row; rows that differ are allowed
  only when each path's set individually passed ``check_topk`` against the reference (so the
  difference is a sub-ulp near-tie at the threshold), and are counted in the message.
* ``dsa_decode_step``: the top-k rule above, then ``check_mla`` between the two outputs on the
  rows whose index sets are identical.
* ``dsa_decode_layer``: per rank, ``kernels.layer_compare.check_between_paths`` (the top-k rule
  above, then out, and for float32 layers also indexer weights, attention and caches, on the
  rows whose index sets are identical, with the bounds each path met against the reference).
"""
from __future__ import annotations

import numpy as np

from kernels import compare, layer_compare
from kernels.compare import CheckResult


class References:
    """Memoised float64 references of built cases (keyed by object identity, kept alive)."""

    def __init__(self):
        self._store: dict[int, tuple] = {}

    def get(self, obj, kind: str, fn):
        key = (id(obj), kind)
        if key not in self._store:
            self._store[key] = (obj, fn())
        return self._store[key][1]

    def clear(self):
        self._store.clear()


def _q_dtype(case) -> str:
    mla = getattr(case, "mla", case)
    return getattr(mla, "params", {}).get("q_dtype", "float32")


def against_reference(op: str, case, got: dict, refs: References) -> CheckResult:
    """Check one path's outputs ``got`` (NumPy) for ``op`` on built ``case`` against the reference."""
    if op == "sparse_mla_decode":
        ref_out, ref_lse = refs.get(case, "mla", case.reference)
        return compare.check_mla(got["out"], got["lse"], ref_out, ref_lse, q_dtype=_q_dtype(case))
    if op == "indexer_logits":
        return compare.check_logits(got["logits"], refs.get(case, "logits", case.reference_logits))
    if op == "indexer_topk":
        lg = refs.get(case, "logits", case.reference_logits)
        return compare.check_topk(got["indices"], lg, case.topk, sorted=bool(getattr(case, "sorted", False)))
    if op == "dsa_decode_step":
        lg = refs.get(case, "logits", case.reference_logits)
        K = case.indexer.topk
        idx = np.asarray(got["indices"])
        res = compare.check_topk(idx[..., :K], lg, K, sorted=case.sorted)
        if case.window and res.passed:
            res = res.merge(_window_columns(idx[..., K:], case.window_indices()))
        if not res.passed:
            return res
        # the attention reference depends on the index *set* only (float64 sums): paths that
        # picked the same sets share one reference computation
        key = "step:" + str(hash(_sorted_rows(got["indices"]).tobytes()))
        ref_out, ref_lse = refs.get(case, key, lambda: case.mla_reference(got["indices"]))
        return res.merge(compare.check_mla(got["out"], got["lse"], ref_out, ref_lse,
                                           q_dtype=_q_dtype(case)))
    if op == "dsa_decode_layer":
        return _layer_against_reference(case, got, refs)
    raise ValueError(f"op: expected one of sparse_mla_decode, indexer_logits, indexer_topk, "
                     f"dsa_decode_step, dsa_decode_layer, got {op!r}")


def _window_columns(got: np.ndarray, want: np.ndarray) -> CheckResult:
    """The step's window columns (after its top-k) must be exactly the reference positions."""
    if got.shape != want.shape:
        return CheckResult(False, np.inf, 0.0, np.inf,
                           f"indices: window columns of shape {got.shape}, expected {want.shape}")
    bad = got != want
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        return CheckResult(False, np.inf, 0.0, np.inf,
                           f"indices: {int(bad.sum())} window positions differ, first at {i}: "
                           f"got {int(got[i])}, expected {int(want[i])}")
    return CheckResult(True, 0.0, 0.0, 0.0, "")


def layer_ranks(case, got: dict) -> list[dict]:
    """The per-rank output dicts of a ``dsa_decode_layer`` result (``"r<rank>."`` prefixes
    removed when ``case.tp > 1``)."""
    if case.tp == 1:
        return [got]
    return [{k.split(".", 1)[1]: v for k, v in got.items() if k.startswith(f"r{r}.")}
            for r in range(case.tp)]


def _tagged(res: CheckResult, tag: str) -> CheckResult:
    if tag and res.message:
        res.message = "; ".join(f"{tag}: {m}" for m in res.message.split("; "))
    return res


def _layer_against_reference(lp, got: dict, refs: References) -> CheckResult:
    """Each rank against its own reference; with tp > 1 also identical caches and the summed
    output against the TP = 1 reference (see the module docstring)."""
    c, tp = lp.case, lp.tp
    ranks = layer_ranks(lp, got)
    res = None
    for r, g in enumerate(ranks):
        if lp.low_precision:
            ind = np.asarray(g["indices"])
            key = f"layer:{r}:" + str(hash(np.ascontiguousarray(ind).tobytes()))
            rr = layer_compare.check_low_precision_step(
                c, g, tp_rank=r, tp_size=tp,
                layer_ref=lambda ind, r=r, key=key: refs.get(lp, key, lambda: c.reference(r, tp, indices=ind)))
        else:
            ref = refs.get(lp, f"layer:{r}", lambda r=r: c.reference(r, tp))
            rr = layer_compare.check_step(c, ref, g, tp_rank=r, tp_size=tp)
        rr = _tagged(rr, f"rank {r}" if tp > 1 else "")
        res = rr if res is None else res.merge(rr)
    if tp > 1:
        for r in range(1, tp):
            for k in ("kv_cache", "k_cache"):
                same = np.asarray(ranks[r][k]).tobytes() == np.asarray(ranks[0][k]).tobytes()
                res = res.merge(CheckResult(same, 0.0 if same else np.inf, 0.0, 0.0 if same else np.inf,
                                            "" if same else f"{k}: rank {r} wrote other bytes than rank 0"))
        if lp.low_precision:
            ind = np.asarray(ranks[0]["indices"])
            full = c.reference(indices=ind)
        else:
            full = refs.get(lp, "layer:full", lambda: c.reference())
        res = res.merge(layer_compare.check_out(got["out"], full.out, low_precision=lp.low_precision,
                                                name=f"sum of {tp} ranks' out"))
    return res


def _sorted_rows(idx: np.ndarray) -> np.ndarray:
    a = np.asarray(idx).astype(np.int64)
    return np.sort(a.reshape(-1, a.shape[-1]), axis=-1)


def _topk_sets(a: np.ndarray, b: np.ndarray, a_ok: bool, b_ok: bool):
    """(CheckResult, mask of rows [B*N] whose sets are identical)."""
    sa, sb = _sorted_rows(a), _sorted_rows(b)
    if sa.shape != sb.shape:
        return CheckResult(False, np.inf, 0.0, np.inf, f"indices: shapes {a.shape} != {b.shape}"), None
    same = (sa == sb).all(axis=1)
    n_diff = int((~same).sum())
    if n_diff == 0:
        return CheckResult(True, 0.0, 0.0, 0.0, ""), same
    r = int(np.flatnonzero(~same)[0])
    extra = np.setdiff1d(sa[r], sb[r])[:4]
    missing = np.setdiff1d(sb[r], sa[r])[:4]
    if a_ok and b_ok:
        return CheckResult(True, 0.0, 0.0, 0.0,
                           f"{n_diff} rows differ only by sub-ulp near-ties at the threshold "
                           f"(first: row {r}, {extra.tolist()} vs {missing.tolist()})"), same
    return CheckResult(False, np.inf, 0.0, np.inf,
                       f"indices: top-k sets differ in {n_diff} rows; first row {r}: only here "
                       f"{extra.tolist()}, only there {missing.tolist()}"), same


def between_paths(op: str, case, a: dict, b: dict, a_ok: bool, b_ok: bool) -> CheckResult:
    """Check path A's outputs against path B's (``a_ok`` / ``b_ok``: each passed vs the reference)."""
    if op == "sparse_mla_decode":
        return compare.check_mla(a["out"], a["lse"], b["out"], b["lse"], q_dtype=_q_dtype(case))
    if op == "indexer_logits":
        return compare.check_logits(a["logits"], b["logits"])
    if op == "indexer_topk":
        return _topk_sets(a["indices"], b["indices"], a_ok, b_ok)[0]
    if op == "dsa_decode_step":
        res, same = _topk_sets(a["indices"], b["indices"], a_ok, b_ok)
        if not res.passed:
            return res
        Bn = same.size
        H = a["out"].shape[2]
        rows = same.reshape(a["out"].shape[:2])
        if not rows.any():
            return res
        sel = lambda x: np.asarray(x)[rows]                   # noqa: E731 - [rows, H, ...]
        mla = compare.check_mla(sel(a["out"]), sel(a["lse"]), sel(b["out"]), sel(b["lse"]),
                                q_dtype=_q_dtype(case))
        if rows.sum() < Bn:
            mla.message = (mla.message + "; " if mla.message else "") + \
                f"outputs compared on {int(rows.sum())} of {Bn} rows x {H} heads (identical index sets)"
        return res.merge(mla)
    if op == "dsa_decode_layer":
        res = None
        for r, (ga, gb) in enumerate(zip(layer_ranks(case, a), layer_ranks(case, b))):
            rr = layer_compare.check_between_paths(ga, gb, low_precision=case.low_precision,
                                                   a_ok=a_ok, b_ok=b_ok)
            rr = _tagged(rr, f"rank {r}" if case.tp > 1 else "")
            res = rr if res is None else res.merge(rr)
        return res
    raise ValueError(f"op: unknown {op!r}")


def bitwise_equal(a: dict, b: dict) -> CheckResult:
    """Two runs of one path on the same inputs must give the same bits (SPEC "Bad input")."""
    for k in a:
        x, y = np.ascontiguousarray(a[k]), np.ascontiguousarray(b[k])
        if x.shape != y.shape or x.tobytes() != y.tobytes():
            n = int((x.view(np.uint8) != y.view(np.uint8)).sum()) if x.shape == y.shape else -1
            return CheckResult(False, np.inf, 0.0, np.inf,
                               f"{k}: a second call on the same inputs gave different bits "
                               f"({n} bytes differ)")
    return CheckResult(True, 0.0, 0.0, 0.0, "")
