"""FlashMLA-compatible sparse decode on this project's kernels.

Same names, arguments and conventions as ``flash_mla/flash_mla_interface.py`` of
deepseek-ai/FlashMLA at commit 9241ae3 (facts and their files: docs/COMPAT.md), backed by
:func:`torch_impl.sparse_mla_decode` and, for two caches,
:func:`torch_impl.sparse_mla.sparse_mla_decode_sources` (Triton on CUDA GPUs of compute capability 8.9 and up,
sm_120 included; the interpreter or plain PyTorch on the CPU). What this module converts:

====================  ===========================================  ==============================
                      FlashMLA                                     native ``sparse_mla_decode``
====================  ===========================================  ==============================
k_cache               ``[num_blocks, P, 1, 656]`` (V3.2) or        ``fp8_ds_mla [pages, P, 656]``
                      ``[num_blocks, P, 1, 584]`` (MODEL1) view,   / ``fp8_model1 [pages, bytes]``
                      fp8 / uint8 / int8; pages may be strided
indices               global slots ``page * P + offset``, -1 pad   the same (slots)
softmax_scale         default ``D_qk ** -0.5``                     always passed
lse                   ``[b, h_q, s_q]``, +inf for an empty row     ``[b, s_q, h_q]``, -inf
attn_sink             +inf gives out 0, -inf no effect             the same formula
extra_k_cache         a second cache, one softmax over both        ``sparse_mla_decode_sources``
====================  ===========================================  ==============================

Not provided (``NotImplementedError`` naming it): dense decode (``indices=None``), ``causal``,
sparse prefill ``flash_mla_sparse_fwd``, and the dense prefill ``flash_attn_varlen_*`` family.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from kernels import formats as np_formats
from kernels.scalars import check_real
from torch_impl import _common
from torch_impl.compat._names import own_names
from torch_impl.sparse_mla import KVSource, sparse_mla_decode, sparse_mla_decode_sources

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache",
           "flash_mla_sparse_fwd", "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func"]

# (D_qk, bytes per token of the FlashMLA view, native kv_format) of the two fp8 sparse layouts.
_FP8_LAYOUTS = {576: (np_formats.DS_MLA_BYTES, "fp8_ds_mla"), 512: (584, "fp8_model1")}
_CACHE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)
_LATENT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# native argument name -> this module's (SPEC "bad input": errors name the caller's argument)
_COMMON_NAMES = {"sm_scale": "softmax_scale", "d_v": "head_dim_v"}
_ONE_CACHE_NAMES = {**_COMMON_NAMES, "kv_cache": "k_cache"}
_TWO_CACHE_NAMES = {**_COMMON_NAMES,
                    "sources[0].kv_cache": "k_cache", "sources[0].indices": "indices",
                    "sources[0].topk_length": "topk_length",
                    "sources[1].kv_cache": "extra_k_cache",
                    "sources[1].indices": "extra_indices_in_kvcache",
                    "sources[1].topk_length": "extra_topk_length"}


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduler-metadata object (same fields). FlashMLA fills ``config`` on the first
    call and checks later calls against it; so does this module. The tile-scheduler tensors
    stay None: the native launcher plans its split over K itself on every call (no host sync,
    CUDA-graph capturable)."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None


def get_mla_metadata(*args, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    """``(FlashMLASchedMeta(), None)``, as FlashMLA 9241ae3 returns.

    Any arguments (the pre-2025 form ``get_mla_metadata(cache_seqlens,
    num_q_tokens_per_head_k, num_heads_k, num_heads_q=None, is_fp8_kvcache=False, topk=None)``
    that vLLM and SGLang still call) are accepted and ignored, as FlashMLA does.
    """
    del args, kwargs
    return FlashMLASchedMeta(), None


# ============================================================================ not provided

def _not_provided(what: str):
    raise NotImplementedError(
        f"torch_impl.compat.flash_mla: {what} is not provided (this project implements FlashMLA's "
        f"sparse fp8 decode only: flash_mla_with_kvcache(..., indices=..., is_fp8_kvcache=True))")


def flash_mla_sparse_fwd(*args, **kwargs):
    """FlashMLA's sparse prefill: not provided; raises NotImplementedError."""
    _not_provided("sparse prefill flash_mla_sparse_fwd")


def flash_attn_varlen_func(*args, **kwargs):
    """FlashMLA's dense prefill (sm100): not provided; raises NotImplementedError."""
    _not_provided("dense prefill flash_attn_varlen_func")


