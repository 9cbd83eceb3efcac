"""Checks shared by tests/test_layer_torch.py, tests/test_layer_jax.py and tests/test_checkpoint.py:
one decode step of a DSA layer (torch or Flax NNX) against kernels.layer_reference, with the SPEC
tolerances of kernels.compare. Inputs are NumPy arrays (callers convert with compare.to_numpy).

What is checked, and why each bound:

* ``out``: SPEC's ``out`` bound (abs 1e-3 or rel 2.01/128 per element, cosine 5e-6) against the
  float64 layer reference.
* caches: rows the step did not write are bit-identical to the input caches; written rows
  (dequantized) agree with the reference's within one e4m3 step (rel 2^-3) for fp8 layouts and
  rel 1e-5 for float latents. Reason: the float32 value in front of a quantizer can sit on the
  other side of an e4m3 rounding boundary than the float64 one.
* indexer: ``idx_weights`` within rel 1e-5 (float32 products); the top-k set is exact for the
  layer's own fp8 q / weights / cache (SPEC: the reference fed the same quantized inputs,
  kernels.compare.check_topk); V4's window columns are exact.
* attention: ``(attn, lse)`` against kernels.reference.sparse_mla_decode fed the layer's own q,
  cache and indices (SPEC tolerances, kernels.compare.check_mla).
"""
from __future__ import annotations

import numpy as np

from kernels import compare, formats, layer_reference as lref, reference


def _rows(kv_cache, kv_format):
    return formats.dequantize_kv(np.asarray(kv_cache), kv_format)


def check_caches(case: lref.LayerCase, ref: lref.LayerResult, kv_cache, k_cache):
    cfg, N = case.cfg, case.x.shape[1]
    _, slots = lref.new_token_slots(case.block_table, case.context_lens, N, cfg.page_size)
    new = np.zeros(case.k_cache.shape[0] * cfg.page_size, bool)
    new[slots[slots >= 0]] = True
    got, want, old = (_rows(c, case.kv_format) for c in (kv_cache, ref.kv_cache, case.kv_cache))
    assert np.array_equal(got[~new], old[~new], equal_nan=True), "kv_cache: rows the step must not write changed"
    rel = 1e-5 if case.kv_format == "latent" else 2.0 ** -3
    compare.assert_pass(compare.check_close("kv_cache new rows", got[new], want[new], abs_tol=1e-6, rel_tol=rel))
    D_I = cfg.index_head_dim
    gk, wk, ok = (formats.dequantize_fp8_indexer(np.asarray(c), D_I).reshape(-1, D_I)
                  for c in (k_cache, ref.k_cache, case.k_cache))
    assert np.array_equal(gk[~new], ok[~new]), "k_cache: rows the step must not write changed"
    compare.assert_pass(compare.check_close("k_cache new rows", gk[new], wk[new], abs_tol=1e-6, rel_tol=2.0 ** -3))


def check_step(case: lref.LayerCase, ref: lref.LayerResult, out, kv_cache, k_cache, inter=None, *,
               tp_rank: int = 0, tp_size: int = 1):
    """All checks of one step of rank ``tp_rank``; ``ref = case.reference(tp_rank, tp_size)``;
    ``out`` etc. NumPy (float32 or wider), ``inter`` the layer's intermediates dict (NumPy) or
    None to check only ``out`` and the caches."""
    compare.assert_pass(compare.check_close("out", out, ref.out, abs_tol=compare.OUT_ABS,
                                            rel_tol=compare.OUT_REL, cos_tol=compare.OUT_COS))
    check_caches(case, ref, kv_cache, k_cache)
    if inter is None:
        return
    cfg = case.cfg
    compare.assert_pass(compare.check_close("idx_weights", inter["idx_weights"], ref.idx_weights,
                                            abs_tol=1e-7, rel_tol=1e-5))
    idx_q = np.asarray(inter["idx_q"])
    lens = np.asarray(inter["idx_context_lens"])
    np.testing.assert_array_equal(lens, ref.idx_context_lens)
    logits = reference.indexer_logits(idx_q, inter["idx_weights"], np.asarray(k_cache),
                                      case.block_table, lens)
    ind = np.asarray(inter["indices"])
    compare.assert_pass(compare.check_topk(ind[..., :cfg.topk], logits, cfg.topk))
    np.testing.assert_array_equal(ind[..., cfg.topk:], ref.indices[..., cfg.topk:])
    sink = lref.shard_weights(cfg, case.weights, tp_rank, tp_size)["attn_sink"] if cfg.attn_sink else None
    q = np.asarray(inter["q"], np.float64)
    r_out, r_lse = reference.sparse_mla_decode(q, np.asarray(kv_cache), ind, cfg.sm_scale,
                                               kv_format=case.kv_format, d_v=cfg.d_v,
                                               block_table=case.block_table, attn_sink=sink)
    compare.assert_pass(compare.check_mla(inter["attn"], inter["lse"], r_out, r_lse))


BF16_COS = 1e-4
"""Cosine bound for bf16 layers: activations are rounded to bf16 after every projection (about
ten chained roundings of 2^-9 relative), so SPEC's element-wise bound does not apply; ten
roundings squared stay far below 1e-4."""


def check_bf16_step(case: lref.LayerCase, out, k_cache, inter):
    """A bf16 layer: its top-k is the exact set for its own (exactly representable) fp8 q,
    float32 weights and cache (SPEC), and its output is within :data:`BF16_COS` of the float64
    reference attending the *same* indices (a bf16 indexer may pick a different near-tie set
    than the float64 one, which would otherwise dominate the comparison)."""
    cfg = case.cfg
    ind = np.asarray(inter["indices"])
    logits = reference.indexer_logits(np.asarray(inter["idx_q"]), inter["idx_weights"], np.asarray(k_cache),
                                      case.block_table, np.asarray(inter["idx_context_lens"]))
    compare.assert_pass(compare.check_topk(ind[..., :cfg.topk], logits, cfg.topk))
    ref = case.reference(indices=ind)
    cd = compare.cos_diff(np.asarray(out, np.float64), ref.out)
    assert cd < BF16_COS, f"out: cosine diff {cd:.3g} >= {BF16_COS}"
