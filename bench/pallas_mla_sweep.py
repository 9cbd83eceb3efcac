"""Every Pallas sparse-MLA config of the GPU's space at the bench's fp8 target rows (jax/pallas),
so ``configs.pallas_sparse_mla_heuristic`` is set from Pallas timings (its rule was copied from
the Triton twin's 2026-12-01 sweep; bench/NOTES.md "Pallas against the Gluon kernels").

    python -m bench.pallas_mla_sweep --out pallas_mla_sweep.json [--rows NAME,...]
        [--scales 1,2] [--budget-s 420]
    python -m bench.pallas_mla_sweep --dry-run --out /tmp/p.json     # CPU, interpret=True

Rows: ``bench.mla_sweep.target_shapes()`` (the fp8 sparse-MLA rows of ``python -m bench
--targets``; ``--rows`` picks by name). Per row the bench's inputs (``bench.inputs``: rotated
sets that together exceed twice the L2), then first the heuristic's own choice (config and split
count as ``jax_impl.sparse_mla`` plans them: the baseline), then every config of the Pallas
space that fits the GPU's shared memory, at the launcher's split count times each of
``--scales``. Each variant is run once and checked against the float64 reference on the first
and last request (``bench.checks.Checker``, SPEC tolerances; a failing variant is not timed),
then timed with ``bench.timing.time_jax_grouped`` (the bench's JAX timer: jitted groups of calls
over the rotated sets). A variant that raises is an error row; ``--budget-s`` starts no variant
after that many seconds. ``--dry-run``: tiny shapes (``bench.mla_sweep.small_head_shapes(dry=True)``)
in the Pallas interpreter on the CPU, fp16 q (plumbing and checks only; timings meaningless).
The JSON (rewritten after every row) has the rows and, per shape, the baseline, the fastest
variant and its speed-up (``bench.mla_sweep.summarize``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def variants(dev, scales=(1.0,)) -> list[dict]:
    """The heuristic's choice, then each config of the Pallas space that fits ``dev``'s shared
    memory (16-bit operands) at the launcher's split count times each of ``scales``."""
    from kernels.sparse_mla import configs
    out = [{"name": "heuristic", "config": None, "scale": 1.0}]
    for cfg in configs.PALLAS_SPARSE_MLA_SPACE[configs.smem_class(dev.smem_per_block)]:
        if configs.pallas_sparse_mla_smem(cfg, 2) > dev.smem_per_block:
            continue
        d = cfg.to_dict()
        for f in scales:
            tag = (f"{d['block_h']}x{d['block_k']}w{d['num_warps']}s{d['num_stages']}"
                   f"{'p' if d.get('prefetch', True) else ''}_x{f:g}")
            out.append({"name": tag, "config": d, "scale": f})
    return out


