"""NumPy simulation of the radix top-k's threshold-bucket sizes under its first digits.

    python -m bench.topk_sim [--rows 16] [--json out.json] [--quick] [--pallas]
    python -m bench.topk_sim --targets [--seeds 2]     # every row of the targets' indexer shapes

The Triton top-k (``kernels/topk/triton.py``) picks the threshold among the 256 bins of a first
digit from one histogram, then runs its lower radix levels over the keys of the threshold bin
only (the *candidates*): their number is what the levels cost. This script computes, per row,
the candidates each first digit leaves, on float32 logits computed on the CPU (float32, the
same math as the kernels: ``k_scale * sum_h w_h * relu(q_h . k)`` over dequantised e4m3):

* ``old``: the top 8 bits of the order key (sign + 7 exponent bits: 2 binades per bin), the
  digit before this change.
* ``window``: the one-sided window of 2026-12-01..04, ``clamp((key >> 20) - base, 0, 255)``
  with ``base = (max_key >> 20) - 255``: 1/8-binade bins over the 32 binades below the row max;
  a threshold in bin 0 is a *window miss* (the kernel then descended the full key over bin 0:
  the candidates are that bin, e.g. the whole row when fewer than K values are positive).
* ``window16``: the same at 1/16 binade (``key >> 19``, 16 binades), for comparison only.
* ``two_sided``: the kernel's digit now (``kernels.topk.window``): 1/8-binade bins over the 16
  binades below the row max and the 16 above the row min, one middle bin between them (a
  threshold there is the miss).

``--pallas``: the Pallas top-k's pruning instead (``kernels/indexer/pallas.py``): the candidates
a row keeps are the keys at or above ``tau``, the K-th largest maximum over groups of positions
rounded down to 1/128 binade; a row whose candidates exceed the capacity (``next_pow2(4 K)``)
is selected from the whole row by one program. Compared: ``g16``, a fixed 16-position group
(before 2026-12-05), and ``merged``, the kernel's ``prune_merge`` rule (4-position maxima merged
by 4, 2 or 1 so that at least 2 K groups remain), over prefixes of 4K-128K positions (K 2048)
and 16K-1M (K 512) of the bench's rows, heavy-tailed and Student-t rows and the step inputs.

A row whose qualifying count is <= K has no threshold (0 candidates). The counts are the
threshold bin's size whether or not the kernel can take it whole (it then skips the levels).

Inputs:

* ``bench``: ``bench.inputs.make_inputs`` (the benchmark's generator, run on the CPU with
  torch), V3.2 K 2048 at L 64K and 128K, V4-Flash K 512 at L 1M.
* ``step``: ``parity.cases.make_step_case`` (serving-structured keys: sink tokens, a recent
  window, topic spans, some heads voting against; requests of varying length, one shorter than
  K), V3.2 K 2048 and V4-Flash K 512 at contexts 64K / 128K.
* heavy tails: the bench logits times a lognormal(0, 2) factor per position (heavy-tailed k
  scales), i.i.d. Student-t rows with 1.5 and 1 (Cauchy) degrees of freedom, and the bench
  logits with one +1e30 outlier per row (a forced window miss: the threshold lies ~100 binades
  below the max).
* thresholds below zero: the bench logits minus 0.1 (most values negative, the max positive)
  and the bench rows cut to 2,560 positions (K 2,048: the threshold near the 20th percentile).
* ``--targets``: every (request, draft) row of the targets' indexer shapes
  (``bench.grid.targets_grid()``, their B, N, L and table) at ``--seeds`` seeds: rows with fewer
  than K positive logits, misses and the worst row's candidates under both windows (the per-row
  kernel's time follows its worst row; issue 17: B 64 N 2 drew a row with 982 positive logits).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from kernels.topk import window
from kernels.topk.window import order_keys  # noqa: F401 (also this module's API)


# ----------------------------------------------------------------------------- digits

def _threshold_bucket(bins: np.ndarray, nbins: int, K: int) -> tuple[int, int]:
    """(threshold bin or -1 when all qualifying are taken, its count) for int bins of keys."""
    hist = np.bincount(bins, minlength=nbins)
    if hist.sum() <= K:
        return -1, 0
    ge = np.cumsum(hist[::-1])[::-1]
    d = int(np.nonzero(ge >= K)[0].max())
    return d, int(hist[d])


def candidates(key: np.ndarray, K: int) -> dict:
    """Threshold-bucket sizes of one row's keys (0 = not qualifying) under each digit."""
    q = key[key != 0]
    out = {}
    if q.size:
        d2, n2 = window.threshold_bin(window.histogram(q, *window.window_bases(q)), K)
    else:
        d2, n2 = -1, 0
    out["two_sided"] = n2
    out["two_sided_miss"] = d2 == window.MID_BIN
    _, out["old"] = _threshold_bucket((q >> 24).astype(np.int64), 256, K)
    kmax = int(q.max()) if q.size else 0
    for name, shift in (("window", 20), ("window16", 19)):
        base = (kmax >> shift) - 255
        b = np.clip((q >> shift).astype(np.int64) - base, 0, 255)
        d, n = _threshold_bucket(b, 256, K)
        out[name] = n
        out[name + "_miss"] = d == 0
    return out


