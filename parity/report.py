"""Result rows, the end-of-run table and the JSON report (docs/SPEC.md "Result files").

JSON, one object per run::

    {"gpu": "NVIDIA H200" | "none (CPU interpreter)", "compute_capability": "9.0" | null,
     "versions": {"python", "numpy", "ml_dtypes", "torch", "triton", "jax", "jaxlib", "cuda",
                  "driver", ...}, "date": ISO-8601 UTC, "command": "python -m parity ...",
     "mode": "default", "seed": 0, "interpret": true, "paths": {"torch/triton": "available" |
     "unavailable: <why>", ...}, "summary": {"rows", "passed", "failed", "unavailable", "seconds"},
     "rows": [{"case", "op", "backend", "path", "against", "status", "passed", "worst_error",
               "tolerance", "ratio", "message", "seconds", "rerun", <shape fields>}, ...]}

``against`` is ``"reference"`` (the float64 reference), ``"repeat"`` (a second call of the same
path must give the same bits) or another path (``"jax/pallas"``: cross-path agreement).
``status`` is ``pass``, ``fail`` (a check failed), ``error`` (the path raised something other
than NotImplementedError: also a failure) or ``unavailable`` (import failure or
NotImplementedError; ``passed`` is null). ``ratio`` = worst error / tolerance at the worst element
(<= 1 passes; 0 for exact checks such as top-k sets); non-finite numbers are written as null.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shlex
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata

STATUSES = ("pass", "fail", "error", "unavailable")
OP_SHORT = {"sparse_mla_decode": "mla", "indexer_logits": "logits", "indexer_topk": "topk",
            "dsa_decode_step": "step", "dsa_decode_layer": "layer"}


@dataclass
class Row:
    """One comparison of one (case, op, path)."""

    case: str
    op: str
    backend: str
    path: str
    against: str
    status: str
    worst_error: float | None = None
    tolerance: float | None = None
    ratio: float | None = None
    message: str = ""
    seconds: float | None = None
    cpu_seconds: float | None = None
    rerun: str = ""
    params: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        return None if self.status == "unavailable" else self.status == "pass"

    @property
    def key(self) -> str:
        return f"{self.backend}/{self.path}"

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "error")

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "params"}
        d["passed"] = self.passed
        for k in ("worst_error", "tolerance", "ratio", "seconds", "cpu_seconds"):
            v = d[k]
            d[k] = None if v is None or not math.isfinite(v) else float(v)
        for k, v in self.params.items():
            d.setdefault(k, v)
        return d


# ============================================================================ environment

def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _nvidia_smi(field_name: str) -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={field_name}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def machine_info(gpu: bool) -> dict:
    """GPU name, compute capability and library versions (frameworks are not imported for it,
    except torch on a GPU machine for the device name and compute capability)."""
    versions = {"python": platform.python_version()}
    for dist in ("numpy", "ml_dtypes", "torch", "triton", "jax", "jaxlib", "jax-cuda12-plugin",
                 "jax-cuda13-plugin", "rich"):
        v = _version(dist)
        if v is not None:
            versions[dist] = v
    name, cc = "none (CPU interpreter)", None
    if gpu:
        name = _nvidia_smi("name") or "unknown NVIDIA GPU"
        cc = _nvidia_smi("compute_cap")
        versions["driver"] = _nvidia_smi("driver_version")
        try:
            import torch
            if torch.cuda.is_available():
                name = torch.cuda.get_device_name(0)
                cc = "%d.%d" % torch.cuda.get_device_capability(0)
                versions["cuda"] = torch.version.cuda
        except Exception:  # noqa: BLE001 - torch missing or broken: keep nvidia-smi's answer
            pass
    return {"gpu": name, "compute_capability": cc, "versions": versions,
            "host": platform.node(), "platform": platform.platform()}


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ============================================================================ CLI argument types
# (shared by ``python -m parity`` and ``python -m bench``)

def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (ArgumentTypeError, a usage error with exit status 2)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def csv_choices(choices):
    """argparse type of a selector flag shared by ``python -m parity`` and ``python -m bench``:
    a comma-separated non-empty subset of ``choices`` -> list (use with ``action="extend"`` so
    ``--backend torch,jax`` and ``--backend torch --backend jax`` select the same)."""
    choices = tuple(choices)

    def parse(s):
        vals = [v.strip() for v in s.split(",") if v.strip()]
        if not vals:                     # '' or ',' would otherwise select everything
            raise argparse.ArgumentTypeError(
                f"expected a non-empty comma-separated subset of {list(choices)}, got {s!r}")
        bad = [v for v in vals if v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated subset of {list(choices)}, got {bad}")
        return vals
    return parse


def selection(values):
    """The flattened, de-duplicated values of an ``action="extend"`` selector (None: all)."""
    return None if values is None else list(dict.fromkeys(values))


# ============================================================================ JSON

def unwritable(target, *, directory: bool = False) -> str | None:
    """Why ``target`` cannot be written, or None when it can.

    ``target`` is a file (``directory=False``) or a directory; missing parent directories are
    fine when the nearest existing one accepts new files (the writers create them). The check
    creates and removes a temporary file there: permission bits alone do not tell (root, /proc,
    read-only mounts).
    """
    import tempfile
    from pathlib import Path
    if str(target) == "":
        return "an empty path"
    t = Path(os.path.abspath(target))
    if directory and t.exists() and not t.is_dir():
        return f"{t} exists and is not a directory"
    if not directory and t.is_dir():
        return f"{t} is a directory"
    anc = t if directory else t.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        return f"{anc} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=anc, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"cannot create files in {anc} ({e.strerror or e})"
    if not directory and t.exists():
        try:
            with open(t, "a"):
                pass
        except OSError as e:
            return f"cannot write {t} ({e.strerror or e})"
    return None


def write_json(path, *, info: dict, command: str, rows: list[Row], extra: dict) -> dict:
    """Write the run's JSON report to ``path`` and return it."""
    doc = {"gpu": info["gpu"], "compute_capability": info["compute_capability"],
           "versions": info["versions"], "date": now_iso(), "command": command, **extra,
           "summary": summarize(rows), "rows": [r.to_json() for r in rows]}
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")
    return doc


