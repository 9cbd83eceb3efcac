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
"""
from __future__ import annotations

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
