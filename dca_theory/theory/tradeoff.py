r"""Parameter budgets and the ResNet-vs-GRN trade-off: Lemma C.1, Theorem 4.3 and Proposition 4.4.

Setting (paper §4.2-4.3): a ResNet of collective rank :math:`r_*` stores
:math:`2 d r_*` parameters. A GRN of depth :math:`T` and collective rank :math:`r'` stores
:math:`2 d r' + e(T)` with the GRN overhead

* v1: :math:`e(T) = T(T-1)/2` (one scalar per pair of layers),
* v2: :math:`e(T) = d\,T(T-1)/2` (one d-vector per pair),
* v3: :math:`e(T) = d\,T(T-1)/2 + d\,T` (plus the gate vectors :math:`w_t`).

"At the same number of parameters" fixes the input dimension :math:`d` and the budget
:math:`2 d r_*`; the GRN's depth :math:`T` is free, every layer has rank >= 1 (so
:math:`T \le r'`), and the GRN gets the largest collective rank that fits.

Lemma C.1 bounds the rank a GRN loses, :math:`\delta = r_* - r'`, for every feasible depth:
v1 :math:`\delta \le (\sqrt{d+r_*}-\sqrt d)^2`, v2 :math:`\delta \le (\sqrt{1+r_*}-1)^2`,
v3 :math:`\delta \le (\sqrt{1.6+r_*}-1)^2` (printed) or the exact
:math:`(\sqrt{r_*+25/16}-1)^2 - 1/16` ("tight"). These hold for the budget-equality relaxation
(real :math:`r'`); with integer ranks the largest feasible :math:`r'` is only
:math:`\ge \lfloor\text{bound}\rfloor` (``lemma="integer"``), see ``paper/01_theory.md``.

Theorem 4.3(i): the sufficient condition (C.2) :math:`r_* - r' < (d - r')\kappa^2`
(v1, v2) or (C.10) with :math:`\eta` in place of :math:`\kappa` (v3), combined with Lemma C.1,
gives thresholds (4.1)-(4.3) on :math:`r_*`. Theorem 4.3(ii): lower bounds G1, G2 (and our G3)
on the excess-risk gain. Proposition 4.4: the rank a GRN needs to beat a ResNet of rank
:math:`r_*`.
"""

from __future__ import annotations

import numpy as np

from dca_theory import schemes
from dca_theory.theory import _validate as V

_LEMMA_HELP = "paper | tight | integer"


def v3_constant(d, constant: str = "corrected"):
    r"""The constant :math:`c` of the GRN-v3 gain :math:`c\,(\nu)_+^2` in Theorem 4.2.

    "corrected": :math:`E[\sigma(w^\top x)^2\|x\|^2] = \|w\|^2 (d+2)/2` for
    :math:`x \sim N(0, I)` gives :math:`c = 1/(\pi(d+2))`; "paper": the proof of Thm 4.3 uses
    :math:`\xi = 1/(\pi(d+1)(d-r'''))`, i.e. :math:`c = 1/(\pi(d+1))`.
    """
    V.check_choice("constant", constant, V.CONSTANTS)
    d = np.asarray(d, dtype=np.float64)
    return 1.0 / (np.pi * (d + (2.0 if constant == "corrected" else 1.0)))


def xi0(d, constant: str = "corrected"):
    r""":math:`\xi_0 = c/(d-1)`, the smallest :math:`\xi = c/(d - r''')` when
    :math:`r''' \ge 1`: paper :math:`1/(\pi(d^2-1))`, corrected :math:`1/(\pi(d+2)(d-1))`."""
    d = np.asarray(d, dtype=np.float64)
    return v3_constant(d, constant) / (d - 1.0)


def eta(kappa, d, constant: str = "corrected"):
    r""":math:`\eta = \sqrt{((\kappa(1+\xi_0)-\xi_0)^2 + \xi_0)/(1+\xi_0)}` (Prop. 4.4).

    This is :math:`\sqrt{h(\kappa)}` with :math:`h(u) = u^2 + \xi_0 (1-u)^2`, the lower bound
    of the v3 gain per unit of tail used in (C.10); it is valid as a minimum over
    :math:`u \ge \kappa` only when :math:`\kappa \ge \xi_0/(1+\xi_0)` (below, :math:`h` is not
    monotone). ``eta`` uses :math:`\max(\kappa, \xi_0/(1+\xi_0))` there, which differs from the
    printed form only for :math:`\kappa < 1/(\pi d^2)`.
    """
    kappa = V.check_kappa(kappa)
    x = xi0(d, constant)
    u = np.maximum(kappa, x / (1.0 + x))
    return np.sqrt(u**2 + x * (1.0 - u) ** 2)


