"""The scalar-argument rule of both stacks (framework-free: Python, NumPy), the shape
rule of their array checks (:func:`check_shape`), and the rule of their on / off environment
switches (:func:`env_switch`).

Integer arguments (``topk``, ``d_v``, ``tp``, head counts) accept a Python int or a NumPy integer
scalar (``np.int64(64)``, what indexing a NumPy config array gives); real arguments
(``sm_scale``) accept a Python int / float or a NumPy integer / floating scalar. Bools (Python or
NumPy) are refused everywhere, and so are floats where an int is expected, even integral ones
(``64.0``). ``torch_impl._common`` and ``jax_impl._common`` re-export these; the JAX side adds
0-d (possibly traced) arrays for ``sm_scale``.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np

__all__ = ["check_int", "check_real", "check_shape", "env_switch"]


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


FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_OVERFLOW = 2.0 ** 128 - 2.0 ** 103
"""The smallest magnitude that rounds to inf in float32 (FLOAT32_MAX + half an ulp, the tie
rounding to even, i.e. up)."""


def check_real(name: str, value) -> float:
    """``float(value)`` of a finite real scalar that stays finite in float32 (every scale this
    checks, ``sm_scale``, ``alpha``, ``softmax_scale``, is applied in float32 by the kernels:
    a Python float such as ``1e39`` would become inf there and every output NaN). Zero and
    negative values are accepted (the SPEC formulas using ``sm_scale`` are defined for them);
    magnitudes below float32's range round to 0 or a subnormal, as in any float32 product.

    Raises:
      TypeError: not a Python int / float or NumPy integer / floating scalar, or a bool (a
        string, None, a complex, a tensor ...).
      ValueError: NaN or +-inf, or a magnitude that rounds to inf in float32 (above
        ``FLOAT32_MAX`` = 3.4028235e38 by more than half an ulp).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number (a Python int / float or a NumPy integer "
                        f"or floating scalar, not a bool), got {type(value).__name__}")
    want = f"a value finite in float32 (|{name}| <= {FLOAT32_MAX:.8g}; the kernels apply it in float32)"
    try:
        out = float(value)
    except OverflowError:               # a Python int past float64's range
        raise ValueError(f"{name}: expected {want}, got an int of {int(value).bit_length()} bits") from None
    if not math.isfinite(out):
        raise ValueError(f"{name}: expected a finite value, got {out!r}")
    if abs(out) >= _FLOAT32_OVERFLOW:   # plain float arithmetic: traceable by Dynamo (alpha)
        raise ValueError(f"{name}: expected {want}, got {out!r}")
    return out


def format_shape(want) -> str:
    """An expected shape as the error messages print it: ``(2, 1, K)``, ``(16,)``; None as ``*``."""
    dims = ["*" if w is None else str(w) for w in want]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def check_shape(name: str, got, want) -> None:
    """ValueError naming ``name`` unless the shape ``got`` matches ``want``: an int per dimension
    it must equal; None or a label (``"num_pages"``, ``"K"``) where any size goes, printed as
    ``*`` or the label, unquoted (``(2, 1, K)``). The rule of ``torch_impl._common.check_tensor``
    and ``jax_impl._common.check_array``."""
    want, got = tuple(want), tuple(got)
    if len(want) != len(got) or any(not (w is None or isinstance(w, str)) and w != s
                                    for w, s in zip(want, got)):
        raise ValueError(f"{name}: expected shape {format_shape(want)}, got {got}")


def env_int(name: str, lo: int, hi: int, unset=None, what: str = ""):
    """The environment variable ``name`` as an int in ``[lo, hi]``, surrounding blanks ignored;
    ``unset`` when it is unset or empty.

    Raises:
      ValueError: the variable holds anything but ASCII digits of a value in ``[lo, hi]`` (names
        the variable, ``what`` it accepts, default "an integer in [lo, hi]", and the value; a
        digit ``str.isdigit`` accepts but ``int`` does not, such as "²", is refused here too).
    """
    v = os.environ.get(name, "").strip()
    if v == "":
        return unset
    if not re.fullmatch(r"[0-9]{1,9}", v) or not lo <= int(v) <= hi:
        raise ValueError(f"{name}: expected {what or f'an integer in [{lo}, {hi}]'} or unset, "
                         f"got {v!r}")
    return int(v)


def env_switch(name: str) -> bool | None:
    """The on / off environment variable ``name``: None when unset or empty (the caller's
    default), False for ``0``, True for ``1`` (surrounding blanks ignored).

    Raises:
      ValueError: the variable holds anything else (names the variable, what it accepts and the
        value).
    """
    v = os.environ.get(name, "").strip()
    if v not in ("", "0", "1"):
        raise ValueError(f"{name}: expected '0', '1' or unset, got {v!r}")
    return None if v == "" else v == "1"


SPLIT_SHIFT_BITS = {"bf16": 8, "fp16": 11}
"""The power-of-two scale S between the three 16-bit parts of a split float32 weight (part
``j`` stored times ``2^(j S)``; ``torch_impl.layer.split_weight``): the significand bits of the
16-bit type. ``prep_q``'s kernel unscales by it (``W_SHIFT``)."""
