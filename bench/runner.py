"""The benchmark loop: shapes x paths -> checked, timed rows."""
from __future__ import annotations

import datetime as dt
import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import checks, grid, paths, report, roofline, timing
from bench.inputs import make_inputs, rotations_for
from kernels import dispatch, hardware


@dataclass
class RunConfig:
    mode: str = "quick"                     # quick | full | targets | dry
    out: Path = Path("bench/results")
    backends: tuple = ()                    # () = all
    paths: tuple = ()
    ops: tuple = ()
    presets: tuple = ()
    kvs: tuple = ()
    budget_s: float = 240.0
    max_gb: float = 60.0
    write_dispatch: bool = False
    dispatch_dir: Path | None = None
    seed: int = 0
    command: str = "python -m bench"
    progress: bool = True
    ref_max_positions: int = 1 << 18
    plot: bool = True
    tag: str = ""
    extra_shapes: list = field(default_factory=list)


# Environment variables a bench result file records (top-level ``env``) when set.
RECORDED_ENV = ("XLA_FLAGS", "TRITON_INTERPRET", "DSA_LAYER_OVERLAP", "DSA_LAYER_OVERLAP_CARVEOUT",
                "DSA_LAYER_LINEAR", "DSA_LINEAR_GEMV", "DSA_LAYER_FUSED_PREP", "DSA_BENCH_COMPILE_LAYER",
                "DSA_BENCH_LAYER_STEPS", "DSA_TOPK_PDL", "DSA_TOPK_SCATTER_SUB", "DSA_TOPK_SCATTER_MAXNREG",
                "DSA_IDX_WS_FUSED_HIST_MAX_N", "DSA_TOPK_SPLIT_PLAN", "DSA_TOPK_SCATTER_FORM",
                # XLA's own log (bench.xla_cmdbuf reads the command-buffer pass's lines); not
                # TF_CPP_MIN_LOG_LEVEL, which an imported library sets to 1 in the process
                "TF_CPP_VMODULE")


def recorded_env() -> dict:
    """The :data:`RECORDED_ENV` variables and every ``DSA_*`` switch set (non-empty) in this
    process, sorted by name: a result file's ``env`` (a switch added later is recorded without
    being listed: the unfused top-k's split count was not, 2026-12-07)."""
    return {k: os.environ[k] for k in sorted(os.environ)
            if os.environ[k] and (k in RECORDED_ENV or k.startswith("DSA_"))}


def environment(dry: bool) -> dict:
    """GPU name, compute capability, arch tag, device string and library versions: parity's
    machine metadata (``parity.report.machine_info``) plus what the bench needs from torch (SM
    count, arch tag)."""
    import torch
    from parity.report import machine_info

    gpu = not dry and torch.cuda.is_available()
    info = machine_info(gpu)
    versions = dict(info["versions"])
    if gpu:
        props = torch.cuda.get_device_properties(0)
        cc = (props.major, props.minor)
        dev = hardware.DeviceInfo(props.name, cc, props.multi_processor_count, hardware.smem_limit(cc))
        return dict(gpu=props.name, compute_capability=f"{cc[0]}.{cc[1]}", arch=dev.arch, device="cuda",
                    num_sms=props.multi_processor_count, versions=versions)
    return dict(gpu="CPU interpreter", compute_capability="0.0", arch=hardware.CPU_INTERPRETER.arch,
                device="cpu", num_sms=0, versions=versions)


