"""Lightning indexer + exact top-k for PyTorch: Triton kernels (``path="triton"``) and plain
PyTorch (``path="torch"``), registered as the custom ops ``dsa::indexer_logits`` and
``dsa::indexer_topk``.

Semantics: docs/SPEC.md "Operation A" (DeepSeek-V3.2-Exp ``Indexer``, DeepGEMM
``fp8_paged_mqa_logits``); the float64 definition is ``kernels.reference.indexer_logits`` /
``indexer_topk``; kernel designs are in ``kernels/indexer/triton.py`` and
``kernels/topk/triton.py``.

Triton path: the logits kernel scores only the pages each request spans (runtime loop bound on
the device) and the radix top-k reads only each row's valid prefix, so work scales with the
actual lengths L_b, not with the block table's width. No host synchronisation and only
shape-dependent allocations: CUDA-graph capturable and traceable by ``torch.compile`` through
the custom op's fake implementation. ``indexer_topk`` materialises a ``[B, N, W]`` float32
logits scratch buffer and a ``[B * N, W]`` int32 candidate buffer (both uninitialised; only
valid prefixes are written and read): 8 bytes per table position per (request, draft), plus
the first-digit histograms (``B x S x next_pow2(N) x 264`` int32, S = logits splits; written
by the logits kernel, or by the top-k's own first pass where ``kernels.indexer.triton.fuse_hist``
says so: the warp-specialised kernel at next_n 2, and on an H200 for tables of 2^20 positions
or more) and the top-k plan (64 bytes of state per row; with more than 16 splits a row, B <= 8 on the
H200 with the warp-specialised logits kernel, also ~128 S bytes of group partials). The top-k kernels compute each
row's length from ``context_lens`` themselves: no torch op runs between the two kernels'
launches.

Torch path: the same math in float32 with ``torch.einsum`` over chunks of pages up to
``max(L_b)`` and an exact top-k with ``torch.topk`` over unique int64 keys
``(order-preserving float key << 31) | (2^31 - 1 - position)`` restricted to the valid prefix.
It reads ``max(L_b)`` back to the host once per call, so it is **not** CUDA-graph capturable.
"""
from __future__ import annotations

import numpy as np
import torch

from kernels import formats as np_formats, hardware
from kernels.scalars import check_int, topk_maximum
from torch_impl import _common

__all__ = ["indexer_logits", "indexer_topk"]

_DENSE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Positions of dequantised K per torch-path chunk (bounds the [B, chunk, D_I] float32 scratch).
_TORCH_CHUNK_ELEMS = 1 << 25


# ============================================================================ validation

_NO_TOPK = object()     # _validate's topk when the call has none (indexer_logits)


