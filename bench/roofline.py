"""Roofline floors: the bytes and FLOPs each op must move and do, and this GPU's peaks.

Floor of one call::

    floor_us = max(bytes / copy_bandwidth, flops / matmul_rate) * 1e6
    frac_floor = floor_us / median_us            (1.0 = at the roofline)

* ``copy_bandwidth`` (bytes/s) is measured once per run: a large device-to-device copy, counting
  bytes read + written (H200: about 4.3e12).
* ``matmul_rate`` (FLOP/s) is measured once per run: an 8192^3 bf16 matmul on random data
  (H200: about 7.9e14).

Sparse MLA decode (``B`` requests, ``N`` drafts, ``H`` heads, ``n_valid`` = the number of valid
index entries over all ``B x N`` lists, counted once per occurrence, ``= B*N*K`` when all valid)::

    bytes = n_valid * row_bytes + B*N*H*D_qk * q_itemsize + B*N*H*D_v * out_itemsize
    flops = 2 * H * n_valid * (D_qk + D_v)

with ``row_bytes`` 656 (``fp8_ds_mla``), 584 (``fp8_model1``) or ``D_qk * itemsize``
(``latent``; 2 * D_qk for bf16). Index lists, block table and LSE are not counted (< 1 %).

Lightning indexer + top-k (``L_b`` tokens of request b)::

    bytes = sum_b L_b * (D_I + 4) + B*N*H_I*D_I * q_itemsize + B*N*H_I * 4
    flops = 2 * N * H_I * D_I * sum_b L_b

The decode step (indexer + top-k + sparse MLA) adds both; its rows also carry
``floor_phases_us`` (each phase's floor: the phases run in turn, the MLA needs the top-k).

The decode layer (``dsa_decode_layer``: one step of ``DSADecodeLayer``, ``T = B*N`` tokens, this
rank's weights ``W``, :func:`layer_cost`)::

    bytes = sum_W numel * itemsize                    (weights, read once per step)
            + indexer bytes (lens L_b - window: V4 ranks positions before its window)
            + sparse MLA bytes (n_valid = T * (min(top-k, L - window) + window), H per rank)
    flops = 2 * T * sum_{2-D W} numel                 (every projection, wkv_b's two halves
                                                       included: q absorption + value up-proj)
            + 2 * T * (H_I + 1) * D_I^2               (Hadamard rotation of the indexer q and k)
            + indexer flops + sparse MLA flops

Linear weights are counted in the layer's dtype (2 bytes for bf16), the weights the layer keeps
in float32 (norms, ``attn_sink``, ``indexer.weights_proj``) at 4 bytes. Activations (x, out,
q, the new cache rows: < 1 % at B = 64) and elementwise work (norms, rope, quantization) are
not counted. Layer rows carry ``floor_phases_us`` = [projections, indexer, sparse MLA].
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kernels import formats

H200_COPY_BPS = 4.3e12       # nominal, for NOTES.md and sanity checks only
H200_BF16_FLOPS = 7.9e14


def kv_row_bytes(kv_format: str, d_qk: int, kv_itemsize: int = 2) -> int:
    """Bytes one token's latent row occupies in the cache (what a gather must read)."""
    if kv_format == "fp8_ds_mla":
        return formats.DS_MLA_BYTES
    if kv_format == "fp8_model1":
        return formats.MODEL1_TOKEN_BYTES
    if kv_format == "latent":
        return d_qk * kv_itemsize
    raise ValueError(f"kv_format: expected one of {formats.KV_FORMATS}, got {kv_format!r}")


def mla_cost(*, B: int, N: int, H: int, n_valid: int, d_qk: int, d_v: int, kv_format: str,
             kv_itemsize: int = 2, q_itemsize: int = 2, out_itemsize: int | None = None) -> tuple[int, int]:
    """(bytes, flops) of one sparse MLA decode call (formula in the module docstring)."""
    out_itemsize = q_itemsize if out_itemsize is None else out_itemsize
    nbytes = (n_valid * kv_row_bytes(kv_format, d_qk, kv_itemsize)
              + B * N * H * d_qk * q_itemsize + B * N * H * d_v * out_itemsize)
    flops = 2 * H * n_valid * (d_qk + d_v)
    return int(nbytes), int(flops)


def indexer_cost(*, lens, N: int, H_I: int, D_I: int, q_itemsize: int = 1) -> tuple[int, int]:
    """(bytes, flops) of one indexer + top-k call; ``lens`` = the B per-request lengths L_b."""
    lens = [int(x) for x in lens]
    B, total = len(lens), sum(lens)
    nbytes = total * (D_I + 4) + B * N * H_I * D_I * q_itemsize + B * N * H_I * 4
    flops = 2 * N * H_I * D_I * total
    return int(nbytes), int(flops)


