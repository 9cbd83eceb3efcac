"""Launcher of the Triton sparse MLA kernels (``kernels/sparse_mla/triton.py``): the dot operand
dtypes, strides and byte views of each cache format, the split count and chunk, the grid, the
constexprs, and the AOT compile specs of every launch it can make (``tests/test_triton_compile.py``).

No validation and no hardware gate here: the binding (``torch_impl.sparse_mla``) validates the
arguments, gates the GPU, picks the config (``kernels.registry``) and then calls :func:`launch`
(one cache) or :func:`launch_sources` (several caches in one softmax: each cache's split kernel
writes float32 partials into one buffer, one combine over all of them).
Imports torch at module level, triton at the first launch.
"""
from __future__ import annotations

import dataclasses

import torch

from kernels import formats
from kernels.sparse_mla import configs

__all__ = ["TRITON_SHAPES", "AOT_VARIANTS", "Source", "aot_specs", "combine_constexprs",
           "dot_dtype", "fp8_bytes", "launch", "launch_sources", "page_used_bytes", "rope_dtype",
           "split_constexprs", "split_spec"]

# (D_qk, d_v) pairs the Triton kernels are built and compile-checked for.
TRITON_SHAPES = ((576, 512), (512, 512))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dot_dtype(q_dtype: torch.dtype, kv_dtype: torch.dtype, kv_format: str) -> str:
    """Operand dtype (``triton.language`` name) of the nope / value dots: fp16 for the fp8
    formats with 16-bit q (dequantized tiles shifted per tile into fp16, q scaled per head: exact,
    docs/SEMANTICS.md "fast-path numerics"); for a latent cache q's dtype when the cache has it;
    else fp32 (IEEE). (bf16 never reaches the interpreter: the launcher refuses it.)"""
    if q_dtype == torch.float32 or (kv_format == "latent" and kv_dtype != q_dtype):
        return "float32"
    if kv_format != "latent":
        return "float16"
    return "bfloat16" if q_dtype == torch.bfloat16 else "float16"


def rope_dtype(q_dtype: torch.dtype, dot_name: str, kv_format: str) -> str:
    """Operand dtype of the rope dots of the fp8 formats (the rope is stored in bf16): bf16 for
    bf16 q (exact), else the nope dots' dtype (fp16 q: the documented fp16 rounding of the rope)."""
    if kv_format != "latent" and q_dtype == torch.bfloat16:
        return "bfloat16"
    return dot_name


def split_constexprs(kv_format: str, d_qk: int, d_v: int, cfg: configs.SparseMLAConfig,
                     dot_name: str, rope_name: str, *, has_bt: bool, has_tkl: bool,
                     has_sink: bool, final: bool) -> dict:
    """Constexpr arguments of ``_sparse_mla_split_kernel`` for one launch (``DOT_DTYPE`` and
    ``ROPE_DTYPE`` as ``triton.language`` dtype names). Shared by the launcher and the AOT
    compile test."""
    from kernels.sparse_mla.triton import KV_FORMAT_CODES
    return dict(
        KV_FORMAT=KV_FORMAT_CODES[kv_format], D_QK=d_qk, D_V=d_v,
        BLOCK_H=cfg.block_h, BLOCK_K=cfg.block_k, PREFETCH=cfg.prefetch, HAS_BT=has_bt, HAS_TKL=has_tkl,
        HAS_SINK=has_sink, FINAL=final, DOT_DTYPE=dot_name, ROPE_DTYPE=rope_name,
        DOT_FP32=dot_name == "float32", ROWS_M=cfg.kernel == "triton_rows")


def combine_constexprs(d_v: int, has_sink: bool, num_splits: int) -> dict:
    """Constexpr arguments of ``_sparse_mla_combine_kernel`` (``configs.sparse_mla_combine_tile``)."""
    s_block, block_c = configs.sparse_mla_combine_tile(num_splits, d_v)
    return dict(D_V=d_v, S_BLOCK=s_block, BLOCK_C=block_c, HAS_SINK=has_sink)


_TL_PTR = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}


# (kv_format, D_qk, q dtype, final) variants compiled per config by the AOT test: every kv_format
# with bf16 q (the production dtype), fp32 q (fp32 dot operands, twice the tile bytes) on the
# latent and fp8_ds_mla layouts, and the single-split epilogue. The feature flags (block table,
# topk_length, sink) only add scalar loads and are compiled on.
AOT_VARIANTS = (
    ("latent", 576, torch.bfloat16, False),
    ("fp8_ds_mla", 576, torch.bfloat16, False),
    ("fp8_model1", 512, torch.bfloat16, False),
    ("fp8_ds_mla", 576, torch.bfloat16, True),
    ("latent", 576, torch.float32, False),
    ("fp8_ds_mla", 576, torch.float32, False),
)


