"""DeepSeek checkpoint naming and FP8 block-scale weight (de)quantization, NumPy only.

A DeepSeek HF checkpoint is a set of ``*.safetensors`` files. Linear weights are float8 e4m3
``[out, in]`` with a float32 ``weight_scale_inv`` ``[ceil(out/128), ceil(in/128)]``: the real
weight is ``w[i, j] * weight_scale_inv[i // 128, j // 128]`` (DeepSeek-V3.2-Exp
``inference/model.py`` ``weight_dequant``; ``quantization_config.weight_block_size = [128,
128]``, ``scale_fmt = "ue8m0"``: power-of-two scales). Norm weights are bf16; the indexer's
``weights_proj`` is bf16 (model.py: "weights_proj in the checkpoint is stored in bf16").

The safetensors container is read and written here directly (8-byte little-endian header
length, JSON header ``{name: {dtype, shape, data_offsets}}``, then the raw little-endian data,
https://github.com/huggingface/safetensors "Format"): the ``safetensors`` package's NumPy API
does not know float8 / bfloat16, and this keeps ``kernels/`` importable with NumPy and
ml_dtypes alone. Files written by ``safetensors.torch`` are read byte-exactly
(tests/test_checkpoint.py checks this).

Names (HF -> this project's / DeepSeek ``inference/model.py`` names), layer ``i``:

=====================================================  =======================
``model.layers.{i}.self_attn.q_a_proj.weight``          ``wq_a``
``model.layers.{i}.self_attn.q_a_layernorm.weight``     ``q_norm``
``model.layers.{i}.self_attn.q_b_proj.weight``          ``wq_b``
``model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight``  ``wkv_a`` (V3.2)
``model.layers.{i}.self_attn.kv_a_layernorm.weight``    ``kv_norm``
``model.layers.{i}.self_attn.kv_b_proj.weight``         ``wkv_b`` (V3.2)
``model.layers.{i}.self_attn.o_proj.weight``            ``wo`` (V3.2)
``model.layers.{i}.self_attn.indexer.wq_b.weight``      ``indexer.wq_b``
``model.layers.{i}.self_attn.indexer.wk.weight``        ``indexer.wk``
``model.layers.{i}.self_attn.indexer.k_norm.weight``    ``indexer.k_norm.weight``
``model.layers.{i}.self_attn.indexer.k_norm.bias``      ``indexer.k_norm.bias``
``model.layers.{i}.self_attn.indexer.weights_proj.weight``  ``indexer.weights_proj``
=====================================================  =======================

V4-Flash (assumption, no primary source): ``model.layers.{i}.self_attn.{wkv,wo_a,wo_b}.weight``
and ``...self_attn.attn_sink`` for the V4-only weights, the rest as above. The loader also
accepts DeepSeek's converted inference naming (``layers.{i}.attn.<name>.weight`` with ``.scale``
for the block scales), as written by ``inference/convert.py``.
"""
from __future__ import annotations

import glob
import json
import os
import struct

import ml_dtypes
import numpy as np

from kernels import formats
from kernels.layer_config import LayerConfig, weight_shapes

__all__ = [
    "BLOCK", "read_header", "load_tensors", "save_safetensors", "weight_dequant", "weight_quant",
    "hf_names", "load_layer_weights", "save_layer_checkpoint",
]

BLOCK = 128

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_CODES = {v: k for k, v in _DTYPES.items()}

_HF = {"wq_a": "q_a_proj.weight", "q_norm": "q_a_layernorm.weight", "wq_b": "q_b_proj.weight",
       "wkv_a": "kv_a_proj_with_mqa.weight", "kv_norm": "kv_a_layernorm.weight",
       "wkv_b": "kv_b_proj.weight", "wo": "o_proj.weight", "wkv": "wkv.weight",
       "wo_a": "wo_a.weight", "wo_b": "wo_b.weight", "attn_sink": "attn_sink",
       "indexer.wq_b": "indexer.wq_b.weight", "indexer.wk": "indexer.wk.weight",
       "indexer.k_norm.weight": "indexer.k_norm.weight", "indexer.k_norm.bias": "indexer.k_norm.bias",
       "indexer.weights_proj": "indexer.weights_proj.weight"}

# Weights stored as fp8 + weight_scale_inv in DeepSeek checkpoints (2-D linears but the
# indexer's weights_proj).
_FP8 = ("wq_a", "wq_b", "wkv_a", "wkv_b", "wo", "wkv", "wo_a", "wo_b", "indexer.wq_b", "indexer.wk")


# ============================================================================ safetensors I/O

