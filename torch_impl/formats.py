"""Cache writers and readers in PyTorch: byte-exact twins of ``kernels/formats.py``.

Same names, same layouts (docs/SPEC.md "Cache layouts", FlashMLA ``tests/quant.py`` and
DeepGEMM's paged MQA layout; the byte tables are in ``kernels/formats.py``). Quantizers produce
the same bytes as the NumPy definitions for the same input (``tests/test_torch_sparse_mla.py``
checks this); dequantizers return float32 and are exact. All functions run on any device, do
no host synchronisation and allocate only output-sized tensors.

The scale rule is computed exactly as the NumPy definition does it (float32 ``log2``, ``ceil``,
``exp2``), so the rare inputs where float32 ``log2`` rounds to an integer get the same scale.
"""
from __future__ import annotations

import torch

from kernels import formats as _nf

FP8_MAX = _nf.FP8_MAX
_E4M3 = torch.float8_e4m3fn


def _check(name: str, t, *, ndim: int | None = None, last: int | None = None,
           dtype: torch.dtype | None = None, floating: bool = False) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected rank {ndim}, got shape {tuple(t.shape)}")
    if last is not None and (t.dim() == 0 or t.shape[-1] != last):
        raise ValueError(f"{name}: expected last dim {last}, got shape {tuple(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")


def _div_448(x: torch.Tensor) -> torch.Tensor:
    """``x / 448`` correctly rounded on every device: PyTorch's CUDA division by a Python scalar
    multiplies by the rounded reciprocal (1 ulp off the NumPy writers' bytes for some values;
    seen on the H200), a division by a device tensor divides. The divisor is filled on the device
    (no host-to-device copy, so CUDA-graph capture and torch.compile keep working)."""
    return x / torch.full((), FP8_MAX, dtype=x.dtype, device=x.device)


def pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """FlashMLA's ue8m0 scale ``2^ceil(log2(max(amax / 448, 1e-4)))``, float32."""
    s = torch.clamp_min(_div_448(amax.float()), 1e-4)
    return torch.exp2(torch.ceil(torch.log2(s)))


def to_e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even e4m3 of ``x`` clamped to +-448, as uint8 bytes (same shape)."""
    return torch.clamp(x.float(), -FP8_MAX, FP8_MAX).to(_E4M3).view(torch.uint8)


def _bytes_of(x: torch.Tensor, n: int) -> torch.Tensor:
    """Little-endian bytes of the last dim of a contiguous tensor: ``[..., d] -> [..., d * n]``."""
    return x.contiguous().view(torch.uint8).reshape(*x.shape[:-1], x.shape[-1] * n)


def _ue8m0_byte(scale: torch.Tensor) -> torch.Tensor:
    """Exponent byte of a power-of-two float32 scale (``127 + log2(scale)``)."""
    return ((scale.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


# ----------------------------------------------------------------------------- fp8_ds_mla

def quantize_fp8_ds_mla(latent: torch.Tensor) -> torch.Tensor:
    """Quantize latent rows into the V3.2 ``fp8_ds_mla`` layout (byte-exact with
    ``kernels.formats.quantize_fp8_ds_mla``).

    Args:
      latent: ``[..., 576]`` float (fp32 / fp16 / bf16): 512 nope dims, then 64 rope dims.
    Returns:
      uint8 ``[..., 656]``: bytes 0..511 e4m3 nope dims, 512..527 four float32 scales (one per
      128 dims, power of two), 528..655 the rope dims as bf16 (round to nearest even).
    Raises:
      TypeError: not a floating-point tensor. ValueError: last dim is not 576.
    """
    _check("latent", latent, last=576, floating=True)
    x = latent.float()
    lead = x.shape[:-1]
    nope = x[..., :512].reshape(*lead, 4, 128)
    scale = pow2_scale(nope.abs().amax(dim=-1))                            # [..., 4]
    q = to_e4m3_bytes(nope / scale[..., None]).reshape(*lead, 512)
    rope = _bytes_of(x[..., 512:].to(torch.bfloat16), 2)
    return torch.cat([q, _bytes_of(scale, 4), rope], dim=-1)


def dequantize_fp8_ds_mla(cache: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 656]`` ``fp8_ds_mla`` rows -> float32 ``[..., 576]`` (exact)."""
    _check("cache", cache, last=656, dtype=torch.uint8)
    c = cache.contiguous()
    lead = c.shape[:-1]
    q = c[..., :512].contiguous().view(_E4M3).float().reshape(*lead, 4, 128)
    scale = c[..., 512:528].contiguous().view(torch.float32)               # [..., 4]
    rope = c[..., 528:].contiguous().view(torch.bfloat16).float()          # [..., 64]
    return torch.cat([(q * scale[..., None]).reshape(*lead, 512), rope], dim=-1)


# ----------------------------------------------------------------------------- fp8_model1

