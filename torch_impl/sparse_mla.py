"""Sparse MLA decode for PyTorch: Triton kernels (``path="triton"``) and plain PyTorch
(``path="torch"``), registered as the custom op ``dsa::sparse_mla_decode``.

Semantics: docs/SPEC.md "Operation B" (FlashMLA sparse decode); the float64 definition is
``kernels.reference.sparse_mla_decode``; the kernel design is in ``kernels/sparse_mla/triton.py``
and its launcher (strides, grid, split count, constexprs, AOT specs) beside it in
``kernels/sparse_mla/triton_launch.py``. This module validates, gates the GPU, plans the call
(``kernels.registry``) and registers the custom op; the plain-PyTorch path is here too.

The custom op (``torch.library.custom_op`` with a fake implementation) lets
``torch.compile(fullgraph=True)`` trace through a call and a CUDA graph capture it: the launcher
does no host synchronisation and every allocation depends on shapes only (never on index
values or ``topk_length``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from kernels import formats as np_formats, hardware
from kernels.sparse_mla import configs, triton_launch
from kernels.sparse_mla.triton_launch import TRITON_SHAPES
from kernels.scalars import check_int, check_real
from torch_impl import _common
from torch_impl.formats import dequantize_fp8_ds_mla

__all__ = ["sparse_mla_decode", "sparse_mla_decode_sources", "KVSource", "choose_config",
           "TRITON_SHAPES"]

_Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_LATENT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_D_QK = {"fp8_ds_mla": 576, "fp8_model1": 512}


# ============================================================================ validation

def _validate(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length,
              attn_sink, path):
    """SPEC "Bad input": TypeError / ValueError naming the argument, expected and received.

    Returns (P, num_slots, num_pages).
    """
    _common.check_tensor("q", q, ndim=4, dtypes=_Q_DTYPES)
    B, N, H, D = q.shape
    dev = q.device
    if kv_format not in np_formats.KV_FORMATS:
        raise ValueError(f"kv_format: expected one of {np_formats.KV_FORMATS}, got {kv_format!r}")
    if path not in _common.TORCH_PATHS:
        raise ValueError(f"path: expected one of {_common.TORCH_PATHS}, got {path!r}")
    if not torch.compiler.is_compiling():
        # Dynamo traces a float argument as a SymFloat, and math.isfinite of it breaks the graph
        # (seen at the real V4-Flash layer under fullgraph compile); the eager call checks it
        check_real("sm_scale", sm_scale)
    check_int("d_v", d_v)
    if min(B, N, H) < 1:
        raise ValueError(f"q: expected non-empty [B, N, H, D_qk], got shape {tuple(q.shape)}")
    if kv_format in _D_QK and D != _D_QK[kv_format]:
        raise ValueError(f"q: kv_format {kv_format!r} needs D_qk = {_D_QK[kv_format]}, "
                         f"got shape {tuple(q.shape)}")
    if not 1 <= d_v <= D:
        raise ValueError(f"d_v: expected 1 <= d_v <= D_qk = {D}, got {d_v}")
    if kv_format == "fp8_ds_mla" and d_v != 512:
        raise ValueError(f"d_v: kv_format 'fp8_ds_mla' stores V as the 512 fp8 dims, expected 512, got {d_v}")

    if kv_format == "latent":
        _common.check_tensor("kv_cache", kv_cache, ndim=3, dtypes=_LATENT_DTYPES, device=dev)
        if kv_cache.shape[2] != D:
            raise ValueError(f"kv_cache: expected shape (num_pages, P, {D}) to match q's D_qk, "
                             f"got {tuple(kv_cache.shape)}")
        if kv_cache.stride(2) != 1:
            raise ValueError(f"kv_cache: expected the last dim contiguous (stride 1), got strides "
                             f"{kv_cache.stride()}")
        num_pages, P = kv_cache.shape[0], kv_cache.shape[1]
    elif kv_format == "fp8_ds_mla":
        _common.check_tensor("kv_cache", kv_cache, ndim=3, dtypes=(torch.uint8,), device=dev)
        if kv_cache.shape[2] != np_formats.DS_MLA_BYTES:
            raise ValueError(f"kv_cache: expected shape (num_pages, P, 656) for 'fp8_ds_mla', "
                             f"got {tuple(kv_cache.shape)}")
        num_pages, P = kv_cache.shape[0], kv_cache.shape[1]
        if kv_cache.stride(2) != 1 or (P > 1 and kv_cache.stride(1) != np_formats.DS_MLA_BYTES):
            raise ValueError(f"kv_cache: expected each 'fp8_ds_mla' page's P token rows packed "
                             f"(strides (page stride, 656, 1)), got strides {kv_cache.stride()}")
    else:
        _common.check_tensor("kv_cache", kv_cache, ndim=2, dtypes=(torch.uint8,), device=dev)
        if kv_cache.stride(1) != 1 and kv_cache.shape[1] > 1:
            raise ValueError(f"kv_cache: expected each 'fp8_model1' page's bytes packed (strides "
                             f"(page stride, 1)), got strides {kv_cache.stride()}")
        num_pages = kv_cache.shape[0]
        P = np_formats.model1_page_size(kv_cache.shape[1])   # ValueError names kv_cache
    if num_pages < 1 or P < 1:
        raise ValueError(f"kv_cache: expected at least one page of one slot, got {tuple(kv_cache.shape)}")
    if kv_format != "latent":
        _check_page_stride(kv_cache, kv_format, P)
    if not torch.compiler.is_compiling():
        # storage_offset() is an int Dynamo cannot trace; under torch.compile the op body
        # (_run, eager on real tensors) makes the same check.
        _check_byte_offset(kv_cache, kv_format)

    _common.check_tensor("indices", indices, ndim=3, dtypes=(torch.int32,), device=dev)
    if indices.shape[0] != B or indices.shape[1] != N or indices.shape[2] < 1:
        raise ValueError(f"indices: expected shape ({B}, {N}, K >= 1), got {tuple(indices.shape)}")
    if block_table is not None:
        _common.check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=dev)
        if block_table.shape[0] != B or block_table.shape[1] < 1:
            raise ValueError(f"block_table: expected shape ({B}, max_pages >= 1), got "
                             f"{tuple(block_table.shape)}")
    if topk_length is not None:
        _common.check_tensor("topk_length", topk_length, shape=(B,), dtypes=(torch.int32,), device=dev)
    if attn_sink is not None:
        _common.check_tensor("attn_sink", attn_sink, shape=(H,), dtypes=(torch.float32,), device=dev)
    return P, num_pages * P, num_pages


def _check_page_stride(kv_cache, kv_format: str, P: int) -> None:
    """An fp8 cache's page stride (``stride(0)``, bytes): pages may be padded (FlashMLA's
    quantizer allocates V3.2 pages of P + 1 rows and slices P; a pool may pad MODEL1 pages), and
    the kernels read them in place, so the stride must be at least the page's own bytes (no
    overlap) and a multiple of ``kernels.formats.FP8_PAGE_ALIGN`` (16: every row start stays
    16-byte aligned for the kernels' 16-byte vector loads, as the compiled launches assume).
    Irrelevant for a single page."""
    if kv_cache.shape[0] < 2:
        return
    used = triton_launch.page_used_bytes(kv_cache, kv_format, P)
    s0 = kv_cache.stride(0)
    if s0 < used or s0 % np_formats.FP8_PAGE_ALIGN:
        raise ValueError(
            f"kv_cache: expected a page stride (stride(0), bytes) that is a multiple of "
            f"{np_formats.FP8_PAGE_ALIGN} and at least the {used} bytes of one {kv_format!r} page "
            f"of P = {P} (padded pages are read in place), got {s0}")


# ============================================================================ config choice

def choose_config(dev: hardware.DeviceInfo, *, B: int, N: int, H: int, K: int, d_qk: int,
                  kv_format: str, operand_bytes: int = 2) -> tuple[str | None, configs.SparseMLAConfig]:
    """(path the dispatch table chose or None, kernel config the triton path runs) for one call.

    The plan of ``kernels.registry`` for the triton path: the config of the table's entry
    (``kernels/dispatch/<arch>.json``) for this shape bucket when the entry chose "triton" and
    the config is in this GPU's search space, else ``kernels.sparse_mla.configs.sparse_mla_heuristic``;
    either way a config compiled and checked for the GPU's shared-memory class and the dot
    operand width (``operand_bytes``: 2 bf16/fp16, 4 fp32).
    """
    pl = _common.REGISTRY.plan("sparse_mla_decode", "torch", dev, path="triton", B=B, N=N, H=H,
                               K=K, d_qk=d_qk, kv_format=kv_format, operand_bytes=operand_bytes)
    return (pl.entry or {}).get("path"), configs.SparseMLAConfig(**pl.config)


# ============================================================================ triton path

def _triton_gate(q, kv_caches, kv_formats, d_v):
    """DeviceInfo of q's device after the triton path's gates (arch, interpreted bf16, the
    (D_qk, d_v) pairs the kernels are built for): NotImplementedError before any launch."""
    dev = _common.device_info(q.device)
    hardware.require_arch(dev, "sparse_mla_decode (triton)")
    _common.require_no_interpreted_bf16(
        dev, "sparse_mla_decode (triton)", q,
        *(c for c, f in zip(kv_caches, kv_formats) if f == "latent"))
    D = q.shape[3]
    if (D, d_v) not in TRITON_SHAPES:
        raise NotImplementedError(
            f"sparse_mla_decode (triton) on {dev.name} (compute capability {dev.cc[0]}.{dev.cc[1]}) "
            f"supports (D_qk, d_v) in {TRITON_SHAPES}, got ({D}, {d_v})")
    return dev


def _cluster_kernels_supported() -> bool:
    from kernels.sparse_mla.gluon_cluster import cluster_kernels_supported
    return cluster_kernels_supported()


def _triton_config(dev, q, kv_cache, kv_format, K, config):
    """The tile config one cache's split kernel runs: ``config`` (the plan's) or the registry's
    choice, a Gluon config replaced by a Triton tile where its kernel cannot run
    (``configs.kernel_eligible``; for the warp-specialised kernel on a latent cache also
    ``configs.gluon_ws_latent_layout_ok``: rows packed and 16-byte aligned): the 64-head tile,
    or for the few-heads kernels (``"gluon_sh"``, ``"gluon_shws"``) the heuristic's Triton tile
    for the call; the crossover kernels (``"gluon_xo"``, ``"gluon_xs"``) with an odd number of
    64-head blocks (``configs.gluon_xo_heads_ok``) or under a Triton they are not written for
    (``gluon_cluster.cluster_kernels_supported``) run the warp-specialised one."""
    B, N, H, D = q.shape
    width = _operand_bytes(q, kv_cache, kv_format)
    cfg = config or choose_config(dev, B=B, N=N, H=H, K=K, d_qk=D, kv_format=kv_format,
                                  operand_bytes=width)[1]
    if cfg.kernel in configs.CLUSTER_KERNELS and not (configs.gluon_xo_heads_ok(H)
                                                     and _cluster_kernels_supported()):
        # one 64-head block left without its pair, or a Triton the crossover kernels are not
        # written for (gluon_cluster.CLUSTER_TRITON)
        cfg = configs.SPARSE_MLA_GLUON_WS
    if not configs.kernel_eligible(cfg.kernel, dev, kv_format, D, width) or (
            cfg.kernel != "triton" and kv_format == "latent"
            and not configs.gluon_ws_latent_layout_ok(
                kv_cache.stride(0), kv_cache.stride(1), kv_cache.shape[0], kv_cache.shape[1], D,
                kv_cache.data_ptr(), kv_cache.element_size())):
        # the Triton 64-head tile (same shape class) where it is a member of this operand
        # width's space; fp32 operands stage twice the bytes (the 64-head tile needs 242,688 B
        # on sm_90 then): the heuristic's fp32 tile
        space = configs.sparse_mla_space(dev.smem_per_block, width)
        if cfg.kernel in ("gluon_sh", "gluon_shws"):
            cfg = configs.sparse_mla_heuristic(H, dev.smem_per_block, width, rows=B * N, topk=K)
        else:
            cfg = (configs.SPARSE_MLA_W64 if configs.SPARSE_MLA_W64 in space
                   else configs.sparse_mla_heuristic(H, dev.smem_per_block, width))
    return cfg


def _triton_impl(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length,
                 attn_sink, *, config: configs.SparseMLAConfig | None = None,
                 num_splits: int | None = None, geometry: tuple | None = None,
                 lse_layout: str = "native"):
    """Gate the GPU, then launch (``kernels.sparse_mla.triton_launch``). ``config`` /
    ``num_splits`` override the choice (tests use them to run every config of the search space);
    ``geometry``: ``(P, num_slots, num_pages)`` from the validation (else read off the cache)."""
    dev = _triton_gate(q, (kv_cache,), (kv_format,), d_v)
    P, _, num_pages = geometry or _geometry(kv_cache, kv_format)
    cfg = _triton_config(dev, q, kv_cache, kv_format, indices.shape[2], config)
    return triton_launch.launch(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table,
                                topk_length, attn_sink, page_size=P, num_pages=num_pages,
                                config=cfg, num_sms=dev.num_sms,
                                smem_per_block=dev.smem_per_block, num_splits=num_splits,
                                lse_layout=lse_layout)


def _operand_bytes(q, kv_cache, kv_format) -> int:
    """Width of the kernel's dot operands (2: fp16 / bf16, 4: fp32): selects the config space."""
    return 4 if triton_launch.dot_dtype(q.dtype, kv_cache.dtype, kv_format) == "float32" else 2


