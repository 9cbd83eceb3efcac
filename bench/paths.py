"""The op paths the bench can time, discovered at run time.

One adapter per backend turns a shape's torch input sets into zero-argument callables, one per
rotated set, that run the named path and return a dict of framework arrays:
``indexer_topk`` -> ``{"indices"}``, ``sparse_mla_decode`` -> ``{"out", "lse"}``,
``dsa_decode_step`` -> ``{"indices", "out", "lse"}`` (the binding's ``dsa_decode_step``, with
the shape's V4 window), ``dsa_decode_layer`` -> ``{"out", "indices",
"idx_q", "idx_weights", "idx_context_lens", "kv_cache", "k_cache"}`` (one step of the binding's
``DSADecodeLayer`` built with ``path=<name>`` in the inputs' dtype; the intermediates are ones the
step computes anyway). The layer writes the new tokens into the caches in place (torch) or
through donated buffers (JAX, see :class:`_DonatingLayerCall`); the torch step has no host
synchronisation, so its rows are timed inside one CUDA graph (``timer``), on CUDA as
``torch.compile(layer, fullgraph=True)`` (``DSA_BENCH_COMPILE_LAYER=0``: the eager module; row
``config``), with the layer's fused step preparation as ``DSA_LAYER_FUSED_PREP`` sets it (row
``config`` ``fused_prep``), and
carry the step's phases from the profiler (:func:`torch_layer_phases`). A backend that does not import,
or a path that raises NotImplementedError, is reported as unavailable with the reason, never as
a failure.

``REGISTRY`` maps backend name -> adapter; tests register stub backends there. Ops, backends
and paths are ``kernels.registry``'s (:data:`OP_REGISTRY`); the bindings are imported through
parity's backend adapters (``parity.runners.BACKENDS``: one import, one reason when it fails).

``path="auto"`` is timed like a path (``python -m bench --path auto``): the bindings plan the
call with ``kernels.registry`` (dispatch table first, then the fall-through order).

Kernel configs: every row records the config its call ran, from the same plan the binding
makes (:meth:`Backend.plan`, ``kernels.registry.Registry.plan`` for this backend, device and
shape): ``{}`` for a plain path, the kernel's launch parameters for a kernel path, and for
compositions (``dsa_decode_step``, ``dsa_decode_layer``) ``{op: config}`` of the ops they call.
``auto`` rows also record the path the plan runs first (``auto_path``).
"""
from __future__ import annotations

import functools
import math
import re

from bench.inputs import Inputs
from kernels.registry import AUTO, REGISTRY as OP_REGISTRY

OPS = OP_REGISTRY.timed_ops
LAYER_OUTPUTS = ("indices", "idx_q", "idx_weights", "idx_context_lens")
"""The layer intermediates a ``dsa_decode_layer`` call returns besides ``out`` and the caches."""


# the kernel ops each timed op calls (their plans are the row's config)
_CALLS = {"sparse_mla_decode": ("sparse_mla_decode",), "indexer_topk": ("indexer_topk",),
          "dsa_decode_step": ("indexer_topk", "sparse_mla_decode"),
          "dsa_decode_layer": ("indexer_topk", "sparse_mla_decode")}


def plan_dims(op: str, inp: Inputs) -> dict:
    """The ``kernels.registry`` shape of kernel op ``op`` as a bench shape calls it (the bucket
    keys the bindings pass: the indexer's L is the block table's capacity)."""
    sh = inp.shape
    if op == "indexer_topk":
        return dict(B=sh.B, N=sh.N, L=sh.table_positions, topk=sh.K_topk)
    return dict(B=sh.B, N=sh.N, H=sh.H, K=sh.K_topk + sh.W_window, d_qk=sh.p.d_qk,
                kv_format=sh.kv_format, operand_bytes=4 if inp.q_dtype == "float32" else 2)


def registry_plan(backend: str, dev, op: str, inp: Inputs, path: str):
    """``(path run first, config)`` of one timed call from ``kernels.registry``'s plan: for a
    composition, ``({op: path}, {op: config})`` of the ops it calls (the path collapses to one
    name when all agree)."""
    plans = {name: OP_REGISTRY.plan(name, backend, dev, path=path, **plan_dims(name, inp))
             for name in _CALLS[op]}
    if op in plans:
        return plans[op].path, plans[op].config
    ran = {n: p.path for n, p in plans.items()}
    return (next(iter(ran.values())) if len(set(ran.values())) == 1 else ran,
            {n: p.config for n, p in plans.items()})


class Backend:
    """Adapter interface."""

    name = "?"
    paths: tuple[str, ...] = ()

    def load(self):
        """Import the binding package; raise ImportError (or anything) with the reason."""
        raise NotImplementedError

    def prepare(self, op: str, inp: Inputs, path: str) -> list:
        """One zero-argument callable per input set."""
        raise NotImplementedError

    def config(self, op: str, inp: Inputs, path: str):
        """The kernel config this call runs, or None when the adapter cannot tell."""
        return None

    def plan(self, op: str, inp: Inputs, path: str):
        """``(path the call runs first, config it runs)``; ``path`` may be ``"auto"``. The
        default: the named path (``"auto"``: the first of :attr:`paths`) and :meth:`config`."""
        return (self.paths[0] if path == AUTO else path), self.config(op, inp, path)

    def sync(self, outputs) -> None:
        """Wait until ``outputs`` are computed."""


