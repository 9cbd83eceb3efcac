"""Checks shared by tests/test_layer_torch.py, tests/test_layer_jax.py and tests/test_checkpoint.py:
one decode step of a DSA layer (torch or Flax NNX) against kernels.layer_reference, with the SPEC
tolerances of kernels.compare. Inputs are NumPy arrays (callers convert with compare.to_numpy).

The checks and every bound (with its reason) live in :mod:`kernels.layer_compare`, which the
parity suite (``dsa_decode_layer``) and the bench use too; these helpers assert their results.
"""
from __future__ import annotations

import numpy as np

from kernels import compare, layer_compare, layer_reference as lref

BF16_COS = layer_compare.BF16_COS


def check_caches(case: lref.LayerCase, ref: lref.LayerResult, kv_cache, k_cache):
    """Unwritten cache rows bit-identical, written rows within one e4m3 step (fp8) or rel 1e-5
    (float latent) of the reference's (:func:`kernels.layer_compare.check_caches`)."""
    compare.assert_pass(layer_compare.check_caches(case, ref, kv_cache, k_cache))


def check_step(case: lref.LayerCase, ref: lref.LayerResult, out, kv_cache, k_cache, inter=None, *,
               tp_rank: int = 0, tp_size: int = 1):
    """All checks of one step of rank ``tp_rank``; ``ref = case.reference(tp_rank, tp_size)``;
    ``out`` etc. NumPy (float32 or wider), ``inter`` the layer's intermediates dict (NumPy) or
    None to check only ``out`` and the caches (:func:`kernels.layer_compare.check_step`)."""
    got = {"out": out, "kv_cache": kv_cache, "k_cache": k_cache, **(inter or {})}
    compare.assert_pass(layer_compare.check_step(case, ref, got, tp_rank=tp_rank, tp_size=tp_size))


def check_bf16_step(case: lref.LayerCase, out, k_cache, inter, *, tp_rank: int = 0, tp_size: int = 1):
    """A bf16 layer: its top-k is the exact set for its own (exactly representable) fp8 q,
    float32 weights and cache (SPEC), and its output is within :data:`BF16_COS` of the float64
    reference attending the *same* indices
    (:func:`kernels.layer_compare.check_low_precision_step`)."""
    got = {"out": out, "k_cache": k_cache, **inter}
    compare.assert_pass(layer_compare.check_low_precision_step(case, got, tp_rank=tp_rank,
                                                               tp_size=tp_size))


# ------------------------------------------------------------------------------ bad input
# One table of bad inputs for both layers, so the torch and the Flax NNX layer are held to the
# same exception type and message for the same mistake.

def bad_input_case() -> lref.LayerCase:
    """V3.2 scaled down, latent cache, B = 2, N = 2 (MTP), lengths (40, 20): 4 table columns
    (capacity 64 positions), 8 pages."""
    return lref.make_layer_case(lref.DSV32_LAYER.scaled_down(), seed=0, B=2, N=2, lens=(40, 20),
                                kv_format="latent", name="bad_input")


def layer_inputs(case):
    """The five forward inputs of ``case`` as keyword arguments (NumPy arrays)."""
    return {"x": case.x, "kv_cache": case.kv_cache, "k_cache": case.k_cache,
            "block_table": case.block_table, "context_lens": case.context_lens}


def _with(case, **kw):
    return {**layer_inputs(case), **kw}


def _new_page(case, b, i=0):
    """(b, column) of the block-table entry holding new token i of request b."""
    N = case.x.shape[1]
    return b, (int(case.context_lens[b]) - N + i) // case.cfg.page_size


def set_entries(case, values):
    """The inputs with the page entry of request b's (first) new token set to ``values[b]``."""
    bt = case.block_table.copy()
    for b, value in values.items():
        bt[_new_page(case, b)] = value
    return _with(case, block_table=bt)


def set_len(case, b, value):
    """The inputs with context_lens[b] set to ``value``."""
    cl = case.context_lens.copy()
    cl[b] = value
    return _with(case, context_lens=cl)


