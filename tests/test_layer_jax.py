"""jax_impl.layer.DSADecodeLayer (Flax NNX) against the float64 layer reference, each step under
one jax.jit with both caches donated (jax_impl.layer.DecodeStep; the tests thread the returned
caches).

Scaled-down configs (4 heads, hidden 256, D_qk 576 / 512, d_v 512, D_I 128, P 16) at both presets;
checks in tests/_layer_checks.py (SPEC tolerances via kernels.compare). On the CPU the Pallas
kernels run in interpret mode with float32 activations; on a GPU the same bodies run there and
the bf16 tests are added (also at the real, unscaled preset dimensions). Every call is jitted
(static shapes); eager dispatch of the same step is several times slower on the CPU and adds no
coverage.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _layer_checks as checks
from jax_impl.layer import DSADecodeLayer, DecodeStep
from kernels import compare, layer_reference as lref

GPU = jax.default_backend() == "gpu"
gpu_only = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")

V32, V4 = lref.DSV32_LAYER.scaled_down(), lref.DSV4_FLASH_LAYER.scaled_down()


def _step(layer, x, kv, kc, bt, cl):
    """One step under the layer's single jit with both caches donated (jax_impl.layer.DecodeStep):
    ``kv`` / ``kc`` are consumed, the returned caches are the updated ones."""
    return DecodeStep(layer, return_intermediates=True)(x, kv, kc, bt, cl)


def _run(layer, case):
    out, kv, kc, inter = _step(layer, *(jnp.asarray(a) for a in (case.x, case.kv_cache, case.k_cache,
                                                                  case.block_table, case.context_lens)))
    conv = {k: (np.asarray(v) if v.dtype == jnp.float8_e4m3fn else compare.to_numpy(v)) for k, v in inter.items()}
    return compare.to_numpy(out), np.asarray(kv), np.asarray(kc), conv


@pytest.mark.parametrize("cfg,fmt,B,N,lens,seed", [
    (V32, "fp8_ds_mla", 2, 2, (150, 40), 0),
    (V4, "fp8_model1", 2, 1, (120, 30), 3),
], ids=["dsv32_fp8_ds_mla_mtp2", "dsv4_fp8_model1"])
def test_layer_matches_reference_jit(cfg, fmt, B, N, lens, seed):
    """The Pallas path (named: no silent fall-back to XLA) under the donating jit."""
    case = lref.make_layer_case(cfg, seed=seed, B=B, N=N, lens=lens, kv_format=fmt)
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=fmt, path="pallas")
    out, kv, kc, inter = _run(layer, case)
    checks.check_step(case, case.reference(), out, kv, kc, inter)


def test_rope_lanes_is_the_sliced_rope_op_by_op():
    """jax_impl.layer._rope_lanes (the rotary embedding over whole rows: partner lanes by a
    reshape and a reverse, tables by a repeat and a pad, a select) against _rope on the slice
    concatenated back, op by op (not jitted: XLA may contract multiply-adds into FMAs
    differently in the two forms): the same bits in all four layouts, with -0.0, +-inf, NaN and
    huge values in and outside the rope lanes."""
    from jax_impl.layer import _rope, _rope_lanes
    rng = np.random.default_rng(0)
    for interleaved in (True, False):
        for at_end in (True, False):
            for D, h, lead in ((128, 32, (2, 3, 4)), (512, 16, (2, 1, 8))):
                x = (rng.standard_normal(lead + (D,)) * 3).astype(np.float32)
                x.reshape(-1)[::37] = -0.0
                x.reshape(-1)[[5, 11, 13, 200]] = [np.inf, np.nan, -np.inf, 3e38]
                cos, sin = (rng.standard_normal(lead[:-1] + (1, h)).astype(np.float32) for _ in "cs")
                r, xj = 2 * h, jnp.asarray(x)
                want = (jnp.concatenate([xj[..., :-r], _rope(xj[..., -r:], cos, sin, interleaved)], -1)
                        if at_end else
                        jnp.concatenate([_rope(xj[..., :r], cos, sin, interleaved), xj[..., r:]], -1))
                got = _rope_lanes(xj, cos, sin, interleaved=interleaved, at_end=at_end)
                np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                              np.asarray(want).view(np.uint32),
                                              err_msg=f"{interleaved=} {at_end=} {D=}")
    with pytest.raises(ValueError, match="multiple of the rope dims"):
        _rope_lanes(jnp.zeros((2, 96)), jnp.zeros((1, 32)), jnp.zeros((1, 32)), interleaved=False,
                    at_end=False)


@pytest.mark.parametrize("cfg,fmt", [(V32, "fp8_ds_mla"), (V4, "fp8_model1")], ids=["dsv32", "dsv4"])
def test_rope_lanes_switch_matches_the_reference(cfg, fmt, monkeypatch):
    """``DSA_JAX_LAYER_ROPE_LANES`` (read when the layer is built): the step with the rotary
    embeddings over whole rows (default) and on the sliced lanes (``0``) each match the float64
    reference, and each other within float32 rounding (under jit the two forms may differ by
    XLA's FMA contraction, ~1 ulp); a bad value is a ValueError naming the variable. The xla
    path: the form is the layer's glue, not an op's."""
    case = lref.make_layer_case(cfg, seed=5, B=2, N=1, lens=(130, 40), kv_format=fmt)
    res = {}
    for v in ("1", "0"):
        monkeypatch.setenv("DSA_JAX_LAYER_ROPE_LANES", v)
        layer = DSADecodeLayer(case.cfg, case.weights, kv_format=fmt, path="xla")
        assert layer.rope_lanes == (v == "1")
        res[v] = _run(layer, case)
        checks.check_step(case, case.reference(), *res[v])
    for k in ("q", "idx_weights"):
        np.testing.assert_allclose(res["1"][3][k], res["0"][3][k], rtol=1e-5, atol=1e-5, err_msg=k)
    monkeypatch.setenv("DSA_JAX_LAYER_ROPE_LANES", "on")
    with pytest.raises(ValueError, match="DSA_JAX_LAYER_ROPE_LANES: expected '0', '1' or unset, got 'on'"):
        DSADecodeLayer(case.cfg, case.weights, kv_format=fmt, path="xla")


def test_tp2_partials_sum_to_tp1():
    """V4 heads / o_groups split over 2 ranks: each rank matches its reference, caches agree, and
    the sum of the partial outputs matches TP=1 (SPEC out bound). The xla path keeps the two
    compilations short; the pallas path is covered above."""
    case = lref.make_layer_case(V4, seed=5, B=1, N=1, lens=(100,), kv_format="latent")
    total, caches = 0.0, []
    for rank in range(2):
        layer = DSADecodeLayer(case.cfg, case.weights, tp_rank=rank, tp_size=2, kv_format="latent", path="xla")
        out, kv, kc, inter = _run(layer, case)
        checks.check_step(case, case.reference(rank, 2), out, kv, kc, inter, tp_rank=rank, tp_size=2)
        total = total + out.astype(np.float64)
        caches.append((kv, kc))
    assert np.array_equal(caches[0][0], caches[1][0]) and np.array_equal(caches[0][1], caches[1][1])
    compare.assert_pass(compare.check_close("tp2 sum", total, case.reference().out, abs_tol=compare.OUT_ABS,
                                            rel_tol=compare.OUT_REL, cos_tol=compare.OUT_COS))


def _model1_case():
    return lref.make_layer_case(V4, seed=3, B=2, N=1, lens=(40, 20), kv_format="fp8_model1",
                                name="unmapped_model1")


def _jit_step(layer, inputs):
    out, kv, kc, _ = _step(layer, *(jnp.asarray(inputs[k]) for k in
                                    ("x", "kv_cache", "k_cache", "block_table", "context_lens")))
    return compare.to_numpy(out), np.asarray(kv), np.asarray(kc)


@pytest.mark.parametrize("fmt,kind", [("latent", k) for k in checks.UNMAPPED_NEW_TOKENS]
                         + [("fp8_model1", "entry_wraps_int32"), ("fp8_model1", "all_tokens_unmapped")])
def test_unmapped_new_token_is_dropped_under_jit(fmt, kind):
    """Inside jit nothing can raise on values: an unmapped new token (page entry >= num_pages,
    one that wraps int32 when multiplied by P, -1, or a position outside the table) changes no
    byte of either cache (its scatter is dropped, never wrapped onto another page); the other
    request's rows are written as in the good step and its output is unchanged."""
    case = checks.bad_input_case() if fmt == "latent" else _model1_case()
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, path="xla")
    edit, _ = checks.UNMAPPED_NEW_TOKENS[kind]
    good = _jit_step(layer, checks.layer_inputs(case))
    checks.check_unmapped_dropped(case, kind, good, _jit_step(layer, edit(case)))