def _logical_to_slots(indices, block_table, P: int, num_pages: int):
    """Logical top-k positions ``[B, N, K]`` -> int32 slots ``block_table[b, j // P] * P + j % P``,
    -1 where the SPEC makes an entry invalid (negative, past the table, a page entry outside
    ``[0, num_pages)``). Only valid entries are looked up."""
    B, N, K = indices.shape
    idx = indices.long()
    max_pages = block_table.shape[1]
    ok = (idx >= 0) & (idx < max_pages * P)
    lpage = torch.where(ok, idx // P, 0)
    ent = torch.gather(block_table.long(), 1, lpage.reshape(B, N * K)).reshape(B, N, K)
    ok &= (ent >= 0) & (ent < num_pages)
    return torch.where(ok, ent * P + idx % P, -1).to(torch.int32).contiguous()


def _geometry(kv_cache, kv_format):
    """(P, num_slots, num_pages) of a validated cache."""
    if kv_format == "fp8_model1":
        P = np_formats.model1_page_size(kv_cache.shape[1])
    else:
        P = kv_cache.shape[1]
    return P, kv_cache.shape[0] * P, kv_cache.shape[0]


# ============================================================================ torch path

def _gather_rows(kv_cache, kv_format, page, off):
    """Dequantized float32 latent rows ``[..., D_qk]`` of (page, off) pairs (all in range)."""
    if kv_format == "latent":
        return kv_cache[page, off].float()
    if kv_format == "fp8_ds_mla":
        return dequantize_fp8_ds_mla(kv_cache[page, off])
    n = kv_cache.shape[0]
    P = np_formats.model1_page_size(kv_cache.shape[1])
    data = kv_cache[:, : P * 576].view(n, P, 576)[page, off]                # [..., 576]
    e = kv_cache[:, P * 576: P * 584].view(n, P, 8)[page, off][..., :7]      # [..., 7]
    scale = (e.to(torch.int32) << 23).view(torch.float32)                   # 2^(e-127)
    nope = data[..., :448].contiguous().view(torch.float8_e4m3fn).float()
    nope = (nope.unflatten(-1, (7, 64)) * scale[..., None]).flatten(-2)
    rope = data[..., 448:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=-1)


def _torch_f32(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length,
               geometry: tuple | None = None):
    """Plain PyTorch, fp32, no sink: (out float32 ``[B, N, H, d_v]``, lse float32 ``[B, N, H]``
    natural log, -inf for an empty row). Invalid indices are clamped to slot 0, gathered, then
    masked (rows zeroed, scores excluded), so nothing invalid is used and NaN in unselected rows
    cannot leak."""
    B, N, H, D = q.shape
    K = indices.shape[2]
    P, num_slots, num_pages = geometry or _geometry(kv_cache, kv_format)
    if block_table is not None:
        indices = _logical_to_slots(indices, block_table, P, num_pages)    # invalid -> -1
    slot = indices.long()
    ok = (slot >= 0) & (slot < num_slots)
    if topk_length is not None:
        ok &= torch.arange(K, device=q.device)[None, None, :] < topk_length.long()[:, None, None]
    slot = torch.where(ok, slot, 0)
    rows = _gather_rows(kv_cache, kv_format, slot // P, slot % P)            # [B, N, K, D]
    rows = torch.where(ok[..., None], rows, 0.0)
    s = torch.einsum("bnhd,bnkd->bnhk", q.float(), rows[..., :D]) * float(sm_scale)
    s = torch.where(ok[:, :, None, :], s, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(m == float("-inf"), 0.0, m)   # all masked -> p = 0; +inf / NaN give NaN
    p = torch.exp(s - m)                                                     # masked -> 0
    den = p.sum(dim=-1)                                                      # [B, N, H]
    has = den != 0          # NaN sums propagate (as in the reference); empty iff den == 0
    lse = torch.where(has, m[..., 0] + torch.log(torch.where(has, den, 1.0)), float("-inf"))
    out = torch.einsum("bnhk,bnkd->bnhd", p, rows[..., :d_v])
    out = out / torch.where(has, den, 1.0)[..., None]
    return out, lse.float()


def _sink_factor(lse, attn_sink):
    """``1 / (1 + exp(sink_h - lse))`` ``[B, N, H]``, a sink of -inf taken as the most negative
    float32 (SPEC): 0 on every empty row, 1 on a non-empty row with a -inf sink; NaN kept."""
    return torch.sigmoid(lse - attn_sink.clamp(min=torch.finfo(torch.float32).min))


def _torch_impl(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length,
                attn_sink, *, geometry: tuple | None = None, lse_layout: str = "native"):
    """:func:`_torch_f32`, the sink, one rounding to q's dtype; the lse in ``lse_layout``."""
    out, lse = _torch_f32(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table,
                          topk_length, geometry)
    if attn_sink is not None:
        out = out * _sink_factor(lse, attn_sink)[..., None]
    return out.to(q.dtype), _lse_in(lse, lse_layout)


def _lse_in(lse: torch.Tensor, lse_layout: str) -> torch.Tensor:
    """The native lse ``[B, N, H]`` in ``lse_layout`` (``triton_launch.LSE_LAYOUTS``)."""
    return triton_launch.to_flash_mla_lse(lse) if lse_layout == "flash_mla" else lse


def _torch_sources(q, sources, sm_scale, d_v, attn_sink, geometries):
    """Several caches in one softmax, plain PyTorch: each cache's float32 (out, lse) merged in
    float32 through the LSEs (``lse = m + ln sum_i e^{lse_i - m}``, ``out = sum_i e^{lse_i - lse}
    out_i``), the sink once, one rounding to q's dtype. A NaN partial makes the row NaN."""
    parts = [_torch_f32(q, src.kv_cache, src.indices, sm_scale, src.kv_format, d_v,
                        src.block_table, src.topk_length, geo)
             for src, geo in zip(sources, geometries)]
    lses = torch.stack([l for _, l in parts])                               # [S, B, N, H]
    m = lses.amax(dim=0)
    m = torch.where(m == float("-inf"), 0.0, m)
    w = torch.exp(lses - m)                                                  # -inf -> 0
    den = w.sum(dim=0)
    has = den != 0
    safe = torch.where(has, den, 1.0)
    lse = torch.where(has, m + torch.log(safe), float("-inf"))
    f = w / safe                                                             # [S, B, N, H]
    out = parts[0][0] * f[0][..., None]
    for i in range(1, len(parts)):
        out.addcmul_(parts[i][0], f[i][..., None])
    if attn_sink is not None:
        out = out * _sink_factor(lse, attn_sink)[..., None]
    return out.to(q.dtype), lse


# ============================================================================ custom op

def _check_byte_offset(kv_cache: torch.Tensor, kv_format: str) -> None:
    if kv_format != "latent":
        _common.check_byte_offset("kv_cache", kv_cache, "the kernels read the bf16 rope and "
                                  "float32 scales through int16 / float32 views")


def _run(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length, attn_sink,
         path, page_size, num_pages, lse_layout):
    _check_byte_offset(kv_cache, kv_format)
    args = (q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length, attn_sink)
    geometry = (page_size, page_size * num_pages, num_pages)
    B, N, H, D = q.shape
    pl = _common.plan("sparse_mla_decode", q.device, path, B=B, N=N, H=H, K=indices.shape[2],
                      d_qk=D, kv_format=kv_format,
                      operand_bytes=_operand_bytes(q, kv_cache, kv_format))
    cfg = pl.config_for("triton") if "triton" in pl.order else None
    impls = {"triton": lambda: _triton_impl(*args, config=configs.SparseMLAConfig(**cfg) if cfg else None,
                                            geometry=geometry, lse_layout=lse_layout),
             "torch": lambda: _torch_impl(*args, geometry=geometry, lse_layout=lse_layout)}
    return _common.run_path("sparse_mla_decode", path, impls, pl.order)


@torch.library.custom_op("dsa::sparse_mla_decode", mutates_args=())
def _sparse_mla_decode_op(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                          sm_scale: float, kv_format: str, d_v: int,
                          block_table: Optional[torch.Tensor], topk_length: Optional[torch.Tensor],
                          attn_sink: Optional[torch.Tensor], path: str, page_size: int,
                          num_pages: int, lse_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length,
                attn_sink, path, page_size, num_pages, lse_layout)


@_sparse_mla_decode_op.register_fake
def _(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length, attn_sink, path,
      page_size, num_pages, lse_layout):
    B, N, H, _ = q.shape
    lse_shape = (B, H, N) if lse_layout == "flash_mla" else (B, N, H)
    return q.new_empty((B, N, H, d_v)), q.new_empty(lse_shape, dtype=torch.float32)


def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                      sm_scale: float, *, kv_format: str = "latent", d_v: int = 512,
                      block_table: torch.Tensor | None = None,
                      topk_length: torch.Tensor | None = None,
                      attn_sink: torch.Tensor | None = None,
                      path: str = "auto",
                      _lse_layout: str = "native") -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode (absorbed MLA in MQA form) over top-k selected latent rows.

    For each query row (b, i, h) and each valid entry t of ``indices[b, i]``:
    ``s_t = sm_scale * (q . latent_t[:D_qk])`` (float32), ``lse = ln(sum_t exp(s_t))`` and
    ``out = sum_t exp(s_t - lse) * latent_t[:d_v]``. Semantics: docs/SPEC.md
    "Operation B", from FlashMLA ``flash_mla_with_kvcache`` sparse decode.

    Args:
      q: shape ``[B, N, H, D_qk]``, bf16 / fp16 / fp32; any strides (the last dim is made
        contiguous if it is not). N = query tokens per request (next_n), H = heads on this rank.
      kv_cache: the latent cache, one of
        ``"latent"``: ``[num_pages, P, D_qk]`` bf16 / fp16 / fp32, last dim contiguous;
        ``"fp8_ds_mla"``: uint8 ``[num_pages, P, 656]`` (D_qk = 576): e4m3 nope dims,
        four float32 scales per 128 dims, bf16 rope dims; strides ``(page_stride, 656, 1)``;
        ``"fp8_model1"``: uint8 ``[num_pages, page_bytes]`` (D_qk = 512): per page P
        data rows (448 e4m3 + 64 bf16) then P ue8m0 scale rows (byte layouts:
        ``kernels/formats.py``); strides ``(page_stride, 1)``. The fp8 pages may be padded
        (read in place, never copied: FlashMLA's quantizer allocates V3.2 pages of P + 1 rows
        and slices P): ``page_stride`` (bytes) a multiple of 16 and at least the page's own
        bytes (``P * 656`` / ``page_bytes``); any value for a single page. The view's start
        must be 4-byte aligned in its storage. A slot is ``page * P + offset``.
      indices: int32 ``[B, N, K]``: slots into the cache, or with ``block_table`` logical
        positions of request b. An entry is ignored (never dereferenced) when negative (-1 is
        the usual padding), ``>= num_slots``, or with a block table ``>= max_pages * P`` or on a
        negative page entry. Duplicated valid entries count once per occurrence.
      sm_scale: softmax scale multiplying ``q . k`` (natural-log domain): a Python int / float
        or NumPy integer / floating scalar, never a bool, finite and finite in float32
        (``kernels.scalars.check_real``).
      kv_format: ``"latent"``, ``"fp8_ds_mla"`` or ``"fp8_model1"``.
      d_v: value width, the first ``d_v`` latent dims (512 in both models).
      block_table: int32 ``[B, max_pages]`` or None: slot of position j is
        ``block_table[b, j // P] * P + j % P``; entries past a request's pages may be -1.
      topk_length: int32 ``[B]`` or None: list positions ``>= topk_length[b]`` are ignored.
      attn_sink: float32 ``[H]`` or None (V4): ``out *= 1 / (1 + exp(sink_h - lse))``; the
        returned lse excludes the sink.
      path: ``"auto"`` (dispatch-table entry if any, else ``"triton"`` then ``"torch"``, falling
        through on NotImplementedError), ``"triton"`` or ``"torch"`` (named paths re-raise).
      _lse_layout: internal, for ``torch_impl.compat.flash_mla``: ``"flash_mla"`` returns the
        lse as FlashMLA does (``[B, H, N]`` contiguous, +inf for an empty row), written by the
        combine kernel itself when the list is split (no extra pass).

    Returns:
      (out, lse): out ``[B, N, H, d_v]`` in q's dtype; lse float32 ``[B, N, H]``, natural log.
      A row with no valid entry has out 0 and lse -inf (FlashMLA returns +inf there).

    Raises:
      TypeError / ValueError: wrong type, dtype, rank, shape, device or layout (names the
        argument, what was expected and what came), e.g. an fp8 page stride that is not a
        multiple of 16 or smaller than a page; an ``sm_scale`` that is not a real scalar
        (TypeError), or is NaN / inf or overflows float32, e.g. ``1e39`` (ValueError; checked
        eagerly, not under torch.compile).
      NotImplementedError: the named path cannot run here (GPU arch, CPU without
        ``TRITON_INTERPRET=1``, unsupported (D_qk, d_v)); names the GPU and what is supported.
    """
    P, _, num_pages = _validate(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table,
                                topk_length, attn_sink, path)
    _check_lse_layout(_lse_layout)
    return torch.ops.dsa.sparse_mla_decode(q, kv_cache, indices, float(sm_scale), kv_format, int(d_v),
                                           block_table, topk_length, attn_sink, path, P, num_pages,
                                           _lse_layout)


def _check_lse_layout(lse_layout) -> None:
    if lse_layout not in triton_launch.LSE_LAYOUTS:
        raise ValueError(f"_lse_layout: expected one of {triton_launch.LSE_LAYOUTS}, got "
                         f"{lse_layout!r}")


# ============================================================================ several caches

class KVSource(NamedTuple):
    """One cache of :func:`sparse_mla_decode_sources`: the arguments :func:`sparse_mla_decode`
    takes for it (same shapes, dtypes, layouts and index rules)."""

    kv_cache: torch.Tensor
    indices: torch.Tensor
    kv_format: str = "latent"
    block_table: Optional[torch.Tensor] = None
    topk_length: Optional[torch.Tensor] = None


_SOURCE_ARGS = ("kv_cache", "indices", "block_table", "topk_length", "kv_format")


def _validate_sources(q, sources, sm_scale, d_v, attn_sink, path, out):
    """:func:`_validate` of every source (an error about a source's own argument is prefixed
    ``sources[i].``), then ``out``. Returns the geometries ``(P, num_slots, num_pages)``."""
    if isinstance(sources, KVSource) or not isinstance(sources, (list, tuple)):
        raise TypeError(f"sources: expected a list or tuple of KVSource, got "
                        f"{type(sources).__name__}")
    if not sources:
        raise ValueError("sources: expected at least one KVSource, got an empty sequence")
    geos = []
    for i, src in enumerate(sources):
        if not isinstance(src, KVSource):
            raise TypeError(f"sources[{i}]: expected a KVSource, got {type(src).__name__}")
        try:
            geos.append(_validate(q, src.kv_cache, src.indices, sm_scale, src.kv_format, d_v,
                                  src.block_table, src.topk_length, attn_sink, path))
        except (TypeError, ValueError) as e:
            if str(e).startswith(_SOURCE_ARGS):
                raise type(e)(f"sources[{i}].{e}") from None
            raise
    if out is not None:
        B, N, H, _ = q.shape
        _common.check_tensor("out", out, shape=(B, N, H, d_v), dtypes=(q.dtype,), device=q.device)
        if not out.is_contiguous():
            raise ValueError(f"out: expected a contiguous tensor (written in place), got strides "
                             f"{out.stride()}")
    return geos


def sparse_mla_decode_sources(q: torch.Tensor, sources, sm_scale: float, *, d_v: int = 512,
                              attn_sink: torch.Tensor | None = None, path: str = "auto",
                              out: torch.Tensor | None = None,
                              _lse_layout: str = "native") -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode over the valid entries of several caches in one softmax.

    For each query row (b, i, h): the entries t of every source's ``indices[b, i]`` that
    :func:`sparse_mla_decode` would use for that source, all together:
    ``lse = ln(sum_t exp(s_t))``, ``out = sum_t exp(s_t - lse) * latent_t[:d_v]``, then
    ``out *= 1 / (1 + exp(sink_h - lse))`` once. Equal to one :func:`sparse_mla_decode` over a
    cache holding all sources' rows (FlashMLA's ``extra_k_cache``: ``torch_impl.compat.flash_mla``).

    How: ``path="triton"`` runs each source's split kernel (never its single-split epilogue)
    into one float32 partial buffer (``kernels.sparse_mla.triton_launch.launch_sources``) and one
    combine over all splits: the sink once, one rounding. ``path="torch"`` merges the sources'
    float32 outputs and LSEs in PyTorch, the sink once, one rounding. No partial output is ever
    rounded to q's dtype (rounded partials of opposite sign that cancel would turn their
    rounding error into a large error of the small merged value).

    Args:
      q: ``[B, N, H, D_qk]`` bf16 / fp16 / fp32, any strides (as :func:`sparse_mla_decode`).
      sources: non-empty list / tuple of :class:`KVSource` ``(kv_cache, indices, kv_format,
        block_table, topk_length)``, each as :func:`sparse_mla_decode` takes them (its own
        format, page size, ``indices [B, N, K_i]`` int32, block table ``[B, max_pages_i]`` and
        ``topk_length [B]``, all on q's device).
      sm_scale: softmax scale of ``q . k`` (natural-log domain), shared by all sources.
      d_v: value width (512).
      attn_sink: float32 ``[H]`` or None, applied once after the merge; the lse excludes it.
      path: ``"auto"`` (the dispatch plan of a call of ``K = sum K_i`` on source 0's format,
        falling through on NotImplementedError), ``"triton"`` or ``"torch"``.
      out: optional contiguous ``[B, N, H, d_v]`` tensor of q's dtype: the triton path writes
        the result into it in place, the torch path copies into it; returned as ``out``.
      _lse_layout: internal, as :func:`sparse_mla_decode`'s (the triton path's combine writes
        FlashMLA's layout itself).

    Returns:
      (out, lse): out ``[B, N, H, d_v]`` in q's dtype; lse float32 ``[B, N, H]`` natural log
      over all sources, -inf for a row with no valid entry in any source, NaN where a used row
      or q is NaN. Same inputs, same bits.

    Raises:
      TypeError / ValueError: as :func:`sparse_mla_decode` for each source, the message
        prefixed ``sources[i].`` when it is about that source's own argument; ``sources`` not
        a list / tuple of KVSource (TypeError) or empty (ValueError); ``out`` of the wrong
        shape, dtype, device or layout.
      NotImplementedError: the named path cannot run here (as :func:`sparse_mla_decode`).
    """
    geos = _validate_sources(q, sources, sm_scale, d_v, attn_sink, path, out)
    _check_lse_layout(_lse_layout)
    sources = tuple(sources)
    for src in sources:
        _check_byte_offset(src.kv_cache, src.kv_format)
    B, N, H, D = q.shape
    sm_scale = float(sm_scale)
    s0 = sources[0]
    pl = _common.plan("sparse_mla_decode", q.device, path, B=B, N=N, H=H,
                      K=sum(src.indices.shape[2] for src in sources), d_qk=D,
                      kv_format=s0.kv_format,
                      operand_bytes=_operand_bytes(q, s0.kv_cache, s0.kv_format))

    def triton():
        dev = _triton_gate(q, [src.kv_cache for src in sources],
                           [src.kv_format for src in sources], d_v)
        srcs = [triton_launch.Source(src.kv_cache, src.indices, src.kv_format, P, n,
                                     _triton_config(dev, q, src.kv_cache, src.kv_format,
                                                    src.indices.shape[2], None),
                                     src.block_table, src.topk_length)
                for src, (P, _, n) in zip(sources, geos)]
        return triton_launch.launch_sources(q, srcs, sm_scale, d_v, attn_sink,
                                            num_sms=dev.num_sms,
                                            smem_per_block=dev.smem_per_block, out=out,
                                            lse_layout=_lse_layout)

    def torch_():
        o, lse = _torch_sources(q, sources, sm_scale, d_v, attn_sink, geos)
        if out is not None:
            out.copy_(o)
            o = out
        return o, _lse_in(lse, _lse_layout)

    return _common.run_path("sparse_mla_decode", path, {"triton": triton, "torch": torch_},
                            pl.order)
