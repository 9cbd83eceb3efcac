"""Float64 NumPy reference of the few-token weight-streaming GEMM (``kernels/linear``).
Importable with NumPy alone."""
from __future__ import annotations

import numpy as np


def linear(x: np.ndarray, w: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """``alpha * x @ w^T`` in float64, per group.

    Args:
      x: ``[M, K]`` or ``[G, M, K]`` (any real dtype; converted to float64).
      w: ``[N, K]`` or ``[G, N, K]`` (a linear layer's ``[out, in]`` weight).
      alpha: scale of the product.
    Returns:
      float64 ``[M, N]`` or ``[G, M, N]``.
    """
    xd = np.asarray(x, np.float64)
    wd = np.asarray(w, np.float64)
    return alpha * np.matmul(xd, np.swapaxes(wd, -1, -2))
