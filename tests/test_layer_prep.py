"""The decode layer's fused step preparation (``kernels/layer_prep/triton.py`` through
``torch_impl.layer.prepare_x`` / ``prepare_q`` / ``rope_out``, and
``DSADecodeLayer(fused_prep=...)``) against
the composite torch ops (the ops' ``path="torch"``: the layer's own code, per stage) and against
float64 math (``kernels.layer_reference``'s rope / norms / Hadamard, the NumPy writers).

Bounds, and why: the kernels round where the composite rounds (docs/SEMANTICS.md "Decode
layer"), but sum the norms and the Hadamard products in another order, so a dt value may sit
one dt ulp away (:data:`DT_REL`) and a quantised byte one e4m3 step away (rel 2^-3, the layer's
``CACHE_REL_FP8``) from the composite's and the float64 value's; bytes of rows the step must not
write, and of unmapped new tokens, are compared bit for bit. On a CPU machine the kernels run in
the Triton interpreter (fp32 / fp16); on a GPU the real-dimension test runs bf16 and the
GPU-only layer test at the end is added.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from kernels import compare, formats, layer_compare, layer_reference as lref
from torch_impl._common import as_tensor
from torch_impl.layer import (DSADecodeLayer, FUSED_PREP_ENV, fused_prep_default, prepare_q, prepare_x,
                              rope_out)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

V32, V4 = lref.DSV32_LAYER.scaled_down(), lref.DSV4_FLASH_LAYER.scaled_down()
DT_REL = {torch.float32: 2.0 ** -21, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
"""A value rounded to dt where the composite rounds, from float32 math summed in another
order: within two ulps of dt (relative), or ~4e-7 absolute for values near zero."""
E4M3_REL = layer_compare.CACHE_REL_FP8

# (cfg, kv_format, N, dtype, latent cache dtype, scale_fmt, unmapped new tokens)
CASES = {
    "v32_ds_mla_fp32_N1": (V32, "fp8_ds_mla", 1, torch.float32, None, "ue8m0", False),
    "v32_latent_fp16_N2_amax": (V32, "latent", 2, torch.float16, torch.float16, None, True),
    "v4_model1_fp16_N2": (V4, "fp8_model1", 2, torch.float16, None, "ue8m0", True),
    "v4_latent_fp32_N1_amax": (V4, "latent", 1, torch.float32, torch.float32, None, False),
}


@dataclasses.dataclass
class Stage:
    """Inputs of one step's two preparation ops (torch tensors on DEVICE) and what the float64
    math needs (``w`` the weights, ``pos`` [T] positions, ``slots`` [T] with -1 unmapped)."""

    cfg: lref.LayerConfig
    kv_format: str
    N: int
    scale_fmt: str | None
    x: dict
    pos: np.ndarray
    slots: np.ndarray


def _stage(name: str, seed: int = 0) -> Stage:
    """B = 3 requests of N new tokens, P = 16, 4 table columns over 14 pages (one stale); with
    ``unmapped``, request 1's new token has page entry -1 and request 2's one that wraps int32
    when multiplied by P (2^28 + 1: page 1 if it wrapped)."""
    cfg, fmt, N, dt, cache_dt, sf, unmapped = CASES[name]
    cfg = dataclasses.replace(cfg, scale_fmt=sf)
    rng = np.random.default_rng(seed)
    B, P, max_pages, num_pages = 3, cfg.page_size, 4, 14
    T, H, H_I, D_I, r = B * N, cfg.num_heads, cfg.index_heads, cfg.index_head_dim, cfg.d_rope
    bt = rng.permutation(num_pages)[:B * max_pages].reshape(B, max_pages).astype(np.int32)
    cl = np.array([max_pages * P - 3 - 17 * b for b in range(B)], np.int32)
    if unmapped:
        bt[1, (cl[1] - N) // P] = -1
        bt[2, (cl[2] - N) // P] = 2 ** 28 + 1
    pos = (cl.astype(np.int64)[:, None] - N + np.arange(N)).reshape(-1)
    slots = formats.logical_to_slot(pos.reshape(B, N), bt, P).reshape(-1)
    slots = np.where((slots >= 0) & (slots < num_pages * P), slots, -1)
    norm_shapes = {k: v for k, v in lref.weight_shapes(cfg).items() if "norm" in k}   # init_weights' rule
    w = {k: (1.0 + 0.1 * rng.standard_normal(v) if not k.endswith("bias") else 0.1 * rng.standard_normal(v))
         .astype(np.float32) for k, v in norm_shapes.items()}
    kv_w = w["kv_norm"]

    def act(*shape):
        return torch.tensor(rng.standard_normal(shape), dtype=dt, device=DEVICE)

    lat = rng.standard_normal((num_pages, P, cfg.d_qk)).astype(np.float32)
    if fmt == "latent":
        kv = torch.tensor(lat, dtype=cache_dt, device=DEVICE)
    else:
        kv = as_tensor(formats.quantize_kv(lat, fmt), DEVICE)
    kc = as_tensor(formats.quantize_fp8_indexer(rng.standard_normal((num_pages, P, D_I)).astype(np.float32), sf),
                   DEVICE)
    q_cols = H * (cfg.qk_nope_head_dim + r) if cfg.absorbed else H * cfg.d_qk
    x = dict(xq=act(T, cfg.q_lora_rank), xkv=act(T, cfg.d_qk), xk=act(T, D_I) * 2 + 0.5,
             x=act(T, cfg.hidden), iq=act(T, H_I * D_I), q=act(T, q_cols),
             q_lat=act(H, T, cfg.kv_lora_rank) if cfg.absorbed else None,
             w_raw=torch.tensor(rng.standard_normal((T, H_I)) / H_I, dtype=torch.float32, device=DEVICE),
             kv_cache=kv, k_cache=kc, block_table=as_tensor(bt, DEVICE), context_lens=as_tensor(cl, DEVICE),
             q_norm=as_tensor(w["q_norm"], DEVICE), kv_norm=as_tensor(kv_w, DEVICE),
             k_norm_w=as_tensor(w["indexer.k_norm.weight"], DEVICE),
             k_norm_b=as_tensor(w["indexer.k_norm.bias"], DEVICE),
             rope_freqs=torch.tensor(lref.rope_freqs(cfg), dtype=torch.float64, device=DEVICE),
             hadamard=torch.tensor(np.sign(lref.hadamard_matrix(D_I)), dtype=dt, device=DEVICE))
    return Stage(cfg, fmt, N, sf, x, pos, slots)


def _run_x(st: Stage, path: str):
    a = st.x
    kv, kc = a["kv_cache"].clone(), a["k_cache"].clone()
    qr, x32 = prepare_x(a["xq"], a["xkv"], a["xk"], a["x"], a["q_norm"], a["kv_norm"], a["k_norm_w"],
                        a["k_norm_b"], a["rope_freqs"], a["hadamard"], kv, kc, a["block_table"],
                        a["context_lens"], st.N, st.kv_format, page_size=st.cfg.page_size,
                        scale_fmt=st.scale_fmt, eps=st.cfg.eps, norm_rope=not st.cfg.absorbed, path=path)
    return qr, x32, kv, kc


def _run_q(st: Stage, path: str, part: str = "all"):
    a, cfg = st.x, st.cfg
    return prepare_q(a["iq"], a["w_raw"], a["q"], a["q_lat"], a["hadamard"], a["rope_freqs"],
                     a["context_lens"], st.N, heads=cfg.num_heads, index_heads=cfg.index_heads,
                     d_qk=cfg.d_qk, qk_nope=cfg.qk_nope_head_dim if cfg.absorbed else 0,
                     scale_fmt=st.scale_fmt, eps=cfg.eps, absorbed=cfg.absorbed,
                     q_head_norm=cfg.q_head_norm, path=path, part=part)


def _np(t):
    return compare.to_numpy(t).astype(np.float64)


# ---------------------------------------------------------------- float64 math of the stages

def _angles(st: Stage):
    return st.pos.astype(np.float64)[:, None] * lref.rope_freqs(st.cfg)             # [T, r/2]


_NP_DT = {torch.float32: np.float32, torch.float16: np.float16}


def _rd(x, dt):
    """float64 ``x`` rounded to the layer dtype ``dt`` (bf16 through torch) and back."""
    if dt == torch.bfloat16:
        return torch.tensor(x, dtype=torch.float64).bfloat16().double().numpy()
    return np.asarray(x).astype(_NP_DT[dt]).astype(np.float64)


def _ref_x(st: Stage):
    """(qr, latent rows [T, D_qk], indexer keys after the Hadamard [T, D_I]): float64 math from
    the dt inputs, rounded to dt where the layer stores dt (docs/SEMANTICS.md "Decode layer")."""
    cfg, a = st.cfg, st.x
    dt = a["xq"].dtype
    ang, r = _angles(st), cfg.d_rope
    qr = _rd(lref._rmsnorm(_np(a["xq"]), _np(a["q_norm"]), cfg.eps), dt)
    kv = _np(a["xkv"])
    if cfg.absorbed:
        C = cfg.kv_lora_rank
        latent = np.concatenate([lref._rmsnorm(kv[:, :C], _np(a["kv_norm"]), cfg.eps),
                                 lref._rope(kv[:, C:], ang, interleaved=True)], axis=-1)
    else:
        n = lref._rmsnorm(kv, _np(a["kv_norm"]), cfg.eps)
        latent = np.concatenate([n[:, :-r], lref._rope(n[:, -r:], ang, interleaved=True)], axis=-1)
    k = lref._layernorm(_np(a["xk"]), _np(a["k_norm_w"]), _np(a["k_norm_b"]), cfg.eps)
    k = _rd(np.concatenate([lref._rope(k[:, :r], ang, interleaved=False), k[:, r:]], axis=-1), dt)
    return qr, _rd(latent, dt), _rd(k @ lref.hadamard_matrix(cfg.index_head_dim), dt)


def _ref_q(st: Stage):
    """(q_mla [T, H, D_qk], indexer q after the Hadamard [T, H_I, D_I]): float64 math, rounded
    to dt where the layer stores dt."""
    cfg, a = st.cfg, st.x
    dt = a["iq"].dtype
    ang, r, H = _angles(st)[:, None], cfg.d_rope, cfg.num_heads
    T = st.pos.shape[0]
    iq = _np(a["iq"]).reshape(T, cfg.index_heads, -1)
    iq = _rd(np.concatenate([lref._rope(iq[..., :r], ang, interleaved=False), iq[..., r:]], axis=-1), dt)
    q = _np(a["q"]).reshape(T, H, -1)
    if cfg.absorbed:
        q_mla = np.concatenate([_np(a["q_lat"]).transpose(1, 0, 2),
                                lref._rope(q[..., cfg.qk_nope_head_dim:], ang, interleaved=True)], axis=-1)
    else:
        q = _rd(lref._rmsnorm(q, None, cfg.eps), dt)
        q_mla = np.concatenate([q[..., :-r], lref._rope(q[..., -r:], ang, interleaved=True)], axis=-1)
    return _rd(q_mla, dt), _rd(iq @ lref.hadamard_matrix(cfg.index_head_dim), dt)


def _close(name, got, want, dt):
    """Two dt ulps, relative to each element or to the largest one (a dt rounding that flips
    upstream of a sum moves a small result by an ulp of the large inputs)."""
    want = np.asarray(want, np.float64)
    return compare.check_close(name, got, want, abs_tol=2 * DT_REL[dt] * float(np.abs(want).max()),
                               rel_tol=2 * DT_REL[dt])


# ---------------------------------------------------------------- comparisons

def _rows(st: Stage, kv, kc):
    """Dequantised cache rows: (latent [slots, D_qk], indexer keys [slots, D_I]) float64."""
    return (formats.dequantize_kv(compare.to_numpy(kv), st.kv_format).astype(np.float64),
            formats.dequantize_fp8_indexer(compare.to_numpy(kc), st.cfg.index_head_dim)
            .reshape(-1, st.cfg.index_head_dim).astype(np.float64))


def _check_caches(st: Stage, kv, kc, want_lat, want_k, what):
    """Rows of the mapped new tokens within one e4m3 step (fp8; abs: one e4m3 subnormal step of
    the row's scale) or two dt ulps (latent) of ``want_*`` ([T, ...] float64, one row per token);
    every other byte of both caches (unmapped new tokens' rows included) as it was, bit for bit."""
    ok = st.slots >= 0
    got_lat, got_k = _rows(st, kv, kc)
    cache_dt = st.x["kv_cache"].dtype
    if st.kv_format == "latent":
        lat = _close(f"{what}: kv new rows", got_lat[st.slots[ok]], want_lat[ok], cache_dt)
    else:
        lat = compare.check_close(f"{what}: kv new rows", got_lat[st.slots[ok]], want_lat[ok],
                                  abs_tol=float(np.abs(want_lat).max()) * 2.0 ** -16, rel_tol=E4M3_REL)
    compare.assert_pass(lat.merge(compare.check_close(
        f"{what}: k new rows", got_k[st.slots[ok]], want_k[ok],
        abs_tol=float(np.abs(want_k).max()) * 2.0 ** -16, rel_tol=E4M3_REL)))
    P = st.cfg.page_size
    for name, got, old in (("kv_cache", kv, st.x["kv_cache"]), ("k_cache", kc, st.x["k_cache"])):
        g = got.contiguous().view(torch.uint8).cpu().numpy().reshape(old.shape[0], -1)
        o = old.contiguous().view(torch.uint8).cpu().numpy().reshape(old.shape[0], -1)
        mask = np.zeros(g.shape, bool)
        for slot in st.slots[ok]:
            page, off = divmod(int(slot), P)
            for lo, hi in _token_bytes(st, name, off):
                mask[page, lo:hi] = True
        bad = (g != o) & ~mask
        assert not bad.any(), f"{what}: {name} bytes outside the mapped new tokens' rows changed, " \
                              f"first at [page, byte] {np.argwhere(bad)[:4].tolist()}"


def _token_bytes(st: Stage, name: str, off: int):
    """Byte ranges of token ``off``'s rows within its page of cache ``name``."""
    P, D_I = st.cfg.page_size, st.cfg.index_head_dim
    if name == "k_cache":
        return [(off * D_I, (off + 1) * D_I), (P * D_I + 4 * off, P * D_I + 4 * off + 4)]
    if st.kv_format == "fp8_model1":
        return [(off * 576, (off + 1) * 576), (P * 576 + off * 8, P * 576 + off * 8 + 8)]
    row = st.x["kv_cache"][0].numel() * st.x["kv_cache"].element_size() // P
    return [(off * row, (off + 1) * row)]


@pytest.mark.parametrize("name", list(CASES))
def test_prep_x_matches_composite_and_float64(name):
    """``dsa::prep_x`` on the Triton kernel against its composite twin (``path="torch"``) and
    float64 math: q_norm within two dt ulps, x cast exactly, both caches' new rows within one
    e4m3 step (fp8) / two dt ulps (latent), every other byte (unmapped new tokens included)
    untouched."""
    st = _stage(name)
    dt = st.x["xq"].dtype
    qr, x32, kv, kc = _run_x(st, "triton")
    qr_c, x32_c, kv_c, kc_c = _run_x(st, "torch")
    ref_qr, ref_lat, ref_k = _ref_x(st)
    assert torch.equal(x32, x32_c) and torch.equal(x32, st.x["x"].float())
    for want, label in ((_np(qr_c), "composite"), (ref_qr, "float64")):
        compare.assert_pass(_close(f"qr vs {label}", qr, want, dt))
    safe = np.where(st.slots >= 0, st.slots, 0)
    lat_c, k_c = _rows(st, kv_c, kc_c)
    _check_caches(st, kv_c, kc_c, lat_c[safe], k_c[safe], "composite")    # its own untouched bytes
    _check_caches(st, kv, kc, lat_c[safe], k_c[safe], "vs composite")
    want_kv, want_kc = lref.write_token_rows(compare.to_numpy(st.x["kv_cache"]), compare.to_numpy(st.x["k_cache"]),
                                             ref_lat, ref_k, st.slots, st.kv_format, st.cfg.page_size,
                                             st.cfg.index_head_dim, st.scale_fmt)
    lat_r, k_r = _rows(st, want_kv, want_kc)
    _check_caches(st, kv, kc, lat_r[safe], k_r[safe], "vs float64")
    same = (kc.view(torch.uint8) == kc_c.view(torch.uint8)).float().mean().item()
    assert same > 0.999, f"only {same:.5f} of the k_cache bytes equal the composite's"


@pytest.mark.parametrize("name", list(CASES))
def test_prep_q_matches_composite_and_float64(name):
    """``dsa::prep_q`` on the Triton kernel against its composite twin and float64 math:
    ``q_mla`` within two dt ulps (V3.2's copied ``q_lat`` bit for bit), ``idx_q`` (dequantised
    with its scale) within one e4m3 step, the scales (``idx_w / w_raw``) equal to the composite's
    up to the float32 ulp of ``amax / 448``; against float64 math within a few dt ulps
    (``amax / 448``) or equal (ue8m0) but for heads whose amax sits at a power-of-two boundary
    (then one power of two apart; at most 10 % of them)."""
    st = _stage(name)
    cfg, dt = st.cfg, st.x["iq"].dtype
    q_mla, idx_q, idx_w = _run_q(st, "triton")
    q_mla_c, idx_q_c, idx_w_c = _run_q(st, "torch")
    ref_q, ref_iq = _ref_q(st)
    if cfg.absorbed:
        assert torch.equal(q_mla[..., :cfg.kv_lora_rank], st.x["q_lat"].transpose(0, 1))
    for want, label in ((_np(q_mla_c), "composite"), (ref_q, "float64")):
        compare.assert_pass(_close(f"q_mla vs {label}", q_mla, want, dt))
    w = _np(st.x["w_raw"])
    scale, scale_c = _np(idx_w) / w, _np(idx_w_c) / w
    compare.assert_pass(compare.check_close("q scale vs composite", scale, scale_c, abs_tol=0, rel_tol=1e-6))
    deq = _np(idx_q.float()) * scale[..., None]
    sub = float(scale.max()) * 2.0 ** -9                          # one e4m3 subnormal step
    compare.assert_pass(compare.check_close("idx_q vs composite", deq, _np(idx_q_c.float()) * scale_c[..., None],
                                            abs_tol=sub, rel_tol=E4M3_REL))
    compare.assert_pass(compare.check_close("idx_q vs float64", deq, ref_iq, abs_tol=sub, rel_tol=E4M3_REL))
    ref_scale = formats.indexer_scale(np.abs(ref_iq.astype(np.float32)).max(-1), st.scale_fmt)
    compare.assert_pass(compare.check_close("q scale vs float64", scale, ref_scale, abs_tol=0,
                                            rel_tol=1.01 if st.scale_fmt == "ue8m0" else 4 * DT_REL[dt]))
    if st.scale_fmt == "ue8m0":
        assert (scale == ref_scale).mean() >= 0.9, f"{(scale != ref_scale).sum()} of {scale.size} scales differ"
    same = (idx_q.view(torch.uint8) == idx_q_c.view(torch.uint8)).float().mean().item()
    assert same > 0.99, f"only {same:.4f} of the idx_q bytes equal the composite's"


def _attn(st: Stage, seed: int = 5):
    T, cfg = st.pos.shape[0], st.cfg
    rng = np.random.default_rng(seed)
    return torch.tensor(rng.standard_normal((T, cfg.num_heads, cfg.d_qk)), dtype=st.x["iq"].dtype, device=DEVICE)


@pytest.mark.parametrize("name", ["v4_model1_fp16_N2", "v4_latent_fp32_N1_amax"])
def test_rope_out_matches_composite_and_float64(name):
    """``dsa::rope_out`` (V4-Flash's inverse rope on the attention output) on the Triton kernel:
    the first D - r dims copied bit for bit, the last r within two dt ulps of the composite's and
    of float64 math (rounded to dt), attn itself untouched."""
    st = _stage(name)
    a, cfg, dt = st.x, st.cfg, st.x["iq"].dtype
    attn = _attn(st)
    before = attn.clone()
    o = rope_out(attn, a["rope_freqs"], a["context_lens"], st.N, path="triton")
    o_c = rope_out(attn, a["rope_freqs"], a["context_lens"], st.N, path="torch")
    r = cfg.d_rope
    assert torch.equal(attn, before) and torch.equal(o[..., :-r], attn[..., :-r])
    ref = _rd(lref._rope(_np(attn)[..., -r:], _angles(st)[:, None], interleaved=True, inverse=True), dt)
    for want, label in ((_np(o_c[..., -r:]), "composite"), (ref, "float64")):
        compare.assert_pass(_close(f"rope dims vs {label}", o[..., -r:], want, dt))


@pytest.mark.parametrize("path", ["triton", "torch"])
def test_prep_ops_pass_opcheck(path):
    """``torch.library.opcheck`` of the three custom ops (schema and mutation declarations, the fake
    impls' shapes / dtypes / strides against the real outputs, AOT dispatch): what
    ``torch.compile(fullgraph=True)`` relies on. V3.2 with unmapped tokens, N = 2 (rope_out:
    V4-Flash, N = 2)."""
    st = _stage("v32_latent_fp16_N2_amax")
    a, cfg = st.x, st.cfg
    x_args = (a["xq"], a["xkv"], a["xk"], a["x"], a["q_norm"], a["kv_norm"], a["k_norm_w"], a["k_norm_b"],
              a["rope_freqs"], a["hadamard"], a["kv_cache"].clone(), a["k_cache"].clone(), a["block_table"],
              a["context_lens"], st.N, st.kv_format, cfg.page_size, st.scale_fmt, cfg.eps, False, path)
    torch.library.opcheck(torch.ops.dsa.prep_x.default, x_args)
    q_args = (a["iq"], a["w_raw"], a["q"], a["q_lat"], a["hadamard"], a["rope_freqs"], a["context_lens"], st.N,
              cfg.num_heads, cfg.index_heads, cfg.d_qk, cfg.qk_nope_head_dim, st.scale_fmt, cfg.eps, True,
              False, path)
    torch.library.opcheck(torch.ops.dsa.prep_q.default, q_args)
    v4 = _stage("v4_model1_fp16_N2")
    torch.library.opcheck(torch.ops.dsa.rope_out.default, (_attn(v4), v4.x["rope_freqs"], v4.x["context_lens"], v4.N,
                                                           path))


@pytest.mark.parametrize("two_d", [False, True], ids=["lens_1d", "lens_2d_strided"])
@pytest.mark.parametrize("N,window", [(1, 128), (2, 128), (3, 5), (2, 0), (1, 1500)])
def test_window_split_kernel_matches_composite_and_numpy(two_d, N, window):
    """``dsa::window_split`` (V4's indexer lengths and window positions in one launch) on the
    Triton kernel equals the nine-launch composite and a NumPy model bit for bit: 1-D context
    lengths (the MTP rule, draft i at ``L_b - (N - 1 - i)``) and 2-D per-draft lengths given as
    a strided view, lengths 0 / below N / below the window / at it / far above it / near
    int32's top (computed in int64: nothing wraps), windows of 0, 5, 128 and 1,500 (two
    iterations of the kernel's 1,024-position block); ``opcheck`` of the op on both paths."""
    from torch_impl.step import window_split
    L = np.array([0, 1, window, window + 1, 7, 40_000, 2**31 - 1 - N, 3], dtype=np.int64)
    if two_d:
        full = np.stack([L - (N - 1 - i) for i in range(N)] * 2, axis=1).astype(np.int32)
        cl = torch.tensor(full, device=DEVICE)[:, ::2]         # [B, N], stride 2 along the drafts
        per = full[:, ::2].astype(np.int64)
    else:
        cl = torch.tensor(L.astype(np.int32), device=DEVICE)
        per = L[:, None] - (N - 1 - np.arange(N))[None, :]
    want_lens = np.maximum(per - window, 0).astype(np.int32)
    want_win = np.maximum(per[..., None] - window + np.arange(window), -1).astype(np.int32)
    got = {p: window_split(cl, N, window, path=p) for p in ("triton", "torch")}
    for p, (lens, win) in got.items():
        assert lens.dtype == win.dtype == torch.int32, p
        np.testing.assert_array_equal(lens.cpu().numpy(), want_lens, err_msg=p)
        np.testing.assert_array_equal(win.cpu().numpy(), want_win, err_msg=p)
    for p in ("triton", "torch"):
        torch.library.opcheck(torch.ops.dsa.window_split.default, (cl, N, window, p))


def test_prep_bf16_in_the_interpreter_is_not_implemented():
    """bf16 operands in the CPU interpreter: the named Triton path raises NotImplementedError
    before launch; ``auto`` falls through to the composite ops."""
    if CUDA:
        pytest.skip("the interpreter's bf16 gate: CPU only")
    st = _stage("v32_ds_mla_fp32_N1")
    for k in ("xq", "xkv", "xk", "x", "iq", "q", "q_lat", "hadamard"):
        st.x[k] = st.x[k].bfloat16()
    with pytest.raises(NotImplementedError, match="bf16"):
        _run_x(st, "triton")
    with pytest.raises(NotImplementedError, match="bf16"):
        _run_q(st, "triton")
    qr, _, _, kc = _run_x(st, "auto")
    assert qr.dtype == torch.bfloat16 and not torch.equal(kc, st.x["k_cache"])
    assert _run_q(st, "auto")[1].dtype == torch.float8_e4m3fn


def test_kernels_rotate_by_the_given_hadamard():
    """Both kernels rotate by the ``hadamard`` argument (loaded, not generated): with the
    Sylvester matrix's columns permuted and some negated (another +-1 matrix, still orthogonal)
    the Triton outputs match the composite's with the same matrix (``idx_q`` and the indexer
    keys within one e4m3 step, as the main tests) and differ from the ones with the Sylvester
    matrix."""
    st = _stage("v4_model1_fp16_N2")
    D_I = st.cfg.index_head_dim
    rng = np.random.default_rng(7)
    sign = np.sign(lref.hadamard_matrix(D_I))[:, rng.permutation(D_I)] * rng.choice([-1.0, 1.0], D_I)
    base_q = _run_q(st, "triton")[1]
    base_kc = _run_x(st, "triton")[3]
    st.x["hadamard"] = torch.tensor(sign, dtype=st.x["iq"].dtype, device=DEVICE)
    _, idx_q, idx_w = _run_q(st, "triton")
    _, idx_q_c, idx_w_c = _run_q(st, "torch")
    w = _np(st.x["w_raw"])
    scale, scale_c = _np(idx_w) / w, _np(idx_w_c) / w
    sub = float(scale.max()) * 2.0 ** -9
    compare.assert_pass(compare.check_close(
        "idx_q vs composite (permuted matrix)", _np(idx_q.float()) * scale[..., None],
        _np(idx_q_c.float()) * scale_c[..., None], abs_tol=sub, rel_tol=E4M3_REL))
    assert not torch.equal(idx_q.view(torch.uint8), base_q.view(torch.uint8))
    kc, kc_c = _run_x(st, "triton")[3], _run_x(st, "torch")[3]
    _, k = _rows(st, st.x["kv_cache"], kc)
    _, k_c = _rows(st, st.x["kv_cache"], kc_c)
    ok = st.slots[st.slots >= 0]
    compare.assert_pass(compare.check_close("indexer keys vs composite (permuted matrix)", k[ok], k_c[ok],
                                            abs_tol=float(np.abs(k_c[ok]).max()) * 2.0 ** -16,
                                            rel_tol=E4M3_REL))
    assert not torch.equal(kc, base_kc)


@pytest.mark.parametrize("shape", [(64, 64), (128, 64), (128,)])
def test_bad_hadamard_shape_is_named(shape):
    st = _stage("v4_model1_fp16_N2")
    st.x["hadamard"] = torch.ones(shape, dtype=st.x["iq"].dtype, device=DEVICE)
    D_I = st.cfg.index_head_dim
    want = rf"^hadamard: expected the \[{D_I}, {D_I}\] \+-1 matrix \(D_I = {D_I}\), got shape"
    with pytest.raises(ValueError, match=want):
        _run_q(st, "triton")
    with pytest.raises(ValueError, match=want):
        _run_x(st, "torch")


def test_bad_hadamard_type_dtype_device_and_index_heads_are_named():
    """Not a tensor, not floating point (a bool / int matrix would be cast silently), on another
    device (a ``meta`` matrix returned uninitialised memory before this check), and an
    ``index_heads`` that does not divide ``iq``'s width: each named before any launch."""
    st = _stage("v4_model1_fp16_N2")
    good = st.x["hadamard"]
    st.x["hadamard"] = good.cpu().numpy()
    with pytest.raises(TypeError, match=r"^hadamard: expected a torch.Tensor .*, got ndarray"):
        _run_q(st, "triton")
    for dt in (torch.bool, torch.int32):
        st.x["hadamard"] = good.to(dt)
        with pytest.raises(TypeError, match=rf"^hadamard: expected a floating-point dtype, got {dt}"):
            _run_x(st, "triton")
    st.x["hadamard"] = torch.ones(good.shape, device="meta")
    with pytest.raises(ValueError, match=r"^hadamard: expected a tensor on .* \(the activations' device\), "
                                         r"got meta"):
        _run_q(st, "torch")
    st.x["hadamard"] = good
    a, cfg = st.x, st.cfg
    for bad in (0, 3, -16, 2.0, True):
        with pytest.raises(ValueError, match=rf"^index_heads: expected a positive int dividing iq's last "
                                             rf"dim \({a['iq'].shape[-1]} = H_I \* D_I\), got {bad!r}"):
            prepare_q(a["iq"], a["w_raw"], a["q"], a["q_lat"], a["hadamard"], a["rope_freqs"],
                      a["context_lens"], st.N, heads=cfg.num_heads, index_heads=bad, d_qk=cfg.d_qk,
                      qk_nope=0, scale_fmt=st.scale_fmt, eps=cfg.eps, absorbed=cfg.absorbed,
                      q_head_norm=cfg.q_head_norm, path="triton")


@pytest.mark.parametrize("name", ["v32_latent_fp16_N2_amax", "v4_model1_fp16_N2"])
def test_prep_q_parts_match_the_whole(name):
    """The layer's overlapped step launches ``dsa::prep_q`` in two halves (``part="index"``: the
    indexer's programs only; ``"mla"``: the kernel compiled with ``NUM_HI = 0``): each half writes
    bit for bit what the one launch writes, and a bad ``part`` is named before any launch."""
    st = _stage(name)
    q_mla, idx_q, idx_w = _run_q(st, "triton")
    _, idx_q_i, idx_w_i = _run_q(st, "triton", "index")
    q_mla_m, _, _ = _run_q(st, "triton", "mla")
    assert torch.equal(idx_q_i.view(torch.uint8), idx_q.view(torch.uint8))
    assert torch.equal(idx_w_i, idx_w)
    assert torch.equal(q_mla_m, q_mla)
    with pytest.raises(ValueError, match=r"^part: expected 'all', 'index' or 'mla', got 'both'"):
        _run_q(st, "triton", "both")


def test_prep_q_configs_are_compiled():
    """The launcher's config (:func:`prep_q_heuristic`) is a member of ``PREP_Q_SPACE`` for every
    preset, TP size and dtype, and each one the real dimensions reach is in the AOT specs that
    tests/test_triton_compile.py compiles for sm_90 / sm_120."""
    from kernels.layer_prep import triton as tlp
    labels = [s.label for s in tlp.aot_specs("small")]
    for cfg in lref.LAYER_CONFIGS.values():
        for tp in (1, 2, 4, 8):
            for dt, nbytes in (("fp32", 4), ("fp16", 2), ("bf16", 2)):
                c = tlp.prep_q_heuristic(cfg.index_heads, cfg.heads_per_rank(tp), nbytes)
                assert c in tlp.PREP_Q_SPACE
                assert any(lb.startswith(f"prep_q {cfg.name} dt={dt} ") and lb.endswith(str(c)) for lb in labels)
                # the overlapped step's MLA half (NUM_HI 0)
                assert f"prep_q {cfg.name} dt={dt} ue8m0=True part=mla {c}" in labels


def test_fused_prep_switch(monkeypatch):
    """``DSA_LAYER_FUSED_PREP``: unset, empty or 1 on, 0 off, anything else a ValueError naming
    it (``kernels.scalars.env_switch``, the rule of every on / off switch); the constructor's
    ``fused_prep`` overrides it."""
    monkeypatch.delenv(FUSED_PREP_ENV, raising=False)
    assert fused_prep_default() is True
    monkeypatch.setenv(FUSED_PREP_ENV, " ")
    assert fused_prep_default() is True
    monkeypatch.setenv(FUSED_PREP_ENV, "0")
    assert fused_prep_default() is False
    assert DSADecodeLayer(V32, None, device="meta").fused_prep is False
    assert DSADecodeLayer(V32, None, device="meta", fused_prep=True).fused_prep is True
    monkeypatch.setenv(FUSED_PREP_ENV, "yes")
    with pytest.raises(ValueError, match=f"^{FUSED_PREP_ENV}: expected '0', '1' or unset, got 'yes'"):
        DSADecodeLayer(V32, None, device="meta")


LAYER_CASES = {  # name: (cfg, kv_format, B, N, lens, seed, dtype)
    "dsv32_fp8_ds_mla_N2": (V32, "fp8_ds_mla", 2, 2, (150, 40), 0, torch.float32),
    "dsv4_fp8_model1_fp16": (V4, "fp8_model1", 2, 1, (120, 30), 3, torch.float16),
}


@pytest.mark.parametrize("name", list(LAYER_CASES))
def test_layer_fused_prep_matches_composite(name):
    """The whole step with the switch on and off (Triton path): the same intermediates within
    the stage bounds, the same caches within one e4m3 step, outputs within SPEC's out bound
    (float32) or the bf16/fp16 layer's cosine bound, and the fused step against the float64
    reference (tests/_layer_checks.py's checks)."""
    import _layer_checks as checks
    cfg, fmt, B, N, lens, seed, dt = LAYER_CASES[name]
    case = lref.make_layer_case(cfg, seed=seed, B=B, N=N, lens=lens, kv_format=fmt, name=name)
    res = {}
    for fused in (True, False):
        layer = DSADecodeLayer(case.cfg, case.weights, kv_format=fmt, device=DEVICE, path="triton", dtype=dt,
                               fused_prep=fused)
        args = [as_tensor(a, DEVICE) for a in (case.x, case.kv_cache, case.k_cache, case.block_table,
                                                case.context_lens)]
        out, kv, kc, inter = layer(*args, return_intermediates=True)
        res[fused] = (out, kv, kc, inter)
    (o1, kv1, kc1, i1), (o0, kv0, kc0, i0) = res[True], res[False]
    compare.assert_pass(_close("q", i1["q"], _np(i0["q"]), dt))
    compare.assert_pass(compare.check_close("idx_weights", i1["idx_weights"], _np(i0["idx_weights"]),
                                            abs_tol=layer_compare.IDX_WEIGHTS_ABS, rel_tol=layer_compare.IDX_WEIGHTS_REL))
    new = layer_compare.new_slot_mask(case)
    (lat1, k1), (lat0, k0) = (layer_compare._cache_rows(case, compare.to_numpy(kv), compare.to_numpy(kc))
                              for kv, kc in ((kv1, kc1), (kv0, kc0)))
    compare.assert_pass(layer_compare._merge([
        layer_compare._exact("kv rows not written", lat1[~new], lat0[~new], equal_nan=True),
        layer_compare._exact("k rows not written", k1[~new], k0[~new]),
        compare.check_close("kv new rows", lat1[new], lat0[new], abs_tol=layer_compare.CACHE_ABS, rel_tol=E4M3_REL),
        compare.check_close("k new rows", k1[new], k0[new], abs_tol=layer_compare.CACHE_ABS, rel_tol=E4M3_REL)]))
    ref = case.reference()
    inter_np = {k: (v.view(torch.uint8).cpu().numpy().view(formats.E4M3) if v.dtype == torch.float8_e4m3fn
                    else compare.to_numpy(v)) for k, v in i1.items()}
    if dt == torch.float32:
        checks.check_step(case, ref, compare.to_numpy(o1), compare.to_numpy(kv1), compare.to_numpy(kc1), inter_np)
        compare.assert_pass(compare.check_close("out", o1, _np(o0), abs_tol=compare.OUT_ABS,
                                                rel_tol=compare.OUT_REL, cos_tol=compare.OUT_COS))
    else:
        checks.check_bf16_step(case, compare.to_numpy(o1), compare.to_numpy(kc1), inter_np)
        compare.assert_pass(layer_compare.check_out(compare.to_numpy(o1), _np(o0), low_precision=True,
                                                    name="out (fused vs composite)"))


@pytest.mark.parametrize("preset", ["DSV32", "DSV4_FLASH"])
def test_prep_at_real_dimensions(preset):
    """All three ops at the real preset dimensions (H 128 / 64, q_lora 1536 / 1024, hidden 7168 /
    4096; P 16 to keep the caches small), fp16 in the CPU interpreter, bf16 on a GPU: the Triton
    kernels against the composite twins and float64 math (the stage bounds with that dtype's
    ulp), with unmapped new tokens."""
    cfg = lref.LAYER_CONFIGS[preset]
    name = f"real_{preset}"
    dt = torch.bfloat16 if CUDA else torch.float16
    CASES[name] = (dataclasses.replace(cfg, page_size=16), cfg.kv_format, 2, dt, None, "ue8m0", True)
    try:
        test_prep_x_matches_composite_and_float64(name)
        test_prep_q_matches_composite_and_float64(name)
        if cfg.inverse_rope_out:
            test_rope_out_matches_composite_and_float64(name)
    finally:
        del CASES[name]


# ---------------------------------------------------------------------------------- GPU only

@gpu_only
@pytest.mark.parametrize("name", ["dsv32_fp8_ds_mla", "dsv4_fp8_model1"])
def test_bf16_layer_fused_prep_matches_composite_on_gpu(name):
    """bf16 layer at the real dimensions, the switch on and off: both pass the bf16 step check
    against the float64 reference (tests/_layer_checks.py) and agree within BF16_COS."""
    import _layer_checks as checks
    from test_layer_torch import _bf16_rounded, _real_case
    case = _real_case(name)
    case.weights = _bf16_rounded(case.weights)
    outs = []
    for fused in (True, False):
        layer = DSADecodeLayer(case.cfg, case.weights, kv_format=case.kv_format, device=DEVICE,
                               dtype=torch.bfloat16, path="triton", fused_prep=fused)
        args = [as_tensor(a, DEVICE) for a in (case.x, case.kv_cache, case.k_cache, case.block_table,
                                                case.context_lens)]
        out, _, kc, inter = layer(*args, return_intermediates=True)
        inter = {k: (v.view(torch.uint8).cpu().numpy().view(formats.E4M3) if v.dtype == torch.float8_e4m3fn
                     else compare.to_numpy(v)) for k, v in inter.items()}
        checks.check_bf16_step(case, compare.to_numpy(out), compare.to_numpy(kc), inter)
        outs.append(_np(out))
    compare.assert_pass(layer_compare.check_out(outs[0], outs[1], low_precision=True,
                                                name="out (fused vs composite)"))


@pytest.mark.skipif(CUDA, reason="the CPU dry run of the GPU sweep")
def test_prep_sweep_dry_run(tmp_path):
    """``bench/prep_sweep.py`` end to end in the interpreter (V4-Flash's real dimensions, B 1,
    fp16, the first two launch shapes): prep_x and rope_out rows, and each prep_q shape's
    outputs bit-equal to the default shape's before its three parts are timed."""
    import json
    from bench import prep_sweep
    out = tmp_path / "prep.json"
    prep_sweep.main(["--dry-run", "--preset", "DSV4_FLASH", "--batch", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {r["kernel"] for r in rows} == {"prep_x", "rope_out", "prep_q"}
    q = [r for r in rows if r["kernel"] == "prep_q"]
    assert [r["config"] for r in q] == [dataclasses.asdict(c) for c in prep_sweep.CANDIDATES[:2]]
    assert all(r["equal_to_default"] and min(r["all_us"], r["index_us"], r["mla_us"]) > 0 for r in q)
    assert all(r["repeatable"] and "differences" not in r for r in q)
    assert [r["programs_per_token"] for r in q] == [4 + 16, 4 + 32]
    # what a shape that differs reports: per output, how many elements and the largest gap
    a = (torch.tensor([1.0, 2.0]), torch.tensor([0.5], dtype=torch.float16), torch.zeros(3))
    b = (torch.tensor([1.0, 2.5]), torch.tensor([0.5], dtype=torch.float16), torch.zeros(3))
    assert prep_sweep._differences(a, b) == {"q_mla": {"elements": 1, "of": 2, "max_abs": 0.5}}


@pytest.mark.parametrize("name", ["v32_latent_fp16_N2_amax", "v4_model1_fp16_N2"])
def test_prep_q_three_weight_parts(name):
    """``w_raw`` as three float32 parts ``[T, 3 H_I]`` (the split ``weights_proj``'s GEMM,
    ``torch_impl.layer.split_weight``, part ``j`` scaled by ``2^(j S)``): the kernel and its
    composite twin sum them as ``(o0 + o1 2^-S) + o2 2^-2S`` and write bit for bit what one part holding that sum gives (the other
    outputs unchanged, bit for bit); a ``w_raw`` of another width or dtype is named."""
    from torch_impl.layer import SPLIT_SHIFT
    st = _stage(name)
    a, H_I = st.x, st.cfg.index_heads
    g = torch.Generator().manual_seed(11)
    S = SPLIT_SHIFT[a["iq"].dtype]
    parts = [a["w_raw"]] + [torch.randn(a["w_raw"].shape, generator=g).to(DEVICE) for _ in (1, 2)]
    whole = (parts[0] + parts[1] * 2.0 ** -S) + parts[2] * 2.0 ** (-2 * S)
    want = {}
    for path in ("triton", "torch"):
        a["w_raw"] = whole
        want[path] = _run_q(st, path)
        a["w_raw"] = torch.cat(parts, dim=1)
        got = _run_q(st, path)
        assert torch.equal(got[2], want[path][2]), path
        assert torch.equal(got[0], want[path][0]) and torch.equal(got[1].view(torch.uint8),
                                                                   want[path][1].view(torch.uint8))
    T = whole.shape[0]
    for bad, got in ((torch.cat(parts[:2], dim=1), f"torch.float32 ({T}, {2 * H_I})"),
                     (whole.double(), f"torch.float64 ({T}, {H_I})")):
        a["w_raw"] = bad
        with pytest.raises(ValueError, match=re.escape(f"w_raw: expected float32 [{T}, {H_I}] or "
                                                       f"[{T}, {3 * H_I}], got {got}")):
            _run_q(st, "triton")
    a["w_raw"] = parts[0]


def test_layer_split_weights_proj(monkeypatch):
    """``DSA_LAYER_SPLIT_WPROJ`` (read at construction; on unless ``0``): an fp16 layer's fused step of two
    tokens runs ``weights_proj`` as three fp16 weights (``wproj_split``, ``3 H_I`` rows, part
    ``j`` scaled by ``2^(11 j)``: ``alpha w`` to 2^-24 relative), one GEMM into float32, summed in ``prep_q``:
    the head weights within the float32 bound of the float32 GEMM's and the same selection
    (the fp16 step's checks against the float64 reference); off (``0``, or a float32 layer) the
    buffer is absent; a bad value is named at construction."""
    import _layer_checks as checks
    from torch_impl.layer import SPLIT_SHIFT, split_weight
    cfg, fmt, B, N, lens, seed, dt = LAYER_CASES["dsv4_fp8_model1_fp16"]
    case = lref.make_layer_case(cfg, seed=seed, B=B, N=N, lens=lens, kv_format=fmt, name="split_wproj")
    args = [as_tensor(x, DEVICE) for x in (case.x, case.kv_cache, case.k_cache, case.block_table,
                                           case.context_lens)]
    res = {}
    monkeypatch.delenv("DSA_LAYER_SPLIT_WPROJ", raising=False)
    assert DSADecodeLayer(cfg, case.weights, kv_format=fmt, device=DEVICE, path="triton", dtype=dt).split_wproj
    for value in ("1", "0"):
        monkeypatch.setenv("DSA_LAYER_SPLIT_WPROJ", value)
        layer = DSADecodeLayer(cfg, case.weights, kv_format=fmt, device=DEVICE, path="triton", dtype=dt,
                               fused_prep=True)
        assert layer.split_wproj == (value == "1") and hasattr(layer, "wproj_split") == (value == "1")
        res[value] = layer(*[t.clone() for t in args], return_intermediates=True)
        if value == "1":
            w = layer.w("indexer.weights_proj") * layer._weights_alpha
            p = layer.wproj_split.view(3, *w.shape).double()
            S = SPLIT_SHIFT[dt]
            assert layer.wproj_split.dtype == dt and torch.equal(layer.wproj_split, split_weight(w, dt))
            got = (p[0] + p[1] * 2.0 ** -S) + p[2] * 2.0 ** (-2 * S)
            assert ((got - w.double()).abs() <= 2.0 ** -24 * w.double().abs()).all()
    (o1, _, kc1, i1), (o0, _, _, i0) = res["1"], res["0"]
    compare.assert_pass(compare.check_close("idx_weights (split vs float32)", i1["idx_weights"],
                                            _np(i0["idx_weights"]), abs_tol=layer_compare.IDX_WEIGHTS_ABS,
                                            rel_tol=layer_compare.IDX_WEIGHTS_REL))
    assert torch.equal(i1["indices"], i0["indices"])
    inter = {k: (v.view(torch.uint8).cpu().numpy().view(formats.E4M3) if v.dtype == torch.float8_e4m3fn
                 else compare.to_numpy(v)) for k, v in i1.items()}
    checks.check_bf16_step(case, compare.to_numpy(o1), compare.to_numpy(kc1), inter)
    monkeypatch.setenv("DSA_LAYER_SPLIT_WPROJ", "1")
    f32 = DSADecodeLayer(cfg, case.weights, kv_format=fmt, device=DEVICE, path="triton", fused_prep=True)
    assert not f32.split_wproj and not hasattr(f32, "wproj_split")
    monkeypatch.setenv("DSA_LAYER_SPLIT_WPROJ", "on")
    with pytest.raises(ValueError, match="DSA_LAYER_SPLIT_WPROJ: expected '0', '1' or unset, got 'on'"):
        DSADecodeLayer(cfg, case.weights, kv_format=fmt, device=DEVICE, path="triton", dtype=dt)


def test_split_weights_proj_yields_to_the_linear_switch(monkeypatch):
    """A ``linear`` switch that puts ``indexer.weights_proj`` on ``dsa::linear`` (here that GEMM
    alone, so ``x_proj`` stays on torch's GEMM where the joint form would run; ``"triton"`` and
    ``"auto"`` name it too: ``linear_switch``'s tests) keeps it there with
    the split built (and with ``DSA_LAYER_XW_JOINT=1``): no float32-out GEMM runs (neither the
    split weight nor the joint), ``dsa::linear`` runs the float32 ``weights_proj`` with the
    layer's alpha, and the head weights equal those of a layer built with the split off under
    the same switch, bit for bit (the same kernels on the same inputs)."""
    from torch_impl import layer as tl
    cfg, fmt, B, N, lens, seed, dt = LAYER_CASES["dsv4_fp8_model1_fp16"]
    case = lref.make_layer_case(cfg, seed=seed, B=B, N=N, lens=lens, kv_format=fmt, name="split_linear")
    args = [as_tensor(x, DEVICE) for x in (case.x, case.kv_cache, case.k_cache, case.block_table,
                                           case.context_lens)]
    calls, lin = [], []
    real_mm, real_lin = tl.mm_float32_out, tl.tlinear.linear
    monkeypatch.setattr(tl, "mm_float32_out", lambda x, w: calls.append(tuple(w.shape)) or real_mm(x, w))
    monkeypatch.setattr(tl.tlinear, "linear", lambda x, w, **kw: lin.append((tuple(w.shape), kw.get("alpha"),
                                                                            kw.get("out_dtype"))) or real_lin(x, w, **kw))
    res = {}
    for split, joint in (("1", "1"), ("1", "0"), ("0", "0")):
        monkeypatch.setenv("DSA_LAYER_SPLIT_WPROJ", split)
        monkeypatch.setenv("DSA_LAYER_XW_JOINT", joint)
        layer = DSADecodeLayer(cfg, case.weights, kv_format=fmt, device=DEVICE, path="triton", dtype=dt,
                               fused_prep=True, linear="indexer.weights_proj=triton")
        assert layer.split_wproj == (split == "1")
        lin.clear()
        res[split + joint] = layer(*[t.clone() for t in args], return_intermediates=True)[3]
        assert calls == [], (split, joint, calls)
        wp = layer.w("indexer.weights_proj")
        assert (tuple(wp.shape), layer._weights_alpha, torch.float32) in lin, (split, joint, lin)
    for key in ("11", "10"):
        assert torch.equal(res[key]["idx_weights"], res["00"]["idx_weights"]), key
        assert torch.equal(res[key]["indices"], res["00"]["indices"]), key


@pytest.mark.parametrize("name", ["v32_latent_fp16_N2_amax", "v4_model1_fp16_N2"])
def test_prep_x_float32_projection_is_rounded_on_load(name):
    """``dsa::prep_x`` given the x projection in float32 (a GEMM that wrote float32: the layer's
    joint ``x_proj``) writes bit for bit what it writes given the same values rounded to dt,
    on the kernel and its composite twin (``qr``, ``x32`` and both caches); another dtype is
    named."""
    st = _stage(name)
    a, dt = st.x, st.x["x"].dtype
    g = torch.Generator().manual_seed(12)
    wide = {k: (a[k].float() + torch.randn(a[k].shape, generator=g).to(DEVICE) * 2.0 ** -14 * a[k].float().abs())
            for k in ("xq", "xkv", "xk")}
    keep = {k: a[k] for k in wide}
    try:
        for path in ("triton", "torch"):
            for k in wide:
                a[k] = wide[k].to(dt)
            want = _run_x(st, path)
            for k in wide:
                a[k] = wide[k]
            got = _run_x(st, path)
            for w, o in zip(want, got):
                assert torch.equal(w, o), path
        a["xq"] = wide["xq"].double()
        with pytest.raises(TypeError, match=r"^xq: expected one of \(torch.float16, torch.float32\)"):
            _run_x(st, "triton")
        a["xq"], x = keep["xq"], a["x"]
        a["x"] = x.int()
        try:
            with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor of one of .*, got torch.int32"):
                _run_x(st, "triton")
        finally:
            a["x"] = x
    finally:
        a.update(keep)


def test_layer_xw_joint(monkeypatch):
    """``DSA_LAYER_XW_JOINT=1`` (with the split ``weights_proj``, the default): the fp16 layer's
    ``x_proj`` rows and the split weight's share one storage (``x_proj_joint``), a fused step of
    two tokens runs them as one float32-out GEMM (``prep_x`` rounding the x projection on
    load), and the step matches the step without it: the same indices, ``idx_weights`` within
    the float32 bound, the output within the 16-bit layer's bound, and the fp16 step checks
    against the float64 reference; off by default; a bad value named at construction."""
    import _layer_checks as checks
    cfg, fmt, B, N, lens, seed, dt = LAYER_CASES["dsv4_fp8_model1_fp16"]
    case = lref.make_layer_case(cfg, seed=seed, B=B, N=N, lens=lens, kv_format=fmt, name="xw_joint")
    args = [as_tensor(x, DEVICE) for x in (case.x, case.kv_cache, case.k_cache, case.block_table,
                                           case.context_lens)]
    monkeypatch.delenv("DSA_LAYER_SPLIT_WPROJ", raising=False)
    monkeypatch.delenv("DSA_LAYER_XW_JOINT", raising=False)
    assert not DSADecodeLayer(cfg, case.weights, kv_format=fmt, device=DEVICE, dtype=dt).xw_joint
    res, calls = {}, []
    from torch_impl import layer as tl
    real = tl.mm_float32_out
    monkeypatch.setattr(tl, "mm_float32_out", lambda x, w: calls.append(tuple(w.shape)) or real(x, w))
    for value in ("1", "0"):
        monkeypatch.setenv("DSA_LAYER_XW_JOINT", value)
        layer = DSADecodeLayer(cfg, case.weights, kv_format=fmt, device=DEVICE, path="triton", dtype=dt,
                               fused_prep=True)
        assert layer.xw_joint == (value == "1")
        if value == "1":
            n = layer.x_proj.shape[0]
            assert layer.x_proj.data_ptr() == layer.x_proj_joint.data_ptr()
            assert layer.wproj_split.data_ptr() == layer.x_proj_joint[n:].data_ptr()
            assert layer.x_proj_joint.shape == (n + 3 * cfg.index_heads, cfg.hidden)
        res[value] = layer(*[t.clone() for t in args], return_intermediates=True)
    # one float32-out GEMM a step: the joint [n + 3 H_I, K], then (off) the split weight alone
    assert [c[0] for c in calls] == [layer.x_proj.shape[0] + 3 * cfg.index_heads, 3 * cfg.index_heads], calls
    (o1, _, kc1, i1), (o0, _, _, i0) = res["1"], res["0"]
    assert torch.equal(i1["indices"], i0["indices"])
    compare.assert_pass(compare.check_close("idx_weights (joint vs apart)", i1["idx_weights"],
                                            _np(i0["idx_weights"]), abs_tol=layer_compare.IDX_WEIGHTS_ABS,
                                            rel_tol=layer_compare.IDX_WEIGHTS_REL))
    compare.assert_pass(layer_compare.check_out(_np(o1), _np(o0), low_precision=True,
                                                name="out (joint vs apart)"))
    inter = {k: (v.view(torch.uint8).cpu().numpy().view(formats.E4M3) if v.dtype == torch.float8_e4m3fn
                 else compare.to_numpy(v)) for k, v in i1.items()}
    checks.check_bf16_step(case, compare.to_numpy(o1), compare.to_numpy(kc1), inter)
    monkeypatch.setenv("DSA_LAYER_XW_JOINT", "yes")
    with pytest.raises(ValueError, match="DSA_LAYER_XW_JOINT: expected '0', '1' or unset, got 'yes'"):
        DSADecodeLayer(cfg, case.weights, kv_format=fmt, device=DEVICE, path="triton")


def test_split_weight_reconstructs_the_float32_weight():
    """``split_weight`` / ``sum_split_parts``: bf16 parts give the float32 weight to 2^-24
    relative over float32's range (2^-100 .. 2^100); fp16 parts to 2^-24 relative where they
    stay normal (1 .. 2^10) and within 2^-47 absolute below; ±inf stays ±inf, NaN NaN; bad
    arguments named."""
    from torch_impl.layer import SPLIT_SHIFT, split_weight, sum_split_parts
    g = torch.Generator().manual_seed(3)
    for dt, lo, hi in ((torch.bfloat16, -100, 100), (torch.float16, 0, 10), (torch.float16, -60, 0)):
        w = torch.randn(8, 64, generator=g).sign() * torch.randn(8, 64, generator=g).abs().add(1) \
            * 2.0 ** torch.linspace(lo, hi, 64)
        p = split_weight(w, dt)
        assert p.shape == (24, 64) and p.dtype == dt
        S = SPLIT_SHIFT[dt]
        back = (p[:8].double() + p[8:16].double() * 2.0 ** -S) + p[16:].double() * 2.0 ** (-2 * S)
        err = (back - w.double()).abs()
        bound = 2.0 ** -24 * w.double().abs() + (2.0 ** -47 if lo < 0 and dt == torch.float16 else 0.0)
        assert (err <= bound).all(), (dt, lo, float((err - bound).max()))
        # the GEMM's output layout [T, 3 H_I] summed in prep_q's order
        o = torch.cat([p[:8].float().T, p[8:16].float().T, p[16:].float().T], dim=1)     # [64, 24]
        assert torch.equal(sum_split_parts(o, 8, dt),
                           (o[:, :8] + o[:, 8:16] * 2.0 ** -S) + o[:, 16:] * 2.0 ** (-2 * S))
    special = torch.tensor([[float("inf"), -float("inf"), float("nan"), 1.0e5, 0.0]])
    p = split_weight(special, torch.float16).double()
    back = (p[0] + p[1] * 2.0 ** -11) + p[2] * 2.0 ** -22
    assert back[0] == float("inf") and back[1] == -float("inf") and torch.isnan(back[2])
    assert back[3] == float("inf") and back[4] == 0              # past fp16's range: inf
    with pytest.raises(TypeError, match=r"^dtype: expected torch.float16 or torch.bfloat16, got torch.float32"):
        split_weight(special, torch.float32)
    with pytest.raises(TypeError, match=r"^w: expected a float32 torch.Tensor, got torch.float64"):
        split_weight(special.double(), torch.bfloat16)


def test_split_weights_follow_load_state_dict_and_moves(monkeypatch):
    """The buffers derived from ``indexer.weights_proj`` (``wproj_split``; with
    ``DSA_LAYER_XW_JOINT=1`` also ``x_proj_joint``, whose views ``x_proj`` and ``wproj_split``
    are) are rebuilt after ``load_state_dict`` and after ``_apply`` (what ``.to()`` runs): a
    layer loaded with another's weights steps bit for bit as that layer, and the views share
    one storage again after a move."""
    cfg, fmt, B, N, lens, seed, dt = LAYER_CASES["dsv4_fp8_model1_fp16"]
    case = lref.make_layer_case(cfg, seed=seed, B=B, N=N, lens=lens, kv_format=fmt, name="sd")
    args = [as_tensor(x, DEVICE) for x in (case.x, case.kv_cache, case.k_cache, case.block_table,
                                           case.context_lens)]
    for joint in ("0", "1"):
        monkeypatch.setenv("DSA_LAYER_XW_JOINT", joint)
        mk = lambda s: DSADecodeLayer(cfg, None, seed=s, kv_format=fmt, device=DEVICE, dtype=dt,
                                      path="triton", fused_prep=True)
        a, b = mk(0), mk(1)
        a._apply(lambda t: t.clone())                  # each buffer copied on its own, as .to() does
        if joint == "1":
            assert a.x_proj.data_ptr() == a.x_proj_joint.data_ptr()
            assert a.wproj_split.data_ptr() == a.x_proj_joint[a.x_proj.shape[0]:].data_ptr()
        a.load_state_dict(b.state_dict())
        assert torch.equal(a.wproj_split, b.wproj_split)
        ra = a(*[t.clone() for t in args], return_intermediates=True)
        rb = b(*[t.clone() for t in args], return_intermediates=True)
        assert torch.equal(ra[0], rb[0]) and torch.equal(ra[3]["idx_weights"], rb[3]["idx_weights"]), joint


def test_prep_q_three_parts_need_a_16_bit_iq():
    """The registered op refuses a three-part ``w_raw`` with a float32 ``iq`` on both paths (its
    parts are scaled for a 16-bit split), naming ``w_raw``; the constexprs refuse a non-int
    ``w_parts`` and a ``w_shift`` out of [1, 16] with three parts."""
    from kernels.layer_prep import triton as tlp
    st = _stage("v4_latent_fp32_N1_amax")
    a, cfg = st.x, st.cfg
    keep = a["w_raw"]
    a["w_raw"] = torch.cat([keep] * 3, dim=1)
    try:
        for path in ("triton", "torch"):
            with pytest.raises(ValueError, match=r"^w_raw: expected \[T, \d+\] float32, or \[T, \d+\] with a "
                                                 r"16-bit iq"):
                torch.ops.dsa.prep_q(a["iq"], a["w_raw"], a["q"], a["q_lat"], a["hadamard"], a["rope_freqs"],
                                     a["context_lens"], st.N, cfg.num_heads, cfg.index_heads, cfg.d_qk, 0,
                                     st.scale_fmt, cfg.eps, cfg.absorbed, cfg.q_head_norm, path, "all")
    finally:
        a["w_raw"] = keep
    qc = tlp.prep_q_heuristic(cfg.index_heads, cfg.num_heads, 2)
    kw = dict(index_heads=cfg.index_heads, index_head_dim=cfg.index_head_dim, rope=cfg.d_rope,
              absorbed=False, head_norm=True, qk_nope=0, nope=cfg.d_qk - cfg.d_rope, d_qk=cfg.d_qk,
              scale_fmt=None)
    with pytest.raises(ValueError, match=r"^w_parts: expected the int 1 or 3, got 3.0"):
        tlp.prep_q_constexprs(qc, **kw, w_parts=3.0, w_shift=8)
    for bad in (0, 17, 8.0):
        with pytest.raises(ValueError, match=r"^w_shift: expected an int in \[1, 16\] with w_parts 3"):
            tlp.prep_q_constexprs(qc, **kw, w_parts=3, w_shift=bad)
    assert tlp.prep_q_constexprs(qc, **kw, part="mla", w_parts=3, w_shift=0)["W_PARTS"] == 1
