"""Float64 NumPy reference of one DSA attention *decode layer* (DeepSeek's absorbed form).

The layer wraps the two SPEC operations (``kernels.reference.indexer_topk`` and
``kernels.reference.sparse_mla_decode``) with everything DeepSeek's ``MLA.forward`` /
``Indexer.forward`` do around them at decode: the query path, the latent-cache and indexer-cache
writes of the N new tokens, the indexer's q/k/weights, and the output projections. The torch
(``torch_impl.layer``) and Flax NNX (``jax_impl.layer``) layers are tested against
:func:`layer_reference`, and both build their weights and tensor-parallel slices from
:func:`init_weights` / :func:`shard_weights` here, so the three agree on names and layouts.

Sources (facts, not code): deepseek-ai/DeepSeek-V3.2-Exp ``inference/model.py`` (``MLA``,
``Indexer``, ``precompute_freqs_cis``, ``apply_rotary_emb(..., interleaved)``,
``rotate_activation``, ``weight_dequant``), ``inference/kernel.py`` (``act_quant``: one scale
per 128 values, ``amax/448`` or with ``scale_fmt="ue8m0"`` rounded up to a power of two) and
``config_671B_v3.2.json``. DeepSeek-V4-Flash: public configs and third-party ports (hidden
4096, 64 heads of width 512 over one shared K=V latent, q_lora 1024, o_groups 8 x o_lora 1024,
sliding window 128, attention sink, inverse rope on the output's rope dims). What is assumed for
V4 where no primary source was available is listed in :data:`DSV4_FLASH_LAYER`'s docstring.

Math of one decode step (per request b, new token i at position ``pos = L_b - N + i``):

V3.2 (``absorbed=True``)::

    qr     = rmsnorm(x @ wq_a.T) * q_norm                          [q_lora]
    q      = (qr @ wq_b.T).view(H, nope + rope); q_pe = rope_interleaved(q_pe, pos)
    q_lat  = einsum("hd,hdc->hc", q_nope, wkv_b.view(H, nope + v, C)[:, :nope])   (absorption)
    q_mla  = [q_lat, q_pe]                                           [H, C + rope] = [H, 576]
    kv     = x @ wkv_a.T = [c, k_pe]; latent = [rmsnorm(c) * kv_norm, rope_interleaved(k_pe)]
    out, lse = sparse_mla_decode(q_mla, cache, indexer_topk(...), sm_scale)          [H, C]
    y      = einsum("hc,hdc->hd", out, wkv_b[:, nope:]).flatten() @ wo.T  (value up-proj, wo)

V4-Flash (``absorbed=False``)::

    q      = (qr @ wq_b.T).view(H, D); q = q * rsqrt(mean(q^2) + eps) (per head, no weight)
    q[-rope:] = rope_interleaved(...); latent = rmsnorm(x @ wkv.T) * kv_norm; latent[-rope:] roped
    indices = [indexer top-k over positions < len - window, the last ``window`` positions]
    out, lse = sparse_mla_decode(q, cache, indices, sm_scale, attn_sink=attn_sink)   [H, D]
    out[-rope:] = inverse rope at the query position; grouped wo_a then wo_b

Indexer (both)::

    iq = (qr @ indexer.wq_b.T).view(H_I, D_I); iq[:rope] = rope_non_interleaved
    ik = layernorm(x @ indexer.wk.T) ; ik[:rope] = rope_non_interleaved
    iq, ik = hadamard(iq), hadamard(ik)                 (Sylvester order, scale D_I^-0.5)
    iq_fp8, q_scale = act_quant(iq, ue8m0) per head; ik -> fp8_indexer cache (ue8m0)
    w = (x @ indexer.weights_proj.T) * H_I^-0.5 * q_scale * D_I^-0.5   (float32)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels import cases, formats, reference
# LayerConfig, the presets' layers and the weight / cache helpers the production layers use
# live in kernels.layer_config (no test tooling); re-exported here so old names keep working.
from kernels.layer_config import (DSV32_LAYER, DSV4_FLASH_LAYER, LAYER_CONFIGS,  # noqa: F401
                                  LayerConfig, Projection, float32_weights, hadamard_matrix,
                                  init_weights, kv_cache_shape, projection_shapes, rope_freqs,
                                  shard_weights, weight_shapes)

__all__ = [
    "LayerConfig", "DSV32_LAYER", "DSV4_FLASH_LAYER", "LAYER_CONFIGS", "weight_shapes",
    "init_weights", "shard_weights", "rope_freqs", "hadamard_matrix", "LayerCase",
    "make_layer_case", "layer_reference", "LayerResult", "layer_parity_cases", "new_token_slots",
    "window_indices", "write_token_rows", "kv_cache_shape",
]


# ============================================================================ reference math

def _rope(x, angle, *, interleaved: bool, inverse: bool = False):
    """Rotate ``x [..., d]`` by ``angle [..., d/2]`` (broadcast over heads by the caller)."""
    c, s = np.cos(angle), np.sin(angle)
    if inverse:
        s = -s
    d = x.shape[-1]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : d // 2], x[..., d // 2:]
    ra, rb = a * c - b * s, a * s + b * c
    if interleaved:
        return np.stack([ra, rb], axis=-1).reshape(x.shape)
    return np.concatenate([ra, rb], axis=-1)


def _rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 if w is None else w)


def _layernorm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


# ============================================================================ cases

@dataclass
class LayerCase:
    """One decode step of the layer: inputs as NumPy arrays, weights full (unsharded) float32.

    x ``[B, N, hidden]`` float32; kv_cache in ``kv_format`` (latent float32
    ``[num_pages, P, D_qk]``, ``fp8_ds_mla`` uint8 ``[num_pages, P, 656]``, ``fp8_model1`` uint8
    ``[num_pages, page_bytes]``); k_cache ``fp8_indexer`` uint8 ``[num_pages, P * 132]``;
    block_table int32 ``[B, max_pages]``; context_lens int32 ``[B]`` (L_b counting the N new
    tokens, whose slots the block table must map).
    """

    name: str
    cfg: LayerConfig
    weights: dict
    x: np.ndarray
    kv_cache: np.ndarray
    k_cache: np.ndarray
    block_table: np.ndarray
    context_lens: np.ndarray
    kv_format: str
    seed: int = 0

    def reference(self, tp_rank: int = 0, tp_size: int = 1, *, indices=None) -> "LayerResult":
        """:func:`layer_reference` of this case for rank ``tp_rank`` of ``tp_size``."""
        return layer_reference(self.cfg, shard_weights(self.cfg, self.weights, tp_rank, tp_size),
                               self.x, self.kv_cache, self.k_cache, self.block_table,
                               self.context_lens, kv_format=self.kv_format, indices=indices)


def make_layer_case(cfg: LayerConfig, *, seed=0, B=2, N=1, lens=(150, 90), kv_format=None,
                    name=None) -> LayerCase:
    """Random weights, inputs and a filled paged cache pool (older tokens and stale pages hold
    random latent / indexer rows of the magnitude the layer writes)."""
    rng = np.random.default_rng(seed)
    kv_format = kv_format or cfg.kv_format
    lens = [int(v) for v in lens][:B]
    if len(lens) != B or min(lens) < N:
        raise ValueError(f"lens: expected {B} lengths >= N={N}, got {lens}")
    P = cfg.page_size
    bt, num_pages, _ = cases.make_block_table(rng, lens, P, stale_pages=1)
    lat = rng.standard_normal((num_pages, P, cfg.d_qk)).astype(np.float32)
    kv_cache = formats.quantize_kv(lat, kv_format)
    k = rng.standard_normal((num_pages, P, cfg.index_head_dim)).astype(np.float32)
    k_cache = formats.quantize_fp8_indexer(k, cfg.scale_fmt)
    x = rng.standard_normal((B, N, cfg.hidden)).astype(np.float32)
    return LayerCase(name or f"{cfg.name}_{kv_format}_B{B}_N{N}", cfg, init_weights(cfg, seed + 1), x,
                     kv_cache, k_cache, bt, np.asarray(lens, np.int32), kv_format, seed)


def layer_parity_cases() -> list[dict]:
    """Named configurations for the parity suite: dicts with ``name``, ``cfg`` (a scaled-down
    :class:`LayerConfig`), ``kv_format``, ``B``, ``N``, ``lens``, ``seed`` and ``tp`` (compare the
    sum of ``tp`` rank outputs). Build one with ``make_layer_case(**{k: c[k] for k in
    ("cfg", "seed", "B", "N", "lens", "kv_format", "name")})``."""
    v32, v4 = DSV32_LAYER.scaled_down(), DSV4_FLASH_LAYER.scaled_down()
    return [
        dict(name="dsv32_fp8_ds_mla", cfg=v32, kv_format="fp8_ds_mla", B=2, N=1, lens=(150, 40), seed=0, tp=1),
        dict(name="dsv32_latent_mtp2", cfg=v32, kv_format="latent", B=2, N=2, lens=(130, 70), seed=1, tp=1),
        dict(name="dsv32_fp8_tp2", cfg=v32, kv_format="fp8_ds_mla", B=1, N=1, lens=(100,), seed=2, tp=2),
        dict(name="dsv4_fp8_model1", cfg=v4, kv_format="fp8_model1", B=2, N=1, lens=(120, 30), seed=3, tp=1),
        dict(name="dsv4_latent_mtp2", cfg=v4, kv_format="latent", B=1, N=2, lens=(90,), seed=4, tp=1),
        dict(name="dsv4_fp8_tp2", cfg=v4, kv_format="fp8_model1", B=1, N=1, lens=(100,), seed=5, tp=2),
    ]


# ============================================================================ the layer

@dataclass
class LayerResult:
    """Outputs and intermediates of :func:`layer_reference` (float64 unless noted).

    out ``[B, N, hidden]`` (this rank's partial sum when tp_size > 1); kv_cache / k_cache the
    updated caches (same layout and dtype as given); q ``[B, N, H, D_qk]`` the sparse-MLA query;
    idx_q float8_e4m3fn ``[B, N, H_I, D_I]``; idx_weights float32 ``[B, N, H_I]``; indices int32
    ``[B, N, K (+ window)]`` logical positions, -1 padded; attn ``[B, N, H, d_v]``, lse
    ``[B, N, H]`` (natural log); idx_context_lens int32 ``[B, N]`` the indexer's valid lengths.
    """

    out: np.ndarray
    kv_cache: np.ndarray
    k_cache: np.ndarray
    q: np.ndarray
    idx_q: np.ndarray
    idx_weights: np.ndarray
    indices: np.ndarray
    attn: np.ndarray
    lse: np.ndarray
    idx_context_lens: np.ndarray = field(default=None)


def new_token_slots(block_table, context_lens, N: int, P: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions ``[B, N]`` = ``L_b - N + i``, slots ``[B, N]``, -1 where unmapped)."""
    pos = np.asarray(context_lens, np.int64)[:, None] - N + np.arange(N)[None, :]
    return pos, formats.logical_to_slot(pos, np.asarray(block_table), P)


def window_indices(lens_bn: np.ndarray, window: int) -> np.ndarray:
    """The last ``window`` positions before each draft's valid length, ``[B, N, window]`` int32,
    -1 where negative."""
    j = np.asarray(lens_bn, np.int64)[..., None] - window + np.arange(window)
    return np.where(j >= 0, j, -1).astype(np.int32)


def write_token_rows(kv_cache, k_cache, latent, idx_k, slots, kv_format, P, D_I, scale_fmt):
    """Write the new tokens' rows into copies of both caches (reference semantics of the cache
    write). latent ``[T, D_qk]`` float, idx_k ``[T, D_I]`` float, slots ``[T]``."""
    kv = kv_cache.copy()
    kc = k_cache.copy()
    for t, slot in enumerate(np.asarray(slots).reshape(-1)):
        if slot < 0:
            continue
        page, off = divmod(int(slot), P)
        row = latent[t].astype(np.float32)
        if kv_format == "latent":
            kv[page, off] = row.astype(kv.dtype)
        elif kv_format == "fp8_ds_mla":
            kv[page, off] = formats.quantize_fp8_ds_mla(row[None])[0]
        else:
            one = formats.quantize_fp8_model1(row[None, None])[0]
            kv[page, off * 576:(off + 1) * 576] = one[:576]
            kv[page, P * 576 + off * 8:P * 576 + off * 8 + 8] = one[576:584]
        one = formats.quantize_fp8_indexer(idx_k[t].astype(np.float32)[None, None], scale_fmt)[0]
        kc[page, off * D_I:(off + 1) * D_I] = one[:D_I]
        kc[page, P * D_I + 4 * off:P * D_I + 4 * off + 4] = one[D_I:]
    return kv, kc


def layer_reference(cfg: LayerConfig, weights: dict, x, kv_cache, k_cache, block_table,
                    context_lens, *, kv_format: str | None = None, indices=None) -> LayerResult:
    """One decode step of the DSA attention layer in float64 (module docstring for the math).

    Args:
      cfg: the layer's dimensions.
      weights: this rank's weights (:func:`shard_weights`), float arrays, DeepSeek names.
      x: ``[B, N, hidden]`` float, the N new tokens of each request (N > 1: MTP drafts).
      kv_cache, k_cache, block_table, context_lens: as in :class:`LayerCase`; not modified.
      kv_format: the latent cache layout (default ``cfg.kv_format``).
      indices: optional int32 ``[B, N, K (+ window)]`` logical positions to attend instead of the
        reference's own selection (to compare a low-precision layer whose indexer legitimately
        picked a different near-tie set; its selection is checked separately).
    Returns:
      :class:`LayerResult`; ``out`` is this rank's row-parallel partial (sum over ranks = TP=1).
    Quantization points (fp8 caches, indexer q) use ``kernels.formats``, i.e. they round the
    float64 value to float32 first, exactly as the float32 layers do.
    """
    kv_format = kv_format or cfg.kv_format
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    x = np.asarray(x, np.float64)
    B, N, _ = x.shape
    P, r, D_I, H_I = cfg.page_size, cfg.d_rope, cfg.index_head_dim, cfg.index_heads
    pos, slots = new_token_slots(block_table, context_lens, N, P)
    ang = pos[..., None].astype(np.float64) * rope_freqs(cfg)           # [B, N, r/2]
    ang_h = ang[:, :, None, :]

    qr = _rmsnorm(x @ w["wq_a"].T, w["q_norm"], cfg.eps)               # [B, N, q_lora]
    if cfg.absorbed:
        nope, C = cfg.qk_nope_head_dim, cfg.kv_lora_rank
        q = (qr @ w["wq_b"].T).reshape(B, N, -1, nope + r)
        H = q.shape[2]
        q_pe = _rope(q[..., nope:], ang_h, interleaved=True)
        wkv_b = w["wkv_b"].reshape(H, nope + cfg.v_head_dim, C)
        q_lat = np.einsum("bnhd,hdc->bnhc", q[..., :nope], wkv_b[:, :nope])
        q_mla = np.concatenate([q_lat, q_pe], axis=-1)
        kv = x @ w["wkv_a"].T
        c = _rmsnorm(kv[..., :C], w["kv_norm"], cfg.eps)
        latent = np.concatenate([c, _rope(kv[..., C:], ang, interleaved=True)], axis=-1)
    else:
        D = cfg.d_qk
        q = (qr @ w["wq_b"].T).reshape(B, N, -1, D)
        H = q.shape[2]
        if cfg.q_head_norm:
            q = _rmsnorm(q, None, cfg.eps)
        q_mla = np.concatenate([q[..., :-r], _rope(q[..., -r:], ang_h, interleaved=True)], axis=-1)
        kv = _rmsnorm(x @ w["wkv"].T, w["kv_norm"], cfg.eps)
        latent = np.concatenate([kv[..., :-r], _rope(kv[..., -r:], ang, interleaved=True)], axis=-1)

    # indexer q / k / weights
    had = hadamard_matrix(D_I)
    iq = (qr @ w["indexer.wq_b"].T).reshape(B, N, H_I, D_I)
    iq = np.concatenate([_rope(iq[..., :r], ang_h, interleaved=False), iq[..., r:]], axis=-1) @ had
    ik = _layernorm(x @ w["indexer.wk"].T, w["indexer.k_norm.weight"], w["indexer.k_norm.bias"], cfg.eps)
    ik = np.concatenate([_rope(ik[..., :r], ang, interleaved=False), ik[..., r:]], axis=-1) @ had
    q_scale = formats.indexer_scale(np.abs(iq.astype(np.float32)).max(axis=-1), cfg.scale_fmt)
    idx_q = formats.to_e4m3(iq.astype(np.float32) / q_scale[..., None])
    idx_w = ((x @ w["indexer.weights_proj"].T) * H_I ** -0.5 * q_scale * D_I ** -0.5).astype(np.float32)

    kv_new, kc_new = write_token_rows(np.asarray(kv_cache), np.asarray(k_cache),
                                      latent.reshape(B * N, -1), ik.reshape(B * N, -1), slots,
                                      kv_format, P, D_I, cfg.scale_fmt)
    lens_bn = reference.valid_lengths(context_lens, B, N)
    if cfg.window:
        idx_lens = np.maximum(lens_bn - cfg.window, 0).astype(np.int32)
        if indices is None:
            top = reference.indexer_topk(idx_q, idx_w, kc_new, block_table, idx_lens, cfg.topk)
            indices = np.concatenate([top, window_indices(lens_bn, cfg.window)], axis=-1)
    else:
        idx_lens = lens_bn.astype(np.int32)
        top = reference.indexer_topk(idx_q, idx_w, kc_new, block_table, context_lens, cfg.topk)
        indices = top if indices is None else indices

    if indices is not None:
        indices = np.asarray(indices, np.int32)
    sink = w["attn_sink"] if cfg.attn_sink else None
    attn, lse = reference.sparse_mla_decode(q_mla, kv_new, indices, cfg.sm_scale, kv_format=kv_format,
                                            d_v=cfg.d_v, block_table=block_table, attn_sink=sink)
    if cfg.absorbed:
        o = np.einsum("bnhc,hdc->bnhd", attn, wkv_b[:, nope:]).reshape(B, N, -1)
        out = o @ w["wo"].T
    else:
        o = attn.copy()
        if cfg.inverse_rope_out:
            o[..., -r:] = _rope(o[..., -r:], ang_h, interleaved=True, inverse=True)
        gl = w["wo_a"].shape[0] // cfg.o_lora_rank
        o = o.reshape(B, N, gl, -1)
        wo_a = w["wo_a"].reshape(gl, cfg.o_lora_rank, -1)
        out = np.einsum("bngd,grd->bngr", o, wo_a).reshape(B, N, -1) @ w["wo_b"].T
    return LayerResult(out, kv_new, kc_new, q_mla, idx_q, idx_w, indices, attn, lse, idx_lens)
