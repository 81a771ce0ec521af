r"""Independent reference computations used to *check* the closed forms of :mod:`.risk` and
:mod:`.tradeoff` (Theorems 4.2, 4.3; Proposition 4.4). Deliberately written without
:mod:`._optimize`: different algorithms, so that agreement means something.

* :func:`v1_exact_symmetric`: exact GRN-v1 optimum for symmetric A by brute force over
  :math:`\alpha` candidates (every optimum sits at the mean of a set of d - r eigenvalues
  closest to it; we evaluate :math:`f(\alpha)` at all window means *and* on a dense grid).
* :func:`v1_search_general`: dense grid over a proven bracket plus bounded Brent refinement of
  the best grid points (not certified; used as "an independent search must not beat the
  claimed exact value").
* :func:`v2_minimise`: L-BFGS over the diagonal D of :math:`\min_D \mathrm{tail}_r(A-D)` with the
  analytic gradient :math:`-2\,\mathrm{diag}(R)`, R the rank-r residual.
* :func:`v3_minimise`: L-BFGS over (D, P, Q, w) of the closed-form GRN-v3 risk
  :math:`J(D, PQ^\top, w)` (see :func:`dca_theory.theory.montecarlo.v3_risk_closed_form`).
* :func:`random_target`: the random targets used throughout.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize, minimize_scalar

from dca_theory.theory.montecarlo import SQRT_2PI


def tail_sq(B: np.ndarray, r: int) -> float:
    r""":math:`\sum_{i>r}\sigma_i(B)^2`: Eckart–Young–Mirsky error of the best rank-r fit."""
    s = np.linalg.svd(B, compute_uv=False)
    return float(np.sum(s[r:] ** 2))


def random_target(d: int, rng: np.random.Generator, *, kind: str = "general",
                  lam_min: float = 1.0, lam_max: float = 2.0) -> np.ndarray:
    """``general``: A = I + G/√d + diag shift (G Gaussian, full rank, not symmetric).
    ``shifted_psd``: A = I + Q diag(λ) Qᵀ with λ uniform in [lam_min, lam_max] and both
    endpoints attained (so κ = lam_min/lam_max exactly), Q Haar-random orthogonal."""
    if kind == "general":
        return np.eye(d) + rng.standard_normal((d, d)) * rng.uniform(0.3, 3.0) / np.sqrt(d) \
            + np.diag(rng.uniform(-1.0, 1.0, d))
    if kind != "shifted_psd":
        raise ValueError(f"kind must be 'general' or 'shifted_psd', got {kind!r}")
    lam = rng.uniform(lam_min, lam_max, d)
    lam[0], lam[-1] = lam_min, lam_max
    rot, upper = np.linalg.qr(rng.standard_normal((d, d)))
    rot = rot * np.sign(np.diag(upper))  # Haar: fix the signs of the QR factor
    return np.eye(d) + (rot * lam) @ rot.T


def v1_exact_symmetric(eigs: np.ndarray, r: int, grid: int = 201) -> tuple[float, float]:
    r"""Exact :math:`\min_\alpha \sum_{\text{d-r nearest}}(\lambda_i-\alpha)^2` for symmetric A
    with eigenvalues ``eigs`` (then :math:`\sigma_i(A-\alpha I) = |\lambda_i-\alpha|`).

    :math:`f(\alpha)` is evaluated exactly (sorting :math:`(\lambda-\alpha)^2`) at every mean of
    d - r consecutive sorted eigenvalues and on a grid; the minimum is over all candidates.
    Returns (value, alpha)."""
    lam = np.sort(np.asarray(eigs, dtype=float))
    m = lam.size - r
    cands = np.concatenate([np.convolve(lam, np.ones(m) / m, mode="valid"),
                            np.linspace(lam[0], lam[-1], grid)])
    dev = np.sort((lam[None, :] - cands[:, None]) ** 2, axis=1)[:, :m].sum(axis=1)
    j = int(np.argmin(dev))
    return float(dev[j]), float(cands[j])


def v1_search_general(A: np.ndarray, r: int, grid: int = 400) -> tuple[float, float]:
    r"""Grid + Brent search for :math:`\min_\alpha \mathrm{tail}_r(A-\alpha I)`.

    Bracket: for :math:`|\alpha| > \|A\|_2 + s` every singular value of :math:`A-\alpha I`
    exceeds s, so the tail exceeds :math:`(d-r)s^2`; with :math:`s^2 = f(0)/(d-r)` no such
    :math:`\alpha` beats :math:`\alpha = 0`."""
    d = A.shape[0]
    f0 = tail_sq(A, r)
    R = np.linalg.norm(A, 2) + np.sqrt(f0 / (d - r)) + 1e-9
    alphas = np.linspace(-R, R, grid)
    vals = np.array([tail_sq(A - a * np.eye(d), r) for a in alphas])
    h = alphas[1] - alphas[0]
    best_v, best_a = float(vals.min()), float(alphas[int(np.argmin(vals))])
    for i in np.argsort(vals)[:4]:
        res = minimize_scalar(lambda a: tail_sq(A - a * np.eye(d), r), method="bounded",
                              bounds=(alphas[i] - h, alphas[i] + h),
                              options={"xatol": 1e-13 * max(1.0, R)})
        if res.fun < best_v:
            best_v, best_a = float(res.fun), float(res.x)
    return best_v, best_a


def _truncate(B: np.ndarray, r: int) -> np.ndarray:
    U, s, Vt = np.linalg.svd(B)
    return (U[:, :r] * s[:r]) @ Vt[:r]


def v2_minimise(A: np.ndarray, r: int, starts: list[np.ndarray]) -> tuple[float, np.ndarray]:
    r"""Best value of :math:`\mathrm{tail}_r(A - \mathrm{diag}(D))` found by L-BFGS from each start.

    Gradient: with :math:`R = (A-D) - [A-D]_r`, :math:`\partial/\partial D_i = -2R_{ii}`
    (valid where :math:`\sigma_r > \sigma_{r+1}`, i.e. almost everywhere)."""
    def fun(D):
        B = A - np.diag(D)
        Rres = B - _truncate(B, r) if r else B
        return float(np.sum(Rres * Rres)), -2.0 * np.diag(Rres)

    best_v, best_D = np.inf, None
    for D0 in starts:
        res = minimize(fun, np.asarray(D0, dtype=float), jac=True, method="L-BFGS-B",
                       options={"maxiter": 200, "ftol": 1e-15, "gtol": 1e-10})
        if res.fun < best_v:
            best_v, best_D = float(res.fun), res.x
    return best_v, best_D


def v3_objective(A: np.ndarray, D: np.ndarray, M: np.ndarray, w: np.ndarray,
                 d_shift: int = 2) -> float:
    r"""Closed-form GRN-v3 risk :math:`E\|(A-D-M)x - \sigma(w^\top x)x\|^2`, x ~ N(0, I)."""
    B = A - np.diag(D) - M
    nw = float(np.linalg.norm(w))
    cross = 0.0 if nw == 0 else (nw * np.trace(B) + w @ B @ w / nw) / SQRT_2PI
    return float(np.sum(B * B) - 2.0 * cross + nw * nw * (A.shape[0] + d_shift) / 2.0)


def v3_minimise(A: np.ndarray, r: int, starts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                d_shift: int = 2, maxiter: int = 300) -> float:
    r"""Best value of :math:`J(D, PQ^\top, w)` found by L-BFGS over all of (D, P, Q, w) jointly,
    from each start (D, M, w) (M factored by SVD), with the analytic gradient: for
    :math:`G = \partial J/\partial B = 2B - 2(\|w\|I + ww^\top/\|w\|)/\sqrt{2\pi}`,
    :math:`\partial_D = -\mathrm{diag}\,G`, :math:`\partial_P = -GQ`, :math:`\partial_Q = -G^\top P`
    and :math:`\partial_w = -\tfrac{2}{\sqrt{2\pi}}(\mathrm{tr}B\,w/n + (B+B^\top)w/n
    - (w^\top Bw)w/n^3) + (d+\text{d\_shift})w`, :math:`n = \|w\|`."""
    d = A.shape[0]

    def unpack(z):
        D, P, Q, w = np.split(z, [d, d + d * r, d + 2 * d * r])
        return D, P.reshape(d, r), Q.reshape(d, r), w

    def fun(z):
        D, P, Q, w = unpack(z)
        B = A - np.diag(D) - P @ Q.T
        n = max(float(np.linalg.norm(w)), 1e-12)
        wBw = float(w @ B @ w)
        val = float(np.sum(B * B) - 2.0 * (n * np.trace(B) + wBw / n) / SQRT_2PI
                    + n * n * (d + d_shift) / 2.0)
        G = 2.0 * B - 2.0 * (n * np.eye(d) + np.outer(w, w) / n) / SQRT_2PI
        gw = (-2.0 / SQRT_2PI * (np.trace(B) * w / n + (B + B.T) @ w / n - wBw * w / n**3)
              + (d + d_shift) * w)
        return val, np.concatenate([-np.diag(G), (-G @ Q).ravel(), (-G.T @ P).ravel(), gw])

    best = np.inf
    for D0, M0, w0 in starts:
        U, s, Vt = np.linalg.svd(M0)
        P0, Q0 = U[:, :r] * np.sqrt(s[:r]), Vt[:r].T * np.sqrt(s[:r])
        z0 = np.concatenate([D0, P0.ravel(), Q0.ravel(), w0])
        best = min(best, fun(z0)[0])
        res = minimize(fun, z0, jac=True, method="L-BFGS-B",
                       options={"maxiter": maxiter, "ftol": 1e-15, "gtol": 1e-10})
        best = min(best, float(res.fun))
    return best
