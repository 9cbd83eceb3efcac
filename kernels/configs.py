"""Frozen tile / split configs and their heuristics, shared by both kernel stacks.

A *config* fixes the compile-time shape of a kernel launch (block sizes, warps, pipeline stages);
the *split count* (how many split-K programs share one top-k list) is a runtime choice made per
call from the GPU's SM count and the rows of work. Each op has:

* a frozen dataclass (``SparseMLAConfig``),
* an explicit search space per shared-memory class and dot-operand width
  (:data:`SPARSE_MLA_SPACE`): every config a launcher may choose. ``tests/test_triton_compile.py``
  compiles every entry for sm_120 (101,376 B shared memory per block) and sm_90 (232,448 B) and
  checks the shared memory,
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
        are masked). Each head block gathers its selected rows itself (from L2 when the head
        blocks of one request run together).
      block_k: top-k entries gathered per loop iteration (power of two >= 16).
      num_warps, num_stages: Triton launch options.
      prefetch: the loop keeps the next row block's loads in flight while it computes this one
        (a three-deep software pipeline by hand: rows, page entries, indices); without it each
        iteration issues its own block's loads back to back and waits for them.
    """

    block_h: int = 16
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 1
    prefetch: bool = True

    def to_dict(self) -> dict:
        """Plain dict (for dispatch JSON and result files)."""
        return asdict(self)


# Every config the launcher may pick, per (shared-memory class, dot operand bytes): 2 for bf16 /
# fp16 operands (bf16 / fp16 q), 4 for IEEE fp32 operands (fp32 q, twice the staging bytes).
# tests/test_triton_compile.py compiles each one for every kv_format and checks its shared
# memory against the class limit.
# The default: 32 heads x 32 entries, 8 warps, hand-pipelined loads. Measured on the H200
# (bench/results/mla_sweep_h200_20261129_v3.json, do_bench medians, B = 64, fp8): fastest of the
# sweep at DSV32 H = 128 (655 us) and H = 16 (214 us; the 16 padded heads cost less than the
# 4-warp 16-head block's lower occupancy), 5 % behind the best at DSV4_FLASH H = 64 (126.5 vs
# 120.4 us for 16 heads x 32, 4 warps). The dispatch table overrides it per shape bucket.
SPARSE_MLA_DEFAULT = SparseMLAConfig(block_h=32, block_k=32, num_warps=8, num_stages=1)

SPARSE_MLA_SPACE: dict[tuple[str, int], tuple[SparseMLAConfig, ...]] = {
    # sm_120 (99 KiB; tests/test_triton_compile.py, latent / fp8_ds_mla layouts the largest):
    # 32 heads x 64 entries and 64 x 32 need 110,592 B, so the small class stops at 32 x 32.
    ("small", 2): (
        SPARSE_MLA_DEFAULT,
        SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=16, block_k=64, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=32, num_warps=4, num_stages=1),
    ),
    # fp32 operands (fp32 q; a correctness path): 16 x 32 needs 110,592 B on sm_120.
    ("small", 4): (
        SparseMLAConfig(block_h=16, block_k=16, num_warps=4, num_stages=1),
    ),
    ("large", 2): (
        SPARSE_MLA_DEFAULT,
        SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=16, block_k=64, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=32, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=64, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=2, prefetch=False),
    ),
    ("large", 4): (
        SparseMLAConfig(block_h=16, block_k=16, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=1),
    ),
}

# Combine kernel: heads per program and warps (no shared memory beyond the reductions).
SPARSE_MLA_COMBINE_BLOCK_H = 16
SPARSE_MLA_COMBINE_WARPS = 4


def sparse_mla_space(smem_per_block: int, operand_bytes: int = 2) -> tuple[SparseMLAConfig, ...]:
    """The configs a launcher may pick on a GPU with ``smem_per_block`` bytes of shared memory
    per block, for dot operands of ``operand_bytes`` (2: bf16/fp16, 4: fp32)."""
    return SPARSE_MLA_SPACE[(smem_class(smem_per_block), 4 if operand_bytes >= 4 else 2)]


def sparse_mla_heuristic(num_heads: int, smem_per_block: int, operand_bytes: int = 2) -> SparseMLAConfig:
    """Default config for ``num_heads`` query heads on a GPU with ``smem_per_block`` bytes:
    :data:`SPARSE_MLA_DEFAULT` when it is in :func:`sparse_mla_space` (bf16 / fp16 dots), else
    the first member of the space (fp32 dots). ``num_heads`` is accepted for a future rule.
    """
    space = sparse_mla_space(smem_per_block, operand_bytes)
    del num_heads
    return SPARSE_MLA_DEFAULT if SPARSE_MLA_DEFAULT in space else space[0]


