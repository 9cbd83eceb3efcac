"""AOT counts of the Triton sparse-MLA split kernel (kernels/sparse_mla/triton.py) over a grid of
candidate tiles, without a GPU: each (config, fp8 format) compiled for sm_90 and sm_120 with the
GPU image's Triton (3.6.0), as the bench's small-head rows launch it (bf16 q, a block table, no
``topk_length``, the sink for fp8_model1, partial outputs: more than one split), reporting
registers, spills, shared memory, resident CTAs and warps per SM on an H200 and on sm_120, and
the SASS of the main loop (per warp per iteration: instructions, global loads, async copies).

    PYTHONPATH=<triton 3.6.0>:. python -m bench.mla_aot_counts [--json out.json] [--quick]
        [--block-h 16 32] [--block-k 16 32 64] [--warps 2 4 8] [--stages 1 2 3] [--prefetch 0 1]
        [--formats fp8_ds_mla fp8_model1] [--cc 90 120]

The tables in bench/NOTES.md ("Small heads: occupancy-first variant space") come from
``bench/results/mla_aot_counts_small_heads_20261205.json`` (this tool, the full grid);
``bench.mla_sweep --small-heads`` times the variants chosen from it. :func:`occupancy` and
:func:`predict` are the arithmetic behind the choice (no compile; used by the sweep and the
notes).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Per-SM limits: (shared bytes per SM, shared bytes per block, max warps, max CTAs, SMs).
# H200 (sm_90): 228 KiB per SM of which 227 KiB per block; 64 warps (2048 threads), 32 CTAs,
# 132 SMs. sm_120 (RTX PRO 6000 / 5090 class): 100 KiB per SM, 99 KiB per block, 48 warps
# (1536 threads), 24 CTAs; 188 SMs (RTX PRO 6000). The driver reserves 1 KiB per block.
LIMITS = {90: (233_472, 232_448, 64, 32, 132), 120: (102_400, 101_376, 48, 24, 188)}
REGISTERS_PER_SM = 65_536
RESERVED_SMEM = 1024
# bytes a row of each format occupies (data + scales + rope), read per gathered entry
ROW_BYTES = {"fp8_ds_mla": 656, "fp8_model1": 584}
FORMATS = (("fp8_ds_mla", 576, False), ("fp8_model1", 512, True))   # (format, D_qk, sink)
LOOP_OPS = ("HMMA", "LDG", "LDGSTS", "LDSM", "STS", "LDS", "LDL", "STL", "BAR", "F2FP", "MUFU")


def occupancy(regs: int | None, shared: int, num_warps: int, cc: int) -> dict:
    """Resident CTAs per SM of one compiled launch on ``sm_<cc>`` (registers allocated per warp
    in units of 256, shared memory plus the 1 KiB the driver reserves per block), with the
    limiting resource. 0 when the block's shared memory exceeds the per-block limit."""
    smem_sm, smem_blk, max_warps, max_ctas, _ = LIMITS[cc]
    if shared > smem_blk:
        return {"ctas": 0, "warps": 0, "limit": "shared per block"}
    per_warp = -(-(regs or 255) * 32 // 256) * 256
    lim = {"registers": REGISTERS_PER_SM // (per_warp * num_warps),
           "shared": smem_sm // (shared + RESERVED_SMEM),
           "warps": max_warps // num_warps, "ctas": max_ctas}
    n = min(lim.values())
    return {"ctas": n, "warps": n * num_warps,
            "limit": "+".join(k for k, v in lim.items() if v == n)}


def configs_grid(block_h, block_k, warps, stages, prefetch) -> list:
    from kernels.sparse_mla.configs import SparseMLAConfig
    return [SparseMLAConfig(h, k, w, s, prefetch=bool(p))
            for h, k, w, s, p in itertools.product(block_h, block_k, warps, stages, prefetch)]


def specs_for(cfgs, formats=("fp8_ds_mla", "fp8_model1")) -> list:
    """(format, config, LaunchSpec) of each candidate as the bench's rows launch it."""
    import torch
    from kernels.sparse_mla import triton_launch
    out = []
    for fmt, d_qk, sink in FORMATS:
        if fmt not in formats:
            continue
        for cfg in cfgs:
            out.append((fmt, cfg, triton_launch.split_spec(fmt, d_qk, torch.bfloat16, False, cfg,
                                                           has_bt=True, has_tkl=False,
                                                           has_sink=sink)))
    return out


def summarize(fmt: str, cfg, res: dict) -> dict:
    """One result row: the compile report, occupancy on the target and the main loop's SASS."""
    row = {"format": fmt, "config": cfg.to_dict(), "cc": res["cc"],
           **{k: res.get(k) for k in ("registers", "spill_store_bytes", "spill_load_bytes",
                                      "stack_bytes", "shared", "error")}}
    if "error" in res:
        return row
    row.update(occupancy(res["registers"], res["shared"], cfg.num_warps, res["cc"]))
    sass = res.get("sass")
    if sass:
        loop = sass["loop"]
        row["loop"] = {"total": loop["total"], **{op: loop["ops"].get(op, 0) for op in LOOP_OPS}}
        row["sass_total"] = sass["total"]
    return row


def rows_in_flight(cfg, loop: dict | None) -> int:
    """Nominal gathered rows one CTA keeps in flight: ``block_k`` per block, the blocks ahead
    of the computed one: 1 with the hand pipeline (``prefetch``), ``num_stages - 1`` more when
    Triton's pipeliner turned the gathers into async copies (LDGSTS in the loop), else the
    block being waited for (a no-prefetch, no-async loop overlaps nothing)."""
    ahead = int(cfg.prefetch)
    if loop and loop.get("LDGSTS", 0) > 0:
        ahead += cfg.num_stages - 1
    return cfg.block_k * max(1, ahead)


# Calibration of the issue model (ncu, H200, 2026-12-05, docs/logs/ncu_mla_triton_*): at 2
# resident warps per scheduler the small-head tile issued 0.31 (H16) / 0.29 (V4 H8)
# instructions per cycle per scheduler: ~0.15 per warp (6.2-6.5 cycles between a warp's
# instructions, latency-bound). The model keeps that per-warp rate and caps a scheduler at
# IPC_MAX (shared-memory, MMA and LSU pipes; a range: 0.5 .. 0.8).
WARP_IPC = 0.15
IPC_MAX = (0.5, 0.8)


def plan(B: int, H: int, K: int, cfg, splits: int, ctas_per_sm: int, num_sms: int) -> dict:
    """Grid arithmetic of one launch: CTAs, waves, loop iterations per CTA (the launcher's
    chunk: a multiple of ``block_k``, trailing empty splits trimmed)."""
    hb = -(-H // cfg.block_h)
    chunk = -(-(-(-K // splits)) // cfg.block_k) * cfg.block_k
    s_eff = -(-K // chunk)
    ctas = B * hb * s_eff
    slots = max(1, num_sms * ctas_per_sm)
    return {"splits": s_eff, "ctas": ctas, "waves": ctas / slots, "iters": chunk // cfg.block_k,
            "head_fill": H / (hb * cfg.block_h)}


def model_cycles(B: int, H: int, K: int, cfg, splits: int, row: dict, num_sms: int,
                 ipc_max: float, prologue: int) -> float:
    """Cycles of one launch by the issue model: the CTAs run in waves of ``ctas`` per SM; in a
    wave of c CTAs per SM each warp issues at ``min(WARP_IPC, 4 ipc_max / (c warps))`` and
    executes ``iters x loop + prologue`` instructions."""
    p = plan(B, H, K, cfg, splits, row["ctas"], num_sms)
    per_warp = p["iters"] * row["loop"]["total"] + prologue
    left, cyc = p["ctas"], 0.0
    while left > 0:
        c = min(row["ctas"], math.ceil(left / num_sms))
        rate = min(WARP_IPC, 4 * ipc_max / (c * cfg.num_warps))
        cyc += per_warp / rate
        left -= c * num_sms
    return cyc


def predict(shape: tuple, cfg, splits: int, row: dict, base: tuple, num_sms: int = 132,
            floor_us: float | None = None, prologue: int = 1300) -> tuple[float, float]:
    """(low, high) microseconds of ``cfg`` at ``splits`` for ``shape`` = (B, H, K) by
    :func:`model_cycles`, scaled to the measured time of the baseline launch ``base`` =
    (cfg, splits, row, measured_us) of the same shape; the low end is held at
    ``floor_us / 0.8`` (a gather of 584-656-byte rows does not beat ~80 % of the copy rate)."""
    B, H, K = shape
    bcfg, bsplits, brow, bus = base
    out = []
    for ipc in IPC_MAX:
        mine = model_cycles(B, H, K, cfg, splits, row, num_sms, ipc, prologue)
        theirs = model_cycles(B, H, K, bcfg, bsplits, brow, num_sms, ipc, prologue)
        out.append(bus * mine / theirs)
    lo, hi = min(out), max(out)
    if floor_us:
        lo, hi = max(lo, floor_us / 0.8), max(hi, floor_us / 0.8)
    return lo, hi


def _key(fmt: str, cfg: dict, cc: int) -> tuple:
    return (fmt, cc, tuple(sorted(cfg.items())))


def _print(row: dict) -> None:
    c = row["config"]
    tag = (f"{row['format']:10s} sm_{row['cc']} {c['block_h']:2d}x{c['block_k']:2d} "
           f"w{c['num_warps']} s{c['num_stages']} pf{int(c['prefetch'])}")
    if row.get("error"):
        print(f"{tag} ERROR {row['error'][:160]}", flush=True)
        return
    lp = row.get("loop", {})
    print(f"{tag} regs {row['registers']:3d} spill {row['spill_store_bytes']:4d} "
          f"smem {row['shared']:7d} ctas/SM {row['ctas']} warps/SM {row['warps']:2d} "
          f"({row['limit']}) loop {lp.get('total')} HMMA {lp.get('HMMA')} "
          f"LDG {lp.get('LDG')} LDGSTS {lp.get('LDGSTS')} LDL {lp.get('LDL')}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write every result here")
    ap.add_argument("--triton", default=str(Path(__file__).resolve().parents[1] / ".venv" / "triton-gpu-image"),
                    help="folder holding the Triton to compile with (default: the GPU image's, "
                         "unpacked by the Makefile); '' for the installed one")
    ap.add_argument("--block-h", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--block-k", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--prefetch", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--formats", nargs="+", default=["fp8_ds_mla", "fp8_model1"])
    ap.add_argument("--cc", type=int, nargs="+", default=[90, 120])
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--chunk", type=int, default=16, help="launches per compile batch (JSON after each)")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --json")
    args = ap.parse_args(argv)
    from kernels import _triton_aot as aot
    tp = args.triton if args.triton and Path(args.triton, "triton").exists() else None
    # a fresh Triton cache: a cached compile skips ptxas, whose log gives the registers
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="mla-aot-cache-")
    cfgs = configs_grid(args.block_h, args.block_k, args.warps, args.stages, args.prefetch)
    todo = specs_for(cfgs, tuple(args.formats))
    rows, done = [], set()
    if args.resume and args.json and Path(args.json).exists():
        rows = [r for r in json.loads(Path(args.json).read_text())["rows"] if not r.get("error")]
        done = {_key(r["format"], r["config"], r["cc"]) for r in rows}
    todo = [(f, c, s) for f, c, s in todo
            if not all(_key(f, c.to_dict(), cc) in done for cc in args.cc)]
    import triton
    meta = {"command": "python -m bench.mla_aot_counts " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "installed_triton": triton.__version__,
            "launch": "bf16 q, block table, no topk_length, sink for fp8_model1, partial",
            "limits": {f"sm_{k}": v for k, v in LIMITS.items()}}
    t = time.time()
    for a in range(0, len(todo), args.chunk):
        part = todo[a:a + args.chunk]
        res = aot.compile_specs([s for _, _, s in part], tuple(args.cc), sass=True, triton_path=tp,
                                workers=args.workers)
        for i, (fmt, cfg, _) in enumerate(part):
            for r in res[i * len(args.cc):(i + 1) * len(args.cc)]:
                meta["triton"] = r.get("triton") or meta.get("triton")
                row = summarize(fmt, cfg, r)
                rows.append(row)
                _print(row)
        if args.json:            # after every chunk: a cut-off run keeps what it compiled
            rows = list({_key(r["format"], r["config"], r["cc"]): r for r in rows}.values())
            with open(args.json, "w") as f:
                json.dump({**meta, "rows": rows}, f, indent=1)
        print(f"## {a + len(part)} / {len(todo)} launches x {len(args.cc)} targets, "
              f"{time.time() - t:.0f} s", flush=True)
    shutil.rmtree(os.environ["TRITON_CACHE_DIR"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("mla_aot_counts: unset TRITON_INTERPRET (it compiles for GPU targets)")
    raise SystemExit(main())
