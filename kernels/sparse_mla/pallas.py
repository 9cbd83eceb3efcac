"""Sparse MLA decode as Pallas kernels (Triton lowering): split-K over the top-k list, then an
LSE combine. The Pallas twin of ``kernels/sparse_mla/triton.py``; read the two side by side.

Semantics: ../docs/SPEC.md "Operation B" (FlashMLA ``flash_mla_with_kvcache`` sparse decode,
absorbed MLA in MQA form). The float64 definition is ``kernels.reference.sparse_mla_decode``.

Design (the same split-K structure, grid, chunking, loop and names as the Triton kernel)
-------------------------------------------------------------------------------------------
Work is a grid ``(head_blocks, splits, B * N)``:

* **Head block.** One program holds ``BLOCK_H`` query heads (all heads of the rank up to 64,
  padded to a power of two >= 16, the dot minimum; padded heads are masked in the q load and in
  every store, the caller never pads). Every gathered latent row is read once per head block.
* **Split-K.** A program walks ``chunk`` entries of the top-k list (a multiple of ``BLOCK_K``)
  with a ``lax.fori_loop`` whose trip count is dynamic (``topk_length``), which the Triton
  lowering turns into an ``scf.for``. The split count is
  ``kernels.sparse_mla.configs.sparse_mla_num_splits``.
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
  ``fp8_ds_mla`` rows ``[num_slots, 656]``: e4m3 bytes bitcast to ``float8_e4m3fn``, one
  float32 scale per 128 dims (assembled from its 4 little-endian bytes), rope from its bf16 byte
  pairs; ``fp8_model1`` ``[num_pages * R, 576]`` (a free reshape: a page is R = page bytes / 576
  rows of 576 bytes): data row of slot (page, off) is ``page * R + off``, its scale byte of group
  g sits in row ``page * R + P + off // 72`` at column ``(off % 72) * 8 + g``; ue8m0 byte e is
  ``2^(e - 127)`` (float32 bits ``e << 23``; 0 -> 2^-127, 255 -> NaN, as ml_dtypes).
* **64-dim chunks.** The latent is handled in chunks of 64 dims (:func:`_chunk_raw`,
  :func:`_chunk_val`): the 8 value chunks of D_v = 512 and, for D_qk = 576, a 9th rope chunk
  used in q.k only. Chunk c is ``[BLOCK_K, 64]``: latent dims ``[64 c, 64 c + 64)`` in the cache
  dtype, or e4m3 bytes, or (the rope: ``fp8_ds_mla`` chunk 8, ``fp8_model1`` chunk 7, a value
  chunk there) two stride-2 byte loads joined into bf16. Scale groups: ``fp8_ds_mla`` chunks
  ``2g, 2g + 1`` share float32 scale g, ``fp8_model1`` chunk c < 7 has ue8m0 scale c; latent and
  rope chunks have none (:func:`_scale_group`). q is loaded once as 8 or 9 ``[BLOCK_H, 64]``
  tiles; the accumulator is 8 separate ``[BLOCK_H, 64]`` fp32 tiles.
* **fp16 fast path** (fp8 formats with bf16 / fp16 q: :func:`_fast_q`, :func:`_fast_issue`,
  :func:`_fast_compute`; docs/SEMANTICS.md "fast-path numerics", the numerics of
  ``kernels/sparse_mla/triton.py``). Each e4m3 chunk is converted ONCE into an fp16 tile with
  its row's scale folded in, ``e4m3 * (scale * 2^-u)``, read by both dots; ``2^u`` is the
  program's running unit (largest valid scale exponent seen so far minus 6, so ``448 * 2^7``
  fits fp16; it only grows, the accumulators move to a new unit by an exact power of two <= 1,
  scores and the output are multiplied back in fp32). q's nope dims are scaled per head by the
  power of two that puts ``max|q_h|`` in [2^14, 2^15) and converted to fp16 (0 heads stay 0;
  inf / NaN heads stay inf / NaN); the rope runs in its own dot in q's dtype (bf16 on the GPU);
  p is fp16 (no residual dot), except fp8_model1's bf16 rope, a value chunk, which takes p in
  bf16 plus its residual. Scales outside the exact range (not powers of two, or 23+ binades below
  the running largest) take the same code: each tile value is rounded to fp16 (the written
  bound, tested by ``test_fast_path_numerics_outside_the_quantizer_range``); no host read, no
  variant. Loads are runs of whole bytes, no byte-wise loads: each e4m3 chunk ``[BLOCK_K, 64]``;
  the rope as one ``[BLOCK_K, 128]`` run split into its low / high bytes in registers
  (``reshape`` + ``unstack``: ``tt.reshape`` / ``tt.split``) and joined into 16-bit words that
  are bitcast to bf16 at equal width; the scales as one 32-byte run per row (fp8_ds_mla: the 4
  float32 words, assembled from bytes the same way; fp8_model1: the aligned window of 4 ue8m0
  scale rows holding the slot's), 32 bytes so that every thread copies >= 4 bytes and the
  pipeliner can make it an async copy. The loop carries no raw tile (the config's
  ``prefetch=False``; Triton's pipeliner overlaps the gathers, ``num_stages`` 2-3); each value
  chunk has its own accumulator, each dot's result is added to it (Triton's combine pass makes
  that the dot's accumulator). fp32 q and the ``latent`` format keep the path below.
* **Scales after the dots** (:func:`_qk`, :func:`_pv`, as the Triton kernel's): the chunk
  values enter the dots unscaled (e4m3 and bf16 rope are exact in bf16, e4m3 in fp16); the per-row
  scale of a group multiplies the group's fp32 partial score ``sum_c q_c . x_c^T`` (one multiply
  per pair of chunks for ``fp8_ds_mla``) and is folded into p for the value dots,
  ``acc_c = acc_c * alpha + (p * sc_g) . x_c`` (``p * sc_g`` formed once per group). For the
  power-of-two scales the fp8 writers produce this is the dequantized product exactly, and the
  scores never round a scaled value to the operand dtype (the previous Pallas kernel scaled the
  value tiles before the dots instead). Dots accumulate in fp32;
  operands are q's dtype (bf16 / fp16; fp8 dequantizes exactly into bf16), or fp32 with
  ``precision=HIGHEST`` (IEEE fp32 in the Triton lowering; DEFAULT would be TF32) for fp32 q
  or a latent cache whose dtype differs from q's. With bf16 operands p is split into hi + lo
  (its rounding residual) and both are dotted, so p keeps ~16 bits.
* **Hand-pipelined loads** (``PREFETCH``, the config's ``prefetch``). All loads of a row block
  (:func:`_issue_rows`: every raw chunk and scale) are issued before any conversion or dot, and
  the loop carries them: at iteration i the rows of block i + 1 are loaded (their slots known),
  the block-table entries of block i + 2 and the indices of block i + 3, then block i (loaded
  an iteration earlier) is converted and computed. The raw tiles, the validity mask, the entries
  and the indices are ``fori_loop`` carries, so no load waits on one issued in the same
  iteration. Loads past the end of the split are fully masked. Without ``PREFETCH`` each
  iteration issues its own block's loads, then computes; the same operations on the same
  values (bitwise equal results in interpret mode, ``test_prefetch_matches_plain_loop``).
  The Triton twin, restructured this way (chunks + hand pipeline), measured 1.5-1.9x faster
  than its previous layout on an H200 at H = 128 and on DSV4_FLASH; the Pallas kernel has not
  been timed on a GPU.
* **Softmax.** Online, exp2 domain (``sm_scale * log2(e)`` applied to the fp32 scores), with a
  finite running-max sentinel ``-1e30`` and masked probabilities forced to 0, so a block (or a
  whole row) without valid entries never produces NaN; an empty row ends with ``l = 0``:
  out 0, LSE -inf. A NaN in q or a selected row makes the row's ``l`` NaN: out and LSE NaN, as
  in the reference. Duplicated indices count once per occurrence.
* **Sink** (V4): ``out *= 1 / (1 + exp(sink_h - lse))`` where the final output is written.
* **Determinism.** No atomics; the combine loops over splits in a fixed order.
* **Configs.** ``kernels.sparse_mla.configs.PALLAS_SPARSE_MLA_SPACE`` (the Triton stack's
  ``SparseMLAConfig``, without a D_v split). Shared memory is about the q tiles plus one block
  of converted row chunks, ``(BLOCK_H + BLOCK_K) x D_qk x 2`` bytes for bf16 operands (``32 x
  32``: 73,728 B, so it fits the 99 KiB class; ``64 x 32``: 110,720 B does not); fp32 dots use
  ``PALLAS_SPARSE_MLA_FP32``. The fast path's tiles on sm_90 (``PALLAS_W64`` 64 x 32, 8 warps,
  three pipeline stages; ``PALLAS_N16P`` 16 x 32, 4 warps, hand-pipelined loads; ``PALLAS_W32``)
  are chosen by ``kernels.configs.pallas_sparse_mla_heuristic`` from the H200 sweep; their
  registers, spills and SASS per iteration are in bench/NOTES.md ("Sparse MLA, Pallas",
  ``python -m bench.pallas_aot_counts``). Shared memory of every entry is measured by lowering
  for CUDA and compiling the Triton IR for sm_90 and sm_120 without a GPU
  (``tests/test_jax_sparse_mla.py::test_aot_compile_fits_smem``).

What the Pallas-Triton lowering cannot express, relative to the raw Triton kernel
--------------------------------------------------------------------------------
* **No reinterpreting views of a buffer.** Triton casts the byte pointer to ``int16*`` /
  ``float32*`` and loads rope and scales directly; Pallas refs keep their dtype, so the fp8
  formats load runs of bytes and assemble bf16 / float32 values in registers (the fast path:
  reshape + split + shifts + an equal-width bitcast; the fp32-q path: two strided byte loads
  per rope chunk, four bytes per ``fp8_ds_mla`` scale). A bitcast view made in XLA is a copy
  of the whole cache (a fused shift-and-or loop on the CPU backend; XLA's bitcast-convert of
  another width is not a view).
* **Offsets.** The lowering picks 32-bit element offsets for arrays up to 2^32 bytes; the
  launcher module (``kernels/_pallas_call.py``) widens them to 64-bit for arrays of
  2^31 or more elements (2-4 GiB uint8 caches), which otherwise wrapped.
* **No static slicing of values** (``lax.slice`` has no Triton lowering), so every chunk is its
  own load (which the chunked design wants anyway) and q is loaded chunk by chunk.
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

from kernels._pallas_call import triton_call
from kernels.layouts import FP8_DS_MLA as _DS, FP8_MODEL1 as _M1
from kernels.sparse_mla.configs import sparse_mla_combine_tile

# kv_format codes (static KV_FORMAT), as in kernels/sparse_mla/triton.py
LATENT, FP8_DS_MLA, FP8_MODEL1 = 0, 1, 2
KV_FORMAT_CODES = {"latent": LATENT, "fp8_ds_mla": FP8_DS_MLA, "fp8_model1": FP8_MODEL1}

# Byte layouts (kernels.layouts). fp8_ds_mla: 656 bytes per token = 512 e4m3 | 4 float32
# scales | 64 bf16 rope
DS_MLA_BYTES, DS_MLA_NOPE, DS_MLA_TILE = _DS.data.nbytes, _DS.field("nope").count, _DS.tile
DS_MLA_SCALE_OFFSET = _DS.field("scale").offset    # 512
DS_MLA_ROPE_OFFSET = _DS.field("rope").offset      # 528
# fp8_model1: per page P data rows of 576 bytes (448 e4m3 | 64 bf16), then P scale rows of 8 bytes
MODEL1_DATA_BYTES, MODEL1_NOPE, MODEL1_TILE = _M1.data.nbytes, _M1.field("nope").count, _M1.tile
MODEL1_SCALE_BYTES = _M1.scale.nbytes
MODEL1_SCALES_PER_ROW = MODEL1_DATA_BYTES // MODEL1_SCALE_BYTES   # 72 scale rows per 576 bytes

MAIN = 512          # value width D_v (8 chunks)
TAIL = 64           # rope width of D_qk = 576 (a 9th chunk, q.k only)
CH = 64             # latent dims per chunk: one fp8_model1 scale group, half an fp8_ds_mla one
V_CHUNKS = MAIN // CH
NEG_SENTINEL = -1.0e30  # finite running-max start; exp2(NEG - real) == 0 exactly
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
F32_LOWEST = -3.4028234663852886e38     # the most negative finite float32


def _finite_sink(sink):
    """A sink of -inf as the most negative float32 (SPEC: factor 1 on a non-empty row, 0 instead
    of NaN on an empty one); NaN stays NaN."""
    return jnp.where(sink == -jnp.inf, F32_LOWEST, sink)


def _iota(n: int) -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, (n,), 0)


def _gather(ref, rows, col0: int, width: int, ok, *, stride: int = 1, interpret: bool):
    """``ref[rows[i], col0 + stride * j]`` as ``[BLOCK_K, width]``; rows with ``ok == False``
    read nothing and give 0. ``rows`` [BLOCK_K] int32 (already 0 where not ok)."""
    if interpret:
        cols = col0 + stride * _iota(width)
        return plgpu.load(ref.at[rows[:, None], cols[None, :]], mask=ok[:, None], other=0)
    return plgpu.load(ref.at[rows, pl.ds(col0, width, stride)], mask=ok[:, None], other=0)


def _scale_group(c: int, kv_format: int) -> int | None:
    """The scale group of chunk ``c`` (dims ``[64 c, 64 c + 64)``), None when it has no scale:
    ``fp8_ds_mla`` chunks 0..7 share one float32 scale per pair (128 dims), ``fp8_model1``
    chunks 0..6 have one ue8m0 scale each; the latent and the bf16 rope chunks have none."""
    if kv_format == FP8_DS_MLA and c < DS_MLA_NOPE // CH:
        return c // (DS_MLA_TILE // CH)
    if kv_format == FP8_MODEL1 and c < MODEL1_NOPE // CH:
        return c
    return None


def _rope_start(c: int, kv_format: int) -> int | None:
    """Byte column of the bf16 rope chunk ``c`` in an fp8 row, None for any other chunk."""
    if kv_format == FP8_DS_MLA and c == DS_MLA_NOPE // CH:
        return DS_MLA_ROPE_OFFSET
    if kv_format == FP8_MODEL1 and c == MODEL1_NOPE // CH:
        return MODEL1_NOPE
    return None


def _chunk_raw(kv_ref, rows, ok, c: int, *, kv_format: int, interpret: bool):
    """Issue the loads of latent dims ``[64 c, 64 c + 64)`` of the selected rows, as stored:
    ``[BLOCK_K, 64]`` in the latent dtype, e4m3 bytes (uint8), or for a bf16 rope chunk the
    pair (low bytes, high bytes), two stride-2 byte loads. :func:`_chunk_val` converts it."""
    start = _rope_start(c, kv_format)
    if start is None:
        return _gather(kv_ref, rows, c * CH, CH, ok, interpret=interpret)
    return (_gather(kv_ref, rows, start, CH, ok, stride=2, interpret=interpret),
            _gather(kv_ref, rows, start + 1, CH, ok, stride=2, interpret=interpret))


def _chunk_val(raw, c: int, *, kv_format: int, dot_dtype):
    """Chunk ``c`` as loaded by :func:`_chunk_raw` -> ``[BLOCK_K, 64]`` in ``dot_dtype``, not
    yet scaled (exact for the fp8 formats: e4m3 and bf16 rope fit bf16; fp16 holds e4m3)."""
    if kv_format == LATENT:
        return raw.astype(dot_dtype)
    if _rope_start(c, kv_format) is None:
        return lax.bitcast_convert_type(raw, jnp.float8_e4m3fn).astype(dot_dtype)
    lo, hi = raw
    bits = (hi.astype(jnp.uint16) << 8) | lo.astype(jnp.uint16)
    return lax.bitcast_convert_type(bits, jnp.bfloat16).astype(dot_dtype)


def _scales_raw(kv_ref, rows, srows, scols, ok, *, kv_format: int, interpret: bool):
    """Issue the scale loads of one row block, as stored: ``fp8_ds_mla`` 4 x ``[BLOCK_K, 4]``
    bytes (one little-endian float32 per 128 dims), ``fp8_model1`` 7 x ``[BLOCK_K]`` ue8m0
    bytes (column offsets differ per row: two index arrays), latent none."""
    if kv_format == FP8_DS_MLA:
        return tuple(_gather(kv_ref, rows, DS_MLA_SCALE_OFFSET + 4 * g, 4, ok, interpret=interpret)
                     for g in range(DS_MLA_NOPE // DS_MLA_TILE))
    if kv_format == FP8_MODEL1:
        return tuple(plgpu.load(kv_ref.at[srows, scols + g], mask=ok, other=127)
                     for g in range(MODEL1_NOPE // MODEL1_TILE))
    return ()


def _scale_val(raw, *, kv_format: int):
    """One scale group as loaded by :func:`_scales_raw` -> ``[BLOCK_K]`` float32."""
    if kv_format == FP8_DS_MLA:
        shifts = (8 * _iota(4)).astype(jnp.uint32)[None, :]
        bits = jnp.sum(raw.astype(jnp.uint32) << shifts, axis=1)
        return lax.bitcast_convert_type(bits, jnp.float32)
    # ue8m0 byte e -> 2^(e - 127) (0 -> 2^-127, 255 -> NaN), as ml_dtypes
    e = raw.astype(jnp.uint32)
    v = lax.bitcast_convert_type(e << 23, jnp.float32)
    v = jnp.where(e == 0, jnp.float32(2.0 ** -127), v)
    return jnp.where(e == 255, jnp.float32(jnp.nan), v)


def _issue_rows(kv_ref, slot, ok, *, kv_format: int, n_chunks: int, page_size: int,
                rows_per_page: int, interpret: bool):
    """All loads of one row block, issued back to back before any conversion: ``(chunks,
    scales)``, the raw chunks ``0 .. n_chunks - 1`` (:func:`_chunk_raw`) and the raw scales
    (:func:`_scales_raw`). ``slot`` [BLOCK_K] is 0 where not ``ok``."""
    srows = scols = None
    rows = slot
    if kv_format == FP8_MODEL1:
        page = slot // page_size
        off = slot % page_size
        rows = page * rows_per_page + off
        srows = page * rows_per_page + page_size + off // MODEL1_SCALES_PER_ROW
        scols = (off % MODEL1_SCALES_PER_ROW) * MODEL1_SCALE_BYTES
    chunks = tuple(_chunk_raw(kv_ref, rows, ok, c, kv_format=kv_format, interpret=interpret)
                   for c in range(n_chunks))
    return chunks, _scales_raw(kv_ref, rows, srows, scols, ok, kv_format=kv_format,
                               interpret=interpret)


def _dot(a, b, contract_b: int, fp32: bool):
    """``a @ b`` (``contract_b=0``) or ``a @ b.T`` (``contract_b=1``), fp32 accumulation;
    IEEE fp32 products when ``fp32`` (precision HIGHEST; DEFAULT lowers to TF32)."""
    return lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())),
                           precision=lax.Precision.HIGHEST if fp32 else None,
                           preferred_element_type=jnp.float32)


def _add(a, b):
    return b if a is None else a + b


def _qk(q_c, x, sc, *, kv_format: int, fp32: bool):
    """Scores ``[BLOCK_H, BLOCK_K]`` fp32: the sum over chunks of ``q_c . x_c^T``; the chunks
    of one scale group are summed first and their sum is multiplied by the group's per-row
    scale (exactly the dequantized product for the power-of-two scales of the fp8 formats)."""
    s = part = None
    for c in range(len(x)):
        d = _dot(q_c[c], x[c], 1, fp32)
        g = _scale_group(c, kv_format)
        if g is None:
            s = _add(s, d)
            continue
        part = _add(part, d)
        if c + 1 == len(x) or _scale_group(c + 1, kv_format) != g:
            s = _add(s, part * sc[g][None, :])
            part = None
    return s


def _pv(acc, alpha, p, x, sc, *, kv_format: int, dot_dtype, fp32: bool):
    """``acc_c * alpha + (p * sc_g) . x_c`` for the 8 value chunks: a chunk's scale folds into
    p (``[BLOCK_H, BLOCK_K]``, once per scale group) instead of its value tile. bf16 operands
    add a second dot with p's rounding residual."""
    split = {}
    out = []
    for c in range(V_CHUNKS):
        g = _scale_group(c, kv_format)
        if g not in split:
            pg = p if g is None else p * sc[g][None, :]
            hi = pg.astype(dot_dtype)
            lo = None
            if jnp.dtype(dot_dtype) == jnp.bfloat16:
                # bf16 keeps 8 bits of p; the rounding residual's second dot makes it ~16 bits
                # (same as kernels/sparse_mla/triton.py; without it a flat softmax misses the
                # SPEC out bound by up to 1.3x on the H200).
                lo = (pg - hi.astype(jnp.float32)).astype(dot_dtype)
            split[g] = (hi, lo)
        hi, lo = split[g]
        a = acc[c] * alpha[:, None] + _dot(hi, x[c], 0, fp32)
        if lo is not None:
            a = a + _dot(lo, x[c], 0, fp32)
        out.append(a)
    return tuple(out)


