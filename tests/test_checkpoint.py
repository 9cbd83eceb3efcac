"""kernels.checkpoint: DeepSeek checkpoint naming, the safetensors container, FP8 128 x 128
block-scale weight (de)quantization, and layers built from a checkpoint written in that format
(small random weights in tmp_path; no network)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import _layer_checks as checks
from kernels import checkpoint, compare, formats, layer_reference as lref
from torch_impl._common import as_tensor

V32, V4 = lref.DSV32_LAYER.scaled_down(), lref.DSV4_FLASH_LAYER.scaled_down()


def test_weight_quant_roundtrip_matches_block_definition():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((300, 200)).astype(np.float32) * np.linspace(0.01, 3, 200, dtype=np.float32)
    q, s = checkpoint.weight_quant(w, scale_fmt="ue8m0")
    assert q.dtype == formats.E4M3 and s.shape == (3, 2) and s.dtype == np.float32
    assert np.all(np.exp2(np.round(np.log2(s))) == s), "ue8m0 scales must be powers of two"
    deq = checkpoint.weight_dequant(q, s)
    # element (i, j) uses block (i // 128, j // 128): check by a plain loop over blocks
    for bi in range(3):
        for bj in range(2):
            blk = (slice(128 * bi, 128 * bi + 128), slice(128 * bj, 128 * bj + 128))
            np.testing.assert_array_equal(deq[blk], q[blk].astype(np.float32) * s[bi, bj])
            amax = np.abs(w[blk]).max()
            assert s[bi, bj] >= amax / 448 and s[bi, bj] < 2 * max(amax, 1e-4) / 448
    # e4m3 keeps 3 mantissa bits: |deq - w| <= 2^-4 |w| (normals) or half the subnormal step
    err = np.abs(deq - w)
    full = np.repeat(np.repeat(s, 128, 0), 128, 1)[:300, :200]
    assert np.all(err <= np.maximum(2.0 ** -4 * np.abs(w), 2.0 ** -10 * full))
    q2, s2 = checkpoint.weight_quant(w, scale_fmt=None)
    np.testing.assert_allclose(s2, np.maximum(np.abs(np.pad(w, ((0, 84), (0, 56)))).reshape(3, 128, 2, 128).max(axis=(1, 3)), 1e-4) / 448, rtol=1e-7)


def test_bad_scale_shape_is_named():
    q, s = checkpoint.weight_quant(np.ones((256, 128), np.float32))
    with pytest.raises(ValueError, match="scale_inv: expected shape \\(2, 1\\)"):
        checkpoint.weight_dequant(q, s[:1])
    with pytest.raises(TypeError, match="weight: expected float8_e4m3fn"):
        checkpoint.weight_dequant(q.astype(np.float32), s)


def test_reads_files_written_by_safetensors_torch(tmp_path):
    """The NumPy container reader agrees byte for byte with the reference writer (fp8, bf16, f32)."""
    from safetensors.torch import save_file
    t = {"a.weight": torch.randn(256, 128).to(torch.float8_e4m3fn), "a.weight_scale_inv": torch.rand(2, 1),
         "n.weight": torch.randn(64).bfloat16()}
    save_file(t, str(tmp_path / "m.safetensors"))
    got = checkpoint.load_tensors(tmp_path)
    assert got["a.weight"].dtype == formats.E4M3 and got["n.weight"].dtype == ml_dtypes.bfloat16
    assert np.array_equal(got["a.weight"].view(np.uint8), t["a.weight"].view(torch.uint8).numpy())
    assert np.array_equal(got["n.weight"].view(np.uint16), t["n.weight"].view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(got["a.weight_scale_inv"], t["a.weight_scale_inv"].numpy())
    # and the other way round: our writer, the reference reader
    from safetensors.torch import load_file
    checkpoint.save_safetensors(str(tmp_path / "o.safetensors"), {k: v for k, v in got.items()})
    back = load_file(str(tmp_path / "o.safetensors"))
    for k in t:
        assert torch.equal(back[k].view(torch.uint8), t[k].view(torch.uint8))


@pytest.mark.parametrize("cfg", [V32, V4], ids=lambda c: c.name)
def test_load_layer_weights_dequantizes_hf_checkpoint(tmp_path, cfg):
    w = lref.init_weights(cfg, 7)
    written = checkpoint.save_layer_checkpoint(str(tmp_path / "model-00001.safetensors"), w, 3, cfg)
    names = checkpoint.hf_names(cfg, 3)
    if cfg.absorbed:
        assert names["wkv_b"] == "model.layers.3.self_attn.kv_b_proj.weight"
        assert names["indexer.weights_proj"] == "model.layers.3.self_attn.indexer.weights_proj.weight"
    assert written[names["wq_b"]].dtype == formats.E4M3
    assert names["wq_b"] + "_scale_inv" in written
    assert written[names["indexer.weights_proj"]].dtype == ml_dtypes.bfloat16
    got = checkpoint.load_layer_weights(tmp_path, 3, cfg)
    assert set(got) == set(lref.weight_shapes(cfg))
    for k, shape in lref.weight_shapes(cfg).items():
        assert got[k].shape == shape and got[k].dtype == np.float32
        t = written[names[k]]
        want = (checkpoint.weight_dequant(t, written[names[k] + "_scale_inv"]) if t.dtype == formats.E4M3
                else t.astype(np.float32))
        np.testing.assert_array_equal(got[k], want)
        # fp8 / bf16 storage of the random weights: within one rounding step of the originals
        np.testing.assert_allclose(got[k], w[k], rtol=2.0 ** -4, atol=2.0 ** -10 * np.abs(w[k]).max())
    with pytest.raises(KeyError, match="layer 4"):
        checkpoint.load_layer_weights(tmp_path, 4, cfg)


def test_torch_layer_from_checkpoint_matches_reference(tmp_path):
    """A V3.2 layer built from an FP8 checkpoint (torch path) matches the float64 reference run
    with the dequantized weights."""
    from torch_impl.layer import DSADecodeLayer
    case = lref.make_layer_case(V32, seed=11, B=1, N=1, lens=(70,), kv_format="fp8_ds_mla")
    checkpoint.save_layer_checkpoint(str(tmp_path / "m.safetensors"), case.weights, 0, V32)
    case.weights = checkpoint.load_layer_weights(tmp_path, 0, V32)
    layer = DSADecodeLayer.from_checkpoint(tmp_path, 0, V32, kv_format=case.kv_format, path="torch")
    args = [as_tensor(a) for a in (case.x, case.kv_cache, case.k_cache, case.block_table, case.context_lens)]
    out, kv, kc = layer(*args)
    checks.check_step(case, case.reference(), *(compare.to_numpy(t) for t in (out, kv, kc)))
