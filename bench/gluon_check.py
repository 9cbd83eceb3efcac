"""Check and time the Gluon sparse-MLA kernels (``kernel="gluon"`` and the warp-specialised
``kernel="gluon_ws"``) against the float64 reference and the Triton 64-head tile on an sm_90 GPU
(GPU only).

    python -m bench.gluon_check --out gluon.json [--no-time] [--no-check]
        [--kernels gluon,gluon_ws] [--ws-timeout 900]

Correctness: random and corner cases of both fp8 formats with bf16 and fp16 q (invalid entries,
block tables, topk_length, sink, 1 and 3 splits, H 24 / 64 / 128; for the WS kernel also slots
without a block table, topk_length or sink), each checked with ``kernels.compare.check_mla``
(the SPEC tolerances). Timing: ``triton.testing.do_bench_cudagraph`` medians (one CUDA graph per
call, so launch overhead is excluded) of each Gluon config against the heuristic's Triton config
at the issue's target shapes (bench.mla_sweep's inputs).

The WS kernel is new and unmeasured: its checks and timings run in a child process (the same
module with ``--kernels gluon_ws``) under ``--ws-timeout`` seconds, its rows streamed to a file,
so a compile error, a mismatch, an illegal address or a hang (an mbarrier that never completes)
costs its own rows only: every case is recorded (``passed`` / ``error``) and the other kernels'
results are written either way.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import triton

from bench.mla_sweep import _inputs
from kernels import cases, compare
from kernels.sparse_mla import configs
from torch_impl import _common
from torch_impl import sparse_mla as tsm

# kernel -> the configs of it that are checked and timed
KERNEL_CONFIGS = {
    "gluon": (configs.SPARSE_MLA_GLUON, configs.SPARSE_MLA_GLUON2),
    "gluon_ws": (configs.SPARSE_MLA_GLUON_WS,),
}

_ROWS_FILE = None          # --rows: every row is also appended here as one JSON line


def _emit(kind: str, row: dict) -> dict:
    row = {"kind": kind, **row}
    if _ROWS_FILE:
        with open(_ROWS_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def _t(x):
    return _common.as_tensor(x, "cuda") if isinstance(x, np.ndarray) else x


def _run(case, cfg, splits):
    kw = {k: _t(v) for k, v in case.kwargs().items()}
    return tsm._triton_impl(_t(case.q), _t(case.kv_cache), _t(case.indices), case.sm_scale,
                            kw["kv_format"], kw["d_v"], kw["block_table"], kw["topk_length"],
                            kw["attn_sink"], config=cfg, num_splits=splits)


def _check_one(name: str, case, ref, cfg, splits: int) -> dict:
    """One launch of ``case`` with ``cfg`` against its reference ``ref`` (out, lse), printed."""
    t0 = time.time()
    try:
        out, lse = _run(case, cfg, splits)
        res = compare.check_mla(out, lse, *ref, q_dtype=case.q_dtype)
        row = dict(case=name, kernel=cfg.kernel, passed=bool(res.passed), detail=str(res)[:400])
    except Exception as e:  # noqa: BLE001 - reported per case
        row = dict(case=name, kernel=cfg.kernel, passed=False, error=f"{type(e).__name__}: {e}"[:800])
    row["wall_s"] = round(time.time() - t0, 2)
    print(("PASS " + name) if row["passed"]
          else f"FAIL {name} {(row.get('error') or row.get('detail', ''))[:200]}", flush=True)
    return _emit("check", row)


def _specs(kernel: str) -> list[tuple]:
    """(fmt, d_qk, q dtype, H, K, B, N, logical + topk_length + sink) of the random cases."""
    specs = []
    for fmt, dqk in (("fp8_ds_mla", 576), ("fp8_model1", 512)):
        for qd in ("bfloat16", "float16"):
            for H, K, B, N in ((64, 100, 3, 2), (128, 640, 2, 1), (24, 64, 2, 2), (64, 2048, 1, 1)):
                specs.append((fmt, dqk, qd, H, K, B, N, True))
    if kernel == "gluon_ws":      # plain slots, no topk_length, no sink (the other constexprs)
        for fmt, dqk in (("fp8_ds_mla", 576), ("fp8_model1", 512)):
            specs.append((fmt, dqk, "bfloat16", 128, 640, 2, 1, False))
            specs.append((fmt, dqk, "bfloat16", 64, 1000, 3, 1, False))
    return specs


def check(kernel: str) -> list[dict]:
    rows = []
    cfgs = KERNEL_CONFIGS[kernel]
    for i, (fmt, dqk, qd, H, K, B, N, feats) in enumerate(_specs(kernel)):
        case = cases.make_mla_case(100 + i, B=B, N=N, H=H, K=K, P=64, d_qk=dqk, kv_format=fmt,
                                   q_dtype=qd, invalid="mix", logical=feats,
                                   topk_length=feats, attn_sink=feats)
        ref = case.reference()
        for cfg in cfgs:
            for splits in (1, 3):
                rows.append(_check_one(
                    f"{fmt} q={qd} H{H} K{K} B{B} N{N} {'bt+tkl+sink' if feats else 'slots'} "
                    f"splits={splits} {cfg.kernel} x{cfg.num_stages}", case, ref, cfg, splits))
    for j, corner in enumerate(cases.mla_corner_cases(7, d_qk=576, H=64, K=64, kv_format="fp8_ds_mla",
                                                      q_dtype="bfloat16", kv_dtype="bfloat16")):
        ref = corner.reference()
        for cfg in cfgs:
            rows.append(_check_one(f"corner {j} {getattr(corner, 'name', '')} {cfg.kernel} "
                                   f"x{cfg.num_stages}", corner, ref, cfg, 2))
    return rows


SHAPES = [  # (preset, B, H, K, kv_format, d_qk, N)
    ("DSV32", 64, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 64, 64, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 16, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 1, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 128, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV4_FLASH", 64, 64, 640, "fp8_model1", 512, 1),
]


def timing(kernels: list[str], with_heuristic: bool = True) -> list[dict]:
    """CUDA-graph medians of the heuristic's Triton config (timed when ``with_heuristic``, else
    only run as the reference of the max-abs-diff) and of every config of ``kernels``."""
    dev = _common.device_info(torch.device("cuda"))
    rows = []
    for preset, B, H, K, fmt, dqk, N in SHAPES:
        q, kv, idx = _inputs(B, H, K, dqk, fmt)
        heur = configs.sparse_mla_heuristic(H, dev.smem_per_block, rows=B * N, topk=K)  # Triton
        ref = None
        todo = [(heur, with_heuristic)] + [(c, True) for k in kernels for c in KERNEL_CONFIGS[k]]
        for cfg, timed in todo:
            splits = configs.sparse_mla_num_splits(
                B * N * triton.cdiv(H, cfg.block_h), K, cfg.block_k, dev.num_sms,
                ctas_per_sm=configs.sparse_mla_ctas_per_sm(cfg, dev.smem_per_block))
            fn = lambda: tsm._triton_impl(q, kv, idx, dqk ** -0.5, fmt, 512, None, None, None,
                                          config=cfg, num_splits=splits)
            t0 = time.time()
            us = diff = err = None
            try:
                out, lse = fn()
                torch.cuda.synchronize()
                if ref is None:
                    ref = (out.float(), lse)
                else:
                    diff = float((out.float() - ref[0]).abs().max())
                if timed:
                    us = triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {e}"[:600]
            if not timed and err is None:
                continue
            row = dict(preset=preset, B=B, H=H, K=K, kv_format=fmt, config=cfg.to_dict(),
                       splits=splits, median_us=us, max_abs_diff_vs_heuristic=diff, error=err,
                       wall_s=round(time.time() - t0, 1))
            rows.append(_emit("timing", row))
            print(json.dumps(row), flush=True)
    return rows


def _isolated(kernel: str, args) -> tuple[list[dict], list[dict], dict]:
    """Run ``kernel``'s checks and timings in a child process under ``args.ws_timeout``; return
    (check rows, timing rows, run info) from its streamed rows, whatever became of it."""
    fd, rows_path = tempfile.mkstemp(prefix=f"gluon_check_{kernel}_", suffix=".jsonl")
    os.close(fd)
    cmd = [sys.executable, "-m", "bench.gluon_check", "--kernels", kernel, "--child",
           "--rows", rows_path, "--out", os.devnull]
    if args.no_time:
        cmd.append("--no-time")
    if args.no_check:
        cmd.append("--no-check")
    t0 = time.time()
    info = {"kernel": kernel, "cmd": " ".join(cmd)}
    try:
        proc = subprocess.run(cmd, timeout=args.ws_timeout, capture_output=True, text=True)
        info["returncode"] = proc.returncode
        if proc.returncode != 0:
            info["stderr_tail"] = proc.stderr[-3000:]
        sys.stdout.write(proc.stdout)
    except subprocess.TimeoutExpired as e:
        info["returncode"] = None
        info["error"] = f"timed out after {args.ws_timeout} s (a hang?)"
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        sys.stdout.write(out)
    info["wall_s"] = round(time.time() - t0, 1)
    rows = []
    with open(rows_path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    os.unlink(rows_path)
    print(f"{kernel} child: {json.dumps({k: v for k, v in info.items() if k != 'stderr_tail'})}",
          flush=True)
    if info.get("returncode") != 0:       # crashed or hung: one failed row says so in the count
        rows.append(_emit("check", dict(
            case=f"{kernel} child process ({len(rows)} rows before it stopped)", kernel=kernel,
            passed=False, error=info.get("error") or (info.get("stderr_tail") or "")[-800:])))
    return ([r for r in rows if r.get("kind") == "check"],
            [r for r in rows if r.get("kind") == "timing"], info)


def main() -> None:
    global _ROWS_FILE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gluon_check.json")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--kernels", default="gluon,gluon_ws",
                    help="comma-separated kernels to check and time (gluon, gluon_ws)")
    ap.add_argument("--ws-timeout", type=float, default=900.0,
                    help="seconds the isolated gluon_ws child may run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    _ROWS_FILE = args.rows
    kernels = [k for k in args.kernels.split(",") if k]
    isolated = [] if args.child else [k for k in kernels if k == "gluon_ws"]
    local = [k for k in kernels if k not in isolated]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "kernels": kernels}
    res["check"], res["timing"], res["isolated"] = [], [], []
    if not args.no_check:
        for k in local:
            res["check"] += check(k)
    if not args.no_time and local:
        res["timing"] += timing(local, with_heuristic=not args.child)
    for k in isolated:            # after the known kernels, so a hang costs only its own rows
        c, t, info = _isolated(k, args)
        res["check"] += c
        res["timing"] += t
        res["isolated"].append(info)
    for k in kernels:
        rows = [r for r in res["check"] if r.get("kernel") == k]
        print(f"check {k}: {sum(r['passed'] for r in rows)}/{len(rows)} passed", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
