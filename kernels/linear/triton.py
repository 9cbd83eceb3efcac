"""Few-token weight-streaming GEMM: ``out[g] = alpha * x[g] @ w[g]^T`` for M <= 64 tokens, as one
Triton kernel with a deterministic in-kernel split-K reduction (``torch_impl.linear`` binding).

Operation (per group g of G; G = 1 for a plain linear layer, the heads / output groups of a
batched projection otherwise)::

    out[g, m, n] = round_to_out_dtype(alpha * sum_k x[g, m, k] * w[g, n, k])

``x`` ``[G, M, K]`` and ``w`` ``[G, N, K]`` (the ``[out, in]`` weight of a linear layer; its
last dim or its N dim contiguous) are bf16 / fp16 / fp32 of one dtype, or ``x`` bf16 / fp16
with an fp32 ``w`` (the product is then an fp32 dot of the exactly widened ``x``: IEEE FMA, or
with the config's ``f32_dot`` "tf32x3" three tf32 tensor-core passes, ~2^-22 of ``sum |x w|``
per product); the sum is fp32; ``out`` ``[G, M, N]`` (any dtype of bf16 / fp16 / fp32, any strides with its last dim
contiguous: a column slice of a larger buffer) is rounded once.

Design (counts: ``bench/NOTES.md``, "Few-token projections"):

* **Swap AB.** At M <= 64 the weights are the bytes; the dot's M is the weight rows
  (``BLOCK_N``, a multiple of 64, so sm_90 runs wgmma with both operands in shared memory) and
  its N the tokens padded to ``BLOCK_M`` in {16, 32, 64} (masked rows load as zeros and are
  never stored): ``acc[BLOCK_N, BLOCK_M] += w_tile[BLOCK_N, BLOCK_K] @ x_tile^T[BLOCK_K, BLOCK_M]``.
  The padding costs tensor-core FLOPs only (16 FLOP per weight byte at BLOCK_M 16, far below the
  ridge point).
* **Grid** ``(cdiv(N, BLOCK_N), num_splits, G)``: N tiles x split-K x groups. The split count
  (``kernels.linear.configs.linear_num_splits``) fills the GPU with one wave of programs when the
  N tiles alone cannot; every split covers a whole number of ``BLOCK_K`` blocks.
* **Deep pipelining.** ``num_stages`` buffers of the weight tile (``num_stages - 1`` loads in
  flight while one is consumed; 48-96 KiB per SM on sm_90): the loads are the async copies of
  Triton's software pipeliner. The weight loads are marked ``evict_first`` (streamed once), the
  tokens ``evict_last`` (every N tile re-reads them from L2).
* **Deterministic split-K in one launch.** With ``num_splits > 1`` every program stores its fp32
  partial tile to ``part[g, s]``, then (a CTA barrier, so every thread's stores precede it)
  increments the tile's counter with one acq_rel atomic at GPU scope. The program that sees
  ``num_splits - 1`` arrived last: it adds the partials in split order 0, 1, ... (through L2,
  ``.cg`` loads, four partial tiles in flight at a time, two for tiles of more than 4096
  elements, whose registers would spill) so the sum does not depend on which program
  came last, writes ``out`` and stores 0 back into the counter. The counters therefore start
  and end every call at zero: no memset, no second launch, bitwise repeatable, and a CUDA graph
  can capture and replay the call. Calls that share a counter buffer must not run concurrently
  (one stream, as in a layer step).

The launcher (:func:`launch_linear`) takes the config and split count that the binding planned
(``kernels.linear.configs``); :func:`aot_specs` lists every launch it can make for
``tests/test_triton_compile.py``.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _linear_kernel(
    x_ptr,          # [G, M, K] tokens (last dim contiguous)
    w_ptr,          # [G, N, K] weights (K or N contiguous)
    out_ptr,        # [G, M, N] (last dim contiguous; any other strides)
    part_ptr,       # [G, num_splits, M, N] fp32 partials (unused when num_splits == 1)
    count_ptr,      # [G, cdiv(N, BLOCK_N)] int32 arrival counters, zero before and after a call
    M, N, K,
    k_per_split,    # K elements per split, a multiple of BLOCK_K
    num_splits,
    stride_xg, stride_xm,
    stride_wg, stride_wn, stride_wk,
    stride_og, stride_om,
    alpha,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    FP32_W: tl.constexpr,           # fp32 weights: widen x, an fp32 dot of precision F32_DOT
    REDUCE_UNROLL: tl.constexpr,    # partials loaded per step of the reduction (2 or 4)
    F32_DOT: tl.constexpr = "ieee",  # "ieee" (FMA) or "tf32x3" (tensor cores, three tf32 passes)
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    g = tl.program_id(2).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    m_ok = offs_m < M
    k0 = pid_s * k_per_split
    k_end = tl.minimum(K, k0 + k_per_split)
    w_ptrs = (w_ptr + g * stride_wg + offs_n[:, None] * stride_wn
              + (k0 + offs_k)[None, :] * stride_wk)                       # [BLOCK_N, BLOCK_K]
    x_ptrs = x_ptr + g * stride_xg + offs_m[None, :] * stride_xm + (k0 + offs_k)[:, None]  # x^T [BLOCK_K, BLOCK_M]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in range(k0, k_end, BLOCK_K):
        k_ok = (k + offs_k) < k_end
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0,
                    eviction_policy="evict_first")
        xt = tl.load(x_ptrs, mask=k_ok[:, None] & m_ok[None, :], other=0.0,
                     eviction_policy="evict_last")
        if FP32_W:
            acc = tl.dot(w, xt.to(tl.float32), acc, input_precision=F32_DOT)
        else:
            acc = tl.dot(w, xt, acc)
        w_ptrs += BLOCK_K * stride_wk
        x_ptrs += BLOCK_K

    out_mask = n_ok[:, None] & m_ok[None, :]
    out_ptrs = out_ptr + g * stride_og + offs_m[None, :] * stride_om + offs_n[:, None]  # [BLOCK_N, BLOCK_M]
    if num_splits == 1:
        tl.store(out_ptrs, (acc * alpha).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # this split's partial; the tile's last program to arrive adds them all in split order
        tile = (offs_m[None, :] * N + offs_n[:, None]).to(tl.int64)       # [BLOCK_N, BLOCK_M]
        part_g = part_ptr + g * num_splits * M * N
        tl.store(part_g + pid_s * M * N + tile, acc, mask=out_mask)
        tl.debug_barrier()                      # every thread's partial stored before the release
        count = count_ptr + g * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            n_unrolled = num_splits - num_splits % REDUCE_UNROLL
            for s0 in range(0, n_unrolled, REDUCE_UNROLL):  # its loads in flight together
                p0 = tl.load(part_g + s0 * M * N + tile, mask=out_mask, other=0.0, cache_modifier=".cg")
                p1 = tl.load(part_g + (s0 + 1) * M * N + tile, mask=out_mask, other=0.0, cache_modifier=".cg")
                if REDUCE_UNROLL == 4:
                    p2 = tl.load(part_g + (s0 + 2) * M * N + tile, mask=out_mask, other=0.0,
                                 cache_modifier=".cg")
                    p3 = tl.load(part_g + (s0 + 3) * M * N + tile, mask=out_mask, other=0.0,
                                 cache_modifier=".cg")
                    total = (((total + p0) + p1) + p2) + p3   # in split order
                else:
                    total = (total + p0) + p1
            for s in range(n_unrolled, num_splits):
                total += tl.load(part_g + s * M * N + tile, mask=out_mask, other=0.0,
                                 cache_modifier=".cg")
            tl.store(out_ptrs, (total * alpha).to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")   # ready for the next call


@triton.jit
def _gemv_kernel(
    x_ptr,          # [G, 1, K] the token (last dim contiguous)
    w_ptr,          # [G, N, K] weights (K or N contiguous)
    out_ptr,        # [G, 1, N] (last dim contiguous; any group stride)
    N, K,
    stride_xg, stride_wg, stride_wn, stride_wk, stride_og,
    alpha,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One token: ``out[g, 0, n] = alpha * sum_k x[g, 0, k] * w[g, n, k]`` without tensor cores
    (:func:`launch_gemv`). Program ``(pid_n, g)`` holds ``BLOCK_N`` weight rows: per K block it
    loads the ``[BLOCK_N, BLOCK_K]`` weight tile (coalesced along whichever of K / N has the unit
    stride, the JIT's specialisation of a stride of 1), widens it and the token to fp32 and adds
    the products into an fp32 tile of the same shape; at the end one sum over K per row, the
    scale, one rounding. Fixed order, no atomics: bitwise repeatable."""
    g = tl.program_id(1).to(tl.int64)
    _gemv_rows(tl.program_id(0), x_ptr + g * stride_xg, w_ptr + g * stride_wg,
               out_ptr + g * stride_og, N, K, stride_wn, stride_wk, alpha, BLOCK_N, BLOCK_K)


