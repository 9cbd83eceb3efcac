"""Per-kernel GPU time of the bench's target rows (torch backend), from ``torch.profiler``.

For each selected row of ``bench.grid.targets_grid()`` this builds the bench's inputs, runs the
torch path's call eagerly a few rounds under the profiler and reports the mean GPU time per call
of every CUDA kernel launched, by kernel name, largest first. It answers "which kernel of the op
is the time" (the indexer's logits vs its top-k launches, a decode layer's glue kernels), which
the bench's one median per row cannot. Timings are eager launches back to back (the kernels a
CUDA graph would replay); the bench's graph timer remains the row's number.

  python scripts/profile_kernels.py --op indexer_topk --out $OUT/profile_idx.json
  python scripts/profile_kernels.py --op dsa_decode_layer -k "B=1 " --top 30
  python scripts/profile_kernels.py --op dsa_decode_layer -k "B=1 " --timeline   # streams
  python scripts/profile_kernels.py --list
  ncu --kernel-name regex:gluon_ws python scripts/profile_kernels.py --op sparse_mla_decode \
      -k "B=64 H=128" --plain          # the same launches, no torch profiler (for ncu)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def kernel_times(calls, reps: int) -> dict:
    """{kernel name: mean GPU us per call} over ``reps`` rounds of ``calls``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for c in calls:                  # warm: compile / autotune outside the profile
        c()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for c in calls:
                c()
        torch.cuda.synchronize()
    tot: dict = defaultdict(float)
    cnt: dict = defaultdict(int)
    n = reps * len(calls)
    for e in prof.events():
        # GPU-side events: kernels and copies, not the ranges of record_function / custom ops
        # (user annotations, e.g. "dsa::indexer_topk"); aten kernels' names contain "::" too
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            tot[e.name] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            cnt[e.name] += 1
    return {k: {"us_per_call": v / n, "launches_per_call": cnt[k] / n}
            for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}


