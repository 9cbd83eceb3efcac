"""Tensor-parallel DSA decode step with torch.distributed: heads sharded, indexer replicated or
sequence-sharded.

Under tensor parallelism (TP ranks, one process and one GPU each) the query heads are split over
the ranks (``H = model heads / TP`` per rank) while the latent cache, the indexer cache, the block
table and therefore the top-k indices are the same on every rank, so sparse MLA needs no
collective: each rank attends the same positions with its own heads and returns its head shard of
``out`` / ``lse``.

The indexer is the part that grows with context. Two modes:

* ``"replicated"``: every rank runs the full ``indexer_topk`` (what SGLang, vLLM and
  TensorRT-LLM do); TP - 1 ranks repeat the dominant cost.
* ``"sequence"``: rank r scores only its share of every request's pages: request b spans
  ``n_b = ceil(L_b / P)`` pages and rank r takes pages ``[r * s_b, (r + 1) * s_b)`` of it,
  ``s_b = ceil(n_b / TP)`` (:func:`shard_block_table`, a per-request gather of the block table;
  each draft's valid length is clipped to the share). Splitting by the request's own length
  rather than by block-table columns (``[r * mp / TP, (r + 1) * mp / TP)``) keeps the ranks
  balanced when the table is sized for a longer context than the request holds (a column split
  would leave a 4K request of a 1M-wide table entirely on rank 0); for a table sized to the
  longest request the two agree up to rounding. It selects its
  local top-K candidates with their float32 logits (bitwise the logits the full indexer computes:
  the indexer kernel scores each page independently of where it sits in the table), an
  all-gather exchanges the TP x K (logit, position) pairs, and an exact merge picks the global
  top-K by the SPEC rule (descending logit, ties to the smaller position; NaN / -inf never
  selected; -1 padding). The global top-K is a subset of the union of the local top-Ks under
  that total order, so the result equals the replicated one bit for bit.

  The pairs travel packed in one int64 per candidate: the high 32 bits are the order-preserving
  signed-int32 image of the logit (NaN mapped to -inf, -0.0 to +0.0 first, so equal logits get
  equal keys), the low 32 bits ``2^32 - 1 - position``. Comparing packed keys is comparing
  (logit, -position) lexicographically, so ``torch.topk`` on the keys is exact and deterministic
  (no two valid keys are equal) and its sorted output is the SPEC's ``sorted=True`` order. Empty
  candidates carry ``INT64_MIN`` and come out as -1.

  On the triton path the shard runs the one-device fused logits + split radix top-k
  (``torch_impl.indexer.triton_select``) and the selected positions' scores are gathered from
  its logits row; the ``"torch"`` path (and non-CUDA tensors outside the interpreter)
  materialises the shard's ``[B, N, W / TP]`` float32 row with ``indexer_logits`` and reduces it
  with a packed-key ``torch.topk``. The all-gather moves only ``TP * B * N * K * 8`` bytes.

Launch (one process per rank; NCCL on GPUs, gloo on the CPU)::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
    torchrun --standalone --nproc_per_node 2 bench/tp_bench.py --torch-worker ...

and in each process ``dist.init_process_group("nccl")``, ``torch.cuda.set_device(local_rank)``,
then :func:`shard_heads` on q (and ``attn_sink``) and :func:`dsa_decode_step_tp`.

Semantics: docs/SPEC.md operations A and B; the TP decomposition is this module's (see
docs/SEMANTICS.md "Tensor parallelism").
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from kernels import formats as np_formats
from torch_impl import _common
from torch_impl.indexer import indexer_logits, indexer_topk
from torch_impl.sparse_mla import sparse_mla_decode
from kernels.scalars import check_int
from torch_impl.step import validate_step

__all__ = ["INDEXER_MODES", "heads_per_rank", "head_split", "shard_heads", "gather_heads",
           "shard_block_table", "sequence_sharded_topk", "dsa_decode_step_tp", "pack_candidates",
           "merge_candidates"]

INDEXER_MODES = ("replicated", "sequence")
_INT64_MIN = -(2 ** 63)
_LOW32 = (1 << 32) - 1


# ============================================================================ head sharding

def heads_per_rank(num_heads: int, tp: int) -> int:
    """Query heads on one rank: ``num_heads // tp``.

    Raises:
      TypeError: ``num_heads`` or ``tp`` not an int (Python or NumPy integer, not bool).
      ValueError: either below 1, or ``tp`` does not divide ``num_heads`` (names heads and tp).
    """
    tp = check_int("tp", tp, minimum=1)
    num_heads = check_int("heads", num_heads, minimum=1)
    if num_heads % tp:
        raise ValueError(f"heads: {num_heads} query heads cannot be split evenly over tp={tp} "
                         f"ranks (heads must be a multiple of tp)")
    return num_heads // tp


def head_split(num_heads: int, tp: int, head_counts=None) -> tuple[int, ...]:
    """The per-rank query-head counts of a TP split, validated: ``(num_heads // tp,) * tp``.

    A pure function of replicated values (the model's head count, the TP size and the caller's
    stated split), so every rank reaches the same verdict and raises before any collective: call
    it at set-up (:func:`shard_heads` does) rather than find out in :func:`gather_heads`, whose
    all-gather of unequal shards aborts a gloo process (NCCL hangs or reads garbage). The split
    must be even: out / lse shards are all-gathered as equal blocks, and JAX's ``shard_map``
    splits the same way (``jax_impl.tp``).

    Args:
      num_heads: the model's query heads H (>= 1).
      tp: the TP size (>= 1).
      head_counts: None, or a manual split to check: a sequence of ``tp`` ints, rank r's head
        count at r. It must sum to ``num_heads`` with every entry ``num_heads / tp``.
    Returns:
      tuple of ``tp`` ints, all ``num_heads // tp``.
    Raises:
      TypeError: ``num_heads``, ``tp`` or an entry of ``head_counts`` not an int (Python or
        NumPy integer, not bool); ``head_counts`` not a sequence.
      ValueError: ``num_heads`` or ``tp`` < 1; ``tp`` does not divide ``num_heads`` (names
        heads and tp); ``head_counts`` of the wrong length, not summing to ``num_heads`` or
        uneven (names head_counts and lists it).
    """
    tp = check_int("tp", tp, minimum=1)
    num_heads = check_int("heads", num_heads, minimum=1)
    if head_counts is None:
        return (heads_per_rank(num_heads, tp),) * tp
    if isinstance(head_counts, (str, bytes, torch.Tensor)) or not hasattr(head_counts, "__len__"):
        raise TypeError(f"head_counts: expected a sequence of {tp} ints (one per rank), got "
                        f"{type(head_counts).__name__}")
    counts = [check_int(f"head_counts[{r}]", c, minimum=0) for r, c in enumerate(head_counts)]
    if len(counts) != tp:
        raise ValueError(f"head_counts: expected {tp} per-rank head counts (one per rank, tp={tp}), "
                         f"got {len(counts)}: {counts}")
    if sum(counts) != num_heads:
        raise ValueError(f"head_counts: the per-rank head counts {counts} sum to {sum(counts)}, "
                         f"expected heads = {num_heads}")
    if num_heads % tp:
        raise ValueError(f"head_counts: {counts} is an uneven split; heads: {num_heads} query "
                         f"heads cannot be split evenly over tp={tp} ranks (heads must be a "
                         f"multiple of tp)")
    h = num_heads // tp
    if any(c != h for c in counts):
        raise ValueError(f"head_counts: expected an even split, {h} heads on each of tp={tp} "
                         f"ranks ({num_heads} heads), got {counts}")
    return (h,) * tp


def shard_heads(x: torch.Tensor, rank: int, world: int, *, dim: int = 2,
                head_counts=None) -> torch.Tensor:
    """This rank's contiguous block of heads of ``x`` (a view).

    Every check is a pure function of ``x``'s shape, ``world`` and ``head_counts`` (the same on
    every rank), so a bad split raises on every rank at set-up, before any collective.

    Args:
      x: a tensor with the model's heads on ``dim``: q ``[B, N, H, D_qk]`` (``dim=2``, default)
        or attn_sink ``[H]`` (``dim=0``).
      rank, world: this rank and the TP size; rank r gets heads ``[r * H/world, (r+1) * H/world)``.
      head_counts: None, or the caller's intended per-rank head counts (a sequence of ``world``
        ints), checked by :func:`head_split` against H: it must sum to H, evenly.
    Returns:
      ``x.narrow(dim, rank * H // world, H // world)``.
    Raises:
      TypeError: ``x`` not a tensor; ``rank``, ``world`` or ``dim`` not an int. ValueError:
      ``world`` does not divide H, ``head_counts`` does not describe that even split (see
      :func:`head_split`), ``dim`` not a dim of x, or ``rank`` outside ``[0, world)``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    dim = check_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim: expected a dim of x (shape {tuple(x.shape)}), got {dim}")
    world = check_int("world", world, minimum=1)
    h = head_split(int(x.shape[dim]), world, head_counts)[0]
    rank = check_int("rank", rank)
    if not 0 <= rank < world:
        raise ValueError(f"rank: expected an int in [0, {world}), got {rank!r}")
    return x.narrow(dim, rank * h, h)


def _all_gather(t: torch.Tensor, group) -> torch.Tensor:
    """``[world, *t.shape]`` stack of every rank's ``t`` (rank order)."""
    world = dist.get_world_size(group)
    t = t.contiguous()
    if dist.get_backend(group) == "nccl":
        out = torch.empty((world, *t.shape), dtype=t.dtype, device=t.device)
        dist.all_gather_into_tensor(out, t, group=group)
        return out
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t, group=group)
    return torch.stack(parts)