def pallas_candidates(key: np.ndarray, K: int, group: int) -> int:
    """Candidates the Pallas prune leaves in one row (uint32 keys as :func:`order_keys`, 0 = not
    qualifying) for groups of ``group`` positions: keys at or above the K-th largest group max
    rounded down to 1/128 binade (its low 16 bits cleared); the whole qualifying row when
    fewer than K groups qualify."""
    L = key.size
    n = -(-L // group)
    kp = np.zeros(n * group, np.uint32)
    kp[:L] = key
    g = kp.reshape(n, group).max(1)
    g = g[g != 0]
    q = int((key != 0).sum())
    if g.size < K:
        return q
    tau = int(np.partition(g, g.size - K)[g.size - K]) & ~0xFFFF
    return int((key >= max(tau, 1)).sum())


def pallas_summary(name: str, rows, K: int) -> dict:
    """Median / worst candidates and the capacity-overflow rate of the Pallas prune, old fixed
    16-position groups against the ``prune_merge`` rule."""
    from kernels.indexer import pallas as pk
    cap = 1 << (4 * K - 1).bit_length()
    out = dict(inputs=name, K=K, rows=len(rows), L=int(max(len(r) for r in rows)), cap=cap)
    for nm in ("g16", "merged"):
        v = []
        for r in rows:
            key = order_keys(np.asarray(r, np.float32))
            g = 16 if nm == "g16" else pk.GROUP * pk.prune_merge(-(-key.size // pk.GROUP), K)
            v.append(pallas_candidates(key, K, g))
        v = np.array(v)
        out[nm + "_median"], out[nm + "_worst"] = int(np.median(v)), int(v.max())
        out[nm + "_overflow_rate"] = float(np.mean(v > cap))
    return out


def pallas_main(R: int, rng) -> list:
    """The ``--pallas`` table (see the module docstring)."""
    table = []
    for preset, L_full, K, lengths in (
            ("DSV32", 131072, 2048, (4096, 8192, 12288, 16384, 24576, 32768, 40960, 49152, 65536,
                                     131072)),
            ("DSV4_FLASH", 1 << 20, 512, (16384, 32768, 65536, 131072, 1 << 20))):
        rows = bench_logits(preset, max(1, R // 8) if L_full >= (1 << 20) else R, L_full)
        heavy = _heavy(rows, rng)
        t15 = rng.standard_t(1.5, size=rows.shape).astype(np.float32)
        for L in lengths:
            table.append(pallas_summary(f"bench {preset} L{L // 1024}K", rows[:, :L], K))
            for nm, hv in heavy.items():
                table.append(pallas_summary(f"{nm} {preset} L{L // 1024}K", hv[:, :L], K))
            table.append(pallas_summary(f"student-t df 1.5 L{L // 1024}K", t15[:, :L], K))
    for preset, ctx, K in (("DSV32", 32768, 2048), ("DSV32", 131072, 2048),
                           ("DSV4_FLASH", 131072, 512)):
        rows = step_logits(preset, 4, ctx, K, seed=1)
        table.append(pallas_summary(f"step {preset} ctx{ctx // 1024}K (B4)", rows, K))
    return table


# ----------------------------------------------------------------------------- logits

def _logits_rows(q, w, k, sc):
    """float32 logits [N, L] of one request: q [N, H, D], w [N, H], k [L, D], sc [L]."""
    import torch
    s = torch.einsum("nhd,ld->nlh", q, k).clamp_min_(0.0)
    return ((s @ w[:, :, None])[..., 0] * sc[None, :]).numpy()


def bench_logits(preset: str, B: int, L: int, seed: int = 0) -> np.ndarray:
    """[B, L] float32 logits of the benchmark's generator (bench.inputs, torch on the CPU)."""
    from bench.grid import Shape
    from bench.inputs import make_inputs
    shape = Shape("indexer_topk", preset, B, 1, 1, L)
    s = make_inputs(shape, rotations=1, device="cpu", q_dtype="bfloat16",
                    latent_dtype="bfloat16", seed=seed).sets[0]
    return np.stack([_logits_rows(q, w, k, sc)[0] for q, w, k, sc in _request_inputs(shape, s)])


def _request_inputs(shape, s):
    """Per request of input set ``s`` of ``shape``: float32 ``(q [N, H, D], w [N, H], k [L, D],
    scales [L])``, the keys and scales of its first L positions read through its block table
    from the fp8_indexer cache (e4m3 values, then the page's float32 scales)."""
    import torch
    P, D, L = shape.P, shape.p.index_head_dim, shape.L
    kc = s["k_cache"]
    vals = kc[:, : P * D].contiguous().view(torch.float8_e4m3fn).float().view(-1, P, D)
    scales = kc[:, P * D:].contiguous().view(torch.float32).view(-1, P)
    q = s["iq"].float()
    w = s["iw"].float()
    n = -(-L // P)
    for b in range(shape.B):
        pages = s["block_table"][b, :n].long()
        yield q[b], w[b], vals[pages].reshape(-1, D)[:L], scales[pages].reshape(-1)[:L]


def shape_logits(shape, seed: int = 0):
    """Per (request, draft) float32 logit rows of a bench shape's inputs (``bench.inputs``, CPU
    generator), each its valid prefix under the MTP rule, in chunks of 128K positions."""
    from bench.inputs import make_inputs
    s = make_inputs(shape, rotations=1, device="cpu", q_dtype="float32", latent_dtype="float32",
                    seed=seed).sets[0]
    L, N = shape.L, shape.N
    for q, w, k, sc in _request_inputs(shape, s):
        rows = np.concatenate([_logits_rows(q, w, k[c:c + (1 << 17)], sc[c:c + (1 << 17)])
                               for c in range(0, L, 1 << 17)], axis=1)
        for i in range(N):
            yield rows[i, : L - (N - 1 - i)]


def targets(seeds: int = 2) -> list:
    """Per targets indexer shape and seed: rows, rows with fewer than K positive logits, and the
    misses and worst candidates under the one-sided and the two-sided window."""
    from bench import grid
    out = []
    for sh in grid.select(grid.targets_grid(), ops=["indexer_topk"]):
        for seed in range(seeds):
            per, neg = [], 0
            for row in shape_logits(sh, seed):
                per.append(candidates(order_keys(row), sh.K_topk))
                neg += int((row > 0).sum() < sh.K_topk)
            r = dict(shape=sh.label(), seed=seed, rows=len(per), fewer_than_K_positive=neg)
            for d in ("window", "two_sided"):
                r[d + "_misses"] = int(sum(p[d + "_miss"] for p in per))
                r[d + "_worst"] = int(max(p[d] for p in per))
            out.append(r)
            print(json.dumps(r), flush=True)
    return out


def step_logits(preset: str, B: int, context: int, K: int, seed: int = 0) -> list:
    """Per-request float32 logit rows (valid prefix only) of a ``parity.cases.make_step_case``."""
    import torch
    from kernels.presets import PRESETS
    from parity.cases import make_step_case
    pr = PRESETS[preset]
    case = make_step_case(seed, name=f"step/{preset}/N1", preset=pr, B=B, N=1, H=16, topk=K,
                          context=context, q_dtype="float32", kv_format="latent").indexer
    D = pr.index_head_dim
    P = case.k_cache.shape[1] // (D + 4)
    kc = torch.from_numpy(np.ascontiguousarray(case.k_cache))
    vals = kc[:, : P * D].contiguous().view(torch.float8_e4m3fn).float().view(-1, P, D)
    scales = kc[:, P * D:].contiguous().view(torch.float32).view(-1, P)
    q = torch.from_numpy(np.asarray(case.q).astype(np.float32))
    w = torch.from_numpy(np.asarray(case.weights, np.float32))
    rows = []
    for b in range(B):
        L = int(case.context_lens[b])
        n = -(-L // P)
        pages = torch.from_numpy(case.block_table[b, :n].astype(np.int64))
        k = vals[pages].reshape(-1, D)[:L]
        sc = scales[pages].reshape(-1)[:L]
        rows.append(_logits_rows(q[b], w[b], k, sc)[0])
    return rows


# ----------------------------------------------------------------------------- report

def summarize(name: str, rows, K: int) -> dict:
    """Median / worst candidates per row under each digit and the window-miss rate."""
    per = [candidates(order_keys(np.asarray(r, np.float32)), K) for r in rows]
    out = dict(inputs=name, K=K, rows=len(per), L=int(max(len(r) for r in rows)))
    for d in ("old", "window", "window16", "two_sided"):
        v = np.array([p[d] for p in per])
        out[d + "_median"] = int(np.median(v))
        out[d + "_worst"] = int(v.max())
    for d in ("window", "window16", "two_sided"):
        out[d + "_miss_rate"] = float(np.mean([p[d + "_miss"] for p in per]))
    return out


def _heavy(rows: np.ndarray, rng) -> dict:
    lognormal = rows * np.exp(2.0 * rng.standard_normal(rows.shape)).astype(np.float32)
    outlier = rows.copy()
    outlier[np.arange(rows.shape[0]), rng.integers(0, rows.shape[1], rows.shape[0])] = 1e30
    return {"bench x lognormal(0,2)": lognormal.astype(np.float32), "bench + one 1e30": outlier,
            "bench - 0.1": (rows - np.float32(0.1)).astype(np.float32)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16, help="bench rows (requests) per shape")
    ap.add_argument("--json", default=None, help="also write the table rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="L 64K only, 4 rows")
    ap.add_argument("--pallas", action="store_true",
                    help="the Pallas top-k's pruning (group maxima) instead of the Triton digit")
    ap.add_argument("--targets", action="store_true",
                    help="every row of the targets' indexer shapes (misses per shape and seed)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per shape with --targets")
    args = ap.parse_args(argv)
    if args.targets:
        rows = targets(args.seeds)
        if args.json:
            import sys
            import time
            doc = dict(command="python -m bench.topk_sim " + " ".join(
                           argv if argv is not None else sys.argv[1:]),
                       date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       inputs="bench.inputs, CPU generator; logits in float32 on the CPU",
                       rows=rows)
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
        return
    rng = np.random.default_rng(0)
    R = 4 if args.quick else args.rows
    if args.pallas:
        table = pallas_main(R, rng)
        cols = ["inputs", "K", "rows", "cap", "g16_median", "g16_worst", "g16_overflow_rate",
                "merged_median", "merged_worst", "merged_overflow_rate"]
        _print_table(table, cols, args.json)
        return
    table = []
    shapes = [("DSV32", 65536, 2048)] if args.quick else \
        [("DSV32", 65536, 2048), ("DSV32", 131072, 2048), ("DSV4_FLASH", 1 << 20, 512)]
    for preset, L, K in shapes:
        rows = bench_logits(preset, R if L < (1 << 20) else max(1, R // 8), L)
        table.append(summarize(f"bench {preset} L{L // 1024}K", rows, K))
        for nm, hv in _heavy(rows, rng).items():
            table.append(summarize(f"{nm} {preset} L{L // 1024}K", hv, K))
        table.append(summarize(f"bench {preset} cut to {K + K // 4}", rows[:, : K + K // 4], K))
        for df in (1.5, 1.0):
            t = rng.standard_t(df, size=(rows.shape[0], L)).astype(np.float32)
            table.append(summarize(f"student-t df {df} L{L // 1024}K", t, K))
    steps = [("DSV32", 65536, 2048)] if args.quick else \
        [("DSV32", 65536, 2048), ("DSV32", 131072, 2048), ("DSV4_FLASH", 131072, 512)]
    for preset, ctx, K in steps:
        rows = step_logits(preset, 4, ctx, K, seed=1)
        table.append(summarize(f"step {preset} ctx{ctx // 1024}K (B4)", rows, K))
    cols = ["inputs", "K", "rows", "old_median", "old_worst", "window_median", "window_worst",
            "window_miss_rate", "window16_median", "window16_worst", "window16_miss_rate",
            "two_sided_median", "two_sided_worst", "two_sided_miss_rate"]
    _print_table(table, cols, args.json)


def _print_table(table: list, cols: list, json_path: str | None) -> None:
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in table:
        print("| " + " | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c])
                                for c in cols) + " |")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
