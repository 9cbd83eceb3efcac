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
    """Compile-time shape of the split-K sparse MLA decode kernel (kernels/sparse_mla/triton.py).

    Attributes:
      block_h: query heads per program (power of two >= 16, the tl.dot minimum; 8 also for
        ``kernel="gluon_sh"``, whose heads are wgmma's N; heads beyond H are masked). Each head
        block gathers its selected rows itself (from L2 when the head blocks of one request run
        together).
      block_k: top-k entries gathered per loop iteration (power of two >= 16).
      num_warps, num_stages: Triton launch options.
      prefetch: the loop keeps the next row block's loads in flight while it computes this one
        (a three-deep software pipeline by hand: rows, page entries, indices); without it each
        iteration issues its own block's loads back to back and waits for them.
      kernel: ``"triton"`` (kernels/sparse_mla/triton.py), ``"triton_rows"`` (the same kernel
        with the gathered rows on the dots' M axis, ``ROWS_M``; in no space: a test and count
        variant), ``"gluon_shws"`` (kernels/sparse_mla/gluon_small_ws.py: ``"gluon_sh"``'s
        math, warp-specialised, ``block_h`` 8 or 16, ``num_stages`` X slots; both in the sm_90
        space),
        ``"gluon_sh"``
        (kernels/sparse_mla/gluon_small.py: sm_90 only, fp8 caches with 16-bit q, rows on wgmma
        M and ``block_h`` in (8, 16, 32) heads on N; ``block_k`` 64, one X buffer), ``"gluon"``
        (kernels/sparse_mla/gluon.py: sm_90 only, fp8 caches with 16-bit q; its tile is
        fixed at 64 heads x 64 rows, 8 warps, and the fields above describe it) or
        ``"gluon_ws"`` (kernels/sparse_mla/gluon_ws.py: the same, warp-specialised, for the fp8
        caches and 16-bit latent caches with q of their dtype; 8 consumer warps plus an 8-warp
        (fp8) or 4-warp (latent) producer, ``num_stages`` X slots) or ``"gluon_xo"``
        (kernels/sparse_mla/gluon_xo.py: ``"gluon_ws"``'s tile for the fp8 caches, two CTAs of a
        cluster converting half of each row block each; an even number of 64-head blocks) or
        ``"gluon_xs"`` (kernels/sparse_mla/gluon_xs.py: ``"gluon_xo"``'s producer and clusters
        with a seesaw consumer, fp8_ds_mla only; ``num_warps`` 4, consumer warpgroup 0's).
      maxnreg: registers a thread the compiler may use (ptxas ``.maxnreg``), or None for its own
        choice; set only on ``"gluon_sh"`` configs, to reach more CTAs an SM (65,536 registers
        an SM: 8 warps at <= 128 registers give 2 CTAs, at 158 one).
    """

    block_h: int = 16
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 1
    prefetch: bool = True
    kernel: str = "triton"
    maxnreg: int | None = None

    def to_dict(self) -> dict:
        """Plain dict (for dispatch JSON and result files); ``kernel`` only when it is not the
        default ``"triton"`` and ``maxnreg`` only when set (so tables written before the
        fields existed still match)."""
        d = asdict(self)
        if d["kernel"] == "triton":
            del d["kernel"]
        if d["maxnreg"] is None:
            del d["maxnreg"]
        return d


# Every config the launcher may pick, per (shared-memory class, dot operand bytes): 2 for 16-bit
# operands (bf16 / fp16 q; the fp8 formats run fp16 nope dots), 4 for IEEE fp32 operands (fp32
# q, twice the staging bytes). tests/test_triton_compile.py compiles each one for every
# kv_format and checks its shared memory against the class limit.
# The kernel converts each gathered chunk once for both dots (fp16 for the fp8 formats). AOT
# compile reports, Triton 3.6.0, sm_90, fp8_ds_mla / fp8_model1, bf16 q (2026-12-01; registers,
# shared bytes, spill-store bytes):
#   32 x 32, 8 warps, 1 stage, prefetch:     240 / 255 regs, 73,856 / 67,584 B, no spill
#   64 x 32, 8 warps, 1 stage, no prefetch:  255, 110,848 / 98,560 B, 4 / 36 B spilled
#   64 x 32, 8 warps, 2 stages, no prefetch: 255, 132,864 / 117,504 B, 28 / 96 B spilled
#   16 x 32, 4 warps, 1 stage, prefetch:     255, 55,360 / 50,176 B, 252 / 248 B spilled
#   16 x 32, 4 warps, 2 stages, no prefetch: 255, 105,984 / 92,672 B, no spill (large class)
#   64 x 64 (8 warps) and 32 x 32 with 4 warps spill 436-844 B.
# Measured on the H200 (bench/results/mla_sweep_h200_20261201.json, do_bench medians with the L2
# flushed, fp8 caches, bf16 q; rows under ~150 us are launch-bound there, see bench/NOTES.md):
#   B 64 H 128 K 2048: 64x32 s2 331.6, 64x32 s1 343.8, 32x32 502.2, 16x32 s2 540.2 us
#   B 64 H 64:  64x32 s2 180.0, 16x32 s2 276.2, 32x32 255.5
#   B 16 H 128: 16x32 s2 169.1, 64x32 s1 278.9, 32x32 299.3
#   B 64 H 16:  16x32 s2 264.4, 32x32 273.3;  V4 B 64 H 64 K 640: 32x32 147.0, 64x32 s2 165.6
SPARSE_MLA_DEFAULT = SparseMLAConfig(block_h=32, block_k=32, num_warps=8, num_stages=1)
SPARSE_MLA_SMALL_H = SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=1)
SPARSE_MLA_W64 = SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=2, prefetch=False)
SPARSE_MLA_N16 = SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=2, prefetch=False)
# The Gluon kernel (sm_90, wgmma; AOT Triton 3.6.0: 255 registers, 4 B spilled (fp8_ds_mla) /
# 104 B (fp8_model1), 151,552 / 135,168 B shared, 1 CTA per SM)
SPARSE_MLA_GLUON = SparseMLAConfig(block_h=64, block_k=64, num_warps=8, num_stages=1,
                                   prefetch=True, kernel="gluon")
