"""Times every projection GEMM of the decode layer (``kernels.layer_config.projection_shapes``:
both presets, B = 1 and 64 tokens, bf16 activations) with torch's GEMMs as the layer calls them
and with the Triton few-token GEMM (``torch_impl.linear``, ``kernels/linear/``) at every config
of its search space and several split counts; writes JSON.

    python -m bench.linear_sweep --out linear_sweep.json [--preset DSV32] [--batch 1 64]
                                 [--gemm x_proj wo_a] [--heuristic-only] [--splits-scale 0.5 1 2]
    python -m bench.linear_sweep --dry-run --out /tmp/x.json   # CPU interpreter, tiny shapes

Every candidate's output is first checked against the float64 product (``kernels.linear``'s
bound: ``2 K u32 sum|x w|`` plus the output rounding; ``check``) and is timed only when it
passes. Timer: ``bench.timing.time_torch_cuda``, one CUDA graph of R calls, each on its own copy
of the weights (R copies > 2 x the L2 of 60 MB, so no call finds its weights in L2), replayed;
median / p20 / p80 us per call. Rows report the weight bytes, GB/s over them and the fraction of
the run's copy bandwidth (``bench.roofline.measure_torch_cuda``: a 2 GiB device copy, read +
written); ``summary`` lists per GEMM the best torch and Triton rows and the heuristic's, and per
(preset, B) the projections phase as the sum of each GEMM's torch, heuristic and best time.

torch candidates (what ``torch_impl.layer`` runs with ``linear="torch"``): ``x @ w.T`` (mm) and
``F.linear`` for plain projections, ``bmm`` into a contiguous result for the per-group ones
(the compiled layer then copies it into the strided buffer; the copy is not timed here),
``addmm(beta=0, alpha)`` on the widened x for the float32 ``weights_proj``. At M = 1 also the
one-token kernel (``kernels.linear.triton._gemv_kernel``, plain loads and fp32 FMAs, no split) at
every config of ``kernels.linear.configs.GEMV_SPACE`` for the weight's layout (rows
``impl="triton_gemv"``; the summary's ``triton_best`` includes them).

``--split-weights`` (M > 1, 16-bit activations): the float32 ``weights_proj`` as three 16-bit
weights, ``alpha w = p0 + p1 2^-S + p2 2^-2S`` (``torch_impl.layer.split_weight``, the layer's
split: each part the activation dtype's rounding of what is left, scaled by a power of two),
whose products with the 16-bit ``x`` are exact and are summed in float32 by a tensor-core GEMM writing float32 (``torch.mm(..., out_dtype=float32)``
or the Triton GEMM): ``out = sum_j (x @ w_j^T)``. Two forms, rows marked ``alternative`` (left out
of the phase sums): ``gemm="indexer.weights_proj"`` with ``impl="torch.mm_x3"`` /
``"triton_x3"``, the three weights as one ``[3 H_I, K]`` GEMM alone; and ``gemm="x_proj+
weights_proj_x3"`` (``impl="torch.mm_f32out"`` / ``"triton_f32out"``), the three appended to
``x_proj``'s rows (the same x), one GEMM writing float32 for both. Timed: the GEMM alone; the
sum of the three ``[M, H_I]`` slices would be read by the consumer (``prep_q``), the check
sums them. ``weight_bytes``: the bytes the GEMM reads (the split weights are 1.5x the float32's).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from kernels import layer_config as lc
from kernels.linear import configs as lcfg
from kernels.linear import triton as ktriton
from torch_impl import _common
from torch_impl import linear as tlinear

L2_BYTES = 60 << 20          # H200; rotated weight sets exceed twice this
ROTATE_BYTES = 2 * L2_BYTES
_UNIT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}


def _shapes(preset: str, dry: bool):
    cfg = lc.LAYER_CONFIGS[preset]
    if dry:                                   # CPU interpreter: the scaled-down layer's GEMMs
        cfg = cfg.scaled_down()
    return lc.projection_shapes(cfg)


def _operands(p: lc.Projection, M: int, act: torch.dtype, dev, sets: int, seed: int):
    """x ``[G, M, K]`` (a strided view of a ``[M, G, K]`` buffer where G > 1, as the layer's),
    ``sets`` weight copies in the projection's layout, the float32 weight for ``weights_proj``."""
    g = torch.Generator(device=dev).manual_seed(seed)
    wd = torch.float32 if p.fp32 else act
    G, N, K = p.groups, p.n, p.k
    x = torch.randn(M, G, K, generator=g, device=dev, dtype=torch.float32).to(act).transpose(0, 1)
    ws = []
    for _ in range(sets):
        if p.n_major:                         # stored [G, K, N], read as [G, N, K]
            w = torch.randn(G, K, N, generator=g, device=dev, dtype=torch.float32).div_(K ** 0.5)
            ws.append(w.to(wd).transpose(1, 2))
        else:
            ws.append(torch.randn(G, N, K, generator=g, device=dev, dtype=torch.float32).div_(K ** 0.5).to(wd))
    return x, ws


def _squeeze(t, G):
    return t[0] if G == 1 else t


def torch_candidates(p: lc.Projection, x, alpha: float):
    """``{name: fn(w) -> out}`` of the torch GEMMs the layer runs for ``p``."""
    G = p.groups
    xs = _squeeze(x, G)
    if p.fp32:
        xf = xs.float()
        zero = torch.zeros((), dtype=torch.float32, device=x.device)
        return {"torch.addmm": lambda w: torch.addmm(zero, xf, _squeeze(w, G).T, beta=0, alpha=alpha)}
    if G > 1:
        return {"torch.bmm": lambda w: torch.bmm(xs, w.transpose(1, 2))}
    return {"torch.mm": lambda w: xs @ _squeeze(w, G).T,
            "F.linear": lambda w: torch.nn.functional.linear(xs, _squeeze(w, G))}


def check(out, x, w, alpha: float) -> tuple[bool, float]:
    """``(ok, worst ratio)`` of ``out`` against the float64 product within the bound of the
    module docstring (on the device, float64)."""
    xd, wd = x.double(), w.double()
    if out.dim() == 2:
        out = out[None]
    want = alpha * torch.matmul(xd, wd.transpose(-1, -2))
    mag = abs(alpha) * torch.matmul(xd.abs(), wd.abs().transpose(-1, -2))
    bound = 2 * x.shape[-1] * 2.0 ** -24 * mag + _UNIT[out.dtype] * want.abs() + 1e-30
    r = ((out.double() - want).abs() / bound)
    worst = float(r.max())
    return bool(torch.isfinite(out).all()) and worst <= 1.0, worst


def _time(calls, dry: bool):
    from bench import timing
    return timing.time_cpu(calls, reps=2) if dry else timing.time_torch_cuda(calls)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="linear_sweep.json")
    ap.add_argument("--preset", nargs="+", default=["DSV32", "DSV4_FLASH"], choices=sorted(lc.LAYER_CONFIGS))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="tokens M (B * N), 1..64")
    ap.add_argument("--gemm", nargs="+", default=None, help="only these projections (layer names)")
    ap.add_argument("--heuristic-only", action="store_true", help="only the heuristic's config")
    ap.add_argument("--splits-scale", type=float, nargs="+", default=[0.5, 1.0, 2.0],
                    help="time each config at the heuristic split count times these (and unsplit)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop timing after this long")
    ap.add_argument("--split-weights", action="store_true",
                    help="also the float32 weights_proj as three 16-bit weights, alone and appended "
                         "to x_proj (M > 1; rows marked alternative)")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU interpreter at the scaled-down layer's shapes, fp16 (plumbing only)")
    args = ap.parse_args(argv)
    t_start = time.time()
    from bench.timing import sweep_device
    dry, dev, act = sweep_device("linear_sweep", args.dry_run)
    info = _common.device_info(dev)
    if dry:
        from bench.roofline import measure_cpu
        machine = measure_cpu()
    else:
        from bench.roofline import measure_torch_cuda
        machine = measure_torch_cuda()
    copy_bw = machine.copy_bytes_per_s
    rows, cut = [], False
    for preset in args.preset:
        for M in args.batch:
            for i, p in enumerate(_shapes(preset, dry)):
                if args.gemm and p.name not in args.gemm:
                    continue
                if time.time() - t_start > args.budget_s:
                    cut = True
                    break
                wb = 4 if p.fp32 else act.itemsize
                w_bytes = p.numel * wb
                sets = 1 if dry else max(1, math.ceil(ROTATE_BYTES / w_bytes))
                x, ws = _operands(p, M, act, dev, sets, seed=i)
                alpha = 0.0078125 if p.fp32 else 1.0
                od = torch.float32 if p.fp32 else act
                base = dict(preset=preset, M=M, gemm=p.name, G=p.groups, N=p.n, K=p.k,
                            w_dtype="float32" if p.fp32 else str(act).split(".")[1], w_n_major=p.n_major,
                            weight_bytes=w_bytes, weight_sets=sets)
                cands = [(name, None, None, fn) for name, fn in torch_candidates(p, x, alpha).items()]
                heur = lcfg.linear_heuristic(M, p.n, p.k, wb, info.smem_per_block)
                h_splits = lcfg.linear_num_splits(heur, M, p.n, p.k, p.groups, info.num_sms, wb,
                                                  act.itemsize, info.smem_per_block)
                space = [heur] if args.heuristic_only else sorted(
                    lcfg.linear_space(info.smem_per_block, wb, M), key=lambda c: c != heur)
                for cfg in space:
                    s0 = lcfg.linear_num_splits(cfg, M, p.n, p.k, p.groups, info.num_sms, wb,
                                                act.itemsize, info.smem_per_block)
                    counts = sorted({1, s0} | {max(1, min(lcfg.MAX_SPLITS, round(s0 * f)))
                                               for f in args.splits_scale})
                    if args.heuristic_only:
                        counts = [s0]
                    for s in counts:
                        s_used = lcfg.split_geometry(p.k, cfg.block_k, s)[1]
                        out = torch.empty(M, p.groups, p.n, dtype=od, device=dev).transpose(0, 1)

                        def fn(w, cfg=cfg, s=s, out=out):
                            return tlinear.linear(_squeeze(x, p.groups), _squeeze(w, p.groups),
                                                  out=_squeeze(out, p.groups), alpha=alpha,
                                                  path="triton", config=cfg, splits=s)
                        cands.append(("triton", cfg, s_used, fn))
                if M == 1 and not args.heuristic_only:       # the one-token kernel (no tensor cores)
                    for gcfg in lcfg.GEMV_SPACE["n_major" if p.n_major else "k_major"]:
                        gout = torch.empty(1, p.groups, p.n, dtype=od, device=dev).transpose(0, 1)

                        def gfn(w, gcfg=gcfg, gout=gout):
                            ktriton.launch_gemv(x, w, gout, alpha, gcfg)
                            return _squeeze(gout, p.groups)
                        cands.append(("triton_gemv", gcfg, 1, gfn))
                if args.split_weights and p.fp32 and M > 1 and act != torch.float32:
                    rows += split_weight_rows(p, _shapes(preset, dry), M, x, ws, alpha, act, dev, info,
                                              copy_bw, base, dry, seed=i)
                seen = set()
                for name, cfg, s, fn in cands:
                    key = (name, cfg, s)
                    if key in seen:
                        continue
                    seen.add(key)
                    row = dict(base, impl=name, config=cfg.to_dict() if cfg else None, splits=s,
                               heuristic=name == "triton" and cfg == heur
                               and s == lcfg.split_geometry(p.k, heur.block_k, h_splits)[1])
                    try:
                        out = fn(ws[0])
                        ok, worst = check(out, x, ws[0], alpha)
                        row["check"] = dict(ok=ok, worst_ratio=worst)
                        if ok:
                            t = _time([lambda w=w: fn(w) for w in ws], dry)
                            gbs = w_bytes / (t.median_us * 1e-6) / 1e9
                            row.update(median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us,
                                       timer=t.timer, weight_GBps=gbs, frac_copy=gbs * 1e9 / copy_bw)
                    except Exception as e:  # noqa: BLE001 - recorded per candidate
                        row["error"] = f"{type(e).__name__}: {e}"[:400]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            if cut:
                break
        if cut:
            break
    doc = dict(gpu=info.name, compute_capability=f"{info.cc[0]}.{info.cc[1]}", num_sms=info.num_sms,
               versions=dict(torch=torch.__version__, triton=__import__("triton").__version__),
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), dry_run=dry,
               command="python -m bench.linear_sweep " + " ".join(sys.argv[1:] if argv is None else argv),
               machine=machine.to_dict(), cut_by_budget=cut, rows=rows, summary=summarize(rows))
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc["summary"], indent=1))
    print(f"json: {args.out}")
    bad = [r for r in rows if r.get("error") or not r.get("check", {}).get("ok", False)]
    return 1 if bad else 0


