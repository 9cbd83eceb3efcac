"""Correct first, then time: the check every timed output passes before it is timed.

* sparse MLA: ``kernels.reference.sparse_mla_decode`` on a slice (requests 0 and B-1, their
  selected rows gathered into a compact cache of the same layout, see
  :func:`bench.inputs.mla_slice`), compared with ``kernels.compare.check_mla`` (SPEC tolerances).
* indexer top-k: ``kernels.reference.indexer_logits`` of request 0 over its own pages and
  ``kernels.compare.check_topk`` when N x L <= ``ref_max_positions`` (float64 NumPy cost grows
  with L: ~0.4 s at 32K on one core); longer rows are compared path-vs-path on the full shape:
  every row's selected set must equal the first checked path's, or, for up to 16 requests that
  differ, both paths' rows must pass ``check_topk`` against that request's float64 reference
  (SPEC allows swaps of logits less than one float32 ulp apart at the threshold).
* decode step: the MLA part against the reference slice, fed the step's own indices, and the
  indices path-vs-path (set equality) as above.
* decode layer: request 0 (:func:`bench.inputs.layer_slice`: its pages compacted) against
  ``kernels.layer_reference``, with ``kernels.layer_compare.check_low_precision_step`` (the
  layer's top-k is the exact set for its own fp8 q, weights and written cache; its output is
  within ``BF16_COS`` of the float64 layer attending the same indices), the layer tests' bf16
  check. The bench runs layers in the machine's low-precision dtype (bf16; fp16 in dry runs).
"""
from __future__ import annotations

import numpy as np

from bench.inputs import Inputs, indexer_slice, layer_slice, mla_slice
from kernels import compare, layer_compare, reference


def _np(x):
    return compare.to_numpy(x)


