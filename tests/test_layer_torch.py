"""torch_impl.layer.DSADecodeLayer (torch.nn.Module) against the float64 layer reference.

Scaled-down configs (4 heads, hidden 256, D_qk 576 / 512, d_v 512, D_I 128, P 16) at both presets;
checks in tests/_layer_checks.py (SPEC tolerances via kernels.compare). On a CPU machine the
Triton kernels run in the interpreter (tests/conftest.py) with float32 activations; on a CUDA GPU
the same bodies run on the GPU, and the bf16 / CUDA-graph tests at the end are added (bf16 also
at the real, unscaled preset dimensions).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import compare, layer_reference as lref
import _layer_checks as checks
from torch_impl._common import as_tensor
from torch_impl.layer import DSADecodeLayer
from torch_impl.linear import GEMV_ENV

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

V32, V4 = lref.DSV32_LAYER.scaled_down(), lref.DSV4_FLASH_LAYER.scaled_down()

CASES = {  # name: (cfg, kv_format, B, N, lens, seed)
    "dsv32_fp8_ds_mla": (V32, "fp8_ds_mla", 2, 1, (150, 40), 0),
    "dsv32_latent_mtp2": (V32, "latent", 2, 2, (130, 70), 1),
    "dsv4_fp8_model1": (V4, "fp8_model1", 2, 1, (120, 30), 3),
    "dsv4_latent_mtp2": (V4, "latent", 1, 2, (90,), 4),
}


ONE_TOKEN_CASES = {  # B 1, N 1: every projection has M = 1 (the one-token GEMV's cases)
    "dsv32_fp8_ds_mla_b1": (V32, "fp8_ds_mla", 1, 1, (150,), 0),
    "dsv4_fp8_model1_b1": (V4, "fp8_model1", 1, 1, (120,), 3),
}


def _case(name):
    cfg, fmt, B, N, lens, seed = CASES[name] if name in CASES else ONE_TOKEN_CASES[name]
    return lref.make_layer_case(cfg, seed=seed, B=B, N=N, lens=lens, kv_format=fmt, name=name)


def _inputs(case):
    return [as_tensor(a, DEVICE) for a in (case.x, case.kv_cache, case.k_cache, case.block_table,
                                           case.context_lens)]


def _np(t):
    return compare.to_numpy(t)


def _run(layer, case, **kw):
    out, kv, kc, inter = layer(*_inputs(case), return_intermediates=True, **kw)
    return _np(out), _np(kv), _np(kc), {k: (t.view(torch.uint8).cpu().numpy().view(lref.formats.E4M3)
                                            if t.dtype == torch.float8_e4m3fn else _np(t))
                                        for k, t in inter.items()}


@pytest.mark.parametrize("name,path,fused", [(n, "triton", True) for n in CASES]
                         + [(n, "triton", False) for n in ("dsv32_latent_mtp2", "dsv4_fp8_model1")]
                         + [("dsv32_fp8_ds_mla", "torch", True)])
def test_layer_matches_reference(name, path, fused):
    """Every case on the Triton kernels (named path: no silent fall-back) with the fused step
    preparation (``dsa::prep_x`` / ``dsa::prep_q``), two with the composite one
    (``fused_prep=False``), one on plain PyTorch."""
    case = _case(name)
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE, path=path,
                           fused_prep=fused)
    out, kv, kc, inter = _run(layer, case)
    checks.check_step(case, case.reference(), out, kv, kc, inter)


@pytest.mark.parametrize("name", ["dsv32_fp8_ds_mla", "dsv4_fp8_model1"])
def test_tp2_partials_sum_to_tp1(name):
    """Heads split over 2 ranks (column-parallel wq_b / wkv_b / wo_a, row-parallel wo / wo_b):
    each rank matches its own reference, both write identical caches, and the sum of the two
    partial outputs (what an all-reduce computes) matches TP=1 within SPEC's out bound."""
    case = _case(name)
    total, caches = 0.0, []
    for rank in range(2):
        layer = DSADecodeLayer(case.cfg, case.weights, tp_rank=rank, tp_size=2,
                               kv_format=case.kv_format, device=DEVICE, path="torch")
        assert layer.local_heads == case.cfg.num_heads // 2
        out, kv, kc, inter = _run(layer, case)
        checks.check_step(case, case.reference(rank, 2), out, kv, kc, inter, tp_rank=rank, tp_size=2)
        total = total + out.astype(np.float64)
        caches.append((kv, kc))
    assert np.array_equal(caches[0][0], caches[1][0]) and np.array_equal(caches[0][1], caches[1][1])
    compare.assert_pass(compare.check_close("tp2 sum", total, case.reference().out, abs_tol=compare.OUT_ABS,
                                            rel_tol=compare.OUT_REL, cos_tol=compare.OUT_COS))


def test_repeat_is_bitwise_identical():
    case = _case("dsv4_fp8_model1")
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE, path="torch")
    a = layer(*_inputs(case))
    b = layer(*_inputs(case))
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_bad_input_is_named():
    case = _case("dsv32_fp8_ds_mla")
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE, path="torch")
    x, kv, kc, bt, cl = _inputs(case)
    with pytest.raises(ValueError, match="x: expected shape"):
        layer(x[..., :-1], kv, kc, bt, cl)
    with pytest.raises(TypeError, match="context_lens"):
        layer(x, kv, kc, bt, cl.long())
    with pytest.raises(ValueError, match="block_table"):
        layer(x, kv, kc, bt[:1], cl)
    with pytest.raises(ValueError, match="kv_cache: expected uint8"):
        layer(x, kv[..., :-1].contiguous(), kc, bt, cl)
    bad = bt.clone()
    bad[0] = -1                                    # the new token's page is unmapped
    with pytest.raises(ValueError, match=r"block_table: expected page entries in \[0, num_pages\)"):
        layer(x, kv, kc, bad, cl)
    with pytest.raises(ValueError, match="tp_size"):
        DSADecodeLayer(case.cfg, case.weights, tp_size=3)
    with pytest.raises(ValueError, match="kv_format"):
        DSADecodeLayer(case.cfg, case.weights, kv_format="fp8_model1")
    with pytest.raises(ValueError, match="weights\\['wo'\\]"):
        DSADecodeLayer(case.cfg, {**case.weights, "wo": case.weights["wo"][:, :8]})


@pytest.mark.parametrize("name,gemv", [("dsv32_fp8_ds_mla", False), ("dsv4_latent_mtp2", False),
                                       ("dsv32_fp8_ds_mla_b1", True), ("dsv4_fp8_model1_b1", True)])