# (q dtype, final) of the latent warp-specialised Gluon launches compiled beyond AOT_VARIANTS'
# (bf16 partial): fp16 q with an fp16 cache, and bf16 with the single-split epilogue
GLUON_WS_LATENT_EXTRA = ((torch.float16, False), (torch.bfloat16, True))


def split_spec(kv_format: str, d_qk: int, q_dtype: torch.dtype, final: bool,
               cfg: configs.SparseMLAConfig, *, has_bt: bool, has_tkl: bool = True,
               has_sink: bool = True):
    """The ``kernels._triton_aot.LaunchSpec`` of one launch of ``_sparse_mla_split_kernel``
    (a Triton config): ``kv_format`` at ``d_qk`` with q of ``q_dtype`` (the cache's dtype for
    ``latent``), ``final`` (the single-split epilogue) and the feature flags as the launcher
    would pass them (:func:`aot_specs` compiles them on; ``bench.mla_aot_counts`` as the
    bench's rows launch them)."""
    from kernels._triton_aot import LaunchSpec
    kv_dtype = q_dtype if kv_format == "latent" else torch.uint8
    kv_ptr = _TL_PTR[q_dtype] if kv_format == "latent" else "*u8"
    dot = dot_dtype(q_dtype, kv_dtype, kv_format)
    sig = {"q_ptr": _TL_PTR[q_dtype], "kv_ptr": kv_ptr, "kv16_ptr": "*i16",
           "kv32_ptr": "*fp32", "idx_ptr": "*i32", "bt_ptr": "*i32",
           "tkl_ptr": "*i32", "sink_ptr": "*fp32", "po_ptr": "*fp32",
           "pl_ptr": "*fp32", "out_ptr": _TL_PTR[q_dtype], "lse_ptr": "*fp32",
           "qk_scale_log2": "fp32"}
    for name in ("sq_b", "sq_n", "sq_h", "si_b", "si_n", "sbt_b", "stride_page",
                 "stride_tok", "N", "H", "K", "num_slots", "num_pages",
                 "max_pages", "page_size", "page_bytes", "chunk"):
        sig[name] = "i32"
    cx = split_constexprs(kv_format, d_qk, 512, cfg, dot, rope_dtype(q_dtype, dot, kv_format),
                          has_bt=has_bt, has_tkl=has_tkl, has_sink=has_sink, final=final)
    flags = "" if (has_tkl and has_sink) else f" tkl={int(has_tkl)} sink={int(has_sink)}"
    label = (f"split {kv_format} D{d_qk} q={str(q_dtype)[6:]} "
             f"{'final' if final else 'partial'} {'block table' if has_bt else 'slots'}{flags} "
             f"{cfg}")
    return LaunchSpec(label, "kernels.sparse_mla.triton", "_sparse_mla_split_kernel", sig, cx,
                      cfg.num_warps, cfg.num_stages, ("DOT_DTYPE", "ROPE_DTYPE"),
                      ("sq_b", "sq_n", "sq_h", "stride_page", "stride_tok", "page_bytes"))