def param_count(kind: str, d, r_star, T):
    """Parameters of each architecture (paper §4.2, Lemma C.1): base/res ``2 d r_*``, GRN-v1
    ``+ T(T-1)/2``, GRN-v2 ``+ d T(T-1)/2``, GRN-v3 ``+ d T(T-1)/2 + d T``. Integers,
    vectorised over ``r_star`` and ``T``."""
    kind = V.check_kind(kind)
    d = V.check_dim("d", d)
    r = V.check_rank(r_star, d)
    T = V.check_int_at_least("T", T, 1)
    count = 2 * d * r + _overhead(kind, d, T)
    return int(count) if np.ndim(count) == 0 else count


def _overhead(kind: str, d: int, T):
    return schemes.network_combiner_params(kind, T, d, convention="paper")


def matched_rank(kind: str, d, r_star, T, *, integer: bool = True):
    """Largest collective rank ``r'`` of a depth-``T`` GRN whose parameter count does not
    exceed the ResNet budget ``2 d r_star`` (d and the budget fixed, T chosen by the caller).

    ``integer=True``: the largest integer ``r' >= T`` with
    ``param_count(kind, d, r', T) <= 2 d r_star``. ``integer=False``: the real ``r'`` that
    spends the budget exactly (Lemma C.1's relaxation). Returns ``None`` when no ``r' >= T``
    fits (each of the T layers needs rank >= 1).
    """
    kind = V.check_kind(kind)
    d = V.check_dim("d", d)
    r = int(V.check_rank(r_star, d))
    T = int(V.check_int_at_least("T", T, 1))
    if schemes.get(kind).family == "plain":
        return (r if integer else float(r)) if r >= T else None
    spare = 2 * d * r - int(_overhead(kind, d, np.int64(T)))
    if spare < 0:
        return None
    rp = spare // (2 * d) if integer else spare / (2 * d)
    return (int(rp) if integer else float(rp)) if rp >= T else None


def feasible_matched_ranks(kind: str, d, r_star, *, integer: bool = True) -> dict[int, float]:
    """``{T: matched_rank(kind, d, r_star, T)}`` for every depth T with a feasible GRN."""
    d = V.check_dim("d", d)
    r = int(V.check_rank(r_star, d))
    out = {}
    for T in range(1, r + 1):  # r' >= T and r' <= r_star bound the depth
        rp = matched_rank(kind, d, r, T, integer=integer)
        if rp is not None:
            out[T] = rp
    return out


def best_matched_rank(kind: str, d, r_star):
    """The largest integer GRN collective rank over all feasible depths (smallest rank loss);
    ``None`` if no depth fits. For v1/v2 this is depth 1 and equals ``r_star``."""
    ranks = feasible_matched_ranks(kind, d, r_star)
    return max(ranks.values()) if ranks else None


def worst_matched_rank(kind: str, d, r_star, *, integer: bool = True):
    """The smallest matched rank over all feasible depths: the case Lemma C.1 bounds."""
    ranks = feasible_matched_ranks(kind, d, r_star, integer=integer)
    return min(ranks.values()) if ranks else None


def rank_loss_bound(kind: str, d, r_star, *, lemma: str = "paper"):
    r"""Lemma C.1's upper bound on :math:`\delta = r_* - r'` (see module docstring).

    ``lemma``: "paper" (printed constants), "tight" (v3: exact
    :math:`(\sqrt{r_*+25/16}-1)^2 - 1/16`; v1, v2 as printed, which are already exact), or
    "integer" (the exact worst case over depths for integer ranks and budget
    ``param_count <= 2 d r_star``, computed, not a closed form; it is <= ceil of the tight bound).
    Vectorised over ``r_star`` (real values allowed except for "integer"; 0 <= r_star <= d).
    """
    kind = V.check_kind(kind, V.GRN_KINDS)
    V.check_choice("lemma", lemma, V.LEMMAS + ("integer",))
    d = V.check_dim("d", d)
    if lemma == "integer":
        return _worst_integer_rank_loss(kind, d, V.check_rank(r_star, d, allow_d=True))
    r = V.check_rank(r_star, d, integer=False, allow_d=True)
    if kind == "grn_v1":
        delta = (np.sqrt(d + r) - np.sqrt(d)) ** 2
    elif kind == "grn_v2":
        delta = (np.sqrt(1.0 + r) - 1.0) ** 2
    elif lemma == "paper":
        delta = (np.sqrt(1.6 + r) - 1.0) ** 2
    else:
        delta = np.maximum((np.sqrt(r + 25.0 / 16.0) - 1.0) ** 2 - 1.0 / 16.0, 0.0)
    return delta


