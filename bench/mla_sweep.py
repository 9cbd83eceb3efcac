"""Config sweep of the sparse-MLA split kernel (kernels/sparse_mla/triton.py) on the current GPU,
at the bench's fp8 sparse-MLA rows, timed as the bench times them.

    python -m bench.mla_sweep --out sweep.json [--config H,K,W,S[,P] ...] [--splits-scale 1 2]
                              [--only-extra] [--targets] [--heads 16 8]
    python -m bench.mla_sweep --small-heads --out sweep.json    # the occupancy-first variants
    python -m bench.mla_sweep --small-heads --dry-run --out /tmp/s.json   # CPU interpreter

Shapes are ``bench.grid`` shapes (block table, logical indices, the V4 window and sink: what
``python -m bench`` runs); default the DSV32 B 64 H 128 / H 16 and V4-Flash B 64 H 64 rows,
``--targets`` every fp8 sparse-MLA row of the targets grid, ``--heads`` keeps those head counts.
Variants: the binding's own choice (``path="triton"``: the dispatch table or the heuristic, the
baseline every row is compared with), then each member of the GPU's search space
(``kernels.sparse_mla.configs.sparse_mla_space``) at the launcher's split count times each
``--splits-scale`` factor, then the ``--config`` extras (outside the space too).
``--l2-hint`` runs the binding's own choice three times: as committed, then with every Gluon
producer's L2 hint of the next row block off and on (:data:`L2_HINT_CONSTANTS`; a variant's
``constants`` are set for its run only). ``--small-heads`` instead runs
:data:`SMALL_HEAD_VARIANTS` (chosen from AOT counts:
``bench.mla_aot_counts``, bench/NOTES.md "Small heads: occupancy-first variant space") on the
V3.2 H 16, V4-Flash H 8 and V4-Flash H 64 rows, the baseline first.

Each variant is run once and checked against the float64 reference (``bench.checks.Checker``:
two requests' slices, SPEC tolerances; a failing variant is not timed), then timed with
``bench.timing.time_torch_cuda``: one CUDA graph holding one call per rotated input set
(``bench.inputs.rotations_for``: the sets together exceed twice the L2), replayed; median / p20 /
p80 us per call, no Python or launch overhead (the old sweep timed the Python launcher with
``do_bench``, so rows under ~150 us were launch-bound). Each shape's variants run in a child
process (``--variant-timeout`` seconds a variant, ``--setup-timeout`` for the inputs); a variant
that faults (CUDA errors are sticky) or hangs is recorded as an error row and a fresh child
resumes with the next one. ``--no-isolate`` runs everything in this process. ``--dry-run``
runs the same variants in the CPU interpreter on tiny shapes (fp16 q; variants that the
interpreter would run identically, i.e. differing only in warps / stages, share one row).
Rows stream to stdout as JSON lines; ``--out`` is rewritten after every row (``partial`` until
the end), with a per-shape ``summary`` (baseline, fastest variant, speed-up).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from kernels.sparse_mla import configs

MLA = "sparse_mla_decode"


def _inputs(B, H, K, d_qk, kv_format, pages_per_req=512, P=64, seed=0):
    """(q bf16 [B, 1, H, d_qk], cache, slots [B, 1, K]) on the GPU: random finite rows of
    ``kv_format`` (``latent``: bf16), K distinct-ish slots of each request's own 512 pages.
    (The sweep itself uses ``bench.inputs``; bench.gluon_check and bench.ncu_mla use this.)"""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    num_pages = B * pages_per_req
    if kv_format == "latent":
        kv = torch.empty((num_pages, P, d_qk), dtype=torch.bfloat16, device="cuda")
        kv.normal_(generator=g)
    elif kv_format == "fp8_ds_mla":
        kv = torch.randint(0, 256, (num_pages, P, 656), dtype=torch.uint8, device="cuda", generator=g)
        kv[..., :512] &= 0x77                                  # finite e4m3, |x| < 256
        kv[..., 512:528] = torch.tensor([1.0] * 4, device="cuda").view(torch.uint8)
        kv[..., 528:].view(torch.bfloat16).normal_(generator=g)
    else:                                                      # fp8_model1
        from kernels import formats
        pb = formats.model1_page_bytes(P)
        kv = torch.randint(0, 256, (num_pages, pb), dtype=torch.uint8, device="cuda", generator=g)
        data = kv[:, :P * 576].view(num_pages, P, 576)
        data[..., :448] &= 0x77
        data[..., 448:].view(torch.bfloat16).normal_(generator=g)
        kv[:, P * 576:P * 584].view(num_pages, P, 8)[..., :7] = 127
    idx = draw_indices(B, K, pages_per_req * P, g)
    q = torch.randn(B, 1, H, d_qk, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, kv, idx


def draw_indices(B: int, K: int, L: int, generator):
    """int32 slots ``[B, 1, K]`` on the GPU: request b's K rows drawn uniformly (repeats allowed)
    from its own L slots ``[b L, (b + 1) L)`` (:func:`_inputs`' layout: each request's pages
    back to back)."""
    import torch
    base = torch.arange(B, device="cuda")[:, None, None] * L
    return ((torch.rand(B, 1, K, device="cuda", generator=generator) * L).long() + base).int()


# ------------------------------------------------------------------------------ shapes

def _shape(preset, B, N, tp, L, **kw):
    from bench.grid import Shape
    return Shape(MLA, preset, B, N, tp, L, "fp8", **kw)


def default_shapes() -> dict:
    from bench.grid import K32
    return {"v32_h128": _shape("DSV32", 64, 1, 1, K32), "v32_h16": _shape("DSV32", 64, 1, 8, K32),
            "v4_h64": _shape("DSV4_FLASH", 64, 1, 1, K32)}


def target_shapes() -> dict:
    """The fp8 sparse-MLA rows of the bench's targets grid, keyed by a short name."""
    from bench import grid
    out = {}
    for s in grid.targets_grid():
        if s.op == MLA and s.kv == "fp8":
            out[f"{'v4' if s.preset == 'DSV4_FLASH' else 'v32'}_b{s.B}_n{s.N}_h{s.H}"] = s
    return out