_DESC_DIMS = 8


def _check_same_shards(x: torch.Tensor, group) -> None:
    """ValueError on every rank unless every rank's ``x`` has the same shape and element size.

    One all-gather of a fixed-size int64 descriptor (same size on every rank, so it cannot
    mismatch) and a host read of it, before the all-gather of the data, which on unequal shards
    aborts a gloo process and hangs or corrupts under NCCL.
    """
    if dist.get_world_size(group) == 1:
        return
    shape = list(x.shape)
    desc = [x.dim(), x.element_size(), x.numel()] + (shape + [-1] * _DESC_DIMS)[:_DESC_DIMS]
    rows = _all_gather(torch.tensor(desc, dtype=torch.int64, device=x.device), group).cpu().tolist()
    if any(r != rows[0] for r in rows):
        got = ", ".join(f"rank {i}: {tuple(r[3:3 + min(r[0], _DESC_DIMS)])} x {r[1]} bytes"
                        for i, r in enumerate(rows))
        raise ValueError(f"x: gather_heads needs the same shard shape and dtype on every rank (an "
                         f"even head split: head_split / shard_heads), got {got}")


def gather_heads(x: torch.Tensor, group=None, *, dim: int = 2) -> torch.Tensor:
    """Concatenate every rank's head shard along ``dim`` (out ``[B, N, H_local, d_v]`` ->
    ``[B, N, H, d_v]``; lse with ``dim=2`` too). A collective: every rank must call it.

    The ranks' shard shapes are compared first (one all-gather of a small int64 descriptor and
    a host read), so an uneven manual head split raises on every rank instead of aborting the
    data all-gather.

    Raises:
      TypeError: ``x`` not a tensor. ValueError: the ranks' shards differ in shape or dtype
      size (raised on every rank; lists each rank's shape), or ``dim`` not a dim of ``x``.
    """
    _common.check_tensor("x", x)
    dim = check_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim: expected a dim of x (shape {tuple(x.shape)}), got {dim}")
    _check_same_shards(x, group)
    g = _all_gather(x, group)                                  # [world, ...]
    return torch.cat(list(g.unbind(0)), dim=dim)