def aot_specs(smem_class: str, variants=AOT_VARIANTS) -> list:
    """Launches of the triton path on a GPU of ``smem_class`` (``kernels.sparse_mla.configs``) as
    ``kernels._triton_aot.LaunchSpec`` s: each of ``variants`` x every config of the space for
    its dot-operand width (the crossover kernels' only with the Triton they are written for,
    ``gluon_cluster.cluster_kernels_supported``), plus the combine kernel for bf16 and fp32
    outputs."""
    from kernels._triton_aot import LaunchSpec
    from kernels.sparse_mla.gluon_cluster import cluster_kernels_supported
    mod = "kernels.sparse_mla.triton"
    specs = []
    for kv_format, d_qk, q_dtype, final in variants:
        kv_dtype = q_dtype if kv_format == "latent" else torch.uint8
        dot = dot_dtype(q_dtype, kv_dtype, kv_format)
        for cfg in configs.SPARSE_MLA_SPACE[(smem_class, 4 if dot == "float32" else 2)]:
            built = configs.GLUON_KERNEL_FORMATS.get(cfg.kernel)
            if cfg.kernel in configs.CLUSTER_KERNELS and not cluster_kernels_supported():
                continue               # not launched with this Triton (the binding runs gluon_ws)
            if built is not None:      # a Gluon kernel: its formats, 16-bit dots only
                if (kv_format, d_qk) in built and dot != "float32":
                    specs.extend(_gluon_specs(kv_format, q_dtype, final, cfg.num_stages,
                                              cfg.kernel, cfg))
                continue
            for has_bt in (True, False):
                specs.append(split_spec(kv_format, d_qk, q_dtype, final, cfg, has_bt=has_bt))
    if configs.SPARSE_MLA_GLUON_WS in configs.SPARSE_MLA_SPACE.get((smem_class, 2), ()):
        # the latent WS kernel's other launches: fp16 q with an fp16 cache, the final epilogue
        nbuf = configs.SPARSE_MLA_GLUON_WS.num_stages
        for q_dtype, final in GLUON_WS_LATENT_EXTRA:
            specs.extend(_gluon_specs("latent", q_dtype, final, nbuf, "gluon_ws"))
    for q_dtype in (torch.bfloat16, torch.float32):
        sig = {"po_ptr": "*fp32", "pl_ptr": "*fp32", "sink_ptr": "*fp32",
               "out_ptr": _TL_PTR[q_dtype], "lse_ptr": "*fp32", "S": "i32", "BN": "i32", "H": "i32",
               "N": "i32", "lse_sb": "i32", "lse_sn": "i32", "lse_sh": "i32", "empty_lse": "fp32"}
        for S in (2, 32, 128):           # one tile of 2 x 512, of 32 x 128; 64 x 64 tiles looped
            specs.append(LaunchSpec(f"combine q={str(q_dtype)[6:]} S={S}", mod,
                                    "_sparse_mla_combine_kernel", sig, combine_constexprs(512, True, S),
                                    configs.SPARSE_MLA_COMBINE_WARPS, 2))
    return specs


def _gluon_sig(q_dtype: torch.dtype) -> dict:
    """Signature of the Gluon kernels (``gluon.py`` and ``gluon_ws.py`` share their arguments)."""
    sig = {"q_ptr": _TL_PTR[q_dtype], "kv_ptr": "*u8", "kv16_ptr": "*i16", "kv32_ptr": "*i32",
           "idx_ptr": "*i32", "bt_ptr": "*i32", "tkl_ptr": "*i32", "sink_ptr": "*fp32",
           "po_ptr": "*fp32", "pl_ptr": "*fp32", "out_ptr": _TL_PTR[q_dtype], "lse_ptr": "*fp32",
           "qk_scale_log2": "fp32"}
    for name in ("sq_b", "sq_n", "sq_h", "si_b", "si_n", "sbt_b", "N", "H", "K", "num_slots",
                 "num_pages", "max_pages", "page_size", "page_bytes", "chunk"):
        sig[name] = "i32"
    return sig


def _gluon_kernel(kernel: str, kv_format: str, cfg: configs.SparseMLAConfig | None = None) -> tuple:
    """``(module, kernel function name, extra constexprs, num_warps)`` of a Gluon config's
    ``kernel`` for a cache of ``kv_format``: ``"gluon"`` (``gluon.py``), ``"gluon_ws"``
    (``gluon_ws.py``, which adds its partition register budget, barrier arrival count and, for
    latent, the full-slot protocol: ``gluon_ws.launch_constexprs``), both launched with the
    module's ``NUM_WARPS``; or ``"gluon_sh"`` (``gluon_small.py``: ``cfg.block_h`` heads on
    wgmma N, ``cfg.num_warps`` warps) and ``"gluon_shws"`` (``gluon_small_ws.py``: the same
    heads, warp-specialised, launched with consumer 0's ``NUM_WARPS``, its other partitions on
    top)."""
    if kernel == "gluon":
        from kernels.sparse_mla import gluon as mod
        return mod, "_sparse_mla_gluon_kernel", {}, mod.NUM_WARPS
    if kernel == "gluon_sh":
        from kernels.sparse_mla import gluon_small as mod
        return mod, "_sparse_mla_gluon_sh_kernel", {"HN": cfg.block_h}, cfg.num_warps
    if kernel == "gluon_shws":
        from kernels.sparse_mla import gluon_small_ws as mod
        return (mod, "_sparse_mla_gluon_shws_kernel",
                {"HN": cfg.block_h, **mod.launch_constexprs(kv_format)}, mod.NUM_WARPS)
    if kernel == "gluon_xo":
        from kernels.sparse_mla import gluon_xo as mod
        return mod, "_sparse_mla_gluon_xo_kernel", mod.launch_constexprs(kv_format), mod.NUM_WARPS
    if kernel == "gluon_xs":
        from kernels.sparse_mla import gluon_xs as mod
        return mod, "_sparse_mla_gluon_xs_kernel", mod.launch_constexprs(kv_format), mod.NUM_WARPS
    from kernels.sparse_mla import gluon_ws as mod
    return mod, "_sparse_mla_gluon_ws_kernel", mod.launch_constexprs(kv_format), mod.NUM_WARPS


