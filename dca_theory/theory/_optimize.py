r"""Solvers behind :func:`dca_theory.theory.excess_risk` for the GRN classes.

GRN-v1, exact. :math:`f(\alpha) = \sum_{i>r}\sigma_i(A-\alpha I)^2`, minimised over the scalar
:math:`\alpha` (Theorem 4.1: :math:`C_{GRN-v1} = \{\alpha I + M\}`). Two facts make the 1-D
search exact:

1. Ky Fan: :math:`f(\alpha) = \min_P \operatorname{tr}(P (A-\alpha I)^\top (A-\alpha I))` over
   rank-:math:`(d-r)` orthogonal projectors, and each term is
   :math:`\operatorname{tr}(PA^\top A) - 2\alpha\operatorname{tr}(PS) + (d-r)\alpha^2` with
   :math:`S = (A+A^\top)/2`. So :math:`g(\alpha) = f(\alpha) - (d-r)\alpha^2` is a minimum of
   affine functions, hence **concave**, and every global minimiser is
   :math:`\alpha^* = \operatorname{tr}(P^*S)/(d-r)`, which lies between the means of the
   :math:`d-r` smallest and largest eigenvalues of :math:`S` (the bracket).
2. On a cell :math:`[a, b]`, concavity of :math:`g` gives the certified lower bound
   :math:`f(\alpha) \ge` chord of :math:`f` :math:`- (d-r)(\alpha-a)(b-\alpha)`.

The solver is branch and bound: a grid on the bracket, bounded Brent on the best grid minima for
the incumbent, then bisection of every cell whose lower bound is below the incumbent minus the
tolerance. It stops with a certificate: global minimum >= value - gap, gap <= tol.

Symmetric A: :math:`\sigma_i(A-\alpha I) = |\lambda_i - \alpha|`, the tail keeps the
:math:`d-r` eigenvalues nearest to :math:`\alpha` (a contiguous window of the sorted spectrum),
so :math:`ER^* = \min` over windows of the window's sum of squared deviations from its mean,
attained at :math:`\alpha` = the window mean. Exact closed form, O(d (d-r)).

GRN-v2 (not exact): block coordinate descent on :math:`\|A - D - M\|_F^2` (D diagonal, rank
M <= r): :math:`M \leftarrow` rank-r SVD truncation of :math:`A-D`,
:math:`D \leftarrow \operatorname{diag}(A-M)`; each step is an exact block minimiser, so the
value decreases monotonically; several starts; the best value is an upper bound on ER*.

GRN-v3 (not exact): for x ~ N(0, I) the risk of :math:`(D+M)x + \sigma(w^\top x)x` is
:math:`J = \|B\|_F^2 - 2\|w\|(\operatorname{tr}B + e^\top B e)/\sqrt{2\pi} + \|w\|^2(d+2)/2`,
:math:`B = A - D - M`, :math:`w = \|w\| e` (Lemma B.1 and
:math:`E[\sigma(x_1)^2\|x\|^2] = (d+2)/2`). Block descent: w-step in closed form (e = top
eigenvector of sym B), then (D, M) steps on the shifted target
:math:`A - (\|w\|/\sqrt{2\pi})(I + ee^\top)`.
"""

from __future__ import annotations

import heapq

import numpy as np
import scipy.linalg
from numpy.lib.stride_tricks import sliding_window_view
from scipy.optimize import minimize, minimize_scalar

EPS = np.finfo(np.float64).eps


def svd_tail_sq(B: np.ndarray, r: int) -> float:
    """Sum of squared singular values beyond the r-th (Eckart-Young-Mirsky error)."""
    s = np.linalg.svd(B, compute_uv=False)
    return float(np.sum(s[r:] ** 2))


def truncate(B: np.ndarray, r: int) -> np.ndarray:
    """Best rank-r approximation of B."""
    if r == 0:
        return np.zeros_like(B)
    U, s, Vt = np.linalg.svd(B)
    return (U[:, :r] * s[:r]) @ Vt[:r]


def is_symmetric(A: np.ndarray) -> bool:
    return bool(np.max(np.abs(A - A.T)) <= 8 * EPS * max(np.max(np.abs(A)), 1e-300))


def grn_v1_symmetric(A: np.ndarray, r: int) -> tuple[float, float]:
    """Exact (value, alpha) for symmetric A: best contiguous eigenvalue window."""
    lam = np.sort(np.linalg.eigvalsh((A + A.T) / 2))
    windows = sliding_window_view(lam, lam.size - r)
    means = windows.mean(axis=1)
    ssd = np.sum((windows - means[:, None]) ** 2, axis=1)
    j = int(np.argmin(ssd))
    return float(ssd[j]), float(means[j])


