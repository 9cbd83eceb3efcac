"""Sparse MLA decode for sm_90 in Gluon (``triton.experimental.gluon``): 64-head tiles, wgmma.

Semantics and numerics: the same as ``kernels.sparse_mla.triton`` (docs/SPEC.md "Operation B";
docs/SEMANTICS.md "fast-path numerics"): fp8 caches (``fp8_ds_mla``, ``fp8_model1``), 16-bit q,
fp16 nope dots over tiles dequantized into the program's running power-of-two unit, q nope
scaled per head by a power of two into fp16, the rope dot in the rope's dtype, fp16 p. Same
split-K partials (normalised fp32 out, log2-domain LSE) or, with one split, the final output;
the Triton combine kernel merges the partials.

Why a Gluon kernel: plain Triton gives a chained-dot kernel ``warpsPerCTA = [num_warps, 1]``, so
with 8 warps on a 64-head tile both warpgroups compute the same 64 x BLOCK_K score tile (q.k done
twice: 1.53x the tensor work), and q, being computed (rescaled) in the kernel, becomes a
register operand held by both warpgroups (~144 registers a thread). Here the layouts are chosen
explicitly (bench/NOTES.md, "Sparse MLA decode"):

* **Work.** One program: 64 heads of one (request, draft) over one split of its top-k list, 8 warps
  (2 warpgroups). Grid ``(head_blocks, splits, B * N)`` as in the Triton kernel.
* **Shared memory.** q once per program: the nope dims as fp16 64 x 64 chunks (scaled per head)
  and the rope chunk in its dtype (73,728 B for D_qk 576). The gathered block of 64 rows,
  dequantized once into fp16 chunks (plus the rope chunk), is read by both dots (73,728 B).
* **Scores.** ``S = q . X^T`` [64 heads, 64 rows]: wgmma from shared memory (A = q, B = the
  transposed view of X), ``warps_per_cta = [4, 2]``: each warpgroup computes the scores of 32 of
  the 64 rows, so no tensor work is repeated. The nope dots accumulate together, the rope dot
  separately (different units; combined after the wait).
* **Values.** ``O += P . X`` per 64-dim chunk of D_v: P (fp16) as a register operand in each
  warpgroup, X from shared memory; each warpgroup holds 32 of every chunk's 64 columns, so the
  fp32 accumulator is 64 x 512 / 256 threads = 128 registers a thread.
* **Pipeline.** The next block's rows are loaded into registers right after this block is
  converted, so the gather overlaps this block's two dots and softmax; slots are resolved one
  block and indices loaded two blocks ahead (the Triton kernel's three-deep chain).
* **Gather and masking.** As the Triton kernel: invalid entries (negative, beyond the cache or the
  table, a negative page entry, past ``topk_length``) are masked in every load and excluded
  from the softmax; masked rows read scale 0. Pages may be strided (``page_bytes`` is the byte
  stride of one page; ``fp8_ds_mla`` rows are 656 B apart inside a page).

Only sm_90 (wgmma): the launcher (``kernels/sparse_mla/triton_launch.py``) runs it for a config
whose ``kernel`` is ``"gluon"``, and the binding substitutes the Triton 64-head tile where it
cannot run (``configs.gluon_eligible``; never in the CPU interpreter: Gluon kernels do not
interpret).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from kernels.sparse_mla.triton import _exp_field, _finite_sink, _page_entries, _pow2
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

# CTA-wide barrier: ``gl.thread_barrier`` in Triton 3.6 (the H200 image), ``gl.barrier`` later
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

NUM_WARPS = 8           # two warpgroups; the tile is 64 heads x 64 rows (configs.SPARSE_MLA_GLUON)

NEG = gl.constexpr(-1.0e30)  # finite running-max start; exp2(NEG - real) == 0 exactly


@gluon.jit
def _resolve(raw, ent, in_list, num_slots, num_pages, max_pages, page_size, HAS_BT: gl.constexpr):
    """``(page, off, ok)`` of one row block: int32 page and in-page offset (0 where invalid) and
    the validity mask. Slots are int32 (the index dtype), so no 64-bit division is needed."""
    if HAS_BT:
        ok = in_list & (raw >= 0) & (raw < max_pages * page_size) & (ent >= 0) & (ent < num_pages)
        page = ent
        off = raw % page_size
    else:
        ok = in_list & (raw >= 0) & (raw < num_slots)
        page = raw // page_size
        off = raw % page_size
    return gl.where(ok, page, 0), gl.where(ok, off, 0), ok


@gluon.jit
def _row_base(page, off, page_bytes, KV_FORMAT: gl.constexpr):
    """Byte offset of each row's data (int64): page * page_bytes + offset * row bytes."""
    if KV_FORMAT == 1:
        return page.to(gl.int64) * page_bytes + off * 656
    else:
        return page.to(gl.int64) * page_bytes + off * 576


@gluon.jit
def _load_u8(kv_ptr, base, ok, C: gl.constexpr, LD: gl.constexpr):
    """e4m3 bytes of nope chunk ``C`` ([64 rows, 64] uint8, 16-byte vectors), 0 where masked."""
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, LD))
    ptrs = kv_ptr + (base + C * 64)[:, None] + d[None, :]
    m = ok[:, None] & (d[None, :] >= 0)
    return gl.load(ptrs, mask=m, other=0)


