"""Tensor-parallel DSA decode step on 2 GPUs: correctness, then replicated vs sequence-sharded indexer.

Run (on the 2 x H200 machine; total under 4 minutes)::

    python bench/tp_bench.py --out bench/results/tp_h200x2.json
    python bench/tp_bench.py --out /tmp/tp_dry.json --dry-run        # CPU: plumbing only

The driver (no GPU work itself) runs two children one after the other, each on ``--tp`` GPUs,
and merges their results into one JSON (docs/SPEC.md "Result files", op
``dsa_decode_step`` / ``indexer_topk``, with ``tp`` and ``indexer_mode`` fields):

* torch: ``python -m torch.distributed.run --standalone --nproc_per_node 2 bench/tp_bench.py
  --torch-worker`` (torchrun; NCCL, one process per GPU; gloo + interpreter with ``--dry-run``);
* jax: ``python bench/tp_bench.py --jax-worker`` (``jax.shard_map`` over a 2-device ``tp`` mesh).

``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` are set for every child (they
are mandatory on the lent 2 x H200 machine: no NVLink multicast).

Each child first checks correctness at TP 2 on a DeepSeek-V3.2-shaped slice built with the NumPy
quantizers (``kernels.cases``; 128 model heads = 64 per rank, K 2048, fp8_ds_mla, bf16 q):
both indexer modes give identical indices and bitwise identical outputs, the indices are the
exact top-k of the float64 reference logits (``kernels.compare.check_topk``) and out / lse match
the float64 reference fed those indices (``check_mla``). Then, for B 64 / 16 and L 64K / 128K
(all requests at L, block table sized to L; device-generated caches), it checks that both modes
agree bitwise on the full shape and times, per mode:

* ``indexer_topk`` rows: the indexer stage alone (replicated: ``indexer_topk(sorted=True)`` on
  every rank; sequence: ``sequence_sharded_topk``, i.e. shard logits + local top-K + all-gather
  + merge);
* ``dsa_decode_step`` rows: the whole TP step (indexer stage + sparse MLA on the rank's 64 heads).

Timing: torch, CUDA events around each call with both ranks aligned by a barrier first (the
all-gather inside would otherwise measure the other rank's lag), rank 0's median / p20 / p80
(``max_rank_median_us`` too); jax, wall clock of one jitted call to ``block_until_ready`` (so
it includes JAX's dispatch, ~10-50 us). One input set per shape: the per-rank indexer cache read
(B x L / TP x 132 bytes >= 69 MB) exceeds the 60 MB L2 except at B 16 where it is close.
``bytes`` / ``flops`` / ``floor_us`` are per rank (what each GPU must move: the full indexer
cache in replicated mode, 1/TP of it in sequence mode) at nominal H200 peaks (4.3 TB/s,
790 TFLOP/s bf16). ``summary`` gives sequence / replicated ratios; the target is <= 0.6 for the
indexer stage at L >= 64K, B = 64.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MANDATORY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
os.environ.update(MANDATORY_ENV)

PRESET = "DSV32"
GPU_SHAPES = [(64, 65536), (64, 131072), (16, 65536), (16, 131072)]     # priority order
DRY_SHAPES = [(2, 512)]
TARGET_RATIO = 0.6


# ============================================================================ shared helpers

def _dims(dry: bool) -> dict:
    """Model dimensions of the run (DSV32; heads / top-k cut for the CPU dry run)."""
    from kernels.presets import PRESETS
    p = PRESETS[PRESET]
    d = dict(H_total=p.num_heads, d_qk=p.d_qk, d_v=p.d_v, K=p.topk, H_I=p.index_heads,
             D_I=p.index_head_dim, P=p.page_size, kv_format=p.kv_format, sm_scale=p.sm_scale, N=1)
    if dry:
        d.update(H_total=16, K=64, H_I=16)
    return d


def _slice_case(dims: dict, q_dtype: str, seed: int = 7):
    """Correctness slice (NumPy, exact quantizers): 2 requests of 3000 / 5000 tokens (1900 / 300
    in a dry run), the stale-page / scattered layout of ``kernels.cases``."""
    import numpy as np

    from kernels import cases, formats
    rng = np.random.default_rng(seed)
    dry = dims["K"] < 2048
    lens = [300, 190] if dry else [5000, 3000]
    ic = cases.make_indexer_case(rng, B=2, N=dims["N"], H_I=dims["H_I"], D_I=dims["D_I"],
                                 P=dims["P"], lens=lens, topk=dims["K"], structured=True)
    latent = rng.standard_normal((ic.k_cache.shape[0], dims["P"], dims["d_qk"])).astype(np.float32)
    kv = formats.quantize_fp8_ds_mla(latent)
    q = cases._cast((0.5 * rng.standard_normal((2, dims["N"], dims["H_total"], dims["d_qk"])))
                    .astype(np.float32), q_dtype)
    return ic, kv, q


def _check_slice(ic, kv, q, dims, out, lse, idx_by_mode, out_by_mode, q_dtype) -> list[dict]:
    """Rows of the correctness checks (NumPy inputs; full-head out / lse of the replicated mode)."""
    import numpy as np

    from kernels import compare, reference
    modes = list(idx_by_mode)
    rows = []
    same_idx = all(np.array_equal(idx_by_mode[m], idx_by_mode[modes[0]]) for m in modes)
    same_out = all(np.array_equal(out_by_mode[m], out_by_mode[modes[0]]) for m in modes)
    rows.append(dict(case="tp2_modes_equal", passed=bool(same_idx and same_out),
                     message=f"indices equal: {same_idx}, outputs bitwise equal: {same_out}"))
    idx = idx_by_mode[modes[0]]
    logits = reference.indexer_logits(ic.q, ic.weights, ic.k_cache, ic.block_table, ic.context_lens)
    r = compare.check_topk(idx, logits, dims["K"], sorted=True)
    rows.append(dict(case="tp2_topk_vs_reference", passed=r.passed, worst_error=r.worst_error,
                     tolerance=r.tolerance, message=r.message))
    ref_out, ref_lse = reference.sparse_mla_decode(q, kv, idx, dims["sm_scale"], kv_format="fp8_ds_mla",
                                                   d_v=dims["d_v"], block_table=ic.block_table)
    r = compare.check_mla(out, lse, ref_out, ref_lse, q_dtype=q_dtype)
    rows.append(dict(case="tp2_mla_vs_reference", passed=r.passed, worst_error=r.worst_error,
                     tolerance=r.tolerance, message=r.message))
    return rows


def _cost(dims: dict, B: int, L: int, tp: int, mode: str, op: str) -> tuple[int, int]:
    """Per-rank (bytes, flops) of the indexer stage, plus sparse MLA on H / tp heads for the step."""
    from bench import roofline
    share = L if mode == "replicated" else -(-L // tp)
    nbytes, flops = roofline.indexer_cost(lens=[share] * B, N=dims["N"], H_I=dims["H_I"], D_I=dims["D_I"])
    if op == "dsa_decode_step":
        b2, f2 = roofline.mla_cost(B=B, N=dims["N"], H=dims["H_total"] // tp, n_valid=B * dims["N"] * dims["K"],
                                   d_qk=dims["d_qk"], d_v=dims["d_v"], kv_format=dims["kv_format"],
                                   q_itemsize=2)
        nbytes, flops = nbytes + b2, flops + f2
    return nbytes, flops


def _row(dims, *, op, backend, B, L, tp, mode, timing, timer, extra=None) -> dict:
    from bench import roofline
    machine = roofline.Machine(roofline.H200_COPY_BPS, roofline.H200_BF16_FLOPS,
                               "nominal H200 peaks", measured=False)
    nbytes, flops = _cost(dims, B, L, tp, mode, op)
    med, p20, p80 = timing
    row = dict(op=op, backend=backend, path="auto", preset=PRESET, B=B, N=dims["N"],
               H=dims["H_total"] // tp, L=L, K=dims["K"], P=dims["P"], kv_format=dims["kv_format"],
               table_len=-(-L // dims["P"]) * dims["P"], tp=tp, indexer_mode=mode,
               median_us=med, p20_us=p20, p80_us=p80, bytes=nbytes, flops=flops, timer=timer,
               cost_scope="per_rank")
    row.update(roofline.row_metrics(machine, nbytes, flops, med))
    row.update(extra or {})
    return row


def _stats(us):
    import numpy as np
    a = np.asarray(us, np.float64)
    return float(np.median(a)), float(np.percentile(a, 20)), float(np.percentile(a, 80))


# ============================================================================ torch worker

def _torch_inputs(torch, dims, B, L, device, seed=0):
    """Device-generated inputs of one shape (same seed -> same tensors on every rank)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    P, D, HI = dims["P"], dims["D_I"], dims["H_I"]
    ppr = -(-L // P)
    pages = B * ppr

    def e4m3(shape):
        x = torch.randn(shape, generator=gen, device=device) * 4.0
        return x.clamp_(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)

    kc = torch.empty((pages, P * (D + 4)), dtype=torch.uint8, device=device)
    kv = torch.empty((pages, P, 656), dtype=torch.uint8, device=device)
    step = max(1, (1 << 26) // (P * 656))
    for a in range(0, pages, step):
        b = min(pages, a + step)
        n = b - a
        kc[a:b, :P * D] = e4m3((n, P * D))
        kc[a:b, P * D:] = (torch.rand((n, P), generator=gen, device=device) * 0.02 + 1e-3).view(torch.uint8)
        kv[a:b, :, :512] = e4m3((n, P, 512))
        kv[a:b, :, 512:528] = torch.exp2(torch.randint(-8, -4, (n, P, 4), generator=gen, device=device)
                                         .float()).view(torch.uint8)
        kv[a:b, :, 528:] = torch.randn((n, P, 64), generator=gen, device=device).to(torch.bfloat16).view(torch.uint8)
    bt = torch.randperm(pages, generator=gen, device=device).to(torch.int32).view(B, ppr).contiguous()
    cl = torch.full((B,), L, dtype=torch.int32, device=device)
    iq = (torch.randn((B, dims["N"], HI, D), generator=gen, device=device) * 2.0).to(torch.float8_e4m3fn)
    iw = (torch.randn((B, dims["N"], HI), generator=gen, device=device) * HI ** -0.5 * D ** -0.5).float()
    q_dtype = torch.bfloat16 if device != "cpu" else torch.float16
    q = (torch.randn((B, dims["N"], dims["H_total"], dims["d_qk"]), generator=gen, device=device) * 0.5).to(q_dtype)
    return dict(q=q, kv=kv, iq=iq, iw=iw, kc=kc, bt=bt, cl=cl)


def torch_worker(args) -> None:
    import torch
    import torch.distributed as dist

    dry = args.dry_run
    cuda = not dry and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
        dist.init_process_group("nccl", device_id=torch.device(device))
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = "cpu"
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch_impl import tp
    from torch_impl._common import as_tensor
    from torch_impl.indexer import indexer_topk
    dims = _dims(dry)
    t_start = time.time()
    doc = dict(rows=[], checks=[], skipped=[])
    if cuda:
        props = torch.cuda.get_device_properties(device)
        doc.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}")
    else:
        doc.update(gpu="CPU interpreter", compute_capability="0.0")
    import triton
    doc["versions"] = dict(torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                           nccl=".".join(map(str, torch.cuda.nccl.version())) if cuda else None)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    # ---- correctness slice
    q_dtype = "bfloat16" if cuda else "float16"
    ic, kv_np, q_np = _slice_case(dims, q_dtype)
    t = [as_tensor(a, device) for a in (q_np, kv_np, ic.q, ic.weights, ic.k_cache, ic.block_table,
                                        ic.context_lens)]
    q_local = tp.shard_heads(t[0], rank, world)
    idx_by_mode, out_by_mode, full = {}, {}, None
    for mode in tp.INDEXER_MODES:
        out, lse, idx = tp.dsa_decode_step_tp(q_local, *t[1:], dims["sm_scale"], dims["K"],
                                              kv_format="fp8_ds_mla", d_v=dims["d_v"], indexer_mode=mode)
        out_full, lse_full = tp.gather_heads(out), tp.gather_heads(lse)
        idx_by_mode[mode] = idx.cpu().numpy()
        out_by_mode[mode] = out_full.float().cpu().numpy()
        if full is None:
            full = (out_full.float().cpu().numpy(), lse_full.cpu().numpy())
    if rank == 0:
        for r in _check_slice(ic, kv_np, q_np, dims, full[0], full[1], idx_by_mode, out_by_mode, q_dtype):
            doc["checks"].append(dict(r, backend="torch", tp=world, op="dsa_decode_step"))
        Path(args.part_out).write_text(json.dumps(doc, indent=1))
    del t, q_local

    # ---- timing
    shapes = DRY_SHAPES if dry else GPU_SHAPES
    K = dims["K"]
    for B, L in shapes:
        if time.time() - t_start > args.budget_s:
            doc["skipped"].append(dict(backend="torch", B=B, L=L, reason=f"budget {args.budget_s}s spent"))
            continue
        x = _torch_inputs(torch, dims, B, L, device)
        ql = tp.shard_heads(x["q"], rank, world)
        common = (x["iq"], x["iw"], x["kc"], x["bt"], x["cl"])
        fns = {
            ("indexer_topk", "replicated"): lambda: indexer_topk(*common, K, sorted=True),
            ("indexer_topk", "sequence"): lambda: tp.sequence_sharded_topk(*common, K),
        }
        for mode in tp.INDEXER_MODES:
            fns[("dsa_decode_step", mode)] = (lambda m=mode: tp.dsa_decode_step_tp(
                ql, x["kv"], *common, dims["sm_scale"], K, kv_format="fp8_ds_mla", d_v=dims["d_v"],
                indexer_mode=m))
        # both modes agree bitwise on the full shape
        a, b = fns[("dsa_decode_step", "replicated")](), fns[("dsa_decode_step", "sequence")]()
        ok = torch.tensor([int(torch.equal(a[2], b[2]) and torch.equal(a[0], b[0])
                               and torch.equal(a[1], b[1]))], device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        n_valid = int((a[2] >= 0).sum())
        if rank == 0:
            doc["checks"].append(dict(case=f"tp{world}_modes_equal_B{B}_L{L}", backend="torch", tp=world,
                                      op="dsa_decode_step", passed=bool(ok.item()),
                                      message=(f"indices and out/lse {'bitwise equal' if ok.item() else 'NOT bitwise equal'} "
                                               f"across modes; {n_valid} valid indices of {a[2].numel()}")))
        del a, b
        reps = 2 if dry else args.reps
        for (op, mode), fn in fns.items():
            for _ in range(1 if dry else 5):
                fn()
            sync()
            us = []
            for _ in range(reps):
                dist.barrier()
                sync()
                if cuda:
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    e.synchronize()
                    us.append(s.elapsed_time(e) * 1e3)
                else:
                    t0 = time.perf_counter()
                    fn()
                    us.append((time.perf_counter() - t0) * 1e6)
            timing = _stats(us)
            med = torch.tensor([timing[0]], dtype=torch.float64, device=device)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            if rank == 0:
                doc["rows"].append(_row(dims, op=op, backend="torch", B=B, L=L, tp=world, mode=mode,
                                        timing=timing, timer="cuda_events_per_call_after_barrier" if cuda
                                        else "cpu_wall_interpreter (meaningless)",
                                        extra=dict(max_rank_median_us=float(med.item()))))
        del x, ql, fns, common
        if cuda:
            torch.cuda.empty_cache()
        if rank == 0:                       # after every shape: a timeout keeps what was measured
            Path(args.part_out).write_text(json.dumps(doc, indent=1))
    if rank == 0:
        Path(args.part_out).write_text(json.dumps(doc, indent=1))
    dist.barrier()
    dist.destroy_process_group()


# ============================================================================ jax worker

def _jax_inputs(jax, jnp, mesh, dims, B, L, seed=0):
    """Device-generated inputs: caches / indexer inputs replicated, q sharded over heads."""
    from jax.sharding import NamedSharding, PartitionSpec as PS
    P, D, HI = dims["P"], dims["D_I"], dims["H_I"]
    ppr = -(-L // P)
    pages = B * ppr
    q_dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float16

    def e4m3_bytes(key, shape):
        b = jax.random.bits(key, shape, jnp.uint8)
        return jnp.where((b & 0x7F) == 0x7F, b ^ 1, b)                  # no NaN pattern

    def gen(key):
        k = jax.random.split(key, 10)
        scales = (jax.random.uniform(k[1], (pages, P), jnp.float32) * 0.02 + 1e-3)
        kc = jnp.concatenate([e4m3_bytes(k[0], (pages, P * D)),
                              jax.lax.bitcast_convert_type(scales, jnp.uint8).reshape(pages, P * 4)], 1)
        kvs = jnp.exp2(jax.random.randint(k[3], (pages, P, 4), -8, -4).astype(jnp.float32))
        rope = jax.random.normal(k[4], (pages, P, 64), jnp.float32).astype(jnp.bfloat16)
        kv = jnp.concatenate([e4m3_bytes(k[2], (pages, P, 512)),
                              jax.lax.bitcast_convert_type(kvs, jnp.uint8).reshape(pages, P, 16),
                              jax.lax.bitcast_convert_type(rope, jnp.uint8).reshape(pages, P, 128)], 2)
        bt = jax.random.permutation(k[5], pages).astype(jnp.int32).reshape(B, ppr)
        cl = jnp.full((B,), L, jnp.int32)
        iq = (jax.random.normal(k[6], (B, dims["N"], HI, D)) * 2.0).astype(jnp.float8_e4m3fn)
        iw = (jax.random.normal(k[7], (B, dims["N"], HI)) * HI ** -0.5 * D ** -0.5).astype(jnp.float32)
        q = (jax.random.normal(k[8], (B, dims["N"], dims["H_total"], dims["d_qk"])) * 0.5).astype(q_dtype)
        return dict(q=q, kv=kv, iq=iq, iw=iw, kc=kc, bt=bt, cl=cl)

    rep = NamedSharding(mesh, PS())
    shard = {k: rep for k in ("kv", "iq", "iw", "kc", "bt", "cl")}
    shard["q"] = NamedSharding(mesh, PS(None, None, "tp", None))
    return jax.block_until_ready(jax.jit(gen, out_shardings=shard)(jax.random.PRNGKey(seed)))


def jax_worker(args) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as PS

    from jax_impl import tp
    from jax_impl.indexer import indexer_topk
    dry = args.dry_run
    dims = _dims(dry)
    t_start = time.time()
    dev = jax.devices()[0]
    import jaxlib
    doc = dict(rows=[], checks=[], skipped=[], versions=dict(jax=jax.__version__, jaxlib=jaxlib.__version__))
    if dev.platform == "gpu":
        doc.update(gpu=dev.device_kind, compute_capability=str(getattr(dev, "compute_capability", "")))
    else:
        doc.update(gpu="CPU interpreter", compute_capability="0.0")
    world = args.tp
    mesh = tp.make_tp_mesh(world)

    # ---- correctness slice
    q_dtype = "bfloat16" if dev.platform == "gpu" else "float16"
    ic, kv_np, q_np = _slice_case(dims, q_dtype)
    arrs = [jnp.asarray(a) for a in (q_np, kv_np, ic.q, ic.weights, ic.k_cache, ic.block_table, ic.context_lens)]
    idx_by_mode, out_by_mode, full = {}, {}, None
    for mode in tp.INDEXER_MODES:
        out, lse, idx = tp.dsa_decode_step_tp(mesh, *arrs, dims["sm_scale"], dims["K"],
                                              kv_format="fp8_ds_mla", d_v=dims["d_v"], indexer_mode=mode)
        idx_by_mode[mode] = np.asarray(idx)
        out_by_mode[mode] = np.asarray(out.astype(jnp.float32))
        if full is None:
            full = (out_by_mode[mode], np.asarray(lse))
    for r in _check_slice(ic, kv_np, q_np, dims, full[0], full[1], idx_by_mode, out_by_mode, q_dtype):
        doc["checks"].append(dict(r, backend="jax", tp=world, op="dsa_decode_step"))
    Path(args.part_out).write_text(json.dumps(doc, indent=1))

    # ---- timing
    K = dims["K"]
    ind_rep = jax.jit(jax.shard_map(
        lambda iq, iw, kc, bt, cl: indexer_topk(iq, iw, kc, bt, cl, K, sorted=True),
        mesh=mesh, in_specs=(PS(),) * 5, out_specs=PS(), check_vma=False))
    ind_seq = jax.jit(jax.shard_map(
        lambda iq, iw, kc, bt, cl: tp.sequence_sharded_topk(iq, iw, kc, bt, cl, K, axis_name="tp"),
        mesh=mesh, in_specs=(PS(),) * 5, out_specs=PS(), check_vma=False))
    shapes = DRY_SHAPES if dry else GPU_SHAPES
    for B, L in shapes:
        if time.time() - t_start > args.budget_s:
            doc["skipped"].append(dict(backend="jax", B=B, L=L, reason=f"budget {args.budget_s}s spent"))
            continue
        x = _jax_inputs(jax, jnp, mesh, dims, B, L)
        common = (x["iq"], x["iw"], x["kc"], x["bt"], x["cl"])
        fns = {("indexer_topk", "replicated"): lambda: ind_rep(*common),
               ("indexer_topk", "sequence"): lambda: ind_seq(*common)}
        for mode in tp.INDEXER_MODES:
            fns[("dsa_decode_step", mode)] = (lambda m=mode: tp.dsa_decode_step_tp(
                mesh, x["q"], x["kv"], *common, dims["sm_scale"], K, kv_format="fp8_ds_mla",
                d_v=dims["d_v"], indexer_mode=m))
        a = jax.block_until_ready(fns[("dsa_decode_step", "replicated")]())
        b = jax.block_until_ready(fns[("dsa_decode_step", "sequence")]())
        ok = all(bool(jnp.array_equal(u, v)) for u, v in zip(a, b))
        doc["checks"].append(dict(case=f"tp{world}_modes_equal_B{B}_L{L}", backend="jax", tp=world,
                                  op="dsa_decode_step", passed=ok,
                                  message=(f"indices {'equal' if bool(jnp.array_equal(a[2], b[2])) else 'DIFFER'}, "
                                           f"out/lse {'bitwise equal' if ok else 'NOT bitwise equal'} across modes; "
                                           f"{int((a[2] >= 0).sum())} valid indices of {a[2].size}")))
        del a, b
        reps = 2 if dry else args.reps
        for (op, mode), fn in fns.items():
            for _ in range(1 if dry else 3):
                jax.block_until_ready(fn())
            us = []
            for _ in range(reps):
                t0 = time.perf_counter()
                jax.block_until_ready(fn())
                us.append((time.perf_counter() - t0) * 1e6)
            doc["rows"].append(_row(dims, op=op, backend="jax", B=B, L=L, tp=world, mode=mode,
                                    timing=_stats(us), timer="wall_clock_to_block_until_ready"
                                    if not dry else "cpu_wall_interpreter (meaningless)"))
        del x, fns, common
        Path(args.part_out).write_text(json.dumps(doc, indent=1))
    Path(args.part_out).write_text(json.dumps(doc, indent=1))


# ============================================================================ driver

def _summary(rows: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(r["backend"], r["op"], r["B"], r["L"]) for r in rows})
    for backend, op, B, L in keys:
        by = {r["indexer_mode"]: r for r in rows
              if (r["backend"], r["op"], r["B"], r["L"]) == (backend, op, B, L)}
        if "replicated" not in by or "sequence" not in by:
            continue
        ratio = by["sequence"]["median_us"] / by["replicated"]["median_us"]
        s = dict(backend=backend, op=op, B=B, L=L, tp=by["sequence"]["tp"],
                 replicated_us=by["replicated"]["median_us"], sequence_us=by["sequence"]["median_us"],
                 sequence_over_replicated=ratio)
        if op == "indexer_topk" and B == 64 and L >= 65536:
            s["target"] = f"<= {TARGET_RATIO}"
            s["target_met"] = ratio <= TARGET_RATIO
        out.append(s)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="result JSON path (driver)")
    ap.add_argument("--backends", default="torch,jax", help="comma list of torch, jax")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20, help="timed calls per measurement")
    ap.add_argument("--budget-s", type=float, default=80.0,
                    help="per-backend seconds after which remaining shapes are skipped")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--jax-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--part-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torch_worker:
        torch_worker(args)
        return 0
    if args.jax_worker:
        jax_worker(args)
        return 0
    if args.out is None:
        ap.error("--out is required")

    command = " ".join([Path(sys.executable).name, "bench/tp_bench.py"] + list(sys.argv[1:] if argv is None else argv))
    env = dict(os.environ, **MANDATORY_ENV)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.dry_run:
        env.update(TRITON_INTERPRET="1", JAX_PLATFORMS="cpu",
                   XLA_FLAGS=env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.tp}")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    common = ["--tp", str(args.tp), "--reps", str(args.reps), "--budget-s", str(args.budget_s)]
    common += ["--dry-run"] if args.dry_run else []
    merged = dict(rows=[], checks=[], skipped=[], errors=[])
    meta = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        part = args.out.with_suffix(f".{backend}.part.json")
        part.unlink(missing_ok=True)
        if backend == "torch":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={args.tp}", str(Path(__file__).resolve()), "--torch-worker"]
        elif backend == "jax":
            cmd = [sys.executable, str(Path(__file__).resolve()), "--jax-worker"]
        else:
            merged["errors"].append(dict(backend=backend, error="unknown backend"))
            continue
        cmd += common + ["--part-out", str(part)]
        t0 = time.time()
        print(f"[tp_bench] {backend}: {' '.join(cmd)}", flush=True)
        # own process group: on timeout the whole group (torchrun and its ranks) is killed
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.budget_s + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
        print(f"[tp_bench] {backend}: rc={rc} in {time.time() - t0:.0f}s", flush=True)
        if part.exists():
            doc = json.loads(part.read_text())
            part.unlink()
            for k in ("rows", "checks", "skipped"):
                merged[k] += doc.get(k, [])
            meta.setdefault("gpu", doc.get("gpu"))
            meta.setdefault("compute_capability", doc.get("compute_capability"))
            meta.setdefault("versions", {}).update({k: v for k, v in doc.get("versions", {}).items() if v})
        if rc != 0:
            merged["errors"].append(dict(backend=backend, error=f"exit status {rc}"))
    doc = dict(meta, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command=command, env=MANDATORY_ENV, **merged, summary=_summary(merged["rows"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in merged["checks"]:
        print(f"[check] {r['backend']:5s} {r['case']:32s} {'ok' if r['passed'] else 'FAIL'} {r.get('message', '')}")
    for s in doc["summary"]:
        print(f"[ratio] {s['backend']:5s} {s['op']:16s} B={s['B']:3d} L={s['L']:6d} rep {s['replicated_us']:9.1f} us"
              f"  seq {s['sequence_us']:9.1f} us  seq/rep {s['sequence_over_replicated']:.3f}"
              + (f"  target {s['target']}: {'met' if s['target_met'] else 'NOT met'}" if "target" in s else ""))
    print(f"[tp_bench] wrote {args.out}")
    failed = [r for r in merged["checks"] if not r["passed"]]
    return 1 if failed or merged["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
