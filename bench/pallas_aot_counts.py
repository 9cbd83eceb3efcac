"""Count the Pallas sparse-MLA split kernel without a GPU: lower it for CUDA through jax's Triton
lowering (abstract shapes, nothing allocated), compile the Triton IR for ``sm_<cc>`` and report
registers, stack (spill) bytes, shared memory and the SASS of the hot loop per warp per iteration
(instruction classes from ``cuobjdump -sass``, the largest backward-branch range).

    PYTHONPATH=. python -m bench.pallas_aot_counts                 # the issue's rows
    PYTHONPATH=. python -m bench.pallas_aot_counts --row b64h128 --block-h 64 --stages 2
    PYTHONPATH=. python -m bench.pallas_aot_counts --topk                  # the indexer's top-k

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


def topk_report(cc: int = 90, *, B: int = 1, W: int = 131072, K: int = 2048) -> list[str]:
    """The four Pallas top-k kernels (``kernels.indexer.pallas.launch_topk_select``: prune,
    count, compact, select) lowered for one row set of width W, compiled for ``sm_<cc>``: shared
    memory, ``BAR.SYNC`` in the whole kernel, and the SASS of its largest loop."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from _pallas_aot import compile_ttir, lower_pallas_ttir
    from kernels.indexer import pallas as pk
    cfg = pk.PallasIndexerConfig()
    args = (jax.ShapeDtypeStruct((B, 1, W), jnp.float32),
            jax.ShapeDtypeStruct((B, 1, pk.group_max_width(W, cfg.block)), jnp.int32),
            jax.ShapeDtypeStruct((B, 1), jnp.int32))
    mods = lower_pallas_ttir(lambda x, g, ln: pk.launch_topk_select(
        x, g, ln, K, num_rows=1, cfg=cfg, interpret=False), args)
    out = []
    for name, ttir in zip(("prune", "count", "compact", "select"), mods):
        k = compile_ttir(ttir, cc, num_warps=cfg.topk_num_warps, num_stages=1)
        resline, ops, n = sass_counts(k.asm["cubin"])
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
            fh.write(k.asm["cubin"])
        sass = subprocess.run([os.path.join(_tools(), "cuobjdump"), "-sass", fh.name],
                              capture_output=True, text=True).stdout
        os.unlink(fh.name)
        bars = len(re.findall(r"\bBAR\.SYNC", sass))
        main = collections.Counter({o: c for o, c in ops.items() if "." not in o})
        out.append(f"topk {name} B{B} W{W} K{K} sm_{cc}: {resline} shared {k.metadata.shared}; "
                   f"BAR.SYNC {bars}; largest loop {n} SASS: "
                   + ", ".join(f"{op} {c}" for op, c in main.most_common(8)))
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
    a = ap.parse_args(argv)
    if a.topk:
        for line in topk_report(a.cc):
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
