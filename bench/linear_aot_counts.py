"""AOT counts of the few-token GEMM (kernels/linear/triton.py) without a GPU: every launch spec
of ``aot_specs`` compiled for sm_90 (the large shared-memory class) and sm_120 (the small one)
with the GPU image's Triton, reporting shared memory, registers, spills, programs per SM and,
for the unsplit bf16 launch of each config, the SASS of its K loop per warp per iteration
(the largest backward-branch range: ``kernels._triton_aot.sass_counts``) with the bytes that
iteration streams.

    PYTHONPATH=. python -m bench.linear_aot_counts [--json out.json] [--triton .venv/triton-gpu-image]

bench/NOTES.md ("Few-token projections") has the numbers and what they predict.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kernels import _triton_aot as aot
from kernels.linear import triton as klinear

# (smem class, cc, shared memory per SM, max warps per SM, max programs per SM)
TARGETS = (("large", 90, 233_472, 64, 32), ("small", 120, 102_400, 48, 24))
LOOP_OPS = ("LDGSTS", "HGMMA", "HMMA", "LDSM", "FFMA", "LDS", "BAR")


def programs_per_sm(res: dict, smem_per_sm: int, max_warps: int, max_ctas: int) -> int:
    """Resident programs per SM by shared memory (+1 KiB reserved per block), registers
    (64 K per SM, allocated per warp in units of 256) and warps."""
    warps = res["num_warps"]
    regs = res["registers"] or 255
    per_warp = -(-regs * 32 // 256) * 256
    return max(0, min(smem_per_sm // (res["shared"] + 1024), 65_536 // (per_warp * warps),
                      max_warps // warps, max_ctas))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write every result here")
    ap.add_argument("--triton", default=str(Path(__file__).resolve().parents[1] / ".venv" / "triton-gpu-image"),
                    help="folder holding the Triton to compile with (default: the GPU image's, "
                         "unpacked by the Makefile); '' for the installed one")
    args = ap.parse_args(argv)
    tp = args.triton if args.triton and Path(args.triton, "triton").exists() else None
    # a fresh Triton cache: a cached compile skips ptxas, whose log gives the registers
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="linear-aot-cache-")
    rows = []
    for cls, cc, smem_sm, max_warps, max_ctas in TARGETS:
        specs = klinear.aot_specs(cls)
        t = time.time()
        res = aot.compile_specs(specs, (cc,), sass=True, triton_path=tp)
        print(f"## sm_{cc} ({cls}): {len(specs)} launches in {time.time() - t:.0f} s", flush=True)
        for spec, r in zip(specs, res):
            row = {k: v for k, v in r.items() if k != "sass"}
            if "error" not in r:
                row["programs_per_sm"] = programs_per_sm(r, smem_sm, max_warps, max_ctas)
                if "unsplit" in spec.label and "x=bf16 w=bf16 " in spec.label or "x=fp32 w=fp32" in spec.label:
                    ce = spec.constexprs
                    wb = 4 if ce["IEEE_FP32"] else 2
                    row["loop"] = {"total": r["sass"]["loop"]["total"],
                                   **{op: r["sass"]["loop"]["ops"].get(op, 0) for op in LOOP_OPS},
                                   "weight_bytes": ce["BLOCK_N"] * ce["BLOCK_K"] * wb,
                                   "token_bytes": ce["BLOCK_M"] * ce["BLOCK_K"] * wb}
                    row["sass_total"] = r["sass"]["total"]
            rows.append(row)
            loop = row.get("loop")
            print(f"{row['label']:78s} " + (row.get("error", "")[:200] if "error" in row else
                  f"smem {row['shared']:7d} regs {row['registers']} spill {row['spill_store_bytes']} "
                  f"per SM {row['programs_per_sm']}"
                  + (f" | loop {loop['total']} instr: " + " ".join(f"{op} {loop[op]}" for op in LOOP_OPS if loop[op])
                     + f" for {loop['weight_bytes']} B weights + {loop['token_bytes']} B tokens" if loop else "")),
                  flush=True)
    shutil.rmtree(os.environ["TRITON_CACHE_DIR"], ignore_errors=True)
    if args.json:
        import triton
        with open(args.json, "w") as f:
            json.dump({"command": "python -m bench.linear_aot_counts " + " ".join(sys.argv[1:] if argv is None else argv),
                       "date": time.strftime("%Y-%m-%d", time.gmtime()),
                       "triton": rows[0].get("triton") if rows else None,
                       "installed_triton": triton.__version__, "rows": rows}, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("linear_aot_counts: unset TRITON_INTERPRET (it compiles for GPU targets)")
    raise SystemExit(main())
