"""One DSA attention decode layer as a ``torch.nn.Module`` (DeepSeek's absorbed form).

The math, the weight names and the tensor-parallel slicing are those of
:mod:`kernels.layer_reference` (whose module docstring writes the whole step out); this module
runs it with the project's ops: ``indexer_topk`` and ``sparse_mla_decode`` (Triton kernels or
plain PyTorch, ``path``), and the new tokens' cache writes as one fused quantize + scatter per
cache (:func:`write_new_tokens`: the Triton kernel ``kernels/cache_write/triton.py``, or the
byte-exact plain-PyTorch writers ``quantize_fp8_ds_mla``, ``quantize_fp8_model1`` and
``quantize_fp8_indexer`` with ``path="torch"``). With ``fused_prep`` (``DSA_LAYER_FUSED_PREP``,
on by default) the work between the projections and the two DSA ops, the cache writes included,
is two custom ops instead (:func:`prepare_x`, :func:`prepare_q`: one Triton launch each,
``kernels/layer_prep/triton.py``), and V4's inverse rope on the attention output a third
(:func:`rope_out`); without it, composite torch ops that torch.compile fuses.

Sources: deepseek-ai/DeepSeek-V3.2-Exp ``inference/model.py`` (``MLA.forward`` decode branch,
``Indexer.forward``), ``inference/kernel.py`` (``act_quant``); V4-Flash assumptions are listed in
``kernels.layer_reference.DSV4_FLASH_LAYER``.
"""
from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Mapping
from typing import Optional

import numpy as np
import torch
from torch import nn

from kernels import formats as np_formats
from kernels.ops import BACKEND_PATHS
from kernels import layer_reference as lref
from kernels.scalars import SPLIT_SHIFT_BITS, check_int, env_switch
from torch_impl import formats as tformats
from torch_impl import _common
from torch_impl._common import TORCH_PATHS
from torch_impl.indexer import indexer_topk
from torch_impl import linear as tlinear
from torch_impl.sparse_mla import sparse_mla_decode
from torch_impl.step import indexer_topk_window, window_split

# prepare_x / prepare_q / rope_out are the layer's own fused steps (dsa::prep_x / prep_q /
# rope_out): their inputs are the layer's intermediates, validated by DSADecodeLayer, so they are
# not part of the public surface
__all__ = ["DSADecodeLayer", "LAYER_GEMMS", "LINEAR_AUTO", "LINEAR_DEFAULT", "gemv_applies", "gemv_on",
           "linear_switch", "new_token_targets",
           "write_new_tokens", "FUSED_PREP_ENV", "fused_prep_default", "OVERLAP_ENV",
           "OVERLAP_MAX_TOKENS", "overlap_default", "OVERLAP_CARVEOUT_ENV", "OVERLAP_SM_CARVEOUT",
           "overlap_sm_carveout", "overlap_applies", "q_index_overlap"]

_FLOAT = (torch.float32, torch.float16, torch.bfloat16)

LAYER_GEMMS = {c.absorbed: tuple(p.name for p in lref.projection_shapes(c))
               for c in (lref.DSV32_LAYER, lref.DSV4_FLASH_LAYER)}
"""The projections of a step by ``cfg.absorbed`` (V3.2 / V4), in order
(:func:`kernels.layer_config.projection_shapes`: their shapes): the fused ``x_proj`` (wq_a,
wkv_a / wkv, indexer.wk), ``wq_b``, V3.2's two per-head ``wkv_b`` products (``wkv_b_q``: q_nope
into the latent, ``wkv_b_v``: the attention output out of it), the indexer's ``wq_b`` and
float32 ``weights_proj``, the output projection (V3.2 ``wo``; V4 the grouped ``wo_a``, then
``wo_b``). The Hadamard rotation is not among them (its M is the indexer's heads x tokens)."""

LINEAR_AUTO = ("x_proj", "wkv_b_q", "indexer.wq_b", "indexer.weights_proj", "wkv_b_v", "wo_a")
"""The projections ``linear="auto"`` runs on the Triton few-token GEMM: those whose cuBLAS
kernels stream the weights at 0.15-2.9 TB/s in the H200 profiles of 2026-12-03 (narrow N,
split-K reduce launches, the one-CTA fp32 GEMM, batched per-head products). A prediction, not a
measurement: ``bench/NOTES.md`` ("Few-token projections") says what the GPU call measures."""

LINEAR_ENV = "DSA_LAYER_LINEAR"
# per GEMM: the torch backend's paths, or "gemv": the one-token kernel when the step has one
# token (B * N = 1) and the weight is K-major (gemv_applies), else torch's GEMM
_LINEAR_CHOICES = BACKEND_PATHS["torch"] + ("gemv",)
LINEAR_DEFAULT = "gemv"
"""The layer's projections by default: one-token steps on the one-token kernel (K-major weights;
``torch_impl.linear.GEMV_ENV``), every other step on torch's GEMMs. Measured (H100,
2026-12-06, bench/NOTES.md "One-token projections: measured"): V4 B 1 step 159.6 -> 145.7 us,
V3.2 B 1 221.6 -> 211.2 (the one-token kernel at its first rule, every GEMM routed), B 64 on
torch as before (the tensor-core Triton GEMM loses to cuBLAS there)."""


def gemv_on() -> bool:
    """``torch_impl.linear.GEMV_ENV`` read once: the one-token kernel on unless ``0``
    (``DSADecodeLayer`` reads it at construction, so a step under ``torch.compile`` reads no
    environment; set to ``0`` after a layer is built, that layer's ``"gemv"`` calls still go to
    ``dsa::linear``, which then reads ``0`` and runs its tensor-core kernel)."""
    return env_switch(tlinear.GEMV_ENV) is not False


JOINT_GEMV_ENV = "DSA_LAYER_JOINT_GEMV"


def joint_gemv_on() -> bool:
    """``DSA_LAYER_JOINT_GEMV`` read once (at construction): a one-token step's ``wq_b`` and
    ``indexer.wq_b`` as one GEMV over ``qr_proj`` (``DSADecodeLayer._project_qr``) and its
    ``x_proj`` and ``weights_proj`` in one launch (``torch_impl.linear.linear_pair``) unless
    ``0`` (the bench's A/B: the GEMVs apart, the launches as before)."""
    return env_switch(JOINT_GEMV_ENV) is not False


SPLIT_WPROJ_ENV = "DSA_LAYER_SPLIT_WPROJ"


def split_wproj_on() -> bool:
    """``DSA_LAYER_SPLIT_WPROJ`` read once (at construction): unless ``0``, a fused-preparation
    one-stream step's float32 ``weights_proj`` that the ``linear`` switch leaves on torch's GEMM
    (with the default ``"gemv"``: steps of more than one token, B 64's; a one-token step too
    where the one-token GEMV does not take it, e.g. ``linear="torch"``; never with ``"triton"``
    / ``"auto"`` or that GEMM named, which put it on ``dsa::linear``) runs as three 16-bit
    weights, ``alpha w = p0 + p1 2^-S + p2 2^-2S`` (:func:`split_weight`), in one
    tensor-core GEMM of the 16-bit ``x`` writing float32 (:func:`mm_float32_out`); ``prep_q``
    sums the three parts. 16-bit layers only (a float32 layer runs the float32 GEMM whatever
    the switch). ``0``: the float32 GEMM (the bench's A/B).

    Why: cuBLAS runs the float32 GEMM (N = H_I = 64, K = hidden) on the CUDA cores over one
    64-wide N tile, 12.4 / 9.7 us at M 64 on the H100 for 1.8 / 1.0 MB of weights; the split
    GEMM takes 7.6 us (V3.2, ``linear_sweep_split_weights_h100_20261208s31.json``). Measured
    (H100, 2026-12-08, bench/NOTES.md "Thirty-first session"): B 64 steps V3.2 507.0 -> 501.4
    us, V4-Flash 330.4 -> 327.0."""
    return env_switch(SPLIT_WPROJ_ENV) is not False


XW_JOINT_ENV = "DSA_LAYER_XW_JOINT"


def xw_joint_on() -> bool:
    """``DSA_LAYER_XW_JOINT`` read once (at construction): ``1`` (with the split
    ``weights_proj`` on, :func:`split_wproj_on`) appends the split weight's ``3 H_I`` rows to
    ``x_proj``'s, so a fused one-stream step of more than one token on torch's GEMM runs both
    as one GEMM writing float32 (``x_proj_joint``; ``prep_x`` rounds the x projection to dt on
    load, the rounding point of a GEMM writing dt). Off unless ``1``: not measured in the layer
    yet. Why: on the H100 at M 64 the joint GEMM took 15.9 us against 15.5 (``x_proj``) + 7.6
    (the split GEMM) or + 12.4 (the float32 one) apart (V3.2,
    ``linear_sweep_split_weights_h100_20261208s31.json``)."""
    return env_switch(XW_JOINT_ENV) is True


SPLIT_SHIFT = {torch.bfloat16: SPLIT_SHIFT_BITS["bf16"], torch.float16: SPLIT_SHIFT_BITS["fp16"]}
"""The significand bits S of each 16-bit part of :func:`split_weight`: part ``j`` is stored
scaled by ``2^(j S)`` (an exact power of two), so a part is as large as the weight (fp16's
5-bit exponent would otherwise flush the low parts of weights below ~2^-3 to subnormals)."""


