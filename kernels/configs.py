"""Frozen tile / split configs and their heuristics, shared by both kernel stacks.

A *config* fixes the compile-time shape of a kernel launch (block sizes, warps, pipeline stages);
the *split count* (how many split-K programs share one top-k list) is a runtime choice made per
call from the GPU's SM count and the rows of work. Each op has:

* a frozen dataclass (``SparseMLAConfig``),
* an explicit search space per shared-memory class (:data:`SPARSE_MLA_SPACE`): every config a
  launcher may choose. ``tests/test_triton_compile.py`` compiles every entry for sm_120
  (101,376 B shared memory per block) and sm_90 (232,448 B) and checks the shared memory,
* a heuristic default (:func:`sparse_mla_heuristic`) that only ever returns a member of the
  space for the GPU's class, and :func:`sparse_mla_num_splits` for the split count.

Dispatch-table overrides (``kernels/dispatch/<arch>.json``) are accepted only when they name a
member of the space (:func:`sparse_mla_from_dict`), so a table can never select a config that
was not compiled and checked.

NumPy-free and framework-free: the Pallas stack may add its own section below.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# Shared-memory classes: "small" = 99 KiB per block (sm_86/89/120/121), "large" = 227 KiB
# (sm_90/100/103) and 163 KiB (sm_80/87; uses the small space to stay on the safe side).
SMALL_SMEM = 101_376
LARGE_SMEM = 232_448


def smem_class(smem_per_block: int) -> str:
    """``"large"`` when a block may use >= 227 KiB of shared memory, else ``"small"``."""
    return "large" if smem_per_block >= LARGE_SMEM else "small"


def next_pow2(x: int) -> int:
    """Smallest power of two >= ``x`` (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


# ============================================================================ sparse MLA decode

@dataclass(frozen=True)
class SparseMLAConfig:
    """Compile-time shape of the split-K sparse MLA decode kernel (kernels/triton/sparse_mla.py).

    Attributes:
      block_h: query heads per program (power of two >= 16, the tl.dot minimum; heads beyond H
        are masked). All heads of a rank up to 64 share one program so each gathered latent row
        is read once per head block.
      block_k: top-k entries gathered per loop iteration (power of two >= 16).
      dv_splits: programs that split the D_v columns of the accumulator (1 or 2). With 2, each
        program recomputes the scores (reading the rows again, mostly from L2) but holds a
        ``[block_h, D_v / 2]`` fp32 accumulator instead of ``[block_h, D_v]``.
      num_warps, num_stages: Triton launch options.
    """

    block_h: int = 64
    block_k: int = 32
    dv_splits: int = 1
    num_warps: int = 8
    num_stages: int = 1

    def to_dict(self) -> dict:
        """Plain dict (for dispatch JSON and result files)."""
        return asdict(self)


# Every config the launcher may pick, per shared-memory class. The compile test compiles each
# one for every kv_format and checks its shared memory against the class limit.
SPARSE_MLA_SPACE: dict[str, tuple[SparseMLAConfig, ...]] = {
    "small": (
        SparseMLAConfig(block_h=16, block_k=32, dv_splits=1, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=32, dv_splits=1, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=16, dv_splits=1, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=16, dv_splits=2, num_warps=8, num_stages=1),
    ),
    "large": (
        SparseMLAConfig(block_h=16, block_k=32, dv_splits=1, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=32, dv_splits=1, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, dv_splits=1, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, dv_splits=2, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, dv_splits=1, num_warps=8, num_stages=2),
    ),
}

# Combine kernel: heads per program and warps (no shared memory beyond the reductions).
SPARSE_MLA_COMBINE_BLOCK_H = 16
SPARSE_MLA_COMBINE_WARPS = 4


def sparse_mla_heuristic(num_heads: int, smem_per_block: int) -> SparseMLAConfig:
    """Default config for ``num_heads`` query heads on a GPU with ``smem_per_block`` bytes.

    One head block covers all heads up to 64 (padded to a power of two >= 16); 128 heads use
    two blocks of 64. The choice is always a member of ``SPARSE_MLA_SPACE[smem_class(...)]``.
    """
    space = SPARSE_MLA_SPACE[smem_class(smem_per_block)]
    want_h = min(64, max(16, next_pow2(num_heads)))
    for cfg in space:                      # first (plain, dv_splits=1, 1 stage) entry that fits
        if cfg.block_h == want_h:
            return cfg
    return space[0]


def sparse_mla_num_splits(rows: int, topk: int, block_k: int, num_sms: int,
                          waves: float = 2.0, min_blocks_per_split: int = 2) -> int:
    """Split-K count: enough programs for ``waves`` x ``num_sms`` when ``rows`` (= B x N x head
    blocks x dv_splits) alone do not fill the GPU, each split keeping at least
    ``min_blocks_per_split`` loop iterations of ``block_k`` entries. Returns 1..ceil(K/block_k).
    """
    if rows <= 0:
        return 1
    blocks = max(1, -(-topk // block_k))
    want = max(1, math.ceil(waves * num_sms / rows))
    cap = max(1, blocks // min_blocks_per_split)
    return int(min(want, cap))


def sparse_mla_from_dict(d: dict, smem_per_block: int) -> SparseMLAConfig | None:
    """A dispatch-table config, or None when it is not a member of this GPU's search space."""
    try:
        cfg = SparseMLAConfig(**d)
    except TypeError:
        return None
    return cfg if cfg in SPARSE_MLA_SPACE[smem_class(smem_per_block)] else None
