"""NumPy model of the index arithmetic of ``kernels.indexer.gluon_ws`` (the warp-specialised
TMA logits kernel): every global address range a launch can touch, against its allocations.

    python -m bench.gluon_ws_model            # the sweep's shapes x the --ws variants

For one launch (``gluon_ws.launch`` with ``consumers`` / ``convert`` / ``splits``; the ring slot
count from ``gluon_ws.ring_slots``) and one block table, :func:`address_ranges` evaluates, for
every program ``(b, split)`` of the grid and every step of its page range, exactly the
expressions the kernel evaluates (``_range``, ``_ws_producer``, ``_tma_page``, ``_entries``,
``_draft_step``, ``_finish_hist``):

* block-table reads: the producer's unmasked ``bt[b, start + 2 i]`` and its masked
  ``bt[b, start + 2 i + 1]``, the consumers' masked ``_entries`` (pages ``< end``);
* TMA box coordinates of the real pages (``0 <= entry < num_pages``; the others are predicated
  off): rows ``[66 e, 66 e + 64)`` x columns ``[0, 128)`` of the ``[num_pages * 66, 128]`` e4m3
  view and words ``[2112 e + 2048, + 64)`` of the float32 view, and whether they fit int32;
* logits stores (positions ``< end * 64`` of each draft row) and the recount's reads (the same
  range), histogram block stores (words ``[(b S + split) N_pad 264 + d 264, + 258)``), q / weight
  and context-length reads;
* the ring: slot ``i % NSLOT`` and phase ``(i // NSLOT) & 1`` of each step, the steps a consumer
  takes (``i % consumers``);

and reports each range's [min, max] next to its allocation (element offsets), plus the two TMA
descriptors' constraints (``cuTensorMapEncodeTiled``: global dims <= 2^32, strides multiples of
16 bytes below 2^40, box dims <= 256, inner box <= the 64-byte swizzle span, 16-byte aligned base).
Pure host arithmetic (64-bit NumPy; the int32 expressions of the kernel checked against 2^31).
"""
from __future__ import annotations

import numpy as np

PAGE = 64
DIMS = 128
ROWS_PER_PAGE = 66            # 8,448 bytes a page / 128
SCALE_WORDS = 2112            # float32 words a page
SCALE_AT = 2048               # the page's first scale word
HIST_BINS = 256
HIST_ROW = 264
INT32 = 2 ** 31