# id: (edit(case) -> the five forward inputs as NumPy arrays (or non-arrays), error, regex)
BAD_FORWARD_INPUTS = {
    "x_int": (lambda c: _with(c, x=c.x.astype("int32")), TypeError, r"^x: expected a floating-point"),
    "x_list": (lambda c: _with(c, x=c.x.tolist()), TypeError, r"^x: expected a floating-point .*got list"),
    "x_hidden": (lambda c: _with(c, x=c.x[..., :-1]), ValueError,
                 r"^x: expected shape \[B, N, 256\], got \(2, 2, 255\)"),
    "x_batch": (lambda c: _with(c, x=c.x[:1]), ValueError, r"^block_table: expected shape \[1, max_pages >= 1\]"),
    "block_table_float": (lambda c: _with(c, block_table=c.block_table.astype("float32")), TypeError,
                          r"^block_table: expected an int32"),
    "block_table_no_columns": (lambda c: _with(c, block_table=c.block_table[:, :0]), ValueError,
                               r"^block_table: expected shape \[2, max_pages >= 1\], got \(2, 0\)"),
    "context_lens_2d": (lambda c: _with(c, context_lens=c.context_lens[:, None]), ValueError,
                        r"^context_lens: expected shape \[2\], got \(2, 1\)"),
    "kv_cache_list": (lambda c: _with(c, kv_cache=[0.0]), TypeError, r"^kv_cache: expected a .*got list"),
    "k_cache_list": (lambda c: _with(c, k_cache=[0]), TypeError, r"^k_cache: expected a .*got list"),
    "kv_cache_no_pages": (lambda c: _with(c, kv_cache=c.kv_cache[:0], k_cache=c.k_cache[:0]), ValueError,
                          r"^kv_cache: expected num_pages >= 1, got shape \(0, 16, 576\)"),
    "k_cache_fewer_pages": (lambda c: _with(c, k_cache=c.k_cache[:-1]), ValueError,
                            r"^k_cache: expected num_pages = 8 \(kv_cache's; the two caches share "
                            r"block_table\), got 7"),
    "k_cache_more_pages": (lambda c: _with(c, k_cache=np.concatenate([c.k_cache, c.k_cache[:1]])),
                           ValueError, r"^k_cache: expected num_pages = 8 .*got 9"),
    # values: L_b - N + i must be a position of the table, and its page entry a page of the cache
    "context_lens_below_N": (lambda c: set_len(c, 1, 1), ValueError,
                             r"^context_lens: expected every L_b in \[N, max_pages \* P\] = \[2, 64\] "
                             r"\(L_b counts the N new tokens\), got 1 for request 1"),
    "context_lens_zero": (lambda c: set_len(c, 0, 0), ValueError, r"^context_lens: .* got 0 for request 0"),
    "context_lens_negative": (lambda c: set_len(c, 1, -7), ValueError, r"^context_lens: .* got -7 for request 1"),
    "context_lens_int32_min": (lambda c: set_len(c, 0, -2 ** 31), ValueError,
                               r"^context_lens: .* got -2147483648 for request 0"),
    "context_lens_past_table": (lambda c: set_len(c, 0, 65), ValueError,
                                r"^context_lens: expected every L_b in \[N, max_pages \* P\] = \[2, 64\] .*got 65"),
    "N_above_context": (lambda c: _with(c, x=np.repeat(c.x[:, :1], 21, axis=1)), ValueError,
                        r"^context_lens: expected every L_b in \[N, max_pages \* P\] = \[21, 64\] .*"
                        r"got 20 for request 1"),
    "N_above_table": (lambda c: _with(c, x=np.repeat(c.x[:, :1], 65, axis=1)), ValueError,
                      r"^context_lens: expected every L_b in \[N, max_pages \* P\] = \[65, 64\]"),
    "page_entry_negative": (lambda c: set_entries(c, {1: -1}), ValueError,
                            r"^block_table: expected page entries in \[0, num_pages\) = \[0, 8\) for every "
                            r"new token's page, got -1 at block_table\[1, 1\] \(new token 0 of request 1 "
                            r"at position 18;"),
    "page_entry_num_pages": (lambda c: set_entries(c, {0: 8}), ValueError,
                             r"^block_table: expected page entries in \[0, num_pages\) = \[0, 8\) .*got 8 "
                             r"at block_table\[0, 2\]"),
    "page_entry_wraps_int32": (lambda c: set_entries(c, {0: 2 ** 28 + 1}), ValueError,
                               r"^block_table: .*got 268435457 at block_table\[0, 2\]"),
    "page_entry_int32_max": (lambda c: set_entries(c, {1: 2 ** 31 - 1}), ValueError,
                             r"^block_table: .*got 2147483647 at block_table\[1, 1\]"),
}


