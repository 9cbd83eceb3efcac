"""torch_impl.sparse_mla_decode (Triton kernels and the plain-PyTorch path) and torch_impl.formats.

Every value test compares against the float64 reference (kernels.reference via kernels.cases)
with the SPEC tolerances (kernels.compare.check_mla). On a CPU machine the Triton kernels run in
the interpreter (tests/conftest.py sets TRITON_INTERPRET=1) with fp32 / fp16 q; on a CUDA GPU
the same bodies run on the GPU and bf16 q cases are added, plus the GPU-only tests at the end
(CUDA graph capture/replay, torch.compile of the triton path).
"""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch

from kernels import cases, compare, formats as np_formats
from kernels.sparse_mla import configs
import test_contract as contract
from torch_impl import _common, formats as t_formats
from torch_impl import sparse_mla as tsm
from torch_impl.sparse_mla import sparse_mla_decode

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
SM90 = CUDA and torch.cuda.get_device_capability() == (9, 0)
sm90_only = pytest.mark.skipif(not SM90, reason="the Gluon kernels run on sm_90 only")
# The interpreter evaluates bf16 arithmetic on raw bits, so bf16 q runs on the GPU only.
Q_DTYPES = ("float32", "float16") + (("bfloat16",) if CUDA else ())
FORMATS = (("latent", 576), ("fp8_ds_mla", 576), ("fp8_model1", 512))


def _t(x):
    return _common.as_tensor(x, DEVICE) if isinstance(x, np.ndarray) else x


def _call(case: cases.MLACase, path: str = "triton", q=None, **over):
    kw = {k: _t(v) for k, v in case.kwargs().items()}
    kw.update(over)
    q = _t(case.q) if q is None else q
    return sparse_mla_decode(q, _t(case.kv_cache), _t(case.indices), case.sm_scale, path=path, **kw)


def _impl(case: cases.MLACase, config, num_splits: int, kv=None):
    """``(out, lse)`` of the Triton binding's launcher (``tsm._triton_impl``, no dispatch) on
    ``case``'s tensors with this config and split count; ``kv``: another view of its cache."""
    kw = {k: _t(v) for k, v in case.kwargs().items()}
    return tsm._triton_impl(_t(case.q), _t(case.kv_cache) if kv is None else kv, _t(case.indices),
                            case.sm_scale, kw["kv_format"], kw["d_v"], kw["block_table"],
                            kw["topk_length"], kw["attn_sink"], config=config,
                            num_splits=num_splits)


def _check(case: cases.MLACase, out, lse):
    ro, rl = case.reference()
    assert out.dtype == _common.as_tensor(case.q).dtype and lse.dtype == torch.float32
    compare.assert_pass(compare.check_mla(out, lse, ro, rl, q_dtype=case.q_dtype))


# ============================================================================ corner cases

@functools.lru_cache(maxsize=None)
def _corners(kv_format: str, d_qk: int, q_dtype: str):
    kv_dtype = "float16" if q_dtype == "float16" else ("bfloat16" if q_dtype == "bfloat16" else "float32")
    return cases.mla_corner_cases(7, d_qk=d_qk, H=16, K=64, kv_format=kv_format,
                                  q_dtype=q_dtype, kv_dtype=kv_dtype)


_CORNER_NAMES = [c.name.split("[")[0] for c in cases.mla_corner_cases(0, K=16, H=16)]
# every (format, corner) but those tests/test_contract.py runs on every path
_CORNERS_HERE = [(i, fmt, d_qk) for fmt, d_qk in FORMATS for i, name in enumerate(_CORNER_NAMES)
                 if not (fmt in contract.MLA_FORMATS and name in contract.MLA_CORNERS)]


@pytest.mark.parametrize("path", ["triton", "torch"])
@pytest.mark.parametrize("i,kv_format,d_qk", _CORNERS_HERE,
                         ids=[f"{_CORNER_NAMES[i]}-{fmt}" for i, fmt, _ in _CORNERS_HERE])
def test_corner_cases(i, kv_format, d_qk, path):
    """Every SPEC corner case (all invalid, -1 first/middle, out-of-range slots and logical
    positions, block table with -1 pages, topk_length incl. 0, duplicates, NaN-filled unselected
    rows, empty rows, attn_sink incl. on empty rows, K > L, P 1/2/61, K not a power of two, N=4)
    in each layout; the fp8 formats' format-dependent ones are tests/test_contract.py's."""
    case = _corners(kv_format, d_qk, "float32")[i]
    _check(case, *_call(case, path))


@pytest.mark.parametrize("q_dtype", [d for d in Q_DTYPES if d != "float32"])
@pytest.mark.parametrize("kv_format,d_qk", FORMATS, ids=[f[0] for f in FORMATS])
@pytest.mark.parametrize("name", ["invalid_middle", "logical_out_of_range", "attn_sink_empty_row",
                                  "topk_length", "mtp_N4"])
def test_corner_cases_low_precision_q(name, kv_format, d_qk, q_dtype):
    """fp16 q (bf16 on the GPU): fp16/bf16 dot operands; latent cache in q's dtype."""
    case = next(c for c in _corners(kv_format, d_qk, q_dtype) if c.name.startswith(name + "["))
    _check(case, *_call(case))


# ============================================================================ random grid

def _grid():
    rng = np.random.default_rng(2024)
    combos = list(itertools.product((8, 16, 24, 64), (1, 2, 3, 4), (64, 100, 256), (1, 2, 61, 64)))
    rng.shuffle(combos)
    out = []
    for j, (H, N, K, P) in enumerate(combos[:14]):
        kv_format, d_qk = FORMATS[j % 3]
        if j % 5 == 4:
            kv_format, d_qk = "latent", 512
        q_dtype = Q_DTYPES[j % len(Q_DTYPES)]
        B = 1 + (j % 3)
        out.append(dict(H=H, N=N, K=K, P=P, B=B, kv_format=kv_format, d_qk=d_qk, q_dtype=q_dtype,
                        logical=bool(j % 2), invalid="random" if j % 4 else None, seed=100 + j))
    return out


@pytest.mark.parametrize("p", _grid(), ids=lambda p: "H{H}-N{N}-K{K}-P{P}-B{B}-{kv_format}{d_qk}-{q_dtype}".format(**p))
def test_random_grid(p):
    p = dict(p)
    kv_dtype = p["q_dtype"] if p["kv_format"] == "latent" else "float32"
    case = cases.make_mla_case(p.pop("seed"), kv_dtype=kv_dtype, attn_sink=p["H"] % 16 == 8, **p)
    _check(case, *_call(case))


def test_128_heads_two_head_blocks():
    """H = 128 (V3.2 without TP): two head blocks of 64 read the same rows."""
    case = cases.make_mla_case(5, B=1, N=1, H=128, K=64, P=64, kv_format="fp8_ds_mla", invalid="mix",
                               logical=True)
    _check(case, *_call(case))


# ============================================================================ every config

# (config, dot operand bytes of the space it belongs to): a config of the 16-bit space runs
# with fp16 q (bf16 on the GPU), one of the fp32 space with fp32 q; a 16-bit tile fed fp32
# operands stages twice the bytes (the 64 x 32 two-stage tile then needs 242,688 B on sm_90).
_ALL_CONFIGS = sorted({(c, width) for (_, width), space in configs.SPARSE_MLA_SPACE.items() for c in space},
                      key=lambda cw: (cw[1], tuple(cw[0].to_dict().values())))


# Triton's interpreter ignores num_warps, num_stages and maxnreg (launch options, no kernel
# argument: kernels/sparse_mla/triton_launch.py passes BLOCK_H, BLOCK_K, PREFETCH and ROWS_M as
# the config's constexprs), so on a CPU machine two configs equal but for them run the same
# interpreted program on the same inputs: the later one is skipped there, naming the first (the
# GPU runs both). 2026-12-07: h32k32w8s1p1 (= h32k32w4s1p1) and h64k32w8s2p0 (= h64k32w8s1p0),
# ~6 s of the CPU CI's test time (tests/TEST_TIME.md, run CC).
def _interpreter_key(cw):
    c, width = cw
    return (c.kernel, c.block_h, c.block_k, c.prefetch, width)


def _config_id(c, width):
    return "h{block_h}k{block_k}w{num_warps}s{num_stages}p{prefetch:d}{g}-q{w}".format(
        g="" if c.kernel == "triton" else "-" + c.kernel, w=8 * width, **c.to_dict())


_INTERPRETER_TWIN = {}
for _i, _cw in enumerate(_ALL_CONFIGS):
    _first = next(cw for cw in _ALL_CONFIGS[:_i + 1] if _interpreter_key(cw) == _interpreter_key(_cw))
    if _first != _cw and _cw[0].kernel in ("triton", "triton_rows"):
        _INTERPRETER_TWIN[_cw] = _config_id(*_first)


@pytest.mark.parametrize("cfg,width", _ALL_CONFIGS, ids=[_config_id(c, w) for c, w in _ALL_CONFIGS])
@pytest.mark.parametrize("splits", [1, 3])
def test_every_config(cfg, width, splits):
    """Each config of the search space (both shared-memory classes, both operand widths), with
    one split (the split kernel writes the result) and three (partials + combine), on both fp8
    formats, with q of the space's operand width."""
    if cfg.kernel != "triton" and not SM90:
        pytest.skip("the Gluon kernels run on sm_90 only (elsewhere the launcher substitutes "
                    "the Triton 64-head tile, tested here as h64k32w8s2p0; in the interpreter "
                    "as h64k32w8s1p0, the same run)")
    twin = _INTERPRETER_TWIN.get((cfg, width))
    if twin is not None and not CUDA:
        pytest.skip(f"in the interpreter the same run as {twin}: warps, stages and maxnreg are "
                    f"compile options only, the kernel's code and arguments are the same")
    q_dtype = "float32" if width == 4 else ("bfloat16" if CUDA else "float16")
    # the fp8 formats; the warp-specialised kernel also a latent cache of q's dtype
    for kv_format, d_qk in (FORMATS if cfg.kernel == "gluon_ws" else FORMATS[1:]):
        case = cases.make_mla_case(11, B=2, N=2, H=24, K=100, P=61 if kv_format == "latent" else 64,
                                   d_qk=d_qk, kv_format=kv_format, invalid="mix", logical=True,
                                   topk_length=True, attn_sink=True, q_dtype=q_dtype,
                                   kv_dtype=q_dtype if kv_format == "latent" else "float32")
        _check(case, *_impl(case, cfg, splits))