def sparse_mla_num_splits(rows: int, topk: int, block_k: int, num_sms: int,
                          waves: float = 2.0, min_blocks_per_split: int = 2) -> int:
    """Split-K count: enough programs for ``waves`` x ``num_sms`` when ``rows`` (= B x N x head
    blocks) alone do not fill the GPU, each split keeping at least
    ``min_blocks_per_split`` loop iterations of ``block_k`` entries. Returns 1..ceil(K/block_k).
    """
    if rows <= 0:
        return 1
    blocks = max(1, -(-topk // block_k))
    want = max(1, math.ceil(waves * num_sms / rows))
    cap = max(1, blocks // min_blocks_per_split)
    return int(min(want, cap))


def sparse_mla_from_dict(d: dict, smem_per_block: int, operand_bytes: int = 2) -> SparseMLAConfig | None:
    """A dispatch-table config, or None when it is not a member of this GPU's search space."""
    try:
        cfg = SparseMLAConfig(**d)
    except TypeError:
        return None
    return cfg if cfg in sparse_mla_space(smem_per_block, operand_bytes) else None


# ============================================================================ Pallas (jax_impl)
# The Pallas-Triton split kernel (kernels/pallas/sparse_mla.py) uses the same SparseMLAConfig
# without a D_v split (see its module docstring); ``prefetch`` selects its hand-pipelined loop
# as in the Triton kernel. Its tiles stage differently from the Triton kernel's (rope and scale
# bytes assembled in registers), so it has its own space, checked by
# tests/test_jax_sparse_mla.py::test_aot_compile_fits_smem (lower for CUDA, compile the Triton
# IR with Triton for sm_90 / sm_120; no GPU needed). Shared memory per block measured that way
# with bf16 dots (jax 0.10.2 lowering, Triton 3.9; 64-dim chunks, hand-pipelined loads), worst
# over the kv formats and equal on sm_90 and sm_120, block_h/block_k/warps/stages:
#   16/32/4/1: 55,296   32/16/8/1: 55,296   32/32/8/1: 73,728   64/16/8/1: 92,224 (not listed)
#   64/32/8/1: 110,720 (> 101,376: large class only)   64/32/8/2: 110,720
# i.e. about (block_h + block_k) x D_qk x 2 bytes: the q chunks and one block of converted row
# chunks (fp8_model1, D_qk = 512, needs less). Before the chunked layout 32/32/8/1 needed
# 102,400 B and was large-class only.
# fp32 dots (fp32 q, or a latent cache of another dtype than q) stage 4-byte operands: the
# launcher then uses PALLAS_SPARSE_MLA_FP32 (a correctness path, not a performance target).
# Combine launch options are shared with the Triton stack (SPARSE_MLA_COMBINE_*).

PALLAS_SPARSE_MLA_SPACE: dict[str, tuple[SparseMLAConfig, ...]] = {
    "small": (
        SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=16, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=32, num_warps=8, num_stages=1),
    ),
    "large": (
        SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=32, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=2),
    ),
}
PALLAS_SPARSE_MLA_FP32 = SparseMLAConfig(block_h=16, block_k=16, num_warps=4,
                                         num_stages=1)

# Shared memory (bytes) each config uses, measured by the AOT compile above, worst over the
# kv formats, keyed by (config, dot operand bytes); the compile test asserts the measured value
# stays at or below these, and the launcher gates with them before launch.
PALLAS_SPARSE_MLA_SMEM: dict[tuple[SparseMLAConfig, int], int] = {
    (SparseMLAConfig(16, 32, 4, 1), 2): 55_296,
    (SparseMLAConfig(32, 16, 8, 1), 2): 55_296,
    (SparseMLAConfig(32, 32, 8, 1), 2): 73_728,
    (SparseMLAConfig(64, 32, 8, 1), 2): 110_720,
    (SparseMLAConfig(64, 32, 8, 2), 2): 110_720,
    (PALLAS_SPARSE_MLA_FP32, 4): 73_792,
}


def pallas_sparse_mla_smem(cfg: SparseMLAConfig, operand_bytes: int) -> int:
    """Shared-memory bytes of a Pallas config for dot operands of ``operand_bytes`` (2 or 4):
    the measured value when the pair is in :data:`PALLAS_SPARSE_MLA_SMEM`, else a conservative
    estimate (q, k and p tiles in the operand dtype, twice)."""
    known = PALLAS_SPARSE_MLA_SMEM.get((cfg, operand_bytes))
    if known is not None:
        return known
    return 2 * operand_bytes * (cfg.block_h * 576 + cfg.block_k * 576 + cfg.block_h * cfg.block_k)


def pallas_sparse_mla_heuristic(num_heads: int, smem_per_block: int,
                                operand_bytes: int = 2) -> SparseMLAConfig:
    """Default Pallas config: the Triton twin's :data:`SPARSE_MLA_DEFAULT` (32 heads x 32
    entries, 8 warps, pipelined loads; the two kernels now share their structure) when it is in
    the Pallas space, else the space's first member; fp32 operands use
    :data:`PALLAS_SPARSE_MLA_FP32`."""
    if operand_bytes >= 4:
        return PALLAS_SPARSE_MLA_FP32
    del num_heads
    space = PALLAS_SPARSE_MLA_SPACE[smem_class(smem_per_block)]
    return SPARSE_MLA_DEFAULT if SPARSE_MLA_DEFAULT in space else space[0]


def pallas_sparse_mla_from_dict(d: dict, smem_per_block: int) -> SparseMLAConfig | None:
    """A dispatch-table config for the Pallas kernel (bf16 / fp16 operands), or None when it is
    not in its space."""
    try:
        cfg = SparseMLAConfig(**d)
    except TypeError:
        return None
    return cfg if cfg in PALLAS_SPARSE_MLA_SPACE[smem_class(smem_per_block)] else None
