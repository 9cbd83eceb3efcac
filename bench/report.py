"""Result files of a bench run: the JSON (SPEC "Result files"), the table, the roofline plot and
the dispatch table entries."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from kernels import dispatch
from kernels.registry import AUTO, REGISTRY as OP_REGISTRY

ROW_KEYS = ("op", "backend", "path", "preset", "B", "N", "H", "L", "K", "P", "kv_format",
            "table_len", "tp", "median_us", "p20_us", "p80_us", "bytes", "flops", "floor_us",
            "frac_floor")


def write_json(path: Path, meta: dict, rows: list[dict]) -> Path:
    """``{gpu, compute_capability, versions, date, command, ..., rows}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = _finite(dict(meta, rows=rows))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=_jsonable, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def _finite(x):
    """Strict JSON: non-finite floats (a failed check's worst error) become strings."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict], meta: dict, console=None) -> None:
    """The end-of-run table (rich), one line per row."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=200)
    title = (f"{meta['gpu']} (cc {meta['compute_capability']})  {meta['date']}"
             + ("  [DRY RUN: timings meaningless]" if meta.get("dry_run") else ""))
    t = Table(title=title, show_lines=False)
    for c in ("op", "preset", "B", "N", "H", "L", "K", "kv", "backend", "path", "median us",
              "p20-p80", "topk us", "GB/s", "TFLOP/s", "floor us", "frac", "check"):
        t.add_column(c, justify="right" if c in ("B", "N", "H", "L", "K", "median us", "topk us",
                                                 "GB/s", "TFLOP/s", "floor us", "frac") else "left")
    for r in rows:
        status = r.get("status", "")
        t.add_row(r["op"].replace("sparse_mla_decode", "mla").replace("dsa_decode_step", "step")
                  .replace("dsa_decode_layer", "layer"),
                  r["preset"], str(r["B"]), str(r["N"]), str(r["H"]), str(r["L"]), str(r["K"]),
                  r["kv_format"], r["backend"], r["path"], _fmt(r["median_us"], ".1f"),
                  "-" if r["median_us"] is None else f"{r['p20_us']:.1f}-{r['p80_us']:.1f}",
                  _fmt(r.get("topk_us"), ".1f"), _fmt(r.get("GB_per_s"), ".0f"), _fmt(r.get("TFLOP_per_s"), ".1f"),
                  _fmt(r["floor_us"], ".1f"), _fmt(r["frac_floor"], ".2f"),
                  "ok" if status == "ok" else status[:60])
    console.print(t)
    console.print(f"command: {meta['command']}")