def test_logical_to_slots_matches_the_in_kernel_block_table():
    """The plain-PyTorch path resolves a block table with ``_logical_to_slots``; the Triton
    kernel looks it up in its pipelined loop. Same slots, same invalid entries (-1 pages, out of
    the table, negative), so the kernel's slot form gives its block-table form's result bit for
    bit."""
    case = cases.make_mla_case(12, B=2, N=2, H=16, K=100, P=16, d_qk=576, kv_format="fp8_ds_mla",
                               invalid="mix", logical=True, topk_length=True)
    kw = {k: _t(v) for k, v in case.kwargs().items()}
    q, kv, idx = _t(case.q), _t(case.kv_cache), _t(case.indices)
    P, _, num_pages = tsm._geometry(kv, "fp8_ds_mla")
    slots = tsm._logical_to_slots(idx, kw["block_table"], P, num_pages)
    cfg = configs.SparseMLAConfig(16, 32, 4, 1)
    a = tsm._triton_impl(q, kv, idx, case.sm_scale, "fp8_ds_mla", 512, kw["block_table"],
                         kw["topk_length"], None, config=cfg, num_splits=2)
    b = tsm._triton_impl(q, kv, slots, case.sm_scale, "fp8_ds_mla", 512, None,
                         kw["topk_length"], None, config=cfg, num_splits=2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    _check(case, *b)


def test_heuristic_stays_in_space():
    for smem, width in itertools.product((configs.SMALL_SMEM, configs.LARGE_SMEM), (2, 4)):
        space = configs.sparse_mla_space(smem, width)
        assert space == configs.SPARSE_MLA_SPACE[(configs.smem_class(smem), width)]
        for H in (8, 16, 24, 32, 64, 128):
            cfg = configs.sparse_mla_heuristic(H, smem, width)
            assert cfg in space
            want = (configs.SPARSE_MLA_SMALL_H if H <= 16 else configs.SPARSE_MLA_DEFAULT)
            assert cfg == (want if width == 2 else space[0])
    assert configs.sparse_mla_heuristic(64, configs.LARGE_SMEM) == configs.SparseMLAConfig(
        block_h=32, block_k=32, num_warps=8, num_stages=1, prefetch=True)
    assert configs.pallas_sparse_mla_heuristic(128, configs.SMALL_SMEM) in configs.PALLAS_SPARSE_MLA_SPACE["small"]
    assert configs.sparse_mla_from_dict({"block_h": 64, "block_k": 999}, configs.SMALL_SMEM) is None
    # the Pallas fp16 fast path's rule on the large class (the H200 rows that set it: the
    # heuristic's docstring): 64-head tiles from 16 requests, N16P for few heads / requests,
    # fp8_model1's few heads the three-stage 16-head tiles
    ph = lambda H, B, K, fmt: configs.pallas_sparse_mla_heuristic(  # noqa: E731
        H, configs.LARGE_SMEM, rows=B, topk=K, kv_format=fmt)
    assert ph(128, 16, 2048, "fp8_ds_mla") == ph(128, 64, 2048, "fp8_ds_mla") == configs.PALLAS_W64
    assert ph(128, 8, 2048, "fp8_ds_mla") == ph(16, 64, 2048, "fp8_ds_mla") == configs.PALLAS_N16P
    assert ph(8, 64, 512, "fp8_model1") == ph(32, 64, 512, "fp8_model1") == configs.PALLAS_N16
    assert ph(64, 64, 512, "fp8_model1") == configs.PALLAS_W32
    # waves x (iterations + 1 of prologue) + 1 for the combine: 64 rows fill 128 of 132 slots at
    # S = 2 (1 x 33 + 1); 1024 rows are 8 waves at S = 1; one row of 2 blocks: S = 1 (3 vs 3 on a
    # tie at S = 2 -> the smaller); B 1 H 128 (4 rows of 64 blocks) -> S = 32 (1 x (2 + 1) + 1)
    assert configs.sparse_mla_num_splits(rows=64, topk=2048, block_k=32, num_sms=132) == 2
    assert configs.sparse_mla_num_splits(rows=1024, topk=2048, block_k=32, num_sms=132) == 1
    assert configs.sparse_mla_num_splits(rows=1, topk=64, block_k=32, num_sms=132) == 1
    assert configs.sparse_mla_num_splits(rows=4, topk=2048, block_k=32, num_sms=132) == 32
    assert configs.sparse_mla_num_splits(rows=64, topk=2048, block_k=32, num_sms=132,
                                         ctas_per_sm=2) == 4


# ============================================================================ determinism, layout

def test_bitwise_repeatable():
    """Same inputs, same bits (split-K partials merged in a fixed order, no atomics)."""
    case = cases.make_mla_case(3, B=1, N=2, H=16, K=256, kv_format="fp8_model1", d_qk=512,
                               invalid="random", attn_sink=True)
    a = _call(case)
    b = _call(case)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    _check(case, *a)


@pytest.mark.parametrize("path", ["triton", "torch"])
def test_non_contiguous_q(path):
    case = cases.make_mla_case(4, B=2, N=2, H=16, K=64, kv_format="fp8_ds_mla", invalid="random")
    q = _t(case.q)
    B, N, H, D = q.shape
    q_perm = torch.empty((B, H, N, D), dtype=q.dtype, device=DEVICE).permute(0, 2, 1, 3)
    q_perm.copy_(q)                                    # heads outermost in memory
    q_wide = torch.zeros((B, N, H, D + 64), dtype=q.dtype, device=DEVICE)[..., 32:32 + D]
    q_wide.copy_(q)                                    # row stride D + 64, offset 32
    q_last = torch.empty((B, N, D, H), dtype=q.dtype, device=DEVICE).transpose(2, 3)
    q_last.copy_(q)                                    # last dim not contiguous
    for qq in (q_perm, q_wide, q_last):
        assert not qq.is_contiguous()
        _check(case, *_call(case, path, q=qq))


def test_latent_cache_strided_pages():
    """A latent cache that is a view of a larger pool (page stride != P * D_qk)."""
    case = cases.make_mla_case(6, B=2, N=1, H=16, K=64, P=2, kv_format="latent", invalid="oob")
    kv = _t(case.kv_cache)
    pool = torch.full((kv.shape[0], kv.shape[1] + 1, kv.shape[2]), float("nan"), dtype=kv.dtype,
                      device=DEVICE)
    pool[:, : kv.shape[1]] = kv
    view = pool[:, : kv.shape[1]]
    assert not view.is_contiguous()
    kw = {k: _t(v) for k, v in case.kwargs().items()}
    out, lse = sparse_mla_decode(_t(case.q), view, _t(case.indices), case.sm_scale, path="triton", **kw)
    _check(case, out, lse)


def _padded_pages(kv: torch.Tensor, kv_format: str, pad: int, lead: int = 0) -> torch.Tensor:
    """The fp8 cache ``kv`` as a strided view: each page ``pad`` bytes further apart than its
    own bytes (the padding 0xFF: NaN e4m3, NaN scales and rope, so a read of it shows), the
    view starting ``lead`` pages into its storage. No copy of the view is ever made."""
    nb = kv.shape[0]
    used = kv[0].numel()
    pool = torch.full((lead + nb, used + pad), 0xFF, dtype=torch.uint8, device=kv.device)
    view = pool[lead:, :used].view(kv.shape)
    view.copy_(kv)
    return view


FP8_FORMATS = (("fp8_ds_mla", 576), ("fp8_model1", 512))


@pytest.mark.parametrize("logical", [False, True], ids=["slots", "block_table"])
@pytest.mark.parametrize("kv_format,d_qk", FP8_FORMATS, ids=[f[0] for f in FP8_FORMATS])
def test_fp8_cache_strided_pages(kv_format, d_qk, logical):
    """fp8 pages further apart than their own bytes (FlashMLA's quantizer pads each V3.2 page
    by one token row; here 656 bytes for fp8_ds_mla, 48 for fp8_model1), read in place: the
    same kernel as the contiguous cache, so bitwise its result, on the triton and torch paths
    (and within SPEC of the float64 reference); the NaN padding is never read."""
    case = cases.make_mla_case(14, B=2, N=2, H=16, K=64, P=16, d_qk=d_qk, kv_format=kv_format,
                               logical=logical, invalid="mix", topk_length=True, attn_sink=True)
    kv = _t(case.kv_cache)
    for pad, lead in ((656 if kv_format == "fp8_ds_mla" else 48, 0), (16, 1)):
        view = _padded_pages(kv, kv_format, pad, lead)
        assert not view.is_contiguous()
        kw = {k: _t(v) for k, v in case.kwargs().items()}
        for path in ("triton", "torch"):
            want = _call(case, path)
            got = sparse_mla_decode(_t(case.q), view, _t(case.indices), case.sm_scale, path=path,
                                    **kw)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (path, pad)
        _check(case, *got)


def test_fp8_strided_pages_launch_passes_the_page_stride(monkeypatch):
    """The launcher hands the kernels the page stride (``page_bytes``) and a flat byte view
    that starts at the view's first byte, for both fp8 formats and a forced split count."""
    from kernels.sparse_mla import triton_launch
    seen = []
    real = triton_launch.fp8_bytes

    def spy(kv_cache, kv_format, page_size):
        kv, page_bytes = real(kv_cache, kv_format, page_size)
        seen.append((kv.data_ptr() == kv_cache.data_ptr(), page_bytes, kv_cache.stride(0)))
        return kv, page_bytes

    monkeypatch.setattr(triton_launch, "fp8_bytes", spy)
    for kv_format, d_qk in FP8_FORMATS:
        case = cases.make_mla_case(15, B=1, H=16, K=64, P=16, d_qk=d_qk, kv_format=kv_format)
        view = _padded_pages(_t(case.kv_cache), kv_format, 32, 1)
        _check(case, *_impl(case, None, 2, kv=view))
    assert seen and all(same and pb == s0 for same, pb, s0 in seen)


# ============================================================================ paths and errors

def test_auto_path_and_named_path(monkeypatch):
    case = cases.make_mla_case(8, B=1, H=8, K=64, kv_format="fp8_ds_mla")
    _check(case, *_call(case, "auto"))
    if not CUDA:
        # Without the interpreter the triton path cannot run on CPU tensors: "auto" falls
        # through to "torch", the named path raises.
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        _check(case, *_call(case, "auto"))
        with pytest.raises(NotImplementedError, match="CUDA"):
            _call(case, "triton")


def test_triton_shape_gate_falls_through():
    """(D_qk, d_v) outside the Triton kernels' shapes: named path raises, "auto" uses torch."""
    case = cases.make_mla_case(9, B=1, H=8, K=64, d_qk=576, d_v=256, kv_format="latent")
    with pytest.raises(NotImplementedError, match="supports"):
        _call(case, "triton")
    _check(case, *_call(case, "auto"))


def _pool_view(kv: torch.Tensor, page_stride: int) -> torch.Tensor:
    """``kv`` (pages along dim 0) copied into a pool whose pages are ``page_stride`` bytes apart."""
    nb, used = kv.shape[0], kv[0].numel()
    pool = torch.zeros((nb, page_stride), dtype=torch.uint8, device=kv.device)
    view = pool[:, :used].view(kv.shape)
    view.copy_(kv)
    return view


@pytest.mark.parametrize("how", ["strided", "expanded"])
def test_strided_topk_length_and_sink_read_by_value(how):
    """topk_length and attn_sink given as a strided view (every other element of a longer
    tensor) or a stride-0 expand: the Triton kernels read them at b / h from a base pointer, so
    the launcher makes them contiguous; the result equals the reference (found by the 12-03
    newcomer trial: the strided view was read as if contiguous)."""
    case = cases.make_mla_case(10, B=2, N=1, H=16, K=64, kv_format="fp8_ds_mla", logical=True,
                               topk_length=True, attn_sink=True, invalid="random")
    tkl, sink = _t(case.topk_length), _t(case.attn_sink)
    if how == "strided":        # the same values, every other element of a decoy-filled tensor
        t2 = torch.stack([tkl, torch.full_like(tkl, 3)], dim=1).reshape(-1)[::2]
        s2 = torch.stack([sink, torch.full_like(sink, 99.0)], dim=1).reshape(-1)[::2]
    else:                       # one value broadcast: the case's inputs made uniform first
        case.topk_length[:] = case.topk_length[0]
        case.attn_sink[:] = case.attn_sink[0]
        t2 = _t(case.topk_length[:1]).expand(2)
        s2 = _t(case.attn_sink[:1]).expand(16)
    assert not t2.is_contiguous() and not s2.is_contiguous()
    out, lse = _call(case, "triton", topk_length=t2, attn_sink=s2)
    _check(case, out, lse)


def _bad_inputs():
    case = cases.make_mla_case(10, B=2, N=1, H=8, K=64, kv_format="fp8_ds_mla", logical=True,
                               topk_length=True, attn_sink=True)
    q, kv, idx = _t(case.q), _t(case.kv_cache), _t(case.indices)
    bt, tkl, sink = _t(case.block_table), _t(case.topk_length), _t(case.attn_sink)
    base = dict(q=q, kv_cache=kv, indices=idx, sm_scale=case.sm_scale, kv_format="fp8_ds_mla",
                block_table=bt, topk_length=tkl, attn_sink=sink)
    bad = [
        ("q", dict(q=q.numpy() if not CUDA else q.cpu().numpy()), TypeError, "q: expected a torch.Tensor"),
        ("q", dict(q=q.to(torch.int32)), TypeError, "q: expected dtype"),
        ("q", dict(q=q[0]), ValueError, "q: expected rank 4"),
        ("q", dict(q=q[..., :512]), ValueError, "q: kv_format 'fp8_ds_mla' needs D_qk = 576"),
        ("kv_cache", dict(kv_cache=kv.view(torch.int8)), TypeError, "kv_cache: expected dtype"),
        ("kv_cache", dict(kv_cache=kv[..., :600]), ValueError, "kv_cache: expected shape"),
        ("kv_cache", dict(kv_cache=kv[:, ::2]), ValueError,
         "kv_cache: expected each 'fp8_ds_mla' page's P token rows packed (strides (page stride, "
         "656, 1)), got strides"),
        # padded pages are read in place, but their stride must keep 16-byte rows and not overlap
        ("kv_cache", dict(kv_cache=_pool_view(kv, kv[0].numel() + 8)), ValueError,
         f"kv_cache: expected a page stride (stride(0), bytes) that is a multiple of 16 and at "
         f"least the {kv[0].numel()} bytes of one 'fp8_ds_mla' page of P = {kv.shape[1]} (padded "
         f"pages are read in place), got {kv[0].numel() + 8}"),
        ("kv_cache", dict(kv_cache=torch.as_strided(kv, kv.shape, (kv[0].numel() - 656, 656, 1))),
         ValueError, f"kv_cache: expected a page stride .* got {kv[0].numel() - 656}"),
        ("model1", dict(kv_format="fp8_model1", q=q[..., :512], kv_cache=_pool_view(
            torch.zeros(4, 1152, dtype=torch.uint8, device=DEVICE), 1160)),
         ValueError, "kv_cache: expected a page stride .* 'fp8_model1' page of P = 1 .* got 1160"),
        ("model1", dict(kv_format="fp8_model1", q=q[..., :512],
                        kv_cache=torch.zeros(4, 2304, dtype=torch.uint8, device=DEVICE)[:, ::2]),
         ValueError, "kv_cache: expected each 'fp8_model1' page's bytes packed"),
        # a contiguous cache starting at an odd byte of its storage (found by a new-user trial:
        # torch raised from the int16 view inside the launcher)
        ("kv_cache", dict(kv_cache=torch.empty(kv.numel() + 1, dtype=torch.uint8, device=kv.device)[1:]
                          .view(kv.shape).copy_(kv)), ValueError, "kv_cache: expected a byte offset"),
        ("kv_format", dict(kv_format="fp4"), ValueError, "kv_format: expected one of"),
        ("indices", dict(indices=idx.long()), TypeError, "indices: expected dtype"),
        ("indices", dict(indices=idx[:1]), ValueError, "indices: expected shape"),
        ("block_table", dict(block_table=bt[:1]), ValueError, "block_table: expected shape"),
        ("block_table", dict(block_table=bt.float()), TypeError, "block_table: expected dtype"),
        ("topk_length", dict(topk_length=tkl[:1]), ValueError, "topk_length: expected shape"),
        ("attn_sink", dict(attn_sink=sink.half()), TypeError, "attn_sink: expected dtype"),
        ("attn_sink", dict(attn_sink=sink[:3]), ValueError, "attn_sink: expected shape"),
        ("sm_scale", dict(sm_scale="0.1"), TypeError, "sm_scale: expected a real number"),
        ("sm_scale", dict(sm_scale=float("nan")), ValueError, "sm_scale: expected a finite"),
        ("d_v", dict(d_v=256), ValueError, "d_v: kv_format 'fp8_ds_mla'"),
        ("d_v", dict(d_v=1000), ValueError, "d_v: expected 1 <= d_v"),
        ("path", dict(path="cuda"), ValueError, "path: expected one of"),
        ("model1", dict(kv_format="fp8_model1", kv_cache=torch.zeros(4, 1000, dtype=torch.uint8, device=DEVICE),
                        q=q[..., :512]), ValueError, "kv_cache: 1000 bytes per page"),
    ]
    if CUDA:
        bad.append(("device", dict(indices=idx.cpu()), ValueError, "indices: expected a tensor on"))
    return base, bad


_BAD = _bad_inputs()


@pytest.mark.parametrize("j", range(len(_BAD[1])), ids=[b[0] for b in _BAD[1]])
def test_bad_input(j):
    """SPEC "Bad input": TypeError / ValueError naming the argument, expected and received."""
    base, bad = _BAD
    _, over, exc, msg = bad[j]
    args = {**base, **over}
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace(")", r"\)")):
        sparse_mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("indices"), args.pop("sm_scale"),
                          **args)