def program_ranges(lens: np.ndarray, max_pages: int, splits: int):
    """``(start, end)`` int64 ``[B, S]``: each program's page range (``kernels.indexer.gluon._range``);
    ``lens`` ``[B, N]`` the drafts' lengths (already clamped at 0)."""
    n_pages = np.minimum((lens.max(axis=1) + 63) // 64, max_pages)              # [B]
    per = (n_pages + splits - 1) // splits
    start = np.arange(splits)[None, :] * per[:, None]
    end = np.minimum(start + per[:, None], n_pages[:, None])
    return start, end


def tma_descriptor_checks(num_pages: int, base_ptr: int = 0) -> dict:
    """The two descriptors of ``gluon_ws.descriptors`` in ``cuTensorMapEncodeTiled`` terms
    (innermost first) and whether each constraint holds. ``kv``: e4m3 ``globalDim = [128,
    num_pages * 66]``, ``globalStrides = [128]`` bytes, ``boxDim = [64, 64]``, 64-byte swizzle;
    ``ks``: float32 ``globalDim = [num_pages * 2112]``, ``boxDim = [64]``. (Triton's error text,
    ``driver.c``, prints a last stride of ``shape * stride``, the tensor's byte size; it is not
    passed to the driver.)"""
    kv = dict(global_dim=[DIMS, num_pages * ROWS_PER_PAGE], strides=[DIMS], box=[64, 64],
              elem_bytes=1, swizzle_bytes=64)
    ks = dict(global_dim=[num_pages * SCALE_WORDS], strides=[], box=[64], elem_bytes=4,
              swizzle_bytes=0)
    out = {}
    for name, d in (("kv", kv), ("ks", ks)):
        ok = dict(
            global_dim=all(1 <= g <= 2 ** 32 for g in d["global_dim"]),
            strides=all(s % 16 == 0 and s < 2 ** 40 for s in d["strides"]),
            box=all(1 <= x <= 256 for x in d["box"]),
            inner_box=(d["box"][0] * d["elem_bytes"]) % 16 == 0
            and (d["swizzle_bytes"] == 0 or d["box"][0] * d["elem_bytes"] <= d["swizzle_bytes"]),
            base_aligned=base_ptr % 16 == 0,
            bytes_covered=int(np.prod(d["global_dim"], dtype=np.int64)) * d["elem_bytes"],
        )
        out[name] = dict(d, ok=ok)
    return out


def address_ranges(block_table: np.ndarray, lens: np.ndarray, num_pages: int, splits: int,
                   consumers: int, nslot: int, N: int) -> dict:
    """Every range a launch touches (see the module docstring). ``block_table`` int ``[B,
    max_pages]``, ``lens`` int ``[B, N]`` (clamped at 0 here). Returns ``{name: dict(lo, hi,
    size, ok)}`` (element offsets, ``hi`` inclusive; ``lo = hi = None`` when nothing is
    touched) and ``"ring"`` / ``"int32"`` / ``"programs"`` summaries."""
    bt = np.asarray(block_table, np.int64)
    B, max_pages = bt.shape
    lens = np.maximum(np.asarray(lens, np.int64).reshape(B, N), 0)
    NB = 1 << (N - 1).bit_length()
    start, end = program_ranges(lens, max_pages, splits)
    n_steps = (np.maximum(end - start, 0) + 1) // 2                              # [B, S]
    res = {}

    def note(name, offs, size):
        offs = np.asarray(offs, np.int64)
        if offs.size == 0:
            res[name] = dict(lo=None, hi=None, size=int(size), ok=True)
        else:
            lo, hi = int(offs.min()), int(offs.max())
            res[name] = dict(lo=lo, hi=hi, size=int(size), ok=bool(lo >= 0 and hi < size))

    # every (b, split, step) of the grid, flattened
    bb, ss = np.nonzero(n_steps > 0)
    reps = n_steps[bb, ss]
    b_i = np.repeat(bb, reps)
    s_i = np.repeat(ss, reps)
    step = np.concatenate([np.arange(r) for r in reps]) if reps.size else np.zeros(0, np.int64)
    st, en = start[b_i, s_i], end[b_i, s_i]
    pg = st + 2 * step
    # producer: bt[b, pg] unmasked, bt[b, pg + 1] when pg + 1 < end
    has1 = pg + 1 < en
    note("bt_read_producer", np.concatenate([b_i * max_pages + pg,
                                             (b_i * max_pages + pg + 1)[has1]]), B * max_pages)
    e0 = bt[b_i, pg]
    e1 = np.where(has1, bt[b_i, np.minimum(pg + 1, max_pages - 1)], -1)
    ents = np.concatenate([e0, e1])
    real = (ents >= 0) & (ents < num_pages)
    er = ents[real]
    rows = er * ROWS_PER_PAGE
    note("tma_kv_rows", np.concatenate([rows, rows + 63]), num_pages * ROWS_PER_PAGE)
    words = er * SCALE_WORDS + SCALE_AT
    note("tma_ks_words", np.concatenate([words, words + 63]), num_pages * SCALE_WORDS)
    # consumers: the entries of both pages masked at end, logits at positions < end * 64
    note("bt_read_consumer", np.concatenate([b_i * max_pages + pg, (b_i * max_pages + pg + 1)[has1]]),
         B * max_pages)
    W = max_pages * PAGE
    j_lo = pg * PAGE
    j_hi = np.minimum(pg * PAGE + 127, en * PAGE - 1)
    out_offs = []
    for d in range(N):
        base = (b_i * N + d) * W
        out_offs += [base + j_lo, base + j_hi]
    note("logits_store", np.concatenate(out_offs) if out_offs else [], B * N * W)
    note("recount_read", np.concatenate(out_offs) if out_offs else [], B * N * W)
    # every program stores its histogram block(s) (C == 0), empty range or not
    pb, ps = np.meshgrid(np.arange(B), np.arange(splits), indexing="ij")
    hb = (pb * splits + ps).reshape(-1) * (NB * HIST_ROW)
    note("hist_store", np.concatenate([hb + d * HIST_ROW + w for d in range(N)
                                       for w in (0, HIST_BINS + 1)]), B * splits * NB * HIST_ROW)
    note("q_read", [0, (B - 1) * N * 64 * DIMS + (N - 1) * 64 * DIMS + 63 * DIMS + 127],
         B * N * 64 * DIMS)
    note("w_read", [0, (B - 1) * N * 64 + (N - 1) * 64 + 63], B * N * 64)
    # int32 expressions of the kernel (j = pg * 64 + t, row = e * 66, word = e * 2112 + 2048)
    i32 = dict(position=int(max(end.max(initial=0) * PAGE, 0)) < INT32,
               tma_row=int(rows.max(initial=0)) + 63 < INT32,
               tma_word=int(words.max(initial=0)) + 63 < INT32,
               step_index=int(n_steps.max(initial=0)) < INT32)
    res["int32"] = dict(i32, ok=all(i32.values()))
    # the ring: every slot a step uses, the phase it waits for, the steps per consumer
    slots = step % nslot
    per_cons = [int(np.count_nonzero(step % consumers == c)) for c in range(consumers)]
    res["ring"] = dict(nslot=nslot, slots_used=sorted(set(slots.tolist())), max_steps=int(
        n_steps.max(initial=0)), wraps=int(n_steps.max(initial=0)) // nslot,
        steps_per_consumer=per_cons, ok=bool(slots.size == 0 or slots.max() < nslot))
    res["programs"] = dict(B=B, splits=splits, ctas=B * splits,
                           empty=int(np.count_nonzero(n_steps == 0)),
                           pages_per_program=int((end - start).max(initial=0)))
    return res


def sweep_shape(B: int, N: int, L: int, table_len: int | None, seed: int = 0):
    """The bench's indexer inputs (``bench.inputs.make_inputs``) as host arrays: every request
    owns ``ceil(L / 64)`` pages, a random permutation of the cache's pages, then -1 up to the
    table's width; lengths ``L`` (the MTP rule for N > 1). Returns ``(block_table, lens [B, N],
    num_pages)``."""
    ppr = -(-L // PAGE)
    table_pages = (table_len or L) // PAGE
    pages = B * ppr
    perm = np.random.default_rng(seed).permutation(pages)
    bt = np.full((B, table_pages), -1, np.int64)
    bt[:, :ppr] = perm.reshape(B, ppr)
    lens = np.array([[L - (N - 1 - i) for i in range(N)] for _ in range(B)], np.int64)
    return bt, lens, pages


def check_variant(shape: tuple, consumers: int, convert: str, num_splits: int | None,
                  num_sms: int = 132) -> dict:
    """:func:`address_ranges` and :func:`tma_descriptor_checks` of one sweep variant at one
    shape ``(B, N, L, table_len)`` on a device of ``num_sms`` SMs, with the launcher's split
    count (``kernels.indexer.triton.logits_splits``) and ring slots (``gluon_ws.ring_slots``):
    the same choices, from the same module constants."""
    from kernels.indexer.triton import IndexerLogitsConfig, logits_splits
    from kernels.indexer import gluon_ws as ws
    B, N, L, tab = shape
    bt, lens, pages = sweep_shape(B, N, L, tab)
    cfg = IndexerLogitsConfig(kernel="gluon_ws", ws_consumers=consumers, ws_convert=convert,
                              num_splits=num_splits)
    S = logits_splits(B, bt.shape[1], num_sms, cfg)
    nslot = ws.ring_slots(consumers, ws.CONVERTS[convert], N)
    r = address_ranges(bt, lens, pages, S, consumers, nslot, N)
    r["tma"] = tma_descriptor_checks(pages)
    r["ok"] = all(v["ok"] for k, v in r.items() if isinstance(v, dict) and "ok" in v) and all(
        all(v for k, v in d["ok"].items() if k != "bytes_covered") for d in r["tma"].values())
    r["tma_bytes_vs_cache"] = (r["tma"]["kv"]["ok"]["bytes_covered"] == pages * 8448
                               and r["tma"]["ks"]["ok"]["bytes_covered"] == pages * 8448)
    return r


def main() -> None:
    import json
    from bench.indexer_sweep import SHAPES, VARIANTS, WS_VARIANTS
    for sname, (_, B, N, L, tab) in SHAPES.items():
        for name in WS_VARIANTS:
            v = VARIANTS[name]
            if v.get("kernel") != "gluon_ws":
                continue
            r = check_variant((B, N, L, tab), v.get("ws_consumers", 2), v.get("ws_convert", "regs"),
                              v.get("num_splits"))
            ranges = {k: (d["lo"], d["hi"], d["size"]) for k, d in r.items()
                      if isinstance(d, dict) and "size" in d}
            print(json.dumps(dict(shape=sname, variant=name, ok=r["ok"],
                                  tma_bytes_vs_cache=r["tma_bytes_vs_cache"],
                                  programs=r["programs"], ring=r["ring"], ranges=ranges)))


if __name__ == "__main__":
    main()
