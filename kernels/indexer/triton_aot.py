"""AOT compile specs of the Triton indexer logits kernel (``kernels/indexer/triton.py``): every
launch its launcher can make, per shared-memory class, for ``tests/test_triton_compile.py``
(``kernels._triton_aot`` compiles them without a GPU). No torch, no triton at import."""
from __future__ import annotations


# Integer arguments of the logits kernel that a real launch specialises as multiples of 16 (every
# stride and offset is, at the bench's and the presets' shapes): compiled so, the AOT counts match
# the GPU's code (unmarked, Triton cannot vectorise the K-tile loads: byte loads, 255 registers).
LOGITS_DIVISIBLE = ("stride_qb", "stride_qn", "stride_qh", "stride_wb", "stride_wn", "stride_kp",
                    "stride_kt", "stride_sp", "scale_off", "stride_bt", "stride_ob", "stride_on")


def _logits_spec(label, q_ptr, k_ptr, N, H, P, has_scale, num_warps, num_stages, dot_prec="tf32",
                 trans=True, pages=2, hist="first", prefetch=True, evict_first=False,
                 divisible=LOGITS_DIVISIBLE):
    from kernels._triton_aot import LaunchSpec
    from kernels.indexer.triton import HIST_MODES
    sig = {"q_ptr": q_ptr, "w_ptr": "*fp32", "k_ptr": k_ptr, "ks_ptr": "*fp32", "bt_ptr": "*i32",
           "cl_ptr": "*i32", "out_ptr": "*fp32", "hist_ptr": "*i32"}
    for name in ("num_pages", "max_pages", "stride_qb", "stride_qn", "stride_qh", "stride_wb",
                 "stride_wn", "stride_kp", "stride_kt", "stride_sp", "scale_off", "stride_bt",
                 "stride_ob", "stride_on"):
        sig[name] = "i32"
    nb = 1 << (N - 1).bit_length()
    cx = dict(N=N, NB=nb, H=H, BLOCK_H=max(16, 1 << (H - 1).bit_length()), D=128, P=P,
              BLOCK_P=max(16, 1 << (P - 1).bit_length()), HAS_SCALE=has_scale, CL_PER_DRAFT=False,
              DOT_PRECISION=dot_prec, DOT_F32=False, FP8_NAN_FIX=False, WRITE_HIST=has_scale,
              FP8_UPCAST=has_scale, TRANS=trans, PAGES=pages, HIST_MODE=HIST_MODES[hist],
              PREFETCH=prefetch, EVICT=evict_first)
    return LaunchSpec(label, "kernels.indexer.triton", "_indexer_logits_kernel", sig, cx,
                      num_warps, num_stages, divisible=tuple(divisible))


def aot_specs(smem_class: str) -> list:
    """Launches of the logits kernels to compile-check per shared-memory class: the default
    config (tokens as M, 2 pages per iteration, 1 stage, num_warps 4 or 8 by q rows) for fp8
    at N = 1, 2, 4 and H_I = 64, 16 with P = 64, P = 16, dense bf16 / fp32 (D_I = 128), and the
    largest tile (N = 4, H_I = 64) at every (num_warps, num_stages, trans, pages) corner of
    ``IndexerLogitsConfig.SEARCH_SPACE``; in the large class (sm_90) also the Gluon kernels
    (:func:`gluon_specs`, :func:`gluon_ws_specs`: sm_90 only)."""
    from kernels.indexer.triton import IndexerLogitsConfig
    specs = []

    def warps(N, H):
        return 8 if (1 << (N - 1).bit_length()) * max(16, 1 << (H - 1).bit_length()) >= 128 else 4

    for N in (1, 2, 4):
        for H in (64, 16):
            specs.append(_logits_spec(f"logits fp8 N{N} H{H} P64", "*fp8e4nv", "*fp8e4nv", N, H, 64,
                                      True, warps(N, H), 1))
    specs.append(_logits_spec("logits fp8 N1 H64 P16", "*fp8e4nv", "*fp8e4nv", 1, 64, 16, True, 4, 1))
    specs.append(_logits_spec("logits dense bf16 N2 H64 P64", "*bf16", "*bf16", 2, 64, 64, False, 8, 1))
    specs.append(_logits_spec("logits dense fp32 N1 H64 P64", "*fp32", "*fp32", 1, 64, 64, False, 4, 1,
                              "ieee"))
    space = IndexerLogitsConfig.SEARCH_SPACE
    for nw in space["num_warps"]:
        for ns in (min(space["num_stages"]), max(space["num_stages"])):
            for trans in space["trans"]:
                for pages in space["pages"]:
                    for pf in space["prefetch"]:
                        specs.append(_logits_spec(
                            f"logits fp8 N4 H64 P64 w{nw} s{ns} trans={trans} pages={pages} "
                            f"prefetch={pf}", "*fp8e4nv", "*fp8e4nv", 4, 64, 64, True, nw, ns,
                            trans=trans, pages=pages, prefetch=pf))
    # the other histogram mode and evict-first loads at the defaults; the pipelined (cp.async)
    # variants of bench.indexer_sweep at N = 1 and 2; the dense bf16 tile at 3 stages
    for N in (1, 2):
        specs.append(_logits_spec(f"logits fp8 N{N} H64 P64 hist=running", "*fp8e4nv", "*fp8e4nv",
                                  N, 64, 64, True, warps(N, 64), 1, hist="running"))
        for nw, ns, pages in ((warps(N, 64), 2, 2), (warps(N, 64), 3, 2), (8, 2, 2),
                              (warps(N, 64), 2, 1)):
            specs.append(_logits_spec(f"logits fp8 N{N} H64 P64 w{nw} s{ns} pages={pages} "
                                      f"prefetch=False evict_first", "*fp8e4nv", "*fp8e4nv", N, 64,
                                      64, True, nw, ns, pages=pages, prefetch=False,
                                      evict_first=True))
    specs.append(_logits_spec("logits dense bf16 N2 H64 P64 s3 prefetch=False", "*bf16", "*bf16",
                              2, 64, 64, False, 8, 3, prefetch=False))
    if smem_class == "large":
        specs += gluon_specs() + gluon_ws_specs()
    return specs


