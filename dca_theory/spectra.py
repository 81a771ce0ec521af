r"""Matrix ranks with explicit tolerances, in numpy alone: the one rank rule of the theory's
checks and the simulations (``dca-paper.md`` §1.9).

* :func:`numerical_rank`: the number of singular values above a cut. Default cut
  ``σ_max · max(m, n) · eps(dtype)`` (the LAPACK / ``numpy.linalg.matrix_rank`` rule); ``rtol``
  makes it ``rtol · σ_max``, ``tol`` an absolute number, and ``atol`` a floor under the relative
  cut (the theory's constructions use ``rtol = atol``: ``rtol · max(σ_max, 1)``, so that a
  matrix of tiny norm counts as zero).
* :func:`effective_rank`: :math:`\exp(H(p))`, :math:`p_i = \sigma_i / \sum_j \sigma_j` (Roy &
  Vetterli 2007); equals r for r equal non-zero singular values.
* :func:`stable_rank`: :math:`\|M\|_F^2 / \|M\|_2^2 \le \mathrm{rank}(M)`.
"""

from __future__ import annotations

import numpy as np


def _check_finite(arr: np.ndarray) -> None:
    if not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)].ravel()[0]
        raise ValueError(f"matrix holds non-finite values (e.g. {bad}); data must be finite")


def _as_matrix(m) -> np.ndarray:
    arr = np.asarray(m)
    if arr.ndim < 2:
        raise ValueError(f"expected a matrix (ndim >= 2), got shape {arr.shape}")
    _check_finite(arr)
    return arr


def default_tol(sv: np.ndarray, shape: tuple[int, int], dtype) -> np.ndarray | np.floating:
    """``σ_max · max(m, n) · eps(dtype)`` per matrix (sv sorted descending on the last axis)."""
    return sv[..., 0] * max(shape) * np.finfo(dtype).eps


def singular_values(m) -> np.ndarray:
    arr = _as_matrix(m)
    return np.linalg.svd(arr, compute_uv=False)


def numerical_rank(m, tol: float | None = None, *, rtol: float | None = None,
                   atol: float = 0.0) -> np.ndarray | np.integer:
    """Number of singular values > tol (absolute) or > max(rtol·σ_max, atol); default
    ``default_tol``.

    Works on a batch ``(..., m, n)``; returns an int array of the batch shape.
    """
    if tol is not None and rtol is not None:
        raise ValueError("give tol or rtol, not both")
    for name, v in (("tol", tol), ("rtol", rtol), ("atol", atol)):
        if v is not None and not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v}")
    arr = _as_matrix(m)
    sv = np.linalg.svd(arr, compute_uv=False)
    if tol is not None:
        cut = np.asarray(tol)
    elif rtol is not None:
        cut = np.maximum(rtol * sv[..., 0], atol)
    else:
        cut = default_tol(sv, arr.shape[-2:], arr.dtype)
    return np.sum(sv > np.asarray(cut)[..., None], axis=-1)


def effective_rank(m) -> np.ndarray:
    """exp(entropy of σ/Σσ); 0 for the zero matrix."""
    sv = singular_values(m)
    total = sv.sum(axis=-1, keepdims=True)
    p = np.where(total > 0, sv / np.where(total > 0, total, 1.0), 0.0)
    ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
    return np.where(total[..., 0] > 0, np.exp(ent), 0.0)


def stable_rank(m) -> np.ndarray:
    """‖M‖_F² / ‖M‖_2²; 0 for the zero matrix."""
    sv = singular_values(m)
    top = sv[..., 0] ** 2
    return np.where(top > 0, np.sum(sv**2, axis=-1) / np.where(top > 0, top, 1.0), 0.0)
