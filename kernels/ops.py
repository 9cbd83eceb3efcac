"""The names every layer agrees on: ops, backends and their paths (in fall-through order),
which path of a backend launches a kernel, and the dispatch bucket of a call.

The bottom of ``kernels``' decisions, imported by the dispatch table (``kernels.dispatch``) and
the registry (``kernels.registry``, which adds the config rules and the plan); the other layers
read these names through ``kernels.registry.REGISTRY``. Standard library only.
"""
from __future__ import annotations

import math
import numbers
from types import MappingProxyType

AUTO = "auto"

OPS = ("sparse_mla_decode", "indexer_logits", "indexer_topk", "dsa_decode_step", "dsa_decode_layer")
"""Every op, in the order reports list them."""

BACKEND_PATHS = MappingProxyType({"torch": ("triton", "torch"), "jax": ("pallas", "xla")})
"""Paths of each backend in their fall-through order (kernel path first)."""

KERNEL_PATHS = MappingProxyType({"torch": "triton", "jax": "pallas"})
"""The path of each backend that launches a kernel with a config; the others are plain."""

BUCKET_KEYS = MappingProxyType({
    "sparse_mla_decode": ("B", "N", "H", "K", "d_qk", "kv_format"),
    "indexer_topk": ("B", "N", "L", "topk"),
    "indexer_logits": ("B", "N", "L"),
})
"""Dispatch-bucket keys of the kernel ops (the other ops have no dispatch entries)."""

POW2_KEYS = ("B", "L")
"""Bucket keys rounded up to a power of two (nearest-entry fallback measures log2 distance)."""

TIMED_OPS = ("sparse_mla_decode", "indexer_topk", "dsa_decode_step", "dsa_decode_layer")
"""The ops ``python -m bench`` times (indexer_logits is a debugging output, not a serving op)."""


def pow2_bucket(x: int) -> int:
    """Smallest power of two >= ``x`` (1 for ``x <= 1``): the bucket of a batch or a length."""
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


def bucket(op: str, **dims) -> dict:
    """The dispatch bucket of a call: the op's :data:`BUCKET_KEYS` (other keys of ``dims`` are
    ignored), ``B`` and ``L`` rounded up to powers of two (1 for values <= 1), the rest exact.
    The compositions (``dsa_decode_step``, ``dsa_decode_layer``) have the empty bucket.

    Raises:
      ValueError: ``op`` not in :data:`OPS`, or a bucket key missing from ``dims``.
      TypeError: ``B`` or ``L`` not an int (a NumPy integer counts as one).
    """
    if op not in OPS:
        raise ValueError(f"op: expected one of {OPS}, got {op!r}")
    keys = BUCKET_KEYS.get(op, ())
    missing = [k for k in keys if k not in dims]
    if missing:
        raise ValueError(f"dims: the {op} bucket needs keys {keys}, missing {missing}")
    out = {}
    for k in sorted(keys):
        v = dims[k]
        if k in POW2_KEYS:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"dims: {k}: expected an int, got {type(v).__name__} {v!r}")
            v = pow2_bucket(int(v))
        out[k] = v
    return out