def _validate(q, weights, k_cache, block_table, context_lens, k_format, path, topk=_NO_TOPK,
              sorted_=False, names=("q", "weights")):
    """SPEC "Bad input": TypeError / ValueError naming the argument, expected and received.

    ``names``: what the errors call ``q`` and ``weights`` (the composed steps pass
    ``("idx_q", "idx_weights")``, their own argument names). ``topk``: checked whenever given
    (None too: a TypeError naming it). Returns the page size P.
    """
    qn, wn = names
    if k_format not in np_formats.K_FORMATS:
        raise ValueError(f"k_format: expected one of {np_formats.K_FORMATS}, got {k_format!r}")
    if path not in _common.TORCH_PATHS:
        raise ValueError(f"path: expected one of {_common.TORCH_PATHS}, got {path!r}")
    q_dtypes = (torch.float8_e4m3fn,) if k_format == "fp8_indexer" else _DENSE_DTYPES
    _common.check_tensor(qn, q, ndim=4, dtypes=q_dtypes)
    B, N, H, D = q.shape
    dev = q.device
    if min(B, N, H, D) < 1:
        raise ValueError(f"{qn}: expected non-empty [B, N, H_I, D_I], got shape {tuple(q.shape)}")
    _common.check_tensor(wn, weights, dtypes=(torch.float32,), shape=(B, N, H), device=dev)
    if k_format == "fp8_indexer":
        _common.check_tensor("k_cache", k_cache, ndim=2, dtypes=(torch.uint8,), device=dev)
        page_bytes = k_cache.shape[1]
        if k_cache.shape[0] < 1:
            raise ValueError(f"k_cache: expected at least one page, got shape {tuple(k_cache.shape)}")
        if page_bytes == 0 or page_bytes % (D + 4):
            raise ValueError(f"k_cache: 'fp8_indexer' pages hold P * (D_I + 4) = P * {D + 4} bytes, "
                             f"got shape {tuple(k_cache.shape)}")
        if k_cache.stride(1) != 1 or k_cache.stride(0) % 4:
            raise ValueError("k_cache: expected contiguous pages with 4-byte aligned page starts "
                             f"(float32 scales), got strides {k_cache.stride()}")
        if not torch.compiler.is_compiling():
            # storage_offset() is an int Dynamo cannot trace; under torch.compile the op bodies
            # (eager, real tensors) make the same check.
            _check_byte_offset(k_cache, k_format)
        P = page_bytes // (D + 4)
    else:
        _common.check_tensor("k_cache", k_cache, ndim=3, dtypes=(q.dtype,), device=dev)
        if k_cache.shape[0] < 1:
            raise ValueError(f"k_cache: expected at least one page, got shape {tuple(k_cache.shape)}")
        if k_cache.shape[2] != D or k_cache.shape[1] < 1:
            raise ValueError(f"k_cache: expected 'dense' shape (num_pages, P, {D}) matching {qn}'s "
                             f"D_I, got {tuple(k_cache.shape)}")
        if k_cache.stride(2) != 1:
            raise ValueError(f"k_cache: expected the last dim contiguous (stride 1), got strides "
                             f"{k_cache.stride()}")
        P = k_cache.shape[1]
    _common.check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=dev)
    if block_table.shape[0] != B or block_table.shape[1] < 1:
        raise ValueError(f"block_table: expected shape ({B}, max_pages) with max_pages >= 1, got "
                         f"{tuple(block_table.shape)}")
    _common.check_tensor("context_lens", context_lens, dtypes=(torch.int32,), device=dev)
    if tuple(context_lens.shape) not in ((B,), (B, N)):
        raise ValueError(f"context_lens: expected shape ({B},) or ({B}, {N}), got "
                         f"{tuple(context_lens.shape)}")
    if topk is not _NO_TOPK:
        check_int("topk", topk, minimum=1, maximum=topk_maximum(B, N),
                  why=f"B * N * topk < 2^31 with B={B}, N={N}: int32 offsets of the output")
    if not isinstance(sorted_, (bool, np.bool_)):
        raise TypeError(f"sorted: expected a bool, got {type(sorted_).__name__}")
    return P


def _page_size(q, k_cache, k_format) -> int:
    return k_cache.shape[1] // (q.shape[3] + 4) if k_format == "fp8_indexer" else k_cache.shape[1]


def _draft_lengths(context_lens, B, N, W) -> torch.Tensor:
    """int32 ``[B, N]`` valid-prefix lengths clamped to ``[0, W]`` (device ops only, no sync)."""
    cl = context_lens.to(torch.int64)
    if cl.dim() == 1:
        cl = cl[:, None] - (N - 1 - torch.arange(N, device=cl.device))[None, :]
    return cl.clamp(0, W).to(torch.int32)


# ============================================================================ phase ranges

# Profiler ranges around the two phases of indexer_topk (opened only while a torch profiler is
# recording, so the calls cost nothing otherwise): the bench reads the GPU time of the kernels
# launched inside each (bench.paths.torch_indexer_phases) and reports the second as topk_us.
PHASE_LOGITS = "dsa::indexer_topk/logits"
PHASE_TOPK = "dsa::indexer_topk/topk"


def _phase(name: str):
    import contextlib
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


# ============================================================================ triton path

def _plan(q, block_table, k_cache, k_format, op, path, topk=None):
    """``kernels.registry`` plan of one call: the bucket's L is the block table's capacity W
    (the actual lengths live on the device and are not read back)."""
    B, N = q.shape[:2]
    W = block_table.shape[1] * _page_size(q, k_cache, k_format)
    dims = dict(B=B, N=N, L=W) if topk is None else dict(B=B, N=N, L=W, topk=topk)
    return _common.plan(op, q.device, path, **dims)


