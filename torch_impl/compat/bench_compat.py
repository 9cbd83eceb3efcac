"""``python -m torch_impl.compat.bench_compat``: the compat calls timed beside the native calls
at the same shapes (CUDA GPU only), each checked first against the native result.

Rows (bf16 q, fp8 caches, P = 64): FlashMLA V3.2 sparse decode (contiguous pages, and
FlashMLA's own strided quantizer layout), FlashMLA MODEL1 with an extra cache (two native calls
+ the merge against the two native calls alone), DeepGEMM paged MQA logits against
``indexer_logits``, and vLLM's ``persistent_topk`` against ``select_topk``'s kernel. Timing:
``triton.testing.do_bench`` median (ms -> us). Prints one line per row and writes JSON with
``--json PATH``. Speed is reported, never asserted.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


def _bench(fn) -> float:
    import triton
    return float(triton.testing.do_bench(fn, warmup=25, rep=200)) * 1e3   # us


def _mla_inputs(B, H, K, d_qk, P, n_pages, strided, g):
    from torch_impl import formats as tf
    lat = (torch.randn((n_pages, P, d_qk), generator=g) / 10).cuda()
    if d_qk == 576:
        q8 = tf.quantize_fp8_ds_mla(lat)                               # [n, P, 656]
        if strided:
            buf = torch.zeros((n_pages, P + 1, 656), dtype=torch.uint8, device="cuda")
            buf[:, :P] = q8
            q8 = buf[:, :P]
        native = q8
        fm = q8.unsqueeze(2)
    else:
        pages = tf.quantize_fp8_model1(lat)                            # [n, padded]
        native = pages
        fm = torch.as_strided(pages, (n_pages, P, 1, 584), (pages.shape[1], 584, 584, 1))
    idx = torch.randint(0, n_pages * P, (B, 1, K), dtype=torch.int32, generator=g).cuda()
    return native, fm, idx


def rows(B_list=(1, 64), seed=0):
    from torch_impl import indexer_logits, sparse_mla_decode
    from torch_impl.compat import deep_gemm, flash_mla, topk
    g = torch.Generator().manual_seed(seed)
    out = []
    for B in B_list:
        # ---- V3.2: H 128, K 2048
        for strided in (False, True):
            H, K = 128, 2048
            native, fm, idx = _mla_inputs(B, H, K, 576, 64, max(64, B * 40), strided, g)
            q = torch.randn((B, 1, H, 576), generator=g).cuda().to(torch.bfloat16)
            nat_cache = native.contiguous() if strided else native
            o_n, _ = sparse_mla_decode(q, nat_cache, idx, 576 ** -0.5, kv_format="fp8_ds_mla")
            meta = flash_mla.get_mla_metadata()[0]
            o_c, _ = flash_mla.flash_mla_with_kvcache(q, fm, None, None, 512, meta,
                                                      is_fp8_kvcache=True, indices=idx)
            torch.testing.assert_close(o_c.float(), o_n.float(), rtol=2.01 / 128, atol=1e-3)
            t_n = _bench(lambda: sparse_mla_decode(q, nat_cache, idx, 576 ** -0.5,
                                                   kv_format="fp8_ds_mla"))
            t_c = _bench(lambda: flash_mla.flash_mla_with_kvcache(q, fm, None, None, 512, meta,
                                                                  is_fp8_kvcache=True, indices=idx))
            out.append(dict(op="flash_mla_with_kvcache", layout="v32 strided" if strided else "v32",
                            B=B, H=H, K=K, native_us=t_n, compat_us=t_c))
        # ---- MODEL1 (V4): H 64, SWA cache K 128 + compressed cache K 512, sink
        H = 64
        nat0, fm0, idx0 = _mla_inputs(B, H, 128, 512, 64, max(16, B * 4), False, g)
        nat1, fm1, idx1 = _mla_inputs(B, H, 512, 512, 64, max(64, B * 16), False, g)
        q = torch.randn((B, 1, H, 512), generator=g).cuda().to(torch.bfloat16)
        sink = torch.randn(H, generator=g).cuda()
        s = 512 ** -0.5

        def native_two():
            sparse_mla_decode(q, nat0, idx0, s, kv_format="fp8_model1")
            sparse_mla_decode(q, nat1, idx1, s, kv_format="fp8_model1")

        meta = flash_mla.get_mla_metadata()[0]

        def compat_two():
            return flash_mla.flash_mla_with_kvcache(q, fm0, None, None, 512, meta, None, s,
                                                    is_fp8_kvcache=True, indices=idx0,
                                                    attn_sink=sink, extra_k_cache=fm1,
                                                    extra_indices_in_kvcache=idx1)
        compat_two()
        out.append(dict(op="flash_mla_with_kvcache", layout="model1 + extra", B=B, H=H,
                        K="128+512", native_us=_bench(native_two), compat_us=_bench(compat_two)))
        # ---- DeepGEMM logits + vLLM top-k: V3.2 indexer, L 32K, N 1
        from torch_impl import formats as tf
        L, Hi, D, P = 32768, 64, 128, 64
        n_pages = B * L // P
        pages = tf.quantize_fp8_indexer((torch.randn((n_pages, P, D), generator=g)).cuda())
        kv = pages.view(n_pages, P, 1, D + 4)
        qi = torch.randn((B, 1, Hi, D), generator=g).cuda().to(torch.float8_e4m3fn)
        w = torch.rand((B, Hi), generator=g).cuda() / Hi
        bt = torch.arange(n_pages, dtype=torch.int32, device="cuda").view(B, -1)
        cl = torch.full((B, 1), L, dtype=torch.int32, device="cuda")
        sched = deep_gemm.get_paged_mqa_logits_metadata(cl, P, deep_gemm.get_num_sms())
        t_n = _bench(lambda: indexer_logits(qi, w.view(B, 1, Hi), pages, bt, cl))
        t_c = _bench(lambda: deep_gemm.fp8_paged_mqa_logits(qi, kv, w, cl, bt, sched, L))
        out.append(dict(op="fp8_paged_mqa_logits", B=B, L=L, native_us=t_n, compat_us=t_c))
        logits = deep_gemm.fp8_paged_mqa_logits(qi, kv, w, cl, bt, sched, L)
        buf = torch.empty((B, 2048), dtype=torch.int32, device="cuda")
        ws = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        t_c = _bench(lambda: topk.persistent_topk(logits, cl, buf, ws, 2048, L))
        t_n = _bench(lambda: topk.select_topk(logits, cl.view(B), 2048, buf))
        out.append(dict(op="persistent_topk", B=B, L=L, native_us=t_n, compat_us=t_c))
    for r in out:
        r["ratio"] = r["compat_us"] / r["native_us"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_impl.compat.bench_compat",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the rows as JSON to this path")
    ap.add_argument("--batch", type=int, action="append", help="B values (default 1 and 64)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m torch_impl.compat.bench_compat: needs a CUDA GPU", file=sys.stderr)
        return 2
    res = rows(tuple(args.batch or (1, 64)))
    dev = torch.cuda.get_device_name()
    for r in res:
        print(f"{dev}  " + "  ".join(
            f"{k}={v:.3f}" if k == "ratio" else f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in r.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": dev, "torch": torch.__version__, "rows": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