def split_weight_rows(p: lc.Projection, shapes, M: int, x, ws, alpha: float, act, dev, info,
                      copy_bw: float, base: dict, dry: bool, seed: int) -> list[dict]:
    """The ``--split-weights`` rows of ``weights_proj`` ``p`` (module docstring), each checked
    against the float64 ``alpha x w^T`` and timed (GEMM alone)."""
    xs, N, K = x[0], p.n, p.k
    xp = next(q for q in shapes if q.name == "x_proj")
    g = torch.Generator(device=dev).manual_seed(seed + 1000)
    from torch_impl.layer import split_weight, sum_split_parts
    w3s = [split_weight(alpha * w[0], act) for w in ws]  # ws: [1, N, K]; the layer's split
    xw = [torch.cat([torch.randn(xp.n, K, generator=g, device=dev).div_(K ** 0.5).to(act), w3], 0)
          for w3 in w3s]

    def mm_f32(w):
        if dry:                                # the CPU has no mm.dtype: the same product
            return (xs.float() @ w.float().T)
        return torch.mm(xs, w.T, out_dtype=torch.float32)

    def tri_f32(w):
        out = torch.empty(M, w.shape[0], dtype=torch.float32, device=dev)
        return tlinear.linear(xs, w, out=out, path="triton")

    forms = [("indexer.weights_proj", "torch.mm_x3", w3s, mm_f32),
             ("indexer.weights_proj", "triton_x3", w3s, tri_f32),
             ("x_proj+weights_proj_x3", "torch.mm_f32out", xw, mm_f32),
             ("x_proj+weights_proj_x3", "triton_f32out", xw, tri_f32)]
    rows = []
    for gemm, impl, wl, fn in forms:
        w_bytes = wl[0].numel() * wl[0].element_size()
        row = dict(base, gemm=gemm, impl=impl, N=wl[0].shape[0], w_dtype=str(act).split(".")[1],
                   weight_bytes=w_bytes, weight_sets=len(wl), config=None, splits=None,
                   heuristic=False, alternative=True)
        try:
            out = fn(wl[0])
            got = sum_split_parts(out[:, -3 * N:], N, act)
            ok, worst = check(got, x, ws[0], alpha)
            if gemm.startswith("x_proj"):      # x_proj's rows: the bf16 GEMM's own bound
                ok2, worst2 = check(out[:, :-3 * N], x, wl[0][None, :-3 * N].float(), 1.0)
                ok, worst = ok and ok2, max(worst, worst2)
            row["check"] = dict(ok=ok, worst_ratio=worst)
            if ok:
                t = _time([lambda w=w: fn(w) for w in wl], dry)
                gbs = w_bytes / (t.median_us * 1e-6) / 1e9
                row.update(median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us, timer=t.timer,
                           weight_GBps=gbs, frac_copy=gbs * 1e9 / copy_bw)
        except Exception as e:  # noqa: BLE001 - recorded per candidate
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def summarize(rows) -> dict:
    """Per (preset, M, gemm): the fastest torch row, the heuristic's Triton row, the fastest
    Triton row of either kernel, the fastest ``--split-weights`` row (``alternative_best``) and
    the fastest one-token kernel row (``gemv_best``, M = 1; us,
    frac_copy, config, splits); per (preset, M): the projections phase summed
    over the GEMMs (the GEMM time only, no gaps between launches): the fastest torch call of
    each, the Triton heuristic, the faster of the two per GEMM, the best row of each (NaN where
    a GEMM has no such row)."""
    per, phase = {}, {}
    for r in rows:
        if r.get("median_us") is None:
            continue
        k = f"{r['preset']} M={r['M']} {r['gemm']}"
        d = per.setdefault(k, {})
        brief = dict(us=round(r["median_us"], 2), frac_copy=round(r["frac_copy"], 3), impl=r["impl"],
                     config=r["config"], splits=r["splits"])
        if r.get("alternative"):              # --split-weights: beside, not in, the phase sums
            if "alternative_best" not in d or r["median_us"] < d["alternative_best"]["us"]:
                d["alternative_best"] = brief
            continue
        slot = "triton_best" if r["impl"].startswith("triton") else "torch"
        if slot not in d or r["median_us"] < d[slot]["us"]:
            d[slot] = brief
        if r["impl"] == "triton_gemv" and ("gemv_best" not in d or r["median_us"] < d["gemv_best"]["us"]):
            d["gemv_best"] = brief
        if r["heuristic"]:
            d["triton_heuristic"] = brief
    for k, d in per.items():
        if set(d) == {"alternative_best"}:
            continue                          # a joint alternative: not one of the phase's GEMMs
        pk = k.rsplit(" ", 1)[0]
        ph = phase.setdefault(pk, {"torch_us": 0.0, "triton_heuristic_us": 0.0,
                                   "faster_of_torch_and_heuristic_us": 0.0, "best_us": 0.0, "gemms": 0})
        ph["gemms"] += 1
        t = d.get("torch", {}).get("us", math.nan)
        h = d.get("triton_heuristic", {}).get("us", math.nan)
        ph["torch_us"] += t
        ph["triton_heuristic_us"] += h
        ph["faster_of_torch_and_heuristic_us"] += min(t, h)      # a per-GEMM switch's best
        ph["best_us"] += min(t, d.get("triton_best", {}).get("us", math.inf))
    return {"gemms": per, "projections_phase": phase}


if __name__ == "__main__":
    raise SystemExit(main())
