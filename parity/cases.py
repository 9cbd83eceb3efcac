"""The grid of named parity cases, built from :mod:`kernels.cases`.

A :class:`ParityCase` is one (name, op) pair with a lazy builder: nothing is generated until a
case survives the command-line filters, and a case's inputs depend only on its name, the run's
``--seed``, the mode (quick / default / full) and the machine class (CPU interpreter / GPU), so
``python -m parity --case <name> --seed <seed>`` rebuilds exactly the inputs of a failing run.

Groups (name prefixes):

* ``mla/<preset>/...``: sparse MLA decode at the DeepSeek-V3.2 (D_qk 576, ``fp8_ds_mla``) and
  V4-Flash (D_qk 512, ``fp8_model1``, attention sink) dimensions, block-table addressing, plus the
  ``latent`` layout in the low-precision q dtype of the machine (bf16 on a GPU, fp16 on the CPU);
  ``.../indexer_indices`` attends the index set the reference indexer picks on cache contents
  with serving-like structure (see :func:`make_step_case`).
* ``mla/<kv_format>/<corner>``: every SPEC corner case of :func:`kernels.cases.mla_corner_cases`
  (invalid indices first / middle / all / out of range, zero-length requests, K > L, page sizes
  1, 2, 61, N = 4, topk_length, sinks, duplicates, NaN-filled unselected rows) in ``fp8_ds_mla``,
  and the layout-dependent ones (:data:`_LAYOUT_MLA`) in ``latent`` and ``fp8_model1`` (all of
  them in every layout with ``--full`` and on a GPU; ``--quick`` runs a handful).
* ``mla/varlen/...``: random variable-length batches, all invalid-index kinds mixed.
* ``idx/<preset>/...``, ``idx/corner/<corner>``, ``idx/varlen/...``: the indexer
  (``indexer_logits`` and ``indexer_topk`` rows; on the CPU by default the logits of the corner
  cases only where their -inf / NaN pattern is the point, :data:`_MASK_IDX`) at H_I 64 / D_I 128 /
  P 64, every SPEC corner case
  of :func:`kernels.cases.indexer_corner_cases` (ties, NaN keys, stale pages, -1 pages, K > L,
  MTP masks, tables much wider than L, N = 1..4), random varlen batches.
* ``step/<preset>/...``: the composed decode step (``dsa_decode_step``): the path's own
  ``indexer_topk`` picks logical positions on structured cache contents, and the path's own
  ``sparse_mla_decode`` attends them through the shared block table.
* ``layer/<preset>/<case>_<dtype>``: one step of the whole decode layer (``dsa_decode_layer``:
  ``torch_impl.layer.DSADecodeLayer`` / ``jax_impl.layer.DSADecodeLayer`` with ``path=<name>``)
  on the cases of :func:`kernels.layer_reference.layer_parity_cases`, checked by
  :mod:`kernels.layer_compare` against :func:`kernels.layer_reference.layer_reference`. On the
  CPU the configs are ``scaled_down()`` (4 heads, hidden 256; D_qk, d_v, D_I, rope and cache
  formats real) in float32; on a GPU the two fp8 cases run at the real preset dimensions (B = 2,
  one request longer than top-k + window, one shorter) in bf16 (``--full``: also float32).

On the CPU everything is small enough for the interpreters (MLA heads 16, K 64..256, contexts up
to 2K) while D_qk stays 576 / 512, D_I 128 and the byte formats are the real ones; on a GPU the
presets run at their real head counts (TP 1; ``--full`` adds TP 2, 4, 8), top-k widths and
contexts (16K; 64K with ``--full``), with bf16 q and latent. The budget on the CPU is the
interpreters' compile time per distinct shape (Pallas interpret mode: 2..6 s of CPU per call),
which is why the default CPU grid runs subsets of the layout-independent corner cases.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np

from kernels import cases as kcases
from kernels import formats, layer_compare, reference
from kernels import layer_reference as lref
from kernels.presets import DSV32, DSV4_FLASH, ModelPreset

MODES = ("quick", "default", "full")


# ============================================================================ case records

@dataclass
class StepCase:
    """Inputs of one composed decode step; ``mla.indices`` is unused (the path's top-k is).

    ``window``: the V4 sliding window the step is called with (``dsa_decode_step(window=...)``;
    0: none): the indexer scores the positions before each draft's last ``window``, and those
    positions are appended to its top-k (:meth:`window_indices`). ``sorted``: the check also
    requires the top-k part in descending logit order, the order the step requests from the
    indexer (off in the grid: on a GPU the order of neighbours a few float32 ulps apart is the
    kernel's rounding, not an error).
    """

    name: str
    indexer: kcases.IndexerCase     # block_table / context_lens shared with the MLA cache
    mla: kcases.MLACase             # q, kv_cache, sm_scale, kv_format, attn_sink (indices empty)
    window: int = 0
    sorted: bool = False

    def _draft_lengths(self) -> np.ndarray:
        i = self.indexer
        return reference.valid_lengths(i.context_lens, *i.q.shape[:2])

    def reference_logits(self) -> np.ndarray:
        """float64 indexer logits over the positions the step's indexer scores (each draft's
        valid length less the window)."""
        if not self.window:
            return self.indexer.reference_logits()
        i = self.indexer
        lens = np.maximum(self._draft_lengths() - self.window, 0).astype(np.int32)
        return reference.indexer_logits(i.q, i.weights, i.k_cache, i.block_table, lens,
                                        k_format=i.k_format)

    def window_indices(self) -> np.ndarray:
        """int32 ``[B, N, window]``: the window positions the step appends after its top-k."""
        return lref.window_indices(self._draft_lengths(), self.window)

    def mla_reference(self, indices: np.ndarray):
        """float64 (out, lse) of sparse MLA over ``indices`` (logical, through the block table)."""
        m = self.mla
        return reference.sparse_mla_decode(m.q, m.kv_cache, indices, m.sm_scale,
                                           kv_format=m.kv_format, d_v=m.d_v,
                                           block_table=self.indexer.block_table,
                                           attn_sink=m.attn_sink)


@dataclass
class LayerParityCase:
    """Inputs of one decode-layer step (``dsa_decode_layer``).

    ``case`` is a :class:`kernels.layer_reference.LayerCase` (full, unsharded float32 weights,
    already rounded to bf16 / fp16 values when ``dtype`` is one, so the reference is fed exactly
    what the layers hold); ``dtype`` is the layers' activation / linear-weight dtype; ``tp`` the
    tensor-parallel size: the runner builds every rank and returns each rank's outputs plus the
    sum of their partial ``out`` (see :mod:`parity.runners`). ``params`` are the row's shape
    fields (as :attr:`ParityCase.params`).
    """

    name: str
    case: lref.LayerCase
    dtype: str = "float32"
    tp: int = 1
    params: dict = field(default_factory=dict)

    @property
    def low_precision(self) -> bool:
        """bf16 / fp16 layers get :func:`kernels.layer_compare.check_low_precision_step`."""
        return self.dtype in layer_compare.LOW_PRECISION


def built_shape(case) -> dict:
    """Shape fields (B, N, L, P) of a built ``kernels.cases`` MLA / indexer case, for result rows
    whose grid entry could not know them before building (the corner cases); {} otherwise."""
    out = {}
    q = getattr(case, "q", None)
    if q is None or np.ndim(q) != 4:
        return out
    out["B"], out["N"] = int(q.shape[0]), int(q.shape[1])
    cl = getattr(case, "context_lens", None)
    if cl is not None and np.size(cl):
        out["L"] = int(np.max(cl))
    if isinstance(case, kcases.MLACase):
        out["P"] = int(formats.kv_page_size(case.kv_cache, case.kv_format))
    elif isinstance(case, kcases.IndexerCase):
        kc = case.k_cache
        out["P"] = int(kc.shape[1] if case.k_format == "dense" else kc.shape[1] // (q.shape[3] + 4))
    return out


@dataclass
class ParityCase:
    """One named (case, op) of the grid.

    ``build()`` returns the inputs (``kernels.cases.MLACase`` / ``IndexerCase`` or
    :class:`StepCase`), memoised and shared by the ops of one input set; ``params`` are the
    shape fields written into every result row (preset, B, N, H, K, L, P, kv_format, q_dtype).
    """

    name: str
    op: str
    builder: Callable[[], object]
    params: dict = field(default_factory=dict)

    def build(self):
        return self.builder()

    @property
    def q_dtype(self) -> str:
        return self.params.get("q_dtype", "float32")


class _Memo:
    """Zero-argument memoised builder with a lazily computed reference beside it."""

    def __init__(self, fn):
        self.fn = fn

    @cached_property
    def value(self):
        return self.fn()

    def __call__(self):
        return self.value


def case_seed(seed: int, name: str) -> int:
    """Per-case seed: stable under filtering (depends on the run seed and the name only)."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 31)


# ============================================================================ sizes

@dataclass(frozen=True)
class Sizes:
    """Shapes and case subsets of one (machine, mode)."""

    mla_heads: dict          # preset name -> heads per rank used for the preset cases
    mla_topk: dict           # preset name -> K for sparse MLA preset cases
    idx_topk: dict           # preset name -> top-k for the indexer / step cases
    context: int             # longest request (tokens) in indexer / step / varlen cases
    batch: int               # requests in preset / step / varlen cases
    corner_heads: int        # H of the MLA corner cases
    corner_k: int            # K of the MLA corner cases
    corner_formats: tuple    # kv formats the MLA corner cases run in
    idx_corner_heads: int    # H_I of the indexer corner cases
    idx_corner_topk: int
    low_dtype: str           # the low-precision q / latent dtype of this machine
    corner_q_dtypes: tuple   # q dtypes of the MLA corner cases
    varlen: int              # random varlen batches per op
    idx_corners: tuple | None     # indexer corner-name subset (None = all)
    idx_corner_ops: tuple         # ops the indexer corner cases run
    idx_logits_corners: tuple | None  # corner names that also run indexer_logits (None = all)
    layout_corners: dict | None   # kv format -> MLA corner-name subset (None / absent = all)
    preset_latent: bool           # also run the presets in the latent layout (low-precision q)
    repeat: bool             # run each path twice and require bitwise-identical outputs
    extra_tp: tuple = ()     # tensor-parallel sizes whose per-rank head counts also run (presets)
    layer_cases: tuple | None = ()    # kernels.layer_reference.layer_parity_cases() names (None = all)
    layer_real_dims: bool = False     # the layer cases at the real preset dimensions (else scaled_down)
    layer_dtypes: tuple = ("float32",)  # activation / weight dtypes of the layer cases


_QUICK_MLA = {"fp8_ds_mla": ("all_invalid_row_in_batch", "logical_out_of_range", "topk_length",
                             "odd_page_61"),
              "fp8_model1": ("attn_sink_empty_row", "mtp_N4")}
# Corner cases whose handling depends on the cache layout (byte-level NaN fill, page addressing,
# sinks, duplicates, MTP rows): the default CPU grid runs these in the two layouts other than
# fp8_ds_mla, where all of them run (the interpreters' compile time per shape is the budget).
_LAYOUT_MLA = ("invalid_random", "logical_out_of_range", "topk_length", "attn_sink_empty_row",
               "zero_length_request", "page_size_1", "odd_page_61", "mtp_N4", "duplicates")
_QUICK_IDX = ("ties", "nan_rows", "negative_page_entries")
# Indexer corner cases whose point is the -inf / NaN pattern of the logits (masking, stale pages,
# -1 pages): the default CPU grid checks indexer_logits on these and indexer_topk on all.
_MASK_IDX = ("len_0", "len_not_multiple_of_P", "mtp_N3_context_lens_2d", "nan_rows",
             "stale_beyond_L", "negative_page_entries", "table_much_wider_than_L", "dense_float32")
# Decode-layer cases (names of kernels.layer_reference.layer_parity_cases()): --quick runs one
# per preset in its fp8 layout; the default grid adds the latent layout with MTP (V3.2) and
# tensor parallelism over V4's head groups; --full runs all of them.
_LAYER_QUICK = ("dsv32_fp8_ds_mla", "dsv4_fp8_model1")
_LAYER_DEFAULT = _LAYER_QUICK + ("dsv32_latent_mtp2", "dsv4_fp8_tp2")


def sizes_for(mode: str, gpu: bool) -> Sizes:
    """The shapes a (mode, machine) runs; see the module docstring."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if not gpu:
        base = dict(mla_heads={"DSV32": 16, "DSV4_FLASH": 16},
                    mla_topk={"DSV32": 256, "DSV4_FLASH": 128},
                    idx_topk={"DSV32": 256, "DSV4_FLASH": 128},
                    context=2048, batch=2, corner_heads=16, corner_k=64,
                    corner_formats=("latent", "fp8_ds_mla", "fp8_model1"),
                    idx_corner_heads=16, idx_corner_topk=64, low_dtype="float16",
                    corner_q_dtypes=("float32",), varlen=2, idx_corners=None,
                    idx_corner_ops=("indexer_logits", "indexer_topk"), idx_logits_corners=_MASK_IDX,
                    layout_corners={"latent": _LAYOUT_MLA, "fp8_model1": _LAYOUT_MLA},
                    preset_latent=True, repeat=False, layer_cases=_LAYER_DEFAULT)
        if mode == "quick":
            base.update(mla_topk={"DSV32": 128, "DSV4_FLASH": 64},
                        idx_topk={"DSV32": 128, "DSV4_FLASH": 64}, context=512,
                        corner_formats=("fp8_ds_mla", "fp8_model1"), varlen=0,
                        idx_corners=_QUICK_IDX, idx_corner_ops=("indexer_topk",),
                        layout_corners=_QUICK_MLA, preset_latent=False, layer_cases=_LAYER_QUICK)
        elif mode == "full":
            base.update(mla_heads={"DSV32": 32, "DSV4_FLASH": 32},
                        mla_topk={"DSV32": 512, "DSV4_FLASH": 512},
                        idx_topk={"DSV32": 512, "DSV4_FLASH": 256}, context=4096, batch=3,
                        corner_q_dtypes=("float32", "float16"), varlen=4, layout_corners=None,
                        idx_logits_corners=None, repeat=True, extra_tp=(8,), layer_cases=None)
        return Sizes(**base)
    base = dict(mla_heads={"DSV32": DSV32.heads_per_rank(1), "DSV4_FLASH": DSV4_FLASH.heads_per_rank(1)},
                mla_topk={"DSV32": DSV32.topk, "DSV4_FLASH": DSV4_FLASH.topk},
                idx_topk={"DSV32": DSV32.topk, "DSV4_FLASH": DSV4_FLASH.topk},
                context=16384, batch=4, corner_heads=64, corner_k=256,
                corner_formats=("latent", "fp8_ds_mla", "fp8_model1"),
                idx_corner_heads=64, idx_corner_topk=256, low_dtype="bfloat16",
                corner_q_dtypes=("bfloat16",), varlen=3, idx_corners=None,
                idx_corner_ops=("indexer_logits", "indexer_topk"), idx_logits_corners=None,
                layout_corners=None,
                preset_latent=True, repeat=True,
                # the real layer weights are large (V3.2: 200 M parameters): two cases
                layer_cases=_LAYER_QUICK, layer_real_dims=True, layer_dtypes=("bfloat16",))
    if mode == "quick":
        base.update(context=4096, batch=2, corner_formats=("fp8_ds_mla", "fp8_model1"),
                    corner_q_dtypes=("bfloat16",), varlen=1, idx_corners=_QUICK_IDX,
                    layout_corners=_QUICK_MLA, repeat=False)
    elif mode == "full":
        base.update(context=65536, batch=4, varlen=6, extra_tp=(2, 4, 8),
                    corner_q_dtypes=("float32", "bfloat16"), layer_dtypes=("bfloat16", "float32"))
    return Sizes(**base)


# ============================================================================ structured step inputs

def _structured_keys(rng, keys, lens, own, P, D_I):
    """Give each request's indexer keys serving-like structure; returns per-request directions.

    Scores rise along a per-request direction ``u_b`` for: the first 4 tokens (attention
    "sinks"), a recent window (the last 128 tokens, ramping up towards the newest), and three
    "topic" spans of 16..48 tokens somewhere in the middle. Queries point along ``u_b``, so those
    positions win the top-k and the rest is decided by noise.
    """
    B = len(lens)
    u = rng.standard_normal((B, D_I)).astype(np.float32)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        strength = np.zeros(L, np.float32)
        strength[:4] = 4.0
        w = min(L, 128)
        strength[L - w:] += np.linspace(1.5, 4.0, w, dtype=np.float32)
        for _ in range(3):
            n = int(rng.integers(16, 49))
            s = int(rng.integers(0, max(1, L - n)))
            strength[s:s + n] += 2.5
        j = np.arange(L)
        keys[own[b][j // P], j % P] += 2.0 * strength[:, None] * u[b][None, :]
    return u


def make_step_case(seed, *, name, preset: ModelPreset, B, N, H, topk, context, q_dtype,
                   kv_format=None, kv_dtype="float32", H_I=None, P=None, window=0,
                   sorted=False) -> StepCase:
    """Composed-step inputs on one shared page pool (indexer K cache + latent cache); ``window``
    and ``sorted`` as :class:`StepCase`.

    Requests' lengths vary (one shorter than ``topk`` so the top-k has -1 padding that flows into
    sparse MLA); the block table holds twice the longest request (a table much wider than the
    context) and points one stale page past each request. Every slot outside all requests'
    ``[0, L_b)`` holds huge indexer keys (a mis-masked indexer would pick them) and NaN latent
    rows (a mis-masked sparse MLA would produce NaN).
    """
    rng = np.random.default_rng(seed)
    P = P or preset.page_size
    H_I = H_I or preset.index_heads
    D_I = preset.index_head_dim
    kv_format = kv_format or preset.kv_format
    d_qk = 512 if kv_format == "fp8_model1" else (preset.d_qk if kv_format == "latent" else 576)
    lens = rng.integers(max(topk + 1, context // 2), context + 1, size=B)
    lens[0] = context
    if B > 1:
        lens[-1] = max(N, topk // 2)                         # fewer than topk positions
    bt, num_pages, own = kcases.make_block_table(rng, lens, P, table_pages=2 * math.ceil(context / P))
    keys = rng.standard_normal((num_pages, P, D_I)).astype(np.float32)
    u = _structured_keys(rng, keys, lens, own, P, D_I)
    used = np.zeros((num_pages, P), bool)
    for b in range(B):
        j = np.arange(int(lens[b]))
        used[own[b][j // P], j % P] = True
    keys[~used] = 50.0 * np.abs(keys[~used]) + 20.0 + 8.0 * u[0][None, :]
    k_cache = formats.quantize_fp8_indexer(keys, "ue8m0")
    head_gain = np.abs(rng.normal(1.0, 0.3, size=(B, 1, H_I, 1))).astype(np.float32)
    iq = 2.0 * (head_gain * u[:, None, None, :] + 0.5 * rng.standard_normal((B, N, H_I, D_I)))
    iq = formats.to_e4m3(iq.astype(np.float32))
    w = np.abs(rng.normal(1.0, 0.25, size=(B, N, H_I)))
    w[rng.random(w.shape) < 0.2] *= -0.3                     # a few heads vote against
    w = (w * H_I ** -0.5 * D_I ** -0.5).astype(np.float32)
    idx = kcases.IndexerCase(
        name=name, q=iq, weights=w, k_cache=k_cache, block_table=bt,
        context_lens=lens.astype(np.int32), topk=topk, k_format="fp8_indexer",
        params=dict(B=B, N=N, H_I=H_I, D_I=D_I, P=P, L=int(lens.max()), topk=topk,
                    k_format="fp8_indexer", table_len=bt.shape[1] * P, structured=True))
    latent = rng.standard_normal((num_pages, P, d_qk)).astype(np.float32)
    latent[~used] = np.nan
    with np.errstate(invalid="ignore"):
        if kv_format == "fp8_ds_mla":
            kv = formats.quantize_fp8_ds_mla(latent)
        elif kv_format == "fp8_model1":
            kv = formats.quantize_fp8_model1(latent)
        else:
            kv = latent.astype(kcases.Q_DTYPES[kv_dtype])
    q = (0.5 * rng.standard_normal((B, N, H, d_qk))).astype(np.float32).astype(kcases.Q_DTYPES[q_dtype])
    sm_scale = preset.sm_scale if preset.sm_scale is not None else d_qk ** -0.5
    sink = rng.standard_normal(H).astype(np.float32) if preset.attn_sink else None
    mla = kcases.MLACase(name=name, q=q, kv_cache=kv, indices=np.full((B, N, topk), -1, np.int32),
                         sm_scale=float(sm_scale), kv_format=kv_format, d_v=preset.d_v,
                         block_table=bt, attn_sink=sink,
                         params=dict(B=B, N=N, H=H, d_qk=d_qk, K=topk + window, P=P,
                                     kv_format=kv_format, q_dtype=q_dtype))
    return StepCase(name=name, indexer=idx, mla=mla, window=int(window), sorted=bool(sorted))


def _mla_from_step(step: StepCase) -> kcases.MLACase:
    """Sparse MLA over the index set the reference indexer picks on the step's structured cache."""
    ref_idx = step.indexer.reference()
    m = step.mla
    return kcases.MLACase(name=step.name, q=m.q, kv_cache=m.kv_cache, indices=ref_idx,
                          sm_scale=m.sm_scale, kv_format=m.kv_format, d_v=m.d_v,
                          block_table=m.block_table, attn_sink=m.attn_sink, params=dict(m.params))


