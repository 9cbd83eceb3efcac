"""DeepGEMM-compatible paged MQA logits (the DSA lightning indexer) on this project's kernels.

Same names, arguments and layouts as deepseek-ai/DeepGEMM at commit 54e2261
(``csrc/apis/attention.hpp``, ``tests/test_attention.py``; facts: docs/COMPAT.md), backed by
:func:`torch_impl.indexer_logits` (Triton on CUDA GPUs of compute capability 8.9 and up, sm_120
included; the interpreter or plain PyTorch on the CPU).

The fused kv_cache ``[num_blocks, block_kv, 1, D + 4]`` uint8 is a view over pages of
``block_kv * (D + 4)`` bytes holding all block_kv e4m3 rows of D bytes, then block_kv float32
scales: the same bytes as this project's ``fp8_indexer`` page, so it is read in place (any page
stride that is a multiple of 4, as DeepGEMM allows).

Deviations from the pinned commit (every one accepts more, none changes a result DeepGEMM
defines):

- ``context_lens`` 1-D ``[B]`` is accepted besides DeepGEMM's 2-D ``[B, next_n]``: draft i of
  request b then sees positions ``j < context_lens[b] - (next_n - 1 - i)`` (DeepGEMM's legacy
  1-D rule, tests/test_attention.py ``ref_paged_mqa_logits``).
- Any H and any power-of-two D >= 16 (DeepGEMM: H in 32 / 64 on sm90, 8..64 on sm100; D 32 / 64 /
  128), any block_kv (DeepGEMM: 64 on sm90, 32 / 64 on sm100), any GPU the native op runs on.
- ``clean_logits``: both values are accepted and positions outside a row's valid prefix are
  always -inf (DeepGEMM leaves them unspecified with ``clean_logits=False`` and refuses
  ``clean_logits=True`` with 2-D context_lens at this commit).
- The returned logits are a ``[B * next_n, max_context_len]`` view whose row stride is the block
  table's capacity ``max_blocks * block_kv`` (DeepGEMM: ``max_context_len`` rounded up to 256
  and to 1024 bytes). Consumers that pass ``logits.stride(0)`` (vLLM's top-k) read either. When
  ``max_context_len`` exceeds the table's capacity the logits are copied into a wider
  -inf-filled buffer (the engines size the table for ``max_context_len``, so this does not
  happen on their hot path).
- ``logits_dtype=torch.bfloat16``: the float32 logits are rounded (one extra pass).
- ``schedule_meta``: accepted and unused (the native launcher plans its own split);
  :func:`get_paged_mqa_logits_metadata` returns a zero int32 ``[num_sms + 1, 2]`` tensor of
  DeepGEMM's shape.
- Not provided: FP4 q / cache (``q=(values, scales)`` with scales), varlen ``indices`` (sm100
  only in DeepGEMM); both raise NotImplementedError.

Work: scoring reads only the pages of each row's valid prefix (it scales with the actual
lengths); the ``[B, next_n, max_blocks * block_kv]`` float32 output is allocated and -inf
filled by :func:`torch_impl.indexer_logits` (4 bytes per table position per row, written once).
"""
from __future__ import annotations

import torch

from kernels import hardware
from kernels.scalars import INT32_MAX, check_int
from torch_impl import _common
from torch_impl.compat._names import own_names
from torch_impl.indexer import indexer_logits

__all__ = ["get_num_sms", "get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits",
           "fp8_fp4_paged_mqa_logits"]


