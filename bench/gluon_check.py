"""Check and time the Gluon sparse-MLA kernel against the float64 reference and the Triton
64-head tile on an sm_90 GPU (GPU only).

    python -m bench.gluon_check --out gluon.json [--no-time]

Correctness: random and corner cases of both fp8 formats with bf16 and fp16 q (invalid entries,
block tables, topk_length, sink, 1 and 3 splits, H 24 / 64 / 128), each checked with
``kernels.compare.check_mla`` (the SPEC tolerances). Timing: ``triton.testing.do_bench_cudagraph``
medians (one CUDA graph per call, so launch overhead is excluded) of the Gluon config against
the heuristic's Triton config at the issue's target shapes (bench.mla_sweep's inputs).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import triton

from bench.mla_sweep import _inputs
from kernels import cases, compare
from kernels.sparse_mla import configs
from torch_impl import _common
from torch_impl import sparse_mla as tsm


def _t(x):
    return _common.as_tensor(x, "cuda") if isinstance(x, np.ndarray) else x


def _run(case, cfg, splits):
    kw = {k: _t(v) for k, v in case.kwargs().items()}
    return tsm._triton_impl(_t(case.q), _t(case.kv_cache), _t(case.indices), case.sm_scale,
                            kw["kv_format"], kw["d_v"], kw["block_table"], kw["topk_length"],
                            kw["attn_sink"], config=cfg, num_splits=splits)


def _check_one(name: str, case, ref, cfg, splits: int) -> dict:
    """One Gluon launch of ``case`` against its reference ``ref`` (out, lse), printed."""
    try:
        out, lse = _run(case, cfg, splits)
        res = compare.check_mla(out, lse, *ref, q_dtype=case.q_dtype)
        row = dict(case=name, passed=bool(res.passed), detail=str(res)[:400])
    except Exception as e:  # noqa: BLE001 - reported per case
        row = dict(case=name, passed=False, detail=f"{type(e).__name__}: {e}"[:800])
    print(("PASS " + name) if row["passed"] else f"FAIL {name} {row['detail'][:200]}", flush=True)
    return row


def check() -> list[dict]:
    rows = []
    specs = []
    for fmt, dqk in (("fp8_ds_mla", 576), ("fp8_model1", 512)):
        for qd in ("bfloat16", "float16"):
            for H, K, B, N in ((64, 100, 3, 2), (128, 640, 2, 1), (24, 64, 2, 2), (64, 2048, 1, 1)):
                specs.append((fmt, dqk, qd, H, K, B, N))
    for i, (fmt, dqk, qd, H, K, B, N) in enumerate(specs):
        case = cases.make_mla_case(100 + i, B=B, N=N, H=H, K=K, P=64, d_qk=dqk, kv_format=fmt,
                                   q_dtype=qd, invalid="mix", logical=True,
                                   topk_length=True, attn_sink=True)
        ref = case.reference()
        for splits, cfg in ((1, configs.SPARSE_MLA_GLUON), (3, configs.SPARSE_MLA_GLUON),
                            (1, configs.SPARSE_MLA_GLUON2), (3, configs.SPARSE_MLA_GLUON2)):
            rows.append(_check_one(f"{fmt} q={qd} H{H} K{K} B{B} N{N} splits={splits} "
                                   f"x{cfg.num_stages}", case, ref, cfg, splits))
    for j, corner in enumerate(cases.mla_corner_cases(7, d_qk=576, H=64, K=64, kv_format="fp8_ds_mla",
                                                      q_dtype="bfloat16", kv_dtype="bfloat16")):
        ref = corner.reference()
        for cfg in (configs.SPARSE_MLA_GLUON, configs.SPARSE_MLA_GLUON2):
            rows.append(_check_one(f"corner {j} {getattr(corner, 'name', '')} x{cfg.num_stages}",
                                   corner, ref, cfg, 2))
    return rows


SHAPES = [  # (preset, B, H, K, kv_format, d_qk, N)
    ("DSV32", 64, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 64, 64, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 16, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 1, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 128, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV4_FLASH", 64, 64, 640, "fp8_model1", 512, 1),
]


def timing() -> list[dict]:
    dev = _common.device_info(torch.device("cuda"))
    rows = []
    for preset, B, H, K, fmt, dqk, N in SHAPES:
        q, kv, idx = _inputs(B, H, K, dqk, fmt)
        heur = configs.sparse_mla_heuristic(H, dev.smem_per_block, rows=B * N, topk=K)  # Triton
        ref = None
        for cfg in (heur, configs.SPARSE_MLA_GLUON, configs.SPARSE_MLA_GLUON2):
            splits = configs.sparse_mla_num_splits(
                B * N * triton.cdiv(H, cfg.block_h), K, cfg.block_k, dev.num_sms,
                ctas_per_sm=configs.sparse_mla_ctas_per_sm(cfg, dev.smem_per_block))
            fn = lambda: tsm._triton_impl(q, kv, idx, dqk ** -0.5, fmt, 512, None, None, None,
                                          config=cfg, num_splits=splits)
            t0 = time.time()
            try:
                out, lse = fn()
                diff = None
                if ref is None:
                    ref = (out.float(), lse)
                else:
                    diff = float((out.float() - ref[0]).abs().max())
                us = triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3
                err = None
            except Exception as e:  # noqa: BLE001
                us, diff, err = None, None, f"{type(e).__name__}: {e}"[:600]
            row = dict(preset=preset, B=B, H=H, K=K, kv_format=fmt, config=cfg.to_dict(),
                       splits=splits, median_us=us, max_abs_diff_vs_heuristic=diff, error=err,
                       wall_s=round(time.time() - t0, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gluon_check.json")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__}
    if not args.no_check:
        res["check"] = check()
        print(f"check: {sum(r['passed'] for r in res['check'])}/{len(res['check'])} passed", flush=True)
    if not args.no_time:
        res["timing"] = timing()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