@triton.jit
def _gemv_rows(pid_n, x_ptr, w_ptr, out_ptr, N, K, stride_wn, stride_wk, alpha,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The ``BLOCK_N`` output rows ``pid_n`` of one group of :func:`_gemv_kernel` (pointers at
    the group's start); shared with :func:`_gemv_pair_kernel`, so a row's sum is the same code
    and order in either."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk
    x_ptrs = x_ptr + offs_k
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_ok = (k + offs_k) < K
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first")
        xv = tl.load(x_ptrs, mask=k_ok, other=0.0, eviction_policy="evict_last")
        acc += w.to(tl.float32) * xv.to(tl.float32)[None, :]
        w_ptrs += BLOCK_K * stride_wk
        x_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1) * alpha
    tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _gemv_pair_kernel(
    x1_ptr, w1_ptr, out1_ptr, N1, K1, stride_w1n, alpha1,      # product 1: [1, K1] x [N1, K1]^T
    x2_ptr, w2_ptr, out2_ptr, N2, K2, stride_w2n, alpha2,      # product 2: [1, K2] x [N2, K2]^T
    P1,                                                        # programs of product 1
    BLOCK_N1: tl.constexpr, BLOCK_K1: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K2: tl.constexpr,
):
    """Two one-token products of K-major weights in one launch (:func:`launch_gemv_pair`):
    programs ``[0, P1)`` are :func:`_gemv_kernel`'s programs of the first at its config
    (``BLOCK_N1`` x ``BLOCK_K1``), the rest those of the second (``BLOCK_N2`` x ``BLOCK_K2``);
    each row's sum is :func:`_gemv_rows`, so the outputs are bitwise those of two launches at
    the same configs. The branch is uniform per program."""
    pid = tl.program_id(0)
    if pid < P1:
        _gemv_rows(pid, x1_ptr, w1_ptr, out1_ptr, N1, K1, stride_w1n, 1, alpha1, BLOCK_N1, BLOCK_K1)
    else:
        _gemv_rows(pid - P1, x2_ptr, w2_ptr, out2_ptr, N2, K2, stride_w2n, 1, alpha2, BLOCK_N2,
                   BLOCK_K2)


def launch_gemv(x, w, out, alpha: float, config) -> int:
    """Launch :func:`_gemv_kernel` on torch tensors ``x`` ``[G, 1, K]``, ``w`` ``[G, N, K]`` (K or
    N of unit stride), ``out`` ``[G, 1, N]`` (last dim contiguous), all on one CUDA device (or
    the CPU under ``TRITON_INTERPRET=1``); ``config`` a
    :class:`kernels.linear.configs.GemvConfig`. Grid ``(cdiv(N, block_n), G)``. Returns the
    number of programs. The callers validate: ``torch_impl.linear`` (its one-token route for
    K-major weights, on unless ``DSA_LINEAR_GEMV=0``) and ``bench.linear_sweep``.

    Raises:
      ValueError: more than one token, a weight with neither K nor N contiguous, or an ``out``
        whose last dim is not contiguous.
    """
    G, M, K = x.shape
    N = w.shape[1]
    if M != 1:
        raise ValueError(f"x: launch_gemv takes one token ([G, 1, K]), got shape {tuple(x.shape)}")
    if w.stride(2) != 1 and w.stride(1) != 1:
        raise ValueError(f"w: expected K or N contiguous, got strides {tuple(w.stride())}")
    if out.stride(2) != 1 or x.stride(2) != 1:
        raise ValueError(f"out / x: expected the last dim contiguous, got strides {tuple(out.stride())} "
                         f"/ {tuple(x.stride())}")
    grid = (triton.cdiv(N, config.block_n), G)
    _gemv_kernel[grid](x, w, out, N, K, x.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
                       float(alpha), BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                       num_warps=config.num_warps, num_stages=1)
    return grid[0] * grid[1]


def launch_gemv_pair(x1, w1, out1, alpha1: float, cfg1, x2, w2, out2, alpha2: float, cfg2) -> int:
    """Launch :func:`_gemv_pair_kernel`: ``out1 = alpha1 * x1 @ w1^T`` and ``out2 = alpha2 * x2 @
    w2^T`` in one launch, each ``x`` ``[1, K]`` and ``out`` ``[1, N]`` contiguous, each ``w``
    ``[N, K]`` with unit K stride, all on one CUDA device (or the CPU under
    ``TRITON_INTERPRET=1``); ``cfg1`` / ``cfg2`` :class:`kernels.linear.configs.GemvConfig` of
    the same ``num_warps`` (:data:`kernels.linear.configs.GEMV_PAIR_PICKS`: the pairs compiled
    for sm_120 in CI). Grid ``(cdiv(N1, block_n1) + cdiv(N2, block_n2),)``; returns the number
    of programs. The caller (``torch_impl.linear.linear_pair``) validates.

    Raises:
      ValueError: a weight whose K stride is not 1, an ``x`` / ``out`` that is not one contiguous
        row, or configs of different ``num_warps``.
    """
    for name, t in (("x1", x1), ("x2", x2), ("out1", out1), ("out2", out2)):
        if t.dim() != 2 or t.shape[0] != 1 or t.stride(-1) != 1:
            raise ValueError(f"{name}: expected one contiguous row [1, n], got shape "
                             f"{tuple(t.shape)} strides {tuple(t.stride())}")
    for name, t in (("w1", w1), ("w2", w2)):
        if t.dim() != 2 or t.stride(1) != 1:
            raise ValueError(f"{name}: expected [N, K] with K contiguous, got shape {tuple(t.shape)} "
                             f"strides {tuple(t.stride())}")
    if cfg1.num_warps != cfg2.num_warps:
        raise ValueError(f"cfg1 / cfg2: expected the same num_warps, got {cfg1} / {cfg2}")
    p1 = triton.cdiv(w1.shape[0], cfg1.block_n)
    grid = (p1 + triton.cdiv(w2.shape[0], cfg2.block_n),)
    _gemv_pair_kernel[grid](x1, w1, out1, w1.shape[0], w1.shape[1], w1.stride(0), float(alpha1),
                            x2, w2, out2, w2.shape[0], w2.shape[1], w2.stride(0), float(alpha2), p1,
                            BLOCK_N1=cfg1.block_n, BLOCK_K1=cfg1.block_k, BLOCK_N2=cfg2.block_n,
                            BLOCK_K2=cfg2.block_k, num_warps=cfg1.num_warps, num_stages=1)
    return grid[0]


def launch_linear(x, w, out, alpha: float, config, num_splits: int, part, counters) -> int:
    """Launch :func:`_linear_kernel` on torch tensors (validated by the binding).

    Args:
      x: ``[G, M, K]`` (last dim contiguous), w: ``[G, N, K]`` (``stride(-1) == 1`` or
        ``stride(-2) == 1``), out: ``[G, M, N]`` (last dim contiguous), on one device.
      alpha: the product's scale (float32 in the kernel).
      config: :class:`kernels.linear.configs.LinearConfig` (``block_m >= M``).
      num_splits: split-K count (:func:`kernels.linear.configs.linear_num_splits`); each split
        gets ``k_per_split = cdiv(cdiv(K, block_k), num_splits) * block_k`` columns, and the
        count is reduced so that no split is empty.
      part: fp32 scratch of at least ``G * num_splits * M * N`` elements (ignored when
        ``num_splits == 1``; contents need not be initialised).
      counters: int32 buffer of at least ``G * cdiv(N, block_n)`` zeros (left zero).
    Returns:
      The split count launched.
    """
    from kernels.linear.configs import split_geometry
    G, M, K = x.shape
    N = w.shape[1]
    k_per_split, num_splits = split_geometry(K, config.block_k, num_splits)
    grid = (triton.cdiv(N, config.block_n), num_splits, G)
    _linear_kernel[grid](
        x, w, out, part if num_splits > 1 else out, counters,
        M, N, K, k_per_split, num_splits,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2),
        out.stride(0), out.stride(1), float(alpha),
        BLOCK_N=config.block_n, BLOCK_M=config.block_m, BLOCK_K=config.block_k,
        FP32_W=w.dtype.itemsize == 4, F32_DOT=config.f32_dot, REDUCE_UNROLL=config.reduce_unroll,
        num_warps=config.num_warps, num_stages=config.num_stages)
    return num_splits


