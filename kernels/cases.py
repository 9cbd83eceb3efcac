"""Random and named corner-case generators for both ops, shared by tests, parity and bench.

Every case is a dataclass of NumPy arrays (ml_dtypes for bf16 / e4m3) plus the arguments of the
public call, with a ``reference()`` method running :mod:`kernels.reference` on exactly those
(already quantized) inputs. Backends convert with ``torch_impl._common.as_tensor`` or
``jnp.asarray``.

Cache contents are built the way serving leaves them: each request's pages are scattered through
the pool by a shuffled block table, pages past a request's length hold stale data from earlier
requests, and (optionally) every slot no valid index selects is filled with NaN, so a kernel that
reads anything it must not read produces NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np

from kernels import formats, reference

Q_DTYPES = {
    "float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
    "e4m3": ml_dtypes.float8_e4m3fn,
}


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "e4m3":
        return formats.to_e4m3(x)
    return x.astype(Q_DTYPES[dtype])


def make_block_table(rng, lens, page_size, *, num_pages=None, table_pages=None, stale_pages=1):
    """Scatter requests over a page pool.

    Returns (block_table int32 ``[B, table_pages]``, num_pages, own_pages list of arrays): request
    b's first ``ceil(L_b / P)`` entries are its pages, the next ``stale_pages`` entries point at
    pages of nobody (stale data), the rest are -1.
    """
    lens = [int(x) for x in lens]
    need = [max(1, math.ceil(L / page_size)) if L > 0 else 0 for L in lens]
    table_pages = table_pages or max(max(need) + stale_pages, 1)
    if max(need) > table_pages:
        raise ValueError(f"table_pages {table_pages} cannot hold {max(need)} pages")
    total = sum(need) + stale_pages * len(lens) + 1
    num_pages = max(num_pages or 0, total)
    perm = rng.permutation(num_pages)
    bt = np.full((len(lens), table_pages), -1, np.int32)
    cur = 0
    own = []
    for b, n in enumerate(need):
        bt[b, :n] = perm[cur:cur + n]
        own.append(perm[cur:cur + n])
        cur += n
        s = min(stale_pages, table_pages - n)
        bt[b, n:n + s] = perm[cur:cur + s]
        cur += s
    return bt, num_pages, own


# ============================================================================ sparse MLA

@dataclass
class MLACase:
    """One sparse_mla_decode call: ``sparse_mla_decode(q, kv_cache, indices, sm_scale, **kwargs())``."""

    name: str
    q: np.ndarray                  # [B, N, H, D_qk] float32 / float16 / bfloat16
    kv_cache: np.ndarray           # layout per kv_format
    indices: np.ndarray            # [B, N, K] int32 slots, or logical positions with block_table
    sm_scale: float
    kv_format: str = "latent"
    d_v: int = 512
    block_table: np.ndarray | None = None   # [B, max_pages] int32
    topk_length: np.ndarray | None = None   # [B] int32
    attn_sink: np.ndarray | None = None     # [H] float32
    params: dict = field(default_factory=dict)

    def kwargs(self) -> dict:
        """Keyword arguments of the public call besides q, kv_cache, indices, sm_scale."""
        return dict(kv_format=self.kv_format, d_v=self.d_v, block_table=self.block_table,
                    topk_length=self.topk_length, attn_sink=self.attn_sink)

    def reference(self):
        """(out float64 [B, N, H, d_v], lse float64 [B, N, H])."""
        return reference.sparse_mla_decode(self.q, self.kv_cache, self.indices, self.sm_scale,
                                           **self.kwargs())

    @property
    def q_dtype(self) -> str:
        return self.params.get("q_dtype", "float32")


def _nan_bytes(kv_format: str, kv_cache: np.ndarray, slots: np.ndarray, page_size: int):
    """Overwrite the given slots of a cache with NaN in its own encoding."""
    if slots.size == 0:
        return
    if kv_format == "latent":
        flat = kv_cache.reshape(-1, kv_cache.shape[-1])
        flat[slots] = np.nan
    elif kv_format == "fp8_ds_mla":
        flat = kv_cache.reshape(-1, formats.DS_MLA_BYTES)
        flat[slots, :512] = 0x7F                                            # e4m3 NaN
        flat[slots, 512:528] = np.frombuffer(np.full(4, np.nan, np.float32).tobytes(), np.uint8)
        flat[slots, 528:] = np.frombuffer(np.full(64, 0x7FC0, np.uint16).tobytes(), np.uint8)  # bf16 NaN
    elif kv_format == "fp8_model1":
        pages, offs = slots // page_size, slots % page_size
        d0 = offs * formats.MODEL1_DATA_BYTES
        s0 = page_size * formats.MODEL1_DATA_BYTES + offs * formats.MODEL1_SCALE_BYTES
        for p, a, s in zip(pages, d0, s0):
            kv_cache[p, a:a + formats.MODEL1_NOPE] = 0x7F
            kv_cache[p, a + formats.MODEL1_NOPE:a + formats.MODEL1_DATA_BYTES] = np.frombuffer(
                np.full(64, 0x7FC0, np.uint16).tobytes(), np.uint8)
            kv_cache[p, s:s + 7] = 0xFF                                      # e8m0 NaN


def make_mla_case(seed=0, *, B=2, N=1, H=16, d_qk=576, d_v=512, K=64, P=64, kv_format="latent",
                  q_dtype="float32", kv_dtype="float32", logical=False, invalid=None,
                  topk_length=False, attn_sink=False, nan_unselected=True, duplicates=False,
                  lens=None, sm_scale=None, nan_q=False, inf_q=False, nan_selected=False,
                  name=None) -> MLACase:
    """A random sparse-MLA case with a realistic scattered page layout.

    Args:
      seed: int or np.random.Generator.
      B, N, H, d_qk, d_v, K, P: batch, drafts, heads, latent key width (576 or 512), value width,
        top-k width, page size.
      kv_format: "latent" (rows in ``kv_dtype``), "fp8_ds_mla" (d_qk 576) or "fp8_model1" (512).
      q_dtype: "float32", "float16" or "bfloat16".
      logical: indices are logical positions + block_table (else slots).
      invalid: None, "first", "middle", "all", "random", "oob" (>= num slots / past the table /
        into -1 pages) or "mix" (all of first, middle, random and oob).
      topk_length: pass a random topk_length [B] (one request gets 0 when B > 1).
      attn_sink: pass a random sink [H]; ``"extremes"``: with sink[0] = -inf and sink[1] = +inf
        (factor 1 and 0 on a non-empty row; 0 on an empty row either way).
      nan_unselected: NaN-fill every slot that no counted index selects.
      duplicates: repeat some valid indices.
      lens: per-request context lengths (default random around K, some < K so rows have -1).
      nan_q: one element of q (request 0, draft 0, head 0) is NaN: that head's out and lse are
        NaN (the reference propagates it; docs/SEMANTICS.md).
      inf_q: q[0, 0, 1, 3] = +inf and q[0, 0, 2, 5] = -inf: those heads' scores hold +-inf, so
        their out and lse are NaN in the reference (``exp(s - max)`` is ``inf - inf``).
      nan_selected: one row selected by request 0, draft 0 holds NaN: all its heads are NaN.
    """
    rng = _rng(seed)
    if kv_format == "fp8_ds_mla" and d_qk != 576:
        raise ValueError("fp8_ds_mla needs d_qk=576")
    if kv_format == "fp8_model1" and d_qk != 512:
        raise ValueError("fp8_model1 needs d_qk=512")
    if lens is None:
        lens = rng.integers(max(1, K // 2), 2 * K + 1, size=B)
        if B > 1:
            lens[0] = max(1, K - 3)                      # one request shorter than K
    lens = np.asarray(lens, np.int64)
    bt, num_pages, _ = make_block_table(rng, lens, P)
    latent = rng.standard_normal((num_pages, P, d_qk)).astype(np.float32)
    kv = formats.quantize_kv(latent, kv_format, Q_DTYPES[kv_dtype])
    num_slots = num_pages * P

    # Logical positions: each draft picks K of its request's positions (fewer when L < K).
    logical_idx = np.full((B, N, K), -1, np.int64)
    for b in range(B):
        for i in range(N):
            L = int(lens[b])
            take = min(K, L)
            if take:
                logical_idx[b, i, :take] = rng.choice(L, size=take, replace=False)
            rng.shuffle(logical_idx[b, i])
    if duplicates:
        for b in range(B):
            for i in range(N):
                row = logical_idx[b, i]
                ok = np.flatnonzero(row >= 0)
                if ok.size >= 2:
                    src = rng.choice(ok, size=max(1, ok.size // 4))
                    dst = rng.choice(ok, size=src.size)
                    row[dst] = row[src]
    slots_idx = formats.logical_to_slot(logical_idx, bt, P)
    idx = logical_idx.copy() if logical else slots_idx.copy()
    modes = ["first", "middle", "random", "oob"] if invalid == "mix" else [invalid]
    for mode in modes:
        if mode is None:
            continue
        if mode == "first":
            idx[..., 0] = -1
        elif mode == "middle":
            a = K // 3
            idx[..., a:a + max(1, K // 8)] = -1
        elif mode == "all":
            idx[0, 0, :] = -1
            if B * N == 1:
                idx[:] = -1
        elif mode == "random":
            idx[rng.random(idx.shape) < 0.15] = -1
        elif mode == "oob":
            m = rng.random(idx.shape) < 0.1
            if logical:
                # past the table, and into pages whose entry is -1 or that lie past the table
                choices = np.array([bt.shape[1] * P, bt.shape[1] * P + 7, -5, 2 ** 30])
            else:
                choices = np.array([num_slots, num_slots + 3, -7, 2 ** 30])
            idx[m] = rng.choice(choices, size=int(m.sum()))
        else:
            raise ValueError(f"invalid: unknown mode {mode!r}")
    idx = idx.astype(np.int32)
    tl = None
    if topk_length:
        tl = rng.integers(0, K + 1, size=B).astype(np.int32)
        if B > 1:
            tl[-1] = 0
            tl[0] = K
    sink = rng.standard_normal(H).astype(np.float32) if attn_sink else None
    if attn_sink == "extremes":
        sink[0], sink[1 % H] = -np.inf, np.inf
    if nan_unselected:
        used = reference.resolve_indices(idx, num_slots=num_slots, page_size=P,
                                         block_table=bt if logical else None, topk_length=tl)
        unused = np.setdiff1d(np.arange(num_slots), used[used >= 0])
        _nan_bytes(kv_format, kv, unused, P)
    if nan_selected:
        used = reference.resolve_indices(idx, num_slots=num_slots, page_size=P,
                                         block_table=bt if logical else None, topk_length=tl)
        sel = used[0, 0][used[0, 0] >= 0]
        if sel.size:
            _nan_bytes(kv_format, kv, sel[:1], P)
    q = (0.5 * rng.standard_normal((B, N, H, d_qk))).astype(np.float32)
    if nan_q:
        q[0, 0, 0, 5] = np.nan
    if inf_q:
        q[0, 0, 1, 3], q[0, 0, 2, 5] = np.inf, -np.inf
    q = _cast(q, q_dtype)
    if sm_scale is None:
        sm_scale = d_qk ** -0.5
    params = dict(B=B, N=N, H=H, d_qk=d_qk, d_v=d_v, K=K, P=P, kv_format=kv_format, q_dtype=q_dtype,
                  kv_dtype=kv_dtype if kv_format == "latent" else "fp8", logical=logical,
                  invalid=invalid, topk_length=bool(topk_length), attn_sink=bool(attn_sink),
                  nan_unselected=nan_unselected, duplicates=duplicates,
                  seed=seed if isinstance(seed, int) else None)
    name = name or (f"mla_B{B}_N{N}_H{H}_D{d_qk}_K{K}_P{P}_{kv_format}_{q_dtype}"
                    + ("_logical" if logical else "") + (f"_inv-{invalid}" if invalid else ""))
    return MLACase(name=name, q=q, kv_cache=kv, indices=idx, sm_scale=float(sm_scale),
                   kv_format=kv_format, d_v=d_v, block_table=bt if logical else None,
                   topk_length=tl, attn_sink=sink, params=params)


def mla_small_scale_case(kv_format: str, d_qk: int, *, K: int = 64, seed: int = 5) -> MLACase:
    """fp8 case whose chunk scales are all 2^-13 (the fast path's tile shift is then 2^19) with
    masked entries in its blocks: a masked row must stay 0 in the fp16 tile (a kernel that reads
    scale 1.0 for a masked row gets 1.0 * 2^19 = inf in fp16, and 0 * inf = NaN in the value
    dot). fp16 q, block table, invalid entries of every kind."""
    case = make_mla_case(seed, B=2, H=16, K=K, d_qk=d_qk, kv_format=kv_format,
                         q_dtype="float16", logical=True, invalid="mix")
    kv = case.kv_cache
    if kv_format == "fp8_ds_mla":
        kv[..., 512:528].view(np.float32)[...] = np.float32(2.0 ** -13)
    else:
        from kernels import formats
        n, P = kv.shape[0], formats.model1_page_size(kv.shape[1])
        e = kv[:, P * 576: P * 584].reshape(n, P, 8)
        e[..., :7] = 127 - 13
        kv[:, P * 576: P * 584] = e.reshape(n, P * 8)
    return case


def rescale_mla_cache(case: MLACase, kind: str, rng) -> None:
    """Overwrite an fp8 case's cache scales in place with scales the SPEC quantizer never writes
    (docs/SEMANTICS.md "fast-path numerics"): ``wide``: powers of two from 2^-24 to 2^4, rows of
    one tile spanning 28 binades (beyond the 22 the fp16 tile holds exactly; below 2^-15 e4m3 x
    scale is no fp16 number unless shifted; out stays within fp16 q's range); ``non_pow2``:
    float32 scales that are not powers of two (fp8_ds_mla only; other writers)."""
    kv = case.kv_cache
    if case.kv_format == "fp8_ds_mla":
        sc = kv[..., 512:528].view(np.float32)
        if kind == "wide":
            sc[...] = np.exp2(rng.integers(-24, 5, sc.shape)).astype(np.float32)
        else:
            sc[...] = rng.uniform(0.01, 3.0, sc.shape).astype(np.float32)
    else:
        from kernels import formats
        n, P = kv.shape[0], formats.model1_page_size(kv.shape[1])
        e = kv[:, P * 576: P * 584].reshape(n, P, 8)
        e[..., :7] = (127 + rng.integers(-24, 5, (n, P, 7))).astype(np.uint8)
        kv[:, P * 576: P * 584] = e.reshape(n, P * 8)


def mla_corner_cases(seed=0, *, d_qk=576, H=16, K=64, kv_format=None, q_dtype="float32",
                     kv_dtype="float32") -> list[MLACase]:
    """Every SPEC corner case of sparse_mla_decode as a named case (small shapes)."""
    fmt = kv_format or "latent"
    base = dict(d_qk=d_qk, H=H, K=K, kv_format=fmt, q_dtype=q_dtype, kv_dtype=kv_dtype)
    spec = [
        ("all_invalid", dict(B=1, invalid="all")),
        ("all_invalid_row_in_batch", dict(B=2, N=2, invalid="all")),
        ("invalid_first", dict(invalid="first")),
        ("invalid_middle", dict(invalid="middle")),
        ("invalid_random", dict(invalid="random")),
        ("out_of_range_slots", dict(invalid="oob")),
        ("logical_block_table", dict(logical=True)),
        ("logical_out_of_range", dict(logical=True, invalid="mix")),
        ("topk_length", dict(B=3, topk_length=True)),
        ("duplicates", dict(duplicates=True)),
        ("attn_sink", dict(attn_sink="extremes")),
        ("attn_sink_empty_row", dict(B=2, attn_sink="extremes", invalid="all")),
        ("K_gt_L", dict(B=2, lens=[K // 4, 3])),
        ("zero_length_request", dict(B=2, lens=[0, K])),
        ("page_size_1", dict(P=1)),
        ("page_size_2", dict(P=2)),
        ("odd_page_61", dict(P=61, logical=True)),
        ("K_not_pow2", dict(K=K + 36 if K > 16 else K + 3)),
        ("mtp_N4", dict(N=4, logical=True, invalid="random")),
        ("no_nan_fill", dict(nan_unselected=False)),
        ("nan_in_q", dict(B=2, nan_q=True)),
        ("nan_in_selected_row", dict(B=2, nan_selected=True)),
    ]
    out = []
    for i, (name, kw) in enumerate(spec):
        args = {**base, **kw}
        out.append(make_mla_case(seed * 1000 + i, name=f"{name}[{fmt},D{d_qk}]", **args))
    return out


# ============================================================================ indexer

@dataclass
class IndexerCase:
    """One indexer call: ``indexer_topk(q, weights, k_cache, block_table, context_lens, topk, k_format=...)``."""

    name: str
    q: np.ndarray              # [B, N, H_I, D_I] float8_e4m3fn (or float with "dense")
    weights: np.ndarray        # [B, N, H_I] float32
    k_cache: np.ndarray        # fp8_indexer uint8 [num_pages, P*(D_I+4)] or dense [num_pages, P, D_I]
    block_table: np.ndarray    # [B, max_pages] int32
    context_lens: np.ndarray   # [B] or [B, N] int32
    topk: int
    k_format: str = "fp8_indexer"
    params: dict = field(default_factory=dict)

    def args(self) -> tuple:
        return (self.q, self.weights, self.k_cache, self.block_table, self.context_lens)

    def reference_logits(self) -> np.ndarray:
        """float64 [B, N, max_pages * P]."""
        return reference.indexer_logits(*self.args(), k_format=self.k_format)

    def reference(self) -> np.ndarray:
        """int32 [B, N, topk], sorted, -1 padded."""
        return reference.topk_from_logits(self.reference_logits(), self.topk)


def make_indexer_case(seed=0, *, B=2, N=1, H_I=16, D_I=128, P=64, lens=None, max_len=512,
                      table_len=None, k_format="fp8_indexer", q_dtype=None, topk=64,
                      context_lens_2d=False, ties=False, stale=True, nan_rows=False,
                      neg_pages=False, scale_fmt="ue8m0", structured=False, name=None) -> IndexerCase:
    """A random indexer case.

    Args:
      lens: per-request L_b (counting the N new tokens); default random in [1, max_len].
      table_len: block-table capacity in positions (default: just enough + one stale page).
      k_format: "fp8_indexer" (q e4m3) or "dense" (q ``q_dtype``, default float32).
      context_lens_2d: pass context_lens [B, N] (each <= the MTP default).
      ties: many positions share identical keys, so the top-k threshold falls inside a tie.
      stale: pages and page tails past L_b hold huge keys (must never be selected).
      nan_rows: a few valid positions hold NaN keys (never selected).
      neg_pages: a page inside some request's valid range has block-table entry -1 (its logits
        are -inf, never read).
      structured: realistic scores: recent tokens and a few early "sink" tokens score high.
    """
    rng = _rng(seed)
    if lens is None:
        lens = rng.integers(1, max_len + 1, size=B)
    lens = np.asarray(lens, np.int64)
    table_pages = None if table_len is None else -(-int(table_len) // P)
    bt, num_pages, own = make_block_table(rng, lens, P, table_pages=table_pages)
    keys = rng.standard_normal((num_pages, P, D_I)).astype(np.float32)
    if structured:
        direction = rng.standard_normal(D_I).astype(np.float32)
        direction /= np.linalg.norm(direction)
        for b in range(B):
            L = int(lens[b])
            for j in list(range(min(4, L))) + list(range(max(0, L - 64), L)):
                p, o = own[b][j // P], j % P
                keys[p, o] += 3.0 * direction * (1.0 + (j >= L - 64) * (j - (L - 64)) / 64)
    stale_mask = np.zeros((num_pages, P), bool)
    if stale:
        used = np.zeros((num_pages, P), bool)
        for b in range(B):
            for j in range(int(lens[b])):
                used[own[b][j // P], j % P] = True
        stale_mask = ~used
        keys[stale_mask] = 50.0 * np.abs(keys[stale_mask]) + 20.0
    if k_format == "fp8_indexer":
        kc = formats.quantize_fp8_indexer(keys, scale_fmt)
        if stale:                     # make stale scores enormous even after per-token scaling
            vals, scales = formats.split_fp8_indexer(kc, D_I)
            sc = scales.copy()
            sc[stale_mask] = 1e4
            kc[:, P * D_I:] = np.ascontiguousarray(sc).view(np.uint8).reshape(num_pages, 4 * P)
        q_dt = q_dtype or "e4m3"
    elif k_format == "dense":
        kc = keys.astype(Q_DTYPES[q_dtype or "float32"])
        q_dt = q_dtype or "float32"
    else:
        raise ValueError(f"k_format: expected one of {formats.K_FORMATS}, got {k_format!r}")
    q = _cast(rng.standard_normal((B, N, H_I, D_I)).astype(np.float32) * 2.0, q_dt)
    weights = (rng.standard_normal((B, N, H_I)) * (H_I ** -0.5) * (D_I ** -0.5)).astype(np.float32)
    if ties:
        # copy the token ranked topk-th for draft 0 onto a third of the request's positions, so
        # the top-k threshold falls inside a group of exactly equal logits
        lg = reference.indexer_logits(q, weights, kc, bt, lens, k_format=k_format)
        for b in range(B):
            L = int(lens[b])
            if L < 2:
                continue
            order = reference.topk_from_logits(lg[b, :1], min(topk, L))[0]
            src = int(order[order >= 0][-1])
            for j in rng.choice(L, size=max(1, L // 3), replace=False):
                _copy_token(kc, k_format, (own[b][src // P], src % P), (own[b][j // P], j % P), P, D_I)
    if nan_rows:
        for b in range(B):
            L = int(lens[b])
            for j in rng.choice(L, size=min(L, 3), replace=False) if L else []:
                p, o = own[b][j // P], j % P
                if k_format == "fp8_indexer":
                    kc[p, o * D_I:(o + 1) * D_I] = 0x7F
                else:
                    kc[p, o] = np.nan
    if neg_pages:
        for b in range(B):
            n = -(-int(lens[b]) // P)
            if n >= 2:
                bt[b, n // 2] = -1
    if context_lens_2d:
        base = reference.valid_lengths(lens, B, N)
        cl = np.maximum(base - rng.integers(0, 3, size=(B, N)), 0).astype(np.int32)
    else:
        cl = lens.astype(np.int32)
    params = dict(B=B, N=N, H_I=H_I, D_I=D_I, P=P, L=int(lens.max(initial=0)), topk=topk,
                  k_format=k_format, table_len=bt.shape[1] * P, ties=ties, stale=stale,
                  nan_rows=nan_rows, neg_pages=neg_pages, context_lens_2d=context_lens_2d,
                  seed=seed if isinstance(seed, int) else None)
    name = name or f"idx_B{B}_N{N}_H{H_I}_P{P}_L{int(lens.max(initial=0))}_K{topk}_{k_format}"
    return IndexerCase(name=name, q=q, weights=weights, k_cache=kc, block_table=bt,
                       context_lens=cl, topk=topk, k_format=k_format, params=params)


def _copy_token(kc, k_format, src, dst, P, D_I):
    (p0, o0), (p1, o1) = src, dst
    if k_format == "fp8_indexer":
        kc[p1, o1 * D_I:(o1 + 1) * D_I] = kc[p0, o0 * D_I:(o0 + 1) * D_I]
        kc[p1, P * D_I + 4 * o1:P * D_I + 4 * o1 + 4] = kc[p0, P * D_I + 4 * o0:P * D_I + 4 * o0 + 4]
    else:
        kc[p1, o1] = kc[p0, o0]


def indexer_corner_cases(seed=0, *, H_I=16, topk=64, P=16) -> list[IndexerCase]:
    """Every SPEC corner case of the indexer as a named case (small shapes)."""
    K = topk
    spec = [
        ("len_0", dict(lens=[0, K])),
        ("len_1", dict(lens=[1, 5])),
        ("len_K-1", dict(lens=[K - 1, K - 1])),
        ("len_K", dict(lens=[K, K])),
        ("len_K+1", dict(lens=[K + 1, K + 1])),
        ("len_not_multiple_of_P", dict(lens=[3 * P + 5, 7 * P - 1])),
        ("mtp_N2", dict(N=2, lens=[K + 9, 4 * K])),
        ("mtp_N4", dict(N=4, lens=[2, 3 * K + 1])),
        ("mtp_N3_context_lens_2d", dict(N=3, lens=[K + 5, 3 * K], context_lens_2d=True)),
        ("ties", dict(lens=[4 * K, 2 * K + 3], ties=True)),
        ("nan_rows", dict(lens=[3 * K, K + 2], nan_rows=True)),
        ("stale_beyond_L", dict(lens=[K // 2 + 1, 2 * K + 1], stale=True)),
        ("negative_page_entries", dict(lens=[4 * K, 3 * K], neg_pages=True)),
        ("K_gt_L", dict(lens=[K // 3, K // 2])),
        ("table_much_wider_than_L", dict(lens=[K + 3, 2 * K], table_len=16 * K)),
        ("dense_float32", dict(lens=[2 * K, K + 7], k_format="dense")),
        ("structured_scores", dict(lens=[4 * K, 5 * K], structured=True)),
    ]
    return [make_indexer_case(seed * 1000 + i, H_I=H_I, topk=topk, P=P, name=name, **kw)
            for i, (name, kw) in enumerate(spec)]
