"""Byte-exact tests of the cache layouts in kernels.formats (SPEC.md "Cache layouts")."""
import ml_dtypes
import numpy as np
import pytest

from kernels import formats


def _latent(rng, shape, spread=True):
    x = rng.standard_normal(shape).astype(np.float32)
    if spread:  # groups with very different magnitudes, incl. an all-zero group
        x *= np.exp2(rng.integers(-12, 8, size=shape[:-1] + (1,))).astype(np.float32)
        x[(0,) * (len(shape) - 1)][:128] = 0.0
    return x


def test_fp8_ds_mla_bytes_by_hand():
    x = np.zeros((1, 1, 576), np.float32)
    x[0, 0, 0] = 448.0 * 4          # amax 1792 -> scale 4 for group 0
    x[0, 0, 1] = -3.0
    x[0, 0, 128] = 1.0              # group 1: amax 1 -> 1/448 -> 2^ceil(log2) = 2^-8
    x[0, 0, 512] = 1.5              # first rope dim
    c = formats.quantize_fp8_ds_mla(x)[0, 0]
    assert c.shape == (656,) and c.dtype == np.uint8
    assert c[0] == 0x7E                                              # 448 in e4m3fn
    assert c[1:2].view(ml_dtypes.float8_e4m3fn).astype(np.float32)[0] == -0.75
    scales = c[512:528].view(np.float32)
    assert scales[0] == 4.0 and scales[1] == 2.0 ** -8
    assert scales[2] == scales[3] == 2.0 ** np.ceil(np.log2(1e-4))   # all-zero groups
    assert c[129:130].view(ml_dtypes.float8_e4m3fn).astype(np.float32)[0] == 0.0
    assert c[128:129].view(ml_dtypes.float8_e4m3fn).astype(np.float32)[0] == 256.0
    assert c[528:530].view(np.uint16)[0] == 0x3FC0                   # bf16 1.5


@pytest.mark.parametrize("shape", [(3, 64, 576), (2, 61, 576), (1, 1, 576)])
def test_fp8_ds_mla_roundtrip_exact(shape):
    rng = np.random.default_rng(0)
    x = _latent(rng, shape)
    c = formats.quantize_fp8_ds_mla(x)
    d = formats.dequantize_fp8_ds_mla(c)
    # byte-exact: re-encoding the dequantized values with the stored scales gives the same bytes
    scale4 = c[..., 512:528].copy().view(np.float32)
    re = formats.to_e4m3(d[..., :512] / np.repeat(scale4, 128, axis=-1)).view(np.uint8)
    np.testing.assert_array_equal(re, c[..., :512])
    # nope dims: within e4m3 rounding (rel 2^-4) of the input, rope dims are bf16 of the input
    np.testing.assert_array_equal(d[..., 512:], x[..., 512:].astype(ml_dtypes.bfloat16).astype(np.float32))
    scale = np.repeat(c[..., 512:528].copy().view(np.float32), 128, axis=-1)
    assert np.all(np.abs(d[..., :512] - x[..., :512]) <= np.maximum(np.abs(x[..., :512]) * 2 ** -4, scale * 2 ** -9))
    # every dequantized value is exact in bf16 (power-of-two scales)
    np.testing.assert_array_equal(d.astype(ml_dtypes.bfloat16).astype(np.float32), d)


