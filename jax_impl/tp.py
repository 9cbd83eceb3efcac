"""Tensor-parallel DSA decode step under ``jax.shard_map``: heads sharded over a ``tp`` mesh axis,
caches and indices replicated, indexer replicated or sequence-sharded.

Under tensor parallelism the query heads are split over the devices of the mesh's ``tp`` axis
(``H / TP`` heads each) while the latent cache, the indexer cache, the block table and therefore
the top-k indices are the same on every device, so sparse MLA needs no collective: each device
attends the same positions with its own heads, and ``out`` / ``lse`` come back head-sharded.

The indexer is the part that grows with context. Two modes:

* ``"replicated"``: every device runs the full ``indexer_topk`` (what SGLang, vLLM and
  TensorRT-LLM do); TP - 1 devices repeat the dominant cost.
* ``"sequence"``: device r scores only its share of every request's pages: request b spans
  ``n_b = ceil(L_b / P)`` pages and device r takes pages ``[r * s_b, (r + 1) * s_b)`` of it,
  ``s_b = ceil(n_b / TP)`` (:func:`shard_block_table`, a per-request gather of the block table;
  each draft's valid length clipped to the share). Splitting by the request's own length rather
  than by block-table columns keeps the devices balanced when the table is sized for a longer
  context than the request holds; for a table sized to the longest request the two agree up to
  rounding. The share is selected with the same kernels as the full indexer
  (``jax_impl.indexer.topk_candidates``: the Pallas logits and top-k kernels, the selected
  positions' logits gathered from the logits the kernel wrote; or the xla path's logits row
  and ``lax.top_k``), bitwise the float32 logits the full indexer computes (each page is scored
  independently of where it sits in the table). It keeps its local top-K (logit, position)
  candidates, one ``lax.all_gather`` exchanges the TP x K pairs, and an exact merge picks the
  global top-K with the SPEC rule (descending logit, ties to the smaller position; NaN / -inf
  never selected; -1 padding). The global top-K is a subset of the union of the local top-Ks
  under that total order, so the result equals the replicated ``indexer_topk(..., sorted=True)``
  bit for bit.

  The merge uses ``lax.top_k``, documented to put the lower index first among equal values:
  scores are canonicalised first (NaN -> -inf, -0.0 -> +0.0, so equal logits compare equal),
  and the candidate list is in rank order with each rank's candidates in ascending position
  among equal scores (the Pallas selection is in ascending position; the xla one in descending
  (logit, -position) order), so "lower index first" is "smaller position first". The
  all-gather moves ``TP * B * N * K * 8`` bytes.

Semantics: docs/SPEC.md operations A and B; the TP decomposition is this module's (see
docs/SEMANTICS.md "Tensor parallelism").
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as PS

from kernels import formats as np_formats
from jax_impl._common import JAX_PATHS, check_array, check_int, check_sm_scale
from jax_impl.indexer import canonical_scores, indexer_topk, topk_candidates
from jax_impl.sparse_mla import sparse_mla_decode
from jax_impl.step import validate_step

__all__ = ["INDEXER_MODES", "heads_per_rank", "make_tp_mesh", "shard_block_table", "sequence_sharded_topk",
           "merge_candidates", "dsa_decode_step_tp"]

INDEXER_MODES = ("replicated", "sequence")


def heads_per_rank(num_heads: int, tp: int) -> int:
    """Query heads on one device: ``num_heads // tp``.

    Raises:
      TypeError: ``num_heads`` or ``tp`` not an int (Python or NumPy integer, not bool).
      ValueError: either below 1, or ``tp`` does not divide ``num_heads`` (names heads and tp).
    """
    tp = check_int("tp", tp, minimum=1)
    num_heads = check_int("heads", num_heads, minimum=1)
    if num_heads % tp:
        raise ValueError(f"heads: {num_heads} query heads cannot be split evenly over tp={tp} "
                         f"devices (heads must be a multiple of tp)")
    return num_heads // tp


def make_tp_mesh(tp: int, *, axis_name: str = "tp", devices=None) -> Mesh:
    """A 1-D mesh of the first ``tp`` devices with one axis ``axis_name``.

    Raises:
      TypeError: ``tp`` not an int. ValueError: ``tp`` outside ``[1, devices available]``
      (names both counts).
    """
    devs = list(jax.devices() if devices is None else devices)
    tp = check_int("tp", tp)
    if not 1 <= tp <= len(devs):
        raise ValueError(f"tp: expected an int in [1, {len(devs)}] (devices available), got {tp!r}")
    return Mesh(np.array(devs[:tp]), (axis_name,))


# ============================================================================ candidates

def merge_candidates(scores, positions, topk: int):
    """Exact top-``topk`` of candidate (logit, position) pairs by the SPEC rule.

    Args:
      scores: float32 ``[..., C]`` candidate logits (-inf / NaN: not a candidate).
      positions: int32 ``[..., C]`` logical positions (-1: not a candidate). Among equal scores
        the candidates must appear in ascending position (true for a rank-ordered concatenation
        of per-shard ``lax.top_k`` outputs, shards in ascending position ranges).
      topk: K.
    Returns:
      (scores float32 ``[..., topk]``, positions int32 ``[..., topk]``) in descending logit,
      ties to the smaller position, missing candidates as (-inf, -1) last.
    """
    s = canonical_scores(scores)
    s = jnp.where(positions < 0, -jnp.inf, s)
    C = s.shape[-1]
    if C < topk:
        pad = [(0, 0)] * (s.ndim - 1) + [(0, topk - C)]
        s = jnp.pad(s, pad, constant_values=-jnp.inf)
        positions = jnp.pad(positions, pad, constant_values=-1)
    vals, ci = lax.top_k(s, topk)
    pos = jnp.take_along_axis(positions, ci, axis=-1)
    return vals, jnp.where(vals == -jnp.inf, -1, pos).astype(jnp.int32)


def _page_size(k_cache, idx_q, k_format: str) -> int:
    if k_format == "fp8_indexer":
        check_array("k_cache", k_cache, ndim=2, dtypes=(jnp.uint8,))
        d_i = int(idx_q.shape[-1])
        if k_cache.shape[1] % (d_i + 4):
            raise ValueError(f"k_cache: expected P * (D_I + 4) = P * {d_i + 4} bytes per page, got "
                             f"shape {tuple(k_cache.shape)}")
        return int(k_cache.shape[1]) // (d_i + 4)
    if k_format == "dense":
        check_array("k_cache", k_cache, ndim=3)
        return int(k_cache.shape[1])
    raise ValueError(f"k_format: expected one of {np_formats.K_FORMATS}, got {k_format!r}")


def _valid_lengths(context_lens, B: int, N: int, capacity: int):
    """Per-draft valid lengths ``[B, N]`` int32 (SPEC MTP mask), clipped to ``[0, capacity]``."""
    cl = context_lens.astype(jnp.int32)
    if cl.shape == (B,):
        # clamp before the MTP offset: INT32_MIN - 1 would wrap to INT32_MAX
        lens = jnp.clip(cl, 0, capacity + N)[:, None] - (N - 1 - jnp.arange(N, dtype=jnp.int32))[None, :]
    elif cl.shape == (B, N):
        lens = cl
    else:
        raise ValueError(f"context_lens: expected shape ({B},) or ({B}, {N}), got {tuple(cl.shape)}")
    return jnp.clip(lens, 0, capacity)


def shard_block_table(block_table, lens, page_size: int, rank, world: int):
    """Device ``rank``'s share of every request's pages (traceable; ``rank`` may be traced).

    Request b spans ``n_b = ceil(max_i lens[b, i] / P)`` pages; device r takes its pages
    ``[r * s_b, (r + 1) * s_b)`` with ``s_b = ceil(n_b / world)``.

    Args:
      block_table: int32 ``[B, max_pages]``. lens: int32 ``[B, N]`` per-draft valid lengths,
        already clipped to ``[0, max_pages * P]``.
    Returns:
      (bt_local int32 ``[B, ceil(max_pages / world)]`` with -1 past the share,
      local_lens int32 ``[B, N]`` valid prefix of each draft within the share,
      offset int32 ``[B]`` logical position of the share's first slot).
    """
    B, max_pages = block_table.shape
    width = -(-max_pages // world)
    n_pages = (jnp.max(lens, axis=1) + page_size - 1) // page_size              # [B]
    share = (n_pages + world - 1) // world
    start = rank * share
    j = jnp.arange(width, dtype=jnp.int32)
    cols = start[:, None] + j[None, :]                                          # [B, width]
    ok = (j[None, :] < share[:, None]) & (cols < n_pages[:, None])
    bt_local = jnp.take_along_axis(block_table, jnp.minimum(cols, max_pages - 1), axis=1)
    bt_local = jnp.where(ok, bt_local, -1).astype(jnp.int32)
    offset = (start * page_size).astype(jnp.int32)
    local_lens = jnp.minimum(jnp.maximum(lens - offset[:, None], 0), (share * page_size)[:, None])
    return bt_local, local_lens.astype(jnp.int32), offset


def sequence_sharded_topk(idx_q, idx_weights, k_cache, block_table, context_lens, topk: int, *,
                          axis_name: str = "tp", k_format: str = "fp8_indexer", path: str = "auto"):
    """``indexer_topk(..., sorted=True)`` with the sequence split over the ``axis_name`` devices.

    Call inside ``jax.shard_map`` (or any context binding ``axis_name``) with the same
    replicated arguments on every device. Each device selects the top-``topk`` (logit,
    position) candidates of its ~1/TP share of every request's pages (:func:`shard_block_table`;
    ``jax_impl.indexer.topk_candidates``: the one-device path's kernels on the share), and one
    ``lax.all_gather`` of the TP x topk pairs plus an exact merge gives the selection.

    Args:
      idx_q: ``[B, N, H_I, D_I]`` float8_e4m3fn (float with ``k_format="dense"``).
      idx_weights: ``[B, N, H_I]`` float32 (scales folded in, SPEC).
      k_cache: ``fp8_indexer`` uint8 ``[num_pages, P * (D_I + 4)]`` or ``dense``
        ``[num_pages, P, D_I]``.
      block_table: int32 ``[B, max_pages]`` (-1 past a request's pages).
      context_lens: int32 ``[B]`` (L_b with the N new tokens) or ``[B, N]``.
      topk: K >= 1 (static).
      axis_name: the mesh axis the sequence is split over; k_format, path: as
        ``jax_impl.indexer.indexer_topk``.
    Returns:
      int32 ``[B, N, topk]`` logical positions, descending logit (ties to the smaller position),
      -1 padding last; replicated over ``axis_name``.
    Raises:
      TypeError / ValueError: bad argument (named); ``topk`` not an int (TypeError) or < 1
        (ValueError).
    """
    topk = check_int("topk", topk, minimum=1)
    check_array("idx_q", idx_q, ndim=4)
    check_array("block_table", block_table, ndim=2, dtypes=(jnp.int32,))
    B, N = int(idx_q.shape[0]), int(idx_q.shape[1])
    if block_table.shape[0] != B:
        raise ValueError(f"block_table: expected {B} rows (idx_q's B), got shape {tuple(block_table.shape)}")
    tp = lax.axis_size(axis_name)
    rank = lax.axis_index(axis_name)
    P = _page_size(k_cache, idx_q, k_format)
    lens = _valid_lengths(context_lens, B, N, int(block_table.shape[1]) * P)
    bt_local, local_lens, offset = shard_block_table(block_table, lens, P, rank, tp)
    # the shard's own top-K with its logits (the Pallas top-k kernels, or XLA's top_k over the
    # shard's logits row), in ascending position among equal scores
    s, lpos = topk_candidates(idx_q, idx_weights, k_cache, bt_local, local_lens, topk,
                              k_format=k_format, path=path)                  # [B, N, K]
    pos = jnp.where(lpos >= 0, lpos + offset[:, None, None], -1)
    all_s = lax.all_gather(s, axis_name, axis=2, tiled=True)                 # [B, N, TP*K]
    all_pos = lax.all_gather(pos, axis_name, axis=2, tiled=True)
    return merge_candidates(all_s, all_pos, topk)[1]


# ============================================================================ the TP step

@functools.lru_cache(maxsize=64)
def _build(mesh: Mesh, axis_name: str, sm_scale: float, topk: int, kv_format: str, d_v: int,
           k_format: str, indexer_mode: str, path: str, has_sink: bool):
    head = PS(None, None, axis_name, None)
    rep = PS()

    def body(q, kv_cache, idx_q, idx_weights, k_cache, block_table, context_lens, *sink):
        if indexer_mode == "replicated":
            indices = indexer_topk(idx_q, idx_weights, k_cache, block_table, context_lens, topk,
                                   k_format=k_format, sorted=True, path=path)
        else:
            indices = sequence_sharded_topk(idx_q, idx_weights, k_cache, block_table,
                                            context_lens, topk, axis_name=axis_name,
                                            k_format=k_format, path=path)
        out, lse = sparse_mla_decode(q, kv_cache, indices, sm_scale, kv_format=kv_format,
                                     d_v=d_v, block_table=block_table,
                                     attn_sink=sink[0] if has_sink else None, path=path)
        return out, lse, indices

    in_specs = (head, rep, rep, rep, rep, rep, rep) + ((PS(axis_name),) if has_sink else ())
    # check_vma=False: pallas_call outputs carry no varying-axes annotation; the indices are
    # replicated by construction (same inputs, or an all-gather + deterministic merge).
    fn = jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                       out_specs=(head, PS(None, None, axis_name), rep), check_vma=False)
    return jax.jit(fn)


def dsa_decode_step_tp(mesh: Mesh, q, kv_cache, idx_q, idx_weights, k_cache, block_table,
                       context_lens, sm_scale: float, topk: int, *, kv_format: str = "latent",
                       d_v: int = 512, attn_sink=None, k_format: str = "fp8_indexer",
                       indexer_mode: str = "replicated", axis_name: str = "tp",
                       path: str = "auto"):
    """The DSA decode step under ``jax.shard_map`` on ``mesh``'s ``axis_name`` axis.

    Arguments are those of :func:`jax_impl.step.dsa_decode_step` with the model's *full* head
    count: ``q`` ``[B, N, H, D_qk]`` and ``attn_sink`` ``[H]`` are sharded over the axis (device r
    gets heads ``[r * H/TP, (r+1) * H/TP)``, any count per device: the sparse-MLA launcher pads
    heads to its dot tile internally); ``kv_cache``, ``idx_q`` ``[B, N, H_I, D_I]``,
    ``idx_weights`` ``[B, N, H_I]``, ``k_cache``, ``block_table`` ``[B, max_pages]`` and
    ``context_lens`` are replicated. Inputs may be committed to any sharding (jit reshards);
    place them with ``NamedSharding`` beforehand to avoid per-call transfers.

    Args:
      mesh: a ``jax.sharding.Mesh`` with an axis ``axis_name`` (e.g. :func:`make_tp_mesh`).
      indexer_mode: ``"replicated"`` (every device runs the full indexer, no collective) or
        ``"sequence"`` (:func:`sequence_sharded_topk`: 1/TP of every request's pages per device,
        one all-gather of TP x K (logit, position) pairs, exact merge).
    Returns:
      ``(out [B, N, H, d_v] q.dtype sharded over heads, lse [B, N, H] float32 natural log sharded
      over heads, indices [B, N, topk] int32 replicated)``; indices are in descending logit
      (ties to the smaller position, -1 last) and identical in both modes, so out / lse are
      bitwise identical in both modes too.
    Raises:
      TypeError: ``sm_scale`` not a real scalar (Python int / float or NumPy scalar, or a
        concrete 0-d float array; never a bool, never traced: the scale is compiled in);
        ``topk`` or ``d_v`` not an int (Python or NumPy integer, not bool); ``mesh`` not a Mesh.
      ValueError: ``H`` not divisible by the axis size (names heads and tp), ``sm_scale`` NaN or
        inf (or overflowing float32), ``topk`` < 1, unknown ``indexer_mode`` / ``axis_name`` /
        ``kv_format`` / ``k_format`` / ``path``, or a bad array argument, named as this
        function names it (``idx_q`` / ``idx_weights``; ``q`` and ``idx_q`` of different B or
        N name both; :func:`jax_impl.step.validate_step`). All of these are raised before
        anything is traced or compiled.
      NotImplementedError: the named ``path`` cannot run here.
    """
    if indexer_mode not in INDEXER_MODES:
        raise ValueError(f"indexer_mode: expected one of {INDEXER_MODES}, got {indexer_mode!r}")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh: expected a jax.sharding.Mesh, got {type(mesh).__name__}")
    if axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name: expected one of the mesh axes {mesh.axis_names}, got {axis_name!r}")
    # the scalars and names are compiled in (lru_cache key of _build): validate them here, so a
    # float topk is not truncated, a NaN scale not compiled, an unhashable name not a TypeError
    # from the cache
    if kv_format not in np_formats.KV_FORMATS:
        raise ValueError(f"kv_format: expected one of {np_formats.KV_FORMATS}, got {kv_format!r}")
    if k_format not in np_formats.K_FORMATS:
        raise ValueError(f"k_format: expected one of {np_formats.K_FORMATS}, got {k_format!r}")
    if path not in JAX_PATHS:
        raise ValueError(f"path: expected one of {JAX_PATHS}, got {path!r}")
    sm_scale = check_sm_scale(sm_scale, static=True)
    topk = check_int("topk", topk, minimum=1)
    d_v = check_int("d_v", d_v, minimum=1)
    # every array as dsa_decode_step checks it, under this function's names, before tracing
    validate_step(q, kv_cache, idx_q, idx_weights, k_cache, block_table, context_lens, sm_scale,
                  topk, kv_format=kv_format, d_v=d_v, attn_sink=attn_sink, k_format=k_format,
                  path=path)
    tp = int(mesh.shape[axis_name])
    heads_per_rank(int(q.shape[2]), tp)
    fn = _build(mesh, axis_name, sm_scale, topk, kv_format, d_v, k_format, indexer_mode, path,
                attn_sink is not None)
    args = (q, kv_cache, idx_q, idx_weights, k_cache, block_table, context_lens)
    if attn_sink is not None:
        args += (attn_sink,)
    return fn(*args)