def shape_cost(shape: grid.Shape, inp, parts: list | None = None) -> tuple[int, int]:
    """(bytes, flops) of one call of ``shape`` (bench.roofline formulas); ``parts`` collects the
    (bytes, flops) of each phase (indexer, sparse MLA) of a decode step, or (projections,
    indexer, sparse MLA) of a decode layer."""
    p = shape.p
    q_item = {"bfloat16": 2, "float16": 2, "float32": 4}[inp.q_dtype]
    if shape.op == "dsa_decode_layer":
        return roofline.layer_cost(shape.layer_cfg, B=shape.B, N=shape.N, lens=inp.lens,
                                   kv_format=shape.kv_format, tp=shape.tp, itemsize=q_item,
                                   kv_itemsize=inp.kv_itemsize, parts=parts)
    nbytes = flops = 0
    if shape.op in ("indexer_topk", "dsa_decode_step"):
        b, f = roofline.indexer_cost(lens=inp.lens, N=shape.N, H_I=p.index_heads, D_I=p.index_head_dim)
        nbytes, flops = nbytes + b, flops + f
        if parts is not None:
            parts.append((b, f))
    if shape.op in ("sparse_mla_decode", "dsa_decode_step"):
        if shape.op == "sparse_mla_decode":
            n_valid = int((inp.sets[0]["indices"] >= 0).sum().item())
        else:                                   # top-k fills every slot (L >= K) plus the window
            n_valid = shape.B * shape.N * (min(shape.K_topk, shape.L) + shape.W_window)
        b, f = roofline.mla_cost(B=shape.B, N=shape.N, H=shape.H, n_valid=n_valid, d_qk=p.d_qk, d_v=p.d_v,
                                 kv_format=shape.kv_format, kv_itemsize=inp.kv_itemsize, q_itemsize=q_item)
        nbytes, flops = nbytes + b, flops + f
        if parts is not None:
            parts.append((b, f))
    return nbytes, flops


def estimate_touched(shape: grid.Shape) -> int:
    """Bytes one call must read (bf16 q / latent, all indices valid), before inputs exist."""
    p = shape.p
    if shape.op == "dsa_decode_layer":
        return roofline.layer_cost(shape.layer_cfg, B=shape.B, N=shape.N, lens=[shape.L] * shape.B,
                                   kv_format=shape.kv_format, tp=shape.tp)[0]
    n = 0
    if shape.op in ("indexer_topk", "dsa_decode_step"):
        n += roofline.indexer_cost(lens=[shape.L] * shape.B, N=shape.N, H_I=p.index_heads,
                                   D_I=p.index_head_dim)[0]
    if shape.op in ("sparse_mla_decode", "dsa_decode_step"):
        n += roofline.mla_cost(B=shape.B, N=shape.N, H=shape.H, n_valid=shape.B * shape.N * shape.K,
                               d_qk=p.d_qk, d_v=p.d_v, kv_format=shape.kv_format)[0]
    return n


def base_row(shape: grid.Shape, backend: str, path: str) -> dict:
    """The row of one (shape, path) before it runs; decode-layer rows also carry the layer's
    ``hidden``, config name, indexer heads and this rank's ``weight_bytes`` (bf16)."""
    if shape.op == "dsa_decode_layer":
        cfg = shape.layer_cfg
        return _base_row(shape, backend, path) | {
            "H_I": cfg.index_heads, "hidden": cfg.hidden, "layer": cfg.name,
            "weight_bytes": roofline.layer_weight_bytes(cfg, tp=shape.tp)}
    return _base_row(shape, backend, path)


def _base_row(shape: grid.Shape, backend: str, path: str) -> dict:
    p = shape.p
    return {"op": shape.op, "backend": backend, "path": path, "preset": shape.preset, "B": shape.B,
            "N": shape.N, "H": shape.H, "L": shape.L, "K": shape.K, "P": shape.P,
            "kv_format": shape.kv_format, "table_len": shape.table_positions, "tp": shape.tp,
            "median_us": None, "p20_us": None, "p80_us": None, "bytes": None, "flops": None,
            "floor_us": None, "frac_floor": None, "GB_per_s": None, "TFLOP_per_s": None,
            "d_qk": p.d_qk, "d_v": p.d_v, "topk": shape.K_topk, "window": shape.W_window,
            "H_I": p.index_heads, "D_I": p.index_head_dim, "q_dtype": None, "config": None,
            "status": None, "check": None, "timer": None, "rotations": None,
            **({"topk_us": None, "logits_us": None, "topk_timer": None}
               if shape.op == "indexer_topk" else {})}


def _free(device: str):
    gc.collect()
    if device == "cuda":
        import torch
        torch.cuda.empty_cache()