def read_header(path: str) -> tuple[dict, int]:
    """(header ``{name: {"dtype", "shape", "data_offsets"}}`` without ``__metadata__``, byte
    offset of the data section) of one ``.safetensors`` file.

    Raises:
      ValueError: not a safetensors file (header length or JSON invalid).
    """
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"path: {path!r} is not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        size = os.fstat(f.fileno()).st_size
        if n > size - 8:
            raise ValueError(f"path: {path!r} is not a safetensors file (header length {n} > file size)")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"path: {path!r} has an invalid safetensors JSON header: {e}") from None
    header.pop("__metadata__", None)
    return header, 8 + n


def _tensor(path: str, header: dict, base: int, name: str) -> np.ndarray:
    info = header[name]
    if info["dtype"] not in _DTYPES:
        raise ValueError(f"{name}: unsupported safetensors dtype {info['dtype']!r} (supported {sorted(_DTYPES)})")
    dt = _DTYPES[info["dtype"]]
    b, e = info["data_offsets"]
    shape = tuple(info["shape"])
    if e - b != int(np.prod(shape)) * dt.itemsize:
        raise ValueError(f"{name}: {e - b} bytes do not hold shape {shape} of {info['dtype']}")
    raw = np.fromfile(path, dtype=np.uint8, count=e - b, offset=base + b)
    return raw.view(dt).reshape(shape)


def _index(path) -> dict[str, str]:
    """tensor name -> file, for a file, a directory of ``*.safetensors`` or a list of files."""
    if isinstance(path, (list, tuple)):
        files = [str(p) for p in path]
    elif os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(str(path), "*.safetensors")))
        if not files:
            raise ValueError(f"path: no *.safetensors files in directory {path!r}")
    elif os.path.isfile(path):
        files = [str(path)]
    else:
        raise ValueError(f"path: expected a .safetensors file or a directory of them, got {path!r}")
    out = {}
    for f in files:
        for name in read_header(f)[0]:
            out[name] = f
    return out


def load_tensors(path, names=None) -> dict[str, np.ndarray]:
    """Tensors (NumPy, ml_dtypes for bf16 / float8) from a file, directory or list of files;
    all of them, or only ``names`` (KeyError naming the first missing one)."""
    idx = _index(path)
    names = list(idx) if names is None else list(names)
    cache, out = {}, {}
    for n in names:
        if n not in idx:
            raise KeyError(f"tensor {n!r} not found in checkpoint {path!r}")
        f = idx[n]
        if f not in cache:
            cache[f] = read_header(f)
        out[n] = _tensor(f, *cache[f], n)
    return out


