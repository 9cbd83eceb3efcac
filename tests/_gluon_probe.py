"""A probe of the two wgmma orientations the few-heads kernel (kernels/sparse_mla/gluon_small.py)
is built on, alone, so a GPU failure of that kernel can be told apart from its pipeline:

* ``S^T = X . q^T``: A = X ``[64 rows, 64]`` fp16 in shared memory (K-major), B = the permuted
  view of q ``[HN, 64]`` (K-major);
* ``O^T = X^T . P``: A = the permuted view of the same X (an MN-major fp16 operand), B = the
  permuted view of P^T stored from registers as ``[HN, 64]`` (``gl.permute`` then ``store``).

Imported only by the sm_90 GPU test (tests/test_torch_sparse_mla.py), so the CPU interpreter
never sees the Gluon kernel.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from kernels.sparse_mla.gluon import _barrier


@gluon.jit
def _orientation_probe_kernel(x_ptr,   # [64, 64] fp16, row-major (rows x dims)
                              q_ptr,   # [HN, 64] fp16 (heads x dims)
                              p_ptr,   # [64, HN] fp16 (rows x heads)
                              s_ptr,   # [64, HN] fp32 out: X . q^T
                              o_ptr,   # [64, HN] fp32 out: X^T . P
                              HN: gl.constexpr):
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, HN, 16])
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, LD))
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, LD))
    h = gl.arange(0, HN, layout=gl.SliceLayout(1, LD))
    x = gl.load(x_ptr + r[:, None] * 64 + d[None, :])
    q = gl.load(q_ptr + h[:, None] * 64 + d[None, :])
    mr = gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))
    mh = gl.arange(0, HN, layout=gl.SliceLayout(0, MMA))
    p = gl.load(p_ptr + mr[:, None] * HN + mh[None, :])          # [64 rows, HN] in MMA layout
    xs = gl.allocate_shared_memory(gl.float16, [64, 64], SH, x)
    qs = gl.allocate_shared_memory(gl.float16, [HN, 64], SH, q)
    pt = gl.allocate_shared_memory(gl.float16, [HN, 64], SH)
    pt.store(gl.permute(p, (1, 0)))
    fence_async_shared()
    _barrier()
    zero = gl.zeros([64, HN], gl.float32, layout=MMA)
    s = warpgroup_mma(xs, qs.permute((1, 0)), zero, use_acc=False)
    o = warpgroup_mma(xs.permute((1, 0)), pt.permute((1, 0)), zero, use_acc=False)
    gl.store(s_ptr + mr[:, None] * HN + mh[None, :], s)
    gl.store(o_ptr + mr[:, None] * HN + mh[None, :], o)