def selection(cfg: RunConfig) -> tuple[list, list]:
    """``(shapes, [(backend, path), ...])`` that ``cfg`` selects from its mode's grid and the
    registered backends (``bench.paths.REGISTRY``), without importing any framework.
    Unavailable backends are still selected (their rows say why)."""
    shapes = grid.select(grid.grid_for(cfg.mode) + list(cfg.extra_shapes), ops=cfg.ops,
                         presets=cfg.presets, kvs=cfg.kvs)
    pairs = [(name, pth) for name, b in paths.REGISTRY.items()
             if not cfg.backends or name in cfg.backends
             for pth in timed_paths(b, cfg.paths)]
    return shapes, pairs


def timed_paths(adapter, selected=()) -> tuple:
    """The paths of ``adapter`` a run times: all of its paths, or those ``selected`` names;
    ``"auto"`` (the bindings' own dispatch) only when selected."""
    if not selected:
        return tuple(adapter.paths)
    return tuple(p for p in tuple(adapter.paths) + (paths.AUTO,) if p in selected)


def empty_selection(cfg: RunConfig) -> str | None:
    """Why ``cfg`` selects nothing to run (no path or no shape), or None when it selects rows."""
    shapes, pairs = selection(cfg)

    def given(*opts):
        return " ".join(f"--{o} {','.join(v)}" for o, v in opts if v)
    if not pairs:
        known = "; ".join(f"{n}: {', '.join(b.paths)}" for n, b in paths.REGISTRY.items())
        return (f"no path matches {given(('backend', cfg.backends), ('path', cfg.paths)) or 'the selection'} "
                f"(backends and their paths: {known})")
    if not shapes:
        return (f"no shape of the {cfg.mode} grid matches "
                f"{given(('op', cfg.ops), ('preset', cfg.presets), ('kv', cfg.kvs)) or 'the selection'}")
    return None