# (x, w, out) operand dtypes of the AOT specs, split, M = 1, weight N-contiguous: per weight
# width each dtype the launcher takes appears at least once, split and unsplit, at M = 1 (Triton
# specialises an integer argument equal to 1 into a constant, so M = 1 and num_splits = 1 are
# launches of their own) and, for 16-bit weights, with the weight's N dim contiguous (V3.2's
# wkv_b_q: a transposed view, stride_wn = 1)
_AOT_OPERANDS = {2: (("bf16", "bf16", "bf16", False, False, False), ("bf16", "bf16", "fp32", True, False, False),
                     ("fp16", "fp16", "fp16", True, True, False), ("bf16", "bf16", "bf16", True, False, True)),
                 4: (("fp32", "fp32", "fp32", False, False, False), ("bf16", "fp32", "fp32", True, False, False),
                     ("fp16", "fp32", "fp16", True, True, False))}


def aot_specs(smem_class: str) -> list:
    """Launches of :func:`_linear_kernel` for ``tests/test_triton_compile.py``: every config of
    ``kernels.linear.configs.LINEAR_SPACE`` for ``smem_class``, each with the operand variants of
    :data:`_AOT_OPERANDS` (M = 1 only where ``block_m`` is 16). The pointer arguments and the
    integer arguments a real launch passes as multiples of 16 (N, K, k_per_split, the row and
    group strides) are compiled as such; the weight's unit stride (K, or N for a transposed
    weight) is the constant 1, as the JIT specialises it."""
    from kernels._triton_aot import LaunchSpec
    from kernels.linear.configs import LINEAR_SPACE
    specs = []
    for (cls, w_bytes, bm), space in sorted(LINEAR_SPACE.items()):
        if cls != smem_class:
            continue
        for cfg in space:
            for xd, wd, od, split, m1, w_nmajor in _AOT_OPERANDS[w_bytes]:
                if m1 and bm != 16:
                    continue
                sig = {"x_ptr": f"*{xd}", "w_ptr": f"*{wd}", "out_ptr": f"*{od}", "part_ptr": "*fp32",
                       "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "k_per_split": "i32",
                       "num_splits": "i32", "stride_xg": "i32", "stride_xm": "i32", "stride_wg": "i32",
                       "stride_wn": "i32", "stride_wk": "i32", "stride_og": "i32", "stride_om": "i32",
                       "alpha": "fp32"}
                ce = dict(BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
                          FP32_W=w_bytes == 4, REDUCE_UNROLL=cfg.reduce_unroll,
                          F32_DOT=cfg.f32_dot)
                ce["stride_wn" if w_nmajor else "stride_wk"] = 1
                if not split:
                    ce["num_splits"] = 1
                if m1:
                    ce["M"] = 1
                for name in ce:
                    sig.pop(name, None)
                dot = f" {cfg.f32_dot}" if w_bytes == 4 else ""
                label = (f"linear {cfg.block_n}x{cfg.block_m}x{cfg.block_k} w{cfg.num_warps} "
                         f"s{cfg.num_stages}{dot} x={xd} w={wd}{'(N-major)' if w_nmajor else ''} out={od} "
                         f"{'split' if split else 'unsplit'}{' M=1' if m1 else ''}")
                specs.append(LaunchSpec(label, "kernels.linear.triton", "_linear_kernel", sig, ce,
                                        cfg.num_warps, cfg.num_stages,
                                        divisible=tuple(n for n in ("N", "K", "k_per_split", "stride_xg",
                                                                    "stride_xm", "stride_wg", "stride_wn",
                                                                    "stride_wk", "stride_og", "stride_om")
                                                        if n in sig)))
    return specs + gemv_aot_specs(reachable_only=True) + gemv_pair_aot_specs()