# ============================================================================ decode-layer inputs

def layer_real_lens(cfg: lref.LayerConfig) -> tuple[int, int]:
    """Context lengths of the B = 2 real-dimension layer cases: request 0 is 1024 tokens longer
    than top-k + window (the indexer really selects), request 1 holds half of top-k (its index
    list is -1 padded). V3.2: (3072, 1024); V4-Flash: (1664, 256)."""
    return (cfg.topk + cfg.window + 1024, cfg.topk // 2)


def layer_case_config(spec: dict, real: bool) -> tuple[lref.LayerConfig, int, tuple]:
    """``(cfg, B, lens)`` of a :func:`kernels.layer_reference.layer_parity_cases` entry: as given
    (``scaled_down()``), or at the real preset dimensions with B = 2 and :func:`layer_real_lens`."""
    if not real:
        return spec["cfg"], spec["B"], tuple(spec["lens"])
    cfg = lref.LAYER_CONFIGS[spec["cfg"].preset.name]
    return cfg, 2, layer_real_lens(cfg)


def make_layer_parity_case(seed: int, spec: dict, *, name: str, dtype: str = "float32",
                           real: bool = False) -> LayerParityCase:
    """One decode-layer step from a :func:`kernels.layer_reference.layer_parity_cases` entry.

    Args:
      seed: the case seed (weights use ``seed + 1``, :func:`kernels.layer_reference.make_layer_case`).
      spec: the entry (``cfg``, ``kv_format``, ``B``, ``N``, ``lens``, ``tp``; its own ``seed``
        is replaced by ``seed``).
      name: the case name; dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"`` (the weights
        are rounded to it); real: the real preset dimensions (:func:`layer_case_config`).
    Returns:
      :class:`LayerParityCase`.
    Raises:
      ValueError: unknown ``dtype`` (or a spec ``make_layer_case`` rejects).
    """
    if dtype not in ("float32", *layer_compare.LOW_PRECISION):
        raise ValueError(f"dtype: expected float32, float16 or bfloat16, got {dtype!r}")
    cfg, B, lens = layer_case_config(spec, real)
    case = lref.make_layer_case(cfg, seed=seed, B=B, N=spec["N"], lens=lens,
                                kv_format=spec["kv_format"], name=name)
    if dtype != "float32":
        case.weights = {k: v.astype(kcases.Q_DTYPES[dtype]).astype(np.float32)
                        for k, v in case.weights.items()}
    return LayerParityCase(name=name, case=case, dtype=dtype, tp=int(spec["tp"]),
                           params=layer_case_params(spec, dtype, real))


def layer_case_params(spec: dict, dtype: str, real: bool) -> dict:
    """The result-row shape fields of a layer case (H = query heads per rank, K = top-k +
    window, L = the longest request), computed without building it."""
    cfg, B, lens = layer_case_config(spec, real)
    tp = int(spec["tp"])
    return dict(preset=cfg.preset.name, B=B, N=spec["N"], H=cfg.heads_per_rank(tp), K=cfg.topk + cfg.window,
                L=max(lens), P=cfg.page_size, kv_format=spec["kv_format"], q_dtype=dtype, d_qk=cfg.d_qk,
                hidden=cfg.hidden, tp=tp)


def layer_probe_case() -> LayerParityCase:
    """A tiny decode-layer step (scaled-down V3.2 in ``fp8_ds_mla``, one request of 40 tokens),
    what ``python -m parity --env`` probes each path's ``dsa_decode_layer`` with."""
    spec = dict(cfg=lref.DSV32_LAYER.scaled_down(), kv_format="fp8_ds_mla", B=1, N=1, lens=(40,), tp=1)
    return make_layer_parity_case(1, spec, name="probe")


# ============================================================================ the grid

def _strip(name: str) -> str:
    return name.split("[")[0]


def build_grid(*, mode: str = "default", gpu: bool = False, seed: int = 0) -> list[ParityCase]:
    """Every named (case, op) of a run, in execution order (nothing is generated yet)."""
    sz = sizes_for(mode, gpu)
    grid: list[ParityCase] = []

    def add(name, ops, fn, **params):
        memo = _Memo(fn)
        for op in ops:
            grid.append(ParityCase(name=name, op=op, builder=memo, params=params))

    idx_ops = ("indexer_logits", "indexer_topk")
    presets = (DSV32, DSV4_FLASH)

    # ---------------------------------------------------------------- presets: sparse MLA
    for pr in presets:
        H, K = sz.mla_heads[pr.name], sz.mla_topk[pr.name]
        N = 2
        variants = [("float32" if not gpu else "bfloat16", pr.kv_format, "float32")]
        if sz.preset_latent:
            variants.append((sz.low_dtype, "latent", sz.low_dtype))
        variants = [(v, H, "") for v in variants] + [
            (variants[0], pr.heads_per_rank(tp), f"_tp{tp}") for tp in sz.extra_tp]
        for (q_dtype, fmt, kv_dtype), H, tag in variants:
            nm = f"mla/{pr.name}/{fmt}_{q_dtype}{tag}"
            s = case_seed(seed, nm)
            add(nm, ("sparse_mla_decode",),
                lambda s=s, pr=pr, H=H, K=K, N=N, q_dtype=q_dtype, fmt=fmt, kv_dtype=kv_dtype, nm=nm:
                kcases.make_mla_case(s, B=sz.batch, N=N, H=H, d_qk=pr.d_qk, d_v=pr.d_v, K=K,
                                     P=pr.page_size, kv_format=fmt, q_dtype=q_dtype,
                                     kv_dtype=kv_dtype, logical=True, invalid="random",
                                     attn_sink=pr.attn_sink, sm_scale=pr.sm_scale, name=nm),
                preset=pr.name, B=sz.batch, N=N, H=H, K=K, P=pr.page_size, kv_format=fmt,
                q_dtype=q_dtype, d_qk=pr.d_qk)

    # ---------------------------------------------------------------- presets: indexer
    for pr in presets:
        K = sz.idx_topk[pr.name]
        for N in ((1, 2) if pr is DSV32 else (1, 4)):
            if mode == "quick" and (N > 1 or pr is not DSV32):
                continue
            nm = f"idx/{pr.name}/N{N}"
            s = case_seed(seed, nm)
            add(nm, idx_ops,
                lambda s=s, pr=pr, K=K, N=N, nm=nm:
                kcases.make_indexer_case(s, B=sz.batch, N=N, H_I=pr.index_heads,
                                         D_I=pr.index_head_dim, P=pr.page_size,
                                         lens=[sz.context] + [max(1, sz.context // (2 + b)) for b in range(sz.batch - 1)],
                                         topk=K, name=nm),
                preset=pr.name, B=sz.batch, N=N, H=pr.index_heads, K=K, L=sz.context,
                P=pr.page_size, kv_format="fp8_indexer")

    # ---------------------------------------------------------------- composed step + realistic index sets
    for pr in presets:
        K = sz.idx_topk[pr.name]
        H = sz.mla_heads[pr.name]
        q_dtype = "bfloat16" if gpu else "float32"
        for N in ((1,) if mode == "quick" else ((1, 2) if pr is DSV32 else (1, 3))):
            nm = f"step/{pr.name}/N{N}"
            s = case_seed(seed, nm)
            step_memo = _Memo(lambda s=s, pr=pr, K=K, H=H, N=N, nm=nm, q_dtype=q_dtype:
                              make_step_case(s, name=nm, preset=pr, B=sz.batch, N=N, H=H, topk=K,
                                             context=sz.context, q_dtype=q_dtype))
            params = dict(preset=pr.name, B=sz.batch, N=N, H=H, K=K, L=sz.context,
                          P=pr.page_size, kv_format=pr.kv_format, q_dtype=q_dtype)
            grid.append(ParityCase(nm, "dsa_decode_step", step_memo, params))
            if N == 1:
                grid.append(ParityCase(f"mla/{pr.name}/indexer_indices", "sparse_mla_decode",
                                       _Memo(lambda m=step_memo: _mla_from_step(m())), params))
    if gpu and mode != "quick":
        # the same step in the bf16 latent layout (FlashMLA's dense-cache case)
        pr = DSV32
        nm = f"step/{pr.name}/latent_bf16"
        s = case_seed(seed, nm)
        add(nm, ("dsa_decode_step",),
            lambda s=s, nm=nm: make_step_case(s, name=nm, preset=pr, B=sz.batch, N=1,
                                              H=sz.mla_heads[pr.name], topk=sz.idx_topk[pr.name],
                                              context=sz.context, q_dtype="bfloat16",
                                              kv_format="latent", kv_dtype="bfloat16"),
            preset=pr.name, B=sz.batch, N=1, H=sz.mla_heads[pr.name], K=sz.idx_topk[pr.name],
            L=sz.context, P=pr.page_size, kv_format="latent", q_dtype="bfloat16")

    # ---------------------------------------------------------------- the whole decode layer
    specs = {c["name"]: c for c in lref.layer_parity_cases()}
    for key in (tuple(specs) if sz.layer_cases is None else sz.layer_cases):
        spec = specs[key]
        for dtype in sz.layer_dtypes:
            nm = f"layer/{spec['cfg'].preset.name}/{key.split('_', 1)[1]}_{dtype}"
            s = case_seed(seed, nm)
            add(nm, ("dsa_decode_layer",),
                lambda s=s, spec=spec, nm=nm, dtype=dtype:
                make_layer_parity_case(s, spec, name=nm, dtype=dtype, real=sz.layer_real_dims),
                **layer_case_params(spec, dtype, sz.layer_real_dims))

    # ---------------------------------------------------------------- MLA corner cases
    for fmt in sz.corner_formats:
        d_qk = 512 if fmt == "fp8_model1" else 576
        for q_dtype in sz.corner_q_dtypes:
            kv_dtype = q_dtype if fmt == "latent" else "float32"
            tag = fmt if q_dtype == "float32" else f"{fmt}_{q_dtype}"
            memo = _Memo(lambda fmt=fmt, d_qk=d_qk, q_dtype=q_dtype, kv_dtype=kv_dtype, tag=tag:
                         kcases.mla_corner_cases(case_seed(seed, f"mla/{tag}"), d_qk=d_qk,
                                                 H=sz.corner_heads, K=sz.corner_k, kv_format=fmt,
                                                 q_dtype=q_dtype, kv_dtype=kv_dtype))
            # names come from kernels.cases; list them from a tiny-shape build
            want_fmt = (sz.layout_corners or {}).get(fmt)
            for i, name in enumerate(_mla_corner_names()):
                if want_fmt is not None and name not in want_fmt:
                    continue
                grid.append(ParityCase(f"mla/{tag}/{name}", "sparse_mla_decode",
                                       _Memo(lambda memo=memo, i=i: memo()[i]),
                                       dict(H=sz.corner_heads, K=sz.corner_k, kv_format=fmt,
                                            q_dtype=q_dtype, d_qk=d_qk)))

    # ---------------------------------------------------------------- indexer corner cases
    want_idx = sz.idx_corners
    memo_i = _Memo(lambda: kcases.indexer_corner_cases(case_seed(seed, "idx/corner"),
                                                       H_I=sz.idx_corner_heads,
                                                       topk=sz.idx_corner_topk))
    for i, name in enumerate(_idx_corner_names()):
        if want_idx is not None and name not in want_idx:
            continue
        m = _Memo(lambda i=i: memo_i()[i])
        for op in sz.idx_corner_ops:
            if (op == "indexer_logits" and sz.idx_logits_corners is not None
                    and name not in sz.idx_logits_corners):
                continue
            grid.append(ParityCase(f"idx/corner/{name}", op, m,
                                   dict(H=sz.idx_corner_heads, K=sz.idx_corner_topk,
                                        kv_format="fp8_indexer")))
    # top-k in descending order (sorted=True) on the tie corner case
    if want_idx is None or "ties" in want_idx:
        k = _idx_corner_names().index("ties")
        grid.append(ParityCase("idx/corner/ties_sorted", "indexer_topk",
                               _Memo(lambda: _sorted_case(memo_i()[k])),
                               dict(H=sz.idx_corner_heads, K=sz.idx_corner_topk,
                                    kv_format="fp8_indexer", sorted=True)))

    # ---------------------------------------------------------------- random varlen batches
    for v in range(sz.varlen):
        pr = presets[v % 2]
        nm = f"mla/varlen/{v}_{pr.kv_format}"
        s = case_seed(seed, nm)
        Bv = 2 * sz.batch + 1
        K = sz.mla_topk[pr.name]
        add(nm, ("sparse_mla_decode",),
            lambda s=s, pr=pr, K=K, Bv=Bv, nm=nm:
            _varlen_mla(s, pr, Bv, sz.mla_heads[pr.name], K, sz.low_dtype if gpu else "float32", nm),
            preset=pr.name, B=Bv, H=sz.mla_heads[pr.name], K=K, P=pr.page_size,
            kv_format=pr.kv_format, q_dtype=sz.low_dtype if gpu else "float32")
        nm = f"idx/varlen/{v}"
        s = case_seed(seed, nm)
        K = sz.idx_topk[pr.name]
        add(nm, idx_ops,
            lambda s=s, pr=pr, K=K, Bv=Bv, nm=nm:
            kcases.make_indexer_case(s, B=Bv, N=1 + (s % 2), H_I=pr.index_heads,
                                     D_I=pr.index_head_dim, P=pr.page_size, max_len=sz.context,
                                     topk=K, name=nm),
            preset=pr.name, B=Bv, H=pr.index_heads, K=K, L=sz.context, P=pr.page_size,
            kv_format="fp8_indexer")
    return grid


def _varlen_mla(seed, pr, B, H, K, q_dtype, name):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 4 * K + 1, size=B)
    lens[0] = 0
    lens[1] = 4 * K
    return kcases.make_mla_case(rng, B=B, N=int(rng.integers(1, 3)), H=H, d_qk=pr.d_qk, d_v=pr.d_v,
                                K=K, P=pr.page_size, kv_format=pr.kv_format, q_dtype=q_dtype,
                                logical=True, invalid="mix", topk_length=bool(seed % 2),
                                attn_sink=pr.attn_sink, lens=lens, sm_scale=pr.sm_scale, name=name)


def _sorted_case(c: kcases.IndexerCase):
    s = kcases.IndexerCase(**{f: getattr(c, f) for f in c.__dataclass_fields__})
    s.sorted = True
    return s


_NAME_CACHE: dict = {}


def _mla_corner_names() -> list[str]:
    if "mla" not in _NAME_CACHE:
        _NAME_CACHE["mla"] = [_strip(c.name) for c in kcases.mla_corner_cases(0, d_qk=576, H=1, K=32)]
    return _NAME_CACHE["mla"]


def _idx_corner_names() -> list[str]:
    if "idx" not in _NAME_CACHE:
        _NAME_CACHE["idx"] = [c.name for c in kcases.indexer_corner_cases(0, H_I=1, topk=16, P=4)]
    return _NAME_CACHE["idx"]


def filter_grid(grid, *, pattern=None, ops=None, names=None) -> list[ParityCase]:
    """The cases of ``grid`` that every given selector keeps, in grid order.

    ``names`` (``--case``): exact case names; a case is kept when its name is one of them.
    ``pattern`` (``-k``): comma-separated alternatives, each a substring of the name (like
    pytest ``-k``: ``idx/corner/ties`` also keeps ``idx/corner/ties_sorted``) or, when it holds
    ``* ? [``, a shell-style wildcard matched against the whole name. ``ops``: op names.
    A selector that is None or empty keeps every case.

    Raises:
        TypeError: ``names`` is a single string instead of a list of names.
        ValueError: a name in ``names`` is no case of ``grid``; the message lists the closest
            names of the grid (``difflib``).
    """
    import fnmatch
    if isinstance(names, str):
        raise TypeError(f"names: expected a list of case names, got the string {names!r}")
    if names:
        known = list(dict.fromkeys(c.name for c in grid))
        known_set = set(known)
        missing = [n for n in dict.fromkeys(names) if n not in known_set]
        if missing:
            import difflib
            parts = []
            for n in missing:
                close = difflib.get_close_matches(n, known, n=5, cutoff=0.6)
                parts.append(f"{n!r} (closest: {', '.join(close)})" if close else f"{n!r} (no close name)")
            raise ValueError(
                f"--case: expected the exact name of a case of this grid ({len(known)} names; the "
                f"grid depends on --quick / --full and on CPU vs GPU, --list shows it), got "
                + "; ".join(parts))
        wanted = set(names)
    pats = [p for p in pattern.split(",") if p] if pattern else []
    out = []
    for c in grid:
        if ops and c.op not in ops:
            continue
        if names and c.name not in wanted:
            continue
        if pats and not any((fnmatch.fnmatchcase(c.name, p) if any(ch in p for ch in "*?[") else p in c.name)
                            for p in pats):
            continue
        out.append(c)
    return out


__all__ = ["ParityCase", "StepCase", "LayerParityCase", "Sizes", "MODES", "build_grid", "filter_grid",
           "sizes_for", "make_step_case", "make_layer_parity_case", "layer_case_config",
           "layer_case_params", "layer_real_lens", "layer_probe_case", "case_seed"]