def _triton_configs(cfg):
    """(IndexerLogitsConfig, TopkConfig) of a plan's triton config dict (registry field names:
    the logits config's fields, the top-k config's prefixed ``topk_``)."""
    from kernels.indexer.triton import IndexerLogitsConfig
    from kernels.topk.triton import TopkConfig
    cfg = dict(cfg or {})
    lcfg = IndexerLogitsConfig(**{k: cfg[k] for k in ("num_splits", "num_warps", "num_stages",
                                                      "trans", "pages", "hist", "prefetch",
                                                      "evict_first", "kernel", "ws_consumers",
                                                      "ws_convert") if k in cfg})
    tcfg = TopkConfig(**{k[5:]: cfg[k] for k in ("topk_block", "topk_num_warps",
                                                      "topk_cand_block") if k in cfg})
    return lcfg, tcfg


def _triton_gate(q, k_format, P, lcfg):
    """NotImplementedError (GPU, compute capability, what is supported) before launch; returns
    ``(dev, lcfg)`` with the Gluon kernel replaced by the Triton one where it cannot run
    (``kernels.indexer.triton.resolve_kernel``)."""
    from kernels.indexer.triton import resolve_kernel
    dev = _common.device_info(q.device)
    hardware.require_arch(dev, "indexer_logits (triton)")
    _common.require_no_interpreted_bf16(dev, "indexer_logits (triton)", q)
    B, N, H, D = q.shape
    if D < 16 or D & (D - 1):
        raise NotImplementedError(f"indexer_logits (triton) on {dev.name} (compute capability "
                                  f"{dev.cc[0]}.{dev.cc[1]}): D_I must be a power of two >= 16, got {D}")
    nb = 1 << (N - 1).bit_length()
    bh = max(16, 1 << (H - 1).bit_length())
    bp = max(16, 1 << (P - 1).bit_length())
    # q and the key tile staged in the dot operand dtype (fp8 keys as fp16), once per stage;
    # with Triton's pipeliner (prefetch=False) the raw tiles once per stage, then the operand
    elem = q.element_size() if k_format == "dense" else 2
    raw = q.element_size() if k_format == "dense" else 1
    tile = lcfg.pages * bp * D
    need = ((nb * bh + max(1, lcfg.num_stages) * lcfg.pages * bp) * D * elem if lcfg.prefetch
            else (nb * bh * D + tile) * elem + max(1, lcfg.num_stages) * tile * raw)
    hardware.require_smem(dev, f"indexer_logits (triton) with N={N}, H_I={H}, D_I={D}, P={P}",
                          need)
    return dev, resolve_kernel(lcfg, dev, k_format, N, H, D, P)


def _launch_logits(q, weights, k_cache, block_table, context_lens, k_format, P, dev, lcfg, out,
                   hist=None):
    from kernels.indexer.triton import launch_indexer_logits
    q = q if q.stride(-1) == 1 else q.contiguous()
    weights = weights if weights.stride(-1) == 1 else weights.contiguous()
    block_table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    # The kernels clamp each length to the table's capacity (+N for the MTP offset) themselves
    # (kernels.indexer.triton.draft_lengths): lengths near 2^31 overflowed their int32 page
    # arithmetic; no torch op runs in front of the launch.
    context_lens = context_lens.contiguous()
    if k_format == "fp8_indexer":
        k_vals, k_scales = k_cache.view(torch.float8_e4m3fn), k_cache.view(torch.float32)
    else:
        k_vals, k_scales = k_cache, None
    dot_f32 = dev.interpret and q.dtype == torch.bfloat16
    launch_indexer_logits(q, weights, k_vals, k_scales, block_table, context_lens, out,
                          page_size=P, num_sms=dev.num_sms, config=lcfg, dot_f32=dot_f32,
                          fp8_nan_fix=dev.interpret, hist=hist,
                          fp8_upcast=True)   # e4m3 -> fp16: exact, and the interpreter computes fp16
    return out


def _triton_logits(q, weights, k_cache, block_table, context_lens, k_format, cfg=None):
    B, N, H, D = q.shape
    P = _page_size(q, k_cache, k_format)
    W = block_table.shape[1] * P
    dev = _common.device_info(q.device)
    if cfg is None:
        cfg = _plan(q, block_table, k_cache, k_format, "indexer_logits", "triton").config
    lcfg, _ = _triton_configs(cfg)
    dev, lcfg = _triton_gate(q, k_format, P, lcfg)
    out = torch.full((B, N, W), float("-inf"), dtype=torch.float32, device=q.device)
    return _launch_logits(q, weights, k_cache, block_table, context_lens, k_format, P, dev, lcfg, out)