# ----------------------------------------------------------------------------- fp16 fast path
# fp8 formats with 16-bit dots (docs/SEMANTICS.md "fast-path numerics", as
# kernels/sparse_mla/triton.py): every e4m3 chunk is converted ONCE into an fp16 tile with its
# scale folded in, in units of the program's running unit 2^(ub - 127) (ub only grows); q's nope
# dims scaled per head by a power of two into fp16; the bf16 rope in its own dot; p in fp16.

def _exp_field(x):
    """Biased float32 exponent field (int32) of float32 ``x`` (0 for zero / subnormals, 255 for
    inf / NaN)."""
    return (lax.bitcast_convert_type(x, jnp.int32) >> 23) & 0xFF


def _pow2(e):
    """2^(e - 127) as float32 for an int32 biased exponent ``e`` in [1, 254]."""
    return lax.bitcast_convert_type(e << 23, jnp.float32)


def _split_last(x, n: int):
    """The ``n`` (a power of two) interleaved parts of ``x``'s last axis: part ``j`` is
    ``x[..., j::n]``, its last axis dropped when that leaves one element (reshape + size-2
    ``unstack``: ``tt.reshape`` / ``tt.split`` in Triton; no byte-wise loads, no static slices)."""
    parts = [x]
    while len(parts) < n:
        nxt = [None] * (2 * len(parts))
        for i, y in enumerate(parts):
            lo, hi = lax.unstack(y.reshape(*y.shape[:-1], y.shape[-1] // 2, 2), y.ndim)
            nxt[i], nxt[i + len(parts)] = lo, hi
        parts = nxt
    if parts[0].shape[-1] == 1:
        parts = [y.reshape(y.shape[:-1]) for y in parts]
    return parts


def _fast_issue(kv_ref, slot, ok, *, kv_format: int, page_size: int, rows_per_page: int,
                interpret: bool):
    """All loads of one row block for the fast path, as wide loads of whole runs of bytes:
    the e4m3 nope chunks ``[BLOCK_K, 64]``, the bf16 rope as one ``[BLOCK_K, 128]`` byte run,
    the scales as one 32-byte run (``fp8_ds_mla``: the 16 bytes of the 4 float32 scales and 16
    rope bytes; ``fp8_model1``: the aligned window of 4 scale rows holding the slot's 8-byte
    ue8m0 row, and its position in it), 32 bytes so that every thread copies >= 4 bytes and the
    pipeliner turns the load into an async copy. Masked rows read nothing: 0 bytes, i.e. scale
    0 for fp8_ds_mla and 2^-127 for fp8_model1 (a masked row stays 0 in the fp16 tile whatever
    the unit's shift; the Triton kernel's model1 scales read 1.0 there once, which its 2^19
    shift made inf and the value dot NaN)."""
    if kv_format == FP8_DS_MLA:
        rows = slot
        chunks = tuple(_gather(kv_ref, rows, c * CH, CH, ok, interpret=interpret)
                       for c in range(DS_MLA_NOPE // CH))
        rope = _gather(kv_ref, rows, DS_MLA_NOPE + 16, 2 * TAIL, ok, interpret=interpret)
        # 32 bytes (the 16 scale bytes and the first 16 rope bytes): 4 bytes per thread at 8
        # warps, the width an async copy needs, so the pipeliner can overlap it
        scales = _gather(kv_ref, rows, DS_MLA_NOPE, 32, ok, interpret=interpret)
        return chunks, rope, scales
    page = slot // page_size
    off = slot % page_size
    rows = page * rows_per_page + off
    chunks = tuple(_gather(kv_ref, rows, c * CH, CH, ok, interpret=interpret)
                   for c in range(MODEL1_NOPE // CH))
    rope = _gather(kv_ref, rows, MODEL1_NOPE, 2 * CH, ok, interpret=interpret)
    # the 32-byte aligned window holding the slot's 8-byte scale row (4 rows of 8 bytes; 576 =
    # 18 x 32): 4 bytes per thread at 8 warps, the width an async copy needs
    srows = page * rows_per_page + page_size + off // MODEL1_SCALES_PER_ROW
    wcol = ((off % MODEL1_SCALES_PER_ROW) // 4) * 32
    cols = wcol[:, None] + _iota(32)[None, :]
    scales = plgpu.load(kv_ref.at[srows[:, None], cols], mask=ok[:, None], other=0)
    return chunks, rope, (scales, off % 4)


def _fast_scales(raw, *, kv_format: int):
    """Per-group ``[BLOCK_K]`` float32 scales and their biased exponent fields from the scale
    bytes of :func:`_fast_issue` (little-endian float32 words for ``fp8_ds_mla``; ue8m0 bytes
    ``e -> 2^(e - 127)`` for ``fp8_model1``, 0 -> 2^-127 and 255 -> NaN as ml_dtypes)."""
    if kv_format == FP8_DS_MLA:
        b = [y.astype(jnp.uint32) for y in _split_last(raw, 4)]            # byte k of each word
        words = b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24)             # [BLOCK_K, 8]
        w = _split_last(words, 8)[:DS_MLA_NOPE // DS_MLA_TILE]               # 4 x [BLOCK_K]
        sc = [lax.bitcast_convert_type(x, jnp.float32) for x in w]
        return sc, [_exp_field(x) for x in sc]
    win, sub = raw                     # [BLOCK_K, 32] window; the slot's 8 bytes at 8 * sub
    pick = sub[:, None] == _iota(4)[None, :]
    e = [jnp.sum(jnp.where(pick, y.astype(jnp.int32), 0), axis=1)       # byte g of row sub
         for y in _split_last(win, 8)[:MODEL1_NOPE // MODEL1_TILE]]
    sc = []
    for x in e:
        v = lax.bitcast_convert_type(x << 23, jnp.float32)
        v = jnp.where(x == 0, jnp.float32(2.0 ** -127), v)
        sc.append(jnp.where(x == 255, jnp.float32(jnp.nan), v))
    return sc, e


def _fast_rope(raw, rope_dtype):
    """The bf16 rope chunk ``[BLOCK_K, 64]`` from its ``[BLOCK_K, 128]`` bytes (low, high byte
    pairs joined into 16-bit words, bitcast at equal width), in ``rope_dtype``."""
    lo, hi = _split_last(raw, 2)
    bits = (hi.astype(jnp.uint16) << 8) | lo.astype(jnp.uint16)
    v = lax.bitcast_convert_type(bits, jnp.bfloat16)
    return v if jnp.dtype(rope_dtype) == jnp.bfloat16 else v.astype(jnp.float32).astype(rope_dtype)


def _fast_q(q_c, *, kv_format: int, rope_dtype):
    """q's chunks (fp32) -> (fp16 nope chunks scaled per head by 2^t, the rope chunk in
    ``rope_dtype``, ``q_inv`` = 2^-t [BLOCK_H]): 2^t puts max|q_nope| in [2^14, 2^15); 0 heads
    keep 0, inf / NaN heads stay inf / NaN (NaN treated as inf for t)."""
    n_nope = DS_MLA_NOPE // CH if kv_format == FP8_DS_MLA else MODEL1_NOPE // CH
    am = None
    for c in range(n_nope):
        m = jnp.max(jnp.abs(q_c[c]), axis=1)
        am = m if am is None else jnp.maximum(am, m)
    am = jnp.where(am != am, jnp.float32(jnp.inf), am)
    qb = jnp.clip(268 - _exp_field(am), 1, 253)
    q_sc, q_inv = _pow2(qb), _pow2(254 - qb)
    nope = tuple((q_c[c] * q_sc[:, None]).astype(jnp.float16) for c in range(n_nope))
    return nope, q_c[n_nope].astype(rope_dtype), q_inv


def _fast_compute(state, raw, ok, q16, q_rope, q_inv, qk_scale_log2, *, kv_format: int,
                  rope_dtype):
    """One row block of the fast path: tiles converted once (fp16, scale folded in, in the
    running unit), scores, online softmax, the value accumulators."""
    m_i, l_i, ub_i, acc = state
    chunks, rope_raw, sraw = raw
    sc, ex = _fast_scales(sraw, kv_format=kv_format)
    e = ex[0]
    for x in ex[1:]:
        e = jnp.maximum(e, x)
    e = jnp.max(jnp.where(ok, e, 0))
    ub = jnp.maximum(jnp.clip(e - 6, 1, 253), ub_i)       # the unit only grows
    shift = _pow2(254 - ub)
    per = DS_MLA_TILE // CH if kv_format == FP8_DS_MLA else 1     # chunks per scale group
    f = [(x * shift).astype(jnp.float16) for x in sc]      # [BLOCK_K] per group
    x = [lax.bitcast_convert_type(chunks[c], jnp.float8_e4m3fn).astype(jnp.float16)
         * f[c // per][:, None] for c in range(len(chunks))]
    xr = _fast_rope(rope_raw, rope_dtype)
    s = None
    for c in range(len(x)):
        s = _add(s, _dot(q16[c], x[c], 1, False))
    s = s * (q_inv * _pow2(ub))[:, None]
    s = s + _dot(q_rope, xr, 1, False)
    s = jnp.where(ok[None, :], s * qk_scale_log2, NEG_SENTINEL)
    m_new = jnp.maximum(m_i, jnp.max(s, axis=1))
    alpha = jnp.exp2(m_i - m_new)
    p = jnp.where(ok[None, :], jnp.exp2(s - m_new[:, None]), 0.0)
    l_i = l_i * alpha + jnp.sum(p, axis=1)
    an = alpha * _pow2(jnp.maximum(ub_i - ub + 127, 1))   # accumulators to the new unit (<= 1)
    p16 = p.astype(jnp.float16)
    out = [acc[c] * an[:, None] + _dot(p16, x[c], 0, False) for c in range(len(x))]
    if kv_format == FP8_MODEL1:         # the bf16 rope is V's last chunk, in true units
        hi = p.astype(rope_dtype)
        a = acc[V_CHUNKS - 1] * alpha[:, None] + _dot(hi, xr, 0, False)
        if jnp.dtype(rope_dtype) == jnp.bfloat16:   # bf16 p + its residual: 16 bits of p
            a = a + _dot((p - hi.astype(jnp.float32)).astype(rope_dtype), xr, 0, False)
        out.append(a)
    return m_new, l_i, ub, tuple(out)


def _sparse_mla_split_kernel(
    *refs,
    KV_FORMAT: int, TAIL: bool, N: int, H: int, K: int, S: int,
    PAGE_SIZE: int, NUM_PAGES: int, ROWS_PER_PAGE: int, MAX_PAGES: int,
    BLOCK_H: int, BLOCK_K: int, CHUNK: int, PREFETCH: bool, HAS_BT: bool, HAS_TKL: bool,
    HAS_SINK: bool, FINAL: bool, DOT_DTYPE, INTERPRET: bool,
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
    n_chunks = V_CHUNKS + 1 if TAIL else V_CHUNKS      # a 9th chunk (rope 512..575): q.k only

    pid_h = pl.program_id(0)
    pid_s = pl.program_id(1)
    pid_bn = pl.program_id(2)
    b = pid_bn // N
    n = pid_bn % N
    h0 = pid_h * BLOCK_H
    h_ok = h0 + _iota(BLOCK_H) < H                                           # [BLOCK_H]
    heads = pl.ds(h0, BLOCK_H)
    # q in 64-dim chunks, loaded once: [BLOCK_H, 64] each
    # fp8 formats with 16-bit dots: the fp16 fast path (docs/SEMANTICS.md "fast-path numerics")
    SHIFTED = KV_FORMAT != LATENT and not fp32
    rope_dtype = DOT_DTYPE                  # bf16 q: bf16 rope dot; fp16 q: fp16 (CPU tests)
    q_c = tuple(plgpu.load(q_ref.at[b, n, heads, pl.ds(c * CH, CH)], mask=h_ok[:, None],
                           other=0).astype(jnp.float32 if SHIFTED else DOT_DTYPE)
                for c in range(n_chunks))
    if SHIFTED:
        q16, q_rope, q_inv = _fast_q(q_c, kv_format=KV_FORMAT, rope_dtype=rope_dtype)
    qk_scale_log2 = scale_ref[0]

    k_len = K
    if HAS_TKL:
        k_len = jnp.clip(tkl_ref[b], 0, K)
    start = pid_s * CHUNK
    end = jnp.minimum(start + CHUNK, k_len)
    n_iter = (jnp.maximum(end - start, 0) + BLOCK_K - 1) // BLOCK_K
    ar = _iota(BLOCK_K)

    def load_idx(k0):
        """Indices of the block at list position ``k0`` (-1 past ``end``), and ``in_list``."""
        in_list = k0 + ar < end
        return plgpu.load(idx_ref.at[b, n, pl.ds(k0, BLOCK_K)], mask=in_list, other=-1), in_list

    def page_entries(raw, in_list):
        """Block-table entries of the logical indices ``raw`` (-1 where outside the table or
        past the list, never read); None without a block table."""
        if not HAS_BT:
            return None
        ok = in_list & (raw >= 0) & (raw < MAX_PAGES * PAGE_SIZE)
        return plgpu.load(bt_ref.at[b, jnp.where(ok, raw // PAGE_SIZE, 0)], mask=ok, other=-1)

    def resolve(raw, ent, in_list):
        """``(slot, ok)``: slots (0 where invalid, never dereferenced) and the validity mask."""
        if HAS_BT:
            ok = (in_list & (raw >= 0) & (raw < MAX_PAGES * PAGE_SIZE)
                  & (ent >= 0) & (ent < NUM_PAGES))
            slot = ent * PAGE_SIZE + raw % PAGE_SIZE
        else:
            ok = in_list & (raw >= 0) & (raw < NUM_PAGES * PAGE_SIZE)
            slot = raw
        return jnp.where(ok, slot, 0), ok

    if SHIFTED:
        issue = functools.partial(_fast_issue, kv_ref, kv_format=KV_FORMAT,
                                  page_size=PAGE_SIZE, rows_per_page=ROWS_PER_PAGE,
                                  interpret=INTERPRET)
    else:
        issue = functools.partial(_issue_rows, kv_ref, kv_format=KV_FORMAT, n_chunks=n_chunks,
                                  page_size=PAGE_SIZE, rows_per_page=ROWS_PER_PAGE,
                                  interpret=INTERPRET)

    def compute(state, raw, ok):
        """One row block (its loads already issued): online softmax and the 8 accumulators."""
        if SHIFTED:
            return _fast_compute(state, raw, ok, q16, q_rope, q_inv, qk_scale_log2,
                                 kv_format=KV_FORMAT, rope_dtype=rope_dtype)
        m_i, l_i, ub_i, acc = state
        chunks, sraw = raw
        x = [_chunk_val(chunks[c], c, kv_format=KV_FORMAT, dot_dtype=DOT_DTYPE)
             for c in range(n_chunks)]
        sc = [_scale_val(r, kv_format=KV_FORMAT) for r in sraw]
        s = _qk(q_c, x, sc, kv_format=KV_FORMAT, fp32=fp32)                  # [BLOCK_H, BLOCK_K]
        # online softmax in the exp2 domain; invalid entries get p = 0 (never NaN)
        s = jnp.where(ok[None, :], s * qk_scale_log2, NEG_SENTINEL)
        m_new = jnp.maximum(m_i, jnp.max(s, axis=1))
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.where(ok[None, :], jnp.exp2(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + jnp.sum(p, axis=1)
        acc = _pv(acc, alpha, p, x, sc, kv_format=KV_FORMAT, dot_dtype=DOT_DTYPE, fp32=fp32)
        return m_new, l_i, ub_i, acc

    # (m, l, ub, acc): ub the fast path's running unit (biased exponent, 1 until a block with
    # valid rows; unused elsewhere)
    state = (jnp.full((BLOCK_H,), NEG_SENTINEL, jnp.float32), jnp.zeros((BLOCK_H,), jnp.float32),
             jnp.int32(1), tuple(jnp.zeros((BLOCK_H, CH), jnp.float32) for _ in range(V_CHUNKS)))
    if PREFETCH:
        # Software pipeline by hand, three deep, as in the Triton kernel: while block i is
        # computed, the rows of block i + 1 are in flight (their slots known), the block-table
        # entries of block i + 2 and the indices of block i + 3; the raw loads travel as
        # fori_loop carries. Each load waits only on values that arrived an iteration earlier.
        # Loads past ``end`` (blocks beyond the last) are fully masked.
        i0, in0 = load_idx(start)
        i1, in1 = load_idx(start + BLOCK_K)
        i2, _ = load_idx(start + 2 * BLOCK_K)
        slot, ok = resolve(i0, page_entries(i0, in0), in0)
        e1 = page_entries(i1, in1)
        raw = issue(slot, ok)

        def body(i, carry):
            state, raw, ok_cur, i1, e1, i2 = carry
            k0 = start + i * BLOCK_K
            # block i + 1: slots from the entries loaded last iteration; issue its rows
            slot, ok = resolve(i1, e1, k0 + BLOCK_K + ar < end)
            nxt = issue(slot, ok)
            # block i + 2: page entries; block i + 3: indices
            e2 = page_entries(i2, k0 + 2 * BLOCK_K + ar < end)
            i3, _ = load_idx(k0 + 3 * BLOCK_K)
            state = compute(state, raw, ok_cur)
            return state, nxt, ok, i2, e2, i3

        state = lax.fori_loop(0, n_iter, body, (state, raw, ok, i1, e1, i2))[0]
    else:
        def body(i, state):
            # this block's loads, all issued back to back before any conversion or dot
            i0, in0 = load_idx(start + i * BLOCK_K)
            slot, ok = resolve(i0, page_entries(i0, in0), in0)
            return compute(state, issue(slot, ok), ok)

        state = lax.fori_loop(0, n_iter, body, state)
    m_i, l_i, ub_i, acc = state

    has = l_i != 0.0        # NaN sums propagate (as in the reference); empty iff l == 0
    l_safe = jnp.where(has, l_i, 1.0)
    inv_l = 1.0 / l_safe
    # the fast path's nope accumulators are in units of 2^(ub - 127); model1's rope chunk is not
    inv_n = inv_l * _pow2(ub_i) if SHIFTED else inv_l
    lse2 = jnp.where(has, m_i + jnp.log(l_safe) * LOG2E, -jnp.inf)           # log2 domain
    factor = None
    if FINAL:
        lse = lse2 * LN2
        if HAS_SINK:
            sink = _finite_sink(plgpu.load(sink_ref.at[heads], mask=h_ok, other=0.0))
            factor = (1.0 / (1.0 + jnp.exp(sink - lse)))[:, None]            # lse=-inf -> 0
        o_ref, l_ref, lead = out_ref, lse_ref, (b, n)
    else:
        lse = lse2
        o_ref, l_ref, lead = po_ref, pl_ref, (pid_s, pid_bn)
    for c in range(V_CHUNKS):
        if not SHIFTED:
            o = jnp.where(has[:, None], acc[c] / l_safe[:, None], 0.0)       # [BLOCK_H, 64]
        else:
            inv = inv_l if (KV_FORMAT == FP8_MODEL1 and c == V_CHUNKS - 1) else inv_n
            o = jnp.where(has[:, None], acc[c] * inv[:, None], 0.0)
        if factor is not None:
            o = o * factor
        # one indexer per ref access (the Triton lowering does not compose .at[] chains)
        plgpu.store(o_ref.at[(*lead, heads, pl.ds(c * CH, CH))], o.astype(o_ref.dtype),
                    mask=h_ok[:, None])
    plgpu.store(l_ref.at[(*lead, heads)], lse, mask=h_ok)


def _sparse_mla_combine_kernel(*refs, S: int, S_BLOCK: int, BLOCK_C: int, HAS_SINK: bool):
    """One (head, request x draft, column block) per program; the splits read as
    ``[S_BLOCK, BLOCK_C]`` tiles (one tile when S <= S_BLOCK: every partial in flight at once),
    summed by fixed-order reductions: the Triton twin's design and order of operations."""
    if HAS_SINK:
        po_ref, pl_ref, sink_ref, out_ref, lse_ref = refs
    else:
        po_ref, pl_ref, out_ref, lse_ref = refs
    # po_ref [S', B*N, H, D_v] f32; pl_ref [S', B*N, H] f32 log2 (S' = S rounded up to S_BLOCK,
    # rows >= S unwritten); sink_ref [H] f32;
    # out_ref [B*N, H, D_v] q dtype; lse_ref [B*N, H] f32 natural log
    h = pl.program_id(0)
    pid_bn = pl.program_id(1)
    cols = pl.ds(pl.program_id(2) * BLOCK_C, BLOCK_C)
    tiles = range(0, S, S_BLOCK)

    def s_ok(s0):
        return s0 + _iota(S_BLOCK) < S

    def load_lse(s0):
        return plgpu.load(pl_ref.at[pl.ds(s0, S_BLOCK), pid_bn, h], mask=s_ok(s0), other=-jnp.inf)

    m = jnp.full((S_BLOCK,), -jnp.inf, jnp.float32)
    nan = jnp.zeros((S_BLOCK,), jnp.int32)            # int32: no reduce_or in the lowering
    for s0 in tiles:
        ls = load_lse(s0)
        m, nan = jnp.maximum(m, ls), nan | (ls != ls).astype(jnp.int32)
    m = jnp.max(jnp.where(m == m, m, -jnp.inf))          # NaN is counted in `nan`
    # a NaN partial (NaN in q or a selected row) makes the row NaN, as in the reference
    has = (m > -jnp.inf) | (jnp.max(nan) != 0)
    m_safe = jnp.where(m > -jnp.inf, m, 0.0)
    den = jnp.zeros((S_BLOCK,), jnp.float32)
    acc = jnp.zeros((S_BLOCK, BLOCK_C), jnp.float32)
    for s0 in tiles:
        w = jnp.exp2(load_lse(s0) - m_safe)                                   # -inf -> 0
        po = plgpu.load(po_ref.at[pl.ds(s0, S_BLOCK), pid_bn, h, cols], mask=s_ok(s0)[:, None],
                        other=0.0)
        den, acc = den + w, acc + w[:, None] * po
    den_safe = jnp.where(has, jnp.sum(den), 1.0)
    o = jnp.where(has, jnp.sum(acc, axis=0) / den_safe, 0.0)
    lse = jnp.where(has, (m_safe + jnp.log(den_safe) * LOG2E) * LN2, -jnp.inf)
    if HAS_SINK:
        sink = _finite_sink(plgpu.load(sink_ref.at[pl.ds(h, 1)]))[0]
        o = o * (1.0 / (1.0 + jnp.exp(sink - lse)))
    plgpu.store(out_ref.at[pid_bn, h, cols], o.astype(out_ref.dtype))

    @pl.when(pl.program_id(2) == 0)
    def _():
        plgpu.store(lse_ref.at[pid_bn, pl.ds(h, 1)], jnp.full((1,), lse, jnp.float32))


def sparse_mla_decode_pallas(q, kv_rows, indices, qk_scale_log2, *, kv_format: str,
                             page_size: int, num_pages: int, block_table=None, topk_length=None,
                             attn_sink=None, block_h: int, block_k: int, num_splits: int,
                             num_warps: int, num_stages: int, dot_dtype, prefetch: bool = True,
                             combine_tile=sparse_mla_combine_tile, combine_warps: int = 4,
                             interpret: bool | None = None):
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
      prefetch: the hand-pipelined loop (the next row block's loads carried across
        iterations); False issues each block's loads at the top of its own iteration.
      combine_tile: ``(num_splits, d_v) -> (S_BLOCK, BLOCK_C)`` of the combine kernel
        (default ``configs.sparse_mla_combine_tile``, the Triton combine's); combine_warps: its
        warps.
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
        KV_FORMAT=code, TAIL=d_qk > MAIN,
        N=N, H=H, K=K, S=S, PAGE_SIZE=page_size, NUM_PAGES=num_pages,
        ROWS_PER_PAGE=rows_per_page, MAX_PAGES=0 if block_table is None else block_table.shape[1],
        BLOCK_H=block_h, BLOCK_K=block_k, CHUNK=chunk, PREFETCH=bool(prefetch),
        HAS_BT=block_table is not None,
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
        # split rows rounded up to the combine's tiles: its static [S_BLOCK] slices stay in
        # bounds (rows >= S are never written, and masked in the combine)
        s_block, block_c = combine_tile(S, MAIN)
        s_rows = -(-S // s_block) * s_block
        out_shape = (jax.ShapeDtypeStruct((s_rows, B * N, H, MAIN), jnp.float32),
                     jax.ShapeDtypeStruct((s_rows, B * N, H), jnp.float32))
    kernel = functools.partial(_sparse_mla_split_kernel, **static)
    res = triton_call(kernel, out_shape=out_shape, grid=(head_blocks, S, B * N),
                      num_warps=num_warps, num_stages=num_stages, interpret=interpret,
                      name="sparse_mla_split")(*args)
    if final:
        return res
    po, plse = res
    cargs = [po, plse] + ([attn_sink] if attn_sink is not None else [])
    ckernel = functools.partial(_sparse_mla_combine_kernel, S=S, S_BLOCK=s_block, BLOCK_C=block_c,
                                HAS_SINK=attn_sink is not None)
    out, lse = triton_call(
        ckernel, out_shape=(jax.ShapeDtypeStruct((B * N, H, MAIN), q.dtype),
                            jax.ShapeDtypeStruct((B * N, H), jnp.float32)),
        grid=(H, B * N, MAIN // block_c), num_warps=combine_warps, num_stages=1,
        interpret=interpret, name="sparse_mla_combine")(*cargs)
    return out.reshape(B, N, H, MAIN), lse.reshape(B, N, H)


__all__ = ["sparse_mla_decode_pallas", "KV_FORMAT_CODES", "LOG2E", "MAIN", "TAIL"]