def test_numpy_scalars_accepted_like_python_scalars():
    """The scalar rule of both stacks (kernels.scalars): np.float32 sm_scale and np.int64 d_v
    give the Python-scalar result bit for bit; np.bool_ is refused."""
    case = cases.make_mla_case(14, B=1, N=1, H=16, K=64, kv_format="fp8_model1", d_qk=512)
    args = (_t(case.q), _t(case.kv_cache), _t(case.indices))
    a = sparse_mla_decode(*args, case.sm_scale, kv_format="fp8_model1", path="torch")
    b = sparse_mla_decode(*args, np.float32(case.sm_scale), kv_format="fp8_model1",
                          d_v=np.int64(512), path="torch")
    c = sparse_mla_decode(*args, float(np.float32(case.sm_scale)), kv_format="fp8_model1",
                          path="torch")
    assert torch.equal(b[0], c[0]) and torch.equal(b[1], c[1])
    _check(case, *a)
    with pytest.raises(TypeError, match="sm_scale: expected a real number"):
        sparse_mla_decode(*args, np.bool_(True), kv_format="fp8_model1", path="torch")


@pytest.mark.skipif(CUDA, reason="the interpreter's bf16 gate; bf16 runs on the GPU")
def test_bf16_refused_in_the_interpreter_auto_uses_torch():
    """The Triton interpreter computes bf16 on raw bits: the triton path raises
    NotImplementedError before launch, and auto gives the torch path's result (within the SPEC
    bf16 tolerance of the reference)."""
    case = cases.make_mla_case(15, B=1, N=1, H=16, K=32, kv_format="fp8_ds_mla", d_qk=576,
                               q_dtype="bfloat16")
    args = (_t(case.q).to(torch.bfloat16), _t(case.kv_cache), _t(case.indices), case.sm_scale)
    with pytest.raises(NotImplementedError, match="interpreter: bf16 operands are not supported"):
        sparse_mla_decode(*args, kv_format="fp8_ds_mla", path="triton")
    out, lse = sparse_mla_decode(*args, kv_format="fp8_ds_mla")
    ref = sparse_mla_decode(*args, kv_format="fp8_ds_mla", path="torch")
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])
    _check(case, out, lse)


# ============================================================================ torch.compile

@pytest.mark.parametrize("path", ["torch", "triton"])
def test_torch_compile_fullgraph(path):
    """The custom op traces under torch.compile(fullgraph=True). CPU: aot_eager (no C++ compiler
    needed; proves tracing with the fake implementation) for both paths; GPU: inductor."""
    case = cases.make_mla_case(12, B=2, N=2, H=16, K=64, kv_format="fp8_model1", d_qk=512,
                               logical=True, invalid="random", attn_sink=True)
    kw = {k: _t(v) for k, v in case.kwargs().items()}

    def f(q, kv, idx, bt, sink):
        out, lse = sparse_mla_decode(q, kv, idx, case.sm_scale, kv_format="fp8_model1",
                                     block_table=bt, attn_sink=sink, path=path)
        return out * 2.0, lse

    torch._dynamo.reset()
    g = torch.compile(f, fullgraph=True, backend="inductor" if CUDA else "aot_eager")
    out2, lse = g(_t(case.q), _t(case.kv_cache), _t(case.indices), kw["block_table"], kw["attn_sink"])
    _check(case, out2 / 2.0, lse)


def test_torch_compile_checks_the_byte_offset_at_run_time():
    """Under torch.compile the storage-offset check (an int Dynamo cannot trace) runs in the op
    body: an fp8 cache at a byte offset not a multiple of 4 still gets the ValueError."""
    case = cases.make_mla_case(13, B=1, N=1, H=16, K=64, kv_format="fp8_model1", d_qk=512)
    kv = _t(case.kv_cache)
    flat = torch.empty(kv.numel() + 2, dtype=torch.uint8, device=kv.device)
    kv_off = flat[2:].view(kv.shape)
    kv_off.copy_(kv)

    def f(q, kv, idx):
        return sparse_mla_decode(q, kv, idx, case.sm_scale, kv_format="fp8_model1", path="torch")

    torch._dynamo.reset()
    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match="kv_cache: expected a byte offset"):
        g(_t(case.q), kv_off, _t(case.indices))


# ============================================================================ GPU only

