"""AOT compile specs of the Triton radix top-k kernels (``kernels/topk/triton.py``): every launch
its launcher can make, for ``tests/test_triton_compile.py`` (``kernels._triton_aot`` compiles
them without a GPU). No torch at import (the top-k module imports triton)."""
from __future__ import annotations


def aot_specs(smem_class: str) -> list:
    """Launches of the radix top-k kernels: the per-row kernel at every (block, num_warps) of
    ``TopkConfig.SEARCH_SPACE`` without a histogram, with the fused one, and finishing a split
    pass B (``FROM_PLAN``); the plan's part kernel at every ``SBASE`` ``plan_blocks`` returns;
    the scatter kernel at every ``SCATTER_SPACE`` entry (``scatter_config`` picks one by shape,
    ``launch_topk(scatter=...)`` any), after the part kernel and planning itself (every split
    tile ``scatter_plan_blocks``)."""
    from kernels._triton_aot import LaunchSpec
    from kernels.topk.triton import (PLAN_MIN, PLAN_SPLITS, SCATTER_PART_GB, SCATTER_PART_SBASE,
                                     SCATTER_PLAN_SPLITS, SCATTER_SMEM_SPACE, SCATTER_SPACE,
                                     SPLIT_HIST_SPACE, TopkConfig, plan_blocks,
                                     scatter_plan_blocks)
    sig = {"x_ptr": "*fp32", "len_ptr": "*i32", "out_ptr": "*i32", "cand_ptr": "*i32",
           "hist_ptr": "*i32", "W": "i32", "topk": "i32", "stride_x": "i32", "stride_o": "i32",
           "stride_c": "i32", "cap": "i32", "n_drafts": "i32", "per_row": "i32",
           "n_drafts_pow2": "i32", "num_splits": "i32", "state_ptr": "*i32"}
    specs = []
    space = TopkConfig.SEARCH_SPACE
    for nw in space["num_warps"]:
        for blk in space["block"]:
            for has_hist in (False, True):
                specs.append(LaunchSpec(f"topk block{blk} w{nw} hist={has_hist} plan=False",
                                        "kernels.topk.triton", "_radix_topk_kernel", sig,
                                        dict(BLOCK=blk, HAS_HIST=has_hist, FROM_PLAN=False,
                                             PLAN_SB=PLAN_SPLITS), nw, 1))
        for blk in space["cand_block"]:              # after a split pass B: the candidate block
            specs.append(LaunchSpec(f"topk block{blk} w{nw} hist=True plan=True",
                                    "kernels.topk.triton", "_radix_topk_kernel", sig,
                                    dict(BLOCK=blk, HAS_HIST=True, FROM_PLAN=True,
                                         PLAN_SB=PLAN_SPLITS), nw, 1))
    # the plan part runs only above SCATTER_PLAN_SPLITS splits (S 17..8K: SBASE 32..1024)
    sbases = sorted({plan_blocks(s)[1] for s in [SCATTER_PLAN_SPLITS + 1]
                     + [1 << e for e in range(5, 14)]})
    common = {"n_drafts": "i32", "n_drafts_pow2": "i32", "num_splits": "i32", "num_groups": "i32"}
    for sbase in sbases:
        specs.append(LaunchSpec(f"topk plan part SBASE{sbase}", "kernels.topk.triton",
                                "_topk_plan_part_kernel",
                                {"hist_ptr": "*i32", "part_ptr": "*i32", "pre_ptr": "*i32",
                                 **common},
                                dict(SBASE=sbase), 4, 1))
    scatter_sig = {"x_ptr": "*fp32", "len_ptr": "*i32", "out_ptr": "*i32", "cand_ptr": "*i32",
                   "state_ptr": "*i32", "part_ptr": "*i32", "pre_ptr": "*i32", "hist_ptr": "*i32",
                   "W": "i32", "P": "i32", "stride_x": "i32", "stride_o": "i32",
                   "stride_c": "i32", "cap": "i32", "topk": "i32", "n_drafts": "i32",
                   "per_row": "i32", "n_drafts_pow2": "i32", "num_splits": "i32",
                   "num_groups": "i32", "sub": "i32"}
    # the indexer's launches: W a multiple of the page size, P 64, strides multiples of 16 (the
    # JIT specialises them so; pass B's 16-byte loads depend on it)
    div = ("W", "P", "stride_x", "stride_o", "stride_c")
    for blk, nw, vec in SCATTER_SPACE:
        v = " vec" if vec else ""
        specs.append(LaunchSpec(f"topk scatter block{blk} w{nw}{v} parts",   # after the part kernel
                                "kernels.topk.triton", "_topk_scatter_kernel", scatter_sig,
                                dict(BLOCK=blk, GB=SCATTER_PART_GB, PLAN=False,
                                     SP=SCATTER_PART_SBASE, VEC=vec, PRE=True), nw, 1,
                                divisible=div))
        for sp in scatter_plan_blocks():                  # planning in its own programs
            specs.append(LaunchSpec(f"topk scatter block{blk} w{nw}{v} plan SP{sp}",
                                    "kernels.topk.triton", "_topk_scatter_kernel", scatter_sig,
                                    dict(BLOCK=blk, GB=PLAN_MIN, PLAN=True, SP=sp, VEC=vec), nw, 1,
                                    divisible=div))
    # the split pass A (launch_split_hist: the indexer's top-k when its logits kernel did not
    # fuse the histogram, select_topk on few long rows), at every SPLIT_HIST_SPACE config: the
    # ballot form the Triton kernel, the smem form the Gluon one (whose one shared buffer must
    # sit at gluon_hist.HIST_SMEM_OFFSET: tests/test_triton_compile.py)
    for hblock, hwarps, form in SPLIT_HIST_SPACE:
        module, kernel = (("kernels.topk.gluon_hist", "_topk_hist_smem_kernel") if form == "smem"
                          else ("kernels.topk.triton", "_topk_hist_kernel"))
        specs.append(LaunchSpec(_split_hist_label(hblock, hwarps, form), module, kernel,
                                {"x_ptr": "*fp32", "len_ptr": "*i32", "hist_ptr": "*i32",
                                 "W": "i32", "P": "i32", "stride_x": "i32", "n_drafts": "i32",
                                 "per_row": "i32", "n_drafts_pow2": "i32", "num_splits": "i32"},
                                dict(BLOCK=hblock), hwarps, 1,
                                divisible=("W", "P", "stride_x")))
    # the split pass B's smem form (launch_topk(scatter_form="smem"): the Gluon kernel, whose
    # one shared buffer must sit at gluon_scatter.STAGE_SMEM_OFFSET: tests/test_triton_compile.py)
    # at every (BLOCK, warps) of SCATTER_SMEM_SPACE, after the part kernel and planning itself at
    # the smallest split tile (the tile only sizes the bases' load: [SP] in registers)
    tiles = scatter_plan_blocks()
    for blk, nw in SCATTER_SMEM_SPACE:
        specs.append(LaunchSpec(f"topk scatter smem block{blk} w{nw} parts",
                                "kernels.topk.gluon_scatter", "_topk_scatter_smem_kernel",
                                scatter_sig, dict(BLOCK=blk, GB=SCATTER_PART_GB, PLAN=False,
                                                  SP=SCATTER_PART_SBASE, VEC=True, SUB=False),
                                nw, 1, divisible=div))
        for sp in (tiles[0],):
            specs.append(LaunchSpec(f"topk scatter smem block{blk} w{nw} plan SP{sp}",
                                    "kernels.topk.gluon_scatter", "_topk_scatter_smem_kernel",
                                    scatter_sig, dict(BLOCK=blk, GB=PLAN_MIN, PLAN=True, SP=sp,
                                                      VEC=True, SUB=False), nw, 1, divisible=div))
    # programmatic dependent launch (DSA_TOPK_PDL=1): each kernel's first instruction a
    # griddepcontrol.wait, nothing else changes; one launch of each kernel (the plan part, the
    # scatter, the per-row kernel after a split pass B), compiled to show
    # the instruction assembles for every target and the resources stay those of its twin
    # (tests/test_triton_compile.py)
    for sp in specs:
        sp.constexprs.setdefault("PDL", False)
        if sp.kernel == "_topk_scatter_kernel":
            sp.constexprs.setdefault("SUB", False)
            sp.constexprs.setdefault("PRE", False)
    for sp in list(specs):
        if sp.label in PDL_TWINS:
            specs.append(LaunchSpec(sp.label + " pdl", sp.module, sp.kernel, sp.signature,
                                    dict(sp.constexprs, PDL=True), sp.num_warps, sp.num_stages,
                                    divisible=sp.divisible))
    # the parts launch without its PRE prologue (DSA_TOPK_PART_PRE=0), at the B 1 launch
    for sp in list(specs):
        if sp.label in PRE_OFF_TWINS:
            specs.append(LaunchSpec(sp.label + " nopre", sp.module, sp.kernel, sp.signature,
                                    dict(sp.constexprs, PRE=False), sp.num_warps, sp.num_stages,
                                    divisible=sp.divisible))
    # the split pass B's sub-splits (DSA_TOPK_SCATTER_SUB > 1: SUB=True), at the B 64 launches
    # (the one the shape picks, planning itself and after the plan kernels)
    for sp in list(specs):
        if sp.label in SUB_TWINS:
            specs.append(LaunchSpec(sp.label + " sub", sp.module, sp.kernel, sp.signature,
                                    dict(sp.constexprs, SUB=True), sp.num_warps, sp.num_stages,
                                    divisible=sp.divisible))
    return specs


# the parts launches compiled again with PRE=False (aot_specs): scatter_config's at B 1 L 64K and 128K
PRE_OFF_TWINS = ("topk scatter block512 w4 parts", "topk scatter block1024 w4 vec parts")
# the scatter launches compiled again with SUB=True (aot_specs)
SUB_TWINS = ("topk scatter block2048 w4 vec plan SP4", "topk scatter block2048 w4 vec parts")


def _split_hist_label(block: int, warps: int, form: str) -> str:
    return f"topk split hist {form} block{block} w{warps}"


def _default_split_hist_label() -> str:
    from kernels.topk.triton import SPLIT_HIST_CONFIG
    return _split_hist_label(*SPLIT_HIST_CONFIG)


# the launches compiled again with PDL=True (aot_specs; the split pass A's at its default
# config, whichever it is)
PDL_TWINS = ("topk block2048 w8 hist=True plan=True", "topk plan part SBASE32",
             "topk scatter block2048 w4 vec plan SP4", _default_split_hist_label(),
             "topk scatter smem block2048 w4 plan SP2")
