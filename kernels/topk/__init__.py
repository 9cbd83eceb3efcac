"""Exact top-k over the indexer logits (SPEC "Operation A", second half), Triton.

* ``reference.py``: the float64 NumPy reference (re-exported by ``kernels.reference``).
* ``triton.py``: the radix top-k kernels (plan, select, scatter) and their launcher.
* ``triton_aot.py``: their AOT compile specs.

The Pallas top-k lives with the Pallas indexer (``kernels/indexer/pallas.py``).
"""