class TorchBackend(Backend):
    name = "torch"
    paths = OP_REGISTRY.paths("torch")

    def load(self):
        from parity.runners import BACKENDS
        return _load(BACKENDS["torch"])

    def _fns(self, inp: Inputs, path: str):
        m = self.load()
        sh = inp.shape
        topk = sh.K_topk

        def topk_fn(s, sorted=False):
            return m.indexer_topk(s["iq"], s["iw"], s["k_cache"], s["block_table"], s["context_lens"],
                                  topk, k_format="fp8_indexer", sorted=sorted, path=path)

        def mla_fn(s, idx):
            return m.sparse_mla_decode(s["q"], s["kv_cache"], idx, inp.sm_scale, kv_format=sh.kv_format,
                                       d_v=sh.p.d_v, block_table=s["block_table"],
                                       attn_sink=s["attn_sink"], path=path)
        return topk_fn, mla_fn

    def prepare(self, op, inp, path):
        if op == "dsa_decode_layer":
            return self._prepare_layer(inp, path)
        m = self.load()
        topk_fn, mla_fn = self._fns(inp, path)
        sh = inp.shape

        def call(s):
            if op == "indexer_topk":
                return {"indices": topk_fn(s)}
            if op == "sparse_mla_decode":
                out, lse = mla_fn(s, s["indices"])
                return {"out": out, "lse": lse}
            out, lse, idx = m.dsa_decode_step(s["q"], s["kv_cache"], s["iq"], s["iw"], s["k_cache"],
                                              s["block_table"], s["context_lens"], inp.sm_scale,
                                              sh.K_topk, kv_format=sh.kv_format, d_v=sh.p.d_v,
                                              attn_sink=s["attn_sink"], window=sh.W_window, path=path)
            return {"indices": idx, "out": out, "lse": lse}
        return [functools.partial(call, s) for s in inp.sets]

    def _prepare_layer(self, inp, path):
        import torch

        m = self.load()
        layer = m.DSADecodeLayer(inp.shape.layer_cfg, inp.extra["layer_weights"], tp_size=inp.shape.tp,
                                 kv_format=inp.shape.kv_format, dtype=getattr(torch, inp.q_dtype),
                                 device=inp.device, path=path)
        # on CUDA (DSA_BENCH_COMPILE_LAYER unset or 1): time torch.compile(layer, fullgraph=True)
        # inside the same CUDA graph, as serving runs it: Inductor fuses the elementwise glue
        fn = torch.compile(layer, fullgraph=True) if _compile_layer(inp.device) else layer

        def call(s):
            out, kv, kc, inter = fn(s["x"], s["kv_cache"], s["k_cache"], s["block_table"],
                                    s["context_lens"], return_intermediates=True)
            return {"out": out, "kv_cache": kv, "k_cache": kc, **{k: inter[k] for k in LAYER_OUTPUTS}}
        return [functools.partial(call, s) for s in inp.sets]

    def plan(self, op, inp, path):
        ran, cfg = registry_plan("torch", _device(_torch_dev(inp)), op, inp, path)
        if op == "dsa_decode_layer":        # how the layer itself ran (DSA_BENCH_COMPILE_LAYER),
            # its GEMMs (DSA_LAYER_LINEAR) and its step preparation (DSA_LAYER_FUSED_PREP; the
            # layer is built without either argument, so it reads the environment)
            from torch_impl.layer import (GEMV_N_MAJOR, fused_prep_default, gemv_on, linear_switch,
                                          overlap_applies, overlap_default, overlap_sm_carveout)
            lin, fused = linear_switch(None, inp.shape.layer_cfg.absorbed), fused_prep_default()
            T = inp.shape.B * inp.shape.N
            cfg = dict(cfg, torch_compile_fullgraph=_compile_layer(inp.device),
                       linear=sorted(n for n, c in lin.items() if c == "triton"),
                       # one-token steps: the GEMMs on the one-token kernel where their weight
                       # is K-major (torch_impl.layer.gemv_applies; wkv_b_q's is not)
                       linear_gemv=sorted(n for n, c in lin.items()
                                          if c == "gemv" and n not in GEMV_N_MAJOR)
                       if (T == 1 and gemv_on() and path != "torch"
                           and str(inp.device).startswith("cuda")) else [],
                       fused_prep=fused,
                       # the indexer's branch on a side stream (dsa::q_index_overlap)
                       overlap=overlap_applies(T, str(inp.device).split(":")[0], fused, path, lin,
                                               overlap_default()))
            if cfg["overlap"]:              # SMs the q projection leaves to the indexer
                cfg["overlap_sm_carveout"] = overlap_sm_carveout()
        return ran, cfg

    def sync(self, outputs):
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()


# Decode-layer phases from the profiler's GPU time (torch on CUDA), by the op that launched each
# kernel: the two DSA custom ops (every kernel inside them, sorts included), and the GEMM ops.
# V4's ``dsa::indexer_topk_window`` also launches the window kernel, which is glue: its GPU time
# (by kernel name, :data:`LAYER_PHASE_GLUE_KERNELS`) is taken off the indexer phase. (The
# indexer's own profiler ranges cannot carry the phase: Triton's launches are not attributed to
# ``record_function`` ranges, measured on an H100 on 2026-12-07, indexer phase 0.0 us that way.)
LAYER_PHASE_OPS = {"indexer": ("dsa::indexer_topk", "dsa::indexer_topk_window"),
                   "sparse_mla": ("dsa::sparse_mla_decode",),
                   "projections": ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm",
                                   "dsa::linear", "dsa::linear_pair")}
# Glue kernels a phase op launches, by op: their time is the glue's (the step launches them only
# inside that op: V4's window, written into the tail of the index list).
LAYER_PHASE_GLUE_KERNELS = {"dsa::indexer_topk_window": ("indexer", ("_window_split_kernel",))}


def _device_us(e) -> float:
    v = getattr(e, "device_time_total", None)
    return float(getattr(e, "cuda_time_total", 0.0) if v is None else v)