# ... with two X buffers (num_stages = buffers: the next block is stored while the value dots
# of this one run): 255 registers, 160 / 292 B spilled, 225,280 / 200,704 B shared
# (kv_format, D_qk) pairs the Gluon kernel is built for
GLUON_FORMATS = (("fp8_ds_mla", 576), ("fp8_model1", 512))


def gluon_eligible(dev, kv_format: str | None, d_qk: int | None, operand_bytes: int) -> bool:
    """Whether the Gluon kernel (kernels/sparse_mla/gluon.py) can run a call on ``dev``
    (``kernels.hardware.DeviceInfo``): sm_90 (wgmma) outside the interpreter, an fp8 cache at its
    D_qk (:data:`GLUON_FORMATS`) and 16-bit dot operands (``operand_bytes`` 2: bf16 / fp16 q).
    The heuristic's and the launcher's one rule (:func:`kernel_eligible`)."""
    return kernel_eligible("gluon", dev, kv_format, d_qk, operand_bytes)


# The warp-specialised Gluon kernel (kernels/sparse_mla/gluon_ws.py; sm_90 only: wgmma and
# setmaxnreg): 64 heads x 64 rows, num_stages = the X ring's slots (2). fp8 caches: 8 consumer
# warps + an 8-warp producer that dequantizes; latent (16-bit q of the cache's dtype): 8
# consumer warps + a 4-warp producer that copies the rows into the slot with cp.async (AOT,
# Triton 3.6.0: consumer 232 registers, no spill, 230,436 B shared; bench/NOTES.md).
SPARSE_MLA_GLUON_WS = SparseMLAConfig(block_h=64, block_k=64, num_warps=8, num_stages=2,
                                      prefetch=True, kernel="gluon_ws")
# (kv_format, D_qk) pairs the warp-specialised kernel is built for
GLUON_WS_FORMATS = (("fp8_ds_mla", 576), ("fp8_model1", 512), ("latent", 576))
# formats whose heuristic picks it (measured faster than the one-partition Gluon kernel on the
# H200: fp8_ds_mla at every target row; fp8_model1 slower, 62.8 vs 57.3 us; 16-bit latent caches
# against the Triton 64 x 32 tile, 2026-12-05: B 64 H 128 126.8 vs 592.0 us, H 64 78.3 vs 313.2,
# B 16 45.3 vs 110.0, B 128 258.3 vs 1175.6, B 1 14.8 vs 14.6,
# bench/results/gluon_check_latent_h200_20261205.json)
GLUON_WS_PICKED = ("fp8_ds_mla", "latent")


# The crossover kernel (kernels/sparse_mla/gluon_xo.py; sm_90 only): gluon_ws's tile, the two
# 64-head CTAs of a request in one cluster, each gathering and converting half of every row
# block and copying it into the other's shared memory (FlashMLA's crossover). AOT (Triton 3.6.0,
# fp8_ds_mla, bf16 q): 226,440 B shared, producer 440 SASS a warp a block (32 F2FP against 64),
# consumer 768. Measured (H100, 2026-12-06, bench/results/gluon_check_xo_h100_20261206.json):
# correct, 5-15 % slower than gluon_ws (its consumer the bound), so in no space: the binding runs
# it when a call passes it as ``config`` and the heads make an even number of 64-head blocks
# (:func:`gluon_xo_heads_ok`; else :data:`SPARSE_MLA_GLUON_WS`); GLUON_XO_PICKED empty.
SPARSE_MLA_GLUON_XO = SparseMLAConfig(block_h=64, block_k=64, num_warps=8, num_stages=2,
                                      prefetch=True, kernel="gluon_xo")
GLUON_XO_PICKED: tuple = ()

# The crossover kernel with a "seesaw" consumer (kernels/sparse_mla/gluon_xs.py; sm_90 only,
# fp8_ds_mla only): gluon_xo's producer and clusters, two consumer warpgroups that own
# alternate row blocks (whole-block scores, half of O each), so one's softmax overlaps the
# other's wgmmas (bench/NOTES.md "Fourteenth session": gluon_xo measured consumer-bound).
# ``num_warps`` 4: the default partition is consumer warpgroup 0 (16 warps in all); producer
# 64 registers, consumers 192. AOT (Triton 3.6.0, bf16 q): 224,344 B shared, consumer loops
# 1,090 / 1,147 SASS a warp per own + other's block. Measured on an H100 (2026-12-06,
# bench/results/gluon_check_xsroll_h100_20261206.json): correct; B 64 H 128 132.3 us (gluon_ws
# 141.6-142.6 in the day's other calls), B 128 259.9 (277.7-279.5), B 16 49.8 (51.2-51.4),
# B 1 18.2 (15.7-15.9). Picked for fp8_ds_mla with its producer's L2 hint of the next block
# (gluon_xs.L2_PREFETCH): in the bench's rows (block tables, H100, 2026-12-06, one call,
# bench/results/bench_h100_targets_mla_20261206_{ws,xspf}.json) B 64 H 128 131.9 us against
# gluon_ws's 148.5, B 16 46.6 / 53.8, B 128 257.5 / 291.7, B 64 N 2 255.7 / 289.9; without the
# hint 162.2 at B 64 (bench_h100_targets_torch_20261206_xs_nopf.json); 5,000 stress launches a
# shape bitwise equal (gluon_check_xs2_h100_20261206.json). In the large class's space; the
# heuristic picks it only for the formats of GLUON_XS_PICKED, at even 64-head blocks
# (:func:`gluon_xo_heads_ok`) and at least GLUON_XS_MIN_ROWS (request, draft) rows (B 1 measured
# slower); elsewhere, and under a Triton other than 3.6 (``gluon_cluster.CLUSTER_TRITON``), the
# binding runs :data:`SPARSE_MLA_GLUON_WS` for it.
SPARSE_MLA_GLUON_XS = SparseMLAConfig(block_h=64, block_k=64, num_warps=4, num_stages=2,
                                      prefetch=True, kernel="gluon_xs")