def run_shape(name, shape, vs, emit, *, dry: bool, deadline: float | None) -> list[dict]:
    """Inputs, reference, then each variant of ``vs``: run once, check, time (one row each)."""
    import jax
    import numpy as np

    from bench import checks, timing
    from bench.inputs import make_inputs, rotations_for
    from bench.paths import to_jax
    from bench.runner import estimate_touched
    from jax_impl import sparse_mla as jsm
    from jax_impl._common import device_info
    from kernels.sparse_mla import configs

    dev = device_info()
    q_dtype = "float16" if dry else "bfloat16"
    R = 1 if dry else rotations_for(estimate_touched(shape), shape.input_bytes(1),
                                    max_bytes=30 << 30)
    inp = make_inputs(shape, rotations=R, device="cpu" if dry else "cuda", q_dtype=q_dtype,
                      latent_dtype=q_dtype, seed=0)
    checker = checks.Checker(inp)
    names = ("q", "kv_cache", "indices", "block_table", "attn_sink")
    sets = [tuple(to_jax(s.get(n)) for n in names) for s in inp.sets]
    fmt, d_v, scale = shape.kv_format, shape.p.d_v, inp.sm_scale
    q0, kv0, idx0, bt0, sink0 = sets[0]
    P, num_pages = jsm._validate(q0, kv0, idx0, scale, fmt, d_v, bt0, None, sink0, "pallas")
    B, N, H, K = shape.B, shape.N, shape.H, shape.K
    base = {"shape_key": name, "label": shape.label(), "preset": shape.preset, "B": B, "N": N, "H": H,
            "K": K, "kv_format": fmt, "rotations": R}
    rows = []
    for v in vs:
        row = {**base, "variant": v["name"], "config": None, "splits": None, "median_us": None,
               "p20_us": None, "p80_us": None, "timer": None, "check": None, "status": None}
        if deadline is not None and time.time() > deadline:
            row["status"] = "skipped: time budget spent (--budget-s)"
            rows.append(emit(row))
            continue
        t1 = time.time()
        try:
            cfg = (configs.SparseMLAConfig(**v["config"]) if v["config"] else
                   configs.SparseMLAConfig(**jsm._plan(q0, idx0, fmt, kv0.dtype, "pallas")
                                           .configs["pallas"]))
            splits = configs.sparse_mla_num_splits(B * N * -(-H // cfg.block_h), K, cfg.block_k,
                                                   dev.num_sms)
            splits = max(1, round(splits * v["scale"]))
            row.update(config=cfg.to_dict(), splits=splits)

            def f(q, kv, idx, bt, sink, cfg=cfg, splits=splits):
                return jsm._pallas(q, kv, idx, scale, kv_format=fmt, d_v=d_v, block_table=bt,
                                   topk_length=None, attn_sink=sink, page_size=P,
                                   num_pages=num_pages, config=cfg, num_splits=splits)
            fj = jax.jit(f)
            out, lse = jax.block_until_ready(fj(*sets[0]))
            res, how = checker.mla(np.asarray(out), np.asarray(lse))
            row["check"] = {"passed": res.passed, "how": how, "ratio": res.ratio,
                            "message": res.message}
            if not res.passed:
                row["status"] = f"FAILED check: {res.message}"[:300]
            else:
                t = (timing.time_cpu([lambda s=s: jax.block_until_ready(fj(*s)) for s in sets])
                     if dry else timing.time_jax_grouped(fj, sets))
                row.update(median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us,
                           timer=t.timer, status="ok")
        except Exception as e:  # noqa: BLE001 - a broken variant is a row
            row["status"] = f"error: {type(e).__name__}: {e}"[:400]
        row["wall_s"] = round(time.time() - t1, 1)
        rows.append(emit(row))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pallas_mla_sweep",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file (rewritten after every row)")
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    ap.add_argument("--scales", default="1", help="split-count factors, e.g. 1,2")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no variant after this many seconds")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes in the Pallas interpreter on the CPU (plumbing only)")
    args = ap.parse_args(argv)
    from bench import mla_sweep
    from jax_impl._common import device_info
    shapes = (mla_sweep.small_head_shapes(dry=True) if args.dry_run
              else mla_sweep.target_shapes())
    want = [r for r in args.rows.split(",") if r]
    unknown = [r for r in want if r not in shapes]
    if unknown:
        ap.error(f"argument --rows: expected names from {sorted(shapes)}, got {unknown}")
    if want:
        shapes = {k: shapes[k] for k in want}
    try:
        scales = tuple(float(x) for x in args.scales.split(",") if x)
    except ValueError:
        ap.error(f"argument --scales: expected comma-separated numbers, got {args.scales!r}")
    if not scales or min(scales) <= 0:
        ap.error(f"argument --scales: expected positive numbers, got {args.scales!r}")
    dev = device_info()
    deadline = time.time() + args.budget_s if args.budget_s else None
    doc = {"command": "python -m bench.pallas_mla_sweep " + " ".join(argv or sys.argv[1:]),
           "device": dev.name, "dry_run": args.dry_run, "partial": True, "rows": []}
    try:
        import jax
        import triton
        doc["versions"] = {"jax": jax.__version__, "triton": triton.__version__}
    except ImportError:
        pass

    def emit(row):
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        return row

    vs = variants(dev, scales)
    for name, shape in shapes.items():
        run_shape(name, shape, vs, emit, dry=args.dry_run, deadline=deadline)
    doc["partial"] = False
    doc["summary"] = mla_sweep.summarize(doc["rows"], baseline="heuristic")
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
