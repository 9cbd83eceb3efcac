"""Per-kernel time breakdown of the torch_impl Triton paths at the headline shapes (GPU only).

    python -m bench.profile_ops [--ops indexer,mla] [--once]

Builds one input set per shape with ``bench.inputs.make_inputs`` (the bench's generator), warms
each call up, then records 10 calls under ``torch.profiler`` and prints every CUDA kernel's mean
time per call: which kernel of an op (indexer logits vs top-k passes, MLA split vs combine)
takes the time. ``--once`` runs each call once after warm-up and nothing else (for wrapping in
``ncu``, which profiles the launches it is told to).
"""
from __future__ import annotations

import argparse

import torch

from bench.grid import Shape
from bench.inputs import make_inputs

SHAPES = {
    "indexer": [Shape("indexer_topk", "DSV32", 64, 1, 1, 65536),
                Shape("indexer_topk", "DSV32", 1, 1, 1, 131072)],
    "mla": [Shape("sparse_mla_decode", "DSV32", 64, 1, 1, 65536),
            Shape("sparse_mla_decode", "DSV32", 64, 1, 8, 65536),
            Shape("sparse_mla_decode", "DSV4_FLASH", 64, 1, 1, 65536)],
}


def _call(shape: Shape, s: dict, sm_scale: float):
    import torch_impl
    if shape.op == "indexer_topk":
        return lambda: torch_impl.indexer_topk(s["iq"], s["iw"], s["k_cache"], s["block_table"],
                                               s["context_lens"], shape.K_topk, path="triton")
    return lambda: torch_impl.sparse_mla_decode(
        s["q"], s["kv_cache"], s["indices"], sm_scale, kv_format=shape.kv_format,
        d_v=shape.p.d_v, block_table=s["block_table"], attn_sink=s["attn_sink"], path="triton")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="indexer,mla")
    ap.add_argument("--once", action="store_true")
    args = ap.parse_args()
    for op in args.ops.split(","):
        for shape in SHAPES[op]:
            inp = make_inputs(shape, rotations=1, device="cuda", q_dtype="bfloat16",
                              latent_dtype="bfloat16")
            fn = _call(shape, inp.sets[0], inp.sm_scale)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            if args.once:
                fn()
                torch.cuda.synchronize()
                continue
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            print(f"== {shape}")
            rows = [e for e in prof.key_averages() if e.device_time_total > 0]
            for e in sorted(rows, key=lambda e: -e.device_time_total):
                print(f"  {e.device_time_total / 10:9.1f} us/call  x{e.count / 10:g}  {e.key[:90]}")
            del inp, fn
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