def test_linear_triton_matches_reference_and_torch_gemms(name, gemv, monkeypatch):
    """Every projection on the Triton few-token GEMM (``linear="triton"``; the DSA ops on plain
    PyTorch, so the GEMMs are all that differs): the float64 reference's checks, and the float32
    intermediates within 1e-5 x max|value| of the torch-GEMM layer's. Why that bound: both sum
    the same float32 products, in another order, so each GEMM differs by at most 2 K u32
    sum|x w| (K <= 512 here: 6e-5 sum|x w|), through at most three GEMMs and a norm; the
    observed difference is 2-6e-7 x max|value|, and 1e-5 stays 100x below SPEC's output bound.
    The B 1 cases run the one-token GEMV (``DSA_LINEAR_GEMV=1``: every GEMM has M = 1, all but
    V3.2's N-major ``wkv_b_q``, which stays on the tensor-core kernel), with the same bound
    (another summation order of the same float32 products)."""
    from kernels.linear import triton as ktriton
    monkeypatch.setenv(GEMV_ENV, "1" if gemv else "0")
    launches = []
    real = ktriton.launch_gemv
    monkeypatch.setattr(ktriton, "launch_gemv", lambda *a, **k: launches.append(1) or real(*a, **k))
    case = _case(name)
    got = {}
    for lin in ("torch", "triton"):
        layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                               path="torch", linear=lin)
        assert set(layer.linear.values()) == {lin}
        got[lin] = _run(layer, case)
    from torch_impl.layer import LAYER_GEMMS
    n_major = 1 if case.cfg.absorbed else 0                         # wkv_b_q (w^T): not the GEMV
    # wq_b and indexer.wq_b as one GEMV over qr_proj (test_qr_projections_as_one_gemv)
    assert len(launches) == (len(LAYER_GEMMS[case.cfg.absorbed]) - n_major - 1 if gemv else 0)
    out, kv, kc, inter = got["triton"]
    checks.check_step(case, case.reference(), out, kv, kc, inter)
    t_out, _, _, t_inter = got["torch"]
    for key, a, b in [("out", out, t_out)] + [(k, inter[k], t_inter[k]) for k in ("q", "idx_weights", "attn")]:
        scale = float(np.abs(b).max())
        compare.assert_pass(compare.check_close(f"{key} (linear=triton vs torch)", a, b,
                                                abs_tol=1e-5 * scale, rel_tol=0.0))


@pytest.mark.parametrize("cfg", [V32, V4], ids=["dsv32", "dsv4"])
def test_qr_projections_as_one_gemv(cfg, monkeypatch):
    """A one-token step's ``wq_b`` and ``indexer.wq_b`` (both read qr) run as one GEMV over the
    layer's ``qr_proj`` (their rows, stacked; ``w(name)`` the row slices): one launch, its two
    column slices the two projections. Against the two projections run apart on the same
    kernel: bit for bit wherever the kernel's config (by N and K) is the same for the joint N as
    for each alone, within the GEMV's own float32 rounding otherwise; and at both presets' real
    dimensions (tp 1 and 8; 132, 170 and 188 SMs) the configs are the same, so the bits are.
    A two-token step runs two projections."""
    from kernels.linear import configs as lcfg, triton as ktriton
    from torch_impl import _common, linear as tlinear
    for real in (lref.DSV32_LAYER, lref.DSV4_FLASH_LAYER):
        for tp in (1, 8):
            s = {p.name: p for p in lref.projection_shapes(real, tp)}
            nq, ni, k = s["wq_b"].n, s["indexer.wq_b"].n, s["wq_b"].k
            assert s["indexer.wq_b"].k == k
            for sms in (132, 170, 188):
                picks = {lcfg.gemv_heuristic(n, k, 1, False, sms) for n in (nq, ni, nq + ni)}
                assert len(picks) == 1, (real.name, tp, sms, picks)
    monkeypatch.setenv(GEMV_ENV, "1")
    layer = DSADecodeLayer(cfg, None, device=DEVICE, dtype=torch.float32, path="triton",
                           linear="triton")
    wq, wi = layer.w("wq_b"), layer.w("indexer.wq_b")
    assert wq.data_ptr() == layer.qr_proj.data_ptr() and wi.shape[1] == wq.shape[1]
    assert torch.equal(layer.qr_proj, torch.cat([wq, wi]))
    launches = []
    real_launch = ktriton.launch_gemv
    monkeypatch.setattr(ktriton, "launch_gemv", lambda *a, **k: launches.append(1) or real_launch(*a, **k))
    qr = torch.randn(1, wq.shape[1], generator=torch.Generator().manual_seed(3)).to(DEVICE)
    q, iq = layer._project_qr(qr)
    assert len(launches) == 1 and q.shape == (1, wq.shape[0]) and iq.shape == (1, wi.shape[0])
    apart = [tlinear.linear(qr, w, path="triton") for w in (wq, wi)]
    assert len(launches) == 3
    sms = _common.device_info(qr.device).num_sms
    same = len({lcfg.gemv_heuristic(n, wq.shape[1], 1, False, sms)
                for n in (wq.shape[0], wi.shape[0], wq.shape[0] + wi.shape[0])}) == 1
    for got, want in ((q, apart[0]), (iq, apart[1])):
        if same:
            assert torch.equal(got, want)
        else:           # another BLOCK_K: the same float32 products summed in another order
            bound = 2 * wq.shape[1] * 2.0 ** -24 * float((qr.abs() @ torch.cat([wq, wi]).abs().T).max())
            assert float((got - want).abs().max()) <= bound
    q2, iq2 = layer._project_qr(qr.expand(2, -1).contiguous())
    assert len(launches) == 3                    # two tokens: not the GEMV (the few-token GEMM)
    assert torch.allclose(q2[1], q[0], rtol=1e-5, atol=1e-5) and torch.allclose(iq2[0], iq[0], rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("DSA_LAYER_JOINT_GEMV", "0")                 # the A/B switch: two GEMVs
    apart_layer = DSADecodeLayer(cfg, None, device=DEVICE, dtype=torch.float32, path="triton",
                                 linear="triton")
    q0, iq0 = apart_layer._project_qr(qr)
    assert len(launches) == 5 and torch.equal(q0, apart[0]) and torch.equal(iq0, apart[1])


@pytest.mark.parametrize("cfg", [V32, V4], ids=["dsv32", "dsv4"])
def test_x_proj_and_weights_proj_in_one_launch(cfg, monkeypatch):
    """A one-token step of the fused preparation runs ``x_proj`` and the float32
    ``weights_proj`` as one launch (``torch_impl.linear.linear_pair``) where both products'
    one-token configs form a listed pair, which they do at both presets' real dimensions (tp 1
    and 8; 132, 170 and 188 SMs): the same bits as the two GEMVs (``weights_proj`` on the
    float32 copy of the token, as the preparation runs it), one launch of the pair kernel; with
    ``DSA_LAYER_JOINT_GEMV=0`` or two tokens, two projections."""
    from kernels.linear import configs as lcfg, triton as ktriton
    from torch_impl import _common
    for real in (lref.DSV32_LAYER, lref.DSV4_FLASH_LAYER):
        for tp in (1, 8):
            s = {p.name: p for p in lref.projection_shapes(real, tp)}
            for sms in (132, 170, 188):
                picks = tuple(lcfg.gemv_heuristic(s[n].n, s[n].k, 1, False, sms)
                              for n in ("x_proj", "indexer.weights_proj"))
                assert picks in lcfg.GEMV_PAIR_PICKS, (real.name, tp, sms, picks)
    monkeypatch.setenv(GEMV_ENV, "1")
    if not CUDA:        # 16 SMs: the small layer's pair is then a listed one (8 x 512, 1 x 2,048)
        import dataclasses
        from kernels import hardware
        info = dataclasses.replace(hardware.CPU_INTERPRETER, num_sms=16)
        monkeypatch.setattr(_common, "device_info", lambda device: info)
    layer = DSADecodeLayer(cfg, None, device=DEVICE, dtype=torch.float32, path="triton",
                           linear="triton", fused_prep=True)
    pairs = []
    real_pair = ktriton.launch_gemv_pair
    monkeypatch.setattr(ktriton, "launch_gemv_pair", lambda *a: pairs.append(1) or real_pair(*a))
    x = torch.randn(1, cfg.hidden, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    xp, w_raw = layer._project_x(x)
    wp = layer.w("indexer.weights_proj")
    sms = _common.device_info(x.device).num_sms
    listed = tuple(lcfg.gemv_heuristic(w.shape[0], w.shape[1], 1, False, sms)
                   for w in (layer.x_proj, wp)) in lcfg.GEMV_PAIR_PICKS
    assert listed or CUDA
    assert len(pairs) == int(listed) and w_raw is not None and w_raw.dtype == torch.float32
    alpha = cfg.index_heads ** -0.5 * cfg.index_head_dim ** -0.5
    assert torch.equal(xp, layer._gemm("x_proj", x, layer.x_proj))
    assert torch.equal(w_raw, layer._gemm("indexer.weights_proj", x.float(), wp, alpha=alpha,
                                          out_dtype=torch.float32))
    assert layer._project_x(x.expand(2, -1).contiguous())[1] is None and len(pairs) == int(listed)
    monkeypatch.setenv("DSA_LAYER_JOINT_GEMV", "0")
    off = DSADecodeLayer(cfg, None, device=DEVICE, dtype=torch.float32, path="triton",
                         linear="triton", fused_prep=True)
    xp0, none = off._project_x(x)
    assert none is None and torch.equal(xp0, xp) and len(pairs) == int(listed)


def test_topk_window_switch_gives_the_same_step(monkeypatch):
    """``DSA_LAYER_TOPK_WINDOW`` (read when the layer is built): V4's index list as one op
    (``dsa::indexer_topk_window``, the default) or, with ``0``, as the top-k, the window and a
    concatenation: the same step bit for bit (output, both caches, the indices); a value other
    than ``0``, ``1`` or unset is a ValueError naming the variable, at construction."""
    case = _case("dsv4_fp8_model1")
    layers = {}
    for value in ("1", "0"):
        monkeypatch.setenv("DSA_LAYER_TOPK_WINDOW", value)
        layers[value] = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format,
                                       device=DEVICE, path="triton")
    assert layers["1"].topk_window_op and not layers["0"].topk_window_op
    one, apart = _run(layers["1"], case), _run(layers["0"], case)
    for a, b in zip(one[:3], apart[:3]):
        assert np.array_equal(a, b)
    assert one[3].keys() == apart[3].keys() and "indices" in one[3]
    for k in one[3]:
        assert np.array_equal(one[3][k], apart[3][k]), k
    checks.check_step(case, case.reference(), *apart)
    monkeypatch.setenv("DSA_LAYER_TOPK_WINDOW", "yes")
    with pytest.raises(ValueError, match="DSA_LAYER_TOPK_WINDOW: expected '0', '1' or unset, got 'yes'"):
        DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE, path="triton")


