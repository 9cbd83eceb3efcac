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
  ``BLOCK_K``). The split count comes from ``kernels.configs.sparse_mla_num_splits``: enough
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
  converted in registers, never into a separate dequantized copy. Row starts are multiples of
  16 bytes (656 = 16 x 41, 576 = 16 x 36) and the masks are constant along a row, so chunks load
  as 16-byte vectors.
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

The launcher (validation, config choice, custom-op registration) is ``torch_impl/sparse_mla.py``.
"""
from __future__ import annotations

import triton
import triton.language as tl

# kv_format codes (constexpr KV_FORMAT)
LATENT, FP8_DS_MLA, FP8_MODEL1 = 0, 1, 2
KV_FORMAT_CODES = {"latent": LATENT, "fp8_ds_mla": FP8_DS_MLA, "fp8_model1": FP8_MODEL1}

# fp8_ds_mla: 656 bytes per token = 512 e4m3 | 4 float32 scales | 64 bf16 rope
DS_MLA_BYTES, DS_MLA_NOPE, DS_MLA_TILE = 656, 512, 128
# fp8_model1: per page P data rows of 576 bytes (448 e4m3 | 64 bf16), then P scale rows of 8 bytes
MODEL1_DATA_BYTES, MODEL1_NOPE, MODEL1_TILE, MODEL1_SCALE_BYTES = 576, 448, 64, 8

NEG_SENTINEL = tl.constexpr(-1.0e30)  # finite running-max start; exp2(NEG - real) == 0 exactly
LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _dot(a, b, DOT_FP32: tl.constexpr):
    """``a @ b`` with fp32 accumulation; IEEE fp32 products when the operands are fp32."""
    if DOT_FP32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


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
    elif KV_FORMAT == 1:    # fp8_ds_mla uint8 [num_slots, 656]: 512 e4m3 | 4 f32 scales | 64 bf16
        if C < 8:
            x8 = tl.load(kv_ptr + (slot * 656 + C * CH)[:, None] + d[None, :], mask=m, other=0)
            sc = tl.load(kv32_ptr + slot * 164 + (128 + C // 2), mask=ok, other=0.0)
            return x8, sc
        else:
            r = tl.load(kv16_ptr + (slot * 328 + 264)[:, None] + d[None, :], mask=m, other=0)
            return r, one
    else:                   # fp8_model1: per page P rows of 448 e4m3 | 64 bf16, then P x 8 ue8m0
        page = slot // page_size
        off = slot % page_size
        data = page * page_bytes + off * 576
        if C < 7:
            x8 = tl.load(kv_ptr + (data + C * CH)[:, None] + d[None, :], mask=m, other=0)
            e = tl.load(kv_ptr + page * page_bytes + page_size * 576 + off * 8 + C, mask=ok,
                        other=127)
            return x8, (e.to(tl.int32) << 23).to(tl.float32, bitcast=True)   # 2^(e-127)
        else:
            r = tl.load(kv16_ptr + (data // 2 + 224)[:, None] + d[None, :], mask=m, other=0)
            return r, one


@triton.jit
def _chunk_val(raw, C: tl.constexpr, KV_FORMAT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Chunk ``C`` as loaded by :func:`_chunk_raw` -> values in ``DOT_DTYPE`` (exact: e4m3 and
    bf16 rope fit bf16 / fp16)."""
    if KV_FORMAT == 0:
        return raw.to(DOT_DTYPE)
    elif (KV_FORMAT == 1 and C < 8) or (KV_FORMAT == 2 and C < 7):
        return raw.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)
    else:
        return _bf16_bits_to_f32(raw).to(DOT_DTYPE)


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
def _qk(s, q_c, x_c, sc_c, SCALED: tl.constexpr, DOT_FP32: tl.constexpr):
    """``s + (q_c . x_c^T) * sc_c`` over one chunk: ``[BLOCK_H, BLOCK_K]`` fp32. The chunk's
    per-row scale multiplies the fp32 partial dot (exactly the dequantized product for the
    power-of-two scales of the fp8 formats)."""
    if SCALED:
        return s + _dot(q_c, tl.trans(x_c), DOT_FP32) * sc_c[None, :]
    else:
        if DOT_FP32:
            return tl.dot(q_c, tl.trans(x_c), s, input_precision="ieee")
        else:
            return tl.dot(q_c, tl.trans(x_c), s)


