"""The composed DSA decode step for PyTorch: lightning indexer + exact top-k -> sparse MLA decode.

One decode step of DeepSeek sparse attention on one device (docs/SPEC.md operations A and B
chained as DeepSeek-V3.2-Exp ``inference/model.py`` ``MLA.forward`` chains them, and as the vLLM /
SGLang DSA backends do at decode):

1. ``indexer_topk`` scores every valid logical position of each request's indexer K cache and
   selects the ``topk`` best (SPEC tie rule; -1 padding);
2. ``sparse_mla_decode`` attends those logical positions through the block table (the
   logical-to-slot conversion happens inside it, ``block_table=...``).

With ``window > 0`` (DeepSeek-V4-Flash) the indexer scores the positions before each draft's
last ``window`` and those ``window`` positions are attended as well (:func:`window_split`).

The top-k is requested ``sorted=True`` (descending logit, ties to the smaller position, -1 last),
so the index list handed to sparse MLA has one canonical order: the tensor-parallel step
(:mod:`torch_impl.tp`) produces exactly this list with its sequence-sharded indexer, and sparse
MLA sums the entries in list order, so both give bitwise identical outputs.
"""
from __future__ import annotations

import torch

from kernels import formats as np_formats
from kernels.ops import BACKEND_PATHS
from kernels.scalars import check_int, check_real, topk_maximum
from torch_impl import _common
from torch_impl import indexer as _idx
from torch_impl.indexer import _validate as _idx_validate, indexer_topk
from torch_impl.sparse_mla import _validate as _mla_validate, sparse_mla_decode

__all__ = ["dsa_decode_step", "window_split"]


def check_step_scalars(sm_scale, topk) -> tuple[float, int]:
    """``(float(sm_scale), int(topk))`` after the scalar rule both stacks share
    (:mod:`kernels.scalars`; topk >= 1). NumPy scalars are converted here,
    so the ops (whose own checks want Python scalars) receive Python ones.

    Raises:
      TypeError: sm_scale or topk of the wrong type (names it, the accepted types, what came).
      ValueError: sm_scale NaN or inf, or overflowing float32; topk < 1.
    """
    return check_real("sm_scale", sm_scale), check_int("topk", topk, minimum=1)


def validate_step(q, kv_cache, idx_q, idx_weights, k_cache, block_table, context_lens,
                  sm_scale, topk, *, kv_format, d_v, attn_sink, k_format, path, window=0):
    """Every argument of a composed step (:func:`dsa_decode_step`,
    :func:`torch_impl.tp.dsa_decode_step_tp`), checked before either op runs and named as the
    step names it (``idx_q`` / ``idx_weights``, not the indexer's ``q`` / ``weights``): the
    scalars (:func:`check_step_scalars`, ``window``), ``q`` and ``idx_q`` as rank-4 tensors of
    the same ``B`` and ``N``, the indexer's arguments, the attention's arguments (with the
    indices the indexer will return), and the caches' shared page pool. Shapes, dtypes and
    devices only: no tensor value is read.

    Returns:
      ``(float(sm_scale), int(topk), int(window))``.
    Raises:
      TypeError / ValueError: the bad argument named (ValueError naming both ``q`` and ``idx_q``
        when their B or N differ; naming ``k_cache`` when its page count or page size differs
        from ``kv_cache``'s).
    """
    sm_scale, topk = check_step_scalars(sm_scale, topk)
    window = check_int("window", window, minimum=0)
    _common.check_tensor("q", q, ndim=4)
    _common.check_tensor("idx_q", idx_q, ndim=4)
    if tuple(q.shape[:2]) != tuple(idx_q.shape[:2]):
        raise ValueError(f"q, idx_q: expected the same B and N (q [B, N, H, D_qk], idx_q "
                         f"[B, N, H_I, D_I]), got q {tuple(q.shape)} and idx_q {tuple(idx_q.shape)}")
    _idx_validate(idx_q, idx_weights, k_cache, block_table, context_lens, k_format, path, topk,
                  True, names=("idx_q", "idx_weights"))
    # the attention's arguments with a stand-in of the indices the indexer returns (a stride-0
    # view: no memory, nothing launched)
    _mla_validate(q, kv_cache, torch.empty(1, dtype=torch.int32, device=q.device).expand(
        q.shape[0], q.shape[1], topk + window), sm_scale, kv_format, d_v, block_table, None,
        attn_sink, path)
    np_formats.check_shared_page_pool(tuple(kv_cache.shape), kv_format, tuple(k_cache.shape),
                                      k_format, idx_q.shape[-1])
    return sm_scale, topk, window