@pytest.mark.parametrize("tp", [1, 2])
def test_projection_shapes_cover_the_weights(tp):
    """kernels.layer_config.projection_shapes (what bench/linear_sweep.py times) lists the
    layer's GEMMs (LAYER_GEMMS, in order) and their weights add up to the rank's 2-D weights."""
    from torch_impl.layer import LAYER_GEMMS
    for cfg in (lref.DSV32_LAYER, lref.DSV4_FLASH_LAYER):
        shapes = lref.projection_shapes(cfg, tp)
        assert tuple(p.name for p in shapes) == LAYER_GEMMS[cfg.absorbed]
        full = {k: np.zeros(v, np.float32) for k, v in lref.weight_shapes(cfg).items()}
        rank = lref.shard_weights(cfg, full, 0, tp)
        assert sum(p.numel for p in shapes) == sum(a.size for a in rank.values() if a.ndim == 2)


def test_linear_switch(monkeypatch):
    """``linear``: "torch" / "triton" / "auto" / "gemv" for every GEMM, per GEMM as a mapping
    or "name=choice,..." (the rest torch), None reads DSA_LAYER_LINEAR (unset: "gemv",
    ``LINEAR_DEFAULT``); bad values are ValueError / TypeError naming ``linear``."""
    from torch_impl.layer import LAYER_GEMMS, LINEAR_AUTO, LINEAR_DEFAULT, LINEAR_ENV
    monkeypatch.delenv(LINEAR_ENV, raising=False)
    assert LINEAR_DEFAULT == "gemv"
    assert set(DSADecodeLayer(V4, None).linear.values()) == {"gemv"}
    assert set(DSADecodeLayer(V4, None, linear="torch").linear.values()) == {"torch"}
    assert set(DSADecodeLayer(V32, None, linear="gemv").linear.values()) == {"gemv"}
    mixed = DSADecodeLayer(V32, None, linear="wo=gemv,x_proj=triton").linear
    assert (mixed["wo"], mixed["x_proj"], mixed["wq_b"]) == ("gemv", "triton", "torch")
    for absorbed, cfg in ((True, V32), (False, V4)):
        auto = DSADecodeLayer(cfg, None, linear="auto").linear
        assert list(auto) == list(LAYER_GEMMS[absorbed])
        assert {n for n, c in auto.items() if c == "triton"} == set(LINEAR_AUTO) & set(LAYER_GEMMS[absorbed])
    one = DSADecodeLayer(V32, None, linear="x_proj=triton,wo=triton").linear
    assert {n for n, c in one.items() if c == "triton"} == {"x_proj", "wo"}
    assert DSADecodeLayer(V4, None, linear={"wo_a": "triton"}).linear["wo_a"] == "triton"
    monkeypatch.setenv(LINEAR_ENV, "triton")
    assert set(DSADecodeLayer(V4, None).linear.values()) == {"triton"}
    for bad, exc, match in (("cuda", ValueError, "linear: expected 'torch', 'triton', 'auto', 'gemv'"),
                            ("wo_a=triton", ValueError, r"linear: expected GEMM names of this layer"),
                            ({"wo": "cublas"}, ValueError, r"linear\['wo'\]: expected one of"),
                            (3, TypeError, "linear: expected a str, a mapping")):
        with pytest.raises(exc, match=match):
            DSADecodeLayer(V32, None, linear=bad)


def test_gemv_applies_and_the_overlap(monkeypatch):
    """``"gemv"``: the one-token kernel for a one-token step, a K-major weight, on CUDA off the
    torch path, unless DSA_LINEAR_GEMV is 0 (the layer reads it once, when built); torch's GEMM
    otherwise (the CPU included). At one token the overlap does not run beside it (its GEMMs are
    torch's); at two tokens, or with the one-token kernel off, the switch is torch's and the
    overlap runs."""
    from torch_impl import linear as tlinear
    from torch_impl.layer import gemv_applies, linear_switch, overlap_applies
    monkeypatch.delenv(tlinear.GEMV_ENV, raising=False)
    w = torch.zeros(8, 16)
    assert gemv_applies(1, w, "cuda", "auto") and gemv_applies(1, w, "cuda", "triton")
    assert not gemv_applies(2, w, "cuda", "auto")                    # two tokens
    assert not gemv_applies(1, w.t(), "cuda", "auto")                # N-major (wkv_b_q)
    assert not gemv_applies(1, w, "cpu", "auto")                     # the CPU: torch's GEMM
    assert not gemv_applies(1, w, "cuda", "torch")
    lin = linear_switch("gemv", True)
    assert not overlap_applies(1, "cuda", True, "auto", lin)
    assert overlap_applies(2, "cuda", True, "auto", lin)
    assert overlap_applies(1, "cuda", True, "auto", linear_switch("torch", True))
    assert not gemv_applies(1, w, "cuda", "auto", enabled=False)
    assert not overlap_applies(1, "cuda", True, "auto", lin, gemv=True)
    assert overlap_applies(1, "cuda", True, "auto", lin, gemv=False)
    assert DSADecodeLayer(V4, None).gemv is True
    monkeypatch.setenv(tlinear.GEMV_ENV, "0")
    assert not gemv_applies(1, w, "cuda", "auto")
    assert gemv_applies(1, w, "cuda", "auto", enabled=True)     # the layer's value, read once
    assert overlap_applies(1, "cuda", True, "auto", lin)
    assert DSADecodeLayer(V4, None).gemv is False


