"""Argument checks shared by the closed forms of :mod:`dca_theory.theory`.

Every check raises a one-line ``ValueError`` that names the argument, the bad value and the
valid range, so that the ``dca-theory`` CLI can print it as ``dca-theory: error: ...``.
"""

from __future__ import annotations

import numpy as np

from dca_theory import schemes

# Section 4 calls the plain residual sum "res" (ResNet); the registry's canonical name is
# "vanilla", with "res" as its alias. The theory keeps the paper's spelling.
_THEORY_SPELLING = {"vanilla": "res"}
GRN_KINDS = schemes.names(theory=True, family="grn")
# Theorem 4.1's classes (the rivals with a theory, family "baseline", have their own module:
# dca_theory.theory.rivals).
ALL_KINDS = tuple(_THEORY_SPELLING.get(n, n) for n in schemes.names(theory=True)
                  if schemes.get(n).family in ("plain", "grn"))
CONSTANTS = ("corrected", "paper")
LEMMAS = ("paper", "tight")


def _short(value) -> str:
    arr = np.asarray(value)
    if arr.ndim == 0:
        return repr(arr.item())
    return f"array of shape {arr.shape}"


def check_kind(kind, allowed=ALL_KINDS) -> str:
    """``kind`` in the theory's spelling (an alias such as ``vanilla`` becomes ``res``)."""
    if not (schemes.known(kind) and
            _THEORY_SPELLING.get(schemes.canonical(kind), schemes.canonical(kind)) in allowed):
        raise ValueError(f"kind={kind!r} is not supported here; valid: {', '.join(allowed)}")
    return _THEORY_SPELLING.get(schemes.canonical(kind), schemes.canonical(kind))


def check_choice(name: str, value, allowed) -> str:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not valid; valid: {', '.join(allowed)}")
    return value


def check_finite(name: str, value) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (no NaN/Inf); got {_short(value)}")
    return arr


def check_dim(name: str, d) -> int:
    """A matrix size: a positive integer."""
    arr = check_finite(name, d)
    if arr.ndim != 0 or arr != np.floor(arr) or arr < 1:
        raise ValueError(f"{name} must be an integer >= 1; got {_short(d)}")
    return int(arr)


def check_int_at_least(name: str, value, low: int) -> np.ndarray:
    """Integer-valued scalar or array with every entry >= low."""
    arr = check_finite(name, value)
    if np.any(arr != np.floor(arr)) or np.any(arr < low):
        raise ValueError(f"{name} must be integer(s) >= {low}; got {_short(value)}")
    return arr.astype(np.int64)


def check_rank(r_star, d: int, *, integer: bool = True, allow_d: bool = False) -> np.ndarray:
    """The collective rank: 0 <= r_star < d (the paper's standing assumption r_* < d).

    ``allow_d`` admits r_star = d for closed forms that extend continuously to the endpoint
    (Figure 5 evaluates the gain bounds at r_* = d = 100).
    """
    arr = check_finite("r_star", r_star)
    upper = "<= d" if allow_d else "< d"
    bad = (arr < 0) | ((arr > d) if allow_d else (arr >= d))
    if integer:
        bad |= arr != np.floor(arr)
    if np.any(bad):
        what = "an integer" if integer else "a number"
        raise ValueError(
            f"r_star must be {what} with 0 <= r_star {upper}={d}; got {_short(r_star)}")
    return arr.astype(np.int64) if integer else arr


def check_kappa(kappa) -> np.ndarray:
    """Task complexity kappa = lam_min / lam_max in (0, 1]."""
    arr = check_finite("kappa", kappa)
    if np.any((arr <= 0) | (arr > 1)):
        raise ValueError(f"kappa must lie in (0, 1]; got {_short(kappa)}")
    return arr


def check_eigen_range(lam_min, lam_max) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalue range of A - I in Theorem 4.3: 0 < lam_min <= lam_max."""
    lo = check_finite("lam_min", lam_min)
    hi = check_finite("lam_max", lam_max)
    if np.any(lo <= 0):
        raise ValueError(f"lam_min must be > 0 (Theorem 4.3 needs A - I positive definite); "
                         f"got {_short(lam_min)}")
    if np.any(lo > hi):
        raise ValueError(f"lam_min must be <= lam_max; got lam_min={_short(lam_min)}, "
                         f"lam_max={_short(lam_max)}")
    return lo, hi


def check_square(A) -> np.ndarray:
    """A finite real square matrix, returned as float64."""
    arr = np.asarray(A)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] == 0:
        raise ValueError(f"A must be a non-empty square matrix; got shape {arr.shape}")
    if np.iscomplexobj(arr):
        raise ValueError("A must be real; got a complex matrix")
    return check_finite("A", arr)


def check_shifted_psd(A, *, rtol: float = 1e-10) -> np.ndarray:
    """Eigenvalues of A - I for Theorem 4.3, which assumes A - I symmetric positive definite.

    Symmetry and positivity are checked up to ``rtol * ||A - I||_2`` (round-off), then the
    eigenvalues of the symmetrised A - I are returned in decreasing order.
    """
    A = check_square(A)
    shifted = A - np.eye(A.shape[0])
    scale = max(np.linalg.norm(shifted, 2), np.finfo(float).tiny)
    asym = np.linalg.norm(shifted - shifted.T, 2)
    if asym > rtol * scale:
        raise ValueError(f"A - I must be symmetric (Theorem 4.3); ||(A - I) - (A - I)^T||_2 = "
                         f"{asym:.3g} > {rtol:g} * ||A - I||_2")
    lam = np.linalg.eigvalsh((shifted + shifted.T) / 2)[::-1]
    if lam[-1] <= rtol * scale:
        raise ValueError(f"A - I must be positive definite (Theorem 4.3 needs lam_min > 0); "
                         f"smallest eigenvalue {lam[-1]:.3g}")
    return lam
