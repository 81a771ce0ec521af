r"""Rank measurements with explicit tolerances (``dca-paper.md`` §1.9; house style point 12).

* :func:`numerical_rank`: the number of singular values above ``tol``; default
  ``tol = σ_max · max(m, n) · eps(dtype)`` (the LAPACK / ``numpy.linalg.matrix_rank`` rule).
* :func:`effective_rank`: :math:`\exp(H(p))`, :math:`p_i = \sigma_i / \sum_j \sigma_j` (Roy &
  Vetterli 2007); equals r for r equal non-zero singular values.
* :func:`stable_rank`: :math:`\|M\|_F^2 / \|M\|_2^2 \le \mathrm{rank}(M)`.
* :func:`jacobian_rank`: the Jacobian rank :math:`\mathrm{rank}_J(f) = \max_x \mathrm{rank}\,
  J_f(x)` of a function's *residual part* (its Jacobian minus the identity / a scalar / the
  Jacobian of a given skip term), estimated over many inputs, with the singular-value spectra.
  A lower bound on the bottleneck rank, equal to it for f = ψ∘A∘φ (Jacot 2023).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dca_theory.sim.targets import check_finite


def _as_matrix(m) -> np.ndarray:
    arr = np.asarray(m)
    if arr.ndim < 2:
        raise ValueError(f"expected a matrix (ndim >= 2), got shape {arr.shape}")
    check_finite("matrix", arr)
    return arr


def default_tol(sv: np.ndarray, shape: tuple[int, int], dtype) -> np.ndarray | np.floating:
    """``σ_max · max(m, n) · eps(dtype)`` per matrix (sv sorted descending on the last axis)."""
    return sv[..., 0] * max(shape) * np.finfo(dtype).eps


def singular_values(m) -> np.ndarray:
    arr = _as_matrix(m)
    return np.linalg.svd(arr, compute_uv=False)


def numerical_rank(
    m, tol: float | None = None, *, rtol: float | None = None
) -> np.ndarray | np.integer:
    """Number of singular values > tol (absolute) or > rtol·σ_max; default ``default_tol``.

    Works on a batch ``(..., m, n)``; returns an int array of the batch shape.
    """
    if tol is not None and rtol is not None:
        raise ValueError("give tol or rtol, not both")
    for name, v in (("tol", tol), ("rtol", rtol)):
        if v is not None and not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v}")
    arr = _as_matrix(m)
    sv = np.linalg.svd(arr, compute_uv=False)
    if tol is not None:
        cut = np.asarray(tol)
    elif rtol is not None:
        cut = rtol * sv[..., 0]
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


@dataclasses.dataclass(frozen=True)
class JacobianRank:
    """Per-input ranks and spectra of the residual Jacobian; ``rank`` is the max over inputs."""

    rank: int
    ranks: np.ndarray  # (n,) numerical rank at each input
    effective_ranks: np.ndarray  # (n,)
    singular_values: np.ndarray  # (n, d) descending
    tol: str

    @property
    def mean_spectrum(self) -> np.ndarray:
        return self.singular_values.mean(axis=0)


def residual_jacobians(
    f: Callable, xs, subtract: str | Callable | None = "identity"
) -> np.ndarray:
    """``J_f(x) − S(x)`` for every row x of ``xs``.

    ``subtract``: ``None`` (nothing), ``"identity"`` (I), ``"scalar"`` (α̂ I with α̂ the median
    of the real parts of the eigenvalues of J: for J = αI + M with rank M < d/2 more than half
    of the eigenvalues equal α), or a function ``skip(x)`` whose Jacobian is subtracted (e.g. a
    model's input-slot term ``model.skip``).
    """
    xs = jnp.asarray(xs)
    check_finite("inputs xs", xs)
    if xs.ndim != 2:
        raise ValueError(f"xs must have shape (n, d), got {xs.shape}")
    jac = np.asarray(jax.vmap(jax.jacfwd(f))(xs))
    if subtract is None:
        return jac
    if callable(subtract):
        return jac - np.asarray(jax.vmap(jax.jacfwd(subtract))(xs))
    eye = np.eye(jac.shape[-1], dtype=jac.dtype)
    if subtract == "identity":
        return jac - eye
    if subtract == "scalar":
        alpha = np.median(np.linalg.eigvals(jac).real, axis=-1)
        return jac - alpha[:, None, None] * eye
    raise ValueError(f"unknown subtract {subtract!r}; valid: None, identity, scalar, a callable")


def jacobian_rank(
    f: Callable, xs, *, subtract: str | Callable | None = "identity",
    tol: float | None = None, rtol: float | None = None,
) -> JacobianRank:
    """Jacobian-rank estimate of f's residual part over the inputs ``xs`` (see module doc)."""
    res = residual_jacobians(f, xs, subtract)
    ranks = numerical_rank(res, tol, rtol=rtol)
    label = f"tol={tol}" if tol is not None else (
        f"rtol={rtol}" if rtol is not None else "sigma_max*max(m,n)*eps")
    return JacobianRank(
        rank=int(ranks.max()), ranks=ranks, effective_ranks=effective_rank(res),
        singular_values=singular_values(res), tol=label,
    )