def torch_layer_phases(calls, reps: int = 5) -> dict:
    """Mean GPU time per call (us) of each phase of a torch layer step, from ``torch.profiler``
    over ``reps`` rounds of ``calls`` run eagerly (the kernels the graph replays): a phase is the
    GPU time of the kernels launched inside its ops (:data:`LAYER_PHASE_OPS`; a GEMM inside a DSA
    op counts for that op), ``other_kernels`` the GPU time of every other kernel (the glue's:
    norms, rope, quantizers, cache writes, casts). Returns ``{"projections", "indexer",
    "sparse_mla", "other_kernels", "kernels_per_step", "top_kernels_us"}`` (every GPU kernel /
    memcpy record per call; the twelve kernels of most GPU time per call by name, phases' and
    glue's alike: where the glue is, since a kernel is not linked to its op here)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for c in calls:
        c()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for c in calls:
                c()
        torch.cuda.synchronize()
    return layer_phase_totals(prof.events(), reps * len(calls))


def layer_phase_totals(events, n: int) -> dict:
    """:func:`torch_layer_phases`' sums over profiler ``events`` (``prof.events()``: objects with
    ``name``, ``device_type``, ``cpu_parent`` and the profiler's time fields), per call of ``n``:
    a phase op's GPU time where no phase op encloses it, less the glue kernels it launched
    (:data:`LAYER_PHASE_GLUE_KERNELS`); ``other_kernels`` every other kernel's."""
    from torch.autograd import DeviceType

    phase_of = {name: ph for ph, names in LAYER_PHASE_OPS.items() for name in names}
    tot = {"projections": 0.0, "indexer": 0.0, "sparse_mla": 0.0}
    all_us, all_n = 0.0, 0
    by_name: dict[str, float] = {}
    seen: set[str] = set()
    for e in events:
        if getattr(e, "device_type", None) == DeviceType.CUDA:      # a kernel / memcpy record
            if getattr(e, "is_user_annotation", False):   # a range's GPU-timeline span, not a kernel
                continue
            us = _device_us(e) or float(getattr(e, "self_device_time_total", 0.0) or 0.0)
            all_us += us
            all_n += 1
            by_name[e.name] = by_name.get(e.name, 0.0) + us
            continue
        ph = phase_of.get(e.name)
        if ph is None:
            continue
        parent, nested = e.cpu_parent, False
        while parent is not None:
            nested = nested or parent.name in phase_of
            parent = parent.cpu_parent
        if not nested:
            tot[ph] += _device_us(e)
            seen.add(e.name)
    for op, (ph, kernels) in LAYER_PHASE_GLUE_KERNELS.items():
        if op in seen:
            tot[ph] = max(0.0, tot[ph] - sum(by_name.get(k, 0.0) for k in kernels))
    main = sum(tot.values())
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {**{k: v / n for k, v in tot.items()}, "other_kernels": max(0.0, all_us - main) / n,
            "kernels_per_step": all_n / n,
            "top_kernels_us": {k[:80]: round(v / n, 2) for k, v in top}}


# Decode-layer phases of a JAX step from the profiler's device trace (jax.profiler, perfetto
# JSON), by kernel name: the Pallas kernels carry their pallas_call names (kernels/sparse_mla/
# pallas.py "sparse_mla_split" / "sparse_mla_combine", kernels/indexer/pallas.py
# "indexer_logits" / "indexer_topk_*"), the GEMMs XLA hands to cuBLAS / cuBLASLt / CUTLASS the
# library's kernel names; every other kernel (XLA fusions: norms, rope, quantizers, cache
# writes, the indexer's and MLA's own XLA glue) is glue. Matched in this order, case-insensitive.
JAX_LAYER_PHASE_KERNELS = (("sparse_mla", ("sparse_mla",)), ("indexer", ("indexer",)),
                           ("projections", ("gemm", "xmma", "cutlass", "nvjet", "cublas",
                                            "matmul")))


def jax_trace_kernels(trace: dict) -> list[tuple[str, float]]:
    """``(name, duration_us)`` of every device kernel of a Chrome / perfetto trace dict (what
    ``jax.profiler.trace(..., create_perfetto_trace=True)`` writes, gunzipped): the complete
    (``"ph": "X"``) events on the ``Stream ...`` threads of the ``/device:GPU:*`` processes (the
    derived "XLA Ops" / "XLA Modules" lines of those processes repeat the kernels and are
    skipped)."""
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    gpu_pids, stream_tids = set(), set()
    for e in events:
        if e.get("ph") != "M":
            continue
        name = str(e.get("args", {}).get("name", ""))
        if e.get("name") == "process_name" and name.startswith("/device:GPU"):
            gpu_pids.add(e.get("pid"))
        elif e.get("name") == "thread_name" and name.lower().startswith("stream"):
            stream_tids.add((e.get("pid"), e.get("tid")))
    return [(str(e.get("name", "")), float(e.get("dur", 0.0))) for e in events
            if e.get("ph") == "X" and e.get("pid") in gpu_pids
            and (e.get("pid"), e.get("tid")) in stream_tids]


