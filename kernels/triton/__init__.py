"""Triton kernel sources of the PyTorch stack (``torch_impl``).

* ``sparse_mla.py``: split-K sparse MLA decode over the top-k list and its LSE combine.
* ``_aot.py``: ahead-of-time compilation for a chosen GPU target without a GPU (shared-memory
  checks in ``tests/test_triton_compile.py``).

Modules here import ``triton`` at import time; ``kernels`` itself does not.
"""
