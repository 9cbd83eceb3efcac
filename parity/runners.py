"""One adapter per (backend, path): NumPy arrays in, NumPy arrays out.

An adapter converts a case's NumPy inputs (ml_dtypes bf16 / e4m3 included) to the framework's
arrays, calls the public op with ``path=<name>`` (a named path never falls through: SPEC
"Public names"), and converts the results back with :func:`kernels.compare.to_numpy`. The
decode layer (``dsa_decode_layer``) builds the binding's ``DSADecodeLayer(cfg, weights,
path=<name>, dtype=...)`` for every tensor-parallel rank of the case and runs one step on copies
of the case's caches (torch: eager, written in place; JAX: under ``nnx.jit``).

Availability is discovered at run time, never assumed:

* the backend package does not import (not written yet, framework missing) -> every path of
  that backend is *unavailable* with the import error as the reason;
* a call raises ``NotImplementedError`` (this GPU / this shape is not supported, CPU without the
  interpreter) -> that cell is *unavailable* with the error text;
* any other exception is a failure of the path (it is reported, with its traceback's last line).

Ops, backends and paths (and their order: torch/triton, torch/torch, jax/pallas, jax/xla) are
``kernels.registry``'s (:data:`OP_REGISTRY`).

The registry (:data:`REGISTRY`) maps ``"backend/path"`` to a :class:`Runner`; tests register
deliberately broken runners through :func:`register` to prove the suite catches them.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kernels import compare, formats
from kernels.registry import AUTO, REGISTRY as OP_REGISTRY
# device detection (parity.machine, also bench's and the tests'), re-exported for the CLI
from parity.machine import has_cuda_gpu, prepare_environment  # noqa: F401

OPS = OP_REGISTRY.ops


class Unavailable(Exception):
    """A path cannot run here (import failure or NotImplementedError); the message says why."""


# ============================================================================ backends

class _Backend:
    """Lazy import of one framework binding; ``module()`` raises :class:`Unavailable`."""

    name = ""
    package = ""

    def __init__(self):
        self._mod = None
        self._err: str | None = None

    def module(self):
        if self._mod is None and self._err is None:
            try:
                self._mod = importlib.import_module(self.package)
            except Exception as e:  # noqa: BLE001 - any import failure makes the backend unavailable
                self._err = f"import {self.package} failed: {type(e).__name__}: {e}"
        if self._mod is None:
            raise Unavailable(self._err)
        return self._mod

    # framework conversions -------------------------------------------------------------
    def to_native(self, a):
        raise NotImplementedError

    def to_numpy(self, x) -> np.ndarray:
        return compare.to_numpy(x)

    def synchronize(self):
        pass

    def layer_step(self, case, *, path: str, dtype: str, tp_rank: int, tp_size: int) -> dict:
        """One step of the binding's ``DSADecodeLayer`` on ``case`` (a
        :class:`kernels.layer_reference.LayerCase`); returns ``out``, ``kv_cache``, ``k_cache``
        and the intermediates as NumPy (``idx_q`` as float8_e4m3fn)."""
        raise NotImplementedError


class TorchBackend(_Backend):
    name = "torch"
    package = "torch_impl"

    def _device(self):
        import torch
        return "cuda" if has_cuda_gpu() and torch.cuda.is_available() else "cpu"

    def to_native(self, a):
        if a is None:
            return None
        common = importlib.import_module("torch_impl._common")
        return common.as_tensor(a, device=self._device())

    def synchronize(self):
        import torch
        if self._device() == "cuda":
            torch.cuda.synchronize()

    def layer_step(self, case, *, path, dtype, tp_rank, tp_size):
        import torch
        m = self.module()
        layer = m.DSADecodeLayer(case.cfg, case.weights, tp_rank=tp_rank, tp_size=tp_size,
                                 kv_format=case.kv_format, dtype=getattr(torch, dtype),
                                 device=self._device(), path=path)
        # to_native copies, so the in-place cache writes never touch the case's arrays
        args = [self.to_native(a) for a in (case.x, case.kv_cache, case.k_cache, case.block_table,
                                            case.context_lens)]
        out, kv, kc, inter = layer(*args, return_intermediates=True)
        self.synchronize()
        res = {"out": out, "kv_cache": kv, "k_cache": kc, **inter}
        return {k: (v.view(torch.uint8).cpu().numpy().view(formats.E4M3) if v.dtype == torch.float8_e4m3fn
                    else self.to_numpy(v)) for k, v in res.items()}


class JaxBackend(_Backend):
    name = "jax"
    package = "jax_impl"

    def to_native(self, a):
        if a is None:
            return None
        import jax.numpy as jnp
        return jnp.asarray(a)

    def to_numpy(self, x) -> np.ndarray:
        import jax
        return compare.to_numpy(np.asarray(jax.device_get(x)))

    def layer_step(self, case, *, path, dtype, tp_rank, tp_size):
        import jax
        import jax.numpy as jnp
        m = self.module()
        layer = m.DSADecodeLayer(case.cfg, case.weights, tp_rank=tp_rank, tp_size=tp_size,
                                 kv_format=case.kv_format, dtype=jnp.dtype(dtype), path=path)
        out, kv, kc, inter = _jax_layer_step()(layer, *(self.to_native(a) for a in (
            case.x, case.kv_cache, case.k_cache, case.block_table, case.context_lens)))
        res = {"out": out, "kv_cache": kv, "k_cache": kc, **inter}
        res = jax.device_get(res)
        return {k: (np.asarray(v) if np.asarray(v).dtype == formats.E4M3 else self.to_numpy(v))
                for k, v in res.items()}


@functools.lru_cache(maxsize=None)
def _jax_layer_step():
    """``nnx.jit`` of one layer step with intermediates (built once; flax imported lazily)."""
    from flax import nnx

    @nnx.jit
    def step(layer, x, kv, kc, bt, cl):
        return layer(x, kv, kc, bt, cl, return_intermediates=True)
    return step


BACKENDS = {"torch": TorchBackend(), "jax": JaxBackend()}


# ============================================================================ runners

@dataclass
class Runner:
    """Runs the parity ops (:data:`OPS`) on one (backend, path).

    ``call(op, case)`` returns a dict of NumPy arrays:
    ``sparse_mla_decode`` -> {"out", "lse"}; ``indexer_logits`` -> {"logits"};
    ``indexer_topk`` -> {"indices"}; ``dsa_decode_step`` -> {"indices", "out", "lse"};
    ``dsa_decode_layer`` (a :class:`parity.cases.LayerParityCase`) -> {"out", "kv_cache",
    "k_cache", "q", "idx_q", "idx_weights", "indices", "idx_context_lens", "attn", "lse"}, with
    tp > 1 each rank's under ``"r<rank>.<name>"`` plus ``"out"``, the sum of the ranks' outputs.
    Raises :class:`Unavailable` when the path cannot run (import failure, NotImplementedError).
    """

    backend: str
    path: str
    ops: dict[str, Callable] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.backend}/{self.path}"

    def call(self, op: str, case) -> dict[str, np.ndarray]:
        if op not in self.ops:
            raise Unavailable(f"{self.key} has no {op} adapter")
        try:
            return self.ops[op](case)
        except NotImplementedError as e:
            raise Unavailable(f"NotImplementedError: {e}") from e


def _framework_runner(be: _Backend, path: str) -> Runner:
    """The adapter of a real binding: ``be.module().<op>(..., path=path)``."""
    n = be.to_native

    def mla_native(m, c, indices, block_table, topk_length=None):
        return m.sparse_mla_decode(n(c.q), n(c.kv_cache), indices, c.sm_scale,
                                   kv_format=c.kv_format, d_v=c.d_v, block_table=block_table,
                                   topk_length=topk_length, attn_sink=n(c.attn_sink), path=path)

    def sparse_mla_decode(c):
        m = be.module()
        out, lse = mla_native(m, c, n(c.indices), n(c.block_table), n(c.topk_length))
        be.synchronize()
        return {"out": be.to_numpy(out), "lse": be.to_numpy(lse)}

    def _idx_args(c):
        return (n(c.q), n(c.weights), n(c.k_cache), n(c.block_table), n(c.context_lens))

    def indexer_logits(c):
        m = be.module()
        lg = m.indexer_logits(*_idx_args(c), k_format=c.k_format, path=path)
        be.synchronize()
        return {"logits": be.to_numpy(lg)}

    def indexer_topk(c):
        m = be.module()
        idx = m.indexer_topk(*_idx_args(c), c.topk, k_format=c.k_format,
                             sorted=bool(getattr(c, "sorted", False)), path=path)
        be.synchronize()
        return {"indices": be.to_numpy(idx)}

    def dsa_decode_step(s):
        # the binding's composed step on this path (indices stay on the device between its ops)
        m = be.module()
        c, a = s.indexer, s.mla
        out, lse, idx = m.dsa_decode_step(n(a.q), n(a.kv_cache), n(c.q), n(c.weights), n(c.k_cache),
                                          n(c.block_table), n(c.context_lens), a.sm_scale, c.topk,
                                          kv_format=a.kv_format, d_v=a.d_v, attn_sink=n(a.attn_sink),
                                          k_format=c.k_format, window=s.window, path=path)
        be.synchronize()
        return {"indices": be.to_numpy(idx), "out": be.to_numpy(out), "lse": be.to_numpy(lse)}

    def dsa_decode_layer(lc):
        # every rank of the case's tensor parallelism; tp = 1 returns the step's arrays as they
        # are, tp > 1 prefixes each rank's with "r<rank>." and adds "out" = the sum of the
        # ranks' partial outputs (what the all-reduce computes)
        be.module()
        ranks = [be.layer_step(lc.case, path=path, dtype=lc.dtype, tp_rank=r, tp_size=lc.tp)
                 for r in range(lc.tp)]
        if lc.tp == 1:
            return ranks[0]
        res = {f"r{r}.{k}": v for r, g in enumerate(ranks) for k, v in g.items()}
        res["out"] = np.sum([g["out"].astype(np.float64) for g in ranks], axis=0)
        return res

    return Runner(be.name, path, dict(sparse_mla_decode=sparse_mla_decode,
                                      indexer_logits=indexer_logits, indexer_topk=indexer_topk,
                                      dsa_decode_step=dsa_decode_step,
                                      dsa_decode_layer=dsa_decode_layer))


REGISTRY: dict[str, Runner] = {}


def register(runner: Runner) -> None:
    """Add (or replace) a runner under ``"backend/path"``; used by tests to inject broken paths."""
    REGISTRY[runner.key] = runner


def unregister(key: str) -> None:
    REGISTRY.pop(key, None)


for _be in OP_REGISTRY.backends:
    for _p in OP_REGISTRY.paths(_be):
        register(_framework_runner(BACKENDS[_be], _p))


@functools.lru_cache(maxsize=None)
def _auto_runner(backend: str) -> Runner:
    return _framework_runner(BACKENDS[backend], AUTO)


def runner(backend: str, path: str) -> Runner:
    """The runner of ``path`` on ``backend``: the registered one, or for ``"auto"`` an adapter
    that calls the binding with ``path="auto"`` (its own plan and fall-through). ``"auto"`` is
    not a path, so the suite does not register or run it; the contract tests
    (``tests/test_contract.py``) check it beside the paths.

    Raises:
      KeyError: no runner is registered for a named ``path`` of ``backend``.
    """
    if path == AUTO:
        return _auto_runner(backend)
    return REGISTRY[f"{backend}/{path}"]


def select(backends=None, paths=None) -> list[Runner]:
    """Registered runners filtered by backend names and path names (None = all), in order."""
    out = []
    for r in REGISTRY.values():
        if backends and r.backend not in backends:
            continue
        if paths and r.path not in paths:
            continue
        out.append(r)
    return out


def import_status(runner: Runner) -> str | None:
    """None when the runner's backend imports (or it is not a framework runner), else why not."""
    be = BACKENDS.get(runner.backend)
    if be is None:
        return None
    try:
        be.module()
    except Unavailable as e:
        return str(e)
    return None
