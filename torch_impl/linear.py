"""Few-token linear layer (``out = alpha * x @ w^T``, M <= 64 tokens) for PyTorch: the Triton
weight-streaming GEMM (``path="triton"``, ``kernels/linear/triton.py``) and plain PyTorch
(``path="torch"``), registered as the custom op ``dsa::linear`` (mutates ``out``; fake
implementation for ``torch.compile``).

Where it is meant to run: the decode layer's projections (``torch_impl.layer``), whose GEMMs read
every weight byte once per step for B * N <= 64 tokens. The Triton kernel swaps the operands
(weight rows as the dot's M, tokens as its N), pipelines the weight tiles deeply and reduces its
K splits inside the launch, deterministically (design and counts in the kernel module and in
``bench/NOTES.md``).

Capture and compile: the Triton path reads no tensor value on the host and allocates only
shape-dependent buffers (the fp32 partials of a split call); its arrival counters live in one
zero-initialised int32 buffer per device that every call leaves zero (:func:`reserve_workspace`
makes it before a capture; a call captured before it exists gets a zeroed buffer of its own,
one memset node in the graph). Calls on one device that may run concurrently (several streams)
must not both split K: they would share the counters.
"""
from __future__ import annotations

from typing import Optional

import torch

from kernels import hardware
from kernels.ops import BACKEND_PATHS
from kernels.linear import configs as lcfg
from kernels.scalars import INT32_MAX, check_int, check_real, env_switch
from torch_impl import _common

__all__ = ["GEMV_ENV", "MAX_M", "linear", "linear_pair", "reserve_workspace"]

MAX_M = lcfg.MAX_M
"""The most tokens the Triton path takes (more: ``path="auto"`` runs plain PyTorch)."""

GEMV_ENV = "DSA_LINEAR_GEMV"
"""Environment switch of the Triton path's one-token calls (M = 1, a K-major weight, neither
``config`` nor ``splits`` given): unset, empty or ``1`` (default) runs them on the one-token
kernel (``kernels.linear.triton._gemv_kernel``, plain loads and fp32 FMAs; config
:func:`kernels.linear.configs.gemv_heuristic`), ``0`` on the tensor-core kernel. Measured
(H100, 2026-12-06, bench/NOTES.md "One-token projections: measured"): faster than cuBLAS and
the tensor-core kernel at every K-major projection of both presets (V4 B 1 projections 105.1
-> 91.7 us summed); an N-major weight (``wkv_b``'s key half as ``w^T``) stays on the
tensor-core kernel (8.0 us against 9.8 for the best one-token config)."""

_FLOAT = (torch.bfloat16, torch.float16, torch.float32)
_PATHS = _common.TORCH_PATHS
_COUNTERS_DEFAULT = 4096
_counters: dict[torch.device, torch.Tensor] = {}


# ============================================================================ validation

def _validate(x, w, out, out_dtype, alpha, path, config, splits):
    """TypeError / ValueError naming the argument, what was expected and what came. Returns
    ``(alpha, out_dtype, config, splits)`` normalised (config a LinearConfig or None, splits an
    int >= 0, 0 = the heuristic's)."""
    if path not in _PATHS:
        raise ValueError(f"path: expected one of {_PATHS}, got {path!r}")
    _common.check_tensor("x", x, dtypes=_FLOAT)
    if x.dim() not in (2, 3):
        raise ValueError(f"x: expected rank 2 [M, K] or 3 [G, M, K], got shape {tuple(x.shape)}")
    if min(x.shape) < 1:
        raise ValueError(f"x: expected non-empty dims, got shape {tuple(x.shape)}")
    if x.stride(-1) != 1:
        raise ValueError(f"x: expected the last dim contiguous (stride 1), got strides {x.stride()}")
    w_dtypes = (x.dtype,) if x.dtype == torch.float32 else (x.dtype, torch.float32)
    _common.check_tensor("w", w, dtypes=w_dtypes, ndim=x.dim(), device=x.device)
    lead, K = tuple(x.shape[:-2]), x.shape[-1]
    if tuple(w.shape[:-2]) != lead or w.shape[-1] != K or w.shape[-2] < 1:
        want = ", ".join(str(d) for d in lead + ("N",) + (K,))
        raise ValueError(f"w: expected shape [{want}] (x's K = {K}{', groups' if lead else ''}), "
                         f"got {tuple(w.shape)}")
    if w.stride(-1) != 1 and w.stride(-2) != 1:
        raise ValueError(f"w: expected its last dim (K) or its N dim contiguous (stride 1), got "
                         f"strides {w.stride()}")
    M, N = x.shape[-2], w.shape[-2]
    out_dtypes = (x.dtype,) if x.dtype == torch.float32 else (x.dtype, torch.float32)
    if out is not None:
        if out_dtype is not None and out_dtype != out.dtype:
            raise ValueError(f"out_dtype: expected None or out's dtype {out.dtype}, got {out_dtype}")
        _common.check_tensor("out", out, dtypes=out_dtypes, shape=lead + (M, N), device=x.device)
        if out.stride(-1) != 1:
            raise ValueError(f"out: expected the last dim contiguous (stride 1), got strides {out.stride()}")
        out_dtype = out.dtype
    elif out_dtype is None:
        out_dtype = x.dtype
    elif out_dtype not in out_dtypes:
        raise TypeError(f"out_dtype: expected one of {[str(d) for d in out_dtypes]} (x's dtype or "
                        f"float32), got {out_dtype}")
    alpha = check_real("alpha", alpha)
    if config is not None and not isinstance(config, lcfg.LinearConfig):
        raise TypeError(f"config: expected a kernels.linear.configs.LinearConfig or None, got "
                        f"{type(config).__name__}")
    splits = 0 if splits is None else check_int("splits", splits, minimum=1, maximum=lcfg.MAX_SPLITS)
    return alpha, out_dtype, config, splits