def _sort_selected(idx, logits):
    """Order selected positions by descending logit, ties by smaller position, -1 last.

    ``idx`` int32 ``[R, K]`` selected positions then -1; ``logits`` float32 ``[R, W]``. One
    ``torch.sort`` of unique int64 keys ``(order key << 31) | (2^31 - 1 - position)`` (the same
    keys as the torch path; -0.0 ties +0.0), padding keyed -1 so it sorts last.
    """
    valid = idx >= 0
    pos = idx.clamp(min=0).long()
    key = _order_key(torch.gather(logits, 1, pos))
    comp = torch.where(valid, (key << _POS_BITS) | ((1 << _POS_BITS) - 1 - pos),
                       torch.full_like(pos, -1))
    comp = torch.sort(comp, dim=1, descending=True).values
    low = (1 << _POS_BITS) - 1
    return torch.where(comp >= 0, low - (comp & low), torch.full_like(comp, -1)).to(torch.int32)


def triton_select(q, weights, k_cache, block_table, context_lens, topk, k_format, cfg=None,
                  out=None):
    """Fused logits + top-k on already-validated tensors: ``(logits, idx)`` with ``logits``
    float32 ``[B, N, W]`` (written at positions ``j < ceil(max_i len[b, i] / P) * P`` of each
    request, every selected position among them; the rest is uninitialised) and ``idx``
    int32 ``[B * N, topk]`` (order unspecified, -1 padded). Shared by ``indexer_topk`` and the
    sequence-sharded TP indexer (which gathers the scores of the selection). ``cfg``: the
    registry plan's triton config (None: plan it here). ``out``: None, or the int32
    ``[B * N, topk]`` tensor (last dim contiguous, any row stride) to select into, returned as
    ``idx`` (``torch_impl.step.indexer_topk_window`` passes the head of its index list)."""
    from kernels.topk.triton import launch_topk
    B, N, H, D = q.shape
    P = _page_size(q, k_cache, k_format)
    W = block_table.shape[1] * P
    dev = _common.device_info(q.device)
    if cfg is None:
        cfg = _plan(q, block_table, k_cache, k_format, "indexer_topk", "triton", topk).config
    lcfg, tcfg = _triton_configs(cfg)
    dev, lcfg = _triton_gate(q, k_format, P, lcfg)
    # Scratch logits: the logits kernel writes every position j < ceil(max_i len / P) * P of a
    # request, the top-k reads only j < len[b, i]; nothing else is touched, so no fill.
    from kernels.indexer.triton import fuse_hist, logits_splits
    from kernels.topk.triton import hist_shape, launch_split_hist, unfused_topk_splits
    logits = torch.empty((B, N, W), dtype=torch.float32, device=q.device)
    splits = logits_splits(B, block_table.shape[1], dev.num_sms, lcfg)
    fused = fuse_hist(lcfg, N, B * W, dev.name)
    if not fused:                # the split passes' own count (the same set, the same order)
        splits = unfused_topk_splits(B * N, block_table.shape[1], dev.num_sms, splits)
    hist = torch.empty(hist_shape(B, splits, N), dtype=torch.int32, device=q.device)
    with _phase(PHASE_LOGITS):
        _launch_logits(q, weights, k_cache, block_table, context_lens, k_format, P, dev, lcfg,
                       logits, hist if fused else None)
    # The top-k kernels compute each row's length from context_lens themselves ([B, N]: per
    # row; [B]: the MTP rule), clamped to [0, W]: no torch op in front of their launches.
    lens = context_lens.contiguous()
    if out is None:
        out = torch.empty((B * N, topk), dtype=torch.int32, device=q.device)
    scratch = torch.empty((B * N, W), dtype=torch.int32, device=q.device)
    with _phase(PHASE_TOPK):
        if not fused:                    # the blocks from the logits (the same set selected)
            launch_split_hist(logits.view(B * N, W), lens.view(-1), hist, n_drafts=N,
                              page_size=P)
        launch_topk(logits.view(B * N, W), lens.view(-1), topk, out, scratch, config=tcfg,
                    hist=hist, n_drafts=N, page_size=P, num_sms=dev.num_sms)
    return logits, out


