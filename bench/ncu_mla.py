"""One sparse-MLA Gluon kernel at one shape, launched a few times (an Nsight Compute target).

    ncu --kernel-name regex:gluon_xo --launch-skip 2 --launch-count 1 \\
        python3 -m bench.ncu_mla --kernel gluon_xo --B 64 --H 128

The kernel runs with its bench config (``bench.gluon_check.KERNEL_CONFIGS``; for the few-heads
kernels the smallest of their head blocks that holds ``--H``, e.g. ``--kernel gluon_shws --H 16
--block-table``: the 16-head WS config at the V3.2 B 64 H 16 target row) and the split count
the bench's timing uses, on gluon_check's inputs (``bench.mla_sweep._inputs``, fp8_ds_mla, top-k
2048, slots) or with ``--block-table`` on the targets bench's (``bench.inputs.make_inputs`` of the
V3.2 fp8 target row of that B and H: logical indices through a block table, the sink; one
rotation), ``--reps`` times; prints the last output's checksum. (On an H100 the L2 hint of
``gluon_xs``'s producer saved 30 us a call on the bench's inputs and 7 on gluon_check's:
bench/NOTES.md, sixteenth session.)
"""
import argparse

import torch

from bench import gluon_check as gc
from torch_impl import _common
from torch_impl import sparse_mla as tsm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="gluon_xo", choices=sorted(gc.KERNEL_CONFIGS))
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--H", type=int, default=128)
    ap.add_argument("--K", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--block-table", action="store_true",
                    help="the targets bench's inputs (block table, sink) instead of slots")
    a = ap.parse_args()
    dev = _common.device_info(torch.device("cuda"))
    cfgs = gc.KERNEL_CONFIGS[a.kernel]
    # a few-heads kernel's configs hold 8 / 16 heads: the smallest that holds H (else the widest)
    cfg = (min((c for c in cfgs if c.block_h >= a.H), key=lambda c: c.block_h,
               default=max(cfgs, key=lambda c: c.block_h))
           if a.kernel in gc.FEW_HEADS else cfgs[0])
    gc._use(a.kernel)
    splits = gc.timing_splits(cfg, a.B, a.H, a.K, dev)
    if a.block_table:
        from bench.inputs import make_inputs
        from bench.mla_sweep import target_shapes
        shape = [s for s in target_shapes().values()
                 if (s.preset, s.B, s.N, s.H, s.K) == ("DSV32", a.B, 1, a.H, a.K)]
        if not shape:
            ap.error(f"--block-table: no V3.2 fp8 target row with B {a.B} H {a.H} K {a.K}")
        inp = make_inputs(shape[0], rotations=1, device="cuda", q_dtype="bfloat16",
                          latent_dtype="bfloat16")
        s0 = inp.sets[0]
        q, kv, idx, bt, sink = s0["q"], s0["kv_cache"], s0["indices"], s0["block_table"], s0["attn_sink"]
        geo = (shape[0].P, kv.shape[0] * shape[0].P, kv.shape[0])
        scale = inp.sm_scale
    else:
        q, kv, idx = gc._inputs(a.B, a.H, a.K, 576, "fp8_ds_mla")
        bt = sink = geo = None
        scale = 576 ** -0.5
    for _ in range(a.reps):
        out, lse = tsm._triton_impl(q, kv, idx, scale, "fp8_ds_mla", 512, bt, None, sink,
                                    config=cfg, num_splits=splits, geometry=geo)
    torch.cuda.synchronize()
    print(f"{a.kernel} B{a.B} H{a.H} splits {splits}: ran "
          f"{tsm._triton_config(dev, q, kv, 'fp8_ds_mla', a.K, cfg).kernel}, "
          f"checksum {float(out.float().sum()):.6e}")


if __name__ == "__main__":
    main()
