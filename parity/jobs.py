"""Running the parity grid: :func:`run_suite` (every case on every selected runner, in one
process) and :func:`run_shard` (one worker of ``python -m parity --jobs N``). A module of its
own, imported by ``parity.__main__`` and never importing it: spawned workers import their target
by module name, and ``parity.__main__`` runs as ``__main__`` in the parent."""
from __future__ import annotations

import time

from parity import runners as _runners

SELECTION_ARGS = ("backend", "path", "mode", "seed", "pattern", "op", "cases")
"""The parsed ``python -m parity`` options a worker needs to rebuild the selection."""


def run_shard(selection: dict, shard: int, jobs: int) -> list:
    """Run cases ``shard::jobs`` of the grid that ``selection`` (the parsed options named in
    :data:`SELECTION_ARGS`) selects; returns ``[(case_index, rows)]`` (one ``run_suite`` per
    case, so the parent merges rows back in case order)."""
    gpu = _runners.prepare_environment()
    from parity import cases as pcases
    sel = dict(selection)
    selected = _runners.select(sel["backend"], sel["path"])
    cases = pcases.filter_grid(pcases.build_grid(mode=sel["mode"], gpu=gpu, seed=sel["seed"]),
                               pattern=sel["pattern"], ops=sel["op"], names=sel["cases"])
    repeat = pcases.sizes_for(sel["mode"], gpu).repeat
    return [(ci, run_suite([cases[ci]], selected, seed=sel["seed"], mode=sel["mode"],
                           repeat=repeat))
            for ci in range(shard, len(cases), jobs)]


def case_line(k: int, n: int, case_rows, seconds: float, what: str = "") -> str:
    """The per-case progress line (one process and ``--jobs`` print the same)."""
    pc = case_rows[0] if case_rows else None
    bad = [x for x in case_rows if x.failed]
    na = sum(x.status == "unavailable" for x in case_rows)
    name = f"{pc.case} [{pc.op}]" if pc else "?"
    return (f"[{k}/{n}] {name}: " + (f"FAIL ({len(bad)} comparisons)" if bad else "ok")
            + (f", {na} unavailable" if na else "") + f" ({seconds:.1f} s{what})")


def run_suite(cases, selected, *, seed: int, mode: str, repeat: bool, progress=None, log=None,
              deadline: float | None = None):
    """Run every case on every selected runner; returns the list of report.Row. ``deadline``
    (a ``time.perf_counter()`` value): no case starts after it (the rows then hold the cases
    that ran: every case that runs has a row per selected runner)."""
    from parity import cases as _pcases, checks, report

    rows: list[report.Row] = []
    refs = checks.References()
    keys = [r.key for r in selected]
    import_err = {r.key: _runners.import_status(r) for r in selected}
    task = progress.add_task("parity", total=len(cases) * max(1, len(selected))) if progress else None

    for ci, pc in enumerate(cases):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        params = dict(pc.params)
        rerun = lambda ks: report.rerun_command(pc.name, pc.op, ks, seed, mode)  # noqa: E731
        t0 = time.perf_counter()
        try:
            case = pc.build()
            build_err = None
            for k, v in _pcases.built_shape(case).items():     # corner cases: shape known once built
                if params.get(k) is None:
                    params[k] = v
        except Exception as e:  # noqa: BLE001 - a broken generator fails the case, not the run
            case, build_err = None, f"building the case failed: {type(e).__name__}: {e}"
        got, ok = {}, {}
        ref_rows, repeat_rows, cross_rows = [], [], []
        for r in selected:
            if progress:
                progress.update(task, description=f"{pc.name} [{pc.op}] {r.key}")
            row = report.Row(pc.name, pc.op, r.backend, r.path, "reference", "pass",
                             rerun=rerun([r.key]), params=params)
            t1, c1 = time.perf_counter(), time.process_time()
            try:
                if build_err:
                    raise RuntimeError(build_err)
                if import_err[r.key]:
                    raise _runners.Unavailable(import_err[r.key])
                out = r.call(pc.op, case)
                row.seconds, row.cpu_seconds = time.perf_counter() - t1, time.process_time() - c1
                res = checks.against_reference(pc.op, case, out, refs)
                row.status = "pass" if res.passed else "fail"
                row.worst_error, row.tolerance, row.ratio, row.message = (
                    res.worst_error, res.tolerance, res.ratio, res.message)
                got[r.key], ok[r.key] = out, res.passed
                if repeat:
                    again = r.call(pc.op, case)
                    rep = checks.bitwise_equal(out, again)
                    repeat_rows.append(report.Row(pc.name, pc.op, r.backend, r.path, "repeat",
                                                "pass" if rep.passed else "fail", 0.0, 0.0,
                                                0.0 if rep.passed else float("inf"), rep.message,
                                                rerun=rerun([r.key]), params=params))
            except _runners.Unavailable as e:
                row.status, row.message = "unavailable", str(e)
            except Exception as e:  # noqa: BLE001 - any other exception is a failure of the path
                row.status, row.message = "error", f"{type(e).__name__}: {str(e)[:1000]}"
                row.seconds = time.perf_counter() - t1
            ref_rows.append(row)
            if progress:
                progress.advance(task)
        # cross-path agreement, every pair of paths that produced outputs
        ran = [k for k in keys if k in got]
        for i, a in enumerate(ran):
            for b in ran[i + 1:]:
                ra = next(r for r in selected if r.key == a)
                row = report.Row(pc.name, pc.op, ra.backend, ra.path, b, "pass", rerun=rerun([a, b]),
                                 params=params)
                try:
                    res = checks.between_paths(pc.op, case, got[a], got[b], ok[a], ok[b])
                    row.status = "pass" if res.passed else "fail"
                    row.worst_error, row.tolerance, row.ratio, row.message = (
                        res.worst_error, res.tolerance, res.ratio, res.message)
                except Exception as e:  # noqa: BLE001
                    row.status, row.message = "error", f"{type(e).__name__}: {e}"
                cross_rows.append(row)
        case_rows = ref_rows + repeat_rows + cross_rows
        rows.extend(case_rows)
        if log is not None:
            log(case_line(ci + 1, len(cases), case_rows, time.perf_counter() - t0))
        # the next case of the same inputs may reuse them; other references can go
        if ci + 1 >= len(cases) or cases[ci + 1].builder is not pc.builder:
            refs.clear()
    return rows
