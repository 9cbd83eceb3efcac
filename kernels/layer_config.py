"""Configuration of one DSA attention decode layer and the helpers a layer needs to build
itself: :class:`LayerConfig`, the two presets' layers (:data:`LAYER_CONFIGS`), weight shapes,
initialisation, tensor-parallel sharding, rope frequencies, the Hadamard matrix and the latent
cache's shape.

The production layers (``torch_impl.layer``, ``jax_impl.layer``) and the float64 reference
(``kernels.layer_reference``, which re-exports these names) share them, so the three agree on
names and layouts. No test tooling here (``kernels.cases`` and the reference math stay in
``kernels.layer_reference``); NumPy only. Sources: ``kernels.layer_reference``'s docstring.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from kernels import formats
from kernels.presets import DSV32, DSV4_FLASH, ModelPreset
from kernels.scalars import check_int

__all__ = [
    "LayerConfig", "DSV32_LAYER", "DSV4_FLASH_LAYER", "LAYER_CONFIGS", "weight_shapes",
    "init_weights", "float32_weights", "shard_weights", "rope_freqs", "hadamard_matrix",
    "kv_cache_shape", "Projection", "projection_shapes",
]


@dataclass(frozen=True)
class LayerConfig:
    """Dimensions of one DSA attention layer beyond :class:`kernels.presets.ModelPreset`.

    Attributes:
      preset: the op-level preset (heads, D_qk, d_v, top-k, window, indexer dims, page size,
        kv_format, attention sink).
      hidden: model width ``dim`` (7168 V3.2, 4096 V4-Flash).
      q_lora_rank: query low-rank width (1536 V3.2, 1024 V4-Flash).
      num_heads: query heads of the whole model (= preset.num_heads unless scaled down).
      absorbed: True for V3.2's MLA (wkv_b absorbed into q and applied to the output); False for
        V4-Flash (q lives in the latent space directly, grouped output projection).
      qk_nope_head_dim / v_head_dim: per-head nope / value width of wkv_b (V3.2: 128 / 128).
      o_groups / o_lora_rank: V4 grouped output projection (8 / 1024), 0 when absent.
      index_heads / index_head_dim: H_I, D_I (64 / 128).
      topk / window: indexer top-k and sliding-window width (V4: 512 / 128).
      rope_theta, rope_factor, original_seq_len, beta_fast, beta_slow: YaRN rope parameters.
      sm_scale: softmax scale of ``q . k`` (natural-log domain).
      q_head_norm: V4 per-head RMS normalisation of q (no learned weight: assumption).
      inverse_rope_out: V4 inverse rope on the output's last ``rope`` dims.
      eps: RMSNorm / LayerNorm epsilon (1e-6 in both models).
      scale_fmt: act_quant scale format of the indexer (``"ue8m0"``).
    """

    name: str
    preset: ModelPreset
    hidden: int
    q_lora_rank: int
    num_heads: int
    absorbed: bool
    qk_nope_head_dim: int
    v_head_dim: int
    o_groups: int
    o_lora_rank: int
    index_heads: int
    index_head_dim: int
    topk: int
    window: int
    rope_theta: float
    rope_factor: float
    original_seq_len: int
    beta_fast: int
    beta_slow: int
    sm_scale: float
    q_head_norm: bool
    inverse_rope_out: bool
    attn_sink: bool
    eps: float = 1e-6
    scale_fmt: str = "ue8m0"
    page_size: int = 64

    @property
    def d_qk(self) -> int:
        """Latent width seen by q: 576 (V3.2) or 512 (V4-Flash)."""
        return self.preset.d_qk

    @property
    def d_rope(self) -> int:
        return self.preset.d_rope

    @property
    def kv_lora_rank(self) -> int:
        """Latent dims before the rope dims (V3.2: 512 = d_v; V4: 448)."""
        return self.preset.d_nope

    @property
    def d_v(self) -> int:
        return self.preset.d_v

    @property
    def kv_format(self) -> str:
        return self.preset.kv_format

    def heads_per_rank(self, tp: int) -> int:
        """Query heads per rank at tensor-parallel size ``tp``.

        Raises:
          TypeError: ``tp`` not an int (kernels.scalars rule). ValueError: ``tp`` < 1 or not a
            divisor of ``num_heads`` (or V4's ``o_groups``).
        """
        tp = check_int("tp_size", tp, minimum=1)
        if self.num_heads % tp:
            raise ValueError(f"tp_size: expected a positive divisor of {self.name}.num_heads="
                             f"{self.num_heads}, got {tp!r}")
        if not self.absorbed and self.o_groups % tp:
            raise ValueError(f"tp_size: expected a divisor of {self.name}.o_groups={self.o_groups} "
                             f"(grouped wo_a is split by group), got {tp}")
        return self.num_heads // tp

    def scaled_down(self, *, num_heads: int = 4, hidden: int = 256, q_lora_rank: int = 64,
                    index_heads: int = 16, topk: int | None = None, window: int | None = None,
                    page_size: int = 16) -> "LayerConfig":
        """A small variant for CPU tests: fewer heads and a narrower model, the same D_qk
        (576 / 512), d_v 512, D_I 128, rope layout, scales and cache formats.

        V3.2 nope / v head dims become 32; V4 groups become 2 with o_lora 32. ``topk`` defaults
        to 64 (V3.2) or 32 (V4) and ``window`` to 16 (V4 only).
        """
        if self.absorbed:
            return replace(self, name=self.name + "_small", num_heads=num_heads, hidden=hidden,
                           q_lora_rank=q_lora_rank, qk_nope_head_dim=32, v_head_dim=32,
                           index_heads=index_heads, topk=topk or 64, window=0,
                           page_size=page_size)
        return replace(self, name=self.name + "_small", num_heads=num_heads, hidden=hidden,
                       q_lora_rank=q_lora_rank, o_groups=2, o_lora_rank=32,
                       index_heads=index_heads, topk=topk or 32,
                       window=16 if window is None else window, page_size=page_size)


DSV32_LAYER = LayerConfig(
    name="DSV32", preset=DSV32, hidden=7168, q_lora_rank=1536, num_heads=DSV32.num_heads,
    absorbed=True, qk_nope_head_dim=128, v_head_dim=128, o_groups=0, o_lora_rank=0,
    index_heads=DSV32.index_heads, index_head_dim=DSV32.index_head_dim, topk=DSV32.topk, window=0,
    rope_theta=10000.0, rope_factor=40.0, original_seq_len=4096, beta_fast=32, beta_slow=1,
    sm_scale=DSV32.sm_scale, q_head_norm=False, inverse_rope_out=False, attn_sink=False,
    page_size=DSV32.page_size)
"""DeepSeek-V3.2-Exp (config_671B_v3.2.json: dim 7168, q_lora_rank 1536, kv_lora_rank 512,
qk_nope 128, qk_rope 64, v_head 128, 128 heads, rope_theta 10000, YaRN factor 40 over 4096,
beta 32/1, mscale 1 -> sm_scale 192^-0.5 * mscale^2; indexer 64 x 128, top-k 2048)."""

DSV4_FLASH_LAYER = LayerConfig(
    name="DSV4_FLASH", preset=DSV4_FLASH, hidden=4096, q_lora_rank=1024,
    num_heads=DSV4_FLASH.num_heads, absorbed=False, qk_nope_head_dim=0, v_head_dim=0, o_groups=8,
    o_lora_rank=1024, index_heads=DSV4_FLASH.index_heads, index_head_dim=DSV4_FLASH.index_head_dim,
    topk=DSV4_FLASH.topk, window=DSV4_FLASH.window, rope_theta=160000.0, rope_factor=16.0,
    original_seq_len=65536, beta_fast=32, beta_slow=1, sm_scale=512 ** -0.5, q_head_norm=True,
    inverse_rope_out=True, attn_sink=True, page_size=DSV4_FLASH.page_size)
"""DeepSeek-V4-Flash as public configs describe it (hidden 4096, 64 heads, head_dim 512 over a
single K = V latent, q_lora 1024, o_groups 8, o_lora 1024, index 64 x 128, top-k 512, sliding
window 128, YaRN factor 16 over 65536, rms eps 1e-6).

Assumptions (no primary source was available; each is a switch in :class:`LayerConfig`):

* The layer is an indexer (compressed-attention) layer, but the latent cache holds one row per
  token: V4's KV *compressor* (one entry per 4 tokens) is out of scope; rope uses
  ``compress_rope_theta`` 160000 with the YaRN correction, as third-party ports do for these
  layers.
* ``wkv`` maps hidden -> 512, ``kv_norm`` (RMSNorm with weight) normalises all 512 dims, then
  the last 64 dims are roped (interleaved pairs); q is normalised per head by RMS without a
  learned weight before its last 64 dims are roped.
* The indexer is V3.2's (same projections, non-interleaved rope, Hadamard, ue8m0 fp8); it ranks
  positions before the window, and the last ``window`` positions are always attended; the two
  sets are disjoint, so no position is counted twice.
* ``sm_scale = 512^-0.5``; the attention sink is the per-head logit of SPEC's ``attn_sink``.
* Output: inverse rope on the last 64 dims of each head at the query position, then
  ``wo_a`` per group of ``H / o_groups`` heads (``[o_groups * o_lora, (H / o_groups) * 512]``)
  and ``wo_b`` (``[hidden, o_groups * o_lora]``).
"""

LAYER_CONFIGS = {c.name: c for c in (DSV32_LAYER, DSV4_FLASH_LAYER)}


# ============================================================================ weights

def weight_shapes(cfg: LayerConfig) -> dict[str, tuple[int, ...]]:
    """Full (unsharded) weight shapes, DeepSeek ``inference/model.py`` names, ``[out, in]``."""
    H, Dh, r = cfg.num_heads, cfg.index_head_dim, cfg.d_rope
    s = {"wq_a": (cfg.q_lora_rank, cfg.hidden), "q_norm": (cfg.q_lora_rank,)}
    if cfg.absorbed:
        C, nope, v = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
        s.update({"wq_b": (H * (nope + r), cfg.q_lora_rank), "wkv_a": (C + r, cfg.hidden),
                  "kv_norm": (C,), "wkv_b": (H * (nope + v), C), "wo": (cfg.hidden, H * v)})
    else:
        D, g = cfg.d_qk, cfg.o_groups
        s.update({"wq_b": (H * D, cfg.q_lora_rank), "wkv": (D, cfg.hidden), "kv_norm": (D,),
                  "wo_a": (g * cfg.o_lora_rank, (H // g) * D),
                  "wo_b": (cfg.hidden, g * cfg.o_lora_rank), "attn_sink": (H,)})
    s.update({"indexer.wq_b": (cfg.index_heads * Dh, cfg.q_lora_rank), "indexer.wk": (Dh, cfg.hidden),
              "indexer.k_norm.weight": (Dh,), "indexer.k_norm.bias": (Dh,),
              "indexer.weights_proj": (cfg.index_heads, cfg.hidden)})
    return s


def init_weights(cfg: LayerConfig, seed=0) -> dict[str, np.ndarray]:
    """Random float32 weights of the full layer with activations of order one.

    Linear weights ~ N(0, 1/fan_in); norm weights 1 + N(0, 0.1^2); LayerNorm bias and the
    attention sink N(0, 0.1^2) / N(0, 1).
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm") or name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif name == "attn_sink":
            w = rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / math.sqrt(shape[1])
        out[name] = w.astype(np.float32)
    return out


def float32_weights(cfg: LayerConfig, weights, convert=None) -> dict:
    """``{name: float32 ndarray}`` of the weights the layer uses, from a mapping of NumPy arrays
    (any real float dtype, ml_dtypes bfloat16 included) or framework arrays that ``convert``
    (the caller's; e.g. torch tensor -> NumPy) or ``np.asarray`` turns into NumPy. Names that are
    absent or of the wrong shape are left to :func:`shard_weights` to report.

    Raises:
      TypeError: ``weights`` not a mapping; a weight that is not a real floating-point array
        (names ``weights[name]``).
    """
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights: expected a mapping {{name: array}} (DeepSeek names, "
                        f"kernels.layer_reference.weight_shapes) or None, got {type(weights).__name__}")
    out = {}
    for name in weight_shapes(cfg):
        if name not in weights:
            continue
        v = weights[name]
        try:
            a = convert(v) if convert is not None else v
            if np.iscomplexobj(a):
                raise TypeError
            out[name] = np.asarray(a, np.float32)
        except (TypeError, ValueError):
            raise TypeError(f"weights[{name!r}]: expected a real floating-point array, got "
                            f"{type(v).__name__} {getattr(v, 'dtype', '')}".rstrip()) from None
    return out


def shard_weights(cfg: LayerConfig, weights: dict, tp_rank: int, tp_size: int) -> dict:
    """This rank's slices of the full weights (DeepSeek's tensor parallelism over heads).

    Column-parallel (output rows, by head): ``wq_b``, ``wkv_b``, V4 ``wo_a`` (by head group) and
    ``attn_sink``; row-parallel (input columns): ``wo`` / V4 ``wo_b``, whose partial outputs the
    ranks sum. Everything else (``wq_a``, norms, ``wkv_a`` / ``wkv``, the whole indexer) is
    replicated, as in DeepSeek's reference and the vLLM / SGLang DSA backends.

    Raises:
      ValueError: missing weight, wrong shape, or ``tp_rank`` / ``tp_size`` out of range.
    """
    Hl = cfg.heads_per_rank(tp_size)
    tp_rank = check_int("tp_rank", tp_rank)
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank: expected an int in [0, {tp_size}), got {tp_rank!r}")
    shapes = weight_shapes(cfg)
    for name, shape in shapes.items():
        if name not in weights:
            raise ValueError(f"weights: missing {name!r} (expected shape {shape})")
        if tuple(np.shape(weights[name])) != shape:
            raise ValueError(f"weights[{name!r}]: expected shape {shape}, got {tuple(np.shape(weights[name]))}")
    w = {k: np.asarray(weights[k]) for k in shapes}
    h0, h1 = tp_rank * Hl, (tp_rank + 1) * Hl
    r = cfg.d_rope
    if cfg.absorbed:
        qd, kvd, v = cfg.qk_nope_head_dim + r, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.v_head_dim
        w["wq_b"] = w["wq_b"][h0 * qd:h1 * qd]
        w["wkv_b"] = w["wkv_b"][h0 * kvd:h1 * kvd]
        w["wo"] = w["wo"][:, h0 * v:h1 * v]
    else:
        D, gl, ol = cfg.d_qk, cfg.o_groups // tp_size, cfg.o_lora_rank
        w["wq_b"] = w["wq_b"][h0 * D:h1 * D]
        w["attn_sink"] = w["attn_sink"][h0:h1]
        w["wo_a"] = w["wo_a"][tp_rank * gl * ol:(tp_rank + 1) * gl * ol]
        w["wo_b"] = w["wo_b"][:, tp_rank * gl * ol:(tp_rank + 1) * gl * ol]
    return {k: np.ascontiguousarray(a) for k, a in w.items()}


@dataclass(frozen=True)
class Projection:
    """One weight-streaming GEMM of a decode step, ``out[g] = x[g] @ w[g]^T`` per group.

    Attributes:
      name: the layer's name of it (``torch_impl.layer.LAYER_GEMMS``).
      groups: G, 1 for a plain linear layer (the heads of V3.2's per-head ``wkv_b`` products,
        V4's output groups of ``wo_a``).
      n, k: output and input features per group (the weight's ``[n, k]``).
      fp32: the weight is float32 (``indexer.weights_proj``), else the layer's dtype.
      n_major: the weight is read transposed, its N dim contiguous (V3.2 ``wkv_b_q``: q_nope
        times ``wkv_b``'s key half, stored ``[nope, C]`` per head).
    """

    name: str
    groups: int
    n: int
    k: int
    fp32: bool = False
    n_major: bool = False

    @property
    def numel(self) -> int:
        return self.groups * self.n * self.k


def projection_shapes(cfg: LayerConfig, tp_size: int = 1) -> tuple[Projection, ...]:
    """The projections of one decode step on one tensor-parallel rank, in the order the step
    runs them: the fused ``x_proj`` (wq_a, wkv_a / wkv, indexer.wk), ``wq_b``, V3.2's per-head
    ``wkv_b_q``, the indexer's ``wq_b`` and ``weights_proj``, then V3.2 ``wkv_b_v`` and ``wo``,
    V4 ``wo_a`` and ``wo_b``. Their weight elements add up to the rank's 2-D weights
    (:func:`weight_shapes`, sliced by :func:`shard_weights`). The Hadamard rotation is not one
    (its M is the indexer's heads x tokens)."""
    Hl = cfg.heads_per_rank(tp_size)
    r, D_I, H_I = cfg.d_rope, cfg.index_head_dim, cfg.index_heads
    if cfg.absorbed:
        C, nope, v = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
        return (Projection("x_proj", 1, cfg.q_lora_rank + C + r + D_I, cfg.hidden),
                Projection("wq_b", 1, Hl * (nope + r), cfg.q_lora_rank),
                Projection("wkv_b_q", Hl, C, nope, n_major=True),
                Projection("indexer.wq_b", 1, H_I * D_I, cfg.q_lora_rank),
                Projection("indexer.weights_proj", 1, H_I, cfg.hidden, fp32=True),
                Projection("wkv_b_v", Hl, v, C),
                Projection("wo", 1, cfg.hidden, Hl * v))
    gl = cfg.o_groups // tp_size
    return (Projection("x_proj", 1, cfg.q_lora_rank + cfg.d_qk + D_I, cfg.hidden),
            Projection("wq_b", 1, Hl * cfg.d_qk, cfg.q_lora_rank),
            Projection("indexer.wq_b", 1, H_I * D_I, cfg.q_lora_rank),
            Projection("indexer.weights_proj", 1, H_I, cfg.hidden, fp32=True),
            Projection("wo_a", gl, cfg.o_lora_rank, Hl * cfg.d_qk // gl),
            Projection("wo_b", 1, cfg.hidden, gl * cfg.o_lora_rank))


# ============================================================================ rope, hadamard

def rope_freqs(cfg: LayerConfig) -> np.ndarray:
    """Rotary frequencies ``[d_rope / 2]`` float64 with DeepSeek's YaRN correction
    (``precompute_freqs_cis``: applied because the model's context exceeds ``original_seq_len``)."""
    dim, base, factor = cfg.d_rope, cfg.rope_theta, cfg.rope_factor
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))

    def corr_dim(rot):
        return dim * math.log(cfg.original_seq_len / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(cfg.beta_fast)), 0)
    high = min(math.ceil(corr_dim(cfg.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    smooth = 1 - ramp
    return freqs / factor * (1 - smooth) + freqs * smooth


def hadamard_matrix(n: int) -> np.ndarray:
    """Sylvester Hadamard matrix ``[n, n]`` times ``n^-0.5`` (``fast_hadamard_transform`` with
    ``scale = n^-0.5``: y = x @ H, H symmetric), float64."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"n: expected a power of two, got {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def kv_cache_shape(cfg: LayerConfig, kv_format: str, num_pages: int) -> tuple[int, ...]:
    """Shape of a latent cache of ``num_pages`` pages of ``cfg.page_size`` tokens: latent
    ``[n, P, D_qk]``, ``fp8_ds_mla`` ``[n, P, 656]``, ``fp8_model1`` ``[n, model1_page_bytes(P)]``."""
    if kv_format not in formats.KV_FORMATS:
        raise ValueError(f"kv_format: expected one of {formats.KV_FORMATS}, got {kv_format!r}")
    return formats.cache_shape(kv_format, num_pages, cfg.page_size, cfg.d_qk)