def _worst_integer_rank_loss(kind: str, d: int, r) -> np.ndarray | np.floating:
    """max over feasible depths T of r - (largest integer r' >= T within budget 2 d r)."""
    r = np.asarray(r, dtype=np.int64)
    T = np.arange(1, max(int(r.max(initial=0)), 1) + 1, dtype=np.int64)
    spare = 2 * d * r[..., None] - _overhead(kind, d, T)  # shape (..., T)
    rp = np.floor_divide(spare, 2 * d)
    feasible = (spare >= 0) & (rp >= T)
    loss = np.where(feasible, r[..., None] - rp, 0)
    return loss.max(axis=-1).astype(np.float64)


def lemma_c1_bound(kind: str, d, r_star, *, lemma: str = "paper"):
    """Lemma C.1: lower bound ``r_star - rank_loss_bound`` on the collective rank of a
    matched-budget GRN, valid for every depth (see :func:`rank_loss_bound` for ``lemma``)."""
    r = np.asarray(r_star, dtype=np.float64)
    return r - rank_loss_bound(kind, d, r_star, lemma=lemma)


def _gain_factor(kind: str, kappa, d, constant: str):
    """kappa for v1/v2 (C.2, C.6); eta for v3 (C.10)."""
    return np.asarray(kappa, dtype=np.float64) if kind != "grn_v3" else eta(kappa, d, constant)


def threshold(kind: str, kappa, d, *, constant: str = "corrected", lemma: str = "paper"):
    r"""Theorem 4.3(i): a GRN beats the ResNet at equal parameters if ``r_star < threshold``.

    (4.1) :math:`d[(1-\kappa^2+\kappa\sqrt{1+\kappa^2})^2 - 1]`, (4.2)
    :math:`(1-\kappa^2+\kappa\sqrt{d+\kappa^2})^2 - 1`, (4.3)
    :math:`(1-\eta^2+\eta\sqrt{d+\eta^2+0.6})^2 - 1.6`; ``lemma="tight"`` gives v3's
    :math:`(1-\eta^2+\sqrt{\eta^4+\eta^2(d+1/2)+1/16})^2 - 25/16`; ``lemma="integer"``
    gives, for integer ranks, the smallest integer :math:`r_*` at which the integer form of
    the sufficient condition fails. A value <= 0 means no :math:`r_*` is covered.
    Vectorised over ``kappa``.
    """
    kind = V.check_kind(kind, V.GRN_KINDS)
    V.check_choice("lemma", lemma, V.LEMMAS + ("integer",))
    d = V.check_dim("d", d)
    k = _gain_factor(kind, V.check_kappa(kappa), d, constant)
    if lemma == "integer":
        return _integer_threshold(kind, k, d)
    if kind == "grn_v1":
        return d * ((1 - k**2 + k * np.sqrt(1 + k**2)) ** 2 - 1)
    if kind == "grn_v2":
        return (1 - k**2 + k * np.sqrt(d + k**2)) ** 2 - 1
    if lemma == "paper":
        return (1 - k**2 + k * np.sqrt(d + k**2 + 0.6)) ** 2 - 1.6
    return (1 - k**2 + np.sqrt(k**4 + k**2 * (d + 0.5) + 1 / 16)) ** 2 - 25 / 16


def _integer_threshold(kind: str, k, d: int):
    """Smallest integer r at which the integer worst-case condition
    delta_int(r) (1 - k^2) < (d - r) k^2 first fails (monotone in r)."""
    r = np.arange(d + 1, dtype=np.float64)
    delta = rank_loss_bound(kind, d, r, lemma="integer")
    k2 = np.asarray(k, dtype=np.float64)[..., None] ** 2
    ok = delta * (1 - k2) < (d - r) * k2  # shape (..., d+1); monotone in r
    first_fail = np.where(ok.all(axis=-1), d, np.argmin(ok, axis=-1))
    return first_fail.astype(np.float64)


def sufficient_condition(kind: str, r_star, r_prime, d, kappa, *, constant: str = "corrected"):
    """(C.2) / (C.6) / (C.10): ``r_star - r' < (d - r') k^2`` with k = kappa (v1, v2) or eta."""
    kind = V.check_kind(kind, V.GRN_KINDS)
    d = V.check_dim("d", d)
    k = _gain_factor(kind, V.check_kappa(kappa), d, constant)
    r, rp = np.asarray(r_star, dtype=float), np.asarray(r_prime, dtype=float)
    return r - rp < (d - rp) * k**2


