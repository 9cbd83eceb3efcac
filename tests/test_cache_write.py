"""The fused new-token cache writes (``kernels/cache_write/triton.py`` through
``torch_impl.layer.write_new_tokens``, and the JAX writer ``jax_impl.layer.write_new_tokens``)
against the NumPy writers of ``kernels/formats.py`` (via ``kernels.layer_reference.write_token_rows``),
bit for bit, in every cache layout; unmapped tokens (page entry -1, >= num_pages, one that wraps
int32 when multiplied by P, positions outside the table) change no byte.

On a CPU machine the Triton kernel runs in the interpreter (tests/conftest.py) and the Pallas path
in interpret mode; the same bodies run on a GPU.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from kernels import formats, layer_reference as lref
from torch_impl._common import as_tensor
from torch_impl.layer import write_new_tokens

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

P, NUM_PAGES, D_I = 16, 24, 128
D_QK = {"latent": 576, "fp8_ds_mla": 576, "fp8_model1": 512}


def _rows(rng, T, D):
    """Rows that exercise the encoders: random scales per row and per 64 dims, exact zeros, e4m3
    subnormals, amax at 448 * 2^k exactly and one float32 ulp above it (the power-of-two scale
    rule's edge), ties of the e4m3 and bf16 roundings."""
    x = rng.standard_normal((T, D)).astype(np.float32) * np.exp2(rng.integers(-12, 12, (T, 1))).astype(np.float32)
    x *= np.exp2(rng.integers(-3, 3, (T, D // 64, 1))).repeat(64, 1).reshape(T, D).astype(np.float32)
    x[0] = 0.0                                                      # amax 0 -> scale floor 1e-4
    x[1, :64] = np.float32(448 * 2.0 ** -3)                         # amax exactly 448 * 2^k
    x[1, 64:128] = np.nextafter(np.float32(448 * 2.0 ** 2), np.float32(np.inf))   # one ulp above
    x[1, 128:192] = np.float32(448) * np.float32(1 + 3 * 2.0 ** -23)
    x[2] = np.float32(2.0 ** -10) * rng.integers(-16, 16, D)        # e4m3 subnormals and ties
    x[2, 0] = 448.0
    x[3, :D // 2] = (np.arange(D // 2) % 16 + 8.5).astype(np.float32)  # e4m3 ties (x.5 at 8..24)
    x[3, D // 2:] = np.float32(1.0) + np.float32(2.0 ** -8) * (np.arange(D - D // 2) % 4)  # bf16 ties
    return x


def _table(case_name, B, N, max_pages):
    """(block_table, context_lens, slots [B*N] with -1 for unmapped tokens)."""
    rng = np.random.default_rng(7)
    bt = rng.permutation(NUM_PAGES)[:B * max_pages].reshape(B, max_pages).astype(np.int32)  # no shared page
    cl = np.array([max_pages * P - 3 - 5 * b for b in range(B)], np.int32)
    if case_name == "unmapped":
        cl[0] = P + 1                                               # token 0 of request 0 at page 0
        bt[0, 0] = -1                                               # its page entry: -1
        bt[1, (cl[1] - N) // P] = 2 ** 28 + 1                       # x P wraps int32 to page 1
        bt[2, (cl[2] - N) // P] = NUM_PAGES                         # one past the pool
        cl[3] = -2 ** 31                                            # position far below 0
        cl[4] = max_pages * P + N                                   # past the table
    pos = cl.astype(np.int64)[:, None] - N + np.arange(N)[None]
    slots = formats.logical_to_slot(pos, bt, P)
    page = np.where(slots >= 0, slots // P, -1)
    slots = np.where(page < NUM_PAGES, slots, -1)
    return bt, cl, slots.reshape(-1)


def _caches(rng, fmt, latent_dtype):
    if fmt == "latent":
        kv = rng.standard_normal((NUM_PAGES, P, D_QK[fmt])).astype(latent_dtype)
    else:
        kv = rng.integers(0, 256, lref.kv_cache_shape(lref.DSV32_LAYER.scaled_down() if fmt == "fp8_ds_mla"
                                                      else lref.DSV4_FLASH_LAYER.scaled_down(), fmt, NUM_PAGES),
                          dtype=np.uint8)
    kc = rng.integers(0, 256, (NUM_PAGES, P * (D_I + 4)), dtype=np.uint8)
    return kv, kc


def _write_case(table, fmt, latent_dtype, N, B=6, max_pages=4):
    """(block_table, context_lens, slots, latent rows, indexer rows, kv cache, k cache) of one
    write test: B requests of N new tokens each, seeded so both stacks see the same inputs."""
    rng = np.random.default_rng(0)
    bt, cl, slots = _table(table, B, N, max_pages)
    latent, ik = _rows(rng, B * N, D_QK[fmt]), _rows(rng, B * N, D_I)
    kv, kc = _caches(rng, fmt, latent_dtype)
    return bt, cl, slots, latent, ik, kv, kc


PARAMS = [("latent", np.float32), ("latent", np.float16), ("latent", ml_dtypes.bfloat16),
          ("fp8_ds_mla", None), ("fp8_model1", None)]


def _expected(fmt, kv, kc, latent, ik, slots, scale_fmt):
    return lref.write_token_rows(kv, kc, latent, ik, slots, fmt, P, D_I, scale_fmt)


@pytest.mark.parametrize("table", ["mapped", "unmapped"])
@pytest.mark.parametrize("fmt,latent_dtype", PARAMS, ids=[f"{f}-{np.dtype(d).name if d else 'u8'}" for f, d in PARAMS])
@pytest.mark.parametrize("path", ["triton", "torch"])
def test_torch_cache_write_matches_numpy_writers(path, fmt, latent_dtype, table):
    """Both caches after ``write_new_tokens`` equal the NumPy writers' bytes exactly (B = 6,
    N = 2, 4 table columns); with unmapped tokens their bytes stay as they were."""
    N = 2
    bt, cl, slots, latent, ik, kv, kc = _write_case(table, fmt, latent_dtype, N)
    for scale_fmt in ("ue8m0", None):
        want_kv, want_kc = _expected(fmt, kv, kc, latent, ik, slots, scale_fmt)
        tkv, tkc = as_tensor(kv, DEVICE), as_tensor(kc, DEVICE)
        tbt, tcl = as_tensor(bt, DEVICE), as_tensor(cl, DEVICE)
        write_new_tokens(as_tensor(latent, DEVICE), tkv, tbt, tcl, N, fmt, page_size=P, path=path)
        write_new_tokens(as_tensor(ik, DEVICE), tkc, tbt, tcl, N, "fp8_indexer", page_size=P,
                         scale_fmt=scale_fmt, path=path)
        got_kv = tkv.cpu().view(torch.uint16).numpy().view(ml_dtypes.bfloat16) if tkv.dtype == torch.bfloat16 \
            else tkv.cpu().numpy()
        assert np.array_equal(got_kv.view(np.uint8), want_kv.view(np.uint8)), \
            f"kv_cache bytes differ at {np.argwhere(got_kv.view(np.uint8) != want_kv.view(np.uint8))[:4].tolist()}"
        got_kc = tkc.cpu().numpy()
        assert np.array_equal(got_kc, want_kc), \
            f"k_cache ({scale_fmt}) bytes differ at {np.argwhere(got_kc != want_kc)[:4].tolist()}"
        if table == "mapped":
            assert (slots >= 0).all() and not np.array_equal(want_kc, kc)


def test_torch_cache_write_bad_input_is_named():
    kv = torch.zeros(NUM_PAGES, P, 576)
    bt, cl = torch.zeros(2, 4, dtype=torch.int32), torch.full((2,), 5, dtype=torch.int32)
    src = torch.zeros(2, 576)
    with pytest.raises(ValueError, match=r"^fmt: expected one of"):
        write_new_tokens(src, kv, bt, cl, 1, "fp8", page_size=P)
    with pytest.raises(ValueError, match=r"^src: expected \[B \* N = 4, D\]"):
        write_new_tokens(src, kv, bt, cl, 2, "latent", page_size=P)
    with pytest.raises(TypeError, match=r"^context_lens: expected dtype"):
        write_new_tokens(src, kv, bt, cl.long(), 1, "latent", page_size=P)
    with pytest.raises(ValueError, match=r"^path: expected one of"):
        write_new_tokens(src, kv, bt, cl, 1, "latent", page_size=P, path="pallas")
    with pytest.raises(ValueError, match=r"^cache: expected uint8 \[num_pages, 16, 656\] \('fp8_ds_mla'"):
        write_new_tokens(src, kv, bt, cl, 1, "fp8_ds_mla", page_size=P)      # a float cache: no
    with pytest.raises(ValueError, match=r"^cache: expected float \[num_pages, 8, 576\]"):
        write_new_tokens(src, kv, bt, cl, 1, "latent", page_size=8)           # another P: no
    with pytest.raises(ValueError, match=r"^cache: expected uint8 \[num_pages, 2112\]"):
        write_new_tokens(src[:, :128].contiguous(), torch.zeros(NUM_PAGES, 2000, dtype=torch.uint8), bt, cl, 1,
                         "fp8_indexer", page_size=P)
    with pytest.raises(ValueError, match=r"^cache: expected a byte offset into its storage that is a multiple of 4"):
        flat = torch.zeros(NUM_PAGES * P * 656 + 2, dtype=torch.uint8)
        write_new_tokens(src, flat[2:].view(NUM_PAGES, P, 656), bt, cl, 1, "fp8_ds_mla", page_size=P)


def test_jax_cache_write_bad_input_is_named():
    import jax.numpy as jnp

    from jax_impl.layer import write_new_tokens as jwrite
    kv = jnp.zeros((NUM_PAGES, P, 576))
    bt, cl = jnp.zeros((2, 4), jnp.int32), jnp.full((2,), 5, jnp.int32)
    src = jnp.zeros((2, 576))
    with pytest.raises(ValueError, match=r"^fmt: expected one of"):
        jwrite(src, kv, bt, cl, 1, "fp8", page_size=P)
    with pytest.raises(ValueError, match=r"^src: expected \[B \* N = 4, D\]"):
        jwrite(src, kv, bt, cl, 2, "latent", page_size=P)
    with pytest.raises(ValueError, match=r"^path: expected one of"):
        jwrite(src, kv, bt, cl, 1, "latent", page_size=P, path="triton")
    with pytest.raises(ValueError, match=r"^cache: expected uint8 \[num_pages, 16, 656\]"):
        jwrite(src, kv, bt, cl, 1, "fp8_ds_mla", page_size=P)



# ---------------------------------------------------------------------------------------- JAX

# The xla writer divides with XLA's float32 division, which XLA:GPU does not round correctly (seen
# on the H200, jax 0.11.2; tests/test_jax_sparse_mla.py's writer tests carry the same mark): a
# scale can land one ulp off NumPy's. The Pallas kernel divides with div.rn.f32 and stays exact.
_XLA_GPU_DIV = pytest.mark.xfail(CUDA, strict=False, reason="XLA:GPU float32 division is not "
                                 "correctly rounded: scale bytes one ulp off NumPy's on the GPU")


@pytest.mark.parametrize("path,table", [("pallas", "unmapped"),
                                        pytest.param("xla", "mapped", marks=_XLA_GPU_DIV),
                                        pytest.param("xla", "unmapped", marks=_XLA_GPU_DIV)])
@pytest.mark.parametrize("fmt,latent_dtype", PARAMS, ids=[f"{f}-{np.dtype(d).name if d else 'u8'}" for f, d in PARAMS])
def test_jax_cache_write_matches_numpy_writers(path, table, fmt, latent_dtype):
    """``jax_impl.layer.write_new_tokens`` under ``jax.jit`` with the cache donated: the same bytes
    as the NumPy writers (Pallas kernel in interpret mode on the CPU, or the one XLA scatter). The
    Pallas kernel runs the "unmapped" table only (its requests also hold mapped tokens, written
    next to the dropped ones): interpret mode costs ~15 s per case on two CPU cores."""
    import functools

    import jax
    import jax.numpy as jnp

    from jax_impl.layer import write_new_tokens as jwrite

    N = 2
    bt, cl, slots, latent, ik, kv, kc = _write_case(table, fmt, latent_dtype, N)
    for scale_fmt in ("ue8m0", None):
        want_kv, want_kc = _expected(fmt, kv, kc, latent, ik, slots, scale_fmt)
        f = jax.jit(functools.partial(jwrite, N=N, page_size=P, path=path), static_argnames=("fmt", "scale_fmt"),
                    donate_argnums=(1,))
        got_kv = np.asarray(f(jnp.asarray(latent), jnp.asarray(kv), jnp.asarray(bt), jnp.asarray(cl), fmt=fmt))
        got_kc = np.asarray(f(jnp.asarray(ik), jnp.asarray(kc), jnp.asarray(bt), jnp.asarray(cl),
                              fmt="fp8_indexer", scale_fmt=scale_fmt))
        assert np.array_equal(got_kv.view(np.uint8), want_kv.view(np.uint8)), \
            f"kv_cache bytes differ at {np.argwhere(got_kv.view(np.uint8) != want_kv.view(np.uint8))[:4].tolist()}"
        assert np.array_equal(got_kc, want_kc), \
            f"k_cache ({scale_fmt}) bytes differ at {np.argwhere(got_kc != want_kc)[:4].tolist()}"



@pytest.mark.parametrize("cc", [pytest.param(90, marks=pytest.mark.sm90), 120])
@pytest.mark.parametrize("fmt,dim", [("latent", 576), ("fp8_ds_mla", 576), ("fp8_model1", 512),
                                     ("fp8_indexer", 128)])
def test_pallas_cache_write_compiles_for_gpu(fmt, dim, cc):
    """The Pallas kernel lowers for CUDA (no GPU needed: the Triton IR is captured from the
    lowering) and that IR compiles with Triton for sm_<cc> at the real dimensions (P = 64, bf16
    rows, the latent cache bf16): the GPU-only code (``div.rn.f32`` inline asm, byte-index
    stores) is checked here, since interpret mode runs the jax.numpy twin."""
    import jax.numpy as jnp
    pytest.importorskip("triton")

    from _pallas_aot import compile_pallas_for_gpu
    from kernels.cache_write import pallas as pcw

    Pg, pages, B, N = 64, 4, 2, 1
    width = {"latent": Pg * dim, "fp8_ds_mla": Pg * 656, "fp8_model1": formats.model1_page_bytes(Pg),
             "fp8_indexer": Pg * (dim + 4)}[fmt]
    cache = jnp.zeros((pages, width), jnp.bfloat16 if fmt == "latent" else jnp.uint8)

    def f(src, cache, bt, cl):
        return pcw.launch_cache_write(src, cache, bt, cl, N, fmt, page_size=Pg, interpret=False)

    k = compile_pallas_for_gpu(f, (jnp.zeros((B * N, dim), jnp.bfloat16), cache,
                                   jnp.zeros((B, 3), jnp.int32), jnp.ones((B,), jnp.int32)), cc,
                               num_warps=4, num_stages=1)
    assert 0 <= int(k.metadata.shared) <= 101376
    if fmt != "latent":
        assert "div.rn.f32" in k.asm["ptx"]