def flash_attn_varlen_qkvpacked_func(*args, **kwargs):
    """Not provided; raises NotImplementedError."""
    _not_provided("dense prefill flash_attn_varlen_qkvpacked_func")


def flash_attn_varlen_kvpacked_func(*args, **kwargs):
    """Not provided; raises NotImplementedError."""
    _not_provided("dense prefill flash_attn_varlen_kvpacked_func")


# ============================================================================ cache views

def _storage_end_ok(t: torch.Tensor, num_pages: int, page_stride: int, page_bytes: int) -> bool:
    need = t.storage_offset() + (num_pages - 1) * page_stride + page_bytes
    return need <= t.untyped_storage().nbytes()


def _native_cache(name: str, k_cache: torch.Tensor, d_qk: int, is_fp8: bool, device):
    """FlashMLA k_cache view -> ``(cache, kv_format)`` for ``sparse_mla_decode``, never copying
    the cache: strided (padded) pages stay strided, and the native op reads them in place with
    the same kernel and config as contiguous pages (it checks the page stride: a multiple of 16
    bytes, at least one page)."""
    _common.check_tensor(name, k_cache, ndim=4, device=device)
    nb, P, h_k, width = k_cache.shape
    if h_k != 1:
        raise ValueError(f"{name}: expected num_heads_k = 1 (shape [num_blocks, page_block_size, "
                         f"1, bytes_per_token]), got shape {tuple(k_cache.shape)}")
    if nb < 1 or P < 1:
        raise ValueError(f"{name}: expected at least one page of one token, got shape "
                         f"{tuple(k_cache.shape)}")
    if not is_fp8:
        # Extension: a bf16 / fp16 / fp32 latent cache [num_blocks, P, 1, D_qk].
        if k_cache.dtype not in _LATENT_DTYPES or width != d_qk:
            raise ValueError(f"{name}: with is_fp8_kvcache=False expected a latent cache "
                             f"[num_blocks, P, 1, {d_qk}] in {[str(d) for d in _LATENT_DTYPES]}, "
                             f"got {k_cache.dtype} shape {tuple(k_cache.shape)}")
        return k_cache[:, :, 0, :], "latent"
    if k_cache.dtype not in _CACHE_DTYPES:
        raise TypeError(f"{name}: expected an fp8 cache of dtype in "
                        f"{[str(d) for d in _CACHE_DTYPES]}, got {k_cache.dtype}")
    if d_qk not in _FP8_LAYOUTS:
        raise ValueError(f"q: fp8 sparse decode needs D_qk 576 (V3.2) or 512 (MODEL1), got "
                         f"{d_qk}")
    tok_bytes, kv_format = _FP8_LAYOUTS[d_qk]
    if width != tok_bytes:
        raise ValueError(f"{name}: D_qk = {d_qk} needs {tok_bytes} bytes per token "
                         f"([num_blocks, P, 1, {tok_bytes}]), got shape {tuple(k_cache.shape)}")
    kc = k_cache.view(torch.uint8)
    s_page, s_tok = kc.stride(0), kc.stride(1)
    if kc.stride(3) != 1 or (P > 1 and s_tok != tok_bytes):
        raise ValueError(f"{name}: expected each page's {P} token rows packed ({tok_bytes}-byte "
                         f"rows, byte stride 1), got strides {tuple(kc.stride())}")
    if kv_format == "fp8_ds_mla":
        return kc[:, :, 0, :], kv_format                      # [nb, P, 656], no copy
    # MODEL1: the view's bytes are pages of model1_page_bytes(P) (data rows, then scale rows,
    # then padding to a multiple of 576), as FlashMLA's tests/quant.py allocates them.
    page_bytes = np_formats.model1_page_bytes(P)
    if nb > 1 and s_page < page_bytes:
        raise ValueError(f"{name}: MODEL1 pages of P = {P} are {page_bytes} bytes (FlashMLA's "
                         f"padded page), got a page stride of {s_page} bytes")
    if not _storage_end_ok(kc, nb, s_page if nb > 1 else page_bytes, page_bytes):
        raise ValueError(f"{name}: the storage ends inside the last MODEL1 page's padding "
                         f"({page_bytes} bytes per page); allocate pages as FlashMLA's quantizer "
                         f"does ([num_blocks, padded page bytes])")
    pages = torch.as_strided(kc, (nb, page_bytes), (s_page if nb > 1 else page_bytes, 1),
                             kc.storage_offset())
    return pages, kv_format


# ============================================================================ one cache