def test_step_donates_both_caches_in_the_compiled_hlo():
    """The whole step is one jit whose compiled HLO aliases the kv_cache and k_cache parameters
    to outputs 1 and 2 (``input_output_alias``): the update is written into the donated buffers,
    neither cache is copied. The passed arrays are consumed (deleted) by the call."""
    import re
    case = _model1_case()
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, path="xla")
    step = DecodeStep(layer)
    args = [jnp.asarray(a) for a in (case.x, case.kv_cache, case.k_cache, case.block_table, case.context_lens)]
    hlo = step.lower(*args).compile().as_text()
    header = next(line for line in hlo.splitlines() if line.startswith("HloModule"))
    aliases = {int(o): int(p) for o, p in re.findall(r"\{(\d+)\}: \((\d+), \{\}, (?:may|must)-alias\)", header)}
    params = {name: int(k) for name, k in re.findall(r"%(kv_cache|k_cache)[.\w]* = \S+ parameter\((\d+)\)", hlo)}
    assert "input_output_alias" in header and set(params) == {"kv_cache", "k_cache"}, header[:300]
    assert aliases.get(1) == params["kv_cache"] and aliases.get(2) == params["k_cache"], (aliases, params)
    out, kv, kc = step(*args)
    assert args[1].is_deleted() and args[2].is_deleted()
    assert kv.shape == case.kv_cache.shape and kc.dtype == jnp.uint8


