"""Lightning indexer logits (SPEC "Operation A", first half) in both stacks.

* ``reference.py``: the float64 NumPy reference of the logits and of indexer + top-k
  (re-exported by ``kernels.reference``).
* ``triton.py``: the logits kernel with its fused top-digit histogram, and its launcher.
* ``gluon.py``: the sm_90 Gluon logits kernel (cp.async ring, wgmma with tokens as M, the same
  fused histogram; config ``kernel="gluon"``), launched by ``triton.py``'s launcher.
* ``gluon_ws.py``: its warp-specialised variant (a TMA producer warp, 1-3 consumer warpgroups;
  config ``kernel="gluon_ws"``, not the heuristic's choice until measured), same launcher.
* ``triton_aot.py``: the logits kernels' AOT compile specs.
* ``pallas.py``: the Pallas logits kernel and the Pallas exact top-k, with their launchers.

The Triton top-k is ``kernels.topk``. The kernel modules import triton / jax.
"""