def run(cfg: RunConfig) -> dict:
    """Run the grid; returns ``{"meta", "rows", "json", "png", "dispatch"}``.

    Raises:
        ValueError: ``cfg`` selects no path or no shape (``empty_selection``); nothing is written.
    """
    why = empty_selection(cfg)
    if why:
        raise ValueError(f"cfg: {why}")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    dry = cfg.mode == "dry"
    env = environment(dry)
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    if env["device"] == "cuda":
        machine = roofline.measure_torch_cuda()
        q_dtype = latent_dtype = "bfloat16"
    else:
        machine = roofline.measure_cpu()
        q_dtype = latent_dtype = "float16"     # the interpreter computes bf16 on raw bits
    meta = {"gpu": env["gpu"], "compute_capability": env["compute_capability"], "arch": env["arch"],
            "versions": env["versions"], "date": date, "command": cfg.command, "mode": cfg.mode,
            "dry_run": dry, "machine": machine.to_dict(), "num_sms": env["num_sms"],
            "floor": "max(bytes / copy_bytes_per_s, flops / matmul_flops_per_s); see bench/roofline.py",
            "q_dtype": q_dtype, "latent_dtype": latent_dtype, "unavailable": {}}
    # compiler flags set in the environment change what the timings mean (e.g. XLA's command
    # buffers): part of the reproducing command
    flags = recorded_env()
    if flags:
        meta["env"] = flags
    if dry:
        meta["note"] = "DRY RUN in the CPU interpreter: plumbing check only, timings meaningless"
    shapes = grid.select(grid.grid_for(cfg.mode) + list(cfg.extra_shapes), ops=cfg.ops,
                         presets=cfg.presets, kvs=cfg.kvs)
    found = paths.discover(cfg.backends or None)
    if env["device"] == "cuda" and found.get("jax", (None, ""))[0] is not None:
        import jax
        if jax.default_backend() != "gpu":      # never interpret GB-sized inputs on the host
            found["jax"] = (None, f"JAX has no GPU backend here (jax.default_backend() == "
                                  f"{jax.default_backend()!r}); install jax[cuda12]")
    todo = []                                    # (backend name, adapter, path)
    for name, (adapter, why) in found.items():
        for pth in timed_paths(paths.REGISTRY[name], cfg.paths):
            if adapter is None:
                meta["unavailable"][f"{name}/{pth}"] = why
            todo.append((name, adapter, pth))
    tag = cfg.tag or ("dry" if dry else env["arch"])
    stamp = date.replace(":", "").replace("-", "")[:15]
    json_path = Path(cfg.out) / f"bench_{tag}_{cfg.mode}_{stamp}.json"
    png_path = json_path.with_suffix(".png")
    rows: list[dict] = []
    t0 = time.perf_counter()
    max_bytes = int(cfg.max_gb * (1 << 30))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, disable=not cfg.progress, transient=False)
    with progress:
        task = progress.add_task("bench", total=len(shapes) * max(1, len(todo)))
        for shape in shapes:
            shape_rows = [base_row(shape, b, p) for b, _, p in todo]
            elapsed = time.perf_counter() - t0
            foot = shape.input_bytes(1)
            skip = None
            if elapsed > cfg.budget_s:
                skip = f"skipped: time budget {cfg.budget_s:.0f} s spent (--budget-s)"
            elif foot > max_bytes:
                skip = f"skipped: inputs need {foot / 2**30:.1f} GiB > --max-gb {cfg.max_gb}"
            if skip:
                for r in shape_rows:
                    r["status"] = skip
                rows += shape_rows
                progress.advance(task, len(todo))
                continue
            progress.update(task, description=shape.label()[:70])
            try:
                R = 1 if dry else rotations_for(estimate_touched(shape), foot, max_bytes=max_bytes // 2)
                inp = make_inputs(shape, rotations=R, device=env["device"], q_dtype=q_dtype,
                                  latent_dtype=latent_dtype, seed=cfg.seed)
            except Exception as e:  # noqa: BLE001 - e.g. out of memory: record and go on
                for r in shape_rows:
                    r["status"] = f"skipped: input generation failed: {type(e).__name__}: {e}"[:300]
                rows += shape_rows
                progress.advance(task, len(todo))
                _free(env["device"])
                continue
            phases: list = []
            nbytes, flops = shape_cost(shape, inp, phases)
            checker = checks.Checker(inp, ref_max_positions=cfg.ref_max_positions)
            for r, (bname, adapter, pth) in zip(shape_rows, todo):
                r.update(bytes=nbytes, flops=flops, q_dtype=q_dtype if shape.op != "indexer_topk" else "float8_e4m3fn",
                         rotations=len(inp.sets), **roofline.row_metrics(machine, nbytes, flops, None))
                if shape.op == "dsa_decode_step":
                    r["step_impl"] = paths.step_impl(bname, shape.W_window)
                if shape.op in ("dsa_decode_step", "dsa_decode_layer"):
                    # the phases cannot overlap (MLA needs the top-k): floor of running them in turn
                    r["floor_phases_us"] = [machine.floor_us(b, f) for b, f in phases]
                progress.update(task, description=f"{shape.label()[:60]} {bname}/{pth}")
                if adapter is None:
                    r["status"] = f"unavailable: {found[bname][1]}"[:300]
                    progress.advance(task)
                    continue
                r.update(_run_path(shape, inp, adapter, pth, checker, env, machine, nbytes, flops, dry))
                progress.advance(task)
            rows += shape_rows
            del inp, checker
            _free(env["device"])
            report.write_json(json_path, meta | {"partial": True}, rows)
    meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
    if any(r["path"] == paths.AUTO for r in rows):
        meta["auto_vs_fastest"] = report.auto_vs_fastest(rows)
    report.write_json(json_path, meta, rows)
    png = None
    if cfg.plot:
        try:
            png = report.plot(png_path, meta, rows, meta["machine"])
        except Exception as e:  # noqa: BLE001 - matplotlib missing: the JSON is the result
            console.print(f"[yellow]no plot: {type(e).__name__}: {e}[/yellow]")
    disp = None
    if cfg.write_dispatch:
        entries = report.dispatch_entries(rows, env["gpu"])
        ddir = cfg.dispatch_dir
        if ddir is None and dry:
            ddir = Path(cfg.out) / "dispatch"     # never write an interpreter table into the package
        disp = dispatch.write_table(env["arch"], entries, gpu=env["gpu"],
                                    compute_capability=env["compute_capability"], command=cfg.command,
                                    versions=env["versions"], directory=ddir)
    return {"meta": meta, "rows": rows, "json": json_path, "png": png, "dispatch": disp}


def _run_path(shape, inp, adapter, pth, checker, env, machine, nbytes, flops, dry) -> dict:
    """Prepare, run once, check, then time one path on one shape; returns the row's fields."""
    upd: dict = {}
    try:
        calls = adapter.prepare(shape.op, inp, pth)
        out0 = calls[0]()
        adapter.sync(out0)
    except NotImplementedError as e:
        return {"status": f"unavailable: {e}"[:300]}
    except Exception as e:  # noqa: BLE001 - a broken path is a row, not a crashed run
        return {"status": f"error: {type(e).__name__}: {e}"[:300]}
    try:
        ran, upd["config"] = adapter.plan(shape.op, inp, pth)
        if pth == paths.AUTO:
            upd["auto_path"] = ran
    except Exception:  # noqa: BLE001 - the row is still timed; its config is unknown
        upd["config"] = None
    try:
        res, how = checker.check(shape.op, out0, pth)
    except Exception as e:  # noqa: BLE001
        return upd | {"status": f"error in check: {type(e).__name__}: {e}"[:300]}
    upd["check"] = {"passed": res.passed, "how": how, "worst_error": res.worst_error,
                    "tolerance": res.tolerance, "ratio": res.ratio, "message": res.message}
    del out0
    if not res.passed:
        return upd | {"status": f"FAILED check: {res.message}"[:300]}
    try:
        if dry:
            t = timing.time_cpu(calls)
        elif adapter.name == "jax" or getattr(adapter, "framework", "") == "jax":
            t = timing.time_jax(calls)
        else:
            t = timing.time_torch_cuda(calls)
    except Exception as e:  # noqa: BLE001
        return upd | {"status": f"error while timing: {type(e).__name__}: {e}"[:300]}
    upd.update(median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us, timer=t.timer, status="ok")
    upd.update(roofline.row_metrics(machine, nbytes, flops, t.median_us))
    if shape.op == "dsa_decode_layer" and not dry:
        upd.update(_layer_phases(calls, t.median_us, adapter.name, machine,
                                 roofline.layer_weight_bytes(shape.layer_cfg, tp=shape.tp),
                                 hlo_path=_hlo_path(shape)))
    if shape.op == "indexer_topk":
        upd.update(_indexer_phases(adapter, calls, dry))
    return upd


def _indexer_phases(adapter, calls, dry: bool) -> dict:
    """``topk_us`` (and ``logits_us``) of an indexer row (issue 17): the GPU time of the kernels
    after the logits kernel, from the profiler ranges the torch bindings open around the two
    phases (paths.torch_indexer_phases); in a dry run the interpreter's time in them. JAX rows
    on a GPU: the Pallas kernels' device time from a jax.profiler trace
    (paths.jax_indexer_phases; in a process where torch.profiler ran, the trace sees no kernel:
    an error note); in a dry run None, and ``topk_timer`` says why."""
    if adapter.name == "jax":
        if dry:
            return {"topk_timer": "not measured (jax dry run: the interpreter launches no kernels)"}
        try:
            return paths.jax_indexer_phases(calls)
        except Exception as e:  # noqa: BLE001 - profiler unavailable: the timing stands
            return {"topk_timer": f"error: {type(e).__name__}: {e}"[:200]}
    if adapter.name != "torch":
        return {"topk_timer": f"not measured ({adapter.name}: no kernel profiler in the bench)"}
    try:
        # dry runs: one interpreted call (minutes of interpreter time otherwise)
        return (paths.torch_indexer_phases(calls[:1], reps=1, warm=False) if dry
                else paths.torch_indexer_phases(calls))
    except Exception as e:  # noqa: BLE001 - profiler unavailable: the timing stands
        return {"topk_timer": f"error: {type(e).__name__}: {e}"[:200]}


def _hlo_path(shape) -> Path | None:
    """Where a jax layer row's optimised HLO goes when ``BENCH_HLO_DIR`` is set (for reading the
    step's command buffers and the thunks outside them off the GPU), named by the row's
    ``shape.label()``, else None."""
    d = os.environ.get("BENCH_HLO_DIR")
    if not d:
        return None
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in shape.label())
    return Path(d) / f"{name}.hlo.txt"


