"""The two-cache merge of ``flash_mla_with_kvcache(..., extra_k_cache=...)`` as one Triton launch.

Inputs: the two native ``sparse_mla_decode`` results (no sink), each ``out [B, N, H, 512]`` in
q's dtype and ``lse [B, N, H]`` float32 natural log (-inf = no valid entry). Output, in one pass
over ``[B, N, H, 512]``:

* ``lse = logaddexp(lse0, lse1)`` (computed as ``m + ln(e^{lse0-m} + e^{lse1-m})``, m the max);
* ``out = (out0 e^{lse0-m} + out1 e^{lse1-m}) / (e^{lse0-m} + e^{lse1-m})`` in float32, then the
  sink once: ``out *= 1 / (1 + exp(sink_h - lse))``, then one rounding to q's dtype;
* FlashMLA's lse layout: ``[B, H, N]`` contiguous, +inf for a row with no valid entry in either
  cache (NaN stays NaN).

The math is the split-K combine of ``kernels/sparse_mla/triton.py`` (``_sparse_mla_combine_kernel``)
with two "splits" given in natural log and q's dtype. Element-wise per (row, head): no atomics,
no reduction order to vary, so results are bitwise repeatable. :func:`merge_torch` is the same
formula in PyTorch (``path="torch"``, and where Triton cannot run).
"""
from __future__ import annotations

import torch

BLOCK_H = 4          # heads per program: 4 x 512 fp32 tiles, B*N*H/4 programs
NUM_WARPS = 4

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no triton: merge_torch only
    triton = None

if triton is not None:
    @triton.jit
    def _flash_mla_merge2_kernel(
        o0_ptr, l0_ptr, o1_ptr, l1_ptr,   # [BN, H, D_V] q dtype / [BN, H] fp32 natural log
        sink_ptr,                         # [H] fp32 (HAS_SINK)
        out_ptr,                          # [BN, H, D_V] q dtype
        lse_ptr,                          # [B, H, N] fp32, FlashMLA layout (+inf empty)
        N, H,
        D_V: tl.constexpr, BLOCK_H: tl.constexpr, HAS_SINK: tl.constexpr,
    ):
        pid_h = tl.program_id(0)
        bn = tl.program_id(1)
        heads = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
        h_ok = heads < H
        row = bn.to(tl.int64) * H + heads
        l0 = tl.load(l0_ptr + row, mask=h_ok, other=float("-inf"))
        l1 = tl.load(l1_ptr + row, mask=h_ok, other=float("-inf"))
        nan = (l0 != l0) | (l1 != l1)
        m = tl.where(l0 > l1, l0, l1)
        m_safe = tl.where(m > float("-inf"), m, 0.0)
        w0 = tl.exp(l0 - m_safe)                       # -inf -> 0
        w1 = tl.exp(l1 - m_safe)
        den = w0 + w1
        has = den > 0.0
        den_safe = tl.where(has, den, 1.0)
        lse = tl.where(has, m_safe + tl.log(den_safe), float("-inf"))
        f = tl.where(has, 1.0 / den_safe, 0.0)
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=h_ok, other=0.0)
            f = f * (1.0 / (1.0 + tl.exp(sink - lse)))
        f = tl.where(nan, float("nan"), f)
        lse = tl.where(nan, float("nan"), lse)
        dv = tl.arange(0, D_V)
        offs = row[:, None] * D_V + dv[None, :]
        msk = h_ok[:, None]
        o0 = tl.load(o0_ptr + offs, mask=msk, other=0.0).to(tl.float32)
        o1 = tl.load(o1_ptr + offs, mask=msk, other=0.0).to(tl.float32)
        o = o0 * (w0 * f)[:, None] + o1 * (w1 * f)[:, None]
        tl.store(out_ptr + offs, o.to(out_ptr.dtype.element_ty), mask=msk)
        b = bn // N
        s = bn - b * N
        lrow = (b.to(tl.int64) * H + heads) * N + s
        tl.store(lse_ptr + lrow, tl.where(lse == float("-inf"), float("inf"), lse), mask=h_ok)


def merge_triton(out0, lse0, out1, lse1, sink, out=None):
    """One launch: ``(out [B, N, H, D_V] in out0's dtype, lse [B, H, N] FlashMLA layout)``.
    ``out``: optional destination (contiguous, out0's dtype and shape) written in place."""
    B, N, H, D_V = out0.shape
    out0, out1 = out0.contiguous(), out1.contiguous()
    lse0, lse1 = lse0.contiguous(), lse1.contiguous()
    if out is None:
        out = torch.empty_like(out0)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=out0.device)
    k = _flash_mla_merge2_kernel
    grid = (-(-H // BLOCK_H), B * N)
    k[grid](out0, lse0, out1, lse1, sink if sink is not None else lse0, out, lse, N, H,
            D_V=D_V, BLOCK_H=BLOCK_H, HAS_SINK=sink is not None, num_warps=NUM_WARPS)
    return out, lse


def merge_torch(out0, lse0, out1, lse1, sink):
    """The same merge in PyTorch: ``(out in out0's dtype [B, N, H, D_V], lse [B, H, N] with +inf
    for empty rows)``."""
    m = torch.maximum(lse0, lse1)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    w0 = torch.exp(lse0 - m)
    w1 = torch.exp(lse1 - m)
    den = w0 + w1
    has = den != 0
    safe = torch.where(has, den, torch.ones_like(den))
    lse = torch.where(has, m + torch.log(safe), torch.full_like(m, float("-inf")))
    f = torch.where(has, 1.0 / safe, torch.zeros_like(den))
    if sink is not None:
        f = f * (1.0 / (1.0 + torch.exp(sink - lse)))
    o = out0.float() * (w0 * f)[..., None]
    o.addcmul_(out1.float(), (w1 * f)[..., None])
    lse_fm = torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)
    return o.to(out0.dtype), lse_fm.transpose(1, 2).contiguous()


def can_use_triton(q: torch.Tensor, path: str) -> bool:
    """The Triton merge runs where the triton path of the native op does: a CUDA tensor, or the
    CPU interpreter (``TRITON_INTERPRET=1``) for fp16 / fp32 (the interpreter computes bf16 on
    raw bits); never for ``path="torch"``."""
    if path == "torch":
        return False
    from torch_impl._common import interpret_mode
    if q.device.type == "cuda":
        ok = True
    elif q.device.type == "cpu" and interpret_mode():
        ok = q.dtype != torch.bfloat16
    else:
        return False
    return ok and triton is not None
