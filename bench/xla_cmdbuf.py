"""What XLA put into its command buffers (CUDA graphs), from its own log.

Newer XLA forms command buffers after the HLO, on the thunk sequence
(``xla/backends/gpu/runtime/command_buffer_conversion_pass.cc``), so the optimised HLO
(:func:`bench.paths.hlo_command_buffer_summary`) cannot show them. With

    TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_conversion_pass=2

the pass logs, per compiled module, its configuration, every command buffer it creates with the
thunks inside, and the thunks it leaves out with the reason it names. A thunk it leaves out
without a word (a legacy custom call, which that pass's ``IsConvertible`` refuses silently) is
in neither list: a module whose kernels are not all inside a command buffer, and not named
here as left out, has such thunks.

The counts are the pass's log lines: it asks about a thunk again where it walks nested bodies
(while / conditional branches, async regions), so a count can exceed the thunks of that kind.

``python -m bench.xla_cmdbuf LOG [--module SUBSTRING] [--json OUT]``: a summary per module.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

# The messages of command_buffer_conversion_pass.cc (VLOG 1 and 2), after the log prefix.
_MODULE = re.compile(r"Module (\S+) CommandBufferConfig: (.*)$")
# XLA of jax 0.11.2 logs no name: "Creating command buffer thunk with the following thunks: ..."
_CREATE = re.compile(r"Creating command buffer thunk(?: (\S+))? with the following thunks: (.*)$")
_SMALL = re.compile(r"Thunk kind (\S+) is not lowered to command buffer because command size is "
                    r"less than the min graph size")
_NOT_ENABLED = re.compile(r"Thunk kind (\S+) lowering is not enabled by the user for type (\S+)")
_UNSUPPORTED = re.compile(r"Unsupported thunk kind: (\S+)")
_COLLECTIVE = re.compile(r"Collective thunk kind (\S+) is not enabled by the collectives filter")
_NOT_CONVERTIBLE = re.compile(r"(\S+) is not convertible to command buffers because (.*)$")
_SKIPPING = re.compile(r"Skipping (\S+) Command Buffer conversion: (.*)$")
# logged while the configuration is built, before its "Module ... CommandBufferConfig" line
_REMOVED = re.compile(r"Removed command buffer support for (\S+) as it's not supported")


def summarize(text: str) -> dict:
    """``{module: {"config", "removed_commands", "command_buffers": [thunk count, ...],
    "thunks_inside", "left_out": {reason: {thunk kind: count}}}}`` from the pass's log
    ``text``, in the order the modules were compiled. ``removed_commands``: command types the
    pass dropped for this toolkit / driver (logged before the module's own line). Lines before
    the first module line count under ``"?"``. A module compiled twice (two executables of one
    name) keeps both runs' counts together."""
    out: dict[str, dict] = {}
    cur, removed = "?", []

    def mod(name):
        return out.setdefault(name, {"config": "", "removed_commands": [], "command_buffers": [],
                                     "thunks_inside": 0, "left_out": {}})

    def left(reason, kind):
        d = mod(cur)["left_out"].setdefault(reason, {})
        d[kind] = d.get(kind, 0) + 1

    for line in text.splitlines():
        line = line.rstrip("\r")
        if m := _REMOVED.search(line):
            removed.append(m.group(1))
        elif m := _MODULE.search(line):
            cur = m.group(1)
            mod(cur)["config"] = m.group(2).strip()
            mod(cur)["removed_commands"] += removed
            removed = []
        elif m := _CREATE.search(line):
            n = len(m.group(2).split(", ")) if m.group(2) else 0     # unnamed thunks count too
            mod(cur)["command_buffers"].append(n)
            mod(cur)["thunks_inside"] += n
        elif m := _SMALL.search(line):
            left("below the min graph size", m.group(1))
        elif m := _NOT_ENABLED.search(line):
            left(f"type {m.group(2)} not enabled", m.group(1))
        elif m := _UNSUPPORTED.search(line):
            left("kind not supported", m.group(1))
        elif m := _COLLECTIVE.search(line):
            left("not in the collectives filter", m.group(1))
        elif m := _NOT_CONVERTIBLE.search(line):
            left(m.group(2).strip(), m.group(1))
        elif m := _SKIPPING.search(line):
            left(m.group(2).strip(), m.group(1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.xla_cmdbuf", description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="a log written with TF_CPP_VMODULE=command_buffer_conversion_pass=2")
    ap.add_argument("--module", default="", help="only modules whose name holds this")
    ap.add_argument("--json", help="also write the summary as JSON here")
    args = ap.parse_args(argv)
    if args.json is not None:          # checked before the log is read
        from parity.report import unwritable
        why = unwritable(args.json)
        if why:
            ap.error(f"argument --json: expected a writable file, got {args.json!r}: {why}")
    try:
        with open(args.log, errors="replace") as f:
            found = summarize(f.read())
    except OSError as e:
        ap.error(f"log: cannot read {args.log!r}: {e.strerror}")
    summary = {k: v for k, v in found.items() if args.module in k}
    if not found:
        print("no command-buffer conversion lines (was TF_CPP_VMODULE=command_buffer_conversion_pass=2 "
              "set, and TF_CPP_MIN_LOG_LEVEL=0?)", file=sys.stderr)
    elif not summary:
        ap.error(f"argument --module: no module name holds {args.module!r}; the log has "
                 f"{', '.join(found)}")
    for name, s in summary.items():
        left = "; ".join(f"{r}: " + ", ".join(f"{k} x{n}" for k, n in sorted(d.items()))
                         for r, d in sorted(s["left_out"].items())) or "none named"
        gone = f"; commands removed: {', '.join(s['removed_commands'])}" if s["removed_commands"] else ""
        print(f"{name}: {len(s['command_buffers'])} command buffers, {s['thunks_inside']} thunks inside "
              f"(sizes {s['command_buffers']}); left out: {left}{gone}")
    if args.json is not None:
        from pathlib import Path
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