def kernel_timeline(trace) -> list[dict]:
    """The GPU kernels of a Chrome trace (``torch.profiler``'s ``export_chrome_trace``, as a
    dict or its event list) in start order: ``{"name", "stream", "start_us", "dur_us"}``, start
    relative to the first kernel's."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    ks = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    if not ks:
        return []
    t0 = min(float(e["ts"]) for e in ks)
    out = [{"name": str(e.get("name", ""))[:120],
            "stream": (e.get("args") or {}).get("stream", e.get("tid")),
            "start_us": round(float(e["ts"]) - t0, 3), "dur_us": round(float(e.get("dur", 0.0)), 3)}
           for e in ks]
    return sorted(out, key=lambda k: (k["start_us"], str(k["stream"])))


def concurrent_us(timeline: list[dict]) -> dict:
    """Of a :func:`kernel_timeline`: the span from the first kernel's start to the last one's
    end, the time some kernel runs, and the time two or more run at once (in us)."""
    edges = sorted([(k["start_us"], 1) for k in timeline]
                   + [(k["start_us"] + k["dur_us"], -1) for k in timeline], key=lambda e: (e[0], e[1]))
    busy = both = 0.0
    depth, last = 0, None
    for t, d in edges:
        if last is not None:
            busy += (t - last) if depth >= 1 else 0.0
            both += (t - last) if depth >= 2 else 0.0
        depth, last = depth + d, t
    span = (max(k["start_us"] + k["dur_us"] for k in timeline) - timeline[0]["start_us"]
            if timeline else 0.0)
    return {"span_us": round(span, 3), "busy_us": round(busy, 3), "concurrent_us": round(both, 3),
            "streams": sorted({str(k["stream"]) for k in timeline})}


def call_timeline(call) -> list[dict]:
    """The kernels of one (warm) ``call()`` on the GPU timeline (:func:`kernel_timeline`)."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return kernel_timeline(json.loads(Path(f.name).read_text()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Per-kernel GPU time of the bench's target rows "
                                             "(torch backend; needs a CUDA GPU), from torch.profiler. "
                                             "Exit 1 when a row failed, 2 on a usage error.")
    ap.add_argument("--op", action="append", default=[], help="op(s) to select (default: all)")
    ap.add_argument("-k", default="", help="substring of the row label (Shape.label())")
    ap.add_argument("--path", default="triton", help="torch path (default: triton)")
    ap.add_argument("--reps", type=int, default=5, help="profiled rounds over the rotated sets (default: 5)")
    ap.add_argument("--top", type=int, default=15, help="kernels printed per row (default: 15)")
    ap.add_argument("--out", default="", help="JSON file to write (default: none)")
    ap.add_argument("--list", action="store_true", help="print the selected rows and exit")
    ap.add_argument("--timeline", action="store_true",
                    help="also record one call's kernels on the GPU timeline (start, duration, "
                         "stream) and how long two or more ran at once (the layer's overlap)")
    ap.add_argument("--plain", action="store_true",
                    help="run the calls (warm round + --reps rounds) without torch.profiler, for an "
                         "outside profiler such as ncu; prints no kernel times")
    a = ap.parse_args(argv)
    from kernels.ops import OPS as ops
    bad = [o for o in a.op if o not in ops]
    if bad:
        ap.error(f"--op: expected one of {ops}, got {bad[0]!r}")
    if a.reps < 1:
        ap.error(f"--reps: expected a positive int, got {a.reps}")
    if a.timeline and a.plain:
        ap.error("--timeline needs the profiler; --plain runs without it")

    from bench import grid
    shapes = [s for s in grid.select(grid.targets_grid(), ops=a.op or None) if a.k in s.label()]
    if not shapes:
        ap.error(f"no target row matches --op {a.op or 'any'} and -k {a.k!r} (see --list)")
    if a.list:
        print("\n".join(s.label() for s in shapes))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("profile_kernels.py: needs a CUDA GPU (the rows run the torch paths' GPU kernels)",
              file=sys.stderr)
        return 2
    from bench import paths
    from bench.runner import recorded_env
    from bench.inputs import make_inputs
    from torch_impl.layer import fused_prep_default
    be = paths.TorchBackend()
    res = []
    for s in shapes:
        row = {"label": s.label(), "shape": s.to_dict()}
        try:
            inp = make_inputs(s, rotations=2, device="cuda", q_dtype="bfloat16", latent_dtype="bfloat16", seed=0)
            calls = be.prepare(s.op, inp, a.path)
            if a.plain:
                for _ in range(a.reps + 1):
                    for c in calls:
                        c()
                torch.cuda.synchronize()
                row["kernels"] = {}
            else:
                row["kernels"] = kernel_times(calls, a.reps)
                if a.timeline:
                    row["timeline"] = call_timeline(calls[0])
                    row["concurrency"] = concurrent_us(row["timeline"])
            row["total_us"] = sum(v["us_per_call"] for v in row["kernels"].values())
        except Exception as e:  # noqa: BLE001 - record and go on to the next row
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        res.append(row)
        print(f"== {row['label']}  total {row.get('total_us', float('nan')):.1f} us/call "
              f"{row.get('error', '')}", flush=True)
        for name, v in list(row.get("kernels", {}).items())[:a.top]:
            print(f"  {v['us_per_call']:9.1f} us  x{v['launches_per_call']:<5.2g} {name[:110]}")
        if "concurrency" in row:
            print(f"  timeline: {row['concurrency']}")
            for k in row["timeline"]:
                print(f"    {k['start_us']:9.1f} +{k['dur_us']:7.1f} us  stream {k['stream']}  {k['name'][:90]}")
        inp = calls = None
        torch.cuda.empty_cache()
    if a.out:
        meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                # layer rows: the module the bench times (compiled unless DSA_BENCH_COMPILE_LAYER=0)
                "layer_torch_compile_fullgraph": paths._compile_layer("cuda"),
                "layer_fused_prep": fused_prep_default(),                # DSA_LAYER_FUSED_PREP
                # the layer's two-stream step (DSA_LAYER_OVERLAP, DSA_LAYER_OVERLAP_CARVEOUT)
                # every DSA_* switch set (bench.runner.recorded_env)
                "env": recorded_env(),
                "command": "python scripts/profile_kernels.py " + " ".join(argv or sys.argv[1:])}
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": res}, indent=1))
    return 1 if any("error" in r for r in res) else 0


if __name__ == "__main__":
    raise SystemExit(main())
