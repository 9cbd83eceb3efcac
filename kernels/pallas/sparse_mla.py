"""Sparse MLA decode as Pallas kernels (Triton lowering): split-K over the top-k list, then an
LSE combine. The Pallas twin of ``kernels/triton/sparse_mla.py``; read the two side by side.

Semantics: ../docs/SPEC.md "Operation B" (FlashMLA ``flash_mla_with_kvcache`` sparse decode,
absorbed MLA in MQA form). The float64 definition is ``kernels.reference.sparse_mla_decode``.

Design (the same split-K structure, grid and names as the Triton kernel)
------------------------------------------------------------------------
Work is a grid ``(head_blocks, splits, B * N)``:

* **Head block.** One program holds ``BLOCK_H`` query heads (all heads of the rank up to 64,
  padded to a power of two >= 16, the dot minimum; padded heads are masked in the q load and in
  every store, the caller never pads). Every gathered latent row is read once per head block.
* **Split-K.** A program walks ``chunk`` entries of the top-k list (a multiple of ``BLOCK_K``)
  with a ``lax.fori_loop`` whose trip count is dynamic (``topk_length``), which the Triton
  lowering turns into an ``scf.for``. The split count is ``kernels.configs.sparse_mla_num_splits``.
  Splits write fp32 partial outputs (normalised) and log2-domain partial LSEs;
  :func:`_sparse_mla_combine_kernel` merges them into the natural-log LSE and the q-dtype output.
  With one split the split kernel writes the final result itself (``FINAL``).
* **Gather.** Per iteration ``BLOCK_K`` indices are loaded, resolved to slots (through the block
  table: ``block_table[b, j // P] * P + j % P``) and checked; invalid entries (negative, beyond
  the cache or the table, a negative or too large page entry, past ``topk_length``) get address
  0 and are masked in every load (``other=0``), so they are never dereferenced, and their scores
  are excluded explicitly, so NaN or stale data in unselected rows cannot leak. On the GPU the
  gather is ``plgpu.load(ref.at[rows, pl.ds(col, width, stride)], mask=...)`` (a vectorised
  pointer gather, contiguous along the row); Pallas interpret mode cannot discharge a load that
  mixes an index array with a slice, so with ``INTERPRET`` the same gather is written with two
  broadcast index arrays (``ref.at[rows[:, None], cols[None, :]]``). That is the only
  difference between the two modes (:func:`_gather`).
* **Layouts, dequantized in registers** (never into a copy of the cache):
  ``latent`` rows ``[num_slots, D_qk]`` (a free reshape of ``[num_pages, P, D_qk]``);
  ``fp8_ds_mla`` rows ``[num_slots, 656]``: e4m3 bytes bitcast to ``float8_e4m3fn``, times the
  float32 scale of their 128-dim group (assembled from its 4 little-endian bytes), rope from its
  bf16 byte pairs; ``fp8_model1`` ``[num_pages * R, 576]`` (a free reshape: a page is R = page
  bytes / 576 rows of 576 bytes): data row of slot (page, off) is ``page * R + off``, its 8 scale
  bytes sit in row ``page * R + P + off // 72`` at column ``(off % 72) * 8``; ue8m0 byte e is
  ``2^(e - 127)`` (float32 bits ``e << 23``).
* **Tiles.** A row is a *main* tile (dims ``[0, 512)``: the value part, and for ``fp8_model1``
  only its 448 quantized dims, the rest zero) and an optional 64-wide *tail* tile (the rope
  dims: ``[512, 576)`` for D_qk = 576, key only; ``[448, 512)`` for ``fp8_model1``, key and
  value). ``s = q_main . k_main + q_tail . k_tail``; ``acc_main += p . k_main`` (and
  ``acc_tail += p . k_tail`` for ``fp8_model1``). Dots accumulate in fp32; operands are q's
  dtype (bf16 / fp16; fp8 dequantizes exactly into bf16), or fp32 with
  ``precision=HIGHEST`` (IEEE fp32 in the Triton lowering; DEFAULT would be TF32) for fp32 q
  or a latent cache whose dtype differs from q's.
* **Softmax.** Online, exp2 domain (``sm_scale * log2(e)`` applied to the fp32 scores), with a
  finite running-max sentinel ``-1e30`` and masked probabilities forced to 0, so a block (or a
  whole row) without valid entries never produces NaN; an empty row ends with ``l = 0``:
  out 0, LSE -inf. Duplicated indices count once per occurrence.
* **Sink** (V4): ``out *= 1 / (1 + exp(sink_h - lse))`` where the final output is written.
* **Determinism.** No atomics; the combine loops over splits in a fixed order.
* **Configs.** ``kernels.configs.PALLAS_SPARSE_MLA_SPACE`` (the Triton stack's
  ``SparseMLAConfig``, ``dv_splits = 1``): on 99 KiB GPUs (sm_120) at most 32 heads per
  program (``64 x 16`` stages 106,496 B); fp32 dots use ``PALLAS_SPARSE_MLA_FP32``. Shared
  memory of every entry is measured by lowering for CUDA and compiling the Triton IR for sm_90
  and sm_120 without a GPU (``tests/test_jax_sparse_mla.py::test_aot_compile_fits_smem``).

What the Pallas-Triton lowering cannot express, relative to the raw Triton kernel
--------------------------------------------------------------------------------
* **No reinterpreting views of a buffer.** Triton casts the byte pointer to ``bf16*`` /
  ``float32*`` and loads rope and scales directly; Pallas refs keep their dtype, so the fp8
  formats load bytes and assemble bf16 / float32 values with shifts and bitcasts (two strided
  byte loads for the rope, four bytes per scale). A bitcast view made in XLA would be a copy of
  the whole cache.
* **No per-column scale gather for free.** The Triton kernel loads one scale per element
  (``d // 128``); here scales are loaded once per row and group and spread over the columns
  with a chain of selects (3 for ``fp8_ds_mla``, 6 for ``fp8_model1``).
* **No static slicing of values** (``lax.slice`` has no Triton lowering), so the main/tail tiles
  are separate loads, and for ``fp8_model1`` the main tile spends 64 zero columns on the dots
  instead of joining nope and rope into one 512-wide tile.
* **No ``dv_splits``.** Splitting D_v across programs needs a value tile at a dynamic column
  offset with a dynamic choice of scale groups; the Triton kernel's ``dv_splits = 2`` is not
  mirrored (the Pallas config space has ``dv_splits = 1`` only).
* **``pl.load`` with index arrays does not run in interpret mode** when mixed with slices (see
  Gather above), so CPU tests exercise the broadcast-index-array variant of the gather.
* Strides: a Pallas ref is a whole contiguous array, so inputs must be contiguous (JAX arrays
  always are); loop-invariant pointer arithmetic, cache modifiers and ``tl.multiple_of`` hints
  are left to the lowering.

The launcher (validation, config choice, jit) is ``jax_impl/sparse_mla.py``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.pallas._pallas_call import triton_call

# kv_format codes (static KV_FORMAT), as in kernels/triton/sparse_mla.py
LATENT, FP8_DS_MLA, FP8_MODEL1 = 0, 1, 2
KV_FORMAT_CODES = {"latent": LATENT, "fp8_ds_mla": FP8_DS_MLA, "fp8_model1": FP8_MODEL1}

# fp8_ds_mla: 656 bytes per token = 512 e4m3 | 4 float32 scales | 64 bf16 rope
DS_MLA_BYTES, DS_MLA_NOPE, DS_MLA_TILE = 656, 512, 128
# fp8_model1: per page P data rows of 576 bytes (448 e4m3 | 64 bf16), then P scale rows of 8 bytes
MODEL1_DATA_BYTES, MODEL1_NOPE, MODEL1_TILE, MODEL1_SCALE_BYTES = 576, 448, 64, 8
MODEL1_SCALES_PER_ROW = MODEL1_DATA_BYTES // MODEL1_SCALE_BYTES   # 72 scale rows per 576 bytes

MAIN = 512          # main tile width (the value part; D_v must be 512)
TAIL = 64           # rope tile width
NEG_SENTINEL = -1.0e30  # finite running-max start; exp2(NEG - real) == 0 exactly
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _iota(n: int) -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, (n,), 0)


def _gather(ref, rows, col0: int, width: int, ok, *, stride: int = 1, interpret: bool):
    """``ref[rows[i], col0 + stride * j]`` as ``[BLOCK_K, width]``; rows with ``ok == False``
    read nothing and give 0. ``rows`` [BLOCK_K] int32 (already 0 where not ok)."""
    if interpret:
        cols = col0 + stride * _iota(width)
        return plgpu.load(ref.at[rows[:, None], cols[None, :]], mask=ok[:, None], other=0)
    return plgpu.load(ref.at[rows, pl.ds(col0, width, stride)], mask=ok[:, None], other=0)


def _bf16_pairs_to_f32(lo, hi):
    """Little-endian bf16 byte pairs (uint8 ``lo``, ``hi``) -> float32 (exact)."""
    bits = (hi.astype(jnp.uint32) << 24) | (lo.astype(jnp.uint32) << 16)
    return lax.bitcast_convert_type(bits, jnp.float32)


def _e4m3_to_f32(x8):
    return lax.bitcast_convert_type(x8, jnp.float8_e4m3fn).astype(jnp.float32)


def _ue8m0_to_f32(e):
    """uint32 exponent byte -> ``2^(e-127)`` float32 (0 -> 2^-127, 255 -> NaN), as ml_dtypes."""
    v = lax.bitcast_convert_type(e << 23, jnp.float32)
    v = jnp.where(e == 0, jnp.float32(2.0 ** -127), v)
    return jnp.where(e == 255, jnp.float32(jnp.nan), v)


def _spread(group_vals, group: int):
    """Per-row group values ``[[BLOCK_K]] * G`` -> ``[BLOCK_K, MAIN]`` (column d gets group
    ``d // group``; columns past the last group repeat it) with a chain of selects."""
    d = _iota(MAIN)[None, :]
    out = group_vals[-1][:, None]
    for g in range(len(group_vals) - 2, -1, -1):
        out = jnp.where(d < (g + 1) * group, group_vals[g][:, None], out)
    return out


def _load_main(kv_ref, rows, srows, scols, ok, *, kv_format: int, dot_dtype, interpret: bool):
    """Main tile (latent dims ``[0, 512)``; ``fp8_model1``: dims ``[0, 448)``, zero beyond) of
    the selected rows, dequantized, ``[BLOCK_K, 512]`` in ``dot_dtype``."""
    if kv_format == LATENT:
        return _gather(kv_ref, rows, 0, MAIN, ok, interpret=interpret).astype(dot_dtype)
    x8 = _gather(kv_ref, rows, 0, MAIN, ok, interpret=interpret)          # [BK, 512] uint8
    if kv_format == FP8_DS_MLA:
        shifts = (8 * _iota(4)).astype(jnp.uint32)[None, :]
        scales = []
        for g in range(DS_MLA_NOPE // DS_MLA_TILE):
            sb = _gather(kv_ref, rows, DS_MLA_NOPE + 4 * g, 4, ok, interpret=interpret)
            bits = jnp.sum(sb.astype(jnp.uint32) << shifts, axis=1)      # [BK] uint32
            scales.append(lax.bitcast_convert_type(bits, jnp.float32))
        x = _e4m3_to_f32(x8) * _spread(scales, DS_MLA_TILE)
        return x.astype(dot_dtype)
    # fp8_model1: the 8 scale bytes of each row; column offsets differ per row (2-D indices)
    cols = scols[:, None] + _iota(MODEL1_SCALE_BYTES)[None, :]
    e = plgpu.load(kv_ref.at[srows[:, None], cols], mask=ok[:, None], other=0)
    e = e.astype(jnp.uint32)                                                # [BK, 8]
    j = _iota(MODEL1_SCALE_BYTES)[None, :]
    scales = [_ue8m0_to_f32(jnp.sum(jnp.where(j == g, e, 0), axis=1))
              for g in range(MODEL1_NOPE // MODEL1_TILE)]
    d = _iota(MAIN)[None, :]
    x = jnp.where(d < MODEL1_NOPE, _e4m3_to_f32(x8) * _spread(scales, MODEL1_TILE), 0.0)
    return x.astype(dot_dtype)


def _load_tail(kv_ref, rows, ok, *, kv_format: int, dot_dtype, interpret: bool):
    """Tail tile: the 64 rope dims (``[512, 576)``, or ``[448, 512)`` for ``fp8_model1``),
    ``[BLOCK_K, 64]`` in ``dot_dtype``."""
    if kv_format == LATENT:
        return _gather(kv_ref, rows, MAIN, TAIL, ok, interpret=interpret).astype(dot_dtype)
    start = DS_MLA_NOPE + 16 if kv_format == FP8_DS_MLA else MODEL1_NOPE
    lo = _gather(kv_ref, rows, start, TAIL, ok, stride=2, interpret=interpret)
    hi = _gather(kv_ref, rows, start + 1, TAIL, ok, stride=2, interpret=interpret)
    return _bf16_pairs_to_f32(lo, hi).astype(dot_dtype)


def _dot(a, b, contract_b: int, fp32: bool):
    """``a @ b`` (``contract_b=0``) or ``a @ b.T`` (``contract_b=1``), fp32 accumulation;
    IEEE fp32 products when ``fp32`` (precision HIGHEST; DEFAULT lowers to TF32)."""
    return lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())),
                           precision=lax.Precision.HIGHEST if fp32 else None,
                           preferred_element_type=jnp.float32)


def _sparse_mla_split_kernel(
    *refs,
    KV_FORMAT: int, HAS_TAIL: bool, TAIL_IN_V: bool, N: int, H: int, K: int, S: int,
    PAGE_SIZE: int, NUM_PAGES: int, ROWS_PER_PAGE: int, MAX_PAGES: int,
    BLOCK_H: int, BLOCK_K: int, CHUNK: int, HAS_BT: bool, HAS_TKL: bool, HAS_SINK: bool,
    FINAL: bool, DOT_DTYPE, INTERPRET: bool,
):
    refs = list(refs)
    q_ref = refs.pop(0)         # [B, N, H, D_qk] q dtype
    kv_ref = refs.pop(0)        # latent [num_slots, D_qk]; ds_mla uint8 [num_slots, 656];
    #                             model1 uint8 [num_pages * R, 576]
    idx_ref = refs.pop(0)       # [B, N, K] int32 slots (logical positions with HAS_BT)
    scale_ref = refs.pop(0)     # [1] float32 sm_scale * log2(e)
    bt_ref = refs.pop(0) if HAS_BT else None      # [B, max_pages] int32
    tkl_ref = refs.pop(0) if HAS_TKL else None    # [B] int32
    sink_ref = refs.pop(0) if HAS_SINK else None  # [H] float32 (FINAL only)
    if FINAL:
        out_ref, lse_ref = refs  # [B, N, H, D_v] q dtype; [B, N, H] float32 natural log
    else:
        po_ref, pl_ref = refs    # [S, B*N, H, D_v] float32; [S, B*N, H] float32 log2 domain
    fp32 = jnp.dtype(DOT_DTYPE) == jnp.float32

    pid_h = pl.program_id(0)
    pid_s = pl.program_id(1)
    pid_bn = pl.program_id(2)
    b = pid_bn // N
    n = pid_bn % N
    h0 = pid_h * BLOCK_H
    h_ok = h0 + _iota(BLOCK_H) < H                                           # [BLOCK_H]
    heads = pl.ds(h0, BLOCK_H)
    q_main = plgpu.load(q_ref.at[b, n, heads, pl.ds(0, MAIN)], mask=h_ok[:, None],
                        other=0).astype(DOT_DTYPE)                           # [BLOCK_H, 512]
    if HAS_TAIL:
        t0 = MODEL1_NOPE if TAIL_IN_V else MAIN
        q_tail = plgpu.load(q_ref.at[b, n, heads, pl.ds(t0, TAIL)], mask=h_ok[:, None],
                            other=0).astype(DOT_DTYPE)                       # [BLOCK_H, 64]
    qk_scale_log2 = scale_ref[0]

    k_len = K
    if HAS_TKL:
        k_len = jnp.clip(tkl_ref[b], 0, K)
    start = pid_s * CHUNK
    end = jnp.minimum(start + CHUNK, k_len)
    n_iter = (jnp.maximum(end - start, 0) + BLOCK_K - 1) // BLOCK_K

    def body(i, carry):
        m_i, l_i, acc, acc_t = carry
        k0 = start + i * BLOCK_K
        in_list = k0 + _iota(BLOCK_K) < end                                  # [BLOCK_K]
        raw = plgpu.load(idx_ref.at[b, n, pl.ds(k0, BLOCK_K)], mask=in_list, other=-1)
        if HAS_BT:
            ok = in_list & (raw >= 0) & (raw < MAX_PAGES * PAGE_SIZE)
            lpage = jnp.where(ok, raw // PAGE_SIZE, 0)
            ent = plgpu.load(bt_ref.at[b, lpage], mask=ok, other=-1)
            ok = ok & (ent >= 0) & (ent < NUM_PAGES)
            slot = ent * PAGE_SIZE + raw % PAGE_SIZE
        else:
            ok = in_list & (raw >= 0) & (raw < NUM_PAGES * PAGE_SIZE)
            slot = raw
        slot = jnp.where(ok, slot, 0)                                        # never dereferenced
        if KV_FORMAT == FP8_MODEL1:
            page = slot // PAGE_SIZE
            off = slot % PAGE_SIZE
            rows = page * ROWS_PER_PAGE + off
            srows = page * ROWS_PER_PAGE + PAGE_SIZE + off // MODEL1_SCALES_PER_ROW
            scols = (off % MODEL1_SCALES_PER_ROW) * MODEL1_SCALE_BYTES
        else:
            rows, srows, scols = slot, None, None

        k_main = _load_main(kv_ref, rows, srows, scols, ok, kv_format=KV_FORMAT,
                            dot_dtype=DOT_DTYPE, interpret=INTERPRET)        # [BLOCK_K, 512]
        s = _dot(q_main, k_main, 1, fp32)                                    # [BLOCK_H, BLOCK_K]
        if HAS_TAIL:
            k_tail = _load_tail(kv_ref, rows, ok, kv_format=KV_FORMAT, dot_dtype=DOT_DTYPE,
                                interpret=INTERPRET)                         # [BLOCK_K, 64]
            s = s + _dot(q_tail, k_tail, 1, fp32)
        s = jnp.where(ok[None, :], s * qk_scale_log2, NEG_SENTINEL)
        m_new = jnp.maximum(m_i, jnp.max(s, axis=1))
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.where(ok[None, :], jnp.exp2(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + jnp.sum(p, axis=1)
        pd = p.astype(DOT_DTYPE)
        acc = acc * alpha[:, None] + _dot(pd, k_main, 0, fp32)
        if TAIL_IN_V:
            acc_t = acc_t * alpha[:, None] + _dot(pd, k_tail, 0, fp32)
        if jnp.dtype(DOT_DTYPE) == jnp.bfloat16:
            # bf16 keeps 8 bits of p; the rounding residual's second dot makes it ~16 bits
            # (same as kernels/triton/sparse_mla.py; without it a flat softmax misses the SPEC
            # out bound by up to 1.3x on the H200).
            p_lo = (p - pd.astype(jnp.float32)).astype(DOT_DTYPE)
            acc = acc + _dot(p_lo, k_main, 0, fp32)
            if TAIL_IN_V:
                acc_t = acc_t + _dot(p_lo, k_tail, 0, fp32)
        return m_new, l_i, acc, acc_t

    init = (jnp.full((BLOCK_H,), NEG_SENTINEL, jnp.float32), jnp.zeros((BLOCK_H,), jnp.float32),
            jnp.zeros((BLOCK_H, MAIN), jnp.float32),
            jnp.zeros((BLOCK_H, TAIL if TAIL_IN_V else 1), jnp.float32))
    m_i, l_i, acc, acc_t = lax.fori_loop(0, n_iter, body, init)

    has = l_i != 0.0        # NaN sums propagate (as in the reference); empty iff l == 0
    l_safe = jnp.where(has, l_i, 1.0)
    o = jnp.where(has[:, None], acc / l_safe[:, None], 0.0)                  # [BLOCK_H, 512]
    o_t = jnp.where(has[:, None], acc_t / l_safe[:, None], 0.0)
    lse2 = jnp.where(has, m_i + jnp.log(l_safe) * LOG2E, -jnp.inf)           # log2 domain
    main_w = MODEL1_NOPE if TAIL_IN_V else MAIN
    omask = h_ok[:, None] & (_iota(MAIN)[None, :] < main_w)
    if FINAL:
        lse = lse2 * LN2
        if HAS_SINK:
            sink = plgpu.load(sink_ref.at[heads], mask=h_ok, other=0.0)
            factor = (1.0 / (1.0 + jnp.exp(sink - lse)))[:, None]            # lse=-inf -> 0
            o, o_t = o * factor, o_t * factor
        o_ref, l_ref, lead = out_ref, lse_ref, (b, n)
    else:
        lse = lse2
        o_ref, l_ref, lead = po_ref, pl_ref, (pid_s, pid_bn)
    # one indexer per ref access (the Triton lowering does not compose .at[] chains)
    plgpu.store(o_ref.at[(*lead, heads, pl.ds(0, MAIN))], o.astype(o_ref.dtype), mask=omask)
    if TAIL_IN_V:
        plgpu.store(o_ref.at[(*lead, heads, pl.ds(MODEL1_NOPE, TAIL))], o_t.astype(o_ref.dtype),
                    mask=h_ok[:, None])
    plgpu.store(l_ref.at[(*lead, heads)], lse, mask=h_ok)


def _sparse_mla_combine_kernel(*refs, S: int, H: int, BLOCK_H: int, HAS_SINK: bool):
    if HAS_SINK:
        po_ref, pl_ref, sink_ref, out_ref, lse_ref = refs
    else:
        po_ref, pl_ref, out_ref, lse_ref = refs
    # po_ref [S, B*N, H, D_v] f32; pl_ref [S, B*N, H] f32 log2; sink_ref [H] f32;
    # out_ref [B*N, H, D_v] q dtype; lse_ref [B*N, H] f32 natural log
    pid_h = pl.program_id(0)
    pid_bn = pl.program_id(1)
    h0 = pid_h * BLOCK_H
    h_ok = h0 + _iota(BLOCK_H) < H
    heads = pl.ds(h0, BLOCK_H)
    d_v = out_ref.shape[-1]

    def load_lse(s):
        return plgpu.load(pl_ref.at[s, pid_bn, heads], mask=h_ok, other=-jnp.inf)

    def max_and_nan(s, carry):
        m, nan = carry
        ls = load_lse(s)
        return jnp.maximum(m, ls), nan | (ls != ls)

    m, nan = lax.fori_loop(0, S, max_and_nan, (jnp.full((BLOCK_H,), -jnp.inf, jnp.float32),
                                               jnp.zeros((BLOCK_H,), jnp.bool_)))
    # a NaN partial (NaN in q or a selected row) makes the row NaN, as in the reference
    has = (m > -jnp.inf) | nan
    m_safe = jnp.where(m > -jnp.inf, m, 0.0)

    def body(s, carry):
        den, acc = carry
        w = jnp.exp2(load_lse(s) - m_safe)                                   # -inf -> 0
        po = plgpu.load(po_ref.at[s, pid_bn, heads, :], mask=h_ok[:, None], other=0.0)
        return den + w, acc + w[:, None] * po

    den, acc = lax.fori_loop(0, S, body, (jnp.zeros((BLOCK_H,), jnp.float32),
                                          jnp.zeros((BLOCK_H, d_v), jnp.float32)))
    den_safe = jnp.where(has, den, 1.0)
    o = jnp.where(has[:, None], acc / den_safe[:, None], 0.0)
    lse = jnp.where(has, (m_safe + jnp.log(den_safe) * LOG2E) * LN2, -jnp.inf)
    if HAS_SINK:
        sink = plgpu.load(sink_ref.at[heads], mask=h_ok, other=0.0)
        o = o * (1.0 / (1.0 + jnp.exp(sink - lse)))[:, None]
    plgpu.store(out_ref.at[pid_bn, heads, :], o.astype(out_ref.dtype), mask=h_ok[:, None])
    plgpu.store(lse_ref.at[pid_bn, heads], lse, mask=h_ok)


def sparse_mla_decode_pallas(q, kv_rows, indices, qk_scale_log2, *, kv_format: str,
                             page_size: int, num_pages: int, block_table=None, topk_length=None,
                             attn_sink=None, block_h: int, block_k: int, num_splits: int,
                             num_warps: int, num_stages: int, dot_dtype, combine_block_h: int = 16,
                             combine_warps: int = 4, interpret: bool | None = None):
    """Launch the split kernel (and the combine when ``num_splits > 1``). No validation here:
    ``jax_impl.sparse_mla.sparse_mla_decode`` validates and picks the config.

    Args:
      q: ``[B, N, H, D_qk]`` bf16 / fp16 / fp32.
      kv_rows: the cache as rows: ``latent`` ``[num_pages * P, D_qk]``; ``fp8_ds_mla`` uint8
        ``[num_pages * P, 656]``; ``fp8_model1`` uint8 ``[num_pages * R, 576]`` (R = page bytes
        / 576). All free reshapes of the caller's cache.
      indices: ``[B, N, K]`` int32 slots, or logical positions with ``block_table``.
      qk_scale_log2: ``[1]`` float32, ``sm_scale * log2(e)``.
      block_table: ``[B, max_pages]`` int32 or None; topk_length: ``[B]`` int32 or None;
        attn_sink: ``[H]`` float32 or None.
      block_h, block_k, num_splits, num_warps, num_stages: the launch config.
      dot_dtype: operand dtype of both dots (accumulation is always fp32).
    Returns:
      (out ``[B, N, H, 512]`` q.dtype, lse ``[B, N, H]`` float32 natural log, -inf for empty rows).
    """
    B, N, H, d_qk = q.shape
    K = indices.shape[-1]
    code = KV_FORMAT_CODES[kv_format]
    blocks = max(1, -(-K // block_k))
    S = max(1, min(int(num_splits), blocks))
    chunk = -(-blocks // S) * block_k
    S = -(-K // chunk) if K > 0 else 1            # no empty trailing splits
    head_blocks = -(-H // block_h)
    rows_per_page = kv_rows.shape[0] // num_pages if code == FP8_MODEL1 else 1
    final = S == 1
    static = dict(
        KV_FORMAT=code, HAS_TAIL=(code == FP8_MODEL1) or d_qk > MAIN, TAIL_IN_V=code == FP8_MODEL1,
        N=N, H=H, K=K, S=S, PAGE_SIZE=page_size, NUM_PAGES=num_pages,
        ROWS_PER_PAGE=rows_per_page, MAX_PAGES=0 if block_table is None else block_table.shape[1],
        BLOCK_H=block_h, BLOCK_K=block_k, CHUNK=chunk, HAS_BT=block_table is not None,
        HAS_TKL=topk_length is not None, HAS_SINK=final and attn_sink is not None,
        FINAL=final, DOT_DTYPE=jnp.dtype(dot_dtype),
        INTERPRET=bool(jax.default_backend() == "cpu" if interpret is None else interpret))
    args = [q, kv_rows, indices, qk_scale_log2]
    args += [a for a in (block_table, topk_length) if a is not None]
    if static["HAS_SINK"]:
        args.append(attn_sink)
    if final:
        out_shape = (jax.ShapeDtypeStruct((B, N, H, MAIN), q.dtype),
                     jax.ShapeDtypeStruct((B, N, H), jnp.float32))
    else:
        out_shape = (jax.ShapeDtypeStruct((S, B * N, H, MAIN), jnp.float32),
                     jax.ShapeDtypeStruct((S, B * N, H), jnp.float32))
    kernel = functools.partial(_sparse_mla_split_kernel, **static)
    res = triton_call(kernel, out_shape=out_shape, grid=(head_blocks, S, B * N),
                      num_warps=num_warps, num_stages=num_stages, interpret=interpret,
                      name="sparse_mla_split")(*args)
    if final:
        return res
    po, plse = res
    cargs = [po, plse] + ([attn_sink] if attn_sink is not None else [])
    ckernel = functools.partial(_sparse_mla_combine_kernel, S=S, H=H, BLOCK_H=combine_block_h,
                                HAS_SINK=attn_sink is not None)
    out, lse = triton_call(
        ckernel, out_shape=(jax.ShapeDtypeStruct((B * N, H, MAIN), q.dtype),
                            jax.ShapeDtypeStruct((B * N, H), jnp.float32)),
        grid=(-(-H // combine_block_h), B * N), num_warps=combine_warps, num_stages=1,
        interpret=interpret, name="sparse_mla_combine")(*cargs)
    return out.reshape(B, N, H, MAIN), lse.reshape(B, N, H)


__all__ = ["sparse_mla_decode_pallas", "KV_FORMAT_CODES", "LOG2E", "MAIN", "TAIL"]