def get_num_sms() -> int:
    """Multiprocessors of the current CUDA device (DeepGEMM ``get_num_sms``); on a machine
    without CUDA the interpreter's nominal count (``kernels.hardware.CPU_INTERPRETER``)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return hardware.CPU_INTERPRETER.num_sms


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices: torch.Tensor | None = None) -> torch.Tensor:
    """DeepGEMM's schedule metadata: int32 ``[num_sms + 1, 2]`` (zeros; unused by the native
    launcher, which needs no host-side plan).

    Args:
      context_lens: int32 ``[B, next_n]`` (DeepGEMM; ``[B]`` accepted), contiguous.
      block_kv: page size in tokens (>= 1).
      num_sms: multiprocessor count (>= 1), e.g. :func:`get_num_sms`.
      indices: varlen row -> request map (DeepGEMM sm100 only): not provided.
    Raises:
      TypeError / ValueError: bad argument (named). NotImplementedError: ``indices`` given.
    """
    _common.check_tensor("context_lens", context_lens, dtypes=(torch.int32,))
    if context_lens.dim() not in (1, 2):
        raise ValueError(f"context_lens: expected [B, next_n] (or [B]), got shape "
                         f"{tuple(context_lens.shape)}")
    for name, v in (("block_kv", block_kv), ("num_sms", num_sms)):
        check_int(name, v, minimum=1)
    if indices is not None:
        raise NotImplementedError("get_paged_mqa_logits_metadata: varlen indices (DeepGEMM "
                                  "sm100-only) are not provided")
    return torch.zeros((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)


def _pages(kv_cache: torch.Tensor, D: int, device) -> torch.Tensor:
    """DeepGEMM fused kv_cache view -> this project's ``fp8_indexer`` pages (no copy)."""
    _common.check_tensor("kv_cache", kv_cache, ndim=4, dtypes=(torch.uint8,), device=device)
    nb, bkv, hk, width = kv_cache.shape
    if hk != 1 or width != D + 4:
        raise ValueError(f"kv_cache: expected [num_blocks, block_kv, 1, D + 4 = {D + 4}] uint8, "
                         f"got shape {tuple(kv_cache.shape)}")
    if nb < 1 or bkv < 1:
        raise ValueError(f"kv_cache: expected at least one page of one token, got shape "
                         f"{tuple(kv_cache.shape)}")
    if kv_cache.stride(3) != 1 or (bkv > 1 and kv_cache.stride(1) != D + 4):
        raise ValueError(f"kv_cache: expected stride(1) = D + 4 = {D + 4} and stride(3) = 1 "
                         f"(DeepGEMM's layout), got strides {tuple(kv_cache.stride())}")
    page_bytes = bkv * (D + 4)
    s_page = kv_cache.stride(0) if nb > 1 else page_bytes
    if s_page < page_bytes or s_page % 4:
        raise ValueError(f"kv_cache: expected a page stride >= {page_bytes} bytes and a multiple "
                         f"of 4, got {s_page}")
    return torch.as_strided(kv_cache, (nb, page_bytes), (s_page, 1), kv_cache.storage_offset())