def small_head_shapes(dry: bool = False) -> dict:
    """The three rows ``--small-heads`` runs (the bench's targets rows); ``dry``: tiny versions
    for the interpreter (L 256, top-k 64, V4 window 16; same heads, formats, sink)."""
    if dry:
        return {"v32_h16": _shape("DSV32", 2, 1, 8, 256, topk=64, window=0),
                "v4_h8": _shape("DSV4_FLASH", 2, 1, 8, 256, topk=48, window=16),
                "v4_h64": _shape("DSV4_FLASH", 1, 1, 1, 256, topk=48, window=16)}
    from bench.grid import K32
    return {"v32_h16": _shape("DSV32", 64, 1, 8, K32), "v4_h8": _shape("DSV4_FLASH", 64, 1, 8, K32),
            "v4_h64": _shape("DSV4_FLASH", 64, 1, 1, K32)}


# ------------------------------------------------------------------------------ variants
# A variant: {"name", "config": SparseMLAConfig fields or None (the binding's own choice through
# the public op, path="triton": the baseline), "splits": an explicit split count or None,
# "ctas_per_sm": CTAs per SM to size the split count with (configs.sparse_mla_num_splits; the
# AOT-counted residency, where the launcher's rule assumes 255 registers) or None (the
# launcher's rule), "scale": factor on that split count}.

BASELINE = {"name": "baseline", "config": None, "splits": None, "ctas_per_sm": None, "scale": 1.0}


def _v(name, h, k, w, s, pf, ctas=None, scale=1.0, splits=None) -> dict:
    return {"name": name, "config": dict(block_h=h, block_k=k, num_warps=w, num_stages=s,
                                         prefetch=bool(pf)),
            "splits": splits, "ctas_per_sm": ctas, "scale": scale}


# Chosen from the AOT counts (bench/results/mla_aot_counts_small_heads_20261205.json, Triton
# 3.6.0, sm_90; bench/NOTES.md "Small heads: occupancy-first variant space" has the table, the
# reasoning and a predicted range per variant). ``ctas`` is the counted residency on the H200
# (registers and shared memory), which sizes the split count so the grid fills every CTA slot.
# Register-light tiles (w8: 122-128 registers, 2 CTAs = 16 warps per SM; 16x16 w4: 160, 3 CTAs
# = 12 warps; 16x16 w2: 4 CTAs of 2 warps), the fewest loop instructions per (row, head)
# (16x16 w2, 16x32 w4 s1, 16x64 w8), two loads-in-flight probes of today's tile (three stages:
# 82 KB a SM; twice the splits: two waves) and, for the two best-predicted, twice the splits.
_SMALL = [
    _v("16x32w8s1", 16, 32, 8, 1, 0, ctas=2),
    _v("16x32w8s1_x2", 16, 32, 8, 1, 0, ctas=2, scale=2.0),
    _v("16x16w8s1", 16, 16, 8, 1, 0, ctas=2),
    _v("16x16w4s1", 16, 16, 4, 1, 0, ctas=3),
    _v("16x16w2s1", 16, 16, 2, 1, 0, ctas=4),
    _v("16x16w2s1_x2", 16, 16, 2, 1, 0, ctas=4, scale=2.0),
    _v("16x32w4s1", 16, 32, 4, 1, 0, ctas=2),
    _v("16x64w8s1", 16, 64, 8, 1, 0, ctas=1),
    _v("16x32w4s3", 16, 32, 4, 3, 0, ctas=2),
    _v("16x32w4s2_x2", 16, 32, 4, 2, 0, ctas=2, scale=2.0),
]