@pytest.mark.parametrize("P", [64, 1, 61])
def test_fp8_model1_layout_and_roundtrip(P):
    rng = np.random.default_rng(1)
    x = _latent(rng, (3, P, 512))
    c = formats.quantize_fp8_model1(x)
    page_bytes = formats.model1_page_bytes(P)
    assert c.shape == (3, page_bytes) and page_bytes % 576 == 0
    assert page_bytes >= P * 584 > page_bytes - 576
    assert formats.model1_page_size(page_bytes) == P
    if P == 64:
        assert page_bytes == 37440
    # token t's data row at t*576, its scale row at P*576 + 8t (7 ue8m0 + one zero pad byte)
    t = P - 1
    row = c[1, t * 576:(t + 1) * 576]
    sc = c[1, P * 576 + 8 * t: P * 576 + 8 * t + 8]
    assert sc[7] == 0
    amax = np.abs(x[1, t, :448].reshape(7, 64)).max(-1)
    want = 127 + np.ceil(np.log2(np.maximum(amax / np.float32(448), np.float32(1e-4)))).astype(int)
    np.testing.assert_array_equal(sc[:7], want)
    np.testing.assert_array_equal(row[448:].view(np.uint16), x[1, t, 448:].astype(ml_dtypes.bfloat16).view(np.uint16))
    assert not c[:, P * 584:].any()                                   # page padding is zero
    d = formats.dequantize_fp8_model1(c)
    scale7 = np.exp2(c[:, P * 576:P * 584].reshape(3, P, 8)[..., :7].astype(np.float64) - 127)
    re = formats.to_e4m3(d[..., :448] / np.repeat(scale7, 64, axis=-1)).view(np.uint8)
    np.testing.assert_array_equal(re, c[:, :P * 576].reshape(3, P, 576)[..., :448])


@pytest.mark.parametrize("scale_fmt", ["ue8m0", None])
@pytest.mark.parametrize("P", [64, 16, 3])
def test_fp8_indexer_layout_and_roundtrip(scale_fmt, P):
    rng = np.random.default_rng(2)
    k = _latent(rng, (4, P, 128))
    c = formats.quantize_fp8_indexer(k, scale_fmt)
    assert c.shape == (4, P * 132) and c.dtype == np.uint8
    vals, scales = formats.split_fp8_indexer(c)
    amax = np.maximum(np.abs(k).max(-1), np.float32(1e-4))
    want = amax / np.float32(448)
    if scale_fmt == "ue8m0":
        want = np.exp2(np.ceil(np.log2(want)))
    np.testing.assert_array_equal(scales, want.astype(np.float32))
    # token t's bytes are at t*D_I of its page, scales at P*D_I + 4t
    t = P // 2
    np.testing.assert_array_equal(c[2, t * 128:(t + 1) * 128], vals[2, t].view(np.uint8))
    np.testing.assert_array_equal(c[2, P * 128 + 4 * t: P * 128 + 4 * t + 4].view(np.float32), scales[2, t:t + 1])
    d = formats.dequantize_fp8_indexer(c)
    re = formats.to_e4m3(d / scales[..., None]).view(np.uint8).reshape(4, P * 128)
    np.testing.assert_array_equal(re, c[:, :P * 128])
    assert np.all(np.abs(d - k) <= np.abs(k) * 2 ** -4 + scales[..., None] * 2 ** -9)


def test_paging_helpers():
    bt = np.array([[5, 2, -1], [0, -1, -1]], np.int32)
    pos = np.array([[0, 3, 4, 7, 8, -1, 12], [1, 4, 3, 0, 99, -3, 2]])
    slots = formats.logical_to_slot(pos, bt, 4)
    np.testing.assert_array_equal(slots, [[20, 23, 8, 11, -1, -1, -1], [1, -1, 3, 0, -1, -1, 2]])
    page, off = formats.slot_to_page_offset(slots, 4)
    np.testing.assert_array_equal(page[0], [5, 5, 2, 2, -1, -1, -1])
    np.testing.assert_array_equal(off[0], [0, 3, 0, 3, -1, -1, -1])


def test_format_errors():
    with pytest.raises(ValueError, match="latent"):
        formats.quantize_fp8_ds_mla(np.zeros((1, 2, 512), np.float32))
    with pytest.raises(TypeError, match="cache"):
        formats.dequantize_fp8_ds_mla(np.zeros((1, 2, 656), np.float32))
    with pytest.raises(ValueError, match="fp8_model1"):
        formats.model1_page_size(1000)
    with pytest.raises(ValueError, match="scale_fmt"):
        formats.quantize_fp8_indexer(np.zeros((1, 2, 128), np.float32), "e5m2")
    with pytest.raises(ValueError, match="kv_format"):
        formats.dequantize_kv(np.zeros((1, 2, 8)), "int4")


