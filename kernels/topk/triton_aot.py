"""AOT compile specs of the Triton radix top-k kernels (``kernels/topk/triton.py``): every launch
its launcher can make, for ``tests/test_triton_compile.py`` (``kernels._triton_aot`` compiles
them without a GPU). No torch at import (the top-k module imports triton)."""
from __future__ import annotations


def aot_specs(smem_class: str) -> list:
    """Launches of the radix top-k kernels: the per-row kernel at every (block, num_warps) of
    ``TopkConfig.SEARCH_SPACE`` without a histogram, with the fused one, and finishing a split
    pass B (``FROM_PLAN``); the plan kernel and the scatter kernel at every
    ``SCATTER_CONFIGS`` entry (``scatter_config`` picks one by shape)."""
    from kernels._triton_aot import LaunchSpec
    from kernels.topk.triton import PLAN_BASES, PLAN_SPLITS, SCATTER_CONFIGS, TopkConfig
    sig = {"x_ptr": "*fp32", "len_ptr": "*i32", "out_ptr": "*i32", "cand_ptr": "*i32",
           "hist_ptr": "*i32", "W": "i32", "topk": "i32", "stride_x": "i32", "stride_o": "i32",
           "stride_c": "i32", "cap": "i32", "n_drafts": "i32", "per_row": "i32",
           "n_drafts_pow2": "i32", "num_splits": "i32", "state_ptr": "*i32"}
    specs = []
    for blk in TopkConfig.SEARCH_SPACE["block"]:
        for nw in TopkConfig.SEARCH_SPACE["num_warps"]:
            for has_hist, plan in ((False, False), (True, False), (True, True)):
                specs.append(LaunchSpec(f"topk block{blk} w{nw} hist={has_hist} plan={plan}",
                                        "kernels.topk.triton", "_radix_topk_kernel", sig,
                                        dict(BLOCK=blk, HAS_HIST=has_hist, FROM_PLAN=plan,
                                             PLAN_SB=PLAN_SPLITS), nw, 1))
    specs.append(LaunchSpec("topk plan", "kernels.topk.triton", "_topk_plan_kernel",
                            {"hist_ptr": "*i32", "state_ptr": "*i32", "cum_ptr": "*i32",
                             "topk": "i32", "cap": "i32", "n_drafts": "i32",
                             "n_drafts_pow2": "i32", "num_splits": "i32"},
                            dict(SB=PLAN_SPLITS, SBASE=PLAN_BASES), 8, 1))
    for blk, nw in SCATTER_CONFIGS:
        specs.append(LaunchSpec(f"topk scatter block{blk} w{nw}", "kernels.topk.triton",
                                "_topk_scatter_kernel",
                                {"x_ptr": "*fp32", "len_ptr": "*i32", "out_ptr": "*i32",
                                 "cand_ptr": "*i32", "state_ptr": "*i32", "cum_ptr": "*i32",
                                 "W": "i32", "P": "i32", "stride_x": "i32", "stride_o": "i32",
                                 "stride_c": "i32", "cap": "i32", "n_drafts": "i32",
                                 "per_row": "i32", "num_splits": "i32"},
                                dict(BLOCK=blk), nw, 1))
    return specs