def _sh(cfg, scale=1.0) -> dict:
    """A few-heads Gluon variant (kernels/sparse_mla/gluon_small.py; bench/NOTES.md "Small heads:
    rows on wgmma M"): the launcher's split count (its residency rule matches the AOT counts:
    2 CTAs an SM at 4 warps, 1 at 8) times ``scale``."""
    d = cfg.to_dict()
    return {"name": f"gluon_sh_h{cfg.block_h}w{cfg.num_warps}" + (f"r{cfg.maxnreg}" if cfg.maxnreg else "")
            + (f"s{cfg.num_stages}" if cfg.num_stages != 1 else "")
            + (f"_x{scale:g}" if scale != 1 else ""),
            "config": d, "splits": None, "ctas_per_sm": None, "scale": scale}


# Two X buffers (NBUF 2: the next block converted into the other buffer while this block's value
# dots run), one CTA an SM by shared memory (AOT, Triton 3.6.0, sm_90, bf16 q, partial:
# fp8_ds_mla h16 w4 255 registers / 8 B spilled / 168,448 B, h16 w8 159 / 0 / 168,448, h8 w4
# 249 / 0 / 158,080; fp8_model1 h8 w4 240 / 0 / 142,720); not in any space: sweep-only
_SH_NBUF2 = {hw: configs.SparseMLAConfig(block_h=hw[0], block_k=64, num_warps=hw[1], num_stages=2,
                                         prefetch=True, kernel="gluon_sh")
             for hw in ((16, 4), (16, 8), (8, 4))}
# the few-heads configs the sweep runs outside every space (the AOT counts above and in
# configs.py; bench/NOTES.md "Few-heads kernel at 16 warps an SM", "Warp-specialised few-heads
# kernel"; the 8-head warp-specialised config joined the sm_90 space on 2026-12-05, the 16-head
# one on 2026-12-06)
SWEEP_ONLY_GLUON = (configs.SPARSE_MLA_GLUON_SH16W8R128, *_SH_NBUF2.values())


def _shws(cfg, scale=1.0, l2_hint: bool = False, stage: bool = False) -> dict:
    """The warp-specialised few-heads variant (kernels/sparse_mla/gluon_small_ws.py) of ``cfg``'s
    heads at the launcher's split count (one CTA an SM) times ``scale``; ``l2_hint``: its
    producer hints the next row block into L2 (``gluon_small_ws.L2_PREFETCH``, for both fp8
    formats), else it does not; ``stage``: the staged producer (``gluon_small_ws.RAW_STAGE`` 1:
    block j + 1's raw bytes copied into shared memory while block j converts), else the
    module's default producer."""
    v = {"name": f"gluon_shws_h{cfg.block_h}" + (f"_x{scale:g}" if scale != 1 else "")
            + ("_l2" if l2_hint else "") + ("_st" if stage else ""),
         "config": cfg.to_dict(), "splits": None, "ctas_per_sm": None, "scale": scale}
    v["constants"] = ({"gluon_small_ws.L2_PREFETCH": 1,
                       "gluon_small_ws.L2_PREFETCH_FORMATS": ("fp8_ds_mla", "fp8_model1")}
                      if l2_hint else {"gluon_small_ws.L2_PREFETCH": 0})
    if stage:
        v["constants"]["gluon_small_ws.RAW_STAGE"] = 1
    return v

