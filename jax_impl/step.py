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
from jax_impl.indexer import _check_topk, _validate as _idx_validate, indexer_topk
from jax_impl.sparse_mla import _validate as _mla_validate, sparse_mla_decode

__all__ = ["dsa_decode_step", "window_split"]


def validate_step(q, kv_cache, idx_q, idx_weights, k_cache, block_table, context_lens,
                  sm_scale, topk, *, kv_format, d_v, attn_sink, k_format, path, window=0):
    """Every argument of a composed step (:func:`dsa_decode_step`,
    :func:`jax_impl.tp.dsa_decode_step_tp`), checked before either op runs (or is traced) and
    named as the step names it (``idx_q`` / ``idx_weights``, not the indexer's ``q`` /
    ``weights``): the scalars (``sm_scale``, ``topk``, ``window``), ``q`` and ``idx_q`` as
    rank-4 arrays of the same ``B`` and ``N``, the indexer's arguments, the attention's
    arguments (with the indices the indexer will return), and the caches' shared page pool.
    Shapes and dtypes only (static: works on tracers), except that a concrete 0-d array
    ``sm_scale`` is read back to check it.

    Returns:
      ``(int(topk), int(window))``.
    Raises:
      TypeError / ValueError: the bad argument named (ValueError naming both ``q`` and ``idx_q``
        when their B or N differ; naming ``k_cache`` when its page count or page size differs
        from ``kv_cache``'s).
    """
    check_sm_scale(sm_scale)
    topk = check_int("topk", topk, minimum=1)
    window = check_int("window", window, minimum=0)
    check_array("q", q, ndim=4)
    check_array("idx_q", idx_q, ndim=4)
    if tuple(q.shape[:2]) != tuple(idx_q.shape[:2]):
        raise ValueError(f"q, idx_q: expected the same B and N (q [B, N, H, D_qk], idx_q "
                         f"[B, N, H_I, D_I]), got q {tuple(q.shape)} and idx_q {tuple(idx_q.shape)}")
    B, N = (int(d) for d in idx_q.shape[:2])
    _idx_validate(idx_q, idx_weights, k_cache, block_table, context_lens, k_format,
                  names=("idx_q", "idx_weights"))
    _check_topk(topk, True, B, N)
    # the attention's arguments with a stand-in of the indices the indexer returns (a
    # zero-stride NumPy view, no memory)
    _mla_validate(q, kv_cache, np.broadcast_to(np.int32(0), (B, N, topk + window)), sm_scale,
                  kv_format, d_v, block_table, None, attn_sink, path)
    np_formats.check_shared_page_pool(tuple(kv_cache.shape), kv_format, tuple(k_cache.shape),
                                      k_format, idx_q.shape[-1])
    return topk, window


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
      TypeError / ValueError: a bad argument, named as this function names it, all checked
        before either op runs (:func:`validate_step`): ``sm_scale`` / ``topk`` / ``window`` of
        the wrong type, a concrete NaN / inf ``sm_scale`` (or one that overflows float32),
        ``topk`` < 1, ``window`` < 0; a wrong type, dtype or shape of ``q``, ``kv_cache``,
        ``idx_q``, ``idx_weights``, ``k_cache``, ``block_table``, ``context_lens`` or
        ``attn_sink``, an unknown ``kv_format`` / ``k_format`` / ``path``, a bad ``d_v``;
        ``q`` and ``idx_q`` of different B or N (ValueError naming both); ``k_cache`` whose
        page count or page size differs from ``kv_cache``'s (one block table addresses both;
        ``kernels.formats.check_shared_page_pool``).
      NotImplementedError: the named ``path`` cannot run on this device / shape.

    Semantics: docs/SPEC.md operations A and B; DeepSeek-V3.2-Exp ``inference/model.py``.
    """
    topk, window = validate_step(q, kv_cache, idx_q, idx_weights, k_cache, block_table,
                                 context_lens, sm_scale, topk, kv_format=kv_format, d_v=d_v,
                                 attn_sink=attn_sink, k_format=k_format, path=path, window=window)
    if window:
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