def gemv_pair_aot_specs() -> list:
    """Launches of :func:`_gemv_pair_kernel` the layer can make
    (:data:`kernels.linear.configs.GEMV_PAIR_PICKS`: ``x_proj``'s bf16 product with
    ``weights_proj``'s fp32 one of the same bf16 token), for CI's sm_120 fit check."""
    from kernels._triton_aot import LaunchSpec
    from kernels.linear.configs import GEMV_PAIR_PICKS
    specs = []
    for c1, c2 in GEMV_PAIR_PICKS:
        sig = {"x1_ptr": "*bf16", "w1_ptr": "*bf16", "out1_ptr": "*bf16", "N1": "i32", "K1": "i32",
               "stride_w1n": "i32", "alpha1": "fp32", "x2_ptr": "*bf16", "w2_ptr": "*fp32",
               "out2_ptr": "*fp32", "N2": "i32", "K2": "i32", "stride_w2n": "i32", "alpha2": "fp32",
               "P1": "i32"}
        ce = dict(BLOCK_N1=c1.block_n, BLOCK_K1=c1.block_k, BLOCK_N2=c2.block_n, BLOCK_K2=c2.block_k)
        specs.append(LaunchSpec(f"gemv pair {c1.block_n}x{c1.block_k} + {c2.block_n}x{c2.block_k} "
                                f"w{c1.num_warps}", "kernels.linear.triton", "_gemv_pair_kernel", sig,
                                ce, c1.num_warps, 1,
                                divisible=("N1", "K1", "stride_w1n", "N2", "K2", "stride_w2n")))
    return specs


