"""Times the decode layer's fused preparation kernels (``dsa::prep_q``, ``dsa::prep_x``,
``dsa::rope_out``; ``kernels/layer_prep/triton.py``) alone at the real dimensions of both
presets, and ``prep_q`` at every launch shape in ``CANDIDATES`` (indexer heads and MLA heads a
program, warps); writes JSON.

    python -m bench.prep_sweep --out prep_sweep.json [--preset DSV4_FLASH] [--batch 1 64]
    python -m bench.prep_sweep --dry-run --out /tmp/x.json     # CPU interpreter, plumbing only

Why: in the H200 layer rows (2026-12-05) ``_prep_q_kernel`` took ~8 us at B 1 (V4-Flash: 4 + 16
programs of 4 warps), the largest glue kernel of the V4 B 1 step, latency-bound (one warp a
scheduler; bench/NOTES.md "Layer prep: latency"). This sweep says which launch shape is fastest
and which half (the indexer heads or the MLA heads, ``part="index"`` / ``"mla"``) is the chain.

Each candidate's outputs are first compared with the default config's bit for bit (every head's
math is the same whatever the program's head count: per-row reductions and a per-row dot) and
timed only when equal. Timer: ``bench.timing.time_torch_cuda`` (one CUDA graph of R calls over R
rotated input sets, replayed; median / p20 / p80 us per call; the inputs are ~1-30 MB, so they
stay in L2 as in the layer step, where the GEMM before the kernel has just written them).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np
import torch

from kernels import formats
from kernels import layer_config as lc
from kernels import layer_reference as lref
from kernels.layer_prep import triton as tlp
from torch_impl import _common
from torch_impl import layer as tlayer

CANDIDATES = (tlp.PrepQConfig(16, 4, 4), tlp.PrepQConfig(16, 2, 4), tlp.PrepQConfig(16, 1, 4),
              tlp.PrepQConfig(16, 4, 2), tlp.PrepQConfig(16, 2, 2), tlp.PrepQConfig(16, 1, 2),
              tlp.PrepQConfig(16, 1, 1), tlp.PrepQConfig(16, 8, 4), tlp.PrepQConfig(32, 4, 4),
              tlp.PrepQConfig(16, 4, 8))
"""Launch shapes timed (the first is :data:`kernels.layer_prep.triton.PREP_Q_SPACE`'s today)."""


def _inputs(cfg: lref.LayerConfig, B: int, dt, dev, seed: int):
    """One set of ``prepare_q`` / ``prepare_x`` / ``rope_out`` inputs (N 1, the layer's page
    size and cache layouts, every request at position 32,763: the bench rows' L 32K, so the rope
    angles are as large as there; every new token mapped)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    H, H_I, D_I, r = cfg.num_heads, cfg.index_heads, cfg.index_head_dim, cfg.d_rope
    P, pages_per_req = cfg.page_size, 32768 // cfg.page_size
    num_pages = B * 2               # the block tables cycle over two real pages a request

    def act(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dt).to(dev)

    q_cols = H * (cfg.qk_nope_head_dim + r) if cfg.absorbed else H * cfg.d_qk
    bt = (2 * torch.arange(B, dtype=torch.int32)[:, None]
          + torch.arange(pages_per_req, dtype=torch.int32)[None, :] % 2).to(dev)
    cl = torch.full((B,), P * pages_per_req - 5, dtype=torch.int32).to(dev)
    fmt = cfg.kv_format
    kv = torch.zeros(lc.kv_cache_shape(cfg, fmt, num_pages), device=dev,
                     dtype=dt if fmt == "latent" else torch.uint8)
    kc = torch.zeros(formats.cache_shape("fp8_indexer", num_pages, P, D_I), dtype=torch.uint8, device=dev)
    ones = torch.ones
    return dict(
        iq=act(B, H_I * D_I), w_raw=act(B, H_I, scale=1 / H_I).float(), q=act(B, q_cols),
        q_lat=act(H, B, cfg.kv_lora_rank) if cfg.absorbed else None,
        xq=act(B, cfg.q_lora_rank), xkv=act(B, cfg.d_qk), xk=act(B, D_I), x=act(B, cfg.hidden),
        q_norm=ones(cfg.q_lora_rank, device=dev), kv_norm=ones(cfg.d_qk if not cfg.absorbed else cfg.kv_lora_rank,
                                                                device=dev),
        k_norm_w=ones(D_I, device=dev), k_norm_b=torch.zeros(D_I, device=dev),
        rope_freqs=torch.tensor(lref.rope_freqs(cfg), dtype=torch.float64, device=dev),
        hadamard=torch.tensor(np.sign(lref.hadamard_matrix(D_I)), dtype=dt, device=dev),
        kv_cache=kv, k_cache=kc, block_table=bt, context_lens=cl, attn=act(B, H, cfg.d_qk))


def _q_call(cfg: lref.LayerConfig, a: dict, part: str):
    return lambda: tlayer.prepare_q(
        a["iq"], a["w_raw"], a["q"], a["q_lat"], a["hadamard"], a["rope_freqs"], a["context_lens"], 1,
        heads=cfg.num_heads, index_heads=cfg.index_heads, d_qk=cfg.d_qk,
        qk_nope=cfg.qk_nope_head_dim if cfg.absorbed else 0, scale_fmt="ue8m0", eps=cfg.eps,
        absorbed=cfg.absorbed, q_head_norm=cfg.q_head_norm, path="triton", part=part)


def _x_call(cfg: lref.LayerConfig, a: dict):
    return lambda: tlayer.prepare_x(
        a["xq"], a["xkv"], a["xk"], a["x"], a["q_norm"], a["kv_norm"], a["k_norm_w"], a["k_norm_b"],
        a["rope_freqs"], a["hadamard"], a["kv_cache"], a["k_cache"], a["block_table"], a["context_lens"], 1,
        cfg.kv_format, page_size=cfg.page_size, scale_fmt="ue8m0", eps=cfg.eps, norm_rope=not cfg.absorbed, path="triton")


def _time(calls, dry: bool):
    from bench import timing
    return timing.time_cpu(calls, reps=1) if dry else timing.time_torch_cuda(calls)


def _same(a, b) -> bool:
    return all(torch.equal(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x,
                           y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y) for x, y in zip(a, b))


PREP_Q_OUTPUTS = ("q_mla", "idx_q", "idx_w")


def _differences(a, b) -> dict:
    """Per output of ``prepare_q`` (:data:`PREP_Q_OUTPUTS`) that differs: how many elements and
    the largest absolute difference (the e4m3 ``idx_q`` compared as its float values)."""
    out = {}
    for name, x, y in zip(PREP_Q_OUTPUTS, a, b):
        x, y = x.float(), y.float()
        ne = (x != y) & ~(torch.isnan(x) & torch.isnan(y))
        if bool(ne.any()):
            out[name] = {"elements": int(ne.sum()), "of": x.numel(),
                         "max_abs": float((x - y).abs()[ne].max())}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="prep_sweep.json")
    ap.add_argument("--preset", nargs="+", default=["DSV4_FLASH", "DSV32"], choices=sorted(lref.LAYER_CONFIGS))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--sets", type=int, default=8, help="rotated input sets per graph")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, fp16, 1 set (plumbing only)")
    args = ap.parse_args(argv)
    t0 = time.time()
    from bench.timing import sweep_device
    dry, dev, dt = sweep_device("prep_sweep", args.dry_run)
    sets = 1 if dry else args.sets
    cands = CANDIDATES[:2] if dry else CANDIDATES
    original = tlayer._prep_q_config           # the launcher's own choice (prep_q_heuristic)
    rows = []
    try:
        for preset in args.preset:
            cfg = dataclasses.replace(lref.LAYER_CONFIGS[preset], scale_fmt="ue8m0")
            for B in args.batch:
                ins = [_inputs(cfg, B, dt, dev, seed=s) for s in range(sets)]
                base = dict(preset=preset, B=B, H=cfg.num_heads, H_I=cfg.index_heads)
                tlayer._prep_q_config = original
                want = _q_call(cfg, ins[0], "all")()
                for name, calls in (("prep_x", [_x_call(cfg, a) for a in ins]),) + (
                        (("rope_out", [(lambda a=a: tlayer.rope_out(a["attn"], a["rope_freqs"], a["context_lens"], 1))
                                       for a in ins]),) if cfg.inverse_rope_out else ()):
                    t = _time(calls, dry)
                    rows.append(dict(base, kernel=name, median_us=t.median_us, p20_us=t.p20_us,
                                     p80_us=t.p80_us, timer=t.timer))
                    print(f"{preset} B{B} {name}: {t.median_us:.2f} us", flush=True)
                for c in cands:
                    tlayer._prep_q_config = lambda hi, h, d, c=c: c
                    row = dict(base, kernel="prep_q", config=dataclasses.asdict(c),
                               programs_per_token=-(-cfg.index_heads // c.block_hi) - (-cfg.num_heads // c.block_hm))
                    try:
                        got = _q_call(cfg, ins[0], "all")()
                    except Exception as e:  # noqa: BLE001 - a config that does not compile is a row
                        rows.append(dict(row, error=f"{type(e).__name__}: {str(e)[:300]}"))
                        continue
                    row["equal_to_default"] = _same(got, want)
                    # a launch shape that differs from today's: by how much, and whether it
                    # repeats itself (two of them did not match at V4 B 64 on the H100,
                    # 2026-12-06: bench/NOTES.md "Layer prep kernels alone")
                    row["repeatable"] = _same(_q_call(cfg, ins[0], "all")(), got)
                    if not row["equal_to_default"]:
                        row["differences"] = _differences(got, want)
                    else:
                        for part in ("all", "index", "mla"):
                            t = _time([_q_call(cfg, a, part) for a in ins], dry)
                            row[f"{part}_us"] = t.median_us
                            row[f"{part}_p20_p80_us"] = [t.p20_us, t.p80_us]
                        row["timer"] = t.timer
                    rows.append(row)
                    print(f"{preset} B{B} prep_q {c}: " + " ".join(
                        f"{k}={row[k]:.2f}" for k in ("all_us", "index_us", "mla_us") if k in row)
                        + ("" if row["equal_to_default"] else " NOT EQUAL"), flush=True)
    finally:
        tlayer._prep_q_config = original
    info = _common.device_info(dev)
    out = dict(gpu=info.name, compute_capability=list(info.cc),
               date=time.strftime("%Y-%m-%d"), command="python -m bench.prep_sweep " + " ".join(sys.argv[1:]),
               versions=dict(torch=torch.__version__, triton=__import__("triton").__version__),
               dtype=str(dt), sets=sets, elapsed_s=round(time.time() - t0, 1), rows=rows)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out} ({len(rows)} rows, {out['elapsed_s']} s)")


if __name__ == "__main__":
    main()
