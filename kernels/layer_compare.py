"""Checks of one DSA decode-layer step against the float64 layer reference, and of two layer
paths against each other.

One decode step of ``torch_impl.layer.DSADecodeLayer`` / ``jax_impl.layer.DSADecodeLayer`` is
checked against :func:`kernels.layer_reference.layer_reference` here, and only here: the tests
(tests/_layer_checks.py asserts these results), the parity suite (op ``dsa_decode_layer``) and
the bench's check-before-time all call these functions, so they share one set of bounds. Every
element-wise and cosine bound is SPEC's (:mod:`kernels.compare`) except the ones defined below,
each with its reason.

A step's outputs are passed as a dict of NumPy arrays (callers convert with
:func:`kernels.compare.to_numpy`): ``out`` ``[B, N, hidden]``, ``kv_cache`` / ``k_cache`` (the
caches after the step, layouts as given), and the layer's intermediates (``return_intermediates``):
``q`` ``[B, N, H, D_qk]``, ``idx_q`` ``[B, N, H_I, D_I]`` (float8_e4m3fn, or float32 holding its
values), ``idx_weights`` ``[B, N, H_I]``, ``indices`` int ``[B, N, K (+ window)]``,
``idx_context_lens`` int ``[B, N]``, ``attn`` ``[B, N, H, d_v]``, ``lse`` ``[B, N, H]``.

What :func:`check_step` checks for a float32 layer, and why each bound:

* ``out``: SPEC's ``out`` bound (abs 1e-3 or rel 2.01/128 per element, cosine 5e-6) against the
  float64 layer reference.
* caches: rows the step did not write are bit-identical to the input caches; written rows
  (dequantized) agree with the reference's within one e4m3 step (rel 2^-3,
  :data:`CACHE_REL_FP8`) for fp8 layouts and rel 1e-5 (:data:`CACHE_REL_LATENT`) for float
  latents. Reason: the float32 value in front of a quantizer can sit on the other side of an
  e4m3 rounding boundary than the float64 one.
* indexer: ``idx_weights`` within rel 1e-5 (:data:`IDX_WEIGHTS_REL`, float32 products); the
  top-k set is exact for the layer's own fp8 q / weights / cache (SPEC: the reference fed the
  same quantized inputs, :func:`kernels.compare.check_topk`); V4's window columns are exact.
* attention: ``(attn, lse)`` against :func:`kernels.reference.sparse_mla_decode` fed the layer's
  own q, cache and indices (SPEC tolerances, :func:`kernels.compare.check_mla`).

Low-precision layers (bf16 / fp16 activations and weights, :func:`check_low_precision_step`):
the top-k set is exact for the layer's own (exactly representable) fp8 q, float32 weights and
cache, and ``out`` is within :data:`BF16_COS` of the float64 reference attending the *same*
indices (a bf16 indexer may pick a different near-tie set than the float64 one, which would
otherwise dominate the comparison).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from kernels import compare, formats, layer_reference as lref, reference
from kernels.compare import CheckResult

__all__ = ["CACHE_ABS", "CACHE_REL_FP8", "CACHE_REL_LATENT", "IDX_WEIGHTS_ABS", "IDX_WEIGHTS_REL",
           "BF16_COS", "LOW_PRECISION", "INTERMEDIATES", "new_slot_mask", "check_caches",
           "check_step", "check_low_precision_step", "check_out", "check_between_paths"]

CACHE_ABS = 1e-6
"""Absolute floor of the written-cache-row comparison (values of order one)."""
CACHE_REL_FP8 = 2.0 ** -3
"""Written fp8 cache rows: one e4m3 step (reason in the module docstring)."""
CACHE_REL_LATENT = 1e-5
"""Written float latent rows: float32 rounding of the float64 value (module docstring)."""
IDX_WEIGHTS_ABS, IDX_WEIGHTS_REL = 1e-7, 1e-5
"""Indexer weights ``(x @ weights_proj.T) * scales``: float32 products of a float64 value."""
BF16_COS = 1e-4
"""Cosine bound for bf16 layers: activations are rounded to bf16 after every projection (about
ten chained roundings of 2^-9 relative), so SPEC's element-wise bound does not apply; ten
roundings squared stay far below 1e-4."""
LOW_PRECISION = ("bfloat16", "float16")
"""Layer dtypes checked with :func:`check_low_precision_step` (float32 uses :func:`check_step`)."""
INTERMEDIATES = ("q", "idx_q", "idx_weights", "indices", "idx_context_lens", "attn", "lse")
"""The intermediates :func:`check_step` checks when ``got`` has them."""


def _ok(message: str = "") -> CheckResult:
    return CheckResult(True, 0.0, 0.0, 0.0, message)


def _fail(message: str) -> CheckResult:
    return CheckResult(False, np.inf, 0.0, np.inf, message)


def _merge(results) -> CheckResult:
    res = None
    for r in results:
        res = r if res is None else res.merge(r)
    return _ok() if res is None else res


def _exact(name: str, got, want, *, equal_nan: bool = False) -> CheckResult:
    """Bit-for-bit (value) equality, NaN equal to NaN when ``equal_nan``."""
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return _fail(f"{name}: shape {g.shape} != expected {w.shape}")
    same = g == w
    if equal_nan and g.dtype.kind == "f" and w.dtype.kind == "f":
        same |= np.isnan(g) & np.isnan(w)
    if same.all():
        return _ok()
    i = tuple(int(v) for v in np.argwhere(~same)[0])
    return _fail(f"{name}: {int((~same).sum())} elements differ, first at {i}: got {g[i]!r}, "
                 f"expected {w[i]!r}")


def _cos(name: str, got, want, bound: float) -> CheckResult:
    cd = compare.cos_diff(np.asarray(got, np.float64), np.asarray(want, np.float64))
    ok = cd < bound
    return CheckResult(ok, cd, bound, cd / bound, "" if ok else f"{name}: cosine diff {cd:.3g} >= {bound}")


def new_slot_mask(case: lref.LayerCase) -> np.ndarray:
    """bool ``[num_pages * P]``: the cache slots the step writes (the N new tokens of each request)."""
    cfg, N = case.cfg, case.x.shape[1]
    _, slots = lref.new_token_slots(case.block_table, case.context_lens, N, cfg.page_size)
    new = np.zeros(case.k_cache.shape[0] * cfg.page_size, bool)
    new[slots[slots >= 0]] = True
    return new


def _cache_rows(case: lref.LayerCase, kv_cache, k_cache) -> tuple[np.ndarray, np.ndarray]:
    """(latent rows ``[slots, D_qk]`` float64, indexer key rows ``[slots, D_I]`` float32)."""
    D_I = case.cfg.index_head_dim
    return (formats.dequantize_kv(np.asarray(kv_cache), case.kv_format),
            formats.dequantize_fp8_indexer(np.asarray(k_cache), D_I).reshape(-1, D_I))


def _cache_rel(case: lref.LayerCase) -> float:
    return CACHE_REL_LATENT if case.kv_format == "latent" else CACHE_REL_FP8


def check_caches(case: lref.LayerCase, ref: lref.LayerResult, kv_cache, k_cache) -> CheckResult:
    """The caches after the step: unwritten rows bit-identical to ``case``'s input caches, the
    new tokens' rows within :data:`CACHE_REL_FP8` / :data:`CACHE_REL_LATENT` (latent) and
    :data:`CACHE_REL_FP8` (indexer keys) of the reference's ``ref.kv_cache`` / ``ref.k_cache``.

    Args:
      case: the step's inputs; ref: ``case.reference(...)``; kv_cache / k_cache: the layer's
        caches after the step (NumPy, the layouts of ``case``).
    Returns:
      :class:`kernels.compare.CheckResult` (all four checks merged).
    """
    new = new_slot_mask(case)
    got, got_k = _cache_rows(case, kv_cache, k_cache)
    want, want_k = _cache_rows(case, ref.kv_cache, ref.k_cache)
    old, old_k = _cache_rows(case, case.kv_cache, case.k_cache)
    res = [_exact("kv_cache: rows the step must not write", got[~new], old[~new], equal_nan=True),
           compare.check_close("kv_cache new rows", got[new], want[new], abs_tol=CACHE_ABS,
                               rel_tol=_cache_rel(case)),
           _exact("k_cache: rows the step must not write", got_k[~new], old_k[~new]),
           compare.check_close("k_cache new rows", got_k[new], want_k[new], abs_tol=CACHE_ABS,
                               rel_tol=CACHE_REL_FP8)]
    return _merge(res)


def _sink(case: lref.LayerCase, tp_rank: int, tp_size: int):
    cfg = case.cfg
    return lref.shard_weights(cfg, case.weights, tp_rank, tp_size)["attn_sink"] if cfg.attn_sink else None


def _topk_own(case: lref.LayerCase, got: dict) -> CheckResult:
    """The top-k part of ``got["indices"]`` is the exact set for the layer's own fp8 q, weights,
    written indexer cache and valid lengths (SPEC; sub-ulp threshold near-ties allowed)."""
    cfg = case.cfg
    logits = reference.indexer_logits(np.asarray(got["idx_q"]), np.asarray(got["idx_weights"]),
                                      np.asarray(got["k_cache"]), case.block_table,
                                      np.asarray(got["idx_context_lens"]))
    ind = np.asarray(got["indices"])
    return compare.check_topk(ind[..., :cfg.topk], logits, cfg.topk)


def check_step(case: lref.LayerCase, ref: lref.LayerResult, got: dict, *, tp_rank: int = 0,
               tp_size: int = 1) -> CheckResult:
    """Every check of one float32 step of rank ``tp_rank`` (module docstring).

    Args:
      case: the step's inputs (full weights; the rank's slice is taken here where needed).
      ref: ``case.reference(tp_rank, tp_size)``.
      got: the layer's outputs (module docstring): ``out``, ``kv_cache`` and ``k_cache`` are
        required; the intermediates (:data:`INTERMEDIATES`) are checked when ``indices`` is
        present, and then all of them must be.
      tp_rank, tp_size: the rank whose partial ``out`` and head slice ``got`` holds.
    Returns:
      :class:`kernels.compare.CheckResult`, every check merged (worst ratio reported).
    Raises:
      KeyError: ``got`` lacks a required entry.
    """
    res = [compare.check_close("out", got["out"], ref.out, abs_tol=compare.OUT_ABS,
                               rel_tol=compare.OUT_REL, cos_tol=compare.OUT_COS),
           check_caches(case, ref, got["kv_cache"], got["k_cache"])]
    if "indices" not in got:
        return _merge(res)
    cfg = case.cfg
    res.append(compare.check_close("idx_weights", got["idx_weights"], ref.idx_weights,
                                   abs_tol=IDX_WEIGHTS_ABS, rel_tol=IDX_WEIGHTS_REL))
    res.append(_exact("idx_context_lens", got["idx_context_lens"], ref.idx_context_lens))
    res.append(_topk_own(case, got))
    ind = np.asarray(got["indices"])
    res.append(_exact("indices (window columns)", ind[..., cfg.topk:], ref.indices[..., cfg.topk:]))
    r_out, r_lse = reference.sparse_mla_decode(np.asarray(got["q"], np.float64), np.asarray(got["kv_cache"]),
                                               ind, cfg.sm_scale, kv_format=case.kv_format, d_v=cfg.d_v,
                                               block_table=case.block_table,
                                               attn_sink=_sink(case, tp_rank, tp_size))
    res.append(compare.check_mla(got["attn"], got["lse"], r_out, r_lse))
    return _merge(res)


def check_low_precision_step(case: lref.LayerCase, got: dict, *, tp_rank: int = 0, tp_size: int = 1,
                             layer_ref: Callable[[np.ndarray], lref.LayerResult] | None = None
                             ) -> CheckResult:
    """One step of a bf16 / fp16 layer (module docstring): exact top-k for its own fp8 q,
    weights and cache, ``out`` within :data:`BF16_COS` of the reference attending its indices.

    Args:
      case: the step's inputs; its weights must be the values the layer holds (e.g. rounded to
        bf16 before both the layer and the reference get them).
      got: ``out``, ``k_cache``, ``idx_q``, ``idx_weights``, ``indices``, ``idx_context_lens``.
      tp_rank, tp_size: the rank ``got`` comes from.
      layer_ref: ``indices -> LayerResult`` (e.g. memoised); default
        ``case.reference(tp_rank, tp_size, indices=indices)``.
    Returns:
      :class:`kernels.compare.CheckResult`.
    Raises:
      KeyError: ``got`` lacks a required entry.
    """
    ind = np.asarray(got["indices"])
    res = _topk_own(case, got)
    ref = (layer_ref(ind) if layer_ref is not None
           else case.reference(tp_rank, tp_size, indices=ind))
    return res.merge(_cos("out", got["out"], ref.out, BF16_COS))


def check_out(got_out, ref_out, *, low_precision: bool = False, name: str = "out") -> CheckResult:
    """A layer output against a reference output (or another path's): SPEC's ``out`` bound for
    float32 layers, :data:`BF16_COS` for low-precision ones."""
    if low_precision:
        return _cos(name, got_out, ref_out, BF16_COS)
    return compare.check_close(name, got_out, ref_out, abs_tol=compare.OUT_ABS, rel_tol=compare.OUT_REL,
                               cos_tol=compare.OUT_COS)


def check_between_paths(a: dict, b: dict, *, low_precision: bool = False, a_ok: bool = True,
                        b_ok: bool = True) -> CheckResult:
    """Path A's step against path B's on the same inputs (B plays the reference's role).

    The index sets must be identical row by row; a row may differ only when both paths passed
    against the reference (``a_ok`` / ``b_ok``), i.e. by a sub-ulp near-tie at the top-k
    threshold, and is then left out of the output comparisons (the count is reported). On the
    rows with identical sets: ``out`` within the bound of :func:`check_out`; for float32 layers
    also ``idx_weights`` (:data:`IDX_WEIGHTS_REL`), ``idx_context_lens`` (exact) and
    ``(attn, lse)`` (SPEC, ``check_mla``). The bounds are those each path met against the
    reference, not wider. The caches are judged against the reference only
    (:func:`check_caches`): the written float-latent rows' floor (:data:`CACHE_ABS`) is within a
    factor of two of float32 rounding, so two paths that each meet it may differ by up to twice
    it, and a path-vs-path check would need that wider bound to say nothing new.

    Args:
      a, b: the two paths' outputs on the same inputs (module docstring: ``indices`` and
        ``out``; float32 layers also the intermediates).
      low_precision: the layers ran in bf16 / fp16.
      a_ok, b_ok: whether each path passed against the reference.
    Returns:
      :class:`kernels.compare.CheckResult`.
    """
    ia, ib = np.asarray(a["indices"]).astype(np.int64), np.asarray(b["indices"]).astype(np.int64)
    if ia.shape != ib.shape:
        return _fail(f"indices: shapes {ia.shape} != {ib.shape}")
    same = (np.sort(ia, axis=-1) == np.sort(ib, axis=-1)).all(axis=-1)          # [B, N]
    n_diff = int((~same).sum())
    res = [_ok()]
    if n_diff:
        r = tuple(int(v) for v in np.argwhere(~same)[0])
        here, there = np.setdiff1d(ia[r], ib[r])[:4].tolist(), np.setdiff1d(ib[r], ia[r])[:4].tolist()
        what = (f"index sets differ in {n_diff} of {same.size} rows (first {r}: only here {here}, "
                f"only there {there})")
        if not (a_ok and b_ok):
            return _fail("indices: " + what)
        res = [_ok(what + " by sub-ulp near-ties; outputs compared on the other rows")]
    if not same.any():
        return res[0]
    res.append(check_out(np.asarray(a["out"])[same], np.asarray(b["out"])[same], low_precision=low_precision))
    if not low_precision:
        res.append(compare.check_close("idx_weights", a["idx_weights"], b["idx_weights"],
                                       abs_tol=IDX_WEIGHTS_ABS, rel_tol=IDX_WEIGHTS_REL))
        res.append(_exact("idx_context_lens", a["idx_context_lens"], b["idx_context_lens"]))
        if "attn" in a and "attn" in b:
            res.append(compare.check_mla(np.asarray(a["attn"])[same], np.asarray(a["lse"])[same],
                                         np.asarray(b["attn"])[same], np.asarray(b["lse"])[same]))
    return _merge(res)