def fp8_fp4_paged_mqa_logits(q, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_table: torch.Tensor,
                             schedule_meta: torch.Tensor, max_context_len: int,
                             clean_logits: bool = False, logits_dtype=torch.float32,
                             indices: torch.Tensor | None = None, *,
                             path: str = "auto") -> torch.Tensor:
    """Paged MQA logits of the DSA indexer (DeepGEMM 54e2261 ``fp8_fp4_paged_mqa_logits``).

    ``logits[b * next_n + i, j] = scale[j] * sum_h weights[b * next_n + i, h] *
    relu(q[b, i, h] . k[j])`` for positions j valid for draft i of request b, -inf elsewhere.

    Args:
      q: ``(q_fp8, None)`` as DeepGEMM takes it (a bare tensor is accepted too): float8_e4m3fn
        ``[B, next_n, H, D]``. ``(values, scales)`` with scales (FP4) is not provided.
      kv_cache: uint8 ``[num_blocks, block_kv, 1, D + 4]`` (module docstring), read in place.
      weights: float32 ``[B * next_n, H]`` (q scale, ``H^-0.5`` and ``D^-0.5`` folded in by the
        caller, as vLLM and SGLang do); bf16 is widened to float32.
      context_lens: int32 ``[B, next_n]``: row (b, i) sees positions ``j < context_lens[b, i]``
        (DeepGEMM). ``[B]`` accepted (module docstring).
      block_table: int32 ``[B, max_blocks]``: page of position j is ``block_table[b, j //
        block_kv]``; negative or ``>= num_blocks`` entries are never read (their positions -inf).
      schedule_meta: from :func:`get_paged_mqa_logits_metadata` (unused).
      max_context_len: width of the returned logits, in [1, 2^31 - 1] (ValueError otherwise).
      clean_logits: accepted; invalid positions are always -inf.
      logits_dtype: ``torch.float32`` (default) or ``torch.bfloat16``.
      indices: varlen (DeepGEMM sm100 only): not provided.
      path: this project's path choice, ``"auto"`` | ``"triton"`` | ``"torch"``.

    Returns:
      ``[B * next_n, max_context_len]`` logits in ``logits_dtype`` (a view, row stride in the
      module docstring).

    Raises:
      TypeError / ValueError: bad argument (named, expected and received).
      NotImplementedError: FP4, varlen, or a GPU / path the native op cannot run on.
    """
    if isinstance(q, (tuple, list)):
        if len(q) != 2:
            raise ValueError(f"q: expected (q_fp8, None), got a sequence of {len(q)}")
        q, q_sf = q
        if q_sf is not None:
            raise NotImplementedError("fp8_fp4_paged_mqa_logits: FP4 q (q=(values, scales)) is "
                                      "not provided; pass (q_fp8, None)")
    if indices is not None:
        raise NotImplementedError("fp8_fp4_paged_mqa_logits: varlen indices (DeepGEMM "
                                  "sm100-only) are not provided")
    _common.check_tensor("q", q, ndim=4, dtypes=(torch.float8_e4m3fn,))
    B, N, H, D = q.shape
    _common.check_tensor("weights", weights, shape=(B * N, H),
                         dtypes=(torch.float32, torch.bfloat16), device=q.device)
    if logits_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"logits_dtype: expected torch.float32 or torch.bfloat16, got "
                         f"{logits_dtype}")
    if not isinstance(clean_logits, bool):
        raise TypeError(f"clean_logits: expected a bool, got {type(clean_logits).__name__}")
    check_int("max_context_len", max_context_len, minimum=1, maximum=INT32_MAX,
              why="positions are int32, as in DeepGEMM")
    _common.check_tensor("schedule_meta", schedule_meta, dtypes=(torch.int32,), ndim=2)
    pages = _pages(kv_cache, D, q.device)
    P = kv_cache.shape[1]
    w = weights.view(B, N, H) if weights.dtype == torch.float32 else weights.float().view(B, N, H)
    with own_names({"k_cache": "kv_cache"}):   # the native op names the page view k_cache
        logits = indexer_logits(q, w, pages, block_table, context_lens, k_format="fp8_indexer",
                                path=path)                              # [B, N, W]
    W = block_table.shape[1] * P
    flat = logits.view(B * N, W)
    if max_context_len <= W:
        flat = flat[:, :max_context_len]
    else:
        wide = torch.full((B * N, max_context_len), float("-inf"), dtype=torch.float32,
                          device=q.device)
        wide[:, :W] = flat
        flat = wide
    return flat if logits_dtype == torch.float32 else flat.to(logits_dtype)


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_table: torch.Tensor,
                         schedule_meta: torch.Tensor, max_context_len: int,
                         clean_logits: bool = False, indices: torch.Tensor | None = None, *,
                         path: str = "auto") -> torch.Tensor:
    """DeepGEMM 54e2261's legacy ``fp8_paged_mqa_logits``: q a bare float8_e4m3fn tensor,
    float32 logits; otherwise exactly :func:`fp8_fp4_paged_mqa_logits`."""
    return fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_table,
                                    schedule_meta, max_context_len, clean_logits, torch.float32,
                                    indices, path=path)