# ============================================================================ candidates

def pack_candidates(scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Pack (float32 logit, int32 logical position) pairs into order-preserving int64 keys.

    ``key = (ord32(logit) << 32) | (2^32 - 1 - position)``: a larger key is a larger logit, or
    the same logit at a smaller position (SPEC tie rule). NaN is treated as -inf and -0.0 as
    +0.0 first. A pair whose position is negative or whose logit is NaN / -inf (never selected)
    gets ``INT64_MIN``.

    Args:
      scores: float32 ``[..., C]``. positions: int32 / int64 ``[..., C]``, in ``[0, 2^31)`` or -1.
    Returns:
      int64 ``[..., C]``.
    """
    s = scores.float()
    s = torch.where(torch.isnan(s), torch.full_like(s, float("-inf")), s)
    s = torch.where(s == 0.0, torch.zeros_like(s), s)                             # -0.0 -> +0.0
    bits = s.view(torch.int32).to(torch.int64)
    ord32 = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    pos = positions.to(torch.int64)
    key = ord32 * (1 << 32) + (_LOW32 - pos.clamp(min=0))
    ok = (pos >= 0) & (s != float("-inf"))
    return torch.where(ok, key, torch.full_like(key, _INT64_MIN))


def merge_candidates(keys: torch.Tensor, topk: int) -> torch.Tensor:
    """Exact top-``topk`` of packed candidate keys ``[..., C]`` (any C; C < topk pads).

    Returns int32 ``[..., topk]`` logical positions, descending logit with ties to the smaller
    position, -1 for missing candidates (always last).
    """
    C = keys.shape[-1]
    if C < topk:
        pad = torch.full((*keys.shape[:-1], topk - C), _INT64_MIN, dtype=keys.dtype, device=keys.device)
        keys = torch.cat([keys, pad], dim=-1)
    top = torch.topk(keys, topk, dim=-1, largest=True, sorted=True).values
    pos = _LOW32 - (top & _LOW32)
    return torch.where(top == _INT64_MIN, torch.full_like(pos, -1), pos).to(torch.int32)


def _page_size(k_cache: torch.Tensor, idx_q: torch.Tensor, k_format: str) -> int:
    if k_format == "fp8_indexer":
        _common.check_tensor("k_cache", k_cache, ndim=2, dtypes=(torch.uint8,))
        d_i = int(idx_q.shape[-1])
        if k_cache.shape[1] % (d_i + 4):
            raise ValueError(f"k_cache: expected P * (D_I + 4) = P * {d_i + 4} bytes per page, got "
                             f"shape {tuple(k_cache.shape)}")
        return int(k_cache.shape[1]) // (d_i + 4)
    if k_format == "dense":
        _common.check_tensor("k_cache", k_cache, ndim=3)
        return int(k_cache.shape[1])
    raise ValueError(f"k_format: expected one of {np_formats.K_FORMATS}, got {k_format!r}")


def _valid_lengths(context_lens: torch.Tensor, B: int, N: int, capacity: int) -> torch.Tensor:
    """Per-draft valid lengths ``[B, N]`` int64 (SPEC MTP mask), clipped to ``[0, capacity]``."""
    cl = context_lens.to(torch.int64)
    if cl.dim() == 1 and cl.shape[0] == B:
        lens = cl[:, None] - (N - 1 - torch.arange(N, device=cl.device))[None, :]
    elif cl.dim() == 2 and tuple(cl.shape) == (B, N):
        lens = cl
    else:
        raise ValueError(f"context_lens: expected shape ({B},) or ({B}, {N}), got {tuple(cl.shape)}")
    return lens.clamp(0, capacity)


def shard_block_table(block_table: torch.Tensor, lens: torch.Tensor, page_size: int, rank: int,
                      world: int):
    """Rank ``rank``'s share of every request's pages (device ops only, no host sync).

    Request b spans ``n_b = ceil(max_i lens[b, i] / P)`` pages; rank r takes its pages
    ``[r * s_b, (r + 1) * s_b)`` with ``s_b = ceil(n_b / world)``, so every rank scores about
    ``L_b / world`` positions of every request whatever the table's width (a column split of a
    table sized for 1M positions would leave a 4K request entirely on rank 0).

    Args:
      block_table: int32 ``[B, max_pages]``. lens: int ``[B, N]`` per-draft valid lengths,
        already clipped to ``[0, max_pages * P]``.
    Returns:
      (bt_local int32 ``[B, ceil(max_pages / world)]`` with -1 past the share,
      local_lens int64 ``[B, N]`` valid prefix of each draft within the share,
      offset int64 ``[B]`` logical position of the share's first slot).
    """
    B, max_pages = block_table.shape
    width = -(-max_pages // world)
    n_pages = (lens.max(dim=1).values + page_size - 1) // page_size          # [B]
    share = (n_pages + world - 1) // world                                    # [B]
    start = rank * share                                                      # [B]
    j = torch.arange(width, device=block_table.device)
    cols = start[:, None] + j[None, :]                                        # [B, width]
    ok = (j[None, :] < share[:, None]) & (cols < n_pages[:, None])
    bt_local = torch.gather(block_table, 1, cols.clamp(max=max(max_pages - 1, 0)))
    bt_local = torch.where(ok, bt_local, torch.full_like(bt_local, -1))
    offset = start * page_size
    local_lens = torch.minimum((lens - offset[:, None]).clamp(min=0), (share * page_size)[:, None])
    return bt_local.contiguous(), local_lens, offset


def _local_candidates(logits: torch.Tensor, local_lens: torch.Tensor, topk: int,
                      offset: torch.Tensor, path: str) -> torch.Tensor:
    """This shard's top-``topk`` candidates as packed keys ``[B, N, topk]`` int64.

    logits float32 ``[B, N, Ws]`` (-inf where invalid), local_lens int64 ``[B, N]`` (valid
    prefix of each row), offset int64 ``[B]`` = each request's first logical position in the
    shard.
    """
    B, N, Ws = logits.shape
    off = offset.to(torch.int64).view(B, 1, 1)
    j = torch.arange(Ws, device=logits.device, dtype=torch.int64)
    keys = pack_candidates(logits, j.view(1, 1, Ws) + off)
    kk = min(topk, Ws)
    top = torch.topk(keys, kk, dim=-1, sorted=False).values
    if kk < topk:
        top = torch.cat([top, torch.full((B, N, topk - kk), _INT64_MIN, dtype=top.dtype,
                                         device=top.device)], dim=-1)
    return top


def sequence_sharded_topk(idx_q: torch.Tensor, idx_weights: torch.Tensor, k_cache: torch.Tensor,
                          block_table: torch.Tensor, context_lens: torch.Tensor, topk: int, *,
                          group=None, k_format: str = "fp8_indexer", path: str = "auto") -> torch.Tensor:
    """``indexer_topk(..., sorted=True)`` computed with the sequence split over the TP ranks.

    A collective: every rank of ``group`` calls it with the same (replicated) arguments. Each
    rank scores its ~1/TP share of every request's pages (:func:`shard_block_table`) with the
    fused logits + top-k of the triton path (the ``"torch"`` path: ``indexer_logits`` and a
    packed-key ``torch.topk``), keeps its top-``topk`` (logit, position) candidates, and one all-gather of
    ``TP x B x N x topk`` int64 keys plus an exact merge gives the global selection.

    Args:
      idx_q: ``[B, N, H_I, D_I]`` float8_e4m3fn (float with ``k_format="dense"``).
      idx_weights: ``[B, N, H_I]`` float32 (scales folded in, SPEC).
      k_cache: ``fp8_indexer`` uint8 ``[num_pages, P * (D_I + 4)]`` or ``dense``
        ``[num_pages, P, D_I]``.
      block_table: int32 ``[B, max_pages]`` (-1 past a request's pages).
      context_lens: int32 ``[B]`` (L_b with the N new tokens) or ``[B, N]``.
      topk: K >= 1.
      group: the TP process group (None: the default group).
      k_format, path: as ``indexer_logits``.
    Returns:
      int32 ``[B, N, topk]`` logical positions, descending logit (ties to the smaller
      position), -1 padding last: equal to ``indexer_topk(..., sorted=True)`` on one device.
    Raises:
      TypeError / ValueError: bad argument (named); ``topk`` not an int (Python or NumPy
      integer, not bool: TypeError) or < 1 (ValueError). RuntimeError: torch.distributed is not
      initialised. All raised before the collective.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("sequence_sharded_topk: torch.distributed is not initialised "
                           "(call dist.init_process_group first)")
    topk = check_int("topk", topk, minimum=1)
    _common.check_tensor("idx_q", idx_q, ndim=4)
    _common.check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,))
    _common.check_tensor("context_lens", context_lens, dtypes=(torch.int32,))
    B, N = int(idx_q.shape[0]), int(idx_q.shape[1])
    if block_table.shape[0] != B:
        raise ValueError(f"block_table: expected {B} rows (idx_q's B), got shape {tuple(block_table.shape)}")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    P = _page_size(k_cache, idx_q, k_format)
    lens = _valid_lengths(context_lens, B, N, int(block_table.shape[1]) * P)
    bt_local, local_lens, offset = shard_block_table(block_table, lens, P, rank, world)
    cl_local = local_lens.to(torch.int32).contiguous()
    if path != "torch" and (idx_q.is_cuda or _common.interpret_mode()):
        # the fused logits + split top-k of the one-device path on this shard, then the
        # selected positions' scores (no full-row pass besides the logits kernel's own)
        from torch_impl import indexer as _tix
        _tix._validate(idx_q, idx_weights, k_cache, bt_local, cl_local, k_format, "triton", topk)
        logits, pos = _tix.triton_select(idx_q, idx_weights, k_cache, bt_local, cl_local, topk,
                                         k_format)
        pos = pos.view(B, N, topk)
        score = torch.gather(logits, -1, pos.clamp(min=0).to(torch.int64))
        glob = torch.where(pos >= 0, pos.to(torch.int64) + offset.to(torch.int64).view(B, 1, 1),
                           torch.full_like(pos, -1, dtype=torch.int64))
        keys = pack_candidates(score, glob)                                   # [B, N, topk]
    else:
        logits = indexer_logits(idx_q, idx_weights, k_cache, bt_local, cl_local,
                                k_format=k_format, path=path)
        keys = _local_candidates(logits, local_lens, topk, offset, path)      # [B, N, topk]
    allk = _all_gather(keys, group)                                       # [world, B, N, topk]
    return merge_candidates(allk.permute(1, 2, 0, 3).reshape(B, N, world * topk), topk)