@pytest.mark.parametrize("stack", ["torch", "jax"])
def test_dequantizer_arguments_named_in_both_stacks(stack):
    """``page_size`` / ``head_dim`` of the framework dequantizers follow kernels.scalars and are
    checked against the page bytes (the same errors in both stacks); valid calls decode the
    NumPy writers' bytes exactly."""
    if stack == "torch":
        import torch
        from torch_impl import formats as fm
        arr = lambda a: torch.from_numpy(a)                               # noqa: E731
        back = lambda t: t.numpy()                                         # noqa: E731
    else:
        import jax.numpy as jnp
        from jax_impl import formats as fm
        arr = jnp.asarray                                                  # noqa: E731
        back = np.asarray                                                  # noqa: E731
    rng = np.random.default_rng(5)
    x = _latent(rng, (2, 4, 512))
    cache = formats.quantize_fp8_model1(x)                                  # P = 4
    want = formats.dequantize_fp8_model1(cache)
    np.testing.assert_array_equal(back(fm.dequantize_fp8_model1(arr(cache))), want)
    np.testing.assert_array_equal(back(fm.dequantize_fp8_model1(arr(cache), np.int64(4))), want)
    for bad, exc, msg in [(5, ValueError, "page_size: 5 slots make an fp8_model1 page of"),
                          (0, ValueError, "page_size: expected an int >= 1, got 0"),
                          (4.0, TypeError, "page_size: expected an int"),
                          (True, TypeError, "page_size: expected an int")]:
        with pytest.raises(exc, match=msg):
            fm.dequantize_fp8_model1(arr(cache), bad)
    k = rng.standard_normal((2, 3, 64)).astype(np.float32)
    kc = formats.quantize_fp8_indexer(k, "ue8m0")                           # [2, 3 * 68]
    np.testing.assert_array_equal(back(fm.dequantize_fp8_indexer(arr(kc), 64)),
                                  formats.dequantize_fp8_indexer(kc, 64))
    for bad, exc, msg in [(0, ValueError, "head_dim: expected an int >= 1, got 0"),
                          (-4, ValueError, "head_dim: expected an int >= 1, got -4"),
                          (64.0, TypeError, "head_dim: expected an int"),
                          (60, ValueError, "k_cache: 204 bytes per page is not a positive multiple")]:
        with pytest.raises(exc, match=msg):
            fm.dequantize_fp8_indexer(arr(kc), bad)