@pytest.fixture(scope="module")
def bad_input_layer():
    case = checks.bad_input_case()
    return case, DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE, path="torch")


def _to_torch(inputs):
    return {k: as_tensor(v, DEVICE) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}


@pytest.mark.parametrize("name", list(checks.BAD_FORWARD_INPUTS))
def test_bad_forward_input_is_named(bad_input_layer, name):
    """The shared bad-input table (tests/_layer_checks.py, the JAX layer gets the same one): the
    exception type and message naming the argument, raised before either cache is written."""
    case, layer = bad_input_layer
    edit, exc, match = checks.BAD_FORWARD_INPUTS[name]
    args = _to_torch(edit(case))
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(exc, match=match):
        layer(**args)
    for k, v in before.items():
        assert torch.equal(args[k], v), f"{k} was modified before the error"


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


@pytest.mark.parametrize("fused_prep", ["no", 0, 1, "False"])
def test_fused_prep_must_be_a_bool(fused_prep):
    """``fused_prep="no"`` used to be taken as True (``bool("no")``; trial 2026-12-05)."""
    with pytest.raises(TypeError, match=r"^fused_prep: expected a bool or None, got "):
        DSADecodeLayer(V32, None, fused_prep=fused_prep)
    assert DSADecodeLayer(V32, None, fused_prep=np.bool_(False)).fused_prep is False


@pytest.mark.parametrize("overlap", ["yes", 0, 1])
def test_overlap_must_be_a_bool(overlap):
    with pytest.raises(TypeError, match=r"^overlap: expected a bool or None, got "):
        DSADecodeLayer(V32, None, overlap=overlap)


def test_overlap_rule():
    """Where the step runs as ``dsa::q_index_overlap`` (``overlap_applies``): CUDA, fused
    preparation, off the torch path, none of its GEMMs on the Triton GEMM (while T <= 64), and
    at most OVERLAP_MAX_TOKENS tokens unless forced; never on the CPU (no streams), where the op
    itself raises NotImplementedError naming the device."""
    from torch_impl.layer import OVERLAP_MAX_TOKENS, linear_switch, overlap_applies, q_index_overlap
    torch_lin, auto_lin = linear_switch("torch", True), linear_switch("auto", True)
    T = OVERLAP_MAX_TOKENS
    assert overlap_applies(1, "cuda", True, "auto", torch_lin)
    assert overlap_applies(T, "cuda", True, "triton", torch_lin)
    assert not overlap_applies(T + 1, "cuda", True, "triton", torch_lin)
    assert overlap_applies(T + 1, "cuda", True, "triton", torch_lin, True)
    assert not overlap_applies(1, "cuda", True, "triton", torch_lin, False)
    assert not overlap_applies(1, "cpu", True, "triton", torch_lin, True)
    assert not overlap_applies(1, "cuda", False, "triton", torch_lin, True)
    assert not overlap_applies(1, "cuda", True, "torch", torch_lin, True)
    assert not overlap_applies(1, "cuda", True, "triton", auto_lin, True)   # indexer GEMMs on Triton
    assert overlap_applies(65, "cuda", True, "triton", auto_lin, True)      # Triton GEMM only to 64
    assert not overlap_applies(1, "cuda", True, "triton", torch_lin, np.False_)
    assert overlap_applies(T + 1, "cuda", True, "triton", torch_lin, np.True_)
    for args, exc, match in [
            ((0, "cuda", True, "triton", torch_lin), ValueError, r"^T: expected a positive int"),
            ((4.5, "cuda", True, "triton", torch_lin), ValueError, r"^T: expected a positive int"),
            ((4, torch.device("cpu"), True, "triton", torch_lin), TypeError, r"^device_type: expected a str"),
            ((4, "cuda", True, "triton", None), TypeError, r"^linear: expected linear_switch's dict"),
            ((4, "cuda", True, "bogus", torch_lin), ValueError, r"^path: expected one of"),
            ((4, "cuda", True, "triton", torch_lin, 0), TypeError, r"^overlap: expected a bool or None, got int 0"),
            ((4, "cuda", True, "triton", torch_lin, "no"), TypeError, r"^overlap: expected a bool or None")]:
        with pytest.raises(exc, match=match):
            overlap_applies(*args)
    layer = DSADecodeLayer(V32, None, overlap=True)
    assert not layer._overlaps(1, torch.device("cpu"))
    z = torch.zeros(1, 1)
    kw = dict(heads=1, index_heads=1, d_qk=1, qk_nope=0, scale_fmt=None, eps=1e-6, absorbed=False,
              q_head_norm=False, w_alpha=1.0, topk=1, window=0)
    with pytest.raises(NotImplementedError, match=r"^q_index_overlap: runs on CUDA devices .*got cpu"):
        q_index_overlap(*([z] * 12), 1, **kw)
    with pytest.raises(TypeError, match=r"^qr: expected a torch.Tensor, got ndarray"):
        q_index_overlap(np.zeros((1, 1)), *([z] * 11), 1, **kw)
    with pytest.raises(TypeError, match=r"^k_cache: expected a torch.Tensor, got NoneType"):
        q_index_overlap(*([z] * 9), None, z, z, 1, **kw)


def test_overlap_carveout_switch(monkeypatch):
    """``DSA_LAYER_OVERLAP_CARVEOUT``: unset the default SMs, an integer those, anything else a
    ValueError naming the variable; ``_sm_carveout`` sets torch's carveout inside and restores
    the previous value after (also after an exception), nothing at 0."""
    from torch_impl.layer import OVERLAP_SM_CARVEOUT, _sm_carveout, overlap_sm_carveout
    monkeypatch.delenv("DSA_LAYER_OVERLAP_CARVEOUT", raising=False)
    assert overlap_sm_carveout() == OVERLAP_SM_CARVEOUT
    monkeypatch.setenv("DSA_LAYER_OVERLAP_CARVEOUT", "0")
    assert overlap_sm_carveout() == 0
    for bad in ("-4", "16.5", "many", "\u00b2", "\u0663", "1234567"):     # superscript 2, Arabic 3
        monkeypatch.setenv("DSA_LAYER_OVERLAP_CARVEOUT", bad)
        with pytest.raises(ValueError, match=r"^DSA_LAYER_OVERLAP_CARVEOUT: expected a non-negative integer \(SMs\), got "):
            overlap_sm_carveout()
        with pytest.raises(ValueError, match=r"^DSA_LAYER_OVERLAP_CARVEOUT: "):   # read at construction
            DSADecodeLayer(V32, None)
    monkeypatch.setenv("DSA_LAYER_OVERLAP_CARVEOUT", "48")
    assert DSADecodeLayer(V32, None).overlap_carveout == 48
    monkeypatch.delenv("DSA_LAYER_OVERLAP_CARVEOUT")
    get = getattr(torch._C, "_get_sm_carveout_experimental", None)
    if get is None:
        pytest.skip("this torch has no SM carveout")
    before, lib = get(), torch.backends.cuda.preferred_blas_library()
    with _sm_carveout(24):
        assert get() == 24
        if torch.cuda.is_available():              # the carveout reaches cuBLASLt's SM target
            assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublaslt
    assert get() == before and torch.backends.cuda.preferred_blas_library() == lib
    with pytest.raises(RuntimeError, match="boom"):
        with _sm_carveout(24):
            raise RuntimeError("boom")
    assert get() == before
    with _sm_carveout(0):
        assert get() == before