@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("kv_format,d_qk", FORMATS, ids=[f[0] for f in FORMATS])
def test_cuda_graph_capture_replay(kv_format, d_qk):
    """No host sync, shape-only allocations: capture once, replay on new index values."""
    same = dict(B=4, N=2, H=64, K=512, kv_format=kv_format, d_qk=d_qk, q_dtype="bfloat16",
                kv_dtype="bfloat16", logical=True, invalid="random", topk_length=True,
                nan_unselected=False, lens=[300, 512, 700, 1000])   # same shapes, new values
    c1 = cases.make_mla_case(13, **same)
    c2 = cases.make_mla_case(14, **same)
    assert c1.kv_cache.shape == c2.kv_cache.shape and c1.block_table.shape == c2.block_table.shape
    q, kv = _t(c1.q), _t(c1.kv_cache)
    idx, bt, tkl = _t(c1.indices), _t(c1.block_table), _t(c1.topk_length)

    def step():
        return sparse_mla_decode(q, kv, idx, c1.sm_scale, kv_format=kv_format, block_table=bt,
                                 topk_length=tkl, path="triton")

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()                                          # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    graph.replay()
    torch.cuda.synchronize()
    _check(c1, out, lse)
    for dst, src in ((q, c2.q), (kv, c2.kv_cache), (idx, c2.indices), (bt, c2.block_table),
                     (tkl, c2.topk_length)):
        dst.copy_(_t(src))
    graph.replay()
    torch.cuda.synchronize()
    _check(c2, out, lse)


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("H", [16, 64, 128])
def test_gpu_bf16_production_shapes(H):
    """V3.2-like (fp8_ds_mla and a bf16 latent cache, K 2048) and V4-like (fp8_model1, K 512 +
    sink) shapes in bf16 (on the H200 the plan runs the Gluon kernels for H >= 64)."""
    for kv_format, d_qk, K, sink in (("fp8_ds_mla", 576, 2048, False), ("fp8_model1", 512, 512, True),
                                     ("latent", 576, 2048, False)):
        case = cases.make_mla_case(15, B=8, N=2, H=H, K=K, P=64, kv_format=kv_format, d_qk=d_qk,
                                   q_dtype="bfloat16", kv_dtype="bfloat16", logical=True,
                                   invalid="random", attn_sink=sink, nan_unselected=False)
        _check(case, *_call(case))


