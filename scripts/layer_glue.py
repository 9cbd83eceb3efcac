#!/usr/bin/env python3
"""The launches of one ``DSADecodeLayer`` step, read off the code on the CPU: every aten op the
step dispatches at the real preset dimensions, run on the meta device (shapes and dtypes only:
no weights are allocated, no GPU is needed), with its output, the bytes its tensors hold
(inputs read, outputs written) and its class: ``gemm`` (mm / bmm / addmm: cuBLAS, plus a split-K
reduce where cuBLAS picks one), ``dsa`` (the custom ops: cache writes, ``indexer_topk`` (V4: ``indexer_topk_window``,
whose window kernel is one more launch), ``sparse_mla_decode``, whose own small launches are not seen from here), ``fused`` (the fused
glue ops of ``DSA_LAYER_FUSED_PREP=1``, ``dsa::prep_x`` / ``dsa::prep_q`` and V4's
``dsa::rope_out``: one Triton launch each; bytes = the activations and weights the kernel reads
and what it writes, the new tokens' cache rows included) or ``glue`` (everything else: one CUDA
launch each).

It counts what a CUDA-graph replay (the bench's timer) runs: the eager value check, which
reads a bool back to the host and is skipped under capture, is skipped here too (``_capturing``
patched true); an op with an empty result launches nothing either.
``torch.nn.functional.rms_norm`` is counted as one launch, torch's CUDA
``_fused_rms_norm`` kernel (the meta device runs its six-op composite). Views and ``empty``
launch nothing and are not listed. Bytes are tensor sizes, not DRAM traffic: a strided slice
counts its elements, a broadcast operand its own size.

    python scripts/layer_glue.py                      # both presets, B = 64, every op listed
    python scripts/layer_glue.py --preset DSV32 -B 1 --summary
    python scripts/layer_glue.py --fused-prep 0       # the composite preparation (the switch off)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_NO_LAUNCH = {"view", "_unsafe_view", "slice", "select", "transpose", "t", "permute", "expand",
              "unsqueeze", "squeeze", "alias", "as_strided", "detach", "unbind", "split", "split_with_sizes",
              "_reshape_alias", "lift_fresh", "empty", "empty_strided", "scalar_tensor"}
_GEMM = {"mm", "bmm", "addmm", "baddbmm", "addmm_"}
_DSA = {"cache_write", "indexer_topk", "indexer_topk_window", "sparse_mla_decode"}
_FUSED = {"prep_x", "prep_q", "rope_out", "window_split"}


def _fused_bytes(name, args, outs, nbytes):
    """(read, written) bytes of one fused glue launch: ``prep_x`` reads its activation and
    weight inputs (not the caches, nor the +-1 matrix the kernel generates) and writes its two
    outputs plus one token row per cache per new token; ``prep_q`` reads its inputs but the +-1
    matrix and writes its three outputs; ``rope_out`` reads attn and writes its copy."""
    import torch
    from kernels import formats as nf
    ts = [a for a in args if isinstance(a, torch.Tensor)]
    if name == "prep_x":
        xq, xkv, xk, x, qn, kvn, kw, kb, freqs, _had, kv_cache, _k_cache, bt, cl = ts
        T, D_I, P = xq.shape[0], xk.shape[1], args[16]
        fmt = args[15]
        row = (kv_cache[0].numel() * kv_cache.element_size()) // P if fmt != "fp8_model1" else \
            nf.model1_page_bytes(P) // P
        read = nbytes([xq, xkv, xk, x, qn, kvn, kw, kb, freqs, bt, cl])
        return read, nbytes(outs) + T * (row + D_I + 4)
    if name == "rope_out":
        return nbytes(ts), nbytes(outs)
    return nbytes([t for i, t in enumerate(ts) if i != 4]), nbytes(outs)


def step_ops(preset: str, B: int, N: int = 1, L: int = 32768, return_intermediates: bool = True,
             fused_prep: bool | None = None):
    """``[(op, output description, read bytes, written bytes, class)]`` of one step
    (``fused_prep``: the layer's switch; None reads ``DSA_LAYER_FUSED_PREP``)."""
    import numpy as np
    import torch
    from torch.utils._pytree import tree_flatten
    from torch.utils._python_dispatch import TorchDispatchMode

    from kernels import layer_reference as lref
    import torch_impl.layer as tl

    cfg = lref.LAYER_CONFIGS[preset]
    fmt, P, dev = cfg.kv_format, cfg.page_size, "meta"
    weights = {k: np.zeros(s, np.float32) for k, s in lref.weight_shapes(cfg).items()}
    layer = tl.DSADecodeLayer(cfg, weights, kv_format=fmt, dtype=torch.bfloat16, device=dev,
                              path="triton", fused_prep=fused_prep)
    pages = B * (-(-L // P))
    args = (torch.empty(B, N, cfg.hidden, dtype=torch.bfloat16, device=dev),
            torch.empty(lref.kv_cache_shape(cfg, fmt, pages), dtype=torch.uint8, device=dev),
            torch.empty(pages, P * (cfg.index_head_dim + 4), dtype=torch.uint8, device=dev),
            torch.empty(B, pages // B, dtype=torch.int32, device=dev),
            torch.empty(B, dtype=torch.int32, device=dev))
    rows, fused = [], []

    def nbytes(ts):
        return sum(t.numel() * t.element_size() for t in ts)

    def tensors(tree):
        return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            outs = tensors(out)
            if (fused or name in _NO_LAUNCH or not any(t.device.type == "meta" for t in outs + tensors(args))
                    or (outs and all(t.numel() == 0 for t in outs))):     # an empty result launches nothing
                return out
            kind = ("gemm" if name in _GEMM else "dsa" if name in _DSA else "fused" if name in _FUSED
                    else "glue")
            desc = " ".join(f"{str(t.dtype)[6:]}{list(t.shape)}" for t in outs[:1])
            if kind == "fused":
                rows.append((name, desc, *_fused_bytes(name, args, outs, nbytes), kind))
                return out
            # an out= tensor and copy_'s destination are written, not read
            ins = args[1:] if name == "copy_" else args
            read = 0 if kind == "dsa" else nbytes(tensors((ins, {k: v for k, v in (kwargs or {}).items() if k != "out"})))
            rows.append((name, desc, read, 0 if kind == "dsa" else nbytes(outs), kind))
            return out

    rms_norm = torch.nn.functional.rms_norm

    def one_launch_rms_norm(x, shape, weight=None, eps=None):
        fused.append(True)
        try:
            y = rms_norm(x, shape, weight, eps)
        finally:
            fused.pop()
        rows.append(("rms_norm", f"{str(y.dtype)[6:]}{list(y.shape)}",
                     nbytes([x] + ([weight] if weight is not None else [])), nbytes([y]), "glue"))
        return y

    capturing = tl._capturing
    tl._capturing, torch.nn.functional.rms_norm = (lambda: True), one_launch_rms_norm
    try:
        with Log():
            layer(*args, return_intermediates=return_intermediates)
    finally:
        tl._capturing, torch.nn.functional.rms_norm = capturing, rms_norm
    return rows


def tl_fused(fused_prep: bool | None) -> bool:
    """The switch a layer built with ``fused_prep`` runs with."""
    from torch_impl.layer import fused_prep_default
    return fused_prep_default() if fused_prep is None else fused_prep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", action="append", default=[], help="DSV32 / DSV4_FLASH (default: both)")
    ap.add_argument("-B", type=int, default=64)
    ap.add_argument("-N", type=int, default=1)
    ap.add_argument("--summary", action="store_true", help="totals only")
    ap.add_argument("--fused-prep", type=int, choices=(0, 1), default=None,
                    help="the layer's fused_prep switch (default: DSA_LAYER_FUSED_PREP, on)")
    a = ap.parse_args(argv)
    fused = None if a.fused_prep is None else bool(a.fused_prep)
    for preset in a.preset or ["DSV32", "DSV4_FLASH"]:
        rows = step_ops(preset, a.B, a.N, fused_prep=fused)
        on = tl_fused(fused)
        print(f"== {preset} B={a.B} N={a.N} (bf16, CUDA-graph step, intermediates returned, "
              f"fused prep {'on' if on else 'off'})")
        if not a.summary:
            for i, (name, desc, r, w, kind) in enumerate(rows):
                mb = "" if kind == "dsa" else f"r {r / 1e6:8.3f} MB  w {w / 1e6:7.3f} MB"
                print(f"{i:3d} {kind:4s} {name:18s} {desc:32s} {mb}")
        for kind in ("glue", "fused", "gemm", "dsa"):
            sel = [row for row in rows if row[4] == kind]
            print(f"  {kind}: {len(sel)} launches" + ("" if kind == "dsa" else
                  f", {sum(r[2] for r in sel) / 1e6:.1f} MB read, {sum(r[3] for r in sel) / 1e6:.1f} MB written"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
