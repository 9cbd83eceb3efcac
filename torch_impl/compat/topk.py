"""The top-k the serving engines run after the indexer logits, on this project's exact top-k.

vLLM (``vllm/model_executor/layers/sparse_attn_indexer.py``, decode branch, after
``fp8_fp4_paged_mqa_logits``) calls one of three ops, each writing into a slice of its
persistent ``topk_indices_buffer``:

- ``torch.ops._C.persistent_topk(logits, seq_lens, topk_indices, workspace, k, max_seq_len)``
  when ``k`` is 512 / 1024 / 2048 on CUDA (the sm_120 case);
- ``torch.ops._C.cooperative_topk(logits, seq_lens, topk_indices, workspace, k, max_seq_len)``
  for at most 32 rows on sm_90 / sm_100 (not on the sm_120 family);
- ``vllm._custom_ops.top_k_per_row_decode(logits, next_n, seq_lens, topk_indices, num_rows,
  stride0, stride1, topk_tokens)`` otherwise.

SGLang's NSA indexer (``sgl_kernel``) calls ``fast_topk_v2(score, lengths, topk,
row_starts=None)`` or ``fast_topk_transform_fused(score, lengths, page_table_size_1,
cu_seqlens_q, topk, row_starts=None)`` (the fused form maps each selected position through the
request's page-size-1 table).

All of them select, per logits row r, the positions of the ``k`` largest logits among the first
``len[r]`` positions; the rest of the row is -1. Here the selection is exact (SPEC "Operation A":
NaN and -inf never selected, ties to the smaller position) and the output order is unspecified,
as in the engines (the attention that consumes the indices sums over them). Backed by the radix
top-k kernel ``kernels.topk.triton.launch_topk`` (no host sync, CUDA-graph capturable) where
Triton runs, else an exact PyTorch top-k over unique (logit, position) keys.
"""
from __future__ import annotations

import torch
from kernels.ops import BACKEND_PATHS

from kernels.scalars import check_int
from torch_impl import _common
from torch_impl.compat._names import own_names
from torch_impl.indexer import _POS_BITS, _order_key

__all__ = ["select_topk", "top_k_per_row_decode", "persistent_topk", "cooperative_topk",
           "fast_topk_v2", "fast_topk_transform_fused"]


def _torch_select(logits: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor):
    R, W = logits.shape
    pos = torch.arange(W, device=logits.device)
    ok = (~torch.isnan(logits) & (logits != float("-inf"))
          & (pos[None, :] < lengths.long()[:, None]))
    key = torch.where(ok, _order_key(logits), torch.zeros_like(pos))
    comp = (key << _POS_BITS) | ((1 << _POS_BITS) - 1 - pos)
    kk = min(k, W)
    top = torch.topk(comp, kk, dim=1, sorted=True).values
    low = (1 << _POS_BITS) - 1
    sel = torch.where((top >> _POS_BITS) > 0, low - (top & low), torch.full_like(top, -1))
    out[:, :kk] = sel.to(torch.int32)
    if kk < k:
        out[:, kk:] = -1
    return out


