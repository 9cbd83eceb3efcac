"""Apply the kernel picks a GPU sweep supports, by the rules of bench/NOTES.md, to this tree.

    python scripts/apply_picks.py [--dry-run] [--mla sweep_mlasmall.json]
                                  [--idx sweep_idxws.json ...] [--dispatch TABLE]

It edits three switches in place and prints each decision with the numbers behind it. A
switch's new value is its current one, less the formats the file has evidence against, plus those
it has evidence for (a format with no row in the file keeps its state):

- ``kernels/sparse_mla/configs.py`` ``GLUON_SH_PICKED``: a cache format joins when, on every
  small-heads sweep shape of that format with at most ``configs.GLUON_SH_PICKED_MAX_HEADS``
  heads, the few-heads Gluon variant the heuristic would launch
  (``configs.gluon_sh_config(H)``, default split count) passed its reference check and its median
  is at least 3 % below the baseline's (the binding's own choice) in the same run. Where the
  baseline already runs a few-heads kernel (the format is picked), the format stays picked when
  that variant passed its check (the comparison is then with itself).
- ``configs.GLUON_SHWS_PICKED``: a format joins when, on every sweep shape of that format with at
  most ``configs.GLUON_SHWS_PICKED_MAX_HEADS`` heads, the warp-specialised 8-head variant
  (``gluon_shws_h8``, default split count) passed its check and its median is at least 3 % below
  both the baseline's and the one-partition variant's; where the baseline already runs it, the
  format stays when the variant passed its check and is at most 3 % above the one-partition
  variant. Only formats of ``GLUON_SH_PICKED`` (after its decision) can hold it.
- ``kernels/indexer/gluon_ws.py`` ``PICKED``: set when, in every given indexer sweep file, every
  shape that has a ``gluon`` row also has a ``gluon_ws`` row with no error, bitwise the same logits
  and the same top-k set as ``gluon``, repeatable, and a logits time no more than 2 % above
  ``gluon``'s.

With ``--dispatch kernels/dispatch/sm_90.json`` it also rewrites that table's torch/triton
entries the picks concern, since a table entry's config shadows the heuristic
(``kernels.registry.Registry.plan``): sparse-MLA entries of a picked format with
``H <= configs.GLUON_SH_PICKED_MAX_HEADS`` get ``configs.few_heads_config(H, format)`` (the
warp-specialised 8-head config for the formats of ``GLUON_SHWS_PICKED``, its 16-head config at
9..16 heads for those of ``GLUON_SHWS16_PICKED``, which this script does not decide), and a few-heads entry
of a format no longer picked gets the heuristic's config without those kernels; indexer_topk entries
get ``kernel="gluon_ws"`` when it is picked. Each rewritten entry keeps its old ``median_us`` and
says so in ``"edited"``; the table's ``"edits"`` list records the command and the evidence.

Used inside one device call (sweep, then this, then the bench on the picks), so the bench measures
the picks without a second machine start; the same command here applies them to the checkout.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kernels.sparse_mla import configs  # noqa: E402 - after the repo root is importable


class BadInput(Exception):
    """A sweep or table file this script cannot read (the message names it)."""


def load_rows(path: pathlib.Path) -> list[dict]:
    """The ``rows`` list of a sweep JSON file; :class:`BadInput` naming the file otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise BadInput(f"{path}: cannot read a JSON sweep file ({type(e).__name__}: {e})") from e
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise BadInput(f"{path}: expected a JSON object with a 'rows' list of objects")
    return rows


def _heads(row: dict, where: str) -> int:
    """A row's head count ``H``, a positive integer; ValueError naming the row otherwise."""
    H = row["H"]
    if isinstance(H, bool) or not isinstance(H, int) or H < 1:
        raise ValueError(f"{where}: H must be a positive integer, got {H!r}")
    return H


def _kernel(row: dict | None) -> str | None:
    """The ``kernel`` of a sweep row's config (None: no row, no config)."""
    return ((row or {}).get("config") or {}).get("kernel")


def _merge(current, evidence: dict[str, bool]) -> set[str]:
    """A switch's new formats: ``current``'s, less those with evidence against them, plus those
    with evidence for them (a format the file has no row of keeps its state)."""
    return (set(current) - {f for f, g in evidence.items() if not g}) | \
        {f for f, g in evidence.items() if g}


def _by_shape(path: pathlib.Path) -> dict[str, dict[str, dict]]:
    by_shape: dict[str, dict[str, dict]] = {}
    for r in load_rows(path):
        by_shape.setdefault(r.get("shape_key", r.get("shape", "?")), {})[r.get("variant")] = r
    return by_shape