def gemv_aot_specs(reachable_only: bool = False) -> list:
    """Launches of :func:`_gemv_kernel`: every config of ``kernels.linear.configs.GEMV_SPACE``
    (what ``bench.linear_sweep`` runs), or with ``reachable_only`` those
    :func:`kernels.linear.configs.gemv_heuristic` can return (``GEMV_PICKS``: the configs
    ``torch_impl.linear`` runs one-token calls at; in :func:`aot_specs`, so CI's sm_120 fit
    check compiles them); each with the layer's operand kinds, bf16 weights and out, fp32
    weights with a bf16 token and fp32 out, and all fp32 (the fused-prep layer's float32 x of
    ``weights_proj``) (the other dtypes the binding takes change only the loads' and
    the store's conversions: the kernel's shared memory is its final cross-warp sum), the weight's unit
    stride the constant 1 as the JIT specialises it (counts: bench/NOTES.md "One-token
    projections")."""
    from kernels._triton_aot import LaunchSpec
    from kernels.linear.configs import GEMV_PICKS, GEMV_SPACE
    specs = []
    for layout, space in GEMV_SPACE.items():
        if reachable_only:
            space = GEMV_PICKS[layout]
        for cfg in space:
            for xd, wd, od in (("bf16", "bf16", "bf16"), ("bf16", "fp32", "fp32"),
                               ("fp32", "fp32", "fp32")):
                sig = {"x_ptr": f"*{xd}", "w_ptr": f"*{wd}", "out_ptr": f"*{od}", "N": "i32", "K": "i32",
                       "stride_xg": "i32", "stride_wg": "i32", "stride_wn": "i32", "stride_wk": "i32",
                       "stride_og": "i32", "alpha": "fp32"}
                ce = dict(BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k)
                ce["stride_wn" if layout == "n_major" else "stride_wk"] = 1
                for name in ce:
                    sig.pop(name, None)
                specs.append(LaunchSpec(f"gemv {layout} {cfg.block_n}x{cfg.block_k} w{cfg.num_warps} x={xd} w={wd}",
                                        "kernels.linear.triton", "_gemv_kernel", sig, ce, cfg.num_warps, 1,
                                        divisible=tuple(n for n in ("N", "K", "stride_xg", "stride_wg",
                                                                    "stride_wn", "stride_wk", "stride_og")
                                                        if n in sig)))
    return specs
