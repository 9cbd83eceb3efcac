"""The scalar-argument rule of both stacks (framework-free: Python, NumPy).

Integer arguments (``topk``, ``d_v``, ``tp``, head counts) accept a Python int or a NumPy integer
scalar (``np.int64(64)``, what indexing a NumPy config array gives); real arguments
(``sm_scale``) accept a Python int / float or a NumPy integer / floating scalar. Bools (Python or
NumPy) are refused everywhere, and so are floats where an int is expected, even integral ones
(``64.0``). ``torch_impl._common`` and ``jax_impl._common`` re-export these; the JAX side adds
0-d (possibly traced) arrays for ``sm_scale``.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["check_int", "check_real"]


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None,
              why: str = "") -> int:
    """``value`` as a Python int.

    Raises:
      TypeError: not a Python int or NumPy integer scalar, or a bool (names ``name``, the
        accepted types and the type received).
      ValueError: below ``minimum`` or above ``maximum`` (names ``name``, the bound, ``why`` it
        holds when given, and the value).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int (a Python int or NumPy integer scalar, not a bool), "
                        f"got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: expected an int <= {maximum}{f' ({why})' if why else ''}, "
                         f"got {value!r}")
    return int(value)


INT32_MAX = 2 ** 31 - 1


def topk_maximum(B: int, N: int) -> int:
    """The largest ``topk`` of an ``indices [B, N, topk]`` int32 output the kernels address with
    int32 element offsets (``B * N * topk <= 2^31 - 1``)."""
    return INT32_MAX // max(1, B * N)


def check_real(name: str, value) -> float:
    """``float(value)`` of a finite real scalar. Zero and negative values are accepted (the SPEC
    formulas using ``sm_scale`` are defined for them).

    Raises:
      TypeError: not a Python int / float or NumPy integer / floating scalar, or a bool (a
        string, None, a complex, a tensor ...).
      ValueError: NaN or +-inf.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number (a Python int / float or a NumPy integer "
                        f"or floating scalar, not a bool), got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name}: expected a finite value, got {out!r}")
    return out