def _gluon_specs(kv_format: str, q_dtype: torch.dtype, final: bool, nbuf: int = 1,
                 kernel: str = "gluon", cfg: configs.SparseMLAConfig | None = None) -> list:
    """Launches of a Gluon kernel (sm_90) for one variant, with and without a block table:
    ``kernel`` ``"gluon"`` (``gluon.py``; ``nbuf`` X buffers), ``"gluon_sh"`` (the few-heads
    ``gluon_small.py`` of ``cfg``: its heads and warps; ``nbuf`` X buffers) or ``"gluon_ws"`` (the
    warp-specialised ``gluon_ws.py``; ``nbuf`` ring slots, ``num_warps`` the consumer's: the
    producer's warps come on top). ``nbuf`` is the config's ``num_stages``. A latent cache has
    q's dtype (the only latent calls a Gluon kernel runs) and is passed for all three cache
    pointers, as the launcher passes it."""
    from kernels._triton_aot import LaunchSpec
    from kernels.sparse_mla.triton import KV_FORMAT_CODES
    mod, fn, extra, num_warps = _gluon_kernel(kernel, kv_format, cfg)
    sig = _gluon_sig(q_dtype)
    if kernel in configs.CLUSTER_KERNELS:    # shared-memory offsets (gluon_xo.launch_cluster)
        sig.update(x_off="i32", x_step="i32", full_off="i32", empty_off="i32")
    kv_dtype = q_dtype if kv_format == "latent" else torch.uint8
    if kv_format == "latent":
        sig.update(kv_ptr=_TL_PTR[q_dtype], kv16_ptr=_TL_PTR[q_dtype], kv32_ptr=_TL_PTR[q_dtype])
    rope = rope_dtype(q_dtype, dot_dtype(q_dtype, kv_dtype, kv_format), kv_format)
    out = []
    for has_bt in (True, False):
        cx = dict(KV_FORMAT=KV_FORMAT_CODES[kv_format], HAS_BT=has_bt, HAS_TKL=True, HAS_SINK=True,
                  FINAL=final, ROPE_DTYPE=rope, NBUF=nbuf, **extra)
        out.append(LaunchSpec(
            f"{kernel}{f' h{cfg.block_h} w{num_warps}' if kernel in ('gluon_sh', 'gluon_shws') else ''}"
            f"{f' r{cfg.maxnreg}' if cfg is not None and cfg.maxnreg else ''} x{nbuf} "
            f"{kv_format} q={str(q_dtype)[6:]} {'final' if final else 'partial'} "
            f"{'block table' if has_bt else 'slots'}", mod.__name__, fn, sig, cx, num_warps,
            nbuf, ("ROPE_DTYPE",), ("sq_b", "sq_n", "sq_h", "page_bytes"),
            launch_options(cfg)))
    return out


def launch_options(cfg) -> dict:
    """The compile options a config adds to its launch beyond warps and stages (``maxnreg``:
    ptxas ``.maxnreg``; :attr:`configs.SparseMLAConfig.maxnreg`), for the launch and its AOT
    spec alike; ``{}`` for None or a config without one."""
    return {"maxnreg": cfg.maxnreg} if cfg is not None and cfg.maxnreg else {}


