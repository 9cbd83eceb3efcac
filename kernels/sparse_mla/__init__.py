"""Sparse MLA decode (SPEC "Operation B"): the split-K kernel over the top-k rows and its LSE
combine, in both stacks.

* ``reference.py``: the float64 NumPy reference (re-exported by ``kernels.reference``).
* ``configs.py``: tile / split configs, their search spaces and heuristics, the split count
  (shared by both kernels; imports nothing beyond the standard library).
* ``triton.py``: the Triton kernels (``torch_impl`` launches them).
* ``pallas.py``: the Pallas kernels with their launcher (``jax_impl`` calls it).

``reference`` and ``configs`` import NumPy at most; the kernel modules import triton / jax.
"""