def summarize(rows: list[Row]) -> dict:
    s = {k: 0 for k in STATUSES}
    for r in rows:
        s[r.status] += 1
    return {"rows": len(rows), "passed": s["pass"], "failed": s["fail"] + s["error"],
            "errors": s["error"], "unavailable": s["unavailable"],
            "cases": len({(r.case, r.op) for r in rows})}


def rerun_command(case: str, op: str, keys: list[str], seed: int, mode: str, *,
                  strict: bool = False) -> str:
    """The command line that reruns exactly one (case, op) on the given paths (``--case``, an
    exact name: ``-k`` would also run every case whose name contains this one); ``--strict``
    kept when the run had it (an unavailable path is then the failure being rerun)."""
    backends = sorted({k.split("/")[0] for k in keys})
    paths = [k.split("/")[1] for k in keys]
    cmd = ["python", "-m", "parity", "--case", case, "--op", op, "--backend", ",".join(backends),
           "--path", ",".join(dict.fromkeys(paths)), "--seed", str(seed)]
    if mode != "default":
        cmd.append(f"--{mode}")
    if strict:
        cmd.append("--strict")
    return " ".join(shlex.quote(c) for c in cmd)


# ============================================================================ table

def _fmt_ratio(r: Row) -> str:
    if r.ratio is None or not math.isfinite(r.ratio):
        return ""
    return f"{r.ratio:.2g}"


def _cell(r: Row | None) -> str:
    if r is None:
        return "[dim]-[/dim]"
    if r.status == "unavailable":
        return "[dim]n/a[/dim]"
    if r.status == "error":
        return "[bold red]ERROR[/bold red]"
    if r.status == "fail":
        return f"[bold red]FAIL[/bold red] {_fmt_ratio(r)}".rstrip()
    note = "*" if r.message else ""
    return f"[green]ok[/green] {_fmt_ratio(r)}{note}".rstrip()