def _torch_window_split(context_lens: torch.Tensor, N: int, window: int):
    """Composite twin of ``kernels.layer_prep.triton._window_split_kernel`` (nine small
    launches for a 1-D ``context_lens``, four for ``window = 0``): in int64 (nothing wraps) and
    without clamping ``len_i`` at 0 first: for ``window >= 0``, ``max(max(len, 0) - window, 0) =
    max(len - window, 0)``, and a position of a negative ``len`` is negative either way (-1), so
    the clamp of the integer positions at -1 is the ``where``."""
    dev = context_lens.device
    if context_lens.dim() == 1:
        cl = context_lens[:, None] + torch.arange(1 - N, 1, device=dev)      # int64 [B, N]
    else:
        cl = context_lens.long()
    lens = torch.clamp(cl - window if window else cl, min=0).to(torch.int32)
    j = (cl[..., None] + torch.arange(-window, 0, device=dev)).clamp_(min=-1)
    return lens, j.to(torch.int32)


def _triton_window_split(context_lens: torch.Tensor, N: int, window: int, head: int = 0):
    """One launch of ``_window_split_kernel`` (grid ``(B * N,)``, one warp a program). With
    ``head`` > 0 the second tensor is ``[B, N, head + window]``: the window positions in its last
    ``window`` columns, the first ``head`` left uninitialised for the caller (the top-k's)."""
    from kernels.layer_prep import triton as tlp
    _common.device_info(context_lens.device)        # NotImplementedError where Triton cannot run
    B = context_lens.shape[0]
    lens = torch.empty((B, N), dtype=torch.int32, device=context_lens.device)
    win = torch.empty((B, N, head + window), dtype=torch.int32, device=context_lens.device)
    if B * N == 0:
        return lens, win
    two_d = context_lens.dim() == 2
    tlp._window_split_kernel[(B * N,)](
        context_lens, lens, win[..., head:], N, window, context_lens.stride(0),
        context_lens.stride(1) if two_d else 0, head + window, CL_2D=two_d,
        BLOCK_W=tlp.window_block(window), num_warps=1)
    return lens, win


