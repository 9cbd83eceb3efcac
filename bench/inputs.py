"""Benchmark inputs, generated on the device (caches of up to tens of GB cannot come from NumPy).

Each fp8 cache is written field by field at the offsets of its ``kernels.layouts`` descriptor (the
layouts ``kernels.formats`` writes, SPEC "Cache layouts"); values are random but
valid: e4m3 bytes are conversions of finite floats (never the NaN pattern), fp8_ds_mla scales are
powers of two (float32), fp8_model1 scales ue8m0 bytes 118..124, rope dims bf16, indexer scales
positive float32. The test suite's generators (``kernels.cases``) build the same layouts through
the NumPy quantizers; the bench cannot, at B x L = 16M tokens.

Every request b owns ``ceil(L / P)`` pages, scattered over the cache by a random permutation
(as a paged allocator leaves them); block-table entries past them are -1. All requests have
``L_b = L``. Each shape gets ``R`` independent input sets ("rotations", separate allocations)
so that a timing loop cycling through them touches more than twice the L2 cache (60 MB on H200)
and measures HBM, not L2, traffic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bench.grid import Shape

L2_BYTES = 60 << 20          # H200 L2 (50 MB on H100; the rotation target is 2x this)
MAX_ROTATIONS = 32


def rotations_for(touched_bytes: int, footprint_bytes: int, *, max_bytes: int,
                  l2_bytes: int = L2_BYTES, cap: int = MAX_ROTATIONS) -> int:
    """Input sets to cycle through so the touched bytes of all sets exceed 2 x L2, within
    ``max_bytes`` of device memory for all sets."""
    want = max(1, math.ceil(2 * l2_bytes / max(1, touched_bytes)))
    fit = max(1, max_bytes // max(1, footprint_bytes))
    return int(min(want, fit, cap))


@dataclass
class Inputs:
    """Input sets of one shape. ``sets[r]`` maps argument names to torch tensors:

    indexer: ``iq`` [B, N, H_I, D_I] float8_e4m3fn, ``iw`` [B, N, H_I] float32, ``k_cache``
    uint8 [num_pages, P * (D_I + 4)], ``block_table`` [B, table_pages] int32, ``context_lens``
    [B] int32. sparse MLA: ``q`` [B, N, H, D_qk] (q_dtype), ``kv_cache`` (layout of
    ``kv_format``), ``indices`` [B, N, K] int32 logical positions (top-k then window),
    ``window_idx`` [B, N, window] int32, ``attn_sink`` [H] float32 or None. decode layer:
    ``x`` [B, N, hidden] (q_dtype), ``kv_cache``, ``k_cache``, ``block_table``,
    ``context_lens``; ``extra["layer_weights"]`` holds the layer's full weights (host NumPy
    float32, rounded to ``q_dtype`` values so the float64 reference sees what the layer holds).
    """

    shape: Shape
    sets: list[dict]
    sm_scale: float
    q_dtype: str
    kv_itemsize: int
    lens: list[int]
    device: str
    extra: dict = field(default_factory=dict)


def _rand_e4m3(torch, shape, gen, device, scale=4.0):
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale
    return x.clamp_(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)


def _fill_chunks(n_pages: int, chunk: int, fill):
    for a in range(0, n_pages, chunk):
        fill(a, min(n_pages, a + chunk))


def _bf16_bytes(torch, shape, gen, device):
    return torch.randn(shape, generator=gen, device=device).to(torch.bfloat16).contiguous().view(
        torch.uint8)


def _ds_mla_cache(torch, pages, P, gen, device):
    from kernels.layouts import FP8_DS_MLA as lay
    nope, scale, rope = lay.field("nope"), lay.field("scale"), lay.field("rope")
    out = torch.empty((pages, P, lay.data.nbytes), dtype=torch.uint8, device=device)

    def fill(a, b):
        n = b - a
        out[a:b, :, nope.offset:nope.end] = _rand_e4m3(torch, (n, P, nope.count), gen, device)
        e = torch.randint(-8, -4, (n, P, scale.count), generator=gen, device=device).float()
        out[a:b, :, scale.offset:scale.end] = torch.exp2(e).contiguous().view(torch.uint8)
        out[a:b, :, rope.offset:rope.end] = _bf16_bytes(torch, (n, P, rope.count), gen, device)
    _fill_chunks(pages, max(1, (1 << 26) // lay.page_bytes(P)), fill)
    return out


def _model1_cache(torch, pages, P, gen, device):
    from kernels.layouts import FP8_MODEL1 as lay
    nope, rope, scale = lay.field("nope"), lay.field("rope"), lay.field("scale")
    s0 = lay.scale_offset(P, 0)
    out = torch.zeros((pages, lay.page_bytes(P)), dtype=torch.uint8, device=device)

    def fill(a, b):
        n = b - a
        data = torch.empty((n, P, lay.data.nbytes), dtype=torch.uint8, device=device)
        data[..., nope.offset:nope.end] = _rand_e4m3(torch, (n, P, nope.count), gen, device)
        data[..., rope.offset:rope.end] = _bf16_bytes(torch, (n, P, rope.count), gen, device)
        sc = torch.zeros((n, P, lay.scale.nbytes), dtype=torch.uint8, device=device)   # pad: 0
        sc[..., scale.offset:scale.end] = torch.randint(118, 125, (n, P, scale.count), generator=gen,
                                                        device=device).to(torch.uint8)
        out[a:b, :s0] = data.view(n, s0)
        out[a:b, s0: lay.scale_offset(P, P)] = sc.view(n, P * lay.scale.nbytes)
    _fill_chunks(pages, max(1, (1 << 26) // lay.page_bytes(P)), fill)
    return out


def _latent_cache(torch, pages, P, d_qk, dtype, gen, device):
    out = torch.empty((pages, P, d_qk), dtype=dtype, device=device)

    def fill(a, b):
        out[a:b] = torch.randn((b - a, P, d_qk), generator=gen, device=device).to(dtype)
    _fill_chunks(pages, max(1, (1 << 25) // (P * d_qk)), fill)
    return out


def _indexer_cache(torch, pages, P, D, gen, device):
    from kernels.layouts import fp8_indexer
    lay = fp8_indexer(D)
    s0 = lay.scale_offset(P, 0)
    out = torch.empty((pages, lay.page_bytes(P)), dtype=torch.uint8, device=device)

    def fill(a, b):
        n = b - a
        out[a:b, :s0] = _rand_e4m3(torch, (n, P * D), gen, device)
        sc = torch.rand((n, P), generator=gen, device=device) * 0.02 + 0.001
        out[a:b, s0:] = sc.contiguous().view(torch.uint8)
    _fill_chunks(pages, max(1, (1 << 26) // lay.page_bytes(P)), fill)
    return out


def _distinct_positions(torch, rows, hi, k, gen, device):
    """[rows, k] int64: k distinct random positions in [0, hi) per row (hi >= k)."""
    out = torch.empty((rows, k), dtype=torch.int64, device=device)
    step = max(1, (1 << 26) // max(1, hi))
    for a in range(0, rows, step):
        b = min(rows, a + step)
        r = torch.rand((b - a, hi), generator=gen, device=device)
        out[a:b] = r.topk(k, dim=-1).indices
    return out


def make_inputs(shape: Shape, *, rotations: int, device: str, q_dtype: str, latent_dtype: str,
                seed: int = 0) -> Inputs:
    """Generate ``rotations`` input sets of ``shape`` on ``device`` (torch)."""
    import torch

    p = shape.p
    B, N, P, L = shape.B, shape.N, shape.P, shape.L
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    ppr = -(-L // P)
    table_pages = shape.table_positions // P
    pages = B * ppr
    layer = shape.op == "dsa_decode_layer"
    need_indexer = shape.op in ("indexer_topk", "dsa_decode_step")
    need_mla = shape.op in ("sparse_mla_decode", "dsa_decode_step")
    extra: dict = {}
    if layer:
        extra["layer_weights"] = layer_weights(shape.layer_cfg, q_dtype, seed)
    sets = []
    sm_scale = p.sm_scale if p.sm_scale is not None else p.d_qk ** -0.5
    sink = None
    if need_mla and p.attn_sink:
        sink = torch.randn((shape.H,), generator=gen, device=device, dtype=torch.float32)
    for _ in range(rotations):
        s: dict = {}
        perm = torch.randperm(pages, generator=gen, device=device).to(torch.int32)
        bt = torch.full((B, table_pages), -1, dtype=torch.int32, device=device)
        bt[:, :ppr] = perm.view(B, ppr)
        s["block_table"] = bt
        s["context_lens"] = torch.full((B,), L, dtype=torch.int32, device=device)
        if need_indexer:
            HI, DI = p.index_heads, p.index_head_dim
            s["iq"] = (torch.randn((B, N, HI, DI), generator=gen, device=device) * 2.0).to(torch.float8_e4m3fn)
            s["iw"] = (torch.randn((B, N, HI), generator=gen, device=device) * (HI ** -0.5) * (DI ** -0.5)).float()
            s["k_cache"] = _indexer_cache(torch, pages, P, DI, gen, device)
        if need_mla:
            H, D = shape.H, p.d_qk
            s["q"] = (torch.randn((B, N, H, D), generator=gen, device=device) * 0.5).to(tdt[q_dtype])
            s["kv_cache"] = _kv_cache(torch, shape, pages, P, tdt[latent_dtype], gen, device)
            Kt, Wn = shape.K_topk, shape.W_window
            # draft i sees L - (N - 1 - i) positions; its window is the last Wn of them
            span = L - (N - 1) - Wn
            if span < Kt:
                raise ValueError(f"shape: L={L} leaves {span} positions for top-k {Kt} + window {Wn}")
            top = _distinct_positions(torch, B * N, span, Kt, gen, device).view(B, N, Kt)
            drafts = torch.arange(N, device=device).view(1, N, 1)
            win = (L - (N - 1) + drafts - Wn + torch.arange(Wn, device=device).view(1, 1, Wn)).expand(B, N, Wn)
            s["window_idx"] = win.to(torch.int32).contiguous()
            s["indices"] = torch.cat([top, win.to(torch.int64)], dim=-1).to(torch.int32).contiguous()
            s["attn_sink"] = sink
        if layer:
            # the layer writes the N new tokens at positions L - N + i (mapped: the request owns
            # ceil(L / P) pages) and computes q, the indexer q / weights and the sink itself
            cfg = shape.layer_cfg
            s["x"] = torch.randn((B, N, cfg.hidden), generator=gen, device=device).to(tdt[q_dtype])
            s["k_cache"] = _indexer_cache(torch, pages, P, cfg.index_head_dim, gen, device)
            s["kv_cache"] = _kv_cache(torch, shape, pages, P, tdt[latent_dtype], gen, device)
        sets.append(s)
    kv_itemsize = tdt[latent_dtype].itemsize if shape.kv_format == "latent" else 1
    if device != "cpu":
        torch.cuda.synchronize()
    return Inputs(shape=shape, sets=sets, sm_scale=float(sm_scale), q_dtype=q_dtype,
                  kv_itemsize=kv_itemsize, lens=[L] * B, device=device, extra=extra)


def _kv_cache(torch, shape: Shape, pages: int, P: int, latent_dtype, gen, device):
    """A latent cache of ``pages`` pages in the shape's layout."""
    if shape.kv_format == "latent":
        return _latent_cache(torch, pages, P, shape.p.d_qk, latent_dtype, gen, device)
    if shape.kv_format == "fp8_ds_mla":
        return _ds_mla_cache(torch, pages, P, gen, device)
    return _model1_cache(torch, pages, P, gen, device)


