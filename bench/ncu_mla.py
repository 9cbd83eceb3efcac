"""One sparse-MLA Gluon kernel at one shape, launched a few times (an Nsight Compute target).

    ncu --kernel-name regex:gluon_xo --launch-skip 2 --launch-count 1 \\
        python3 -m bench.ncu_mla --kernel gluon_xo --B 64 --H 128

The kernel runs with its bench config (``bench.gluon_check.KERNEL_CONFIGS``) and the split count
the bench's timing uses, on the bench's inputs (``bench.mla_sweep._inputs``, fp8_ds_mla, top-k
2048), ``--reps`` times; prints the last output's checksum.
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
    a = ap.parse_args()
    dev = _common.device_info(torch.device("cuda"))
    q, kv, idx = gc._inputs(a.B, a.H, a.K, 576, "fp8_ds_mla")
    cfg = gc.KERNEL_CONFIGS[a.kernel][0]
    gc._use(a.kernel)
    splits = gc.timing_splits(cfg, a.B, a.H, a.K, dev)
    for _ in range(a.reps):
        out, lse = tsm._triton_impl(q, kv, idx, 576 ** -0.5, "fp8_ds_mla", 512, None, None, None,
                                    config=cfg, num_splits=splits)
    torch.cuda.synchronize()
    print(f"{a.kernel} B{a.B} H{a.H} splits {splits}: ran "
          f"{tsm._triton_config(dev, q, kv, 'fp8_ds_mla', a.K, cfg).kernel}, "
          f"checksum {float(out.float().sum()):.6e}")


if __name__ == "__main__":
    main()
