"""Frozen configs of the few-token GEMM (``kernels/linear/triton.py``), their search spaces and
heuristics, and the split-K count.

* :class:`LinearConfig`: the compile-time tile (weight rows x padded tokens x K block), warps and
  pipeline stages of one launch.
* :data:`LINEAR_SPACE`: every config a launcher may choose, per (shared-memory class, weight
  operand bytes, ``block_m``). ``tests/test_triton_compile.py`` compiles each one (every operand
  dtype, split and unsplit) for sm_120 (101,376 B of shared memory per block) and sm_90 and
  checks the shared memory.
* :func:`linear_heuristic`: the default config of a call (a member of the space).
* :func:`linear_num_splits`: the split-K count, a runtime choice from the SM count and the tiles.

Standard library only (no NumPy, no framework), like ``kernels.sparse_mla.configs``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from kernels.sparse_mla.configs import SMEM_PER_SM, smem_class

MAX_M = 64
"""The most tokens (rows of x) one launch takes; more belong to an ordinary GEMM."""

BLOCK_MS = (16, 32, 64)
"""Token tiles: M padded up to the next one (16 is the smallest dot operand)."""

MAX_SPLITS = 128
"""Upper bound of the split-K count (the per-tile partials the last program adds)."""

REDUCE_BYTES = 256 * 1024
"""At most this many partial bytes (``num_splits * block_n * M * 4``) are added by the last
program of a tile: its loads are a serial tail after the weights have streamed (one SM reads
them from L2), so the split count drops with M (a reduction cap, not a tuned number)."""


F32_DOTS = ("ieee", "tf32x3")
"""The fp32-weight dot precisions a config may name (:attr:`LinearConfig.f32_dot`)."""


@dataclass(frozen=True)
class LinearConfig:
    """Compile-time shape of one launch of ``_linear_kernel``.

    Attributes:
      block_n: weight rows per program, the dot's M (16-bit weights: a multiple of 64, so sm_90
        runs wgmma; fp32 weights run an fp32 FMA dot, any power of two >= 16, or with
        ``f32_dot`` "tf32x3" a tensor-core one, 64).
      block_m: tokens per program, M padded up (16, 32 or 64: the dot's N).
      block_k: K per loop iteration (the pipelined tile is ``block_n x block_k`` weights and
        ``block_m x block_k`` tokens).
      num_warps, num_stages: Triton launch options (``num_stages`` buffers, ``num_stages - 1``
        tiles in flight).
      f32_dot: fp32 weights only: the dot's ``input_precision``, "ieee" (an fp32 FMA dot on
        the CUDA cores) or "tf32x3" (three tf32 tensor-core passes, error ~2^-22 of
        ``sum |x w|`` a product, far inside the linear check's ``2 K u32 sum |x w|``).
    """

    block_n: int = 128
    block_m: int = 16
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    f32_dot: str = "ieee"

    def __post_init__(self):
        if self.f32_dot not in F32_DOTS:
            raise ValueError(f"f32_dot: expected one of {F32_DOTS}, got {self.f32_dot!r}")

    def to_dict(self) -> dict:
        """Plain dict (result files, dispatch JSON)."""
        return asdict(self)

    @property
    def reduce_unroll(self) -> int:
        """Partial tiles the split-K reduction loads per step (``REDUCE_UNROLL``): 4, or 2 for
        tiles of more than 4096 elements (128 x 64: four more fp32 tiles in registers spill)."""
        return 4 if self.block_n * self.block_m <= 4096 else 2

    def smem_bytes(self, w_bytes: int, x_bytes: int, wgmma: bool) -> int:
        """Shared memory of the pipeline buffers, an estimate of the compiled kernel's (the AOT
        compile reports it exactly): ``num_stages`` buffers of both tiles where the dot is
        wgmma (sm_90, 16-bit weights), ``num_stages - 1`` on the mma.sync / FMA pipelines
        (Triton 3.6); the epilogue reuses them. The FMA dot of fp32 weights with 16-bit x adds
        one float32 x tile (the widened tokens' layout conversion). Equal to every sm_120
        compile report of the space (``tests/test_triton_compile.py``); on sm_90 the tf32x3
        tiles take 4-8 KiB more than this (2026-12-08 compiles)."""
        buffers = self.num_stages if wgmma else self.num_stages - 1
        widened = (self.block_k * self.block_m * 4
                   if w_bytes == 4 and x_bytes == 2 and self.f32_dot == "ieee" else 0)
        return buffers * self.block_k * (self.block_n * w_bytes + self.block_m * x_bytes) + widened


def _space(w_bytes: int, bm: int, cls: str) -> tuple[LinearConfig, ...]:
    """The configs of one (weight bytes, block_m) for a shared-memory class, the heuristic's
    default first and a shallow one (two buffers, for K of one or two blocks) last.

    16-bit weights, sm_90 (``large``; wgmma keeps ``num_stages`` buffers): the default holds two
    programs per SM (<= 113 KiB each) with 64-96 KiB of weights in flight per SM; the others
    trade depth against programs per SM. sm_120 (``small``, 99 KiB per block; its mma.sync
    pipeline keeps ``num_stages - 1`` buffers): one program per SM with 48-80 KiB in flight.
    fp32 weights (an fp32 FMA dot, either class): 2-8 KiB tiles, several programs per SM; with
    16-bit x the widened token tile is held in registers per K step, so ``block_k * block_m``
    stays <= 1024 (no spills in the AOT compiles; 64 x 16 x 32 takes 224-250 registers with
    16-bit x, so the lighter 64 x 16 x 16 comes first); then one tf32x3 tile (tensor cores:
    6-12 HGMMA a K step on sm_90, 75-138 registers, no spills; bench/NOTES.md fifteenth
    session)."""
    C = LinearConfig
    if w_bytes == 4:
        # the FMA dot's configs (the heuristic's), then one 64-row tf32x3 tile a token width
        # (sweep-only until measured: bench/NOTES.md "B 64 projections"; AOT probe of 64 x 64 x 16:
        # sm_90 6 HGMMA a K step where the FMA dot runs 512 FFMA a warp)
        return {16: (C(64, 16, 16, 4, 6), C(64, 16, 32, 4, 4), C(64, 16, 32, 4, 4, "tf32x3")),
                32: (C(64, 32, 16, 4, 6), C(32, 32, 32, 4, 4), C(64, 32, 16, 4, 6, "tf32x3")),
                64: (C(32, 64, 16, 4, 6), C(64, 64, 16, 4, 4), C(64, 64, 16, 4, 4, "tf32x3"))}[bm]
    if cls == "large":
        deep = {16: C(128, 16, 128, 4, 3), 32: C(128, 32, 64, 4, 4), 64: C(128, 64, 64, 4, 4)}[bm]
        return (deep, C(128, bm, 128, 4, 4), C(128, bm, 64, 4, 6), C(64, bm, 128, 4, 4),
                C(256, bm, 64, 8, 4), C(128, bm, 64, 4, 2))
    return {16: (C(128, 16, 64, 4, 6), C(64, 16, 128, 4, 5), C(64, 16, 64, 4, 6), C(128, 16, 64, 4, 3)),
            32: (C(128, 32, 64, 4, 5), C(128, 32, 128, 4, 3), C(64, 32, 64, 4, 6), C(128, 32, 64, 4, 3)),
            64: (C(128, 64, 64, 4, 5), C(64, 64, 128, 4, 4), C(128, 64, 128, 4, 3), C(128, 64, 64, 4, 3))}[bm]


LINEAR_SPACE: dict[tuple[str, int, int], tuple[LinearConfig, ...]] = {
    (cls, wb, bm): _space(wb, bm, cls) for cls in ("small", "large") for wb in (2, 4) for bm in BLOCK_MS
}
"""Every config a launcher may choose, keyed by (shared-memory class, weight operand bytes,
block_m). Weight bytes 2: bf16 / fp16 weights (x the same dtype); 4: fp32 weights (x fp32, bf16
or fp16)."""


def block_m_for(M: int) -> int:
    """The token tile of M rows: the smallest of :data:`BLOCK_MS` >= M.

    Raises:
      ValueError: M outside ``[1, MAX_M]``.
    """
    for bm in BLOCK_MS:
        if 1 <= M <= bm:
            return bm
    raise ValueError(f"M: expected 1 <= M <= {MAX_M}, got {M}")


def linear_space(smem_per_block: int, w_bytes: int, M: int) -> tuple[LinearConfig, ...]:
    """The configs a call of M tokens with ``w_bytes``-byte weights may run on a GPU with
    ``smem_per_block`` bytes of shared memory per block."""
    return LINEAR_SPACE[(smem_class(smem_per_block), 4 if w_bytes == 4 else 2, block_m_for(M))]


def linear_heuristic(M: int, N: int, K: int, w_bytes: int, smem_per_block: int) -> LinearConfig:
    """Default config of a call: the space's first entry (sm_90: 128 weight rows, two programs
    per SM; sm_120: 128 x 64 tiles, 5 buffers), except

    * N below its ``block_n`` (fp32 ``weights_proj``, N 64): the entry with the smallest
      ``block_n`` (fewer masked rows);
    * K of at most two ``block_k`` blocks (the per-head ``wkv_b`` products, K 128): the space's
      last, shallow entry (two buffers, so several programs share an SM and the loads of the
      next programs overlap this one's).

    Always a member of :func:`linear_space`."""
    space = linear_space(smem_per_block, w_bytes, M)
    cfg = space[0]
    if N < cfg.block_n:
        cfg = min(space, key=lambda c: (c.block_n, space.index(c)))
    elif w_bytes != 4 and -(-K // cfg.block_k) <= 2:
        cfg = space[-1]
    return cfg


def ctas_per_sm(cfg: LinearConfig, w_bytes: int, x_bytes: int, smem_per_block: int) -> int:
    """Programs of ``cfg`` one SM holds at once, by shared memory (the pipeline buffers:
    :meth:`LinearConfig.smem_bytes`, wgmma on the large class with 16-bit weights) and warps
    (at most 16 warps of this kernel per SM are assumed: registers are 50-255 per thread in the
    AOT compiles); at least 1."""
    cls = smem_class(smem_per_block)
    wgmma = cls == "large" and w_bytes == 2
    by_smem = SMEM_PER_SM[cls] // (cfg.smem_bytes(w_bytes, x_bytes, wgmma) + 1024)
    return max(1, min(by_smem, 16 // cfg.num_warps))


def split_geometry(K: int, block_k: int, num_splits: int) -> tuple[int, int]:
    """``(k_per_split, splits)``: K columns per split (whole ``block_k`` blocks) and the split
    count that leaves no split empty (<= ``num_splits``)."""
    blocks = -(-K // block_k)
    per = -(-blocks // max(1, min(num_splits, blocks)))
    return per * block_k, -(-blocks // per)


def linear_num_splits(cfg: LinearConfig, M: int, N: int, K: int, G: int, num_sms: int,
                      w_bytes: int, x_bytes: int, smem_per_block: int) -> int:
    """Split-K count of a call: the most splits whose programs (``N tiles x G x splits``) still
    fit in one wave of the GPU (``num_sms x`` :func:`ctas_per_sm`), at least 1, at most
    :data:`MAX_SPLITS`, one ``block_k`` block per split at least, and with at most
    :data:`REDUCE_BYTES` of partials per tile for its last program to add. Unsplit when the N
    tiles alone fill a wave: every program then streams its weight rows once with
    ``num_stages - 1`` tiles in flight, and any program beyond the wave reuses a free slot."""
    tiles = -(-N // cfg.block_n) * G
    slots = num_sms * ctas_per_sm(cfg, w_bytes, x_bytes, smem_per_block)
    if tiles >= slots:
        return 1
    blocks = -(-K // cfg.block_k)
    cap = max(1, REDUCE_BYTES // (cfg.block_n * M * 4))
    want = max(1, min(slots // tiles, MAX_SPLITS, blocks, cap))
    return split_geometry(K, cfg.block_k, want)[1]


def linear_from_dict(d: dict, smem_per_block: int, w_bytes: int, M: int) -> LinearConfig | None:
    """The config a dict names (dispatch table, CLI) when it is a member of the call's space,
    else None (a table can never pick a config that was not compiled and checked)."""
    try:
        cfg = LinearConfig(**d)
    except (TypeError, ValueError):
        return None
    return cfg if cfg in linear_space(smem_per_block, w_bytes, M) else None


@dataclass(frozen=True)
class GemvConfig:
    """Compile-time shape of one launch of ``_gemv_kernel`` (one token, no tensor cores).

    Attributes:
      block_n: weight rows per program; block_k: K per loop iteration (the fp32 product tile
        is ``block_n x block_k``); num_warps: Triton launch option.
    """

    block_n: int
    block_k: int
    num_warps: int = 4

    def to_dict(self) -> dict:
        """Plain dict (result files)."""
        return asdict(self)


GEMV_SPACE = {
    "k_major": (GemvConfig(1, 2048, 4), GemvConfig(2, 1024, 4), GemvConfig(4, 1024, 4),
                GemvConfig(4, 2048, 8), GemvConfig(8, 512, 4), GemvConfig(8, 1024, 8)),
    "n_major": (GemvConfig(128, 16, 4), GemvConfig(256, 16, 8), GemvConfig(128, 32, 8),
                GemvConfig(64, 32, 4)),
}
"""The one-token kernel's configs swept by ``bench.linear_sweep`` (M = 1 rows), by the weight's
unit-stride dim: a K-major weight (a linear layer's ``[out, in]``) wants a few rows of long K
blocks (8-16 KiB of bf16 a tile, ~32-64 fp32 product registers a thread); an N-major weight
(``wkv_b``'s key half read as ``w^T``) wants 128-byte rows along N."""


GEMV_PICKS = {"k_major": (GemvConfig(1, 2048, 4), GemvConfig(2, 1024, 4), GemvConfig(8, 512, 4)),
              "n_major": (GemvConfig(64, 32, 4),)}
"""The configs :func:`gemv_heuristic` returns (the fastest of :data:`GEMV_SPACE` at the layer's
one-token projections, H100, 2026-12-06: ``bench/results/linear_sweep_h100_20261206.json``)."""


GEMV_PAIR_PICKS = ((GemvConfig(2, 1024, 4), GemvConfig(1, 2048, 4)),
                   (GemvConfig(8, 512, 4), GemvConfig(1, 2048, 4)))
"""The config pairs ``kernels.linear.triton._gemv_pair_kernel`` is launched at (each product
at its own :func:`gemv_heuristic` pick; other pairs run as two launches): the layer's
``x_proj`` (2 x 1,024 where 1,024 divides K, else 8 x 512) with its ``weights_proj`` (64 rows:
1 x 2,048)."""


def gemv_heuristic(N: int, K: int, groups: int, n_major: bool, num_sms: int) -> GemvConfig:
    """The one-token kernel's config of a call (one of :data:`GEMV_PICKS`), from the M = 1 sweep
    of both presets' projections (H100, 2026-12-06, ``linear_sweep_h100_20261206.json``;
    bench/NOTES.md "One-token projections: measured"):

    * N-major weights: ``64 x 32`` (9.8 us at ``wkv_b_q`` against 11.7-13.9 for the other three;
      the binding runs N-major one-token calls on the tensor-core kernel, 8.0 us there).
    * K-major, where programs of two rows would not give every SM one (``ceil(N / 2) * groups <
      num_sms``: the fp32 ``weights_proj``, 64 rows): ``1 x 2048`` (3.7 / 2.7 us against 5.5 /
      3.6 at ``2 x 1024``).
    * K-major with 1,024 dividing K: ``2 x 1024`` (``x_proj``, V4 ``wq_b`` and ``indexer.wq_b``,
      ``wo``, ``wo_b``: the fastest; ``wo_a``: 25.3 against 25.2 us).
    * Otherwise (K 1,536 and 512: V3.2 ``wq_b`` and ``indexer.wq_b``, ``wkv_b_v``): ``8 x 512``
      (27.4 against 29.0 us, 11.1 against 11.4, 7.7 against 10.2).
    """
    if n_major:
        return GEMV_PICKS["n_major"][0]
    if -(-N // 2) * groups < num_sms:
        return GEMV_PICKS["k_major"][0]
    return GEMV_PICKS["k_major"][1] if K % 1024 == 0 else GEMV_PICKS["k_major"][2]