# ============================================================================ torch formats

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_formats_byte_exact(dtype):
    """torch_impl.formats produces the same bytes as kernels.formats and dequantizes exactly."""
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((3, 5, 576)) * np.exp(rng.uniform(-12, 12, (3, 5, 1)))).astype(np.float32)
    x[0, 0, :128] = 0.0                                      # amax 0 -> scale floor 1e-4
    x[0, 1, :128] = 448.0 * 2.0 ** -5                       # exact power-of-two boundary
    x = x.astype(cases.Q_DTYPES[dtype])
    xt = _common.as_tensor(x)
    got = t_formats.quantize_fp8_ds_mla(xt)
    want = np_formats.quantize_fp8_ds_mla(x)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(t_formats.dequantize_fp8_ds_mla(got).numpy(),
                                  np_formats.dequantize_fp8_ds_mla(want))

    flat = x[..., :512].reshape(-1, 512)                                     # 15 rows
    for P in (1, 3, 64):
        y = np.ascontiguousarray(np.tile(flat, (-(-2 * P // 15), 1))[: 2 * P].reshape(2, P, 512))
        got = t_formats.quantize_fp8_model1(_common.as_tensor(y))
        want = np_formats.quantize_fp8_model1(y)
        np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(t_formats.dequantize_fp8_model1(got).numpy(),
                                      np_formats.dequantize_fp8_model1(want))

    k = np.ascontiguousarray(x[..., :128].reshape(3, 5, 128))
    for fmt in ("ue8m0", None):
        got = t_formats.quantize_fp8_indexer(_common.as_tensor(k), fmt)
        want = np_formats.quantize_fp8_indexer(k, fmt)
        np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(t_formats.dequantize_fp8_indexer(got).numpy(),
                                      np_formats.dequantize_fp8_indexer(want))


def test_formats_bad_input():
    with pytest.raises(ValueError, match="latent: expected last dim 576"):
        t_formats.quantize_fp8_ds_mla(torch.zeros(2, 512))
    with pytest.raises(TypeError, match="latent: expected a floating-point"):
        t_formats.quantize_fp8_model1(torch.zeros(1, 2, 512, dtype=torch.int32))
    with pytest.raises(TypeError, match="cache: expected dtype"):
        t_formats.dequantize_fp8_ds_mla(torch.zeros(2, 656))
    with pytest.raises(ValueError, match="scale_fmt"):
        t_formats.quantize_fp8_indexer(torch.zeros(1, 2, 128), "e5m2")
    with pytest.raises(ValueError, match="not a positive multiple"):
        t_formats.dequantize_fp8_indexer(torch.zeros(1, 100, dtype=torch.uint8))


@pytest.mark.parametrize("path", ["torch", "triton"])
def test_inf_in_q_matches_the_reference(path):
    """A +inf / -inf in q: every path gives the reference's NaN / finite pattern (the torch path
    used to return lse +inf where the reference has NaN)."""
    case = cases.make_mla_case(16, B=1, N=1, H=16, K=32, kv_format="fp8_ds_mla", d_qk=576,
                               inf_q=True)
    with np.errstate(invalid="ignore", over="ignore"):
        _, ref_lse = case.reference()
    assert np.isnan(ref_lse[0, 0, 1]) and np.isnan(ref_lse[0, 0, 2])
    out, lse = sparse_mla_decode(_t(case.q), _t(case.kv_cache), _t(case.indices), case.sm_scale,
                                 kv_format="fp8_ds_mla", path=path)
    _check(case, out, lse)


# ============================================================================ fast-path numerics

@pytest.mark.parametrize("kind", ["wide", "non_pow2", "q_extremes"])
@pytest.mark.parametrize("kv_format,d_qk", FORMATS[1:], ids=[f[0] for f in FORMATS[1:]])
def test_fast_path_numerics_outside_the_quantizer_range(kv_format, d_qk, kind):
    """The fp16 fast path (docs/SEMANTICS.md "fast-path numerics": tiles with the scale folded in,
    shifted to the program's running unit; q scaled per head by a power of two; p in fp16) on
    scales the SPEC quantizer never writes (wide power-of-two ranges, non-power-of-two float32
    scales) and on heads of very different magnitudes (fp16 q from 2^-20 to 2^13).

    The bound checked is the written one, not SPEC's elementwise abs 1e-3: fp16 p (11 bits) and,
    for non-power-of-two scales, the fp16 rounding of the tile give
    ``|out - ref| <= 2^-10 * max|v|`` over the selected rows (v up to 448 * scale here, far above
    the unit-variance latents of the parity cases, where SPEC's bound holds: test_corner_cases);
    the LSE keeps SPEC's bound, and the cosine bound holds."""
    if kind == "non_pow2" and kv_format == "fp8_model1":
        pytest.skip("fp8_model1 scales are ue8m0 bytes: powers of two by construction")
    rng = np.random.default_rng(11)
    case = cases.make_mla_case(5, B=2, H=16, K=96, d_qk=d_qk, kv_format=kv_format,
                               q_dtype="float16", logical=True, invalid="mix")
    if kind == "q_extremes":
        mag = np.exp2(rng.integers(-20, 14, case.q.shape[2])).astype(np.float32)
        q = case.q.astype(np.float32) / np.abs(case.q.astype(np.float32)).max(-1, keepdims=True)
        case.q = (q * mag[None, None, :, None]).astype(np.float16)
        case.sm_scale = float(2.0 ** -14)
    else:
        cases.rescale_mla_cache(case, kind, rng)
        case.sm_scale = float(d_qk ** -0.5 * 2.0 ** -8)
    ro, rl = case.reference()
    rows = (np_formats.dequantize_fp8_ds_mla(case.kv_cache) if kv_format == "fp8_ds_mla"
            else np_formats.dequantize_fp8_model1(case.kv_cache))
    vmax = float(np.nanmax(np.abs(rows.reshape(-1, rows.shape[-1])[:, :512])))   # NaN: unselected
    for path in ("triton", "torch"):
        out, lse = _call(case, path)
        got = out.float().cpu().numpy()
        fin = np.isfinite(ro)
        assert np.array_equal(fin, np.isfinite(got)), path
        err = np.abs(got[fin] - ro[fin])
        assert err.max() <= 2.0 ** -10 * vmax + 1e-3, (path, float(err.max()), vmax)
        got_l = lse.cpu().numpy().astype(np.float64)
        assert np.array_equal(np.isfinite(rl), np.isfinite(got_l)), path
        lf = np.isfinite(rl)
        assert (np.abs(got_l[lf] - rl[lf]) <= 1e-6 + 8.01 / 65536 * np.abs(rl[lf])).all(), path


@pytest.mark.parametrize("kv_format,d_qk", FORMATS[1:], ids=[f[0] for f in FORMATS[1:]])
def test_small_scales_beside_masked_rows(kv_format, d_qk):
    """Small scales (2^-13: the tile's shift is 2^19) in blocks holding masked entries: a masked
    row's value stays 0 in the fp16 tile (the H200 run gave NaN for whole requests of the
    fp8_model1 varlen parity cases when masked rows read a scale of 1.0: 1.0 * 2^19 is inf in
    fp16 and 0 * inf NaN in the dot); SPEC tolerances against the reference."""
    case = cases.mla_small_scale_case(kv_format, d_qk, K=96)
    _check(case, *_call(case, "triton"))


def test_gluon_eligibility():
    """The Gluon kernel runs only on sm_90 outside the interpreter, for the fp8 formats with
    16-bit q at their D_qk; anything else runs the Triton kernel."""
    from kernels import hardware
    h200 = hardware.DeviceInfo(name="NVIDIA H200", cc=(9, 0), num_sms=132, smem_per_block=232_448)
    sm120 = hardware.DeviceInfo(name="NVIDIA RTX PRO 6000", cc=(12, 0), num_sms=188,
                                smem_per_block=101_376)
    assert configs.gluon_eligible(h200, "fp8_ds_mla", 576, 2)     # bf16 / fp16 q
    assert configs.gluon_eligible(h200, "fp8_model1", 512, 2)
    assert not configs.gluon_eligible(h200, "fp8_ds_mla", 576, 4)  # fp32 q
    assert not configs.gluon_eligible(h200, "latent", 576, 2)
    assert not configs.gluon_eligible(h200, "fp8_ds_mla", 512, 2)
    assert not configs.gluon_eligible(sm120, "fp8_ds_mla", 576, 2)
    assert not configs.gluon_eligible(hardware.CPU_INTERPRETER, "fp8_ds_mla", 576, 2)
    assert configs.SPARSE_MLA_GLUON in configs.sparse_mla_space(configs.LARGE_SMEM)
    assert configs.SPARSE_MLA_GLUON not in configs.sparse_mla_space(configs.SMALL_SMEM)
    # the warp-specialised kernel: the same rule, exactly sm_90 (not sm_100 / sm_120), and also
    # a latent cache of D_qk 576 with 16-bit q of its dtype (fp32 q, or another cache dtype,
    # gives fp32 dots: operand width 4)
    b200 = hardware.DeviceInfo(name="NVIDIA B200", cc=(10, 0), num_sms=148, smem_per_block=232_448)
    ws = configs.SPARSE_MLA_GLUON_WS
    assert configs.gluon_ws_eligible(h200, "fp8_ds_mla", 576, 2)
    assert configs.gluon_ws_eligible(h200, "fp8_model1", 512, 2)
    assert not configs.gluon_ws_eligible(h200, "fp8_ds_mla", 576, 4)
    assert configs.gluon_ws_eligible(h200, "latent", 576, 2)
    assert not configs.gluon_ws_eligible(h200, "latent", 576, 4)
    assert not configs.gluon_ws_eligible(h200, "latent", 512, 2)
    for fmt, d_qk in (("fp8_ds_mla", 576), ("latent", 576)):
        for dev in (sm120, b200, hardware.CPU_INTERPRETER):
            assert not configs.gluon_ws_eligible(dev, fmt, d_qk, 2)
            assert not configs.kernel_eligible("gluon_ws", dev, fmt, d_qk, 2)
    assert configs.kernel_eligible("triton", sm120, "latent", 576, 4)
    assert ws in configs.sparse_mla_space(configs.LARGE_SMEM)
    assert ws not in configs.sparse_mla_space(configs.SMALL_SMEM)
    for H in (64, 128):
        assert configs.sparse_mla_heuristic(H, configs.LARGE_SMEM, rows=64, topk=2048,
                                            gluon=True) != ws
        assert configs.sparse_mla_heuristic(H, configs.LARGE_SMEM, rows=64, topk=2048,
                                            gluon_ws=True) == ws
    assert configs.sparse_mla_heuristic(32, configs.LARGE_SMEM, rows=64, topk=2048,
                                        gluon_ws=True) == configs.SPARSE_MLA_N16


def test_gluon_ws_latent_layout_rule():
    """The latent warp-specialised kernel copies rows as 16-byte vectors from ``page *
    page_stride + off * D_qk``: rows packed in a page (or one slot a page), page stride and base
    on 16-byte boundaries, 16-bit elements; anything else runs the Triton tile (any strides)."""
    ok = configs.gluon_ws_latent_layout_ok
    P, D = 64, 576
    assert ok(P * D, D, 10, P, D, 1 << 20, 2)                   # contiguous pages
    assert ok((P + 1) * D, D, 10, P, D, 256, 2)                 # padded pages (a pool view)
    assert ok(P * D + 8, D, 10, P, D, 256, 2)                   # 16 more bytes a page
    assert not ok(P * D + 4, D, 10, P, D, 256, 2)               # 8 bytes: rows not 16-aligned
    assert ok(P * D + 4, D, 1, P, D, 256, 2)                    # ... irrelevant for one page
    assert not ok(P * D, D, 10, P, D, 256 + 2, 2)               # base off a 16-byte boundary
    assert not ok(P * (D + 64), D + 64, 10, P, D, 256, 2)       # rows not packed
    assert ok(5 * D + 8, 3 * D, 10, 1, D, 256, 2)               # ... irrelevant at P = 1
    assert not ok(P * D, D, 10, P, D, 256, 4)                   # fp32 (fp32 dots anyway)


def test_gluon_config_substituted_within_the_operand_width():
    """A Gluon config the call cannot run is replaced by a tile of the call's operand width:
    the Triton 64-head tile for 16-bit q, the fp32 space's tile for fp32 q (the 64-head tile
    fed fp32 operands needs 242,688 B of shared memory on the H200 and failed at launch)."""
    from kernels import hardware
    h200 = hardware.DeviceInfo(name="NVIDIA H200", cc=(9, 0), num_sms=132, smem_per_block=232_448)
    kv = torch.zeros((1, 64, 656), dtype=torch.uint8)
    for cfg in (configs.SPARSE_MLA_GLUON, configs.SPARSE_MLA_GLUON_WS):
        q16 = torch.zeros((1, 1, 64, 576), dtype=torch.float16)
        assert tsm._triton_config(h200, q16, kv, "fp8_ds_mla", 64, cfg) == cfg
        assert tsm._triton_config(hardware.CPU_INTERPRETER, q16, kv, "fp8_ds_mla", 64, cfg) \
            == configs.SPARSE_MLA_W64
        q32 = torch.zeros((1, 1, 64, 576), dtype=torch.float32)
        sub = tsm._triton_config(h200, q32, kv, "fp8_ds_mla", 64, cfg)
        assert sub.kernel == "triton" and sub in configs.sparse_mla_space(h200.smem_per_block, 4)
    # a latent cache: the warp-specialised kernel for q of the cache's 16-bit dtype and rows it
    # can copy in place; the Triton 64-head tile for unaligned rows, another dtype, the
    # one-partition Gluon kernel (fp8 only) or another GPU; fp32 q: the fp32 space
    ws, w64 = configs.SPARSE_MLA_GLUON_WS, configs.SPARSE_MLA_W64
    pool = torch.zeros((4, 65, 576), dtype=torch.bfloat16)
    qb = torch.zeros((1, 1, 128, 576), dtype=torch.bfloat16)
    assert tsm._triton_config(h200, qb, pool, "latent", 64, ws) == ws
    assert tsm._triton_config(h200, qb, pool[:, :64], "latent", 64, ws) == ws     # padded pages
    assert tsm._triton_config(h200, qb, pool[:, 1:], "latent", 64, ws) == ws      # +1,152 B
    odd = torch.zeros(4 * 64 * 576 + 4, dtype=torch.bfloat16)[4:].view(4, 64, 576)
    assert tsm._triton_config(h200, qb, odd, "latent", 64, ws) == w64              # base +8 B
    assert tsm._triton_config(h200, qb.half(), pool.half(), "latent", 64, ws) == ws
    assert tsm._triton_config(h200, qb, pool, "latent", 64, configs.SPARSE_MLA_GLUON) == w64
    assert tsm._triton_config(hardware.CPU_INTERPRETER, qb.half(), pool.half(), "latent", 64,
                              ws) == w64
    for q_, kv_ in ((qb, pool.half()), (qb.float(), pool.float()), (qb.float(), pool)):
        sub = tsm._triton_config(h200, q_, kv_, "latent", 64, ws)     # fp32 dots
        assert sub.kernel == "triton" and sub in configs.sparse_mla_space(h200.smem_per_block, 4)


def test_gluon_ws_latent_config_runs_the_triton_tile_elsewhere(monkeypatch):
    """The warp-specialised config on a latent cache where it cannot run (the CPU interpreter,
    or a GPU other than sm_90): the binding launches the Triton 64-head tile instead, with the
    reference's result (fp16 q and cache here, bf16 on a GPU)."""
    if SM90:
        pytest.skip("sm_90 runs the Gluon kernel itself (test_gluon_ws_latent)")
    from kernels.sparse_mla import triton_launch
    ran = []
    launch = triton_launch.launch
    monkeypatch.setattr(triton_launch, "launch",
                        lambda *a, **kw: ran.append(kw["config"]) or launch(*a, **kw))
    qd = "bfloat16" if CUDA else "float16"
    case = cases.make_mla_case(21, B=1, N=1, H=64, K=40, P=16, kv_format="latent", q_dtype=qd,
                               kv_dtype=qd, logical=True, invalid="mix", attn_sink=True)
    out, lse = _impl(case, configs.SPARSE_MLA_GLUON_WS, 2)
    assert ran == [configs.SPARSE_MLA_W64]
    _check(case, out, lse)


_LATENT_LAYOUTS = ("slots", "block_table_tkl_sink", "padded_pages")


@gpu_only
@sm90_only
@pytest.mark.gpu
@pytest.mark.parametrize("variant", [(0, 1), (1, 0)], ids=["default", "safe"])
@pytest.mark.parametrize("layout", _LATENT_LAYOUTS)
@pytest.mark.parametrize("q_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("H", [64, 128])
def test_gluon_ws_latent(H, splits, q_dtype, layout, variant, monkeypatch):
    """The warp-specialised Gluon kernel on a 16-bit latent cache (q of the cache's dtype)
    against the float64 reference: its defaults and the conservative pair ((full-slot protocol
    ``gluon_ws.LATENT_SIGNAL``, P exchange ``LATENT_P_SMEM``) = (0, 1) / (1, 0)), 1 and 3
    splits (final epilogue / partials + combine), H 64 and 128 (two head blocks), every
    invalid-entry kind, plain slots or a block table with topk_length and a sink, and pages read
    in place from a pool with a NaN row more a page; the call must run the Gluon kernel."""
    from kernels.sparse_mla import gluon_ws
    monkeypatch.setattr(gluon_ws, "LATENT_SIGNAL", variant[0])
    monkeypatch.setattr(gluon_ws, "LATENT_P_SMEM", variant[1])
    feats = layout == "block_table_tkl_sink"
    case = cases.make_mla_case(40 + H + splits, B=3, N=2, H=H, K=300, P=64, kv_format="latent",
                               q_dtype=q_dtype, kv_dtype=q_dtype, invalid="mix", logical=feats,
                               topk_length=feats, attn_sink=feats)
    kv = _t(case.kv_cache)
    if layout == "padded_pages":
        pool = torch.full((kv.shape[0], kv.shape[1] + 1, kv.shape[2]), float("nan"),
                          dtype=kv.dtype, device=DEVICE)
        pool[:, : kv.shape[1]] = kv
        kv = pool[:, : kv.shape[1]]
    dev = _common.device_info(torch.device(DEVICE))
    ws = configs.SPARSE_MLA_GLUON_WS
    assert tsm._triton_config(dev, _t(case.q), kv, "latent", case.indices.shape[2], None) == ws
    _check(case, *_impl(case, ws, splits, kv=kv))


@gpu_only
@sm90_only
@pytest.mark.gpu
@pytest.mark.parametrize("variant", [(1, 1), (0, 0)], ids=["s1_psmem", "s0_pconv"])
def test_gluon_ws_latent_mixed_variants(variant, monkeypatch):
    """The two mixed (protocol, P exchange) pairs on one case each (H 128, 3 splits, block
    table, topk_length, sink, every invalid kind), against the float64 reference."""
    from kernels.sparse_mla import gluon_ws
    monkeypatch.setattr(gluon_ws, "LATENT_SIGNAL", variant[0])
    monkeypatch.setattr(gluon_ws, "LATENT_P_SMEM", variant[1])
    case = cases.make_mla_case(61, B=3, N=2, H=128, K=300, P=64, kv_format="latent",
                               q_dtype="bfloat16", kv_dtype="bfloat16", invalid="mix",
                               logical=True, topk_length=True, attn_sink=True)
    _check(case, *_impl(case, configs.SPARSE_MLA_GLUON_WS, 3))


@gpu_only
@sm90_only
@pytest.mark.gpu
@pytest.mark.parametrize("i", range(len(_CORNER_NAMES)), ids=_CORNER_NAMES)
def test_gluon_ws_latent_corners(i):
    """Every SPEC corner case on a bf16 latent cache at H 64 through ``path="triton"``, whose
    plan on the H200 is the warp-specialised Gluon kernel (asserted)."""
    case = cases.mla_corner_cases(7, d_qk=576, H=64, K=64, kv_format="latent", q_dtype="bfloat16",
                                  kv_dtype="bfloat16")[i]
    B, N, H, D = case.q.shape
    _, cfg = tsm.choose_config(_common.device_info(torch.device(DEVICE)), B=B, N=N, H=H,
                               K=case.indices.shape[2], d_qk=D, kv_format="latent")
    assert cfg == configs.SPARSE_MLA_GLUON_WS
    _check(case, *_call(case, "triton"))


_SH_CONFIGS = (configs.SPARSE_MLA_GLUON_SH8, configs.SPARSE_MLA_GLUON_SH16,
               configs.SPARSE_MLA_GLUON_SH16W8, configs.SPARSE_MLA_GLUON_SH32)
_SH_IDS = [f"h{c.block_h}w{c.num_warps}" for c in _SH_CONFIGS]


@gpu_only
@sm90_only
@pytest.mark.gpu
@pytest.mark.parametrize("HN", [8, 16, 32])
def test_gluon_sh_orientations(HN):
    """The two wgmma orientations of the few-heads kernel alone (tests/_gluon_probe.py): ``X .
    q^T`` (X K-major in shared memory) and ``X^T . P`` (the same X as an MN-major operand, P^T
    stored from registers through ``gl.permute``) against torch's fp32 products of the same
    fp16 values. fp16 products are exact in fp32, so only the summation order differs."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _gluon_probe import _orientation_probe_kernel
    g = torch.Generator(device=DEVICE).manual_seed(HN)
    x = torch.randn((64, 64), generator=g, device=DEVICE).half()
    q = torch.randn((HN, 64), generator=g, device=DEVICE).half()
    p = torch.rand((64, HN), generator=g, device=DEVICE).half()
    s = torch.empty((64, HN), dtype=torch.float32, device=DEVICE)
    o = torch.empty((64, HN), dtype=torch.float32, device=DEVICE)
    _orientation_probe_kernel[(1,)](x, q, p, s, o, HN=HN, num_warps=4)
    torch.testing.assert_close(s, x.float() @ q.float().T, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(o, x.float().T @ p.float(), rtol=1e-5, atol=1e-4)


# (config, q dtype): every config with bf16 q, the 16-head one also with fp16 q (fp16 rope values:
# no residual dot), so a GPU run compiles 40 variants, not 64
_SH_CASES = [(c, "bfloat16") for c in _SH_CONFIGS] + [(configs.SPARSE_MLA_GLUON_SH16, "float16")]


@gpu_only
@sm90_only
@pytest.mark.gpu
@pytest.mark.parametrize("cfg,q_dtype", _SH_CASES,
                         ids=[f"{i}-{q[:4]}" for i, (_, q) in zip(_SH_IDS + [_SH_IDS[1]], _SH_CASES)])
@pytest.mark.parametrize("kv_format,d_qk", FP8_FORMATS, ids=[f[0] for f in FP8_FORMATS])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("H,feats", [(8, True), (24, True), (16, False)],
                         ids=["H8-bt_tkl_sink", "H24-bt_tkl_sink", "H16-slots"])
def test_gluon_sh(cfg, q_dtype, kv_format, d_qk, splits, H, feats):
    """The few-heads Gluon kernel (rows on wgmma M, heads on N; kernels/sparse_mla/gluon_small.py)
    on both fp8 formats against the float64 reference: each config of the space with bf16 q (the
    16-head one with fp16 q too), 1 and 3 splits (final epilogue / partials + combine), H below,
    across and at the head block (H 24: a partial second block at 16 heads), every invalid-entry
    kind, plain slots or a block table with topk_length and a sink; the call must run the Gluon
    kernel."""
    case = cases.make_mla_case(80 + H + splits, B=3, N=2, H=H, K=300, P=64, d_qk=d_qk,
                               kv_format=kv_format, q_dtype=q_dtype, invalid="mix", logical=feats,
                               topk_length=feats, attn_sink=feats)
    dev = _common.device_info(torch.device(DEVICE))
    q, kv = _t(case.q), _t(case.kv_cache)
    assert tsm._triton_config(dev, q, kv, kv_format, case.indices.shape[2], cfg) == cfg
    _check(case, *_impl(case, cfg, splits, kv=kv))


@gpu_only
@sm90_only
@pytest.mark.gpu
@pytest.mark.parametrize("kv_format,d_qk", FP8_FORMATS, ids=[f[0] for f in FP8_FORMATS])
def test_gluon_sh_strided_pages_and_corners(kv_format, d_qk):
    """The few-heads kernel (16 heads, 4 warps) reads padded fp8 pages in place (bitwise the
    contiguous cache's result; the 0xFF padding is NaN if read) and gives every SPEC corner case
    of the format (H 16, bf16 q) within tolerance of the float64 reference."""
    cfg = configs.SPARSE_MLA_GLUON_SH16
    case = cases.make_mla_case(14, B=2, N=2, H=16, K=200, P=16, d_qk=d_qk, kv_format=kv_format,
                               q_dtype="bfloat16", logical=True, invalid="mix", topk_length=True,
                               attn_sink=True)
    want = _impl(case, cfg, 2)
    view = _padded_pages(_t(case.kv_cache), kv_format, 656 if kv_format == "fp8_ds_mla" else 48, 1)
    got = _impl(case, cfg, 2, kv=view)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    _check(case, *got)
    for corner in _corners(kv_format, d_qk, "bfloat16"):
        _check(corner, *_impl(corner, cfg, 2))


@gpu_only
@sm90_only
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [configs.SPARSE_MLA_GLUON_SHWS8, configs.SPARSE_MLA_GLUON_SHWS16],
                         ids=["h8", "h16"])
@pytest.mark.parametrize("kv_format,d_qk", FP8_FORMATS, ids=[f[0] for f in FP8_FORMATS])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("H,feats,K", [(8, True, 300), (24, True, 300), (16, False, 96)],
                         ids=["H8-bt_tkl_sink", "H24-bt_tkl_sink", "H16-slots-K96"])
@pytest.mark.parametrize("stage", [0, 1], ids=["gather", "staged"])
def test_gluon_shws(cfg, kv_format, d_qk, splits, H, feats, K, stage, monkeypatch):
    """The warp-specialised few-heads kernel (kernels/sparse_mla/gluon_small_ws.py; its 8-head
    config picked for fp8_model1 up to 8 heads, its 16-head one for fp8_ds_mla at 9..16)
    on both fp8 formats against the float64 reference, bf16 q: both configs, 1 and 3 splits, H
    below, across and at the head block, every invalid-entry kind, plain slots or a block table
    with topk_length and a sink; K 96 in one split (two blocks: one a consumer) and in "3"
    splits (the plan makes two of one block each: consumer 1 gets none and hands over an empty
    state); the call must run the Gluon kernel. Both producers: ``_ws_producer`` and the staged
    one (``gluon_small_ws.RAW_STAGE``). H200 2026-12-05 (ninth session): 24 passed (the first)."""
    from kernels.sparse_mla import gluon_small_ws
    monkeypatch.setattr(gluon_small_ws, "RAW_STAGE", stage)
    case = cases.make_mla_case(90 + H + splits, B=3, N=2, H=H, K=K, P=64, d_qk=d_qk,
                               kv_format=kv_format, q_dtype="bfloat16", invalid="mix",
                               logical=feats, topk_length=feats, attn_sink=feats)
    dev = _common.device_info(torch.device(DEVICE))
    q, kv = _t(case.q), _t(case.kv_cache)
    assert tsm._triton_config(dev, q, kv, kv_format, case.indices.shape[2], cfg) == cfg
    _check(case, *_impl(case, cfg, splits, kv=kv))


@pytest.mark.parametrize("kv_format,d_qk", FORMATS, ids=[f[0] for f in FORMATS])
@pytest.mark.parametrize("H,feats,splits,block_k", [(8, True, 3, 64), (24, False, 1, 32)],
                         ids=["H8-bt_tkl_sink-3splits-k64", "H24-slots-1split-k32"])
def test_rows_on_m_orientation(kv_format, d_qk, H, feats, splits, block_k):
    """The split kernel's ``ROWS_M`` orientation (config ``kernel="triton_rows"``: the gathered
    rows on the dots' M axis, the heads on N, the softmax along axis 0, the accumulators
    ``[64, heads]`` transposed for the stores: the few-heads Gluon kernel's algorithm in plain
    Triton, so it also runs in the interpreter) against the float64 reference, every format,
    a partial head block and one of several, 1 and 3 splits. Not in any config space (its AOT
    counts are no better than the heads-on-M tile's: bench/NOTES.md); on a GPU it tells a
    failure of the few-heads kernel's algorithm from one of its Gluon mechanics."""
    cfg = configs.SparseMLAConfig(16, block_k, 4, 1, prefetch=True, kernel="triton_rows")
    qd = "bfloat16" if CUDA else "float16"
    case = cases.make_mla_case(90 + H + splits, B=2, N=2, H=H, K=100,
                               P=61 if kv_format == "latent" else 64, d_qk=d_qk,
                               kv_format=kv_format, q_dtype=qd,
                               kv_dtype=qd if kv_format == "latent" else "float32", invalid="mix",
                               logical=feats, topk_length=feats, attn_sink=feats)
    _check(case, *_impl(case, cfg, splits))


def test_gluon_sh_rules():
    """Where the few-heads kernel runs and what replaces it: exactly sm_90 with 16-bit q on an
    fp8 cache (not latent, not fp32 q, not sm_120 or the interpreter); elsewhere the binding
    runs the heuristic's Triton tile for the call's heads (never the 64-head tile); the
    heuristic picks it only when told (``gluon_sh``: the registry passes it for the formats of
    ``configs.GLUON_SH_PICKED``, both fp8 formats since the 2026-12-05 sweep), by heads: 8 ->
    8-head blocks, 9..16 -> 16; 17..32 (the 32-head config, not timed) and more heads -> not
    this kernel; the registry plans it for the picked formats on the H200."""
    from kernels import hardware
    h200 = hardware.DeviceInfo(name="NVIDIA H200", cc=(9, 0), num_sms=132, smem_per_block=232_448)
    sm120 = hardware.DeviceInfo(name="NVIDIA RTX PRO 6000", cc=(12, 0), num_sms=188,
                                smem_per_block=101_376)
    for fmt, d_qk in FP8_FORMATS:
        assert configs.kernel_eligible("gluon_sh", h200, fmt, d_qk, 2)
        assert not configs.kernel_eligible("gluon_sh", h200, fmt, d_qk, 4)
        for dev in (sm120, hardware.CPU_INTERPRETER):
            assert not configs.kernel_eligible("gluon_sh", dev, fmt, d_qk, 2)
    assert not configs.kernel_eligible("gluon_sh", h200, "latent", 576, 2)
    for cfg in _SH_CONFIGS:
        assert cfg in configs.sparse_mla_space(configs.LARGE_SMEM)
        assert cfg not in configs.sparse_mla_space(configs.SMALL_SMEM)
    kv = torch.zeros((1, 64, 656), dtype=torch.uint8)
    q16 = torch.zeros((2, 1, 16, 576), dtype=torch.float16)
    assert tsm._triton_config(h200, q16, kv, "fp8_ds_mla", 2048, configs.SPARSE_MLA_GLUON_SH16) \
        == configs.SPARSE_MLA_GLUON_SH16
    sub = tsm._triton_config(hardware.CPU_INTERPRETER, q16, kv, "fp8_ds_mla", 2048,
                             configs.SPARSE_MLA_GLUON_SH16)
    assert sub == configs.sparse_mla_heuristic(16, hardware.CPU_INTERPRETER.smem_per_block, 2,
                                               rows=2, topk=2048)
    assert sub.kernel == "triton" and sub.block_h == 16
    sub32 = tsm._triton_config(h200, q16.float(), kv, "fp8_ds_mla", 2048,
                               configs.SPARSE_MLA_GLUON_SH16)             # fp32 dots
    assert sub32.kernel == "triton" and sub32 in configs.sparse_mla_space(h200.smem_per_block, 4)
    pick = lambda H: configs.sparse_mla_heuristic(H, configs.LARGE_SMEM, rows=64, topk=2048,
                                                  gluon=True, gluon_ws=True, gluon_sh=True)
    assert configs.GLUON_SH_PICKED_MAX_HEADS == 16
    assert [pick(H) for H in (1, 8, 9, 16)] == [
        configs.SPARSE_MLA_GLUON_SH8] * 2 + [configs.SPARSE_MLA_GLUON_SH16] * 2
    assert all(pick(H).kernel == "triton" for H in (17, 32))
    assert configs.gluon_sh_config(17) == configs.gluon_sh_config(32) == configs.SPARSE_MLA_GLUON_SH32
    assert pick(64) == configs.SPARSE_MLA_GLUON_WS
    from kernels.registry import REGISTRY
    assert set(configs.GLUON_SH_PICKED) == {"fp8_ds_mla", "fp8_model1"}
    # the warp-specialised configs where picked: 16 heads of fp8_ds_mla (GLUON_SHWS16_PICKED),
    # 8 of fp8_model1 (GLUON_SHWS_PICKED)
    for fmt, d_qk, H, want in (("fp8_ds_mla", 576, 16, configs.SPARSE_MLA_GLUON_SHWS16),
                               ("fp8_ds_mla", 576, 8, configs.SPARSE_MLA_GLUON_SH8),
                               ("fp8_model1", 512, 16, configs.SPARSE_MLA_GLUON_SH16),
                               ("fp8_model1", 512, 8, configs.SPARSE_MLA_GLUON_SHWS8)):
        shape = dict(B=64, N=1, H=H, K=2048, d_qk=d_qk, kv_format=fmt)
        assert REGISTRY.heuristic("sparse_mla_decode", "torch", "triton", h200, **shape) == \
            want.to_dict()
    assert configs.sparse_mla_heuristic(16, configs.LARGE_SMEM, rows=64, topk=2048, gluon=True,
                                        gluon_ws=True) == configs.SPARSE_MLA_N16   # not told
    assert configs.sparse_mla_heuristic(16, configs.SMALL_SMEM, gluon_sh=True).kernel == "triton"
    # the split plan's residency equals the AOT counts' (tests/test_triton_compile.py): 2 CTAs an
    # SM at 4 warps, 1 at 8; B 64 H 16 K 2048 -> 4 splits (256 CTAs, 8 blocks each) at 16 heads
    # a program; V4 B 64 H 8 K 640 -> 4 at 8 heads (bench/NOTES.md "Small heads: rows on wgmma M")
    ctas = {cfg: configs.sparse_mla_ctas_per_sm(cfg, configs.LARGE_SMEM) for cfg in _SH_CONFIGS}
    assert [ctas[c] for c in _SH_CONFIGS] == [2, 2, 1, 1]
    sh16, sh8 = configs.SPARSE_MLA_GLUON_SH16, configs.SPARSE_MLA_GLUON_SH8
    assert configs.sparse_mla_num_splits(64, 2048, 64, 132, ctas_per_sm=ctas[sh16]) == 4
    assert configs.sparse_mla_num_splits(64, 640, 64, 132, ctas_per_sm=ctas[sh8]) == 4
    # a register cap (ptxas .maxnreg) counts in the residency: 8 warps at 128 registers, 2 CTAs
    # an SM, so B 64 H 16 K 2048 plans 4 splits as the 4-warp tile; the dict keeps the field
    # only when set, and the dispatch-table round trip refuses it (a sweep-only config)
    r128 = configs.SPARSE_MLA_GLUON_SH16W8R128
    assert configs.sparse_mla_ctas_per_sm(r128, configs.LARGE_SMEM) == 2
    assert configs.sparse_mla_num_splits(64, 2048, 64, 132, ctas_per_sm=2) == 4
    assert r128.to_dict()["maxnreg"] == 128 and "maxnreg" not in sh16.to_dict()
    assert configs.SparseMLAConfig(**r128.to_dict()) == r128
    assert configs.sparse_mla_from_dict(r128.to_dict(), configs.LARGE_SMEM) is None
    assert configs.sparse_mla_from_dict(sh16.to_dict(), configs.LARGE_SMEM) == sh16


def test_gluon_shws_rules():
    """The warp-specialised few-heads kernel's pick: its 8- and 16-head configs are in the sm_90
    space only; the heuristic picks the 8-head one only when told both ``gluon_sh`` and
    ``gluon_shws`` (the registry: formats of ``configs.GLUON_SHWS_PICKED``, fp8_model1 since the
    2026-12-05 H200 sweep: V4 B 64 H 8 22.3 vs 28.7 us) and only up to 8 heads, the 16-head one
    only when told ``gluon_sh`` and ``gluon_shws16`` (formats of ``configs.GLUON_SHWS16_PICKED``,
    fp8_ds_mla since the 2026-12-06 H100 sweep with the producer's L2 hint: V3.2 B 64 H 16 61.6 vs
    70.8 us) and only at 9..16 heads; ``few_heads_config`` (the dispatch-table rewrite's rule)
    agrees; one CTA an SM (its shared memory), so V4 B 64 H 8 K 640 and V3.2 B 64 H 16 K 2048 plan
    2 splits (128 CTAs: the sweeps' timed plans); on sm_120 and in the interpreter the binding
    runs the Triton tile for the call's heads."""
    from kernels import hardware
    ws8, ws16 = configs.SPARSE_MLA_GLUON_SHWS8, configs.SPARSE_MLA_GLUON_SHWS16
    for ws in (ws8, ws16):
        assert ws in configs.sparse_mla_space(configs.LARGE_SMEM)
        assert ws not in configs.sparse_mla_space(configs.SMALL_SMEM)
        assert configs.sparse_mla_from_dict(ws.to_dict(), configs.LARGE_SMEM) == ws
    pick = lambda H, **kw: configs.sparse_mla_heuristic(H, configs.LARGE_SMEM, rows=64, topk=640,
                                                        gluon=True, gluon_ws=True, **kw)
    assert configs.GLUON_SHWS_PICKED_MAX_HEADS == 8
    assert [pick(H, gluon_sh=True, gluon_shws=True) for H in (1, 8, 9, 16)] == \
        [ws8, ws8, configs.SPARSE_MLA_GLUON_SH16, configs.SPARSE_MLA_GLUON_SH16]
    assert [pick(H, gluon_sh=True, gluon_shws16=True) for H in (1, 8, 9, 16)] == \
        [configs.SPARSE_MLA_GLUON_SH8, configs.SPARSE_MLA_GLUON_SH8, ws16, ws16]
    assert pick(17, gluon_sh=True, gluon_shws16=True).kernel == "triton"   # past the few heads
    assert [pick(H, gluon_sh=True, gluon_shws=True, gluon_shws16=True) for H in (8, 16)] == \
        [ws8, ws16]
    assert pick(16, gluon_shws16=True).kernel != "gluon_shws"              # gluon_sh off
    assert set(configs.GLUON_SHWS16_PICKED) == {"fp8_ds_mla"}
    assert configs.few_heads_config(16, "fp8_ds_mla") == ws16
    assert configs.few_heads_config(12, "fp8_ds_mla") == ws16
    assert configs.few_heads_config(8, "fp8_ds_mla") == configs.SPARSE_MLA_GLUON_SH8
    assert configs.few_heads_config(16, "fp8_ds_mla", shws16_formats=()) == \
        configs.SPARSE_MLA_GLUON_SH16
    assert configs.sparse_mla_ctas_per_sm(ws16, configs.LARGE_SMEM) == 1
    assert configs.sparse_mla_num_splits(64, 2048, 64, 132, ctas_per_sm=1) == 2
    assert pick(8, gluon_sh=True) == configs.SPARSE_MLA_GLUON_SH8          # not told
    assert pick(8, gluon_shws=True).kernel == "triton"                     # gluon_sh off
    assert configs.sparse_mla_heuristic(8, configs.SMALL_SMEM, gluon_sh=True,
                                        gluon_shws=True).kernel == "triton"
    assert set(configs.GLUON_SHWS_PICKED) == {"fp8_model1"}
    assert configs.few_heads_config(8, "fp8_model1") == ws8
    assert configs.few_heads_config(8, "fp8_ds_mla") == configs.SPARSE_MLA_GLUON_SH8
    assert configs.few_heads_config(8, "fp8_ds_mla", ("fp8_ds_mla",)) == ws8
    assert configs.few_heads_config(16, "fp8_model1") == configs.SPARSE_MLA_GLUON_SH16
    assert configs.few_heads_config(8, "fp8_model1", ()) == configs.SPARSE_MLA_GLUON_SH8
    assert configs.sparse_mla_ctas_per_sm(ws8, configs.LARGE_SMEM) == 1
    assert configs.sparse_mla_num_splits(64, 640, 64, 132, ctas_per_sm=1) == 2
    sm120 = hardware.DeviceInfo(name="NVIDIA RTX PRO 6000", cc=(12, 0), num_sms=188,
                                smem_per_block=101_376)
    kv = torch.zeros((1, 37_440), dtype=torch.uint8)          # one fp8_model1 page of 64 rows
    q8 = torch.zeros((2, 1, 8, 512), dtype=torch.float16)
    for dev in (sm120, hardware.CPU_INTERPRETER):
        assert not configs.kernel_eligible("gluon_shws", dev, "fp8_model1", 512, 2)
        sub = tsm._triton_config(dev, q8, kv, "fp8_model1", 640, ws8)
        assert sub.kernel == "triton" and sub in configs.sparse_mla_space(dev.smem_per_block)


# ============================================================================ combine

def test_combine_matches_float64_merge():
    """The split-K combine against a float64 LSE merge: 5 splits (one split empty for every
    head, one head empty in every split, a NaN partial in one head); the sink applied once; LSE
    natural log, -inf for the empty head, NaN for the NaN head."""
    from kernels.sparse_mla import triton_launch as tl_
    S, BN, H, D = 5, 1, 24, 512
    g = np.random.default_rng(3)
    po = g.standard_normal((S, BN, H, D)).astype(np.float32)
    pl = (g.standard_normal((S, BN, H)) * 4).astype(np.float32)
    pl[2] = -np.inf                                   # an empty split
    pl[:, :, 5] = -np.inf                             # a head with no valid entry anywhere
    pl[3, 0, 7] = np.nan                              # a NaN partial
    sink = g.standard_normal(H).astype(np.float32)
    out = torch.empty((BN, H, D), dtype=torch.float32, device=DEVICE)
    lse = torch.empty((BN, H), dtype=torch.float32, device=DEVICE)
    tl_._launch_combine(_t(po), _t(pl), _t(sink), out, lse, D)
    l64 = pl.astype(np.float64)
    with np.errstate(invalid="ignore"):
        m = np.max(l64, axis=0)
        ms = np.where(np.isfinite(m), m, 0.0)
        w = np.exp2(l64 - ms)
        den = w.sum(axis=0)
        ref = np.einsum("sbh,sbhd->bhd", w, po.astype(np.float64)) / np.where(den > 0, den, 1)[..., None]
        ref_lse = np.where(den > 0, (ms + np.log2(np.where(den > 0, den, 1))) * np.log(2), -np.inf)
        ref_lse = np.where(np.isnan(m), np.nan, ref_lse)
        ref = ref * (1 / (1 + np.exp(sink[None, :] - ref_lse)))[..., None]
    ref[:, 5] = 0.0
    o, l_ = out.cpu().numpy(), lse.cpu().numpy()
    assert np.isneginf(l_[0, 5]) and np.all(o[0, 5] == 0)
    assert np.isnan(l_[0, 7]) and np.all(np.isnan(o[0, 7]))
    keep = [h for h in range(H) if h not in (5, 7)]
    np.testing.assert_allclose(l_[0, keep], ref_lse[0, keep], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(o[0, keep], ref[0, keep], rtol=1e-5, atol=1e-6)


@gpu_only
@sm90_only
@pytest.mark.gpu
def test_cluster_primitives():
    """The crossover kernel's building blocks alone (``gluon_cluster.cluster_selftest``: the
    cluster launch, the offsets read off the PTX, the half-tile stores, the bulk copy into the
    peer completing on its mbarrier, the remote arrive): every CTA of 8 clusters holds its
    cluster's whole tile, bit for bit."""
    from kernels.sparse_mla import gluon_cluster
    res = gluon_cluster.cluster_selftest(clusters=8)
    assert res["ok"], res


def test_cluster_launch_refuses_an_odd_grid():
    """Clusters of two along grid axis 0: an odd grid[0] is refused before anything compiles
    or launches."""
    from kernels.sparse_mla import gluon_cluster
    with pytest.raises(ValueError, match="multiple of the cluster size 2, got 3"):
        gluon_cluster.launch(gluon_cluster._cluster_selftest_kernel, (3,), (), {}, 3,
                             gluon_cluster._selftest_offsets)


def _cluster_case(seed, fmt, q_dtype, H, feats, cfg):
    """A case for the crossover kernels (B 3, N 2, K 300: 5 blocks a split at one split), every
    invalid-entry kind, the block table / topk_length / sink or plain slots (``feats``), and
    ``cfg`` checked to be what the binding runs for it on this GPU. Returns (case, cfg)."""
    dqk = 512 if fmt == "fp8_model1" else 576
    case = cases.make_mla_case(seed, B=3, N=2, H=H, K=300, P=64, d_qk=dqk, kv_format=fmt,
                               q_dtype=q_dtype, invalid="mix", logical=feats, topk_length=feats,
                               attn_sink=feats)
    dev = _common.device_info(torch.device(DEVICE))
    assert tsm._triton_config(dev, _t(case.q), _t(case.kv_cache), fmt, 300, cfg) == cfg
    return case, cfg


def _cluster_grid(fn):
    """The crossover kernels' GPU grid: splits 1 / 3, block table + topk_length + sink or plain
    slots, H 128 (one cluster a request) or 100 (28 heads of the pair's second CTA masked)."""
    for mark in (pytest.mark.parametrize("H", [128, 100]),
                 pytest.mark.parametrize("feats", [True, False], ids=["block_table_tkl_sink", "slots"]),
                 pytest.mark.parametrize("splits", [1, 3]), pytest.mark.gpu, sm90_only, gpu_only):
        fn = mark(fn)
    return fn


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_model1"])
@_cluster_grid
def test_gluon_xo(fmt, H, feats, splits):
    """The crossover kernel (two 64-head CTAs of a cluster, each converting half of every row
    block) against the float64 reference, and bitwise against the warp-specialised kernel it
    shares its numerics with (same units, conversion and dots: only who converts which rows
    changes); H 100 masks 28 heads of the pair's second CTA; every invalid-entry kind."""
    case, xo = _cluster_case(70 + H + splits, fmt, "bfloat16", H, feats,
                             configs.SPARSE_MLA_GLUON_XO)
    out, lse = _impl(case, xo, splits)
    _check(case, out, lse)
    ws_out, ws_lse = _impl(case, configs.SPARSE_MLA_GLUON_WS, splits)
    assert torch.equal(out, ws_out) and torch.equal(lse, ws_lse)


@gpu_only
@sm90_only
@pytest.mark.gpu
@pytest.mark.parametrize("i", range(len(_CORNER_NAMES)), ids=_CORNER_NAMES)
@pytest.mark.parametrize("kernel", ["gluon_xo", "gluon_xs"])
def test_gluon_cluster_corners(kernel, i):
    """Every SPEC corner case (fp8_ds_mla, H 128: one cluster a request) on the crossover
    kernel and its seesaw twin, against the float64 reference."""
    case = cases.mla_corner_cases(7, d_qk=576, H=128, K=64, kv_format="fp8_ds_mla",
                                  q_dtype="bfloat16")[i]
    cfg = {"gluon_xo": configs.SPARSE_MLA_GLUON_XO, "gluon_xs": configs.SPARSE_MLA_GLUON_XS}[kernel]
    _check(case, *_impl(case, cfg, 2))


@pytest.mark.parametrize("q_dtype", ["bfloat16", "float16"])
@_cluster_grid
def test_gluon_xs(q_dtype, H, feats, splits):
    """The crossover kernel with the seesaw consumer (fp8_ds_mla; two consumer warpgroups
    owning alternate row blocks) against the float64 reference, and against the
    warp-specialised kernel: its units, conversion and dots are the same, its row sums and the
    rope dot's addition run in another order, so the two agree to float32 rounding, not bitwise:
    LSE within 1e-5, outputs (16-bit) within 1e-2 of the largest (a few units in the last place
    of a 16-bit output), both far inside SPEC's bounds (passed on an H100, 2026-12-06:
    docs/logs/tests_mla_gluon_xo_xs_h100_20261206_partial.log).
    K 300 is 5 blocks a split at splits 1 (the odd count that leaves warpgroup 1 a last step
    with only the other's block), 2 at splits 3."""
    case, xs = _cluster_case(90 + H + splits, "fp8_ds_mla", q_dtype, H, feats,
                             configs.SPARSE_MLA_GLUON_XS)
    out, lse = _impl(case, xs, splits)
    _check(case, out, lse)
    ws_out, ws_lse = _impl(case, configs.SPARSE_MLA_GLUON_WS, splits)
    fin = torch.isfinite(ws_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert torch.allclose(lse[fin], ws_lse[fin], rtol=1e-5, atol=1e-5)
    scale = ws_out.float().abs().amax().clamp_min(1e-30)
    assert float((out.float() - ws_out.float()).abs().max()) <= 1e-2 * scale


def test_gluon_xs_config_substitution(monkeypatch):
    """The seesaw config where it cannot run: an odd number of 64-head blocks, or a Triton other
    than the one the cluster kernels are written for (3.6; ``gluon_cluster``), runs the
    warp-specialised kernel; fp8_model1 (its P has no dead rope chunk to live in) and fp32 q
    get the Triton 64-head tile; the interpreter the Triton tile."""
    from kernels import hardware
    from kernels.sparse_mla import gluon_cluster
    assert [gluon_cluster.cluster_kernels_supported(v) for v in ("3.6.0", "3.6", "3.9.0", "3.60.1")] \
        == [True, True, False, False]
    xs, ws = configs.SPARSE_MLA_GLUON_XS, configs.SPARSE_MLA_GLUON_WS
    h200 = hardware.DeviceInfo(name="NVIDIA H200", cc=(9, 0), num_sms=132, smem_per_block=232_448)
    q128 = torch.zeros(1, 1, 128, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 656, dtype=torch.uint8)
    monkeypatch.setattr(tsm, "_cluster_kernels_supported", lambda: False)
    assert tsm._triton_config(h200, q128, kv, "fp8_ds_mla", 64, xs) == ws
    monkeypatch.setattr(tsm, "_cluster_kernels_supported", lambda: True)
    assert tsm._triton_config(h200, q128, kv, "fp8_ds_mla", 64, xs) == xs
    assert tsm._triton_config(h200, q128[:, :, :64], kv, "fp8_ds_mla", 64, xs) == ws
    q512 = torch.zeros(1, 1, 128, 512, dtype=torch.bfloat16)
    assert tsm._triton_config(h200, q512, torch.zeros(4, 64 * 584, dtype=torch.uint8),
                              "fp8_model1", 64, xs).kernel == "triton"
    assert tsm._triton_config(h200, q128.float(), kv, "fp8_ds_mla", 64, xs).kernel == "triton"
    assert tsm._triton_config(hardware.CPU_INTERPRETER, q128.half(), kv, "fp8_ds_mla", 64,
                              xs).kernel == "triton"


def test_gluon_xo_config_substitution(monkeypatch):
    """The crossover config where its clusters cannot form: an odd number of 64-head blocks
    runs the warp-specialised kernel (then its own rules: on the CPU interpreter the Triton
    64-head tile); on the interpreter every H gets the Triton tile (no Gluon). With the Triton
    the cluster kernels are written for (stubbed here: the CPU's may be another)."""
    from kernels import hardware
    monkeypatch.setattr(tsm, "_cluster_kernels_supported", lambda: True)
    xo, ws = configs.SPARSE_MLA_GLUON_XO, configs.SPARSE_MLA_GLUON_WS
    assert [configs.gluon_xo_heads_ok(h) for h in (64, 65, 100, 128, 129, 192, 256)] == \
        [False, True, True, True, False, False, True]
    h200 = hardware.DeviceInfo(name="NVIDIA H200", cc=(9, 0), num_sms=132, smem_per_block=232_448)
    q128 = torch.zeros(1, 1, 128, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 656, dtype=torch.uint8)
    assert tsm._triton_config(h200, q128, kv, "fp8_ds_mla", 64, xo) == xo
    assert tsm._triton_config(h200, q128[:, :, :64], kv, "fp8_ds_mla", 64, xo) == ws
    assert tsm._triton_config(h200, q128.float(), kv, "fp8_ds_mla", 64, xo).kernel == "triton"
    assert tsm._triton_config(hardware.CPU_INTERPRETER, q128.half(), kv, "fp8_ds_mla", 64,
                              xo).kernel == "triton"
