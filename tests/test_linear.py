"""The few-token GEMM (``torch_impl.linear``, kernels/linear/triton.py) against the float64
reference (kernels/linear/reference.py).

Every value check uses a per-element error bound, not a tolerance picked to pass: a float32 sum
of K products (each exact in float32 for 16-bit operands, rounded once for fp32 ones) is within
``2 K u32 * sum_k |x_k w_k|`` of the exact dot (u32 = 2^-24; the factor 2 covers the product
rounding), and the output rounding adds ``u_out |result|`` (2^-11 fp16, 2^-8 bf16, 2^-24 fp32).
On the CPU the kernel runs in the Triton interpreter (fp16 / fp32; the interpreter computes bf16
wrongly), on a GPU the same bodies run, plus the bf16 and CUDA-graph tests at the end.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.linear import configs as lcfg
from kernels.linear.reference import linear as ref_linear
from torch_impl import linear as tlinear
from torch_impl.linear import linear

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

_UNIT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}


def _operands(seed, G, M, N, K, x_dtype, w_dtype):
    g = torch.Generator().manual_seed(seed)
    shape_x = (G, M, K) if G else (M, K)
    shape_w = (G, N, K) if G else (N, K)
    x = torch.randn(shape_x, generator=g).to(x_dtype)
    w = (torch.randn(shape_w, generator=g) / K ** 0.5).to(w_dtype)
    return x.to(DEVICE), w.to(DEVICE)


def _check(out, x, w, alpha=1.0):
    """``out`` against the float64 reference within the bound of the module docstring; the
    worst element named on failure."""
    xd, wd = x.double().cpu().numpy(), w.double().cpu().numpy()
    want = ref_linear(xd, wd, alpha)
    mag = abs(alpha) * np.matmul(np.abs(xd), np.swapaxes(np.abs(wd), -1, -2))
    K = x.shape[-1]
    bound = 2 * K * 2.0 ** -24 * mag + _UNIT[out.dtype] * np.abs(want) + 1e-30
    got = out.double().cpu().numpy()
    assert got.shape == want.shape
    assert np.isfinite(got).all(), "non-finite output"
    ratio = np.abs(got - want) / bound
    i = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert ratio[i] <= 1.0, (f"element {i}: got {got[i]!r}, want {want[i]!r}, |err| "
                             f"{abs(got[i] - want[i]):.3g} > bound {bound[i]:.3g}")


# dtype triples (x, w, out) the CPU interpreter runs: 16-bit same dtype, fp32, fp16 x with fp32 w
DTYPES = [(torch.float16, torch.float16, torch.float16), (torch.float32, torch.float32, torch.float32),
          (torch.float16, torch.float32, torch.float32), (torch.float16, torch.float16, torch.float32)]
DTYPE_IDS = ["fp16", "fp32", "fp16x-fp32w", "fp16-fp32out"]


@pytest.mark.parametrize("M", [1, 3, 16, 64])
@pytest.mark.parametrize("dts", DTYPES, ids=DTYPE_IDS)
def test_values_against_reference(M, dts):
    """M = 1, 3, 16, 64 (every token tile, M = 1 specialised), N not a multiple of the weight
    tile, K = 200 not a multiple of the K tile (the masked last block), alpha != 1, the
    heuristic's config and split count."""
    xd, wd, od = dts
    x, w = _operands(M, 0, M, 96, 200, xd, wd)
    out = linear(x, w, alpha=0.75, out_dtype=od, path="triton")
    assert out.shape == (M, 96) and out.dtype == od
    _check(out, x, w, 0.75)