def save_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
    """Write ``tensors`` (NumPy / ml_dtypes arrays) as one safetensors file (sorted names,
    header padded with spaces to 8 bytes, as the reference writer does)."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype not in _CODES:
            raise TypeError(f"tensors[{name!r}]: unsupported dtype {a.dtype} (supported "
                            f"{sorted(str(d) for d in _CODES)})")
        b = a.tobytes()
        header[name] = {"dtype": _CODES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for b in blobs:
            f.write(b)


# ============================================================================ FP8 block scales

def weight_dequant(weight: np.ndarray, scale_inv: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """FP8 block-scaled weight -> float32: ``w[i, j] * scale_inv[i // block, j // block]``.

    Args:
      weight: float8_e4m3fn ``[out, in]`` (or uint8 holding e4m3 bytes).
      scale_inv: float32 ``[ceil(out / block), ceil(in / block)]``.
    Raises:
      TypeError / ValueError: wrong dtype, rank or scale shape.
    """
    w = np.asarray(weight)
    if w.dtype == np.uint8:
        w = w.view(formats.E4M3)
    if w.dtype != formats.E4M3:
        raise TypeError(f"weight: expected float8_e4m3fn, got {w.dtype}")
    s = np.asarray(scale_inv, np.float32)
    if w.ndim != 2:
        raise ValueError(f"weight: expected rank 2 [out, in], got shape {w.shape}")
    want = (-(-w.shape[0] // block), -(-w.shape[1] // block))
    if s.shape != want:
        raise ValueError(f"scale_inv: expected shape {want} for weight {w.shape} and block {block}, got {s.shape}")
    full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[: w.shape[0], : w.shape[1]]
    return w.astype(np.float32) * full


def weight_quant(weight: np.ndarray, block: int = BLOCK, scale_fmt: str | None = "ue8m0"):
    """float ``[out, in]`` -> (float8_e4m3fn weight, float32 ``weight_scale_inv``), one scale per
    ``block x block`` tile: ``amax / 448`` (or, ``scale_fmt="ue8m0"``, that rounded up to a power
    of two, DeepSeek's checkpoint setting; all-zero tiles get 1e-4 / 448 as ``act_quant`` does)."""
    w = np.asarray(weight, np.float32)
    if w.ndim != 2:
        raise ValueError(f"weight: expected rank 2 [out, in], got shape {w.shape}")
    o, i = w.shape
    bo, bi = -(-o // block), -(-i // block)
    pad = np.zeros((bo * block, bi * block), np.float32)
    pad[:o, :i] = w
    amax = np.abs(pad.reshape(bo, block, bi, block)).max(axis=(1, 3))
    s = formats.indexer_scale(amax, scale_fmt)
    full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:o, :i]
    return formats.to_e4m3(w / full), s.astype(np.float32)


# ============================================================================ layers

def hf_names(cfg: LayerConfig, layer_idx: int) -> dict[str, str]:
    """This project's weight name -> HF checkpoint tensor name for layer ``layer_idx``."""
    return {k: f"model.layers.{layer_idx}.self_attn.{_HF[k]}" for k in weight_shapes(cfg)}


def _inference_name(name: str, layer_idx: int) -> str:
    tail = name if name.endswith((".weight", ".bias")) or name == "attn_sink" else name + ".weight"
    return f"layers.{layer_idx}.attn.{tail}"


def load_layer_weights(path, layer_idx: int, cfg: LayerConfig) -> dict[str, np.ndarray]:
    """Full (unsharded) float32 weights of one attention layer from a DeepSeek checkpoint.

    Args:
      path: a ``.safetensors`` file, a directory of them, or a list of files.
      layer_idx: the transformer layer.
      cfg: the layer config (decides which weights exist and their shapes).
    Returns:
      ``{name: float32 array}`` with :func:`kernels.layer_reference.weight_shapes` names and
      shapes; FP8 weights dequantized with their 128 x 128 ``weight_scale_inv`` blocks.
    Raises:
      KeyError: a weight missing under both the HF and the converted inference name.
      ValueError: a weight of the wrong shape (names the tensor, expected and received).
    """
    idx = _index(path)
    headers = {}
    out = {}
    for name, shape in weight_shapes(cfg).items():
        cands = [(f"model.layers.{layer_idx}.self_attn.{_HF[name]}", "_scale_inv"),
                 (_inference_name(name, layer_idx), None)]
        for tname, scale_suffix in cands:
            if tname in idx:
                break
        else:
            raise KeyError(f"weight {name!r} of layer {layer_idx}: none of {[c[0] for c in cands]} "
                           f"in checkpoint {path!r}")
        f = idx[tname]
        if f not in headers:
            headers[f] = read_header(f)
        t = _tensor(f, *headers[f], tname)
        sname = (tname + "_scale_inv") if scale_suffix else tname[: -len("weight")] + "scale"
        if t.dtype == formats.E4M3:
            if sname not in idx:
                raise KeyError(f"weight {tname!r} is float8 but its block scale {sname!r} is missing")
            g = idx[sname]
            if g not in headers:
                headers[g] = read_header(g)
            t = weight_dequant(t, _tensor(g, *headers[g], sname))
        t = np.asarray(t).astype(np.float32)
        if t.shape != shape:
            raise ValueError(f"{tname}: expected shape {shape} for {cfg.name}, got {t.shape}")
        out[name] = t
    return out


def save_layer_checkpoint(path: str, weights: dict, layer_idx: int, cfg: LayerConfig, *,
                          fp8: bool = True, scale_fmt: str | None = "ue8m0") -> dict[str, np.ndarray]:
    """Write one layer's weights in DeepSeek's HF format (for tests and tools).

    Linear weights become float8 e4m3 plus ``weight_scale_inv`` (``fp8=True``) or bf16; norms,
    the LayerNorm bias and ``indexer.weights_proj`` bf16; ``attn_sink`` float32.
    Returns the written tensors (name -> array).
    """
    names = hf_names(cfg, layer_idx)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        a = np.asarray(weights[name], np.float32)
        if a.shape != shape:
            raise ValueError(f"weights[{name!r}]: expected shape {shape}, got {a.shape}")
        if name in _FP8 and fp8:
            q, s = weight_quant(a, scale_fmt=scale_fmt)
            out[names[name]] = q
            out[names[name] + "_scale_inv"] = s
        elif name == "attn_sink":
            out[names[name]] = a
        else:
            out[names[name]] = a.astype(ml_dtypes.bfloat16)
    save_safetensors(path, out)
    return out