def _sets_equal(a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    a2 = np.sort(np.asarray(a).reshape(-1, a.shape[-1]), axis=-1)
    b2 = np.sort(np.asarray(b).reshape(-1, b.shape[-1]), axis=-1)
    if a2.shape != b2.shape:
        return False, f"indices: shape {a.shape} != {b.shape}"
    bad = np.flatnonzero((a2 != b2).any(axis=-1))
    if bad.size:
        return False, f"indices: {bad.size} of {a2.shape[0]} rows select a different set than the baseline path"
    return True, ""


class Checker:
    """Reference results shared by all paths of one shape (computed once, lazily)."""

    def __init__(self, inp: Inputs, *, ref_max_positions: int = 1 << 18):
        self.inp = inp
        self.ref_max_positions = ref_max_positions
        self._mla_ref: dict = {}
        self._logits: dict = {}                         # window -> request 0's logits
        self.baseline: dict[str, np.ndarray] = {}       # op -> indices of the first passing path
        self.baseline_path: dict[str, str] = {}
        self._layer_w64: dict | None = None
        self._layer_ref: dict = {}

    def _requests(self):
        B = self.inp.shape.B
        return sorted({0, B - 1})

    def mla(self, out, lse, indices=None) -> tuple[compare.CheckResult, str]:
        s = self.inp.sets[0]
        res = None
        o, l_ = _np(out), _np(lse)
        for b in self._requests():
            key = b if indices is None else None
            if key is not None and key in self._mla_ref:
                ref_out, ref_lse = self._mla_ref[key]
            else:
                args = mla_slice(self.inp, s, b, indices=indices)
                ref_out, ref_lse = reference.sparse_mla_decode(**args)
                if key is not None:
                    self._mla_ref[key] = (ref_out, ref_lse)
            r = compare.check_mla(o[b: b + 1], l_[b: b + 1], ref_out, ref_lse, q_dtype=self.inp.q_dtype)
            res = r if res is None else res.merge(r)
        return res, f"reference slice (requests {self._requests()})"

    def topk(self, indices, op: str, path: str) -> tuple[compare.CheckResult, str]:
        sh = self.inp.shape
        got = _np(indices).astype(np.int64)[..., : sh.K_topk]
        # the step's indexer scores the positions before the V4 window (dsa_decode_step(window=))
        window = sh.W_window if op == "dsa_decode_step" else 0
        res = None
        how = []
        if sh.N * sh.L <= self.ref_max_positions:
            if window not in self._logits:
                self._logits[window] = reference.indexer_logits(
                    **indexer_slice(self.inp, self.inp.sets[0], 0, window))
            res = compare.check_topk(got[0:1], self._logits[window], sh.K_topk)
            how.append("reference slice (request 0)")
        base = self.baseline.get(op)
        if base is not None:
            ok, msg = _sets_equal(got, base)
            if not ok:
                ok, msg = self._differing_rows_within_spec(got, base, sh.K_topk, msg, window=window)
            r = compare.CheckResult(ok, 0.0 if ok else np.inf, 0.0, 0.0 if ok else np.inf,
                                    msg + (f" ({self.baseline_path[op]})" if msg else ""))
            res = r if res is None else res.merge(r)
            how.append(f"sets == {self.baseline_path[op]} (full shape)")
        if res is None:
            res = compare.CheckResult(True, 0.0, 0.0, 0.0, "")
            how.append(f"baseline: L={sh.L} beyond the reference budget; later paths compared to this one")
        return res, "; ".join(how)

    def _differing_rows_within_spec(self, got, base, topk, msg, max_requests: int = 16,
                                    window: int = 0):
        """Two paths may legally pick different sets where logits differ by less than one
        float32 ulp at the threshold (SPEC). For up to ``max_requests`` requests whose sets
        differ, check both paths' rows against the float64 reference of that request."""
        a2 = np.sort(got.reshape(got.shape[0], -1), axis=-1)
        b2 = np.sort(base.reshape(base.shape[0], -1), axis=-1)
        reqs = np.flatnonzero((a2 != b2).any(axis=-1))
        if reqs.size > max_requests:
            return False, msg + f"; {reqs.size} requests differ, more than the {max_requests} checked against the reference"
        for b in reqs:
            lg = reference.indexer_logits(**indexer_slice(self.inp, self.inp.sets[0], int(b), window))
            for name, idx in (("this path", got), ("baseline", base)):
                r = compare.check_topk(idx[b: b + 1], lg, topk)
                if not r.passed:
                    return False, f"{msg}; request {b}, {name}: {r.message}"
        return True, (f"{reqs.size} requests differ from the baseline only by sub-ulp near-ties at the "
                      f"threshold (both checked against the float64 reference)")

    def layer(self, outputs: dict) -> tuple[compare.CheckResult, str]:
        """A decode-layer step (module docstring) on request 0 of input set 0.

        Raises:
          ValueError: the inputs are not in a low-precision dtype (bf16 / fp16).
        """
        from kernels import layer_reference as lref

        if self.inp.q_dtype not in layer_compare.LOW_PRECISION:
            raise ValueError(f"q_dtype: the layer check expects one of {layer_compare.LOW_PRECISION}, "
                             f"got {self.inp.q_dtype!r}")
        case, got = layer_slice(self.inp, self.inp.sets[0], 0, outputs)
        if self._layer_w64 is None:                  # float64 weights, converted once per shape
            self._layer_w64 = {k: v.astype(np.float64) for k, v in
                               lref.shard_weights(case.cfg, case.weights, 0, 1).items()}

        def layer_ref(ind):
            # the float64 step depends on the index set only (same inputs): paths that picked the
            # same sets share one reference computation
            key = np.sort(np.asarray(ind, np.int64), axis=-1).tobytes()
            if key not in self._layer_ref:
                self._layer_ref[key] = lref.layer_reference(
                    case.cfg, self._layer_w64, case.x, case.kv_cache, case.k_cache, case.block_table,
                    case.context_lens, kv_format=case.kv_format, indices=ind)
            return self._layer_ref[key]
        res = layer_compare.check_low_precision_step(case, got, layer_ref=layer_ref)
        return res, "layer reference on request 0 (its pages compacted): exact top-k, out cosine"

    def check(self, op: str, outputs: dict, path: str) -> tuple[compare.CheckResult, str]:
        """(result, how it was checked) of one path's outputs on input set 0."""
        if op == "sparse_mla_decode":
            return self.mla(outputs["out"], outputs["lse"])
        if op == "dsa_decode_layer":
            return self.layer(outputs)
        if op == "indexer_topk":
            res, how = self.topk(outputs["indices"], op, path)
        else:
            res, how = self.topk(outputs["indices"], op, path)
            import torch
            idx = outputs["indices"]
            idx_t = idx if isinstance(idx, torch.Tensor) else torch.from_numpy(np.array(_np(idx), np.int64))
            r2, how2 = self.mla(outputs["out"], outputs["lse"], indices=idx_t)
            res, how = res.merge(r2), how + "; MLA " + how2
        if res.passed and op not in self.baseline:
            self.baseline[op] = _np(outputs["indices"]).astype(np.int64)[..., : self.inp.shape.K_topk]
            self.baseline_path[op] = path
        return res, how
