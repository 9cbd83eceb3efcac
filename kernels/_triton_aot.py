"""Ahead-of-time compilation of ``@triton.jit`` kernels for a chosen GPU without a GPU.

Used to prove that every launch config a launcher can choose fits the shared memory of each
target (``tests/test_triton_compile.py``): ``triton.compile`` runs the whole pipeline
(TTIR -> TTGIR -> LLVM -> PTX -> cubin with Triton's bundled ptxas) for
``GPUTarget("cuda", cc, 32)`` and reports the static shared memory the kernel needs.

A *launch spec* is ``(module, kernel, signature, constexprs, num_warps, num_stages)``: the kernel
``module:kernel`` with every non-constexpr argument typed in ``signature`` (Triton type strings:
``"*bf16"``, ``"*u8"``, ``"i32"``, ``"fp32"``) and every constexpr given in ``constexprs``.
Pointer arguments, and the integer arguments named in ``divisible``, are compiled as multiples
of 16 (as a real launch specialises them when they are).

``@triton.jit`` returns an interpreter object when ``TRITON_INTERPRET=1``, so compilation must
happen in a process without it: :func:`compile_specs` runs :func:`compile_spec` in a subprocess
with the variable cleared (``python -m kernels._triton_aot`` reads specs as JSON on stdin).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class LaunchSpec:
    """One compile of one kernel: what a launcher would launch, with a readable label."""

    label: str
    module: str                       # "kernels.sparse_mla.triton"
    kernel: str                       # "_sparse_mla_split_kernel"
    signature: dict                   # arg name -> Triton type string (non-constexpr args)
    constexprs: dict                  # arg name -> value (dtype constexprs as "bf16"/"fp16"/...)
    num_warps: int = 4
    num_stages: int = 2
    dtype_constexprs: tuple = field(default=())   # names whose value is a Triton dtype string
    divisible: tuple = field(default=())          # integer args specialised as multiples of 16
    options: dict = field(default_factory=dict)    # extra triton.compile options (maxnreg, ...)


# Per-SM limits: (shared bytes per SM, shared bytes per block, max warps, max CTAs, SMs).
# H200 (sm_90): 228 KiB per SM of which 227 KiB per block; 64 warps (2048 threads), 32 CTAs,
# 132 SMs. sm_120 (RTX PRO 6000 / 5090 class): 100 KiB per SM, 99 KiB per block, 48 warps
# (1536 threads), 24 CTAs; 188 SMs (RTX PRO 6000). The driver reserves 1 KiB per block.
LIMITS = {90: (233_472, 232_448, 64, 32, 132), 120: (102_400, 101_376, 48, 24, 188)}
REGISTERS_PER_SM = 65_536
RESERVED_SMEM = 1024


def occupancy(regs: int | None, shared: int, num_warps: int, cc: int) -> dict:
    """Resident CTAs per SM of one compiled launch on ``sm_<cc>`` (registers allocated per warp
    in units of 256, shared memory plus the 1 KiB the driver reserves per block), with the
    limiting resource. 0 when the block's shared memory exceeds the per-block limit."""
    smem_sm, smem_blk, max_warps, max_ctas, _ = LIMITS[cc]
    if shared > smem_blk:
        return {"ctas": 0, "warps": 0, "limit": "shared per block"}
    per_warp = -(-(regs or 255) * 32 // 256) * 256
    lim = {"registers": REGISTERS_PER_SM // (per_warp * num_warps),
           "shared": smem_sm // (shared + RESERVED_SMEM),
           "warps": max_warps // num_warps, "ctas": max_ctas}
    n = min(lim.values())
    return {"ctas": n, "warps": n * num_warps,
            "limit": "+".join(k for k, v in lim.items() if v == n)}


def add_triton_arg(ap) -> None:
    """The counting tools' ``--triton`` option: the folder holding the Triton to compile with
    (default the GPU image's, which the Makefile unpacks into ``.venv/triton-gpu-image``; ''
    for the installed one). :func:`triton_dir` reads it back."""
    ap.add_argument("--triton", default=str(_ROOT / ".venv" / "triton-gpu-image"),
                    help="folder holding the Triton to compile with (default: the GPU image's, "
                         "unpacked by the Makefile); '' for the installed one")


def triton_dir(value: str | None) -> str | None:
    """``--triton``'s folder when it holds a ``triton`` package, else None (the installed one)."""
    return value if value and Path(value, "triton").exists() else None


def _options(spec: LaunchSpec) -> dict:
    """The ``triton.compile`` options of ``spec``."""
    return {"num_warps": spec.num_warps, "num_stages": spec.num_stages, **spec.options}


def _source(spec: LaunchSpec):
    """``spec``'s kernel as Triton's compile source (an ``ASTSource``; a ``GluonASTSource`` for
    ``@gluon.jit`` kernels): the signature typed, the constexprs bound, pointers and
    ``spec.divisible`` integers marked as multiples of 16.
    Raises:
      RuntimeError: the kernel module was imported under ``TRITON_INTERPRET``.
      ValueError: a kernel argument has neither a type nor a value in ``spec``."""
    import triton
    import triton.language as tl

    mod = importlib.import_module(spec.module)
    fn = getattr(mod, spec.kernel)
    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise RuntimeError(f"{spec.module}.{spec.kernel} is not a compiled JITFunction "
                           f"(TRITON_INTERPRET set when it was imported?)")
    constexprs = {}
    for name, val in spec.constexprs.items():
        constexprs[name] = getattr(tl, val) if name in spec.dtype_constexprs else val
    signature = {}
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in spec.signature:
            signature[name] = spec.signature[name]
            if signature[name].startswith("*") or name in spec.divisible:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            raise ValueError(f"{spec.label}: argument {name!r} of {spec.kernel} has no type or value")
    src_cls = triton.compiler.ASTSource
    if getattr(fn, "is_gluon", lambda: False)():       # @gluon.jit kernels (sm_90 only)
        from triton.experimental.gluon._runtime import GluonASTSource as src_cls
    return src_cls(fn, signature, constexprs, attrs)


def spec_key(spec: LaunchSpec, cc: int) -> str:
    """The key Triton's own kernel cache files a compile of ``spec`` for ``sm_<cc>`` under
    (``triton.runtime.cache.get_cache_key``, sha256 hex): the kernel's source and every
    ``@jit`` function and constexpr global it reaches (``JITFunction.cache_key``), the
    signature, divisibility and constexprs, the Triton version and its source, the backend
    (ptxas version, target), the options and the cache-invalidating environment variables.
    Equal keys mean ``triton.compile`` would return the same binary from its cache; that is
    what :func:`compile_specs_cached` relies on. Not a path: equal in every clone."""
    import hashlib

    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import get_cache_invalidating_env_vars, make_backend
    from triton.runtime.cache import get_cache_key

    src = _source(spec)
    backend = make_backend(GPUTarget("cuda", cc, 32))
    options = backend.parse_options(dict(_options(spec), **src.parse_options()))
    key = get_cache_key(src, backend, options, env_vars=get_cache_invalidating_env_vars())
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def compile_spec(spec: LaunchSpec, cc: int, sass: bool = False) -> dict:
    """Compile ``spec`` for ``sm_<cc>`` in this process (must not be interpreting).

    Returns:
      ``{"label", "cc", "triton" (the compiler's version), "shared" (bytes of shared memory per
      block), "num_warps", "num_stages",
      "registers" (per thread, from ptxas -v, None if a cached compile skipped ptxas),
      "spill_store_bytes"}``; with ``sass`` also ``"sass"`` (:func:`sass_counts` of the cubin:
      opcode counts of the whole kernel and of its largest loop); for a kernel with mbarriers
      ``"mbarrier_inits"`` (``gluon_cluster.mbarrier_inits`` of its PTX, or why not).
    ``DSA_AOT_DUMP_DIR`` set: the PTX and the cubin are also written there (``<label>_sm<cc>``),
    to read a schedule by hand (``cuobjdump -sass``).
    Raises:
      RuntimeError: the kernel module was imported under ``TRITON_INTERPRET``.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    src = _source(spec)
    log = io.StringIO()
    knobs = triton.knobs.nvidia
    old = knobs.dump_ptxas_log
    knobs.dump_ptxas_log = True                       # ptxas -v: registers and spills
    try:
        with contextlib.redirect_stdout(log):
            k = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=_options(spec))
    finally:
        knobs.dump_ptxas_log = old
    text = log.getvalue()
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    spill_ld = re.search(r"(\d+) bytes spill loads", text)
    stack = re.search(r"(\d+) bytes stack frame", text)
    res = {"label": spec.label, "cc": cc, "triton": triton.__version__,
           "shared": int(k.metadata.shared),
           "num_warps": spec.num_warps, "num_stages": spec.num_stages,
           "registers": int(regs.group(1)) if regs else None,
           "spill_store_bytes": int(spill.group(1)) if spill else None,
           "spill_load_bytes": int(spill_ld.group(1)) if spill_ld else None,
           "stack_bytes": int(stack.group(1)) if stack else None}
    if sass:
        res["sass"] = sass_counts(k.asm["cubin"])
    dump = os.environ.get("DSA_AOT_DUMP_DIR")
    if dump:                      # the PTX and cubin, for reading a schedule by hand
        stem = Path(dump) / re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{spec.label}_sm{cc}")
        Path(dump).mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".ptx").write_text(k.asm["ptx"])
        stem.with_suffix(".cubin").write_bytes(k.asm["cubin"])
    if "mbarrier.init" in k.asm["ptx"]:
        from kernels.sparse_mla.gluon_cluster import mbarrier_inits
        try:       # (offset, count) of every mbarrier.init (what gluon_xo's launcher reads)
            res["mbarrier_inits"] = mbarrier_inits(k.asm["ptx"])
        except ValueError as e:
            res["mbarrier_inits"] = f"unreadable: {e}"
    return res


def _cuobjdump() -> str:
    import triton
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


# opcodes whose full mnemonics :func:`block_loops` lists (memory, synchronisation, tensor)
_DETAIL_OPS = ("LDG", "STG", "LDGSTS", "STS", "LDS", "STSM", "LDSM", "F2FP", "HGMMA", "LDL", "STL",
               "BAR", "SYNCS", "ARRIVES")


def block_loops(sass: str) -> list[dict]:
    """The innermost loops of a kernel's SASS (``cuobjdump -sass`` text) spanning more than
    1 KiB of code before its last EXIT, in address order: the block loops of a warp-specialised
    kernel's partitions (the mbarrier retry loops ptxas moves behind the EXIT are excluded).
    Each ``{"range", "total", "ops" (the 20 most frequent opcodes), "memory_sync" (full
    mnemonics of the memory, synchronisation and tensor opcodes)}``, per warp per iteration."""
    import collections
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if not m:
            continue
        body = re.sub(r"^@!?U?P[T0-9]+\s+", "", m.group(2).strip())
        full = body.split()[0]
        op = full.split(".")[0]
        tgt = None
        if op == "BRA":
            t = re.search(r"0x([0-9a-f]+)", body)
            tgt = int(t.group(1), 16) if t else None
        ins.append((int(m.group(1), 16), op, full, tgt))
    last_exit = max((a for a, op, _, _ in ins if op == "EXIT"), default=float("inf"))
    loops = [(t, a) for a, op, _, t in ins
             if op == "BRA" and t is not None and t < a and a - t > 0x400 and a < last_exit]
    inner = [(lo, hi) for lo, hi in loops
             if not any(lo <= l and h <= hi and (l, h) != (lo, hi) for l, h in loops)]
    out = []
    for lo, hi in sorted(inner):
        ops = collections.Counter(op for a, op, _, _ in ins if lo <= a <= hi and op != "NOP")
        det = collections.Counter(f for a, op, f, _ in ins if lo <= a <= hi and op in _DETAIL_OPS)
        out.append({"range": f"{lo:#x}-{hi:#x}", "total": sum(ops.values()),
                    "ops": dict(ops.most_common(20)), "memory_sync": dict(det.most_common())})
    return out


def sass_counts(cubin: bytes) -> dict:
    """Opcode counts of a cubin's SASS (``cuobjdump -sass`` from Triton's bundled tools):
    ``{"total": n, "ops": {opcode: n}, "loop": {"total", "ops"}, "loops": [...]}``, ``loop``
    being the largest backward-branch range (the main loop's body, inner loops included),
    ``loops`` the block loops of :func:`block_loops`. Opcodes are the mnemonic's first
    component (``HGMMA.64x128x16.F32`` -> ``HGMMA``); predicates dropped."""
    import collections
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    ins = []                                            # (address, opcode, branch target)
    for line in text.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if not m:
            continue
        body = re.sub(r"^@!?U?P[T0-9]+\s+", "", m.group(2).strip())
        op = body.split()[0].split(".")[0] if body else "?"
        addr = int(m.group(1), 16)
        target = None
        if op == "BRA":
            t = re.search(r"0x([0-9a-f]+)", body)
            target = int(t.group(1), 16) if t else None
        ins.append((addr, op, target))
    total = collections.Counter(op for _, op, _ in ins if op != "NOP")
    best = None
    for addr, op, target in ins:
        if op == "BRA" and target is not None and target < addr:
            if best is None or addr - target > best[1] - best[0]:
                best = (target, addr)
    loop = collections.Counter()
    if best is not None:
        loop = collections.Counter(op for a, op, _ in ins if best[0] <= a <= best[1] and op != "NOP")
    return {"total": sum(total.values()), "ops": dict(total.most_common()),
            "loop": {"total": sum(loop.values()), "ops": dict(loop.most_common())},
            "loops": block_loops(text)}


def _subprocess_env(triton_path: str | None) -> dict:
    """The compiling subprocesses' environment: this one's without ``TRITON_INTERPRET``, with
    ``triton_path`` (when given) and the repository first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        ([triton_path] if triton_path else []) + [str(_ROOT)] + [env.get("PYTHONPATH", "")])
    return env


def compile_specs(specs: list[LaunchSpec], ccs: tuple[int, ...], timeout: float = 1200,
                  workers: int | None = None, sass: bool = False,
                  triton_path: str | None = None, *, keys: bool = False,
                  always_compile: bool = False) -> list[dict]:
    """Compile every spec for every ``cc`` in subprocesses without ``TRITON_INTERPRET``.

    ``triton_path``: a folder holding another ``triton`` package (e.g. the GPU image's version,
    unpacked by the Makefile into ``.venv/triton-gpu-image``), put first on the subprocesses'
    ``PYTHONPATH`` so they compile with it; default the installed Triton.

    The specs are dealt round-robin to ``workers`` processes (default: the CPUs this process may
    use, at most 8) that compile concurrently; ptxas is single-threaded, so on the 2-core CI
    machine two workers halve the wall time.

    ``keys``: compute each spec's :func:`spec_key` instead of compiling (``{"label", "cc",
    "key"}``; one import of the kernels, milliseconds a spec). ``always_compile``: bypass
    Triton's on-disk cache (``TRITON_ALWAYS_COMPILE=1``), so ptxas runs and reports registers.

    Returns one result dict per (spec, cc), in the order of ``specs`` then ``ccs`` (see
    :func:`compile_spec`); a failed compile gives ``{"label", "cc", "error": message}`` instead
    of ``"shared"``.
    Raises:
      RuntimeError: a worker process failed (its stderr tail is in the message).
    """
    # Specs that differ only in their label are one compile: compile the first, copy its result.
    first = {}
    for i, s in enumerate(specs):
        first.setdefault(json.dumps({**asdict(s), "label": ""}, sort_keys=True, default=str), i)
    uniq = sorted(set(first.values()))
    if len(uniq) < len(specs):
        res = compile_specs([specs[i] for i in uniq], ccs, timeout, workers, sass, triton_path,
                            keys=keys, always_compile=always_compile)
        by_key = {k: res[j * len(ccs): (j + 1) * len(ccs)]
                  for j, k in enumerate(sorted(first, key=first.get))}
        return [{**r, "label": s.label} for s in specs
                for r in by_key[json.dumps({**asdict(s), "label": ""}, sort_keys=True, default=str)]]
    if workers is None:
        workers = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else (os.cpu_count() or 1))
    workers = max(1, min(workers, len(specs)))
    env = _subprocess_env(triton_path)
    if always_compile:
        env["TRITON_ALWAYS_COMPILE"] = "1"
    shares = [list(range(w, len(specs), workers)) for w in range(workers)]

    def run(share: list[int]) -> list[dict]:
        payload = json.dumps({"ccs": list(ccs), "sass": sass, "keys": keys,
                              "specs": [asdict(specs[i]) for i in share]})
        proc = subprocess.run([sys.executable, "-m", "kernels._triton_aot"], input=payload,
                              capture_output=True, text=True, env=env, cwd=str(_ROOT),
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"AOT compile subprocess failed ({proc.returncode}):\n"
                               f"{proc.stderr[-4000:]}")
        return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"label"')]

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        outputs = list(pool.map(run, shares))
    by_spec = {}
    for share, results in zip(shares, outputs):
        for j, i in enumerate(share):
            by_spec[i] = results[j * len(ccs): (j + 1) * len(ccs)]
    return [r for i in range(len(specs)) for r in by_spec.get(i, [])]


