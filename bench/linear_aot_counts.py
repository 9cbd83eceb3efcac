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

from kernels import _triton_aot as aot
from kernels.linear import triton as klinear

# (smem class, cc); the per-SM limits are kernels._triton_aot.LIMITS
TARGETS = (("large", 90), ("small", 120))
LOOP_OPS = ("LDGSTS", "HGMMA", "HMMA", "LDSM", "FFMA", "LDS", "BAR")


def programs_per_sm(res: dict, cc: int) -> int:
    """Resident programs per SM (:func:`kernels._triton_aot.occupancy`: shared memory + the
    1 KiB reserved per block, registers allocated per warp in units of 256, warps, CTAs)."""
    return aot.occupancy(res["registers"], res["shared"], res["num_warps"], cc)["ctas"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write every result here")
    aot.add_triton_arg(ap)
    args = ap.parse_args(argv)
    tp = aot.triton_dir(args.triton)
    # a fresh Triton cache: a cached compile skips ptxas, whose log gives the registers
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="linear-aot-cache-")
    rows = []
    for cls, cc in TARGETS:
        specs = klinear.aot_specs(cls)
        t = time.time()
        res = aot.compile_specs(specs, (cc,), sass=True, triton_path=tp)
        print(f"## sm_{cc} ({cls}): {len(specs)} launches in {time.time() - t:.0f} s", flush=True)
        for spec, r in zip(specs, res):
            row = {k: v for k, v in r.items() if k != "sass"}
            if "error" not in r:
                row["programs_per_sm"] = programs_per_sm(r, cc)
                if "unsplit" in spec.label and "x=bf16 w=bf16 " in spec.label or "x=fp32 w=fp32" in spec.label:
                    ce = spec.constexprs
                    wb = 4 if ce["FP32_W"] else 2
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
