"""AOT counts of the warp-specialised Gluon kernel (kernels/sparse_mla/gluon_ws.py) for sm_90, no
GPU needed: registers (setmaxnreg per partition), spills, shared memory and the SASS opcode counts
of each partition's block loop (per warp per 64-row block).

    PYTHONPATH=<triton 3.6.0>:. TRITON_INTERPRET=0 python -m bench.gluon_ws_counts
        [--model1 | --latent [--fp16] [--signal 0|1] [--p-smem 0|1]] [--producer-regs N]
        [--l2-prefetch 0|1] [--kernel gluon_ws|gluon_xs] [--final] [--slots]

The loops are ``kernels._triton_aot.block_loops``: the innermost backward branches spanning more
than 1 KiB of code before the last EXIT (the mbarrier retry loops that ptxas moves behind it are
excluded): the producer's loop comes first in the cubin, the consumer's second.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile

import torch

from kernels._triton_aot import block_loops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model1", action="store_true", help="fp8_model1 (default fp8_ds_mla)")
    ap.add_argument("--latent", action="store_true", help="a 16-bit latent cache (q of its dtype)")
    ap.add_argument("--fp16", action="store_true", help="fp16 q (default bf16)")
    ap.add_argument("--signal", type=int, choices=(0, 1), default=None,
                    help="latent full-slot protocol (default gluon_ws.LATENT_SIGNAL)")
    ap.add_argument("--p-smem", type=int, choices=(0, 1), default=None,
                    help="latent P exchange (default gluon_ws.LATENT_P_SMEM)")
    ap.add_argument("--producer-regs", type=int, default=None,
                    help="the producer's setmaxnreg budget (default gluon_ws.PRODUCER_REGS)")
    ap.add_argument("--l2-prefetch", type=int, choices=(0, 1), default=None,
                    help="the fp8 producer's L2 hint of the next block (default the module's "
                         "L2_PREFETCH)")
    ap.add_argument("--kernel", choices=("gluon_ws", "gluon_xs"), default="gluon_ws",
                    help="gluon_ws (default) or the seesaw kernel gluon_xs (fp8_ds_mla)")
    ap.add_argument("--final", action="store_true", help="the single-split epilogue")
    ap.add_argument("--slots", action="store_true", help="plain slots (default a block table)")
    args = ap.parse_args()
    import os
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="gluon_ws_counts_")  # run ptxas
    import triton
    from kernels import _triton_aot as aot
    from kernels.sparse_mla import triton_launch
    import dataclasses
    fmt = "latent" if args.latent else ("fp8_model1" if args.model1 else "fp8_ds_mla")
    spec = triton_launch._gluon_specs(fmt, torch.float16 if args.fp16 else torch.bfloat16,
                                      args.final, 2, args.kernel)[1 if args.slots else 0]
    for name, val in (("SIGNAL", args.signal), ("P_SMEM", args.p_smem),
                      ("PRODUCER_REGS", args.producer_regs), ("L2_PREFETCH", args.l2_prefetch)):
        if val is not None:
            spec = dataclasses.replace(spec, label=f"{spec.label} {name}={val}",
                                       constexprs={**spec.constexprs, name: val})
    res = aot.compile_spec(spec, 90)          # registers / spills / shared (ptxas -v)
    # the cubin and the PTX (compile_spec keeps only the counts; this compile hits the cache)
    import importlib
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    fn = getattr(importlib.import_module(spec.module), spec.kernel)
    cx = {k: (getattr(tl, v) if k in spec.dtype_constexprs else v) for k, v in spec.constexprs.items()}
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in cx:
            sig[name] = "constexpr"
        else:
            sig[name] = spec.signature[name]
            if sig[name].startswith("*") or name in spec.divisible:
                attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(GluonASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    res["setmaxnreg"] = sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)",
                                              k.asm["ptx"])))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run([aot._cuobjdump(), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
    res["loops"] = block_loops(sass)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