def test_jax_writers_name_a_foreign_tensor():
    """A torch tensor (or a list) given to a jax_impl writer or dequantizer is a TypeError naming
    the argument and what is accepted, not a dtype-interpretation error from inside JAX."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    from jax_impl import formats as jf
    calls = [(jf.quantize_fp8_indexer, torch.zeros(2, 16, 128)),
             (jf.quantize_fp8_ds_mla, torch.zeros(2, 16, 576)),
             (jf.quantize_fp8_model1, [[0.0] * 512]),
             (jf.dequantize_fp8_ds_mla, torch.zeros(2, 16, 656, dtype=torch.uint8)),
             (jf.dequantize_fp8_indexer, torch.zeros(2, 16 * 132, dtype=torch.uint8))]
    for fn, x in calls:
        with pytest.raises(TypeError, match=r"expected a jax\.Array or a NumPy array, got "
                                            + ("a torch.Tensor" if torch.is_tensor(x) else "list")):
            fn(x)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_jax_and_torch_writers_match_numpy_on_non_finite_input(value):
    """A NaN / +-inf latent or key: both framework writers give NumPy's bytes exactly (the JAX
    ue8m0 scale used to turn a NaN amax into -0.0 and saturate the row)."""
    import jax.numpy as jnp
    import torch
    from jax_impl import formats as jf
    from torch_impl import formats as tf
    x = np.ones((1, 2, 576), np.float32)
    x[0, 0, 0] = value
    y = np.ones((1, 2, 512), np.float32)
    y[0, 0, 0] = value
    k = np.ones((1, 2, 128), np.float32)
    k[0, 0, 0] = value
    with np.errstate(invalid="ignore"):
        want = [formats.quantize_fp8_ds_mla(x), formats.quantize_fp8_model1(y),
                formats.quantize_fp8_indexer(k, "ue8m0"), formats.quantize_fp8_indexer(k, None)]
    got_j = [jf.quantize_fp8_ds_mla(jnp.asarray(x)), jf.quantize_fp8_model1(jnp.asarray(y)),
             jf.quantize_fp8_indexer(jnp.asarray(k), "ue8m0"), jf.quantize_fp8_indexer(jnp.asarray(k), None)]
    got_t = [tf.quantize_fp8_ds_mla(torch.from_numpy(x)), tf.quantize_fp8_model1(torch.from_numpy(y)),
             tf.quantize_fp8_indexer(torch.from_numpy(k), "ue8m0"),
             tf.quantize_fp8_indexer(torch.from_numpy(k), None)]
    for w, j, t in zip(want, got_j, got_t):
        np.testing.assert_array_equal(np.asarray(j), w)
        np.testing.assert_array_equal(t.numpy(), w)


# ----------------------------------------------------------------------------- layout descriptors

_FIELD_DTYPES = {"e4m3": formats.E4M3, "ue8m0": formats.E8M0, "bfloat16": formats.BF16,
                 "float32": np.float32}


def _pack(layout, P, values):
    """Pages ``[n, page_bytes]`` placed by the descriptor alone: ``values[name]`` holds each
    field's elements per token ``[n, P, count]``; pad bytes and the page's tail stay 0."""
    n = next(iter(values.values())).shape[0]
    out = np.zeros((n, layout.page_bytes(P)), np.uint8)
    rows = [(layout.data, layout.data_offset)]
    if layout.scale is not None:
        rows.append((layout.scale, lambda off: layout.scale_offset(P, off)))
    for row, start in rows:
        for f in row.fields:
            if f.dtype == "pad":
                continue
            raw = np.ascontiguousarray(values[f.name].astype(_FIELD_DTYPES[f.dtype]))
            raw = raw.view(np.uint8).reshape(n, P, f.nbytes)
            for off in range(P):
                out[:, start(off) + f.offset: start(off) + f.end] = raw[:, off]
    return out


def _scaled(x, tile, scale_fn):
    """(e4m3 values, scales) of ``x [n, P, D]`` with one scale per ``tile`` dims."""
    n, P, D = x.shape
    g = x.reshape(n, P, D // tile, tile)
    s = scale_fn(np.abs(g).max(axis=-1))
    return formats.to_e4m3(g / s[..., None]).reshape(n, P, D), s


@pytest.mark.parametrize("P", [1, 16, 61])
def test_layout_descriptors_match_the_numpy_writers_byte_for_byte(P):
    """``kernels.layouts``' descriptors place each field where ``kernels.formats``' writers put
    it: a packer that reads only the descriptor reproduces the writers' pages exactly."""
    from kernels import layouts

    rng = np.random.default_rng(P)
    ds, m1, ix = layouts.FP8_DS_MLA, layouts.FP8_MODEL1, layouts.FP8_INDEXER

    x = _latent(rng, (2, P, 576))
    q, s = _scaled(x[..., :512], ds.tile, formats.pow2_scale)
    want = formats.quantize_fp8_ds_mla(x).reshape(2, P * 656)
    np.testing.assert_array_equal(_pack(ds, P, {"nope": q, "scale": s, "rope": x[..., 512:]}), want)

    x = _latent(rng, (2, P, 512))
    q, s = _scaled(x[..., :448], m1.tile, formats.pow2_scale)
    want = formats.quantize_fp8_model1(x)
    np.testing.assert_array_equal(_pack(m1, P, {"nope": q, "scale": s, "rope": x[..., 448:]}), want)

    k = _latent(rng, (2, P, 128))
    q, s = _scaled(k, ix.tile, lambda a: formats.indexer_scale(a, "ue8m0"))
    want = formats.quantize_fp8_indexer(k)
    np.testing.assert_array_equal(_pack(ix, P, {"k": q, "scale": s}), want)

    assert (ds.page_bytes(P), m1.page_bytes(P), ix.page_bytes(P)) == (
        P * 656, formats.model1_page_bytes(P), P * 132)