def _attend(q, name, k_cache, indices, topk_length, scale, is_fp8, sink, path):
    """(out in q's dtype ``[b, s_q, h_q, 512]``, lse float32 ``[b, h_q, s_q]`` contiguous, +inf
    empty: FlashMLA's) over one FlashMLA cache: one native call on the cache as it lies
    (strided pages included), its combine writing FlashMLA's lse layout."""
    cache, kv_format = _native_cache(name, k_cache, q.shape[3], is_fp8, q.device)
    return sparse_mla_decode(q, cache, indices, scale, kv_format=kv_format, d_v=512,
                             topk_length=topk_length, attn_sink=sink, path=path,
                             _lse_layout="flash_mla")


def _attend_two(q, caches, scale, is_fp8, sink, path, out):
    """(out ``[b, s_q, h_q, 512]`` in q's dtype, lse float32 ``[b, h_q, s_q]``, +inf empty) of one
    softmax over several FlashMLA caches (``caches``: ``(name, k_cache, indices, topk_length)``
    each), through :func:`sparse_mla_decode_sources`: float32 partials of every cache, one
    merge, the sink once, one rounding. ``out``: a contiguous tensor of q's dtype written in
    place, or None. Each cache is passed as it lies (strided pages read in place)."""
    srcs = []
    for name, k_cache, indices, tkl in caches:
        cache, kv_format = _native_cache(name, k_cache, q.shape[3], is_fp8, q.device)
        srcs.append(KVSource(cache, indices, kv_format, None, tkl))
    return sparse_mla_decode_sources(q, srcs, scale, d_v=512, attn_sink=sink, path=path, out=out,
                                     _lse_layout="flash_mla")


# ============================================================================ public entry

