"""``python -m bench``: check, then time, every available path of the DSA decode ops.

Examples::

    python -m bench                      # --quick grid on this GPU (~4 min on an H200)
    python -m bench --full               # the whole grid (long; see bench/grid.py)
    python -m bench --targets            # the rows the performance issues name
    python -m bench --quick --write-dispatch   # also write kernels/dispatch/<arch>.json
    python -m bench --dry-run            # CPU interpreter plumbing check (timings meaningless)
    python -m bench --op sparse_mla_decode --backend torch --preset DSV32
    python -m bench --op dsa_decode_layer   # the whole decode layer (weights + attention)
    python -m bench --path auto          # path="auto" rows: what the dispatch table picks
    python -m bench --targets --compat   # also the compat calls beside the native calls
    python -m bench --compat-only        # only those (bench.compat_rows rows)

Results: ``bench/results/bench_<arch>_<mode>_<date>.json`` (SPEC "Result files") and ``.png``
(roofline plot), a table on stdout. Without a CUDA GPU the run is a dry run.

Exit status: 0 when every row that ran passed its check, 1 when any failed or errored, 2 on a
usage error (a bad flag, a non-positive ``--budget-s`` / ``--max-gb``, an ``--out`` that cannot
be written, a selection that matches no path or no shape, a ``DSA_LAYER_*`` /
``DSA_BENCH_LAYER_STEPS`` / ``DSA_TOPK_PDL`` / ``DSA_LINEAR_GEMV`` / ``DSA_TOPK_SCATTER_SUB``
environment switch set to a value it does not take), checked before anything runs.
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path


def _has_cuda() -> bool:
    """parity's device detection (``parity.machine``: a visible NVIDIA GPU, not forced off by
    ``DSA_FORCE_INTERPRET``), then torch's view of it (the bench times torch inputs)."""
    from parity.machine import has_cuda_gpu
    if not has_cuda_gpu():
        return False
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return v


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default in its help."""

    def _get_help_string(self, action):
        h = action.help or ""
        if ("default" in h or action.default is None or action.default is False
                or action.default is argparse.SUPPRESS):
            return h
        return h + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (every flag with help text; defaults shown by the formatter)."""
    from bench import grid                # NumPy-only imports: no framework is loaded here
    from kernels.registry import AUTO, REGISTRY as OP_REGISTRY
    from parity.report import csv_choices, positive_int

    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=_HelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the priority grid (default), ~4 min on an H200")
    mode.add_argument("--full", action="store_true", help="the full grid of the issue")
    mode.add_argument("--targets", action="store_true",
                      help="the rows the open performance issues name, headline first")
    mode.add_argument("--dry-run", "--cpu-smoke", dest="dry_run", action="store_true",
                      help="tiny grid in the CPU interpreter: plumbing only, timings meaningless")
    ap.add_argument("--out", type=Path, default=Path("bench/results"),
                    help="result directory (JSON, PNG; created if missing)")
    sel = "comma-separated and/or repeated (--backend torch,jax = --backend torch --backend jax)"
    backends = tuple(OP_REGISTRY.backends)
    ap.add_argument("--backend", type=csv_choices(backends), action="extend",
                    help=f"backends to time ({', '.join(backends)}; default all): {sel}")
    all_paths = tuple(OP_REGISTRY.all_paths()) + (AUTO,)
    ap.add_argument("--path", type=csv_choices(all_paths), action="extend",
                    help=f"paths to time ({', '.join(all_paths)}; default every path, auto "
                         f"excluded; 'auto' times the bindings' path=\"auto\", the dispatch "
                         f"table's choice): comma-separated and/or repeated")
    ap.add_argument("--op", type=csv_choices(grid.OPS), action="extend",
                    help=f"ops to time ({', '.join(grid.OPS)}; default all): comma-separated "
                         f"and/or repeated")
    ap.add_argument("--preset", type=csv_choices(("DSV32", "DSV4_FLASH")), action="extend",
                    help="model presets (DSV32, DSV4_FLASH; default all): comma-separated and/or "
                         "repeated")
    ap.add_argument("--kv", type=csv_choices(("bf16", "fp8")), action="extend",
                    help="latent-cache kind of the sparse MLA rows (bf16, fp8; default all): "
                         "comma-separated and/or repeated")
    ap.add_argument("--budget-s", type=_positive_float, default=None,
                    help="stop starting new shapes after this many seconds (default: 240 for "
                         "--quick, none otherwise)")
    ap.add_argument("--max-gb", type=_positive_float, default=60.0,
                    help="device memory the inputs of one shape may take, all rotations, GB")
    ap.add_argument("--write-dispatch", action="store_true",
                    help="write kernels/dispatch/<arch>.json from the fastest checked paths")
    ap.add_argument("--dispatch-dir", type=Path, default=None,
                    help="where --write-dispatch writes (default: kernels/dispatch; dry runs: "
                         "<out>/dispatch)")
    ap.add_argument("--ref-max-positions", type=positive_int, default=1 << 18,
                    help="indexer rows with N*L above this are checked path-vs-path, not against "
                         "the float64 reference")
    ap.add_argument("--seed", type=int, default=0, help="seed of every generated input")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar / per-row lines")
    ap.add_argument("--no-plot", action="store_true", help="do not write the roofline PNG")
    ap.add_argument("--tag", default="", help="result file tag (default: the arch, or 'dry')")
    ap.add_argument("--compat", action="store_true",
                    help="after the grid, time the FlashMLA / DeepGEMM / top-k compat calls "
                         "(torch_impl.compat) beside the native calls at the same shapes, on the "
                         "same inputs; JSON 'compat_rows' with compat_us, native_us and ratio")
    ap.add_argument("--compat-only", action="store_true",
                    help="only the compat rows of --compat (no grid); JSON "
                         "bench_<tag>_compat_<date>.json")
    return ap