def plot(path: Path, meta: dict, rows: list[dict], machine: dict) -> Path | None:
    """Roofline plot: achieved TFLOP/s against arithmetic intensity (FLOP/byte), the measured
    copy-bandwidth and matmul roofs, one marker per row (colour = path, shape = op)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw, peak = machine["copy_bytes_per_s"], machine["matmul_flops_per_s"]
    fig, ax = plt.subplots(figsize=(9, 6.5))
    xs = [10 ** (i / 20) for i in range(-20, 101)]
    ax.plot(xs, [min(bw * x, peak) / 1e12 for x in xs], "k-", lw=1.5,
            label=f"roof: {bw / 1e12:.2f} TB/s copy, {peak / 1e12:.0f} TFLOP/s bf16")
    colors = {"triton": "tab:blue", "torch": "tab:orange", "pallas": "tab:green", "xla": "tab:red",
              AUTO: "tab:purple"}
    markers = {"sparse_mla_decode": "o", "indexer_topk": "s", "dsa_decode_step": "^", "dsa_decode_layer": "D"}
    seen = set()
    for r in rows:
        if not r.get("median_us") or not r.get("bytes"):
            continue
        ai = r["flops"] / r["bytes"]
        perf = r["flops"] / (r["median_us"] * 1e-6) / 1e12
        key = (r["op"], r["backend"], r["path"])
        ax.scatter([ai], [perf], c=colors.get(r["path"], "gray"), marker=markers.get(r["op"], "x"),
                   s=36, alpha=0.8, label=f"{r['op']} {r['backend']}/{r['path']}" if key not in seen else None)
        seen.add(key)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte that must move)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    dry = "  [DRY RUN: CPU interpreter, timings meaningless]" if meta.get("dry_run") else ""
    ax.set_title(f"DSA decode roofline: {meta['gpu']} (cc {meta['compute_capability']}){dry}", fontsize=10)
    vers = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
    fig.text(0.01, 0.01, f"{meta['date']}  |  {vers}\n$ {meta['command']}", fontsize=6, va="bottom")
    fig.subplots_adjust(bottom=0.16)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- dispatch

def row_bucket(r: dict) -> dict | None:
    """The dispatch bucket of a result row (the same keys the launchers pass)."""
    if r["op"] == "sparse_mla_decode":
        return dispatch.bucket("sparse_mla_decode", B=r["B"], N=r["N"], H=r["H"], K=r["K"],
                               d_qk=r["d_qk"], kv_format=r["kv_format"])
    if r["op"] == "indexer_topk":
        # the launchers bucket L by the block table's capacity W (the actual lengths live on the
        # device and are not read back under jit / CUDA graphs)
        return dispatch.bucket("indexer_topk", B=r["B"], N=r["N"], L=r["table_len"], topk=r["K"])
    return None


def dispatch_entries(rows: list[dict], gpu: str) -> list[dict]:
    """Fastest checked path per (op, backend, bucket), with the config it ran.

    Rows of one bucket (e.g. several L for sparse MLA, whose bucket has no L) are compared on
    the shapes every candidate path measured: the winner has the smallest geometric mean of
    median_us over them. The entry carries the config of the winner's fastest checked row (the
    config that row's call ran, ``kernels.registry.Plan.config``; ``{}`` for a plain path) and
    every candidate's geometric-mean time. ``auto`` rows are not candidates (auto is what the
    table steers).
    """
    groups: dict = defaultdict(lambda: defaultdict(dict))      # key -> path -> shape -> row
    for r in rows:
        if r.get("status") != "ok" or not r.get("median_us") or r.get("path") == AUTO:
            continue
        bkt = row_bucket(r)
        if bkt is None:
            continue
        key = (r["op"], r["backend"], json.dumps(bkt, sort_keys=True))
        shape_key = (r["preset"], r["L"], r["table_len"], r["tp"])
        groups[key][r["path"]][shape_key] = r
    entries = []
    for (op, backend, bkt_s), by_path in sorted(groups.items()):
        common = set.intersection(*(set(v) for v in by_path.values()))
        score = {}
        for path, by_shape in by_path.items():
            use = common if common else set(by_shape)
            score[path] = math.exp(sum(math.log(by_shape[s]["median_us"]) for s in use) / len(use))
        best = min(score, key=score.get)
        rep = min(by_path[best].values(), key=lambda r: r["median_us"])
        config = rep.get("config")
        if config is None and OP_REGISTRY.is_plain(backend, best):
            config = {}                                 # an adapter that reports none
        entries.append({"op": op, "backend": backend, "bucket": json.loads(bkt_s), "path": best,
                        "config": config, "gpu": gpu,
                        "median_us": {p: round(v, 3) for p, v in sorted(score.items())}})
    return entries


def auto_vs_fastest(rows: list[dict]) -> list[dict]:
    """For every checked ``auto`` row, the fastest checked row of the same backend and shape in
    the same run: ``{op, backend, preset, B, N, H, L, K, kv_format, table_len, tp, auto_path,
    auto_config, auto_us, fastest_path, fastest_config, fastest_us, agrees}`` (``agrees``: auto
    ran the fastest row's path and config). Timing noise between rows, and buckets that span
    several shapes, can make a disagreement legitimate; the list says where to look."""
    shape_keys = ("op", "preset", "B", "N", "H", "L", "K", "kv_format", "table_len", "tp")
    ok = [r for r in rows if r.get("status") == "ok" and r.get("median_us")]
    out = []
    for a in ok:
        if a.get("path") != AUTO:
            continue
        same = [r for r in ok if r.get("path") != AUTO and r["backend"] == a["backend"]
                and all(r.get(k) == a.get(k) for k in shape_keys)]
        if not same:
            continue
        f = min(same, key=lambda r: r["median_us"])
        out.append({**{k: a.get(k) for k in shape_keys}, "backend": a["backend"],
                    "auto_path": a.get("auto_path"), "auto_config": a.get("config"),
                    "auto_us": a["median_us"], "fastest_path": f["path"],
                    "fastest_config": f.get("config"), "fastest_us": f["median_us"],
                    "agrees": (a.get("auto_path"), a.get("config")) == (f["path"], f.get("config"))})
    return out