@dataclasses.dataclass(frozen=True)
class Source:
    """One cache the split kernel attends, validated by the binding.

    Attributes:
      kv_cache: the cache in ``kv_format``'s layout (``torch_impl.sparse_mla_decode``):
        ``"latent"`` ``[num_pages, P, D_qk]``, ``"fp8_ds_mla"`` uint8 ``[num_pages, P, 656]``,
        ``"fp8_model1"`` uint8 ``[num_pages, page_bytes]``; the fp8 pages may be strided
        (:func:`fp8_bytes`).
      indices: int32 ``[B, N, K]`` slots (or logical positions with ``block_table``), -1 padding.
      kv_format: ``"latent"``, ``"fp8_ds_mla"`` or ``"fp8_model1"``.
      page_size, num_pages: the cache's geometry (P slots per page), from the validation.
      config: the tile config (``kernels.sparse_mla.configs.SparseMLAConfig``) this source's
        split kernel runs (``config.kernel`` picks the Triton or the Gluon kernel; the caller
        checked ``configs.gluon_eligible`` for a Gluon config).
      block_table: int32 ``[B, max_pages]`` or None.
      topk_length: int32 ``[B]`` or None.
      num_splits: overrides the split count (``configs.sparse_mla_num_splits``) or None.
    """

    kv_cache: torch.Tensor
    indices: torch.Tensor
    kv_format: str
    page_size: int
    num_pages: int
    config: configs.SparseMLAConfig
    block_table: torch.Tensor | None = None
    topk_length: torch.Tensor | None = None
    num_splits: int | None = None


def page_used_bytes(kv_cache: torch.Tensor, kv_format: str, page_size: int) -> int:
    """Bytes of one page of an fp8 cache that the kernels read: ``P * 656`` (``fp8_ds_mla``) or
    the page's byte count ``kv_cache.shape[1]`` (``fp8_model1``: ``model1_page_bytes(P)``)."""
    if kv_format == "fp8_ds_mla":
        return page_size * formats.DS_MLA_BYTES
    return kv_cache.shape[1]


def fp8_bytes(kv_cache: torch.Tensor, kv_format: str, page_size: int) -> tuple:
    """``(bytes, page_bytes)`` of a validated fp8 cache, without a copy: ``bytes`` a flat uint8
    view of its storage from its first byte to the last byte of its last page, ``page_bytes``
    the byte stride of one page (``kv_cache.stride(0)``; the page's own bytes for a single
    page). The kernels address row ``off`` of page ``p`` at ``p * page_bytes + off * 656``
    (fp8_ds_mla) or ``p * page_bytes + off * 576`` and its scales at ``p * page_bytes +
    P * 576 + off * 8`` (fp8_model1), so padded (strided) pages are read in place; the binding
    checked the stride (a multiple of 16 bytes, at least the page's bytes)."""
    used = page_used_bytes(kv_cache, kv_format, page_size)
    n_pages = kv_cache.shape[0]
    stride = kv_cache.stride(0) if n_pages > 1 else used
    if kv_cache.is_contiguous():
        return kv_cache.view(-1), stride
    return torch.as_strided(kv_cache, ((n_pages - 1) * stride + used,), (1,)), stride


def _split_plan(q: torch.Tensor, src: Source, num_sms: int, smem_per_block: int) -> tuple[int, int]:
    """(splits, chunk) of one source: the split count of ``configs.sparse_mla_num_splits`` (or
    ``src.num_splits``; CTAs per SM from the config and its dot operands' size), ``chunk``
    entries of the top-k list per split (a multiple of ``BLOCK_K``), the count then trimmed so
    no split is empty."""
    B, N, H, _ = q.shape
    K = src.indices.shape[2]
    cfg = src.config
    rows = B * N * cdiv(H, cfg.block_h)
    dot = dot_dtype(q.dtype, src.kv_cache.dtype, src.kv_format)
    splits = src.num_splits or configs.sparse_mla_num_splits(
        rows, K, cfg.block_k, num_sms,
        ctas_per_sm=configs.sparse_mla_ctas_per_sm(cfg, smem_per_block,
                                                   operand_bytes=4 if dot == "float32" else 2))
    chunk = cdiv(cdiv(K, splits), cfg.block_k) * cfg.block_k
    return cdiv(K, chunk), chunk