# id: (edit(full weights) -> weights argument, error, regex)
BAD_WEIGHTS = {
    "str": (lambda w: "x", TypeError, r"^weights: expected a mapping \{name: array\} .* or None, got str"),
    "list": (lambda w: list(w.values()), TypeError, r"^weights: expected a mapping .*got list"),
    "missing": (lambda w: {k: v for k, v in w.items() if k != "wkv_b"}, ValueError,
                r"^weights: missing 'wkv_b' \(expected shape \(256, 512\)\)"),
    "wrong_shape": (lambda w: {**w, "wo": w["wo"][:, :8]}, ValueError,
                    r"^weights\['wo'\]: expected shape \(256, 128\), got \(256, 8\)"),
    "transposed": (lambda w: {**w, "wq_a": w["wq_a"].T}, ValueError,
                   r"^weights\['wq_a'\]: expected shape \(64, 256\), got \(256, 64\)"),
    "not_numeric": (lambda w: {**w, "q_norm": "ones"}, TypeError,
                    r"^weights\['q_norm'\]: expected a real floating-point array, got str"),
    "complex": (lambda w: {**w, "kv_norm": w["kv_norm"].astype(np.complex64)}, TypeError,
                r"^weights\['kv_norm'\]: expected a real floating-point array, got ndarray complex64"),
}


