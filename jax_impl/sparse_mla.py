"""Sparse MLA decode for JAX: the Pallas kernel (Triton lowering, ``path="pallas"``) and plain
jax.numpy (``path="xla"``), validated per docs/SPEC.md and jit-compatible.

The kernel design is in ``kernels/sparse_mla/pallas.py``; this module validates (statically, on
shapes and dtypes), picks the config (dispatch table, else the heuristic of ``kernels.sparse_mla.configs``),
gates the hardware (``kernels.hardware``) before launch and dispatches between the paths.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_impl import formats as jfmt
from jax_impl._common import (JAX_PATHS, check_array, check_sm_scale, device_info, plan,
                              require_32bit_indices, run_path)
from kernels import hardware
from kernels.sparse_mla import configs
from kernels import formats as nf
from kernels import _pallas_call as pcall
from kernels.sparse_mla import pallas as pk

_FLOATS = (jnp.bfloat16, jnp.float16, jnp.float32)


def _validate(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length,
              attn_sink, path):
    """Static checks; returns (page_size, num_pages)."""
    if path not in JAX_PATHS:
        raise ValueError(f"path: expected one of {JAX_PATHS}, got {path!r}")
    if kv_format not in nf.KV_FORMATS:
        raise ValueError(f"kv_format: expected one of {nf.KV_FORMATS}, got {kv_format!r}")
    check_array("q", q, ndim=4, dtypes=_FLOATS)
    B, N, H, d_qk = q.shape
    if min(B, N, H) < 1:
        raise ValueError(f"q: expected B, N, H >= 1, got shape {tuple(q.shape)}")
    if kv_format == "latent":
        check_array("kv_cache", kv_cache, ndim=3, dtypes=_FLOATS, shape=("num_pages", "P", d_qk))
        num_pages, page_size = kv_cache.shape[:2]
    elif kv_format == "fp8_ds_mla":
        if d_qk != nf.DS_MLA_NOPE + nf.DS_MLA_ROPE:
            raise ValueError(f"q: kv_format 'fp8_ds_mla' needs D_qk = 576, got shape {tuple(q.shape)}")
        check_array("kv_cache", kv_cache, ndim=3, dtypes=(jnp.uint8,),
                    shape=("num_pages", "P", nf.DS_MLA_BYTES))
        num_pages, page_size = kv_cache.shape[:2]
    else:
        if d_qk != nf.MODEL1_NOPE + nf.MODEL1_ROPE:
            raise ValueError(f"q: kv_format 'fp8_model1' needs D_qk = 512, got shape {tuple(q.shape)}")
        check_array("kv_cache", kv_cache, ndim=2, dtypes=(jnp.uint8,))
        num_pages = kv_cache.shape[0]
        page_size = nf.model1_page_size(kv_cache.shape[1])      # ValueError names kv_cache
    if num_pages < 1 or page_size < 1:
        raise ValueError(f"kv_cache: expected at least one page of one slot, got {tuple(kv_cache.shape)}")
    check_array("indices", indices, ndim=3, dtypes=(jnp.int32,), shape=(B, N, "K >= 1"))
    if indices.shape[2] < 1:
        raise ValueError(f"indices: expected K >= 1 entries per row, got shape {tuple(indices.shape)}")
    if isinstance(d_v, (bool, np.bool_)) or not isinstance(d_v, (int, np.integer)):
        raise TypeError(f"d_v: expected an int, got {type(d_v).__name__} {d_v!r}")
    if not 1 <= d_v <= d_qk:
        raise ValueError(f"d_v: expected an int in [1, D_qk={d_qk}], got {d_v!r}")
    if kv_format == "fp8_ds_mla" and d_v != nf.DS_MLA_NOPE:
        raise ValueError(f"d_v: kv_format 'fp8_ds_mla' stores V as the {nf.DS_MLA_NOPE} fp8 dims, "
                         f"expected {nf.DS_MLA_NOPE}, got {d_v}")
    if block_table is not None:
        check_array("block_table", block_table, ndim=2, dtypes=(jnp.int32,))
        if block_table.shape[0] != B or block_table.shape[1] < 1:
            raise ValueError(f"block_table: expected shape ({B}, max_pages >= 1), got "
                             f"{tuple(block_table.shape)}")
    if topk_length is not None:
        check_array("topk_length", topk_length, ndim=1, dtypes=(jnp.int32,), shape=(B,))
    if attn_sink is not None:
        check_array("attn_sink", attn_sink, ndim=1, dtypes=(jnp.float32,), shape=(H,))
    check_sm_scale(sm_scale)   # TypeError / ValueError naming sm_scale; concrete NaN / inf too
    return page_size, num_pages


def _dot_dtype(q_dtype, kv_format: str, kv_dtype):
    """Dot operand dtype: q's (fp8 dequantizes exactly into bf16); fp32 when q is fp32 or a
    latent cache's dtype differs from q's (no silent rounding of the cache)."""
    q_dtype, kv_dtype = jnp.dtype(q_dtype), jnp.dtype(kv_dtype)
    if q_dtype == jnp.float32 or (kv_format == "latent" and kv_dtype != q_dtype):
        return jnp.dtype(jnp.float32)
    return q_dtype


def _kv_rows(kv_cache, kv_format: str, page_size: int):
    """The cache as rows (free reshapes): latent ``[num_slots, D_qk]``, fp8_ds_mla
    ``[num_slots, 656]``, fp8_model1 ``[num_pages * R, 576]`` with R = page_bytes / 576."""
    if kv_format == "fp8_model1":
        return kv_cache.reshape(-1, nf.MODEL1_DATA_BYTES)
    return kv_cache.reshape(-1, kv_cache.shape[-1])


# ----------------------------------------------------------------------------- pallas path

def _plan(q, indices, kv_format, kv_dtype, path):
    """``kernels.registry`` plan of one call (the dispatch table read once, at trace time)."""
    B, N, H, d_qk = q.shape
    return plan("sparse_mla_decode", path, B=B, N=N, H=H, K=indices.shape[2], d_qk=d_qk,
                kv_format=kv_format, operand_bytes=_dot_dtype(q.dtype, kv_format, kv_dtype).itemsize)


def _pallas(q, kv_cache, indices, sm_scale, *, kv_format, d_v, block_table, topk_length,
            attn_sink, page_size, num_pages, config=None, num_splits=None, interpret=None):
    B, N, H, d_qk = q.shape
    require_32bit_indices("sparse_mla_decode")
    dev = device_info()
    hardware.require_arch(dev, "sparse_mla_decode (pallas)")
    if d_v != pk.MAIN or d_qk not in (pk.MAIN, pk.MAIN + pk.TAIL):
        raise NotImplementedError(
            f"sparse_mla_decode (pallas) supports D_qk in (512, 576) and d_v = 512 on "
            f"{dev.name} (compute capability {dev.cc[0]}.{dev.cc[1]}); got D_qk={d_qk}, d_v={d_v}")
    # 64-bit offsets for every array of >= 2^31 elements (kernels/_pallas_call.py)
    hardware.require_int32_addressing(dev, "sparse_mla_decode (pallas)",
                                      kv_cache.size * kv_cache.dtype.itemsize,
                                      itemsize=kv_cache.dtype.itemsize,
                                      wide_offsets=pcall.WIDE_OFFSETS)
    dot_dtype = _dot_dtype(q.dtype, kv_format, kv_cache.dtype)
    if config is None:
        config = configs.SparseMLAConfig(**_plan(q, indices, kv_format, kv_cache.dtype,
                                                 "pallas").config)
    hardware.require_smem(dev, f"sparse_mla_decode (pallas, {config})",
                          configs.pallas_sparse_mla_smem(config, dot_dtype.itemsize))
    head_blocks = -(-H // config.block_h)
    if num_splits is None:
        num_splits = configs.sparse_mla_num_splits(B * N * head_blocks, indices.shape[2],
                                                   config.block_k, dev.num_sms)
    scale = (jnp.asarray(sm_scale, jnp.float32) * jnp.float32(pk.LOG2E)).reshape(1)
    return pk.sparse_mla_decode_pallas(
        q, _kv_rows(kv_cache, kv_format, page_size), indices, scale, kv_format=kv_format,
        page_size=page_size, num_pages=num_pages, block_table=block_table,
        topk_length=topk_length, attn_sink=attn_sink, block_h=config.block_h,
        block_k=config.block_k, num_splits=num_splits, num_warps=config.num_warps,
        num_stages=config.num_stages, dot_dtype=dot_dtype, prefetch=config.prefetch,
        combine_warps=configs.SPARSE_MLA_COMBINE_WARPS, interpret=interpret)


# ----------------------------------------------------------------------------- xla path

def resolve_slots(indices, *, num_slots: int, page_size: int, block_table=None, topk_length=None):
    """jax.numpy twin of ``kernels.reference.resolve_indices``: int32 ``[B, N, K]`` slots in
    ``[0, num_slots)``, and a bool mask ``ok`` (False entries have slot 0 and must be ignored)."""
    idx = indices.astype(jnp.int32)
    if block_table is not None:
        max_pages = block_table.shape[1]
        ok = (idx >= 0) & (idx < max_pages * page_size)
        lpage = jnp.where(ok, idx // page_size, 0)
        ent = jnp.take_along_axis(block_table, lpage.reshape(lpage.shape[0], -1), axis=1,
                                  mode="clip").reshape(idx.shape)
        # page entry checked against the cache before the multiply (ent * P could wrap in int32)
        ok &= (ent >= 0) & (ent < num_slots // page_size)
        slots = jnp.where(ok, ent, 0) * page_size + idx % page_size
    else:
        slots = idx
        ok = idx >= 0
    ok &= (slots >= 0) & (slots < num_slots)
    if topk_length is not None:
        K = idx.shape[-1]
        ok &= jnp.arange(K, dtype=jnp.int32)[None, None, :] < topk_length[:, None, None]
    return jnp.where(ok, slots, 0), ok


def gather_rows(kv_cache, kv_format: str, slots, page_size: int):
    """float32 ``[..., D_qk]`` latent rows of the given (valid) slots, dequantized; only the
    selected rows are read."""
    if kv_format == "latent":
        return _kv_rows(kv_cache, kv_format, page_size)[slots].astype(jnp.float32)
    if kv_format == "fp8_ds_mla":
        return jfmt.dequantize_fp8_ds_mla(_kv_rows(kv_cache, kv_format, page_size)[slots])
    rows = _kv_rows(kv_cache, kv_format, page_size)                  # [num_pages * R, 576]
    R = kv_cache.shape[1] // nf.MODEL1_DATA_BYTES
    page, off = slots // page_size, slots % page_size
    data = rows[page * R + off]                                        # [..., 576]
    per_row = nf.MODEL1_DATA_BYTES // nf.MODEL1_SCALE_BYTES
    srow = page * R + page_size + off // per_row
    scol = (off % per_row) * nf.MODEL1_SCALE_BYTES
    e = rows[srow[..., None], scol[..., None] + jnp.arange(7)]         # [..., 7]
    q = jfmt._from_bytes(data[..., :nf.MODEL1_NOPE], jnp.float8_e4m3fn).astype(jnp.float32)
    rope = jfmt._from_bytes(data[..., nf.MODEL1_NOPE:], jnp.bfloat16).astype(jnp.float32)
    lead = q.shape[:-1]
    nope = (q.reshape(*lead, 7, nf.MODEL1_TILE) * jfmt._ue8m0_to_f32(e)[..., None])
    return jnp.concatenate([nope.reshape(*lead, nf.MODEL1_NOPE), rope], axis=-1)


def _xla(q, kv_cache, indices, sm_scale, *, kv_format, d_v, block_table, topk_length,
         attn_sink, page_size, num_pages):
    num_slots = num_pages * page_size
    slots, ok = resolve_slots(indices, num_slots=num_slots, page_size=page_size,
                              block_table=block_table, topk_length=topk_length)
    rows = gather_rows(kv_cache, kv_format, slots, page_size)          # [B, N, K, D_qk]
    rows = jnp.where(ok[..., None], rows, 0.0)                         # NaN in row 0 stays out
    hi = jax.lax.Precision.HIGHEST
    s = jnp.einsum("bnhd,bnkd->bnhk", q.astype(jnp.float32), rows, precision=hi)
    s = jnp.where(ok[:, :, None, :], s * jnp.asarray(sm_scale, jnp.float32), -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(m == -jnp.inf, 0.0, m)     # all masked -> p = 0; +inf / NaN propagate (NaN)
    p = jnp.exp(s - m)                                                 # masked -> 0
    den = jnp.sum(p, axis=-1)
    has = den != 0          # NaN sums propagate (as in the reference); empty iff den == 0
    den_safe = jnp.where(has, den, 1.0)
    lse = jnp.where(has, m[..., 0] + jnp.log(den_safe), -jnp.inf)
    out = jnp.einsum("bnhk,bnkd->bnhd", p, rows[..., :d_v], precision=hi) / den_safe[..., None]
    if attn_sink is not None:
        sink = jnp.where(attn_sink == -jnp.inf, jnp.finfo(jnp.float32).min, attn_sink)  # SPEC
        out = out * (1.0 / (1.0 + jnp.exp(sink[None, None, :] - lse)))[..., None]
    return out.astype(q.dtype), lse


# ----------------------------------------------------------------------------- public

def sparse_mla_decode(q, kv_cache, indices, sm_scale, *, kv_format="latent", d_v=512,
                      block_table=None, topk_length=None, attn_sink=None, path="auto"):
    """Sparse MLA decode (absorbed MLA in MQA form) over a paged latent cache.

    Semantics: docs/SPEC.md "Operation B" (FlashMLA ``flash_mla_with_kvcache`` sparse
    decode); float64 definition ``kernels.reference.sparse_mla_decode``. For each valid entry t of
    a row's top-k list, ``s_t = sm_scale * (q . latent_t[:D_qk])`` in float32;
    ``lse = ln(sum_t exp(s_t))`` (natural log); ``out = sum_t exp(s_t - lse) * latent_t[:d_v]``.

    Args:
      q: ``[B, N, H, D_qk]`` bfloat16, float16 or float32 (N query tokens per request: 1 for
        decode, > 1 for MTP; H query heads on this rank).
      kv_cache: ``kv_format="latent"``: ``[num_pages, P, D_qk]`` bf16 / fp16 / fp32;
        ``"fp8_ds_mla"`` (V3.2, D_qk = 576): uint8 ``[num_pages, P, 656]`` per token 512 e4m3
        bytes, 4 float32 scales (one per 128 dims), 64 bf16 rope dims; ``"fp8_model1"`` (V4,
        D_qk = 512): uint8 ``[num_pages, page_bytes]``, per page P data rows of 576 bytes then P
        8-byte ue8m0 scale rows (``kernels/formats.py`` has the byte tables). Dequantized in the
        kernel; no dequantized copy of the cache is made.
      indices: ``[B, N, K]`` int32: slots (page * P + offset) into the cache, or with
        ``block_table`` logical positions of request b. An entry is invalid (ignored, never
        dereferenced) when negative (-1 is the padding), >= num_pages * P (slots) or
        >= max_pages * P (logical), or when its page entry is negative or >= num_pages.
        Duplicated valid entries count once per occurrence.
      sm_scale: softmax scale, natural-log domain: a Python int / float, a NumPy integer or
        floating scalar, or a 0-d float array (traced under ``jax.jit`` too); never a bool. A
        concrete value must be finite (a concrete ``jax.Array`` is read back to check it).
      kv_format: ``"latent"``, ``"fp8_ds_mla"`` or ``"fp8_model1"`` (static).
      d_v: value width, the first d_v latent dims (static int; the pallas path supports 512;
        ``"fp8_ds_mla"`` stores V as its 512 fp8 dims and needs 512).
      block_table: ``[B, max_pages]`` int32 or None; entries past a request's pages may be -1.
      topk_length: ``[B]`` int32 or None: list positions >= topk_length[b] are ignored.
      attn_sink: ``[H]`` float32 or None (V4): ``out *= 1 / (1 + exp(sink_h - lse))``; the
        returned lse excludes the sink.
      path: ``"auto"`` (dispatch table entry, else pallas, falling through to xla on
        NotImplementedError), ``"pallas"`` or ``"xla"`` (plain jax.numpy, fp32). Static.
    Returns:
      (out ``[B, N, H, d_v]`` q.dtype, lse ``[B, N, H]`` float32). A row with no valid entry has
      out 0 and lse -inf (FlashMLA returns +inf there; its wrapper converts, this API does not).
    Raises:
      TypeError / ValueError: wrong dtype, rank or shape of an argument, unknown kv_format or
        path, bad d_v (not an int, outside [1, D_qk], not 512 with ``"fp8_ds_mla"``), an
        sm_scale that is not a real scalar (TypeError) or is a concrete NaN / inf or overflows
        float32, e.g. ``1e39`` (ValueError)
        (the message names the argument, the expectation and what came).
      NotImplementedError: ``path="pallas"`` on a GPU / shape it cannot run (names the GPU, its
        compute capability and what is supported) or with ``jax_enable_x64`` on, raised before
        launch (``"auto"`` then runs the xla path).
    """
    page_size, num_pages = _validate(q, kv_cache, indices, sm_scale, kv_format, d_v,
                                     block_table, topk_length, attn_sink, path)
    kw = dict(kv_format=kv_format, d_v=d_v, block_table=block_table, topk_length=topk_length,
              attn_sink=attn_sink, page_size=page_size, num_pages=num_pages)
    pl = _plan(q, indices, kv_format, kv_cache.dtype, path)
    cfg = pl.configs.get("pallas")
    impls = {"pallas": lambda: _pallas(q, kv_cache, indices, sm_scale, **kw,
                                       config=configs.SparseMLAConfig(**cfg) if cfg else None),
             "xla": lambda: _xla(q, kv_cache, indices, sm_scale, **kw)}
    order = pl.order
    return run_path("sparse_mla_decode", path, impls, order)


_sparse_mla_decode_jit = functools.partial(jax.jit, static_argnames=("kv_format", "d_v", "path"))(
    sparse_mla_decode)


@functools.wraps(sparse_mla_decode)
def _sparse_mla_decode_checked(q, kv_cache, indices, sm_scale, *, kv_format="latent", d_v=512,
                               block_table=None, topk_length=None, attn_sink=None, path="auto"):
    # Validate the caller's arrays as given, before the jit boundary: there, a NumPy int64 array
    # would be cast to int32 silently (JAX without x64) and a Python NaN scale become a tracer.
    _validate(q, kv_cache, indices, sm_scale, kv_format, d_v, block_table, topk_length,
              attn_sink, path)
    if isinstance(sm_scale, (int, float, np.integer, np.floating)):
        # a Python float traces as a weak float32 scalar; a Python / NumPy int would trace as an
        # int32 array, which the traced check (0-d float arrays only) refuses
        sm_scale = float(sm_scale)
    return _sparse_mla_decode_jit(q, kv_cache, indices, sm_scale, kv_format=kv_format, d_v=d_v,
                                  block_table=block_table, topk_length=topk_length,
                                  attn_sink=attn_sink, path=path)


sparse_mla_decode = _sparse_mla_decode_checked


__all__ = ["sparse_mla_decode", "resolve_slots", "gather_rows"]