SMALL_HEAD_VARIANTS: dict[str, list[dict]] = {
    "v32_h16": _SMALL + [_sh(configs.SPARSE_MLA_GLUON_SH16), _sh(configs.SPARSE_MLA_GLUON_SH16, 2.0),
                         _sh(configs.SPARSE_MLA_GLUON_SH16W8), _sh(configs.SPARSE_MLA_GLUON_SH8),
                         _sh(configs.SPARSE_MLA_GLUON_SH16W8R128),
                         _sh(configs.SPARSE_MLA_GLUON_SH16W8R128, 2.0),
                         _sh(_SH_NBUF2[16, 4]), _sh(_SH_NBUF2[16, 8]),
                         _shws(configs.SPARSE_MLA_GLUON_SHWS16),
                         _shws(configs.SPARSE_MLA_GLUON_SHWS16, 2.0),
                         _shws(configs.SPARSE_MLA_GLUON_SHWS16, l2_hint=True),
                         _shws(configs.SPARSE_MLA_GLUON_SHWS16, stage=True),
                         _shws(configs.SPARSE_MLA_GLUON_SHWS16, l2_hint=True, stage=True)],
    "v4_h8": _SMALL + [_sh(configs.SPARSE_MLA_GLUON_SH8), _sh(configs.SPARSE_MLA_GLUON_SH8, 2.0),
                       _sh(configs.SPARSE_MLA_GLUON_SH16), _sh(_SH_NBUF2[8, 4]),
                       _sh(_SH_NBUF2[8, 4], 2.0), _shws(configs.SPARSE_MLA_GLUON_SHWS8),
                       _shws(configs.SPARSE_MLA_GLUON_SHWS8, 2.0),
                       _shws(configs.SPARSE_MLA_GLUON_SHWS8, l2_hint=True),
                       _shws(configs.SPARSE_MLA_GLUON_SHWS8, stage=True),
                       _shws(configs.SPARSE_MLA_GLUON_SHWS8, l2_hint=True, stage=True)],
    # V4 H 64 runs the one-partition Gluon kernel today: the best-predicted Triton tiles (one
    # split: the final epilogue, no combine), today's 32 x 32 default (88 us on 2026-12-02),
    # the 16-warp tile, and the warp-specialised Gluon kernel (62.8 us on 2026-12-02)
    "v4_h64": [
        _v("32x64w8s1", 32, 64, 8, 1, 0, ctas=1),
        _v("32x32w8s1p", 32, 32, 8, 1, 1, ctas=1),
        _v("16x32w8s1", 16, 32, 8, 1, 0, ctas=2),
        _v("16x32w8s1_x2", 16, 32, 8, 1, 0, ctas=2, scale=2.0),
        {"name": "gluon_ws", "config": configs.SPARSE_MLA_GLUON_WS.to_dict(),
         "splits": None, "ctas_per_sm": None, "scale": 1.0},
        # four 16-head blocks a request at 2 CTAs an SM (rows re-gathered from L2 per block)
        _sh(configs.SPARSE_MLA_GLUON_SH16),
        _sh(configs.SPARSE_MLA_GLUON_SH16W8R128),
        _sh(_SH_NBUF2[16, 8]),
        _shws(configs.SPARSE_MLA_GLUON_SHWS16),
        _shws(configs.SPARSE_MLA_GLUON_SHWS16, l2_hint=True, stage=True),
    ],
}


# the module constants that switch the Gluon producers' L2 hint of the next row block
# (gluon._l2_prefetch_rows; read at each launch)
L2_HINT_CONSTANTS = ("gluon_ws.L2_PREFETCH", "gluon_xs.L2_PREFETCH", "gluon_small_ws.L2_PREFETCH")
# --l2-hint: the binding's own choice with every producer's hint off, then on (the baseline,
# the defaults as committed, first). gluon_ws's second form (the hint from a three-deep slot
# chain, "baseline_l2hint_ws2") measured the same as the first and was removed (2026-12-06,
# bench/results/mla_sweep_l2hint_h100_20261206.json)
L2_HINT_VARIANTS = [
    dict(BASELINE, name="baseline_l2hint_off", constants={c: 0 for c in L2_HINT_CONSTANTS}),
    dict(BASELINE, name="baseline_l2hint_on", constants={c: 1 for c in L2_HINT_CONSTANTS}),
]


def _set_constants(constants: dict | None) -> dict:
    """Set a variant's module constants (``{"gluon_xs.L2_PREFETCH": 1}``: a module of
    ``kernels.sparse_mla``) and return their previous values, for :func:`_restore_constants`.
    Raises ValueError for a constant the module does not define (a misspelt name would
    otherwise time the default twice)."""
    import importlib
    targets = []
    for name, val in (constants or {}).items():     # every name checked before any is set
        mod, _, attr = name.rpartition(".")
        m = importlib.import_module(f"kernels.sparse_mla.{mod}")
        if not hasattr(m, attr):
            raise ValueError(f"constants: kernels.sparse_mla.{mod} has no {attr!r}")
        targets.append((name, m, attr, val))
    old = {}
    for name, m, attr, val in targets:
        old[name] = getattr(m, attr)
        setattr(m, attr, val)
    return old


def _restore_constants(old: dict) -> None:
    _set_constants(old)


def config_tag(d: dict) -> str:
    """``16x32w4s2`` (+``p`` with the hand pipeline, +the kernel when it is not Triton)."""
    return (f"{d['block_h']}x{d['block_k']}w{d['num_warps']}s{d['num_stages']}"
            f"{'p' if d.get('prefetch', True) else ''}"
            f"{'' if d.get('kernel', 'triton') == 'triton' else '_' + d['kernel']}")


