"""The compat calls timed beside the native calls at the same shapes, on the same inputs.

``python -m bench --compat`` (after the grid) or ``python -m bench --compat-only`` runs these
rows; ``python -m bench.compat_rows`` is the same rows alone. Each row first checks
that the compat call and the native call agree, then times both with the bench's torch timer
(``bench.timing.time_torch_cuda``: one CUDA graph per path holding one call per rotated input
set, so neither Python nor launch overhead is counted, as in every other bench row), and reports
``ratio = compat_us / native_us``. Speed is reported, never asserted (issue 18's target: ratio
<= 1.05 on the H200).

Rows (bf16 q, fp8 caches, P = 64; fp16 q and tiny shapes in a CPU dry run):

* ``flash_mla_with_kvcache v32``: FlashMLA V3.2 sparse decode (H 128, topk 2048) vs
  ``sparse_mla_decode(kv_format="fp8_ds_mla")`` on the same pages.
* ``flash_mla_with_kvcache v32 strided``: FlashMLA's quantizer layout (pages of P + 1 rows,
  sliced to P) read in place, vs the native op on the same strided pages (``native_cache``:
  "strided (in place, ...)"; both run the same kernel and config, the page stride passed to
  it as ``page_bytes``). ``7f7f460:bench/results/bench_h200_compat_20261202.json`` predates this: the
  native op then refused strided pages and was timed on a contiguous copy, while the compat
  call read the pages through a one-row-per-slot remap of its indices.
* ``flash_mla_with_kvcache model1 + extra``: MODEL1 (H 64) with a sliding-window cache (P 256,
  topk 128) and an extra compressed cache (P 64, topk 512: FlashMLA's MODEL1 CONFIG1), sink, vs
  the two native single-cache calls (``native_us``: each its split kernel and, when split, its
  own combine). The compat call runs both caches' split kernels into one float32 partial buffer
  and one combine over all splits (``torch_impl.sparse_mla.sparse_mla_decode_sources``), so
  ``ratio = compat_us / native_us`` is the 5 % target's ratio (the merge of the two caches
  costs no launch beyond the native calls' own combines); ``native_sources_us`` times that
  native two-cache call itself (``sparse_mla_decode_sources``, with the sink). Checked first
  against the same two-cache softmax on the plain-PyTorch path (float32, one rounding).
* ``fp8_paged_mqa_logits``: DeepGEMM's paged MQA logits (V3.2 indexer, L 32K) vs
  ``indexer_logits`` on the same pages.
* ``persistent_topk``: vLLM's decode top-k (k 2048) vs ``select_topk`` on the same logits.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

ROW_NAMES = ("v32", "v32 strided", "model1 + extra", "fp8_paged_mqa_logits", "persistent_topk")


def _dims(gpu: bool) -> dict:
    if gpu:
        return dict(v32_H=128, v32_K=2048, m1_H=64, m1_K0=128, m1_K1=512, idx_L=32768,
                    idx_H=64, idx_D=128, topk=2048, P=64, m1_P0=256, sets=4)
    return dict(v32_H=8, v32_K=32, m1_H=8, m1_K0=16, m1_K1=32, idx_L=256, idx_H=8, idx_D=32,
                topk=16, P=16, m1_P0=16, sets=1)


def _timer(device: str):
    from bench import timing
    if device == "cuda":
        return lambda calls: timing.time_torch_cuda(calls)
    return lambda calls: timing.time_cpu(calls)


def _mla_set(B, H, K, d_qk, P, n_pages, strided, g, device, q_dtype):
    """(native cache, FlashMLA view, indices [B, 1, K] slots, q) of one input set."""
    from torch_impl import formats as tf
    lat = (torch.randn((n_pages, P, d_qk), generator=g) / 10).to(device)
    if d_qk == 576:
        q8 = tf.quantize_fp8_ds_mla(lat)                               # [n, P, 656]
        if strided:      # FlashMLA tests/quant.py: empty((n, P + 1, 656))[:, :P]
            buf = torch.zeros((n_pages, P + 1, 656), dtype=torch.uint8, device=device)
            buf[:, :P] = q8
            q8 = buf[:, :P]
        native, fm = q8, q8.unsqueeze(2)
    else:
        pages = tf.quantize_fp8_model1(lat)                            # [n, padded]
        native = pages
        fm = torch.as_strided(pages, (n_pages, P, 1, 584), (pages.shape[1], 584, 584, 1))
    idx = torch.randint(0, n_pages * P, (B, 1, K), dtype=torch.int32, generator=g).to(device)
    q = (torch.randn((B, 1, H, d_qk), generator=g) / 2).to(device, q_dtype)
    return native, fm, idx, q


def _close(a, b, what):
    torch.testing.assert_close(a.float(), b.float(), rtol=2.01 / 128, atol=1e-3, equal_nan=True,
                               msg=lambda m: f"{what}: compat and native disagree: {m}")


def rows(B_list=(1, 64), seed=0, *, device: str | None = None, only=None) -> list[dict]:
    """The rows (dicts) for each B of ``B_list``; ``device`` "cuda" (default when available) or
    "cpu" (dry run: the interpreter, fp16 q, tiny shapes); ``only``: names of :data:`ROW_NAMES`."""
    from torch_impl import indexer_logits, sparse_mla_decode
    from torch_impl import formats as tf
    from torch_impl.compat import deep_gemm, flash_mla, topk
    from torch_impl.sparse_mla import KVSource, sparse_mla_decode_sources

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device == "cuda"
    d = _dims(gpu)
    q_dtype = torch.bfloat16 if gpu else torch.float16
    path = "auto" if gpu else "triton"
    tm = _timer(device)
    timer_name = "cuda graph per path (bench.timing.time_torch_cuda)" if gpu else "cpu dry run (meaningless)"
    g = torch.Generator().manual_seed(seed)
    want = set(only or ROW_NAMES)
    out = []
    P, R = d["P"], d["sets"]

    def nat(q, cache, idx, scale, fmt, **kw):
        return sparse_mla_decode(q, cache, idx, scale, kv_format=fmt, path=path, **kw)

    for B in B_list:
        # ---- V3.2: H 128, K 2048 (contiguous, then FlashMLA's strided quantizer layout)
        for strided in (False, True):
            name = "v32 strided" if strided else "v32"
            if name not in want:
                continue
            H, K = d["v32_H"], d["v32_K"]
            sets = [_mla_set(B, H, K, 576, P, max(4, B * (K // P + 8)), strided, g, device, q_dtype)
                    for _ in range(R)]
            # strided: the native op reads the same padded pages in place (the compat call's
            # own cache, never a contiguous copy), so the ratio is the compat layer's cost alone
            how = "strided (in place, the compat call's pages)" if strided else "contiguous"
            if strided:
                assert all(not n.is_contiguous() and n.data_ptr() == fm.data_ptr()
                           for n, fm, _, _ in sets)
            metas = [flash_mla.get_mla_metadata()[0] for _ in sets]
            ncalls = [lambda s=s: nat(s[3], s[0], s[2], 576 ** -0.5, "fp8_ds_mla") for s in sets]
            ccalls = [lambda s=s, m=m: flash_mla.flash_mla_with_kvcache(
                s[3], s[1], None, None, 512, m, is_fp8_kvcache=True, indices=s[2], path=path)
                for s, m in zip(sets, metas)]
            o_n, _ = ncalls[0]()
            o_c, _ = ccalls[0]()
            _close(o_c, o_n, name)
            out.append(dict(op="flash_mla_with_kvcache", layout=name, B=B, H=H, K=K,
                            native_cache=how, native_us=tm(ncalls).median_us,
                            compat_us=tm(ccalls).median_us))
        # ---- MODEL1 (V4): H 64, SWA cache K 128 + compressed (extra) cache K 512, sink
        if "model1 + extra" in want:
            H, K0, K1 = d["m1_H"], d["m1_K0"], d["m1_K1"]
            s = 512 ** -0.5
            sets = []
            for _ in range(R):
                P0 = d["m1_P0"]       # FlashMLA MODEL1 CONFIG1: main P 256 topk 128, extra P 64
                n0, f0, i0, q = _mla_set(B, H, K0, 512, P0, max(4, B * (K0 // P0 + 2)), False, g,
                                         device, q_dtype)
                n1, f1, i1, _ = _mla_set(B, H, K1, 512, P, max(4, B * (K1 // P + 8)), False, g,
                                         device, q_dtype)
                sink = torch.randn(H, generator=g).to(device)
                sets.append((q, n0, f0, i0, n1, f1, i1, sink))

            def native_two(t):
                q, n0, _, i0, n1, _, i1, _ = t
                return (nat(q, n0, i0, s, "fp8_model1"), nat(q, n1, i1, s, "fp8_model1"))

            def torch_two(t):
                q, n0, _, i0, n1, _, i1, sink = t
                return sparse_mla_decode_sources(
                    q, [KVSource(n0, i0, "fp8_model1"), KVSource(n1, i1, "fp8_model1")], s,
                    attn_sink=sink, path="torch")

            metas = [flash_mla.get_mla_metadata()[0] for _ in sets]

            def compat_two(t, m):
                q, _, f0, i0, _, f1, i1, sink = t
                return flash_mla.flash_mla_with_kvcache(
                    q, f0, None, None, 512, m, None, s, is_fp8_kvcache=True, indices=i0,
                    attn_sink=sink, extra_k_cache=f1, extra_indices_in_kvcache=i1, path=path)
            o_c, _ = compat_two(sets[0], metas[0])
            o_t, _ = torch_two(sets[0])
            _close(o_c, o_t, "model1 + extra")
            def native_sources(t):
                q, n0, _, i0, n1, _, i1, sink = t
                return sparse_mla_decode_sources(
                    q, [KVSource(n0, i0, "fp8_model1"), KVSource(n1, i1, "fp8_model1")], s,
                    attn_sink=sink, path=path)
            t_n = tm([lambda t=t: native_two(t) for t in sets]).median_us
            t_s = tm([lambda t=t: native_sources(t) for t in sets]).median_us
            t_c = tm([lambda t=t, m=m: compat_two(t, m) for t, m in zip(sets, metas)]).median_us
            out.append(dict(op="flash_mla_with_kvcache", layout="model1 + extra", B=B, H=H,
                            K=f"{K0}+{K1}", native_us=t_n, compat_us=t_c,
                            native="two sparse_mla_decode calls (each with its own combine)",
                            native_sources_us=t_s))
        # ---- DeepGEMM logits + vLLM top-k: V3.2 indexer, L 32K, N 1
        if {"fp8_paged_mqa_logits", "persistent_topk"} & want:
            L, Hi, D, k = d["idx_L"], d["idx_H"], d["idx_D"], d["topk"]
            n_pages = B * L // P
            sets = []
            for _ in range(R):
                pages = tf.quantize_fp8_indexer(torch.randn((n_pages, P, D), generator=g).to(device))
                kv = pages.view(n_pages, P, 1, D + 4)
                qi = torch.randn((B, 1, Hi, D), generator=g).to(device).to(torch.float8_e4m3fn)
                w = torch.rand((B, Hi), generator=g).to(device) / Hi
                bt = torch.randperm(n_pages, generator=g).to(device, torch.int32).view(B, -1)
                cl = torch.full((B, 1), L, dtype=torch.int32, device=device)
                sets.append((pages, kv, qi, w, bt, cl))
            sched = deep_gemm.get_paged_mqa_logits_metadata(sets[0][5], P, deep_gemm.get_num_sms())
            ipath = "auto" if gpu else "triton"
            ncalls = [lambda t=t: indexer_logits(t[2], t[3].view(B, 1, Hi), t[0], t[4], t[5],
                                                 path=ipath) for t in sets]
            ccalls = [lambda t=t: deep_gemm.fp8_paged_mqa_logits(t[2], t[1], t[3], t[5], t[4],
                                                                 sched, L) for t in sets]
            lg_c = ccalls[0]()
            if "fp8_paged_mqa_logits" in want:
                lg_n = ncalls[0]()
                lg_n = lg_n[0] if isinstance(lg_n, tuple) else lg_n
                _close(lg_c[:, :L], lg_n.reshape(B, -1)[:, :L], "fp8_paged_mqa_logits")
                out.append(dict(op="fp8_paged_mqa_logits", B=B, L=L, H=Hi,
                                native_us=tm(ncalls).median_us, compat_us=tm(ccalls).median_us))
            if "persistent_topk" in want:
                logits = [c() for c in ccalls]
                bufs = [torch.empty((B, k), dtype=torch.int32, device=device) for _ in sets]
                ws = torch.empty(1 << 20, dtype=torch.uint8, device=device)
                ccalls = [lambda lg=lg, t=t, o=o: topk.persistent_topk(lg, t[5], o, ws, k, L)
                          for lg, t, o in zip(logits, sets, bufs)]
                ncalls = [lambda lg=lg, t=t, o=o: topk.select_topk(lg, t[5].view(B), k, o)
                          for lg, t, o in zip(logits, sets, bufs)]
                out.append(dict(op="persistent_topk", B=B, L=L, K=k,
                                native_us=tm(ncalls).median_us, compat_us=tm(ccalls).median_us))
    for r in out:
        r["ratio"] = r["compat_us"] / r["native_us"]
        r["timer"] = timer_name
        if r["op"] == "flash_mla_with_kvcache":
            r["q_dtype"] = str(q_dtype).replace("torch.", "")
    return out


def format_row(r: dict) -> str:
    """One line: op/layout, shape, native / compat microseconds and the ratio."""
    keys = [k for k in r if k not in ("timer", "op", "layout")]
    head = r["op"] + (f" [{r['layout']}]" if "layout" in r else "")
    body = "  ".join(f"{k}={v:.3f}" if k.startswith("ratio") else f"{k}={v:.1f}"
                     if isinstance(v, float) else f"{k}={v}" for k, v in ((k, r[k]) for k in keys))
    return f"{head}  {body}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compat_rows",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the rows as JSON to this path")
    ap.add_argument("--batch", type=int, action="append", help="B values (default 1 and 64)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes in the CPU interpreter (timings meaningless)")
    args = ap.parse_args(argv)
    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    from parity.machine import prepare_environment
    prepare_environment(gpu=device == "cuda")     # the interpreter on the CPU (before imports)
    res = rows(tuple(args.batch or ((1, 64) if device == "cuda" else (1,))), device=device)
    dev = torch.cuda.get_device_name() if device == "cuda" else "CPU interpreter (dry run)"
    for r in res:
        print(f"{dev}  {format_row(r)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": dev, "torch": torch.__version__, "rows": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