# ============================================================================ workspace

def reserve_workspace(device, counters: int = _COUNTERS_DEFAULT) -> torch.Tensor:
    """Make (or grow) the device's split-K arrival counters: ``counters`` zeroed int32 (one per
    N tile and group of a split call). Call it before capturing a CUDA graph that runs a split
    :func:`linear` (the layer does, at construction); every call leaves the counters zero.

    Returns:
      The counter buffer (int32 ``[>= counters]`` on ``device``).
    """
    device = torch.device(device)
    buf = _counters.get(device)
    if buf is None or buf.numel() < counters:
        buf = torch.zeros(max(counters, _COUNTERS_DEFAULT), dtype=torch.int32, device=device)
        _counters[device] = buf
    return buf


def _counter_buffer(device: torch.device, n: int) -> torch.Tensor:
    """The device's counters with at least ``n`` entries; during a capture that finds none, a
    zeroed buffer of this call's own (its memset is captured: the cached buffer cannot be
    zeroed while the stream is capturing)."""
    buf = _counters.get(device)
    if buf is not None and buf.numel() >= n:
        return buf
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    return reserve_workspace(device, n)


# ============================================================================ paths

def _plan(x3, w3, dev, config, splits):
    """Config and split count of a Triton call on ``dev``: the given config (a member of the
    call's space, else ValueError) or the heuristic's, the given split count or the heuristic's."""
    G, M, K = x3.shape
    N = w3.shape[1]
    wb, xb = w3.element_size(), x3.element_size()
    if config is None:
        config = lcfg.linear_heuristic(M, N, K, wb, dev.smem_per_block)
    elif config not in lcfg.linear_space(dev.smem_per_block, wb, M):
        raise ValueError(f"config: expected a member of the search space for M = {M} "
                         f"({'fp32' if wb == 4 else '16-bit'} weights, "
                         f"{lcfg.smem_class(dev.smem_per_block)} shared memory): "
                         f"{lcfg.linear_space(dev.smem_per_block, wb, M)}, got {config}")
    if not splits:
        splits = lcfg.linear_num_splits(config, M, N, K, G, dev.num_sms, wb, xb, dev.smem_per_block)
    return config, splits


