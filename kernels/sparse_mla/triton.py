"""Sparse MLA decode as Triton kernels: split-K over the top-k list, then an LSE combine.

Semantics: ../docs/SPEC.md "Operation B" (FlashMLA ``flash_mla_with_kvcache`` sparse decode,
absorbed MLA in MQA form). The float64 definition is ``kernels.reference.sparse_mla_decode``.

Design
------
Work is a grid ``(head_blocks, splits, B * N)``:

* **Head block.** One program holds ``BLOCK_H`` query heads (a power of two >= 16 for
  ``tl.dot``; padded heads are masked, the caller never pads). Each head block gathers its
  selected rows itself (for H = 128 the head blocks of one (request, split) are adjacent in the
  grid, so the repeated gathers mostly hit L2).
* **Split-K.** A program walks ``chunk`` entries of the top-k list (``chunk`` a multiple of
  ``BLOCK_K``). The split count comes from ``kernels.sparse_mla.configs.sparse_mla_num_splits``: enough
  programs to fill the SMs when ``B x N x head_blocks`` alone does not. Splits write fp32
  partial outputs (normalised) and log2-domain partial LSEs; ``_sparse_mla_combine_kernel``
  merges them into the natural-log LSE and q-dtype output. With one split the split kernel
  writes the final result itself (``FINAL``), saving the combine launch and the partial traffic.
* **64-dim chunks.** The latent is handled as 8 chunks of 64 value dims (D_v = 512) plus, for
  D_qk = 576, a 9th chunk of rope dims used by the scores only. The scores are a sum of 9 (or 8)
  ``[BLOCK_H, 64] x [64, BLOCK_K]`` dots and the accumulator is 8 ``[BLOCK_H, 64]`` fp32 tiles,
  so no operand ever spans the whole 576-wide row (a 16 x 576 bf16 q operand alone is 128
  registers per thread when a warp holds it whole). A chunk is one scale group of
  ``fp8_model1`` (64 dims) and half of one of ``fp8_ds_mla`` (128 dims), so its per-row scale is
  one value: it multiplies the fp32 partial score of the chunk (``_qk``) and is folded into p for
  the value dot (``_pv``), so the e4m3 values enter the dots unscaled (exact in bf16 / fp16).
* **Hand-pipelined gathers.** Every load of a row block (9 chunks, 8 scales) is issued back to
  back, and the loop runs three deep: while block i is computed, the rows of block i + 1 are in
  flight, the block-table entries of block i + 2 and the indices of block i + 3, so each load
  waits on values that arrived an iteration earlier (``prefetch=False`` issues each block's loads
  at the top of its own iteration). Triton's pipeliner does not turn these loads into async
  copies because the dots need them converted first. Measured on the H200 (bench/NOTES.md).
* **Gather.** Each block of ``BLOCK_K`` indices is resolved to slots (through the block table:
  ``block_table[b, j // P] * P + j % P``) and checked; invalid entries (negative, beyond the
  cache or the table, a negative page entry, past ``topk_length``) are masked in every load so
  they are never dereferenced, and their scores are excluded explicitly (so NaN or stale data in
  unselected rows cannot leak). Rows are read straight from the cache in its own layout:
  ``latent`` (bf16/fp16/fp32), ``fp8_ds_mla`` (e4m3 bytes x float32 scale per 128 dims, bf16
  rope) and ``fp8_model1`` (per-page data rows then ue8m0 scale rows; byte e -> 2^(e-127)),
  converted in registers, never into a separate dequantized copy. The fp8 pages are
  ``page_bytes`` apart (the byte stride of one page: padded pages, as FlashMLA's quantizer
  allocates them, are read in place; ``latent`` pages use ``stride_page`` / ``stride_tok``).
  Row starts are multiples of 16 bytes (656 = 16 x 41, 576 = 16 x 36, the page stride a
  multiple of 16) and the masks are constant along a row, so chunks load as 16-byte vectors.
* **Math.** Both dots accumulate in fp32; the operand dtype follows q (bf16 / fp16 on the GPU;
  fp32 q uses IEEE fp32 dots, fp16 in the CPU interpreter). bf16 p is split into a bf16 value
  and its bf16 residual (two value dots) so p keeps 16 bits: with 8 bits a flat softmax over K
  rows missed the SPEC bound by up to 1.3x on the H200. Online softmax runs in the exp2 domain
  (``sm_scale * log2(e)`` folded into the scores) with a finite running-max sentinel ``-1e30``
  and masked probabilities forced to 0, so a block (or a whole row) without valid entries never
  produces NaN. An empty row ends with ``l = 0``: out 0, LSE -inf; NaN in q or in a selected row
  propagates to out and LSE as in the reference. Duplicated indices are summed once per
  occurrence naturally.
* **Sink** (V4): ``out *= 1 / (1 + exp(sink_h - lse))`` applied where the final output is written.
* **Determinism.** No atomics; the combine loops over splits in a fixed order.

The launcher (views, split count, grid, constexprs, AOT specs) is ``kernels/sparse_mla/triton_launch.py``;
the binding (validation, config choice, custom-op registration) ``torch_impl/sparse_mla.py``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.layouts import FP8_DS_MLA as _DS, FP8_MODEL1 as _M1

# kv_format codes (constexpr KV_FORMAT)
LATENT, FP8_DS_MLA, FP8_MODEL1 = 0, 1, 2
KV_FORMAT_CODES = {"latent": LATENT, "fp8_ds_mla": FP8_DS_MLA, "fp8_model1": FP8_MODEL1}

# Byte layouts (kernels.layouts). fp8_ds_mla: 656 bytes per token = 512 e4m3 | 4 float32
# scales | 64 bf16 rope, read through uint8 / float32 (_F32) / int16 (_I16) views
DS_MLA_BYTES = tl.constexpr(_DS.data.nbytes)                        # 656
DS_MLA_ROW_F32 = tl.constexpr(_DS.data.stride(4))                   # 164
DS_MLA_SCALE_F32 = tl.constexpr(_DS.field("scale").index(4))        # 128
DS_MLA_ROW_I16 = tl.constexpr(_DS.data.stride(2))                   # 328
DS_MLA_ROPE_I16 = tl.constexpr(_DS.field("rope").index(2))          # 264
DS_MLA_NOPE, DS_MLA_TILE = _DS.field("nope").count, _DS.tile        # 512, 128
# fp8_model1: per page P data rows of 576 bytes (448 e4m3 | 64 bf16), then P scale rows of 8 bytes
MODEL1_DATA_BYTES = tl.constexpr(_M1.data.nbytes)                   # 576
MODEL1_SCALE_BYTES = tl.constexpr(_M1.scale.nbytes)                 # 8
MODEL1_ROPE_I16 = tl.constexpr(_M1.field("rope").index(2))          # 224
MODEL1_NOPE, MODEL1_TILE = _M1.field("nope").count, _M1.tile        # 448, 64

NEG_SENTINEL = tl.constexpr(-1.0e30)  # finite running-max start; exp2(NEG - real) == 0 exactly
LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)
F32_LOWEST = tl.constexpr(-3.4028234663852886e38)     # the most negative finite float32


@triton.jit
def _finite_sink(sink):
    """A sink of -inf as the most negative float32 (SPEC: the same factor 1 on a non-empty row,
    and 0 instead of ``1 / (1 + exp(-inf + inf))`` = NaN on an empty one); NaN stays NaN."""
    return tl.where(sink == float("-inf"), F32_LOWEST, sink)


@triton.jit
def _bf16_bits_to_f32(bits):
    """bf16 stored as int16 bits -> float32 (exact; bf16 is the top half of a float32). Bit
    arithmetic rather than a bf16 cast, which the CPU interpreter does not evaluate."""
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


CH = tl.constexpr(64)   # latent dims per chunk: one fp8_model1 scale group, half an fp8_ds_mla one


@triton.jit
def _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr,             # cache as its dtype / int16 (bf16 bits) / f32
               slot, ok,                                # [BLOCK_K] int64 slot (0 if invalid); bool
               stride_page, stride_tok, page_bytes, page_size,
               C: tl.constexpr, BLOCK_K: tl.constexpr, KV_FORMAT: tl.constexpr):
    """Issue the loads of latent dims ``[64 C, 64 C + 64)`` of the selected rows: ``(raw,
    scale)`` with ``raw`` ``[BLOCK_K, 64]`` as stored (e4m3 bytes, bf16 rope bits as int16, or
    the latent dtype; :func:`_chunk_val` converts it) and the chunk's per-row fp32 scale
    ``[BLOCK_K]`` (1 where the format has none): the dequantized latent is ``val * scale``.
    Rows with ``ok == False`` are 0 and never read."""
    d = tl.arange(0, CH)
    m = ok[:, None]                                   # constant along the row: 16-byte vectors
    one = tl.full([BLOCK_K], 1.0, tl.float32)
    if KV_FORMAT == 0:      # latent [num_pages, P, D_qk], last dim contiguous
        row = (slot // page_size) * stride_page + (slot % page_size) * stride_tok
        return tl.load(kv_ptr + row[:, None] + (d + C * CH)[None, :], mask=m, other=0.0), one
    elif KV_FORMAT == 1:    # fp8_ds_mla uint8 [num_pages, P, 656], pages page_bytes apart
        # 512 e4m3 | 4 f32 scales | 64 bf16 per row; slots < num_slots fit int32, so the page
        # and offset are int32 divisions. Row starts are multiples of 16 bytes (page_bytes is,
        # kernels.formats.FP8_PAGE_ALIGN), so the 64-byte chunks load as 16-byte vectors.
        # Cost against the old ``slot * 656`` (AOT, Triton 3.6, bf16 q, 2026-12-02): slot
        # indices ~7-12 % more SASS in the loop (sm_90 16x32 s2: 1086 -> 1217), registers and
        # spills within a few bytes (sm_120 16x32 s1 prefetch: 4 -> 28 B spilled); with a block
        # table no more (1469 -> 1552, 352 -> 272 B on sm_120). A uniform branch back to
        # ``slot * 656`` for packed pages spilled more (sm_90 64x32 s2: 128 -> 212 B), and
        # computing the offset in _resolve (carried through the pipeline) far more. Not yet
        # timed on the H200.
        s32 = slot.to(tl.int32)
        row = (s32 // page_size).to(tl.int64) * page_bytes + (s32 % page_size) * DS_MLA_BYTES
        if C < 8:
            x8 = tl.load(kv_ptr + (row + C * CH)[:, None] + d[None, :], mask=m, other=0)
            sc = tl.load(kv32_ptr + row // 4 + (DS_MLA_SCALE_F32 + C // 2), mask=ok, other=0.0)
            return x8, sc
        else:
            r = tl.load(kv16_ptr + (row // 2 + DS_MLA_ROPE_I16)[:, None] + d[None, :], mask=m,
                        other=0)
            return r, one
    else:                   # fp8_model1: per page P rows of 448 e4m3 | 64 bf16, then P x 8 ue8m0
        page = slot // page_size
        off = slot % page_size
        data = page * page_bytes + off * MODEL1_DATA_BYTES
        if C < 7:
            x8 = tl.load(kv_ptr + (data + C * CH)[:, None] + d[None, :], mask=m, other=0)
            # masked rows read scale byte 0 (scale 0.0): the fp16 tile folds the scale in, and a
            # masked row's value must stay 0 whatever the tile's shift (1.0 * 2^19 was inf in fp16,
            # and 0 * inf NaN in the dot)
            e = tl.load(kv_ptr + page * page_bytes + page_size * MODEL1_DATA_BYTES
                        + off * MODEL1_SCALE_BYTES + C, mask=ok, other=0)
            return x8, (e.to(tl.int32) << 23).to(tl.float32, bitcast=True)   # 2^(e-127)
        else:
            r = tl.load(kv16_ptr + (data // 2 + MODEL1_ROPE_I16)[:, None] + d[None, :], mask=m,
                        other=0)
            return r, one


@triton.jit
def _chunk_val(raw, C: tl.constexpr, KV_FORMAT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Chunk ``C`` as loaded by :func:`_chunk_raw` -> unscaled values in ``DOT_DTYPE`` (exact:
    e4m3 fits bf16 / fp16; the bf16 rope fits bf16)."""
    if KV_FORMAT == 0:
        return raw.to(DOT_DTYPE)
    elif (KV_FORMAT == 1 and C < 8) or (KV_FORMAT == 2 and C < 7):
        return raw.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)
    else:
        return _bf16_bits_to_f32(raw).to(DOT_DTYPE)


