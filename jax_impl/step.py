"""The composed DSA decode step for JAX: lightning indexer + exact top-k -> sparse MLA decode.

One decode step of DeepSeek sparse attention on one device (docs/SPEC.md operations A and B
chained as DeepSeek-V3.2-Exp ``inference/model.py`` ``MLA.forward`` chains them):

1. ``indexer_topk`` scores every valid logical position of each request's indexer K cache and
   selects the ``topk`` best (SPEC tie rule; -1 padding);
2. ``sparse_mla_decode`` attends those logical positions through the block table (the
   logical-to-slot conversion happens inside it, ``block_table=...``).

With ``window > 0`` (DeepSeek-V4-Flash) the indexer scores the positions before each draft's
last ``window`` and those ``window`` positions are attended as well (:func:`window_split`).

The top-k is requested ``sorted=True`` (descending logit, ties to the smaller position, -1 last),
so the index list has one canonical order: the sequence-sharded tensor-parallel step
(:mod:`jax_impl.tp`) produces exactly this list, and since sparse MLA sums entries in list order
both give bitwise identical outputs. Traceable under ``jax.jit`` (all shapes static).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from kernels import formats as np_formats

from jax_impl._common import check_array, check_int, check_sm_scale
from jax_impl.indexer import indexer_topk
from jax_impl.sparse_mla import _validate as _mla_validate, sparse_mla_decode

__all__ = ["dsa_decode_step", "window_split"]


def window_split(context_lens, N: int, window: int):
    """The V4 sliding window of a step: ``(indexer lengths, window positions)``.

    ``context_lens`` int32 ``[B]`` (L_b, counting the N new tokens: draft i's valid length is
    ``L_b - (N - 1 - i)``) or ``[B, N]`` (per-draft valid lengths). Returns int32 ``[B, N]``
    lengths ``max(len_i - window, 0)`` for the indexer and int32 ``[B, N, window]`` positions
    ``len_i - window + w`` (-1 where negative). Traceable (static ``N`` and ``window``).
    """
    cl = jnp.asarray(context_lens).astype(jnp.int32)
    if cl.ndim == 1:
        cl = cl[:, None] - (N - 1 - jnp.arange(N, dtype=jnp.int32))[None, :]
    lens = jnp.maximum(cl, 0)
    j = lens[..., None] - window + jnp.arange(window, dtype=jnp.int32)
    return jnp.maximum(lens - window, 0), jnp.where(j >= 0, j, -1).astype(jnp.int32)


def dsa_decode_step(q, kv_cache, idx_q, idx_weights, k_cache, block_table, context_lens,
                    sm_scale: float, topk: int, *, kv_format: str = "latent", d_v: int = 512,
                    attn_sink=None, k_format: str = "fp8_indexer", window: int = 0,
                    path: str = "auto"):
    """One DSA decode step: indexer top-k over the paged indexer cache, then sparse MLA decode.

    Args:
      q: MLA query (absorbed, MQA form), ``[B, N, H, D_qk]`` bf16 / fp16 / fp32 jax.Array, H =
        query heads on this device (model heads / TP), D_qk 576 (V3.2) or 512 (V4-Flash).
      kv_cache: latent cache, SPEC layout 1 ``"latent"`` ``[num_pages, P, D_qk]`` float, 2
        ``"fp8_ds_mla"`` uint8 ``[num_pages, P, 656]`` or 3 ``"fp8_model1"`` uint8
        ``[num_pages, page_bytes]`` (named by ``kv_format``).
      idx_q: indexer query ``[B, N, H_I, D_I]`` float8_e4m3fn (a float dtype with
        ``k_format="dense"``).
      idx_weights: ``[B, N, H_I]`` float32 per-head indexer weights with the q scale,
        ``H_I^-0.5`` and ``D_I^-0.5`` already folded in (DeepSeek / DeepGEMM convention).
      k_cache: indexer K cache, SPEC layout 4 ``"fp8_indexer"`` uint8
        ``[num_pages, P * (D_I + 4)]`` (or ``"dense"`` ``[num_pages, P, D_I]`` float).
      block_table: int32 ``[B, max_pages]``: logical position j of request b lives in slot
        ``block_table[b, j // P] * P + j % P``; -1 past a request's pages. The same table
        addresses both caches (they share the page pool and P).
      context_lens: int32 ``[B]`` (L_b, counting the N new tokens; draft i sees positions
        ``j < L_b - (N - 1 - i)``) or ``[B, N]`` (per-draft valid lengths).
      sm_scale: softmax scale of ``q . k`` (natural-log domain): a Python int / float, a NumPy
        integer or floating scalar, or a 0-d float array (traced under ``jax.jit`` too); never
        a bool; finite when concrete.
      topk: K >= 1, positions attended per draft (``index_topk``; 2048 for V3.2): a Python int
        or NumPy integer scalar, never a bool (static under ``jax.jit``).
      kv_format: ``"latent"``, ``"fp8_ds_mla"`` or ``"fp8_model1"``.
      d_v: value width, the first ``d_v`` latent dims (512).
      attn_sink: float32 ``[H]`` or None (V4-Flash): ``out *= 1 / (1 + exp(sink_h - lse))``.
      k_format: ``"fp8_indexer"`` (default) or ``"dense"``.
      window: the V4-Flash sliding window (``DSV4_FLASH.window`` = 128; 0, the default, for
        V3.2): when > 0 the indexer scores only the positions before each draft's last
        ``window`` (``j < len_i - window``, len_i the draft's valid length) and those last
        ``window`` positions ``len_i - window .. len_i - 1`` (-1 where negative) are appended
        to its top-k, as DeepSeek-V4's attention and ``DSADecodeLayer`` do. A Python int or
        NumPy integer scalar >= 0, never a bool (static under ``jax.jit``).
      path: ``"auto"``, ``"pallas"`` or ``"xla"``, passed to both ops (a named path that cannot
        run raises; ``"auto"`` falls through).

    Returns:
      ``(out, lse, indices)``:

      * out ``[B, N, H, d_v]`` in q's dtype; 0 for a draft with no valid position.
      * lse ``[B, N, H]`` float32, natural log of the softmax denominator (sink excluded);
        -inf for a draft with no valid position.
      * indices ``[B, N, topk + window]`` int32 logical positions: the top-k in descending
        indexer logit (ties to the smaller position), -1 padding last, then the window positions in ascending order.

    Raises:
      TypeError / ValueError: bad argument (named) from either op's validation; ``sm_scale``,
        ``topk`` and ``window`` are checked first (before the indexer runs): TypeError for a
        wrong type, ValueError for a NaN / inf scale, ``topk`` < 1 or ``window`` < 0; then
        ValueError naming ``k_cache`` when its page count or page size differs from
        ``kv_cache``'s (one block table addresses both; ``kernels.formats.check_shared_page_pool``),
        and the attention's own arguments (``q``, ``kv_cache``, ``block_table``, ``attn_sink``,
        ``kv_format``, ``d_v``, ``path``), before either op runs.
      NotImplementedError: the named ``path`` cannot run on this device / shape.

    Semantics: docs/SPEC.md operations A and B; DeepSeek-V3.2-Exp ``inference/model.py``.
    """
    check_sm_scale(sm_scale)
    topk = check_int("topk", topk, minimum=1)
    window = check_int("window", window, minimum=0)
    shapes = [getattr(t, "shape", None) for t in (kv_cache, k_cache, idx_q)]
    if all(sh is not None for sh in shapes):
        np_formats.check_shared_page_pool(tuple(shapes[0]), kv_format, tuple(shapes[1]), k_format,
                                          shapes[2][-1] if len(shapes[2]) else 0)
    # the attention's arguments before the indexer runs (its indices are a stand-in of the
    # shape the indexer returns: a zero-stride NumPy view, no memory)
    check_array("q", q, ndim=4)
    _mla_validate(q, kv_cache, np.broadcast_to(np.int32(0), (q.shape[0], q.shape[1], topk + window)),
                  sm_scale, kv_format, d_v, block_table, None, attn_sink, path)
    if window:
        check_array("context_lens", context_lens, dtypes=(jnp.int32,))
        idx_lens, win = window_split(context_lens, q.shape[1], window)
        top = indexer_topk(idx_q, idx_weights, k_cache, block_table, idx_lens, topk,
                           k_format=k_format, sorted=True, path=path)
        indices = jnp.concatenate([top, win], axis=-1)
    else:
        indices = indexer_topk(idx_q, idx_weights, k_cache, block_table, context_lens, topk,
                               k_format=k_format, sorted=True, path=path)
    out, lse = sparse_mla_decode(q, kv_cache, indices, sm_scale, kv_format=kv_format, d_v=d_v,
                                 block_table=block_table, attn_sink=attn_sink, path=path)
    return out, lse, indices
