"""Timers. Each returns a :class:`Timing` in microseconds per call (median, p20, p80).

* torch on CUDA: one CUDA graph holding one call per rotated input set, replayed ``reps`` times
  between CUDA events; per-call time = replay time / calls (no Python or launch overhead, the
  inputs of consecutive calls differ so the L2 does not serve them). When the path cannot be
  captured (a host sync in a plain-PyTorch path), ``triton.testing.do_bench`` with its L2 flush
  between calls, cycling through the input sets.
* JAX ops (each call a ``functools.partial`` of one jitted function over one rotated set):
  jitted groups of up to :data:`GROUP_CALLS` calls over distinct rotated sets
  (:func:`time_jax_grouped`), dispatched asynchronously in batches closed by
  ``jax.block_until_ready``; per-call time = batch time / calls. One dispatch per group, so a
  B 1 row is GPU-bound (its kernels back to back, as a serving step runs them) where one
  dispatch per call made it dispatch-bound (issue 16). A jitted ``fori_loop`` over the sets was
  tried first: XLA hoists the loop-invariant calls out of the loop even behind an
  ``optimization_barrier`` (seen on XLA:CPU), so the loop timed nothing.
* JAX decode layer (donating calls with a ``group``): one jitted call runs a chain of layer
  steps, one per rotated set, caches donated (:func:`time_jax_steps`); per-step time = batch
  time / steps. One step per dispatch measured the host at B 1 (bench/NOTES.md).
* JAX otherwise: each sample is a batch of asynchronously dispatched calls over the rotated
  sets, closed by ``jax.block_until_ready``; per-call time = batch time / calls. For kernels
  shorter than JAX's dispatch cost (~10-20 us per call) the number is dispatch-bound; rows say
  ``timer``.
* CPU dry runs: wall clock of a few calls (meaningless, labelled so).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    samples: int
    timer: str


def _stats(us: list[float], timer: str) -> Timing:
    a = np.asarray(us, np.float64)
    return Timing(float(np.median(a)), float(np.percentile(a, 20)), float(np.percentile(a, 80)),
                  int(a.size), timer)


def time_torch_cuda(calls, *, target_s: float = 0.25, max_reps: int = 200, min_reps: int = 10) -> Timing:
    """``calls``: one zero-argument callable per rotated input set."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for c in calls:                   # warm-up on a side stream before capture
                c()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in calls:
                c()
        g.replay()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - capture failed (host sync, CPU op): no graph
        torch.cuda.synchronize()
        return _time_do_bench(calls, reason=type(e).__name__)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    one = max(1e-3, start.elapsed_time(end))          # ms per replay
    reps = int(min(max_reps, max(min_reps, target_s * 1e3 / one)))
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in evs:
        s.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    us = [s.elapsed_time(e) * 1e3 / len(calls) for s, e in evs]
    del g
    return _stats(us, f"cuda_graph({len(calls)} calls/replay)")


def _time_do_bench(calls, *, reason: str) -> Timing:
    from triton.testing import do_bench

    i = [0]

    def fn():
        calls[i[0] % len(calls)]()
        i[0] += 1
    q = do_bench(fn, warmup=10, rep=100, quantiles=[0.5, 0.2, 0.8])
    return Timing(q[0] * 1e3, q[1] * 1e3, q[2] * 1e3, 0, f"do_bench(L2 flush; no graph: {reason})")


def _loop_parts(calls):
    """``(f, sets)`` when every call is ``functools.partial(f, *set)`` of one jitted ``f`` with
    positional array arguments only, else None."""
    import functools
    f = getattr(calls[0], "func", None) if calls else None
    if f is None or not hasattr(f, "lower"):
        return None
    for c in calls:
        if not isinstance(c, functools.partial) or c.func is not f or c.keywords:
            return None
    return f, [tuple(c.args) for c in calls]


GROUP_CALLS = 16       # calls of the op per jitted group (JAX ops; fewer when there are fewer sets)


def jax_call_groups(f, sets, group: int = GROUP_CALLS):
    """``(g, groups)``: ``g = jax.jit(lambda ss: tuple(f(*s) for s in ss))`` and the rotated sets
    cut into full groups of ``min(group, len(sets))``: one dispatch runs ``group`` calls of the
    op back to back. Each set's arrays differ from the others' (distinct rotated inputs), so XLA
    cannot merge two calls, and every output is returned, so none is dead."""
    import jax

    G = max(1, min(group, len(sets)))
    groups = [tuple(sets[i:i + G]) for i in range(0, len(sets) - G + 1, G)]
    g = jax.jit(lambda ss: tuple(f(*s) for s in ss))
    return g, groups


def _jax_batch_samples(batch, units: int, *, target_s: float, max_batches: int,
                       min_batches: int) -> list[float]:
    """Microseconds per unit, one sample a batch: ``batch()`` dispatches one batch of ``units``
    units of work asynchronously and returns what to wait on (``jax.block_until_ready``). One
    timed probe batch sets the sample count (``target_s`` of batches, within ``[min_batches,
    max_batches]``). The caller compiles and warms first."""
    import jax

    t = time.perf_counter()
    jax.block_until_ready(batch())
    one = time.perf_counter() - t
    batches = int(min(max_batches, max(min_batches, target_s / max(one, 1e-6))))
    us = []
    for _ in range(batches):
        t = time.perf_counter()
        jax.block_until_ready(batch())
        us.append((time.perf_counter() - t) * 1e6 / units)
    return us