def mla_picks(path: pathlib.Path, current=None) -> tuple[set[str] | None, list[str]]:
    """The formats to pick (``current``, default ``configs.GLUON_SH_PICKED``, merged with the
    file's evidence: :func:`_merge`) and the evidence lines; None when no row of the file counts
    (then the switch stays as it is)."""
    current = configs.GLUON_SH_PICKED if current is None else current
    ok: dict[str, bool] = {}
    why = []
    for key, vs in sorted(_by_shape(path).items()):
        base = vs.get("baseline")
        any_row = next(iter(vs.values()))
        fmt, H = any_row["kv_format"], _heads(any_row, key)
        if H > configs.GLUON_SH_PICKED_MAX_HEADS:
            why.append(f"mla {key} ({fmt}): H {H} > "
                       f"{configs.GLUON_SH_PICKED_MAX_HEADS}, not the few-heads kernel's range: "
                       f"not counted")
            continue
        cfg = configs.gluon_sh_config(H)
        name = f"gluon_sh_h{cfg.block_h}w{cfg.num_warps}"
        sh = vs.get(name)
        base_kernel = _kernel(base)
        if base_kernel in ("gluon_sh", "gluon_shws"):   # in effect (no Triton baseline): passed
            good = (base.get("status") == "ok" and sh is not None and sh.get("status") == "ok")
        else:
            good = (base is not None and sh is not None and base.get("status") == "ok"
                    and sh.get("status") == "ok" and sh["median_us"] < 0.97 * base["median_us"])
        why.append(f"mla {key} ({fmt}): baseline {base and base.get('median_us')} us "
                   f"[{base and base.get('status')}, {base_kernel}], {name} "
                   f"{sh and sh.get('median_us')} us [{sh and sh.get('status')}] -> "
                   f"{'for' if good else 'against'}")
        ok[fmt] = ok.get(fmt, True) and good
    if not ok:
        return None, why + [f"mla {path.name}: no shape of the few-heads range: no evidence"]
    return _merge(current, ok), why


def mla_shws_picks(path: pathlib.Path, sh_formats=None,
                   current=None) -> tuple[set[str] | None, list[str]]:
    """The formats whose few-heads calls of up to ``configs.GLUON_SHWS_PICKED_MAX_HEADS`` heads
    run the warp-specialised kernel (``current``, default ``configs.GLUON_SHWS_PICKED``, merged
    with the file's evidence, then limited to ``sh_formats``: the few-heads formats picked,
    default ``configs.GLUON_SH_PICKED``), and the evidence lines; None when no row of the file is
    in that range (then the switch stays as it is). Evidence for a format: the variant passed
    and is 3 % below both the baseline and the one-partition variant; where the baseline already
    runs it, the variant passed and is at most 3 % above the one-partition variant (when that
    one passed)."""
    current = configs.GLUON_SHWS_PICKED if current is None else current
    sh_formats = configs.GLUON_SH_PICKED if sh_formats is None else sh_formats
    ok: dict[str, bool] = {}
    why = []
    for key, vs in sorted(_by_shape(path).items()):
        any_row = next(iter(vs.values()))
        fmt, H = any_row["kv_format"], _heads(any_row, key)
        if H > configs.GLUON_SHWS_PICKED_MAX_HEADS:
            continue
        cfg = configs.SPARSE_MLA_GLUON_SHWS8
        ws = vs.get(f"gluon_shws_h{cfg.block_h}")
        sh_cfg = configs.gluon_sh_config(H)
        base, sh = vs.get("baseline"), vs.get(f"gluon_sh_h{sh_cfg.block_h}w{sh_cfg.num_warps}")
        others = [base, sh]
        base_kernel = _kernel(base)
        passed = ws is not None and ws.get("status") == "ok"
        if base_kernel == "gluon_shws":                       # in effect: against gluon_sh
            good = passed and (sh is None or sh.get("status") != "ok"
                               or ws["median_us"] <= 1.03 * sh["median_us"])
        else:
            good = passed and all(o is not None and o.get("status") == "ok"
                                  and ws["median_us"] < 0.97 * o["median_us"] for o in others)
        why.append(f"mla {key} ({fmt}): gluon_shws_h{cfg.block_h} {ws and ws.get('median_us')} us "
                   f"[{ws and ws.get('status')}] against "
                   + ", ".join(f"{o and o.get('variant')} {o and o.get('median_us')} us"
                               for o in others)
                   + f" (baseline runs {base_kernel}) -> {'for' if good else 'against'}")
        ok[fmt] = ok.get(fmt, True) and good
    if not ok:
        return None, why + [f"mla {path.name}: no shape of the warp-specialised few-heads range: "
                            f"no evidence"]
    return _merge(current, ok) & set(sh_formats), why


def idx_pick(paths: list[pathlib.Path]) -> tuple[bool | None, list[str]]:
    """Whether to pick the WS logits kernel, and the evidence lines; None when no shape of the
    files has a ``gluon`` row (then the switch stays as it is)."""
    why, good, seen = [], True, 0
    for p in paths:
        rows = load_rows(p)
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
    if not seen:
        return None, why + ["idx: no shape with a gluon row: no evidence"]
    return good, why