def parse(argv=None) -> argparse.Namespace:
    """The parsed command line, with ``dry`` (the CPU dry run: asked for, or no CUDA GPU) and
    the environment set for it (``parity.machine.prepare_environment``); a usage error (also an
    ``--out`` / ``--dispatch-dir`` that cannot be written, checked before anything runs) exits
    with status 2 (``SystemExit``)."""
    from parity.report import selection, unwritable

    ap = build_parser()
    args = ap.parse_args(argv)
    for name in ("backend", "path", "op", "preset", "kv"):
        setattr(args, name, selection(getattr(args, name)))
    # checked before the run: a result that cannot be written would cost the whole run
    why = unwritable(args.out, directory=True)
    if why:
        ap.error(f"argument --out: expected a writable directory, got {str(args.out)!r}: {why}")
    if args.write_dispatch and args.dispatch_dir is not None:
        why = unwritable(args.dispatch_dir, directory=True)
        if why:
            ap.error(f"argument --dispatch-dir: expected a writable directory, got "
                     f"{str(args.dispatch_dir)!r}: {why}")
    # the interpreters before the check below imports the kernel modules (a Triton module
    # imported before TRITON_INTERPRET=1 is set stays compiled: every CPU row then failed);
    # args.dry: the CPU dry run, asked for or for want of a GPU
    from parity.machine import prepare_environment
    args.dry = args.dry_run or not _has_cuda()
    prepare_environment(gpu=not args.dry)      # interpreters on the CPU; JAX does not preallocate
    why = _bad_environment(args.backend or None)
    if why:
        ap.error(f"environment: {why}")
    return args


def _bad_environment(backends=None) -> str | None:
    """The first environment switch the timed paths read that holds a value they refuse
    (``DSA_LAYER_OVERLAP``, ``DSA_LAYER_OVERLAP_CARVEOUT``, ``DSA_LAYER_FUSED_PREP``,
    ``DSA_LAYER_LINEAR``, ``DSA_LAYER_JOINT_GEMV``, ``DSA_LAYER_TOPK_WINDOW``,
    ``DSA_LAYER_SPLIT_WPROJ``, ``DSA_LAYER_XW_JOINT``,
    ``DSA_BENCH_LAYER_STEPS``, ``DSA_TOPK_PDL``, ``DSA_LINEAR_GEMV``,
    ``DSA_TOPK_SCATTER_SUB``, ``DSA_IDX_WS_FUSED_HIST_MAX_N``, ``DSA_TOPK_SPLIT_PLAN``,
    ``DSA_TOPK_SCATTER_FORM``, ``DSA_TOPK_PART_PRE``, ``DSA_TOPK_UNFUSED_PER_SM``,
    ``DSA_JAX_LAYER_ROPE_LANES``), as its
    error message; None when all are good. Checked before anything runs, so a typo is a usage
    error, not a failed row. ``backends``: the selected backends (None: all); a backend not
    selected is neither imported nor checked (a torch-only run does not import the JAX layer)."""
    from bench.paths import layer_group_steps
    checks = [layer_group_steps]
    want = set(backends) if backends else {"torch", "jax"}
    tl = None
    if "torch" in want:
        try:
            from torch_impl import layer as tl
        except Exception:  # noqa: BLE001 - no torch here: its switches are not read either
            tl = None
    if tl is not None:
        import torch
        from kernels.scalars import env_switch
        from kernels.indexer.triton import ws_fused_hist_max_n
        from kernels.topk.triton import (SPLIT_PLAN_ENV, pdl_enabled, scatter_form_default,
                                         scatter_part_pre, scatter_subsplits,
                                         unfused_topk_splits)
        from torch_impl.linear import GEMV_ENV
        checks += [tl.overlap_default, tl.overlap_sm_carveout, tl.fused_prep_default, tl.joint_gemv_on,
                   tl.topk_window_on, tl.split_wproj_on, tl.xw_joint_on,
                   lambda: tl.linear_switch(None, True), lambda: tl.linear_switch(None, False),
                   lambda: pdl_enabled(torch.device("cpu")),
                   lambda: env_switch(GEMV_ENV), scatter_subsplits, ws_fused_hist_max_n,
                   lambda: env_switch(SPLIT_PLAN_ENV), scatter_form_default, scatter_part_pre,
                   lambda: unfused_topk_splits(1, 1, 1, 1)]
    jl = None
    if "jax" in want:
        try:
            from jax_impl import layer as jl
        except Exception:  # noqa: BLE001 - no JAX here: its switch is not read either
            jl = None
    if jl is not None:
        checks.append(jl.rope_lanes_on)
    for check in checks:
        try:
            check()
        except (ValueError, TypeError) as e:
            return str(e)
    return None


