"""Apply the kernel picks a GPU sweep supports, by the rules of bench/NOTES.md, to this tree.

    python scripts/apply_picks.py [--dry-run] [--mla sweep_mlasmall.json]
                                  [--idx sweep_idxws.json ...] [--dispatch TABLE]

It edits two switches in place and prints each decision with the numbers behind it:

- ``kernels/sparse_mla/configs.py`` ``GLUON_SH_PICKED``: a cache format joins when, on every
  small-heads sweep shape of that format with at most ``configs.GLUON_SH_PICKED_MAX_HEADS``
  heads, the few-heads Gluon variant the heuristic would launch
  (``configs.gluon_sh_config(H)``, default split count) passed its reference check and its median
  is at least 3 % below the baseline's (the binding's own choice) in the same run.
- ``kernels/indexer/gluon_ws.py`` ``PICKED``: set when, in every given indexer sweep file, every
  shape that has a ``gluon`` row also has a ``gluon_ws`` row with no error, bitwise the same logits
  and the same top-k set as ``gluon``, repeatable, and a logits time no more than 2 % above
  ``gluon``'s.

With ``--dispatch kernels/dispatch/sm_90.json`` it also rewrites that table's torch/triton
entries the picks concern, since a table entry's config shadows the heuristic
(``kernels.registry.Registry.plan``): sparse-MLA entries of a picked format with
``H <= configs.GLUON_SH_PICKED_MAX_HEADS`` get ``configs.gluon_sh_config(H)``; indexer_topk entries
get ``kernel="gluon_ws"`` when it is picked. Each rewritten entry keeps its old ``median_us`` and
says so in ``"edited"``; the table's ``"edits"`` list records the command and the evidence.

Used inside one device call (sweep, then this, then the bench on the picks), so the bench measures
the picks without a second machine start; the same command here applies them to the checkout.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MLA_FORMAT = {"DSV32": "fp8_ds_mla", "DSV4_FLASH": "fp8_model1"}


def mla_picks(path: pathlib.Path) -> tuple[set[str], list[str]]:
    sys.path.insert(0, str(ROOT))
    from kernels.sparse_mla import configs

    rows = json.loads(path.read_text())["rows"]
    by_shape: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_shape.setdefault(r.get("shape_key", r.get("shape", "?")), {})[r.get("variant")] = r
    ok: dict[str, bool] = {}
    why = []
    for key, vs in sorted(by_shape.items()):
        base = vs.get("baseline")
        any_row = next(iter(vs.values()))
        fmt = any_row.get("kv_format") or MLA_FORMAT.get(any_row.get("preset"), "?")
        if int(any_row["H"]) > configs.GLUON_SH_PICKED_MAX_HEADS:
            why.append(f"mla {key} ({fmt}): H {any_row['H']} > "
                       f"{configs.GLUON_SH_PICKED_MAX_HEADS}, not the few-heads kernel's range: "
                       f"not counted")
            continue
        cfg = configs.gluon_sh_config(int(any_row["H"]))
        name = f"gluon_sh_h{cfg.block_h}w{cfg.num_warps}"
        sh = vs.get(name)
        good = (base is not None and sh is not None and base.get("status") == "ok"
                and sh.get("status") == "ok" and sh["median_us"] < 0.97 * base["median_us"])
        why.append(f"mla {key} ({fmt}): baseline {base and base.get('median_us')} us "
                   f"[{base and base.get('status')}], {name} {sh and sh.get('median_us')} us "
                   f"[{sh and sh.get('status')}] -> {'pick' if good else 'keep'}")
        ok[fmt] = ok.get(fmt, True) and good
    return {f for f, g in ok.items() if g}, why


def idx_pick(paths: list[pathlib.Path]) -> tuple[bool, list[str]]:
    why, good, seen = [], True, 0
    for p in paths:
        rows = json.loads(p.read_text())["rows"]
        by_shape: dict[str, dict[str, dict]] = {}
        for r in rows:
            by_shape.setdefault(r["shape"], {})[r["variant"]] = r
        for key, vs in sorted(by_shape.items()):
            g, w = vs.get("gluon"), vs.get("gluon_ws")
            if g is None or g.get("error") or g.get("logits_us") is None:
                why.append(f"idx {p.name} {key}: no gluon row, not counted")
                continue
            seen += 1
            fine = (w is not None and not w.get("error") and w.get("logits_us") is not None
                    and w.get("bitwise_logits_vs_first") and w.get("same_topk_set")
                    and w.get("repeatable") and w["logits_us"] <= 1.02 * g["logits_us"])
            why.append(f"idx {p.name} {key}: gluon {g['logits_us']:.1f} us, gluon_ws "
                       f"{w and w.get('logits_us')} us, exact "
                       f"{w and w.get('bitwise_logits_vs_first')}"
                       f"/{w and w.get('same_topk_set')}, error {w and w.get('error')} -> "
                       f"{'ok' if fine else 'NO'}")
            good = good and fine
    return good and seen > 0, why


def edit_table(path: pathlib.Path, sh_formats: set[str] | None, ws: bool | None, why: list[str],
               dry: bool) -> list[str]:
    """Rewrite the dispatch table's entries the picks concern (module docstring)."""
    import datetime
    sys.path.insert(0, str(ROOT))
    from kernels.sparse_mla import configs

    table = json.loads(path.read_text())
    today = datetime.date.today().isoformat()
    done = []
    for e in table["entries"]:
        if e["backend"] != "torch" or e["path"] != "triton":
            continue
        b = e["bucket"]
        if (e["op"] == "sparse_mla_decode" and sh_formats and b.get("kv_format") in sh_formats
                and b["H"] <= configs.GLUON_SH_PICKED_MAX_HEADS):
            new = configs.gluon_sh_config(b["H"]).to_dict()
        elif e["op"] == "indexer_topk" and ws is not None:
            new = {**e["config"], "kernel": "gluon_ws" if ws else "gluon"}
        else:
            continue
        if new == e["config"]:
            continue
        e["config"] = new
        e["edited"] = (f"{today}: config set by scripts/apply_picks.py (the sweep's pick); "
                       f"median_us is the previous config's")
        done.append(f"{e['op']} {b} -> {new.get('kernel')}")
    if done:
        table.setdefault("edits", []).append({
            "date": today, "command": "python scripts/apply_picks.py " + " ".join(sys.argv[1:]),
            "entries": done, "evidence": why})
        if not dry:
            path.write_text(json.dumps(table, indent=1) + "\n")
    return done


