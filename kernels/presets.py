"""Model dimension presets for DeepSeek sparse attention (DSA) decode.

One place for every model number the kernels, tests, parity suite and benchmark use. Each field
names its source:

* DeepSeek-V3.2-Exp: ``inference/config_671B_v3.2.json`` and ``inference/model.py`` of
  deepseek-ai/DeepSeek-V3.2-Exp (``n_heads=128``, ``kv_lora_rank=512``, ``qk_rope_head_dim=64``,
  ``qk_nope_head_dim=128``, ``v_head_dim=128``, ``index_n_heads=64``, ``index_head_dim=128``,
  ``index_topk=2048``; softmax scale ``(128+64)^-0.5 * mscale^2`` with YaRN ``mscale = 0.1 *
  mscale_all_dim * ln(factor) + 1``, ``factor=40``, ``mscale_all_dim=1.0``), and FlashMLA's
  ``V32_FP8Sparse`` cache layout (656 bytes per token, 4 tiles of 128).
* DeepSeek-V4-Flash: FlashMLA's ``MODEL1_FP8Sparse`` layout (``d=512``, ``d_nope=448``,
  ``d_rope=64``, 7 tiles of 64, 584 bytes per token) and docs/SPEC.md's table (64 heads,
  top-k 512 plus a 128-token window, attention sink).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernels.scalars import check_int


def _v32_sm_scale() -> float:
    mscale = 0.1 * 1.0 * math.log(40.0) + 1.0
    return (128 + 64) ** -0.5 * mscale * mscale


@dataclass(frozen=True)
class ModelPreset:
    """Dimensions of one DSA model's decode attention.

    Attributes:
      name: preset name used in result files (``"DSV32"``, ``"DSV4_FLASH"``).
      num_heads: query heads of the whole model (per rank = num_heads / TP).
      d_qk: latent key width seen by q (``d_nope + d_rope``).
      d_nope: the quantized (no-position) part of the latent.
      d_rope: the rotary part, stored unquantized (bf16) in the fp8 layouts.
      d_v: value width, the first ``d_v`` dims of the latent.
      topk: indexer top-k width (``index_topk``).
      window: extra sliding-window tokens attended besides the top-k (V4-Flash), 0 if none.
      index_heads / index_head_dim: lightning indexer heads H_I and their width D_I.
      page_size: tokens per cache page P.
      kv_format: the fp8 latent-cache layout the model serves with.
      sm_scale: softmax scale (natural-log domain); None when the caller must pass it.
      attn_sink: whether the model has a per-head attention sink.
      max_context: the model's maximum context, in cache positions.
    """

    name: str
    num_heads: int
    d_qk: int
    d_nope: int
    d_rope: int
    d_v: int
    topk: int
    window: int
    index_heads: int
    index_head_dim: int
    page_size: int
    kv_format: str
    sm_scale: float | None
    attn_sink: bool
    max_context: int

    def heads_per_rank(self, tp: int) -> int:
        """Query heads on one rank at tensor-parallel size ``tp``.

        Raises:
          TypeError: ``tp`` not an int (kernels.scalars rule). ValueError: ``tp`` < 1 or not a
            divisor of ``num_heads``.
        """
        tp = check_int("tp", tp, minimum=1)
        if self.num_heads % tp:
            raise ValueError(
                f"tp: expected a positive divisor of {self.name}.num_heads={self.num_heads}, got {tp}")
        return self.num_heads // tp


DSV32 = ModelPreset(
    name="DSV32", num_heads=128, d_qk=576, d_nope=512, d_rope=64, d_v=512, topk=2048, window=0,
    index_heads=64, index_head_dim=128, page_size=64, kv_format="fp8_ds_mla",
    sm_scale=_v32_sm_scale(), attn_sink=False, max_context=128 * 1024)

DSV4_FLASH = ModelPreset(
    name="DSV4_FLASH", num_heads=64, d_qk=512, d_nope=448, d_rope=64, d_v=512, topk=512,
    window=128, index_heads=64, index_head_dim=128, page_size=64, kv_format="fp8_model1",
    sm_scale=None, attn_sink=True, max_context=1024 * 1024)

PRESETS = {p.name: p for p in (DSV32, DSV4_FLASH)}