def grn_v1_general(A: np.ndarray, r: int, *, rtol: float = 1e-12,
                   max_evals: int = 20000) -> tuple[float, float, dict]:
    """Certified global minimum of f(alpha) = svd_tail_sq(A - alpha I, r); see module doc."""
    d = A.shape[0]
    m = d - r
    eye = np.eye(d)
    lam = np.linalg.eigvalsh((A + A.T) / 2)  # ascending
    lo, hi = float(lam[:m].mean()), float(lam[-m:].mean())
    evals = 0

    def f(a: float) -> float:
        nonlocal evals
        evals += 1
        return svd_tail_sq(A - a * eye, r)

    # round-off level of one evaluation: SVD errors scale with ||A - alpha I|| on the bracket,
    # which is at most a small multiple of ||A - (tr A / d) I||
    floor_tol = 64 * EPS * float(np.sum((A - np.trace(A) / d * eye) ** 2))
    if hi - lo <= 4 * EPS * max(abs(lo), abs(hi), 1.0):
        return f(lo), lo, {"certified_gap": 0.0, "evaluations": evals, "bracket": [lo, hi]}
    grid = np.linspace(lo, hi, 33 + min(d, 96))
    vals = np.array([f(a) for a in grid])
    best_val, best_a = float(vals.min()), float(grid[np.argmin(vals)])
    # Incumbent: bounded Brent around the three lowest grid local minima.
    interior = [i for i in range(len(grid))
                if vals[i] <= vals[max(i - 1, 0)] and vals[i] <= vals[min(i + 1, len(grid) - 1)]]
    for i in sorted(interior, key=lambda i: vals[i])[:3]:
        a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
        res = minimize_scalar(f, bounds=(a, b), method="bounded",
                              options={"xatol": 1e-13 * max(1.0, abs(hi - lo))})
        if res.fun < best_val:
            best_val, best_a = float(res.fun), float(res.x)

    def tol() -> float:
        return max(rtol * best_val, floor_tol)

    heap = []
    for a, b, fa, fb in zip(grid[:-1], grid[1:], vals[:-1], vals[1:]):
        heapq.heappush(heap, (_cell_lower_bound(a, b, fa, fb, m), a, b, fa, fb))
    gap_lb = heap[0][0]
    while heap:
        lb, a, b, fa, fb = heap[0]
        gap_lb = lb
        if lb >= best_val - tol() or evals >= max_evals:
            break
        heapq.heappop(heap)
        mid = 0.5 * (a + b)
        fm = f(mid)
        if fm < best_val:
            best_val, best_a = fm, mid
        for x0, x1, f0, f1 in ((a, mid, fa, fm), (mid, b, fm, fb)):
            heapq.heappush(heap, (_cell_lower_bound(x0, x1, f0, f1, m), x0, x1, f0, f1))
    gap = max(best_val - gap_lb, 0.0)
    info = {"certified_gap": gap, "tolerance": tol(), "evaluations": evals,
            "bracket": [lo, hi], "converged": bool(gap <= tol())}
    return best_val, best_a, info


def _cell_lower_bound(a: float, b: float, fa: float, fb: float, m: int) -> float:
    """min over [a, b] of the chord of f minus m (x - a)(b - x) (concavity of f - m x^2)."""
    h = b - a
    slope = (fb - fa) / h - m * h  # f_lb(a + x) = fa + slope x + m x^2
    x = min(max(-slope / (2 * m), 0.0), h)
    return fa + slope * x + m * x * x


def _race(starts: dict, step, value, *, rtol: float, race_iter: int, max_iter: int):
    """Multi-start block descent: every start runs ``race_iter`` steps, then the best one
    continues until a step lowers the value by less than ``rtol`` (relative) or ``max_iter``.

    ``step(state) -> state`` is one exact block-minimisation sweep, ``value(state)`` its risk.
    """
    def descend(state, prev, n):
        val = value(state)
        for it in range(1, n + 1):
            state = step(state)
            prev, val = val, value(state)
            if prev - val <= rtol * max(abs(prev), 1e-300):
                return state, val, it, True
        return state, val, n, False

    runs, best = {}, None
    for name, state in starts.items():
        state, val, it, done = descend(state, np.inf, race_iter)
        runs[name] = {"value": val, "iterations": it}
        if best is None or val < best[1]:
            best = (name, val, state, done)
    name, val, state, done = best
    if not done:
        state, val, it, done = descend(state, val, max_iter - race_iter)
        runs[name] = {"value": val, "iterations": race_iter + it}
    return state, val, {"starts": runs, "best_start": name, "converged": done}


