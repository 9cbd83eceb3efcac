"""Few-token weight-streaming GEMM (``out = alpha * x @ w^T``, M <= 64 tokens): the decode
layer's projections (``torch_impl.linear``, ``torch_impl.layer``).

* ``reference.py``: the float64 NumPy reference.
* ``configs.py``: ``LinearConfig``, the search spaces per shared-memory class, weight width and
  token tile, the heuristic and the split-K count (standard library only).
* ``triton.py``: the Triton kernel (swap AB, split-K with an in-kernel deterministic reduction),
  its launcher and AOT specs.

The JAX layer's projections stay XLA's (98 % of the copy bandwidth at B = 1 on the H200), so
there is no Pallas twin.
"""