@triton.jit
def _pv(acc_c, alpha, p, x_c, sc_c, SCALED: tl.constexpr, DOT_DTYPE: tl.constexpr,
        DOT_FP32: tl.constexpr):
    """``acc_c * alpha + (p * sc_c) . x_c`` over one chunk of D_v: the chunk's scale folds into
    p (``[BLOCK_H, BLOCK_K]``) instead of the value tile (``[BLOCK_K, 64]``)."""
    if SCALED:
        p = p * sc_c[None, :]
    acc_c = acc_c * alpha[:, None]
    p_hi = p.to(DOT_DTYPE)
    if DOT_FP32:
        return tl.dot(p_hi, x_c, acc_c, input_precision="ieee")
    acc_c = tl.dot(p_hi, x_c, acc_c)
    if DOT_DTYPE == tl.bfloat16:
        # bf16 keeps 8 bits of p: a flat softmax over K rows then misses the SPEC bound
        # (abs 1e-3 / rel 2^-6) by up to 1.3x (seen on the H200). A second dot with the
        # rounding residual makes p effectively 16 bits; x_c is exact in bf16 already.
        acc_c = tl.dot((p - p_hi.to(tl.float32)).to(DOT_DTYPE), x_c, acc_c)
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
    DOT_DTYPE: tl.constexpr, DOT_FP32: tl.constexpr,
):
    tl.static_assert(D_V == 512, "D_v must be 512 (8 chunks of 64)")
    tl.static_assert((D_QK == 576) | (D_QK == 512), "D_qk must be 576 or 512")
    TAIL: tl.constexpr = D_QK == 576                 # a 9th chunk (rope dims 512..575) in q.k only
    S7: tl.constexpr = KV_FORMAT != 0                # chunks 0..6 carry a scale in both fp8 formats
    S8: tl.constexpr = KV_FORMAT == 1                # chunk 7: e4m3 in fp8_ds_mla, rope in model1
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
    # q in 64-dim chunks, loaded once ([BLOCK_H, 64] each; staged in shared memory by the dots)
    q0 = tl.load(q_row + 0 * CH, mask=qm, other=0.0).to(DOT_DTYPE)
    q1 = tl.load(q_row + 1 * CH, mask=qm, other=0.0).to(DOT_DTYPE)
    q2 = tl.load(q_row + 2 * CH, mask=qm, other=0.0).to(DOT_DTYPE)
    q3 = tl.load(q_row + 3 * CH, mask=qm, other=0.0).to(DOT_DTYPE)
    q4 = tl.load(q_row + 4 * CH, mask=qm, other=0.0).to(DOT_DTYPE)
    q5 = tl.load(q_row + 5 * CH, mask=qm, other=0.0).to(DOT_DTYPE)
    q6 = tl.load(q_row + 6 * CH, mask=qm, other=0.0).to(DOT_DTYPE)
    q7 = tl.load(q_row + 7 * CH, mask=qm, other=0.0).to(DOT_DTYPE)
    if TAIL:
        q8 = tl.load(q_row + 8 * CH, mask=qm, other=0.0).to(DOT_DTYPE)

    k_len = K
    if HAS_TKL:
        k_len = tl.maximum(tl.minimum(tl.load(tkl_ptr + b), K), 0)
    start = pid_s * chunk
    end = tl.minimum(start + chunk, k_len)

    m_i = tl.full([BLOCK_H], NEG_SENTINEL, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    a0 = tl.zeros([BLOCK_H, CH], tl.float32)
    a1 = tl.zeros([BLOCK_H, CH], tl.float32)
    a2 = tl.zeros([BLOCK_H, CH], tl.float32)
    a3 = tl.zeros([BLOCK_H, CH], tl.float32)
    a4 = tl.zeros([BLOCK_H, CH], tl.float32)
    a5 = tl.zeros([BLOCK_H, CH], tl.float32)
    a6 = tl.zeros([BLOCK_H, CH], tl.float32)
    a7 = tl.zeros([BLOCK_H, CH], tl.float32)
    # Software pipeline by hand, three deep: while block i is computed, the rows of block
    # i + 1 are in flight (their slots known), the block-table entries of block i + 2 and the
    # indices of block i + 3. Each load waits on values that arrived an iteration earlier, so
    # no iteration stalls on a dependent chain of gathers (the dots need the rows converted
    # first, which Triton's own pipeliner does not turn into async copies). The slots of
    # block i + 2 are resolved at the end of the body, behind the dots, and carried (Triton
    # 3.6 fails in TritonGPURemoveLayoutConversions when the raw entries are carried instead).
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
            # block i + 1: slots from the entries loaded last iteration; issue its rows
            slot, ok = s1, ok1
            n0, n1, n2, n3, n4, n5, n6, n7, n8, d0, d1, d2, d3, d4, d5, d6, d7 = _issue_rows(
                kv_ptr, kv16_ptr, kv32_ptr, slot, ok, stride_page, stride_tok, page_bytes,
                page_size, BLOCK_K, KV_FORMAT, TAIL)
            # block i + 2: page entries; block i + 3: indices
            in2 = k0 + 2 * BLOCK_K + ar < end
            e2 = _page_entries(bt_row, i2, in2, max_pages, page_size, HAS_BT)
            in3 = k0 + 3 * BLOCK_K + ar < end
            i3 = tl.load(idx_row + k0 + 3 * BLOCK_K + ar, mask=in3, other=-1)
        else:
            # this block's loads, all issued back to back before any conversion or dot
            in0 = k0 + ar < end
            i0 = tl.load(idx_row + k0 + ar, mask=in0, other=-1)
            slot, ok_cur = _resolve(i0, _page_entries(bt_row, i0, in0, max_pages, page_size,
                                                      HAS_BT),
                                    in0, num_slots, num_pages, max_pages, page_size, HAS_BT)
            r0, r1, r2, r3, r4, r5, r6, r7, r8, c0, c1, c2, c3, c4, c5, c6, c7 = _issue_rows(
                kv_ptr, kv16_ptr, kv32_ptr, slot, ok_cur, stride_page, stride_tok, page_bytes,
                page_size, BLOCK_K, KV_FORMAT, TAIL)

        # scores s = q . k over the chunks, each chunk's scale applied to its fp32 partial dot
        s = tl.zeros([BLOCK_H, BLOCK_K], tl.float32)
        s = _qk(s, q0, _chunk_val(r0, 0, KV_FORMAT, DOT_DTYPE), c0, S7, DOT_FP32)
        s = _qk(s, q1, _chunk_val(r1, 1, KV_FORMAT, DOT_DTYPE), c1, S7, DOT_FP32)
        s = _qk(s, q2, _chunk_val(r2, 2, KV_FORMAT, DOT_DTYPE), c2, S7, DOT_FP32)
        s = _qk(s, q3, _chunk_val(r3, 3, KV_FORMAT, DOT_DTYPE), c3, S7, DOT_FP32)
        s = _qk(s, q4, _chunk_val(r4, 4, KV_FORMAT, DOT_DTYPE), c4, S7, DOT_FP32)
        s = _qk(s, q5, _chunk_val(r5, 5, KV_FORMAT, DOT_DTYPE), c5, S7, DOT_FP32)
        s = _qk(s, q6, _chunk_val(r6, 6, KV_FORMAT, DOT_DTYPE), c6, S7, DOT_FP32)
        s = _qk(s, q7, _chunk_val(r7, 7, KV_FORMAT, DOT_DTYPE), c7, S8, DOT_FP32)
        if TAIL:
            s = _qk(s, q8, _chunk_val(r8, 8, KV_FORMAT, DOT_DTYPE), c7, False, DOT_FP32)
        ok_blk = ok_cur
        # online softmax in the exp2 domain; invalid entries get p = 0 (never NaN)
        s = tl.where(ok_blk[None, :], s * qk_scale_log2, NEG_SENTINEL)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.where(ok_blk[None, :], tl.exp2(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

        # acc += p . v over the 8 chunks of D_v (the value tile is the first 512 latent dims)
        a0 = _pv(a0, alpha, p, _chunk_val(r0, 0, KV_FORMAT, DOT_DTYPE), c0, S7, DOT_DTYPE, DOT_FP32)
        a1 = _pv(a1, alpha, p, _chunk_val(r1, 1, KV_FORMAT, DOT_DTYPE), c1, S7, DOT_DTYPE, DOT_FP32)
        a2 = _pv(a2, alpha, p, _chunk_val(r2, 2, KV_FORMAT, DOT_DTYPE), c2, S7, DOT_DTYPE, DOT_FP32)
        a3 = _pv(a3, alpha, p, _chunk_val(r3, 3, KV_FORMAT, DOT_DTYPE), c3, S7, DOT_DTYPE, DOT_FP32)
        a4 = _pv(a4, alpha, p, _chunk_val(r4, 4, KV_FORMAT, DOT_DTYPE), c4, S7, DOT_DTYPE, DOT_FP32)
        a5 = _pv(a5, alpha, p, _chunk_val(r5, 5, KV_FORMAT, DOT_DTYPE), c5, S7, DOT_DTYPE, DOT_FP32)
        a6 = _pv(a6, alpha, p, _chunk_val(r6, 6, KV_FORMAT, DOT_DTYPE), c6, S7, DOT_DTYPE, DOT_FP32)
        a7 = _pv(a7, alpha, p, _chunk_val(r7, 7, KV_FORMAT, DOT_DTYPE), c7, S8, DOT_DTYPE, DOT_FP32)
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
    lse2 = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))    # [BLOCK_H], log2 domain
    sink_f = tl.full([BLOCK_H], 1.0, tl.float32)
    if FINAL:
        lse = lse2 * LN2
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=h_ok, other=0.0)
            sink_f = 1.0 / (1.0 + tl.exp(sink - lse))              # lse=-inf -> factor 0
        tl.store(lse_ptr + pid_bn.to(tl.int64) * H + heads, lse, mask=h_ok)
    else:
        tl.store(pl_ptr + (pid_s.to(tl.int64) * tl.num_programs(2) + pid_bn) * H + heads, lse2,
                 mask=h_ok)
    _store_chunk(a0, inv_l, has, 0, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a1, inv_l, has, 1, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a2, inv_l, has, 2, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a3, inv_l, has, 3, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a4, inv_l, has, 4, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a5, inv_l, has, 5, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a6, inv_l, has, 6, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)
    _store_chunk(a7, inv_l, has, 7, heads, h_ok, pid_s, pid_bn, H, sink_f, po_ptr, out_ptr, FINAL)


