"""Config sweep of the Triton indexer-logits kernel on the current GPU (GPU only).

    python -m bench.indexer_sweep --out sweep.json [--config SPLITS,WARPS,STAGES,TRANS,PAGES ...]

At DSV32 B=64 L=64K and B=1 L=128K (bench.inputs, one input set, pages scattered), times the
logits kernel with its fused top-digit histogram (``kernels.indexer.triton``) for each config
(``triton.testing.do_bench`` median; SPLITS 0 = heuristic) and the top-k kernel after it, and
compares each config's logits with the first config's (max relative difference over finite
logits; -inf patterns must match). Results feed bench/NOTES.md and the split heuristic.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import triton

from bench.grid import Shape
from bench.inputs import make_inputs
from kernels.indexer import triton as kx
from kernels.topk.triton import hist_shape, launch_topk
from torch_impl import _common

DEFAULT = ["0,0,1,1,2", "0,0,3,0,1", "16,4,1,1,2"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="indexer_sweep.json")
    ap.add_argument("--config", action="append", default=None,
                    help="num_splits,num_warps,num_stages,trans,pages (0 = heuristic)")
    args = ap.parse_args()
    dev = _common.device_info(torch.device("cuda"))
    cfgs = []
    for c in args.config or DEFAULT:
        sp, w, st, tr, pg = (int(x) for x in c.split(","))
        cfgs.append(kx.IndexerLogitsConfig(num_splits=sp or None, num_warps=w or None,
                                           num_stages=st, trans=bool(tr), pages=pg))
    rows = []
    for shape in (Shape("indexer_topk", "DSV32", 64, 1, 1, 65536),
                  Shape("indexer_topk", "DSV32", 1, 1, 1, 131072)):
        s = make_inputs(shape, rotations=1, device="cuda", q_dtype="bfloat16",
                        latent_dtype="bfloat16").sets[0]
        B, P = shape.B, shape.P
        bt, cl = s["block_table"], s["context_lens"]
        W = bt.shape[1] * P
        kv, ks = s["k_cache"].view(torch.float8_e4m3fn), s["k_cache"].view(torch.float32)
        base = None
        for cfg in cfgs:
            t0 = time.time()
            splits = kx.logits_splits(B, bt.shape[1], dev.num_sms, cfg)
            out = torch.full((B, 1, W), float("-inf"), device="cuda")
            hist = torch.empty(hist_shape(B, splits, 1), dtype=torch.int32, device="cuda")
            topk = torch.empty((B, 2048), dtype=torch.int32, device="cuda")
            scratch = torch.empty((B, W), dtype=torch.int32, device="cuda")
            fn = lambda: kx.launch_indexer_logits(s["iq"], s["iw"], kv, ks, bt, cl, out,
                                                  page_size=P, num_sms=dev.num_sms, config=cfg,
                                                  hist=hist, fp8_upcast=True)
            tk = lambda: launch_topk(out.view(B, W), cl, 2048, topk, scratch, hist=hist, n_drafts=1,
                                    page_size=P)
            try:
                fn()
                tk()
                torch.cuda.synchronize()
                fin = torch.isfinite(out)
                if base is None:
                    base = (out.clone(), fin, topk.clone())
                same_pattern = bool(torch.equal(fin, base[1]))
                rel = float(((out[fin] - base[0][fin]).abs() / base[0][fin].abs().clamp_min(1e-30)).max())
                same_topk = bool(torch.equal(topk.sort(-1).values, base[2].sort(-1).values))
                us = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                us_topk = triton.testing.do_bench(tk, warmup=10, rep=50, return_mode="median") * 1e3
                err = None
            except Exception as e:  # noqa: BLE001 - recorded per config
                us = us_topk = rel = same_pattern = same_topk = None
                err = f"{type(e).__name__}: {e}"[:300]
            row = dict(B=B, L=shape.L, config=cfg.__dict__, num_splits=splits, logits_us=us,
                       topk_us=us_topk, max_rel_diff_vs_first=rel, same_inf_pattern=same_pattern,
                       same_topk_set=same_topk, error=err, wall_s=round(time.time() - t0, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del s
        torch.cuda.empty_cache()
    doc = dict(gpu=dev.name, compute_capability=f"{dev.cc[0]}.{dev.cc[1]}",
               versions=dict(torch=torch.__version__, triton=triton.__version__),
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               command="python -m bench.indexer_sweep --out " + args.out, rows=rows)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