@pytest.mark.parametrize("n_major", [False, True], ids=["k_major", "n_major"])
@pytest.mark.parametrize("dts", [DTYPES[0], DTYPES[2]], ids=[DTYPE_IDS[0], DTYPE_IDS[2]])
def test_gemv_against_reference(dts, n_major):
    """The one-token kernel (``kernels.linear.triton.launch_gemv``, swept against cuBLAS by
    ``bench.linear_sweep``) at every config of its layout's ``GEMV_SPACE``, 16-bit weights and
    fp32 weights with an fp16 token (``weights_proj``'s case): 2 groups, N = 75 and K = 300
    (neither a multiple of any tile: the masked last rows and K block), the weight K- or
    N-major, ``out`` a strided view of a ``[1, G, N]`` buffer, alpha != 1; two runs bitwise
    equal. (Small shapes: the interpreter runs every program of the grid in Python.)"""
    from kernels.linear import triton as ktriton
    xd, wd, od = dts
    G, N, K = 2, 75, 300
    x, w = _operands(7, G, 1, N, K, xd, wd)
    if n_major:
        w = w.transpose(1, 2).contiguous().transpose(1, 2)       # [G, N, K] with N contiguous
    for cfg in lcfg.GEMV_SPACE["n_major" if n_major else "k_major"]:
        out = torch.full((1, G, N), float("nan"), dtype=od, device=DEVICE).transpose(0, 1)
        assert ktriton.launch_gemv(x, w, out, 0.75, cfg) == -(-N // cfg.block_n) * G
        _check(out, x, w, 0.75)
        again = torch.empty_like(out)
        ktriton.launch_gemv(x, w, again, 0.75, cfg)
        assert torch.equal(out, again), cfg


def test_gemv_route_of_the_binding(monkeypatch):
    """``DSA_LINEAR_GEMV`` unset (default) or ``1``: a Triton call of one token, a K-major
    weight and no config runs the one-token kernel at ``gemv_heuristic``'s config (bit-equal to
    launching it directly; within the float64 bound); ``0`` runs the tensor-core kernel; an
    N-major weight, a call of 3 tokens, or one given a config or a split count runs the
    tensor-core kernel whatever the switch (bit-equal to the switch off); a bad value is a
    ValueError naming the switch."""
    from kernels import hardware
    from kernels.linear import triton as ktriton
    x, w = _operands(11, 2, 1, 40, 300, torch.float16, torch.float16)
    x3, w3 = _operands(12, 2, 3, 40, 300, torch.float16, torch.float16)
    wn = w.transpose(1, 2).contiguous().transpose(1, 2)
    monkeypatch.setenv(tlinear.GEMV_ENV, "0")
    off3 = linear(x3, w3, path="triton")
    off = linear(x, w, path="triton")
    off_n = linear(x, wn, path="triton")
    cfg = lcfg.linear_heuristic(1, 40, 300, 2, hardware.CPU_INTERPRETER.smem_per_block)
    off_cfg = linear(x, w, path="triton", config=cfg)
    off_split = linear(x, w, path="triton", splits=2)
    sms = (torch.cuda.get_device_properties(0).multi_processor_count if CUDA
           else hardware.CPU_INTERPRETER.num_sms)
    want = torch.empty(2, 1, 40, dtype=torch.float16, device=DEVICE)
    ktriton.launch_gemv(x, w, want, 0.5, lcfg.gemv_heuristic(40, 300, 2, False, sms))
    _check(want, x, w, 0.5)
    for value in (None, "1"):
        if value is None:
            monkeypatch.delenv(tlinear.GEMV_ENV, raising=False)
        else:
            monkeypatch.setenv(tlinear.GEMV_ENV, value)
        assert torch.equal(linear(x, w, alpha=0.5, path="triton"), want), value
        assert torch.equal(linear(x, wn, path="triton"), off_n), value
        assert torch.equal(linear(x3, w3, path="triton"), off3), value
        assert torch.equal(linear(x, w, path="triton", config=cfg), off_cfg), value
        assert torch.equal(linear(x, w, path="triton", splits=2), off_split), value
    calls = []                           # which kernel ran (the two may round to the same bits)
    real = ktriton.launch_gemv
    monkeypatch.setattr(ktriton, "launch_gemv", lambda *a: calls.append(a[4]) or real(*a))
    monkeypatch.delenv(tlinear.GEMV_ENV, raising=False)
    linear(x, w, path="triton")
    linear(x, wn, path="triton")
    monkeypatch.setenv(tlinear.GEMV_ENV, "0")
    assert torch.equal(linear(x, w, path="triton"), off)
    assert calls == [lcfg.gemv_heuristic(40, 300, 2, False, sms)]
    monkeypatch.setenv(tlinear.GEMV_ENV, "yes")
    with pytest.raises(ValueError, match=r"^DSA_LINEAR_GEMV: expected '0', '1' or unset, got 'yes'"):
        linear(x, w, path="triton")


def test_gemv_heuristic_members_and_rule():
    """Every config the heuristic returns is one of ``GEMV_PICKS`` (in ``GEMV_SPACE`` and in
    the CI fit check's specs), by the measured rule: N-major 64 x 32; K-major 1 x 2048 where
    two-row programs would leave SMs without one, else 2 x 1024 where 1,024 divides K, else
    8 x 512 (bench/NOTES.md "One-token projections: measured")."""
    from kernels.linear import triton as ktriton
    labels = {s.label for s in ktriton.gemv_aot_specs(reachable_only=True)}
    for layout, picks in lcfg.GEMV_PICKS.items():
        assert set(picks) <= set(lcfg.GEMV_SPACE[layout])
        for c in picks:
            assert any(lb.startswith(f"gemv {layout} {c.block_n}x{c.block_k} w{c.num_warps} ")
                       for lb in labels), c
    rule = [((512, 128, 128, True, 132), (64, 32)), ((64, 7168, 1, False, 132), (1, 2048)),
            ((64, 4096, 1, False, 188), (1, 2048)), ((1664, 4096, 1, False, 132), (2, 1024)),
            ((32768, 1024, 1, False, 132), (2, 1024)), ((7168, 16384, 1, False, 132), (2, 1024)),
            ((1024, 4096, 8, False, 170), (2, 1024)), ((24576, 1536, 1, False, 132), (8, 512)),
            ((128, 512, 128, False, 132), (8, 512)), ((40, 300, 2, False, 4), (8, 512))]
    for (N, K, G, n_major, sms), (bn, bk) in rule:
        c = lcfg.gemv_heuristic(N, K, G, n_major, sms)
        assert (c.block_n, c.block_k, c.num_warps) == (bn, bk, 4), (N, K, G, n_major, sms, c)


def test_gemv_refuses_what_it_cannot_launch():
    """More than one token, a weight with neither K nor N of unit stride, a strided ``out``."""
    from kernels.linear import triton as ktriton
    x, w = _operands(0, 1, 2, 16, 32, torch.float32, torch.float32)
    cfg = lcfg.GEMV_SPACE["k_major"][0]
    with pytest.raises(ValueError, match=r"^x: launch_gemv takes one token"):
        ktriton.launch_gemv(x, w, torch.empty(1, 2, 16, device=DEVICE), 1.0, cfg)
    x1 = x[:, :1]
    wide = torch.zeros(1, 16, 64, device=DEVICE)[:, :, ::2]
    with pytest.raises(ValueError, match=r"^w: expected K or N contiguous"):
        ktriton.launch_gemv(x1, wide, torch.empty(1, 1, 16, device=DEVICE), 1.0, cfg)
    with pytest.raises(ValueError, match=r"^out / x: expected the last dim contiguous"):
        ktriton.launch_gemv(x1, w, torch.empty(1, 1, 32, device=DEVICE)[..., ::2], 1.0, cfg)


def test_tf32x3_config_reaches_the_kernel(monkeypatch):
    """A config naming the tf32x3 fp32 dot (``f32_dot``, in the fp32-weight space of every token
    tile) passes through the ``dsa::linear`` op to the launch unchanged (the op carries configs
    as integers), and its split call is within the bound (the interpreter's dot is exact).
    A precision outside ``F32_DOTS`` is a ValueError naming ``f32_dot``; a dispatch dict that
    names one is no config, and a dict without the field is the FMA dot's."""
    from kernels.linear import triton as ktriton
    for bm in lcfg.BLOCK_MS:
        assert [c.f32_dot for c in lcfg.LINEAR_SPACE[("large", 4, bm)]].count("tf32x3") == 1
    cfg = next(c for c in lcfg.LINEAR_SPACE[("large", 4, 64)] if c.f32_dot == "tf32x3")
    seen = []
    real = ktriton.launch_linear
    monkeypatch.setattr(ktriton, "launch_linear",
                        lambda x, w, out, alpha, config, *a: seen.append(config) or real(
                            x, w, out, alpha, config, *a))
    x, w = _operands(7, 0, 40, 64, 448, torch.float32, torch.float32)
    _check(linear(x, w, path="triton", config=cfg, splits=3), x, w)
    assert seen == [cfg]
    with pytest.raises(ValueError, match="f32_dot"):
        lcfg.LinearConfig(64, 64, 16, 4, 4, "tf32")
    d = cfg.to_dict()
    assert lcfg.linear_from_dict({**d, "f32_dot": "tf32"}, 232_448, 4, 40) is None
    d.pop("f32_dot")
    assert lcfg.linear_from_dict(d, 232_448, 4, 40) == lcfg.LinearConfig(64, 64, 16, 4, 4)


@pytest.mark.parametrize("splits", [1, 2, 3, 4, 5, 9, 64])
def test_every_split_count(splits):
    """The direct store (1), the last-arriving program's reduction with a partial step (2, 3),
    exactly one unrolled step of four (4), unrolled + remainder (5, 9), and a count above the
    number of K blocks (64: clamped so that no split is empty). Run twice: bitwise equal, and the
    arrival counters are zero after each call."""
    x, w = _operands(splits, 0, 5, 80, 1000, torch.float32, torch.float32)
    cfg = lcfg.LinearConfig(64, 16, 32, 4, 4)
    first = linear(x, w, path="triton", config=cfg, splits=splits)
    _check(first, x, w)
    counters = tlinear.reserve_workspace(x.device)
    assert int(counters.count_nonzero()) == 0
    again = linear(x, w, path="triton", config=cfg, splits=splits)
    assert torch.equal(first.view(torch.int32), again.view(torch.int32))
    assert int(counters.count_nonzero()) == 0
    k_per_split, used = lcfg.split_geometry(1000, cfg.block_k, splits)
    assert used <= splits and (used - 1) * k_per_split < 1000 <= used * k_per_split


def test_split_grouped_reduction_uses_its_own_counters():
    """G = 3 groups, each with 2 N tiles and 4 splits: every (group, tile) counts its own
    arrivals (a shared counter would reduce too early or never): each group's product matches."""
    x, w = _operands(7, 3, 4, 128, 256, torch.float16, torch.float16)
    out = linear(x, w, path="triton", splits=4, out_dtype=torch.float32)
    _check(out, x, w)


def test_strided_out_and_grouped_views():
    """``out`` a column slice of a wider buffer (its other columns keep their sentinel), and the
    layer's per-head form: x, out transposed views [G, T, ...] of [T, G, ...] buffers, w a
    transposed (N-contiguous) view."""
    x, w = _operands(11, 0, 3, 40, 72, torch.float16, torch.float16)
    buf = torch.full((3, 100), 7.0, dtype=torch.float16, device=DEVICE)
    linear(x, w, out=buf[:, 30:70], path="triton", splits=2)
    _check(buf[:, 30:70], x, w)
    assert (buf[:, :30] == 7).all() and (buf[:, 70:] == 7).all()

    T, G, K, N = 3, 4, 48, 64
    g = torch.Generator().manual_seed(12)
    xs = torch.randn(T, G, K + 16, generator=g).half().to(DEVICE)            # [T, G, K + pad]
    wk = (torch.randn(G, K, N, generator=g) / K ** 0.5).half().to(DEVICE)     # [G, K, N]: w^T stored
    o = torch.full((T, G, N + 8), 7.0, dtype=torch.float16, device=DEVICE)
    xg, wg, og = xs[..., :K].transpose(0, 1), wk.transpose(1, 2), o[..., :N].transpose(0, 1)
    assert wg.stride(-2) == 1 and og.stride(-1) == 1
    linear(xg, wg, out=og, path="triton")
    _check(og, xg, wg)
    assert (o[..., N:] == 7).all()


def test_torch_path_and_auto():
    """The plain-PyTorch path meets the same bound; ``auto`` runs Triton where it can and plain
    PyTorch for M > 64 (the kernel's limit), which a named ``triton`` refuses."""
    x, w = _operands(21, 0, 65, 32, 64, torch.float32, torch.float32)
    _check(linear(x, w, path="torch", alpha=-2.0), x, w, -2.0)
    _check(linear(x, w, path="auto"), x, w)
    with pytest.raises(NotImplementedError, match="M = 65 tokens"):
        linear(x, w, path="triton")
    x16, w32 = _operands(22, 2, 4, 32, 64, torch.float16, torch.float32)
    _check(linear(x16, w32, path="torch", out_dtype=torch.float32), x16, w32)


def test_torch_compile_fullgraph():
    """``dsa::linear`` traces under torch.compile(fullgraph=True) (CPU: aot_eager; GPU: inductor)
    writing into a column slice of a buffer made inside the graph, and into a transposed view."""
    x, w = _operands(31, 0, 3, 24, 40, torch.float32, torch.float32)
    w2 = _operands(32, 4, 3, 8, 40, torch.float32, torch.float32)[1]

    def f(x, w, w2):
        buf = torch.zeros(3, 40, device=x.device)
        linear(x, w, out=buf[:, 4:28], path="triton", splits=2)
        o = torch.empty(3, 4, 8, device=x.device)
        linear(x.expand(4, 3, 40), w2, out=o.transpose(0, 1), path="triton")
        return buf * 2, o

    torch._dynamo.reset()
    buf2, o = torch.compile(f, fullgraph=True, backend="inductor" if CUDA else "aot_eager")(x, w, w2)
    _check(buf2[:, 4:28] / 2, x, w)
    assert (buf2[:, :4] == 0).all() and (buf2[:, 28:] == 0).all()
    _check(o.transpose(0, 1), x.expand(4, 3, 40), w2)


def _bad(**kw):
    x, w = _operands(41, 0, 2, 16, 32, torch.float32, torch.float32)
    # the cases' tensors are built on the CPU: on a GPU run they move to x's device with their
    # strides (a CPU tensor would fail the device check before the one the case is about)
    for k, v in kw.items():
        if isinstance(v, torch.Tensor) and v.device != x.device:
            kw[k] = torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=x.device).copy_(v)
    args = dict(x=x, w=w)
    args.update(kw)
    return linear(args.pop("x"), args.pop("w"), **args)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(x=np.zeros((2, 32))), TypeError, "x: expected a torch.Tensor"),
    (dict(x=torch.zeros(2, 32, dtype=torch.int32)), TypeError, "x: expected dtype"),
    (dict(x=torch.zeros(32)), ValueError, r"x: expected rank 2 \[M, K\] or 3"),
    (dict(x=torch.zeros(0, 32)), ValueError, "x: expected non-empty"),
    (dict(x=torch.zeros(32, 2).t()), ValueError, "x: expected the last dim contiguous"),
    (dict(w=torch.zeros(16, 32, dtype=torch.float16)), TypeError, "w: expected dtype"),
    (dict(w=torch.zeros(16, 31)), ValueError, r"w: expected shape \[N, 32\]"),
    (dict(w=torch.zeros(4, 16, 32)), ValueError, "w: expected rank 2"),
    (dict(w=torch.zeros(16, 64)[:, ::2]), ValueError, "w: expected its last dim"),
    (dict(out=torch.zeros(2, 15)), ValueError, r"out: expected shape \(2, 16\)"),
    (dict(out=torch.zeros(2, 16, dtype=torch.float16)), TypeError, "out: expected dtype"),
    (dict(out=torch.zeros(16, 2).t()), ValueError, "out: expected the last dim contiguous"),
    (dict(out=torch.zeros(2, 16), out_dtype=torch.float16), ValueError, "out_dtype: expected None or"),
    (dict(out_dtype=torch.float16), TypeError, "out_dtype: expected one of"),
    (dict(alpha="2"), TypeError, "alpha: expected a real number"),
    (dict(alpha=float("nan")), ValueError, "alpha: expected a finite value"),
    (dict(path="cuda"), ValueError, "path: expected one of"),
    (dict(splits=0), ValueError, "splits: expected an int >= 1"),
    (dict(splits=2.0), TypeError, "splits: expected an int"),
    (dict(config=(64, 16, 32, 4, 4)), TypeError, "config: expected a kernels.linear.configs.LinearConfig"),
    (dict(config=lcfg.LinearConfig(48, 16, 32, 4, 4), path="triton"), ValueError,
     "config: expected a member of the search space"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input(kw, exc, msg):
    """TypeError / ValueError naming the argument, what was expected and what came."""
    with pytest.raises(exc, match=msg):
        _bad(**kw)


@pytest.mark.skipif(CUDA, reason="the interpreter's bf16 refusal")
def test_interpreter_refuses_bf16():
    x, w = _operands(51, 0, 2, 16, 32, torch.bfloat16, torch.bfloat16)
    with pytest.raises(NotImplementedError, match="interpreter: bf16"):
        linear(x, w, path="triton")
    _check(linear(x, w, path="auto"), x, w)                 # auto: plain PyTorch


def test_configs_and_split_heuristic():
    """Every heuristic pick is a member of its space; split counts stay within one wave of the
    GPU, leave no split empty, and respect the reduction cap; tiles filling a wave run unsplit."""
    for smem, sms in ((232_448, 132), (101_376, 188)):
        for wb in (2, 4):
            for M in (1, 16, 17, 33, 64):
                for N, K in ((2240, 7168), (64, 7168), (24576, 1536), (128, 512)):
                    cfg = lcfg.linear_heuristic(M, N, K, wb, smem)
                    assert cfg in lcfg.linear_space(smem, wb, M)
                    assert cfg.block_m >= M
                    s = lcfg.linear_num_splits(cfg, M, N, K, 1, sms, wb, 2, smem)
                    tiles = -(-N // cfg.block_n)
                    slots = sms * lcfg.ctas_per_sm(cfg, wb, 2, smem)
                    assert 1 <= s <= lcfg.MAX_SPLITS
                    assert s == 1 or tiles * s <= slots
                    assert s == 1 or s * cfg.block_n * M * 4 <= lcfg.REDUCE_BYTES
                    assert s == lcfg.split_geometry(K, cfg.block_k, s)[1]
    assert lcfg.linear_num_splits(lcfg.LinearConfig(), 1, 24576, 1536, 1, 132, 2, 2, 232_448) == 1
    with pytest.raises(ValueError, match="M: expected 1 <= M <= 64"):
        lcfg.block_m_for(65)
    assert lcfg.linear_from_dict(lcfg.LinearConfig().to_dict(), 232_448, 2, 8) == lcfg.LinearConfig()
    assert lcfg.linear_from_dict({"block_n": 48}, 232_448, 2, 8) is None


# ============================================================================ GPU only

@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 64])
@pytest.mark.parametrize("shape", [(2240, 7168), (64, 7168), (8192, 1536), (1664, 4096)],
                         ids=["x_proj_v32", "weights_proj", "idx_wq_b", "x_proj_v4"])