_HLO_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\([^{]*)?\{\s*$")
_HLO_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\(")
_HLO_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)="
                        r"\{?%?([\w.\-]+(?:,\s*%?[\w.\-]+)*)")
_HLO_DOT_OPS = ("dot_general", "einsum", "matmul")
_HLO_COMMENT = re.compile(r"/\*.*?\*/")
_HLO_PARAM_SHAPE = re.compile(r":\s*([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HLO_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64",
               "float8_e4m3fn": "f8e4m3fn", "float8_e5m2": "f8e5m2", "uint8": "u8", "int8": "s8",
               "int32": "s32", "int64": "s64"}


def _numel(dims: str) -> int:
    """Elements of an HLO shape's dimension list (``"512,256"``; ``""`` a scalar)."""
    return math.prod(int(d) for d in filter(None, dims.split(",")))


def hlo_weight_keys(arrays, min_elements: int = 1 << 16) -> set[tuple[str, int]]:
    """``(HLO dtype name, element count)`` of every array in ``arrays`` (anything with
    ``dtype`` and ``shape``, e.g. the leaves of a layer's nnx state) of two or more dimensions
    and at least ``min_elements`` elements (norm vectors and the sink are no keys): the keys
    :func:`jax_projection_kernels` matches fusion parameters against (a reshaped or bitcast
    weight keeps its count)."""
    out = set()
    for a in arrays:
        shape, dt = getattr(a, "shape", None), getattr(a, "dtype", None)
        if shape is None or dt is None:
            continue
        n = math.prod(int(d) for d in shape)
        name = _HLO_DTYPES.get(str(dt))
        if name is not None and n >= min_elements and len(shape) >= 2:
            out.add((name, n))
    return out


def _hlo_computations(hlo_text: str) -> tuple[dict, dict, str | None]:
    """An HLO module's computations: ``{name: [(instruction, op, line), ...]}``, their header
    lines ``{name: line}`` and the ENTRY computation's name."""
    comps: dict[str, list[tuple[str, str, str]]] = {}
    heads: dict[str, str] = {}
    entry, cur = None, None
    for line in hlo_text.splitlines():
        # XLA numbers every fifth parameter / tuple element in a comment (``/*index=5*/``): its
        # "=" made a header of six or more parameters (the layer step's ENTRY, a wide fusion)
        # read as an instruction, so that computation's lines fell into the one before it
        line = _HLO_COMMENT.sub("", line)
        m = _HLO_COMP.match(line)
        if m and "=" not in line.split("{")[0]:
            cur = comps.setdefault(m.group(1), [])
            heads[m.group(1)] = line
            if line.lstrip().startswith("ENTRY"):
                entry = m.group(1)
            continue
        if cur is not None:
            mi = _HLO_INSTR.match(line)
            if mi:
                cur.append((mi.group(1), mi.group(2), line))
    return comps, heads, entry


def jax_projection_kernels(hlo_text: str, weight_shapes=()) -> set[str]:
    """Kernel names of the dots in an optimised HLO module (``jax.jit(f).lower(...).compile()
    .as_text()``): every instruction that is a ``dot`` / ``convolution``, a GEMM custom call, or
    a fusion whose computation holds one or a ``multiply`` / ``reduce`` with a dot's metadata
    (``op_name`` ending in ``dot_general``). The last case is how XLA:GPU emits a GEMV: at
    B = 1 its algebraic simplifier rewrites a vector-matrix dot into ``multiply`` + ``reduce``
    (an ``input_reduce_fusion``), which has no dot left but whose multiply / reduce keep the
    dot's metadata (bitcasts / converts carrying it into a consumer fusion do not count). Names are
    sanitised as XLA:GPU names its kernels (``.`` and ``-`` -> ``_``). The jax layer's phases
    count these as projections, as the torch layer counts every ``mm`` / ``bmm`` / ``addmm``
    (the Hadamard rotation included).

    ``weight_shapes``: ``(dtype, shape)`` of the layer's weight arrays (:func:`hlo_weight_keys`).
    A kernel-level fusion whose computation takes an array of a weight's HLO dtype and element
    count (>= 2^16 elements) counts as well, whatever its metadata: on the H200 (2026-12-05,
    ``bench_h200_targets_jax_20261205.json``) the metadata rule alone named no kernel of the
    jax layer step (``hlo_projection_kernels`` empty, V4 B 1 projections at 144 % of copy
    bandwidth: XLA:GPU's GEMV fusions did not carry a dot's ``op_name``). Fusions list their
    parameters' shapes in the called computation's header (``%fused_computation (param_0:
    bf16[512,256], ...)``), not at the call site, so the rule reads the headers."""
    wkeys = {(str(d), int(n)) for d, n in weight_shapes}
    comps, heads, _ = _hlo_computations(hlo_text)
    reads_weight = {name: any((d, _numel(dims)) in wkeys
                              for d, dims in _HLO_PARAM_SHAPE.findall(head.split("->")[0]))
                    for name, head in heads.items()} if wkeys else {}

    def dotlike_line(op: str, line: str) -> bool:
        # a dot, a GEMM library call, or the arithmetic of a rewritten dot (its multiply /
        # reduce keep the dot's op_name); bitcasts, converts and copies that merely carry a
        # dot's metadata into a consumer fusion do not count
        if op in ("dot", "convolution"):
            return True
        if op == "custom-call":
            return any(t in line.lower() for t in ("gemm", "matmul", "cublas"))
        if op not in ("reduce", "multiply"):
            return False
        meta = re.search(r'op_name="([^"]*)"', line)
        return bool(meta) and any(meta.group(1).endswith(t) or f"/{t}" in meta.group(1)
                                  for t in _HLO_DOT_OPS)

    memo: dict[str, bool] = {}

    def comp_dotlike(name: str, seen=()) -> bool:
        if name in memo:
            return memo[name]
        hit = False
        for _, op, line in comps.get(name, ()):
            if dotlike_line(op, line):
                hit = True
                break
            m = _HLO_CALLS.search(line)
            if m and any(comp_dotlike(c.strip().lstrip("%"), seen + (name,))
                         for c in m.group(1).split(",") if c.strip().lstrip("%") not in seen):
                hit = True
                break
        memo[name] = hit
        return hit

    fused = set()                   # computations inlined into a fusion: not kernels themselves
    for instrs in comps.values():
        for _, op, line in instrs:
            m = _HLO_CALLS.search(line) if op == "fusion" else None
            if m:
                fused.update(c.strip().lstrip("%") for c in m.group(1).split(","))
    out = set()
    for comp, instrs in comps.items():
        if comp in fused:
            continue
        for name, op, line in instrs:
            if op == "fusion":
                m = _HLO_CALLS.search(line)
                called = m.group(1).split(",") if m else []
                hit = any(comp_dotlike(c.strip().lstrip("%"))
                          or reads_weight.get(c.strip().lstrip("%"), False) for c in called)
            else:
                hit = op in ("dot", "convolution") or (op == "custom-call" and dotlike_line(op, line))
            if hit:
                out.add(re.sub(r"[.\-]", "_", name))
    return out


def jax_phase_totals(kernels, n_calls: int, projection_kernels=()) -> dict:
    """Mean time per call (us) of each :data:`JAX_LAYER_PHASE_KERNELS` phase and of the other
    kernels over ``kernels`` (:func:`jax_trace_kernels` of ``n_calls`` steps), the kernel count
    per step, and the five largest other kernels by name (``other_top``: what to look at when a
    name changes). ``projection_kernels``: kernel names that are projections whatever their
    name says (:func:`jax_projection_kernels` of the step's optimised HLO: XLA's GEMV reduce
    fusions at B = 1); the Pallas kernels' names are matched first."""
    tot = {ph: 0.0 for ph, _ in JAX_LAYER_PHASE_KERNELS}
    other, other_by = 0.0, {}
    proj = set(projection_kernels)
    for name, us in kernels:
        low = name.lower()
        ph = next((p for p, pats in JAX_LAYER_PHASE_KERNELS if any(x in low for x in pats)), None)
        if ph not in ("sparse_mla", "indexer") and name in proj:
            ph = "projections"
        if ph is None:
            other += us
            other_by[name] = other_by.get(name, 0.0) + us
        else:
            tot[ph] += us
    n = max(1, n_calls)
    top = sorted(other_by.items(), key=lambda kv: -kv[1])[:5]
    return {**{k: v / n for k, v in tot.items()}, "other_kernels": other / n,
            "kernels_per_step": len(kernels) / n,
            "other_top": {k[:80]: round(v / n, 2) for k, v in top}}


def _jax_device_kernels(calls, reps: int) -> list[tuple[str, float]]:
    """The device kernels (:func:`jax_trace_kernels`) of ``reps`` rounds of ``calls`` (each
    blocked on, after one warm round) under ``jax.profiler.trace`` with a perfetto trace."""
    import glob
    import gzip
    import json
    import tempfile

    import jax
    for c in calls:
        jax.block_until_ready(c())
    with tempfile.TemporaryDirectory(prefix="dsa-jax-trace-") as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(reps):
                for c in calls:
                    jax.block_until_ready(c())
        files = glob.glob(f"{d}/**/perfetto_trace.json.gz", recursive=True)
        if not files:
            raise RuntimeError(f"jax.profiler wrote no perfetto_trace.json.gz under {d}")
        with gzip.open(files[0], "rt") as f:
            trace = json.load(f)
    return jax_trace_kernels(trace)


def jax_indexer_phase_totals(kernels, n_calls: int) -> dict:
    """``{"logits_us", "topk_us"}`` per call from device kernels by name: the Pallas logits kernel
    (``indexer_logits``) and the Pallas top-k kernels (``indexer_topk_*``: prune, count, compact,
    select); XLA's own small kernels around them (the lengths' pad, the -1 pad) are in neither,
    as the torch rows count only their named kernels. ``topk_kernels_us``: each top-k kernel's
    time per call by name (which of the four a B 1 row waits on; the torch rows get theirs from
    ``scripts/profile_kernels.py``)."""
    logits = sum(us for name, us in kernels if "indexer_logits" in name.lower())
    by_name: dict[str, float] = {}
    for name, us in kernels:
        if "indexer_topk" in name.lower():
            by_name[name[:80]] = by_name.get(name[:80], 0.0) + us
    n = max(1, n_calls)
    return {"logits_us": logits / n, "topk_us": sum(by_name.values()) / n,
            "topk_kernels_us": {k: round(v / n, 3) for k, v in sorted(by_name.items())}}


def jax_indexer_phases(calls, reps: int = 5) -> dict:
    """:func:`torch_indexer_phases` for a JAX ``indexer_topk`` row: the Pallas kernels' device time
    from a ``jax.profiler`` trace (:func:`jax_indexer_phase_totals`). Needs a process in which
    torch.profiler has not run (CUPTI takes one subscriber): a trace without kernels raises."""
    kern = _jax_device_kernels(calls, reps)
    if not kern:
        raise RuntimeError("no device kernel in the jax.profiler trace (CUPTI refuses a second "
                           "subscriber: time the jax rows in their own process, --backend jax)")
    t = jax_indexer_phase_totals(kern, reps * len(calls))
    return {**t, "topk_timer": f"jax.profiler device trace, Pallas kernels by name (mean of "
                               f"{reps * len(calls)} blocked calls)"}


# HLO ops that launch nothing (or are the command-buffer call itself, counted apart)
_HLO_NO_KERNEL = frozenset(("parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                            "after-all", "opt-barrier", "partition-id", "replica-id"))


def hlo_command_buffer_summary(hlo_text: str) -> dict:
    """How much of an optimised GPU HLO module's ENTRY runs inside XLA's command buffers (CUDA
    graphs): ``command_buffer_calls`` (``call`` instructions of a ``command_buffer*``
    computation), ``ops_in_command_buffers`` (the instructions of those computations that
    launch work: not parameters, constants, tuples, bitcasts), and the ENTRY's launching
    instructions outside them by op (``ops_outside``) and, for custom calls, by
    ``custom_call_target`` (``custom_calls_outside``; a Pallas kernel is
    ``__gpu$xla.gpu.triton``). Each launch outside a command buffer is a separate host-side
    launch: at B 1 those are what can leave the GPU idle. An HLO whose command buffers are
    formed later (at the thunk level, in newer XLA) shows no ``command_buffer`` computation:
    then ``command_buffer_calls`` is 0 and only a profile tells."""
    comps, _, entry = _hlo_computations(hlo_text)
    cmd = {n for n in comps if n.startswith("command_buffer")}
    calls, ops, targets, called = 0, {}, {}, []
    for _, op, line in comps.get(entry, []):
        callee = _HLO_CALLS.search(line)
        if op == "call" and callee and callee.group(1) in cmd:
            calls += 1
            called.append(callee.group(1))
            continue
        if op in _HLO_NO_KERNEL:
            continue
        ops[op] = ops.get(op, 0) + 1
        if op == "custom-call":
            t = re.search(r'custom_call_target="([^"]*)"', line)
            key = t.group(1) if t else "?"
            targets[key] = targets.get(key, 0) + 1
    inside = sum(1 for n in called for _, op, _ in comps[n] if op not in _HLO_NO_KERNEL)
    return {"command_buffer_calls": calls, "ops_in_command_buffers": inside,
            "ops_outside": dict(sorted(ops.items())),
            "custom_calls_outside": dict(sorted(targets.items()))}


def jax_layer_phases(calls, reps: int = 5, save_hlo=None) -> dict:
    """:func:`torch_layer_phases` for a JAX layer step: ``reps`` rounds of ``calls`` (each
    blocked on) under ``jax.profiler.trace`` with a perfetto trace, the device kernels split by
    name (:func:`jax_phase_totals`); a call with ``hlo_text()`` (:class:`_DonatingLayerCall`)
    adds the projection kernels its optimised HLO names (:func:`jax_projection_kernels`), and
    the result records how many kernels came from it (``hlo_projection_kernels``) and what of
    the step runs outside XLA's command buffers (``hlo_command_buffers``:
    :func:`hlo_command_buffer_summary`); ``save_hlo`` (a path): that HLO text is also written
    there."""
    proj = set()
    hlo = getattr(calls[0], "hlo_text", None) if calls else None
    if hlo is not None:
        wk = getattr(calls[0], "weight_keys", None)
        text = hlo()
        if save_hlo is not None:
            from pathlib import Path
            Path(save_hlo).parent.mkdir(parents=True, exist_ok=True)
            Path(save_hlo).write_text(text)
        proj = jax_projection_kernels(text, wk() if wk is not None else ())
        cmdbuf = hlo_command_buffer_summary(text)
    kern = _jax_device_kernels(calls, reps)
    out = jax_phase_totals(kern, reps * len(calls), proj)
    out["hlo_projection_kernels"] = sorted({n for n, _ in kern if n in proj})
    if hlo is not None:
        out["hlo_command_buffers"] = cmdbuf
    return out


# indexer_topk phases: the profiler ranges torch_impl.indexer opens around its two phases while
# a profiler records (the logits kernel, then every kernel of the top-k).
INDEXER_PHASES = {"logits": "dsa::indexer_topk/logits", "topk": "dsa::indexer_topk/topk"}


def indexer_phase_totals(events, on_gpu: bool) -> dict:
    """Total time (us) of each :data:`INDEXER_PHASES` phase over profiler ``events``
    (``prof.events()``: objects with ``name``, ``device_type`` and the profiler's time fields):
    on the GPU the device time of the kernels by name (the Triton kernels whose name holds
    ``logits`` for the logits, ``topk`` for the top-k; other kernels, e.g. the output fill, are
    not counted; nor are the ranges' own GPU-timeline annotations, named ``dsa::...``, which
    span the kernels: counting them tripled topk_us on the H200): measured on the H200
    (2026-12-02), Triton's driver-API launches are not
    attributed to the enclosing profiler range (the ranges carried ~1 us of fill kernels), so
    the ranges are the fallback only when no kernel name matches; on the CPU the ranges' CPU
    time (the interpreter runs the kernels inside them). Returns ``{"logits", "topk", "how"}``."""
    from torch.autograd import DeviceType

    tot = {"logits": 0.0, "topk": 0.0}
    kern = {"logits": 0.0, "topk": 0.0}
    by_name = {v: k for k, v in INDEXER_PHASES.items()}
    for e in events:
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            if "::" in e.name:          # a range's GPU-timeline annotation ("dsa::indexer_topk")
                continue
            us = _device_us(e) or float(getattr(e, "self_device_time_total", 0.0) or 0.0)
            for ph in ("logits", "topk"):
                if ph in e.name:
                    kern[ph] += us
            continue
        ph = by_name.get(e.name)
        if ph is not None:
            tot[ph] += _device_us(e) if on_gpu else float(getattr(e, "cpu_time_total", 0.0) or 0.0)
    if on_gpu and kern["logits"] + kern["topk"] > 0.0:
        return {**kern, "how": "kernel names"}
    return {**tot, "how": "profiler ranges"}


def torch_indexer_phases(calls, reps: int = 5, warm: bool = True) -> dict:
    """Mean time per call (us) of the two phases of a torch ``indexer_topk`` call from
    ``torch.profiler`` over ``reps`` rounds of ``calls`` run eagerly (:func:`indexer_phase_totals`):
    ``{"logits_us", "topk_us", "timer"}``; on the CPU the interpreter's wall time inside each
    range (meaningless as a speed, but the plumbing is the GPU's)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    for c in calls if warm else ():
        c()
    if gpu:
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            for c in calls:
                c()
        if gpu:
            torch.cuda.synchronize()
    t = indexer_phase_totals(prof.events(), gpu)
    n = reps * len(calls)
    what = ("GPU time of the kernels launched inside each phase" if gpu else
            "CPU interpreter wall time inside each phase (dry run: meaningless)")
    return {"logits_us": t["logits"] / n, "topk_us": t["topk"] / n,
            "topk_timer": f"torch.profiler, {what} ({t['how']}; eager calls, mean of {n})"}


def _compile_layer(device) -> bool:
    """Whether torch decode-layer rows time ``torch.compile(layer, fullgraph=True)`` (recorded
    in the row's ``config``): on a CUDA device by default, as serving engines run the layer
    (compiled, then captured); ``DSA_BENCH_COMPILE_LAYER=0`` times the eager module in the graph
    instead, ``=1`` compiles on the CPU too (Inductor's C++ backend: minutes per row)."""
    import os
    v = os.environ.get("DSA_BENCH_COMPILE_LAYER", "")
    if v == "":
        return str(device).startswith("cuda")
    return v != "0"


def step_impl(backend: str, window: int) -> str:
    """Which composition a dsa_decode_step row timed (recorded in the row): the binding's
    ``dsa_decode_step`` (with the V4 window when ``window`` > 0)."""
    mod = {"torch": "torch_impl", "jax": "jax_impl"}.get(backend, backend)
    return f"{mod}.dsa_decode_step(window={window})" if window else f"{mod}.dsa_decode_step"


def _load(be):
    """The binding module through parity's backend adapter (ImportError with its reason)."""
    from parity.runners import Unavailable
    try:
        return be.module()
    except Unavailable as e:
        raise ImportError(str(e)) from None


def _torch_dev(inp):
    def get():
        import torch
        from torch_impl import _common
        return _common.device_info(torch.device(inp.device))
    return get


def _jax_dev():
    from jax_impl import _common
    return _common.device_info()


def _device(get):
    """The binding's DeviceInfo, or None where it has none (the plan then names no config)."""
    try:
        return get()
    except NotImplementedError:
        return None


def to_jax(t):
    """torch tensor -> jax array (DLPack, zero-copy where possible; fp8 via a uint8 view)."""
    import jax
    import jax.numpy as jnp
    import torch

    if t is None:
        return None
    t = t.contiguous()
    if t.dtype == torch.float8_e4m3fn:
        return jax.lax.bitcast_convert_type(to_jax(t.view(torch.uint8)), jnp.float8_e4m3fn)
    try:
        return jax.dlpack.from_dlpack(t)
    except Exception:  # noqa: BLE001 - dtype / device DLPack cannot carry: copy through NumPy
        from bench.inputs import to_numpy_exact
        return jnp.asarray(to_numpy_exact(t))


class JaxBackend(Backend):
    name = "jax"
    paths = OP_REGISTRY.paths("jax")

    def load(self):
        from parity.runners import BACKENDS
        return _load(BACKENDS["jax"])

    def prepare(self, op, inp, path):
        import jax

        m = self.load()
        if op == "dsa_decode_layer":
            return self._prepare_layer(m, inp, path)
        sh = inp.shape
        topk, window, fmt, d_v, scale = sh.K_topk, sh.W_window, sh.kv_format, sh.p.d_v, inp.sm_scale

        def topk_fn(iq, iw, kc, bt, cl, sorted=False):
            return m.indexer_topk(iq, iw, kc, bt, cl, topk, k_format="fp8_indexer", sorted=sorted,
                                  path=path)

        def mla_fn(q, kv, idx, bt, sink):
            return m.sparse_mla_decode(q, kv, idx, scale, kv_format=fmt, d_v=d_v, block_table=bt,
                                       attn_sink=sink, path=path)

        if op == "indexer_topk":
            f = jax.jit(lambda iq, iw, kc, bt, cl: {"indices": topk_fn(iq, iw, kc, bt, cl)})
            names = ("iq", "iw", "k_cache", "block_table", "context_lens")
        elif op == "sparse_mla_decode":
            def g(q, kv, idx, bt, sink):
                out, lse = mla_fn(q, kv, idx, bt, sink)
                return {"out": out, "lse": lse}
            f = jax.jit(g)
            names = ("q", "kv_cache", "indices", "block_table", "attn_sink")
        else:
            def g(iq, iw, kc, bt, cl, q, kv, sink):
                out, lse, idx = m.dsa_decode_step(q, kv, iq, iw, kc, bt, cl, scale, topk, kv_format=fmt,
                                                  d_v=d_v, attn_sink=sink, window=window, path=path)
                return {"indices": idx, "out": out, "lse": lse}
            f = jax.jit(g)
            names = ("iq", "iw", "k_cache", "block_table", "context_lens", "q", "kv_cache", "attn_sink")
        calls = []
        for s in inp.sets:
            args = tuple(to_jax(s.get(n)) for n in names)
            calls.append(functools.partial(f, *args))
        return calls

    def _prepare_layer(self, m, inp, path):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        layer = m.DSADecodeLayer(inp.shape.layer_cfg, inp.extra["layer_weights"], tp_size=inp.shape.tp,
                                 kv_format=inp.shape.kv_format, dtype=jnp.dtype(inp.q_dtype), path=path)
        graphdef, state = nnx.split(layer)

        def step(state, x, kv, kc, bt, cl):
            out, kv, kc, inter = nnx.merge(graphdef, state)(x, kv, kc, bt, cl, return_intermediates=True)
            return {"out": out, "kv_cache": kv, "k_cache": kc, **{k: inter[k] for k in LAYER_OUTPUTS}}
        f = jax.jit(step, donate_argnums=(2, 3))
        calls = []
        for s in inp.sets:
            # the caches are copied into buffers JAX owns (DLPack imports share torch's memory,
            # which must not be donated)
            args = [to_jax(s[n]) for n in ("x", "kv_cache", "k_cache", "block_table", "context_lens")]
            args[1], args[2] = jnp.copy(args[1]), jnp.copy(args[2])
            calls.append(_DonatingLayerCall(f, state, *args))
        group = _DonatingLayerGroup(step, state, calls)
        for c in calls:
            c.group = group
        return calls

    def plan(self, op, inp, path):
        return registry_plan("jax", _device(_jax_dev), op, inp, path)

    def sync(self, outputs):
        import jax
        jax.block_until_ready(outputs)


class _DonatingLayerCall:
    """One JAX layer step per call on one input set, its caches updated in place.

    The jitted step donates the two caches (argument buffers reused for the written caches, as a
    serving loop does; without donation every step would copy both caches whole), so each call
    feeds the caches the previous call returned. The first call, the one the bench checks,
    returns them too; later calls return only ``out`` and the intermediates, because a buffer
    donated to the next call can no longer be waited on (``jax.block_until_ready`` raises).
    """

    def __init__(self, f, state, x, kv_cache, k_cache, block_table, context_lens):
        self.f, self.state = f, state
        self.x, self.kv, self.kc, self.bt, self.cl = x, kv_cache, k_cache, block_table, context_lens
        self.calls = 0

    def hlo_text(self) -> str:
        """The step's optimised HLO (an ahead-of-time compile of the same jitted function for
        the same argument shapes; nothing is donated by lowering)."""
        return self.f.lower(self.state, self.x, self.kv, self.kc, self.bt, self.cl).compile().as_text()

    def weight_keys(self) -> set[tuple[str, int]]:
        """:func:`hlo_weight_keys` of the layer's state (its weights; the caches and the step's
        inputs are arguments of their own, not in the state)."""
        import jax
        return hlo_weight_keys(jax.tree_util.tree_leaves(self.state))

    def __call__(self) -> dict:
        res = self.f(self.state, self.x, self.kv, self.kc, self.bt, self.cl)
        self.kv, self.kc = res["kv_cache"], res["k_cache"]
        self.calls += 1
        if self.calls > 1:
            res = {k: v for k, v in res.items() if k not in ("kv_cache", "k_cache")}
        return res


# Layer steps per dispatch of the JAX layer timer (at least; every rotated set once): a served
# model shares one executable's dispatch among its ~60 layers. The steps are unrolled in one
# executable, so XLA's compile time grows with them: DSA_BENCH_LAYER_STEPS sets another count.
LAYER_GROUP_STEPS = 8


def layer_group_steps() -> int:
    """``DSA_BENCH_LAYER_STEPS`` as a positive int (unset: :data:`LAYER_GROUP_STEPS`).

    Raises:
      ValueError: the variable is not a positive integer.
    """
    import os
    v = os.environ.get("DSA_BENCH_LAYER_STEPS", "").strip()
    if v == "":
        return LAYER_GROUP_STEPS
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"DSA_BENCH_LAYER_STEPS: expected a positive integer, got {v!r}")
    return int(v)


class _DonatingLayerGroup:
    """The timer's unit for a JAX layer row: one jitted call running one layer step on each of
    the rows' rotated sets (``members``: their :class:`_DonatingLayerCall`), in a chain, every
    set's caches donated and threaded back into its member (so the members still run alone
    afterwards: the check, the phases).

    Why: one layer step per dispatch measures the host, not the step. At B 1 the V4-Flash step's
    kernels take ~170 us but one dispatch of the single-step executable left 52-127 us of the
    step with no kernel running, and that idle time moved with the machine's host and with
    XLA's command buffers in opposite directions on two machines (bench/NOTES.md, tenth
    session). A served model runs all its layers in one executable, so the per-executable cost
    is shared by ~60 layer steps; here by ``steps`` of them (:data:`LAYER_GROUP_STEPS`, or every
    set once if there are more sets; the sets in turn, each set's caches threaded from step to
    step inside the call). What stays is XLA's cost inside
    the executable (its launches, its command buffers), as a served model has it.

    The chain: step ``i + 1``'s ``x`` passes through ``lax.optimization_barrier`` with step
    ``i``'s output, so it cannot start before step ``i`` is computed (as layer ``i + 1`` waits
    for layer ``i``), and XLA cannot merge the steps' independent GEMMs over the shared weights
    (which would read each weight once for all of them: B 1 timed as B ``steps``)."""

    def __init__(self, step, state, members, steps: int | None = None):
        import jax

        self.members, self.state = list(members), state
        S = len(self.members)
        self.steps = max(S, layer_group_steps()) if steps is None else int(steps)

        def run(state, xs, kvs, kcs, bts, cls):
            kvs, kcs = list(kvs), list(kcs)
            outs, prev = [], None
            for j in range(self.steps):          # the sets in turn, each set's caches threaded
                i = j % S
                x = xs[i]
                if prev is not None:
                    _, x = jax.lax.optimization_barrier((prev, x))
                res = step(state, x, kvs[i], kcs[i], bts[i], cls[i])
                kvs[i], kcs[i] = res["kv_cache"], res["k_cache"]
                outs.append({k: v for k, v in res.items() if k not in ("kv_cache", "k_cache")})
                prev = res["out"]
            return outs, tuple(kvs), tuple(kcs)
        self.f = jax.jit(run, donate_argnums=(2, 3))

    def __call__(self) -> list:
        m = self.members
        outs, kvs, kcs = self.f(self.state, tuple(c.x for c in m), tuple(c.kv for c in m),
                                tuple(c.kc for c in m), tuple(c.bt for c in m),
                                tuple(c.cl for c in m))
        for c, kv, kc in zip(m, kvs, kcs):
            c.kv, c.kc = kv, kc
        # the caches are donated to the next call: only the other outputs can be waited on
        return outs


_ADAPTERS = {"torch": TorchBackend, "jax": JaxBackend}
REGISTRY: dict[str, Backend] = {b: _ADAPTERS[b]() for b in OP_REGISTRY.backends}


def discover(backends=None) -> dict[str, tuple[Backend | None, str]]:
    """``{backend: (adapter or None, reason it is unavailable or "")}``."""
    out = {}
    for name, b in REGISTRY.items():
        if backends and name not in backends:
            continue
        try:
            b.load()
            out[name] = (b, "")
        except Exception as e:  # noqa: BLE001 - any import failure makes the backend unavailable
            out[name] = (None, f"{type(e).__name__}: {e}")
    return out
