"""Sparse MLA decode (SPEC "Operation B"): the split-K kernel over the top-k rows and its LSE
combine, in both stacks.

* ``reference.py``: the float64 NumPy reference (re-exported by ``kernels.reference``).
* ``configs.py``: tile / split configs, their search spaces and heuristics, the split count
  (shared by both kernels; imports nothing beyond the standard library).
* ``triton.py``: the Triton kernels.
* ``gluon.py``: the sm_90 Gluon kernel (configs with ``kernel="gluon"``).
* ``gluon_ws.py``: its warp-specialised variant (sm_90 only; ``kernel="gluon_ws"``: a producer
  warp group gathers and dequantizes into a two-slot ring, the consumers run the wgmma dots; for
  a 16-bit latent cache the producer copies the rows straight into the ring with cp.async).
* ``gluon_xo.py``: the crossover variant (sm_90; ``kernel="gluon_xo"``: the two 64-head CTAs of
  a request in a 2-CTA cluster, each converting half of every row block and copying it into the
  other's shared memory), with its cluster PTX in ``gluon_cluster.py``; ``gluon_xs.py`` the same
  producer with a "seesaw" consumer (``kernel="gluon_xs"``, fp8_ds_mla: two consumer warpgroups
  owning alternate row blocks, so one's softmax overlaps the other's wgmmas).
* ``triton_launch.py``: the launcher of both (operand dtypes, byte views, split count, grid,
  constexprs) and AOT specs; ``torch_impl.sparse_mla`` calls it after validation.
* ``pallas.py``: the Pallas kernels with their launcher (``jax_impl`` calls it).

``reference`` and ``configs`` import NumPy at most; the kernel modules import triton / jax.
"""
