"""Fused preparation of one decode-layer step: the elementwise / small-GEMM chains between the
layer's projections and its two DSA ops (norms, rope, the indexer's Hadamard rotation and fp8
quantisation, the new tokens' cache writes) as two Triton launches per step, and V4-Flash's
inverse rope on the attention output as a third.

* ``triton.py``: the three kernels (``_prep_x_kernel`` after the x projection, ``_prep_q_kernel``
  after the q projections, ``_rope_out_kernel`` after the attention), the frozen launch config of
  the second and its heuristic, the constexprs the launchers pass, and the AOT compile specs.
  Launched by ``torch_impl.layer`` (the ``dsa::prep_x`` / ``dsa::prep_q`` / ``dsa::rope_out``
  custom ops, ``DSA_LAYER_FUSED_PREP``).

The cache stores reuse the per-layout helpers of ``kernels/cache_write/triton.py``. The kernel
module imports triton.
"""