def grn_v2_search(A: np.ndarray, r: int, starts: dict[str, np.ndarray], *, rtol: float = 1e-10,
                  race_iter: int = 5, max_iter: int = 600):
    """Best (value, D, M, info) of block coordinate descent D <- diag(A - M),
    M <- truncate(A - D, r), from each start diagonal (see :func:`_race`)."""
    def step(state):
        M = truncate(A - np.diag(state[0]), r)
        return np.diag(A - M).copy(), M

    def value(state):
        D, M = state
        return float(np.sum((A - np.diag(D) - M) ** 2))

    init = {name: (np.asarray(D, dtype=np.float64), truncate(A - np.diag(D), r))
            for name, D in starts.items()}
    (D, M), val, info = _race(init, step, value, rtol=rtol, race_iter=race_iter,
                              max_iter=race_iter)
    # The descent step is D <- D - grad/2 of F(D) = svd_tail_sq(A - D, r), whose gradient is
    # -2 diag(A - D - M(D)); quasi-Newton on F converges far faster than the plain steps.
    res = minimize(_v2_tail_and_grad, D, args=(A, r), jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter, "ftol": rtol * 1e-2, "gtol": 1e-12})
    if res.fun < val:
        D = res.x
        M = truncate(A - np.diag(D), r)
    # finish with exact block steps (monotone) to polish
    (D, M), val, polish = _race({"polish": (D, M)}, step, value, rtol=rtol,
                                race_iter=race_iter, max_iter=race_iter)
    info.update({"lbfgs_iterations": int(res.nit), "converged": bool(res.success)})
    return val, D, M, info


def _v2_tail_and_grad(D: np.ndarray, A: np.ndarray, r: int) -> tuple[float, np.ndarray]:
    R = A - np.diag(D) - truncate(A - np.diag(D), r)
    return float(np.sum(R**2)), -2.0 * np.diag(R)


def v3_objective(A: np.ndarray, D: np.ndarray, M: np.ndarray, w_norm: float,
                 e: np.ndarray) -> float:
    """Gaussian-x risk of x -> (D + M) x + relu(w^T x) x, w = w_norm e (noise dropped)."""
    d = A.shape[0]
    B = A - np.diag(D) - M
    t = np.trace(B) + e @ B @ e
    return float(np.sum(B**2) - 2 * w_norm * t / np.sqrt(2 * np.pi)
                 + w_norm**2 * (d + 2) / 2)


def v3_w_step(B: np.ndarray) -> tuple[float, np.ndarray, float]:
    """Optimal w for fixed B: (norm, direction, risk reduction t_+^2 / (pi (d+2)))."""
    d = B.shape[0]
    # scipy's divide-and-conquer driver: numpy's eigh is ~40x slower here (OpenBLAS 0.3.31).
    lam, vec = scipy.linalg.eigh((B + B.T) / 2, driver="evd")
    t = float(np.trace(B) + lam[-1])
    w_norm = max(t, 0.0) * 2 / (np.sqrt(2 * np.pi) * (d + 2))
    return w_norm, vec[:, -1], max(t, 0.0) ** 2 / (np.pi * (d + 2))


def grn_v3_search(A: np.ndarray, r: int, starts: dict[str, tuple[np.ndarray, np.ndarray]], *,
                  rtol: float = 1e-10, race_iter: int = 3, max_iter: int = 60):
    """Block descent over (w, M, D) from each (D, M) start; returns (best value, info).

    The starts' initial values already realise Theorem 4.2's v3 bounds and the v2 optimum, so a
    short race suffices. The descent converges slowly (linearly) and the v3 gain over v2 is
    O(1/d), so it stops after ``max_iter`` sweeps; ``info["converged"]`` says whether the
    relative decrease fell below ``rtol`` first. The value is an upper bound either way."""
    d = A.shape[0]

    def gate(D, M):
        return v3_w_step(A - np.diag(D) - M)[:2]

    def step(state):
        D, M = state
        w_norm, e = gate(D, M)
        target = A - (w_norm / np.sqrt(2 * np.pi)) * (np.eye(d) + np.outer(e, e))
        M = truncate(target - np.diag(D), r)
        return np.diag(target - M).copy(), M

    def value(state):  # risk at the optimal gate for this (D, M)
        return v3_objective(A, *state, *gate(*state))

    init = {name: (np.asarray(D, dtype=np.float64), M) for name, (D, M) in starts.items()}
    (D, M), val, info = _race(init, step, value, rtol=rtol, race_iter=race_iter,
                              max_iter=max_iter)
    w_norm, e = gate(D, M)
    return val, {"D": D, "w": w_norm * e, **info}