@triton.jit
def _nope_tile(raw, sc, shift, C: tl.constexpr, KV_FORMAT: tl.constexpr,
               DOT_DTYPE: tl.constexpr, SHIFTED: tl.constexpr):
    """Chunk ``C`` converted ONCE for both dots: ``[BLOCK_K, 64]`` in ``DOT_DTYPE``.

    SHIFTED (fp8 formats with 16-bit dots): the dequantized value ``e4m3 * scale * shift`` in
    fp16, where ``1 / shift`` is the program's running unit (:func:`_tile_unit`). For
    power-of-two scales within 22 binades below the largest scale seen so far the fp16 value is
    exact (docs/SEMANTICS.md "fast-path numerics"); the dots' fp32 results are multiplied back by
    the unit. Else the latent value, or (fp32 dots)
    the dequantized fp32 value."""
    if SHIFTED:
        f = (sc * shift).to(tl.float16)
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float16) * f[:, None]
    elif KV_FORMAT == 0:
        return _chunk_val(raw, C, KV_FORMAT, DOT_DTYPE)
    else:                   # fp32 dots: the dequantized value in fp32 (1 for the rope chunk)
        return _chunk_val(raw, C, KV_FORMAT, DOT_DTYPE) * sc[:, None]


@triton.jit
def _exp_field(x):
    """Biased float32 exponent field of ``x`` (0 for zero / subnormals, 255 for inf / NaN)."""
    return (x.to(tl.int32, bitcast=True) >> 23) & 0xFF