def split_weight(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[3 N, K]`` in the 16-bit ``dtype``: ``p0; p1; p2`` with ``w = p0 + p1 2^-S + p2 2^-2S``
    (S = :data:`SPLIT_SHIFT`: bf16 8, fp16 11), each part the rounding of what the ones before it
    leave of the float32 ``w`` ``[N, K]``, scaled by ``2^(j S)``. bf16: ``w`` to ~2^-24
    relative (float32's 24 significand bits) over float32's range. fp16: to ~2^-33 relative
    where the parts stay normal (``|w|`` above ~2^-3); below that the parts go subnormal and
    the error is absolute, below ~2^-47 (harmless in a GEMM of such weights). Products with a
    16-bit x are exact in a float32 accumulator and the scalings are exact, so the GEMM of the
    three, its parts summed as ``(o0 + o1 2^-S) + o2 2^-2S`` (``prep_q``), is the float32 GEMM
    up to its summation order (the same bound, ``kernels.linear``'s). Non-finite weights stay
    what they are (±inf: ``p0`` ±inf, ``p1 = p2 = 0``; NaN: NaN); a finite weight beyond the
    16-bit type's range (fp16: ``|w| >= 65520``) becomes ±inf (the layer's ``alpha w`` is
    ~1e-3). Source: the bf16x3 split XLA and cuBLAS use to emulate float32 dots.

    Raises:
      TypeError: ``dtype`` not float16 / bfloat16, ``w`` not a float32 torch.Tensor.
    """
    if dtype not in SPLIT_SHIFT:
        raise TypeError(f"dtype: expected torch.float16 or torch.bfloat16, got {dtype}")
    if not isinstance(w, torch.Tensor) or w.dtype != torch.float32:
        got = w.dtype if isinstance(w, torch.Tensor) else type(w).__name__
        raise TypeError(f"w: expected a float32 torch.Tensor, got {got}")
    S = SPLIT_SHIFT[dtype]
    parts, rest = [], w
    for j in range(3):
        q = (rest * 2.0 ** (j * S)).to(dtype)
        parts.append(q)
        back = q.float() * 2.0 ** (-j * S)
        # a part that is ±inf (an inf weight, or past the 16-bit range) leaves nothing: not inf - inf
        rest = torch.where(torch.isinf(back), torch.zeros_like(rest), rest - back)
    return torch.cat(parts, dim=0).contiguous()


def sum_split_parts(w_raw: torch.Tensor, index_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """``[T, H_I]`` float32 from :func:`split_weight`'s GEMM output ``[T, 3 H_I]``: ``(o0 + o1
    2^-S) + o2 2^-2S`` (S of the 16-bit ``dtype``), in ``_prep_q_kernel``'s order."""
    S = SPLIT_SHIFT[dtype]
    o = w_raw.view(w_raw.shape[0], 3, index_heads)
    return (o[:, 0] + o[:, 1] * 2.0 ** -S) + o[:, 2] * 2.0 ** (-2 * S)


def mm_float32_out(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w^T`` written float32, for 16-bit ``x`` ``[T, K]`` and ``w`` ``[N, K]``: on CUDA
    one GEMM (``torch.mm(..., out_dtype=torch.float32)``: the float32 accumulator stored without
    rounding to 16 bits); elsewhere the float32 product of the widened operands (exact widening,
    the same math)."""
    if x.device.type in ("cuda", "meta"):      # (meta: scripts/layer_glue.py counts the launch)
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return x.float() @ w.float().t()


def gemv_applies(T: int, w: torch.Tensor, device_type: str, path: str,
                 enabled: bool | None = None) -> bool:
    """Whether a projection whose switch says ``"gemv"`` runs the one-token kernel: a step of one
    token (``T == 1``), a K-major weight (``w.stride(-1) == 1``), on CUDA off the ``torch``
    path, with the kernel ``enabled`` (None: :func:`gemv_on`); else torch's GEMM (on the CPU
    too: the interpreter would run it, slowly, where torch's GEMM is the reference path)."""
    return (T == 1 and w.stride(-1) == 1 and device_type == "cuda" and path != "torch"
            and (gemv_on() if enabled is None else bool(enabled)))


def linear_switch(spec, absorbed: bool) -> dict[str, str]:
    """``{gemm: "torch" | "triton" | "gemv"}`` for every GEMM of :data:`LAYER_GEMMS` from the
    layer's ``linear`` argument: ``"torch"``, ``"triton"``, ``"auto"`` (:data:`LINEAR_AUTO` on
    Triton), ``"gemv"`` (every GEMM ``"gemv"``: :func:`gemv_applies`), a mapping ``{gemm:
    "torch" | "triton" | "gemv"}`` (the others torch), or its string form
    ``"x_proj=triton,wo=gemv"``; None reads the environment variable ``DSA_LAYER_LINEAR``
    (default :data:`LINEAR_DEFAULT`)."""
    names = LAYER_GEMMS[absorbed]
    if spec is None:
        spec = os.environ.get(LINEAR_ENV, "") or LINEAR_DEFAULT
    if spec == "gemv":
        return {n: "gemv" for n in names}
    if isinstance(spec, str) and spec in TORCH_PATHS:           # "auto", "triton", "torch"
        pick = {"auto": LINEAR_AUTO, "triton": names}.get(spec, ())
        return {n: "triton" if n in pick else "torch" for n in names}
    if isinstance(spec, str):
        try:
            spec = dict(item.split("=") for item in spec.split(",") if item)
        except ValueError:
            raise ValueError(f"linear: expected 'torch', 'triton', 'auto', 'gemv' or "
                             f"'gemm=choice,...', got {spec!r}") from None
    if not isinstance(spec, Mapping):
        raise TypeError(f"linear: expected a str, a mapping {{gemm: choice}} or None, got "
                        f"{type(spec).__name__}")
    out = {n: "torch" for n in names}
    for n, choice in spec.items():
        if n not in names:
            raise ValueError(f"linear: expected GEMM names of this layer {names}, got {n!r}")
        if choice not in _LINEAR_CHOICES:
            raise ValueError(f"linear[{n!r}]: expected one of {_LINEAR_CHOICES}, got {choice!r}")
        out[n] = choice
    return out



def _into(dst: torch.Tensor, fn, *args, **kwargs) -> None:
    """``dst[...] = fn(*args, **kwargs)``. Eagerly ``fn`` writes ``dst`` itself (``out=dst``, any
    strides: a slice of a larger buffer), so no temporary is made and no copy kernel runs.
    torch.compile cannot trace an ``out=`` into a non-contiguous tensor (a graph break), so
    under it the functional result is copied in; Inductor fuses the copy with ``fn`` (an
    elementwise op) or writes the GEMM's result once more (``mm`` / ``bmm``)."""
    if torch.compiler.is_compiling():
        dst.copy_(fn(*args, **kwargs))
    else:
        fn(*args, **kwargs, out=dst)


def _rope_into(dst: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               interleaved: bool) -> None:
    """Write ``x [..., d]`` rotated by angles whose cos / sin are ``[..., d/2]`` (float32) into
    ``dst`` (x's shape, any float dtype and strides; ``dst`` may be ``x`` itself).

    Four elementwise launches, no concatenation: the two products with the first half are
    formed first (float32), so overwriting ``x`` in place is safe, and each half of the result
    is one ``addcmul`` in float32 rounded once to ``dst``'s dtype, as rotating in float32 and
    casting the result would round it."""
    h = x.shape[-1] // 2
    if interleaved:
        a, b, da, db = x[..., 0::2], x[..., 1::2], dst[..., 0::2], dst[..., 1::2]
    else:
        a, b, da, db = x[..., :h], x[..., h:], dst[..., :h], dst[..., h:]
    ac, as_ = a * cos, a * sin
    _into(da, torch.addcmul, ac, b, sin, value=-1)
    _into(db, torch.addcmul, as_, b, cos)


def _rmsnorm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * w`` in float32 (float32 result): ``rms_norm``, one fused
    kernel on CUDA (``_fused_rms_norm``) where torch has it. The input is cast to float32 first
    because ``w`` is float32 (the layer keeps norm weights float32) and ``rms_norm`` with an
    input of another dtype than its weight warns and runs its six-op composite instead."""
    return nn.functional.rms_norm(x.float(), x.shape[-1:], w, eps)


_capturing = _common.capturing         # a module name, so tests can patch it


def _to_numpy(v):
    """A torch tensor as a float32 NumPy array (complex refused); anything else unchanged."""
    if isinstance(v, torch.Tensor):
        if v.is_complex():
            raise TypeError
        return v.detach().float().cpu().numpy()
    return v


def new_token_targets(block_table: torch.Tensor, context_lens: torch.Tensor, N: int, page_size: int,
                      num_pages: int):
    """Where the N new tokens of each request go, on the device (no host read).

    Token ``t = b * N + i`` sits at position ``pos = L_b - N + i`` (``L_b = context_lens[b]``), in
    page ``block_table[b, pos // P]`` at offset ``pos % P``; it is *mapped* when
    ``0 <= pos < max_pages * P`` and that page entry is in ``[0, num_pages)``.

    Returns:
      ``(pos, page, off, ok)``, each ``[B, N]``: int64, int64 (the entry, meaningful where ok),
      int64, bool. Nothing is multiplied by a page entry, so nothing can wrap.
    """
    P, max_pages = page_size, block_table.shape[1]
    pos = context_lens.long()[:, None] - N + torch.arange(N, device=context_lens.device)[None]
    col = torch.clamp(pos // P, 0, max_pages - 1)
    page = torch.gather(block_table, 1, col).long()
    ok = (pos >= 0) & (pos < max_pages * P) & (page >= 0) & (page < num_pages)
    return pos, page, pos % P, ok


def _encode_rows(src: torch.Tensor, fmt: str, scale_fmt, cache_dtype) -> list[tuple[int, int, torch.Tensor]]:
    """The new tokens' bytes / elements in ``fmt`` as ``[(start_mult, start_add, rows [T, W])]``:
    row t goes to columns ``off * start_mult + start_add + [0, W)`` of its page (plain-PyTorch
    writers of torch_impl.formats)."""
    T, D = src.shape
    if fmt == "latent":
        return [(D, 0, src.to(cache_dtype))]
    if fmt == "fp8_ds_mla":
        return [(np_formats.DS_MLA_BYTES, 0, tformats.quantize_fp8_ds_mla(src.float()))]
    if fmt == "fp8_indexer":
        one = tformats.quantize_fp8_indexer(src.float()[:, None], scale_fmt)     # [T, D + 4]
        return [(D, 0, one[:, :D]), (4, None, one[:, D:])]
    one = tformats.quantize_fp8_model1(src.float()[:, None])                     # [T, page(P=1)]
    return [(576, 0, one[:, :576]), (8, None, one[:, 576:584])]


def _torch_cache_write(src, cache, block_table, context_lens, N, fmt, page_size, scale_fmt):
    """Plain-PyTorch twin of the Triton cache write. PyTorch has no drop-mode scatter, so an
    unmapped token's write goes to the first mapped token's target with that token's bytes (a
    duplicate index with identical values is deterministic), or, when no token is mapped, to
    page 0 offset 0 with the bytes it already holds: either way no byte changes for it. All on
    the device (``index_select`` with a one-element index tensor, no host read)."""
    P, num_pages = page_size, cache.shape[0]
    _, page, off, ok = new_token_targets(block_table, context_lens, N, P, num_pages)
    page, off, ok = page.reshape(-1), off.reshape(-1), ok.reshape(-1)
    any_ok = ok.any()
    t0 = torch.argmax(ok.to(torch.int32)).reshape(1)                 # first mapped token (0 if none)
    page = torch.where(ok, page, torch.where(any_ok, page.index_select(0, t0), 0))
    off = torch.where(ok, off, torch.where(any_ok, off.index_select(0, t0), 0))
    flat = cache.view(num_pages, -1)
    D = src.shape[1]
    for mult, add, vals in _encode_rows(src, fmt, scale_fmt, cache.dtype):
        if add is None:                                   # the scale area after the P data rows
            add = P * (D if fmt == "fp8_indexer" else 576)
        cols = (off * mult + add)[:, None] + torch.arange(vals.shape[1], device=src.device)
        cur = flat[page[:, None], cols]
        vals = torch.where(ok[:, None], vals, torch.where(any_ok, vals.index_select(0, t0), cur))
        flat.index_put_((page[:, None], cols), vals)


def _triton_cache_write(src, cache, block_table, context_lens, N, fmt, page_size, scale_fmt):
    """One launch of ``kernels.cache_write.triton._cache_write_kernel`` (grid ``B * N``)."""
    from kernels.cache_write import triton as tcw
    dev = _common.device_info(src.device)
    _common.require_no_interpreted_bf16(dev, "cache_write", src)
    B, max_pages = block_table.shape
    num_pages = cache.shape[0]
    bf16 = cache.dtype == torch.bfloat16
    ce = tcw.cache_write_constexprs(fmt, page_size=page_size, dim=src.shape[1],
                                    page_bytes=cache[0].numel() * cache.element_size(),
                                    scale_fmt=scale_fmt, bf16_cache=bf16)
    tcw._cache_write_kernel[(B * N,)](src, cache.view(torch.uint16) if bf16 else cache,
                                      block_table.contiguous(), context_lens.contiguous(), N, max_pages, num_pages, block_table.stride(0),
                                      src.stride(0), **ce, num_warps=tcw.NUM_WARPS)


@torch.library.custom_op("dsa::cache_write", mutates_args=("cache",))
def _cache_write_op(src: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
                    context_lens: torch.Tensor, N: int, fmt: str, page_size: int,
                    scale_fmt: Optional[str], path: str) -> None:
    if fmt != "latent":
        _common.check_byte_offset("cache", cache, "float32 scales are stored through a float32 view")
    args = (src, cache, block_table, context_lens, N, fmt, page_size, scale_fmt)
    impls = {"triton": lambda: _triton_cache_write(*args), "torch": lambda: _torch_cache_write(*args)}
    _common.run_path("cache_write", path, impls, BACKEND_PATHS["torch"])


@_cache_write_op.register_fake
def _(src, cache, block_table, context_lens, N, fmt, page_size, scale_fmt, path):
    return None


_WRITE_FORMATS = ("latent", "fp8_ds_mla", "fp8_model1", "fp8_indexer")


def _cache_layout(fmt: str, cache: torch.Tensor, D: int, P: int):
    """(expected shape, dtype ok) of a ``fmt`` cache with ``cache.shape[0]`` pages for rows of D."""
    n = cache.shape[0] if cache.dim() else 0
    u8 = cache.dtype == torch.uint8
    ok = {"latent": cache.dtype in _FLOAT, "fp8_ds_mla": u8 and D == 576,
          "fp8_model1": u8 and D == 512, "fp8_indexer": u8}[fmt]
    return np_formats.cache_shape(fmt, n, P, D), ok


def write_new_tokens(src: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
                     context_lens: torch.Tensor, N: int, fmt: str, *, page_size: int,
                     scale_fmt: str | None = "ue8m0", path: str = "auto") -> None:
    """Quantize the N new tokens' rows of each request into ``cache`` (in place), one launch.

    Token ``t = b * N + i`` goes to position ``L_b - N + i`` of request b (page
    ``block_table[b, pos // P]``, offset ``pos % P``); an unmapped token (position outside
    ``[0, max_pages * P)`` or page entry outside ``[0, num_pages)``) is dropped: no byte of the
    cache changes for it and nothing outside it is addressed (docs/SEMANTICS.md). Bytes: those of
    the NumPy writers in ``kernels/formats.py`` (docs/SPEC.md "Cache layouts").

    Args:
      src: ``[B * N, D]`` float (fp32 / fp16 / bf16), last dim contiguous: latent rows (D = D_qk)
        or indexer keys (D = D_I).
      cache: contiguous, 4-byte aligned: ``"latent"`` ``[num_pages, P, D]`` float;
        ``"fp8_ds_mla"`` uint8 ``[num_pages, P, 656]``; ``"fp8_model1"`` uint8
        ``[num_pages, model1_page_bytes(P)]``; ``"fp8_indexer"`` uint8 ``[num_pages, P * (D + 4)]``.
      block_table: int32 ``[B, max_pages]``, contiguous; context_lens: int32 ``[B]`` (L_b,
        counting the N new tokens).
      N: new tokens per request (>= 1). fmt: the cache layout (above). page_size: P.
      scale_fmt: indexer scale, ``"ue8m0"`` (power of two, the model's) or None (``amax / 448``).
      path: ``"auto"`` (Triton, else plain PyTorch), ``"triton"`` or ``"torch"``.
    Raises:
      TypeError / ValueError: a bad dtype, shape, layout or ``fmt`` / ``path`` (named).
      NotImplementedError: ``path="triton"`` where Triton cannot run (CPU without
        ``TRITON_INTERPRET=1``; bf16 ``src`` in the interpreter).
    """
    if fmt not in _WRITE_FORMATS:
        raise ValueError(f"fmt: expected one of {_WRITE_FORMATS}, got {fmt!r}")
    if path not in TORCH_PATHS:
        raise ValueError(f"path: expected one of {TORCH_PATHS}, got {path!r}")
    _common.check_tensor("src", src, ndim=2, dtypes=_FLOAT)
    _common.check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,))
    _common.check_tensor("context_lens", context_lens, shape=(block_table.shape[0],), dtypes=(torch.int32,))
    if src.shape[0] != block_table.shape[0] * N or src.stride(1) != 1:
        raise ValueError(f"src: expected [B * N = {block_table.shape[0] * N}, D] with a contiguous last "
                         f"dim, got shape {tuple(src.shape)} strides {src.stride()}")
    if not isinstance(cache, torch.Tensor) or not cache.is_contiguous() or cache.dim() < 2:
        raise ValueError(f"cache: expected a contiguous torch.Tensor [num_pages, ...], got "
                         f"{type(cache).__name__ if not isinstance(cache, torch.Tensor) else tuple(cache.shape)}")
    if not block_table.is_contiguous():
        raise ValueError(f"block_table: expected contiguous, got strides {block_table.stride()}")
    want, dtype_ok = _cache_layout(fmt, cache, src.shape[1], int(page_size))
    if tuple(cache.shape) != want or not dtype_ok:
        raise ValueError(f"cache: expected {'float' if fmt == 'latent' else 'uint8'} [num_pages, "
                         f"{', '.join(str(w) for w in want[1:])}] ({fmt!r}, P = {page_size}, D = "
                         f"{src.shape[1]}), got {cache.dtype} {tuple(cache.shape)}")
    for name, t in (("cache", cache), ("block_table", block_table), ("context_lens", context_lens)):
        if t.device != src.device:
            raise ValueError(f"{name}: expected a tensor on src's device {src.device}, got {t.device}")
    torch.ops.dsa.cache_write(src, cache, block_table, context_lens, int(N), fmt, int(page_size),
                              scale_fmt, path)


# ------------------------------------------------------------------ fused step preparation
# Custom ops replace the chains of small kernels between the layer's projections and its DSA
# ops (norms, rope, the indexer's Hadamard rotation and fp8 quantisation, both cache writes):
# ``dsa::prep_x`` after the x projection, ``dsa::prep_q`` after the q projections, and V4's
# inverse rope on the attention output, ``dsa::rope_out``. Their Triton impls are the kernels of
# kernels/layer_prep/triton.py (one launch each); their "torch" impls are the composite ops the
# layer runs without them (DSA_LAYER_FUSED_PREP=0), per stage.

FUSED_PREP_ENV = "DSA_LAYER_FUSED_PREP"
"""Environment switch read when a :class:`DSADecodeLayer` is built without ``fused_prep``:
``"1"`` (default) runs the step's preparation as ``dsa::prep_x`` + ``dsa::prep_q`` (and V4's
output rope as ``dsa::rope_out``), ``"0"`` as the composite torch ops (what torch.compile fuses
by itself)."""


def fused_prep_default() -> bool:
    """:data:`FUSED_PREP_ENV` as a bool (unset: True).

    Raises:
      ValueError: the variable holds something other than ``0``, ``1`` or nothing.
    """
    return env_switch(FUSED_PREP_ENV) is not False


OVERLAP_ENV = "DSA_LAYER_OVERLAP"
"""Environment switch read when a :class:`DSADecodeLayer` is built without ``overlap``: unset
or empty (default) the rule of :func:`overlap_applies`, ``"0"`` never, ``"1"`` wherever it can
(the bench's A/B of the overlap on one machine)."""


def overlap_default() -> bool | None:
    """:data:`OVERLAP_ENV` as ``None`` (unset or empty), False (``0``) or True (``1``).

    Raises:
      ValueError: the variable holds something else.
    """
    return env_switch(OVERLAP_ENV)


OVERLAP_MAX_TOKENS = 16
"""The largest step (B * N tokens) whose indexer branch runs on a side stream by default
(``DSADecodeLayer(overlap=None)``). At B 1 every kernel of the step is latency-bound (the
indexer reads 4 MB at L 32K in ~23 us on the H200), so the indexer's chain (its q preparation,
logits and top-k) can run beside the attention's q projection
(``wq_b``: 64-75 MB of weights at B 1) instead of after it. At B 64 both chains stream DRAM and
overlapping them only shares the bandwidth: the default keeps such steps on one stream."""


def _rope_cos_sin(context_lens: torch.Tensor, N: int, freqs: torch.Tensor):
    """cos / sin ``[B * N, r / 2]`` float32 at the new tokens' positions (float64 angles, one
    rounding to float32; the layer's ``_rope_tables``)."""
    pos = context_lens[:, None] + torch.arange(-N, 0, device=context_lens.device, dtype=torch.float64)
    ang = (pos[..., None] * freqs).reshape(-1, freqs.shape[0])
    return torch.cos(ang).float(), torch.sin(ang).float()


def _check_hadamard(hadamard, d_i: int, device: torch.device) -> None:
    """The ``hadamard`` argument of :func:`prepare_x` / :func:`prepare_q`: a floating-point
    ``[d_i, d_i]`` tensor on the activations' ``device`` (the kernels read it whole).

    Raises:
      TypeError: not a torch.Tensor, or not a floating-point dtype (an integer or bool matrix
        would be cast silently: a 0 / 1 matrix is no rotation).
      ValueError: another shape, or another device.
    """
    if not isinstance(hadamard, torch.Tensor):
        raise TypeError(f"hadamard: expected a torch.Tensor (the [{d_i}, {d_i}] +-1 matrix), got "
                        f"{type(hadamard).__name__}")
    if not hadamard.dtype.is_floating_point:
        raise TypeError(f"hadamard: expected a floating-point dtype, got {hadamard.dtype}")
    if tuple(hadamard.shape) != (d_i, d_i):
        raise ValueError(f"hadamard: expected the [{d_i}, {d_i}] +-1 matrix (D_I = {d_i}), got "
                         f"shape {tuple(hadamard.shape)}")
    if hadamard.device != device:
        raise ValueError(f"hadamard: expected a tensor on {device} (the activations' device), got "
                         f"{hadamard.device}")


def _hadamard_rows(rows: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """``rows [M, D] @ sign * D^-0.5`` in ``rows``' dtype (float32 accumulation; the scale as
    the GEMM's alpha, so the product is rounded once)."""
    zero = torch.zeros((), dtype=rows.dtype, device=rows.device)
    return torch.addmm(zero, rows, sign.to(rows.dtype), beta=0, alpha=sign.shape[0] ** -0.5)


def _torch_prep_x(xq, xkv, xk, x, q_norm, kv_norm, k_norm_w, k_norm_b, rope_freqs, hadamard,
                  kv_cache, k_cache, block_table, context_lens, N, kv_format, page_size, scale_fmt,
                  eps, norm_rope):
    """Composite twin of ``_prep_x_kernel`` (the layer's own torch ops, per token row; a float32
    x projection rounded to dt first, as the kernel loads it)."""
    dt, T = x.dtype, xq.shape[0]
    xq, xkv, xk = (t.to(dt) for t in (xq, xkv, xk))
    r = rope_freqs.shape[0] * 2
    cos, sin = _rope_cos_sin(context_lens, N, rope_freqs)                 # [T, r/2]
    qr = _rmsnorm(xq, q_norm, eps).to(dt)
    x32 = x.to(torch.float32, copy=True)
    latent = torch.empty(T, xkv.shape[1], dtype=dt, device=xq.device)
    if norm_rope:                                                         # V4: all dims normed
        lat32 = _rmsnorm(xkv, kv_norm, eps)
        _rope_into(lat32[..., -r:], lat32[..., -r:], cos, sin, True)
        latent.copy_(lat32)
    else:                                                                 # V3.2: the first C
        C = xkv.shape[1] - r
        latent[:, :C] = _rmsnorm(xkv[:, :C], kv_norm, eps)
        _rope_into(latent[:, C:], xkv[:, C:], cos, sin, True)
    ik32 = nn.functional.layer_norm(xk.float(), xk.shape[-1:], k_norm_w, k_norm_b, eps)
    ik = ik32.to(dt)
    _rope_into(ik[:, :r], ik32[:, :r], cos, sin, False)
    ik = _hadamard_rows(ik, hadamard)
    _torch_cache_write(latent, kv_cache, block_table, context_lens, N, kv_format, page_size, None)
    _torch_cache_write(ik, k_cache, block_table, context_lens, N, "fp8_indexer", page_size, scale_fmt)
    return qr.contiguous(), x32


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` (2-D) itself when its last dim is contiguous (the kernels take a row stride), else a
    contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _triton_prep_x(xq, xkv, xk, x, q_norm, kv_norm, k_norm_w, k_norm_b, rope_freqs, hadamard,
                   kv_cache, k_cache, block_table, context_lens, N, kv_format, page_size, scale_fmt,
                   eps, norm_rope):
    """One launch of ``kernels.layer_prep.triton._prep_x_kernel`` (grid ``(B * N, 4)``)."""
    from kernels.layer_prep import triton as tlp
    dev = _common.device_info(xq.device)
    _common.require_no_interpreted_bf16(dev, "prep_x", x, kv_cache)
    T, D_qk, D_I = xq.shape[0], xkv.shape[1], xk.shape[1]
    r = rope_freqs.shape[0] * 2
    nope = D_qk - r
    why = tlp.supported(index_head_dim=D_I, rope=r, latent_nope=nope)
    if why is not None:
        raise NotImplementedError(f"prep_x: {why}")
    xq, xkv, xk, x = (_last_dim_contiguous(t) for t in (xq, xkv, xk, x))
    bf16 = kv_cache.dtype == torch.bfloat16
    ce = tlp.prep_x_constexprs(q_lora=xq.shape[1], d_qk=D_qk, nope=nope, rope=r, norm_rope=norm_rope,
                               kv_format=kv_format, page_size=page_size,
                               kv_page_bytes=kv_cache[0].numel() * kv_cache.element_size(),
                               bf16_cache=bf16, index_head_dim=D_I, scale_fmt=scale_fmt)
    qr = torch.empty(xq.shape, dtype=x.dtype, device=xq.device)
    x32 = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    B, max_pages = block_table.shape
    tlp._prep_x_kernel[(T, tlp.X_ROLES)](
        xq, xkv, xk, x, qr, x32, q_norm, kv_norm, k_norm_w, k_norm_b, rope_freqs,
        hadamard.to(x.dtype).contiguous(), kv_cache.view(torch.uint16) if bf16 else kv_cache,
        k_cache, block_table, context_lens,
        N, max_pages, kv_cache.shape[0], block_table.stride(0), xq.stride(0), xkv.stride(0),
        xk.stride(0), x.stride(0), x.shape[1], eps, **ce, num_warps=tlp.X_NUM_WARPS)
    return qr, x32


@torch.library.custom_op("dsa::prep_x", mutates_args=("kv_cache", "k_cache"))
def _prep_x_op(xq: torch.Tensor, xkv: torch.Tensor, xk: torch.Tensor, x: torch.Tensor,
               q_norm: torch.Tensor, kv_norm: torch.Tensor, k_norm_w: torch.Tensor,
               k_norm_b: torch.Tensor, rope_freqs: torch.Tensor, hadamard: torch.Tensor,
               kv_cache: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
               context_lens: torch.Tensor, N: int, kv_format: str, page_size: int,
               scale_fmt: Optional[str], eps: float, norm_rope: bool,
               path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's work between the x projection and the q projections, and both cache writes
    (:func:`prepare_x`)."""
    if kv_format != "latent":
        _common.check_byte_offset("kv_cache", kv_cache, "float32 scales are stored through a float32 view")
    _common.check_byte_offset("k_cache", k_cache, "float32 scales are stored through a float32 view")
    args = (xq, xkv, xk, x, q_norm, kv_norm, k_norm_w, k_norm_b, rope_freqs, hadamard, kv_cache,
            k_cache, block_table, context_lens, N, kv_format, page_size, scale_fmt, eps, norm_rope)
    impls = {"triton": lambda: _triton_prep_x(*args), "torch": lambda: _torch_prep_x(*args)}
    return _common.run_path("prep_x", path, impls, BACKEND_PATHS["torch"])


@_prep_x_op.register_fake
def _(xq, xkv, xk, x, q_norm, kv_norm, k_norm_w, k_norm_b, rope_freqs, hadamard, kv_cache, k_cache,
      block_table, context_lens, N, kv_format, page_size, scale_fmt, eps, norm_rope, path):
    return x.new_empty(xq.shape), x.new_empty(x.shape, dtype=torch.float32)


def prepare_x(xq, xkv, xk, x, q_norm, kv_norm, k_norm_w, k_norm_b, rope_freqs, hadamard, kv_cache,
              k_cache, block_table, context_lens, N: int, kv_format: str, *, page_size: int,
              scale_fmt: str | None, eps: float, norm_rope: bool, path: str = "auto"):
    """The decode step's preparation after the x projection, fused (``dsa::prep_x``; math,
    rounding points and sources in ``kernels/layer_prep/triton.py``).

    Args:
      xq, xkv, xk: ``[T, q_lora]``, ``[T, D_qk]``, ``[T, D_I]`` in the layer dtype dt (T = B * N,
        token ``b * N + i``; the x projection's column slices, last dim contiguous), or float32
        for a 16-bit dt (a GEMM that wrote float32: rounded to dt first, the same rounding
        point as a GEMM writing dt).
      x: ``[T, hidden]`` dt, the layer input.
      q_norm: ``[q_lora]``, kv_norm: ``[C]`` (V3.2) or ``[D_qk]`` (V4), k_norm_w / k_norm_b:
        ``[D_I]``, all float32. rope_freqs: ``[r / 2]`` float64. hadamard: ``[D_I, D_I]`` the
        +-1 Sylvester matrix (the layer's ``hadamard_sign``; any float dtype, +-1 being exact in
        each; both paths read it).
      kv_cache, k_cache, block_table, context_lens, N, kv_format, page_size, scale_fmt: as
        :func:`write_new_tokens` (the latent rows go to ``kv_cache`` in ``kv_format``, the
        indexer keys to ``k_cache`` as ``fp8_indexer`` with ``scale_fmt``), written in place;
        unmapped new tokens are dropped.
      eps: the norms' epsilon. norm_rope: V4 (rmsnorm over all D_qk latent dims) or V3.2
        (the first D_qk - r dims; the rope dims are the raw projection).
      path: ``"auto"``, ``"triton"`` (one kernel launch) or ``"torch"`` (the composite ops).
    Returns:
      ``(qr, x32)``: ``[T, q_lora]`` dt, ``rmsnorm(xq) * q_norm``; ``[T, hidden]`` float32, x.
    Raises:
      TypeError: ``hadamard`` is not a floating-point torch.Tensor; ``x`` not float32 /
        float16 / bfloat16; ``xq`` / ``xkv`` / ``xk`` not in x's dtype (or float32 with a
        16-bit x).
      ValueError: ``hadamard`` is not ``[D_I, D_I]`` (D_I = ``xk.shape[1]``) on ``xk``'s device.
    """
    _check_hadamard(hadamard, xk.shape[1], xk.device)
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"x: expected a torch.Tensor of one of {_FLOAT}, got {got}")
    ok = (x.dtype,) + ((torch.float32,) if x.dtype in SPLIT_SHIFT else ())
    for name, t in (("xq", xq), ("xkv", xkv), ("xk", xk)):
        if t.dtype not in ok:
            raise TypeError(f"{name}: expected one of {ok} (x is {x.dtype}), got {t.dtype}")
    return torch.ops.dsa.prep_x(xq, xkv, xk, x, q_norm, kv_norm, k_norm_w, k_norm_b, rope_freqs,
                                hadamard, kv_cache, k_cache, block_table, context_lens, int(N),
                                kv_format, int(page_size), scale_fmt, float(eps), bool(norm_rope), path)


def _torch_prep_q(iq, w_raw, q, q_lat, hadamard, rope_freqs, context_lens, N, heads, index_heads,
                  d_qk, qk_nope, scale_fmt, eps, absorbed, q_head_norm, part="all"):
    """Composite twin of ``_prep_q_kernel`` (the layer's own torch ops); computes both parts
    whatever ``part`` (the reference path)."""
    dt, T = iq.dtype, iq.shape[0]
    r = rope_freqs.shape[0] * 2
    cos, sin = _rope_cos_sin(context_lens, N, rope_freqs)
    cos_h, sin_h = cos[:, None], sin[:, None]
    iq = iq.reshape(T, index_heads, -1).clone()
    _rope_into(iq[..., :r], iq[..., :r], cos_h, sin_h, False)
    iq = _hadamard_rows(iq.view(T * index_heads, -1), hadamard).view(T, index_heads, -1)
    q_scale = tformats.indexer_scale(torch.linalg.vector_norm(iq, float("inf"), dim=-1), scale_fmt)
    idx_q = (iq / q_scale[..., None]).clamp_(-np_formats.FP8_MAX, np_formats.FP8_MAX).to(torch.float8_e4m3fn)
    if w_raw.shape[-1] == 3 * index_heads:           # the split weights_proj: its three parts
        w_raw = sum_split_parts(w_raw, index_heads, dt)
    idx_w = w_raw * q_scale
    q = q.reshape(T, heads, -1)
    if absorbed:
        C = q_lat.shape[2]
        q_mla = torch.empty(T, heads, C + r, dtype=dt, device=iq.device)
        q_mla[..., :C] = q_lat.transpose(0, 1)
        _rope_into(q_mla[..., C:], q[..., qk_nope:], cos_h, sin_h, True)
    else:
        q_mla = nn.functional.rms_norm(q, (d_qk,), None, eps) if q_head_norm else q.clone()
        _rope_into(q_mla[..., -r:], q_mla[..., -r:], cos_h, sin_h, True)
    return q_mla.contiguous(), idx_q.contiguous(), idx_w.contiguous()


def _prep_q_config(index_heads: int, heads: int, dtype: torch.dtype):
    from kernels.layer_prep import triton as tlp
    return tlp.prep_q_heuristic(index_heads, heads, torch.finfo(dtype).bits // 8)


def _triton_prep_q(iq, w_raw, q, q_lat, hadamard, rope_freqs, context_lens, N, heads, index_heads,
                   d_qk, qk_nope, scale_fmt, eps, absorbed, q_head_norm, part="all"):
    """One launch of ``kernels.layer_prep.triton._prep_q_kernel``: grid ``(B * N, ceil(H_I /
    block_hi) + ceil(H / block_hm))`` for ``part="all"``; ``"index"`` launches the indexer's
    programs only (the first ``ceil(H_I / block_hi)``), ``"mla"`` the MLA programs only (the
    kernel compiled with ``NUM_HI = 0``, :func:`kernels.layer_prep.triton.prep_q_constexprs`);
    the outputs of the other part are returned unwritten."""
    from kernels.layer_prep import triton as tlp
    dev = _common.device_info(iq.device)
    _common.require_no_interpreted_bf16(dev, "prep_q", iq)
    T, dt = iq.shape[0], iq.dtype
    D_I, r = iq.shape[1] // index_heads, rope_freqs.shape[0] * 2
    nope = q_lat.shape[2] if absorbed else d_qk - r
    why = tlp.supported(index_head_dim=D_I, rope=r, mla_row=nope if absorbed else d_qk)
    if why is not None:
        raise NotImplementedError(f"prep_q: {why}")
    cfg = _prep_q_config(index_heads, heads, dt)
    iq, w_raw, q = (_last_dim_contiguous(t) for t in (iq, w_raw, q))
    q_lat = q_lat.contiguous() if absorbed else None
    ce = tlp.prep_q_constexprs(cfg, index_heads=index_heads, index_head_dim=D_I, rope=r,
                               absorbed=absorbed, head_norm=q_head_norm, qk_nope=qk_nope, nope=nope,
                               d_qk=d_qk, scale_fmt=scale_fmt, part=part,
                               w_parts=w_raw.shape[-1] // index_heads,
                               w_shift=SPLIT_SHIFT.get(dt, 0))
    q_mla = torch.empty(T, heads, d_qk, dtype=dt, device=iq.device)
    idx_q = torch.empty(T, index_heads, D_I, dtype=torch.float8_e4m3fn, device=iq.device)
    idx_w = torch.empty(T, index_heads, dtype=torch.float32, device=iq.device)
    lat = q_lat if absorbed else q
    grid = (T, ce["NUM_HI"] + (-(-heads // cfg.block_hm) if part != "index" else 0))
    tlp._prep_q_kernel[grid](
        iq, w_raw, q, lat, q_mla, idx_q.view(torch.uint8), idx_w, rope_freqs,
        hadamard.to(dt).contiguous(), context_lens,
        N, heads, iq.stride(0), w_raw.stride(0), q.stride(0), q.shape[1] // heads,
        lat.stride(0) if absorbed else 0, eps, **ce, num_warps=cfg.num_warps)
    return q_mla, idx_q, idx_w


@torch.library.custom_op("dsa::prep_q", mutates_args=())
def _prep_q_op(iq: torch.Tensor, w_raw: torch.Tensor, q: torch.Tensor, q_lat: Optional[torch.Tensor],
               hadamard: torch.Tensor, rope_freqs: torch.Tensor, context_lens: torch.Tensor, N: int,
               heads: int, index_heads: int, d_qk: int, qk_nope: int, scale_fmt: Optional[str],
               eps: float, absorbed: bool, q_head_norm: bool, path: str,
               part: str = "all") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's work between the q projections and the DSA ops (:func:`prepare_q`)."""
    if w_raw.shape[-1] != index_heads and (w_raw.shape[-1] != 3 * index_heads
                                           or iq.dtype not in SPLIT_SHIFT):
        raise ValueError(f"w_raw: expected [T, {index_heads}] float32, or [T, {3 * index_heads}] "
                         f"with a 16-bit iq (the split weights_proj), got {tuple(w_raw.shape)} "
                         f"with iq {iq.dtype}")
    args = (iq, w_raw, q, q_lat, hadamard, rope_freqs, context_lens, N, heads, index_heads, d_qk,
            qk_nope, scale_fmt, eps, absorbed, q_head_norm, part)
    impls = {"triton": lambda: _triton_prep_q(*args), "torch": lambda: _torch_prep_q(*args)}
    return _common.run_path("prep_q", path, impls, BACKEND_PATHS["torch"])


@_prep_q_op.register_fake
def _(iq, w_raw, q, q_lat, hadamard, rope_freqs, context_lens, N, heads, index_heads, d_qk, qk_nope,
      scale_fmt, eps, absorbed, q_head_norm, path, part="all"):
    T = iq.shape[0]
    return (iq.new_empty(T, heads, d_qk), iq.new_empty(T, index_heads, iq.shape[1] // index_heads,
                                                       dtype=torch.float8_e4m3fn),
            iq.new_empty(T, index_heads, dtype=torch.float32))


def prepare_q(iq, w_raw, q, q_lat, hadamard, rope_freqs, context_lens, N: int, *, heads: int,
              index_heads: int, d_qk: int, qk_nope: int, scale_fmt: str | None, eps: float,
              absorbed: bool, q_head_norm: bool = True, path: str = "auto", part: str = "all"):
    """The decode step's preparation after the q projections, fused (``dsa::prep_q``; math,
    rounding points and sources in ``kernels/layer_prep/triton.py``).

    Args:
      iq: ``[T, H_I * D_I]`` dt, the ``indexer.wq_b`` projection (T = B * N).
      w_raw: ``[T, H_I]`` float32, ``x @ indexer.weights_proj.T * H_I^-0.5 * D_I^-0.5``; or
        ``[T, 3 H_I]`` (16-bit dt only), its three parts (:func:`split_weight`'s GEMM), summed
        here as ``(o0 + o1 2^-S) + o2 2^-2S`` (:func:`sum_split_parts`).
      q: the ``wq_b`` projection, ``[T, H * (qk_nope + r)]`` (V3.2) or ``[T, H * D_qk]`` (V4), dt.
      q_lat: V3.2 ``[H, T, C]`` dt, q_nope through ``wkv_b``'s key half (the absorption bmm,
        contiguous); V4 None.
      hadamard: ``[D_I, D_I]`` +-1 Sylvester matrix (as :func:`prepare_x`). rope_freqs: ``[r / 2]``
        float64. context_lens: ``[B]`` int32 (positions ``L_b - N + i``). N: new tokens per
        request.
      heads, index_heads, d_qk, qk_nope: H, H_I, D_qk, V3.2's per-head nope width (0 for V4).
      scale_fmt: ``"ue8m0"`` or None; absorbed: V3.2 (else V4); q_head_norm: V4's per-head rms
        norm of q (no weight) before its rope, with epsilon ``eps``.
      path: ``"auto"``, ``"triton"`` (one launch) or ``"torch"`` (the composite ops).
      part: ``"all"`` (default); ``"index"`` writes only ``idx_q`` / ``idx_w`` and ``"mla"`` only
        ``q_mla`` on the ``triton`` path (the other outputs are returned unwritten: the layer's
        overlapped step runs the two parts on two streams); the ``torch`` path writes all three.
    Returns:
      ``(q_mla, idx_q, idx_w)``: ``[T, H, D_qk]`` dt (the sparse-MLA query), ``[T, H_I, D_I]``
      float8_e4m3fn, ``[T, H_I]`` float32 (the indexer's q and head weights, scale folded in).
    Raises:
      TypeError: ``hadamard`` is not a floating-point torch.Tensor.
      ValueError: ``index_heads`` is not a positive int dividing ``iq.shape[-1]``; ``w_raw`` not
        ``[T, H_I]`` or ``[T, 3 H_I]`` float32; ``hadamard``
        is not ``[D_I, D_I]`` (D_I = ``iq.shape[-1] / index_heads``) on ``iq``'s device;
        ``part`` not one of ``"all"``, ``"index"``, ``"mla"``.
    """
    if part not in ("all", "index", "mla"):
        raise ValueError(f"part: expected 'all', 'index' or 'mla', got {part!r}")
    if (type(index_heads) is bool or not isinstance(index_heads, (int, np.integer)) or index_heads < 1
            or iq.shape[-1] % int(index_heads)):
        raise ValueError(f"index_heads: expected a positive int dividing iq's last dim "
                         f"({iq.shape[-1]} = H_I * D_I), got {index_heads!r}")
    _check_hadamard(hadamard, iq.shape[-1] // int(index_heads), iq.device)
    H_I = int(index_heads)
    widths = (H_I, 3 * H_I) if iq.dtype in SPLIT_SHIFT else (H_I,)
    if (not isinstance(w_raw, torch.Tensor) or w_raw.dtype != torch.float32 or w_raw.dim() != 2
            or w_raw.shape[0] != iq.shape[0] or w_raw.shape[1] not in widths):
        got = (f"{w_raw.dtype} {tuple(w_raw.shape)}" if isinstance(w_raw, torch.Tensor)
               else type(w_raw).__name__)
        raise ValueError(f"w_raw: expected float32 [{iq.shape[0]}, {H_I}]"
                         + (f" or [{iq.shape[0]}, {3 * H_I}]" if len(widths) > 1 else "")
                         + f", got {got}")
    return torch.ops.dsa.prep_q(iq, w_raw, q, q_lat, hadamard, rope_freqs, context_lens, int(N),
                                int(heads), int(index_heads), int(d_qk), int(qk_nope), scale_fmt,
                                float(eps), bool(absorbed), bool(q_head_norm), path, part)


_OVERLAP_GEMMS = ("wq_b", "wkv_b_q", "indexer.wq_b", "indexer.weights_proj")
"""The projections inside ``dsa::q_index_overlap``: torch's GEMMs there (the layer overlaps only
when its switch runs none of them on the Triton GEMM, whose split-K counters are one buffer,
nor, at one token, on the one-token kernel: ``"gemv"``)."""

GEMV_N_MAJOR = ("wkv_b_q",)
"""The projections whose weight the layer passes N-major (``wkv_b``'s key half as ``w^T``): never
on the one-token kernel (:func:`gemv_applies`' stride check)."""

_side_streams: dict = {}          # torch.device -> the indexer branch's side stream


def overlap_applies(T: int, device_type: str, fused_prep: bool, path: str, linear: Mapping,
                    overlap: bool | None = None, gemv: bool | None = None) -> bool:
    """Whether ``DSADecodeLayer(overlap=overlap)`` runs a step of ``T`` tokens (B * N) as
    :func:`q_index_overlap`: on CUDA, with ``fused_prep``, off the ``torch`` path, with none of
    :data:`_OVERLAP_GEMMS` on the Triton GEMM (``linear``: :func:`linear_switch`'s dict; it runs
    for T <= 64 only) nor, at ``T == 1``, on the one-token kernel (``"gemv"`` with ``gemv``
    true; None: :func:`gemv_on`; at B 1 it is faster than the overlap, H100 2026-12-06), and
    ``overlap`` True or None with ``T <= OVERLAP_MAX_TOKENS``.

    Raises:
      TypeError: ``device_type`` not a str, ``linear`` not a mapping, ``overlap`` not a bool or
        None.
      ValueError: ``T`` not a positive int, ``path`` not one of the torch paths.
    """
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 1:
        raise ValueError(f"T: expected a positive int (B * N tokens), got {T!r}")
    if not isinstance(device_type, str):
        raise TypeError(f"device_type: expected a str such as 'cuda' (torch.device.type), got "
                        f"{type(device_type).__name__}")
    if not isinstance(linear, Mapping):
        raise TypeError(f"linear: expected linear_switch's dict {{gemm: 'torch' | 'triton' | "
                        f"'gemv'}}, got "
                        f"{type(linear).__name__}")
    if overlap is not None and not isinstance(overlap, (bool, np.bool_)):
        raise TypeError(f"overlap: expected a bool or None, got {type(overlap).__name__} {overlap!r}")
    if path not in TORCH_PATHS:
        raise ValueError(f"path: expected one of {TORCH_PATHS}, got {path!r}")
    overlap = None if overlap is None else bool(overlap)
    if overlap is False or not fused_prep or path == "torch" or device_type != "cuda":
        return False
    if T <= tlinear.MAX_M and any(linear.get(n) == "triton" for n in _OVERLAP_GEMMS):
        return False
    if (T == 1 and any(linear.get(n) == "gemv" for n in _OVERLAP_GEMMS)
            and (gemv_on() if gemv is None else bool(gemv))):
        return False              # one token: the one-token kernel, not the overlap's GEMMs
    return bool(overlap) or T <= OVERLAP_MAX_TOKENS


def _side_stream(device: torch.device):
    """The side stream of ``device`` (made on the first overlapped step there; one for every
    layer: each step's fork first waits on the main stream), at high priority: at B 1 the
    attention's q projection fills every SM with CTAs streaming its weights, and without the
    priority the indexer's small latency-bound kernels wait for SMs behind it (H200, 2026-12-05:
    V4 B 1 141.5 -> 140.7 us at default priority, bench/NOTES.md). The priority is captured into
    the graph's kernel nodes (torch instantiates graphs with node priorities)."""
    key = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    stream = _side_streams.get(key)
    if stream is None:
        stream = _side_streams[key] = torch.cuda.Stream(device=key, priority=-1)
    return stream


OVERLAP_CARVEOUT_ENV = "DSA_LAYER_OVERLAP_CARVEOUT"
OVERLAP_SM_CARVEOUT = 0
"""SMs the overlapped step's attention q projection (``wq_b``, V3.2's ``wkv_b_q``) leaves free for
the indexer running beside it on the side stream (``torch._C._set_sm_carveout_experimental``:
cuBLAS / cuBLASLt's SM-count target, around those GEMMs only). Why: at B 1 their kernels are
cuBLASLt's persistent ``nvjet`` GEMMs (H100 / H200 profiles, 2026-12-05), one CTA an SM for the
whole GEMM, so without a carveout the indexer's kernels wait for SMs behind them and the overlap
saved 1-5 us of a predicted ~20 (bench/NOTES.md). The candidate is 32 of 132 (the indexer's
logits kernel runs in a few waves there; the bandwidth-bound GEMM keeps most of its rate on 100
SMs), but no GPU has run the carveout yet: the default stays 0 (the overlap as measured) until a
sweep of ``DSA_LAYER_OVERLAP_CARVEOUT`` (32, 64) picks a value. The carveout changes the GEMM's kernel choice, so the
q projection's rounding may differ from the one-stream step's in the last bf16 bit (the
indexer's outputs and the caches stay bitwise the same)."""


def overlap_sm_carveout() -> int:
    """:data:`OVERLAP_CARVEOUT_ENV` as a non-negative int (unset: :data:`OVERLAP_SM_CARVEOUT`;
    0: no carveout). Read when a :class:`DSADecodeLayer` is built (``layer.overlap_carveout``);
    :func:`q_index_overlap` refuses a value of at least the device's SM count before any launch.

    Raises:
      ValueError: the variable is not a non-negative integer.
    """
    v = os.environ.get(OVERLAP_CARVEOUT_ENV, "").strip()
    if v == "":
        return OVERLAP_SM_CARVEOUT
    if not re.fullmatch(r"[0-9]{1,6}", v):            # ASCII digits only ("²".isdigit() is True)
        raise ValueError(f"{OVERLAP_CARVEOUT_ENV}: expected a non-negative integer (SMs), got {v!r}")
    return int(v)


@contextlib.contextmanager
def _sm_carveout(sms: int):
    """GEMMs launched inside leave ``sms`` SMs free (torch's experimental carveout, nothing where
    this torch lacks it or ``sms`` is 0), routed through cuBLASLt
    (``torch.backends.cuda.preferred_blas_library("cublaslt")``, where this torch has it): torch
    passes the carveout to cuBLASLt as its SM-count target (pytorch/pytorch#144974), to plain
    cuBLAS only in later versions (#183330). Both settings are restored after."""
    get = getattr(torch._C, "_get_sm_carveout_experimental", None)
    put = getattr(torch._C, "_set_sm_carveout_experimental", None)
    if not sms or get is None or put is None:
        yield
        return
    prev, prev_lib = get(), torch.backends.cuda.preferred_blas_library()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # torch warns once that it is experimental
        put(int(sms))
    try:
        try:
            torch.backends.cuda.preferred_blas_library("cublaslt")
        except RuntimeError:                       # a torch built without cuBLASLt (CPU builds)
            pass
        yield
    finally:
        put(prev)
        torch.backends.cuda.preferred_blas_library(prev_lib)


TOPK_WINDOW_ENV = "DSA_LAYER_TOPK_WINDOW"


def topk_window_on() -> bool:
    """``DSA_LAYER_TOPK_WINDOW`` read once (at construction): V4's index list from
    ``dsa::indexer_topk_window`` (the window kernel and the top-k write one
    ``[B, N, topk + window]`` tensor; default), or, with ``0`` (the bench's A/B),
    ``window_split``, ``indexer_topk`` and a ``torch.cat``: the same bits.

    Raises:
      ValueError: the variable holds anything but ``0``, ``1`` or nothing (named)."""
    return env_switch(TOPK_WINDOW_ENV) is not False


def _select_indices(idx_q, idx_w, k_cache, block_table, context_lens, N: int, topk: int,
                    window: int, path: str, *, report_lens: bool, one_op: bool):
    """The step's positions ``[B, N, topk + window]`` (V4: the indexer's top-k over the positions
    before each draft's window, then the window; V3.2, ``window`` 0: the top-k) and the drafts'
    indexer lengths ``[B, N]`` (V3.2: only reported, computed when ``report_lens``, else None).
    ``one_op``: V4's list from ``dsa::indexer_topk_window`` (:func:`topk_window_on`)."""
    if window and one_op:                # one [B, N, topk + window] tensor, no concatenation
        return indexer_topk_window(idx_q, idx_w, k_cache, block_table, context_lens, topk,
                                   window, path=path)
    if window:
        idx_lens, win = window_split(context_lens, N, window, path=path)
        top = indexer_topk(idx_q, idx_w, k_cache, block_table, idx_lens, topk, path=path)
        return torch.cat([top, win], dim=-1), idx_lens
    indices = indexer_topk(idx_q, idx_w, k_cache, block_table, context_lens, topk, path=path)
    idx_lens = window_split(context_lens, N, 0, path=path)[0] if report_lens else None
    return indices, idx_lens


def _mm(x, w, alpha, zero):
    """``alpha * x @ w^T`` as ``DSADecodeLayer._gemm`` runs it on torch's path (``addmm`` with
    ``beta=0`` when scaled: the scale in the GEMM's epilogue)."""
    wt = w.transpose(-1, -2)
    return x @ wt if alpha == 1.0 else torch.addmm(zero, x, wt, beta=0, alpha=alpha)


@torch.library.custom_op("dsa::q_index_overlap", mutates_args=())
def _q_index_overlap_op(qr: torch.Tensor, x32: torch.Tensor, wq_b: torch.Tensor,
                        wkv_b_q: Optional[torch.Tensor], idx_wq_b: torch.Tensor,
                        weights_proj: torch.Tensor, zero_f32: torch.Tensor, hadamard: torch.Tensor,
                        rope_freqs: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                        context_lens: torch.Tensor, N: int, heads: int, index_heads: int, d_qk: int,
                        qk_nope: int, scale_fmt: Optional[str], eps: float, absorbed: bool,
                        q_head_norm: bool, w_alpha: float, topk: int, window: int,
                        topk_window_op: bool, path: str,
                        carveout: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                           torch.Tensor, torch.Tensor]:
    """:func:`q_index_overlap` (one opaque op, so torch.compile keeps its two streams)."""
    dev = qr.device
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    if not 0 <= carveout < sms:        # before any launch: nothing is left half done
        raise ValueError(f"carveout: expected SMs in [0, {sms}) ({OVERLAP_CARVEOUT_ENV}; "
                         f"{torch.cuda.get_device_name(dev)} has {sms}), got {carveout}")
    T, dt = qr.shape[0], qr.dtype
    H_I = index_heads
    prep = dict(heads=heads, index_heads=H_I, d_qk=d_qk, qk_nope=qk_nope, scale_fmt=scale_fmt,
                eps=eps, absorbed=absorbed, q_head_norm=q_head_norm, path=path)
    # Every buffer both branches name is made on the main stream before the fork (each half of
    # dsa::prep_q gets the other half's inputs as unread arguments) and is referenced until
    # after the join, so none is reused while the other stream may touch it. What the side
    # stream allocates (the indexer's q and indices) goes back to the side stream's pool when
    # freed; its next use starts with a wait on the main stream (every fork), after this step's
    # readers.
    q = torch.empty(T, wq_b.shape[0], dtype=dt, device=dev)
    q_lat = None
    if absorbed:     # q_nope through wkv_b's key half, per head [T, nope] @ [nope, C]: [H, T, C]
        q_lat = torch.empty(heads, T, wkv_b_q.shape[1], dtype=dt, device=dev)
    # the indexer's two projections before the fork, with every SM (cuBLAS's persistent GEMMs
    # launch one CTA an SM and hold it)
    iq = qr @ idx_wq_b.t()                                                  # [T, H_I * D_I]
    w_raw = _mm(x32, weights_proj, w_alpha, zero_f32)                       # [T, H_I] float32
    main, side = torch.cuda.current_stream(dev), _side_stream(dev)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        _, idx_q, idx_w = prepare_q(iq, w_raw, q, q_lat, hadamard, rope_freqs, context_lens, N,
                                    **prep, part="index")
        B = context_lens.shape[0]
        idx_q, idx_w = idx_q.view(B, N, H_I, -1), idx_w.view(B, N, H_I)
        indices, idx_lens = _select_indices(idx_q, idx_w, k_cache, block_table, context_lens, N,
                                            topk, window, path, report_lens=True,
                                            one_op=topk_window_op)
    # the attention's q projection beside the indexer, leaving it SMs (overlap_sm_carveout)
    with _sm_carveout(carveout):
        torch.mm(qr, wq_b.t(), out=q)                                       # [T, H * (nope + r) | D_qk]
        if absorbed:
            torch.bmm(q.view(T, heads, -1)[..., :qk_nope].transpose(0, 1), wkv_b_q.transpose(1, 2),
                      out=q_lat)
    q_mla, _, _ = prepare_q(iq, w_raw, q, q_lat, hadamard, rope_freqs, context_lens, N, **prep,
                            part="mla")
    main.wait_stream(side)
    return q_mla, idx_q.view(T, H_I, -1), idx_w.view(T, H_I), indices, idx_lens


@_q_index_overlap_op.register_fake
def _(qr, x32, wq_b, wkv_b_q, idx_wq_b, weights_proj, zero_f32, hadamard, rope_freqs, k_cache,
      block_table, context_lens, N, heads, index_heads, d_qk, qk_nope, scale_fmt, eps, absorbed,
      q_head_norm, w_alpha, topk, window, topk_window_op, path, carveout):
    T, B = qr.shape[0], context_lens.shape[0]
    i32 = torch.int32
    return (qr.new_empty(T, heads, d_qk),
            qr.new_empty(T, index_heads, idx_wq_b.shape[0] // index_heads, dtype=torch.float8_e4m3fn),
            qr.new_empty(T, index_heads, dtype=torch.float32),
            qr.new_empty(B, N, topk + window, dtype=i32), qr.new_empty(B, N, dtype=i32))


def q_index_overlap(qr, x32, wq_b, wkv_b_q, idx_wq_b, weights_proj, zero_f32, hadamard, rope_freqs,
                    k_cache, block_table, context_lens, N: int, *, heads: int, index_heads: int,
                    d_qk: int, qk_nope: int, scale_fmt: str | None, eps: float, absorbed: bool,
                    q_head_norm: bool, w_alpha: float, topk: int, window: int, path: str = "auto",
                    carveout: int | None = None, topk_window_op: bool | None = None):
    """The decode step from the x projection's results to the sparse MLA's inputs on two CUDA
    streams (``dsa::q_index_overlap``): the indexer's two projections (``qr @ idx_wq_b^T``, the
    float32 head weights ``w_alpha * x32 @ weights_proj^T``) first, then its half of
    :func:`prepare_q`, V4's window split and ``indexer_topk`` on a side stream (high priority),
    beside the attention's q (``qr @ wq_b^T``; V3.2 q_nope through ``wkv_b_q``; cuBLAS told to
    leave :func:`overlap_sm_carveout` SMs free) and the MLA half of :func:`prepare_q` on the
    current stream, joined before returning. The kernels and inputs of ``DSADecodeLayer``'s
    one-stream step on torch's GEMMs: the same bits (with the default carveout 0), but for the
    q projection's when a carveout makes cuBLAS pick another kernel (:data:`OVERLAP_SM_CARVEOUT`). One opaque op, so
    ``torch.compile(fullgraph=True)`` keeps the two streams and a CUDA graph captures them (a
    fork and a join).

    Why: at B 1 every kernel of the step is latency-bound, and the indexer's chain (~30 us on the
    H200 at L 32K) needs nothing of the attention's q (bench/NOTES.md, "Torch layer at B 1").

    Args:
      qr: ``[T, q_lora]`` dt, the normed q latent (T = B * N). x32: ``[T, hidden]`` float32.
      wq_b: ``[H * (qk_nope + r) | H * D_qk, q_lora]`` dt. wkv_b_q: V3.2 ``[H, C, qk_nope]`` dt
        (wkv_b's key half, transposed per head), V4 None. idx_wq_b: ``[H_I * D_I, q_lora]`` dt.
      weights_proj: ``[H_I, hidden]`` float32. zero_f32: a float32 scalar tensor (addmm's ignored
        input). hadamard, rope_freqs, context_lens, N: as :func:`prepare_q`. k_cache,
        block_table: as ``indexer_topk``. heads ... q_head_norm, path: as :func:`prepare_q`;
        w_alpha: ``H_I^-0.5 * D_I^-0.5``; topk, window: the preset's (window 0: V3.2).
      carveout: SMs the q projection leaves free, in ``[0, SM count)``; None:
        :func:`overlap_sm_carveout` (``DSA_LAYER_OVERLAP_CARVEOUT``, default
        :data:`OVERLAP_SM_CARVEOUT`).
      topk_window_op: V4's index list as one op (``dsa::indexer_topk_window``) or as the top-k,
        the window and a concatenation (the same bits); None: :func:`topk_window_on`.
    Returns:
      ``(q_mla [T, H, D_qk] dt, idx_q [T, H_I, D_I] float8_e4m3fn, idx_w [T, H_I] float32,
      indices [B, N, topk + window] int32, idx_lens [B, N] int32)``: :func:`prepare_q`'s three,
      the step's indices (V4: top-k then the window) and the indexer's lengths.
    Raises:
      TypeError: a tensor argument that is not a torch.Tensor (named).
      NotImplementedError: not a CUDA tensor (the op needs streams).
      ValueError: ``carveout`` not an int in ``[0, SM count)`` (raised before any launch).
    """
    named = dict(qr=qr, x32=x32, wq_b=wq_b, idx_wq_b=idx_wq_b, weights_proj=weights_proj,
                 zero_f32=zero_f32, hadamard=hadamard, rope_freqs=rope_freqs, k_cache=k_cache,
                 block_table=block_table, context_lens=context_lens)
    if wkv_b_q is not None:
        named["wkv_b_q"] = wkv_b_q
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if qr.device.type != "cuda":
        raise NotImplementedError(f"q_index_overlap: runs on CUDA devices (two streams), got "
                                  f"{qr.device}")
    carveout = overlap_sm_carveout() if carveout is None else carveout
    topk_window_op = topk_window_on() if topk_window_op is None else bool(topk_window_op)
    if isinstance(carveout, bool) or not isinstance(carveout, (int, np.integer)) or carveout < 0:
        raise ValueError(f"carveout: expected a non-negative int (SMs), got {carveout!r}")
    return torch.ops.dsa.q_index_overlap(
        qr, x32, wq_b, wkv_b_q, idx_wq_b, weights_proj, zero_f32, hadamard, rope_freqs, k_cache,
        block_table, context_lens, int(N), int(heads), int(index_heads), int(d_qk), int(qk_nope),
        scale_fmt, float(eps), bool(absorbed), bool(q_head_norm), float(w_alpha), int(topk),
        int(window), topk_window_op, path, int(carveout))


def _torch_rope_out(attn, rope_freqs, context_lens, N):
    """Composite twin of ``_rope_out_kernel``: a copy of ``attn`` with its last r dims rotated by
    minus the angle (the layer's ``_rope_into(o, o, cos, -sin, True)``)."""
    r = rope_freqs.shape[0] * 2
    cos, sin = _rope_cos_sin(context_lens, N, rope_freqs)
    o = attn.clone()
    _rope_into(o[..., -r:], o[..., -r:], cos[:, None], -sin[:, None], True)
    return o


def _triton_rope_out(attn, rope_freqs, context_lens, N):
    """One launch of ``kernels.layer_prep.triton._rope_out_kernel`` (grid ``(B * N, ceil(H /
    block_h))``)."""
    from kernels.layer_prep import triton as tlp
    dev = _common.device_info(attn.device)
    _common.require_no_interpreted_bf16(dev, "rope_out", attn)
    T, H, D = attn.shape
    r = rope_freqs.shape[0] * 2
    if D & (D - 1) or r & (r - 1) or not 2 <= r <= D:
        raise NotImplementedError(f"rope_out: D = {D} and rope = {r} must be powers of two, rope <= D")
    attn = attn if attn.stride(-1) == 1 and attn.stride(1) == D else attn.contiguous()
    o = torch.empty((T, H, D), dtype=attn.dtype, device=attn.device)
    bh = tlp.rope_out_block_h(H)
    tlp._rope_out_kernel[(T, -(-H // bh))](attn, o, rope_freqs, context_lens, N, H, attn.stride(0),
                                          D=D, ROPE=r, BLOCK_H=bh, num_warps=4)
    return o


@torch.library.custom_op("dsa::rope_out", mutates_args=())
def _rope_out_op(attn: torch.Tensor, rope_freqs: torch.Tensor, context_lens: torch.Tensor, N: int,
                 path: str) -> torch.Tensor:
    """V4-Flash's inverse rope on the attention output (:func:`rope_out`)."""
    args = (attn, rope_freqs, context_lens, N)
    impls = {"triton": lambda: _triton_rope_out(*args), "torch": lambda: _torch_rope_out(*args)}
    return _common.run_path("rope_out", path, impls, BACKEND_PATHS["torch"])


@_rope_out_op.register_fake
def _(attn, rope_freqs, context_lens, N, path):
    return attn.new_empty(attn.shape)


def rope_out(attn, rope_freqs, context_lens, N: int, *, path: str = "auto"):
    """V4-Flash's inverse rope on the attention output, fused (``dsa::rope_out``): a new tensor
    equal to ``attn`` but for its last r dims, rotated (interleaved pairs) by minus the angle of
    each token's position, float32 math rounded once to attn's dtype
    (``kernels/layer_prep/triton.py`` ``_rope_out_kernel``).

    Args:
      attn: ``[T, H, D]`` (T = B * N), the sparse-MLA output, last dim contiguous.
      rope_freqs: ``[r / 2]`` float64. context_lens: ``[B]`` int32 (token ``b * N + i`` at
        ``L_b - N + i``). path: ``"auto"``, ``"triton"`` (one launch) or ``"torch"``.
    Returns:
      ``[T, H, D]`` in attn's dtype, contiguous.
    """
    return torch.ops.dsa.rope_out(attn, rope_freqs, context_lens, int(N), path)


def _check_device(device) -> torch.device | None:
    """The layer's ``device`` argument as a ``torch.device`` this torch can allocate on (None
    stays None: torch's default device). TypeError for a type that is no device, ValueError
    naming ``device`` for a string torch cannot parse or a device it cannot use (``"cuda"`` on
    a CPU-only torch or without a visible GPU, a CUDA index past the device count), instead of
    torch's bare AssertionError / RuntimeError from the first allocation."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device: expected a torch.device, a device string ('cpu', 'cuda:0') or "
                        f"an int, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ValueError(f"device: expected a device string such as 'cpu' or 'cuda:0', got "
                         f"{device!r} ({e})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is built without CUDA" if torch.version.cuda is None
                   else "torch.cuda.is_available() is False")
            raise ValueError(f"device: expected a device this torch can use, got {device!r}: "
                             f"{why} (torch {torch.__version__}); use device='cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device: expected a CUDA index in [0, {torch.cuda.device_count()}), "
                             f"got {device!r}")
    try:
        torch.empty(0, device=dev)
    except (AssertionError, RuntimeError) as e:
        raise ValueError(f"device: expected a device this torch can use, got {device!r} "
                         f"({type(e).__name__}: {e})") from None
    return dev


class DSADecodeLayer(nn.Module):
    """DeepSeek sparse-attention decode layer (V3.2 MLA or V4-Flash), one tensor-parallel rank.

    Inference only: the weights are buffers and :meth:`forward` runs under ``torch.no_grad()``
    (an ``x`` that requires grad is accepted; the output does not require grad).

    Args:
      cfg: :class:`kernels.layer_reference.LayerConfig` (``DSV32_LAYER``, ``DSV4_FLASH_LAYER`` or
        a ``scaled_down()`` variant).
      weights: full (unsharded) weights, ``{name: array}`` with DeepSeek ``inference/model.py``
        names and ``[out, in]`` layout (:func:`kernels.layer_reference.weight_shapes`), NumPy or
        torch, any float dtype; None draws :func:`kernels.layer_reference.init_weights` (``seed``).
        :meth:`from_checkpoint` loads DeepSeek's safetensors checkpoint instead.
      tp_rank, tp_size: this rank and the tensor-parallel size: heads are split
        (column-parallel ``wq_b`` / ``wkv_b`` / V4 ``wo_a``, row-parallel ``wo`` / V4 ``wo_b``); the
        indexer and the latent projections are replicated. With ``tp_size > 1`` :meth:`forward`
        returns this rank's partial output; summing the ranks' outputs (all-reduce) gives TP=1.
      kv_format: latent cache layout, ``"latent"``, ``"fp8_ds_mla"`` (V3.2) or ``"fp8_model1"``
        (V4); default ``cfg.kv_format``.
      dtype: activation and linear-weight dtype (float32 / float16 / bfloat16). Norms and rope
        compute in float32 and round once to ``dtype`` where their result is stored; norm
        weights, the indexer weights and the softmax statistics stay float32. Where DeepSeek
        rounds to bf16 the layer rounds to ``dtype`` too: V4's head-normed q before its rope,
        and the indexer's q / k before the Hadamard rotation (docs/SEMANTICS.md).
      device: where the weights live: a ``torch.device``, a device string or an int; None
        (default) torch's default device.
      path: op path for ``indexer_topk`` / ``sparse_mla_decode`` and the fused preparation
        (``"auto"``, ``"triton"``, ``"torch"``).
      fused_prep: run the step's preparation (norms, rope, the indexer's Hadamard rotation and
        fp8 quantisation, both cache writes) as the two fused ops ``dsa::prep_x`` /
        ``dsa::prep_q`` (:func:`prepare_x`, :func:`prepare_q`), and V4's inverse rope on the
        attention output as ``dsa::rope_out`` (:func:`rope_out`), one Triton launch each on the
        ``triton`` path, instead of the composite torch ops; None reads
        ``DSA_LAYER_FUSED_PREP`` (:func:`fused_prep_default`: on unless ``0``). A bool or None.
      linear: which projections (:data:`LAYER_GEMMS`) run the Triton few-token GEMM
        (``torch_impl.linear``, ``dsa::linear`` with ``path="triton"``) instead of torch's
        ``mm`` / ``bmm`` / ``addmm``: ``"torch"`` (none), ``"triton"`` (all), ``"auto"``
        (:data:`LINEAR_AUTO`), ``"gemv"`` (each on the one-token kernel where
        :func:`gemv_applies`: one-token steps on CUDA, K-major weights, ``DSA_LINEAR_GEMV`` not
        ``0`` when the layer is built; torch's GEMM otherwise),
        or per GEMM ``{"x_proj": "triton", "wo": "gemv", ...}`` /
        ``"x_proj=triton,wo_a=triton"``; None (default) reads ``DSA_LAYER_LINEAR``, unset:
        :data:`LINEAR_DEFAULT` (``"gemv"``). A step of more than 64 tokens (B * N) runs torch's
        GEMMs whatever the switch (the kernel's limit). Both compute each output element as a float32 sum rounded
        once to its dtype; the summation order differs.
      seed: the seed of the random weights drawn when ``weights`` is None: an int >= 0 (a
        Python int or NumPy integer scalar, not a bool).
      overlap: run the indexer's branch of the step (its half of ``dsa::prep_q``,
        ``indexer_topk``) on a side CUDA stream, beside the attention's q projection and its half
        of ``dsa::prep_q``, joined before ``sparse_mla_decode`` (:func:`q_index_overlap`, one
        custom op: eager, captured in a CUDA graph or under ``torch.compile(fullgraph=True)``).
        Bitwise the one-stream step's; with an SM carveout (``DSA_LAYER_OVERLAP_CARVEOUT``,
        default 0: :data:`OVERLAP_SM_CARVEOUT`) the q projection may differ in its last bit
        (another cuBLAS kernel), the indexer's outputs and the caches not. It applies only where it can: a CUDA step with
        ``fused_prep`` off the ``torch`` path, and the step's q / indexer GEMMs on torch's path
        (the Triton GEMM's split-K counters are shared by the device's launches). None
        (default) reads ``DSA_LAYER_OVERLAP``
        (:func:`overlap_default`), unset: on for steps of at most :data:`OVERLAP_MAX_TOKENS`
        tokens; True: every step; False: never. A bool or None.
    Raises:
      TypeError: ``cfg`` not a LayerConfig, ``dtype`` not a float dtype, ``weights`` not a mapping
        (or None), a weight that is not a real float array (``weights['name']``);
        ``fused_prep`` or ``overlap`` not a bool or None; ``seed`` not an int; ``device`` of a
        type that is no device.
      ValueError: bad ``tp_size`` / ``tp_rank``, ``kv_format`` or ``path``; a weight missing or
        of the wrong shape (``weights['name']: expected shape ..., got ...``); ``seed`` < 0;
        a ``device`` torch cannot parse or use here (e.g. ``"cuda"`` on a CPU-only torch);
        ``DSA_LAYER_OVERLAP`` / ``DSA_LAYER_OVERLAP_CARVEOUT`` / ``DSA_LAYER_FUSED_PREP`` /
        ``DSA_LAYER_JOINT_GEMV`` / ``DSA_LAYER_TOPK_WINDOW`` / ``DSA_LAYER_SPLIT_WPROJ`` /
        ``DSA_LAYER_XW_JOINT`` set to something they do not take (read here, once).
    """

    def __init__(self, cfg: lref.LayerConfig, weights: dict | None = None, *, tp_rank: int = 0,
                 tp_size: int = 1, kv_format: str | None = None, dtype: torch.dtype = torch.float32,
                 device=None, path: str = "auto", seed: int = 0, fused_prep: bool | None = None,
                 linear=None, overlap: bool | None = None):
        super().__init__()
        if not isinstance(cfg, lref.LayerConfig):
            raise TypeError(f"cfg: expected a kernels.layer_reference.LayerConfig, got {type(cfg).__name__}")
        kv_format = kv_format or cfg.kv_format
        if kv_format not in np_formats.KV_FORMATS:
            raise ValueError(f"kv_format: expected one of {np_formats.KV_FORMATS}, got {kv_format!r}")
        if kv_format == "fp8_ds_mla" and cfg.d_qk != 576 or kv_format == "fp8_model1" and cfg.d_qk != 512:
            raise ValueError(f"kv_format: {kv_format!r} does not hold D_qk = {cfg.d_qk} ({cfg.name})")
        if dtype not in _FLOAT:
            raise TypeError(f"dtype: expected one of {_FLOAT}, got {dtype}")
        if path not in TORCH_PATHS:
            raise ValueError(f"path: expected one of {TORCH_PATHS}, got {path!r}")
        if fused_prep is not None and not isinstance(fused_prep, (bool, np.bool_)):
            raise TypeError(f"fused_prep: expected a bool or None, got {type(fused_prep).__name__} "
                            f"{fused_prep!r}")
        if overlap is not None and not isinstance(overlap, (bool, np.bool_)):
            raise TypeError(f"overlap: expected a bool or None, got {type(overlap).__name__} {overlap!r}")
        seed = check_int("seed", seed, minimum=0)
        device = _check_device(device)
        self.cfg, self.kv_format, self.dtype, self.path = cfg, kv_format, dtype, path
        self.fused_prep = fused_prep_default() if fused_prep is None else bool(fused_prep)
        self.linear = linear_switch(linear, cfg.absorbed)
        self.gemv = gemv_on()                  # DSA_LINEAR_GEMV, read now (not inside a step)
        self.joint_gemv = joint_gemv_on()      # DSA_LAYER_JOINT_GEMV, likewise
        self.topk_window_op = topk_window_on()  # DSA_LAYER_TOPK_WINDOW, likewise
        self.split_wproj = split_wproj_on() and dtype in SPLIT_SHIFT  # likewise
        self.overlap = overlap_default() if overlap is None else bool(overlap)
        self.overlap_carveout = overlap_sm_carveout()          # DSA_LAYER_OVERLAP_CARVEOUT, checked now
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.local_heads = cfg.heads_per_rank(tp_size)
        weights = lref.init_weights(cfg, seed) if weights is None else lref.float32_weights(cfg, weights, _to_numpy)
        shard = lref.shard_weights(cfg, weights, tp_rank, tp_size)
        self._names = list(shard)
        # the three projections of x (q_lora, latent, indexer key) as one weight, one GEMM: its
        # rows are [wq_a; wkv_a (V4: wkv); indexer.wk], w(name) of each is a row slice. Every
        # output element is the same bf16-rounded dot product as from its own GEMM; one GEMM of
        # N = q_lora + D_qk + D_I columns streams the weights better than three narrow ones
        # (vLLM's fused_qkv_a_proj does the same)
        x_names = ("wq_a", "wkv_a" if cfg.absorbed else "wkv", "indexer.wk")
        # the two projections of qr, [wq_b; indexer.wq_b] (the same K, q_lora), as one weight too:
        # a one-token step runs one GEMV over both (one launch, not two: _project_qr); other
        # steps run them apart on the row slices w("wq_b") / w("indexer.wq_b")
        qr_names = ("wq_b", "indexer.wq_b")
        self._x_rows = self._stack("x_proj", x_names, shard, dtype, device)
        self._qr_rows = self._stack("qr_proj", qr_names, shard, dtype, device)
        for name, arr in shard.items():
            if name in self._x_rows or name in self._qr_rows:
                continue
            keep_f32 = "norm" in name or name in ("attn_sink", "indexer.weights_proj")
            t = torch.as_tensor(arr, dtype=torch.float32 if keep_f32 else dtype, device=device)
            self.register_buffer(self._buf(name), t)
        self.register_buffer("rope_freqs", torch.as_tensor(lref.rope_freqs(cfg), dtype=torch.float64,
                                                           device=device), persistent=False)
        # the indexer's Hadamard rotation as its +-1 Sylvester matrix, exact in every dtype, in the
        # activation dtype (one tensor-core GEMM); the scale D_I^-0.5 (2^-3.5 for D_I = 128, not
        # exact in bf16) is the GEMM's float32 alpha instead (forward)
        sign = np.sign(lref.hadamard_matrix(cfg.index_head_dim))
        self.register_buffer("hadamard_sign", torch.as_tensor(sign, dtype=dtype, device=device),
                             persistent=False)
        xw_joint = xw_joint_on()        # DSA_LAYER_XW_JOINT, likewise (checked whatever the split)
        self.xw_joint = self.split_wproj and xw_joint
        if self.split_wproj:    # alpha * weights_proj as three 16-bit weights (split_wproj_on)
            self.register_buffer("wproj_split", None, persistent=False)
            if self.xw_joint:   # x_proj's rows, then the split weight's, one storage (xw_joint_on)
                self.register_buffer("x_proj_joint", None, persistent=False)
            self._refresh_split()
            # derived from indexer.weights_proj (and x_proj): rebuilt when weights are loaded
            self.register_load_state_dict_post_hook(lambda module, keys: module._refresh_split())
        # the ignored input of torch.addmm(..., beta=0, alpha=scale): a GEMM scaled in its epilogue
        for name, dt in (("zero", dtype), ("zero_f32", torch.float32)):
            self.register_buffer(name, torch.zeros((), dtype=dt, device=device), persistent=False)

        if "triton" in self.linear.values() and self.x_proj.device.type == "cuda":
            tlinear.reserve_workspace(self.x_proj.device)    # split-K counters, before any capture

    def _refresh_split(self) -> None:
        """(Re)build the buffers derived from ``indexer.weights_proj``: ``wproj_split``
        (:func:`split_weight` of ``alpha w``) and, with :func:`xw_joint_on`, ``x_proj_joint``
        holding ``x_proj``'s rows then the split weight's, ``x_proj`` and ``wproj_split`` views
        of it (one storage). Run at construction, after ``load_state_dict`` (a hook) and after
        every ``_apply`` (``.to()``, ``.cuda()``: they copy each buffer on its own, which would
        part the views)."""
        if not self.split_wproj or self.x_proj.dtype not in SPLIT_SHIFT:
            return
        with torch.no_grad():
            w3 = split_weight(self.w("indexer.weights_proj").float() * self._weights_alpha,
                              self.x_proj.dtype)
            if not self.xw_joint:
                self.wproj_split = w3
                return
            n = self.x_proj.shape[0]
            joint = torch.cat([self.x_proj, w3])
            self.x_proj_joint = joint
            self.x_proj, self.wproj_split = joint[:n], joint[n:]

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if getattr(self, "split_wproj", False):
            self._refresh_split()
        return out

    def _gemm(self, name: str, x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None,
              alpha: float = 1.0, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The projection ``name`` (:data:`LAYER_GEMMS`): ``alpha * x @ w^T``, ``x`` ``[T, K]``
        with ``w`` ``[N, K]``, or per group ``[G, T, K]`` with ``[G, N, K]``; written into
        ``out`` when given (any strides, last dim contiguous), else returned in ``out_dtype``
        (default x's). The switch (``self.linear``) picks ``dsa::linear`` on Triton for T <= 64
        (``"gemv"``: where :func:`gemv_applies`, the one-token kernel), else torch's GEMM as the layer always ran it (``mm`` / ``bmm``; ``addmm`` with
        ``beta=0`` for a scaled product, the scale in the GEMM's epilogue; a float32 product of
        16-bit x widens x first)."""
        lin_path = self._lin_path(name, x, w)
        if lin_path is not None:
            return tlinear.linear(x if x.stride(-1) == 1 else x.contiguous(), w, out=out,
                                  alpha=alpha, out_dtype=out_dtype, path=lin_path)
        if out_dtype is not None and out_dtype != x.dtype:
            x = x.to(out_dtype)
        if alpha == 1.0 and out is not None:
            _into(out, torch.bmm if x.dim() == 3 else torch.mm, x, w.transpose(-1, -2))
            return out
        res = _mm(x, w, alpha, self.zero_f32 if x.dtype == torch.float32 else self.zero)
        if out is not None:
            out.copy_(res)
            return out
        return res

    def _stack(self, buffer: str, names, shard, dtype, device) -> dict[str, tuple[int, int]]:
        """Register the weights ``names`` of ``shard`` stacked by rows as one buffer ``buffer``;
        returns each name's row range in it (what :meth:`w` slices)."""
        rows, start = {}, 0
        for name in names:
            rows[name] = (start, start + shard[name].shape[0])
            start += shard[name].shape[0]
        self.register_buffer(buffer, torch.cat([torch.as_tensor(shard[n], dtype=dtype, device=device)
                                                for n in names]))
        return rows

    @staticmethod
    def _buf(name: str) -> str:
        return name.replace(".", "_")

    def w(self, name: str) -> torch.Tensor:
        """This rank's weight ``name`` (DeepSeek naming, e.g. ``"wkv_b"``, ``"indexer.wk"``): a
        row slice of the fused ``x_proj`` for ``wq_a``, ``wkv_a`` / ``wkv`` and ``indexer.wk``, of
        the fused ``qr_proj`` for ``wq_b`` and ``indexer.wq_b``."""
        if name in self._x_rows:
            a, b = self._x_rows[name]
            return self.x_proj[a:b]
        if name in self._qr_rows:
            a, b = self._qr_rows[name]
            return self.qr_proj[a:b]
        return getattr(self, self._buf(name))

    def _lin_path(self, name: str, x: torch.Tensor, w: torch.Tensor) -> str | None:
        """The ``dsa::linear`` path projection ``name`` runs on for ``x`` (:meth:`_gemm`'s
        choice), or None for torch's GEMM."""
        choice = self.linear[name]
        if choice == "gemv" and gemv_applies(x.shape[-2], w, x.device.type, self.path, self.gemv):
            # the layer's path: "auto" falls back to torch's GEMM where the kernel cannot run
            # (a GPU outside kernels.hardware.SUPPORTED_CC), "triton" raises there
            return self.path
        if choice == "triton" and x.shape[-2] <= tlinear.MAX_M:
            return "triton"
        return None

    def _project_qr(self, qr: torch.Tensor):
        """``(q, iq)``: ``qr @ wq_b^T`` ``[T, H * (nope + r) | D_qk]`` and ``qr @ indexer.wq_b^T``
        ``[T, H_I * D_I]``. A one-token step whose two projections both run the one-token GEMV on
        the same path runs one GEMV over ``qr_proj`` (both weights' rows) and returns its two
        column slices (contiguous: one row): one launch instead of two, and every output element
        the same dot product in the same order whenever the kernel's config
        (``kernels.linear.configs.gemv_heuristic``, by N and K) is the same for the joint N as for
        each N alone, as at both presets' real dimensions (8 x 512 at V3.2's K 1,536, 2 x 1,024
        at V4's K 1,024). Every other step, and with ``DSA_LAYER_JOINT_GEMV=0``: two
        projections on the row slices."""
        wq, wi = self.w("wq_b"), self.w("indexer.wq_b")
        path = self._joint_path(qr, ("wq_b", wq), ("indexer.wq_b", wi))
        if path is not None:
            both = tlinear.linear(qr if qr.stride(-1) == 1 else qr.contiguous(), self.qr_proj,
                                  path=path)
            return both[:, :wq.shape[0]], both[:, wq.shape[0]:]
        return self._gemm("wq_b", qr, wq), self._gemm("indexer.wq_b", qr, wi)

    def _joint_path(self, x: torch.Tensor, first, second) -> str | None:
        """The path two projections ``(name, w)`` of a one-token ``x`` run on together
        (:meth:`_project_qr`, :meth:`_project_x`): both on the one-token GEMV's path (the same
        :meth:`_lin_path`) with ``DSA_LAYER_JOINT_GEMV`` on; else None (two projections)."""
        if x.shape[0] != 1 or not (self.gemv and self.joint_gemv):
            return None
        p = self._lin_path(first[0], x, first[1])
        return p if p is not None and p == self._lin_path(second[0], x, second[1]) else None

    @property
    def _weights_alpha(self) -> float:
        """``weights_proj``'s constant scale ``H_I^-0.5 * D_I^-0.5`` (the GEMM's alpha; the q
        scale is multiplied in ``prep_q``)."""
        return self.cfg.index_heads ** -0.5 * self.cfg.index_head_dim ** -0.5

    def _project_x(self, x2d: torch.Tensor):
        """``(xp, w_raw)``: ``x_proj``'s product ``[T, q_lora + D_latent + D_I]`` and, for a
        one-token step of the fused preparation whose ``x_proj`` and ``weights_proj`` both run the
        one-token GEMV on the same path, ``weights_proj``'s scaled float32 product ``[1, H_I]``
        from the same launch (``torch_impl.linear.linear_pair``: bit for bit the two GEMVs; its
        x is the bf16 token, exactly what the float32 ``x32`` holds); with ``DSA_LAYER_XW_JOINT``
        (:func:`xw_joint_on`), for a fused one-stream step of more than one token on torch's GEMM,
        both from one float32-out GEMM over ``x_proj_joint``: ``xp`` float32 (``prep_x`` rounds it
        to dt) and ``w_raw`` the split weight's three parts ``[T, 3 H_I]``; else ``w_raw`` None (the
        preparation runs ``weights_proj`` itself)."""
        T = x2d.shape[0]
        if (self.xw_joint and T > 1 and self.fused_prep and self._split_runs(x2d)
                and self._lin_path("x_proj", x2d, self.x_proj) is None
                and not self._overlaps(T, x2d.device)):    # one float32-out GEMM (xw_joint_on)
            both = mm_float32_out(x2d, self.x_proj_joint)
            n = self.x_proj.shape[0]
            return both[:, :n], both[:, n:]
        wp = self.w("indexer.weights_proj")
        path = self._joint_path(x2d, ("x_proj", self.x_proj), ("indexer.weights_proj", wp))
        if path is not None and self.fused_prep and not self._overlaps(1, x2d.device):
            xc = x2d if x2d.stride(-1) == 1 else x2d.contiguous()
            return tlinear.linear_pair(xc, self.x_proj, xc, wp, alphas=(1.0, self._weights_alpha),
                                       out_dtypes=(None, torch.float32), path=path)
        return self._gemm("x_proj", x2d, self.x_proj), None

    @classmethod
    def from_checkpoint(cls, checkpoint_path, layer_idx: int, cfg: lref.LayerConfig, **kwargs) -> "DSADecodeLayer":
        """Build the layer from a DeepSeek safetensors checkpoint (file or directory): FP8 e4m3
        weights with 128 x 128 ``weight_scale_inv`` blocks are dequantized
        (:func:`kernels.checkpoint.load_layer_weights`); other keyword arguments as the constructor."""
        from kernels import checkpoint
        return cls(cfg, checkpoint.load_layer_weights(checkpoint_path, layer_idx, cfg), **kwargs)

    # ------------------------------------------------------------------ forward

    def _validate(self, x, kv_cache, k_cache, block_table, context_lens):
        """Types, dtypes, shapes, devices and layouts (no values: nothing here syncs)."""
        cfg, dev = self.cfg, self.w("wq_a").device
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"x: expected a floating-point torch.Tensor, got {got}")
        if x.dim() != 3 or x.shape[-1] != cfg.hidden or min(x.shape) < 1:
            raise ValueError(f"x: expected shape [B, N, {cfg.hidden}], got {tuple(x.shape)}")
        B = x.shape[0]
        for name, t in (("block_table", block_table), ("context_lens", context_lens)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
                got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"{name}: expected an int32 torch.Tensor, got {got}")
        if block_table.dim() != 2 or block_table.shape[0] != B or block_table.shape[1] < 1:
            raise ValueError(f"block_table: expected shape [{B}, max_pages >= 1], got {tuple(block_table.shape)}")
        if tuple(context_lens.shape) != (B,):
            raise ValueError(f"context_lens: expected shape [{B}], got {tuple(context_lens.shape)}")
        for name, t in (("kv_cache", kv_cache), ("k_cache", k_cache)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            if not t.is_contiguous():
                raise ValueError(f"{name}: expected a contiguous torch.Tensor (written in place), "
                                 f"got strides {t.stride()}")
        for name, t in (("x", x), ("kv_cache", kv_cache), ("k_cache", k_cache),
                        ("block_table", block_table), ("context_lens", context_lens)):
            if t.device != dev:
                raise ValueError(f"{name}: expected a tensor on the layer's device {dev}, got {t.device}")
        want = lref.kv_cache_shape(cfg, self.kv_format, kv_cache.shape[0] if kv_cache.dim() else 0)
        latent_ok = kv_cache.dtype in _FLOAT if self.kv_format == "latent" else kv_cache.dtype == torch.uint8
        if tuple(kv_cache.shape) != want or not latent_ok:
            raise ValueError(f"kv_cache: expected {'float' if self.kv_format == 'latent' else 'uint8'} "
                             f"{list(want)} ({self.kv_format!r}, P = cfg.page_size), got {kv_cache.dtype} "
                             f"{tuple(kv_cache.shape)}")
        if kv_cache.shape[0] < 1:
            raise ValueError(f"kv_cache: expected num_pages >= 1, got shape {tuple(kv_cache.shape)}")
        if k_cache.dtype != torch.uint8 or k_cache.dim() != 2 or k_cache.shape[1] % (cfg.index_head_dim + 4):
            raise ValueError(f"k_cache: expected uint8 [num_pages, P * {cfg.index_head_dim + 4}] "
                             f"('fp8_indexer'), got {k_cache.dtype} {tuple(k_cache.shape)}")
        P = k_cache.shape[1] // (cfg.index_head_dim + 4)
        if P != cfg.page_size:
            raise ValueError(f"k_cache: expected page size {cfg.page_size} (cfg.page_size), got {P}")
        if k_cache.shape[0] != kv_cache.shape[0]:
            raise ValueError(f"k_cache: expected num_pages = {kv_cache.shape[0]} (kv_cache's; the two "
                             f"caches share block_table), got {k_cache.shape[0]}")

    def _check_new_tokens(self, block_table, context_lens, N, num_pages):
        """The eager value check: every new token (token i of request b at ``L_b - N + i``) must
        be mapped (:func:`new_token_targets`; ValueError naming context_lens or block_table). It
        reads a ``[B, N]`` bool back to the host, so under CUDA-graph capture / torch.compile
        (:func:`_capturing`) it is skipped, and the cache write drops the writes of unmapped
        tokens instead.
        """
        if _capturing():
            return
        P, max_pages = self.cfg.page_size, block_table.shape[1]
        pos, page, _, ok = new_token_targets(block_table, context_lens, N, P, num_pages)
        if not bool(ok.all()):
            lens = context_lens.long()
            bad_len = ((lens < N) | (lens > max_pages * P)).nonzero()
            if len(bad_len):
                b = int(bad_len[0, 0])
                raise ValueError(f"context_lens: expected every L_b in [N, max_pages * P] = [{N}, "
                                 f"{max_pages * P}] (L_b counts the N new tokens), got {int(lens[b])} "
                                 f"for request {b}")
            b, i = (int(v) for v in (~ok).nonzero()[0])
            j = int(pos[b, i]) // P
            raise ValueError(f"block_table: expected page entries in [0, num_pages) = [0, {num_pages}) "
                             f"for every new token's page, got {int(page[b, i])} at block_table[{b}, "
                             f"{j}] (new token {i} of request {b} at position {int(pos[b, i])}; "
                             f"allocate the pages before the step)")

    def _rope_tables(self, context_lens, N):
        """cos / sin ``[B, N, d_rope / 2]`` float32 at the new tokens' positions ``L_b - N + i``:
        angles in float64 (the int32 length plus a float64 offset is exact), each rounded once to
        float32 as it is stored. Five launches (arange, add, mul, cos, sin)."""
        dev = context_lens.device
        pos = context_lens[:, None] + torch.arange(-N, 0, device=dev, dtype=torch.float64)
        ang = pos[..., None] * self.rope_freqs
        cos, sin = (torch.empty(ang.shape, dtype=torch.float32, device=dev) for _ in range(2))
        _into(cos, torch.cos, ang)
        _into(sin, torch.sin, ang)
        return cos, sin

    def _write_caches(self, kv_cache, k_cache, latent, ik, block_table, context_lens, N):
        """Write the new tokens' latent and indexer rows in place: one fused quantize + scatter
        launch per cache (``dsa::cache_write``, :func:`write_new_tokens`). Unmapped tokens (only
        possible under capture / compile, eagerly :meth:`_check_new_tokens` has raised) are
        dropped."""
        T = latent.shape[0] * latent.shape[1]
        P = self.cfg.page_size
        torch.ops.dsa.cache_write(latent.reshape(T, -1), kv_cache, block_table, context_lens, N,
                                  self.kv_format, P, None, self.path)
        torch.ops.dsa.cache_write(ik.reshape(T, -1), k_cache, block_table, context_lens, N,
                                  "fp8_indexer", P, self.cfg.scale_fmt, self.path)

    def _prepare_composite(self, x, xq, xkv, xk, kv_cache, k_cache, block_table, context_lens, rope):
        """The step between the x projection and the DSA ops as composite torch ops (what
        torch.compile fuses by itself; ``fused_prep=False``): returns ``(q_mla [B, N, H, D_qk] dt,
        idx_q [B, N, H_I, D_I] e4m3, idx_w [B, N, H_I] float32)`` and writes both caches."""
        cfg, dt, dev = self.cfg, self.dtype, x.device
        B, N, _ = x.shape
        T, H = B * N, self.local_heads
        r, D_I, H_I = cfg.d_rope, cfg.index_head_dim, cfg.index_heads
        cos, sin, cos_h, sin_h = rope
        # Each result is written into the columns of the buffer its consumer reads (strided
        # out=, in-place rope): no concatenation, and no float32 copy of a [B, N, H, D_qk] tensor
        qr = _rmsnorm(xq, self.w("q_norm"), cfg.eps).to(dt)
        if cfg.absorbed:
            nope, C = cfg.qk_nope_head_dim, cfg.kv_lora_rank
            q = self._gemm("wq_b", qr.reshape(T, -1), self.w("wq_b")).view(B, N, H, nope + r)
            wkv_b = self.w("wkv_b").view(H, nope + cfg.v_head_dim, C)
            # q_mla = [q_nope through wkv_b's key half (per head [T, nope] @ [nope, C], one bmm
            # into the first C columns), rope(q_pe) (from the dt q_pe, float32 math)]
            q_mla = torch.empty(B, N, H, C + r, dtype=dt, device=dev)
            self._gemm("wkv_b_q", q.view(T, H, -1)[..., :nope].transpose(0, 1),
                       wkv_b[:, :nope].transpose(1, 2), out=q_mla.view(T, H, -1)[..., :C].transpose(0, 1))
            _rope_into(q_mla[..., C:], q[..., nope:], cos_h, sin_h, True)
            kv = xkv                                                         # [B, N, C + r]
            latent = torch.empty(B, N, C + r, dtype=dt, device=dev)
            latent[..., :C] = _rmsnorm(kv[..., :C], self.w("kv_norm"), cfg.eps)
            _rope_into(latent[..., C:], kv[..., C:], cos, sin, True)
        else:
            q_mla = self._gemm("wq_b", qr.reshape(T, -1), self.w("wq_b")).view(B, N, H, cfg.d_qk)
            if cfg.q_head_norm:
                # per head, no weight: float32 math, one rounding to dt; the rope then reads the
                # dt value, as DeepSeek's apply_rotary_emb rotates the bf16 activation
                q_mla = nn.functional.rms_norm(q_mla, (cfg.d_qk,), None, cfg.eps)
            _rope_into(q_mla[..., -r:], q_mla[..., -r:], cos_h, sin_h, True)
            latent = _rmsnorm(xkv, self.w("kv_norm"), cfg.eps)                  # float32
            _rope_into(latent[..., -r:], latent[..., -r:], cos, sin, True)
            latent = latent.to(dt)

        # indexer: q / k with non-interleaved rope, Hadamard rotation, ue8m0 fp8. Both live in
        # one [T * H_I + T, D_I] buffer (every token's H_I query heads, then every token's key),
        # so one GEMM rotates both. They enter it in dt: the query heads as their projection's
        # dt output with the rope written over dims [:r] in place, the key as its float32 layer
        # norm and rope rounded to dt; DeepSeek rounds both to bf16 before rotate_activation
        # (with dt = float32 nothing is rounded). The rotation's result is rounded to dt, as the
        # float32 rotation cast to dt was.
        ih = torch.empty(T * H_I + T, D_I, dtype=dt, device=dev)
        iq, ik = ih[:T * H_I].view(B, N, H_I, D_I), ih[T * H_I:].view(B, N, D_I)
        self._gemm("indexer.wq_b", qr.reshape(T, -1), self.w("indexer.wq_b"), out=ih[:T * H_I].view(T, H_I * D_I))
        _rope_into(iq[..., :r], iq[..., :r], cos_h, sin_h, False)
        ik32 = nn.functional.layer_norm(xk.float(), (D_I,),
                                        self.w("indexer.k_norm.weight"), self.w("indexer.k_norm.bias"), cfg.eps)
        _rope_into(ik[..., :r], ik32[..., :r], cos, sin, False)
        ik[..., r:] = ik32[..., r:]
        ih = torch.addmm(self.zero, ih, self.hadamard_sign, beta=0, alpha=D_I ** -0.5)
        iq, ik = ih[:T * H_I].view(B, N, H_I, D_I), ih[T * H_I:]
        amax = torch.linalg.vector_norm(iq, float("inf"), dim=-1)               # max |iq|, exact in dt
        q_scale = tformats.indexer_scale(amax, cfg.scale_fmt)                   # [B, N, H_I] float32
        idx_q = (iq / q_scale[..., None]).clamp_(-np_formats.FP8_MAX, np_formats.FP8_MAX).to(torch.float8_e4m3fn)
        # float32 weights (DeepSeek's weights_proj runs on x.float()); the constant scale is the
        # GEMM's alpha
        idx_w = self._gemm("indexer.weights_proj", x.reshape(T, -1), self.w("indexer.weights_proj"),
                           alpha=self._weights_alpha, out_dtype=torch.float32).view(B, N, H_I) * q_scale

        self._write_caches(kv_cache, k_cache, latent, ik, block_table, context_lens, N)
        return q_mla, idx_q, idx_w

    def _prepare_fused(self, x, xq, xkv, xk, kv_cache, k_cache, block_table, context_lens,
                       w_raw=None):
        """:meth:`_prepare_composite` as two fused ops (``fused_prep=True``): ``dsa::prep_x``
        (q_norm, x in float32, the latent and indexer-key rows into both caches) after the x
        projection, ``dsa::prep_q`` (the indexer q's rope, Hadamard rotation, fp8 quantisation
        and weight scale; the MLA q's rope, V4's head norm) after the q projections; the same
        rounding points (kernels/layer_prep/triton.py). ``w_raw``: ``weights_proj``'s product
        when :meth:`_project_x` made it with ``x_proj``'s (None: made here).

        With the overlap on (:meth:`_overlaps`) the q projections, ``dsa::prep_q`` and the
        indexer run as ``dsa::q_index_overlap`` (:func:`q_index_overlap`: the indexer's branch on
        a side stream) and the step's ``(indices, idx_lens)`` come back too; else that item is
        None (the caller runs the indexer)."""
        cfg = self.cfg
        B, N, _ = x.shape
        T, H = B * N, self.local_heads
        D_I, H_I, P = cfg.index_head_dim, cfg.index_heads, cfg.page_size
        qr, x32 = prepare_x(xq.reshape(T, -1), xkv.reshape(T, -1), xk.reshape(T, -1), x.reshape(T, -1),
                            self.w("q_norm"), self.w("kv_norm"), self.w("indexer.k_norm.weight"),
                            self.w("indexer.k_norm.bias"), self.rope_freqs, self.hadamard_sign,
                            kv_cache, k_cache, block_table, context_lens, N, self.kv_format, page_size=P,
                            scale_fmt=cfg.scale_fmt, eps=cfg.eps, norm_rope=not cfg.absorbed,
                            path=self.path)
        nope, alpha = cfg.qk_nope_head_dim, self._weights_alpha
        if self._overlaps(T, x.device):
            wkv_b_q = (self.w("wkv_b").view(H, nope + cfg.v_head_dim, cfg.kv_lora_rank)[:, :nope]
                       .transpose(1, 2) if cfg.absorbed else None)
            q_mla, idx_q, idx_w, indices, idx_lens = q_index_overlap(
                qr, x32, self.w("wq_b"), wkv_b_q, self.w("indexer.wq_b"),
                self.w("indexer.weights_proj"), self.zero_f32, self.hadamard_sign, self.rope_freqs,
                k_cache, block_table, context_lens, N, heads=H, index_heads=H_I, d_qk=cfg.d_qk,
                qk_nope=nope if cfg.absorbed else 0, scale_fmt=cfg.scale_fmt, eps=cfg.eps,
                absorbed=cfg.absorbed, q_head_norm=cfg.q_head_norm, w_alpha=alpha, topk=cfg.topk,
                window=cfg.window, path=self.path, carveout=self.overlap_carveout,
                topk_window_op=self.topk_window_op)
            return (q_mla.view(B, N, H, -1), idx_q.view(B, N, H_I, D_I), idx_w.view(B, N, H_I),
                    (indices, idx_lens))
        q, iq = self._project_qr(qr)                   # [T, H * (nope + r) | D_qk], [T, H_I * D_I]
        q_lat = None
        if cfg.absorbed:
            wkv_b = self.w("wkv_b").view(H, nope + cfg.v_head_dim, cfg.kv_lora_rank)
            # q_nope through wkv_b's key half, per head [T, nope] @ [nope, C]: [H, T, C]
            q_lat = self._gemm("wkv_b_q", q.view(T, H, -1)[..., :nope].transpose(0, 1),
                               wkv_b[:, :nope].transpose(1, 2))
        # float32 weights (DeepSeek's weights_proj runs on x.float()); the constant scale is the
        # GEMM's alpha, the q scale is multiplied in prep_q
        if w_raw is None and self._split_runs(x32):   # [T, 3 H_I]: prep_q sums the parts
            w_raw = mm_float32_out(x.reshape(T, -1), self.wproj_split)
        elif w_raw is None:
            w_raw = self._gemm("indexer.weights_proj", x32, self.w("indexer.weights_proj"),
                               alpha=alpha, out_dtype=torch.float32)
        q_mla, idx_q, idx_w = prepare_q(iq, w_raw, q, q_lat, self.hadamard_sign, self.rope_freqs,
                                        context_lens, N, heads=H, index_heads=H_I, d_qk=cfg.d_qk,
                                        qk_nope=nope if cfg.absorbed else 0,
                                        scale_fmt=cfg.scale_fmt, eps=cfg.eps, absorbed=cfg.absorbed,
                                        q_head_norm=cfg.q_head_norm, path=self.path)
        return q_mla.view(B, N, H, -1), idx_q.view(B, N, H_I, D_I), idx_w.view(B, N, H_I), None

    def _split_runs(self, x: torch.Tensor) -> bool:
        """Whether ``weights_proj`` of the tokens ``x`` ``[T, hidden]`` runs as the split GEMM
        (:func:`split_wproj_on`): the split on (a 16-bit layer), and the ``linear`` switch
        leaving ``indexer.weights_proj`` on torch's GEMM for this step (:meth:`_lin_path` None);
        a step the switch puts on ``dsa::linear`` (``linear="triton"`` / ``"auto"``, or that
        GEMM named) runs it there, in float32, as the switch says."""
        return (self.split_wproj
                and self._lin_path("indexer.weights_proj", x, self.w("indexer.weights_proj")) is None)

    def _overlaps(self, T: int, device: torch.device) -> bool:
        """Whether a step of ``T`` tokens on ``device`` runs as :func:`q_index_overlap`."""
        return overlap_applies(T, device.type, self.fused_prep, self.path, self.linear, self.overlap,
                               self.gemv)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, k_cache: torch.Tensor,
                block_table: torch.Tensor, context_lens: torch.Tensor, *,
                return_intermediates: bool = False):
        """One decode step: project the N new tokens, write them into both caches (in place),
        select top-k positions with the indexer, attend, project out.

        Args:
          x: ``[B, N, hidden]`` float, the new tokens' hidden states (N > 1: MTP drafts).
          kv_cache: latent cache in ``self.kv_format`` (SPEC layouts 1-3), written in place at
            the new tokens' slots.
          k_cache: indexer K cache, ``fp8_indexer`` uint8 ``[num_pages, P * (D_I + 4)]`` (ue8m0
            scales), written in place.
          block_table: int32 ``[B, max_pages]``, shared by both caches (P = ``cfg.page_size``).
          context_lens: int32 ``[B]``, L_b counting the N new tokens, in ``[N, max_pages * P]``;
            token i sits at position ``L_b - N + i`` (whose page entry must be in
            ``[0, num_pages)``) and draft i attends positions ``< L_b - (N - 1 - i)``.
          return_intermediates: also return a dict (``q``, ``idx_q``, ``idx_weights``,
            ``indices``, ``idx_context_lens``, ``attn``, ``lse``) for tests.
        Returns:
          ``(out, kv_cache, k_cache)``: out ``[B, N, hidden]`` in ``self.dtype`` (this rank's
          row-parallel partial when ``tp_size > 1``), and the two caches (the same tensors).
        Raises:
          TypeError: an argument of the wrong type or dtype (named: ``x`` not a float tensor,
            ``block_table`` / ``context_lens`` not int32 tensors, a cache not a tensor).
          ValueError: a wrong shape, layout or device (named); ``k_cache`` with another page
            count than ``kv_cache``; ``context_lens`` outside ``[N, max_pages * P]``; a new
            token's page entry outside ``[0, num_pages)`` (``block_table``). The last two are
            value checks, made eagerly; under torch.compile / CUDA-graph capture they cannot
            run, and an unmapped new token is then not written (no byte of either cache changes
            for it and nothing outside them is touched) while the step still runs.
          NotImplementedError: a named ``path`` that cannot run.

        Capture and compile: apart from the eager value check, the step reads no tensor value on
        the host and allocates nothing whose size depends on one (positions, the drop mask, the
        V4 window and the ops are device work; the cache writes are the ``dsa::cache_write``
        custom op, one fused Triton kernel per cache, or with ``fused_prep`` part of the
        ``dsa::prep_x`` custom op), so one call captures in a CUDA graph and
        ``torch.compile(layer, fullgraph=True)`` has no graph break (docs/SEMANTICS.md).

        Autograd: an inference layer (its weights are buffers). The step runs under
        ``torch.no_grad()``, whatever the caller's grad mode: an ``x`` that requires grad (the
        output of an upstream module outside ``no_grad``) is accepted, gives the same output as
        ``x.detach()``, and no gradient flows through the layer (``out.requires_grad`` is False).
        """
        with torch.no_grad():
            return self._forward(x, kv_cache, k_cache, block_table, context_lens,
                                 return_intermediates)

    def _forward(self, x, kv_cache, k_cache, block_table, context_lens, return_intermediates):
        """:meth:`forward`'s body (under ``torch.no_grad()``)."""
        self._validate(x, kv_cache, k_cache, block_table, context_lens)
        cfg, dt, dev = self.cfg, self.dtype, x.device
        B, N, _ = x.shape
        T, H, r = B * N, self.local_heads, cfg.d_rope
        x = x.to(dt)
        self._check_new_tokens(block_table, context_lens, N, kv_cache.shape[0])
        # one GEMM for the three projections of x (x_proj), sliced into its three results
        xp, w_raw = self._project_x(x.reshape(T, -1))
        xp = xp.view(B, N, -1)
        xq, xkv, xk = xp.split([b - a for a, b in self._x_rows.values()], dim=-1)
        rope = None
        if not self.fused_prep:
            cos, sin = self._rope_tables(context_lens, N)                    # [B, N, r/2]
            rope = (cos, sin, cos[:, :, None], sin[:, :, None])              # (and over heads)
        selected = None
        if self.fused_prep:
            q_mla, idx_q, idx_w, selected = self._prepare_fused(x, xq, xkv, xk, kv_cache, k_cache,
                                                                block_table, context_lens, w_raw)
        else:
            q_mla, idx_q, idx_w = self._prepare_composite(x, xq, xkv, xk, kv_cache, k_cache, block_table,
                                                          context_lens, rope)
        if selected is None:
            selected = _select_indices(idx_q, idx_w, k_cache, block_table, context_lens, N, cfg.topk,
                                       cfg.window, self.path, report_lens=return_intermediates,
                                       one_op=self.topk_window_op)
        indices, idx_lens = selected

        sink = self.w("attn_sink") if cfg.attn_sink else None
        attn, lse = sparse_mla_decode(q_mla, kv_cache, indices, float(cfg.sm_scale), kv_format=self.kv_format,
                                      d_v=cfg.d_v, block_table=block_table, attn_sink=sink, path=self.path)
        if cfg.absorbed:
            wkv_b = self.w("wkv_b").view(H, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
            # value up-projection, per head [T, C] @ [C, v], written as [T, H * v] for wo
            o = torch.empty(B, N, H, cfg.v_head_dim, dtype=dt, device=dev)
            self._gemm("wkv_b_v", attn.reshape(T, H, -1).transpose(0, 1), wkv_b[:, cfg.qk_nope_head_dim:],
                       out=o.view(T, H, -1).transpose(0, 1))
            out = self._gemm("wo", o.view(T, -1), self.w("wo")).view(B, N, -1)
        else:
            o = attn
            if cfg.inverse_rope_out and self.fused_prep:    # one launch, a new tensor
                o = rope_out(attn.reshape(T, H, -1), self.rope_freqs, context_lens, N, path=self.path)
            elif cfg.inverse_rope_out:              # in place (on a copy when attn is reported)
                o = attn.clone() if return_intermediates else attn
                _rope_into(o[..., -r:], o[..., -r:], rope[2], -rope[3], True)
            gl = self.w("wo_a").shape[0] // cfg.o_lora_rank
            wo_a = self.w("wo_a").view(gl, cfg.o_lora_rank, -1)
            # grouped wo_a, per group [T, H * D / gl] @ [H * D / gl, o_lora], as [T, gl * o_lora]
            og = torch.empty(B, N, gl, cfg.o_lora_rank, dtype=dt, device=dev)
            self._gemm("wo_a", o.reshape(T, gl, -1).transpose(0, 1), wo_a, out=og.view(T, gl, -1).transpose(0, 1))
            out = self._gemm("wo_b", og.view(T, -1), self.w("wo_b")).view(B, N, -1)
        if return_intermediates:
            inter = dict(q=q_mla, idx_q=idx_q, idx_weights=idx_w, indices=indices,
                         idx_context_lens=idx_lens, attn=attn, lse=lse)
            return out, kv_cache, k_cache, inter
        return out, kv_cache, k_cache
