"""The open issues' targets, evaluated on bench result files: for every target a row of
``python -m bench --targets`` can meet, the row's value, the target, met or missed, and with
``--against`` the same value in an earlier file.

    python -m bench.targets bench/results/bench_h200_targets_torch_20261205.json \\
        bench/results/bench_h200_targets_jax_20261205.json [--against OLDER.json ...] [--json OUT]

The targets are the issues' (issue 15: the decode layer, 16: sparse MLA, 17: indexer + top-k),
written down in :data:`ABSOLUTE` (microseconds for torch/triton rows), :data:`RELATIVE` (one
row against another of the same file set) and :data:`LAYER` (the layer rows' ratios, both
stacks). Rows are matched by ``(op, preset, B, N, H, L, table_len, kv_format)``; a target whose
row is in none of the files is listed as ``absent``. Reads JSON only: no GPU, no kernels.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from bench.grid import K4, K32, K64, K128, M1
from kernels.ops import KERNEL_PATHS

MLA, IDX, LAYER_OP = "sparse_mla_decode", "indexer_topk", "dsa_decode_layer"
TRITON = ("torch", KERNEL_PATHS["torch"])      # (backend, path) of the targets' absolute rows
PALLAS = ("jax", KERNEL_PATHS["jax"])


@dataclass(frozen=True)
class Row:
    """A target row: the bench row's key fields (``table_len`` None: equal to ``L``)."""

    op: str
    preset: str
    B: int
    N: int
    H: int
    L: int
    kv_format: str
    table_len: int | None = None

    def label(self) -> str:
        tl = "" if self.table_len in (None, self.L) else f" in a {self.table_len} table"
        return (f"{self.op.replace('sparse_mla_decode', 'mla').replace('indexer_topk', 'idx')} "
                f"{self.preset} B{self.B} N{self.N} H{self.H} L{self.L}{tl} {self.kv_format}")


def _mla(preset, B, N, H, fmt="fp8_ds_mla"):
    return Row(MLA, preset, B, N, H, K32, fmt)


def _idx(preset, B, N, L, table=None):
    return Row(IDX, preset, B, N, 64, L, "fp8_indexer", table)


# (issue, row, metric, at most): torch/triton rows
ABSOLUTE = [
    (16, _mla("DSV32", 64, 1, 128), "median_us", 125.0),
    (16, _mla("DSV32", 64, 1, 64), "median_us", 100.0),
    (16, _mla("DSV32", 16, 1, 128), "median_us", 55.0),
    (16, _mla("DSV32", 1, 1, 128), "median_us", 21.0),
    (16, _mla("DSV32", 128, 1, 128), "median_us", 240.0),
    (16, _mla("DSV32", 64, 2, 128), "median_us", 240.0),
    (16, _mla("DSV32", 64, 1, 16), "median_us", 30.0),
    (16, _mla("DSV4_FLASH", 64, 1, 64, "fp8_model1"), "median_us", 25.0),
    (16, _mla("DSV4_FLASH", 64, 1, 8, "fp8_model1"), "median_us", 12.0),
    (16, _mla("DSV32", 64, 1, 128, "latent"), "median_us", 130.0),
    (17, _idx("DSV32", 64, 1, K64), "median_us", 180.0),
    (17, _idx("DSV32", 64, 1, K128), "median_us", 340.0),
    (17, _idx("DSV32", 1, 1, K128), "median_us", 25.0),
    (17, _idx("DSV32", 1, 1, K64), "median_us", 20.0),
    (17, _idx("DSV4_FLASH", 64, 1, K4, M1), "median_us", 20.0),
    (17, _idx("DSV4_FLASH", 8, 1, M1), "median_us", 350.0),
    (17, _idx("DSV4_FLASH", 1, 1, M1), "median_us", 45.0),
]
# (issue, row, its reference row, at most row / reference): torch/triton rows
RELATIVE = [
    (17, _idx("DSV32", 64, 2, K64), _idx("DSV32", 64, 1, K64), 1.6),           # N 2 / N 1
    (17, _idx("DSV4_FLASH", 64, 1, K4, M1), _idx("DSV4_FLASH", 64, 1, K4), 1.2),  # work ~ length
]
# jax/pallas against torch/triton, same row: at most (issue 16: 1.25, 17: 1.5)
PALLAS_RATIO = {MLA: (16, 1.25), IDX: (17, 1.5)}
TOPK_US = 25.0           # issue 17: topk_us on every indexer row (torch/triton)
# issue 15, each layer row of both stacks: (metric, bound, "max" or "min")
LAYER = [("glue_frac", 0.15, "max"), ("step_over_phases", 1.15, "max"),
         ("projections_frac_copy", 0.85, "min")]


def _key(r: dict) -> tuple:
    tl = r.get("table_len")
    return (r["op"], r["preset"], int(r["B"]), int(r["N"]), int(r["H"]), int(r["L"]),
            r["kv_format"], None if tl in (None, r["L"]) else int(tl))


