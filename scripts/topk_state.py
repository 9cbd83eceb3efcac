"""What the split top-k did inside the bench's decode-layer rows (GPU; issue 17's open item:
``_radix_topk_kernel`` takes ~60 us in the V4-Flash layer rows, 8-18 us elsewhere).

For each selected layer row of ``bench.grid.targets_grid()`` this runs one eager step of the
torch layer on the bench's inputs with ``kernels.topk.triton.launch_topk`` wrapped: the wrapper
keeps a copy of the logits, lengths and histograms the layer's indexer hands to the top-k and
the plan's per-row state (``kernels.topk.window.STATE_FIELDS``). Then it re-runs
the top-k alone on that copy under the profiler (GPU time per kernel) and reports, per row
(request x draft), the plan state and the logits' distribution: length, the top-k-th value,
how many keys equal it, how many are > 0, == 0 and < 0, and the row max. Beside the copy's times: the launch's arguments
(shapes, strides, 16-byte alignment: what Triton specialises on), the same call repeated on the
layer's own tensors right after the step's launch (``same_tensors_us``), and the step's own
indexer kernel times (``step_kernels_us``), so a slow launch is told apart from slow inputs.

  python scripts/topk_state.py --out $OUT/topk_state.json            # all layer rows
  python scripts/topk_state.py -k DSV4_FLASH                           # V4 rows only
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.topk.window import STATE_FIELDS, state_summary  # noqa: E402 (NumPy only)


def _row_stats(logits, lens, topk: int, rows: int = 4) -> list[dict]:
    """Per row (the first ``rows``): its length and the distribution of its valid logits."""
    import torch
    res = []
    for r in range(min(rows, logits.shape[0])):
        n = int(lens[r])
        x = logits[r, :n].float()
        k = min(topk, n)
        kth = float(torch.topk(x, k).values[-1]) if k else float("nan")
        res.append({"row": r, "len": n, "kth": kth, "eq_kth": int((x == kth).sum()),
                    "pos": int((x > 0).sum()), "zero": int((x == 0).sum()),
                    "neg": int((x < 0).sum()), "max": float(x.max()) if n else float("nan"),
                    "nan": int(torch.isnan(x).sum())})
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", default="", help="substring of the row label (Shape.label())")
    ap.add_argument("--out", default="", help="JSON file to write")
    ap.add_argument("--reps", type=int, default=5, help="profiled top-k repetitions (default 5)")
    a = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    import kernels.topk.triton as ktopk
    from bench import grid, paths
    from bench.inputs import make_inputs

    shapes = [s for s in grid.select(grid.targets_grid(), ops=["dsa_decode_layer"]) if a.k in s.label()]
    orig = ktopk.launch_topk
    seen: list = []

    def _desc(v):
        if isinstance(v, torch.Tensor):
            return {"shape": list(v.shape), "stride": list(v.stride()), "dtype": str(v.dtype),
                    "ptr_mod16": v.data_ptr() % 16, "contiguous": v.is_contiguous()}
        return v if isinstance(v, (int, float, bool, type(None))) else str(v)

    def _kernel_us(fn, reps):
        """GPU time per call of each kernel ``fn`` launches (profiler, ``reps`` calls)."""
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        tot: dict = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
                tot[e.name] = tot.get(e.name, 0.0) + e.device_time_total / reps
        return {k[:60]: round(v, 2) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}

    passthrough = [False]

    def wrapped(logits, lengths, topk, out, scratch, **kw):
        if passthrough[0]:
            return orig(logits, lengths, topk, out, scratch, **kw)
        state = torch.full((logits.shape[0], ktopk.STATE_WORDS.value), -7, dtype=torch.int32,
                           device=logits.device)
        # inputs copied *before* the call (the top-k may write its histogram argument)
        pre = dict(logits=logits.clone(), lengths=lengths.clone(),
                   kw={k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
        res = orig(logits, lengths, topk, out, scratch, state=state, **kw)
        args = {"logits": _desc(logits), "lengths": _desc(lengths), "topk": topk, "out": _desc(out),
                "scratch": _desc(scratch), **{k: _desc(v) for k, v in kw.items()}}
        # the same call again on the layer's own tensors, right after the step's launch
        same = _kernel_us(lambda: orig(logits, lengths, topk, out, scratch, **kw), a.reps)
        seen.append(dict(logits=pre["logits"], lengths=pre["lengths"], topk=topk, kw=pre["kw"],
                         state=state, out=out.clone(), scratch_cols=scratch.shape[1],
                         args=args, same_tensors_us=same))
        return res

    ktopk.launch_topk = wrapped
    be = paths.TorchBackend()
    report = []
    os.environ["DSA_BENCH_COMPILE_LAYER"] = "0"      # eager: the wrapper sees the real call
    for s in shapes:
        row = {"label": s.label()}
        try:
            inp = make_inputs(s, rotations=1, device="cuda", q_dtype="bfloat16", latent_dtype="bfloat16", seed=0)
            calls = be.prepare(s.op, inp, "triton")
            seen.clear()
            calls[0]()
            torch.cuda.synchronize()
            passthrough[0] = True                    # the step's own kernel times, unwrapped
            row["step_kernels_us"] = {k: v for k, v in _kernel_us(calls[0], a.reps).items()
                                      if "topk" in k or "logits" in k}
            passthrough[0] = False
            if not seen:
                row["error"] = "launch_topk was not called (another top-k path ran)"
            else:
                c = seen[-1]
                st = c["state"].cpu()
                R, W = c["logits"].shape
                n_drafts = c["kw"].get("n_drafts", 1)
                lens = c["lengths"].cpu().long()
                if lens.numel() != R:                    # request lengths: the MTP rule
                    lens = (lens[:, None] - (n_drafts - 1 - torch.arange(n_drafts))).reshape(-1)
                lens = lens.clamp(0, W)
                row.update(R=R, W=W, topk=c["topk"], scratch_cols=c["scratch_cols"],
                           config=str(c["kw"].get("config")),
                           split=c["kw"].get("hist") is not None and c["kw"].get("page_size") is not None,
                           state=[dict(zip(STATE_FIELDS, map(int, st[r]))) for r in range(min(4, R))],
                           state_range={f: [int(st[:, i].min()), int(st[:, i].max())]
                                        for i, f in enumerate(STATE_FIELDS)},
                           state_summary=state_summary(st.numpy()),
                           rows=_row_stats(c["logits"], lens, c["topk"]))
                out2 = torch.empty_like(c["out"])
                scratch = torch.empty((R, c["scratch_cols"]), dtype=torch.int32, device="cuda")
                row["args"] = c["args"]
                row["same_tensors_us"] = c["same_tensors_us"]
                row["topk_alone_us"] = _kernel_us(
                    lambda: orig(c["logits"], c["lengths"], c["topk"], out2, scratch, **c["kw"]), a.reps)
                row["same_selection"] = bool(torch.equal(out2.sort(-1).values, c["out"].sort(-1).values))
        except Exception as e:  # noqa: BLE001 - record and go on
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        report.append(row)
        print(json.dumps(row)[:3000], flush=True)
        inp = calls = None
        seen.clear()
        torch.cuda.empty_cache()
    ktopk.launch_topk = orig
    if a.out:
        Path(a.out).write_text(json.dumps({"meta": {"gpu": torch.cuda.get_device_name(0),
                                                    "command": "python scripts/topk_state.py " + " ".join(argv or sys.argv[1:])},
                                           "rows": report}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