GLUON_XS_PICKED: tuple = ("fp8_ds_mla",)
GLUON_XS_MIN_ROWS = 16


# the kernels launched in clusters of two 64-head CTAs (gluon_xo.launch_cluster)
CLUSTER_KERNELS = ("gluon_xo", "gluon_xs")


def gluon_xo_heads_ok(num_heads: int) -> bool:
    """Whether ``num_heads`` make whole clusters of the crossover kernel: an even number of
    64-head blocks (H 65..128, 193..256, ...)."""
    return -(-num_heads // 64) % 2 == 0


def gluon_ws_eligible(dev, kv_format: str | None, d_qk: int | None, operand_bytes: int) -> bool:
    """Whether the warp-specialised Gluon kernel (kernels/sparse_mla/gluon_ws.py) can run a call
    on ``dev``: exactly sm_90 (wgmma, setmaxnreg; not sm_100 / sm_120) outside the interpreter,
    an fp8 cache or a latent one at its D_qk (:data:`GLUON_WS_FORMATS`), 16-bit dot operands
    (for latent: q and the cache of one 16-bit dtype; ``triton_launch.dot_dtype``). A latent
    call also needs its rows 16-byte aligned (:func:`gluon_ws_latent_layout_ok`, checked by the
    binding on the tensor)."""
    return kernel_eligible("gluon_ws", dev, kv_format, d_qk, operand_bytes)


def gluon_ws_latent_layout_ok(page_stride: int, row_stride: int, num_pages: int, page_size: int,
                              d_qk: int, data_ptr: int, elem_bytes: int) -> bool:
    """Whether the warp-specialised kernel can copy a latent cache's rows in place: rows of
    ``d_qk`` elements packed in a page (``row_stride == d_qk``, or one slot a page), pages
    (``page_stride`` elements apart) and the first row on 16-byte boundaries, 16-bit elements.
    Its producer copies each row as 16-byte vectors (``cp.async``) from ``page * page_stride +
    off * d_qk``; elsewhere the binding runs the Triton 64-head tile (any strides)."""
    return (elem_bytes == 2 and data_ptr % 16 == 0
            and (page_size == 1 or row_stride == d_qk)
            and (num_pages == 1 or (page_stride * elem_bytes) % 16 == 0))


def kernel_eligible(kernel: str, dev, kv_format: str | None, d_qk: int | None,
                    operand_bytes: int) -> bool:
    """Whether a config's ``kernel`` can run a call on ``dev``: ``"triton"`` everywhere; the
    Gluon kernels (``"gluon"``, ``"gluon_ws"``, ``"gluon_sh"``, ``"gluon_shws"``,
    ``"gluon_xo"``, ``"gluon_xs"``) on exactly sm_90 (wgmma; the WS kernels also setmaxnreg, the
    crossover ones clusters) outside the interpreter, with 16-bit dot operands, for the
    (kv_format, D_qk) pairs each is built for (:data:`GLUON_KERNEL_FORMATS`; ``"gluon_ws"``: fp8
    and latent, ``"gluon_xs"``: fp8_ds_mla, the others fp8 only)."""
    built = GLUON_KERNEL_FORMATS.get(kernel)
    if built is None:
        return True
    return (not dev.interpret and tuple(dev.cc) == (9, 0) and operand_bytes == 2
            and (kv_format, d_qk) in built)


# (kv_format, D_qk) pairs each Gluon kernel is built for; "gluon_sh" (kernels/sparse_mla/
# gluon_small.py: rows on wgmma M, block_h heads on N with block_h / warpgroups a multiple of
# 8, 4 or 8 warps) takes the fp8 formats as "gluon" does
GLUON_KERNEL_FORMATS = {"gluon": GLUON_FORMATS, "gluon_ws": GLUON_WS_FORMATS,
                        "gluon_sh": GLUON_FORMATS, "gluon_shws": GLUON_FORMATS,
                        "gluon_xo": GLUON_FORMATS,
                        "gluon_xs": (("fp8_ds_mla", 576),)}


SPARSE_MLA_GLUON2 = SparseMLAConfig(block_h=64, block_k=64, num_warps=8, num_stages=2,
                                    prefetch=True, kernel="gluon")

# The few-heads Gluon kernel (kernels/sparse_mla/gluon_small.py; sm_90 only: wgmma): 64 gathered
# rows on wgmma M, block_h heads on N (8, 16 or 32), one X buffer. AOT compile reports, Triton
# 3.6.0, sm_90, bf16 q, partial outputs, fp8_ds_mla / fp8_model1 (registers, shared bytes ->
# CTAs per SM on the H200; bench/NOTES.md "Small heads: rows on wgmma M"):
#   h8  w4: 247 / 242 registers, 84,352 / 77,184 B   -> 2 CTAs (8 warps)
#   h16 w4: 255 / 255 (12 B spilled), 94,720 / 88,576 B -> 2 CTAs (8 warps)
#   h16 w8: 158 / 162 registers, same shared bytes     -> 1 CTA (registers)
#   h32 w8: 219 / 220 registers, 115,456 / 111,360 B   -> 1 CTA
# The main loop of h16 w4 is 1,318 SASS instructions a warp per 64-row block: 5.1 per (row,
# head), against 11.8 for the Triton 16 x 32 tile it would replace.
SPARSE_MLA_GLUON_SH8 = SparseMLAConfig(block_h=8, block_k=64, num_warps=4, num_stages=1,
                                       prefetch=True, kernel="gluon_sh")
SPARSE_MLA_GLUON_SH16 = SparseMLAConfig(block_h=16, block_k=64, num_warps=4, num_stages=1,
                                        prefetch=True, kernel="gluon_sh")
SPARSE_MLA_GLUON_SH16W8 = SparseMLAConfig(block_h=16, block_k=64, num_warps=8, num_stages=1,
                                          prefetch=True, kernel="gluon_sh")
SPARSE_MLA_GLUON_SH32 = SparseMLAConfig(block_h=32, block_k=64, num_warps=8, num_stages=1,
                                        prefetch=True, kernel="gluon_sh")
# Sweep-only (in no space yet): h16 w8 held to 128 registers (ptxas .maxnreg), 2 CTAs = 16 warps
# an SM instead of 1 CTA (8 warps) at 158 registers. AOT (Triton 3.6.0, sm_90, bf16 q, partial):
# fp8_ds_mla 64 B spilled, loop 897 SASS (14 LDL reloads, no STL) against 867; fp8_model1 80 B,
# 914 (18 LDL) against 878. Measured slower (H100, mla_sweep_small_heads_h100_20261205.json):
# V3.2 B 64 H 16 85.3 us against 71.1 for h16 w4; bench/NOTES.md "Few-heads kernel at 16 warps
# an SM: rejected".
SPARSE_MLA_GLUON_SH16W8R128 = SparseMLAConfig(block_h=16, block_k=64, num_warps=8, num_stages=1,
                                              prefetch=True, kernel="gluon_sh", maxnreg=128)
# The warp-specialised few-heads kernel (kernels/sparse_mla/gluon_small_ws.py): an 8-warp
# producer converts row blocks into ``num_stages`` X slots, two 4-warp consumers take alternate
# blocks and merge at the end; num_warps is consumer 0's (16 warps in all), one CTA an SM
# (shared memory). The 8-head config is in the sm_90 space and picked for the formats of
# GLUON_SHWS_PICKED up to GLUON_SHWS_PICKED_MAX_HEADS heads: H200, 2026-12-05 (ninth session,
# bench/results/mla_sweep_small_heads_h200_20261205b.json, CUDA-graph timed, checked against the
# reference; gluon_check 138/138): V4-Flash B 64 H 8 fp8_model1 22.3 us against 28.7 for the
# one-partition few-heads kernel. The 16-head config was sweep-only (V3.2 B 64 H 16 66.0
# against 65.2, V4 B 64 H 64 (four 16-head blocks) 58.8 against 49.3 for the 64-head kernel)
# until the producer's L2 hint: picked for GLUON_SHWS16_PICKED (below) since 2026-12-06.
SPARSE_MLA_GLUON_SHWS8 = SparseMLAConfig(block_h=8, block_k=64, num_warps=4, num_stages=2,
                                         prefetch=True, kernel="gluon_shws")
SPARSE_MLA_GLUON_SHWS16 = SparseMLAConfig(block_h=16, block_k=64, num_warps=4, num_stages=2,
                                          prefetch=True, kernel="gluon_shws")
# formats whose heuristic picks the one-partition few-heads kernel, up to
# GLUON_SH_PICKED_MAX_HEADS heads: H200, 2026-12-05
# (`bench.mla_sweep --small-heads`, bench/results/mla_sweep_small_heads_h200_20261205.json,
# CUDA-graph timed, checked against the reference): V3.2 B 64 H 16 fp8_ds_mla 66.2 us against
# 99.5 for the Triton 16 x 32 tile; V4-Flash B 64 H 8 fp8_model1 28.9 against 42.7. The 32-head
# config (H 17..32) has not been timed: those calls keep the Triton tiles.
GLUON_SH_PICKED: tuple = ('fp8_ds_mla', 'fp8_model1')
GLUON_SH_PICKED_MAX_HEADS = 16
# formats (of GLUON_SH_PICKED) whose few-heads calls of up to GLUON_SHWS_PICKED_MAX_HEADS heads
# run the warp-specialised kernel instead (its 8-head config); fp8_ds_mla at 8 heads is not timed
GLUON_SHWS_PICKED: tuple = ('fp8_model1',)
GLUON_SHWS_PICKED_MAX_HEADS = 8
# formats (of GLUON_SH_PICKED) whose few-heads calls of GLUON_SHWS_PICKED_MAX_HEADS + 1 ..
# GLUON_SH_PICKED_MAX_HEADS (9..16) heads run the warp-specialised 16-head config: with the
# producer's L2 hint on (gluon_small_ws.L2_PREFETCH), H100, 2026-12-06 (seventeenth session,
# bench/results/mla_sweep_small_heads_h100_20261206.json, CUDA-graph timed over rotated
# block-table sets, checked against the reference): V3.2 B 64 H 16 fp8_ds_mla 61.6 us against
# 70.8 for the one-partition 16-head config (69.1 without the hint). fp8_model1 at 9..16 heads is
# not timed (its only few-heads target row has 8 heads), so it keeps gluon_small.py there.
GLUON_SHWS16_PICKED: tuple = ('fp8_ds_mla',)


def gluon_sh_config(num_heads: int) -> SparseMLAConfig:
    """The few-heads Gluon config for ``num_heads`` (H <= 32 is its range; more heads run in
    blocks of 32): the smallest head block that holds them, 2 CTAs an SM up to 16 heads."""
    if num_heads <= 8:
        return SPARSE_MLA_GLUON_SH8
    return SPARSE_MLA_GLUON_SH16 if num_heads <= 16 else SPARSE_MLA_GLUON_SH32


def few_heads_config(num_heads: int, kv_format: str, shws_formats: tuple | None = None,
                     shws16_formats: tuple | None = None) -> SparseMLAConfig:
    """The few-heads Gluon config the heuristic picks for ``num_heads`` heads of a
    ``kv_format`` cache whose format is picked for the few-heads kernel: the warp-specialised
    8-head config (:data:`SPARSE_MLA_GLUON_SHWS8`) up to :data:`GLUON_SHWS_PICKED_MAX_HEADS`
    heads for the formats of ``shws_formats`` (default :data:`GLUON_SHWS_PICKED`), its 16-head
    config (:data:`SPARSE_MLA_GLUON_SHWS16`) at 9..16 heads for the formats of
    ``shws16_formats`` (default :data:`GLUON_SHWS16_PICKED`), else :func:`gluon_sh_config`."""
    shws = GLUON_SHWS_PICKED if shws_formats is None else shws_formats
    shws16 = GLUON_SHWS16_PICKED if shws16_formats is None else shws16_formats
    return _few_heads(num_heads, kv_format in shws, kv_format in shws16)


def _few_heads(num_heads: int, shws: bool, shws16: bool = False) -> SparseMLAConfig:
    """The warp-specialised 8-head config where ``shws`` (its format picked) and the heads fit
    it, the 16-head one where ``shws16`` and 9..16 heads, else :func:`gluon_sh_config`: the one
    rule of :func:`few_heads_config` and the heuristic."""
    if shws and num_heads <= GLUON_SHWS_PICKED_MAX_HEADS:
        return SPARSE_MLA_GLUON_SHWS8
    if shws16 and GLUON_SHWS_PICKED_MAX_HEADS < num_heads <= SPARSE_MLA_GLUON_SHWS16.block_h:
        return SPARSE_MLA_GLUON_SHWS16
    return gluon_sh_config(num_heads)


SPARSE_MLA_SPACE: dict[tuple[str, int], tuple[SparseMLAConfig, ...]] = {
    # sm_120 (99 KiB): 64-head tiles and two-stage 16-head tiles need > 101,376 B.
    ("small", 2): (
        SPARSE_MLA_DEFAULT,
        SPARSE_MLA_SMALL_H,
        SparseMLAConfig(block_h=16, block_k=64, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=32, num_warps=4, num_stages=1),
    ),
    # fp32 operands (fp32 q; a correctness path): 16 x 32 needs 110,592 B on sm_120.
    ("small", 4): (
        SparseMLAConfig(block_h=16, block_k=16, num_warps=4, num_stages=1),
    ),
    ("large", 2): (
        SPARSE_MLA_DEFAULT,
        SPARSE_MLA_SMALL_H,
        SparseMLAConfig(block_h=16, block_k=64, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=32, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=64, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=1, prefetch=False),
        SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=2, prefetch=False),
        SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=2, prefetch=False),
        SPARSE_MLA_GLUON,
        SPARSE_MLA_GLUON2,
        SPARSE_MLA_GLUON_WS,
        SPARSE_MLA_GLUON_XS,
        SPARSE_MLA_GLUON_SH8,
        SPARSE_MLA_GLUON_SH16,
        SPARSE_MLA_GLUON_SH16W8,
        SPARSE_MLA_GLUON_SH32,
        SPARSE_MLA_GLUON_SHWS8,
        SPARSE_MLA_GLUON_SHWS16,
    ),
    ("large", 4): (
        SparseMLAConfig(block_h=16, block_k=16, num_warps=4, num_stages=1),
        SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=1),
    ),
}