def select_topk(logits: torch.Tensor, lengths: torch.Tensor, k: int,
                out: torch.Tensor | None = None, *, path: str = "auto") -> torch.Tensor:
    """Exact top-k positions of each row's valid prefix.

    Args:
      logits: float32 ``[R, W]`` (bf16 / fp16 widened), any row stride, last dim contiguous.
      lengths: int ``[R]``: row r's valid prefix ``[0, lengths[r])`` (clamped to ``[0, W]``).
      k: top-k width (>= 1).
      out: int32 ``[R, k]`` with contiguous last dim to write into (any row stride), or None.
      path: ``"auto"`` (Triton where it runs, else torch), ``"triton"`` or ``"torch"``.
    Returns:
      int32 ``[R, k]``: selected positions (order unspecified), then -1.

    On the Triton path, few long rows (``kernels.topk.triton.split_plan``: fewer than two
    programs an SM, rows of at least 4,096 positions) run split over programs (the split pass A,
    then the split top-k); otherwise one program a row. Same set either way.
    """
    _common.check_tensor("logits", logits, ndim=2,
                         dtypes=(torch.float32, torch.bfloat16, torch.float16))
    R, W = logits.shape
    check_int("k", k, minimum=1)
    _common.check_tensor("lengths", lengths, shape=(R,), dtypes=(torch.int32, torch.int64),
                         device=logits.device)
    if out is None:
        out = torch.empty((R, k), dtype=torch.int32, device=logits.device)
    _common.check_tensor("out", out, shape=(R, k), dtypes=(torch.int32,), device=logits.device)
    if logits.dtype != torch.float32 or logits.stride(1) != 1:
        logits = logits.float().contiguous()
    lens = lengths.clamp(0, W).to(torch.int32).contiguous()   # (clamped first: int64 >= 2^31)
    if R == 0:
        return out

    def triton():
        from kernels import hardware
        from kernels.topk.triton import hist_shape, launch_split_hist, launch_topk, split_plan
        dev = _common.device_info(logits.device)
        hardware.require_arch(dev, "select_topk (triton)")
        dst = out if out.stride(1) == 1 else torch.empty((R, k), dtype=torch.int32,
                                                         device=logits.device)
        scratch = torch.empty((R, W), dtype=torch.int32, device=logits.device)
        plan = split_plan(R, W, dev.num_sms)
        if plan is None:                 # one program a row
            launch_topk(logits, lens, k, dst, scratch)
        else:                            # few, long rows: passes A and B split over programs
            page, splits = plan
            hist = torch.empty(hist_shape(R, splits, 1), dtype=torch.int32,
                               device=logits.device)
            launch_split_hist(logits, lens, hist, page_size=page)
            launch_topk(logits, lens, k, dst, scratch, hist=hist, page_size=page,
                        num_sms=dev.num_sms)
        if dst is not out:
            out.copy_(dst)
        return out

    impls = {"triton": triton, "torch": lambda: _torch_select(logits, lens, k, out)}
    return _common.run_path("select_topk", path, impls, BACKEND_PATHS["torch"])