def _launch_split(q, src: Source, sm_scale, d_v, attn_sink, po, pl, out, lse, *, splits: int,
                  chunk: int, final: bool):
    """One launch of the split kernel of ``src.config.kernel`` over grid ``(head_blocks,
    splits, B * N)``. ``final``: write ``out`` ``[B, N, H, d_v]`` (q's dtype, sink applied) and
    ``lse`` ``[B, N, H]`` (natural log) directly; else write float32 partials ``po [splits,
    B * N, H, d_v]`` (normalised per split, no sink) and ``pl [splits, B * N, H]`` (log2
    domain, -inf for an empty split). Both kernels address split s of row bn at
    ``(s * B * N + bn) * H`` from the pointers given, so ``po`` / ``pl`` may be views starting
    at any split of a larger buffer (contiguous from there)."""
    from kernels.sparse_mla import triton as tk
    import triton.language as tl

    B, N, H, D = q.shape
    kv_cache, indices, block_table, kv_format = src.kv_cache, src.indices, src.block_table, src.kv_format
    topk_length, P, num_pages, cfg = src.topk_length, src.page_size, src.num_pages, src.config
    K = indices.shape[2]
    num_slots = num_pages * P
    dot_name = dot_dtype(q.dtype, kv_cache.dtype, kv_format)
    if q.stride(3) != 1:
        q = q.contiguous()
    if indices.stride(2) != 1:
        indices = indices.contiguous()
    if block_table is not None and block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    # the kernels read topk_length [B] and attn_sink [H] at b / h from their base pointers: a
    # strided or stride-0 view (expand) is made contiguous (a no-op when it already is)
    if topk_length is not None:
        topk_length = topk_length.contiguous()
    if attn_sink is not None:
        attn_sink = attn_sink.contiguous()
    if kv_format == "latent":
        kv, kv16, kv32 = kv_cache, kv_cache, kv_cache
        stride_page, stride_tok, page_bytes = kv_cache.stride(0), kv_cache.stride(1), 0
    else:
        kv, page_bytes = fp8_bytes(kv_cache, kv_format, P)  # uint8 bytes, page stride
        kv16 = kv.view(torch.int16)                         # bf16 rope bits
        kv32 = kv.view(torch.float32) if kv_format == "fp8_ds_mla" else kv
        stride_page = stride_tok = 0
    dummy = indices
    rope_name = rope_dtype(q.dtype, dot_name, kv_format)
    cx = split_constexprs(kv_format, D, d_v, cfg, dot_name, rope_name,
                          has_bt=block_table is not None, has_tkl=topk_length is not None,
                          has_sink=attn_sink is not None, final=final)
    cx["DOT_DTYPE"] = getattr(tl, dot_name)
    cx["ROPE_DTYPE"] = getattr(tl, rope_name)
    grid = (cdiv(H, cfg.block_h), splits, B * N)
    if cfg.kernel in configs.GLUON_KERNEL_FORMATS:   # the caller checked configs.kernel_eligible
        mod, fn, extra, num_warps = _gluon_kernel(cfg.kernel, kv_format, cfg)  # same arguments
        if kv_format == "latent":   # gluon_ws only: rows packed, 16-byte aligned (the caller
            # checked configs.gluon_ws_latent_layout_ok); the cache for all three pointers
            kv32 = kv
            page_bytes = (kv_cache.stride(0) if kv_cache.shape[0] > 1
                          else P * kv_cache.shape[2]) * kv_cache.element_size()
        else:
            kv32 = kv.view(torch.int32)
        args = (q, kv, kv16, kv32, indices,
                block_table if block_table is not None else dummy,
                topk_length if topk_length is not None else dummy,
                attn_sink if attn_sink is not None else dummy,
                po, pl, out, lse,
                q.stride(0), q.stride(1), q.stride(2), indices.stride(0), indices.stride(1),
                block_table.stride(0) if block_table is not None else 0,
                N, H, K, num_slots, num_pages,
                block_table.shape[1] if block_table is not None else 0, P, page_bytes, chunk,
                float(sm_scale) * tk.LOG2E)
        kwargs = dict(KV_FORMAT=cx["KV_FORMAT"], HAS_BT=cx["HAS_BT"], HAS_TKL=cx["HAS_TKL"],
                      HAS_SINK=cx["HAS_SINK"], FINAL=final, ROPE_DTYPE=cx["ROPE_DTYPE"],
                      NBUF=cfg.num_stages, **extra, num_warps=num_warps, **launch_options(cfg))
        if cfg.kernel in configs.CLUSTER_KERNELS:   # clusters of two head blocks
            mod.launch_cluster(getattr(mod, fn), grid, args, kwargs, kv_format, cfg.num_stages)
        else:
            getattr(mod, fn)[grid](*args, **kwargs)
    else:
        tk._sparse_mla_split_kernel[grid](
            q, kv, kv16, kv32, indices,
            block_table if block_table is not None else dummy,
            topk_length if topk_length is not None else dummy,
            attn_sink if attn_sink is not None else dummy,
            po, pl, out, lse,
            q.stride(0), q.stride(1), q.stride(2), indices.stride(0), indices.stride(1),
            block_table.stride(0) if block_table is not None else 0, stride_page, stride_tok,
            N, H, K, num_slots, num_pages,
            block_table.shape[1] if block_table is not None else 0, P, page_bytes, chunk,
            float(sm_scale) * tk.LOG2E,
            **cx, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )


def _launch_combine(po, pl, attn_sink, out, lse, d_v: int, empty_lse: float = float("-inf")):
    """One launch of ``_sparse_mla_combine_kernel``: the LSE merge of all ``S`` splits of
    ``po [S, B * N, H, d_v]`` / ``pl [S, B * N, H]`` (float32, log2 domain) in a fixed order,
    the sink once, one rounding into ``out`` (contiguous ``[B, N, H, d_v]``, q's dtype);
    ``lse``: float32 natural log, a ``[B, N, H]`` view of any strides (FlashMLA's ``[B, H, N]``
    is ``lse_fm.transpose(1, 2)``) or ``[B * N, H]`` contiguous; ``empty_lse`` (-inf, or
    FlashMLA's +inf) for a row with no valid entry in any split, NaN when a split is NaN."""
    from kernels.sparse_mla import triton as tk
    S, BN, H, _ = po.shape
    lse3 = lse if lse.dim() == 3 else lse.view(BN, 1, H)
    if attn_sink is not None:
        attn_sink = attn_sink.contiguous()      # read at h from its base pointer
    cx = combine_constexprs(d_v, attn_sink is not None, S)
    tk._sparse_mla_combine_kernel[(H, BN, cdiv(d_v, cx["BLOCK_C"]))](
        po, pl, attn_sink if attn_sink is not None else pl, out, lse3,
        S, BN, H, lse3.shape[1], lse3.stride(0), lse3.stride(1), lse3.stride(2), float(empty_lse),
        **cx,
        num_warps=configs.SPARSE_MLA_COMBINE_WARPS,
    )


def lse_buffer(lse_layout: str, B: int, N: int, H: int, device) -> tuple:
    """(the lse to return, its ``[B, N, H]`` view for the combine, the value of an empty row) of
    ``lse_layout``: native ``[B, N, H]`` with -inf, or FlashMLA's ``[B, H, N]`` contiguous with
    +inf (the view is its transpose)."""
    if lse_layout == "flash_mla":
        lse_fm = torch.empty((B, H, N), dtype=torch.float32, device=device)
        return lse_fm, lse_fm.transpose(1, 2), float("inf")
    lse = torch.empty((B, N, H), dtype=torch.float32, device=device)
    return lse, lse, float("-inf")


def to_flash_mla_lse(lse: torch.Tensor) -> torch.Tensor:
    """Native lse ``[B, N, H]`` (-inf empty) -> FlashMLA's ``[B, H, N]`` contiguous, +inf for an
    empty row, NaN kept (one pass; the single-split epilogue and the plain-PyTorch path write the
    native layout)."""
    lse_fm, view, _ = lse_buffer("flash_mla", *lse.shape, lse.device)
    torch.nan_to_num(lse, nan=float("nan"), posinf=float("inf"), neginf=float("inf"), out=view)
    return lse_fm


LSE_LAYOUTS = ("native", "flash_mla")
"""``lse_layout`` of :func:`launch` / :func:`launch_sources`: ``"native"`` lse ``[B, N, H]``,
-inf for an empty row (SPEC); ``"flash_mla"`` lse ``[B, H, N]`` contiguous, +inf for an empty row
(FlashMLA's ``flash_mla_with_kvcache``), written by the combine itself when the list is split."""