def rank_savings(kind: str, r_star, d, kappa, *, constant: str = "corrected", clip: bool = True):
    r"""Proposition 4.4: a GRN with collective rank above
    :math:`r'_* = (r_* - d\kappa^2)/(1-\kappa^2)` (v1, v2; :math:`\eta` for v3) has a smaller
    excess risk than a ResNet of collective rank :math:`r_*`.

    With ``clip`` (default) negative values, meaning any rank >= 0 suffices, are returned as 0;
    at kappa = 1 (so eta = 1) every rank suffices and 0 is returned.
    """
    kind = V.check_kind(kind, V.GRN_KINDS)
    d = V.check_dim("d", d)
    r = V.check_rank(r_star, d, integer=False)
    k2 = _gain_factor(kind, V.check_kappa(kappa), d, constant) ** 2
    one = k2 >= 1.0
    denom = np.where(one, 1.0, 1.0 - k2)
    out = np.where(one, -np.inf, (r - d * k2) / denom)
    return np.maximum(out, 0.0) if clip else out


def gain_lower_bound(kind: str, d, r_star, lam_min, lam_max, *, constant: str = "corrected",
                     lemma: str = "paper"):
    r"""Theorem 4.3(ii): lower bounds on :math:`G = ER^*(C_{res}) - ER^*(C_{GRN})` at equal
    parameters, for :math:`A - I \succ 0` with eigenvalues in [lam_min, lam_max].

    G1, G2: :math:`\lambda_{max}^2[(d-r_*)\kappa^2 - (1-\kappa^2)\bar\delta]` with
    :math:`\bar\delta` Lemma C.1's rank-loss bound. G3 (ours, derived in
    ``paper/01_theory.md``): :math:`\min_{s\in[\lambda_{min},\lambda_{max}]}
    (d-r_*)\lambda_{min}^2 + c'(s-\lambda_{min})^2 - \bar\delta(s^2-\lambda_{min}^2)` with
    :math:`c' = c` if :math:`\kappa \ge c/(d-r_*+c)`, else 0. Vectorised over ``r_star``,
    ``lam_min``, ``lam_max``; ``r_star = d`` is admitted (Figure 5's endpoint).
    """
    kind = V.check_kind(kind, V.GRN_KINDS)
    d = V.check_dim("d", d)
    r = V.check_rank(r_star, d, integer=False, allow_d=True)
    lo, hi = V.check_eigen_range(lam_min, lam_max)
    delta = rank_loss_bound(kind, d, r, lemma=lemma)
    if kind != "grn_v3":
        kappa2 = (lo / hi) ** 2
        return hi**2 * ((d - r) * kappa2 - (1 - kappa2) * delta)
    c = v3_constant(d, constant)
    c_eff = np.where(lo * (d - r + c) >= c * hi, c, 0.0)
    return _min_gain_quadratic(d - r, c_eff, delta, lo, hi)


def _min_gain_quadratic(m, c, delta, lo, hi):
    """min over s in [lo, hi] of m lo^2 + c (s - lo)^2 - delta (s^2 - lo^2)."""
    def q(s):
        return m * lo**2 + c * (s - lo) ** 2 - delta * (s**2 - lo**2)

    best = np.minimum(q(lo), q(hi))
    curv = c - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.where(curv > 0, c * lo / np.where(curv > 0, curv, 1.0), lo)
    inside = (curv > 0) & (vertex > lo) & (vertex < hi)
    return np.where(inside, np.minimum(best, q(np.clip(vertex, lo, hi))), best)


def normalised_gain_guarantee(kind: str, d: int, r_star, kappa: float):
    r"""The gain Theorem 4.3(ii) guarantees, on a 0-1 scale: :func:`gain_lower_bound` at
    :math:`\lambda_{min} = \kappa`, :math:`\lambda_{max} = 1` and collective rank ``r_star``,
    clipped at 0 (a negative bound guarantees nothing) and divided by its value at
    :math:`r_* = 0` (1 = the largest). 0 for :math:`r_* \ge d`, where a ResNet of that rank is
    already exact. Vectorised over ``r_star``; a scalar in, a float out.

    This is the overlay set against measured ranks of trained networks (the LM width
    experiment and its figure), where ``r_star`` may exceed ``d``.
    """
    r = np.asarray(r_star, dtype=float)
    inside = np.clip(r, 0.0, d)
    g = gain_lower_bound(kind, d, inside, kappa, 1.0)
    g0 = gain_lower_bound(kind, d, 0.0, kappa, 1.0)
    out = np.where(r < d, np.maximum(g, 0.0) / g0, 0.0)
    return float(out) if out.ndim == 0 else out