# ============================================================================ the TP step

def dsa_decode_step_tp(q: torch.Tensor, kv_cache: torch.Tensor, idx_q: torch.Tensor,
                       idx_weights: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                       context_lens: torch.Tensor, sm_scale: float, topk: int, *,
                       kv_format: str = "latent", d_v: int = 512,
                       attn_sink: torch.Tensor | None = None, k_format: str = "fp8_indexer",
                       indexer_mode: str = "replicated", group=None, path: str = "auto"):
    """One DSA decode step on this TP rank (a collective in ``"sequence"`` mode).

    Arguments are those of :func:`torch_impl.step.dsa_decode_step` on one device, except that
    ``q`` ``[B, N, H_local, D_qk]`` and ``attn_sink`` ``[H_local]`` are this rank's head shard
    (:func:`shard_heads`; ``H_local = H / TP``, any count: the sparse-MLA launcher pads heads to
    its dot tile internally; a split made by hand must be that even one: check it at set-up with
    :func:`head_split`, which raises on every rank alike). ``kv_cache``, ``idx_q``
    ``[B, N, H_I, D_I]``, ``idx_weights`` ``[B, N, H_I]``, ``k_cache``, ``block_table``
    ``[B, max_pages]`` and ``context_lens`` are replicated (identical on every rank).

    Args:
      indexer_mode: ``"replicated"`` (every rank runs the full indexer; no collective) or
        ``"sequence"`` (:func:`sequence_sharded_topk`: each rank scores 1/TP of every request's
        pages, one all-gather of ``TP x B x N x topk`` int64 candidate keys, exact merge).
      group: the TP process group (None: the default group; only used by ``"sequence"``).
    Returns:
      ``(out [B, N, H_local, d_v] q.dtype, lse [B, N, H_local] float32 natural log,
      indices [B, N, topk] int32)``: out / lse are this rank's head shard, indices are
      replicated (descending logit, ties to the smaller position, -1 last) and identical in both
      modes, so out / lse are bitwise identical in both modes too.
    Raises:
      TypeError / ValueError: unknown ``indexer_mode`` (ValueError), then every argument as
        :func:`torch_impl.step.dsa_decode_step` checks it (:func:`torch_impl.step.validate_step`,
        named as this function names it: ``idx_q`` / ``idx_weights``, ``q`` and ``idx_q`` of
        different B or N, a NaN / inf or float32-overflowing ``sm_scale``, ``topk`` < 1, ...).
        All of these run before either op and before any collective.
      RuntimeError: ``"sequence"`` without an initialised torch.distributed.
      NotImplementedError: the named ``path`` cannot run here.
    """
    if indexer_mode not in INDEXER_MODES:
        raise ValueError(f"indexer_mode: expected one of {INDEXER_MODES}, got {indexer_mode!r}")
    sm_scale, topk, _ = validate_step(q, kv_cache, idx_q, idx_weights, k_cache, block_table,
                                      context_lens, sm_scale, topk, kv_format=kv_format, d_v=d_v,
                                      attn_sink=attn_sink, k_format=k_format, path=path)
    if indexer_mode == "replicated":
        indices = indexer_topk(idx_q, idx_weights, k_cache, block_table, context_lens, topk,
                               k_format=k_format, sorted=True, path=path)
    else:
        indices = sequence_sharded_topk(idx_q, idx_weights, k_cache, block_table, context_lens,
                                        topk, group=group, k_format=k_format, path=path)
    out, lse = sparse_mla_decode(q, kv_cache, indices, sm_scale, kv_format=kv_format, d_v=d_v,
                                 block_table=block_table, attn_sink=attn_sink, path=path)
    return out, lse, indices