@gluon.jit
def _l2_prefetch_rows(kv_ptr, page, off, ok, page_size, page_bytes, KV_FORMAT: gl.constexpr,
                      ROWS: gl.constexpr):
    """Hint the bytes of ``ROWS`` gathered rows (``page`` / ``off`` / ``ok`` in a row layout of
    ``ROWS`` rows over the partition's warps) into L2, one ``prefetch.global.L2`` per 128-byte
    line: a row of ``R`` bytes at a 16-byte aligned address (the cache's alignment contract)
    spans at most 6 lines, hinted at ``base + min(128 c, R - 1)``, c = 0..5 (ds_mla: R = 656,
    scales inside the row; model1: R = 576, then its 8 scale bytes in the page's tail as a
    seventh). No destination register and no scoreboard, so a producer can hint the next block
    while this block's loads are in flight; invalid rows are predicated off (never dereferenced,
    not even as a hint), and every hinted address lies inside a valid row's bytes."""
    R: gl.constexpr = 656 if KV_FORMAT == 1 else 576
    COLS: gl.constexpr = 6 if KV_FORMAT == 1 else 7
    # [ROWS, 8] over the partition's threads, one row's columns in adjacent lanes: for the
    # callers' row layouts (4 or 8 lanes a row, rows over warps) the conversion is free
    PF: gl.constexpr = gl.BlockedLayout([1, ROWS // (4 * gl.num_warps())],
                                        [ROWS // gl.num_warps(), 32 * gl.num_warps() // ROWS],
                                        [gl.num_warps(), 1], [1, 0])
    base = gl.convert_layout(_row_base(page, off, page_bytes, KV_FORMAT), gl.SliceLayout(1, PF))
    okp = gl.convert_layout(ok, gl.SliceLayout(1, PF))
    c = gl.arange(0, 8, layout=gl.SliceLayout(0, PF))
    if KV_FORMAT == 1:      # (128 c < 656 for every hinted column: no clamp; AOT, a clamp here
        line = base[:, None] + c[None, :] * 128    # cost gluon_xs's producer 5 local accesses)
    else:
        line = base[:, None] + gl.minimum(c * 128, R - 1)[None, :]
        # the row's scale word, in the page tail (page * page_bytes + P * 576 + off * 8)
        of = gl.convert_layout(off, gl.SliceLayout(1, PF))
        tail = base + (page_size - of) * 576 + of * 8
        line = gl.where(c[None, :] == 6, tail[:, None], line)
    addr = (kv_ptr + line).to(gl.int64)
    on = (okp[:, None] & (c[None, :] < COLS)).to(gl.int32)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [addr, on], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _rope_ptrs(kv16_ptr, base, ok, KV_FORMAT: gl.constexpr, LD16: gl.constexpr):
    """Pointers and mask ([64 rows, 64], ``LD16``) of each row's bf16 rope bits as int16: bytes
    528.. (ds_mla), 448.. (model1); the mask is constant along a row (16-byte vectors)."""
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, LD16))
    b16 = gl.convert_layout(base, gl.SliceLayout(1, LD16)) // 2
    okr = gl.convert_layout(ok, gl.SliceLayout(1, LD16))
    if KV_FORMAT == 1:
        ptrs = kv16_ptr + (b16 + 264)[:, None] + d[None, :]
    else:
        ptrs = kv16_ptr + (b16 + 224)[:, None] + d[None, :]
    return ptrs, okr[:, None] & (d[None, :] >= 0)


@gluon.jit
def _load_rope(kv16_ptr, base, ok, KV_FORMAT: gl.constexpr, LD16: gl.constexpr):
    """bf16 rope bits ([64 rows, 64] int16) of each row (:func:`_rope_ptrs`), 0 where masked."""
    ptrs, m = _rope_ptrs(kv16_ptr, base, ok, KV_FORMAT, LD16)
    return gl.load(ptrs, mask=m, other=0)


@gluon.jit
def _scale_word(page, off, base, page_size, page_bytes, KV_FORMAT: gl.constexpr):
    """Index (in int32 words of the cache) of each row's first scale word: ds_mla's 4 float32
    at bytes 512..527 of the row (``base`` its first byte), model1's 8 ue8m0 bytes in the page
    tail (``page * page_bytes + page_size * 576 + off * 8``)."""
    if KV_FORMAT == 1:
        w = base // 4 + 128
    else:
        w = (page.to(gl.int64) * page_bytes + page_size * 576 + off * 8) // 4
    return w


@gluon.jit
def _load_scales(kv32_ptr, page, off, base, ok, page_size, page_bytes, KV_FORMAT: gl.constexpr):
    """Per-row scale words: ds_mla the 4 float32 scales (as int32 bits); model1 the 8 ue8m0
    bytes as two int32 words (:func:`_scale_word`). Masked rows read 0 (scale 0.0 / exponent
    byte 0)."""
    w = _scale_word(page, off, base, page_size, page_bytes, KV_FORMAT)
    if KV_FORMAT == 1:
        s0 = gl.load(kv32_ptr + w, mask=ok, other=0)
        s1 = gl.load(kv32_ptr + w + 1, mask=ok, other=0)
        s2 = gl.load(kv32_ptr + w + 2, mask=ok, other=0)
        s3 = gl.load(kv32_ptr + w + 3, mask=ok, other=0)
    else:
        s0 = gl.load(kv32_ptr + w, mask=ok, other=0)
        s1 = gl.load(kv32_ptr + w + 1, mask=ok, other=0)
        s2 = s0
        s3 = s1
    return s0, s1, s2, s3