def _row_key(row: Row) -> tuple:
    return (row.op, row.preset, row.B, row.N, row.H, row.L, row.kv_format,
            None if row.table_len in (None, row.L) else row.table_len)


def load(paths) -> dict:
    """``{(backend, path): {key: row}}`` of the ``ok`` rows of result files (later files win)."""
    out: dict = {}
    for p in paths:
        doc = json.loads(Path(p).read_text())
        for r in doc.get("rows", []):
            if r.get("status") != "ok" or r.get("median_us") is None:
                continue
            out.setdefault((r["backend"], r["path"]), {})[_key(r)] = r
    return out


def evaluate(rows: dict, before: dict | None = None) -> list[dict]:
    """One line per target: ``{issue, target, stack, metric, value, bound, kind, status,
    before}`` (status ``met`` / ``missed`` / ``absent``)."""
    tri = rows.get(TRITON, {})
    pal = rows.get(PALLAS, {})
    old_tri = (before or {}).get(TRITON, {})
    lines = []

    def add(issue, target, stack, metric, value, bound, kind, old=None):
        if value is None:
            status = "absent"
        else:
            status = "met" if (value <= bound if kind == "max" else value >= bound) else "missed"
        lines.append(dict(issue=issue, target=target, stack=stack, metric=metric, value=value,
                          bound=bound, kind=kind, status=status, before=old))

    for issue, row, metric, bound in ABSOLUTE:
        r, o = tri.get(_row_key(row)), old_tri.get(_row_key(row))
        add(issue, row.label(), "torch/triton", metric, r and r[metric], bound, "max",
            o and o[metric])
    for issue, row, ref, bound in RELATIVE:
        def ratio(src):
            a, b = src.get(_row_key(row)), src.get(_row_key(ref))
            return a["median_us"] / b["median_us"] if a and b else None
        add(issue, f"{row.label()} / {ref.label()}", "torch/triton", "ratio", ratio(tri), bound,
            "max", ratio(old_tri) if before else None)
    for key, r in sorted(tri.items(), key=lambda kv: str(kv[0])):
        if r["op"] == IDX and r.get("topk_us") is not None:
            o = old_tri.get(key)
            add(17, Row(*key).label(), "torch/triton", "topk_us", r["topk_us"], TOPK_US, "max",
                o and o.get("topk_us"))
    for key, r in sorted(pal.items(), key=lambda kv: str(kv[0])):
        if r["op"] in PALLAS_RATIO and key in tri:
            issue, bound = PALLAS_RATIO[r["op"]]
            add(issue, Row(*key).label(), "jax/pallas", "/ torch/triton",
                r["median_us"] / tri[key]["median_us"], bound, "max")
    for (backend, path), src in sorted(rows.items()):
        for key, r in sorted(src.items(), key=lambda kv: str(kv[0])):
            if r["op"] != LAYER_OP:
                continue
            o = (before or {}).get((backend, path), {}).get(key)
            for metric, bound, kind in LAYER:
                add(15, f"layer {r['preset']} B{r['B']} N{r['N']} {r['kv_format']} "
                        f"({r['median_us']:.1f} us)", f"{backend}/{path}", metric,
                    r.get(metric), bound, kind, o and o.get(metric))
    return lines


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def print_report(lines: list[dict], console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    console = console or Console(width=200)
    t = Table(title="issue targets")
    for c in ("issue", "row", "stack", "metric", "value", "target", "status", "before"):
        t.add_column(c, justify="right" if c in ("issue", "value", "target", "before") else "left")
    for ln in lines:
        t.add_row(str(ln["issue"]), ln["target"], ln["stack"], ln["metric"], _fmt(ln["value"]),
                  ("<= " if ln["kind"] == "max" else ">= ") + _fmt(ln["bound"]), ln["status"],
                  _fmt(ln["before"]))
    console.print(t)
    for issue in sorted({ln["issue"] for ln in lines}):
        mine = [ln for ln in lines if ln["issue"] == issue]
        console.print(f"issue {issue}: {sum(ln['status'] == 'met' for ln in mine)} met, "
                      f"{sum(ln['status'] == 'missed' for ln in mine)} missed, "
                      f"{sum(ln['status'] == 'absent' for ln in mine)} absent")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.targets", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="bench result JSON files (torch and / or jax)")
    ap.add_argument("--against", nargs="*", default=[], help="earlier result files to compare with")
    ap.add_argument("--json", default=None, help="also write the lines as JSON here")
    args = ap.parse_args(argv)
    for p in args.results + args.against:
        if not Path(p).is_file():
            ap.error(f"no such result file: {p}")
    lines = evaluate(load(args.results), load(args.against) if args.against else None)
    print_report(lines)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": args.results, "against": args.against,
                                               "lines": lines}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
