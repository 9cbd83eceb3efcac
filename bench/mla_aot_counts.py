"""AOT counts of the Triton sparse-MLA split kernel (kernels/sparse_mla/triton.py) over a grid of
candidate tiles, without a GPU: each (config, fp8 format) compiled for sm_90 and sm_120 with the
GPU image's Triton (3.6.0), as the bench's small-head rows launch it (bf16 q, a block table, no
``topk_length``, the sink for fp8_model1, partial outputs: more than one split), reporting
registers, spills, shared memory, resident CTAs and warps per SM on an H200 and on sm_120, and
the SASS of the main loop (per warp per iteration: instructions, global loads, async copies).

    PYTHONPATH=<triton 3.6.0>:. python -m bench.mla_aot_counts [--json out.json] [--quick]
        [--block-h 16 32] [--block-k 16 32 64] [--warps 2 4 8] [--stages 1 2 3] [--prefetch 0 1]
        [--formats fp8_ds_mla fp8_model1] [--cc 90 120] [--kernels triton triton_rows]

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

from kernels import _triton_aot as aot
from kernels._triton_aot import LIMITS, occupancy  # noqa: F401 (occupancy: the tests read it here)

# bytes a row of each format occupies (data + scales + rope), read per gathered entry
ROW_BYTES = {"fp8_ds_mla": 656, "fp8_model1": 584}
FORMATS = (("fp8_ds_mla", 576, False), ("fp8_model1", 512, True))   # (format, D_qk, sink)
LOOP_OPS = ("HMMA", "LDG", "LDGSTS", "LDSM", "STS", "LDS", "LDL", "STL", "BAR", "F2FP", "MUFU")


def configs_grid(block_h, block_k, warps, stages, prefetch, kernels=("triton",)) -> list:
    """Every combination, for each Triton ``kernel``: ``"triton"`` (heads on the dots' M axis)
    or ``"triton_rows"`` (the split kernel's ``ROWS_M``: the gathered rows on M)."""
    from kernels.sparse_mla.configs import SparseMLAConfig
    return [SparseMLAConfig(h, k, w, s, prefetch=bool(p), kernel=kern)
            for kern, h, k, w, s, p in itertools.product(kernels, block_h, block_k, warps, stages,
                                                          prefetch)]


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
# instructions, latency-bound). The model keeps that per-warp rate and caps a scheduler at an
# issue rate of ``ipc_max`` (shared-memory, MMA and LSU pipes); a loop without loads in flight
# across iterations (no hand pipeline, no async copies) may also wait ``exposed`` cycles of
# memory latency per iteration that other warps do not hide. The two ends of a prediction:
# (ipc_max, exposed) = (0.8, 0) and (0.5, 1200) (~0.6 us at 1.98 GHz, a loaded HBM round trip).
WARP_IPC = 0.15
MODEL_ENDS = ((0.8, 0), (0.5, 1200))


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
                 ipc_max: float, exposed: float = 0, prologue: int = 1300) -> float:
    """Cycles of one launch by the issue model: the CTAs run in waves of ``row["ctas"]`` per SM;
    in a wave of c CTAs per SM each warp issues at ``min(WARP_IPC, 4 ipc_max / (c warps))`` and
    executes ``iters x loop + prologue`` instructions, plus ``exposed`` cycles per iteration
    when nothing is in flight across iterations (:func:`rows_in_flight` lookahead 0)."""
    p = plan(B, H, K, cfg, splits, row["ctas"], num_sms)
    per_warp = p["iters"] * row["loop"]["total"] + prologue
    ahead = int(cfg.prefetch) + (cfg.num_stages - 1 if row["loop"].get("LDGSTS", 0) else 0)
    wait = p["iters"] * exposed if ahead == 0 else 0.0
    left, cyc = p["ctas"], 0.0
    while left > 0:
        c = min(row["ctas"], math.ceil(left / num_sms))
        rate = min(WARP_IPC, 4 * ipc_max / (c * cfg.num_warps))
        cyc += per_warp / rate + wait
        left -= c * num_sms
    return cyc


def predict(shape: tuple, cfg, splits: int, row: dict, base: tuple, num_sms: int = 132,
            floor_us: float | None = None, prologue: int = 1300) -> tuple[float, float]:
    """(low, high) microseconds of ``cfg`` at ``splits`` for ``shape`` = (B, H, K) by
    :func:`model_cycles` at the two ends of :data:`MODEL_ENDS`, scaled to the measured time of
    a baseline launch ``base`` = ((B, H, K), cfg, splits, count row, measured us) of the same
    format (same shape, or another one: the model is per warp); the low end is held at
    ``floor_us / 0.8`` (a gather of 584-656-byte rows does not beat ~80 % of the copy rate)."""
    bshape, bcfg, bsplits, brow, bus = base
    out = []
    for ipc, exposed in MODEL_ENDS:
        mine = model_cycles(*shape, cfg, splits, row, num_sms, ipc, exposed, prologue)
        theirs = model_cycles(*bshape, bcfg, bsplits, brow, num_sms, ipc, exposed, prologue)
        out.append(bus * mine / theirs)
    lo, hi = min(out), max(out)
    if floor_us:
        lo, hi = max(lo, floor_us / 0.8), max(hi, floor_us / 0.8)
    return lo, hi


# The rows ``--report`` predicts ((B, H, K), format, measured us, floor us): the baseline is the
# tile the binding runs today at the small heads (16 x 32, 4 warps, 2 stages, no hand pipeline;
# the launcher's split count), timed by the bench on the H200
# (bench/results/bench_h200_targets_torch_20261205.json). V4 H64 runs the Gluon kernel today
# (49.4 us) and V3.2 H32 is no bench row: their Triton tiles are predicted from the V4 H8 /
# V3.2 H16 baseline of their format (the model is per warp, so another H is another grid).
REPORT_SHAPES = {
    "v32_h16": ((64, 16, 2048), "fp8_ds_mla", 99.8, 20.6),
    "v4_h8": ((64, 8, 640), "fp8_model1", 42.7, 5.8),
    "v4_h64": ((64, 64, 640), "fp8_model1", None, 7.8),
    "v32_h32": ((64, 32, 2048), "fp8_ds_mla", None, None),
}
BASE_CFG = dict(block_h=16, block_k=32, num_warps=4, num_stages=2, prefetch=False)


def launcher_splits(B: int, H: int, K: int, cfg, ctas_per_sm: int, num_sms: int = 132) -> int:
    """The split count ``configs.sparse_mla_num_splits`` gives at ``ctas_per_sm``."""
    from kernels.sparse_mla import configs
    return configs.sparse_mla_num_splits(B * -(-H // cfg.block_h), K, cfg.block_k, num_sms,
                                         ctas_per_sm=ctas_per_sm)


def report(path: str, cc: int = 90, top: int = 40) -> dict:
    """Per :data:`REPORT_SHAPES` row: every spill-free count on ``sm_<cc>`` with its residency,
    rows in flight per SM, loop instructions per useful (row, head), the split count that fills
    the counted CTA slots (and twice it) and the predicted range (:func:`predict`, against the
    baseline tile at the launcher's split count today). Printed, and returned by shape."""
    from kernels.sparse_mla import configs
    rows = json.loads(Path(path).read_text())["rows"]
    by = {_key(r["format"], r["config"], r["cc"]): r for r in rows}
    out = {}
    for name, ((B, H, K), fmt, base_us, floor) in REPORT_SHAPES.items():
        brow = by.get(_key(fmt, BASE_CFG, cc))
        if brow is None:
            continue
        bcfg = configs.SparseMLAConfig(**BASE_CFG)
        # the launcher sizes today's split count assuming 255 registers
        bsplit = launcher_splits(B, H, K, bcfg, configs.sparse_mla_ctas_per_sm(bcfg, 232_448))
        base = ((B, H, K), bcfg, bsplit, brow, base_us)
        if base_us is None:             # predicted from the V4 H8 / V3.2 H16 row of its format
            other = "v4_h8" if fmt == "fp8_model1" else "v32_h16"
            (B2, H2, K2), _, ref_us, _ = REPORT_SHAPES[other]
            base = ((B2, H2, K2), bcfg, launcher_splits(B2, H2, K2, bcfg, 2), brow, ref_us)
        lines = []
        for r in rows:
            if r["format"] != fmt or r["cc"] != cc or r.get("error") or r["spill_store_bytes"] \
                    or not r.get("ctas") or r["config"]["block_h"] > max(16, H):
                continue
            cfg = configs.SparseMLAConfig(**r["config"])
            if cfg.prefetch and cfg.num_stages > 1:     # the hand pipeline ignores num_stages
                continue
            s1 = launcher_splits(B, H, K, cfg, r["ctas"])
            for s in sorted({s1, 2 * s1}):
                lo, hi = predict((B, H, K), cfg, s, r, base, LIMITS[cc][4], floor)
                p = plan(B, H, K, cfg, s, r["ctas"], LIMITS[cc][4])
                lines.append({
                    "config": r["config"], "registers": r["registers"], "shared": r["shared"],
                    "ctas_per_sm": r["ctas"], "warps_per_sm": r["warps"], "limit": r["limit"],
                    "loop": r["loop"]["total"], "LDGSTS": r["loop"].get("LDGSTS", 0),
                    "instr_per_row_head": round(r["loop"]["total"] * cfg.num_warps
                                                / (cfg.block_k * min(H, cfg.block_h)), 1),
                    "kb_in_flight_per_sm": round(r["ctas"] * rows_in_flight(cfg, r["loop"])
                                                 * ROW_BYTES[fmt] / 1024, 1),
                    "splits": p["splits"], "ctas": p["ctas"], "waves": round(p["waves"], 2),
                    "iters": p["iters"], "pred_us": (round(lo, 1), round(hi, 1)),
                    "sm120_fits": _fits_120(by, fmt, r["config"])})
        lines.sort(key=lambda d: sum(d["pred_us"]))
        out[name] = {"shape": {"B": B, "H": H, "K": K, "format": fmt}, "baseline_us": base_us,
                     "baseline_splits": bsplit, "rows": lines}
        print(f"## {name}: B {B} H {H} K {K} {fmt}; baseline 16x32w4s2 x{bsplit} splits "
              f"{base_us} us (floor {floor})")
        for d in lines[:top]:
            c = d["config"]
            print(f"  {c['block_h']}x{c['block_k']} w{c['num_warps']} s{c['num_stages']} "
                  f"pf{int(c['prefetch'])} S{d['splits']:3d}: regs {d['registers']} smem "
                  f"{d['shared']} ctas/SM {d['ctas_per_sm']} warps/SM {d['warps_per_sm']} "
                  f"KB/SM {d['kb_in_flight_per_sm']} loop {d['loop']} instr/row-head "
                  f"{d['instr_per_row_head']} waves {d['waves']} -> {d['pred_us']} us"
                  f"{'' if d['sm120_fits'] else ' (not sm_120)'}")
    return out


def _fits_120(by: dict, fmt: str, cfg: dict) -> bool:
    r = by.get(_key(fmt, cfg, 120))
    return bool(r and not r.get("error") and r["shared"] <= LIMITS[120][1])


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
    aot.add_triton_arg(ap)
    ap.add_argument("--block-h", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--block-k", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--prefetch", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--formats", nargs="+", default=["fp8_ds_mla", "fp8_model1"])
    ap.add_argument("--kernels", nargs="+", default=["triton"], choices=["triton", "triton_rows"],
                    help="the split kernel's orientation(s): heads on M, or rows on M")
    ap.add_argument("--cc", type=int, nargs="+", default=[90, 120])
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--chunk", type=int, default=16, help="launches per compile batch (JSON after each)")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --json")
    ap.add_argument("--report", default=None,
                    help="no compile: the per-shape tables and predictions from this counts JSON")
    args = ap.parse_args(argv)
    if args.report:
        rep = report(args.report)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rep, f, indent=1)
        return 0
    tp = aot.triton_dir(args.triton)
    # a fresh Triton cache: a cached compile skips ptxas, whose log gives the registers
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="mla-aot-cache-")
    cfgs = configs_grid(args.block_h, args.block_k, args.warps, args.stages, args.prefetch,
                        tuple(args.kernels))
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
