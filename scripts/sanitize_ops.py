#!/usr/bin/env python3
"""Adversarial inputs through the sparse-MLA and indexer kernels, each result checked against the
float64 reference (``kernels.reference``, SPEC tolerances via ``kernels.compare``).

Run under ``compute-sanitizer --tool memcheck`` (``scripts/gpu_run.sh sanitize:torch`` /
``sanitize:jax``; one stack per invocation), where it must report 0 errors (issues 16 / 17), or
plainly on the CPU, where the Triton kernels run in the interpreter and the Pallas kernels in
interpret mode (``tests/test_sanitize_ops.py`` runs one or two cases so the script cannot rot).

    python scripts/sanitize_ops.py                   # torch stack (Triton kernels + compat API)
    python scripts/sanitize_ops.py --stack jax       # jax stack (Pallas kernels)
    python scripts/sanitize_ops.py -k mla_slots -k idx_pages   # cases whose name contains these
    python scripts/sanitize_ops.py --list

Inputs (small shapes: memcheck runs kernels 10-50x slower):

* sparse MLA, every kv format: slot indices that are negative, -1, >= num_slots, 2^31 - 1 and
  -2^31; logical indices past the block table, into -1 pages and into page entries >= the
  page count or 2^31 - 1; ``topk_length`` 0 for one request (and all requests); NaN bytes in
  every unselected cache row (a read of a row the kernel must not read shows in the result);
  strided fp8 pages read in place (``fp8_ds_mla`` pages of P + 1 rows of 656 bytes, as
  FlashMLA's quantizer pads them, and ``fp8_model1`` pages 576 bytes beyond the padded page,
  the view starting one page into a pool of NaN bytes) through the native op, at H 16 (the
  Triton kernel) and H 64 (on sm_90 the Gluon kernels), and through
  ``torch_impl.compat.flash_mla``; the compat two-cache call (MODEL1 with ``extra_k_cache``)
  with the same adversarial slots.
* indexer (logits and top-k): -1 page entries inside the valid range, page entries >= the page
  count and 2^31 - 1, context lengths past the block table's capacity, a zero length, MTP drafts
  with 2-D context lengths.

Prints one line per case, ``PASS`` / ``FAIL`` / ``SKIP`` and the case name, then a summary;
exit status 1 when any case fails or errors, 0 otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

INT32_MAX, INT32_MIN = 2 ** 31 - 1, -(2 ** 31)


class Skip(Exception):
    """A case that cannot run here (printed SKIP, not a failure)."""


# ============================================================================ inputs

def _adversarial_slots(idx, num_slots, rng):
    """Slot indices with every out-of-range kind mixed in (about a third of the entries)."""
    import numpy as np
    idx = idx.astype(np.int64).copy()
    bad = np.array([-1, -7, num_slots, num_slots + 3, INT32_MAX, INT32_MIN, 2 ** 30])
    m = rng.random(idx.shape) < 0.33
    idx[m] = rng.choice(bad, size=int(m.sum()))
    idx[..., 0] = INT32_MAX
    idx[..., -1] = INT32_MIN
    return idx.astype(np.int32)


def _adversarial_table(bt, num_pages, rng):
    """Block-table entries past each request's pages -> -1, >= num_pages and 2^31 - 1."""
    import numpy as np
    bt = bt.copy()
    for b in range(bt.shape[0]):
        tail = np.flatnonzero(bt[b] < 0)
        if tail.size:
            bt[b, tail] = rng.choice(np.array([-1, num_pages, num_pages + 5, INT32_MAX]),
                                     size=tail.size)
    return bt.astype(np.int32)


