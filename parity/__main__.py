"""``python -m parity``: every available path of both backends against the float64 reference and
against each other, on a grid of named cases (see parity/README.md).

Exit status: 0 when every comparison passed (unavailable paths are not failures unless
``--strict``), 1 when any failed, 3 when none failed but ``--budget-s`` left cases unrun, 2 on
a usage error (bad flag, an empty ``--backend`` / ``--path`` / ``--op`` / ``-k``, a ``--case``
name that is no case of the grid, no case matches the selection, a ``--json`` path that cannot
be written: checked before any case runs).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from parity import runners as _runners
from parity.jobs import SELECTION_ARGS, case_line, run_shard, run_suite
from parity.report import csv_choices, positive_int, selection, unwritable as report_unwritable

OP_CHOICES = _runners.OPS


def build_parser() -> argparse.ArgumentParser:
    # choices come from the registries (ops: parity.runners.OPS; backends and paths: the
    # registered runners, so a runner a test registers is selectable like the real ones)
    backend_paths: dict[str, list[str]] = {}
    for r in _runners.REGISTRY.values():
        backend_paths.setdefault(r.backend, []).append(r.path)
    backends = tuple(backend_paths)
    all_paths = tuple(dict.fromkeys(x for v in backend_paths.values() for x in v))
    described = "; ".join(f"{b}: {', '.join(ps)}" for b, ps in backend_paths.items())
    p = argparse.ArgumentParser(
        prog="python -m parity",
        description=f"Parity suite of the DSA decode kernels: every available path ({described}) "
                    "against the float64 NumPy reference and against each other, with SPEC "
                    "tolerances (kernels.compare).",
        epilog="A failing comparison prints the command that reruns exactly that case and path, "
               "e.g. python -m parity --case mla/fp8_ds_mla/invalid_middle --op sparse_mla_decode "
               "--backend torch --path triton --seed 0")
    m = p.add_mutually_exclusive_group()
    m.add_argument("--quick", dest="mode", action="store_const", const="quick",
                   help="presets and a subset of the corner cases (20 cases on a CPU, about 2 min on 2 "
                        "cores)")
    m.add_argument("--full", dest="mode", action="store_const", const="full",
                   help="larger shapes, fp16 corner cases, bitwise-repeat checks")
    p.set_defaults(mode="default")
    p.add_argument("--backend", type=csv_choices(backends), action="extend", default=None,
                   help=f"comma-separated backends to run ({', '.join(backends)}; default all), "
                        f"also repeatable (--backend torch,jax = --backend torch --backend jax)")
    p.add_argument("--path", type=csv_choices(all_paths), action="extend", default=None,
                   help=f"comma-separated paths to run ({', '.join(all_paths)}; default all), "
                        f"also repeatable")
    p.add_argument("--op", type=csv_choices(OP_CHOICES), action="extend", default=None,
                   help=f"comma-separated ops ({', '.join(OP_CHOICES)}; default all), also "
                        f"repeatable")
    p.add_argument("--case", dest="cases", action="append", default=None, metavar="NAME",
                   help="run only the case named exactly NAME (repeatable; a name that is no case "
                        "of the selected grid is an error listing the closest names). With -k and "
                        "--op, a case runs only when it matches all three")
    p.add_argument("-k", dest="pattern", type=_pattern, default=None,
                   help="run only cases whose name contains PATTERN, a substring match like pytest "
                        "-k (-k idx/corner/ties also runs idx/corner/ties_sorted: use --case for "
                        "one exact case); comma-separated alternatives; with * ? [] the pattern is "
                        "a wildcard matched against the whole name")
    p.add_argument("--seed", type=int, default=0, help="seed of every generated input (default 0)")
    p.add_argument("--json", dest="json_path", default=None, metavar="PATH",
                   help="write the JSON report (schema: SPEC.md 'Result files') to PATH (checked "
                        "to be writable before any case runs)")
    p.add_argument("--env", action="store_true",
                   help="print GPU, driver, CUDA and library versions and which paths can run, then exit")
    p.add_argument("--list", action="store_true", help="list the selected case names and exit")
    p.add_argument("--strict", action="store_true",
                   help="count unavailable paths as failures (use on the GPU where all must run)")
    p.add_argument("--failures-only", action="store_true",
                   help="print only the failing cases in the final table")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (and, when stderr is not a terminal, no per-case lines)")
    p.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                   help="run the cases in N worker processes (one report, same rows and order as "
                        "one process; a line per finished case). On a GPU the workers share it; "
                        "compiling and the float64 reference are what the extra CPU cores speed up")
    p.add_argument("--budget-s", type=positive_int, default=None, metavar="SECONDS",
                   help="start no case after SECONDS (with --jobs: also stop the cases still "
                        "running then); the report and --json hold the cases that finished, "
                        "the JSON lists the others under not_run, and the exit status is 3 "
                        "when some did not run and none failed")
    return p


def parse_args(argv):
    """``build_parser().parse_args`` with the selector lists flattened and de-duplicated."""
    args = build_parser().parse_args(argv)
    args.backend, args.path, args.op = (selection(args.backend), selection(args.path),
                                        selection(args.op))
    return args


def _pattern(text: str) -> str:
    """``-k``: at least one non-empty alternative ('' and ',' would select the whole grid)."""
    if not any(p.strip() for p in text.split(",")):
        raise argparse.ArgumentTypeError(
            f"expected a non-empty pattern (comma-separated alternatives), got {text!r}")
    return text


def _command_line(argv) -> str:
    import shlex
    return " ".join(["python", "-m", "parity"] + [shlex.quote(a) for a in argv])


# ============================================================================ --env

def _probe_cases():
    """Tiny inputs for a run-time availability probe of each op."""
    from kernels import cases as kc
    from parity.cases import layer_probe_case, make_step_case
    from kernels.presets import DSV32
    mla = kc.make_mla_case(1, B=1, N=1, H=16, d_qk=576, K=16, P=16, kv_format="latent")
    idx = kc.make_indexer_case(1, B=1, N=1, H_I=16, D_I=128, P=16, lens=[64], topk=16)
    step = make_step_case(1, name="probe", preset=DSV32, B=1, N=1, H=16, topk=16, context=64,
                          q_dtype="float32", P=16, H_I=16)
    return {"sparse_mla_decode": mla, "indexer_logits": idx, "indexer_topk": idx,
            "dsa_decode_step": step, "dsa_decode_layer": layer_probe_case()}


def probe_paths(selected) -> dict:
    """{runner key: {op: "ok" | "unavailable: why" | "error: why"}} from one tiny call per op."""
    from parity import checks
    refs = checks.References()
    probes = _probe_cases()
    out = {}
    for r in selected:
        why = _runners.import_status(r)
        if why:
            out[r.key] = {op: f"unavailable: {why}" for op in OP_CHOICES}
            continue
        res = {}
        for op in OP_CHOICES:
            try:
                got = r.call(op, probes[op])
                chk = checks.against_reference(op, probes[op], got, refs)
                res[op] = "ok" if chk.passed else f"runs, but WRONG on a tiny case: {chk.message[:200]}"
            except _runners.Unavailable as e:
                res[op] = f"unavailable: {e}"
            except Exception as e:  # noqa: BLE001 - report, never crash --env
                res[op] = f"error: {type(e).__name__}: {str(e)[:300]}"
        out[r.key] = res
    return out


def print_env(console, gpu: bool, selected) -> dict:
    from rich.markup import escape

    from parity import report
    info = report.machine_info(gpu)
    console.print(f"[bold]GPU[/bold]: {info['gpu']}  compute capability: "
                  f"{info['compute_capability'] or 'n/a'}", highlight=False)
    for k, v in info["versions"].items():
        console.print(f"  {k}: {v}", highlight=False)
    mode = "GPU" if gpu else "CPU: Triton interpreter (TRITON_INTERPRET=1), Pallas interpret mode"
    console.print(f"[bold]mode[/bold]: {mode}")
    for var in ("TRITON_INTERPRET", "JAX_PLATFORMS", "DSA_FORCE_INTERPRET"):
        if os.environ.get(var):
            console.print(f"  {var}={os.environ[var]}", highlight=False)
    try:
        import jax
        console.print(f"  jax devices: {[str(d) for d in jax.devices()]}", highlight=False)
    except Exception as e:  # noqa: BLE001
        console.print(f"  jax devices: unavailable ({type(e).__name__}: {e})", highlight=False)
    console.print("[bold]paths[/bold] (one tiny call per op):")
    status = probe_paths(selected)
    for key, ops in status.items():
        for op, s in ops.items():
            colour = "green" if s == "ok" else ("yellow" if s.startswith("unavailable") else "red")
            console.print(f"  {key:<13} {op:<18} [{colour}]{escape(s)}[/{colour}]", highlight=False,
                          soft_wrap=True)
    return {"machine": info, "paths": status}


# ============================================================================ the run
# run_suite (one process) and run_shard (one --jobs worker) live in parity.jobs, which never
# imports this module (spawned workers import their target by module name).

def _run_jobs(args: argparse.Namespace, jobs: int, n_cases: int, err_console,
              show: bool = True, deadline: float | None = None) -> list:
    """``--jobs``: each case in one of ``jobs`` spawned worker processes (a one-case shard of
    ``parity.jobs.run_shard``), a progress line per finished case, rows merged in case order.
    With ``deadline`` (``--budget-s``; a ``time.perf_counter()`` value) the rows of the cases
    finished by then (the workers of the others are stopped; a case that ends in that instant
    is counted as not run)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import threading
    done = []
    t0 = time.perf_counter()
    sel = {k: getattr(args, k) for k in SELECTION_ARGS}
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
    futs = [pool.submit(run_shard, sel, ci, n_cases) for ci in range(n_cases)]
    # (a wait longer than threading.TIMEOUT_MAX, ~292 years, overflows the platform's time_t)
    timeout = (None if deadline is None else
               min(threading.TIMEOUT_MAX, max(0.0, deadline - time.perf_counter())))
    try:
        for f in cf.as_completed(futs, timeout=timeout):
            part = f.result()
            done.extend(part)
            if show:
                for _, case_rows in part:
                    err_console.print(case_line(len(done), n_cases, case_rows,
                                                time.perf_counter() - t0, " elapsed"),
                                      markup=False, highlight=False)
        pool.shutdown()
    except cf.TimeoutError:
        # the budget is spent: drop the queued cases and stop the workers of the running ones
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
    except BaseException:
        pool.shutdown(cancel_futures=True)   # a worker's exception: as the `with` block did
        raise
    return [row for _, rows in sorted(done, key=lambda x: x[0]) for row in rows]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parse_args(argv)
    if args.json_path is not None and not (args.env or args.list):
        why = report_unwritable(args.json_path)     # before the run: a report lost after it costs the run
        if why:
            parser.error(f"argument --json: expected a writable file path, got "
                         f"{args.json_path!r}: {why}")
    gpu = _runners.prepare_environment()

    from rich.console import Console
    # a table in a log file or CI output should not be squeezed to 80 columns
    # (an explicit COLUMNS is honoured: the table then folds long case names instead)
    console = Console() if sys.stdout.isatty() or os.environ.get("COLUMNS") else Console(width=160)
    err_console = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)

    selected = _runners.select(args.backend, args.path)
    if not selected:
        err_console.print("no path matches --backend / --path", style="red")
        return 2
    if args.env:
        print_env(console, gpu, selected)
        return 0

    from parity import cases as pcases, report
    grid = pcases.build_grid(mode=args.mode, gpu=gpu, seed=args.seed)
    try:
        cases = pcases.filter_grid(grid, pattern=args.pattern, ops=args.op, names=args.cases)
    except ValueError as e:
        err_console.print(str(e), style="red", markup=False, highlight=False)
        return 2
    if not cases:
        given = [f"--case {' --case '.join(args.cases)}" if args.cases else "",
                 f"-k {args.pattern}" if args.pattern else "",
                 f"--op {','.join(args.op)}" if args.op else ""]
        err_console.print(f"no case of this grid matches {' '.join(g for g in given if g)} (--list "
                          f"shows the grid)", style="red", markup=False, highlight=False)
        return 2
    if args.list:
        for c in cases:
            console.print(f"{c.name}  [{c.op}]", markup=False, highlight=False)
        return 0

    sizes = pcases.sizes_for(args.mode, gpu)
    where = "GPU" if gpu else "CPU interpreter"
    err_console.print(f"parity: {len(cases)} cases x {len(selected)} paths ({', '.join(r.key for r in selected)}), "
                      f"mode {args.mode}, {where}, seed {args.seed}", highlight=False)
    t0 = time.perf_counter()
    show_bar = not args.no_progress and err_console.is_terminal
    deadline = None if args.budget_s is None else t0 + args.budget_s
    if args.jobs > 1:
        rows = _run_jobs(args, args.jobs, len(cases), err_console, show=not args.no_progress,
                         deadline=deadline)
    elif show_bar:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
                      transient=True) as progress:
            rows = run_suite(cases, selected, seed=args.seed, mode=args.mode, repeat=sizes.repeat,
                             progress=progress, deadline=deadline)
    else:
        log = None if args.no_progress else (lambda s: err_console.print(s, markup=False, highlight=False))
        rows = run_suite(cases, selected, seed=args.seed, mode=args.mode, repeat=sizes.repeat, log=log,
                         deadline=deadline)
    ran = {(r.case, r.op) for r in rows}     # every case that ran has a row per path
    not_run = [i for i, c in enumerate(cases) if (c.name, c.op) not in ran]
    seconds = time.perf_counter() - t0

    if args.strict:
        for r in rows:
            if r.status == "unavailable":
                r.status, r.message = "fail", f"--strict: path unavailable: {r.message}"
            if r.rerun and " --strict" not in r.rerun:
                r.rerun += " --strict"              # rerun what failed, under the same rule
    report.render(console, rows, [r.key for r in selected], seconds=seconds,
                  show_all=not args.failures_only)
    if not_run:
        err_console.print(f"--budget-s {args.budget_s}: {len(not_run)} of {len(cases)} cases did not "
                          f"run (first: {cases[not_run[0]].name} [{cases[not_run[0]].op}])",
                          style="yellow", markup=False, highlight=False)
    if args.json_path:
        info = report.machine_info(gpu)
        paths = {}
        for r in selected:
            why = _runners.import_status(r)
            paths[r.key] = "available" if not why else f"unavailable: {why}"
        report.write_json(args.json_path, info=info, command=_command_line(argv), rows=rows,
                          extra={"mode": args.mode, "seed": args.seed, "interpret": not gpu,
                                 "seconds": round(seconds, 2), "paths": paths,
                                 "budget_s": args.budget_s,
                                 "not_run": [{"case": cases[i].name, "op": cases[i].op}
                                             for i in not_run]})
        console.print(f"wrote {args.json_path}", highlight=False)
    if any(r.failed for r in rows):
        return 1
    return 3 if not_run else 0


if __name__ == "__main__":
    sys.exit(main())