def quantize_fp8_model1(latent: torch.Tensor) -> torch.Tensor:
    """Quantize latent pages into the V4-Flash ``fp8_model1`` layout (byte-exact with
    ``kernels.formats.quantize_fp8_model1``).

    Args:
      latent: ``[num_pages, P, 512]`` float: 448 nope dims, then 64 rope dims.
    Returns:
      uint8 ``[num_pages, page_bytes]``, ``page_bytes = P * 584`` rounded up to a multiple of
      576: P data rows (448 e4m3 + 64 bf16 = 576 bytes), then P scale rows (7 ue8m0 bytes,
      one zero pad byte), then zero padding.
    Raises:
      TypeError / ValueError: not a floating-point rank-3 tensor with last dim 512.
    """
    _check("latent", latent, ndim=3, last=512, floating=True)
    x = latent.float()
    n, p, _ = x.shape
    nope = x[..., :448].reshape(n, p, 7, 64)
    scale = pow2_scale(nope.abs().amax(dim=-1))                            # [n, p, 7]
    q = to_e4m3_bytes(nope / scale[..., None]).reshape(n, p, 448)
    rope = _bytes_of(x[..., 448:].to(torch.bfloat16), 2)                   # [n, p, 128]
    data = torch.cat([q, rope], dim=-1).reshape(n, p * 576)
    sc = torch.cat([_ue8m0_byte(scale), torch.zeros(n, p, 1, dtype=torch.uint8, device=x.device)],
                   dim=-1).reshape(n, p * 8)
    page_bytes = _nf.model1_page_bytes(p)
    pad = torch.zeros(n, page_bytes - p * 584, dtype=torch.uint8, device=x.device)
    return torch.cat([data, sc, pad], dim=-1)


def dequantize_fp8_model1(cache: torch.Tensor, page_size: int | None = None) -> torch.Tensor:
    """uint8 ``[num_pages, page_bytes]`` ``fp8_model1`` pages -> float32 ``[num_pages, P, 512]``
    (exact; scale byte e means 2^(e-127)).

    Raises:
      TypeError / ValueError: ``cache`` not uint8 rank 2; ``page_size`` not an int, < 1, or not
        the P of the cache's page bytes (None: the P they imply; no P matches).
    """
    _check("cache", cache, ndim=2, dtype=torch.uint8)
    p = _nf.resolve_model1_page_size(cache.shape[1], page_size)
    n = cache.shape[0]
    data = cache[:, : p * 576].reshape(n, p, 576)
    q = data[..., :448].contiguous().view(_E4M3).float().reshape(n, p, 7, 64)
    rope = data[..., 448:].contiguous().view(torch.bfloat16).float()
    e = cache[:, p * 576: p * 584].reshape(n, p, 8)[..., :7].to(torch.int32)
    scale = (e << 23).view(torch.float32)                                  # 2^(e-127)
    return torch.cat([(q * scale[..., None]).reshape(n, p, 448), rope], dim=-1)


# ----------------------------------------------------------------------------- fp8_indexer

def indexer_scale(amax: torch.Tensor, scale_fmt: str | None) -> torch.Tensor:
    """Per-token indexer scale ``max(amax, 1e-4) / 448`` (DeepSeek ``act_quant``), rounded up to a
    power of two with ``scale_fmt="ue8m0"``; float32."""
    if scale_fmt not in (None, "ue8m0"):
        raise ValueError(f"scale_fmt: expected None or 'ue8m0', got {scale_fmt!r}")
    s = _div_448(torch.clamp_min(amax.float(), 1e-4))
    if scale_fmt == "ue8m0":
        s = torch.exp2(torch.ceil(torch.log2(s)))
    return s


def quantize_fp8_indexer(k: torch.Tensor, scale_fmt: str | None = "ue8m0") -> torch.Tensor:
    """Quantize indexer keys into DeepGEMM's paged ``fp8_indexer`` layout (byte-exact with
    ``kernels.formats.quantize_fp8_indexer``).

    Args:
      k: ``[num_pages, P, D_I]`` float indexer keys.
      scale_fmt: ``"ue8m0"`` (the model's setting) or None (``amax / 448``).
    Returns:
      uint8 ``[num_pages, P * (D_I + 4)]``: P rows of D_I e4m3 bytes, then P float32 scales.
    Raises:
      TypeError / ValueError: not a floating-point rank-3 tensor, or a bad ``scale_fmt``.
    """
    _check("k", k, ndim=3, floating=True)
    x = k.float()
    n, p, d = x.shape
    scale = indexer_scale(x.abs().amax(dim=-1), scale_fmt)                 # [n, p]
    q = to_e4m3_bytes(x / scale[..., None]).reshape(n, p * d)
    return torch.cat([q, _bytes_of(scale, 4)], dim=-1)


def dequantize_fp8_indexer(cache: torch.Tensor, head_dim: int = 128) -> torch.Tensor:
    """uint8 ``[num_pages, P * (D_I + 4)]`` -> float32 ``[num_pages, P, D_I]`` (value x scale).

    Raises:
      TypeError: ``head_dim`` not an int. ValueError: ``head_dim`` < 1, bytes per page not a
        positive multiple of ``head_dim + 4``.
    """
    _check("k_cache", cache, ndim=2, dtype=torch.uint8)
    n, page_bytes = cache.shape
    p = _nf.indexer_page_size(page_bytes, head_dim)
    head_dim = int(head_dim)
    vals = cache[:, : p * head_dim].contiguous().view(_E4M3).float().reshape(n, p, head_dim)
    scales = cache[:, p * head_dim:].contiguous().view(torch.float32)      # [n, p]
    return vals * scales[..., None]