def test_repeat_threads_the_returned_caches():
    """Two steps, the second fed the caches the first returned (the donated inputs are gone):
    it rewrites the same slots with the same bytes, so outputs and caches are bitwise identical;
    both match the float64 reference."""
    case = lref.make_layer_case(V32, seed=2, B=2, N=1, lens=(70, 33), kv_format="fp8_ds_mla")
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, path="xla")
    step = DecodeStep(layer)
    x, bt, cl = (jnp.asarray(a) for a in (case.x, case.block_table, case.context_lens))
    out1, kv, kc = step(x, jnp.asarray(case.kv_cache), jnp.asarray(case.k_cache), bt, cl)
    first = (np.asarray(out1), np.asarray(kv), np.asarray(kc))
    out2, kv, kc = step(x, kv, kc, bt, cl)
    for a, b in zip(first, (np.asarray(out2), np.asarray(kv), np.asarray(kc))):
        assert np.array_equal(a, b)
    checks.check_step(case, case.reference(), compare.to_numpy(out1), first[1], first[2])


@pytest.fixture(scope="module")
def bad_input_layer():
    case = checks.bad_input_case()
    return case, DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, path="xla")


@pytest.mark.parametrize("name", list(checks.BAD_FORWARD_INPUTS))
def test_bad_forward_input_is_named(bad_input_layer, name):
    """The shared bad-input table (tests/_layer_checks.py, the torch layer gets the same one):
    the same exception type and message as the torch layer. Called eagerly, so the value checks
    (context_lens range, new tokens' page entries) run on the concrete inputs."""
    case, layer = bad_input_layer
    edit, exc, match = checks.BAD_FORWARD_INPUTS[name]
    args = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in edit(case).items()}
    with pytest.raises(exc, match=match):
        layer(**args)


@pytest.mark.parametrize("tp_size,exc,match", checks.BAD_TP_SIZE)
def test_bad_tp_size_is_named(tp_size, exc, match):
    with pytest.raises(exc, match=match):
        DSADecodeLayer(V32, None, tp_size=tp_size)
    assert DSADecodeLayer(V32, None, tp_size=np.int64(2)).local_heads == V32.num_heads // 2


@pytest.mark.parametrize("tp_rank,exc,match", checks.BAD_TP_RANK)
def test_bad_tp_rank_is_named(tp_rank, exc, match):
    with pytest.raises(exc, match=match):
        DSADecodeLayer(V32, None, tp_rank=tp_rank, tp_size=2)


@pytest.mark.parametrize("seed,exc,match", checks.BAD_SEED)
def test_bad_seed_is_named(seed, exc, match):
    with pytest.raises(exc, match=match):
        DSADecodeLayer(V32, None, seed=seed)


@pytest.mark.parametrize("arg", ["x", "kv_cache", "k_cache", "block_table", "context_lens"])
def test_torch_tensor_input_is_named(bad_input_layer, arg):
    """A torch.Tensor argument gets the jax ops' named TypeError; it used to raise ``Cannot
    interpret 'torch.float32' as a data type`` from inside JAX (trial 2026-12-05)."""
    torch = pytest.importorskip("torch")
    from torch_impl._common import as_tensor
    case, layer = bad_input_layer
    args = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v
            for k, v in checks.layer_inputs(case).items()}
    args[arg] = as_tensor(np.asarray(args[arg]))
    assert isinstance(args[arg], torch.Tensor)
    with pytest.raises(TypeError, match=rf"^{arg}: expected a jax.Array or a NumPy array, got a torch.Tensor"):
        layer(**args)