@pytest.mark.parametrize("cfg", [V32, V4], ids=["V3.2", "V4"])
def test_q_index_overlap_fake_shapes(cfg):
    """``dsa::q_index_overlap``'s fake (what torch.compile traces with, and the meta device runs)
    gives the shapes and dtypes of the one-stream step's tensors (scaled-down presets)."""
    def meta(*shape, dt=torch.bfloat16):
        return torch.empty(shape, dtype=dt, device="meta")
    T, B, N = 4, 2, 2
    H, H_I, D_I = cfg.num_heads, cfg.index_heads, cfg.index_head_dim
    f32 = torch.float32
    wkv_b_q = meta(H, cfg.kv_lora_rank, cfg.qk_nope_head_dim) if cfg.absorbed else None
    out = torch.ops.dsa.q_index_overlap(
        meta(T, cfg.q_lora_rank), meta(T, cfg.hidden, dt=f32), meta(H * 8, cfg.q_lora_rank), wkv_b_q,
        meta(H_I * D_I, cfg.q_lora_rank), meta(H_I, cfg.hidden, dt=f32), meta(dt=f32), meta(D_I, D_I),
        meta(cfg.d_rope // 2, dt=torch.float64), meta(8, 64 * (D_I + 4), dt=torch.uint8),
        meta(B, 4, dt=torch.int32), meta(B, dt=torch.int32), N, H, H_I, cfg.d_qk,
        cfg.qk_nope_head_dim if cfg.absorbed else 0, cfg.scale_fmt, cfg.eps, cfg.absorbed,
        cfg.q_head_norm, 0.01, cfg.topk, cfg.window, True, "triton", 32)
    assert [(tuple(o.shape), o.dtype) for o in out] == [
        ((T, H, cfg.d_qk), torch.bfloat16), ((T, H_I, D_I), torch.float8_e4m3fn), ((T, H_I), f32),
        ((B, N, cfg.topk + cfg.window), torch.int32), ((B, N), torch.int32)]


@pytest.mark.parametrize("device,exc,match", [
    ("nodevice", ValueError, r"^device: expected a device string such as 'cpu' or 'cuda:0', got 'nodevice'"),
    (1.0, TypeError, r"^device: expected a torch.device, a device string .*got float"),
    (True, TypeError, r"^device: expected a torch.device, a device string .*got bool"),
    ("cuda:99", ValueError, r"^device: expected (a device this torch can use|a CUDA index in)"),
] + ([] if CUDA else [("cuda", ValueError, r"^device: expected a device this torch can use, got 'cuda'")]))
def test_bad_device_is_named(device, exc, match):
    """A device torch cannot parse or use here is named: ``device="cuda"`` on a CPU-only torch
    used to raise torch's bare ``AssertionError: Torch not compiled with CUDA enabled``."""
    with pytest.raises(exc, match=match):
        DSADecodeLayer(V32, None, device=device)


def test_x_requiring_grad_gives_the_no_grad_output():
    """An inference layer: ``x`` from an upstream module outside ``no_grad`` (requires grad) used
    to crash inside the layer (``bmm(): functions with out=... arguments don't support automatic
    differentiation``; trial 2026-12-05). The step runs under ``torch.no_grad()``: the output
    equals the one of ``x.detach()`` bit for bit and does not require grad."""
    case = _case("dsv32_fp8_ds_mla")
    for fused in (True, False):
        layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                               path="torch", fused_prep=fused)
        x, kv, kc, bt, cl = _inputs(case)
        lin = torch.nn.Linear(x.shape[-1], x.shape[-1], device=DEVICE)
        xg = lin(x)
        assert xg.requires_grad
        want, kv_w, kc_w = layer(xg.detach(), kv.clone(), kc.clone(), bt, cl)
        got, kv_g, kc_g = layer(xg, kv.clone(), kc.clone(), bt, cl)
        assert not got.requires_grad
        assert torch.equal(got, want) and torch.equal(kv_g, kv_w) and torch.equal(kc_g, kc_w)
        assert torch.is_grad_enabled()                 # the caller's grad mode is left as it was


@pytest.mark.parametrize("name", list(checks.BAD_WEIGHTS))
def test_bad_weights_are_named(name):
    edit, exc, match = checks.BAD_WEIGHTS[name]
    with pytest.raises(exc, match=match):
        DSADecodeLayer(V32, edit(lref.init_weights(V32, 1)))


def test_weights_as_bf16_tensors():
    """torch weights of any float dtype (bf16, requiring grad) are taken at their value: each
    buffer equals the bf16 value in float32."""
    w = {k: torch.tensor(v).bfloat16().requires_grad_() for k, v in lref.init_weights(V32, 1).items()}
    layer = DSADecodeLayer(V32, w)
    for name in ("wq_a", "wkv_b", "indexer.weights_proj", "q_norm"):
        assert torch.equal(layer.w(name), w[name].detach().float()), name


def test_input_on_another_device_is_named():
    """Tensors on another device than the layer's: ValueError naming the tensor and both devices
    (the layer lives on the meta device here, so no GPU is needed)."""
    case = checks.bad_input_case()
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device="meta")
    args = _to_torch(checks.layer_inputs(case))
    got = args["x"].device     # the test files put inputs on the GPU where there is one
    with pytest.raises(ValueError, match=rf"^x: expected a tensor on the layer.s device meta, got {got}"):
        layer(**args)


def _model1_case():
    return lref.make_layer_case(V4, seed=3, B=2, N=1, lens=(40, 20), kv_format="fp8_model1",
                                name="unmapped_model1")


@pytest.mark.parametrize("fmt,kind", [("latent", k) for k in checks.UNMAPPED_NEW_TOKENS]
                         + [("fp8_model1", "entry_wraps_int32"), ("fp8_model1", "all_tokens_unmapped")])
def test_unmapped_new_token_is_dropped_under_capture(monkeypatch, fmt, kind):
    """Under CUDA-graph capture / torch.compile (``_capturing()`` patched True: the value checks
    cannot run) an unmapped new token (page entry >= num_pages, one that wraps int32 when
    multiplied by P, -1, or a position outside the table) changes no byte of either cache; the
    other request's rows are written as in the good step and its output is unchanged. With no
    mapped token at all the fallback target (page 0, offset 0) keeps its bytes."""
    import torch_impl.layer as tlayer
    case = checks.bad_input_case() if fmt == "latent" else _model1_case()
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE, path="torch")

    def step(inputs):
        args = _to_torch(inputs)
        out, kv, kc = layer(**args)
        return _np(out), _np(kv), _np(kc)

    good = step(checks.layer_inputs(case))
    monkeypatch.setattr(tlayer, "_capturing", lambda: True)
    edit, _ = checks.UNMAPPED_NEW_TOKENS[kind]
    checks.check_unmapped_dropped(case, kind, good, step(edit(case)))


@pytest.fixture
def compile_logs(caplog):
    """caplog for torch.compile tests: torch's structured-trace logger (``torch.__trace``) logs
    at DEBUG on every compile, ~800 lines in a failure report; it is held at WARNING here, so a
    failure shows the assertion and any real warning only. ``torch._dynamo.reset()`` first, so
    one test's compiled frames (and recompile limits) do not leak into the next."""
    import logging
    torch._dynamo.reset()
    caplog.set_level(logging.WARNING, logger="torch.__trace")
    return caplog