# Registers per SM on every supported GPU (sm_80 .. sm_120): 64 K 32-bit registers.
REGISTERS_PER_SM = 65_536
# Shared memory per SM (bytes) by class: sm_90 228 KiB, sm_120 100 KiB.
SMEM_PER_SM = {"large": 233_472, "small": 102_400}


def sparse_mla_ctas_per_sm(cfg: SparseMLAConfig, smem_per_block: int,
                           registers: int | None = None, smem: int | None = None,
                           operand_bytes: int = 2) -> int:
    """Resident CTAs per SM of ``cfg`` from its compile report: registers per thread (default
    ``cfg.maxnreg``, else 255: every config above but one, conservative) and shared bytes
    (default: the (block_h + block_k) x 576 x ``operand_bytes`` staging estimate, within 10 %
    of the reports above; ``operand_bytes`` 4 for the fp32-dot configs, whose tiles take twice
    the bytes: 73,728 B for 16 x 16 on sm_120, one CTA an SM where the 2-byte estimate said
    two; tests/test_triton_compile.py checks every sm_120 config against its report)."""
    if registers is None:
        registers = cfg.maxnreg or 255
    if smem is None:
        smem = (cfg.block_h + cfg.block_k) * 576 * operand_bytes * max(1, cfg.num_stages)
    by_regs = REGISTERS_PER_SM // (registers * 32 * cfg.num_warps)
    by_smem = SMEM_PER_SM[smem_class(smem_per_block)] // max(1, smem)
    return max(1, min(by_regs, by_smem))