def launch(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length, attn_sink,
           *, page_size: int, num_pages: int, config: configs.SparseMLAConfig, num_sms: int,
           smem_per_block: int, num_splits: int | None = None, lse_layout: str = "native"):
    """Launch the split kernel (and the combine when the list is split) on validated tensors.

    Args:
      q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length, attn_sink: as
        ``torch_impl.sparse_mla_decode`` takes them (validated there; strides may be any the
        binding accepts: a non-contiguous last dim is made contiguous here).
      page_size, num_pages: the cache's geometry (P slots per page), from the validation.
      config: the tile config (``kernels.sparse_mla.configs.SparseMLAConfig``) to launch.
      num_sms, smem_per_block: the GPU's, for the split count
        (``configs.sparse_mla_num_splits``); ``num_splits`` overrides it.
      lse_layout: :data:`LSE_LAYOUTS`.
    Returns:
      (out ``[B, N, H, d_v]`` in q's dtype, lse float32 natural log: ``[B, N, H]`` (-inf empty),
      or ``[B, H, N]`` (+inf empty) for ``lse_layout="flash_mla"``).
    """
    src = Source(kv_cache, indices, kv_format, page_size, num_pages, config, block_table,
                 topk_length, num_splits)
    B, N, H, _ = q.shape
    splits, chunk = _split_plan(q, src, num_sms, smem_per_block)
    out = torch.empty((B, N, H, d_v), dtype=q.dtype, device=q.device)
    if splits == 1:          # the single-split epilogue writes out and the native lse itself
        lse = torch.empty((B, N, H), dtype=torch.float32, device=q.device)
        _launch_split(q, src, sm_scale, d_v, attn_sink, out, lse, out, lse, splits=1, chunk=chunk,
                      final=True)
        return out, (to_flash_mla_lse(lse) if lse_layout == "flash_mla" else lse)
    lse_ret, lse, empty_lse = lse_buffer(lse_layout, B, N, H, q.device)
    po = torch.empty((splits, B * N, H, d_v), dtype=torch.float32, device=q.device)
    pl = torch.empty((splits, B * N, H), dtype=torch.float32, device=q.device)
    _launch_split(q, src, sm_scale, d_v, attn_sink, po, pl, out, lse, splits=splits, chunk=chunk,
                  final=False)
    _launch_combine(po, pl, attn_sink, out, lse, d_v, empty_lse)
    return out, lse_ret


def launch_sources(q, sources, sm_scale, d_v, attn_sink, *, num_sms: int, smem_per_block: int,
                   out: torch.Tensor | None = None, lse_layout: str = "native"):
    """One attention over the valid entries of several caches: each source's split kernel
    (never ``FINAL``) writes its float32 partials into one buffer, then one combine launch
    merges all of them, applies the sink once and rounds once.

    Exactly the softmax over the union of the sources' valid entries (the combine is the same
    LSE merge as within one cache's splits); no partial is rounded to q's dtype, so opposite-
    signed partial outputs that cancel lose nothing beyond float32 (FlashMLA's MODEL1 extra
    cache: ``torch_impl.compat.flash_mla``).

    Args:
      q: ``[B, N, H, D_qk]`` bf16 / fp16 / fp32 (validated by the binding; any strides).
      sources: a non-empty sequence of :class:`Source` (validated; each with its own cache,
        format, page size, indices ``[B, N, K_i]``, topk_length, block table and tile config).
      sm_scale: softmax scale of ``q . k`` (natural-log domain).
      d_v: value width (512).
      attn_sink: float32 ``[H]`` or None, applied once in the combine:
        ``out *= 1 / (1 + exp(sink_h - lse))``.
      num_sms, smem_per_block: the GPU's, for each source's split count (as its own
        :func:`launch` would split it).
      out: optional destination, a contiguous ``[B, N, H, d_v]`` tensor of q's dtype written in
        place (the caller checked it); else a new one.
      lse_layout: :data:`LSE_LAYOUTS` (the combine writes either).
    Returns:
      (out ``[B, N, H, d_v]`` in q's dtype, lse float32: natural log over all sources, excluding
      the sink; ``[B, N, H]`` with -inf for a row with no valid entry in any source, or
      ``[B, H, N]`` with +inf there for ``lse_layout="flash_mla"``).
      Buffers: float32 partials ``[S, B * N, H, d_v]`` and ``[S, B * N, H]``, S the sum of the
      sources' split counts (source i's splits after those of sources 0..i-1).
    """
    B, N, H, _ = q.shape
    plans = [_split_plan(q, src, num_sms, smem_per_block) for src in sources]
    S = sum(sp for sp, _ in plans)
    if out is None:
        out = torch.empty((B, N, H, d_v), dtype=q.dtype, device=q.device)
    lse_ret, lse, empty_lse = lse_buffer(lse_layout, B, N, H, q.device)
    po = torch.empty((S, B * N, H, d_v), dtype=torch.float32, device=q.device)
    pl = torch.empty((S, B * N, H), dtype=torch.float32, device=q.device)
    s0 = 0
    for src, (splits, chunk) in zip(sources, plans):
        _launch_split(q, src, sm_scale, d_v, attn_sink, po[s0:], pl[s0:], out, lse,
                      splits=splits, chunk=chunk, final=False)
        s0 += splits
    _launch_combine(po, pl, attn_sink, out, lse, d_v, empty_lse)
    return out, lse_ret