def _mla_case(name, seed, *, kv_format, q_dtype, logical, K=64, P=16, H=16, N=1, B=3,
              tkl=True, sink=True):
    import numpy as np
    from kernels import cases
    d_qk = 512 if kv_format == "fp8_model1" else 576
    c = cases.make_mla_case(seed, B=B, N=N, H=H, d_qk=d_qk, K=K, P=P, kv_format=kv_format,
                            q_dtype=q_dtype, kv_dtype="float16" if kv_format == "latent" else "float32",
                            logical=logical, invalid="mix", topk_length=tkl, attn_sink=sink,
                            name=name)
    rng = np.random.default_rng(seed + 1)
    from kernels import formats
    P_ = formats.kv_page_size(c.kv_cache, kv_format)
    if logical:
        num_pages = c.kv_cache.shape[0]
        c.block_table = _adversarial_table(c.block_table, num_pages, rng)
        idx = c.indices.astype(np.int64)
        m = rng.random(idx.shape) < 0.1
        idx[m] = rng.choice(np.array([INT32_MAX, INT32_MIN, c.block_table.shape[1] * P_ + 1]),
                            size=int(m.sum()))
        c.indices = idx.astype(np.int32)
    else:
        num_slots = c.kv_cache.shape[0] * P_
        c.indices = _adversarial_slots(c.indices, num_slots, rng)
    return c


# ============================================================================ checks

def _check_mla(out, lse, ref_out, ref_lse, q_dtype):
    from kernels import compare
    return compare.check_mla(out, lse, ref_out, ref_lse, q_dtype=q_dtype)


def _torch_env():
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q_dtype = "bfloat16" if dev == "cuda" else "float16"     # the interpreter cannot run bf16
    return torch, dev, q_dtype


def _t(a, dev):
    from torch_impl import _common
    return None if a is None else _common.as_tensor(a, dev)


# ---------------------------------------------------------------- torch: native sparse MLA

def torch_mla_native(kv_format, logical, H=16):
    """H 64: on sm_90 the heuristic runs the Gluon kernel (kernels/sparse_mla/gluon.py)."""
    def run():
        torch, dev, qd = _torch_env()
        from torch_impl import sparse_mla_decode
        c = _mla_case(f"{kv_format}", 10 + logical + 3 * len(kv_format), kv_format=kv_format,
                      q_dtype=qd, logical=logical, H=H)
        out, lse = sparse_mla_decode(_t(c.q, dev), _t(c.kv_cache, dev), _t(c.indices, dev),
                                     c.sm_scale, kv_format=kv_format, d_v=c.d_v,
                                     block_table=_t(c.block_table, dev),
                                     topk_length=_t(c.topk_length, dev),
                                     attn_sink=_t(c.attn_sink, dev), path="triton")
        ro, rl = c.reference()
        return _check_mla(out, lse, ro, rl, qd)
    return run


def torch_mla_empty():
    """topk_length 0 for every request: every row empty (out 0, lse -inf)."""
    def run():
        import numpy as np
        torch, dev, qd = _torch_env()
        from torch_impl import sparse_mla_decode
        c = _mla_case("empty", 21, kv_format="fp8_ds_mla", q_dtype=qd, logical=True)
        c.topk_length = np.zeros_like(c.topk_length)
        out, lse = sparse_mla_decode(_t(c.q, dev), _t(c.kv_cache, dev), _t(c.indices, dev),
                                     c.sm_scale, kv_format="fp8_ds_mla",
                                     block_table=_t(c.block_table, dev),
                                     topk_length=_t(c.topk_length, dev),
                                     attn_sink=_t(c.attn_sink, dev), path="triton")
        ro, rl = c.reference()
        assert np.isneginf(rl).all()
        return _check_mla(out, lse, ro, rl, qd)
    return run


def _strided_v32(c, dev):
    """(FlashMLA view [nb, P, 1, 656] over pages of P + 1 rows, the native strided [nb, P, 656])."""
    import torch
    kv = _t(c.kv_cache, dev)                                   # [nb, P, 656] uint8
    nb, P, w = kv.shape
    buf = torch.full((nb, P + 1, w), 0xFF, dtype=torch.uint8, device=dev)   # NaN padding rows
    buf[:, :P] = kv
    view = buf[:, :P]
    return view.view(torch.float8_e4m3fn).unsqueeze(2), view


