"""The op registry: which ops exist, which paths each backend runs them on and in which
fall-through order, how a call is bucketed for the dispatch table, which kernel configs a path
may run, and :meth:`Registry.plan`, the one function that turns (op, backend, device, shape)
into the paths to try and the config each one runs.

Every consumer reads these decisions here and nowhere else: the bindings (``torch_impl``,
``jax_impl``: ``path="auto"`` and the configs their launchers run), the dispatch table
(``kernels.dispatch``: which ops and paths an entry may name, the bucket keys), parity (one
runner per backend and path) and the bench (the paths it times, the config each row records,
the dispatch entries it writes). ``tests/test_registry.py`` asserts they hold this very object.

Vocabulary:

* *op*: ``sparse_mla_decode``, ``indexer_logits``, ``indexer_topk`` (kernel ops, with dispatch
  entries), ``dsa_decode_step`` and ``dsa_decode_layer`` (compositions of them; parity checks
  and the bench times them, the table has no entries for them).
* *path*: one implementation of an op in a backend. Each backend has a *kernel path* (torch:
  ``"triton"``, jax: ``"pallas"``), whose launch has a config, and a *plain path* (``"torch"``,
  ``"xla"``: framework ops only) whose config is the explicit empty dict ``{}``. ``"auto"`` is
  not a path: it tries the backend's paths in order (the dispatch entry's path first), falling
  through on ``NotImplementedError`` (SPEC "Public names").
* *bucket*: the dispatch key of a call (``kernels.ops.BUCKET_KEYS``; ``B`` and ``L`` rounded up to
  powers of two, the rest exact). ``L`` is the block table's capacity in positions
  (``max_pages * P``): the actual lengths live on the device and are never read back.
* *config*: a plain dict (JSON-able) of the kernel's launch parameters; ``None`` in a field
  means "the launcher's per-call rule" (e.g. the indexer's split count, from the SM count and
  the batch). A path runs the dispatch entry's config when the entry for its bucket chose this
  path and the config is in the path's space (:meth:`Registry.accept`), else its heuristic
  (:meth:`Registry.heuristic`). The split-K count of sparse MLA is a per-call choice, not part
  of the config (``kernels.sparse_mla.configs.sparse_mla_num_splits``).

Modules: the names (ops, paths, bucket keys, :func:`kernels.ops.bucket`) are defined in
``kernels.ops``, which the dispatch table (``kernels.dispatch``) also reads; this module adds the
config rules and the plan on top of both (``ops <- dispatch <- registry``, no cycle). NumPy-free
and framework-free at module level; the indexer config classes live beside their kernels
(``kernels.indexer.triton`` and ``kernels.topk.triton`` import triton, ``kernels.indexer.pallas``
imports jax) and are imported only when a config of that path is asked for.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from kernels import dispatch
from kernels.sparse_mla import configs
from kernels.ops import (AUTO, BACKEND_PATHS, BUCKET_KEYS, KERNEL_PATHS, OPS, POW2_KEYS,  # noqa: F401
                         TIMED_OPS, bucket as _bucket, pow2_bucket)


# ============================================================================ config rules

def _operand_bytes(shape: Mapping) -> int:
    return 4 if int(shape.get("operand_bytes", 2)) >= 4 else 2


# The rules below are pure functions of the device's shared-memory class, the dot operand width
# and the head count (sparse MLA: also B x N and K); their dicts are cached (dataclasses.asdict costs ~10 us a config, and a
# plan runs on every eager call). Callers copy before they change one.

@functools.lru_cache(maxsize=None)
def _mla_triton_heuristic_cached(heads: int, smem: int, operand_bytes: int, rows, topk,
                                 gluon: bool, gluon_ws: bool, gluon_sh: bool = False,
                                 gluon_shws: bool = False, gluon_xs: bool = False,
                                 gluon_shws16: bool = False) -> dict:
    return configs.sparse_mla_heuristic(heads, smem, operand_bytes, rows=rows, topk=topk,
                                        gluon=gluon, gluon_ws=gluon_ws, gluon_sh=gluon_sh,
                                        gluon_shws=gluon_shws, gluon_xs=gluon_xs,
                                        gluon_shws16=gluon_shws16).to_dict()


def _mla_triton_heuristic(dev, shape):
    rows = shape["B"] * shape["N"] if "B" in shape and "N" in shape else None
    fmt, d_qk, width = shape.get("kv_format"), shape.get("d_qk"), _operand_bytes(shape)
    gluon = configs.gluon_eligible(dev, fmt, d_qk, width)
    # the warp-specialised kernel where it measured faster: fp8_ds_mla (configs.GLUON_WS_PICKED)
    ws = configs.gluon_ws_eligible(dev, fmt, d_qk, width) and fmt in configs.GLUON_WS_PICKED
    # the few-heads kernel where it is picked for the format (configs.GLUON_SH_PICKED)
    sh = configs.kernel_eligible("gluon_sh", dev, fmt, d_qk, width) and fmt in configs.GLUON_SH_PICKED
    # and its warp-specialised variant where that is picked (configs.GLUON_SHWS_PICKED)
    shws_ok = sh and configs.kernel_eligible("gluon_shws", dev, fmt, d_qk, width)
    shws = shws_ok and fmt in configs.GLUON_SHWS_PICKED
    # its 16-head config at 9..16 heads (configs.GLUON_SHWS16_PICKED)
    shws16 = shws_ok and fmt in configs.GLUON_SHWS16_PICKED
    # the seesaw kernel where it is picked for the format (configs.GLUON_XS_PICKED); the
    # binding substitutes gluon_ws under a Triton it is not written for
    xs = (configs.kernel_eligible("gluon_xs", dev, fmt, d_qk, width)
          and fmt in configs.GLUON_XS_PICKED)
    return _mla_triton_heuristic_cached(shape["H"], dev.smem_per_block, width,
                                        rows, shape.get("K"), gluon, ws, sh, shws, xs, shws16)


@functools.lru_cache(maxsize=None)
def _mla_triton_space_cached(smem: int, operand_bytes: int) -> tuple:
    return tuple(c.to_dict() for c in configs.sparse_mla_space(smem, operand_bytes))


def _mla_triton_space(dev, shape):
    return _mla_triton_space_cached(dev.smem_per_block, _operand_bytes(shape))


@functools.lru_cache(maxsize=None)
def _mla_pallas_heuristic_cached(heads: int, smem: int, operand_bytes: int, rows, topk,
                                 kv_format) -> dict:
    return configs.pallas_sparse_mla_heuristic(heads, smem, operand_bytes, rows=rows, topk=topk,
                                               kv_format=kv_format).to_dict()


def _mla_pallas_heuristic(dev, shape):
    rows = shape["B"] * shape["N"] if "B" in shape and "N" in shape else None
    return _mla_pallas_heuristic_cached(shape["H"], dev.smem_per_block, _operand_bytes(shape),
                                        rows, shape.get("K"), shape.get("kv_format"))


@functools.lru_cache(maxsize=None)
def _mla_pallas_space_cached(smem: int, operand_bytes: int) -> tuple:
    if operand_bytes >= 4:                  # fp32 dots: the one correctness config
        return (configs.PALLAS_SPARSE_MLA_FP32.to_dict(),)
    return tuple(c.to_dict() for c in configs.PALLAS_SPARSE_MLA_SPACE[configs.smem_class(smem)])


def _mla_pallas_space(dev, shape):
    return _mla_pallas_space_cached(dev.smem_per_block, _operand_bytes(shape))


def _triton_indexer_classes(op):
    from kernels.indexer.triton import IndexerLogitsConfig
    from kernels.topk.triton import TopkConfig
    return IndexerLogitsConfig, (TopkConfig if op == "indexer_topk" else None)


@functools.lru_cache(maxsize=None)
def _triton_indexer_default(op: str) -> dict:
    logits_cls, topk_cls = _triton_indexer_classes(op)
    d = dataclasses.asdict(logits_cls())
    if d.get("kernel") == "triton":          # the default kernel: omitted (a selector field)
        del d["kernel"]
    for f in _INDEXER_WS_FIELDS:              # the gluon_ws kernel's variant: selector fields
        d.pop(f, None)
    if topk_cls is not None:
        d.update({f"topk_{k}": v for k, v in dataclasses.asdict(topk_cls()).items()})
    return d


@functools.lru_cache(maxsize=None)
def _triton_indexer_space_cached(op: str) -> dict:
    logits_cls, topk_cls = _triton_indexer_classes(op)
    s = {k: tuple(v) for k, v in logits_cls.SEARCH_SPACE.items()}
    if topk_cls is not None:
        s.update({f"topk_{k}": tuple(v) for k, v in topk_cls.SEARCH_SPACE.items()})
    return s


# Fields of the indexer logits config that pick a variant of the warp-specialised Gluon kernel
# (kernels.indexer.gluon_ws: consumer warpgroups, conversion path); the heuristic never names
# that kernel, so they are selectors: absent means the dataclass default.
_INDEXER_WS_FIELDS = ("ws_consumers", "ws_convert")


# The top-k's candidate block after a split pass B for top-k 2048 where a row may keep more than
# 1,024 candidates (the threshold bin's keys; they grow with L, and a launch waits on its fullest
# row): 2,048, one loop iteration a level where 1,024 took two; rows of fewer candidates pay for
# the wider block. Applied at top-k >= 2048 with B x N >= 8 rows or L > 64K (the dispatch table's
# buckets round L up to a power of two: a B 1 call of L 100K takes the L 128K entry's 2,048). H200
# (topk_us by cand_block 1,024 -> 2,048, bench/results/indexer_sweep_*_h200_2026120{2,5}*.json):
# B 64 L 64K (n_cand_max 1,129) 34.5 -> 33.8, 31.8 -> 31.0, 39.9 -> 38.7; B 64 N 2 L 64K 51.9 ->
# 48.4, 58.2 -> 53.6; B 64 L 128K (1,426) 46.8 -> 42.4; B 1 L 128K (1,040) 22.8 -> 19.8, 25.4 ->
# 22.4; targets bench 2026-12-05 (ninth session, both runs on one H200): B 64 L 64K 35.9 -> 29.5,
# L 128K 53.6 -> 43.9, N 2 49.6 -> 40.6, B 1 L 128K 17.6 -> 17.0, but B 1 L 64K 15.1 -> 16.7
# (one run: that row keeps 1,024). Top-k 512 rows keep 1,024 (V4 B 64 4K in 1M 12.8 vs 14.8,
# V4 B 8 1M 43.5 vs 45.8). Not measured on sm_120 (the same loop; its SEARCH_SPACE compiles
# there).
TOPK_WIDE_CAND_BLOCK = 2048


def _wide_cand_block(shape) -> bool:
    """Whether an indexer_topk call of ``shape`` (registry fields: B, N, L, topk) gets
    :data:`TOPK_WIDE_CAND_BLOCK` (the rule above)."""
    rows = int(shape.get("B", 1)) * int(shape.get("N", 1))
    return (int(shape.get("topk", 0)) >= TOPK_WIDE_CAND_BLOCK
            and (rows >= 8 or int(shape.get("L", 0)) > 65_536))


def _triton_indexer_heuristic(op):
    def rule(dev, shape):
        # the Gluon logits kernel on sm_90, where it measured faster at every bench shape
        # (bench/NOTES.md "Gluon logits kernel"), its warp-specialised variant once
        # kernels.indexer.gluon_ws.PICKED says so; the launcher runs the Triton kernel for calls
        # they are not built for (kernels.indexer.triton.resolve_kernel) and gluon.py where TMA
        # cannot address the cache
        from kernels.indexer import gluon, gluon_ws
        d = _triton_indexer_default(op)
        if op == "indexer_topk" and _wide_cand_block(shape):
            d = {**d, "topk_cand_block": TOPK_WIDE_CAND_BLOCK}
        if not gluon.device_ok(dev):
            return d
        return {**d, "kernel": "gluon_ws" if gluon_ws.PICKED else "gluon"}
    return rule


def _triton_indexer_space(op):
    return lambda dev, shape: _triton_indexer_space_cached(op)


@functools.lru_cache(maxsize=None)
def _pallas_indexer_default() -> dict:
    from kernels.indexer.pallas import PallasIndexerConfig
    return PallasIndexerConfig().to_dict()


@functools.lru_cache(maxsize=None)
def _pallas_indexer_space_cached() -> dict:
    from kernels.indexer.pallas import PallasIndexerConfig
    return {k: tuple(v) for k, v in PallasIndexerConfig.SEARCH_SPACE.items()}


def _pallas_indexer_heuristic(dev, shape):
    return _pallas_indexer_default()


def _pallas_indexer_space(dev, shape):
    return _pallas_indexer_space_cached()


@dataclass(frozen=True)
class ConfigRule:
    """How one kernel path of one op picks its config.

    ``heuristic(dev, shape) -> dict``: the default config for this device and call.
    ``space(dev, shape)``: the configs the launcher may run, either a tuple of whole configs
    (sparse MLA: the compiled-and-checked members) or a dict ``{field: allowed values}`` (the
    indexers: every combination is allowed; the heuristic's own value of a field always is).
    A table's config may name some fields only: the others are the heuristic's, except the
    ``selectors``: fields that choose a kernel rather than tune one (sparse MLA's ``kernel``),
    whose absence means the default kernel (a config dict omits the field then), never the
    heuristic's choice.
    """

    heuristic: Callable[..., dict]
    space: Callable[..., tuple | dict]
    selectors: tuple = ()


CONFIG_RULES = MappingProxyType({
    # "kernel": "triton" when absent (SparseMLAConfig.to_dict omits it), "gluon", "gluon_ws"
    ("sparse_mla_decode", "torch", "triton"): ConfigRule(_mla_triton_heuristic, _mla_triton_space,
                                                         selectors=("kernel",)),
    ("sparse_mla_decode", "jax", "pallas"): ConfigRule(_mla_pallas_heuristic, _mla_pallas_space),
    # "kernel": "triton" when absent, "gluon" (kernels.indexer.gluon, sm_90), "gluon_ws"
    # (kernels.indexer.gluon_ws, sm_90, with its ws_* variant fields; never the heuristic's)
    ("indexer_logits", "torch", "triton"): ConfigRule(_triton_indexer_heuristic("indexer_logits"),
                                                      _triton_indexer_space("indexer_logits"),
                                                      selectors=("kernel",) + _INDEXER_WS_FIELDS),
    ("indexer_topk", "torch", "triton"): ConfigRule(_triton_indexer_heuristic("indexer_topk"),
                                                    _triton_indexer_space("indexer_topk"),
                                                    selectors=("kernel",) + _INDEXER_WS_FIELDS),
    ("indexer_logits", "jax", "pallas"): ConfigRule(_pallas_indexer_heuristic, _pallas_indexer_space),
    ("indexer_topk", "jax", "pallas"): ConfigRule(_pallas_indexer_heuristic, _pallas_indexer_space),
})
"""Config rule of every (kernel op, backend, kernel path); plain paths have none (config ``{}``)."""


# ============================================================================ plan

@dataclass(frozen=True)
class Plan:
    """What one call runs: the paths to try in order and the config each one runs.

    Attributes:
      op, backend: as given to :meth:`Registry.plan`.
      bucket: the call's dispatch bucket (``{}`` for ops without dispatch entries).
      order: the paths to try: one path for a named path, the fall-through order for
        ``"auto"`` (the dispatch entry's path first).
      configs: ``{path: config}`` for every path of ``order``: ``{}`` for plain paths, a dict
        for kernel paths, None when there was no device to choose for (the launcher then raises
        NotImplementedError or picks its own).
      entry: the dispatch-table entry used, or None.
    """

    op: str
    backend: str
    bucket: dict
    order: tuple
    configs: Mapping = field(default_factory=dict)
    entry: dict | None = None

    @property
    def path(self) -> str:
        """The path tried first."""
        return self.order[0]

    @property
    def config(self) -> dict | None:
        """The config of the path tried first."""
        return self.configs[self.order[0]]

    def config_for(self, path: str) -> dict | None:
        """The config ``path`` runs in this call (KeyError when it is not in :attr:`order`)."""
        return self.configs[path]


class Registry:
    """The registry object (:data:`REGISTRY`); all state is the module's constants."""

    ops = OPS
    kernel_ops = tuple(BUCKET_KEYS)
    timed_ops = TIMED_OPS
    backends = tuple(BACKEND_PATHS)
    bucket_keys = BUCKET_KEYS
    pow2_keys = POW2_KEYS
    config_rules = CONFIG_RULES

    # ------------------------------------------------------------------ names
    def _check_op(self, op: str) -> None:
        if op not in self.ops:
            raise ValueError(f"op: expected one of {self.ops}, got {op!r}")

    def _check_backend(self, backend: str) -> None:
        if backend not in BACKEND_PATHS:
            raise ValueError(f"backend: expected one of {self.backends}, got {backend!r}")

    def paths(self, backend: str) -> tuple[str, ...]:
        """The backend's paths in fall-through order (``"auto"`` excluded)."""
        self._check_backend(backend)
        return BACKEND_PATHS[backend]

    def path_choices(self, backend: str) -> tuple[str, ...]:
        """What a binding's ``path=`` accepts: ``("auto",) + paths(backend)``."""
        return (AUTO,) + self.paths(backend)

    def all_paths(self) -> tuple[str, ...]:
        """Every path of every backend, in backend order (``"auto"`` excluded)."""
        return tuple(p for b in self.backends for p in BACKEND_PATHS[b])

    def kernel_path(self, backend: str) -> str:
        """The backend's path that launches a kernel (``"triton"`` / ``"pallas"``)."""
        self._check_backend(backend)
        return KERNEL_PATHS[backend]

    def is_plain(self, backend: str, path: str) -> bool:
        """True for a path that launches no kernel (its config is ``{}``)."""
        if path not in self.paths(backend):
            raise ValueError(f"path: expected one of {self.paths(backend)} for backend "
                             f"{backend!r}, got {path!r}")
        return path != KERNEL_PATHS[backend]

    # ------------------------------------------------------------------ buckets
    def bucket(self, op: str, **dims) -> dict:
        """The dispatch bucket of a call (``kernels.ops.bucket``): the op's bucket keys, ``B``
        and ``L`` rounded up to powers of two, the rest exact; ``{}`` for the compositions.

        Raises:
          ValueError: unknown op, or a bucket key missing from ``dims``.
        """
        return _bucket(op, **dims)

    # ------------------------------------------------------------------ configs
    def _rule(self, op, backend, path) -> ConfigRule | None:
        if self.is_plain(backend, path):
            return None
        return CONFIG_RULES.get((op, backend, path))

    def heuristic(self, op: str, backend: str, path: str, dev, **shape) -> dict | None:
        """The config ``path`` runs without a dispatch entry: ``{}`` for a plain path (and for
        the compositions, whose ops plan their own), the rule's heuristic for a kernel path,
        None when ``dev`` is None (no device to choose for)."""
        self._check_op(op)
        rule = self._rule(op, backend, path)
        if rule is None:
            return {}
        return None if dev is None else dict(rule.heuristic(dev, shape))

    def space(self, op: str, backend: str, path: str, dev, **shape):
        """The configs ``path`` may run on ``dev``: ``({},)`` for a plain path, else the rule's
        space (a tuple of configs, or ``{field: allowed values}``)."""
        self._check_op(op)
        rule = self._rule(op, backend, path)
        return ({},) if rule is None else rule.space(dev, shape)

    def accept(self, op: str, backend: str, path: str, dev, config, **shape) -> dict | None:
        """``config`` (from a dispatch table; fields it does not name are the heuristic's) when
        ``path`` may run it on ``dev``, else None (the caller then uses the heuristic: a table
        never selects an unchecked config). ``{}`` is the heuristic's config on a kernel path
        and the only config of a plain path."""
        if not isinstance(config, dict) or dev is None:
            return None
        rule = self._rule(op, backend, path)
        if rule is None:
            return {} if not config else None
        base = rule.heuristic(dev, shape)
        if set(config) - set(base) - set(rule.selectors):
            return None
        full = {**base, **config}                       # fields not given: the heuristic's ...
        if config:
            for f in rule.selectors:                    # ... but an absent selector: the default
                if f not in config:
                    full.pop(f, None)
        space = rule.space(dev, shape)
        if isinstance(space, tuple):
            return full if full in space else None
        for k, v in config.items():
            if v != base.get(k) and v not in space.get(k, ()):
                return None
        return full

    # ------------------------------------------------------------------ the plan
    def plan(self, op: str, backend: str, dev, *, path: str = AUTO, **shape) -> Plan:
        """(path order, config per path) of one call: the one decision ``path="auto"`` makes.

        Args:
          op: one of :data:`OPS`.
          backend: ``"torch"`` or ``"jax"``.
          dev: the ``kernels.hardware.DeviceInfo`` the call runs on, or None when the backend
            cannot tell (e.g. CPU without the interpreter): then no table is read and kernel
            paths get config None.
          path: ``"auto"`` or one of the backend's paths.
          shape: the call's dimensions: at least the op's :data:`BUCKET_KEYS`; sparse MLA also
            takes ``operand_bytes`` (2: bf16 / fp16 dots, the default; 4: fp32 dots), which
            selects the config space.
        Returns:
          a :class:`Plan`. The dispatch table (``kernels.dispatch``) is read once, for
          ``dev.arch`` and the call's bucket.
        Raises:
          ValueError: unknown op, backend or path, or a missing bucket key.
        """
        self._check_op(op)
        if path != AUTO and path not in self.paths(backend):
            raise ValueError(f"path: expected one of {self.path_choices(backend)}, got {path!r}")
        order = self.paths(backend) if path == AUTO else (path,)
        bkt = self.bucket(op, **shape)
        entry = None
        if dev is not None and op in BUCKET_KEYS:
            entry = dispatch.lookup(op, backend, dev.arch, bkt)
        chosen = entry.get("path") if entry else None
        if path == AUTO and chosen in order:
            order = (chosen,) + tuple(p for p in order if p != chosen)
        # An entry of another bucket (the nearest in log2 B / L) decides the path only: its
        # config was chosen for its own B / L (the heuristics depend on them: the Pallas tiles
        # on B x N, the split counts on B and L), so the call's config is the heuristic's at
        # its own shape. (H200, 2026-12-05: B 16 H 128 ran the B 8 entry's 16-head Pallas tiles,
        # 247 us, where the heuristic's 64-head tiles took 139 in the sweep.)
        exact = entry is not None and dispatch.matches(entry["bucket"], bkt)
        cfgs = {}
        for p in order:
            cfg = None
            if chosen == p and exact:
                cfg = self.accept(op, backend, p, dev, entry.get("config"), **shape)
            cfgs[p] = cfg if cfg is not None else self.heuristic(op, backend, p, dev, **shape)
        return Plan(op, backend, bkt, tuple(order), MappingProxyType(cfgs), entry)


def run_path(op: str, path: str, impls: Mapping[str, Callable], order: Sequence[str]):
    """Run ``impls[path]``; ``"auto"`` tries ``order`` and falls through on NotImplementedError
    (a named path re-raises: SPEC "Public names").

    Raises:
      ValueError: ``path`` is neither ``"auto"`` nor a key of ``impls``.
      NotImplementedError: the named path cannot run, or under ``"auto"`` no path of ``order``
        can (the message lists every path's reason).
    """
    if path == AUTO:
        errors = []
        for name in order:
            try:
                return impls[name]()
            except NotImplementedError as e:  # noqa: PERF203 - fall through to the next path
                errors.append(f"{name}: {e}")
        raise NotImplementedError(f"{op}: no path can run: " + "; ".join(errors))
    if path not in impls:
        raise ValueError(f"path: expected one of {(AUTO,) + tuple(impls)}, got {path!r}")
    return impls[path]()


REGISTRY = Registry()
"""The registry every consumer uses (bindings, dispatch, parity, bench)."""

plan = REGISTRY.plan