def _compile_quietly(fn, compile_logs, *args, **kwargs):
    """``torch.compile(fn, fullgraph=True)(*args, **kwargs)`` asserting no graph break (fullgraph
    raises on one), no Python warning and no log record at WARNING or above (Dynamo's graph-break
    and recompile warnings are log records)."""
    import logging
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = torch.compile(fn, fullgraph=True)(*args, **kwargs)
    records = [f"{r.name}: {r.getMessage()[:200]}" for r in compile_logs.records if r.levelno >= logging.WARNING]
    # torch 2.13's Inductor imports modules that use its own deprecated torch.jit.script_method at
    # import time (first compile of the process): torch's own API deprecation, not this code's
    caught = [w for w in caught if not (issubclass(w.category, DeprecationWarning)
                                        and "torch.jit" in str(w.message))]
    assert not caught, f"warnings under torch.compile: {[(w.category.__name__, w.filename, str(w.message)[:200]) for w in caught[:3]]}"
    assert not records, f"log records under torch.compile: {records[:3]}"
    return result


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False], ids=["fused_prep", "composite_prep"])
def test_torch_compile_matches_reference(compile_logs, fused):
    """torch.compile(fullgraph=True) of the whole layer (the ops, the cache writes and the fused
    preparation are opaque torch.library custom ops): no graph break, no warning, and the float64
    reference's bounds. Works on the CPU but Inductor's C++ build of the composite preparation
    takes ~1 minute of CPU, hence slow."""
    case = _case("dsv32_fp8_ds_mla")
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE, path="torch",
                           fused_prep=fused)
    out, kv, kc = _compile_quietly(layer, compile_logs, *_inputs(case))
    checks.check_step(case, case.reference(), _np(out), _np(kv), _np(kc))


def test_torch_compile_with_linear_triton(compile_logs):
    """torch.compile(fullgraph=True) of the layer with every projection on ``dsa::linear``
    (strided ``out`` views mutated by the custom op): no graph break, no warning, and the
    eager step's output bit for bit (aot_eager on the CPU: no Inductor fusion, the same ops;
    Inductor on a GPU, where the GPU tests compare with the reference)."""
    case = _case("dsv32_fp8_ds_mla")
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                           path="torch", linear="triton")
    eager = layer(*_inputs(case))[0]
    import logging
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(layer, fullgraph=True, backend="inductor" if CUDA else "aot_eager")(*_inputs(case))[0]
    assert not [w for w in caught if not issubclass(w.category, DeprecationWarning)]
    assert not [r for r in compile_logs.records if r.levelno >= logging.WARNING]
    if CUDA:                  # Inductor fuses and reorders the float32 glue: SPEC's out bound
        compare.assert_pass(compare.check_close("compiled vs eager", out, _np(eager), abs_tol=compare.OUT_ABS,
                                                rel_tol=compare.OUT_REL))
    else:
        assert torch.equal(out, eager)


@pytest.mark.slow
def test_torch_compile_drops_unmapped_new_token(compile_logs):
    """Under torch.compile(fullgraph=True) (the value checks cannot run) a new token whose page
    entry wraps int32 when multiplied by P changes no cache byte (bit for bit: order-free); the
    other request's rows and output match the eager step within the SPEC bounds, not bit for
    bit: Inductor fuses and reorders the float32 norm / rope / projection math (~3e-7 apart on an
    AVX-512 CPU), see checks.check_unmapped_dropped(exact=False)."""
    case = checks.bad_input_case()
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE, path="torch")
    good = [_np(t) for t in layer(**_to_torch(checks.layer_inputs(case)))]
    edit, _ = checks.UNMAPPED_NEW_TOKENS["entry_wraps_int32"]
    bad = [_np(t) for t in _compile_quietly(layer, compile_logs, **_to_torch(edit(case)))]
    checks.check_unmapped_dropped(case, "entry_wraps_int32", good, bad, exact=False)


# ------------------------------------------------------------- the layer reference itself

def test_reference_absorbed_equals_unabsorbed_mha():
    """The float64 layer reference's absorbed form (q_nope through wkv_b's key half, output
    through its value half) equals DeepSeek's non-absorbed MHA math (prefill branch of
    ``MLA.forward``: per-head k_nope / v from wkv_b, scores (q_nope.k_nope + q_pe.k_pe) * scale)
    over the same selected positions."""
    case = _case("dsv32_latent_mtp2")
    cfg, ref = case.cfg, case.reference()
    w = {k: v.astype(np.float64) for k, v in case.weights.items()}
    rows = lref.formats.dequantize_kv(ref.kv_cache, "latent")               # [slots, 576]
    slots = lref.reference.resolve_indices(ref.indices, num_slots=rows.shape[0], page_size=cfg.page_size,
                                           block_table=case.block_table)
    H, nope, v, C = cfg.num_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    wkv_b = w["wkv_b"].reshape(H, nope + v, C)
    B, N = case.x.shape[:2]
    # recompute q_nope / q_pe exactly as MLA.forward does (before absorption)
    pos, _ = lref.new_token_slots(case.block_table, case.context_lens, N, cfg.page_size)
    ang = pos[..., None] * lref.rope_freqs(cfg)
    qr = lref._rmsnorm(case.x.astype(np.float64) @ w["wq_a"].T, w["q_norm"], cfg.eps)
    q = (qr @ w["wq_b"].T).reshape(B, N, H, nope + cfg.d_rope)
    q_pe = lref._rope(q[..., nope:], ang[:, :, None], interleaved=True)
    out = np.zeros((B, N, cfg.hidden))
    for b in range(B):
        for i in range(N):
            sel = rows[slots[b, i][slots[b, i] >= 0]]                         # [T, 576]
            k_nope = np.einsum("hdc,tc->htd", wkv_b[:, :nope], sel[:, :C])
            vv = np.einsum("hdc,tc->htd", wkv_b[:, nope:], sel[:, :C])
            s = (np.einsum("hd,htd->ht", q[b, i, :, :nope], k_nope) + q_pe[b, i] @ sel[:, C:].T) * cfg.sm_scale
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out[b, i] = np.einsum("ht,htd->hd", p, vv).reshape(-1) @ w["wo"].T
    np.testing.assert_allclose(ref.out, out, rtol=1e-10, atol=1e-12)


def test_full_size_weight_shapes_match_deepseek_configs():
    """The unscaled configs give DeepSeek-V3.2-Exp's checkpoint shapes and the public V4-Flash
    shapes (no weights are allocated)."""
    s = lref.weight_shapes(lref.DSV32_LAYER)
    assert s["wq_a"] == (1536, 7168) and s["wq_b"] == (128 * 192, 1536) and s["wkv_a"] == (576, 7168)
    assert s["wkv_b"] == (128 * 256, 512) and s["wo"] == (7168, 128 * 128)
    assert s["indexer.wq_b"] == (64 * 128, 1536) and s["indexer.wk"] == (128, 7168)
    assert s["indexer.weights_proj"] == (64, 7168)
    s4 = lref.weight_shapes(lref.DSV4_FLASH_LAYER)
    assert s4["wq_b"] == (64 * 512, 1024) and s4["wkv"] == (512, 4096)
    assert s4["wo_a"] == (8 * 1024, 8 * 512) and s4["wo_b"] == (4096, 8 * 1024) and s4["attn_sink"] == (64,)
    assert lref.DSV32_LAYER.d_qk == 576 and lref.DSV4_FLASH_LAYER.d_qk == 512
    assert lref.DSV32_LAYER.heads_per_rank(8) == 16 and lref.DSV4_FLASH_LAYER.heads_per_rank(8) == 8



@pytest.mark.parametrize("preset,fused,max_glue", [("DSV32", False, 43), ("DSV4_FLASH", False, 50),
                                                 ("DSV32", True, 0), ("DSV4_FLASH", True, 0)])