def _padded_pages(c, dev, pad):
    """The case's fp8 cache as a strided view over a pool whose pages are ``pad`` bytes further
    apart than their own bytes, starting one page into the pool; every byte outside the view
    0xFF (NaN e4m3 / scales / rope), so a read of padding or of the page before shows."""
    import torch
    kv = _t(c.kv_cache, dev)                                   # [nb, P, 656] | [nb, page_bytes]
    nb, used = kv.shape[0], kv[0].numel()
    pool = torch.full((nb + 1, used + pad), 0xFF, dtype=torch.uint8, device=dev)
    view = pool[1:, :used].view(kv.shape)
    view.copy_(kv)
    assert not view.is_contiguous()
    return view


def torch_mla_strided_native(kv_format="fp8_ds_mla", logical=False, H=16):
    """Padded fp8 pages read in place by the native op (fp8_ds_mla: FlashMLA's P + 1 rows a
    page; fp8_model1: 576 bytes beyond the padded page). H 64: on sm_90 the heuristic runs a
    Gluon kernel (fp8_ds_mla the warp-specialised one), which gets the page stride too."""
    def run():
        torch, dev, qd = _torch_env()
        from torch_impl import sparse_mla_decode
        c = _mla_case(f"strided {kv_format}", 31 + logical + len(kv_format) + H,
                      kv_format=kv_format, q_dtype=qd, logical=logical, H=H)
        if kv_format == "fp8_ds_mla" and not logical and H == 16:
            _, view = _strided_v32(c, dev)
        else:
            view = _padded_pages(c, dev, 656 if kv_format == "fp8_ds_mla" else 576)
        out, lse = sparse_mla_decode(_t(c.q, dev), view, _t(c.indices, dev), c.sm_scale,
                                     kv_format=kv_format, block_table=_t(c.block_table, dev),
                                     topk_length=_t(c.topk_length, dev),
                                     attn_sink=_t(c.attn_sink, dev), path="triton")
        ro, rl = c.reference()
        return _check_mla(out, lse, ro, rl, qd)
    return run


def torch_mla_few_heads(kv_format, logical, H=16, strided=False):
    """The few-heads Gluon kernels (kernels/sparse_mla/gluon_small.py, and its warp-specialised
    variant gluon_small_ws.py for the formats of ``configs.GLUON_SHWS_PICKED`` up to 8 heads and
    of ``configs.GLUON_SHWS16_PICKED`` at 9..16, so fp8_ds_mla at 16 heads runs the WS kernel;
    sm_90 only: elsewhere the binding runs its Triton substitute) with 2 splits, adversarial
    indices / block table and, ``strided``, padded pages read in place. Config as the heuristic
    picks it by H and format (``configs.few_heads_config``)."""
    def run():
        torch, dev, qd = _torch_env()
        from kernels.sparse_mla import configs
        from torch_impl import sparse_mla as tsm
        c = _mla_case(f"few heads {kv_format}", 61 + logical + H + len(kv_format),
                      kv_format=kv_format, q_dtype=qd, logical=logical, H=H, K=200)
        kv = (_padded_pages(c, dev, 656 if kv_format == "fp8_ds_mla" else 576) if strided
              else _t(c.kv_cache, dev))
        out, lse = tsm._triton_impl(_t(c.q, dev), kv, _t(c.indices, dev), c.sm_scale, kv_format,
                                    c.d_v, _t(c.block_table, dev), _t(c.topk_length, dev),
                                    _t(c.attn_sink, dev),
                                    config=configs.few_heads_config(H, kv_format),
                                    num_splits=2)
        ro, rl = c.reference()
        return _check_mla(out, lse, ro, rl, qd)
    return run


