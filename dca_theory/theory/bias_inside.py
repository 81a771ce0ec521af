r"""GRN-v3 with the bias inside the ReLU: its expressivity class and its excess risk (numpy).

Setting of Section 4 (linear layers :math:`f_t = V_t g_t`, :math:`\mathrm{rank}\,V_t\le r_t`,
:math:`r_* = \sum_t r_t < d`) with every combiner
:math:`\sum_i \mathrm{ReLU}(b_i + w^\top h_i)\odot h_i` (:math:`b_i\in R^d`, one :math:`w` per
combiner; the ``bias_inside`` gate of :mod:`dca_theory.gates`). Call its class
:math:`\mathcal C_{in}`, and :math:`\mathcal C_{v2}^{+} = \{(D+M)x: D\ \text{diagonal}\ \ge 0,
\ \mathrm{rank}\,M\le r_*\}`.

* **Linearisation at 0.** Every stack entry vanishes at x = 0, so each coefficient tends to
  :math:`\mathrm{ReLU}(b_i)` and :math:`F(x) = Lx + o(\|x\|)` with L the map of the same network
  at w = 0 and biases :math:`\mathrm{ReLU}(b)\ge0` (:func:`linearisation`). Hence
  :math:`L\in\mathcal C_{v2}^{+}`, and the linear members of :math:`\mathcal C_{in}` are exactly
  :math:`\mathcal C_{v2}^{+}` (":math:`\supseteq`": :func:`realise_v2_plus`).
* **Signs.** A negative :math:`D_{kk}` cannot come from the input slot; the layers carry signs
  (negate :math:`V_t`), so :math:`(D+M)x` is in :math:`\mathcal C_{in}` when
  :math:`\mathrm{rank}\,M + \#\{k: D_{kk}<0\}\le r_*` (``absorb=True``), not in general:
  :math:`-I\in\mathcal C_{v2}\subseteq\mathcal C_{v3}` has
  :math:`\min_{L\in\mathcal C_{v2}^{+}}\|-I-L\|_F^2 = d - r_*` (singular values of
  :math:`-I-D` are :math:`1+D_{kk}\ge1`).
* **Against the paper's gate.** A paper-gate network's layer slots emit
  :math:`(b_t+\sigma(w^\top f_t))\odot f_t\in S := \sum_t(\mathrm{col}V_t +
  \mathrm{diag}(b_t)\mathrm{col}V_t)`, :math:`\dim S\le 2r_*` (:func:`paper_gate_subspace`).
  :math:`F(x) = \mathrm{ReLU}(1+w^\top x)\odot x\in\mathcal C_{in}` equals
  :math:`x + (w^\top x)x` near 0; projecting off S, the :math:`\lambda^2` coefficient of
  :math:`F(\lambda x) - G(\lambda x)` is :math:`(w^\top x - \sigma(w'^\top x))\Pi x`, and pairing
  x with -x gives :math:`E\|\cdot\|^2\ge\tfrac12\|w\|^2(d-2r_*)` for every paper-gate G: so
  :math:`\mathcal C_{in}\not\subseteq\mathcal C_{v3}` when :math:`2r_* < d`.
* **Risk** (x ~ N(0, I)). The proof of Theorem 4.2 adds the gate to the input slot; with the
  bias inside that slot gives :math:`\mathrm{ReLU}(\beta + w^\top x)\odot x`, whose risk
  :func:`gate_risk` is closed-form (moments :func:`gate_moments`, both gates); the best
  rank-r M for a fixed gate is Eckart-Young (:func:`profile`), so :func:`minimise` searches
  2d numbers. Around any :math:`\beta > 0` the gate is linear but for a tail of mass
  :math:`\Phi(-\beta/\|w\|)`, and its term :math:`(w^\top x)x` is odd: no gain at any
  polynomial order, so Theorem 4.2's v3 bound holds with c = 0 (:func:`v2_plus_bound`) and
  (4.3) with :math:`\eta = \kappa` (:func:`threshold_inside`).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import ndtr
from threadpoolctl import threadpool_limits

from dca_theory import grn_formula
from dca_theory.theory import constructions as C
from dca_theory.theory import montecarlo as MC

INV_SQRT_2PI = 1.0 / MC.SQRT_2PI


def _relu(x):
    return np.maximum(x, 0.0)


# --- networks with the bias inside ------------------------------------------------------------

def _combine_inside(b, w, stack: list[np.ndarray]) -> np.ndarray:
    b = np.asarray(b, dtype=float)
    w = np.zeros(stack[0].shape[-1]) if w is None else np.asarray(w, dtype=float)
    return grn_formula.combine(b, w, _relu, np.stack(stack), bias_inside=True)


def forward_inside(net: C.LinearNet, X: np.ndarray) -> np.ndarray:
    """``net`` (b of shape (t+1, d) per combiner, w per combiner or None = 0) applied to the rows
    of X with every combiner ``sum_i ReLU(b_i + w.h_i) * h_i``."""
    X = np.atleast_2d(np.asarray(X, dtype=float))
    stack = [X]
    for t in range(net.depth):
        stack.append(_combine_inside(net.b[t], net.w[t], stack) @ net.V[t].T)
    return _combine_inside(net.b[-1], net.w[-1], stack)


def linearisation(net: C.LinearNet) -> np.ndarray:
    """The matrix L with ``forward_inside(net, x) = L x + o(|x|)``: the same network with w = 0
    and every bias replaced by ReLU(b)."""
    lin = C.LinearNet("grn_v3", net.V, tuple(_relu(np.asarray(b, float)) for b in net.b),
                      (None,) * len(net.b))
    return forward_inside(lin, np.eye(net.dim)).T


def realise_v2_plus(M: np.ndarray, D: np.ndarray, ranks, *, absorb: bool = False) -> C.LinearNet:
    r"""A bias-inside network (w = 0) computing :math:`(\mathrm{diag}D + M)x`. Needs D >= 0, or
    with ``absorb`` the negative part of D moved into the layers:
    :math:`\mathrm{rank}(M + \mathrm{diag}\min(D,0))\le\sum r_t`."""
    D = np.asarray(D, dtype=float)
    if absorb:
        M, D = np.asarray(M, float) + np.diag(np.minimum(D, 0.0)), np.maximum(D, 0.0)
    if np.any(D < 0):
        raise ValueError(f"D must be >= 0 without absorb (min {D.min():.3g}); "
                         "pass absorb=True to move negative entries into the layers")
    net = C.realise("grn_v2", M, ranks, D=D)
    return C.LinearNet("grn_v3", net.V, net.b, (None,) * len(net.b))


def random_inside_net(d: int, ranks, rng: np.random.Generator, *, w_scale: float = 1.0):
    """Random weights with biases of both signs and nonzero gates in every combiner."""
    T = len(ranks)
    V = tuple(rng.standard_normal((d, r)) @ rng.standard_normal((r, d)) / d for r in ranks)
    b = tuple(0.5 + rng.standard_normal((t + 1, d)) for t in range(T + 1))
    w = tuple(w_scale * rng.standard_normal(d) for _ in range(T + 1))
    return C.LinearNet("grn_v3", V, b, w)


def v2_plus_distance_to_negative_diagonal(D_neg: np.ndarray, r: int) -> float:
    r"""Exact :math:`\min\{\|\mathrm{diag}(D_{neg}) - L\|_F^2: L\in\mathcal C_{v2}^{+}(r)\}` for
    :math:`D_{neg}\le 0`: the sum of the d - r smallest :math:`D_{neg,k}^2` (adding
    :math:`D'\ge0` only grows every :math:`|D_{neg,k}-D'_k|`; Eckart-Young drops r of them)."""
    D_neg = np.asarray(D_neg, dtype=float)
    if np.any(D_neg > 0):
        raise ValueError("D_neg must be <= 0 entrywise")
    return float(np.sum(np.sort(D_neg**2)[: D_neg.size - r]))


# --- the paper's gate: where its layer slots can reach -----------------------------------------

def paper_gate_subspace(net: C.LinearNet) -> np.ndarray:
    r"""Orthonormal basis of :math:`S = \sum_t(\mathrm{col}V_t + \mathrm{diag}(b_t)\,\mathrm{col}
    V_t)` for a paper-gate network (b_t its output combiner's bias on slot t): every layer
    slot's output term lies in S whatever the inner combiners compute."""
    b_out = np.asarray(net.b[-1], dtype=float)
    cols = []
    for t, V in enumerate(net.V):
        U, s, _ = np.linalg.svd(V)
        base = U[:, : C.numerical_rank(V)]
        cols += [base, b_out[t + 1][:, None] * base]
    U, s, _ = np.linalg.svd(np.hstack(cols))
    return U[:, : int(np.sum(s > 1e-10 * max(s[0], 1.0)))]


def quadratic_gap_sq(w_paper: np.ndarray, w: np.ndarray, proj: np.ndarray, X: np.ndarray):
    r"""Sample mean of :math:`(w^\top x - \sigma(w'^\top x))^2\|\Pi x\|^2` over the rows of X,
    and its gradient in :math:`w'` (``w_paper``)."""
    s = X @ w_paper
    h, weight = X @ w - _relu(s), np.einsum("nd,nd->n", X @ proj, X)
    grad = -2.0 * ((h * weight * (s > 0))[:, None] * X).mean(axis=0)
    return float(np.mean(h**2 * weight)), grad


def quadratic_gap_lower_bound(w: np.ndarray, proj: np.ndarray) -> float:
    r""":math:`\tfrac12 E[(w^\top x)^2\|\Pi x\|^2]
    = \tfrac12(\|w\|^2\mathrm{tr}\Pi + 2w^\top\Pi w)`, which is
    :math:`\ge\tfrac12\|w\|^2(d - 2r_*)` for a projector off S."""
    return 0.5 * (float(w @ w) * float(np.trace(proj)) + 2.0 * float(w @ proj @ w))


# --- risk of the input-slot gate, x ~ N(0, I) --------------------------------------------------

GATES = ("inside", "paper")  # ReLU(beta + n z) | D + ReLU(n z) on the input slot


def gate_moments(bias: np.ndarray, n: float, gate: str = "inside"):
    r"""Moments :math:`(E g, E g z^2, E g^2, E g^2z^2)` of the input-slot coefficient, z ~ N(0, 1),
    n >= 0, elementwise in ``bias``. ``inside``, :math:`g = \mathrm{ReLU}(\beta + nz)`, at
    :math:`a = \beta/n`: :math:`(\beta\Phi + n\phi,\ \beta\Phi + 2n\phi,\ (\beta^2+n^2)\Phi
    + \beta n\phi,\ (\beta^2+3n^2)\Phi + \beta n\phi)` (``symbolic.bias_inside_moments``
    derives them); ``paper``, :math:`g = D + \mathrm{ReLU}(nz)`: Lemma B.1's moments."""
    bias = np.asarray(bias, dtype=float)
    if gate == "paper":
        k = n * INV_SQRT_2PI
        return (bias + k, bias + 2 * k, bias**2 + 2 * bias * k + n * n / 2,
                bias**2 + 4 * bias * k + 1.5 * n * n)
    if n <= 0:
        g = _relu(bias)
        return g, g, g * g, g * g
    a = bias / n
    Phi, phi = ndtr(a), np.exp(-0.5 * a * a) * INV_SQRT_2PI
    return (bias * Phi + n * phi, bias * Phi + 2 * n * phi,
            (bias**2 + n**2) * Phi + bias * n * phi, (bias**2 + 3 * n**2) * Phi + bias * n * phi)


def _target_and_cost(bias: np.ndarray, w: np.ndarray, gate: str):
    r"""(G, q) with :math:`E\|Bx - g(x)\odot x\|^2 = \|B-G\|_F^2 - \|G\|_F^2 + q` for every B:
    :math:`G = E[g\odot xx^\top]` (x = z e + y, y independent of z = e.x) and
    :math:`q = \sum_k E[g_k^2x_k^2]`."""
    n = float(np.linalg.norm(w))
    e = w / n if n > 0 else np.zeros_like(w)
    m1, m3, m2, m4 = gate_moments(bias, n, gate)
    G = np.diag(m1) + ((m3 - m1) * e)[:, None] * e[None, :]
    return G, float(np.sum(m2 * (1 - e**2) + m4 * e**2))


def gate_risk(B: np.ndarray, bias: np.ndarray, w: np.ndarray, gate: str = "inside") -> float:
    r""":math:`E\|Bx - g(x)\odot x\|^2`, x ~ N(0, I), closed form; g the input-slot coefficient
    (``inside``: :math:`\mathrm{ReLU}(\beta + w^\top x)`; ``paper``: :math:`D +
    \mathrm{ReLU}(w^\top x)`)."""
    G, q = _target_and_cost(np.asarray(bias, float), np.asarray(w, float), gate)
    return float(np.sum((B - G) ** 2) - np.sum(G * G) + q)


def gate_risk_mc(B, bias, w, n: int, rng: np.random.Generator,
                 gate: str = "inside") -> MC.Estimate:
    """Monte Carlo estimate of :func:`gate_risk` (with its standard error)."""
    B, bias, w = (np.asarray(a, dtype=float) for a in (B, bias, w))

    def sample(m, g):
        x = g.standard_normal((m, w.size))
        s = (x @ w)[:, None]
        coef = _relu(bias[None, :] + s) if gate == "inside" else bias[None, :] + _relu(s)
        res = x @ B.T - coef * x
        return np.einsum("nd,nd->n", res, res)

    return MC._mc(sample, n, rng)


def profile(A: np.ndarray, r: int, bias: np.ndarray, w: np.ndarray, gate: str = "inside"):
    """min over rank-r M of the risk of ``g(x) * x + M x`` for target A (Eckart-Young on A - G)."""
    G, q = _target_and_cost(bias, w, gate)
    s = np.linalg.svd(A - G, compute_uv=False)
    return float(np.sum(s[r:] ** 2) - np.sum(G * G) + q)


def minimise(A: np.ndarray, r: int, starts: list[tuple[np.ndarray, np.ndarray | None]], *,
             gate: str = "inside", gated: bool = True, maxiter: int = 150):
    """Best :func:`profile` found by L-BFGS (finite-difference gradients) over (bias, w) from
    each start, or over the bias alone with w = 0 (``gated=False``: GRN-v2 for ``paper``,
    :math:`C_{v2}^+` for ``inside``). Returns (value, bias, w)."""
    d = A.shape[0]

    def split(z):
        return (z[:d], z[d:]) if gated else (z, np.zeros(d))

    def fun(z):
        return profile(A, r, *split(z), gate=gate)

    bounds = [(0.0, None) if gate == "inside" else (None, None)] * d
    best = (np.inf, None, None)
    with threadpool_limits(limits=1, user_api="blas"):  # tiny SVDs: threads only cost
        for bias0, w0 in starts:
            best = _minimise_from(fun, split, bias0, w0, gate, gated, bounds, maxiter, best)
    return best


def _minimise_from(fun, split, bias0, w0, gate, gated, bounds, maxiter, best):
    """One L-BFGS run of :func:`minimise`; returns the better of ``best`` and its result."""
    z0 = np.concatenate([bias0, w0]) if gated else np.asarray(bias0, float)
    if not gated and gate == "inside":  # D >= 0 directly: ReLU(beta) has dead coordinates
        z0 = np.maximum(z0, 0.0)
    res = minimize(fun, z0, method="L-BFGS-B", bounds=bounds if not gated else None,
                   options={"maxiter": maxiter, "ftol": 1e-13, "gtol": 1e-8})
    for val, z in ((fun(z0), z0), (float(res.fun), res.x)):
        if val < best[0]:
            best = (val, *(a.copy() for a in split(z)))
    return best


def v2_plus_bound(A: np.ndarray, r: int) -> float:
    r"""Theorem 4.2's v2 bound with the diagonal clamped at 0 (Choice 1 with
    :math:`\alpha_+ = \max(0, 1+\mathrm{tr}\Delta/m)`, Choice 2 with
    :math:`D = \max(0, 1+\Delta_{kk})`): attained in :math:`\mathcal C_{v2}^{+}\subseteq
    \mathcal C_{in}`; equal to the v2 bound when :math:`A - I\succeq 0`."""
    d = A.shape[0]
    U, s, Vt = np.linalg.svd(A - np.eye(d))
    delta = (U[:, r:] * s[r:]) @ Vt[r:]
    m, fro2, tr, dg = d - r, float(np.sum(delta**2)), float(np.trace(delta)), np.diag(delta)
    choice1 = fro2 - tr**2 / m + m * min(0.0, 1.0 + tr / m) ** 2
    choice2 = fro2 - float(np.sum(dg**2)) + float(np.sum(np.minimum(0.0, 1.0 + dg) ** 2))
    return min(choice1, choice2)


def v2_plus_choice_points(A: np.ndarray, r: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(D >= 0, M) of :func:`v2_plus_bound`'s two choices (rank M <= r)."""
    d = A.shape[0]
    U, s, Vt = np.linalg.svd(A - np.eye(d))
    low, delta = (U[:, :r] * s[:r]) @ Vt[:r], (U[:, r:] * s[r:]) @ Vt[r:]
    alpha = max(0.0, 1.0 + np.trace(delta) / (d - r))
    M1 = low - (alpha - 1.0) * U[:, :r] @ U[:, :r].T
    return [(np.full(d, alpha), M1), (np.maximum(0.0, 1.0 + np.diag(delta)), low)]


def threshold_inside(kappa, d, *, lemma: str = "paper"):
    r"""(4.3) for the bias-inside gate: the same steps with the gain factor :math:`\eta` replaced
    by :math:`\kappa` (c = 0: the gate contributes no certified gain; GRN-v3's parameter count,
    so Lemma C.1's v3 rank loss). ``lemma``: "paper" :math:`(1-\kappa^2+\kappa\sqrt{d+\kappa^2
    +0.6})^2-1.6`, "tight" (Lemma C.1's exact v3 constant), or "integer" (integer ranks)."""
    from dca_theory.theory import tradeoff as TR

    k = np.asarray(TR.V.check_kappa(kappa), dtype=np.float64)
    d = TR.V.check_dim("d", d)
    TR.V.check_choice("lemma", lemma, TR.V.LEMMAS + ("integer",))
    if lemma == "integer":
        return TR._integer_threshold("grn_v3", k, d)
    if lemma == "paper":
        return (1 - k**2 + k * np.sqrt(d + k**2 + 0.6)) ** 2 - 1.6
    return (1 - k**2 + np.sqrt(k**4 + k**2 * (d + 0.5) + 1 / 16)) ** 2 - 25 / 16