def test_kernel_byte_constants_come_from_the_descriptors():
    """The byte offsets the Triton and Pallas kernels compile in are the descriptors' (the
    Triton sparse-MLA kernel addresses the bf16 rope through int16 and the scales through
    float32 views: offsets in 2- and 4-byte words)."""
    from kernels import layouts

    ds, m1 = layouts.FP8_DS_MLA, layouts.FP8_MODEL1
    tk = pytest.importorskip("kernels.sparse_mla.triton")
    got = {k: getattr(tk, k).value for k in ("DS_MLA_BYTES", "DS_MLA_ROW_F32", "DS_MLA_SCALE_F32",
                                             "DS_MLA_ROW_I16", "DS_MLA_ROPE_I16", "MODEL1_DATA_BYTES",
                                             "MODEL1_SCALE_BYTES", "MODEL1_ROPE_I16")}
    assert got == {"DS_MLA_BYTES": 656, "DS_MLA_ROW_F32": 164, "DS_MLA_SCALE_F32": 128,
                   "DS_MLA_ROW_I16": 328, "DS_MLA_ROPE_I16": 264, "MODEL1_DATA_BYTES": 576,
                   "MODEL1_SCALE_BYTES": 8, "MODEL1_ROPE_I16": 224}
    assert got["DS_MLA_ROPE_I16"] == ds.field("rope").index(2)
    assert got["MODEL1_ROPE_I16"] == m1.field("rope").index(2)
    pytest.importorskip("jax")
    from kernels.sparse_mla import pallas as pk
    assert (pk.DS_MLA_BYTES, pk.DS_MLA_NOPE, pk.DS_MLA_TILE) == (656, 512, ds.tile)
    assert (pk.MODEL1_DATA_BYTES, pk.MODEL1_NOPE, pk.MODEL1_TILE, pk.MODEL1_SCALE_BYTES) == (
        576, 448, m1.tile, 8)
    assert pk.DS_MLA_ROPE_OFFSET == ds.field("rope").offset


def test_check_shared_page_pool():
    """dsa_decode_step's cache pair check, from shapes: equal pools pass; another page count or
    page size names k_cache; shapes malformed for their format are left to the ops."""
    from kernels.formats import check_shared_page_pool, model1_page_bytes
    ok = [((8, 64, 656), "fp8_ds_mla", (8, 64 * 132), "fp8_indexer", 128),
          ((8, model1_page_bytes(64)), "fp8_model1", (8, 64 * 132), "fp8_indexer", 128),
          ((8, 16, 576), "latent", (8, 16, 128), "dense", 128)]
    for args in ok:
        check_shared_page_pool(*args)
    with pytest.raises(ValueError, match="num_pages 7"):
        check_shared_page_pool((8, 64, 656), "fp8_ds_mla", (7, 64 * 132), "fp8_indexer", 128)
    with pytest.raises(ValueError, match="page size 32"):
        check_shared_page_pool((8, model1_page_bytes(64)), "fp8_model1", (8, 32 * 132),
                               "fp8_indexer", 128)
    check_shared_page_pool((8, 100), "fp8_model1", (8, 64 * 132), "fp8_indexer", 128)  # op's job
    check_shared_page_pool((8,), "latent", (8, 16, 128), "dense", 128)
