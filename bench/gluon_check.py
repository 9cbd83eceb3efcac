"""Check and time the Gluon sparse-MLA kernels (``kernel="gluon"``, the warp-specialised
``kernel="gluon_ws"``, the few-heads ``kernel="gluon_sh"`` and its warp-specialised twin
``kernel="gluon_shws"``, the crossover ``kernel="gluon_xo"`` and its seesaw twin
``kernel="gluon_xs"``) against the float64 reference
and the Triton tile the heuristic ran before them on an sm_90 GPU (GPU only).

    python -m bench.gluon_check --out gluon.json [--no-time] [--no-check]
        [--kernels gluon,gluon_ws,gluon_ws_latent,gluon_ws_latent_safe,gluon_sh,gluon_shws,gluon_xo,
                   gluon_xs]
        [--ws-timeout 900] [--stress 5000]

Kernels (``--kernels``): ``gluon`` and ``gluon_ws`` on the fp8 formats; ``gluon_ws_latent`` the
warp-specialised kernel on a 16-bit latent cache with its defaults (``gluon_ws.LATENT_SIGNAL``
0: the slot signalled by cp.async mbarrier arrivals; ``LATENT_P_SMEM`` 1: P to the value dots
through shared memory), ``gluon_ws_latent_safe`` with the conservative pair (1: wait_group +
fence + barrier + arrive, the fp8 producer's protocol; 0: P by ``convert_layout``, as the fp8
consumer), ``gluon_ws_latent_s1`` / ``gluon_ws_latent_pconv`` the two mixed pairs;
``gluon_sh`` the few-heads kernel (rows on wgmma M; every config of its space) on the fp8 formats
at H 5..32 (checks) and the few-heads shapes (timing: B 64 H 16 / 32, B 1 H 16, V4 H 8 / 16);
``gluon_shws`` the same cases and shapes for the warp-specialised few-heads kernel (its 8-head
config, in the sm_90 space, and its 16-head sweep config); ``gluon_xo`` the crossover kernel
(clusters of two 64-head CTAs sharing each row block's conversion) on the fp8 formats at H 100 /
128 (checks; corner cases at H 128) and the 128-head shapes (timing), in a child process;
``gluon_xs`` the same on fp8_ds_mla (its only format), ``gluon_xs_p56`` with a producer budget
of 56 registers; ``gluon_xs_pf`` / ``gluon_ws_pf`` with the producer hinting the next row
block into L2 (``L2_PREFETCH``; on by default since 2026-12-06), ``gluon_xs_nopf`` /
``gluon_ws_nopf`` without.

Correctness: random and corner cases of each kernel's formats with bf16 and fp16 q (invalid
entries, block tables, topk_length, sink, 1 and 3 splits, H 24 / 64 / 128; for the WS kernels
also slots without a block table, topk_length or sink; latent: also padded pages and P = 61),
each checked with ``kernels.compare.check_mla`` (the SPEC tolerances); a latent check also
records that the call ran the Gluon kernel (``ran``: the binding substitutes the Triton tile
where it cannot). Timing: ``triton.testing.do_bench_cudagraph`` medians (one CUDA graph per
call, so launch overhead is excluded) of each Gluon config and of the heuristic's Triton config
(``configs.sparse_mla_heuristic`` without the Gluon flags: for latent the 64 x 32 tile of the
631 us bench row, the A/B comparison) at the issue's target shapes of the requested kernels'
formats (bench.mla_sweep's inputs); each timing row also has ``median_us_cold``: the same call
with its gathered rows L2-cold, R rotated index sets in one graph (:func:`_time_cold`), the
condition of the bench's rows. The plain median alone misled once: gluon_xs 131.9 us against
gluon_ws 142.0 that way, 162.2 against 148 in the bench (H100, 2026-12-06).

The WS kernels, ``gluon_sh`` and ``gluon_shws`` (:data:`ISOLATED`) run in child processes (the same module with
``--kernels <one>``), one each,
under ``--ws-timeout`` seconds, their rows streamed to a file, so a compile error, a mismatch,
an illegal address or a hang (an mbarrier that never completes) costs that kernel's rows only:
every case is recorded (``passed`` / ``error``) and the other kernels' results are written
either way. The Triton tiles are timed in the parent, before the children.
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

from bench.mla_sweep import _inputs, _set_constants, draw_indices
from kernels import cases, compare
from kernels.sparse_mla import configs
from torch_impl import _common
from torch_impl import sparse_mla as tsm

FP8 = ("fp8_ds_mla", "fp8_model1")
# kernel -> (the configs of it that are checked and timed, the kv formats it runs, the module
# constants it sets: gluon_ws's, or "module.NAME")
KERNELS = {
    "gluon": ((configs.SPARSE_MLA_GLUON, configs.SPARSE_MLA_GLUON2), FP8, {}),
    "gluon_ws": ((configs.SPARSE_MLA_GLUON_WS,), FP8, {}),
    # the latent kernel's defaults (cp.async mbarrier arrivals, P through shared memory), the
    # conservative pair (wait_group + fence + barrier, P by convert_layout) and the other two
    "gluon_ws_latent": ((configs.SPARSE_MLA_GLUON_WS,), ("latent",),
                        {"LATENT_SIGNAL": 0, "LATENT_P_SMEM": 1}),
    "gluon_ws_latent_safe": ((configs.SPARSE_MLA_GLUON_WS,), ("latent",),
                             {"LATENT_SIGNAL": 1, "LATENT_P_SMEM": 0}),
    "gluon_ws_latent_s1": ((configs.SPARSE_MLA_GLUON_WS,), ("latent",),
                           {"LATENT_SIGNAL": 1, "LATENT_P_SMEM": 1}),
    "gluon_ws_latent_pconv": ((configs.SPARSE_MLA_GLUON_WS,), ("latent",),
                              {"LATENT_SIGNAL": 0, "LATENT_P_SMEM": 0}),
    # the few-heads kernel (rows on wgmma M): every config of the space
    "gluon_sh": ((configs.SPARSE_MLA_GLUON_SH8, configs.SPARSE_MLA_GLUON_SH16,
                  configs.SPARSE_MLA_GLUON_SH16W8, configs.SPARSE_MLA_GLUON_SH32), FP8, {}),
    # its warp-specialised twin (kernels/sparse_mla/gluon_small_ws.py; both in the sm_90 space)
    "gluon_shws": ((configs.SPARSE_MLA_GLUON_SHWS8, configs.SPARSE_MLA_GLUON_SHWS16), FP8, {}),
    # ... with the staged producer (gluon_small_ws.RAW_STAGE: the next block's raw bytes copied
    # into shared memory while this block converts) and the L2 hint on for both formats
    "gluon_shws_stage": ((configs.SPARSE_MLA_GLUON_SHWS8, configs.SPARSE_MLA_GLUON_SHWS16), FP8,
                         {"gluon_small_ws.RAW_STAGE": 1, "gluon_small_ws.L2_PREFETCH": 1,
                          "gluon_small_ws.L2_PREFETCH_FORMATS": ("fp8_ds_mla", "fp8_model1")}),
    # the crossover kernel (kernels/sparse_mla/gluon_xo.py: clusters of two 64-head CTAs)
    "gluon_xo": ((configs.SPARSE_MLA_GLUON_XO,), FP8, {}),
    # the crossover kernel with the seesaw consumer (kernels/sparse_mla/gluon_xs.py;
    # fp8_ds_mla only)
    "gluon_xs": ((configs.SPARSE_MLA_GLUON_XS,), ("fp8_ds_mla",), {}),
    # ... with gluon_ws's producer budget (56; the consumers' 200): 149.0 us against 132.3 at
    # B 64 H 128 (H100, 2026-12-06); its child stopped on the 150 s limit at the next timing row,
    # most likely slow rather than hung (bench/NOTES.md fifteenth session)
    "gluon_xs_p56": ((configs.SPARSE_MLA_GLUON_XS,), ("fp8_ds_mla",),
                     {"gluon_xs.PRODUCER_REGS": 56}),
    # the producers hinting the next block's rows into L2 (gluon._l2_prefetch_rows): for the
    # L2-cold rows of the bench (``median_us_cold``)
    "gluon_xs_pf": ((configs.SPARSE_MLA_GLUON_XS,), ("fp8_ds_mla",), {"gluon_xs.L2_PREFETCH": 1}),
    "gluon_ws_pf": ((configs.SPARSE_MLA_GLUON_WS,), FP8, {"L2_PREFETCH": 1}),
    # ... and without it (the defaults since 2026-12-06 have it on)
    "gluon_xs_nopf": ((configs.SPARSE_MLA_GLUON_XS,), ("fp8_ds_mla",), {"gluon_xs.L2_PREFETCH": 0}),
    "gluon_ws_nopf": ((configs.SPARSE_MLA_GLUON_WS,), FP8, {"L2_PREFETCH": 0}),
}
# kernels run in a child process each (a fault or a hang costs only their rows): the
# warp-specialised ones and the few-heads kernels (each an mbarrier protocol or a new tiling: a
# change to either could hang or fault before its check)
FEW_HEADS = ("gluon_sh", "gluon_shws", "gluon_shws_stage")     # heads on wgmma N
# clusters of two 64-head CTAs (gluon_xo, gluon_xs and its variants)
CLUSTERED = tuple(k for k, v in KERNELS.items() if v[0][0].kernel in configs.CLUSTER_KERNELS)
ISOLATED = tuple(k for k in KERNELS if k.startswith("gluon_ws")) + FEW_HEADS + CLUSTERED


def _heads_ok(kernel: str, H: int) -> bool:
    """Whether ``kernel`` is timed at a shape of H heads: the few-heads kernel at H <= 32, the
    crossover kernel where H makes whole clusters (``configs.gluon_xo_heads_ok``), the other
    64-head-tile kernels at H >= 64."""
    if kernel in CLUSTERED:
        return configs.gluon_xo_heads_ok(H)
    return H <= 32 if kernel in FEW_HEADS else H >= 64
KERNEL_CONFIGS = {k: v[0] for k, v in KERNELS.items()}


def _use(kernel: str) -> None:
    """Set the module constants ``kernel`` runs with (the launcher reads them at each launch):
    ``gluon_ws``'s, or ``module.NAME`` of another ``kernels.sparse_mla`` module
    (``bench.mla_sweep._set_constants``: a name the module lacks is a ValueError)."""
    _set_constants({name if "." in name else f"gluon_ws.{name}": val
                    for name, val in KERNELS[kernel][2].items()})


_ROWS_FILE = None          # --rows: every row is also appended here as one JSON line


def _emit(kind: str, row: dict) -> dict:
    row = {"kind": kind, **row}
    if _ROWS_FILE:
        with open(_ROWS_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def _t(x):
    return _common.as_tensor(x, "cuda") if isinstance(x, np.ndarray) else x


def _padded(kv: torch.Tensor) -> torch.Tensor:
    """A latent cache as a view of a pool with one NaN row more a page (page stride (P + 1) x
    D_qk: padded pages are read in place, the padding never)."""
    pool = torch.full((kv.shape[0], kv.shape[1] + 1, kv.shape[2]), float("nan"), dtype=kv.dtype,
                      device=kv.device)
    pool[:, :kv.shape[1]] = kv
    return pool[:, :kv.shape[1]]


def _run(case, cfg, splits, padded=False):
    kw = {k: _t(v) for k, v in case.kwargs().items()}
    kv = _padded(_t(case.kv_cache)) if padded else _t(case.kv_cache)
    return tsm._triton_impl(_t(case.q), kv, _t(case.indices), case.sm_scale,
                            kw["kv_format"], kw["d_v"], kw["block_table"], kw["topk_length"],
                            kw["attn_sink"], config=cfg, num_splits=splits)


def _ran(case, cfg, padded=False) -> str:
    """The kernel the binding runs for ``case`` given ``cfg`` (``tsm._triton_config``)."""
    dev = _common.device_info(torch.device("cuda"))
    kv = _padded(_t(case.kv_cache)) if padded else _t(case.kv_cache)
    return tsm._triton_config(dev, _t(case.q), kv, case.kv_format, case.indices.shape[2], cfg).kernel


def _check_one(name: str, case, ref, cfg, splits: int, kernel: str, padded=False) -> dict:
    """One launch of ``case`` with ``cfg`` against its reference ``ref`` (out, lse), printed;
    a Gluon config the binding would replace by a Triton tile fails the row (``ran``)."""
    t0 = time.time()
    try:
        ran = _ran(case, cfg, padded)
        out, lse = _run(case, cfg, splits, padded)
        res = compare.check_mla(out, lse, *ref, q_dtype=case.q_dtype)
        row = dict(case=name, kernel=kernel, ran=ran, passed=bool(res.passed) and ran == cfg.kernel,
                   detail=str(res)[:400])
    except Exception as e:  # noqa: BLE001 - reported per case
        row = dict(case=name, kernel=kernel, passed=False, error=f"{type(e).__name__}: {e}"[:800])
    row["wall_s"] = round(time.time() - t0, 2)
    print(("PASS " + name) if row["passed"]
          else f"FAIL {name} ran={row.get('ran')} {(row.get('error') or row.get('detail', ''))[:200]}",
          flush=True)
    return _emit("check", row)


def _specs(kernel: str) -> list[tuple]:
    """(fmt, d_qk, q dtype, H, K, B, N, logical + topk_length + sink, P, padded pages) of the
    random cases."""
    specs = []
    fmts = [(f, 512 if f == "fp8_model1" else 576) for f in KERNELS[kernel][1]]
    shapes = ((64, 100, 3, 2), (128, 640, 2, 1), (24, 64, 2, 2), (64, 2048, 1, 1))
    if kernel in FEW_HEADS:      # its head range: below, across and at its head blocks
        shapes = ((16, 100, 3, 2), (8, 640, 2, 1), (24, 64, 2, 2), (32, 2048, 1, 1),
                  (5, 300, 2, 1))
    if kernel in CLUSTERED:      # whole clusters: 128 heads, and 100 (the pair's second CTA
        shapes = ((128, 100, 3, 2), (128, 640, 2, 1), (100, 64, 2, 2), (128, 2048, 1, 1))
        # has 36 heads masked)
    for fmt, dqk in fmts:
        for qd in ("bfloat16", "float16"):
            for H, K, B, N in shapes:
                specs.append((fmt, dqk, qd, H, K, B, N, True, 64, False))
    if kernel in FEW_HEADS:            # plain slots, no topk_length, no sink
        for fmt, dqk in fmts:
            specs.append((fmt, dqk, "bfloat16", 16, 640, 2, 1, False, 64, False))
    if kernel.startswith("gluon_ws") or kernel in CLUSTERED:   # plain slots, no topk_length,
        for fmt, dqk in fmts:                                     # no sink (other constexprs)
            specs.append((fmt, dqk, "bfloat16", 128, 640, 2, 1, False, 64, False))
            specs.append((fmt, dqk, "bfloat16", 128 if kernel in CLUSTERED else 64, 1000, 3,
                          1, False, 64, False))
    if kernel.startswith("gluon_ws_latent"):  # pages read in place: padded, odd page size
        specs.append(("latent", 576, "bfloat16", 128, 640, 2, 1, True, 64, True))
        specs.append(("latent", 576, "bfloat16", 64, 333, 3, 2, True, 61, False))
        specs.append(("latent", 576, "float16", 64, 200, 2, 1, False, 1, True))
    return specs


def check(kernel: str) -> list[dict]:
    _use(kernel)
    rows = []
    cfgs = KERNEL_CONFIGS[kernel]
    for i, (fmt, dqk, qd, H, K, B, N, feats, P, padded) in enumerate(_specs(kernel)):
        case = cases.make_mla_case(100 + i, B=B, N=N, H=H, K=K, P=P, d_qk=dqk, kv_format=fmt,
                                   q_dtype=qd, kv_dtype=qd if fmt == "latent" else "float32",
                                   invalid="mix", logical=feats,
                                   topk_length=feats, attn_sink=feats)
        ref = case.reference()
        for cfg in cfgs:
            for splits in (1, 3):
                rows.append(_check_one(
                    f"{fmt} q={qd} H{H} K{K} B{B} N{N} P{P}{' padded' if padded else ''} "
                    f"{'bt+tkl+sink' if feats else 'slots'} splits={splits} {kernel} "
                    f"x{cfg.num_stages}", case, ref, cfg, splits, kernel, padded))
    fmt = KERNELS[kernel][1][0]
    for qd in (("bfloat16", "float16") if fmt == "latent" else ("bfloat16",)):
        for j, corner in enumerate(cases.mla_corner_cases(7, d_qk=576, H=16 if kernel in FEW_HEADS
                                                          else 128 if kernel in CLUSTERED
                                                          else 64, K=64, kv_format=fmt,
                                                          q_dtype=qd, kv_dtype=qd)):
            ref = corner.reference()
            for cfg in cfgs:
                rows.append(_check_one(f"corner {j} {getattr(corner, 'name', '')} q={qd} {kernel} "
                                       f"x{cfg.num_stages}", corner, ref, cfg, 2, kernel))
    return rows


SHAPES = [  # (preset, B, H, K, kv_format, d_qk, N)
    ("DSV32", 64, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 64, 64, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 16, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 1, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 128, 128, 2048, "fp8_ds_mla", 576, 1),
    ("DSV4_FLASH", 64, 64, 640, "fp8_model1", 512, 1),
    # a bf16 latent cache (issue 16: 631 us with the Triton 64 x 32 tile at B 64 H 128)
    ("DSV32", 64, 128, 2048, "latent", 576, 1),
    ("DSV32", 64, 64, 2048, "latent", 576, 1),
    ("DSV32", 16, 128, 2048, "latent", 576, 1),
    ("DSV32", 1, 128, 2048, "latent", 576, 1),
    ("DSV32", 128, 128, 2048, "latent", 576, 1),
    # few heads (TP 8 of 128 / 64 heads; the few-heads kernel's rows)
    ("DSV32", 64, 16, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 64, 32, 2048, "fp8_ds_mla", 576, 1),
    ("DSV32", 1, 16, 2048, "fp8_ds_mla", 576, 1),
    ("DSV4_FLASH", 64, 8, 640, "fp8_model1", 512, 1),
    ("DSV4_FLASH", 64, 16, 640, "fp8_model1", 512, 1),
]


def _slice_reference(q, kv, idx, fmt, sm_scale):
    """float64 reference of the first and the last request of a timing shape (``sel``, (out,
    lse)), from their selected rows only (a compact one-slot-a-page copy of them: the caches of
    the timing shapes are GiBs), or None for fp8_model1 (rows are not contiguous there)."""
    if fmt == "fp8_model1":
        return None
    from kernels import reference
    B, N, K = idx.shape
    sel = sorted({0, B - 1})
    rows = kv.reshape(-1, kv.shape[-1])[idx[sel].reshape(-1).long()]      # valid slots only here
    rows = rows.float() if fmt == "latent" else rows
    ref = reference.sparse_mla_decode(
        q[sel].float().cpu().numpy(), rows.cpu().numpy()[:, None, :],
        np.arange(len(sel) * N * K, dtype=np.int32).reshape(len(sel), N, K), sm_scale,
        kv_format=fmt)
    return sel, ref


def timing_splits(cfg, rows: int, H: int, K: int, dev) -> int:
    """The split count a timing row of ``cfg`` runs with: ``configs.sparse_mla_num_splits`` over
    ``rows`` (request, draft) rows of ``H`` heads at top-k ``K`` on ``dev`` (also
    ``bench.ncu_mla``'s)."""
    return configs.sparse_mla_num_splits(
        rows * triton.cdiv(H, cfg.block_h), K, cfg.block_k, dev.num_sms,
        ctas_per_sm=configs.sparse_mla_ctas_per_sm(cfg, dev.smem_per_block))


def _time_cold(q, kv, idx, B: int, K: int, fmt: str, dqk: int, cfg, splits: int,
               max_rotations: int = 64) -> tuple[float, int]:
    """Median us a call with the gathered rows L2-cold, as ``python -m bench`` times them: R index
    sets over the same cache (each request's rows redrawn from its own pages,
    ``bench.mla_sweep.draw_indices``), R calls in one CUDA graph, R large enough that the
    sets' gathered bytes exceed twice the L2 (``bench.inputs.L2_BYTES``; at most
    ``max_rotations``). The plain median (``do_bench_cudagraph`` of one call) re-gathers the same
    rows every replay, part of them from L2: on an H100 gluon_xs timed 131.9 us that way at B 64
    H 128 and 162.2 in the bench (2026-12-06). Returns (median us a call, R)."""
    from bench.inputs import L2_BYTES
    from bench.roofline import kv_row_bytes
    touched = B * K * kv_row_bytes(fmt, dqk)
    R = max(2, min(max_rotations, -(-2 * L2_BYTES // touched)))
    pages_per_req = kv.shape[0] // B                   # _inputs: 512 pages of 64 rows a request
    L = pages_per_req * (kv.shape[1] if kv.dim() >= 3 else 64)
    g = torch.Generator(device="cuda").manual_seed(1234)
    sets = [draw_indices(B, K, L, g) for _ in range(R)]

    def fn():
        for ix in sets:
            tsm._triton_impl(q, kv, ix, dqk ** -0.5, fmt, 512, None, None, None,
                             config=cfg, num_splits=splits)
    return triton.testing.do_bench_cudagraph(fn, rep=200) * 1e3 / R, R


def _stress(fn, out, lse, launches: int, every: int = 250) -> tuple[int, int, float]:
    """Launch ``fn`` (a kernel call returning ``(out, lse)``) ``launches`` times back to back,
    comparing every ``every``-th result bitwise with ``out`` / ``lse`` (the kernels have no
    atomics and a fixed reduction order, so a race shows as a differing result; a hang as the
    child's timeout). Returns (launches compared, mismatching, wall seconds)."""
    t0 = time.time()
    compared = bad = 0
    for i in range(1, launches + 1):
        o, l = fn()
        if i % every == 0 or i == launches:
            if o.is_cuda:
                torch.cuda.synchronize()
            compared += 1
            same = torch.equal(o.view(torch.int16), out.view(torch.int16)) and torch.equal(
                l.view(torch.int32), lse.view(torch.int32))
            bad += not same
    return compared, bad, time.time() - t0


def timing(kernels: list[str], with_heuristic: bool = True, formats=None,
           timed_kernels=None, stress: int = 0) -> tuple[list, list]:
    """CUDA-graph medians of the heuristic's Triton config (timed when ``with_heuristic``, else
    only run as the reference of the max-abs-diff) and of every config of ``kernels``, at the
    shapes of ``formats`` (default: the kernels' formats). Every output timed is first checked
    against the float64 reference on its first and last request (``_slice_reference``; a
    ``check`` row each, fp8_model1 excepted). ``stress`` > 0: each Gluon config is then launched
    that many times more and its results compared bitwise with the first (:func:`_stress`; a
    ``check`` row each). Returns (timing rows, check rows)."""
    dev = _common.device_info(torch.device("cuda"))
    formats = set(formats or (f for k in kernels for f in KERNELS[k][1]))
    timed_kernels = list(timed_kernels or kernels)   # shapes: those of these kernels' heads
    rows, checks = [], []
    for preset, B, H, K, fmt, dqk, N in SHAPES:
        if fmt not in formats or not any(_heads_ok(k, H) for k in timed_kernels):
            continue
        q, kv, idx = _inputs(B, H, K, dqk, fmt)
        heur = configs.sparse_mla_heuristic(H, dev.smem_per_block, rows=B * N, topk=K)  # Triton
        ref = None
        ref64 = _slice_reference(q, kv, idx, fmt, dqk ** -0.5)
        todo = [(heur, "triton", with_heuristic)] + [
            (c, k, True) for k in kernels if fmt in KERNELS[k][1] and _heads_ok(k, H)
            for c in KERNEL_CONFIGS[k]]
        for cfg, kernel, timed in todo:
            if kernel != "triton":
                _use(kernel)
            splits = timing_splits(cfg, B * N, H, K, dev)
            fn = lambda: tsm._triton_impl(q, kv, idx, dqk ** -0.5, fmt, 512, None, None, None,
                                          config=cfg, num_splits=splits)
            t0 = time.time()
            us = diff = err = us_cold = rots = None
            ran = tsm._triton_config(dev, q, kv, fmt, K, cfg).kernel
            try:
                out, lse = fn()
                torch.cuda.synchronize()
                if ref64 is not None and timed:
                    sel, (ro, rl) = ref64
                    res = compare.check_mla(out[sel], lse[sel], ro, rl, q_dtype="bfloat16")
                    checks.append(_emit("check", dict(case=f"timing {preset} B{B} H{H} K{K} {fmt} reference "
                                             f"slice {cfg.to_dict()}", kernel=kernel, ran=ran,
                                        passed=bool(res.passed) and ran == cfg.kernel,
                                        detail=str(res)[:400])))
                    print(("PASS" if res.passed else "FAIL") + f" reference slice {kernel} "
                          f"B{B} H{H} {fmt}: {str(res)[:200]}", flush=True)
                if ref is None:
                    ref = (out.float(), lse)
                else:
                    diff = float((out.float() - ref[0]).abs().max())
                if timed:
                    us = triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3
                    # the bench's condition: rows L2-cold (rotated index sets, one graph)
                    us_cold, rots = _time_cold(q, kv, idx, B, K, fmt, dqk, cfg, splits)
                if stress and kernel != "triton":
                    n, bad, wall = _stress(fn, out, lse, stress)
                    checks.append(_emit("check", dict(
                        case=f"stress {preset} B{B} H{H} K{K} {fmt} {cfg.to_dict()}: {stress} "
                             f"launches, {n} results compared bitwise with the first",
                        kernel=kernel, ran=ran, passed=bad == 0,
                        detail=f"{bad} of {n} differ; {wall:.1f} s")))
                    print(("PASS" if bad == 0 else "FAIL") + f" stress {kernel} B{B} H{H} {fmt}: "
                          f"{bad} of {n} results differ ({stress} launches, {wall:.1f} s)",
                          flush=True)
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {e}"[:600]
            if not timed and err is None:
                continue
            row = dict(preset=preset, B=B, H=H, K=K, kv_format=fmt, kernel=kernel, ran=ran,
                       config=cfg.to_dict(), splits=splits, median_us=us, median_us_cold=us_cold,
                       cold_rotations=rots, max_abs_diff_vs_heuristic=diff, error=err, wall_s=round(time.time() - t0, 1))
            rows.append(_emit("timing", row))
            print(json.dumps(row), flush=True)
        del q, kv, idx
        torch.cuda.empty_cache()
    return rows, checks


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
    if args.stress:
        cmd += ["--stress", str(args.stress)]
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
                    help=f"comma-separated kernels to check and time ({', '.join(KERNELS)})")
    ap.add_argument("--ws-timeout", type=float, default=900.0,
                    help="seconds each isolated child (ISOLATED: gluon_ws*, gluon_sh, "
                         "gluon_shws, gluon_xo, gluon_xs) may run")
    ap.add_argument("--stress", type=int, default=0,
                    help="after timing, launch each Gluon config this many times more and "
                         "compare its results bitwise with the first (a race or a hang)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    _ROWS_FILE = args.rows
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        ap.error(f"argument --kernels: expected names from {list(KERNELS)}, got {unknown}")
    isolated = [] if args.child else [k for k in kernels if k in ISOLATED]
    local = [k for k in kernels if k not in isolated]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "kernels": kernels, "command": " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    res["check"], res["timing"], res["isolated"] = [], [], []

    def dump():                   # after every stage: a cut-off run keeps what it measured
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    if not args.no_check:
        for k in local:
            res["check"] += check(k)
            dump()
    if not args.no_time and (local or not args.child):
        # the parent times the Triton tiles of every requested kernel's formats (and its local
        # kernels); a child times only its own kernel
        t, c = timing(local, with_heuristic=not args.child,
                      formats=[f for k in kernels for f in KERNELS[k][1]], timed_kernels=kernels,
                      stress=args.stress)
        res["timing"] += t
        res["check"] += c
        dump()
    for k in isolated:            # after the known kernels, so a hang costs only its own rows
        c, t, info = _isolated(k, args)
        res["check"] += c
        res["timing"] += t
        res["isolated"].append(info)
        dump()
    for k in ["triton"] + kernels:
        rows = [r for r in res["check"] if r.get("kernel") == k]
        if rows or k != "triton":
            print(f"check {k}: {sum(r['passed'] for r in rows)}/{len(rows)} passed", flush=True)
    dump()


if __name__ == "__main__":
    main()