def _triton_topk(q, weights, k_cache, block_table, context_lens, topk, k_format, sort, cfg=None):
    B, N = q.shape[:2]
    logits, out = triton_select(q, weights, k_cache, block_table, context_lens, topk, k_format,
                                cfg)
    if sort:
        out = _sort_selected(out, logits.view(B * N, -1))
    return out.view(B, N, topk)


# ============================================================================ torch path

def _torch_keys(k_cache, k_format, D, P):
    """(values ``[num_pages, P, D_I]`` (uint8 e4m3 bytes, or the dense float rows), float32
    scales ``[num_pages, P]`` or None). Gathers index the uint8 bytes (fp8 indexing kernels are
    not available on every device); :func:`_to_float` decodes them."""
    if k_format == "fp8_indexer":
        n = k_cache.shape[0]
        vals = k_cache[:, : P * D].reshape(n, P, D)
        scales = k_cache[:, P * D:].view(torch.float32).reshape(n, P)
        return vals, scales
    return k_cache, None


def _to_float(rows):
    return (rows.view(torch.float8_e4m3fn) if rows.dtype == torch.uint8 else rows).float()


def _torch_logits_prefix(q, weights, k_cache, block_table, context_lens, k_format):
    """(logits float32 ``[B, N, Lmax]`` over the prefix Lmax = max valid length (host sync),
    lengths int32 ``[B, N]``, W)."""
    B, N, H, D = q.shape
    P = _page_size(q, k_cache, k_format)
    W = block_table.shape[1] * P
    lens = _draft_lengths(context_lens, B, N, W)
    l_max = int(lens.max().item()) if lens.numel() else 0       # host sync (torch path only)
    n_pages = -(-l_max // P)
    vals, scales = _torch_keys(k_cache, k_format, D, P)
    num_pages = vals.shape[0]
    qf = q.float()
    w = weights.float()
    out = torch.full((B, N, n_pages * P), float("-inf"), dtype=torch.float32, device=q.device)
    chunk = max(1, _TORCH_CHUNK_ELEMS // max(1, B * P * max(D, N * H)))
    for p0 in range(0, n_pages, chunk):
        p1 = min(n_pages, p0 + chunk)
        entry = block_table[:, p0:p1].long()                                  # [B, c]
        ok = (entry >= 0) & (entry < num_pages)
        safe = torch.where(ok, entry, torch.zeros_like(entry))
        k = _to_float(vals[safe]).reshape(B, (p1 - p0) * P, D)                # [B, cP, D]
        dots = torch.einsum("bnhd,bjd->bnhj", qf, k)
        dots = torch.where(dots < 0, torch.zeros_like(dots), dots)           # ReLU keeping NaN
        logit = torch.einsum("bnh,bnhj->bnj", w, dots)
        if scales is not None:
            logit = logit * scales[safe].reshape(B, 1, (p1 - p0) * P)
        j = torch.arange(p0 * P, p1 * P, device=q.device)
        valid = (j[None, None, :] < lens[:, :, None]) & ok.repeat_interleave(P, dim=1)[:, None, :]
        out[:, :, p0 * P:p1 * P] = torch.where(valid, logit, torch.full_like(logit, float("-inf")))
    return out[:, :, :l_max], lens, W


def _torch_logits(q, weights, k_cache, block_table, context_lens, k_format):
    B, N = q.shape[:2]
    prefix, _, W = _torch_logits_prefix(q, weights, k_cache, block_table, context_lens, k_format)
    out = torch.full((B, N, W), float("-inf"), dtype=torch.float32, device=q.device)
    out[:, :, : prefix.shape[2]] = prefix
    return out


_POS_BITS = 31


def _order_key(x):
    """Order-preserving int64 key in ``[0, 2^32)`` of float32 ``x`` (-0.0 as +0.0)."""
    x = torch.where(x == 0, torch.zeros_like(x), x)
    u = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    neg = (u >> 31) == 1
    return torch.where(neg, (~u) & 0xFFFFFFFF, u | 0x80000000)


def _torch_topk(q, weights, k_cache, block_table, context_lens, topk, k_format, sort):
    with _phase(PHASE_LOGITS):
        logits, lens, _ = _torch_logits_prefix(q, weights, k_cache, block_table, context_lens,
                                               k_format)
    with _phase(PHASE_TOPK):
        return _torch_topk_select(q, logits, lens, topk)


def _torch_topk_select(q, logits, lens, topk):
    B, N = q.shape[:2]
    l_max = logits.shape[2]
    out = torch.full((B, N, topk), -1, dtype=torch.int32, device=q.device)
    if l_max == 0:
        return out
    pos = torch.arange(l_max, device=q.device)
    ok = ~torch.isnan(logits) & (logits != float("-inf")) & (pos[None, None, :] < lens[:, :, None])
    key = torch.where(ok, _order_key(logits), torch.zeros_like(pos))
    # Unique composite keys: larger logit first, then smaller position; exact and deterministic.
    comp = (key << _POS_BITS) | ((1 << _POS_BITS) - 1 - pos)
    top = torch.topk(comp, min(topk, l_max), dim=2, sorted=True).values
    sel = torch.where((top >> _POS_BITS) > 0, ((1 << _POS_BITS) - 1) - (top & ((1 << _POS_BITS) - 1)),
                      torch.full_like(top, -1))
    out[:, :, : sel.shape[2]] = sel.to(torch.int32)
    return out                                   # already sorted (descending logit, position)


# ============================================================================ custom ops

def _check_byte_offset(k_cache: torch.Tensor, k_format: str) -> None:
    if k_format == "fp8_indexer":
        _common.check_byte_offset("k_cache", k_cache, "the kernels read the float32 scales "
                                  "through a float32 view")


@torch.library.custom_op("dsa::indexer_logits", mutates_args=())
def _indexer_logits_op(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                       block_table: torch.Tensor, context_lens: torch.Tensor, k_format: str,
                       path: str) -> torch.Tensor:
    _check_byte_offset(k_cache, k_format)
    args = (q, weights, k_cache, block_table, context_lens, k_format)
    pl = _plan(q, block_table, k_cache, k_format, "indexer_logits", path)
    cfg = pl.configs.get("triton")
    impls = {"triton": lambda: _triton_logits(*args, cfg), "torch": lambda: _torch_logits(*args)}
    return _common.run_path("indexer_logits", path, impls, pl.order)


@_indexer_logits_op.register_fake
def _(q, weights, k_cache, block_table, context_lens, k_format, path):
    B, N = q.shape[:2]
    W = block_table.shape[1] * _page_size(q, k_cache, k_format)
    return q.new_empty((B, N, W), dtype=torch.float32)


def _topk_plan(q, block_table, k_cache, k_format, path, topk):
    """What every top-k op runs first (``dsa::indexer_topk``, ``dsa::indexer_topk_window``): the
    cache's byte-offset check and the registry's ``indexer_topk`` plan for these shapes."""
    _check_byte_offset(k_cache, k_format)
    return _plan(q, block_table, k_cache, k_format, "indexer_topk", path, topk)


@torch.library.custom_op("dsa::indexer_topk", mutates_args=())
def _indexer_topk_op(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                     block_table: torch.Tensor, context_lens: torch.Tensor, topk: int,
                     k_format: str, sort: bool, path: str) -> torch.Tensor:
    args = (q, weights, k_cache, block_table, context_lens, topk, k_format, sort)
    pl = _topk_plan(q, block_table, k_cache, k_format, path, topk)
    cfg = pl.configs.get("triton")
    impls = {"triton": lambda: _triton_topk(*args, cfg), "torch": lambda: _torch_topk(*args)}
    return _common.run_path("indexer_topk", path, impls, pl.order)


@_indexer_topk_op.register_fake
def _(q, weights, k_cache, block_table, context_lens, topk, k_format, sort, path):
    B, N = q.shape[:2]
    return q.new_empty((B, N, topk), dtype=torch.int32)


_ARGS_DOC = """
    Args:
      q: ``[B, N, H_I, D_I]``: float8_e4m3fn with ``k_format="fp8_indexer"``; fp32 / fp16 / bf16
        (the cache's dtype) with ``"dense"``. N = query tokens per request (next_n, MTP drafts).
      weights: float32 ``[B, N, H_I]``, per-head weights with the q scale, ``H_I^-0.5`` and
        ``D_I^-0.5`` already folded in (as DeepSeek's reference and DeepGEMM do).
      k_cache: ``"fp8_indexer"``: uint8 ``[num_pages, P * (D_I + 4)]``, contiguous pages: P rows
        of D_I e4m3 bytes, then P float32 scales (P inferred); ``"dense"``: ``[num_pages, P, D_I]``
        float, last dim contiguous.
      block_table: int32 ``[B, max_pages]``: position j of request b is token ``j % P`` of page
        ``block_table[b, j // P]``; entries < 0 or >= num_pages are never read (-inf logits).
      context_lens: int32 ``[B]`` (L_b, counting the N new tokens; draft i sees positions
        ``j < L_b - (N - 1 - i)``) or ``[B, N]`` (draft i sees ``j < context_lens[b, i]``).
      k_format: ``"fp8_indexer"`` or ``"dense"``.
      path: ``"auto"`` (dispatch-table entry if any, else ``"triton"`` then ``"torch"``, falling
        through on NotImplementedError), ``"triton"`` or ``"torch"`` (named paths re-raise).
"""

_RAISES_DOC = """
    Raises:
      TypeError / ValueError: wrong type, dtype, rank, shape, device or layout of an argument
        (the message names it, what was expected and what came).
      NotImplementedError: the named path cannot run here (GPU compute capability, shared
        memory, D_I not a power of two, CPU without ``TRITON_INTERPRET=1``); names the GPU, its
        compute capability and what is supported. Raised before launch.
"""


def indexer_logits(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                   block_table: torch.Tensor, context_lens: torch.Tensor, *,
                   k_format: str = "fp8_indexer", path: str = "auto") -> torch.Tensor:
    """Lightning-indexer logits over a paged K cache (for debugging and parity).

    ``logit[b, i, j] = k_scale[j] * sum_h weights[b, i, h] * relu(q[b, i, h] . k[j])`` with
    float32 accumulation (k_scale = 1 for ``"dense"``), for valid positions; -inf elsewhere.
    NaN keys give NaN logits. Semantics: docs/SPEC.md "Operation A" (DeepSeek-V3.2-Exp
    ``Indexer``, DeepGEMM ``fp8_paged_mqa_logits``).
    {args}
    Returns:
      float32 ``[B, N, W]``, W = max_pages * P, indexed by logical position.
    {raises}
    """
    _validate(q, weights, k_cache, block_table, context_lens, k_format, path)
    return torch.ops.dsa.indexer_logits(q, weights, k_cache, block_table, context_lens, k_format, path)


def indexer_topk(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                 block_table: torch.Tensor, context_lens: torch.Tensor, topk: int, *,
                 k_format: str = "fp8_indexer", sorted: bool = False,
                 path: str = "auto") -> torch.Tensor:
    """Positions of the ``topk`` largest indexer logits of each (request, draft).

    Candidates are valid positions whose logit is neither NaN nor -inf (+inf qualifies); ties at
    the threshold go to the smaller position, so the set is exact and deterministic. Semantics:
    docs/SPEC.md "Operation A"; reference ``kernels.reference.indexer_topk``.
    {args}
      topk: K >= 1 (any value; 2048 for V3.2, 512 for V4-Flash).
      sorted: False: order within a row unspecified (deterministic; the torch path happens to
        emit descending logits); True: descending logit, ties by smaller position.
    Returns:
      int32 ``[B, N, topk]``: logical positions in ``[0, len[b, i])``; when fewer than ``topk``
      positions qualify, all of them are selected and the rest of the row is -1 (after them
      when ``sorted=True``).
    {raises}
    """
    _validate(q, weights, k_cache, block_table, context_lens, k_format, path, topk, sorted)
    return torch.ops.dsa.indexer_topk(q, weights, k_cache, block_table, context_lens, int(topk),
                                      k_format, bool(sorted), path)


indexer_logits.__doc__ = indexer_logits.__doc__.format(args=_ARGS_DOC, raises=_RAISES_DOC)
indexer_topk.__doc__ = indexer_topk.__doc__.format(args=_ARGS_DOC, raises=_RAISES_DOC)
