"""Per-GPU dispatch data: which path and kernel config ``path="auto"`` uses for a shape bucket.

``kernels/dispatch/<arch>.json`` (``arch`` = ``"sm_90"``, ``"sm_120"``, ... as
``kernels.hardware.DeviceInfo.arch`` spells it) is written by ``python -m bench
--write-dispatch`` on that GPU and holds::

    {"arch": "sm_90", "gpu": "NVIDIA H200", "compute_capability": "9.0",
     "date": ISO-8601, "command": "python -m bench --quick --write-dispatch",
     "versions": {...},
     "entries": [{"op": "sparse_mla_decode", "backend": "torch",
                  "bucket": {"B": 64, "H": 128, "K": 2048, "N": 1, "d_qk": 576,
                             "kv_format": "fp8_ds_mla"},
                  "path": "triton", "config": {...},
                  "gpu": "NVIDIA H200", "median_us": {"triton": 41.2, "torch": 390.0}}, ...]}

``backend`` and ``path``: a backend of ``kernels.ops`` and one of its paths (torch:
``"triton"``, ``"torch"``; jax: ``"pallas"``, ``"xla"``). ``config`` is the config the winning
row ran (``kernels.registry.Plan.config``: ``{}`` for a plain path, the kernel's launch
parameters as a dict for a kernel path). ``path="auto"`` runs it when it is in the path's space
(``kernels.registry.Registry.accept``), else the path's heuristic; which ops, paths and bucket
keys exist is ``kernels.ops``' decision, what runs ``kernels.registry``'s; this module only
stores and finds entries (it imports ``kernels.ops`` only, the registry imports it).

Lookup (:func:`lookup`) matches an entry when every key of the entry's bucket is present in the
query bucket with the same value (extra query keys are ignored). When no entry matches exactly,
the entry whose power-of-two keys (``B``, ``L``) are nearest in log2 distance, all other keys
equal, is used (so a B=16 call uses the B=8 or B=32 measurement rather than no measurement;
on a tie the smaller bucket);
the registry takes only the path from such an entry and the config from the path's heuristic
at the call's own shape (``kernels.registry.Registry.plan``). A missing file, GPU or bucket
returns None and the caller uses its heuristic.

The directory is this package's folder, or ``$DSA_DISPATCH_DIR`` when set (tests use it;
``python -m bench --dispatch-dir`` only says where the writer writes). A table is read once per
process and path (a lookup costs no file-system call after the first); :func:`write_table` and
:func:`clear_cache` drop the cache.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
from pathlib import Path

from kernels.ops import BACKEND_PATHS, BUCKET_KEYS, KERNEL_PATHS, POW2_KEYS  # noqa: F401 - re-exported
from kernels.ops import bucket as _bucket

_DIR = Path(__file__).resolve().parent
DISPATCH_DIR_ENV = "DSA_DISPATCH_DIR"

_cache: dict[str, dict | None] = {}


def dispatch_dir() -> Path:
    """Folder holding the ``<arch>.json`` tables (``$DSA_DISPATCH_DIR`` overrides)."""
    env = os.environ.get(DISPATCH_DIR_ENV)
    return Path(env) if env else _DIR


def bucket(op: str, **dims) -> dict:
    """Shape bucket of an op call (``kernels.ops.bucket``): the op's bucket keys
    (``kernels.ops.BUCKET_KEYS``; sparse_mla_decode: B, N, H, K, d_qk, kv_format;
    indexer_topk: B, N, L (the block table's capacity in positions), topk; indexer_logits: B,
    N, L), batch and length rounded up to powers of two, the rest exact.

    Raises:
      ValueError: unknown op or a missing bucket key.
    """
    return _bucket(op, **dims)


def clear_cache() -> None:
    """Forget loaded tables (the next lookup re-reads the file)."""
    _cache.clear()


def table_path(arch: str, directory: str | os.PathLike | None = None) -> Path:
    """Path of the table for ``arch`` (``"sm_90"``) in ``directory`` (default :func:`dispatch_dir`)."""
    if not arch or "/" in arch or arch.startswith("."):
        raise ValueError(f"arch: expected a tag like 'sm_90', got {arch!r}")
    return (Path(directory) if directory is not None else dispatch_dir()) / f"{arch}.json"


def load_table(arch: str) -> dict | None:
    """The parsed table for ``arch``, or None when there is none (or it is not valid JSON)."""
    path = table_path(arch)
    key = str(path)
    if key in _cache:
        return _cache[key]
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = None
    _cache[key] = table
    return table


def matches(entry_bkt: dict, query: dict, ignore=()) -> bool:
    """Whether an entry's bucket ``entry_bkt`` matches the query bucket: every key of the
    entry's is in ``query`` with the same value (keys in ``ignore`` excepted)."""
    return all(k in ignore or (k in query and query[k] == v) for k, v in entry_bkt.items())


def _distance(entry_bkt: dict, query: dict) -> float:
    d = 0.0
    for k in POW2_KEYS:
        if k in entry_bkt and k in query:
            d += abs(math.log2(max(1, entry_bkt[k])) - math.log2(max(1, query[k])))
    return d


def lookup(op: str, backend: str, arch: str, bkt: dict, *, nearest: bool = True) -> dict | None:
    """The dispatch entry (``{"path": ..., "config": {...} | None, ...}``) for this op, backend,
    arch and bucket, or None.

    Args:
      op: ``"sparse_mla_decode"``, ``"indexer_topk"`` or ``"indexer_logits"``.
      backend: ``"torch"`` or ``"jax"``.
      arch: ``DeviceInfo.arch`` of the current device (``"sm_90"``; ``"interpreter"`` on CPU).
      bkt: the call's bucket from :func:`bucket`.
      nearest: fall back to the entry nearest in log2(B), log2(L) when none matches exactly.
    """
    table = load_table(arch)
    if not table:
        return None
    cands = [e for e in table.get("entries", ())
             if e.get("op") == op and e.get("backend") == backend and isinstance(e.get("bucket"), dict)]
    for e in cands:
        if matches(e["bucket"], bkt):
            return e
    if not nearest:
        return None
    near = [e for e in cands if matches(e["bucket"], bkt, ignore=POW2_KEYS)]
    if not near:
        return None
    # ties (B 16 between B 2 and B 128) go to the smaller bucket, whatever the table's order
    return min(near, key=lambda e: (_distance(e["bucket"], bkt),
                                    tuple(e["bucket"].get(k, 0) for k in POW2_KEYS)))


def validate_table(table: dict) -> None:
    """Raise ValueError when ``table`` is not a dispatch table this module can read: keys,
    ops and paths of ``kernels.ops``, every entry's ``config`` a dict (``{}`` for plain
    paths)."""
    if not isinstance(table, dict):
        raise ValueError(f"table: expected a JSON object, got {type(table).__name__}")
    for k in ("arch", "gpu", "compute_capability", "entries"):
        if k not in table:
            raise ValueError(f"table: missing key {k!r}")
    for i, e in enumerate(table["entries"]):
        for k in ("op", "backend", "bucket", "path", "config"):
            if k not in e:
                raise ValueError(f"table.entries[{i}]: missing key {k!r}")
        if e["backend"] not in BACKEND_PATHS or e["path"] not in BACKEND_PATHS[e["backend"]]:
            raise ValueError(f"table.entries[{i}]: path {e['path']!r} is no path of backend {e['backend']!r} "
                             f"(expected one of {dict(BACKEND_PATHS)})")
        if e["op"] not in BUCKET_KEYS:
            raise ValueError(f"table.entries[{i}]: op {e['op']!r} not in {tuple(BUCKET_KEYS)}")
        if not isinstance(e["config"], dict):
            raise ValueError(f"table.entries[{i}]: config: expected a dict (the config the entry's "
                             f"path ran, {{}} for a plain path), got {e['config']!r}")
        if e["path"] != KERNEL_PATHS[e["backend"]] and e["config"]:
            raise ValueError(f"table.entries[{i}]: config: a plain path ({e['backend']}/"
                             f"{e['path']}) runs the empty config {{}}, got {e['config']!r}")


def write_table(arch: str, entries: list[dict], *, gpu: str, compute_capability: str,
                command: str, versions: dict | None = None, directory=None,
                merge: bool = True) -> Path:
    """Write ``<directory>/<arch>.json``; with ``merge`` keep existing entries whose (op,
    backend, bucket) the new ones do not replace (a kept entry's null config becomes ``{}``).
    Returns the path written.

    Raises:
      ValueError: the table is not valid (:func:`validate_table`); nothing is written.
    """
    path = table_path(arch, directory)
    old = []
    if merge and path.exists():
        try:
            prev = json.loads(path.read_text())
            old = prev.get("entries", []) if isinstance(prev, dict) else []
        except ValueError:
            old = []
    key = lambda e: (e["op"], e["backend"], json.dumps(e["bucket"], sort_keys=True))  # noqa: E731
    new_keys = {key(e) for e in entries}
    # entries of tables written before every entry carried a config: null -> {} (a plain
    # path's config; a kernel path's heuristic)
    old = [dict(e, config={}) if isinstance(e, dict) and e.get("config") is None else e for e in old]
    merged = [e for e in old if key(e) not in new_keys] + list(entries)
    merged.sort(key=key)
    table = {"arch": arch, "gpu": gpu, "compute_capability": compute_capability,
             "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
             "command": command, "versions": versions or {}, "entries": merged}
    validate_table(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    clear_cache()
    return path