def render(console, rows: list[Row], keys: list[str], *, seconds: float, show_all: bool = True):
    """Print the case x path table, then every failure with its rerun command, then a summary.

    A cell is ``ok r`` / ``FAIL r`` with r = worst error / tolerance against the reference
    (``*``: passed with a note, e.g. sub-ulp top-k near-ties), ``ERROR`` (the path raised),
    ``n/a`` (unavailable). The ``cross`` column is the worst path-vs-path agreement of the case,
    ``repeat`` whether repeated calls gave identical bits.
    """
    from rich.table import Table
    from rich.text import Text

    by = {}
    order = []
    for r in rows:
        k = (r.case, r.op)
        if k not in by:
            by[k] = {"ref": {}, "cross": [], "repeat": []}
            order.append(k)
        if r.against == "reference":
            by[k]["ref"][r.key] = r
        elif r.against == "repeat":
            by[k]["repeat"].append(r)
        else:
            by[k]["cross"].append(r)
    has_repeat = any(v["repeat"] for v in by.values())
    t = Table(title="parity: worst error / tolerance against the float64 reference "
                    "(ok <= 1; * = passed with a note)", show_lines=False, header_style="bold")
    t.add_column("case", no_wrap=True)
    t.add_column("op", no_wrap=True)
    for k in keys:
        t.add_column(k, justify="left", no_wrap=True)
    t.add_column("cross", justify="left", no_wrap=True)
    if has_repeat:
        t.add_column("repeat", justify="left", no_wrap=True)
    table_rows = []
    for k in order:
        v = by[k]
        fails_here = any(r.failed for r in v["ref"].values()) or any(r.failed for r in v["cross"] + v["repeat"])
        if not show_all and not fails_here:
            continue
        cross = v["cross"]
        if not cross:
            cc = "[dim]-[/dim]"
        elif any(r.failed for r in cross):
            bad = [r for r in cross if r.failed]
            cc = f"[bold red]FAIL[/bold red] {bad[0].key}~{bad[0].against}"
        else:
            worst = max((r.ratio or 0.0) for r in cross)
            cc = f"[green]ok[/green] {worst:.2g}"
        cells = [k[0], OP_SHORT.get(k[1], k[1])] + [_cell(v["ref"].get(p)) for p in keys] + [cc]
        if has_repeat:
            rep = v["repeat"]
            cells.append("[dim]-[/dim]" if not rep else
                         ("[bold red]DIFF[/bold red]" if any(r.failed for r in rep) else "[green]same[/green]"))
        t.add_row(*cells)
        table_rows.append(cells)
    from rich.measure import Measurement
    if Measurement.get(console, console.options.update_width(1 << 16), t).maximum <= console.width:
        console.print(t)
    else:
        # Narrower than the table (COLUMNS=80 with 4 paths): one block per case instead, the
        # name whole on its own line and the cells as "path result" pairs wrapped at spaces,
        # so nothing is cut off with an ellipsis.
        heads = [c.header for c in t.columns]
        console.print(Text(str(t.title), style="bold"))
        for cells in table_rows:
            console.print(Text(f"{cells[0]}  [{cells[1]}]", style="bold"), soft_wrap=True,
                          highlight=False)
            line = Text("   ")
            for h, c in zip(heads[2:], cells[2:]):     # pack whole "path result" pairs per line
                pair = Text.from_markup(f"[dim]{h}[/dim] {c}")
                if line.cell_len > 3 and line.cell_len + 3 + pair.cell_len > console.width:
                    console.print(line, soft_wrap=True, highlight=False)
                    line = Text("   ")
                line.append("   ")
                line.append_text(pair)
            console.print(line, soft_wrap=True, highlight=False)

    failed = [r for r in rows if r.failed]
    if failed:
        console.print(f"\n[bold red]{len(failed)} failing comparisons[/bold red]:")
        for r in failed:
            what = r.key if r.against == "reference" else f"{r.key} vs {r.against}"
            console.print(Text.assemble("  ", (r.status.upper(), "red"),
                                        f" {r.case} [{r.op}] {what}: {r.message}"),
                          highlight=False, soft_wrap=True)
            # one line whatever the width, so it can be copied and pasted as printed
            console.print(f"    rerun: {r.rerun}", markup=False, highlight=False, soft_wrap=True)
    unavailable = {}
    for r in rows:
        if r.status == "unavailable":
            unavailable.setdefault(r.key, {}).setdefault(r.message, 0)
            unavailable[r.key][r.message] += 1
    if unavailable:
        console.print("\n[bold]unavailable[/bold] (not failures):")
        for key, reasons in unavailable.items():
            for msg, n in reasons.items():
                console.print(f"  {key} ({n} cases): {msg[:300]}", markup=False, highlight=False)
    s = summarize(rows)
    colour = "red" if s["failed"] else "green"
    console.print(f"\n[bold {colour}]{s['cases']} cases, {s['rows']} comparisons: {s['passed']} passed, "
                  f"{s['failed']} failed ({s['errors']} errors), {s['unavailable']} unavailable[/bold {colour}]"
                  f" in {seconds:.1f} s")