def test_gpu_bf16_layer_shapes(M, shape):
    """bf16 at the layer's projection shapes (the fp32 weights_proj with bf16 x), heuristic
    config and split count, against the float64 bound."""
    N, K = shape
    wd = torch.float32 if N == 64 else torch.bfloat16
    od = torch.float32 if N == 64 else torch.bfloat16
    x, w = _operands(M + N, 0, M, N, K, torch.bfloat16, wd)
    _check(linear(x, w, out_dtype=od, path="triton"), x, w)


@gpu_only
@pytest.mark.gpu
def test_gpu_every_config_bitwise_repeatable():
    """Every config of the GPU's space (16-bit and fp32 weights, each token tile), split as the
    heuristic splits: within the bound, the same bits on a second call, counters zero after."""
    dev = tlinear._common.device_info(torch.device("cuda"))
    for wb, wd in ((2, torch.bfloat16), (4, torch.float32)):
        for M in (1, 24, 64):
            x, w = _operands(M, 0, M, 1536, 4096, torch.bfloat16, wd)
            for cfg in lcfg.linear_space(dev.smem_per_block, wb, M):
                a = linear(x, w, path="triton", config=cfg)
                b = linear(x, w, path="triton", config=cfg)
                _check(a, x, w)
                assert torch.equal(a.view(torch.int16), b.view(torch.int16)), cfg
    assert int(tlinear.reserve_workspace("cuda").count_nonzero()) == 0


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("reserved", [True, False], ids=["reserved", "captured_counters"])
def test_gpu_cuda_graph_capture_replay(reserved, monkeypatch):
    """A split call captured in a CUDA graph, replayed on new values: within the bound, bitwise
    equal to the eager call, the counters zero after every replay. Without the device's counter
    buffer (``captured_counters``) the capture zeroes a buffer of its own."""
    x, w = _operands(61, 0, 4, 2240, 7168, torch.bfloat16, torch.bfloat16)
    out = torch.empty(4, 2240, dtype=torch.bfloat16, device="cuda")
    linear(x, w, out=out, path="triton")                         # compile outside the capture
    if not reserved:
        monkeypatch.setattr(tlinear, "_counters", {})            # no counter buffer at capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        linear(x, w, out=out, path="triton")
    for seed in (62, 63):
        x2, w2 = _operands(seed, 0, 4, 2240, 7168, torch.bfloat16, torch.bfloat16)
        x.copy_(x2)
        w.copy_(w2)
        g.replay()
        torch.cuda.synchronize()
        _check(out, x, w)
        assert torch.equal(out, linear(x, w, path="triton"))
    for buf in tlinear._counters.values():
        assert int(buf.count_nonzero()) == 0


