"""Config sweep of the Triton sparse-MLA split kernel on the current GPU (every member of the
search space in kernels/sparse_mla/configs.py), at the headline DSV32 / DSV4_FLASH fp8 shapes.

    python -m bench.mla_sweep --out sweep.json [--config H,K,W,S ...] [--splits-scale 1 2]
                              [--targets] [--heads 16 8]

``--config`` adds candidates outside the search space (block_h, block_k, num_warps,
num_stages); ``--splits-scale`` times each config with the heuristic split count multiplied by
each factor (the split count is a runtime choice, see kernels.sparse_mla.configs.sparse_mla_num_splits).

Each config's output is first compared with the heuristic config's (max |diff| reported); the
time is ``triton.testing.do_bench``'s median over one input set (the selected rows of B=64
requests, 86 MB at DSV32, exceed the 60 MB L2 of an H200). Results feed bench/NOTES.md and,
where a config wins clearly, the dispatch table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton

from kernels.sparse_mla import configs
from torch_impl import _common, sparse_mla


def _inputs(B, H, K, d_qk, kv_format, pages_per_req=512, P=64, seed=0):
    """(q bf16 [B, 1, H, d_qk], cache, slots [B, 1, K]) on the GPU: random finite rows of
    ``kv_format`` (``latent``: bf16), K distinct-ish slots of each request's own 512 pages."""
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
    L = pages_per_req * P
    base = torch.arange(B, device="cuda")[:, None, None] * L
    idx = (torch.rand(B, 1, K, device="cuda", generator=g) * L).long() + base
    q = torch.randn(B, 1, H, d_qk, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, kv, idx.int()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="mla_sweep.json")
    ap.add_argument("--config", action="append", default=[],
                    help="extra config block_h,block_k,num_warps,num_stages[,prefetch 0/1]")
    ap.add_argument("--splits-scale", type=float, nargs="+", default=[1.0])
    ap.add_argument("--only-extra", action="store_true", help="skip the search space")
    ap.add_argument("--targets", action="store_true",
                    help="the issue's target shapes (B 64/16/1 H 128, H 64/16, V4 H 64/8)")
    ap.add_argument("--heads", type=int, nargs="+", default=None,
                    help="only the shapes with these head counts (e.g. 16 8)")
    args = ap.parse_args()
    extra = []
    for c in args.config:
        h, k, w, st, *pf = (int(x) for x in c.split(","))
        extra.append(configs.SparseMLAConfig(h, k, w, st, prefetch=bool(pf[0]) if pf else True))
    dev = _common.device_info(torch.device("cuda"))
    shapes = [("DSV32", 64, 128, 2048, 576, "fp8_ds_mla"), ("DSV32", 64, 16, 2048, 576, "fp8_ds_mla"),
              ("DSV4_FLASH", 64, 64, 512, 512, "fp8_model1")]
    if args.targets:
        shapes = [("DSV32", 64, 128, 2048, 576, "fp8_ds_mla"), ("DSV32", 64, 64, 2048, 576, "fp8_ds_mla"),
                  ("DSV32", 16, 128, 2048, 576, "fp8_ds_mla"), ("DSV32", 1, 128, 2048, 576, "fp8_ds_mla"),
                  ("DSV32", 64, 16, 2048, 576, "fp8_ds_mla"), ("DSV4_FLASH", 64, 64, 640, 512, "fp8_model1"),
                  ("DSV4_FLASH", 64, 8, 640, 512, "fp8_model1")]
    if args.heads:
        shapes = [s for s in shapes if s[2] in args.heads]
    rows = []
    for preset, B, H, K, d_qk, fmt in shapes:
        q, kv, idx = _inputs(B, H, K, d_qk, fmt)
        scale = d_qk ** -0.5
        ref = None
        space = [] if args.only_extra else list(configs.sparse_mla_space(dev.smem_per_block, 2))
        heur = configs.sparse_mla_heuristic(H, dev.smem_per_block)
        todo = [(c, f) for c in sorted(space, key=lambda c: c != heur) + extra
                for f in args.splits_scale]
        for cfg, fac in todo:
            t0 = time.time()
            rows_ = B * -(-H // cfg.block_h)
            splits = max(1, round(fac * configs.sparse_mla_num_splits(
                rows_, K, cfg.block_k, dev.num_sms,
                ctas_per_sm=configs.sparse_mla_ctas_per_sm(cfg, dev.smem_per_block))))
            try:
                fn = lambda: sparse_mla._triton_impl(q, kv, idx, scale, fmt, 512, None, None, None,
                                                     config=cfg, num_splits=splits)
                out, lse = fn()
                torch.cuda.synchronize()
                if ref is None:     # the plain-PyTorch path (gather + fp32 matmul)
                    r_out, r_lse = sparse_mla._torch_impl(q, kv, idx, scale, fmt, 512, None, None, None)
                    ref = (r_out.float(), r_lse)
                diff = float((out.float() - ref[0]).abs().max())
                us = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                err = None
            except Exception as e:  # noqa: BLE001 - recorded per config
                us, diff, err = None, None, f"{type(e).__name__}: {e}"[:300]
            row = dict(preset=preset, B=B, H=H, K=K, kv_format=fmt, config=cfg.__dict__,
                       num_splits=splits,
                       heuristic=cfg == heur, median_us=us, max_abs_diff_vs_torch_path=diff,
                       error=err, wall_s=round(time.time() - t0, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = dict(gpu=dev.name, compute_capability=f"{dev.cc[0]}.{dev.cc[1]}",
               versions=dict(torch=torch.__version__, triton=triton.__version__),
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               command="python -m bench.mla_sweep " + " ".join(sys.argv[1:]), rows=rows)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