# The fields of a compile result that :func:`compile_specs_cached` records (the rest, label, cc,
# num_warps and num_stages, come from the spec).
CACHED_FIELDS = ("triton", "shared", "registers", "spill_store_bytes", "spill_load_bytes",
                 "stack_bytes")

# Environment variables that change what Triton builds without changing its cache key (a kernel
# replaced from a folder, instrumentation, non-constexpr globals read as constants): with any of
# them set, :func:`compile_specs_cached` neither reads nor writes the record.
RECORD_UNSAFE_ENV = ("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS", "TRITON_KERNEL_OVERRIDE",
                     "TRITON_OVERRIDE_DIR", "TRITON_INSTRUMENTATION_MODE")


def kernels_tree_digest() -> str:
    """sha256 of every ``*.py`` file under ``kernels/`` (relative path and bytes, sorted): part
    of every record key (:func:`compile_specs_cached`). Triton's key covers what a kernel names
    directly (its source, the ``@jit`` functions it calls, constexpr globals), not values it
    reaches otherwise (a constant read through a module attribute, a dtype global, a global as a
    helper's default argument); any change under ``kernels/`` changes this digest, so a record
    written before it is not read."""
    import hashlib
    h = hashlib.sha256()
    base = _ROOT / "kernels"
    for f in sorted(base.rglob("*.py")):
        h.update(str(f.relative_to(base)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _record_unsafe_env() -> list[str]:
    return [v for v in RECORD_UNSAFE_ENV if os.environ.get(v, "") not in ("", "0")]


def compile_specs_cached(specs: list[LaunchSpec], ccs: tuple[int, ...], record: Path,
                         triton_path: str | None = None, *, write: bool = False,
                         timeout: float = 1200) -> tuple[list[dict], dict]:
    """:func:`compile_specs` with a record of earlier compiles: a spec whose record key is in
    ``record`` takes the recorded result; every other spec is compiled. The record key is the
    sha256 of :func:`spec_key` (Triton's own cache key: the kernel's source and the ``@jit``
    functions and constexpr globals it names, the signature and constexprs, the Triton version
    and source, ptxas, the options, the cache-invalidating environment variables: the key under
    which ``triton.compile`` itself would return the earlier binary) and of
    :func:`kernels_tree_digest` (every file under ``kernels/``, which covers the values a kernel
    reaches that Triton's key does not). So any change under ``kernels/``, to a config or to the
    compiler makes every spec compile until the record is rewritten; with one of
    :data:`RECORD_UNSAFE_ENV` set the record is neither read nor written.

    ``record``: a JSON file ``{"about", "entries": {key: {label, cc, triton, shared,
    registers, spill_store_bytes, spill_load_bytes, stack_bytes}}}`` (absent: every spec is
    compiled). ``write``: compile every spec (bypassing Triton's on-disk cache, so ptxas
    reports registers) and rewrite ``record`` with exactly these specs' entries.

    Returns ``(results, stats)``: the results as :func:`compile_specs` orders them, each with
    ``"key"`` and ``"cached"`` (True: from the record); ``stats`` ``{"specs", "recorded",
    "compiled", "bypassed"}`` (results counted; ``bypassed``: the unsafe variables set, else
    ``[]``).
    Raises:
      RuntimeError: a subprocess failed (as :func:`compile_specs`).
      ValueError: ``record`` exists but is not such a file (named, with how to rewrite it)."""
    import hashlib
    bypassed = _record_unsafe_env()
    if bypassed:
        write = False
    keyed = compile_specs(specs, ccs, timeout, workers=1, triton_path=triton_path, keys=True)
    entries = {}
    if record.exists() and not write and not bypassed:
        try:
            entries = json.loads(record.read_text())["entries"]
            if not isinstance(entries, dict):
                raise TypeError(f"'entries' is a {type(entries).__name__}")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{record}: expected a compile record {{'about', 'entries': {{key: result}}}} "
                             f"({type(e).__name__}: {e}); `make aot-record` rewrites it") from None
    n = len(ccs)
    tree = kernels_tree_digest()
    keys = [hashlib.sha256(f"{r['key']}|{tree}".encode()).hexdigest() if r.get("key") else None
            for r in keyed]                          # None: the key failed (the compile says why)
    todo = [i for i in range(len(specs)) if any(keys[i * n + j] not in entries for j in range(n))]
    fresh = compile_specs([specs[i] for i in todo], ccs, timeout, triton_path=triton_path,
                          always_compile=write) if todo else []
    fresh_at = {i: fresh[t * n:(t + 1) * n] for t, i in enumerate(todo)}
    results = []
    for i, spec in enumerate(specs):
        for j, cc in enumerate(ccs):
            key = keys[i * n + j]
            if i in fresh_at:
                results.append({**fresh_at[i][j], "key": key, "cached": False})
            else:
                results.append({**entries[key], "label": spec.label, "cc": cc,
                                "num_warps": spec.num_warps, "num_stages": spec.num_stages,
                                "key": key, "cached": True})
    if write:
        out = {r["key"]: {"label": r["label"], "cc": r["cc"], **{f: r.get(f) for f in CACHED_FIELDS}}
               for r in results if r["key"] is not None and "error" not in r}
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({
            "about": ("Results of earlier AOT compiles (kernels._triton_aot.compile_specs_cached), "
                      "keyed by Triton's own cache key of each launch spec and a digest of every "
                      "file under kernels/; rewritten by `make aot-record`. A spec whose key is "
                      "not here is compiled."),
            "entries": dict(sorted(out.items()))}, indent=1) + "\n")
    stats = {"specs": len(results), "recorded": sum(r["cached"] for r in results),
             "compiled": sum(not r["cached"] for r in results), "bypassed": bypassed}
    return results, stats

def _main() -> None:
    req = json.loads(sys.stdin.read())
    for d in req["specs"]:
        d["dtype_constexprs"] = tuple(d.get("dtype_constexprs", ()))
        d["divisible"] = tuple(d.get("divisible", ()))
        spec = LaunchSpec(**d)
        for cc in req["ccs"]:
            try:
                res = ({"label": spec.label, "cc": cc, "key": spec_key(spec, cc)} if req.get("keys")
                       else compile_spec(spec, cc, sass=bool(req.get("sass"))))
            except Exception as e:  # noqa: BLE001 - reported per spec to the caller
                msg = f"{type(e).__name__}: {e}"
                c = e.__cause__ or e.__context__      # a CompilationError's root cause
                while c is not None:
                    msg += f" <- {type(c).__name__}: {c}"
                    c = c.__cause__ or c.__context__
                if len(msg) > 3000:                    # the head and the root cause
                    msg = msg[:1000] + " ... " + msg[-2000:]
                res = {"label": spec.label, "cc": cc, "error": msg}
            print(json.dumps(res), flush=True)            # one line per result


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("kernels._triton_aot: unset TRITON_INTERPRET to compile for a GPU target")
    _main()