def edit_table(path: pathlib.Path, sh_formats: set[str] | None, ws: bool | None,
               why: list[str], shws_formats: set[str] | None = None) -> tuple[str | None, list[str]]:
    """The dispatch table's text with the entries the picks concern rewritten (module
    docstring), or None when nothing changes, and one line per rewritten entry."""
    try:
        table = json.loads(path.read_text())
        entries = table["entries"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInput(f"{path}: cannot read a dispatch table ({type(e).__name__}: {e})") from e
    today = datetime.date.today().isoformat()
    done = []
    for e in entries:
        if e["backend"] != "torch" or e["path"] != "triton":
            continue
        b = e["bucket"]
        if not isinstance(e["config"], dict):
            raise BadInput(f"{path}: an entry's config is not an object: {e['config']!r}")
        if e["op"] == "sparse_mla_decode":
            _heads(b, f"{path}: sparse_mla_decode entry {b}")
        mla_few = (e["op"] == "sparse_mla_decode" and sh_formats is not None
                   and b["H"] <= configs.GLUON_SH_PICKED_MAX_HEADS)
        if mla_few and b.get("kv_format") in sh_formats:
            shws = configs.GLUON_SHWS_PICKED if shws_formats is None else tuple(shws_formats)
            new = configs.few_heads_config(b["H"], b["kv_format"], shws).to_dict()
        elif mla_few and e["config"].get("kernel") in ("gluon_sh", "gluon_shws"):
            # a format no longer picked: the heuristic's choice without the few-heads kernels
            new = configs.sparse_mla_heuristic(
                b["H"], configs.LARGE_SMEM, rows=b["B"] * b["N"], topk=b["K"], gluon=True,
                gluon_ws=b["kv_format"] in configs.GLUON_WS_PICKED).to_dict()
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
    if not done:
        return None, done
    table.setdefault("edits", []).append({
        "date": today, "command": "python scripts/apply_picks.py " + " ".join(sys.argv[1:]),
        "entries": done, "evidence": why})
    return json.dumps(table, indent=1) + "\n", done


def set_line(path: pathlib.Path, pattern: str, new: str, text: str | None = None) -> str:
    """``path``'s text (or ``text``: an earlier decision's edit of it) with the one line
    matching ``pattern`` replaced by ``new``."""
    text = path.read_text() if text is None else text
    out, n = re.subn(pattern, new, text, count=1, flags=re.M)
    if n != 1:
        raise BadInput(f"{path}: no line matches {pattern!r}")
    return out


def _decide(rule, source: str, evidence: list, writes: dict, name: str, rel: str, pattern: str,
            line) -> object:
    """Run one decision ``rule`` (returning ``(value or None, evidence lines)``), print it, and
    queue the switch's new line (``line(value)`` at ``pattern`` in ``rel``) unless the value is
    None (no evidence). Returns the value."""
    try:
        value, why = rule()
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise BadInput(f"{source}: a row lacks a field or has a bad value "
                       f"({type(e).__name__}: {e})") from e
    evidence += why
    print("\n".join(why))
    if value is None:
        print(f"{name} unchanged (no evidence)")
        return None
    new = line(value)
    print(f"{name} = {new.split(' = ', 1)[1]}")
    writes[ROOT / rel] = set_line(ROOT / rel, pattern, new, writes.get(ROOT / rel))
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mla", type=pathlib.Path, default=None)
    ap.add_argument("--idx", type=pathlib.Path, action="append", default=[])
    ap.add_argument("--dispatch", type=pathlib.Path, default=None,
                    help="a dispatch table whose torch/triton entries to bring to the picks")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    fmts, shws, pick, evidence, writes = None, None, None, [], {}
    try:                                 # every decision first; nothing is written on an error
        for f in [a.mla, *a.idx, a.dispatch]:
            if f is not None and not f.is_file():
                raise BadInput(f"{f}: no such file")
        if a.mla is not None:
            fmts = _decide(lambda: mla_picks(a.mla), str(a.mla), evidence, writes,
                           "GLUON_SH_PICKED", "kernels/sparse_mla/configs.py",
                           r"^GLUON_SH_PICKED: tuple = .*$",
                           lambda v: f"GLUON_SH_PICKED: tuple = {repr(tuple(sorted(v)))}")
            shws = _decide(lambda: mla_shws_picks(a.mla, fmts), str(a.mla), evidence, writes,
                           "GLUON_SHWS_PICKED", "kernels/sparse_mla/configs.py",
                           r"^GLUON_SHWS_PICKED: tuple = .*$",
                           lambda v: f"GLUON_SHWS_PICKED: tuple = {repr(tuple(sorted(v)))}")
        if a.idx:
            pick = _decide(lambda: idx_pick(a.idx), " ".join(map(str, a.idx)), evidence, writes,
                           "gluon_ws.PICKED", "kernels/indexer/gluon_ws.py",
                           r"^PICKED = (True|False)$", lambda v: f"PICKED = {v}")
        if a.dispatch is not None:
            try:
                text, done = edit_table(a.dispatch, fmts, pick, evidence, shws)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise BadInput(f"{a.dispatch}: an entry lacks a field "
                               f"({type(e).__name__}: {e})") from e
            for line in done:
                print(f"{a.dispatch}: {line}")
            if text is not None:
                writes[a.dispatch] = text
    except BadInput as e:
        print(f"apply_picks: {e}; nothing written", file=sys.stderr)
        return 2
    if not a.dry_run:
        for path, text in writes.items():
            path.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