@gluon.jit
def _scale_of(s0, s1, s2, s3, C: gl.constexpr, KV_FORMAT: gl.constexpr):
    """float32 scale of nope chunk ``C`` per row from the scale words."""
    if KV_FORMAT == 1:
        if C // 2 == 0:
            w = s0
        elif C // 2 == 1:
            w = s1
        elif C // 2 == 2:
            w = s2
        else:
            w = s3
        return w.to(gl.float32, bitcast=True)
    else:
        if C < 4:
            e = (s0 >> (8 * C)) & 0xFF
        else:
            e = (s1 >> (8 * (C - 4))) & 0xFF
        return (e << 23).to(gl.float32, bitcast=True)        # 2^(e - 127); byte 0 -> 0.0


@gluon.jit
def _max_exp(s0, s1, s2, s3, KV_FORMAT: gl.constexpr):
    """Largest biased exponent of a row's chunk scales (int32 per row)."""
    if KV_FORMAT == 1:
        e = gl.maximum(gl.maximum(_exp_field(s0.to(gl.float32, bitcast=True)),
                                  _exp_field(s1.to(gl.float32, bitcast=True))),
                       gl.maximum(_exp_field(s2.to(gl.float32, bitcast=True)),
                                  _exp_field(s3.to(gl.float32, bitcast=True))))
    else:
        e = gl.maximum(gl.maximum(s0 & 0xFF, (s0 >> 8) & 0xFF),
                       gl.maximum((s0 >> 16) & 0xFF, (s0 >> 24) & 0xFF))
        e = gl.maximum(e, gl.maximum(gl.maximum(s1 & 0xFF, (s1 >> 8) & 0xFF), (s1 >> 16) & 0xFF))
    return e


@gluon.jit
def _tile(raw, s0, s1, s2, s3, shift, C: gl.constexpr, KV_FORMAT: gl.constexpr):
    """Nope chunk ``C`` dequantized into the unit: e4m3 * scale * shift in fp16 (exact within the
    documented range, docs/SEMANTICS.md)."""
    f = (_scale_of(s0, s1, s2, s3, C, KV_FORMAT) * shift).to(gl.float16)
    return raw.to(gl.float8e4nv, bitcast=True).to(gl.float16) * f[:, None]


@gluon.jit
def _issue_rows(kv_ptr, kv16_ptr, kv32_ptr, pg, of, ok, page_size, page_bytes,
                KV_FORMAT: gl.constexpr, NC: gl.constexpr, LD: gl.constexpr, LD16: gl.constexpr):
    """All loads of one row block, issued back to back: the NC e4m3 chunks, the rope chunk and
    the scale words."""
    base = _row_base(pg, of, page_bytes, KV_FORMAT)
    r0 = _load_u8(kv_ptr, base, ok, 0, LD)
    r1 = _load_u8(kv_ptr, base, ok, 1, LD)
    r2 = _load_u8(kv_ptr, base, ok, 2, LD)
    r3 = _load_u8(kv_ptr, base, ok, 3, LD)
    r4 = _load_u8(kv_ptr, base, ok, 4, LD)
    r5 = _load_u8(kv_ptr, base, ok, 5, LD)
    r6 = _load_u8(kv_ptr, base, ok, 6, LD)
    if NC == 8:
        r7 = _load_u8(kv_ptr, base, ok, 7, LD)
    else:
        r7 = r6
    rr = _load_rope(kv16_ptr, base, ok, KV_FORMAT, LD16)
    c0, c1, c2, c3 = _load_scales(kv32_ptr, pg, of, base, ok, page_size, page_bytes, KV_FORMAT)
    return r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2, c3


@gluon.jit
def _unit_of(e, ub_i):
    """Biased exponent ``ub`` of the unit ``2^(ub - 127)`` of a row block whose largest scale
    exponent is ``e``: ``e - 6`` (so e4m3 * scale / unit < 448 * 2^7 < 65504) within [1, 253],
    never below the running unit ``ub_i`` (the unit only grows)."""
    return gl.maximum(gl.minimum(gl.maximum(e - 6, 1), 253), ub_i)


@gluon.jit
def _block_unit(c0, c1, c2, c3, ok, ub_i, KV_FORMAT: gl.constexpr):
    """The unit (:func:`_unit_of`) of one row block from the largest scale exponent of its
    valid rows (``ok``; ``c0..`` the rows' scale words)."""
    e = gl.max(gl.where(ok, _max_exp(c0, c1, c2, c3, KV_FORMAT), 0), axis=0)
    return _unit_of(e, ub_i)


@gluon.jit
def _store_rows(x0, x1, x2, x3, x4, x5, x6, x7, xr, t0, t1, t2, t3, t4, t5, t6, t7, tr,
                NC: gl.constexpr):
    """Store one converted row block into X (one buffer a chunk, so no barrier between the
    stores), then make it visible to the async proxy (wgmma) and to every warp."""
    _barrier()                                # every warpgroup is done reading X
    x0.store(t0)
    x1.store(t1)
    x2.store(t2)
    x3.store(t3)
    x4.store(t4)
    x5.store(t5)
    x6.store(t6)
    if NC == 8:
        x7.store(t7)
    xr.store(tr)
    fence_async_shared()
    _barrier()