def _triton_impl(x3, w3, out3, alpha, config, splits):
    from kernels.linear import triton as tl_linear
    dev = _common.device_info(x3.device)
    hardware.require_arch(dev, "linear (Triton)")
    _common.require_no_interpreted_bf16(dev, "linear", x3, w3, out3)
    G, M, K = x3.shape
    N = w3.shape[1]
    if M > lcfg.MAX_M:
        raise NotImplementedError(f"linear (Triton): M = {M} tokens; the kernel takes M <= "
                                  f"{lcfg.MAX_M} (use path='torch')")
    spans = {"x": x3[0], "w": w3[0], "out": out3[0]}
    for name, t in spans.items():
        last = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
        if last > INT32_MAX:
            raise NotImplementedError(f"linear (Triton): {name} spans {last + 1} elements per group; "
                                      f"the kernel's offsets are int32 (use path='torch')")
    if (M == 1 and config is None and not splits and w3.stride(2) == 1
            and env_switch(GEMV_ENV) is not False):
        gcfg = lcfg.gemv_heuristic(N, K, G, False, dev.num_sms)
        tl_linear.launch_gemv(x3, w3, out3, alpha, gcfg)
        return
    config, splits = _plan(x3, w3, dev, config, splits)
    splits = lcfg.split_geometry(K, config.block_k, splits)[1]
    tiles = -(-N // config.block_n) * G
    part = (torch.empty(G * splits * M * N, dtype=torch.float32, device=x3.device) if splits > 1
            else out3)
    counters = _counter_buffer(x3.device, tiles) if splits > 1 else out3
    tl_linear.launch_linear(x3, w3, out3, alpha, config, splits, part, counters)


def _torch_impl(x3, w3, out3, alpha):
    """``out = alpha * x @ w^T`` with torch.baddbmm (alpha applied in the GEMM's epilogue, one
    rounding to a 16-bit out); in float32 when w or out is float32 (x widened exactly)."""
    wide = torch.float32 in (w3.dtype, out3.dtype)
    x_, w_ = (x3.float(), w3.float()) if wide else (x3, w3)
    zero = torch.zeros((), dtype=x_.dtype, device=x3.device)
    res = torch.baddbmm(zero, x_, w_.transpose(1, 2), beta=0, alpha=alpha)
    out3.copy_(res)


@torch.library.custom_op("dsa::linear", mutates_args=("out",))
def _linear_op(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, alpha: float, path: str,
               config: Optional[list[int]], splits: int) -> None:
    x3, w3, out3 = (t if t.dim() == 3 else t.unsqueeze(0) for t in (x, w, out))
    cfg = None if config is None else lcfg.LinearConfig(*config[:5],
                                                          f32_dot=lcfg.F32_DOTS[config[5]])
    impls = {"triton": lambda: _triton_impl(x3, w3, out3, alpha, cfg, splits),
             "torch": lambda: _torch_impl(x3, w3, out3, alpha)}
    _common.run_path("linear", path, impls, BACKEND_PATHS["torch"])


@_linear_op.register_fake
def _(x, w, out, alpha, path, config, splits):
    return None


def _triton_pair_impl(x1, w1, out1, alpha1, x2, w2, out2, alpha2):
    """Two one-token products in one launch (``_gemv_pair_kernel``) where both products' own
    one-token configs form a pair of ``GEMV_PAIR_PICKS``, else two launches as :func:`linear`
    runs them (the same bits either way)."""
    from kernels.linear import triton as tl_linear
    dev = _common.device_info(x1.device)
    hardware.require_arch(dev, "linear_pair (Triton)")
    _common.require_no_interpreted_bf16(dev, "linear_pair", x1, w1, out1, x2, w2, out2)
    picks = tuple(lcfg.gemv_heuristic(w.shape[0], w.shape[1], 1, False, dev.num_sms) for w in (w1, w2))
    if (picks in lcfg.GEMV_PAIR_PICKS and env_switch(GEMV_ENV) is not False
            and max(w1.numel(), w2.numel()) <= INT32_MAX):
        tl_linear.launch_gemv_pair(x1, w1, out1, alpha1, picks[0], x2, w2, out2, alpha2, picks[1])
        return
    _triton_impl(x1[None], w1[None], out1[None], alpha1, None, 0)
    _triton_impl(x2[None], w2[None], out2[None], alpha2, None, 0)


@torch.library.custom_op("dsa::linear_pair", mutates_args=("out1", "out2"))
def _linear_pair_op(x1: torch.Tensor, w1: torch.Tensor, out1: torch.Tensor, alpha1: float,
                    x2: torch.Tensor, w2: torch.Tensor, out2: torch.Tensor, alpha2: float,
                    path: str) -> None:
    impls = {"triton": lambda: _triton_pair_impl(x1, w1, out1, alpha1, x2, w2, out2, alpha2),
             "torch": lambda: (_torch_impl(x1[None], w1[None], out1[None], alpha1),
                               _torch_impl(x2[None], w2[None], out2[None], alpha2))}
    _common.run_path("linear_pair", path, impls, BACKEND_PATHS["torch"])


@_linear_pair_op.register_fake
def _(x1, w1, out1, alpha1, x2, w2, out2, alpha2, path):
    return None


# ============================================================================ public

def linear(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None, alpha=1.0,
           out_dtype: torch.dtype | None = None, path: str = "auto",
           config: lcfg.LinearConfig | None = None, splits: int | None = None) -> torch.Tensor:
    """``out = alpha * x @ w^T`` for a few tokens, each element an fp32 sum rounded once to
    ``out``'s dtype.

    Args:
      x: ``[M, K]`` or ``[G, M, K]`` (G groups: heads or output groups of a batched
        projection), bf16 / fp16 / fp32, the last dim contiguous (other strides free).
      w: ``[N, K]`` or ``[G, N, K]`` (a linear layer's ``[out, in]`` weight), x's dtype or
        float32 (with 16-bit x: an fp32 IEEE dot of the exactly widened x); its last dim or its
        N dim contiguous (``wkv_b[:, :nope].transpose(1, 2)`` is a valid ``w``).
      out: ``[M, N]`` / ``[G, M, N]`` written in place (any strides with the last dim contiguous:
        a column slice of a larger buffer), dtype x's or float32; None allocates one.
      alpha: real scale, applied in float32 to the sum before the rounding.
      out_dtype: dtype of an allocated ``out`` (x's or float32; default x's).
      path: ``"auto"`` (Triton where it runs, else plain PyTorch), ``"triton"`` or ``"torch"``.
      config: a :class:`kernels.linear.configs.LinearConfig` of the call's search space
        (``linear_space``); None: ``linear_heuristic``.
      splits: split-K count (1..128; None: ``linear_num_splits``, from the SM count); reduced so
        that no split is empty. Results are bitwise repeatable for a given config and count.
        A Triton call of one token with a K-major ``w`` and neither ``config`` nor ``splits``
        runs the one-token kernel instead (no split; same bound, bitwise repeatable) unless
        :data:`GEMV_ENV` is ``0``.
    Returns:
      ``out`` (``[M, N]`` / ``[G, M, N]``).
    Raises:
      TypeError / ValueError: a bad dtype, shape, layout, device, alpha, config or splits (named).
      NotImplementedError: ``path="triton"`` where the kernel cannot run: a CPU without
        ``TRITON_INTERPRET=1``, bf16 in the interpreter, M > 64, an unsupported GPU, more than
        2^31 - 1 elements spanned by one group of an operand.
    """
    alpha, out_dtype, config, splits = _validate(x, w, out, out_dtype, alpha, path, config, splits)
    if out is None:
        out = torch.empty(tuple(x.shape[:-1]) + (w.shape[-2],), dtype=out_dtype, device=x.device)
    cfg = None if config is None else [config.block_n, config.block_m, config.block_k,
                                       config.num_warps, config.num_stages,
                                       lcfg.F32_DOTS.index(config.f32_dot)]
    torch.ops.dsa.linear(x, w, out, alpha, path, cfg, splits)
    return out


def linear_pair(x1: torch.Tensor, w1: torch.Tensor, x2: torch.Tensor, w2: torch.Tensor, *,
                alphas=(1.0, 1.0), out_dtypes=(None, None), path: str = "auto"):
    """Two one-token products, ``(alphas[0] * x1 @ w1^T, alphas[1] * x2 @ w2^T)``, each as
    :func:`linear` computes it (bit for bit) but on the Triton path in one launch where both
    products' one-token configs form a pair of
    :data:`kernels.linear.configs.GEMV_PAIR_PICKS` (``kernels.linear.triton._gemv_pair_kernel``;
    otherwise two launches): the decode layer's ``x_proj`` and ``weights_proj`` of a one-token
    step, whose second product is latency, not bytes.

    Args:
      x1, x2: ``[1, K1]`` / ``[1, K2]`` (one token), as :func:`linear`'s ``x``.
      w1, w2: ``[N1, K1]`` / ``[N2, K2]`` with K contiguous (the pair launch's layout; other
        layouts: :func:`linear`), as :func:`linear`'s ``w``.
      alphas: the two products' scales; out_dtypes: their outputs' dtypes (None: x's).
      path: ``"auto"``, ``"triton"`` or ``"torch"``, as :func:`linear`.
    Returns:
      ``(out1 [1, N1], out2 [1, N2])``.
    Raises:
      TypeError / ValueError: as :func:`linear` for each product (named), or an ``x`` of more
        than one token, or a weight whose K is not contiguous.
      NotImplementedError: as :func:`linear`.
    """
    outs, alist = [], []
    for i, (x, w, alpha, od) in enumerate(((x1, w1, alphas[0], out_dtypes[0]),
                                           (x2, w2, alphas[1], out_dtypes[1])), start=1):
        try:
            alpha, od, _, _ = _validate(x, w, None, od, alpha, path, None, None)
        except (TypeError, ValueError) as e:
            raise type(e)(f"product {i} (x{i}, w{i}): {e}") from None
        if x.dim() != 2 or x.shape[0] != 1:
            raise ValueError(f"x{i}: expected one token [1, K], got shape {tuple(x.shape)}")
        if w.stride(-1) != 1:
            raise ValueError(f"w{i}: expected K contiguous, got strides {tuple(w.stride())}")
        outs.append(torch.empty((1, w.shape[0]), dtype=od, device=x.device))
        alist.append(alpha)
    torch.ops.dsa.linear_pair(x1, w1, outs[0], alist[0], x2, w2, outs[1], alist[1], path)
    return outs[0], outs[1]