def layer_weights(cfg, dtype: str, seed: int = 0) -> dict:
    """Full (unsharded) random layer weights (``kernels.layer_reference.init_weights``) as host
    float32 NumPy arrays whose values are exactly representable in ``dtype`` (``"bfloat16"``,
    ``"float16"`` or ``"float32"``): the layer casts them without rounding, so the float64
    reference fed these arrays sees the layer's weights."""
    from kernels import cases as kcases
    from kernels import layer_reference as lref
    w = lref.init_weights(cfg, seed)
    if dtype == "float32":
        return w
    return {k: v.astype(kcases.Q_DTYPES[dtype]).astype(np.float32) for k, v in w.items()}


# ----------------------------------------------------------------------------- reference slices

def to_numpy_exact(t):
    """torch tensor -> NumPy with bf16 / e4m3 kept bit-exact as ml_dtypes."""
    import ml_dtypes
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return t.numpy()


def mla_slice(inp: Inputs, s: dict, b: int, indices=None) -> dict:
    """A compact, reference-sized copy of request ``b``'s sparse-MLA problem.

    Gathers exactly the cache rows request b's index lists select (bytes as stored) into a
    compact cache of the same layout with page size 1, remaps the indices to it (invalid stay
    -1, duplicates kept) and returns the arguments of ``kernels.reference.sparse_mla_decode``.
    """
    from kernels import formats

    P = inp.shape.P
    idx = (s["indices"] if indices is None else indices)[b].detach().cpu().numpy().astype(np.int64)  # [N, K]
    bt = s["block_table"][b: b + 1].detach().cpu().numpy()
    slots = formats.logical_to_slot(idx[None], bt, P)[0]                        # [N, K]
    kv = s["kv_cache"]
    fmt = inp.shape.kv_format
    n_slots = kv.shape[0] * P
    slots = np.where((slots >= 0) & (slots < n_slots), slots, -1)
    uniq, inv = np.unique(slots[slots >= 0], return_inverse=True)
    remap = np.full(slots.shape, -1, np.int64)
    remap[slots >= 0] = inv
    import torch
    u = torch.as_tensor(uniq, device=kv.device)
    if fmt == "fp8_model1":
        from kernels.layouts import FP8_MODEL1 as lay
        db, sb = lay.data.nbytes, lay.scale.nbytes
        pairs = list(zip((u // P).tolist(), (u % P).tolist()))
        data = torch.stack([kv[pg, lay.data_offset(o): lay.data_offset(o) + db] for pg, o in pairs]) \
            if pairs else torch.empty((0, db), dtype=torch.uint8)
        sc = torch.stack([kv[pg, lay.scale_offset(P, o): lay.scale_offset(P, o) + sb] for pg, o in pairs]) \
            if pairs else torch.empty((0, sb), dtype=torch.uint8)
        compact = np.zeros((max(1, len(uniq)), lay.page_bytes(1)), np.uint8)      # pages of 1 slot
        compact[: len(uniq), :db] = data.cpu().numpy()
        compact[: len(uniq), lay.scale_offset(1, 0): lay.scale_offset(1, 1)] = sc.cpu().numpy()
    else:
        flat = kv.reshape(-1, kv.shape[-1])
        rows = to_numpy_exact(flat[u]) if len(uniq) else to_numpy_exact(flat[:1])
        compact = rows.reshape(rows.shape[0], 1, rows.shape[-1])
    q = to_numpy_exact(s["q"][b: b + 1])
    sink = None if s.get("attn_sink") is None else s["attn_sink"].detach().cpu().numpy()
    p = inp.shape.p
    return dict(q=q, kv_cache=compact, indices=remap[None].astype(np.int32), sm_scale=inp.sm_scale,
                kv_format=fmt, d_v=p.d_v, attn_sink=sink)


def indexer_slice(inp: Inputs, s: dict, b: int, window: int = 0) -> dict:
    """Request ``b``'s indexer problem over its own pages only (same page order, so logical
    positions are unchanged): the arguments of ``kernels.reference.indexer_logits``. With
    ``window`` > 0, the lengths a step with that V4 window gives its indexer: each draft's
    valid length minus ``window`` (``[1, N]``)."""
    P = inp.shape.P
    L = inp.lens[b]
    n = -(-L // P)
    pages = s["block_table"][b, :n].long()
    kc = s["k_cache"][pages].detach().cpu().numpy()
    return dict(q=to_numpy_exact(s["iq"][b: b + 1]), weights=s["iw"][b: b + 1].detach().cpu().numpy(),
                k_cache=kc, block_table=np.arange(n, dtype=np.int32)[None],
                context_lens=_indexer_lens(L, inp.shape.N, window))


def _indexer_lens(L: int, N: int, window: int) -> np.ndarray:
    if not window:
        return np.array([L], np.int32)
    from kernels.reference import valid_lengths
    return np.maximum(valid_lengths(np.array([L]), 1, N) - window, 0).astype(np.int32)


def _take_pages(x, pages: np.ndarray) -> np.ndarray:
    """Pages ``pages`` (leading axis) of a torch / jax cache, as NumPy (bytes / values exact)."""
    if hasattr(x, "detach"):                                   # torch
        import torch
        return to_numpy_exact(x[torch.as_tensor(pages, device=x.device)])
    return np.asarray(x[np.asarray(pages)])                    # jax (ml_dtypes kept)


def _host(x) -> np.ndarray:
    """A torch / jax output as NumPy, bf16 / e4m3 kept exact (ml_dtypes)."""
    return to_numpy_exact(x) if hasattr(x, "detach") else np.asarray(x)


def layer_slice(inp: Inputs, s: dict, b: int, outputs: dict) -> tuple:
    """Request ``b``'s decode-layer step, small enough for the float64 reference.

    Request b's pages (in block-table order) become a compact pool with the identity block
    table, so logical positions are unchanged. Returns ``(case, got)``: ``case`` a
    ``kernels.layer_reference.LayerCase`` (x, the caches as given in ``s`` and
    ``extra["layer_weights"]``; the reference rewrites the new tokens' rows itself, so a cache
    the layer already wrote in place serves as well), ``got`` the layer's outputs for request b
    (``out``, ``indices``, ``idx_q``, ``idx_weights``, ``idx_context_lens``, and ``k_cache``:
    the layer's cache *after* its write, compacted the same way) as
    ``kernels.layer_compare.check_low_precision_step`` takes them.
    """
    from kernels import layer_reference as lref

    sh = inp.shape
    cfg = sh.layer_cfg
    L = inp.lens[b]
    n = -(-L // sh.P)
    pages = s["block_table"][b, :n].detach().cpu().numpy().astype(np.int64)
    case = lref.LayerCase(
        name=f"{sh.label()} request {b}", cfg=cfg, weights=inp.extra["layer_weights"],
        x=to_numpy_exact(s["x"][b: b + 1]).astype(np.float32),
        kv_cache=_take_pages(s["kv_cache"], pages), k_cache=_take_pages(s["k_cache"], pages),
        block_table=np.arange(n, dtype=np.int32)[None], context_lens=np.array([L], np.int32),
        kv_format=sh.kv_format)
    got = {k: _host(outputs[k])[b: b + 1] for k in ("out", "indices", "idx_q", "idx_weights",
                                                     "idx_context_lens")}
    got["k_cache"] = _take_pages(outputs["k_cache"], pages)
    return case, got