def set_line(path: pathlib.Path, pattern: str, new: str, dry: bool) -> None:
    text = path.read_text()
    out, n = re.subn(pattern, new, text, count=1, flags=re.M)
    if n != 1:
        raise SystemExit(f"{path}: no line matches {pattern!r}")
    if not dry:
        path.write_text(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mla", type=pathlib.Path, default=None)
    ap.add_argument("--idx", type=pathlib.Path, action="append", default=[])
    ap.add_argument("--dispatch", type=pathlib.Path, default=None,
                    help="a dispatch table whose torch/triton entries to bring to the picks")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    fmts, pick, evidence = None, None, []
    if a.mla is not None and a.mla.exists():
        fmts, why = mla_picks(a.mla)
        evidence += why
        print("\n".join(why))
        val = repr(tuple(sorted(fmts)))
        print(f"GLUON_SH_PICKED = {val}")
        set_line(ROOT / "kernels/sparse_mla/configs.py", r"^GLUON_SH_PICKED: tuple = .*$",
                 f"GLUON_SH_PICKED: tuple = {val}", a.dry_run)
    idx = [p for p in a.idx if p.exists()]
    if idx:
        pick, why = idx_pick(idx)
        evidence += why
        print("\n".join(why))
        print(f"gluon_ws.PICKED = {pick}")
        set_line(ROOT / "kernels/indexer/gluon_ws.py", r"^PICKED = (True|False)$",
                 f"PICKED = {pick}", a.dry_run)
    if a.dispatch is not None:
        for line in edit_table(a.dispatch, fmts, pick, evidence, a.dry_run):
            print(f"{a.dispatch}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
