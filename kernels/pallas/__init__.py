"""Pallas kernels (Triton lowering) for jax_impl. Every pl.pallas_call goes through
``kernels.pallas._pallas_call.triton_call`` so a later lowering can be swapped in one place."""