# ============================================================================ the sweep

@pytest.mark.skipif(CUDA, reason="the CPU dry run of the GPU sweep")
def test_sweep_dry_run(tmp_path):
    """``bench/linear_sweep.py`` end to end in the interpreter (scaled-down layer shapes, fp16,
    the heuristic's config): every projection of both presets has a torch and a Triton row,
    each checked against the float64 bound before it is timed, and the summary's phases."""
    import json
    from bench import linear_sweep
    out = tmp_path / "sweep.json"
    assert linear_sweep.main(["--dry-run", "--heuristic-only", "--batch", "3", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["dry_run"] and not doc["cut_by_budget"]
    from kernels import layer_config as lc
    for preset in ("DSV32", "DSV4_FLASH"):
        names = [p.name for p in lc.projection_shapes(lc.LAYER_CONFIGS[preset].scaled_down())]
        for name in names:
            rows = [r for r in doc["rows"] if r["preset"] == preset and r["gemm"] == name]
            assert {r["impl"] == "triton" for r in rows} == {True, False}, name
            assert all(r["check"]["ok"] and r["median_us"] > 0 for r in rows), name
            assert any(r["heuristic"] for r in rows), name
        assert doc["summary"]["projections_phase"][f"{preset} M=3"]["gemms"] == len(names)


def test_gemv_pair_is_the_two_gemvs_bitwise(monkeypatch):
    """``linear_pair`` (the layer's one-token ``x_proj`` + ``weights_proj``): where both products'
    one-token configs form a pair of ``GEMV_PAIR_PICKS`` (here 2 x 1,024 for max(40, 2 x SMs)
    rows of K 2,048 and 1 x 2,048 for 4 fp32 rows) one launch of
    ``_gemv_pair_kernel`` whose outputs are bitwise those of two ``linear`` calls (two
    ``_gemv_kernel`` launches: the same row code and order) and within the reference's bound;
    another pair of configs runs as two launches; the torch path within the bound; bad input
    named."""
    from kernels import hardware
    from kernels.linear import triton as ktriton
    monkeypatch.delenv(tlinear.GEMV_ENV, raising=False)
    sms = (torch.cuda.get_device_properties(0).multi_processor_count if CUDA
           else hardware.CPU_INTERPRETER.num_sms)
    n1 = max(40, 2 * sms)                        # programs of two rows give every SM one
    x, w1 = (t.to(DEVICE) for t in _operands(21, 0, 1, n1, 2048, torch.float16, torch.float16))
    w2 = _operands(22, 0, 1, 4, 2048, torch.float16, torch.float32)[1].to(DEVICE)
    picks = (lcfg.gemv_heuristic(n1, 2048, 1, False, sms), lcfg.gemv_heuristic(4, 2048, 1, False, sms))
    assert picks in lcfg.GEMV_PAIR_PICKS
    pairs, singles = [], []
    real_pair, real_one = ktriton.launch_gemv_pair, ktriton.launch_gemv
    monkeypatch.setattr(ktriton, "launch_gemv_pair", lambda *a: pairs.append(1) or real_pair(*a))
    monkeypatch.setattr(ktriton, "launch_gemv", lambda *a: singles.append(1) or real_one(*a))
    o1, o2 = tlinear.linear_pair(x, w1, x, w2, alphas=(1.0, 0.37), out_dtypes=(None, torch.float32),
                                 path="triton")
    assert (len(pairs), len(singles)) == (1, 0)
    assert o1.dtype == torch.float16 and o2.dtype == torch.float32
    a1 = linear(x, w1, path="triton")
    a2 = linear(x, w2, alpha=0.37, out_dtype=torch.float32, path="triton")
    assert torch.equal(o1, a1) and torch.equal(o2, a2)
    _check(o1, x, w1)
    _check(o2, x, w2, 0.37)
    pairs.clear()
    singles.clear()
    w3 = _operands(23, 0, 1, n1, 1024, torch.float16, torch.float16)[1].to(DEVICE)
    o1, o3 = tlinear.linear_pair(x, w1, x[:, :1024].contiguous(), w3, path="triton")
    assert (len(pairs), len(singles)) == (0, 2)                 # 2 x 1,024 twice: not a listed pair
    assert torch.equal(o1, a1)
    _check(o3, x[:, :1024], w3)
    t1, t2 = tlinear.linear_pair(x, w1, x, w2, alphas=(1.0, 0.37), out_dtypes=(None, torch.float32),
                                 path="torch")
    _check(t1, x, w1)
    _check(t2, x, w2, 0.37)
    with pytest.raises(ValueError, match="x1: expected one token"):
        tlinear.linear_pair(x.expand(2, -1), w1, x, w2)
    with pytest.raises(ValueError, match="w2: expected K contiguous"):
        tlinear.linear_pair(x, w1, x[:, :4], w2.t())
    with pytest.raises(TypeError, match="product 2"):
        tlinear.linear_pair(x, w1, x.to(torch.int32), w2)


@pytest.mark.skipif(CUDA, reason="the CPU dry run of the GPU sweep")
def test_sweep_split_weights_dry_run(tmp_path):
    """``--split-weights``: the float32 ``weights_proj`` as three 16-bit weights, alone and
    appended to ``x_proj``, torch and Triton, each checked against the float64 product before it
    is timed; the rows are alternatives, left out of the phase sums."""
    import json
    from bench import linear_sweep
    out = tmp_path / "sweep.json"
    assert linear_sweep.main(["--dry-run", "--heuristic-only", "--batch", "3", "--preset", "DSV4_FLASH",
                              "--gemm", "indexer.weights_proj", "--split-weights", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    alt = [r for r in doc["rows"] if r.get("alternative")]
    assert sorted((r["gemm"], r["impl"]) for r in alt) == [
        ("indexer.weights_proj", "torch.mm_x3"), ("indexer.weights_proj", "triton_x3"),
        ("x_proj+weights_proj_x3", "torch.mm_f32out"), ("x_proj+weights_proj_x3", "triton_f32out")]
    assert all(r["check"]["ok"] and r["median_us"] > 0 for r in alt)
    assert all(r["weight_bytes"] == r["N"] * r["K"] * 2 for r in alt)
    gemms = doc["summary"]["gemms"]
    assert "alternative_best" in gemms["DSV4_FLASH M=3 indexer.weights_proj"]
    assert doc["summary"]["projections_phase"]["DSV4_FLASH M=3"]["gemms"] == 1