def _staged(run):
    """``run`` with the few-heads WS kernel's staged producer (``gluon_small_ws.RAW_STAGE`` 1:
    masked ``cp.async`` copies of the next block, which must never read an invalid row)."""
    def staged():
        from kernels.sparse_mla import gluon_small_ws
        old = gluon_small_ws.RAW_STAGE
        gluon_small_ws.RAW_STAGE = 1
        try:
            return run()
        finally:
            gluon_small_ws.RAW_STAGE = old
    return staged


def _fm_lse(lse):
    """FlashMLA lse [b, h, s_q] (+inf empty) -> native orientation [b, s_q, h] (-inf empty)."""
    import numpy as np
    from kernels import compare
    a = compare.to_numpy(lse).transpose(0, 2, 1)
    return np.where(np.isposinf(a), -np.inf, a)


def torch_compat_v32_strided():
    def run():
        torch, dev, qd = _torch_env()
        from torch_impl.compat import flash_mla
        c = _mla_case("compat", 41, kv_format="fp8_ds_mla", q_dtype=qd, logical=False)
        fm, _ = _strided_v32(c, dev)
        meta, _ = flash_mla.get_mla_metadata()
        out, lse = flash_mla.flash_mla_with_kvcache(
            _t(c.q, dev), fm, None, None, 512, meta, None, c.sm_scale, False, True,
            _t(c.indices, dev), _t(c.attn_sink, dev), topk_length=_t(c.topk_length, dev),
            path="triton")
        ro, rl = c.reference()
        return _check_mla(out, _fm_lse(lse), ro, rl, qd)
    return run


def torch_compat_two_caches():
    """MODEL1 main + extra cache (own page sizes), adversarial slots in both, topk_length and
    extra_topk_length with zeros, sink: one softmax over both caches' rows."""
    def run():
        import numpy as np
        torch, dev, qd = _torch_env()
        from kernels import formats, reference
        from torch_impl.compat import flash_mla
        a = _mla_case("m1a", 51, kv_format="fp8_model1", q_dtype=qd, logical=False, P=16, K=32)
        b = _mla_case("m1b", 52, kv_format="fp8_model1", q_dtype=qd, logical=False, P=8, K=48,
                      sink=False)
        b.q = a.q
        views = []
        for c in (a, b):
            pages = _t(c.kv_cache, dev)
            nb, pb = pages.shape
            P = formats.kv_page_size(c.kv_cache, "fp8_model1")
            views.append(torch.as_strided(pages.view(torch.float8_e4m3fn), (nb, P, 1, 584),
                                          (pb, 584, 584, 1)))
        meta, _ = flash_mla.get_mla_metadata()
        out, lse = flash_mla.flash_mla_with_kvcache(
            _t(a.q, dev), views[0], None, None, 512, meta, None, a.sm_scale, False, True,
            _t(a.indices, dev), _t(a.attn_sink, dev), extra_k_cache=views[1],
            extra_indices_in_kvcache=_t(b.indices, dev), topk_length=_t(a.topk_length, dev),
            extra_topk_length=_t(b.topk_length, dev), path="triton")
        rows, idx, off = [], [], 0
        for c in (a, b):
            r = formats.dequantize_kv(c.kv_cache, "fp8_model1")
            P = formats.kv_page_size(c.kv_cache, "fp8_model1")
            s = reference.resolve_indices(c.indices, num_slots=r.shape[0], page_size=P,
                                          topk_length=c.topk_length)
            idx.append(np.where(s >= 0, s + off, -1))
            rows.append(r)
            off += r.shape[0]
        with np.errstate(invalid="ignore"):
            ro, rl = reference.sparse_mla_decode(a.q, np.concatenate(rows)[:, None, :],
                                                 np.concatenate(idx, axis=2), a.sm_scale,
                                                 kv_format="latent", d_v=512,
                                                 attn_sink=a.attn_sink)
        return _check_mla(out, _fm_lse(lse), ro, rl, qd)
    return run


# ---------------------------------------------------------------- indexer