@torch.library.custom_op("dsa::window_split", mutates_args=())
def _window_split_op(context_lens: torch.Tensor, N: int, window: int,
                     path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The V4 sliding window of a step (:func:`window_split`)."""
    impls = {"triton": lambda: _triton_window_split(context_lens, N, window),
             "torch": lambda: _torch_window_split(context_lens, N, window)}
    return _common.run_path("window_split", path, impls, BACKEND_PATHS["torch"])


@_window_split_op.register_fake
def _(context_lens, N, window, path):
    B = context_lens.shape[0]
    return (context_lens.new_empty((B, N), dtype=torch.int32),
            context_lens.new_empty((B, N, window), dtype=torch.int32))


def _triton_topk_window(q, weights, k_cache, block_table, context_lens, topk, window, k_format,
                        cfg):
    """Two kernels' worth of launches into one ``[B, N, topk + window]`` tensor: the window
    kernel writes the lengths and the last ``window`` columns, the indexer's logits + top-k
    (``torch_impl.indexer.triton_select``, ``out=`` the first ``topk`` columns, row stride
    ``topk + window``) the rest."""
    B, N = q.shape[:2]
    lens, sel = _triton_window_split(context_lens, N, window, head=topk)
    _idx.triton_select(q, weights, k_cache, block_table, lens, topk, k_format, cfg,
                       out=sel.view(B * N, topk + window)[:, :topk])
    return sel, lens


def _torch_topk_window(q, weights, k_cache, block_table, context_lens, topk, window, k_format):
    N = q.shape[1]
    lens, win = _torch_window_split(context_lens, N, window)
    top = _idx._torch_topk(q, weights, k_cache, block_table, lens, topk, k_format, False)
    return torch.cat([top, win], dim=-1), lens


@torch.library.custom_op("dsa::indexer_topk_window", mutates_args=())
def _indexer_topk_window_op(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                            block_table: torch.Tensor, context_lens: torch.Tensor, topk: int,
                            window: int, k_format: str,
                            path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`indexer_topk_window`: the V4 step's index list and indexer lengths in one op."""
    pl = _idx._topk_plan(q, block_table, k_cache, k_format, path, topk)
    args = (q, weights, k_cache, block_table, context_lens, topk, window, k_format)
    impls = {"triton": lambda: _triton_topk_window(*args, pl.configs.get("triton")),
             "torch": lambda: _torch_topk_window(*args)}
    return _common.run_path("indexer_topk", path, impls, pl.order)


@_indexer_topk_window_op.register_fake
def _(q, weights, k_cache, block_table, context_lens, topk, window, k_format, path):
    B, N = q.shape[:2]
    return (q.new_empty((B, N, topk + window), dtype=torch.int32),
            q.new_empty((B, N), dtype=torch.int32))


def indexer_topk_window(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                        block_table: torch.Tensor, context_lens: torch.Tensor, topk: int,
                        window: int, *, k_format: str = "fp8_indexer", path: str = "auto"):
    """A V4 step's attended positions: ``(indices, idx_lens)``, where ``indices`` int32
    ``[B, N, topk + window]`` is ``torch.cat([indexer_topk(..., idx_lens, topk), win], -1)``
    and ``(idx_lens, win) = window_split(context_lens, N, window)``, bit for bit (the same
    selected set in the same order, -1 padded, then the window's positions), without the
    concatenation: on the Triton path the window kernel writes the tail and the top-k kernels
    the head of one tensor (``out=`` with row stride ``topk + window``). ``idx_lens`` int32
    ``[B, N]``. Arguments as :func:`torch_impl.indexer.indexer_topk` (unsorted) and
    :func:`window_split`; ``window >= 0``. Device ops only (graph capturable, no host sync).

    Raises:
      TypeError / ValueError / NotImplementedError: as ``indexer_topk`` (its argument checks
        run with ``context_lens``), and ValueError for a ``window`` that is not an int >= 0 or
        with ``B * N * (topk + window) >= 2^31`` (the output's int32 offsets).
    """
    window = check_int("window", window, minimum=0)
    _idx_validate(q, weights, k_cache, block_table, context_lens, k_format, path, topk, False)
    B, N = q.shape[:2]
    # the top-k kernels write rows of topk + window int32 at int32 offsets (row * stride)
    check_int("window", window, maximum=topk_maximum(B, N) - int(topk),
              why=f"B * N * (topk + window) < 2^31 with B={B}, N={N}, topk={int(topk)}: int32 "
                  f"offsets of the output")
    return torch.ops.dsa.indexer_topk_window(q, weights, k_cache, block_table, context_lens,
                                             int(topk), window, k_format, path)


def window_split(context_lens: torch.Tensor, N: int, window: int, *, path: str = "auto"):
    """The V4 sliding window of a step: ``(indexer lengths, window positions)``, one launch
    (``dsa::window_split``: ``kernels/layer_prep/triton.py`` ``_window_split_kernel``; ``path``
    ``"torch"`` runs the nine-launch composite, ``"auto"`` the kernel where Triton runs).

    ``context_lens`` int32 ``[B]`` (L_b, counting the N new tokens: draft i's valid length is
    ``L_b - (N - 1 - i)``) or ``[B, N]`` (per-draft valid lengths, any strides). Returns int32
    ``[B, N]`` lengths ``max(len_i - window, 0)`` for the indexer and int32 ``[B, N, window]``
    positions ``len_i - window + w`` (-1 where negative), computed in int64. Device ops only (no
    host sync), so it captures in a CUDA graph and compiles with ``fullgraph=True``. The caller
    validated ``context_lens`` (dtype, shape, device) and ``window >= 0``.
    """
    return torch.ops.dsa.window_split(context_lens, int(N), int(window), path)


def dsa_decode_step(q: torch.Tensor, kv_cache: torch.Tensor, idx_q: torch.Tensor,
                    idx_weights: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                    context_lens: torch.Tensor, sm_scale: float, topk: int, *,
                    kv_format: str = "latent", d_v: int = 512,
                    attn_sink: torch.Tensor | None = None, k_format: str = "fp8_indexer",
                    window: int = 0, path: str = "auto"):
    """One DSA decode step: indexer top-k over the paged indexer cache, then sparse MLA decode.

    Args:
      q: MLA query (absorbed, MQA form), ``[B, N, H, D_qk]`` bf16 / fp16 / fp32, H = query heads
        on this device (model heads / TP), D_qk 576 (V3.2) or 512 (V4-Flash).
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
      sm_scale: softmax scale of ``q . k`` (natural-log domain), e.g. ``DSV32.sm_scale``: a
        Python int / float or NumPy integer / floating scalar, never a bool, finite.
      topk: K >= 1, the number of positions attended per draft (``index_topk``; 2048 for
        V3.2): a Python int or NumPy integer scalar, never a bool.
      kv_format: ``"latent"``, ``"fp8_ds_mla"`` or ``"fp8_model1"``.
      d_v: value width, the first ``d_v`` latent dims (512).
      attn_sink: float32 ``[H]`` or None (V4-Flash): ``out *= 1 / (1 + exp(sink_h - lse))``.
      k_format: ``"fp8_indexer"`` (default) or ``"dense"``.
      window: the V4-Flash sliding window (``DSV4_FLASH.window`` = 128; 0, the default, for
        V3.2): when > 0 the indexer scores only the positions before each draft's last
        ``window`` (``j < len_i - window``, len_i the draft's valid length) and those last
        ``window`` positions ``len_i - window .. len_i - 1`` (-1 where negative) are appended
        to its top-k, as DeepSeek-V4's attention and ``DSADecodeLayer`` do. A Python int or
        NumPy integer scalar >= 0, never a bool.
      path: ``"auto"``, ``"triton"`` or ``"torch"``, passed to both ops (a named path that cannot
        run raises; ``"auto"`` falls through).

    Returns:
      ``(out, lse, indices)``:

      * out ``[B, N, H, d_v]`` in q's dtype: softmax-weighted sum of the selected latent rows;
        0 for a draft with no valid position.
      * lse ``[B, N, H]`` float32, natural log of the softmax denominator (sink excluded);
        -inf for a draft with no valid position.
      * indices ``[B, N, topk + window]`` int32 logical positions: the top-k in descending
        indexer logit (ties to the smaller position), -1 padding last (fewer than ``topk``
        qualifying positions), then the window positions in ascending order.

    Raises:
      TypeError / ValueError: a bad argument, named as this function names it, all checked
        before either op runs (:func:`validate_step`): ``sm_scale`` / ``topk`` / ``window`` of
        the wrong type, a NaN / inf ``sm_scale`` (or one that overflows float32), ``topk`` < 1,
        ``window`` < 0; a wrong type, dtype, shape or device of ``q``, ``kv_cache``, ``idx_q``,
        ``idx_weights``, ``k_cache``, ``block_table``, ``context_lens`` or ``attn_sink``, an
        unknown ``kv_format`` / ``k_format`` / ``path``, a bad ``d_v``; ``q`` and ``idx_q`` of
        different B or N (ValueError naming both); ``k_cache`` whose page count or page size
        differs from ``kv_cache``'s (one block table addresses both;
        ``kernels.formats.check_shared_page_pool``).
      NotImplementedError: the named ``path`` cannot run on this device / shape.

    Semantics: docs/SPEC.md operations A and B; DeepSeek-V3.2-Exp ``inference/model.py``.
    """
    sm_scale, topk, window = validate_step(
        q, kv_cache, idx_q, idx_weights, k_cache, block_table, context_lens, sm_scale, topk,
        kv_format=kv_format, d_v=d_v, attn_sink=attn_sink, k_format=k_format, path=path,
        window=window)
    if window:
        idx_lens, win = window_split(context_lens, q.shape[1], window, path=path)
        top = indexer_topk(idx_q, idx_weights, k_cache, block_table, idx_lens, topk,
                           k_format=k_format, sorted=True, path=path)
        indices = torch.cat([top, win], dim=-1)
    else:
        indices = indexer_topk(idx_q, idx_weights, k_cache, block_table, context_lens, topk,
                               k_format=k_format, sorted=True, path=path)
    out, lse = sparse_mla_decode(q, kv_cache, indices, sm_scale, kv_format=kv_format, d_v=d_v,
                                 block_table=block_table, attn_sink=attn_sink, path=path)
    return out, lse, indices