def _layer_rank_shapes(cfg, tp: int) -> dict[str, tuple[int, ...]]:
    """This rank's weight shapes (``kernels.layer_reference.shard_weights`` without arrays)."""
    from kernels import layer_reference as lref

    cfg.heads_per_rank(tp)                                     # raises on a bad tp
    s = dict(lref.weight_shapes(cfg))
    if tp > 1:
        if cfg.absorbed:
            s["wq_b"] = (s["wq_b"][0] // tp, s["wq_b"][1])
            s["wkv_b"] = (s["wkv_b"][0] // tp, s["wkv_b"][1])
            s["wo"] = (s["wo"][0], s["wo"][1] // tp)
        else:
            s["wq_b"] = (s["wq_b"][0] // tp, s["wq_b"][1])
            s["attn_sink"] = (s["attn_sink"][0] // tp,)
            s["wo_a"] = (s["wo_a"][0] // tp, s["wo_a"][1])
            s["wo_b"] = (s["wo_b"][0], s["wo_b"][1] // tp)
    return s


def layer_weight_bytes(cfg, *, tp: int = 1, itemsize: int = 2) -> int:
    """Bytes of one rank's layer weights: linear weights at ``itemsize``, the ones the layers
    keep in float32 (norms, ``attn_sink``, ``indexer.weights_proj``) at 4.

    Args:
      cfg: a ``kernels.layer_reference.LayerConfig``; tp: tensor-parallel size.
    Raises:
      ValueError: ``tp`` does not divide the heads (or V4's output groups).
    """
    n = 0
    for name, shape in _layer_rank_shapes(cfg, tp).items():
        f32 = "norm" in name or name in ("attn_sink", "indexer.weights_proj")
        n += math.prod(shape) * (4 if f32 else itemsize)
    return int(n)


def layer_cost(cfg, *, B: int, N: int, lens, kv_format: str, tp: int = 1, itemsize: int = 2,
               kv_itemsize: int = 2, parts: list | None = None) -> tuple[int, int]:
    """(bytes, flops) of one decode-layer step (formula in the module docstring).

    Args:
      cfg: the layer's ``kernels.layer_reference.LayerConfig``.
      B, N: requests and new tokens per request; lens: the B context lengths L_b (counting the
        new tokens); kv_format: the latent cache layout; tp: tensor-parallel size (H per rank).
      itemsize: bytes of the layer's dtype (linear weights, q, attention output);
        kv_itemsize: bytes of a ``latent`` cache element.
      parts: if given, receives ``(bytes, flops)`` of [projections, indexer, sparse MLA].
    Raises:
      ValueError: bad ``tp`` or ``kv_format``.
    """
    lens = [int(x) for x in lens]
    T = B * N
    shapes = _layer_rank_shapes(cfg, tp)
    w_bytes = layer_weight_bytes(cfg, tp=tp, itemsize=itemsize)
    D_I, H_I = cfg.index_head_dim, cfg.index_heads
    proj_flops = (2 * T * sum(math.prod(sh) for sh in shapes.values() if len(sh) == 2)
                  + 2 * T * (H_I + 1) * D_I * D_I)
    win = cfg.window
    ib, i_f = indexer_cost(lens=[max(L - win, 0) for L in lens], N=N, H_I=H_I, D_I=D_I)
    n_valid = N * sum(min(cfg.topk, max(L - win, 0)) + min(win, L) for L in lens)
    mb, m_f = mla_cost(B=B, N=N, H=cfg.heads_per_rank(tp), n_valid=n_valid, d_qk=cfg.d_qk, d_v=cfg.d_v,
                       kv_format=kv_format, kv_itemsize=kv_itemsize, q_itemsize=itemsize)
    if parts is not None:
        parts += [(w_bytes, proj_flops), (ib, i_f), (mb, m_f)]
    return int(w_bytes + ib + mb), int(proj_flops + i_f + m_f)


@dataclass(frozen=True)
class Machine:
    """Measured peaks of this device (``measured=False``: nominal numbers, e.g. a dry run)."""

    copy_bytes_per_s: float
    matmul_flops_per_s: float
    how: str
    measured: bool = True

    def floor_us(self, nbytes: int, flops: int) -> float:
        """Roofline floor in microseconds."""
        return max(nbytes / self.copy_bytes_per_s, flops / self.matmul_flops_per_s) * 1e6

    def to_dict(self) -> dict:
        return asdict(self)


def row_metrics(machine: Machine, nbytes: int, flops: int, median_us: float | None) -> dict:
    """``floor_us``, ``frac_floor``, ``GB_per_s``, ``TFLOP_per_s`` of one row."""
    floor = machine.floor_us(nbytes, flops)
    if not median_us or median_us <= 0:
        return {"floor_us": floor, "frac_floor": None, "GB_per_s": None, "TFLOP_per_s": None}
    return {"floor_us": floor, "frac_floor": floor / median_us,
            "GB_per_s": nbytes / median_us * 1e-3, "TFLOP_per_s": flops / median_us * 1e-6}


def measure_torch_cuda(device="cuda", copy_bytes: int = 2 << 30, mm: int = 8192) -> Machine:
    """Copy bandwidth (``copy_bytes`` device-to-device, read + written counted) and bf16 matmul
    rate (``mm``^3) with ``triton.testing.do_bench`` (median)."""
    import torch
    from triton.testing import do_bench

    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    bw = 2 * copy_bytes / (ms * 1e-3)
    del src, dst
    a = torch.randn(mm, mm, dtype=torch.bfloat16, device=device)
    b = torch.randn(mm, mm, dtype=torch.bfloat16, device=device)
    ms_mm = do_bench(lambda: a @ b, warmup=10, rep=100, return_mode="median")
    rate = 2 * mm ** 3 / (ms_mm * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return Machine(bw, rate, f"torch: {copy_bytes >> 20} MiB D2D copy (read+write), {mm}^3 bf16 matmul, "
                             f"do_bench median")


def measure_cpu(copy_bytes: int = 64 << 20, mm: int = 512) -> Machine:
    """Dry-run stand-in: NumPy copy and float32 matmul on the host (meaningless for kernels)."""
    import time

    import numpy as np

    src = np.ones(copy_bytes, np.uint8)
    dst = np.empty_like(src)
    best = np.inf
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    a = np.ones((mm, mm), np.float32)
    best_mm = np.inf
    for _ in range(3):
        t = time.perf_counter()
        a @ a
        best_mm = min(best_mm, time.perf_counter() - t)
    return Machine(2 * copy_bytes / best, 2 * mm ** 3 / best_mm,
                   f"CPU dry run: numpy {copy_bytes >> 20} MiB copy, {mm}^3 float32 matmul (not a GPU)",
                   measured=False)