def token_write_masks(case: lref.LayerCase, tokens, kv_shape, kc_shape):
    """Boolean masks (shapes of the two caches) of every element / byte the cache write of the
    new tokens ``tokens`` ((b, i) pairs) touches, for the case's block table and lengths."""
    P, D_I = case.cfg.page_size, case.cfg.index_head_dim
    N = case.x.shape[1]
    kv = np.zeros(kv_shape, bool).reshape(kv_shape[0], -1)
    kc = np.zeros(kc_shape, bool)
    for b, i in tokens:
        pos = int(case.context_lens[b]) - N + i
        page, off = int(case.block_table[b, pos // P]), pos % P
        if case.kv_format == "fp8_model1":
            kv[page, off * 576:(off + 1) * 576] = True
            kv[page, P * 576 + off * 8:P * 576 + off * 8 + 8] = True
        else:
            w = kv.shape[1] // P
            kv[page, off * w:(off + 1) * w] = True
        kc[page, off * D_I:(off + 1) * D_I] = True
        kc[page, P * D_I + 4 * off:P * D_I + 4 * off + 4] = True
    return kv.reshape(kv_shape), kc


def _num_pages(case):
    return case.kv_cache.shape[0]


# Unmapped new tokens where the value checks cannot run (torch.compile / CUDA-graph capture,
# jax.jit): the step runs, their cache writes are dropped. kind: (edit(case) -> the five
# inputs, the requests whose new tokens are still written). Entry 2^28 + 1 times P = 16 wraps
# int32 to slot 16 + offset, a row of page 1: a wrapping multiply would overwrite it.
UNMAPPED_NEW_TOKENS = {
    "entry_num_pages": (lambda c: set_entries(c, {1: _num_pages(c)}), [0]),
    "entry_wraps_int32": (lambda c: set_entries(c, {1: 2 ** 28 + 1}), [0]),
    "entry_negative": (lambda c: set_entries(c, {0: -1}), [1]),
    "len_negative": (lambda c: set_len(c, 1, -5), [0]),
    "len_int32_max": (lambda c: set_len(c, 0, 2 ** 31 - 1), [1]),
    "all_tokens_unmapped": (lambda c: set_entries(c, {0: _num_pages(c), 1: 2 ** 28 + 1}), []),
}


def check_unmapped_dropped(case: lref.LayerCase, kind: str, good, bad, *, exact: bool = True):
    """``good`` / ``bad``: (out, kv_cache, k_cache) NumPy of the step on the case's own inputs and
    on ``UNMAPPED_NEW_TOKENS[kind]``'s. Every cache byte outside the rows of the still-mapped
    requests' new tokens must equal the input's, bit for bit (always: which bytes are written is
    order-free integer logic); those rows, and those requests' outputs, must equal the good
    step's: bit for bit when ``exact`` (both steps ran the same eager code), else within the
    SPEC bounds (``exact=False``: ``good`` eager, ``bad`` compiled, where Inductor may fuse and
    reorder the float32 math of the norms, rope and projections; the written rows within one
    e4m3 step / rel 1e-5 of a float latent, :mod:`kernels.layer_compare`, and out within SPEC's
    out tolerance)."""
    _, requests = UNMAPPED_NEW_TOKENS[kind]
    N = case.x.shape[1]
    kv_mask, kc_mask = token_write_masks(case, [(b, i) for b in requests for i in range(N)],
                                         case.kv_cache.shape, case.k_cache.shape)
    for name, got, old, mask in (("kv_cache", bad[1], case.kv_cache, kv_mask),
                                 ("k_cache", bad[2], case.k_cache, kc_mask)):
        diff = (np.asarray(got).view(np.uint8) != np.asarray(old).view(np.uint8)).reshape(got.shape[0], -1)
        unwritten = diff & ~np.repeat(mask.reshape(got.shape[0], -1), diff.shape[1] // mask.reshape(
            got.shape[0], -1).shape[1], axis=1)
        assert not unwritten.any(), (f"{name}: bytes outside the mapped new tokens' rows changed, first "
                                     f"at [page, byte] {np.argwhere(unwritten)[:4].tolist()}")
    if requests:
        assert kc_mask.any() and not np.array_equal(good[2], case.k_cache)
    if exact:
        want_kv = np.where(kv_mask, good[1], case.kv_cache)
        want_kc = np.where(kc_mask, good[2], case.k_cache)
        assert np.array_equal(bad[1], want_kv), f"kv_cache: {np.argwhere(bad[1] != want_kv)[:4].tolist()} differ"
        assert np.array_equal(bad[2], want_kc), f"k_cache: {np.argwhere(bad[2] != want_kc)[:4].tolist()} differ"
        for b in requests:
            np.testing.assert_allclose(bad[0][b], good[0][b], rtol=1e-5, atol=1e-6)
        return
    if not requests:
        return
    slots = np.zeros(case.k_cache.shape[0] * case.cfg.page_size, bool)
    _, new = lref.new_token_slots(case.block_table, case.context_lens, N, case.cfg.page_size)
    slots[[int(new[b, i]) for b in requests for i in range(N)]] = True
    got_rows, got_k = layer_compare._cache_rows(case, bad[1], bad[2])
    want_rows, want_k = layer_compare._cache_rows(case, good[1], good[2])
    compare.assert_pass(layer_compare._merge([
        compare.check_close("kv_cache new rows (compiled vs eager)", got_rows[slots], want_rows[slots],
                            abs_tol=layer_compare.CACHE_ABS, rel_tol=layer_compare._cache_rel(case)),
        compare.check_close("k_cache new rows (compiled vs eager)", got_k[slots], want_k[slots],
                            abs_tol=layer_compare.CACHE_ABS, rel_tol=layer_compare.CACHE_REL_FP8),
        compare.check_close("out of the mapped requests (compiled vs eager)",
                            bad[0][requests].astype(np.float64), good[0][requests].astype(np.float64),
                            abs_tol=compare.OUT_ABS, rel_tol=compare.OUT_REL, cos_tol=compare.OUT_COS)]))


# (tp_rank, exception, message regex) with tp_size = 2, the same in both stacks.
BAD_TP_RANK = [
    ("0", TypeError, r"^tp_rank: expected an int \(a Python int or NumPy integer scalar, not a bool\), got str"),
    (True, TypeError, r"^tp_rank: expected an int .*got bool"),
    (2, ValueError, r"^tp_rank: expected an int in \[0, 2\), got 2"),
    (-1, ValueError, r"^tp_rank: expected an int in \[0, 2\), got -1"),
]

# (tp_size, exception, message regex): the kernels.scalars rule for the layers' tp_size.
BAD_TP_SIZE = [
    (True, TypeError, r"^tp_size: expected an int .*got bool"),
    (2.0, TypeError, r"^tp_size: expected an int .*got float"),
    (3, ValueError, r"^tp_size: expected a positive divisor of .*num_heads=4, got 3"),
    (0, ValueError, r"^tp_size: expected an int >= 1, got 0"),
]

# (seed, exception, message regex): the layers' seed of the random weights, the kernels.scalars
# rule (it used to reach NumPy's SeedSequence, whose error does not name seed: trial 2026-12-05).
BAD_SEED = [
    ("a", TypeError, r"^seed: expected an int .*got str"),
    (1.5, TypeError, r"^seed: expected an int .*got float"),
    (True, TypeError, r"^seed: expected an int .*got bool"),
    (-1, ValueError, r"^seed: expected an int >= 0, got -1"),
]