@triton.jit
def _pow2(e):
    """2^(e - 127) as float32 for an int32 biased exponent ``e`` in [1, 254]."""
    return (e << 23).to(tl.float32, bitcast=True)


@triton.jit
def _tile_unit(ok, c0, c1, c2, c3, c4, c5, c6, c7, KV_FORMAT: tl.constexpr):
    """Biased exponent ``ub`` (int32 in [1, 253]) of the unit ``2^(ub - 127)`` one row block of
    an fp8 format needs: the largest biased exponent E of its valid rows' scales gives
    ``ub = E - 6``, so every scale divided by the unit is below 2^7 and ``448 * 2^7 < 65504``
    holds for any scale of that exponent. A block without valid rows gives 1 (no constraint)."""
    e = tl.maximum(tl.maximum(_exp_field(c0), _exp_field(c2)),
                   tl.maximum(_exp_field(c4), _exp_field(c6)))
    if KV_FORMAT == 2:      # fp8_model1: 7 scale groups of 64 dims (chunks 0..6)
        e = tl.maximum(e, tl.maximum(tl.maximum(_exp_field(c1), _exp_field(c3)), _exp_field(c5)))
    e = tl.max(tl.where(ok, e, 0), axis=0)
    return tl.minimum(tl.maximum(e - 6, 1), 253)


@triton.jit
def _issue_rows(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok, page_bytes,
                page_size, BLOCK_K: tl.constexpr, KV_FORMAT: tl.constexpr, TAIL: tl.constexpr):
    """All loads of one row block, issued back to back: 9 (8 without the rope tail) raw chunks
    and 8 scales (see :func:`_chunk_raw`)."""
    r0, c0 = _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok,
                        page_bytes, page_size, 0, BLOCK_K, KV_FORMAT)
    r1, c1 = _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok,
                        page_bytes, page_size, 1, BLOCK_K, KV_FORMAT)
    r2, c2 = _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok,
                        page_bytes, page_size, 2, BLOCK_K, KV_FORMAT)
    r3, c3 = _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok,
                        page_bytes, page_size, 3, BLOCK_K, KV_FORMAT)
    r4, c4 = _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok,
                        page_bytes, page_size, 4, BLOCK_K, KV_FORMAT)
    r5, c5 = _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok,
                        page_bytes, page_size, 5, BLOCK_K, KV_FORMAT)
    r6, c6 = _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok,
                        page_bytes, page_size, 6, BLOCK_K, KV_FORMAT)
    r7, c7 = _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok,
                        page_bytes, page_size, 7, BLOCK_K, KV_FORMAT)
    if TAIL:
        r8, _ = _chunk_raw(kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok,
                           page_bytes, page_size, 8, BLOCK_K, KV_FORMAT)
    else:
        r8 = r7
    return r0, r1, r2, r3, r4, r5, r6, r7, r8, c0, c1, c2, c3, c4, c5, c6, c7