@triton.jit
def _sparse_mla_combine_kernel(
    po_ptr,           # [S, B*N, H, D_V] float32 partial out (normalised per split)
    pl_ptr,           # [S, B*N, H] float32 partial LSE, log2 domain (-inf = empty split)
    sink_ptr,         # [H] float32 (HAS_SINK)
    out_ptr,          # [B*N, H, D_V] q dtype
    lse_ptr,          # [B*N, H] float32 natural-log LSE
    S, BN, H,
    D_V: tl.constexpr, D_V_PAD: tl.constexpr, BLOCK_H: tl.constexpr, HAS_SINK: tl.constexpr,
):
    pid_h = tl.program_id(0)
    pid_bn = tl.program_id(1)
    heads = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    dv = tl.arange(0, D_V_PAD)
    omask = h_ok[:, None] & (dv[None, :] < D_V)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    nan = tl.zeros([BLOCK_H], tl.int32)
    for s in range(0, S):
        row = (s * BN + pid_bn).to(tl.int64) * H + heads
        ls = tl.load(pl_ptr + row, mask=h_ok, other=float("-inf"))
        m = tl.maximum(m, ls)
        nan |= (ls != ls).to(tl.int32)
    # a NaN partial (NaN in q or a selected row) makes the row NaN, as in the reference
    has = (m > float("-inf")) | (nan != 0)
    m_safe = tl.where(m > float("-inf"), m, 0.0)
    den = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_V_PAD], tl.float32)
    for s in range(0, S):
        row = (s * BN + pid_bn).to(tl.int64) * H + heads
        w = tl.exp2(tl.load(pl_ptr + row, mask=h_ok, other=float("-inf")) - m_safe)  # -inf -> 0
        po = tl.load(po_ptr + row[:, None] * D_V + dv[None, :], mask=omask, other=0.0)
        den += w
        acc += w[:, None] * po
    den_safe = tl.where(has, den, 1.0)
    o = tl.where(has[:, None], acc / den_safe[:, None], 0.0)
    lse = tl.where(has, (m_safe + tl.log2(den_safe)) * LN2, float("-inf"))
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=h_ok, other=0.0)
        o = o * (1.0 / (1.0 + tl.exp(sink - lse)))[:, None]
    orow = pid_bn.to(tl.int64) * H + heads
    tl.store(out_ptr + orow[:, None] * D_V + dv[None, :], o.to(out_ptr.dtype.element_ty), mask=omask)
    tl.store(lse_ptr + orow, lse, mask=h_ok)