def main(argv=None) -> int:
    args = parse(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    dry = args.dry                            # (parse set the environment for it)
    if dry:
        if not args.dry_run:
            print("no CUDA GPU: running the CPU dry run (timings meaningless)", file=sys.stderr)
    from bench import report
    from bench.runner import RunConfig, empty_selection, run
    if args.compat_only:
        return _compat_only(args, dry)

    mode = "dry" if dry else ("full" if args.full else "targets" if args.targets else "quick")
    budget = args.budget_s if args.budget_s is not None else {"quick": 240.0, "dry": 1e9}.get(mode, 1e9)
    cfg = RunConfig(mode=mode, out=args.out, backends=tuple(args.backend or ()), paths=tuple(args.path or ()),
                    ops=tuple(args.op or ()), presets=tuple(args.preset or ()), kvs=tuple(args.kv or ()),
                    budget_s=budget, max_gb=args.max_gb, write_dispatch=args.write_dispatch,
                    dispatch_dir=args.dispatch_dir, seed=args.seed,
                    command="python -m bench " + " ".join(shlex.quote(a) for a in argv),
                    progress=not args.no_progress, ref_max_positions=args.ref_max_positions,
                    plot=not args.no_plot, tag=args.tag)
    why = empty_selection(cfg)
    if why:                                  # like python -m parity: nothing to run is a usage error
        print(f"python -m bench: error: {why}", file=sys.stderr)
        return 2
    res = run(cfg)
    report.print_table(res["rows"], res["meta"])
    compat_failed = False
    if args.compat:
        crows, compat_failed = _compat_rows(dry)
        res["meta"]["compat_rows"] = crows
        report.write_json(res["json"], res["meta"], res["rows"])
    print(f"json: {res['json']}")
    if res["png"]:
        print(f"plot: {res['png']}")
    if res["dispatch"]:
        print(f"dispatch: {res['dispatch']}")
    agree = res["meta"].get("auto_vs_fastest")
    if agree:
        n = sum(a["agrees"] for a in agree)
        print(f"auto: {n} of {len(agree)} auto rows ran the path and config of their backend's "
              f"fastest checked row (json meta 'auto_vs_fastest')")
    failed = [r for r in res["rows"] if str(r.get("status", "")).startswith(("FAILED", "error"))]
    if failed:
        print(f"{len(failed)} rows failed their check or errored (see 'status')", file=sys.stderr)
    if dry:
        why = "--dry-run" if args.dry_run else "no CUDA GPU"
        print(f"this was a dry run ({why}): tiny shapes in the CPU interpreter, the timings "
              f"are meaningless; run on a CUDA GPU for real numbers")
    return 1 if failed or compat_failed else 0


def _compat_rows(dry: bool) -> tuple[list, bool]:
    """(rows of ``bench.compat_rows``, whether they errored), printed one per line."""
    from bench import compat_rows as bench_compat
    try:
        crows = bench_compat.rows((1,) if dry else (1, 64), device="cpu" if dry else "cuda")
    except Exception as e:  # noqa: BLE001 - a compat mismatch is a failed row, not a crash
        print(f"compat rows: error: {type(e).__name__}: {e}"[:400], file=sys.stderr)
        return [{"status": f"error: {type(e).__name__}: {e}"[:300]}], True
    print("compat calls beside the native calls (same shapes, same inputs; ratio = compat / native):")
    for r in crows:
        print("  " + bench_compat.format_row(r))
    return crows, False


def _compat_only(args, dry: bool) -> int:
    import datetime as dt
    from bench import report
    from bench.runner import environment

    env = environment(dry)
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    crows, bad = _compat_rows(dry)
    tag = args.tag or ("dry" if dry else env["arch"])
    stamp = date.replace(":", "").replace("-", "")[:15]
    path = Path(args.out) / f"bench_{tag}_compat_{stamp}.json"
    meta = {"gpu": env["gpu"], "compute_capability": env["compute_capability"],
            "versions": env["versions"], "date": date, "dry_run": dry, "mode": "compat",
            "command": "python -m bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
            "compat_rows": crows}
    from bench.runner import recorded_env
    flags = recorded_env()
    if flags:
        meta["env"] = flags
    report.write_json(path, meta, [])
    print(f"json: {path}")
    if dry:
        print("this was a dry run: tiny shapes in the CPU interpreter, the timings are meaningless")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