def _row_lengths(seq_lens: torch.Tensor, num_rows: int, next_n: int | None) -> torch.Tensor:
    """Per-row valid lengths: ``seq_lens`` with one entry per row (2-D ``[B, next_n]``
    flattened, or ``[num_rows]``), else the decode rule of a 1-D ``[B]``: row ``r = b * next_n
    + i`` sees ``seq_lens[b] - next_n + i + 1`` positions."""
    if seq_lens.numel() == num_rows and (seq_lens.dim() == 2 or next_n in (None, 1)):
        return seq_lens.reshape(num_rows)
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens: expected [B, next_n] with B * next_n = {num_rows} rows, or "
                         f"[B], got shape {tuple(seq_lens.shape)}")
    B = seq_lens.shape[0]
    n = next_n if next_n is not None else (num_rows // B if B and num_rows % B == 0 else 0)
    if n < 1 or B * n != num_rows:
        raise ValueError(f"seq_lens: {B} requests do not split {num_rows} logits rows into "
                         f"next_n = {next_n} drafts each")
    r = torch.arange(num_rows, device=seq_lens.device)
    return seq_lens.long()[r // n] - n + (r % n) + 1


_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT_DTYPES = (torch.int32, torch.int64)


def _check_indices_buffer(name: str, buf, rows: int, cols: int, device) -> None:
    """An int32 2-D output buffer with at least ``rows`` rows and ``cols`` columns (the op
    writes its ``[:rows, :cols]`` slice), named ``name``."""
    _common.check_tensor(name, buf, ndim=2, dtypes=(torch.int32,), device=device)
    if buf.shape[0] < rows or buf.shape[1] < cols:
        raise ValueError(f"{name}: expected shape (>= {rows}, >= {cols}) (the slice "
                         f"[:{rows}, :{cols}] is written), got {tuple(buf.shape)}")


def top_k_per_row_decode(logits: torch.Tensor, next_n: int, seq_lens: torch.Tensor,
                         topk_indices: torch.Tensor, num_rows: int, stride0: int, stride1: int,
                         topk_tokens: int) -> None:
    """vLLM's ``_custom_ops.top_k_per_row_decode``: writes ``topk_indices[:num_rows,
    :topk_tokens]`` (int32, -1 padded) in place.

    Args:
      logits: float32 ``[rows, W]`` tensor read as ``[num_rows, W]`` with element strides
        ``(stride0, stride1)`` from its storage offset (vLLM passes ``logits.stride()``).
        ``num_rows <= rows`` and the strided view must stay inside the elements ``logits``
        spans (ValueError naming ``num_rows`` / ``stride0`` / ``stride1`` otherwise).
      next_n: drafts per request (>= 1). seq_lens: int32 ``[B]`` (row ``b * next_n + i`` sees
        ``seq_lens[b] - next_n + i + 1`` positions) or ``[B, next_n]`` (per row).
      topk_indices: int32 ``[>= num_rows, >= topk_tokens]`` output buffer.
      num_rows, stride0, stride1: ints >= 0; topk_tokens: int >= 1.
    """
    _common.check_tensor("logits", logits, ndim=2, dtypes=_FLOAT_DTYPES)
    check_int("next_n", next_n, minimum=1)
    num_rows = check_int("num_rows", num_rows, minimum=0)
    stride0 = check_int("stride0", stride0, minimum=0)
    stride1 = check_int("stride1", stride1, minimum=0)
    topk_tokens = check_int("topk_tokens", topk_tokens, minimum=1)
    R, W = logits.shape
    if num_rows > R:
        raise ValueError(f"num_rows: expected <= logits.shape[0] = {R}, got {num_rows}")
    if num_rows and W:
        # the last element the view reads vs the last element logits itself spans
        # (both relative to its storage offset): never read past the tensor
        span = sum((n - 1) * st for n, st in zip(logits.shape, logits.stride()))
        for name, last in (("stride1", (W - 1) * stride1),
                           ("stride0", (num_rows - 1) * stride0 + (W - 1) * stride1)):
            if last > span:
                raise ValueError(
                    f"{name}: expected a [{num_rows}, {W}] view with strides ({stride0}, "
                    f"{stride1}) inside logits (shape {tuple(logits.shape)}, strides "
                    f"{logits.stride()}: last element {span}), got {name} = "
                    f"{stride0 if name == 'stride0' else stride1} (last element {last})")
    _common.check_tensor("seq_lens", seq_lens, dtypes=_INT_DTYPES, device=logits.device)
    _check_indices_buffer("topk_indices", topk_indices, num_rows, topk_tokens, logits.device)
    view = torch.as_strided(logits, (num_rows, W), (stride0, stride1), logits.storage_offset())
    lens = _row_lengths(seq_lens, num_rows, next_n)
    with own_names({"lengths": "seq_lens", "k": "topk_tokens", "out": "topk_indices"}):
        select_topk(view, lens, topk_tokens, topk_indices[:num_rows, :topk_tokens])


def persistent_topk(logits: torch.Tensor, seq_lens: torch.Tensor, topk_indices: torch.Tensor,
                    workspace: torch.Tensor, k: int, max_seq_len: int) -> None:
    """vLLM's ``torch.ops._C.persistent_topk``: writes ``topk_indices[:, :k]`` for every logits
    row in place; ``workspace`` is unused.

    Args:
      logits: float32 ``[R, W]``. seq_lens: int ``[R]`` / ``[B, next_n]`` (one per row) or
        ``[B]`` (the decode rule of :func:`top_k_per_row_decode`).
      topk_indices: int32 ``[>= R, >= k]``. k: int >= 1.
      max_seq_len: int >= 0: only the first ``min(max_seq_len, W)`` positions of a row are
        read (vLLM passes the batch's longest sequence; a value above W reads the whole row).
    """
    _common.check_tensor("logits", logits, ndim=2, dtypes=_FLOAT_DTYPES)
    k = check_int("k", k, minimum=1)
    max_seq_len = check_int("max_seq_len", max_seq_len, minimum=0)
    R, W = logits.shape
    _common.check_tensor("seq_lens", seq_lens, dtypes=_INT_DTYPES, device=logits.device)
    _check_indices_buffer("topk_indices", topk_indices, R, k, logits.device)
    view = logits[:, : min(max_seq_len, W)]
    with own_names({"lengths": "seq_lens", "out": "topk_indices"}):
        select_topk(view, _row_lengths(seq_lens, R, None), k, topk_indices[:R, :k])


def cooperative_topk(logits, seq_lens, topk_indices, workspace, k, max_seq_len) -> None:
    """vLLM's ``torch.ops._C.cooperative_topk``: the same contract as :func:`persistent_topk`."""
    persistent_topk(logits, seq_lens, topk_indices, workspace, k, max_seq_len)


def fast_topk_v2(score: torch.Tensor, lengths: torch.Tensor, topk: int,
                 row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """SGLang ``sgl_kernel.fast_topk_v2`` (paged / decode form): int32 ``[R, topk]`` positions
    of the top-k of ``score[r, :lengths[r]]``, -1 padded. Any topk (SGLang: 2048 only).
    ``row_starts`` (the ragged prefill form) is not provided."""
    if row_starts is not None:
        raise NotImplementedError("fast_topk_v2: row_starts (ragged prefill) is not provided")
    with own_names({"logits": "score", "k": "topk"}):
        return select_topk(score, lengths, topk)


def fast_topk_transform_fused(score: torch.Tensor, lengths: torch.Tensor,
                              page_table_size_1: torch.Tensor, cu_seqlens_q: torch.Tensor,
                              topk: int, row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """SGLang ``sgl_kernel.fast_topk_transform_fused`` (decode form): the top-k positions of
    each row mapped through its request's page-size-1 table,
    ``dst[r, j] = page_table_size_1[req(r), pos[r, j]]``, -1 kept (and -1 for a position past
    the table's width). ``req(r)`` is r when the table has one row per score row, else the
    request whose ``cu_seqlens_q`` range holds r.
    ``row_starts`` (ragged prefill) is not provided.

    Args:
      score: float32 ``[R, W]``. lengths: int ``[R]``. topk: int >= 1.
      page_table_size_1: int32 ``[num_reqs, width]``, ``num_reqs >= 1`` when R > 0.
      cu_seqlens_q: int32 / int64 1-D or None; required when ``num_reqs != R``: then
        ``[num_reqs + 1]``, starting at 0, non-decreasing, ending at R (request i owns score
        rows ``[cu_seqlens_q[i], cu_seqlens_q[i + 1])``). Its values are checked eagerly
        (one host read) except while a CUDA graph is being captured or under torch.compile;
        there a bad value still maps each row to a table row in range (clamped), never past it.
    """
    if row_starts is not None:
        raise NotImplementedError("fast_topk_transform_fused: row_starts (ragged prefill) is "
                                  "not provided")
    with own_names({"logits": "score", "k": "topk"}):
        pos = select_topk(score, lengths, topk)
    R = score.shape[0]
    _common.check_tensor("page_table_size_1", page_table_size_1, ndim=2,
                         dtypes=(torch.int32,), device=score.device)
    table = page_table_size_1
    n_req = table.shape[0]
    if cu_seqlens_q is not None:
        _common.check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=_INT_DTYPES,
                             device=score.device)
    if R == 0:
        return pos
    if n_req == 0:
        raise ValueError(f"page_table_size_1: expected at least one row (one per request) for "
                         f"{R} score rows, got shape {tuple(table.shape)}")
    if n_req != R:
        if cu_seqlens_q is None:
            raise ValueError(f"cu_seqlens_q: required when page_table_size_1 has {n_req} rows "
                             f"and score has {R} (maps score rows to requests), got None")
        if cu_seqlens_q.shape[0] != n_req + 1:
            raise ValueError(f"cu_seqlens_q: expected shape ({n_req + 1},) (page_table_size_1 "
                             f"rows + 1), got {tuple(cu_seqlens_q.shape)}")
        if not _common.capturing():
            cu = cu_seqlens_q.tolist()
            if cu[0] != 0 or cu[-1] != R or any(a > b for a, b in zip(cu, cu[1:])):
                raise ValueError(f"cu_seqlens_q: expected non-decreasing offsets from 0 to the "
                                 f"{R} score rows, got {cu}")
        req = torch.searchsorted(cu_seqlens_q[1:].long().contiguous(),
                                 torch.arange(R, device=score.device), right=True)
        table = table[req.clamp(min=0, max=n_req - 1)]
    if table.shape[1] == 0:
        return torch.full_like(pos, -1)
    ok = (pos >= 0) & (pos < table.shape[1])
    slot = torch.gather(table, 1, torch.where(ok, pos, 0).long())
    return torch.where(ok, slot, -1).to(torch.int32)
