"""Fused new-token cache writes (the decode layer's cache update), in both stacks.

* ``triton.py``: the Triton kernel, its constexprs and AOT specs (launched by ``torch_impl.layer``).
* ``pallas.py``: the Pallas kernel and its launcher (``jax_impl.layer``).
"""