# Integer arguments of the Gluon logits kernel specialised as multiples of 16 at real launches
GLUON_DIVISIBLE = ("stride_qb", "stride_qn", "stride_qh", "stride_wb", "stride_wn", "stride_kp",
                   "stride_sp", "scale_off", "stride_bt", "stride_ob", "stride_on")


def gluon_specs() -> list:
    """Launches of the Gluon logits kernel (``kernels/indexer/gluon.py``, sm_90 only): N 1 and 2,
    with the fused histogram (``indexer_topk``) and without (``indexer_logits``), lengths
    ``[B]`` and ``[B, N]``."""
    from kernels._triton_aot import LaunchSpec
    from kernels.indexer import gluon
    sig = {"q_ptr": "*fp8e4nv", "w_ptr": "*fp32", "k_ptr": "*fp8e4nv", "ks_ptr": "*fp32",
           "bt_ptr": "*i32", "cl_ptr": "*i32", "out_ptr": "*fp32", "hist_ptr": "*i32"}
    for name in ("num_pages", "max_pages", "stride_qb", "stride_qn", "stride_qh", "stride_wb",
                 "stride_wn", "stride_kp", "stride_sp", "scale_off", "stride_bt", "stride_ob",
                 "stride_on"):
        sig[name] = "i32"
    specs = []
    for n in gluon.DRAFTS:
        for hist in (True, False):
            for per_draft in ((False, True) if hist else (False,)):
                specs.append(LaunchSpec(
                    f"logits gluon N{n} hist={hist} cl_per_draft={per_draft}",
                    "kernels.indexer.gluon", "_indexer_logits_gluon_kernel", sig,
                    dict(N=n, CL_PER_DRAFT=per_draft, WRITE_HIST=hist), gluon.NUM_WARPS, 1,
                    divisible=GLUON_DIVISIBLE))
    return specs


def gluon_ws_specs(consumers=(1, 2, 3, 4), converts=("regs", "smem")) -> list:
    """Launches of the warp-specialised Gluon logits kernel (``kernels/indexer/gluon_ws.py``,
    sm_90 only): N 1 and 2 with the fused histogram (``indexer_topk``), lengths ``[B]`` and
    ``[B, N]``, and without it (``indexer_logits``), for each consumer count and conversion
    (``IndexerLogitsConfig.ws_consumers`` / ``ws_convert``), as ``gluon_ws.launch`` launches
    them (ring slots, register budgets, ``maxnreg``)."""
    from kernels._triton_aot import LaunchSpec
    from kernels.indexer import gluon_ws as ws
    kl, sl = ws.layouts()
    sig = {"q_ptr": "*fp8e4nv", "w_ptr": "*fp32", "kv_desc": f"tensordesc<fp8e4nv[64, 64],{kl!r}>",
           "ks_desc": f"tensordesc<fp32[64],{sl!r}>", "bt_ptr": "*i32", "cl_ptr": "*i32",
           "out_ptr": "*fp32", "hist_ptr": "*i32"}
    for name in ("num_pages", "max_pages", "stride_qb", "stride_qn", "stride_qh", "stride_wb",
                 "stride_wn", "stride_bt", "stride_ob", "stride_on"):
        sig[name] = "i32"
    specs = []
    for cons in consumers:
        maxnreg, cregs = ws.REGS[cons]
        for cname in converts:
            if cons == 4 and cname != "regs":       # four consumers convert in registers only
                continue
            conv = ws.CONVERTS[cname]
            for n in ws.DRAFTS:
                for hist, per_draft in ((True, False), (True, True), (False, False)):
                    specs.append(LaunchSpec(
                        f"logits gluon_ws c{cons} {cname} N{n} hist={hist} "
                        f"cl_per_draft={per_draft}",
                        "kernels.indexer.gluon_ws", "_indexer_logits_gluon_ws_kernel", sig,
                        dict(N=n, CL_PER_DRAFT=per_draft, WRITE_HIST=hist, CONSUMERS=cons,
                             CONVERT=conv, NSLOT=ws.ring_slots(cons, conv, n),
                             CONSUMER_REGS=cregs, PRODUCER_REGS=ws.PRODUCER_REGS_BY[cons],
                             HIST_ATOMIC=ws.hist_atomic(cons)),
                        ws.NUM_WARPS, 1, divisible=GLUON_WS_DIVISIBLE,
                        options={"maxnreg": maxnreg}))
    return specs


GLUON_WS_DIVISIBLE = ("stride_qb", "stride_qn", "stride_qh", "stride_wb", "stride_wn",
                      "stride_bt", "stride_ob", "stride_on")