@triton.jit
def _page_entries(bt_row, raw, in_list, max_pages, page_size, HAS_BT: tl.constexpr):
    """Block-table entries ``[BLOCK_K]`` int32 of the logical indices ``raw`` (HAS_BT; -1 where
    the index is outside the table or past the list, never read), else ``raw`` unchanged."""
    if HAS_BT:
        ok = in_list & (raw >= 0) & (raw < max_pages * page_size)
        return tl.load(bt_row + tl.where(ok, raw // page_size, 0), mask=ok, other=-1)
    else:
        return raw


@triton.jit
def _resolve(raw, ent, in_list, num_slots, num_pages, max_pages, page_size, HAS_BT: tl.constexpr):
    """``(slot, ok)`` of one row block: int64 slots (0 where invalid) and the validity mask
    (negative, beyond the cache or the table, a negative page entry, past the list)."""
    raw = raw.to(tl.int64)
    if HAS_BT:
        ent = ent.to(tl.int64)
        ok = in_list & (raw >= 0) & (raw < max_pages * page_size) & (ent >= 0) & (ent < num_pages)
        slot = ent * page_size + raw % page_size
    else:
        ok = in_list & (raw >= 0) & (raw < num_slots)
        slot = raw
    return tl.where(ok, slot, 0), ok


@triton.jit
def _heads(v, ROWS_M: tl.constexpr):
    """A per-head vector ``[BLOCK_H]`` broadcast over the score / accumulator tile: heads on
    axis 0 (``[BLOCK_H, *]``), or on axis 1 with ``ROWS_M`` (``[*, BLOCK_H]``)."""
    if ROWS_M:
        return v[None, :]
    else:
        return v[:, None]


@triton.jit
def _rows(v, ROWS_M: tl.constexpr):
    """A per-row vector ``[BLOCK_K]`` broadcast over the score tile (rows on axis 1, or on axis 0
    with ``ROWS_M``)."""
    if ROWS_M:
        return v[:, None]
    else:
        return v[None, :]


@triton.jit
def _dot_acc(a, b, acc, DOT_FP32: tl.constexpr):
    """``acc + a . b`` with fp32 accumulation; IEEE fp32 products when the operands are fp32."""
    if DOT_FP32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _qk(s, q_c, x_c, DOT_FP32: tl.constexpr, ROWS_M: tl.constexpr = False):
    """``s + q_c . x_c^T`` over one chunk: ``[BLOCK_H, BLOCK_K]`` fp32 (accumulated in the dot);
    ``ROWS_M``: the transposed product ``s + x_c . q_c^T``, ``[BLOCK_K, BLOCK_H]``."""
    if ROWS_M:
        return _dot_acc(x_c, tl.trans(q_c), s, DOT_FP32)
    else:
        return _dot_acc(q_c, tl.trans(x_c), s, DOT_FP32)


@triton.jit
def _pv(acc_c, alpha, p, x_c, P_SPLIT: tl.constexpr, DOT_FP32: tl.constexpr,
        ROWS_M: tl.constexpr = False):
    """``acc_c * alpha + p . x_c`` over one chunk of D_v, p ``[BLOCK_H, BLOCK_K]`` fp32 rounded to
    ``x_c``'s dtype (``ROWS_M``: the transposed ``acc_c`` ``[64, BLOCK_H]`` plus ``x_c^T . p``
    with p ``[BLOCK_K, BLOCK_H]``). P_SPLIT (bf16 values): a second dot with p's bf16 rounding
    residual, so p keeps 16 bits (bf16 alone keeps 8: a flat softmax over K rows then missed the
    SPEC bound by up to 1.3x on the H200). fp16 p keeps 11 bits and needs no residual."""
    acc_c = acc_c * _heads(alpha, ROWS_M)
    p_hi = p.to(x_c.dtype)
    if ROWS_M:
        x_t = tl.trans(x_c)
        acc_c = _dot_acc(x_t, p_hi, acc_c, DOT_FP32)
        if P_SPLIT and not DOT_FP32:
            acc_c = tl.dot(x_t, (p - p_hi.to(tl.float32)).to(x_c.dtype), acc_c)
    else:
        acc_c = _dot_acc(p_hi, x_c, acc_c, DOT_FP32)
        if P_SPLIT and not DOT_FP32:
            acc_c = tl.dot((p - p_hi.to(tl.float32)).to(x_c.dtype), x_c, acc_c)
    return acc_c


@triton.jit
def _store_chunk(acc_c, inv_l, has, C: tl.constexpr, heads, h_ok, pid_s, pid_bn, H, sink_f,
                 po_ptr, out_ptr, FINAL: tl.constexpr):
    """Write dims ``[64 C, 64 C + 64)`` of the normalised output (FINAL: q dtype, times the
    sink factor) or of the fp32 partial output."""
    dv = tl.arange(0, CH) + C * CH
    o = tl.where(has[:, None], acc_c * inv_l[:, None], 0.0)
    if FINAL:
        orow = pid_bn.to(tl.int64) * H + heads
        tl.store(out_ptr + orow[:, None] * 512 + dv[None, :],
                 (o * sink_f[:, None]).to(out_ptr.dtype.element_ty), mask=h_ok[:, None])
    else:
        prow = (pid_s.to(tl.int64) * tl.num_programs(2) + pid_bn) * H + heads
        tl.store(po_ptr + prow[:, None] * 512 + dv[None, :], o, mask=h_ok[:, None])


@triton.jit
def _sparse_mla_split_kernel(
    q_ptr,            # [B, N, H, D_qk] q dtype, strides sq_*; last dim contiguous
    kv_ptr,           # latent: [num_pages, P, D_qk] cache dtype; fp8: the cache as uint8 bytes
    kv16_ptr,         # fp8: the same bytes viewed as int16 (bf16 rope bits); latent: unused
    kv32_ptr,         # fp8_ds_mla: the same bytes viewed as float32 (scales); else unused
    idx_ptr,          # [B, N, K] int32 slots (or logical positions with HAS_BT), strides si_*
    bt_ptr,           # [B, max_pages] int32 block table (HAS_BT)
    tkl_ptr,          # [B] int32 topk_length (HAS_TKL)
    sink_ptr,         # [H] float32 attention sink (HAS_SINK, FINAL only)
    po_ptr,           # [S, B*N, H, 512] float32 partial out (not FINAL)
    pl_ptr,           # [S, B*N, H] float32 partial LSE, log2 domain (not FINAL)
    out_ptr,          # [B, N, H, 512] q dtype (FINAL)
    lse_ptr,          # [B, N, H] float32 natural-log LSE (FINAL)
    sq_b, sq_n, sq_h, si_b, si_n, sbt_b, stride_page, stride_tok,
    N, H, K, num_slots, num_pages, max_pages, page_size, page_bytes, chunk, qk_scale_log2,
    KV_FORMAT: tl.constexpr, D_QK: tl.constexpr, D_V: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
    HAS_BT: tl.constexpr, HAS_TKL: tl.constexpr, HAS_SINK: tl.constexpr, FINAL: tl.constexpr,
    DOT_DTYPE: tl.constexpr, ROPE_DTYPE: tl.constexpr, DOT_FP32: tl.constexpr,
    ROWS_M: tl.constexpr = False,
):
    # ROWS_M (config kernel "triton_rows"): the transposed products, the BLOCK_K gathered rows on
    # the dots' M axis and the heads on N (scores [BLOCK_K, BLOCK_H], accumulators [64,
    # BLOCK_H]: kernels/sparse_mla/gluon_small.py's orientation); the same values
    tl.static_assert(D_V == 512, "D_v must be 512 (8 chunks of 64)")
    tl.static_assert((D_QK == 576) | (D_QK == 512), "D_qk must be 576 or 512")
    TAIL: tl.constexpr = D_QK == 576                 # a 9th chunk (rope dims 512..575) in q.k only
    # fp8 formats with 16-bit dots: fp16 nope tiles (scale folded in, shifted per tile), q nope
    # scaled per head by a power of two into fp16; the bf16 rope chunk in its own dtype.
    SHIFTED: tl.constexpr = (KV_FORMAT != 0) & (not DOT_FP32)
    ROPE_C: tl.constexpr = 8 if KV_FORMAT == 1 else 7  # the rope chunk (fp8 formats)
    P_SPLIT: tl.constexpr = DOT_DTYPE == tl.bfloat16   # bf16 value dots: p + its residual
    R_SPLIT: tl.constexpr = ROPE_DTYPE == tl.bfloat16  # model1's rope is part of V
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_bn = tl.program_id(2)
    b = pid_bn // N
    n = pid_bn % N

    heads = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)               # [BLOCK_H]
    h_ok = heads < H
    dq = tl.arange(0, CH)
    q_row = q_ptr + b.to(tl.int64) * sq_b + n * sq_n + heads[:, None] * sq_h + dq[None, :]
    qm = h_ok[:, None]
    # q in 64-dim chunks, loaded once ([BLOCK_H, 64] each)
    f0 = tl.load(q_row + 0 * CH, mask=qm, other=0.0).to(tl.float32)
    f1 = tl.load(q_row + 1 * CH, mask=qm, other=0.0).to(tl.float32)
    f2 = tl.load(q_row + 2 * CH, mask=qm, other=0.0).to(tl.float32)
    f3 = tl.load(q_row + 3 * CH, mask=qm, other=0.0).to(tl.float32)
    f4 = tl.load(q_row + 4 * CH, mask=qm, other=0.0).to(tl.float32)
    f5 = tl.load(q_row + 5 * CH, mask=qm, other=0.0).to(tl.float32)
    f6 = tl.load(q_row + 6 * CH, mask=qm, other=0.0).to(tl.float32)
    f7 = tl.load(q_row + 7 * CH, mask=qm, other=0.0).to(tl.float32)
    if TAIL:
        f8 = tl.load(q_row + 8 * CH, mask=qm, other=0.0).to(tl.float32)
    else:
        f8 = f7
    q_inv = tl.full([BLOCK_H], 1.0, tl.float32)     # 1 / the per-head q scale (SHIFTED)
    if SHIFTED:
        # per head, a power of two 2^t that puts max|q_nope| in [2^14, 2^15): bf16 q (8 bits)
        # is then exact in fp16 for every element >= max * 2^-31; 0 / inf / NaN heads keep
        # their values' meaning (t clamped; NaN and inf survive any power-of-two scaling)
        am = tl.maximum(tl.maximum(tl.max(tl.abs(f0), axis=1), tl.max(tl.abs(f1), axis=1)),
                        tl.maximum(tl.max(tl.abs(f2), axis=1), tl.max(tl.abs(f3), axis=1)))
        am = tl.maximum(am, tl.maximum(tl.maximum(tl.max(tl.abs(f4), axis=1),
                                                  tl.max(tl.abs(f5), axis=1)),
                                       tl.max(tl.abs(f6), axis=1)))
        if KV_FORMAT == 1:
            am = tl.maximum(am, tl.max(tl.abs(f7), axis=1))
        am = tl.where(am != am, float("inf"), am)             # NaN head: like inf (t = -113)
        qb = tl.minimum(tl.maximum(268 - _exp_field(am), 1), 253)   # biased exponent of 2^t
        q_sc = _pow2(qb)
        q_inv = _pow2(254 - qb)
        q0 = (f0 * q_sc[:, None]).to(tl.float16)
        q1 = (f1 * q_sc[:, None]).to(tl.float16)
        q2 = (f2 * q_sc[:, None]).to(tl.float16)
        q3 = (f3 * q_sc[:, None]).to(tl.float16)
        q4 = (f4 * q_sc[:, None]).to(tl.float16)
        q5 = (f5 * q_sc[:, None]).to(tl.float16)
        q6 = (f6 * q_sc[:, None]).to(tl.float16)
        if KV_FORMAT == 1:
            q7 = (f7 * q_sc[:, None]).to(tl.float16)
            q8 = f8.to(ROPE_DTYPE)
        else:
            q7 = f7.to(ROPE_DTYPE)
            q8 = q7
    else:
        q0 = f0.to(DOT_DTYPE)
        q1 = f1.to(DOT_DTYPE)
        q2 = f2.to(DOT_DTYPE)
        q3 = f3.to(DOT_DTYPE)
        q4 = f4.to(DOT_DTYPE)
        q5 = f5.to(DOT_DTYPE)
        q6 = f6.to(DOT_DTYPE)
        q7 = f7.to(DOT_DTYPE)
        q8 = f8.to(DOT_DTYPE)

    k_len = K
    if HAS_TKL:
        k_len = tl.maximum(tl.minimum(tl.load(tkl_ptr + b), K), 0)
    start = pid_s * chunk
    end = tl.minimum(start + chunk, k_len)

    m_i = tl.full([BLOCK_H], NEG_SENTINEL, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    # SHIFTED: the nope tiles and accumulators are in units of 2^(ub_i - 127), the largest unit
    # any row block of this program needed so far (it only grows, so rescaling the accumulators
    # never overflows); 1 until the first block with valid rows.
    ub_i = pid_h * 0 + 1
    HAX: tl.constexpr = 0 if ROWS_M else 1          # the score tile's row (top-k entry) axis
    if ROWS_M:
        zero = tl.zeros([CH, BLOCK_H], tl.float32)
    else:
        zero = tl.zeros([BLOCK_H, CH], tl.float32)
    a0, a1, a2, a3, a4, a5, a6, a7 = zero, zero, zero, zero, zero, zero, zero, zero
    # Software pipeline by hand (PREFETCH), three deep: while block i is computed, the rows of
    # block i + 1 are in flight (their slots known), the block-table entries of block i + 2 and
    # the indices of block i + 3, so no iteration stalls on a dependent chain of gathers. The
    # slots of block i + 2 are resolved at the end of the body and carried (Triton 3.6 fails in
    # TritonGPURemoveLayoutConversions when the raw entries are carried instead).
    idx_row = idx_ptr + b.to(tl.int64) * si_b + n * si_n
    bt_row = bt_ptr + b.to(tl.int64) * sbt_b
    ar = tl.arange(0, BLOCK_K)
    if PREFETCH:
        in0 = start + ar < end
        i0 = tl.load(idx_row + start + ar, mask=in0, other=-1)
        in1 = start + BLOCK_K + ar < end
        i1 = tl.load(idx_row + start + BLOCK_K + ar, mask=in1, other=-1)
        in2 = start + 2 * BLOCK_K + ar < end
        i2 = tl.load(idx_row + start + 2 * BLOCK_K + ar, mask=in2, other=-1)
        slot, ok = _resolve(i0, _page_entries(bt_row, i0, in0, max_pages, page_size, HAS_BT), in0,
                            num_slots, num_pages, max_pages, page_size, HAS_BT)
        s1, ok1 = _resolve(i1, _page_entries(bt_row, i1, in1, max_pages, page_size, HAS_BT), in1,
                           num_slots, num_pages, max_pages, page_size, HAS_BT)
        r0, r1, r2, r3, r4, r5, r6, r7, r8, c0, c1, c2, c3, c4, c5, c6, c7 = _issue_rows(
            kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok, page_bytes, page_size,
            BLOCK_K, KV_FORMAT, TAIL)
    for k0 in range(start, end, BLOCK_K):
        if PREFETCH:
            ok_cur = ok
            slot, ok = s1, ok1
            n0, n1, n2, n3, n4, n5, n6, n7, n8, d0, d1, d2, d3, d4, d5, d6, d7 = _issue_rows(
                kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok, page_bytes,
                page_size, BLOCK_K, KV_FORMAT, TAIL)
            in2 = k0 + 2 * BLOCK_K + ar < end
            e2 = _page_entries(bt_row, i2, in2, max_pages, page_size, HAS_BT)
            in3 = k0 + 3 * BLOCK_K + ar < end
            i3 = tl.load(idx_row + k0 + 3 * BLOCK_K + ar, mask=in3, other=-1)
        else:
            in0 = k0 + ar < end
            i0 = tl.load(idx_row + k0 + ar, mask=in0, other=-1)
            slot, ok_cur = _resolve(i0, _page_entries(bt_row, i0, in0, max_pages, page_size,
                                                      HAS_BT),
                                    in0, num_slots, num_pages, max_pages, page_size, HAS_BT)
            r0, r1, r2, r3, r4, r5, r6, r7, r8, c0, c1, c2, c3, c4, c5, c6, c7 = _issue_rows(
                kv_ptr, kv16_ptr, kv32_ptr, slot, ok_cur, stride_page, stride_tok, page_bytes,
                page_size, BLOCK_K, KV_FORMAT, TAIL)

        # each chunk converted once, read by both dots
        shift = 1.0
        ub = ub_i
        if SHIFTED:
            ub = tl.maximum(_tile_unit(ok_cur, c0, c1, c2, c3, c4, c5, c6, c7, KV_FORMAT), ub_i)
            shift = _pow2(254 - ub)
        x0 = _nope_tile(r0, c0, shift, 0, KV_FORMAT, DOT_DTYPE, SHIFTED)
        x1 = _nope_tile(r1, c1, shift, 1, KV_FORMAT, DOT_DTYPE, SHIFTED)
        x2 = _nope_tile(r2, c2, shift, 2, KV_FORMAT, DOT_DTYPE, SHIFTED)
        x3 = _nope_tile(r3, c3, shift, 3, KV_FORMAT, DOT_DTYPE, SHIFTED)
        x4 = _nope_tile(r4, c4, shift, 4, KV_FORMAT, DOT_DTYPE, SHIFTED)
        x5 = _nope_tile(r5, c5, shift, 5, KV_FORMAT, DOT_DTYPE, SHIFTED)
        x6 = _nope_tile(r6, c6, shift, 6, KV_FORMAT, DOT_DTYPE, SHIFTED)
        if SHIFTED and (ROPE_C == 7):
            x7 = _chunk_val(r7, 7, KV_FORMAT, ROPE_DTYPE)
        else:
            x7 = _nope_tile(r7, c7, shift, 7, KV_FORMAT, DOT_DTYPE, SHIFTED)
        if TAIL:
            x8 = _chunk_val(r8, 8, KV_FORMAT, ROPE_DTYPE if SHIFTED else DOT_DTYPE)

        # scores: the nope dots, unshifted (tile and per-head q scales), then the rope dot
        if ROWS_M:
            s = tl.zeros([BLOCK_K, BLOCK_H], tl.float32)
        else:
            s = tl.zeros([BLOCK_H, BLOCK_K], tl.float32)
        s = _qk(s, q0, x0, DOT_FP32, ROWS_M)
        s = _qk(s, q1, x1, DOT_FP32, ROWS_M)
        s = _qk(s, q2, x2, DOT_FP32, ROWS_M)
        s = _qk(s, q3, x3, DOT_FP32, ROWS_M)
        s = _qk(s, q4, x4, DOT_FP32, ROWS_M)
        s = _qk(s, q5, x5, DOT_FP32, ROWS_M)
        s = _qk(s, q6, x6, DOT_FP32, ROWS_M)
        if SHIFTED:
            if ROPE_C == 8:
                s = _qk(s, q7, x7, DOT_FP32, ROWS_M)
                s = s * _heads(q_inv * _pow2(ub), ROWS_M)
                s = _qk(s, q8, x8, DOT_FP32, ROWS_M)
            else:
                s = s * _heads(q_inv * _pow2(ub), ROWS_M)
                s = _qk(s, q7, x7, DOT_FP32, ROWS_M)
        else:
            s = _qk(s, q7, x7, DOT_FP32, ROWS_M)
            if TAIL:
                s = _qk(s, q8, x8, DOT_FP32, ROWS_M)
        # online softmax in the exp2 domain; invalid entries get p = 0 (never NaN)
        s = tl.where(_rows(ok_cur, ROWS_M), s * qk_scale_log2, NEG_SENTINEL)
        m_new = tl.maximum(m_i, tl.max(s, axis=HAX))
        alpha = tl.exp2(m_i - m_new)
        p = tl.where(_rows(ok_cur, ROWS_M), tl.exp2(s - _heads(m_new, ROWS_M)), 0.0)
        l_i = l_i * alpha + tl.sum(p, axis=HAX)
        m_i = m_new
        an = alpha
        if SHIFTED:
            # the nope accumulators move to the new unit (a factor <= 1: ub >= ub_i)
            an = alpha * _pow2(tl.maximum(ub_i - ub + 127, 1))
            ub_i = ub

        # acc += p . v over the 8 chunks of D_v (the value tile is the first 512 latent dims)
        a0 = _pv(a0, an, p, x0, P_SPLIT, DOT_FP32, ROWS_M)
        a1 = _pv(a1, an, p, x1, P_SPLIT, DOT_FP32, ROWS_M)
        a2 = _pv(a2, an, p, x2, P_SPLIT, DOT_FP32, ROWS_M)
        a3 = _pv(a3, an, p, x3, P_SPLIT, DOT_FP32, ROWS_M)
        a4 = _pv(a4, an, p, x4, P_SPLIT, DOT_FP32, ROWS_M)
        a5 = _pv(a5, an, p, x5, P_SPLIT, DOT_FP32, ROWS_M)
        a6 = _pv(a6, an, p, x6, P_SPLIT, DOT_FP32, ROWS_M)
        if SHIFTED and (ROPE_C == 7):
            a7 = _pv(a7, alpha, p, x7, R_SPLIT, DOT_FP32, ROWS_M)  # bf16 rope values, true units
        else:
            a7 = _pv(a7, an, p, x7, P_SPLIT, DOT_FP32, ROWS_M)
        if PREFETCH:        # rotate the pipeline
            r0, r1, r2, r3, r4, r5, r6, r7, r8 = n0, n1, n2, n3, n4, n5, n6, n7, n8
            c0, c1, c2, c3, c4, c5, c6, c7 = d0, d1, d2, d3, d4, d5, d6, d7
            s1, ok1 = _resolve(i2, e2, in2, num_slots, num_pages, max_pages, page_size, HAS_BT)
            i2 = i3

    # Empty iff nothing was summed (l == 0); a NaN sum (NaN in q or a selected row) propagates
    # to out and lse as in the reference instead of reading as an empty row.
    has = l_i != 0.0
    l_safe = tl.where(has, l_i, 1.0)
    inv_l = 1.0 / l_safe
    inv_n = inv_l
    if SHIFTED:
        inv_n = inv_l * _pow2(ub_i)              # the nope accumulators back to true units
    lse2 = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))    # [BLOCK_H], log2 domain
    sink_f = tl.full([BLOCK_H], 1.0, tl.float32)
    if FINAL:
        lse = lse2 * LN2
        if HAS_SINK:
            sink = _finite_sink(tl.load(sink_ptr + heads, mask=h_ok, other=0.0))
            sink_f = 1.0 / (1.0 + tl.exp(sink - lse))              # lse=-inf -> factor 0
        tl.store(lse_ptr + pid_bn.to(tl.int64) * H + heads, lse, mask=h_ok)
    else:
        tl.store(pl_ptr + (pid_s.to(tl.int64) * tl.num_programs(2) + pid_bn) * H + heads, lse2,
                 mask=h_ok)
    if ROWS_M:                                   # the accumulators heads-first for the stores
        a0, a1, a2, a3 = tl.trans(a0), tl.trans(a1), tl.trans(a2), tl.trans(a3)
        a4, a5, a6, a7 = tl.trans(a4), tl.trans(a5), tl.trans(a6), tl.trans(a7)
    _store_chunk(a0, inv_n, has, 0, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a1, inv_n, has, 1, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a2, inv_n, has, 2, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a3, inv_n, has, 3, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a4, inv_n, has, 4, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a5, inv_n, has, 5, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a6, inv_n, has, 6, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    if SHIFTED and (ROPE_C == 7):
        _store_chunk(a7, inv_l, has, 7, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr,
                     FINAL)
    else:
        _store_chunk(a7, inv_n, has, 7, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr,
                     FINAL)


@triton.jit
def _sparse_mla_combine_kernel(
    po_ptr,           # [S, B*N, H, D_V] float32 partial out (normalised per split)
    pl_ptr,           # [S, B*N, H] float32 partial LSE, log2 domain (-inf = empty split)
    sink_ptr,         # [H] float32 (HAS_SINK)
    out_ptr,          # [B*N, H, D_V] q dtype
    lse_ptr,          # [B, N, H] float32 natural-log LSE at strides (lse_sb, lse_sn, lse_sh)
    S, BN, H,
    N,                # drafts per request (BN = B * N)
    lse_sb, lse_sn, lse_sh,
    empty_lse,        # float32 stored for a row with no valid entry (-inf; FlashMLA's +inf)
    D_V: tl.constexpr, S_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, HAS_SINK: tl.constexpr,
):
    """One (head, request x draft, column block) per program: the splits are read as one
    ``[S_BLOCK, BLOCK_C]`` tile (all of them at once when S <= S_BLOCK), so a program has every
    partial it needs in flight together instead of one dependent load per split. The sums over
    the splits are tree reductions in a fixed order: bitwise repeatable."""
    h = tl.program_id(0)
    pid_bn = tl.program_id(1)
    pid_c = tl.program_id(2)
    sp = tl.arange(0, S_BLOCK)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < D_V

    m = tl.full([S_BLOCK], float("-inf"), tl.float32)
    nan = tl.zeros([S_BLOCK], tl.int32)
    for s0 in range(0, S, S_BLOCK):
        s = s0 + sp
        ls = tl.load(pl_ptr + (s * BN + pid_bn).to(tl.int64) * H + h, mask=s < S, other=float("-inf"))
        m = tl.maximum(m, ls)
        nan |= (ls != ls).to(tl.int32)
    m = tl.max(tl.where(m == m, m, float("-inf")), axis=0)      # NaN is counted in `nan`
    # a NaN partial (NaN in q or a selected row) makes the row NaN, as in the reference
    has = (m > float("-inf")) | (tl.max(nan, axis=0) != 0)
    m_safe = tl.where(m > float("-inf"), m, 0.0)
    den = tl.zeros([S_BLOCK], tl.float32)
    acc = tl.zeros([S_BLOCK, BLOCK_C], tl.float32)
    for s0 in range(0, S, S_BLOCK):
        s = s0 + sp
        s_ok = s < S
        row = (s * BN + pid_bn).to(tl.int64) * H + h
        w = tl.exp2(tl.load(pl_ptr + row, mask=s_ok, other=float("-inf")) - m_safe)   # -inf -> 0
        po = tl.load(po_ptr + row[:, None] * D_V + cols[None, :], mask=s_ok[:, None] & c_ok[None, :],
                     other=0.0)
        den += w
        acc += w[:, None] * po
    den_t = tl.sum(den, axis=0)
    den_safe = tl.where(has, den_t, 1.0)
    o = tl.where(has, tl.sum(acc, axis=0) / den_safe, 0.0)
    lse = tl.where(has, (m_safe + tl.log2(den_safe)) * LN2, float("-inf"))
    if HAS_SINK:
        sink = _finite_sink(tl.load(sink_ptr + h))
        o = o * (1.0 / (1.0 + tl.exp(sink - lse)))
    orow = pid_bn.to(tl.int64) * H + h
    tl.store(out_ptr + orow * D_V + cols, o.to(out_ptr.dtype.element_ty), mask=c_ok)
    if pid_c == 0:
        b = pid_bn // N
        lrow = b.to(tl.int64) * lse_sb + (pid_bn - b * N).to(tl.int64) * lse_sn + h * lse_sh
        tl.store(lse_ptr + lrow, tl.where(has, lse, empty_lse))