@pytest.mark.parametrize("name", list(checks.BAD_WEIGHTS))
def test_bad_weights_are_named(name):
    edit, exc, match = checks.BAD_WEIGHTS[name]
    with pytest.raises(exc, match=match):
        DSADecodeLayer(V32, edit(lref.init_weights(V32, 1)))


def test_weights_as_bf16_arrays():
    """jax (and ml_dtypes NumPy) bf16 weights are taken at their value: each parameter equals the
    bf16 value in float32."""
    w = {k: jnp.asarray(v, jnp.bfloat16) for k, v in lref.init_weights(V32, 1).items()}
    layer = DSADecodeLayer(V32, w)
    for name in ("wq_a", "wkv_b", "indexer.weights_proj", "q_norm"):
        assert np.array_equal(np.asarray(layer.w(name)), np.asarray(w[name], np.float32)), name


def test_bad_input_is_named():
    case = lref.make_layer_case(V32, seed=0, B=1, N=1, lens=(40,), kv_format="fp8_ds_mla")
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format="fp8_ds_mla", path="xla")
    x, kv, kc, bt, cl = (jnp.asarray(a) for a in (case.x, case.kv_cache, case.k_cache, case.block_table,
                                                   case.context_lens))
    with pytest.raises(ValueError, match="x: expected shape"):
        layer(x[..., :-1], kv, kc, bt, cl)
    with pytest.raises(TypeError, match="block_table"):
        layer(x, kv, kc, bt.astype(jnp.float32), cl)
    with pytest.raises(ValueError, match="k_cache"):
        layer(x, kv, kc[:, :-4], bt, cl)
    with pytest.raises(ValueError, match="kv_cache: expected uint8"):
        layer(x, kv.astype(jnp.float32), kc, bt, cl)
    with pytest.raises(ValueError, match="tp_size"):
        DSADecodeLayer(V4, lref.init_weights(V4), tp_size=4)     # o_groups 2 cannot split 4 ways
    with pytest.raises(ValueError, match="path"):
        DSADecodeLayer(V32, case.weights, path="triton")


@gpu_only
@pytest.mark.parametrize("cfg,fmt", [(V32, "fp8_ds_mla"), (V4, "fp8_model1")], ids=["dsv32", "dsv4"])
def test_bf16_layer_on_gpu(cfg, fmt):
    """bf16 activations and bf16-rounded weights (the reference gets the same rounded weights);
    bound and reason in tests/_layer_checks.py (check_bf16_step, BF16_COS)."""
    import ml_dtypes
    case = lref.make_layer_case(cfg, seed=0, B=2, N=1, lens=(150, 40), kv_format=fmt)
    case.weights = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in case.weights.items()}
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=fmt, dtype=jnp.bfloat16, path="pallas")
    out, _, kc, inter = _run(layer, case)
    checks.check_bf16_step(case, out, kc, inter)


@gpu_only
@pytest.mark.parametrize("cfg,fmt,seed", [(lref.DSV32_LAYER, "fp8_ds_mla", 0),
                                         (lref.DSV4_FLASH_LAYER, "fp8_model1", 3)], ids=["dsv32", "dsv4"])
def test_bf16_layer_at_real_dimensions_on_gpu(cfg, fmt, seed):
    """The unscaled layer (V3.2: 128 heads, hidden 7168, top-k 2048; V4-Flash: 64 heads, hidden
    4096, top-k 512 + window 128; P 64) on the Pallas kernels in bf16 with bf16-rounded weights,
    B = 2: one request 1024 tokens longer than top-k + window, one holding half of top-k (the
    lengths of parity's GPU layer cases, parity.cases.layer_real_lens). Bound and reason in
    tests/_layer_checks.py (check_bf16_step, BF16_COS)."""
    import ml_dtypes
    lens = (cfg.topk + cfg.window + 1024, cfg.topk // 2)
    case = lref.make_layer_case(cfg, seed=seed, B=2, N=1, lens=lens, kv_format=fmt)
    case.weights = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in case.weights.items()}
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=fmt, dtype=jnp.bfloat16, path="pallas")
    assert layer.local_heads == cfg.num_heads == cfg.preset.num_heads
    out, _, kc, inter = _run(layer, case)
    assert out.shape == (2, 1, cfg.hidden)
    checks.check_bf16_step(case, out, kc, inter)
