"""Count the Pallas sparse-MLA split kernel without a GPU: lower it for CUDA through jax's Triton
lowering (abstract shapes, nothing allocated), compile the Triton IR for ``sm_<cc>`` and report
registers, stack (spill) bytes, shared memory and the SASS of the hot loop per warp per iteration
(instruction classes from ``cuobjdump -sass``, the largest backward-branch range).

    PYTHONPATH=. python -m bench.pallas_aot_counts                 # the issue's rows
    PYTHONPATH=. python -m bench.pallas_aot_counts --row b64h128 --block-h 64 --stages 2
    PYTHONPATH=. python -m bench.pallas_aot_counts --topk                  # the indexer's top-k
    PYTHONPATH=. python -m bench.pallas_aot_counts --topk --loops          # ... every loop of each
    git show REV:kernels/indexer/pallas.py > /tmp/pk_rev.py                # an earlier version
    PYTHONPATH=. python -m bench.pallas_aot_counts --topk --loops --module /tmp/pk_rev.py
    PYTHONPATH=. python -m bench.pallas_aot_counts --logits                # its group-max epilogue

bench/NOTES.md ("Sparse MLA, Pallas") has the method and the numbers.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

# (name, kv_format, H, K): the rows (B does not change the compiled kernel)
ROWS = {
    "b64h128": ("fp8_ds_mla", 128, 2048),
    "b64h64": ("fp8_ds_mla", 64, 2048),
    "b64h16": ("fp8_ds_mla", 16, 2048),
    "v4h64": ("fp8_model1", 64, 640),
    "latent_h128": ("latent", 128, 2048),       # bf16 latent cache (not the fp16 fast path)
}


def _tools():
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_row(kv_format: str, H: int, K: int, cfg, cc: int = 90, *, B: int = 64, P: int = 64,
                num_pages: int = 4096, dtype: str = "bfloat16"):
    """``triton.compile`` result of the split kernel (one split, block table, topk_length) for
    abstract inputs of the row's shape."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from _pallas_aot import compile_pallas_for_gpu
    from jax_impl import sparse_mla as jsm
    from kernels import formats as nf
    from kernels.sparse_mla import pallas as pk

    d_qk = 512 if kv_format == "fp8_model1" else 576
    qd = jnp.dtype(dtype)
    if kv_format == "latent":
        kv = jax.ShapeDtypeStruct((num_pages, P, d_qk), qd)
    elif kv_format == "fp8_ds_mla":
        kv = jax.ShapeDtypeStruct((num_pages, P, nf.DS_MLA_BYTES), jnp.uint8)
    else:
        kv = jax.ShapeDtypeStruct((num_pages, nf.model1_page_bytes(P)), jnp.uint8)
    args = (jax.ShapeDtypeStruct((B, 1, H, d_qk), qd), kv,
            jax.ShapeDtypeStruct((B, 1, K), jnp.int32),
            jax.ShapeDtypeStruct((B, (2 * K) // P + 1), jnp.int32),
            jax.ShapeDtypeStruct((B,), jnp.int32), jax.ShapeDtypeStruct((H,), jnp.float32))

    def f(q, kv, idx, bt, tkl, sink):
        return pk.sparse_mla_decode_pallas(
            q, jsm._kv_rows(kv, kv_format, P), idx, jnp.ones((1,), jnp.float32),
            kv_format=kv_format, page_size=P, num_pages=kv.shape[0], block_table=bt,
            topk_length=tkl, attn_sink=sink, block_h=cfg.block_h, block_k=cfg.block_k,
            num_splits=1, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            dot_dtype=jsm._dot_dtype(q.dtype, kv_format, kv.dtype), prefetch=cfg.prefetch,
            interpret=False)

    return compile_pallas_for_gpu(f, args, cc, num_warps=cfg.num_warps,
                                  num_stages=cfg.num_stages)


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)([^;]*);")
_BRA = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")


def _sass_instrs(sass: str):
    """[(address, opcode, operands)] of a ``cuobjdump -sass`` listing."""
    out = []
    for ln in sass.splitlines():
        m = _INSTR.search(ln)
        if m:
            out.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


_REG = re.compile(r"\bR(\d+)\b")
_NO_DEST = {"STG", "STS", "STL", "BAR", "BRA", "EXIT", "RET", "ISETP", "FSETP", "DSETP", "NOP",
            "RED", "ATOM", "WARPSYNC", "BSYNC", "BSSY", "MEMBAR", "DEPBAR", "PLOP3"}


def _regs(operands: str, width: int = 1) -> set[int]:
    out = set()
    for m in _REG.finditer(operands):
        out.update(range(int(m.group(1)), int(m.group(1)) + width))
    return out


def loop_model(body, load_latency: int = 300, short_latency: int = 30) -> tuple[list, int]:
    """A latency model of one loop body (``[(address, opcode, operands)]``) per warp: the
    distance in instructions from each global load (``LDG``) to the first instruction that
    reads its data (wrapping into the next iteration), and the cycles of one iteration in
    steady state when one instruction issues per cycle in order, a global load's data arrives
    ``load_latency`` cycles after it issues, shared-memory loads and shuffles after
    ``short_latency``, everything else at once (so: a lower bound, which counts only the
    waits on loads; the third of three iterations is reported, so data a previous iteration
    loaded counts as such)."""
    n = len(body)

    def dest_and_srcs(op, rest):
        width = 4 if ".128" in rest else 2 if ".64" in rest else 1
        head, _, tail = rest.partition(",")
        if op in _NO_DEST or not tail:
            return set(), _regs(rest)
        return _regs(head, width if op in ("LDG", "LDS", "LDL") else 1), _regs(tail)

    parsed = [(op,) + dest_and_srcs(op, rest) for _, op, rest in body]
    dist = []
    for k, (op, dst, _) in enumerate(parsed):
        if op == "LDG":
            d = None
            for j in list(range(k + 1, n)) + list(range(k)):
                if parsed[j][2] & dst:
                    d = j - k if j > k else n - k + j
                    break
            dist.append(d)
    ready, t, start = {}, 0, 0
    for it in range(3):
        start = t
        for op, dst, srcs in parsed:
            t = max([t + 1] + [ready.get(r, 0) for r in srcs])
            lat = (load_latency if op == "LDG" else
                   short_latency if op in ("LDS", "SHFL", "LDL") else 0)
            for r in dst:
                ready[r] = t + lat
    return dist, t - start


def sass_loops(sass: str, load_latency: int = 300):
    """Every loop of a SASS listing, in address order: ``(start, length, {opcode: count},
    {memory / shuffle / barrier opcode with its modifiers: count}, load-to-use distances,
    modelled cycles per iteration)`` (:func:`loop_model`), a loop being the range
    ``[target, branch]`` of a backward ``BRA``."""
    instrs = _sass_instrs(sass)
    out = []
    for i, (addr, op, rest) in enumerate(instrs):
        m = _BRA.search(op + " " + rest) if op == "BRA" else None
        if m and m.group(1) is not None and int(m.group(1), 16) < addr:
            tgt = int(m.group(1), 16)
            j = next(k for k, ins in enumerate(instrs) if ins[0] >= tgt)
            body = instrs[j:i + 1]
            ops = collections.Counter(o for _, o, _ in body)
            mem = collections.Counter(
                o + (r.split()[0] if r.startswith(".") else "") for _, o, r in body
                if o in ("LDG", "STG", "LDGSTS", "LDL", "STL", "LDS", "STS", "SHFL", "BAR"))
            dist, cycles = loop_model(body, load_latency)
            out.append((tgt, i + 1 - j, ops, mem, dist, cycles))
    return sorted(out, key=lambda t: t[0])


def sass_counts(cubin: bytes):
    """(resources line, {opcode: count} of the hot loop, loop length) from a cubin: the loop is
    the largest range ``[target, branch]`` of a backward ``BRA`` (cuobjdump prints absolute
    targets)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
    tools = _tools()
    res = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", fh.name],
                         capture_output=True, text=True).stdout
    sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", fh.name],
                          capture_output=True, text=True).stdout
    os.unlink(fh.name)
    resline = next((ln.strip() for ln in res.splitlines() if "REG:" in ln), res.strip())
    instrs = []                                     # (address, opcode, operands)
    for ln in sass.splitlines():
        m = _INSTR.search(ln)
        if m:
            instrs.append((int(m.group(1), 16), m.group(2), m.group(3)))
    best = None
    for i, (addr, op, rest) in enumerate(instrs):
        m = _BRA.search(op + " " + rest) if op == "BRA" else None
        if m and m.group(1) is not None:
            tgt = int(m.group(1), 16)
            if tgt < addr:
                j = next(k for k, ins in enumerate(instrs) if ins[0] >= tgt)
                if best is None or i + 1 - j > best[1] - best[0]:
                    best = (j, i + 1)
    if best is None:
        return resline, collections.Counter(), 0
    body = instrs[best[0]:best[1]]
    ops = collections.Counter(op for _, op, _ in body)
    # memory instructions with their width modifiers (LDG.E.U8 vs LDG.E.128, LDGSTS, LDL/STL)
    for _, op, rest in body:
        if op in ("LDG", "LDGSTS", "LDL", "STL", "LDS", "STS"):
            ops[op + rest.split()[0] if rest.startswith(".") else op + "."] += 1
    return resline, ops, best[1] - best[0]


def report(name, cfg, cc=90, top=12):
    import time
    kv_format, H, K = ROWS[name]
    t = time.time()
    k = compile_row(kv_format, H, K, cfg, cc)
    resline, ops, n = sass_counts(k.asm["cubin"])
    main = collections.Counter({o: c for o, c in ops.items() if "." not in o})
    mem = {o: c for o, c in ops.items() if "." in o}
    classes = ", ".join(f"{op} {c}" for op, c in main.most_common(top))
    classes += "; memory: " + ", ".join(f"{op} {c}" for op, c in sorted(mem.items()))
    return (f"{name} {kv_format} H{H} K{K} {cfg.block_h}x{cfg.block_k} {cfg.num_warps}w "
            f"s{cfg.num_stages} pf={int(cfg.prefetch)} sm_{cc}: {resline} shared "
            f"{k.metadata.shared}; loop {n} SASS: {classes} ({time.time() - t:.0f} s)")


def _indexer_module(path: str | None):
    """``kernels.indexer.pallas``, or the module in file ``path`` (an earlier version of it,
    e.g. ``git show REV:kernels/indexer/pallas.py > /tmp/pk_rev.py``; it imports this tree's
    ``kernels`` package for everything else)."""
    if not path:
        from kernels.indexer import pallas as pk
        return pk
    import importlib.util
    spec = importlib.util.spec_from_file_location("_pallas_indexer_alt", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return mod


def _cuobjdump_sass(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
    sass = subprocess.run([os.path.join(_tools(), "cuobjdump"), "-sass", fh.name],
                          capture_output=True, text=True).stdout
    os.unlink(fh.name)
    return sass


def _loop_lines(sass: str, load_latency: int) -> list[str]:
    return [f"    loop @{start:#x}: {n} SASS; "
            + ", ".join(f"{op} {c}" for op, c in ops.most_common(6)) + "; "
            + ", ".join(f"{op} {c}" for op, c in sorted(mem.items()))
            + f"; load-to-use {dist}; ~{cycles} cycles/iteration at {load_latency}-cycle loads"
            for start, n, ops, mem, dist, cycles in sass_loops(sass, load_latency)]


def topk_report(cc: int = 90, *, B: int = 1, W: int = 131072, K: int = 2048,
                module: str | None = None, loops: bool = False,
                warps: int | None = None, load_latency: int = 300) -> list[str]:
    """The four Pallas top-k kernels (``kernels.indexer.pallas.launch_topk_select``: prune,
    count, compact, select) lowered for one row set of width W, compiled for ``sm_<cc>``: shared
    memory, ``BAR.SYNC`` and spill instructions in the whole kernel, and the SASS of its largest
    loop (``loops``: of every loop, with its loads' widths, shuffles and barriers, and
    :func:`loop_model`'s load-to-use distances and cycles at ``load_latency``). ``module``:
    a file holding another version of ``kernels/indexer/pallas.py``; ``warps``: compile with
    this many warps instead of ``topk_num_warps`` (the lowering does not depend on it)."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from _pallas_aot import compile_ttir, lower_pallas_ttir
    pk = _indexer_module(module)
    cfg = pk.PallasIndexerConfig()
    args = (jax.ShapeDtypeStruct((B, 1, W), jnp.float32),
            jax.ShapeDtypeStruct((B, 1, pk.group_max_width(W, cfg.block)), jnp.int32),
            jax.ShapeDtypeStruct((B, 1), jnp.int32))
    mods = lower_pallas_ttir(lambda x, g, ln: pk.launch_topk_select(
        x, g, ln, K, num_rows=1, cfg=cfg, interpret=False), args)
    out = []
    nw = warps or cfg.topk_num_warps
    for name, ttir in zip(("prune", "count", "compact", "select"), mods):
        k = compile_ttir(ttir, cc, num_warps=nw, num_stages=1)
        resline, ops, n = sass_counts(k.asm["cubin"])
        sass = _cuobjdump_sass(k.asm["cubin"])
        bars = len(re.findall(r"\bBAR\.SYNC", sass))
        spill = len(re.findall(r"\b(?:STL|LDL)\b", sass))
        main = collections.Counter({o: c for o, c in ops.items() if "." not in o})
        out.append(f"topk {name} B{B} W{W} K{K} sm_{cc} {nw}w: {resline} shared "
                   f"{k.metadata.shared}; BAR.SYNC {bars}; STL/LDL {spill}; largest loop {n} SASS: "
                   + ", ".join(f"{op} {c}" for op, c in main.most_common(8)))
        if loops:
            out += _loop_lines(sass, load_latency)
    return out


def logits_report(cc: int = 90, *, module: str | None = None, N: int = 1, H: int = 64,
                  D: int = 128, P: int = 64, max_pages: int = 2048) -> list[str]:
    """The Pallas logits kernel (fp8 cache, default config) without and with the group-max
    epilogue (``group_max=True``: the top-k's pruning input), compiled for ``sm_<cc>``: the
    SASS of its page loop per warp per iteration, so the epilogue's cost is the difference."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from _pallas_aot import compile_ttir, lower_pallas_ttir
    pk = _indexer_module(module)
    cfg = pk.PallasIndexerConfig()
    NP, HP = pk._next_pow2(N), max(16, pk._next_pow2(H))
    warps = cfg.num_warps or (8 if NP * HP * cfg.pages * P >= 16384 else 4)
    args = (jax.ShapeDtypeStruct((1, N, H, D), jnp.float8_e4m3fn),
            jax.ShapeDtypeStruct((1, N, H), jnp.float32),
            jax.ShapeDtypeStruct((4096, P * (D + 4)), jnp.uint8),
            jax.ShapeDtypeStruct((1, max_pages), jnp.int32),
            jax.ShapeDtypeStruct((1, N), jnp.int32))
    out = []
    for gm in (False, True):
        ttir = lower_pallas_ttir(lambda q, w, kc, bt, ln: pk.launch_indexer_logits(
            q, w, kc, bt, ln, fp8=True, page_size=P, num_sms=132, cfg=cfg, group_max=gm,
            interpret=False), args)[0]
        k = compile_ttir(ttir, cc, num_warps=warps, num_stages=cfg.num_stages)
        resline, ops, n = sass_counts(k.asm["cubin"])
        main = collections.Counter({o: c for o, c in ops.items() if "." not in o})
        out.append(f"logits N{N} H{H} D{D} P{P} group_max={gm} sm_{cc} {warps}w: {resline}; "
                   f"loop {n} SASS (per {cfg.pages * P} tokens): "
                   + ", ".join(f"{op} {main.get(op, 0)}" for op in
                               ("STG", "BAR", "SHFL", "VIMNMX", "SEL", "ISETP", "FSETP")))
    return out


def main(argv=None):
    from kernels.sparse_mla import configs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", action="append", choices=sorted(ROWS))
    ap.add_argument("--block-h", type=int)
    ap.add_argument("--block-k", type=int, default=32)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=0)
    ap.add_argument("--cc", type=int, default=90)
    ap.add_argument("--topk", action="store_true", help="the indexer's Pallas top-k kernels instead")
    ap.add_argument("--loops", action="store_true", help="--topk: every loop of each kernel")
    ap.add_argument("--topk-warps", type=int, help="--topk: compile with this many warps")
    ap.add_argument("--load-latency", type=int, default=300,
                    help="--loops: global-load latency (cycles) of the loop model")
    ap.add_argument("--logits", action="store_true",
                    help="the indexer's Pallas logits kernel without / with its group-max epilogue")
    ap.add_argument("--module", help="--topk / --logits: a file holding another version of "
                                     "kernels/indexer/pallas.py (git show REV:...)")
    a = ap.parse_args(argv)
    if a.topk or a.logits:
        lines = (topk_report(a.cc, module=a.module, loops=a.loops, warps=a.topk_warps,
                             load_latency=a.load_latency)
                 if a.topk else []) + (logits_report(a.cc, module=a.module) if a.logits else [])
        for line in lines:
            print(line, flush=True)
        return
    for name in a.row or list(ROWS):
        H = ROWS[name][1]
        if a.block_h:
            cfg = configs.SparseMLAConfig(a.block_h, a.block_k, a.warps, a.stages,
                                          bool(a.prefetch))
        else:
            cfg = configs.pallas_sparse_mla_heuristic(        # the sm_90 default at B 64
                H, configs.LARGE_SMEM, rows=64, topk=ROWS[name][2], kv_format=ROWS[name][0])
        print(report(name, cfg, a.cc), flush=True)


if __name__ == "__main__":
    main()
