"""Fused preparation of one decode-layer step: the elementwise / small-GEMM chains between the
layer's projections and its two DSA ops (norms, rope, the indexer's Hadamard rotation and fp8
quantisation, the new tokens' cache writes), as two Triton launches per step.

* ``triton.py``: the two kernels (``_prep_x_kernel`` after the x projection,
  ``_prep_q_kernel`` after the q projections), their frozen launch config and heuristic,
  the constexprs the launcher passes, and the AOT compile specs. Launched by
  ``torch_impl.layer`` (the ``dsa::prep_x`` / ``dsa::prep_q`` custom ops).

The cache stores reuse the per-layout helpers of ``kernels/cache_write/triton.py``. The kernel
module imports triton.
"""
