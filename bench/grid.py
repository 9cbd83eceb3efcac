"""The benchmark grids: which (op, preset, B, N, TP, L, KV format) shapes a run times.

* ``full``: the issue's grid, every combination of B 1/8/32/64/128, L 4K/32K/128K (V4-Flash:
  4K/32K/128K/1M), N 1/2, TP 1/2/4/8 (H = heads / TP), KV bf16 and fp8, for sparse MLA and the
  decode step; the indexer (whose cost does not depend on H or the KV format) over B x L x N.
  Shapes whose inputs would not fit in ``--max-gb`` of device memory are skipped with a reason.
* ``quick``: the shapes that decide dispatch and the roofline story in ~4 minutes on an H200,
  ordered by priority (the run stops at ``--budget-s`` and records the rest as skipped).
* ``targets``: the rows the open performance issues name, headline first (sparse MLA: V3.2 fp8
  B 64/16/1/128 at H 128, B 64 at H 64 / 16 and N 2, bf16 latent, V4-Flash H 64 / 8; indexer:
  B 64 / 1 at L 64K / 128K, V4-Flash 4K in a 1M table, 1M at B 8 / 1, N 2; the decode layer).
* ``dry``: a tiny grid for the CPU interpreter (``--dry-run``): real D_qk / D_I and formats,
  16 (V3.2) or 8 (V4-Flash) heads, K 64 (+16 window), L 256; ``scaled_down()`` layers.

The decode layer (``dsa_decode_layer``: one step of ``DSADecodeLayer``, projections, cache
writes, indexer top-k, sparse MLA and output projection) runs at the real preset dimensions
(V3.2: hidden 7168, 128 heads; V4-Flash: hidden 4096, 64 heads) at B 1 and 64, L 32K, fp8
caches, TP 1; the dry grid runs ``scaled_down()`` layers (4 heads, hidden 256).

Sparse MLA is benchmarked with logical indices through a block table (as the decode step calls
it). V4-Flash attends ``topk + window`` entries: K = 512 top-k positions from ``[0, L - 128)``
plus the last 128 positions (the sliding window), with a per-head attention sink.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

from kernels.presets import PRESETS
from kernels.registry import REGISTRY as OP_REGISTRY

OPS = OP_REGISTRY.timed_ops
KV_KINDS = ("bf16", "fp8")


@dataclass(frozen=True)
class Shape:
    """One benchmark shape. ``kv`` is ``"bf16"`` (latent cache) or ``"fp8"`` (the preset's fp8
    layout); ``table_len`` is the block table's capacity in positions (default: L rounded up to
    pages); ``topk`` / ``window`` / ``heads`` override the preset (dry runs; for
    ``dsa_decode_layer`` ``heads`` selects the ``scaled_down()`` layer, see :attr:`layer_cfg`)."""

    op: str
    preset: str
    B: int
    N: int
    tp: int
    L: int
    kv: str = "fp8"
    table_len: int | None = None
    topk: int | None = None
    window: int | None = None
    heads: int | None = None

    @property
    def p(self):
        return PRESETS[self.preset]

    @property
    def H(self) -> int:
        """Query heads on this rank (sparse MLA / step); the indexer's H_I for indexer rows."""
        if self.op == "indexer_topk":
            return self.p.index_heads
        return self.heads if self.heads is not None else self.p.heads_per_rank(self.tp)

    @property
    def P(self) -> int:
        return self.p.page_size

    @property
    def K_topk(self) -> int:
        return self.topk if self.topk is not None else self.p.topk

    @property
    def W_window(self) -> int:
        return self.window if self.window is not None else self.p.window

    @property
    def K(self) -> int:
        """Entries per sparse-MLA index list (top-k + window); the indexer's K for indexer rows."""
        return self.K_topk if self.op == "indexer_topk" else self.K_topk + self.W_window

    @property
    def kv_format(self) -> str:
        if self.op == "indexer_topk":
            return "fp8_indexer"
        return "latent" if self.kv == "bf16" else self.p.kv_format

    @property
    def layer_cfg(self):
        """The ``kernels.layer_reference.LayerConfig`` of a ``dsa_decode_layer`` shape: the
        preset's real layer (``LAYER_CONFIGS``; top-k / window overrides applied), or with
        ``heads`` set its ``scaled_down(num_heads=heads)`` variant (hidden 256, 16 indexer heads),
        both at page size :attr:`P`."""
        import dataclasses

        from kernels import layer_reference as lref
        cfg = lref.LAYER_CONFIGS[self.preset]
        if self.heads is not None:
            return cfg.scaled_down(num_heads=self.heads, topk=self.K_topk, window=self.W_window,
                                   page_size=self.P)
        return dataclasses.replace(cfg, topk=self.K_topk, window=self.W_window, page_size=self.P)

    @property
    def table_positions(self) -> int:
        t = self.table_len if self.table_len is not None else self.L
        return -(-t // self.P) * self.P

    def label(self) -> str:
        t = "" if self.table_len is None else f" table={self.table_len}"
        return (f"{self.op} {self.preset} B={self.B} N={self.N} H={self.H} L={self.L} K={self.K} "
                f"{self.kv_format}{t}")

    def to_dict(self) -> dict:
        return asdict(self)

    def input_bytes(self, rotations: int = 1) -> int:
        """Device bytes of the generated inputs (caches dominate)."""
        pages = self.B * (self.table_positions // self.P)
        tok = pages * self.P
        n = 0
        if self.op in ("indexer_topk", "dsa_decode_step", "dsa_decode_layer"):
            n += tok * (self.p.index_head_dim + 4)
        if self.op in ("sparse_mla_decode", "dsa_decode_step", "dsa_decode_layer"):
            from bench.roofline import kv_row_bytes
            n += tok * kv_row_bytes(self.kv_format, self.p.d_qk)
        n *= rotations
        if self.op == "dsa_decode_layer":                  # one layer's weights, all rotations
            from bench.roofline import layer_weight_bytes
            n += layer_weight_bytes(self.layer_cfg, tp=self.tp)
        return n


K4, K32, K64, K128, M1 = 4096, 32768, 65536, 131072, 1 << 20


def _lens(preset: str):
    return (K4, K32, K128, M1) if preset == "DSV4_FLASH" else (K4, K32, K128)


def full_grid() -> list[Shape]:
    out = []
    for preset in ("DSV32", "DSV4_FLASH"):
        for B, L, N in itertools.product((1, 8, 32, 64, 128), _lens(preset), (1, 2)):
            out.append(Shape("indexer_topk", preset, B, N, 1, L, kv="fp8"))
        for op in ("sparse_mla_decode", "dsa_decode_step"):
            for B, L, N, tp, kv in itertools.product((1, 8, 32, 64, 128), _lens(preset), (1, 2),
                                                     (1, 2, 4, 8), KV_KINDS):
                out.append(Shape(op, preset, B, N, tp, L, kv=kv))
    return out + layer_shapes()


def layer_shapes() -> list[Shape]:
    """The decode-layer rows: both presets at their real dimensions, B 1 and 64, L 32K, fp8."""
    return [Shape("dsa_decode_layer", preset, B, 1, 1, K32, "fp8")
            for preset in ("DSV32", "DSV4_FLASH") for B in (64, 1)]


def quick_grid() -> list[Shape]:
    """Priority order: what dispatch and the headline numbers need first."""
    S = Shape
    out = [
        # headline rows first (the issues' targets), so a short budget still measures them
        S("sparse_mla_decode", "DSV32", 64, 1, 1, K32, "fp8"),
        S("sparse_mla_decode", "DSV32", 64, 1, 8, K32, "fp8"),
        S("sparse_mla_decode", "DSV4_FLASH", 64, 1, 1, K32, "fp8"),
        S("indexer_topk", "DSV32", 64, 1, 1, K64),
        S("indexer_topk", "DSV4_FLASH", 64, 1, 1, K4, table_len=M1),
        S("indexer_topk", "DSV4_FLASH", 64, 1, 1, K4),
        S("dsa_decode_step", "DSV32", 64, 1, 1, K32, "fp8"),
        S("dsa_decode_layer", "DSV32", 64, 1, 1, K32, "fp8"),
        S("indexer_topk", "DSV32", 1, 1, 1, K128),
        # sparse MLA, serving format (fp8), full heads (TP=1) and TP=8, B sweep at L=32K
        *(S("sparse_mla_decode", "DSV32", B, 1, 1, K32, "fp8") for B in (1, 8, 64, 128)),
        *(S("sparse_mla_decode", "DSV4_FLASH", B, 1, 1, K32, "fp8") for B in (1, 8, 64, 128)),
        S("sparse_mla_decode", "DSV32", 64, 1, 8, K32, "fp8"),
        S("sparse_mla_decode", "DSV4_FLASH", 64, 1, 8, K32, "fp8"),
        # indexer + top-k: the target shape (B=64, L=64K), the long-context ends, batch ends
        S("indexer_topk", "DSV32", 64, 1, 1, K64),
        S("indexer_topk", "DSV4_FLASH", 64, 1, 1, K64),
        S("indexer_topk", "DSV32", 1, 1, 1, K128),
        S("indexer_topk", "DSV32", 128, 1, 1, K32),
        S("indexer_topk", "DSV4_FLASH", 8, 1, 1, M1),
        S("indexer_topk", "DSV4_FLASH", 1, 1, 1, M1),
        # work scales with L: L=4K in a table sized for 1M vs for 4K
        S("indexer_topk", "DSV4_FLASH", 64, 1, 1, K4),
        S("indexer_topk", "DSV4_FLASH", 64, 1, 1, K4, table_len=M1),
        # decode step (the composition serving runs)
        S("dsa_decode_step", "DSV32", 64, 1, 1, K32, "fp8"),
        S("dsa_decode_step", "DSV4_FLASH", 64, 1, 1, K64, "fp8"),
        S("dsa_decode_step", "DSV32", 1, 1, 1, K128, "fp8"),
        # the whole decode layer (weights + attention) at the real preset dimensions
        *layer_shapes(),
        # MTP (N=2), bf16 cache, long cache, H per TP sweep
        S("sparse_mla_decode", "DSV32", 64, 2, 1, K32, "fp8"),
        S("sparse_mla_decode", "DSV32", 64, 1, 1, K32, "bf16"),
        S("sparse_mla_decode", "DSV4_FLASH", 64, 1, 1, K32, "bf16"),
        S("sparse_mla_decode", "DSV32", 64, 1, 2, K32, "fp8"),
        S("sparse_mla_decode", "DSV32", 64, 1, 4, K32, "fp8"),
        S("sparse_mla_decode", "DSV32", 32, 1, 1, K128, "fp8"),
        S("indexer_topk", "DSV32", 64, 2, 1, K32),
        S("sparse_mla_decode", "DSV32", 1, 1, 1, K32, "bf16"),
        S("sparse_mla_decode", "DSV4_FLASH", 64, 2, 1, K32, "fp8"),
        S("dsa_decode_step", "DSV4_FLASH", 8, 1, 1, M1, "fp8"),
    ]
    seen, uniq = set(), []
    for s_ in out:                       # drop the repeats of the headline rows
        if s_ not in seen:
            seen.add(s_)
            uniq.append(s_)
    return uniq


def targets_grid() -> list[Shape]:
    """The issues' target rows (sparse MLA, indexer + top-k, decode layer), headline first, so one
    ``python -m bench --targets`` call measures every row an issue's "done when" names. Sparse MLA
    rows use L 32K (the top-k selects K rows of it; the cost does not depend on L); TP t means
    H = heads / t (V3.2: 128 / t, V4-Flash: 64 / t)."""
    S = Shape
    mla, idx = "sparse_mla_decode", "indexer_topk"
    return [
        S(mla, "DSV32", 64, 1, 1, K32, "fp8"),                 # H 128, the headline
        S(mla, "DSV32", 64, 1, 2, K32, "fp8"),                 # H 64
        S(mla, "DSV32", 16, 1, 1, K32, "fp8"),
        S(mla, "DSV32", 1, 1, 1, K32, "fp8"),
        S(mla, "DSV32", 128, 1, 1, K32, "fp8"),
        S(mla, "DSV32", 64, 2, 1, K32, "fp8"),                 # MTP N 2
        S(mla, "DSV32", 64, 1, 8, K32, "fp8"),                 # H 16 (TP 8)
        S(mla, "DSV4_FLASH", 64, 1, 1, K32, "fp8"),            # H 64, K 512 + 128
        S(mla, "DSV4_FLASH", 64, 1, 8, K32, "fp8"),            # H 8
        S(mla, "DSV32", 64, 1, 1, K32, "bf16"),                # latent cache
        S(idx, "DSV32", 64, 1, 1, K64),
        S(idx, "DSV32", 64, 1, 1, K128),
        S(idx, "DSV32", 1, 1, 1, K128),
        S(idx, "DSV32", 1, 1, 1, K64),
        S(idx, "DSV4_FLASH", 64, 1, 1, K4, table_len=M1),
        S(idx, "DSV4_FLASH", 64, 1, 1, K4),
        S(idx, "DSV4_FLASH", 8, 1, 1, M1),
        S(idx, "DSV4_FLASH", 1, 1, 1, M1),
        S(idx, "DSV32", 64, 2, 1, K64),
        *layer_shapes(),
    ]


GRIDS = {"quick": quick_grid, "full": full_grid, "targets": targets_grid}


def grid_for(mode: str) -> list[Shape]:
    """The shapes of a run mode: ``quick``, ``full``, ``targets`` or ``dry``."""
    return (GRIDS | {"dry": dry_grid})[mode]()


def dry_grid() -> list[Shape]:
    """Tiny shapes for the CPU interpreter (timings meaningless)."""
    S = Shape
    return [
        S("sparse_mla_decode", "DSV32", 2, 1, 8, 256, "fp8", topk=64, window=0),
        S("sparse_mla_decode", "DSV4_FLASH", 2, 2, 8, 256, "fp8", topk=64, window=16),
        S("sparse_mla_decode", "DSV32", 2, 1, 8, 256, "bf16", topk=64, window=0),
        S("indexer_topk", "DSV32", 2, 1, 1, 256, topk=64),
        S("indexer_topk", "DSV4_FLASH", 2, 2, 1, 200, topk=64, table_len=512),
        S("dsa_decode_step", "DSV32", 2, 1, 8, 256, "fp8", topk=64, window=0),
        S("dsa_decode_layer", "DSV32", 2, 1, 1, 256, "fp8", topk=64, window=0, heads=4),
        S("dsa_decode_layer", "DSV4_FLASH", 2, 1, 1, 256, "fp8", topk=32, window=16, heads=4),
    ]


def select(shapes, *, ops=None, presets=None, kvs=None) -> list[Shape]:
    """Filter a grid by op, preset and KV kind (None = all)."""
    return [s for s in shapes
            if (not ops or s.op in ops) and (not presets or s.preset in presets)
            and (not kvs or s.op == "indexer_topk" or s.kv in kvs)]