def test_step_glue_launches(preset, fused, max_glue):
    """One step's launches outside the GEMMs and the DSA ops at the real dimensions
    (scripts/layer_glue.py: the meta device, no weights): at most the counts in bench/NOTES.md
    "Glue kernels" / "Fused step preparation" / "V4's window in one launch", the fused glue
    launches (prep_x, prep_q, V4's rope_out when the switch is on; V3.2's lengths,
    ``dsa::window_split``, either way: one launch; V4's window is written by its kernel inside
    ``dsa::indexer_topk_window``, into the tail of the index list), no concatenation, and no glue
    op writing more than one bf16 copy of the MLA query (none makes a float32 one)."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "layer_glue", Path(__file__).resolve().parent.parent / "scripts" / "layer_glue.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    B, cfg = 2, lref.LAYER_CONFIGS[preset]
    rows = mod.step_ops(preset, B, fused_prep=fused)
    glue = [row for row in rows if row[4] == "glue"]
    assert len(glue) <= max_glue, [row[:2] for row in glue]
    lens = [] if cfg.window else ["window_split"]
    want = ["prep_x", "prep_q"] + lens + (["rope_out"] if cfg.inverse_rope_out else [])
    assert [row[0] for row in rows if row[4] == "fused"] == (want if fused else lens)
    assert [row[0] for row in rows if row[4] == "dsa"].count(
        "indexer_topk_window" if cfg.window else "indexer_topk") == 1
    assert sum(row[0] in ("cat", "stack") for row in glue) == 0
    q_bf16 = B * cfg.num_heads * cfg.d_qk * 2
    assert max((row[3] for row in glue), default=0) <= q_bf16, max(glue, key=lambda row: row[3])


# ---------------------------------------------------------------------------------- GPU only

def _bf16_rounded(weights):
    return {k: torch.tensor(v).bfloat16().float().numpy() for k, v in weights.items()}


@gpu_only
@pytest.mark.parametrize("name", ["dsv32_fp8_ds_mla", "dsv4_fp8_model1"])
def test_bf16_layer_on_gpu(name):
    """bf16 activations and weights (the reference gets the same bf16-rounded weights); bound and
    reason in tests/_layer_checks.py (check_bf16_step, BF16_COS)."""
    case = _case(name)
    case.weights = _bf16_rounded(case.weights)
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                           dtype=torch.bfloat16)
    out, _, kc, inter = _run(layer, case)
    checks.check_bf16_step(case, out, kc, inter)


def _real_case(name):
    """CASES[name] at the real preset dimensions (``DSV32_LAYER``: 128 heads, hidden 7168, top-k
    2048; ``DSV4_FLASH_LAYER``: 64 heads, hidden 4096, top-k 512 + window 128; P 64), B = 2:
    one request 1024 tokens longer than top-k + window (the indexer really selects), one
    holding half of top-k (-1 padded index lists); the same lengths as parity's GPU layer cases
    (parity.cases.layer_real_lens)."""
    small, fmt, _, _, _, seed = CASES[name]
    cfg = lref.LAYER_CONFIGS[small.preset.name]
    lens = (cfg.topk + cfg.window + 1024, cfg.topk // 2)
    return lref.make_layer_case(cfg, seed=seed, B=2, N=1, lens=lens, kv_format=fmt, name=name + "_real")


@gpu_only
@pytest.mark.parametrize("linear", ["torch", "triton"])
@pytest.mark.parametrize("name", ["dsv32_fp8_ds_mla", "dsv4_fp8_model1"])
def test_bf16_layer_at_real_dimensions_on_gpu(name, linear):
    """The unscaled layer (V3.2: 200 M weights; V4-Flash: 115 M) on the Triton kernels (named
    path) in bf16 with bf16-rounded weights, against the float64 reference fed the same rounded
    weights; bound and reason in tests/_layer_checks.py (check_bf16_step, BF16_COS)."""
    case = _real_case(name)
    case.weights = _bf16_rounded(case.weights)
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                           dtype=torch.bfloat16, path="triton", linear=linear)
    assert layer.local_heads == case.cfg.num_heads == case.cfg.preset.num_heads
    out, _, kc, inter = _run(layer, case)
    assert out.shape == (2, 1, case.cfg.hidden)
    checks.check_bf16_step(case, out, kc, inter)


@gpu_only
@pytest.mark.parametrize("name", ["dsv32_fp8_ds_mla", "dsv4_fp8_model1"])
def test_one_token_layer_on_the_gemv_at_real_dimensions(name, monkeypatch):
    """The default ``linear="gemv"`` at B 1 (one token) and the real dimensions, bf16, Triton
    path: every K-major projection on the one-token kernel (launches counted: all GEMMs but
    V3.2's N-major ``wkv_b_q``, ``wq_b`` and ``indexer.wq_b`` in one, ``x_proj`` and
    ``weights_proj`` in the pair kernel), no overlap, the float64 reference's bf16 checks, the output
    within the bf16 bound of the cuBLAS layer's (``linear="torch"``) where both selected the
    same rows (``layer_compare.check_between_paths``), and a CUDA-graph replay of the step
    bitwise the eager step."""
    from kernels import layer_compare
    from kernels.linear import triton as ktriton
    from torch_impl.layer import GEMV_N_MAJOR, LAYER_GEMMS
    monkeypatch.delenv("DSA_LINEAR_GEMV", raising=False)
    small, fmt, _, _, _, seed = CASES[name]
    cfg = lref.LAYER_CONFIGS[small.preset.name]
    case = lref.make_layer_case(cfg, seed=seed, B=1, N=1, lens=(cfg.topk + cfg.window + 1024,),
                                kv_format=fmt, name=name + "_real_b1")
    case.weights = _bf16_rounded(case.weights)
    launches = []
    real = ktriton.launch_gemv
    monkeypatch.setattr(ktriton, "launch_gemv", lambda *a, **k: launches.append(1) or real(*a, **k))
    runs = {}
    for linear in ("gemv", "torch"):
        layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                               dtype=torch.bfloat16, path="triton", linear=linear)
        if linear == "gemv":
            assert not layer._overlaps(1, torch.device(DEVICE))
        runs[linear] = _run(layer, case)
    gemms = [n for n in LAYER_GEMMS[cfg.absorbed] if n not in GEMV_N_MAJOR]
    # wq_b and indexer.wq_b: one GEMV over qr_proj; x_proj and weights_proj: one pair launch
    # (launch_gemv_pair, not counted here; test_x_proj_and_weights_proj_in_one_launch)
    assert len(launches) == len(gemms) - 3
    for linear in ("gemv", "torch"):
        out, _, kc, inter = runs[linear]
        checks.check_bf16_step(case, out, kc, inter)
    # gemv against cuBLAS by the parity rule: the index sets may differ only because each run is
    # exact for its own fp8 index q (the two GEMMs round the bf16 projections differently; on the
    # H100, 2026-12-06, V3.2's one row selected a different set and the outputs differed by a
    # cosine distance of 0.0034, each within the bound of the reference for its own set); on
    # identical sets the outputs are held to the bf16 bound
    (a, b) = ({"out": runs[k][0], "indices": runs[k][3]["indices"]} for k in ("gemv", "torch"))
    compare.assert_pass(layer_compare.check_between_paths(a, b, low_precision=True))
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                           dtype=torch.bfloat16, path="triton")
    eager, replayed = _eager_and_replayed(layer, case)
    assert torch.equal(replayed, eager)


def _eager_and_replayed(layer, case):
    """``layer``'s output for ``case`` run eagerly, then captured in a CUDA graph (after a
    warm-up outside the capture: autotune, allocations) and replayed, from the same caches."""
    args = _inputs(case)
    kv0, kc0 = args[1].clone(), args[2].clone()
    eager, _, _ = layer(*args)
    args[1].copy_(kv0)
    args[2].copy_(kc0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(*args)
    torch.cuda.current_stream().wait_stream(s)
    args[1].copy_(kv0)
    args[2].copy_(kc0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out, _, _ = layer(*args)
    args[1].copy_(kv0)
    args[2].copy_(kc0)
    g.replay()
    torch.cuda.synchronize()
    return eager, static_out


@gpu_only
def test_cuda_graph_replay_is_bitwise_identical():
    case = _case("dsv32_fp8_ds_mla")
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                           dtype=torch.bfloat16)
    eager, replayed = _eager_and_replayed(layer, case)
    assert torch.equal(replayed, eager)


@gpu_only
@pytest.mark.parametrize("carveout", ["0", "32"], ids=["no_carveout", "carveout32"])
@pytest.mark.parametrize("name", ["dsv32_fp8_ds_mla", "dsv4_fp8_model1"])
def test_overlapped_step_matches_the_one_stream_step(name, carveout, monkeypatch):
    """``overlap=True`` (``dsa::q_index_overlap``: the indexer's branch on a side stream) against
    ``overlap=False`` at the real dimensions (bf16, Triton path, torch's GEMMs). Without the SM
    carveout the same kernels run on the same inputs: every output bit for bit. With it
    (32 SMs, the candidate for ``OVERLAP_SM_CARVEOUT``) cuBLASLt may pick another kernel for the
    attention's q projection,
    so what depends on q (``q``, ``attn``, ``lse``, ``out``) is held to the bf16 bounds (the
    one-stream step's out within BF16_COS, and the float64 reference's check_bf16_step) while
    the indexer's outputs and both caches stay bitwise."""
    from kernels import layer_compare
    monkeypatch.setenv("DSA_LAYER_OVERLAP_CARVEOUT", carveout)
    case = _real_case(name)
    case.weights = _bf16_rounded(case.weights)
    runs = {}
    for overlap in (True, False):
        layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                               dtype=torch.bfloat16, path="triton", linear="torch", overlap=overlap)
        assert layer._overlaps(2, torch.device(DEVICE)) is overlap
        out, kv, kc, inter = _run(layer, case)
        runs[overlap] = {"out": out, "kv": kv, "kc": kc, **inter}
    a, b = runs[True], runs[False]
    assert set(a) == set(b)
    on_q = {"q", "attn", "lse", "out"} if carveout != "0" else set()
    for k in set(b) - on_q:
        assert np.array_equal(a[k].view(np.uint8) if a[k].dtype == lref.formats.E4M3 else a[k],
                              b[k].view(np.uint8) if b[k].dtype == lref.formats.E4M3 else b[k]), k
    if on_q:
        compare.assert_pass(layer_compare.check_out(a["out"], b["out"].astype(np.float64), low_precision=True,
                                                    name="out (overlapped vs one stream)"))
    checks.check_bf16_step(case, a["out"], a["kc"], {k: v for k, v in a.items() if k not in ("out", "kv", "kc")})


def _next_step_case(case):
    """The same caches and block table with new hidden states and every L_b one shorter (the new
    token moves to another slot of the table): new inputs of the same shapes, for a graph replay."""
    import dataclasses
    rng = np.random.default_rng(case.seed + 100)
    return dataclasses.replace(case, name=case.name + "_next", x=rng.standard_normal(case.x.shape).astype(np.float32),
                               context_lens=(case.context_lens - 1).astype(np.int32))


def _intermediates_np(inter):
    return {k: (t.view(torch.uint8).cpu().numpy().view(lref.formats.E4M3)
                if t.dtype == torch.float8_e4m3fn else _np(t)) for k, t in inter.items()}


@gpu_only
@pytest.mark.parametrize("linear", ["torch", "triton"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", ["dsv32_fp8_ds_mla", "dsv4_fp8_model1"])
def test_cuda_graph_step_at_real_dimensions(name, compiled, linear):
    """One step of the unscaled layer (bf16, Triton path, fp8 caches; as is, or
    ``torch.compile(fullgraph=True)`` as serving runs it) captured in a CUDA graph, then replayed
    with new inputs copied into the static buffers: the replay matches the eager step on those
    inputs (caches and indices bit for bit when not compiled, the compiled layer's own eager call
    otherwise; out within BF16_COS) and the float64 reference (check_bf16_step).
    ``torch.cuda.set_sync_debug_mode("error")`` is on around the captured step and around the
    input copies + replay, so any host synchronisation in the step raises. ``linear``: the
    projections on torch's GEMMs or on the Triton few-token GEMM (split-K counters in the graph)."""
    from kernels import layer_compare
    case = _real_case(name)
    case.weights = _bf16_rounded(case.weights)
    nxt = _next_step_case(case)
    eager_layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                                 dtype=torch.bfloat16, path="triton", linear=linear)
    layer = torch.compile(eager_layer, fullgraph=True) if compiled else eager_layer
    static = _inputs(case)                         # x, kv_cache, k_cache, block_table, context_lens
    kv0, kc0 = static[1].clone(), static[2].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                  # warm-up: Triton / Inductor compiles, cuBLAS, allocator
        layer(*static, return_intermediates=True)
    torch.cuda.current_stream().wait_stream(side)
    static[1].copy_(kv0)
    static[2].copy_(kc0)
    graph = torch.cuda.CUDAGraph()
    # torch.cuda.graph() synchronises on entry (and a host-to-device copy of pageable memory
    # does too), so the sync check is switched on inside the capture, around the step alone
    with torch.cuda.graph(graph):
        torch.cuda.set_sync_debug_mode("error")
        try:
            g_out, g_kv, g_kc, g_inter = layer(*static, return_intermediates=True)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    new_inputs = _inputs(nxt)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for dst, src in zip(static, new_inputs):    # new inputs into the static buffers (on device)
            dst.copy_(src)
        graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    replay = {"out": _np(g_out), "kv_cache": _np(g_kv), "k_cache": _np(g_kc), **_intermediates_np(g_inter)}
    e_out, e_kv, e_kc, e_inter = layer(*_inputs(nxt), return_intermediates=True)
    assert np.array_equal(replay["kv_cache"], _np(e_kv)) and np.array_equal(replay["k_cache"], _np(e_kc))
    assert np.array_equal(replay["indices"], _np(e_inter["indices"]))
    compare.assert_pass(layer_compare.check_out(replay["out"], _np(e_out).astype(np.float64), low_precision=True,
                                                name="out (graph replay vs eager)"))
    checks.check_bf16_step(nxt, replay["out"], replay["k_cache"], {k: v for k, v in replay.items()
                                                                  if k in layer_compare.INTERMEDIATES})


@gpu_only
@pytest.mark.parametrize("linear", ["torch", "triton"])
@pytest.mark.parametrize("name", ["dsv32_fp8_ds_mla", "dsv4_fp8_model1"])
def test_torch_compile_fullgraph_at_real_dimensions_on_gpu(name, compile_logs, linear):
    """torch.compile(fullgraph=True) of the unscaled bf16 layer on the Triton path (projections
    on torch's GEMMs or on the Triton few-token GEMM): no graph break, no warning, and the
    float64 reference's bf16 bounds (check_bf16_step)."""
    case = _real_case(name)
    case.weights = _bf16_rounded(case.weights)
    layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                           dtype=torch.bfloat16, path="triton", linear=linear)
    out, _, kc, inter = _compile_quietly(layer, compile_logs, *_inputs(case), return_intermediates=True)
    checks.check_bf16_step(case, _np(out), _np(kc), _intermediates_np(inter))
