r"""Rank measurements with explicit tolerances (``dca-paper.md`` §1.9; house style point 12).

Ranks of single matrices (``numerical_rank``, ``effective_rank``, ``stable_rank``) are
:mod:`dca_theory.spectra`, the one rank rule shared with the theory's checks.

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
from dca_theory.spectra import effective_rank, numerical_rank, singular_values


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