@gluon.jit
def _convert(r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2, c3, ub,
             KV_FORMAT: gl.constexpr, NC: gl.constexpr, ROPE_DTYPE: gl.constexpr):
    """The fp16 tiles of one row block in the unit 2^(ub - 127) and its rope tile."""
    shift = _pow2(254 - ub)
    t0 = _tile(r0, c0, c1, c2, c3, shift, 0, KV_FORMAT)
    t1 = _tile(r1, c0, c1, c2, c3, shift, 1, KV_FORMAT)
    t2 = _tile(r2, c0, c1, c2, c3, shift, 2, KV_FORMAT)
    t3 = _tile(r3, c0, c1, c2, c3, shift, 3, KV_FORMAT)
    t4 = _tile(r4, c0, c1, c2, c3, shift, 4, KV_FORMAT)
    t5 = _tile(r5, c0, c1, c2, c3, shift, 5, KV_FORMAT)
    t6 = _tile(r6, c0, c1, c2, c3, shift, 6, KV_FORMAT)
    if NC == 8:
        t7 = _tile(r7, c0, c1, c2, c3, shift, 7, KV_FORMAT)
    else:
        t7 = t6
    tr = rr.to(gl.bfloat16, bitcast=True).to(ROPE_DTYPE)
    return t0, t1, t2, t3, t4, t5, t6, t7, tr


@gluon.jit
def _pv(o, an, p16, x):
    """``o * an + P . X_c`` issued asynchronously (the caller waits)."""
    o = o * an[:, None]
    return warpgroup_mma(p16, x, o, is_async=True)


@gluon.jit
def _store_out(o, inv, has, sink_f, C: gl.constexpr, heads, h_ok, pid_s, pid_bn, H, nbn,
               po_ptr, out_ptr, FINAL: gl.constexpr, MMA: gl.constexpr):
    """Write dims [64 C, 64 C + 64) of the normalised output (FINAL, times the sink factor) or
    of the fp32 partial."""
    dv = gl.arange(0, 64, layout=gl.SliceLayout(0, MMA)) + C * 64
    val = gl.where(has[:, None], o * inv[:, None], 0.0)
    m = h_ok[:, None] & (dv[None, :] >= 0)
    if FINAL:
        orow = pid_bn.to(gl.int64) * H + heads
        gl.store(out_ptr + orow[:, None] * 512 + dv[None, :],
                 (val * sink_f[:, None]).to(out_ptr.dtype.element_ty), mask=m)
    else:
        prow = (pid_s.to(gl.int64) * nbn + pid_bn) * H + heads
        gl.store(po_ptr + prow[:, None] * 512 + dv[None, :], val, mask=m)


