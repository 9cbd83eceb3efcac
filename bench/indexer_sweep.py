"""Variant sweep of the Triton indexer: the logits kernel alone and the top-k alone (GPU).

    python -m bench.indexer_sweep --out sweep.json [--ws] [--variant NAME ...] [--shape NAME ...]
                                  [--row-timeout S] [--isolate] [--unguarded]
    python -m bench.indexer_sweep --aot [--ws] [--variant NAME ...]   # CPU: compile counts only
    python -m bench.indexer_sweep --dry-run --out /tmp/s.json    # CPU interpreter, tiny shapes

For each shape of :data:`DEFAULT_SHAPES` (V3.2 B 64 L 64K, B 1 L 128K, V4-Flash B 64 L 4K in a
1M table, V3.2 B 64 N 2 L 64K; ``--shape`` also V3.2 B 64 L 128K and V4-Flash B 8 L 1M, the rest
of :data:`SHAPES`; ``bench.inputs``, one input set, pages scattered) and each logits variant of
:data:`VARIANTS` (``kernels.indexer.triton.IndexerLogitsConfig`` fields), times with CUDA
events over a CUDA graph of 20 launches (median of 10 replays) with one input set for all
calls; the logits timing flushes L2 before each launch and subtracts the flush, the top-k
timing does not: in the op the top-k reads the logits the logits kernel has just written):

* ``logits_us``: the logits kernel with its fused first-digit histogram; ``logits_nohist_us``:
  the same launch without it (what ``indexer_logits`` runs), so the histogram's share;
* ``topk_nohist_us``: the top-k without the fused histogram as ``indexer_topk`` runs it
  (``kernels.topk.triton.launch_split_hist``, the split pass A over the logits at the logits
  kernel's split count, then the split top-k over them; ``split_hist_us`` that pass alone,
  ``split_hist_us_by_config`` at each ``SPLIT_HIST_SPACE`` config, keys
  ``"{form}{BLOCK}w{warps}"``, "MISMATCH" where its blocks differ from the default config's);
  ``topk_nohist_same_set``
  whether it selects the fused pipeline's set), so ``logits_nohist_us + topk_nohist_us`` is
  the unfused pipeline;
  ``topk_perrow_us``: the per-row kernel's own pass A instead (one program a row);
* ``topk_us``: the top-k kernels after it (``launch_topk`` on those logits: plan, split pass B,
  candidate levels), for each ``cand_block`` of :data:`CAND_BLOCKS` and each split pass B
  launch of ``kernels.topk.triton.SCATTER_SPACE`` (``topk_us_by_scatter``, "MISMATCH" where
  the indices differ from the default's; keys ``"smem{BLOCK}w{warps}"``: the Gluon split pass
  B, ``scatter_form="smem"``, at each (BLOCK, warps) of ``SCATTER_SMEM_SPACE``, its indices
  and plan state checked likewise), and for the per-row kernel's warps at the first two
  candidate blocks (``topk_us_by_warps``, keys ``"{cand_block}w{warps}"``, "MISMATCH" likewise)
  (first variant only; the others use the default);

and checks each variant's logits against the first variant's (max relative difference over
finite logits, and whether they are bitwise equal; the -inf pattern must match), its
histogram blocks (where the split count is the first variant's), its top-k set against the
first's, that two logits launches give bitwise equal logits and blocks, and that two top-k runs
give bitwise equal indices. Each row also records the top-k's split plan state over its rows
(``topk_state``: ``kernels.topk.window.state_summary``: window misses, rows taken whole,
candidates and candidate reads of the slowest row), which the per-row kernel's time follows,
and ``topk_launches``, the kernels one top-k call launches. ``--ws``: the warp-specialised
kernel's variants (:data:`WS_VARIANTS`, today's Gluon kernel first, so every check is against
it). ``--dry-run`` runs the same code in the CPU interpreter at :data:`DRY_SHAPES` (the Triton
variants only; times are the interpreter's wall time, meaningless): the plumbing checked before
a GPU call. ``--aot`` compiles each variant's logits kernel for sm_90 on the CPU instead
(registers, spills, shared memory, SASS per loop and, for ``gluon_ws``, per partition loop;
``kernels._triton_aot``).
``--ws`` (or ``--isolate``) runs every (shape, variant) row in its own child process
(:func:`_sweep_isolated`, as ``bench.gluon_check``'s ``--ws-timeout`` children): a kernel that
faults (a CUDA error is sticky: every later call of its process fails) or hangs costs only its
own row, which records the child's exit and stderr tail as its ``error``; the checks against the
first variant read that variant's results from a file its child wrote. ``--unguarded`` lets the
children launch the ``gluon_ws`` configs the launcher refuses
(``kernels.indexer.gluon_ws.unverified``: one consumer with two CTAs an SM), to test them.
Rows go to ``--out`` as JSON (and one line each on stdout); bench/NOTES.md has the analysis.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

# name -> IndexerLogitsConfig fields (num_splits / num_warps None = the launcher's heuristic)
VARIANTS = {
    "default": {},
    "running": dict(hist="running"),                        # the 2026-12-01 kernel
    "evict": dict(evict_first=True),
    "cp2": dict(prefetch=False, num_stages=2),              # Triton's cp.async pipeline
    "cp3": dict(prefetch=False, num_stages=3),
    "cp2_w8": dict(prefetch=False, num_stages=2, num_warps=8),
    "cp2_evict": dict(prefetch=False, num_stages=2, evict_first=True),
    "p1_cp2": dict(pages=1, prefetch=False, num_stages=2),
    "p1_cp3": dict(pages=1, prefetch=False, num_stages=3),
    "p1": dict(pages=1),
    "cp2_s8": dict(prefetch=False, num_stages=2, num_splits=8),
    "gluon": dict(kernel="gluon"),                           # kernels/indexer/gluon.py (sm_90)
    "gluon_s4": dict(kernel="gluon", num_splits=4),
    "gluon_s8": dict(kernel="gluon", num_splits=8),
    "gluon_s16": dict(kernel="gluon", num_splits=16),
    "triton": dict(kernel="triton"),
    # kernels/indexer/gluon_ws.py (sm_90): producer warp + TMA ring, 2 consumer warpgroups
    # (1 CTA / SM), e4m3 rows into wgmma's register A operand; then one field changed each
    "gluon_ws": dict(kernel="gluon_ws"),
    "gluon_ws_s2": dict(kernel="gluon_ws", num_splits=2),      # B 64: one wave
    "gluon_ws_s8": dict(kernel="gluon_ws", num_splits=8),      # B 64: four waves
    "gluon_ws_s132": dict(kernel="gluon_ws", num_splits=132),  # B 1: one wave (default 264: two)
    "gluon_ws_c1": dict(kernel="gluon_ws", ws_consumers=1),    # 2 CTAs / SM of one consumer
    "gluon_ws_c3": dict(kernel="gluon_ws", ws_consumers=3),    # 3 consumers at 160 registers
    "gluon_ws_smem": dict(kernel="gluon_ws", ws_convert="smem"),  # fp16 rows via shared memory
    "gluon_ws_c3_smem": dict(kernel="gluon_ws", ws_consumers=3, ws_convert="smem"),  # no spill
    # four consumers, a page of every other step each (16 consumer warps an SM; refused by the
    # launcher until verified: run with --unguarded)
    "gluon_ws_c4": dict(kernel="gluon_ws", ws_consumers=4),
}
# module constants of kernels/indexer/gluon_ws.py a variant sets while it runs (the rest run with
# the module's values): the fused histogram as one atomic add a key into the program's block
# (``gluon_ws.HIST_ATOMIC``, bench/NOTES.md "Twenty-second session")
VARIANTS["gluon_ws_hatom"] = dict(kernel="gluon_ws")
WS_CONSTANTS = {"gluon_ws_hatom": dict(HIST_ATOMIC=1)}


def _ws_constants(name: str) -> dict:
    """Set the ``gluon_ws`` module constants of a ``gluon_ws`` variant ``name``: its own
    (:data:`WS_CONSTANTS`), the others back to the module's values; returns the values set
    (``{}`` for the other kernels, which read none of them)."""
    if VARIANTS[name].get("kernel") != "gluon_ws":
        return {}
    from kernels.indexer import gluon_ws
    vals = {**_ws_defaults(), **WS_CONSTANTS.get(name, {})}
    for k, v in vals.items():
        setattr(gluon_ws, k, v)
    return vals


@functools.cache
def _ws_defaults() -> dict:
    """The module's own values of the constants :data:`WS_CONSTANTS` sets (read once, before
    any variant has set one: :func:`_ws_constants` is the only writer)."""
    from kernels.indexer import gluon_ws
    return {k: getattr(gluon_ws, k) for c in WS_CONSTANTS.values() for k in c}

# the default set (one GPU call of ~100 s: each variant compiles once per N); --variant for more
DEFAULT_VARIANTS = ("triton", "gluon", "gluon_s4", "gluon_s16")
# the warp-specialised kernel's set (--ws): today's Gluon kernel first, the base of the checks
WS_VARIANTS = ("gluon", "gluon_ws", "gluon_ws_c1", "gluon_ws_c3", "gluon_ws_smem",
               "gluon_ws_c3_smem", "gluon_ws_s2", "gluon_ws_s8")

# name -> (preset, B, N, L, table_len)
SHAPES = {
    "v32_b64_l64k": ("DSV32", 64, 1, 65536, None),
    "v32_b1_l128k": ("DSV32", 1, 1, 131072, None),
    "v4_b64_4k_in_1m": ("DSV4_FLASH", 64, 1, 4096, 1 << 20),
    "v32_b64_n2_l64k": ("DSV32", 64, 2, 65536, None),
    # by --shape only (not in DEFAULT_SHAPES): the rows whose slowest request has more
    # threshold-bin candidates than the default cand_block (bench.topk_sim, CPU: up to 1,648 at
    # B 64 L 128K against 1,024), so topk_us_by_cand_block says whether a wider block pays
    "v32_b64_l128k": ("DSV32", 64, 1, 131072, None),
    "v4_b8_1m": ("DSV4_FLASH", 8, 1, 1 << 20, None),
}
# the shapes a sweep without --shape runs
DEFAULT_SHAPES = ("v32_b64_l64k", "v32_b1_l128k", "v4_b64_4k_in_1m", "v32_b64_n2_l64k")
# --dry-run (CPU interpreter): the same relations at a fraction of the size (K / L = 1 / 32 as at
# V3.2 L 64K; B 64's 4 or 8 splits a request; N 2 with the MTP lengths)
DRY_SHAPES = {
    "v32_b64_l64k": ("DSV32", 2, 1, 8192, None, 256),
    "v32_b64_n2_l64k": ("DSV32", 2, 2, 8192, None, 256),
}
CAND_BLOCKS = (1024, 2048, 4096)


_FLUSH = []


def _flush():
    """Write 256 MB (more than the H200's L2), evicting the K cache of the previous launch."""
    import torch
    if not _FLUSH:
        _FLUSH.append(torch.empty(64 << 20, dtype=torch.float32, device="cuda"))
    _FLUSH[0].zero_()


def _graph_us(fn, launches: int = 20, replays: int = 10, flush: bool = False) -> float:
    """Median us per launch of ``fn`` over ``replays`` replays of a CUDA graph of ``launches``
    calls (no launch overhead in the number). ``flush``: an L2 flush before each call, its own
    time (a graph of flushes alone) subtracted."""
    if flush:
        return (_graph_us(lambda: (_flush(), fn()), launches, replays)
                - _graph_us(_flush, launches, replays))
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / launches)
    del g
    times.sort()
    return times[len(times) // 2]


def _gluon_aot_specs(name: str) -> list:
    """The fused-histogram launches (lengths ``[B]``, N 1 and 2) of a Gluon variant."""
    from kernels.indexer import triton_aot
    from kernels.indexer.triton import IndexerLogitsConfig
    cfg = IndexerLogitsConfig(**VARIANTS[name])
    if cfg.kernel == "gluon":
        specs = triton_aot.gluon_specs()
    else:
        specs = triton_aot.gluon_ws_specs((cfg.ws_consumers,), (cfg.ws_convert,))
    consts = WS_CONSTANTS.get(name, {}) if cfg.kernel == "gluon_ws" else {}
    return [dataclasses.replace(s, label=f"{name} N{s.constexprs['N']}",
                                constexprs={**s.constexprs, **consts}) for s in specs
            if s.constexprs["WRITE_HIST"] and not s.constexprs["CL_PER_DRAFT"]]


def _aot(names) -> list:
    from kernels._triton_aot import compile_specs
    from kernels.indexer.triton import IndexerLogitsConfig
    from kernels.indexer.triton_aot import _logits_spec
    specs = []
    for name in names:
        if VARIANTS[name].get("kernel", "triton") != "triton":
            specs += _gluon_aot_specs(name)    # (split-count variants: the same compile)
            continue
        for N in (1, 2):
            cfg = IndexerLogitsConfig(**VARIANTS[name])
            nw = cfg.num_warps or (8 if N * 64 >= 128 else 4)
            specs.append(_logits_spec(f"{name} N{N}", "*fp8e4nv", "*fp8e4nv", N, 64, 64, True, nw,
                                      cfg.num_stages, trans=cfg.trans, pages=cfg.pages,
                                      hist=cfg.hist, prefetch=cfg.prefetch,
                                      evict_first=cfg.evict_first))
    rows = []
    for r in compile_specs(specs, (90,), sass=True, workers=2):
        s = r.pop("sass", None)
        if s:
            r["sass_total"] = s["total"]
            r["sass_loop"] = s["loop"]["total"]
            r["sass_loop_x_warps"] = s["loop"]["total"] * r["num_warps"]
            r["sass_loop_ops"] = dict(list(s["loop"]["ops"].items())[:16])
            if r["label"].startswith("gluon_ws"):
                # partitions: each one's loop per step (128 tokens), per warp (the dispatch
                # loop around them is the "loop" above)
                r["partition_loops"] = [dict(range=lp["range"], total=lp["total"],
                                             ops=dict(list(lp["ops"].items())[:12]),
                                             memory_sync=lp["memory_sync"])
                                        for lp in s["loops"]]
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def _watchdog(seconds: float, label: str, rows: list, meta: dict, save):
    """A timer that, if a row is still running after ``seconds`` (a kernel that hangs: an
    mbarrier phase never completed), saves the rows so far with the hung row named and ends the
    process (exit status 124); ``cancel()`` it when the row is done. None for ``seconds <= 0``."""
    import threading
    if seconds <= 0:
        return None

    def fire():
        meta["hung"] = f"{label}: no result after {seconds:.0f} s"
        print(json.dumps({"hung": meta["hung"]}), flush=True)
        save(rows, meta)
        os._exit(124)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def _wall_us(fn, **_) -> float:
    """Wall-clock us of one call (the dry run's stand-in for :func:`_graph_us`)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def _launches(fn) -> list:
    """Names of the Triton kernels ``fn`` launches, in order (each kernel's ``run`` wrapped)."""
    import kernels.topk.triton as kt
    names = []
    kerns = {n: getattr(kt, n) for n in dir(kt) if n.startswith("_") and n.endswith("_kernel")}
    saved = {n: k.run for n, k in kerns.items()}
    try:
        for n, k in kerns.items():
            k.run = (lambda *a, _n=n, _r=k.run, **kw: (names.append(_n), _r(*a, **kw))[1])
        fn()
    finally:
        for n, k in kerns.items():
            k.run = saved[n]
    return names


def _sweep(shapes, names, save=lambda rows, meta: None, row_timeout: float = 0,
           dry: bool = False, base_files: dict | None = None,
           first_name: str | None = None) -> tuple[list, dict]:
    """The rows of ``shapes`` x ``names`` in this process. ``base_files``: shape name -> a path
    holding the first successful variant's results (the base of the checks): read when it
    exists (an isolated child's row is checked against an earlier child's variant), written when
    this process's variant becomes the base. ``first_name``: the sweep's first variant (its row
    also times the top-k at each ``cand_block``), default ``names[0]``."""
    import torch

    from bench.grid import Shape
    from bench.inputs import make_inputs
    from kernels.indexer import triton as kx
    from kernels.topk import window
    from kernels.topk.triton import (HIST_BINS, SCATTER_SMEM_SPACE, SCATTER_SPACE, STATE_WORDS,
                                     TopkConfig, SPLIT_HIST_SPACE, hist_shape, launch_split_hist,
                                     launch_topk)
    from torch_impl import _common

    import triton
    device = "cpu" if dry else "cuda"
    dev = _common.device_info(torch.device(device))
    meta = dict(gpu=dev.name, compute_capability=f"{dev.cc[0]}.{dev.cc[1]}",
                versions=dict(torch=torch.__version__, triton=triton.__version__),
                dry_run=dry)
    timer = _wall_us if dry else _graph_us
    table = DRY_SHAPES if dry else {k: v + (None,) for k, v in SHAPES.items()}
    rows = []
    for sname in shapes:
        if sname not in table:
            continue
        preset, B, N, L, tab, topk = table[sname]
        shape = Shape("indexer_topk", preset, B, N, 1, L, table_len=tab, topk=topk)
        s = make_inputs(shape, rotations=1, device=device,
                        q_dtype="float32" if dry else "bfloat16",
                        latent_dtype="float32" if dry else "bfloat16").sets[0]
        P, K = shape.P, shape.K_topk
        bt, cl = s["block_table"], s["context_lens"]
        W = bt.shape[1] * P
        kv, ks = s["k_cache"].view(torch.float8_e4m3fn), s["k_cache"].view(torch.float32)
        base = None
        base_file = (base_files or {}).get(sname)
        if base_file and os.path.exists(base_file):
            base = tuple(t.to(device) for t in torch.load(base_file))
        for name in names:
            if dry and VARIANTS[name].get("kernel", "triton") != "triton":
                continue                          # Gluon kernels do not interpret
            cfg = kx.IndexerLogitsConfig(**VARIANTS[name])
            consts = _ws_constants(name)
            t0 = time.time()
            dog = _watchdog(row_timeout, f"{sname} {name}", rows, meta, save)
            row = dict(shape=sname, preset=preset, B=B, N=N, L=L, table_len=W, topk=K,
                       variant=name, config=dict(cfg.__dict__), constants=consts)
            try:
                splits = kx.logits_splits(B, bt.shape[1], dev.num_sms, cfg)
                out = torch.empty((B, N, W), device=device)
                hist = torch.empty(hist_shape(B, splits, N), dtype=torch.int32, device=device)
                idx = torch.empty((B * N, K), dtype=torch.int32, device=device)
                scratch = torch.empty((B * N, W), dtype=torch.int32, device=device)
                state = torch.empty((B * N, STATE_WORDS.value), dtype=torch.int32, device=device)

                def lg(h=hist):
                    kx.launch_indexer_logits(s["iq"], s["iw"], kv, ks, bt, cl, out, page_size=P,
                                             num_sms=dev.num_sms, config=cfg, hist=h,
                                             fp8_upcast=True, fp8_nan_fix=dry)

                def tk(tcfg=None, st=None, scatter=None, h=hist, form=None):
                    launch_topk(out.view(B * N, W), cl, K, idx, scratch, config=tcfg, hist=h,
                                n_drafts=N, page_size=P, state=st, scatter=scatter,
                                num_sms=dev.num_sms, scatter_form=form)

                def sync():
                    if not dry:
                        torch.cuda.synchronize()
                lg()
                sync()
                blocks = hist[..., : HIST_BINS.value + 2]   # counts and both bases (no padding)
                lg_first = (out.clone(), blocks.clone())
                lg()                                  # again: bitwise the same logits / blocks
                row["topk_launches"] = _launches(lambda: tk(st=state))
                sync()
                row["topk_state"] = window.state_summary(state.cpu().numpy())
                first = idx.clone()
                tk()
                sync()
                row["repeatable"] = bool(torch.equal(first, idx))
                n_pages = -(-L // P)
                valid = out[:, :, : n_pages * P]
                row["repeatable_logits"] = bool(
                    torch.equal(lg_first[0][:, :, : n_pages * P].view(torch.int32),
                                valid.view(torch.int32)) and torch.equal(lg_first[1], blocks))
                fin = torch.isfinite(valid)
                if base is None:
                    base = (valid.clone(), fin, first.sort(-1).values, blocks.clone())
                    if base_file:
                        torch.save(tuple(t.cpu() for t in base), base_file)
                row["same_inf_pattern"] = bool(torch.equal(fin, base[1]))
                ref = base[0][fin]
                row["max_rel_diff_vs_first"] = float(
                    ((valid[fin] - ref).abs() / ref.abs().clamp_min(1e-30)).max()) if ref.numel() else 0.0
                # bitwise (the Gluon kernels: the same fp32 sums in the same order)
                row["bitwise_logits_vs_first"] = bool(torch.equal(valid.view(torch.int32),
                                                                  base[0].view(torch.int32)))
                # the histogram blocks, where the split count is the first variant's
                row["same_hist_vs_first"] = (bool(torch.equal(blocks, base[3]))
                                             if blocks.shape == base[3].shape else None)
                row["same_topk_set"] = bool(torch.equal(first.sort(-1).values, base[2]))
                row["num_splits"] = splits
                row["logits_us"] = timer(lg, flush=True)        # K pages from HBM, as served
                # the same launch without the fused histogram (``indexer_logits``' own): the
                # histogram's share of the logits kernel
                row["logits_nohist_us"] = timer(lambda: lg(None), flush=True)
                row["topk_us"] = timer(tk)
                # the top-k without the fused histogram as indexer_topk runs it (the split
                # pass A, then the same launches): with ``logits_nohist_us``, the unfused
                # pipeline's cost
                def pass_a(h_a, hcfg=None):
                    launch_split_hist(out.view(B * N, W), cl, h_a, n_drafts=N, page_size=P,
                                      config=hcfg)

                def tk_unfused(h_a):
                    pass_a(h_a)
                    tk(h=h_a)
                h_a = torch.empty_like(hist)
                tk_unfused(h_a)
                sync()
                row["topk_nohist_same_set"] = bool(torch.equal(idx.sort(-1).values,
                                                               first.sort(-1).values))
                row["topk_nohist_us"] = timer(lambda: tk_unfused(h_a))
                row["split_hist_us"] = timer(lambda: pass_a(h_a))
                # every config's blocks bitwise the default's (written words only), then timed
                words = HIST_BINS.value + 2
                by_cfg, h_c = {}, torch.empty_like(hist)
                h_a.fill_(-7)
                pass_a(h_a)
                for c in SPLIT_HIST_SPACE:
                    h_c.fill_(-7)
                    pass_a(h_c, c)
                    sync()
                    same = bool(torch.equal(h_c[:, :, :N, :words], h_a[:, :, :N, :words]))
                    by_cfg[f"{c[2]}{c[0]}w{c[1]}"] = (timer(lambda c=c: pass_a(h_c, c)) if same
                                                      else "MISMATCH")
                row["split_hist_us_by_config"] = by_cfg
                row["topk_perrow_us"] = timer(lambda: tk(h=None))
                if name == (names[0] if first_name is None else first_name):
                    row["topk_us_by_cand_block"] = {
                        str(cb): timer(lambda cb=cb: tk(TopkConfig(cand_block=cb)))
                        for cb in CAND_BLOCKS}
                    # the per-row kernel's warps (one program a row: at B 1 one CTA runs every
                    # level; at B 64, 64 programs on 132 SMs), each checked against the first run
                    by_w = {}
                    for cb in CAND_BLOCKS[:2]:
                        for nw in TopkConfig.SEARCH_SPACE["num_warps"]:
                            c = TopkConfig(cand_block=cb, num_warps=nw)
                            tk(c)
                            sync()
                            by_w[f"{cb}w{nw}"] = (timer(lambda c=c: tk(c))
                                                  if torch.equal(first, idx) else "MISMATCH")
                    row["topk_us_by_warps"] = by_w
                    # the split pass B's (BLOCK, warps), each checked against the first run
                    by_sc = {}
                    # (the Triton form named: without a form the shape's rule may pick the smem
                    # one, as on 2026-12-07, whose first such run timed the smem kernel under
                    # these keys)
                    for sc in SCATTER_SPACE:
                        tk(scatter=sc, form="triton")
                        sync()
                        by_sc[f"{sc[0]}w{sc[1]}" + ("v" if sc[2] else "")] = (
                            timer(lambda sc=sc: tk(scatter=sc, form="triton"))
                            if torch.equal(first, idx) else "MISMATCH")
                    # the smem form (the Gluon kernel) at each (BLOCK, warps) of its space: output
                    # and plan state checked against the first run, keys "smem{BLOCK}w{warps}"
                    st2 = torch.empty_like(state)
                    for b_, w_ in SCATTER_SMEM_SPACE:
                        sc = (b_, w_, True)
                        tk(scatter=sc, st=st2, form="smem")
                        sync()
                        same = torch.equal(first, idx) and torch.equal(st2, state)
                        by_sc[f"smem{b_}w{w_}"] = (
                            timer(lambda sc=sc: tk(scatter=sc, form="smem")) if same
                            else "MISMATCH")
                    row["topk_us_by_scatter"] = by_sc
                row["error"] = None
            except Exception as e:  # noqa: BLE001 - recorded per variant
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            if dog is not None:
                dog.cancel()
            row["wall_s"] = round(time.time() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            save(rows, meta)                       # a time limit still leaves the rows so far
        del s
        if not dry:
            torch.cuda.empty_cache()
    return rows, meta


# seconds an isolated child may take beyond --row-timeout: interpreter start, the inputs (the
# B 64 L 64K cache: 553 MB generated on the GPU) and the base variant's results read back
CHILD_SLACK_S = 240.0


def _row_head(sname: str, name: str, dry: bool = False) -> dict:
    """The keys a row starts with (:func:`_sweep`), from the shape table alone (no GPU)."""
    from bench.grid import Shape
    from kernels.indexer.triton import IndexerLogitsConfig
    if dry:
        preset, B, N, L, tab, topk = DRY_SHAPES[sname]
    else:
        (preset, B, N, L, tab), topk = SHAPES[sname], None
    shape = Shape("indexer_topk", preset, B, N, 1, L, table_len=tab, topk=topk)
    cfg = IndexerLogitsConfig(**VARIANTS[name])
    return dict(shape=sname, preset=preset, B=B, N=N, L=L,
                table_len=shape.table_positions // shape.P * shape.P, topk=shape.K_topk,
                variant=name, config=dict(cfg.__dict__))


def _child_cmd(sname: str, name: str, doc_path: str, base_file: str, row_timeout: float,
               first_name: str, dry: bool, unguarded: bool) -> list:
    """The command line of the child process of one (shape, variant) row."""
    cmd = [sys.executable, "-m", "bench.indexer_sweep", "--child", doc_path, "--shape", sname,
           "--variant", name, "--base-file", base_file, "--first-variant", first_name,
           "--row-timeout", str(row_timeout), "--out", os.devnull]
    return cmd + (["--dry-run"] if dry else []) + (["--unguarded"] if unguarded else [])


def _sweep_isolated(shapes, names, save=lambda rows, meta: None, row_timeout: float = 0,
                    dry: bool = False, unguarded: bool = False) -> tuple[list, dict]:
    """:func:`_sweep`'s rows, each (shape, variant) in its own child process, one after the
    other: a child that faults, fails or hangs (killed after ``row_timeout`` +
    :data:`CHILD_SLACK_S` seconds; its own watchdog ends a hung row at ``row_timeout``) leaves
    a row with its ``error`` (exit status and stderr tail) and the sweep goes on. The first
    variant whose child succeeds writes its results to a per-shape file that the later children
    check against (as :func:`_sweep` in one process). Returns ``(rows, meta)``; ``meta`` is the
    children's device description, plus ``"hung"`` naming the rows that hung."""
    table = DRY_SHAPES if dry else SHAPES
    rows: list = []
    meta: dict = {}
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    with tempfile.TemporaryDirectory(prefix="indexer_sweep_") as tmp:
        for sname in shapes:
            if sname not in table:
                continue
            base_file = os.path.join(tmp, f"base_{sname}.pt")
            for name in names:
                if dry and VARIANTS[name].get("kernel", "triton") != "triton":
                    continue                          # Gluon kernels do not interpret
                doc_path = os.path.join(tmp, f"{sname}_{name}.json")
                cmd = _child_cmd(sname, name, doc_path, base_file, row_timeout, names[0], dry,
                                 unguarded)
                t0 = time.time()
                limit = row_timeout + CHILD_SLACK_S if row_timeout > 0 else None
                why = None
                try:
                    proc = subprocess.run(cmd, timeout=limit, capture_output=True, text=True,
                                          env=env)
                    rc, err = proc.returncode, proc.stderr
                except subprocess.TimeoutExpired as e:
                    rc, err = None, (e.stderr.decode(errors="replace")
                                     if isinstance(e.stderr, bytes) else (e.stderr or ""))
                    why = f"killed after {limit:.0f} s (a hang?)"
                doc = {}
                if os.path.exists(doc_path):
                    try:
                        with open(doc_path) as f:
                            doc = json.load(f)
                    except json.JSONDecodeError:
                        doc = {}
                for k, v in doc.get("meta", {}).items():
                    if k == "hung":
                        why = why or v
                    else:
                        meta.setdefault(k, v)
                got = [r for r in doc.get("rows", []) if r.get("variant") == name]
                if got:
                    row = got[-1]
                else:
                    row = _row_head(sname, name, dry)
                    tail = " ".join((err or "").strip().splitlines()[-6:])[-600:]
                    row["error"] = (f"child process: {why or f'exit status {rc}'}; "
                                    f"{tail}")[:800]
                    row["wall_s"] = round(time.time() - t0, 1)
                if why:
                    meta["hung"] = "; ".join(x for x in (meta.get("hung"), f"{sname} {name}: {why}")
                                             if x)
                rows.append(row)
                print(json.dumps(row), flush=True)
                save(rows, meta)
    return rows, meta


def _child(args) -> None:
    """One isolated row (``--child DOC``): :func:`_sweep` of one shape and one variant, its rows
    and meta written to DOC after every change (a watchdog's exit still leaves them)."""
    if args.unguarded:
        from kernels.indexer import gluon_ws
        gluon_ws.ALLOW_UNVERIFIED = True

    def save(rows, meta, done=False):
        with open(args.child + ".tmp", "w") as f:
            json.dump(dict(meta=meta, rows=rows), f)
        os.replace(args.child + ".tmp", args.child)

    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    rows, meta = _sweep(args.shape, args.variant, save, args.row_timeout, dry=args.dry_run,
                        base_files={args.shape[0]: args.base_file}, first_name=args.first_variant)
    save(rows, meta)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="indexer_sweep.json")
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS), default=None,
                    help="logits variants (default: DEFAULT_VARIANTS, 'default' first)")
    ap.add_argument("--row-timeout", type=float, default=0,
                    help="seconds a (shape, variant) row may take before the sweep saves what it "
                         "has, names the row and exits 124 (a hung kernel; isolated rows: the "
                         "row's child exits, the sweep goes on); 0: no limit")
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), default=None,
                    help="shapes (default: DEFAULT_SHAPES, the first four)")
    ap.add_argument("--ws", action="store_true",
                    help="the warp-specialised kernel's variants (WS_VARIANTS, 'gluon' first) "
                         "before any --variant")
    ap.add_argument("--aot", action="store_true",
                    help="compile each variant for sm_90 on the CPU (no GPU) instead of timing")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU interpreter at DRY_SHAPES (Triton variants): plumbing only")
    ap.add_argument("--isolate", action="store_true",
                    help="each (shape, variant) row in its own child process (default with --ws)")
    ap.add_argument("--unguarded", action="store_true",
                    help="let the gluon_ws configs the launcher refuses run (isolated children: "
                         "to test them)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--base-file", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--first-variant", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args)
        return
    names = list(WS_VARIANTS) if args.ws else []
    names += [n for n in args.variant or () if n not in names]
    names = names or list(DEFAULT_VARIANTS)
    if "default" in names:
        names = ["default"] + [n for n in names if n != "default"]
    t0 = time.time()
    cmd = "python -m bench.indexer_sweep " + " ".join(argv if argv is not None else sys.argv[1:])

    def save(rows, meta, done=False):
        doc = dict(meta, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   command=cmd.strip(), elapsed_s=round(time.time() - t0, 1), partial=not done,
                   variants={n: VARIANTS[n] for n in names}, shapes=SHAPES, rows=rows)
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)

    if args.aot:
        rows, meta = _aot(names), dict(target="sm_90 (AOT, kernels._triton_aot)")
    else:
        if args.dry_run:
            os.environ.setdefault("TRITON_INTERPRET", "1")
        if args.ws or args.isolate:
            rows, meta = _sweep_isolated(args.shape or list(DEFAULT_SHAPES), names, save,
                                         args.row_timeout, dry=args.dry_run,
                                         unguarded=args.unguarded)
        else:
            if args.unguarded:
                from kernels.indexer import gluon_ws
                gluon_ws.ALLOW_UNVERIFIED = True
            rows, meta = _sweep(args.shape or list(DEFAULT_SHAPES), names, save, args.row_timeout,
                                dry=args.dry_run)
    save(rows, meta, done=True)
    print(f"json: {args.out}")


if __name__ == "__main__":
    main()