def _layer_phases(calls, step_us: float, backend: str = "torch", machine=None,
                  weight_bytes: int | None = None, hlo_path: Path | None = None) -> dict:
    """The decode-layer row's phases (issue 15): GPU time per call of the projections (GEMMs),
    the indexer and sparse MLA, from the profiler (torch: the kernels inside their ops,
    paths.torch_layer_phases; jax: the device trace's kernels by name, paths.jax_layer_phases),
    and glue = the timed step minus those three (the other kernels plus the gaps between
    kernels). ``projections_frac_copy``: the weight bytes over the projections' time, as a
    fraction of the run's measured copy bandwidth (``machine.copy_bytes_per_s``; issue 15's
    target is >= 0.85). A profile that saw no kernel (a second CUPTI client in the process:
    XLA's tracer cannot subscribe after torch.profiler has run in the same process) is an error
    (``phases_error``), never phases of zero. ``hlo_path``: a jax step's optimised HLO is
    written there (``BENCH_HLO_DIR``)."""
    try:
        ph = (paths.jax_layer_phases(calls, save_hlo=hlo_path) if backend == "jax"
              else paths.torch_layer_phases(calls))
    except Exception as e:  # noqa: BLE001 - profiler unavailable: the timing stands
        return {"phases_error": f"{type(e).__name__}: {e}"[:200]}
    if not ph.get("kernels_per_step"):
        why = ("no device kernel in the jax.profiler trace (CUPTI refuses a second subscriber: "
               "time the jax rows in a process where torch.profiler has not run, e.g. "
               "--backend jax)" if backend == "jax" else "no device kernel in the profile")
        return {"phases_error": why}
    main = ph["projections"] + ph["indexer"] + ph["sparse_mla"]
    glue = step_us - main
    how = ("jax.profiler device trace (perfetto), kernels by name: bench.paths."
           "JAX_LAYER_PHASE_KERNELS, plus the dots of the step's optimised HLO as projections "
           "(bench.paths.jax_projection_kernels: XLA's GEMV reduce fusions; blocked calls, mean "
           "per call)" if backend == "jax" else
           "torch.profiler GPU time of the kernels inside each phase's ops (eager calls, mean "
           "per call)")
    extra = {"glue_top_kernels_us": ph["other_top"]} if "other_top" in ph else {}
    if "top_kernels_us" in ph:
        extra["top_kernels_us"] = ph["top_kernels_us"]
    if "hlo_projection_kernels" in ph:
        extra["hlo_projection_kernels"] = ph["hlo_projection_kernels"]
    if "hlo_command_buffers" in ph:
        extra["hlo_command_buffers"] = ph["hlo_command_buffers"]
    copy_bw = getattr(machine, "copy_bytes_per_s", None)
    if weight_bytes and copy_bw and ph["projections"] > 0:
        extra["projections_frac_copy"] = weight_bytes / (ph["projections"] * 1e-6) / copy_bw
    return {"phases_us": {"projections": ph["projections"], "indexer": ph["indexer"],
                          "sparse_mla": ph["sparse_mla"], "glue": glue,
                          "glue_kernels": ph["other_kernels"]},
            "kernels_per_step": ph["kernels_per_step"], **extra,
            "phases_timer": how + "; glue = median_us - projections - indexer - sparse_mla",
            "glue_frac": glue / step_us if step_us > 0 else None,
            "step_over_phases": step_us / main if main > 0 else None}