@gluon.jit
def _issue_nope_scores(qn, z, y0, y1, y2, y3, y4, y5, y6, y7, NC: gl.constexpr,
                       MMA: gl.constexpr):
    """Issue (async, not waited) the nope chunks' score wgmmas of one row block, accumulated
    together (units ``q_inv * 2^ub``); q's chunk ``c`` is ``qn.index(z + c)`` (``z`` 0, or an
    opaque 0: ``gluon_xs._opaque``)."""
    s0 = gl.zeros([64, 64], gl.float32, layout=MMA)
    s = warpgroup_mma(qn.index(z), y0.permute((1, 0)), s0, use_acc=False, is_async=True)
    s = warpgroup_mma(qn.index(z + 1), y1.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qn.index(z + 2), y2.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qn.index(z + 3), y3.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qn.index(z + 4), y4.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qn.index(z + 5), y5.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qn.index(z + 6), y6.permute((1, 0)), s, is_async=True)
    if NC == 8:
        s = warpgroup_mma(qn.index(z + 7), y7.permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _issue_scores(qn, qr, y0, y1, y2, y3, y4, y5, y6, y7, yr, NC: gl.constexpr, MMA: gl.constexpr):
    """Issue (async, not waited) the score wgmmas of one row block: ``s`` = the nope chunks'
    dots accumulated together (units ``q_inv * 2^ub``), ``r`` = the rope dot (true units)."""
    s = _issue_nope_scores(qn, 0, y0, y1, y2, y3, y4, y5, y6, y7, NC, MMA)
    r = warpgroup_mma(qr, yr.permute((1, 0)), gl.zeros([64, 64], gl.float32, layout=MMA),
                      use_acc=False, is_async=True)
    return s, r


@gluon.jit
def _online_softmax(s, r, okc, q_inv, ub, ub_i, m_i, l_i, qk_scale_log2):
    """One online-softmax step (exp2 domain) over the waited scores: returns ``(p, alpha, an,
    m_i, l_i)``, ``an`` = alpha times the factor that brings the nope accumulators from unit
    ``2^ub_i`` to the block's ``2^ub``; masked rows get p = 0."""
    s = s * (q_inv * _pow2(ub))[:, None] + r
    s = gl.where(okc[None, :], s * qk_scale_log2, NEG)
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.where(okc[None, :], gl.exp2(s - m_new[:, None]), 0.0)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    an = alpha * _pow2(gl.maximum(ub_i - ub + 127, 1))
    return p, alpha, an, m_new, l_i


@gluon.jit
def _issue_values(o0, o1, o2, o3, o4, o5, o6, o7, p, alpha, an, y0, y1, y2, y3, y4, y5, y6, y7,
                  yr, ROPE_IN_V: gl.constexpr, R_SPLIT: gl.constexpr, ROPE_DTYPE: gl.constexpr,
                  P_OP: gl.constexpr):
    """Issue (async) the value wgmmas ``O += P . X`` per 64-dim chunk, fp16 P as a register
    operand; fp8_model1's rope chunk (part of V) in the rope's dtype, bf16 with its residual."""
    p16 = gl.convert_layout(p.to(gl.float16), P_OP)
    o0 = _pv(o0, an, p16, y0)
    o1 = _pv(o1, an, p16, y1)
    o2 = _pv(o2, an, p16, y2)
    o3 = _pv(o3, an, p16, y3)
    o4 = _pv(o4, an, p16, y4)
    o5 = _pv(o5, an, p16, y5)
    o6 = _pv(o6, an, p16, y6)
    if ROPE_IN_V:
        o7 = o7 * alpha[:, None]
        p_hi = p.to(ROPE_DTYPE)
        o7 = warpgroup_mma(gl.convert_layout(p_hi, P_OP), yr, o7, is_async=True)
        if R_SPLIT:
            p_lo = (p - p_hi.to(gl.float32)).to(ROPE_DTYPE)
            o7 = warpgroup_mma(gl.convert_layout(p_lo, P_OP), yr, o7, is_async=True)
    else:
        o7 = _pv(o7, an, p16, y7)
    return o0, o1, o2, o3, o4, o5, o6, o7


@gluon.jit
def _epilogue_rows(m_i, l_i, ub_i, pid_h, pid_s, pid_bn, H, nbn, sink_ptr, lse_ptr, pl_ptr,
                   FINAL: gl.constexpr, HAS_SINK: gl.constexpr, MROW: gl.constexpr,
                   HB: gl.constexpr = 64, STORE_LSE: gl.constexpr = True):
    """The per-head half of :func:`_epilogue`: from the running max / sum / unit, the heads and
    their mask, whether a head saw a valid row, ``1 / l`` and ``2^ub / l``, the sink factor, and
    (``STORE_LSE``) the natural-log LSE (``FINAL``) or the partial's log2 LSE stored. Returns
    ``(heads, h_ok, has, inv_l, inv_n, sink_f)`` in layout ``MROW``."""
    heads = pid_h * HB + gl.arange(0, HB, layout=MROW)
    h_ok = heads < H
    has = l_i != 0.0
    l_safe = gl.where(has, l_i, 1.0)
    inv_l = 1.0 / l_safe
    inv_n = inv_l * _pow2(ub_i)
    lse2 = gl.where(has, m_i + gl.log2(l_safe), float("-inf"))
    sink_f = gl.full([HB], 1.0, gl.float32, layout=MROW)
    if FINAL:
        lse = lse2 * 0.6931471805599453
        if HAS_SINK:
            sink = _finite_sink(gl.load(sink_ptr + heads, mask=h_ok, other=0.0))
            sink_f = 1.0 / (1.0 + gl.exp(sink - lse))
        if STORE_LSE:
            gl.store(lse_ptr + pid_bn.to(gl.int64) * H + heads, lse, mask=h_ok)
    elif STORE_LSE:
        gl.store(pl_ptr + (pid_s.to(gl.int64) * nbn + pid_bn) * H + heads, lse2, mask=h_ok)
    return heads, h_ok, has, inv_l, inv_n, sink_f


@gluon.jit
def _epilogue(o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, ub_i, pid_h, pid_s, pid_bn, H, nbn,
              sink_ptr, lse_ptr, pl_ptr, po_ptr, out_ptr, FINAL: gl.constexpr,
              HAS_SINK: gl.constexpr, ROPE_IN_V: gl.constexpr, MMA: gl.constexpr,
              HB: gl.constexpr = 64):
    """The Gluon kernels' epilogue: normalise the eight 64-dim accumulator chunks ``[HB heads,
    64]`` in layout ``MMA`` (the nope chunks carry the running unit ``2^ub``; fp8_model1's rope
    chunk, part of V, does not), then write the final output with the sink and the natural-log
    LSE (``FINAL``) or the fp32 partial and its log2 LSE, as the Triton kernel does."""
    heads, h_ok, has, inv_l, inv_n, sink_f = _epilogue_rows(
        m_i, l_i, ub_i, pid_h, pid_s, pid_bn, H, nbn, sink_ptr, lse_ptr, pl_ptr, FINAL, HAS_SINK,
        gl.SliceLayout(1, MMA), HB)
    _store_out(o0, inv_n, has, sink_f, 0, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o1, inv_n, has, sink_f, 1, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o2, inv_n, has, sink_f, 2, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o3, inv_n, has, sink_f, 3, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o4, inv_n, has, sink_f, 4, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o5, inv_n, has, sink_f, 5, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    _store_out(o6, inv_n, has, sink_f, 6, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    if ROPE_IN_V:
        _store_out(o7, inv_l, has, sink_f, 7, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)
    else:
        _store_out(o7, inv_n, has, sink_f, 7, heads, h_ok, pid_s, pid_bn, H, nbn, po_ptr, out_ptr, FINAL, MMA)


@gluon.jit
def _program(N):
    """``(pid_h, pid_s, pid_bn, nbn, b, n)`` of a program of the grid ``(head_blocks, splits,
    B * N)``: its head block, split, (request, draft) row and the row count, request and draft."""
    pid_bn = gl.program_id(2)
    return (gl.program_id(0), gl.program_id(1), pid_bn, gl.num_programs(2), pid_bn // N,
            pid_bn % N)


@gluon.jit
def _list_range(tkl_ptr, b, K, pid_s, chunk, HAS_TKL: gl.constexpr):
    """``[start, end)``: split ``pid_s``'s share of request b's top-k list (``chunk`` entries a
    split), cut at ``topk_length[b]`` clamped to ``[0, K]`` (HAS_TKL)."""
    k_len = K
    if HAS_TKL:
        k_len = gl.maximum(gl.minimum(gl.load(tkl_ptr + b), K), 0)
    start = pid_s * chunk
    return start, gl.minimum(start + chunk, k_len)


@gluon.jit
def _alloc_x(DT: gl.constexpr, RT: gl.constexpr, NBUF: gl.constexpr, SH: gl.constexpr):
    """X: ``NBUF`` slots of one row block, one buffer a 64-dim chunk (the barrier analysis
    treats views of one buffer as overlapping): eight ``[NBUF, 64, 64]`` of ``DT`` and the rope
    chunk's of ``RT``, in the shared layout ``SH``."""
    return (gl.allocate_shared_memory(DT, [NBUF, 64, 64], SH),
            gl.allocate_shared_memory(DT, [NBUF, 64, 64], SH),
            gl.allocate_shared_memory(DT, [NBUF, 64, 64], SH),
            gl.allocate_shared_memory(DT, [NBUF, 64, 64], SH),
            gl.allocate_shared_memory(DT, [NBUF, 64, 64], SH),
            gl.allocate_shared_memory(DT, [NBUF, 64, 64], SH),
            gl.allocate_shared_memory(DT, [NBUF, 64, 64], SH),
            gl.allocate_shared_memory(DT, [NBUF, 64, 64], SH),
            gl.allocate_shared_memory(RT, [NBUF, 64, 64], SH))


@gluon.jit
def _views(x0, x1, x2, x3, x4, x5, x6, x7, xr, buf):
    """The X chunk buffers' views of slot ``buf``."""
    return (x0.index(buf), x1.index(buf), x2.index(buf), x3.index(buf), x4.index(buf),
            x5.index(buf), x6.index(buf), x7.index(buf), xr.index(buf))


@gluon.jit
def _pipeline_start(idx_row, bt_row, start, end, ar, num_slots, num_pages, max_pages, page_size,
                    HAS_BT: gl.constexpr):
    """Fill the three-deep pipeline of the 64-row blocks (``ar`` = arange(64) in the row
    layout): the indices of blocks 0, 1 and 2 loaded, the slots of blocks 0 and 1 resolved.
    Returns ``(i2, pg, of, ok, pg_nx, of_nx, ok_nx)``."""
    in0 = start + ar < end
    i0 = gl.load(idx_row + start + ar, mask=in0, other=-1)
    in1 = start + 64 + ar < end
    i1 = gl.load(idx_row + start + 64 + ar, mask=in1, other=-1)
    in2 = start + 128 + ar < end
    i2 = gl.load(idx_row + start + 128 + ar, mask=in2, other=-1)
    pg, of, ok = _resolve(i0, _page_entries(bt_row, i0, in0, max_pages, page_size, HAS_BT), in0,
                          num_slots, num_pages, max_pages, page_size, HAS_BT)
    pg_nx, of_nx, ok_nx = _resolve(i1, _page_entries(bt_row, i1, in1, max_pages, page_size,
                                                     HAS_BT),
                                   in1, num_slots, num_pages, max_pages, page_size, HAS_BT)
    return i2, pg, of, ok, pg_nx, of_nx, ok_nx


@gluon.jit
def _pipeline_ahead(idx_row, bt_row, i2, k0, end, ar, max_pages, page_size, HAS_BT: gl.constexpr):
    """In the loop at block ``k0``: the page entries of block +2 (its indices ``i2``) and the
    indices of block +3, in flight during this block's work. Returns ``(in2, e2, i3)``."""
    in2 = k0 + 128 + ar < end
    e2 = _page_entries(bt_row, i2, in2, max_pages, page_size, HAS_BT)
    in3 = k0 + 192 + ar < end
    i3 = gl.load(idx_row + k0 + 192 + ar, mask=in3, other=-1)
    return in2, e2, i3


@gluon.jit
def _q_rows(q_ptr, pid_h, b, n, H, sq_b, sq_n, sq_h, LDQ: gl.constexpr, HB: gl.constexpr = 64):
    """``(q_row, qmask)``: pointers to dims 0..63 of the program's ``HB`` heads of q (``[HB,
    64]``; chunk c is ``q_row + 64 c``) and the mask of the heads below H."""
    hq = pid_h * HB + gl.arange(0, HB, layout=gl.SliceLayout(1, LDQ))
    dq = gl.arange(0, 64, layout=gl.SliceLayout(0, LDQ))
    qmask = (hq < H)[:, None] & (dq[None, :] >= 0)
    return q_ptr + b.to(gl.int64) * sq_b + n * sq_n + hq[:, None] * sq_h + dq[None, :], qmask


@gluon.jit
def _q_exponent(q_row, qmask, NC: gl.constexpr, LDQ: gl.constexpr, HB: gl.constexpr = 64):
    """Per head (``HB``, layout ``SliceLayout(1, LDQ)``) the biased exponent of the power of
    two 2^t that puts max|q_nope| over the ``NC`` nope chunks in [2^14, 2^15) (NaN heads as
    inf), clamped to [1, 253]."""
    am = gl.zeros([HB], gl.float32, layout=gl.SliceLayout(1, LDQ))
    for c in gl.static_range(NC):
        f = gl.load(q_row + c * 64, mask=qmask, other=0.0).to(gl.float32)
        am = gl.maximum(am, gl.max(gl.abs(f), axis=1))
    am = gl.where(am != am, float("inf"), am)                  # NaN head: like inf
    return gl.minimum(gl.maximum(268 - _exp_field(am), 1), 253)


@gluon.jit
def _store_q_scaled(q_row, qmask, qn, qr, NC: gl.constexpr, ROPE_DTYPE: gl.constexpr,
                    LDQ: gl.constexpr, MROW: gl.constexpr, HB: gl.constexpr = 64):
    """q into shared memory for the fp8 formats: per head a power of two 2^t that puts
    max|q_nope| in [2^14, 2^15), the NC nope chunks as fp16 (``qn``), the rope chunk in its
    dtype (``qr``); returns 2^-t per head (``HB`` heads) in the layout ``MROW`` (the
    accumulator's head axis; NaN heads as inf)."""
    qb = _q_exponent(q_row, qmask, NC, LDQ, HB)
    q_sc = _pow2(qb)
    for c in gl.static_range(NC):
        f = gl.load(q_row + c * 64, mask=qmask, other=0.0).to(gl.float32)
        qn.index(c).store((f * q_sc[:, None]).to(gl.float16))
    qr.store(gl.load(q_row + NC * 64, mask=qmask, other=0.0).to(ROPE_DTYPE))
    return gl.convert_layout(_pow2(254 - qb), MROW)


@gluon.jit
def _sparse_mla_gluon_kernel(
    q_ptr,            # [B, N, H, D_qk] bf16 / fp16, strides sq_*; last dim contiguous
    kv_ptr,           # the cache as uint8 bytes
    kv16_ptr,         # the same bytes as int16 (bf16 rope bits)
    kv32_ptr,         # the same bytes as int32 (ds_mla scales as float32 bits; model1 ue8m0 words)
    idx_ptr,          # [B, N, K] int32 slots (or logical positions with HAS_BT), strides si_*
    bt_ptr,           # [B, max_pages] int32 block table (HAS_BT)
    tkl_ptr,          # [B] int32 topk_length (HAS_TKL)
    sink_ptr,         # [H] float32 attention sink (HAS_SINK, FINAL only)
    po_ptr,           # [S, B*N, H, 512] float32 partial out (not FINAL)
    pl_ptr,           # [S, B*N, H] float32 partial LSE, log2 domain (not FINAL)
    out_ptr,          # [B, N, H, 512] q dtype (FINAL)
    lse_ptr,          # [B, N, H] float32 natural-log LSE (FINAL)
    sq_b, sq_n, sq_h, si_b, si_n, sbt_b,
    N, H, K, num_slots, num_pages, max_pages, page_size, page_bytes, chunk, qk_scale_log2,
    KV_FORMAT: gl.constexpr, HAS_BT: gl.constexpr, HAS_TKL: gl.constexpr,
    HAS_SINK: gl.constexpr, FINAL: gl.constexpr, ROPE_DTYPE: gl.constexpr,
    NBUF: gl.constexpr = 2,
):
    gl.static_assert((KV_FORMAT == 1) | (KV_FORMAT == 2), "fp8_ds_mla or fp8_model1 only")
    NC: gl.constexpr = 8 if KV_FORMAT == 1 else 7     # fp16 nope chunks; then one rope chunk
    ROPE_IN_V: gl.constexpr = KV_FORMAT == 2          # model1's rope dims are part of V
    R_SPLIT: gl.constexpr = ROPE_DTYPE == gl.bfloat16  # bf16 p + its residual on the rope values

    # Register layouts: LD gathers a [64 rows, 64 B] chunk as one 16-byte vector a thread;
    # MMA is the wgmma accumulator with the two warpgroups side by side along N.
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    LD16: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])
    LDQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, LD)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 32, 16])
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    MROW: gl.constexpr = gl.SliceLayout(1, MMA)
    MCOL: gl.constexpr = gl.SliceLayout(0, MMA)
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    pid_h, pid_s, pid_bn, nbn, b, n = _program(N)

    qn = gl.allocate_shared_memory(gl.float16, [NC, 64, 64], SH)
    qr = gl.allocate_shared_memory(ROPE_DTYPE, [64, 64], SH)
    # X: one buffer a chunk (the barrier analysis treats views of one buffer as overlapping)
    x0, x1, x2, x3, x4, x5, x6, x7, xr = _alloc_x(gl.float16, ROPE_DTYPE, NBUF, SH)

    # ---- q: per head a power of two 2^t that puts max|q_nope| in [2^14, 2^15), fp16 chunks
    q_row, qmask = _q_rows(q_ptr, pid_h, b, n, H, sq_b, sq_n, sq_h, LDQ)
    q_inv = _store_q_scaled(q_row, qmask, qn, qr, NC, ROPE_DTYPE, LDQ, MROW)

    start, end = _list_range(tkl_ptr, b, K, pid_s, chunk, HAS_TKL)

    m_i = gl.full([64], NEG, gl.float32, layout=MROW)
    l_i = gl.zeros([64], gl.float32, layout=MROW)
    ub_i = pid_h * 0 + 1
    zero = gl.zeros([64, 64], gl.float32, layout=MMA)
    o0, o1, o2, o3, o4, o5, o6, o7 = zero, zero, zero, zero, zero, zero, zero, zero

    idx_row = idx_ptr + b.to(gl.int64) * si_b + n * si_n
    bt_row = bt_ptr + b.to(gl.int64) * sbt_b
    ar = gl.arange(0, 64, layout=ROW)
    i2, pg, of, ok, pg_nx, of_nx, ok_nx = _pipeline_start(
        idx_row, bt_row, start, end, ar, num_slots, num_pages, max_pages, page_size, HAS_BT)
    r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2, c3 = _issue_rows(
        kv_ptr, kv16_ptr, kv32_ptr, pg, of, ok, page_size, page_bytes, KV_FORMAT, NC, LD, LD16)
    ub = _block_unit(c0, c1, c2, c3, ok, ub_i, KV_FORMAT)
    t0, t1, t2, t3, t4, t5, t6, t7, tr = _convert(r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2,
                                                  c3, ub, KV_FORMAT, NC, ROPE_DTYPE)
    _store_rows(x0.index(0), x1.index(0), x2.index(0), x3.index(0), x4.index(0), x5.index(0),
                x6.index(0), x7.index(0), xr.index(0), t0, t1, t2, t3, t4, t5, t6, t7, tr, NC)

    for k0 in range(start, end, 64):
        # this block's X and (NBUF 2) the other buffer, which the next block is stored into
        buf = ((k0 - start) // 64) % NBUF
        nxt = (buf + 1) % NBUF
        y0, y1, y2, y3, y4, y5, y6, y7, yr = _views(x0, x1, x2, x3, x4, x5, x6, x7, xr, buf)
        # X holds this block (in units 2^(ub - 127)). Issue the next block's rows (slots resolved
        # last iteration), its successor's page entries and the indices after that: all in
        # flight during this block's dots, consumed at the end of the iteration.
        ok_cur = ok
        ok = ok_nx
        r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1, c2, c3 = _issue_rows(
            kv_ptr, kv16_ptr, kv32_ptr, pg_nx, of_nx, ok, page_size, page_bytes, KV_FORMAT, NC,
            LD, LD16)
        in2, e2, i3 = _pipeline_ahead(idx_row, bt_row, i2, k0, end, ar, max_pages, page_size,
                                      HAS_BT)

        # scores: nope dots in units (q_inv * 2^ub), the rope dot in true units
        s, r = _issue_scores(qn, qr, y0, y1, y2, y3, y4, y5, y6, y7, yr, NC, MMA)
        s, r = warpgroup_mma_wait(num_outstanding=0, deps=(s, r))
        okc = gl.convert_layout(ok_cur, MCOL)
        p, alpha, an, m_i, l_i = _online_softmax(s, r, okc, q_inv, ub, ub_i, m_i, l_i, qk_scale_log2)
        ub_i = ub

        o0, o1, o2, o3, o4, o5, o6, o7 = _issue_values(
            o0, o1, o2, o3, o4, o5, o6, o7, p, alpha, an, y0, y1, y2, y3, y4, y5, y6, y7, yr,
            ROPE_IN_V, R_SPLIT, ROPE_DTYPE, P_OP)
        # the next block's tiles are computed while the value dots run, stored after them
        ub = _block_unit(c0, c1, c2, c3, ok, ub_i, KV_FORMAT)
        t0, t1, t2, t3, t4, t5, t6, t7, tr = _convert(r0, r1, r2, r3, r4, r5, r6, r7, rr, c0, c1,
                                                      c2, c3, ub, KV_FORMAT, NC, ROPE_DTYPE)
        if NBUF == 2:       # stored into the other buffer while the value dots run
            _store_rows(x0.index(nxt), x1.index(nxt), x2.index(nxt), x3.index(nxt),
                        x4.index(nxt), x5.index(nxt), x6.index(nxt), x7.index(nxt),
                        xr.index(nxt), t0, t1, t2, t3, t4, t5, t6, t7, tr, NC)
        o0, o1, o2, o3, o4, o5, o6, o7 = warpgroup_mma_wait(
            num_outstanding=0, deps=(o0, o1, o2, o3, o4, o5, o6, o7))
        if NBUF == 1:
            _store_rows(y0, y1, y2, y3, y4, y5, y6, y7, yr, t0, t1, t2, t3, t4, t5, t6, t7, tr, NC)
        pg_nx, of_nx, ok_nx = _resolve(i2, e2, in2, num_slots, num_pages, max_pages, page_size,
                                       HAS_BT)
        i2 = i3

    # ---- epilogue (as the Triton kernel)
    _epilogue(o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, ub_i, pid_h, pid_s, pid_bn, H, nbn,
              sink_ptr, lse_ptr, pl_ptr, po_ptr, out_ptr, FINAL, HAS_SINK, ROPE_IN_V, MMA)