def _idx_case(seed, *, N=1, cl2d=False, past_table=True, zero_len=True, P=16):
    import numpy as np
    from kernels import cases
    lens = [70, 33, 0 if zero_len else 9]
    c = cases.make_indexer_case(seed, B=3, N=N, H_I=16, D_I=64, P=P, lens=lens, topk=32,
                                context_lens_2d=cl2d, neg_pages=True, name=f"idx{seed}")
    rng = np.random.default_rng(seed)
    num_pages = c.k_cache.shape[0]
    bt = c.block_table.copy()
    bt[bt < 0] = -1
    # out-of-range entries inside request 0's valid range (its page 1) and past the pages
    bt[0, 1] = num_pages + 2
    bt = _adversarial_table(bt, num_pages, rng)
    bt[1, 0] = INT32_MAX if bt.shape[1] > 0 else bt[1, 0]
    if past_table:
        # lengths past the table's capacity: drop the table's last column(s)
        bt = bt[:, : max(1, bt.shape[1] - 2)]
    c.block_table = np.ascontiguousarray(bt)
    return c


def _idx_long_case(seed, N=1):
    """Rows long enough for the top-k's split path on sm_90 (the fused first-digit histograms,
    the split pass B, the per-row kernel's in-register descent with its speculative candidate
    loads): H_I 64, D_I 128, P 64, top-k 2048, lengths 40,000 / 9,000 / 0 in a table cut to 140
    pages (8,960 positions, one page short of the 9,000 row: both long rows' lengths run past
    it and are clamped to the table in-kernel), adversarial entries past each request's pages
    and a -1 page inside request 0's range. ``N`` 2: the MTP rows, where the WS logits kernel
    runs without the histogram and the top-k's split pass A (``launch_split_hist``) makes it."""
    import numpy as np
    from kernels import cases
    c = cases.make_indexer_case(seed, B=3, N=N, H_I=64, D_I=128, P=64, lens=[40000, 9000, 0],
                                topk=2048, neg_pages=True, name=f"idx_long{seed}")
    rng = np.random.default_rng(seed)
    bt = c.block_table.copy()
    bt[bt < 0] = -1
    bt = _adversarial_table(bt, c.k_cache.shape[0], rng)
    c.block_table = np.ascontiguousarray(bt[:, : -(-9000 // 64) - 1])   # row 1 past its table
    return c


def _check_idx(logits, idx, c):
    from kernels import compare
    ref = c.reference_logits()
    res = compare.check_logits(logits, ref)
    return res.merge(compare.check_topk(idx, ref, c.topk))


def torch_indexer(N, cl2d):
    return _torch_indexer_on(lambda: _idx_case(60 + N + cl2d, N=N, cl2d=cl2d))


def torch_indexer_long(N=1):
    return _torch_indexer_on(lambda: _idx_long_case(71 + N - 1, N=N))


def torch_compat_select_topk_split():
    """``select_topk`` on two long rows (the split pass A and the split top-k:
    ``kernels.topk.triton.split_plan``), lengths past the width (clamped) and mid-row."""
    def run():
        import numpy as np
        torch, dev, _ = _torch_env()
        from kernels import compare
        from torch_impl.compat.topk import select_topk
        W, k = 40960, 2048
        x = np.random.default_rng(81).standard_normal((2, W)).astype(np.float32)
        lens = np.array([W + 1000, 30001], np.int32)
        got = select_topk(torch.from_numpy(x).to(dev), torch.from_numpy(lens).to(dev), k,
                          path="triton")
        ref = x.astype(np.float64)
        ref[1, 30001:] = -np.inf
        return compare.check_topk(got, ref, k)
    return run


def _torch_indexer_on(make_case):
    def run():
        torch, dev, _ = _torch_env()
        from torch_impl import indexer_logits, indexer_topk
        c = make_case()
        args = [_t(a, dev) for a in c.args()]
        lg = indexer_logits(*args, k_format=c.k_format, path="triton")
        ix = indexer_topk(*args, c.topk, k_format=c.k_format, path="triton")
        return _check_idx(lg, ix, c)
    return run


# ---------------------------------------------------------------- jax / pallas

def _jax_q_dtype():
    import jax
    return "bfloat16" if jax.default_backend() == "gpu" else "float16"


def jax_mla_native(kv_format, logical):
    def run():
        import jax
        from jax_impl import sparse_mla_decode
        qd = _jax_q_dtype()
        c = _mla_case(kv_format, 10 + logical + 3 * len(kv_format), kv_format=kv_format,
                      q_dtype=qd, logical=logical)
        out, lse = sparse_mla_decode(c.q, c.kv_cache, c.indices, c.sm_scale, kv_format=kv_format,
                                     d_v=c.d_v, block_table=c.block_table,
                                     topk_length=c.topk_length, attn_sink=c.attn_sink,
                                     path="pallas")
        jax.block_until_ready((out, lse))
        ro, rl = c.reference()
        return _check_mla(out, lse, ro, rl, qd)
    return run


def jax_indexer(N, cl2d):
    def run():
        import jax
        from jax_impl import indexer_logits, indexer_topk
        c = _idx_case(60 + N + cl2d, N=N, cl2d=cl2d)
        lg = indexer_logits(*c.args(), k_format=c.k_format, path="pallas")
        ix = indexer_topk(*c.args(), c.topk, k_format=c.k_format, path="pallas")
        jax.block_until_ready((lg, ix))
        return _check_idx(lg, ix, c)
    return run


# ============================================================================ cases

def cases_for(stack: str) -> list:
    """[(name, callable)] of one stack."""
    if stack == "torch":
        return [
            ("mla_slots_fp8_ds_mla", torch_mla_native("fp8_ds_mla", False)),
            ("mla_table_fp8_ds_mla", torch_mla_native("fp8_ds_mla", True)),
            ("mla_slots_fp8_model1", torch_mla_native("fp8_model1", False)),
            ("mla_table_fp8_model1", torch_mla_native("fp8_model1", True)),
            ("mla_table_latent", torch_mla_native("latent", True)),
            ("mla_h64_slots_fp8_ds_mla", torch_mla_native("fp8_ds_mla", False, H=64)),
            ("mla_h64_table_fp8_ds_mla", torch_mla_native("fp8_ds_mla", True, H=64)),
            ("mla_h64_table_fp8_model1", torch_mla_native("fp8_model1", True, H=64)),
            ("mla_topk_length_all_zero", torch_mla_empty()),
            ("mla_strided_pages_native", torch_mla_strided_native()),
            ("mla_strided_pages_fp8_model1", torch_mla_strided_native("fp8_model1")),
            ("mla_h64_strided_table_fp8_ds_mla", torch_mla_strided_native("fp8_ds_mla", True, 64)),
            ("mla_h64_strided_slots_fp8_model1", torch_mla_strided_native("fp8_model1", False, 64)),
            ("mla_few_heads_h16_slots_fp8_ds_mla", torch_mla_few_heads("fp8_ds_mla", False)),
            ("mla_few_heads_h16_table_fp8_model1", torch_mla_few_heads("fp8_model1", True)),
            ("mla_few_heads_h8_strided_table_fp8_ds_mla",
             torch_mla_few_heads("fp8_ds_mla", True, H=8, strided=True)),
            ("mla_few_heads_h24_strided_slots_fp8_model1",
             torch_mla_few_heads("fp8_model1", False, H=24, strided=True)),
            ("mla_few_heads_ws_h8_table_fp8_model1", torch_mla_few_heads("fp8_model1", True, H=8)),
            # the 16-head WS config with the producer's L2 hint (picked 2026-12-06)
            ("mla_few_heads_ws_h16_strided_table_fp8_ds_mla",
             torch_mla_few_heads("fp8_ds_mla", True, H=16, strided=True)),
            ("mla_few_heads_ws_h5_strided_slots_fp8_model1",
             torch_mla_few_heads("fp8_model1", False, H=5, strided=True)),
            # ... with the staged producer (eighteenth session)
            ("mla_few_heads_ws_staged_h16_strided_table_fp8_ds_mla",
             _staged(torch_mla_few_heads("fp8_ds_mla", True, H=16, strided=True))),
            ("mla_few_heads_ws_staged_h8_strided_slots_fp8_model1",
             _staged(torch_mla_few_heads("fp8_model1", False, H=8, strided=True))),
            ("compat_v32_strided_pages", torch_compat_v32_strided()),
            ("compat_model1_two_caches", torch_compat_two_caches()),
            ("idx_pages_past_table", torch_indexer(1, False)),
            ("idx_pages_mtp2_cl2d", torch_indexer(2, True)),
            # the top-k's split path and per-row kernel (twentieth session's speculative loads)
            ("idx_long_rows_split_topk", torch_indexer_long()),
            # N 2: the WS logits kernel without the histogram, the split pass A (2026-12-07)
            ("idx_long_rows_mtp2_split_pass_a", torch_indexer_long(2)),
            ("compat_select_topk_split_pass_a", torch_compat_select_topk_split()),
        ]
    return [
        ("mla_slots_fp8_ds_mla", jax_mla_native("fp8_ds_mla", False)),
        ("mla_table_fp8_ds_mla", jax_mla_native("fp8_ds_mla", True)),
        ("mla_slots_fp8_model1", jax_mla_native("fp8_model1", False)),
        ("mla_table_fp8_model1", jax_mla_native("fp8_model1", True)),
        ("mla_table_latent", jax_mla_native("latent", True)),
        ("idx_pages_past_table", jax_indexer(1, False)),
        ("idx_pages_mtp2_cl2d", jax_indexer(2, True)),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/sanitize_ops.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--stack", choices=("torch", "jax"), default="torch",
                    help="torch: Triton kernels and the compat API; jax: Pallas kernels")
    ap.add_argument("-k", action="append", default=[],
                    help="run only cases whose name contains this (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the case names and exit")
    args = ap.parse_args(argv)

    from parity.machine import prepare_environment
    gpu = prepare_environment()          # the interpreters on the CPU, before kernel imports
    todo = [(n, f) for n, f in cases_for(args.stack) if not args.k or any(k in n for k in args.k)]
    if args.list:
        print("\n".join(n for n, _ in todo))
        return 0
    if not todo:
        print(f"no case matches {args.k}", file=sys.stderr)
        return 2
    where = "GPU" if gpu else "CPU interpreter"
    alloc = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "0") != "0"
    print(f"sanitize_ops: stack {args.stack} on the {where}; {len(todo)} cases"
          + ("; torch caching allocator off" if alloc else ""), flush=True)
    n_fail = n_skip = 0
    for name, fn in todo:
        t0 = time.perf_counter()
        try:
            res = fn()
        except Skip as e:
            n_skip += 1
            print(f"SKIP {args.stack}/{name}: {e}", flush=True)
            continue
        except Exception as e:  # noqa: BLE001 - an error is a failed case, the run goes on
            n_fail += 1
            print(f"FAIL {args.stack}/{name}: error {type(e).__name__}: {str(e)[:300]}", flush=True)
            traceback.print_exc(limit=3, file=sys.stderr)
            continue
        dt = time.perf_counter() - t0
        if res.passed:
            print(f"PASS {args.stack}/{name} ({dt:.1f} s; worst error / tolerance "
                  f"{res.ratio:.3g}{'; ' + res.message if res.message else ''})", flush=True)
        else:
            n_fail += 1
            print(f"FAIL {args.stack}/{name}: {res.message[:400]}", flush=True)
    n_pass = len(todo) - n_fail - n_skip
    print(f"sanitize_ops {args.stack}: {n_pass} passed, {n_fail} failed, {n_skip} skipped",
          flush=True)
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