def time_jax_grouped(f, sets, *, target_s: float = 0.25, max_batches: int = 50,
                     min_batches: int = 5, min_groups: int = 4) -> Timing:
    """Per-call time of ``f`` over the rotated ``sets`` with :func:`jax_call_groups`: each sample
    is a batch of asynchronously dispatched group calls (cycling over the groups), closed by
    ``jax.block_until_ready``; per-call time = batch time / calls in it. One dispatch per group
    instead of per call: once a group's GPU time exceeds its dispatch (a few tens of us), the
    batch is GPU-bound and the number is the kernels' (issue 16: B 1 rows measured dispatch)."""
    import jax

    g, groups = jax_call_groups(f, sets)
    G = len(groups[0])
    jax.block_until_ready(g(groups[0]))             # compile (excluded)
    jax.block_until_ready([g(gr) for gr in groups])  # warm every set
    per_batch = max(min_groups, len(groups))
    us = _jax_batch_samples(lambda: [g(groups[i % len(groups)]) for i in range(per_batch)],
                            per_batch * G, target_s=target_s, max_batches=max_batches,
                            min_batches=min_batches)
    return _stats(us, f"jax jitted groups ({G} calls per dispatch, {per_batch} groups per batch, "
                      f"block_until_ready)")


def time_jax(calls, *, target_s: float = 0.25, max_batches: int = 50, min_batches: int = 5,
             min_calls: int = 8) -> Timing:
    """``calls``: one zero-argument callable per rotated input set, each returning jax arrays.
    Partials of one jitted function (the op rows) are timed in jitted groups of calls
    (:func:`time_jax_grouped`); anything else (the layer's donating calls) as an asynchronously
    dispatched batch of single calls."""
    import jax

    parts = _loop_parts(calls)
    if parts is not None:
        return time_jax_grouped(*parts, target_s=target_s)
    group = getattr(calls[0], "group", None) if calls else None
    if group is not None:
        return time_jax_steps(group, target_s=target_s, max_batches=max_batches,
                              min_batches=min_batches)

    per_batch = max(min_calls, len(calls))
    jax.block_until_ready(calls[0]())                # compile (excluded)
    jax.block_until_ready([c() for c in calls])       # warm every set
    us = _jax_batch_samples(lambda: [calls[i % len(calls)]() for i in range(per_batch)], per_batch,
                            target_s=target_s, max_batches=max_batches, min_batches=min_batches)
    return _stats(us, f"jax async batch ({per_batch} calls, block_until_ready)")


def time_jax_steps(group, *, target_s: float = 0.25, max_batches: int = 50, min_batches: int = 5,
                   min_calls: int = 4) -> Timing:
    """Per-step time of a JAX layer row from ``group`` (``bench.paths._DonatingLayerGroup``: one
    call runs ``group.steps`` chained layer steps, one a rotated set, caches donated): each
    sample is a batch of asynchronously dispatched group calls closed by
    ``jax.block_until_ready``; per-step time = batch time / (calls x steps)."""
    import jax

    jax.block_until_ready(group())                    # compile (excluded)
    jax.block_until_ready(group())                    # warm
    us = _jax_batch_samples(lambda: [group() for _ in range(min_calls)], min_calls * group.steps,
                            target_s=target_s, max_batches=max_batches, min_batches=min_batches)
    return _stats(us, f"jax jitted chain of {group.steps} layer steps per dispatch (one per "
                      f"rotated set, caches donated; {min_calls} dispatches per batch, "
                      f"block_until_ready)")


def time_cpu(calls, *, reps: int = 1) -> Timing:
    """Dry-run timer: wall clock per call on the host (interpreter; meaningless)."""
    try:                          # imported before the clock starts (seconds on a first import)
        import jax
        wait = jax.block_until_ready
    except Exception:  # noqa: BLE001 - jax missing: torch outputs are ready on return
        wait = None
    us = []
    for r in range(reps):
        c = calls[r % len(calls)]
        t = time.perf_counter()
        out = c()
        if wait is not None:
            try:
                wait(out)
            except Exception:  # noqa: BLE001 - torch outputs
                pass
        us.append((time.perf_counter() - t) * 1e6)
    return _stats(us, "cpu wall clock (dry run: meaningless)")


def sweep_device(tool: str, dry_run: bool):
    """``(dry, device, activation dtype)`` of a torch GPU sweep (``bench.linear_sweep``,
    ``bench.prep_sweep``): the CUDA GPU in bf16, or with ``dry_run`` / no GPU the CPU
    interpreter in fp16 (plumbing only: the interpreter computes bf16 on raw bits).

    Raises:
      SystemExit: no CUDA GPU and ``TRITON_INTERPRET`` unset (names ``tool``).
    """
    import torch

    from torch_impl import _common
    dry = dry_run or not torch.cuda.is_available()
    if dry and not _common.interpret_mode():
        raise SystemExit(f"{tool}: no CUDA GPU; run with TRITON_INTERPRET=1 for the dry run")
    return dry, torch.device("cpu" if dry else "cuda"), torch.float16 if dry else torch.bfloat16