# Combine kernels (Triton, kernels/sparse_mla/triton.py, and its Pallas twin): one (head,
# request x draft, column block) per program, the splits read as one [S_BLOCK, BLOCK_C] tile of at most
# SPARSE_MLA_COMBINE_TILE float32 (32 a thread at 4 warps): at B 1 H 128 with 32 splits that is
# 512 programs of 16 KB each, every partial in flight at once, where 8 programs of 16 heads
# looped over the splits (17 us on the H200, bench/NOTES.md "The split-K combine").
SPARSE_MLA_COMBINE_WARPS = 4
SPARSE_MLA_COMBINE_TILE = 4096
SPARSE_MLA_COMBINE_MAX_S_BLOCK = 64


def sparse_mla_combine_tile(num_splits: int, d_v: int) -> tuple[int, int]:
    """(S_BLOCK, BLOCK_C) of the combine (Triton and Pallas) for ``num_splits`` splits of ``d_v`` columns:
    all splits in one tile up to 64 (more loop over tiles of 64), columns filling the rest of
    ``SPARSE_MLA_COMBINE_TILE`` (at least 32, at most next_pow2(d_v))."""
    s_block = min(next_pow2(max(1, num_splits)), SPARSE_MLA_COMBINE_MAX_S_BLOCK)
    block_c = min(next_pow2(d_v), max(32, SPARSE_MLA_COMBINE_TILE // s_block))
    return s_block, block_c


def sparse_mla_space(smem_per_block: int, operand_bytes: int = 2) -> tuple[SparseMLAConfig, ...]:
    """The configs a launcher may pick on a GPU with ``smem_per_block`` bytes of shared memory
    per block, for dot operands of ``operand_bytes`` (2: bf16/fp16, 4: fp32)."""
    return SPARSE_MLA_SPACE[(smem_class(smem_per_block), 4 if operand_bytes >= 4 else 2)]


def sparse_mla_heuristic(num_heads: int, smem_per_block: int, operand_bytes: int = 2, *,
                         rows: int | None = None, topk: int | None = None,
                         gluon: bool = False, gluon_ws: bool = False,
                         gluon_sh: bool = False, gluon_shws: bool = False,
                         gluon_xs: bool = False, gluon_shws16: bool = False) -> SparseMLAConfig:
    """Default config for ``num_heads`` query heads on a GPU with ``smem_per_block`` bytes:
    the first member of the space for fp32 dots; given ``rows`` (B x N) and ``topk`` (K) on the
    large class, the measured rule below; else :data:`SPARSE_MLA_SMALL_H` (16-head blocks,
    4 warps) for H <= 16 and :data:`SPARSE_MLA_DEFAULT` otherwise. ``gluon`` (the caller's
    statement that the Gluon kernel can run the call: sm_90, an fp8 cache, 16-bit q;
    :func:`gluon_eligible`) picks :data:`SPARSE_MLA_GLUON` for
    H >= 64: measured on the H200 (bench/results/gluon_check_h200_20261202.json, CUDA-graph
    medians, one input set) it beat the best Triton tile on every such target row (B 64 H 128:
    157 vs 326 us; B 64 H 64: 97 vs 175; B 16 H 128: 52 vs 138; V4 B 64 H 64 K 640: 47 vs 88;
    B 1: 30.7 vs 31.3), and one X buffer beat two (157 vs 171 at B 64 H 128). ``gluon_ws``
    (the caller's statement that the warp-specialised kernel can run the call and measured
    faster for its format, :data:`GLUON_WS_PICKED`) picks :data:`SPARSE_MLA_GLUON_WS` instead:
    on the H200 (bench/results/gluon_check_ws_h200_20261202.json, do_bench_cudagraph, same run
    as the Gluon timings) fp8_ds_mla B 64 H 128 143.9 vs 157.6 us, H 64 100.6 vs 107.8, B 16
    H 128 68.8 vs 72.9, B 1 28.7 vs 30.1, B 128 281.3 vs 306.0; fp8_model1 B 64 H 64 K 640
    62.8 vs 57.3 (slower: not picked). ``gluon_sh`` (the caller's statement that the few-heads
    Gluon kernel can run the call and is picked for its format, :data:`GLUON_SH_PICKED`) picks
    :func:`gluon_sh_config` for H <= :data:`GLUON_SH_PICKED_MAX_HEADS` (16): on the H200
    (2026-12-05, bench.mla_sweep --small-heads) B 64 H 16 fp8_ds_mla 66.2 vs 99.5 us, V4 B 64
    H 8 fp8_model1 28.9 vs 42.7. ``gluon_shws`` (with ``gluon_sh``: the caller's statement that the
    warp-specialised few-heads kernel is picked for the format, :data:`GLUON_SHWS_PICKED`) picks
    :data:`SPARSE_MLA_GLUON_SHWS8` for H <= :data:`GLUON_SHWS_PICKED_MAX_HEADS` (8): on the H200
    (2026-12-05, ninth session) V4 B 64 H 8 fp8_model1 22.3 vs 28.7 us; ``gluon_shws16`` (with
    ``gluon_sh``: the format is in :data:`GLUON_SHWS16_PICKED`) picks
    :data:`SPARSE_MLA_GLUON_SHWS16` at 9..16 heads (H100, 2026-12-06: V3.2 B 64 H 16 fp8_ds_mla
    61.6 vs 70.8 us, the producer's L2 hint on). ``gluon_xs`` (the
    caller's statement that the seesaw kernel can run the call and is picked for its format,
    :data:`GLUON_XS_PICKED`) picks :data:`SPARSE_MLA_GLUON_XS` for an even number of 64-head
    blocks and ``rows`` >= :data:`GLUON_XS_MIN_ROWS` (H100, 2026-12-06: B 64 H 128 132.3 us
    against ``gluon_ws``'s 141.6-142.6 in other calls, B 1 18.2 against 15.7-15.9).
    """
    space = sparse_mla_space(smem_per_block, operand_bytes)
    if operand_bytes >= 4:
        return space[0]
    if gluon_sh and num_heads <= GLUON_SH_PICKED_MAX_HEADS \
            and _few_heads(num_heads, gluon_shws, gluon_shws16) in space:
        return _few_heads(num_heads, gluon_shws, gluon_shws16)
    if (gluon_xs and rows is not None and rows >= GLUON_XS_MIN_ROWS
            and gluon_xo_heads_ok(num_heads) and SPARSE_MLA_GLUON_XS in space):
        return SPARSE_MLA_GLUON_XS
    if gluon_ws and num_heads >= 64 and SPARSE_MLA_GLUON_WS in space:
        return SPARSE_MLA_GLUON_WS
    if gluon and num_heads >= 64 and SPARSE_MLA_GLUON in space:
        return SPARSE_MLA_GLUON
    if rows is not None and topk is not None and SPARSE_MLA_W64 in space:
        # large class (sm_90): 64-head tiles when there are 64 heads, >= 32 requests and a long
        # list; two-stage 16-head tiles for few heads or few requests; 32x32 otherwise
        if num_heads >= 64 and rows >= 32 and topk >= 1024:
            return SPARSE_MLA_W64
        if num_heads <= 32 or rows < 32:
            return SPARSE_MLA_N16
        return SPARSE_MLA_DEFAULT
    if num_heads <= 16 and SPARSE_MLA_SMALL_H in space:
        return SPARSE_MLA_SMALL_H
    return SPARSE_MLA_DEFAULT if SPARSE_MLA_DEFAULT in space else space[0]


def sparse_mla_num_splits(rows: int, topk: int, block_k: int, num_sms: int,
                          ctas_per_sm: int = 1, prologue_blocks: float = 1.0,
                          combine_blocks: float = 1.0) -> int:
    """Split-K count S from the GPU's CTA slots and waves: ``rows`` (= B x N x head blocks)
    programs of ``ceil(K / block_k)`` loop iterations each, split S ways, run in
    ``ceil(rows * S / (num_sms * ctas_per_sm))`` waves of ``ceil(blocks / S) +
    prologue_blocks`` iterations (the prologue: q load, pipeline fill, epilogue), plus
    ``combine_blocks`` for the combine launch when S > 1. Returns the S in 1..blocks with the
    smallest cost, the smallest S on ties (one split writes the result directly).

    E.g. on an H200 (132 SMs, 1 CTA per SM): B 64 H 128 in 32-head blocks (256 rows) -> 1;
    B 1 H 128 -> 32 (128 programs of 2 iterations); B 64 H 16 (64 rows, 2 CTAs per SM) -> 4.
    """
    if rows <= 0:
        return 1
    blocks = max(1, -(-topk // block_k))
    slots = max(1, num_sms * max(1, ctas_per_sm))
    best, best_cost = 1, None
    for S in range(1, blocks + 1):
        cost = -(-rows * S // slots) * (-(-blocks // S) + prologue_blocks)
        cost += combine_blocks if S > 1 else 0.0
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = S, cost
    return best


def sparse_mla_from_dict(d: dict, smem_per_block: int, operand_bytes: int = 2) -> SparseMLAConfig | None:
    """A dispatch-table config, or None when it is not a member of this GPU's search space."""
    try:
        cfg = SparseMLAConfig(**d)
    except TypeError:
        return None
    return cfg if cfg in sparse_mla_space(smem_per_block, operand_bytes) else None


# ============================================================================ Pallas (jax_impl)
# The Pallas-Triton split kernel (kernels/sparse_mla/pallas.py) uses the same SparseMLAConfig
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

# fp16 fast path tiles (fp8 formats, 16-bit q; kernels/sparse_mla/pallas.py): no carried raw
# tiles, Triton's pipeliner overlaps the gathers. AOT counts (jax 0.10.2 lowering + make_ttir,
# Triton 3.9, sm_90, bf16 q; regs / stack B / shared B / SASS per warp per loop iteration,
# bench/NOTES.md "Sparse MLA, Pallas"):
#   64/32/8/3: fp8_ds_mla 255 / 192 / 133,632 / 1,386 (every load an async copy);
#              fp8_model1 255 / 272 / 119,552 / 1,688
#   64/32/8/2: ds_mla 255 / 168 / 132,864 / 1,325 (block-table loads synchronous in the loop)
#   32/32/8/3: ds_mla 223 / 0 / 125,184 / 1,430; model1 255 / 0 / 111,104 / 1,641
#   16/32/4/3: ds_mla 250 / 0 / 75,008 / 1,225; model1 255 / 16 / 52,224 / 1,416
#   16/32/4/2: ds_mla 245 / 0 / 74,240 / 1,196
# The Triton twin's tiles compiled the same way: W64 255 / 120 / 132,864 / 1,577; N16
# 241 / 0 / 74,240 / 1,471. The s2 variants stay out of the space (latent not measured); the
# latent format (the path without the fast numerics) at 64/32/8/3: 255 / 352 / 152,064 / 2,073,
# 32/32/8/3: 204 / 0 / 78,336 / 702, 16/32/4/3: 241 / 0 / 57,856 / 638.
PALLAS_W64 = SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=3, prefetch=False)
PALLAS_N16 = SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=3, prefetch=False)
PALLAS_W32 = SparseMLAConfig(block_h=32, block_k=32, num_warps=8, num_stages=3, prefetch=False)

# 16 x 32, 4 warps, one stage, hand-pipelined loads: the few-heads / few-requests default
PALLAS_N16P = SparseMLAConfig(block_h=16, block_k=32, num_warps=4, num_stages=1)

PALLAS_SPARSE_MLA_SPACE: dict[str, tuple[SparseMLAConfig, ...]] = {
    "small": (
        PALLAS_N16P,
        SparseMLAConfig(block_h=32, block_k=16, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=32, block_k=32, num_warps=8, num_stages=1),
    ),
    "large": (
        PALLAS_N16P,
        SparseMLAConfig(block_h=32, block_k=32, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=1),
        SparseMLAConfig(block_h=64, block_k=32, num_warps=8, num_stages=2),
        PALLAS_W64,
        PALLAS_W32,
        PALLAS_N16,
    ),
}
PALLAS_SPARSE_MLA_FP32 = SparseMLAConfig(block_h=16, block_k=16, num_warps=4,
                                         num_stages=1)

# Shared memory (bytes) each config uses, measured by the AOT compile above, worst over the
# kv formats, keyed by (config, dot operand bytes); the compile test asserts the measured value
# stays at or below these, and the launcher gates with them before launch.
PALLAS_SPARSE_MLA_SMEM: dict[tuple[SparseMLAConfig, int], int] = {
    # the hand-pipelined configs on the fp16 fast path (fp8_ds_mla, sm_120 / sm_90) need 64-128 B
    # more than before it: 55,360 / 55,424 / 73,856 / 110,848
    (SparseMLAConfig(16, 32, 4, 1), 2): 55_360,
    (SparseMLAConfig(32, 16, 8, 1), 2): 55_424,
    (SparseMLAConfig(32, 32, 8, 1), 2): 73_856,
    (SparseMLAConfig(64, 32, 8, 1), 2): 110_848,
    (SparseMLAConfig(64, 32, 8, 2), 2): 110_848,
    (PALLAS_W64, 2): 152_064,           # latent (fp8_ds_mla 133,632, fp8_model1 119,552)
    (PALLAS_W32, 2): 125_184,           # fp8_ds_mla (fp8_model1 111,104, latent 78,336)
    (PALLAS_N16, 2): 75_008,            # fp8_ds_mla (fp8_model1 52,224, latent 57,856)
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


def pallas_sparse_mla_heuristic(num_heads: int, smem_per_block: int, operand_bytes: int = 2, *,
                                rows: int | None = None, topk: int | None = None,
                                kv_format: str | None = None) -> SparseMLAConfig:
    """Default Pallas config. fp32 operands: :data:`PALLAS_SPARSE_MLA_FP32`. The fp16 fast
    path (``kv_format`` an fp8 format) on the large class, given ``rows`` (B x N) and ``topk``:
    64-head tiles (:data:`PALLAS_W64`, three stages) for >= 64 heads, >= 16 requests and
    K >= 1024; 16-head tiles with hand-pipelined loads (:data:`PALLAS_N16P`, one stage) for
    <= 32 heads or fewer requests, except ``fp8_model1`` with <= 32 heads: the three-stage
    16-head tiles (:data:`PALLAS_N16`); 32-head tiles otherwise. Set from `bench.pallas_mla_sweep`
    on the H200 (2026-12-05, bench/results/pallas_mla_sweep_h200_20261205.json, the bench's
    JAX timer): B 16 H 128 W64 139.0 us against 272.9 for the 16-head tiles the rule picked
    before (rows < 32); B 64 H 16 N16P 138.5 against 164.6 for the three-stage 16-head tile,
    B 1 H 128 31.6 against 33.8. V4 B 64 H 8 (``fp8_model1``, K 512, not in that sweep): the
    targets bench measured N16P at 103.5 us (bench_h200_targets_jax_20261205c.json) against
    74.9 and 76.6 for :data:`PALLAS_N16` in the two earlier runs of the day, so that format keeps
    N16 for few heads. Otherwise the Triton twin's :data:`SPARSE_MLA_DEFAULT`
    (32 x 32, 8 warps, hand-pipelined loads) when it is in the Pallas space, else the space's
    first member."""
    if operand_bytes >= 4:
        return PALLAS_SPARSE_MLA_FP32
    space = PALLAS_SPARSE_MLA_SPACE[smem_class(smem_per_block)]
    if (kv_format in ("fp8_ds_mla", "fp8_model1") and rows is not None and topk is not None
            and PALLAS_W64 in space):
        if num_heads >= 64 and rows >= 16 and topk >= 1024:
            return PALLAS_W64
        if kv_format == "fp8_model1" and num_heads <= 32 and PALLAS_N16 in space:
            return PALLAS_N16
        if num_heads <= 32 or rows < 16:
            return PALLAS_N16P
        return PALLAS_W32
    return SPARSE_MLA_DEFAULT if SPARSE_MLA_DEFAULT in space else space[0]


def pallas_sparse_mla_from_dict(d: dict, smem_per_block: int) -> SparseMLAConfig | None:
    """A dispatch-table config for the Pallas kernel (bf16 / fp16 operands), or None when it is
    not in its space."""
    try:
        cfg = SparseMLAConfig(**d)
    except TypeError:
        return None
    return cfg if cfg in PALLAS_SPARSE_MLA_SPACE[smem_class(smem_per_block)] else None