def space_variants(dev, shape, extra=(), scales=(1.0,), only_extra=False) -> list[dict]:
    """The default sweep's variants: the baseline, every member of the GPU's search space at the
    launcher's split count times each of ``scales``, then ``extra`` configs."""
    from kernels.sparse_mla import configs
    out = [BASELINE]
    cfgs = [] if only_extra else list(configs.sparse_mla_space(dev.smem_per_block, 2))
    for cfg in cfgs + list(extra):
        for f in scales:
            d = cfg.to_dict()
            out.append({"name": f"{config_tag(d)}_x{f:g}", "config": d, "splits": None,
                        "ctas_per_sm": None, "scale": f})
    return out


def resolve_splits(v: dict, shape, cfg, dev) -> int | None:
    """The split count a variant asks for (None: the launcher's own)."""
    from kernels.sparse_mla import configs
    if v.get("splits"):
        return int(v["splits"])
    if v.get("ctas_per_sm") is None and v.get("scale", 1.0) == 1.0:
        return None
    rows = shape.B * shape.N * -(-shape.H // cfg.block_h)
    ctas = v.get("ctas_per_sm") or configs.sparse_mla_ctas_per_sm(cfg, dev.smem_per_block)
    s = configs.sparse_mla_num_splits(rows, shape.K, cfg.block_k, dev.num_sms, ctas_per_sm=ctas)
    return max(1, round(s * v.get("scale", 1.0)))


def dry_key(v: dict):
    """What the interpreter runs of a variant (warps, stages and the module constants of the Gluon
    kernels, which it never runs, do not change it)."""
    c = v["config"]                    # (a variant's constants switch Gluon kernels only)
    if c is None:
        return ("baseline",)
    if c.get("kernel", "triton") != "triton":   # the binding's Triton substitute (no Gluon here)
        return ("gluon substitute", v.get("splits"), v.get("ctas_per_sm"), v.get("scale", 1.0))
    return (c["block_h"], c["block_k"], c.get("prefetch", True), v.get("splits"),
            v.get("ctas_per_sm"), v.get("scale", 1.0))


# ------------------------------------------------------------------------------ one shape

def run_shape(shape, variants: list[dict], emit, *, dry: bool, seed: int = 0,
              deadline: float | None = None, max_gb: float = 60.0, indices=None) -> None:
    """Inputs, reference, then each variant: run once, check, time; ``emit`` gets a
    ``{"kind": "ready"}`` record after the inputs, ``{"kind": "start", "i"}`` before and
    ``{"kind": "row", "i", ...}`` after each variant (``i`` from ``indices``, default 0..)."""
    import functools

    import torch

    from bench import checks, timing
    from bench.inputs import make_inputs, rotations_for
    from bench.runner import estimate_touched, shape_cost
    from kernels.sparse_mla import configs, triton_launch
    from torch_impl import _common, sparse_mla

    t0 = time.time()
    device = "cpu" if dry else "cuda"
    q_dtype = "float16" if dry else "bfloat16"
    R = 1 if dry else rotations_for(estimate_touched(shape), shape.input_bytes(1),
                                    max_bytes=int(max_gb * (1 << 30)) // 2)
    inp = make_inputs(shape, rotations=R, device=device, q_dtype=q_dtype, latent_dtype=q_dtype,
                      seed=seed)
    checker = checks.Checker(inp)
    dev = _common.device_info(torch.device(device))
    nbytes, _ = shape_cost(shape, inp)
    import triton
    emit({"kind": "ready", "gpu": dev.name, "cc": f"{dev.cc[0]}.{dev.cc[1]}", "num_sms": dev.num_sms,
          "rotations": R, "input_s": round(time.time() - t0, 1),
          "versions": {"torch": torch.__version__, "triton": triton.__version__}})
    fmt, d_v, P = shape.kv_format, shape.p.d_v, shape.P
    B, N, H, K = shape.B, shape.N, shape.H, shape.K
    base = {"shape": shape.label(), "preset": shape.preset, "B": B, "N": N, "H": H, "K": K,
            "kv_format": fmt, "rotations": R, "bytes": nbytes}
    seen: dict = {}
    for j, v in enumerate(variants):
        i = indices[j] if indices is not None else j
        if deadline is not None and time.time() > deadline:
            emit({"kind": "row", "i": i, **base, "variant": v["name"],
                  "status": "skipped: time budget spent (--budget-s)"})
            continue
        emit({"kind": "start", "i": i})
        _fault(v["name"])
        t1 = time.time()
        row = {**base, "variant": v["name"], "config": None, "splits": None, "ctas": None,
               "median_us": None, "p20_us": None, "p80_us": None, "timer": None, "check": None,
               "status": None}
        if v.get("constants"):
            row["constants"] = dict(v["constants"])
        if dry and dry_key(v) in seen:
            row.update(status=f"same interpreter program as {seen[dry_key(v)]} (dry run)")
            emit({"kind": "row", "i": i, **row, "wall_s": 0.0})
            continue
        seen.setdefault(dry_key(v), v["name"])
        saved = {}
        try:
            saved = _set_constants(v.get("constants"))
            s0 = inp.sets[0]
            geo = (P, s0["kv_cache"].shape[0] * P, s0["kv_cache"].shape[0])
            if v["config"] is None:        # the binding's own choice, as `python -m bench` runs it
                cfg = sparse_mla._triton_config(dev, s0["q"], s0["kv_cache"], fmt, K, None)
                splits = None

                def fn(s):
                    return sparse_mla.sparse_mla_decode(
                        s["q"], s["kv_cache"], s["indices"], inp.sm_scale, kv_format=fmt, d_v=d_v,
                        block_table=s["block_table"], attn_sink=s["attn_sink"], path="triton")
            else:                          # (a Gluon config where it cannot run: the Triton
                # tile the binding substitutes, sparse_mla._triton_config; the row says which)
                cfg = sparse_mla._triton_config(dev, s0["q"], s0["kv_cache"], fmt, K,
                                                configs.SparseMLAConfig(**v["config"]))
                splits = resolve_splits(v, shape, cfg, dev)

                def fn(s, cfg=cfg, splits=splits):
                    return sparse_mla._triton_impl(
                        s["q"], s["kv_cache"], s["indices"], inp.sm_scale, fmt, d_v,
                        s["block_table"], None, s["attn_sink"], config=cfg, num_splits=splits,
                        geometry=geo)
            src = triton_launch.Source(s0["kv_cache"], s0["indices"], fmt, P, geo[2], cfg,
                                       s0["block_table"], None, splits)
            eff, _ = triton_launch._split_plan(s0["q"], src, dev.num_sms, dev.smem_per_block)
            row.update(config=cfg.to_dict(), splits=eff,
                       ctas=B * N * -(-H // cfg.block_h) * eff)
            calls = [functools.partial(fn, s) for s in inp.sets]
            out, lse = calls[0]()
            if not dry:
                torch.cuda.synchronize()
            res, how = checker.mla(out, lse)
            row["check"] = {"passed": res.passed, "how": how, "worst_error": res.worst_error,
                            "tolerance": res.tolerance, "ratio": res.ratio, "message": res.message}
            del out, lse
            if not res.passed:
                row["status"] = f"FAILED check: {res.message}"[:300]
            else:
                t = timing.time_cpu(calls) if dry else timing.time_torch_cuda(calls)
                row.update(median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us, timer=t.timer,
                           status="ok",
                           GB_per_s=nbytes / (t.median_us * 1e-6) / 1e9 if t.median_us > 0 else None)
        except Exception as e:  # noqa: BLE001 - a broken variant is a row (a child resumes
            # after a sticky CUDA error: the parent sees the next variant fail and restarts)
            row["status"] = f"error: {type(e).__name__}: {e}"[:400]
        finally:
            _restore_constants(saved)
        row["wall_s"] = round(time.time() - t1, 1)
        emit({"kind": "row", "i": i, **row})
        if not dry and row["status"] and row["status"].startswith("error") and _cuda_broken():
            raise SystemExit(3)          # sticky CUDA error: let the parent start a new child


def _fault(name: str) -> None:
    """Test hook: ``MLA_SWEEP_FAULT=<variant>:crash[,<variant>:hang]``: ``crash`` ends the
    process when that variant starts (as a faulting kernel can), ``hang`` sleeps (as a hung
    kernel would)."""
    for spec in filter(None, os.environ.get("MLA_SWEEP_FAULT", "").split(",")):
        who, _, what = spec.rpartition(":")
        if who == name:
            if what == "crash":
                os._exit(7)
            time.sleep(3600)


def _cuda_broken() -> bool:
    import torch
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return False
    except Exception:  # noqa: BLE001
        return True


# ------------------------------------------------------------------------------ isolation

def _child_main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    from bench.grid import Shape
    shape = Shape(**spec["shape"])
    with open(spec["rows"], "a") as out:
        def emit(rec):
            out.write(json.dumps(rec) + "\n")
            out.flush()
        run_shape(shape, spec["variants"], emit, dry=spec["dry"], seed=spec["seed"],
                  deadline=spec["deadline"], max_gb=spec["max_gb"], indices=spec["indices"])


def run_isolated(shape, variants: list[dict], *, dry: bool, seed: int, deadline: float | None,
                 variant_timeout: float, setup_timeout: float, max_gb: float, on_row) -> dict:
    """:func:`run_shape` in child processes: a variant that crashes the child (or stays without a
    row for ``variant_timeout`` s) becomes an error row, and a new child resumes after it.
    Returns the first child's ``ready`` record (device, rotations)."""
    done: dict[int, dict] = {}
    ready_info: dict = {}
    remaining = list(range(len(variants)))
    env = {k: v for k, v in os.environ.items()}
    while remaining:
        fd, rows_path = tempfile.mkstemp(prefix="mla_sweep_rows_", suffix=".jsonl")
        os.close(fd)
        fd, spec_path = tempfile.mkstemp(prefix="mla_sweep_spec_", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"shape": shape.to_dict(), "variants": [variants[i] for i in remaining],
                       "indices": remaining, "rows": rows_path, "dry": dry, "seed": seed,
                       "deadline": deadline, "max_gb": max_gb}, f)
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen([sys.executable, "-m", "bench.mla_sweep", "--child", spec_path],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        t_start, t_cur, cur, ready, why, pos = time.time(), None, None, False, None, 0
        progressed = False
        while True:
            rc = proc.poll()
            with open(rows_path) as f:
                f.seek(pos)
                chunk = f.read()
            lines = chunk.split("\n")
            pos += len(chunk) - len(lines[-1])        # keep a partial last line for next time
            for line in lines[:-1]:
                if not line.strip():
                    continue
                rec = json.loads(line)
                if rec["kind"] == "ready":
                    ready = True
                    ready_info = ready_info or rec
                elif rec["kind"] == "start":
                    cur, t_cur = rec["i"], time.time()
                else:
                    rec.pop("kind")
                    i = rec.pop("i")
                    done[i] = rec
                    on_row(i, rec)
                    cur, progressed = None, True
            if rc is not None:
                break
            now = time.time()
            if not ready and now - t_start > setup_timeout:
                why = f"inputs not ready after {setup_timeout:.0f} s (--setup-timeout)"
            elif cur is not None and now - t_cur > variant_timeout:
                why = f"no result after {variant_timeout:.0f} s (--variant-timeout; a hang?)"
            if why:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.2)
        log.seek(0)
        tail = log.read()[-1500:]
        log.close()
        os.unlink(rows_path)
        os.unlink(spec_path)
        left = [i for i in remaining if i not in done]
        if not left:
            break
        if not ready:                 # the inputs themselves failed: every variant says so
            for i in left:
                rec = {"variant": variants[i]["name"], "status": f"error: child setup: {why or tail}"[:600]}
                done[i] = rec
                on_row(i, rec)
            break
        if cur is None and not progressed:  # died between variants without progress: stop
            cur = left[0]
        if cur is not None:
            rec = {"variant": variants[cur]["name"],
                   "status": f"error: child process: {why or f'exit status {proc.returncode}'}: "
                             f"{tail}"[:800]}
            done[cur] = rec
            on_row(cur, rec)
        remaining = [i for i in left if i != cur]
    return ready_info


# ------------------------------------------------------------------------------ main

def _parse_config(c: str):
    from kernels.sparse_mla import configs
    h, k, w, st, *pf = (int(x) for x in c.split(","))
    return configs.SparseMLAConfig(h, k, w, st, prefetch=bool(pf[0]) if pf else True)


def summarize(rows: list[dict], baseline: str = "baseline") -> dict:
    """Per shape (``shape_key``): the baseline's (the variant named ``baseline``) time and
    config, the fastest passing variant, its speed-up. Also ``bench.pallas_mla_sweep``'s."""
    out = {}
    for r in rows:
        d = out.setdefault(r.get("shape_key", "?"), {"baseline_us": None, "best": None})
        if r.get("median_us") is None:
            continue
        if r.get("variant") == baseline:
            d["baseline_us"] = round(r["median_us"], 2)
            d["baseline_config"] = r.get("config")
            d["baseline_splits"] = r.get("splits")
        if d["best"] is None or r["median_us"] < d["best"]["us"]:
            d["best"] = {"variant": r["variant"], "us": round(r["median_us"], 2),
                         "config": r.get("config"), "splits": r.get("splits")}
    for d in out.values():
        if d["baseline_us"] and d["best"]:
            d["speedup"] = round(d["baseline_us"] / d["best"]["us"], 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="mla_sweep.json")
    ap.add_argument("--config", action="append", default=[],
                    help="extra config block_h,block_k,num_warps,num_stages[,prefetch 0/1]")
    ap.add_argument("--splits-scale", type=float, nargs="+", default=[1.0])
    ap.add_argument("--only-extra", action="store_true", help="skip the search space")
    ap.add_argument("--targets", action="store_true",
                    help="every fp8 sparse-MLA row of the bench's targets grid")
    ap.add_argument("--heads", type=int, nargs="+", default=None,
                    help="only the shapes with these head counts (e.g. 16 8)")
    ap.add_argument("--small-heads", action="store_true",
                    help="SMALL_HEAD_VARIANTS on the V3.2 H16, V4 H8 and V4 H64 rows")
    ap.add_argument("--l2-hint", action="store_true",
                    help="the binding's own choice with the Gluon producers' L2 hint off and on "
                         "(L2_HINT_CONSTANTS) against the defaults, at the selected shapes")
    ap.add_argument("--shapes", nargs="+", default=None, help="only these shape keys")
    ap.add_argument("--variants", nargs="+", default=None,
                    help="only these variant names (the baseline always runs)")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU interpreter, tiny shapes, fp16 q (plumbing and checks only)")
    ap.add_argument("--no-isolate", action="store_true", help="run every variant in this process")
    ap.add_argument("--variant-timeout", type=float, default=90.0,
                    help="seconds a variant may run (compile, check, timing) before its child is killed")
    ap.add_argument("--setup-timeout", type=float, default=120.0,
                    help="seconds a child may take to build its inputs")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no variant after this many seconds (the rest: skipped rows)")
    ap.add_argument("--max-gb", type=float, default=60.0, help="device memory for the input sets")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child_main(args.child)
        return 0
    t_start = time.time()
    dry = args.dry_run
    if dry and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise SystemExit("mla_sweep --dry-run: set TRITON_INTERPRET=1 (the CPU interpreter)")
    import torch
    from torch_impl import _common
    dev = _common.device_info(torch.device("cpu" if dry else "cuda"))
    extra = [_parse_config(c) for c in args.config]
    if args.small_heads:
        shapes = small_head_shapes(dry)
    elif dry:
        shapes = {k: v for k, v in small_head_shapes(True).items() if k != "v4_h64"}
    else:
        shapes = target_shapes() if args.targets else default_shapes()
    if args.heads:
        shapes = {k: s for k, s in shapes.items() if s.H in args.heads}
    if args.shapes:
        shapes = {k: s for k, s in shapes.items() if k in args.shapes}
    deadline = t_start + args.budget_s if args.budget_s else None
    rows: list[dict] = []
    meta = {"gpu": dev.name, "compute_capability": f"{dev.cc[0]}.{dev.cc[1]}",
            "num_sms": dev.num_sms, "dry_run": dry,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "python -m bench.mla_sweep " + " ".join(sys.argv[1:] if argv is None else argv),
            "timer": "bench.timing.time_torch_cuda (CUDA graph over rotated input sets)"
                     if not dry else "bench.timing.time_cpu (interpreter: meaningless)",
            "isolated": not args.no_isolate, "shapes": {k: s.label() for k, s in shapes.items()}}

    def save(partial: bool):
        doc = dict(meta, partial=partial, elapsed_s=round(time.time() - t_start, 1), rows=rows,
                   summary=summarize(rows))
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    for key, shape in shapes.items():
        if args.l2_hint:
            variants = [BASELINE] + L2_HINT_VARIANTS
        elif args.small_heads:
            variants = [BASELINE] + SMALL_HEAD_VARIANTS[key] + space_variants(
                dev, shape, extra, [1.0], only_extra=True)[1:]
        else:
            variants = space_variants(dev, shape, extra, args.splits_scale, args.only_extra)
        if args.variants:
            variants = [v for i, v in enumerate(variants) if i == 0 or v["name"] in args.variants]
        def on_row(i, rec, key=key, variants=variants):
            rec = {"shape_key": key, **rec, "variant_spec": variants[i]}
            rows.append(rec)
            print(json.dumps(rec), flush=True)
            save(partial=True)          # a run cut off by its time limit keeps every row so far

        if args.no_isolate:
            def emit(rec):
                if rec["kind"] == "ready":
                    meta.setdefault("child", {k: v for k, v in rec.items() if k != "kind"})
                elif rec["kind"] == "row":
                    rec = dict(rec)
                    rec.pop("kind")
                    on_row(rec.pop("i"), rec)
            run_shape(shape, variants, emit, dry=dry, seed=args.seed, deadline=deadline,
                      max_gb=args.max_gb)
        else:
            info = run_isolated(shape, variants, dry=dry, seed=args.seed, deadline=deadline,
                                variant_timeout=args.variant_timeout,
                                setup_timeout=args.setup_timeout, max_gb=args.max_gb, on_row=on_row)
            if info:
                meta.setdefault("child", {k: v for k, v in info.items() if k != "kind"})
    save(partial=False)
    bad = [r for r in rows if str(r.get("status", "")).startswith(("error", "FAILED"))]
    print(json.dumps(summarize(rows), indent=1))
    print(f"rows: {len(rows)}, ok {sum(r.get('status') == 'ok' for r in rows)}, rows failed: {len(bad)}")
    print(f"json: {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
