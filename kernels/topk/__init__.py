"""Exact top-k over the indexer logits (SPEC "Operation A", second half), Triton.

* ``reference.py``: the float64 NumPy reference (re-exported by ``kernels.reference``).
* ``triton.py``: the radix top-k kernels (plan, select, scatter) and their launcher.
* ``triton_aot.py``: their AOT compile specs.
* ``window.py``: a NumPy model of their first digit (the two-sided window) and plan state, for
  the tests and ``bench/topk_sim.py``.

The Pallas top-k lives with the Pallas indexer (``kernels/indexer/pallas.py``).
"""