def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    extra_k_cache: Optional[torch.Tensor] = None,
    extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    path: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA sparse decode: ``flash_mla_with_kvcache(..., indices=..., is_fp8_kvcache=True)``.

    For each query row (batch i, token j, head h) and each valid entry t of ``indices[i, j]``
    (and of ``extra_indices_in_kvcache[i, j]``): ``s_t = softmax_scale * (q . k_t)`` (float32),
    ``lse = ln(sum_t exp(s_t))`` over both caches, ``out = sum_t exp(s_t - lse) * k_t[:512]``,
    then ``out *= 1 / (1 + exp(attn_sink[h] - lse))``. Semantics: FlashMLA 9241ae3
    ``flash_mla_interface.py`` and ``tests/ref.py::ref_sparse_attn_decode``.

    Args:
      q: ``[b, s_q, h_q, d_qk]`` bf16 (FlashMLA's dtype; fp16 / fp32 accepted as an extension:
        the CPU interpreter cannot compute bf16). d_qk 576 (V3.2) or 512 (MODEL1). Any h_q
        (FlashMLA: 64 or 128 only). Any strides.
      k_cache: ``[num_blocks, page_block_size, 1, bytes_per_token]`` uint8 / int8 /
        float8_e4m3fn view. V3.2 (d_qk 576): 656 bytes per token (512 e4m3, 4 float32 scales,
        64 bf16 rope dims); pages may be strided (FlashMLA's quantizer pads each page by one
        token row): read in place, see Notes. MODEL1 (d_qk 512): 584 bytes per token viewed
        over pages of ``ceil(P * 584 / 576) * 576`` bytes holding all P data rows (448 e4m3 +
        64 bf16) then all P scale rows (7 ue8m0 + 1 pad), so ``k_cache[b, t, 0]`` is *not*
        token t; the storage must hold the last page's padding, as FlashMLA's quantizer
        allocates it. Extension: with ``is_fp8_kvcache=False`` a latent cache
        ``[num_blocks, P, 1, d_qk]`` bf16 / fp16 / fp32.
      block_table, cache_seqlens: ignored by sparse decode (FlashMLA ignores them too).
      head_dim_v: 512 (the only value FlashMLA supports).
      tile_scheduler_metadata: the :class:`FlashMLASchedMeta` of :func:`get_mla_metadata`;
        filled on the first call, later calls must have the same shapes (ValueError otherwise).
      num_splits: must be None.
      softmax_scale: scale of ``q . k``; default ``d_qk ** -0.5``.
      causal: must be False (sparse decode); True raises NotImplementedError.
      is_fp8_kvcache: True for the fp8 layouts above.
      indices: int32 ``[b, s_q, topk]`` global slots ``page * page_block_size + offset``; -1
        (and any entry outside ``[0, num_blocks * page_block_size)``) is ignored and never
        read. None (dense decode) raises NotImplementedError.
      attn_sink: float32 ``[h_q]`` or None: +inf makes out 0, -inf has no effect; it does not
        change the returned lse.
      extra_k_cache, extra_indices_in_kvcache: a second cache (same format as ``k_cache``, its
        own page size) and its int32 ``[b, s_q, extra_topk]`` slots, attended together with
        the first in one softmax (float32 partials of both caches merged through their LSEs,
        the sink applied once after the merge, one rounding to q's dtype).
      topk_length, extra_topk_length: int32 ``[b]`` or None: only the first ``topk_length[i]``
        entries of ``indices[i]`` (resp. the extra indices) are used.
      out: extension (vLLM's vendored interface passes it): ``[b, s_q, h_q, 512]`` tensor of
        q's dtype (the output dtype; another dtype raises TypeError) on q's device that
        receives the result and is returned. With two caches and a contiguous ``out`` the
        combine writes it in place; otherwise the result is copied in.
      path: this project's path choice, ``"auto"`` | ``"triton"`` | ``"torch"``.

    Returns:
      (out, lse): out ``[b, s_q, h_q, 512]`` in q's dtype (bf16 for FlashMLA's bf16 q), 0 for a
      row with no valid entry; lse float32 ``[b, h_q, s_q]`` contiguous, natural log over both
      caches, excluding the sink, +inf for a row with no valid entry.

    Raises:
      TypeError / ValueError: a bad argument, named, with what was expected and what came.
        A page stride (bytes) that is not a multiple of 16 or smaller than one page raises
        ValueError naming ``k_cache`` / ``extra_k_cache``.
      NotImplementedError: dense decode, ``causal=True``, or a GPU / path the native op cannot
        run on (names the GPU).

    Notes:
      Strided pages (V3.2 pages of P + 1 rows sliced to P, MODEL1 pages further apart than
      their padded size) are passed to the native op as a strided view, which its kernels read
      in place (``page_bytes`` = the page stride): the same kernel, config and launch as for
      contiguous pages, no copy of the cache and no pass over the indices. Two caches run
      :func:`torch_impl.sparse_mla.sparse_mla_decode_sources`: on the triton path each cache's
      split kernel writes float32 partials (normalised outputs ``[splits, b * s_q, h_q, 512]``,
      log2 LSEs ``[splits, b * s_q, h_q]``) into one buffer, cache 0's splits then cache 1's,
      and one combine launch over all splits merges them, applies the sink once and rounds
      once (``kernels.sparse_mla.triton_launch.launch_sources``); ``path="torch"`` merges the
      two caches' float32 outputs and LSEs in PyTorch the same way. No partial output is
      rounded to q's dtype before the merge: partial outputs of opposite sign that nearly
      cancel would turn that rounding into a large error of the small merged value (it failed
      SPEC's out bound with bf16 q, docs/COMPAT.md). Bitwise repeatable (fixed split order,
      no atomics). The returned lse is one fused pass from the native ``[b, s_q, h_q]``.
    """
    # ---- FlashMLA's own argument rules
    if indices is None:
        _not_provided("dense decode (flash_mla_with_kvcache without indices)")
    if causal:
        raise NotImplementedError("torch_impl.compat.flash_mla: causal=True is dense decode; "
                                  "FlashMLA's sparse decode requires causal=False")
    if num_splits is not None:
        raise ValueError(f"num_splits: expected None (FlashMLA's placeholder), got "
                         f"{type(num_splits).__name__}")
    if not (hasattr(tile_scheduler_metadata, "have_initialized")
            and hasattr(tile_scheduler_metadata, "config")):
        raise TypeError(f"tile_scheduler_metadata: expected the FlashMLASchedMeta of "
                        f"get_mla_metadata(), got {type(tile_scheduler_metadata).__name__}")
    if isinstance(head_dim_v, bool) or head_dim_v != 512:
        raise ValueError(f"head_dim_v: expected 512, got {head_dim_v!r}")
    if not isinstance(is_fp8_kvcache, bool):
        raise TypeError(f"is_fp8_kvcache: expected a bool, got {type(is_fp8_kvcache).__name__}")
    _common.check_tensor("q", q, ndim=4, dtypes=_LATENT_DTYPES)
    b, s_q, h_q, d_qk = q.shape
    _common.check_tensor("indices", indices, ndim=3, dtypes=(torch.int32,), device=q.device)
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        raise ValueError("extra_k_cache / extra_indices_in_kvcache: expected both or neither, got "
                         f"{'extra_k_cache' if extra_k_cache is not None else 'extra_indices_in_kvcache'} only")
    if extra_topk_length is not None and extra_k_cache is None:
        raise ValueError("extra_topk_length: given without extra_k_cache")
    if extra_indices_in_kvcache is not None:
        _common.check_tensor("extra_indices_in_kvcache", extra_indices_in_kvcache, ndim=3,
                             dtypes=(torch.int32,), device=q.device)
        if tuple(extra_indices_in_kvcache.shape[:2]) != (b, s_q):
            raise ValueError(f"extra_indices_in_kvcache: expected shape ({b}, {s_q}, extra_topk), "
                             f"got {tuple(extra_indices_in_kvcache.shape)}")
    for nm, tl_ in (("topk_length", topk_length), ("extra_topk_length", extra_topk_length)):
        if tl_ is not None:
            _common.check_tensor(nm, tl_, shape=(b,), dtypes=(torch.int32,), device=q.device)
    if attn_sink is not None:
        _common.check_tensor("attn_sink", attn_sink, shape=(h_q,), dtypes=(torch.float32,),
                             device=q.device)
    if not isinstance(k_cache, torch.Tensor):
        raise TypeError(f"k_cache: expected a torch.Tensor, got {type(k_cache).__name__}")
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache: expected rank 4 [num_blocks, page_block_size, 1, "
                         f"bytes_per_token], got shape {tuple(k_cache.shape)}")
    _check_sched(tile_scheduler_metadata, q, k_cache, causal, is_fp8_kvcache, indices,
                 extra_k_cache, extra_indices_in_kvcache)
    if softmax_scale is None:
        scale = d_qk ** -0.5
    else:
        # named here: the native op would call it sm_scale (under torch.compile the scalar is
        # a SymFloat, which the native op does not check either)
        if not torch.compiler.is_compiling():
            check_real("softmax_scale", softmax_scale)
        scale = softmax_scale
    if out is not None:
        # the op's output dtype is q's: an out of another dtype would be silently cast
        # (int32 truncated, fp16 rounded), so it is refused
        _common.check_tensor("out", out, shape=(b, s_q, h_q, 512), dtypes=(q.dtype,),
                             device=q.device)

    # ---- attention (native errors re-raised under this function's argument names)
    # a -inf sink on an empty row gives factor 0 (FlashMLA's 0 output) in the native op itself
    # (SPEC: a -inf sink counts as the most negative float32), so the sink is passed as it is
    sink = attn_sink
    if extra_k_cache is None:
        with own_names(_ONE_CACHE_NAMES):
            o, lse = _attend(q, "k_cache", k_cache, indices, topk_length, scale, is_fp8_kvcache,
                             sink, path)
    else:
        # one softmax over both caches: float32 partials, one merge, the sink once, one
        # rounding, written straight into out= when it is contiguous (its dtype is q's)
        dst = out if (out is not None and out.is_contiguous()) else None
        with own_names(_TWO_CACHE_NAMES):
            o, lse = _attend_two(q, (("k_cache", k_cache, indices, topk_length),
                                     ("extra_k_cache", extra_k_cache, extra_indices_in_kvcache,
                                      extra_topk_length)),
                                 scale, is_fp8_kvcache, sink, path, dst)
        if dst is not None:
            return out, lse
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse


def _check_sched(meta, q, k_cache, causal, is_fp8, indices, extra_k_cache, extra_indices):
    cfg = FlashMLASchedMeta.Config(
        b=q.shape[0], s_q=q.shape[1], h_q=q.shape[2], page_block_size=k_cache.shape[1],
        h_k=k_cache.shape[2], causal=causal, is_fp8_kvcache=is_fp8, topk=indices.shape[-1],
        extra_page_block_size=extra_k_cache.shape[1] if extra_k_cache is not None else None,
        extra_topk=extra_indices.shape[-1] if extra_indices is not None else None)
    if not meta.have_initialized:
        meta.have_initialized = True
        meta.config = cfg
        return
    old = meta.config
    if old is None:
        meta.config = cfg
        return
    for f in dataclasses.fields(cfg):
        was, now = getattr(old, f.name, None), getattr(cfg, f.name)
        if was != now:
            raise ValueError(f"tile_scheduler_metadata: its config has {f.name} = {was!r} from the "
                             f"first call, this call has {now!r}; use one FlashMLASchedMeta per "
                             f"shape (FlashMLA requires the same)")
