"""Closed forms of dca_theory.theory against independent computations (Section 4).

Tolerances: values built from one SVD/eigendecomposition agree to ~1e-13 relative in float64;
we allow 1e-10 for SVD-vs-eigh comparisons and 1e-9 where a numerical 1-D search is involved
(the certified solver stops at a 1e-12 relative gap; scipy's own search is less precise).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import minimize, minimize_scalar

from dca_theory import theory as th
from dca_theory.theory import _optimize as O


def random_target(rng, d, *, symmetric=False, scale=2.0):
    G = rng.standard_normal((d, d)) * scale / np.sqrt(d)
    return np.eye(d) + (G + G.T) / 2 if symmetric else np.eye(d) + G


def spd_target(rng, d, lam_min, lam_max):
    """A = I + U diag(lam) U^T with lam in [lam_min, lam_max], both ends attained."""
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    lam = np.concatenate([[lam_min, lam_max], rng.uniform(lam_min, lam_max, d - 2)])
    return np.eye(d) + (Q * lam) @ Q.T


CASES = [(d, r, sym, seed) for d, r in [(6, 0), (6, 2), (12, 5), (16, 15), (16, 6)]
         for sym in (False, True) for seed in (0, 1)]


@pytest.mark.parametrize("d,r,sym,seed", CASES)
def test_res_and_base_are_eckart_young(d, r, sym, seed):
    # Independent route: the tail of eigvalsh(B^T B) instead of the SVD.
    A = random_target(np.random.default_rng(seed), d, symmetric=sym)
    for kind, B in (("res", A - np.eye(d)), ("base", A)):
        expected = np.sum(np.sort(np.linalg.eigvalsh(B.T @ B))[: d - r])
        assert th.excess_risk(kind, A, r) == pytest.approx(expected, rel=1e-10, abs=1e-12)
    # and the rank-r truncation attains it: ||A - I - M_r||_F^2
    M = O.truncate(A - np.eye(d), r)
    assert np.linalg.matrix_rank(M) <= r
    assert np.sum((A - np.eye(d) - M) ** 2) == pytest.approx(th.excess_risk("res", A, r), rel=1e-10)


def _scipy_alpha_search(A, r):
    """Fine grid over [-||A||_2, ||A||_2] (contains every minimiser) + scipy polish."""
    d = A.shape[0]
    radius = np.linalg.norm(A, 2)
    def f(a):
        return O.svd_tail_sq(A - float(np.squeeze(a)) * np.eye(d), r)
    grid = np.linspace(-radius, radius, 4001)
    vals = np.array([f(a) for a in grid])
    best = vals.min()
    for i in np.argsort(vals)[:5]:
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
        best = min(best, minimize_scalar(f, bounds=(lo, hi), method="bounded",
                                         options={"xatol": 1e-12}).fun,
                   minimize(f, x0=[grid[i]], method="Nelder-Mead",
                            options={"xatol": 1e-12, "fatol": 1e-15}).fun)
    return best


@pytest.mark.parametrize("d,r,seed", [(8, 2, 0), (15, 4, 1), (15, 10, 2), (30, 12, 3)])
def test_grn_v1_exact_matches_independent_search(d, r, seed):
    A = random_target(np.random.default_rng(seed), d)
    value, info = th.excess_risk("grn_v1", A, r, return_info=True)
    assert info["exact"] and "branch and bound" in info["method"]
    reference = _scipy_alpha_search(A, r)
    scale = np.sum((A - np.trace(A) / d * np.eye(d)) ** 2)
    assert value <= reference + 1e-12 * scale  # certified global minimum: never worse
    assert value == pytest.approx(reference, rel=1e-9)
    # the returned alpha attains the value
    assert O.svd_tail_sq(A - info["alpha"] * np.eye(d), r) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("d,r,seed", [(7, 3, 0), (16, 5, 1), (30, 1, 2), (30, 29, 3)])
def test_grn_v1_symmetric_closed_form_equals_general_search(d, r, seed):
    A = random_target(np.random.default_rng(seed), d, symmetric=True)
    value, info = th.excess_risk("grn_v1", A, r, return_info=True)
    assert "closed form" in info["method"]
    general, alpha, cert = O.grn_v1_general(A, r)
    assert cert["converged"]
    assert value == pytest.approx(general, rel=1e-10)


def test_grn_v1_symmetric_window_is_optimal_over_all_subsets():
    # Brute force: min over ALL (d - r)-subsets of eigenvalues of their spread about the mean.
    rng = np.random.default_rng(5)
    d, r = 8, 3
    A = random_target(rng, d, symmetric=True)
    lam = np.linalg.eigvalsh(A)
    brute = min(np.sum((lam[list(S)] - lam[list(S)].mean()) ** 2)
                for S in itertools.combinations(range(d), d - r))
    assert th.excess_risk("grn_v1", A, r) == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize("d,r,sym,seed", CASES)
def test_bounds_dominate_optima_and_classes_nest(d, r, sym, seed):
    A = random_target(np.random.default_rng(seed), d, symmetric=sym)
    er = {k: th.excess_risk(k, A, r) for k in ("res", "grn_v1", "grn_v2", "grn_v3")}
    bound = {k: th.excess_risk_bound(k, A, r) for k in er}
    slack = 1e-10 * (1.0 + er["res"])  # round-off of a few SVDs
    assert bound["res"] == pytest.approx(er["res"], rel=1e-10, abs=1e-12)
    for k in ("grn_v1", "grn_v2", "grn_v3"):
        assert er[k] <= bound[k] + slack, k
    # C_res within C_v1 within C_v2 within C_v3, and bounds nest the same way
    assert er["grn_v1"] <= er["res"] + slack
    assert er["grn_v2"] <= er["grn_v1"] + slack
    assert er["grn_v3"] <= er["grn_v2"] + slack
    assert bound["grn_v3"] <= bound["grn_v2"] <= bound["grn_v1"] <= bound["res"] + slack


def test_theorem_4_2_choice_1_attains_v1_bound_and_v3_constants():
    rng = np.random.default_rng(3)
    d, r = 12, 4
    A = random_target(rng, d)
    dec = th.delta_decomposition(A, r)
    m = d - r
    alpha = 1 + np.trace(dec.delta) / m
    Ur = np.eye(d) - dec.u_perp @ dec.u_perp.T
    A_tilde = dec.low_rank + (1 - alpha) * Ur  # rank <= r
    assert np.linalg.matrix_rank(A_tilde) <= r
    err = np.sum((A - alpha * np.eye(d) - A_tilde) ** 2)
    assert err == pytest.approx(th.excess_risk_bound("grn_v1", A, r), rel=1e-12)
    # constant="paper" uses 1/(pi(d+1)) > 1/(pi(d+2)): a smaller (more optimistic) bound
    assert th.excess_risk_bound("grn_v3", A, r, constant="paper") <= \
        th.excess_risk_bound("grn_v3", A, r)


def test_param_counts_and_matched_rank_budget():
    # hand-computed: d=10, r=3, T=4 -> 60, +6, +60, +60+40
    assert [th.param_count(k, 10, 3, 4) for k in ("base", "res", "grn_v1", "grn_v2", "grn_v3")] \
        == [60, 60, 66, 120, 160]
    np.testing.assert_array_equal(th.param_count("grn_v1", 10, [1, 2], [1, 3]), [20, 43])
    for kind in ("grn_v1", "grn_v2", "grn_v3"):
        for T in range(1, 9):
            rp = th.matched_rank(kind, 16, 9, T)
            if rp is None:
                continue
            assert rp >= T
            assert th.param_count(kind, 16, rp, T) <= 2 * 16 * 9
            if rp + 1 < 16:
                assert th.param_count(kind, 16, rp + 1, T) > 2 * 16 * 9
    assert th.best_matched_rank("grn_v1", 50, 20) == 20  # depth 1 costs nothing extra
    assert th.best_matched_rank("grn_v3", 50, 20) == 19  # the gate w costs d = half a rank


@pytest.mark.parametrize("kind", ["grn_v1", "grn_v2", "grn_v3"])
def test_lemma_c1_holds_for_every_depth(kind):
    for d in (1, 2, 3, 5, 8, 13, 21, 40):
        for r in range(d):
            bound = th.lemma_c1_bound(kind, d, r)
            tight = th.lemma_c1_bound(kind, d, r, lemma="tight")
            assert tight >= bound - 1e-12  # "tight" never weaker than the printed form
            for T, rp in th.feasible_matched_ranks(kind, d, r, integer=False).items():
                assert rp >= tight - 1e-9, (d, r, T)  # budget-equality relaxation: the lemma
            for T, rp in th.feasible_matched_ranks(kind, d, r).items():
                assert rp >= np.floor(tight + 1e-9), (d, r, T)  # integer ranks: its floor
            worst = th.worst_matched_rank(kind, d, r)
            if worst is not None:
                assert r - worst == th.rank_loss_bound(kind, d, r, lemma="integer")


def test_lemma_c1_integer_gap_is_real():
    # With integer ranks the continuous bound can fail by < 1 (documented in paper/01_theory.md).
    rp = th.matched_rank("grn_v1", 100, 3, 2)  # one extra scalar costs a whole rank
    assert rp == 2 and rp < th.lemma_c1_bound("grn_v1", 100, 3)


def test_thresholds_limits_and_printed_values():
    for d in (10, 100, 300):
        for kind in ("grn_v1", "grn_v2", "grn_v3"):
            for lemma in ("paper", "tight"):
                assert th.threshold(kind, 1.0, d, lemma=lemma) == pytest.approx(d, rel=1e-12)
    # (4.1) / d at kappa = 0.1, 0.3, 0.5, 0.8 (values listed in the reference notes)
    np.testing.assert_allclose(th.threshold("grn_v1", [0.1, 0.3, 0.5, 0.8], 1),
                               [0.189, 0.496, 0.714, 0.917], atol=6e-4)
    k = np.linspace(0.05, 1, 20)
    for kind in ("grn_v1", "grn_v2", "grn_v3"):
        assert np.all(np.diff(th.threshold(kind, k, 100)) > 0)  # increasing in kappa
        assert np.all(th.threshold(kind, k, 200) > th.threshold(kind, k, 100))  # and in d


@pytest.mark.parametrize("kind,lemma", [("grn_v1", "paper"), ("grn_v2", "paper"),
                                        ("grn_v3", "paper"), ("grn_v3", "tight")])
def test_threshold_is_root_of_sufficient_condition(kind, lemma):
    # At r = threshold, (C.2)/(C.10) with Lemma C.1's delta holds with equality.
    d = 120
    for kappa in (0.1, 0.4, 0.9):
        r = float(th.threshold(kind, kappa, d, lemma=lemma))
        k = kappa if kind != "grn_v3" else float(th.eta(kappa, d))
        delta = th.rank_loss_bound(kind, d, r, lemma=lemma)
        assert delta * (1 - k**2) == pytest.approx((d - r) * k**2, rel=1e-10)


def test_integer_threshold_matches_enumeration():
    d = 60
    for kind in ("grn_v1", "grn_v2", "grn_v3"):
        for kappa in (0.1, 0.5):
            k2 = (kappa if kind != "grn_v3" else float(th.eta(kappa, d))) ** 2
            ok = [all(r - rp < (d - rp) * k2
                      for rp in th.feasible_matched_ranks(kind, d, r).values())
                  for r in range(d)]
            first_fail = ok.index(False) if False in ok else d
            assert th.threshold(kind, kappa, d, lemma="integer") == first_fail


def test_eta_identity_and_order():
    for d in (5, 100):
        xi = float(th.xi0(d))
        assert xi / (1 + xi) < 0.03  # so the printed form applies at the kappas below
        for kappa in (0.03, 0.3, 1.0):
            lhs = (1 + xi) * kappa**2 - 2 * xi * kappa + xi
            eta_printed = np.sqrt(((kappa * (1 + xi) - xi) ** 2 + xi) / (1 + xi))
            assert float(th.eta(kappa, d)) ** 2 == pytest.approx(lhs, rel=1e-12)
            assert float(th.eta(kappa, d)) == pytest.approx(eta_printed, rel=1e-12)
            assert float(th.eta(kappa, d)) >= kappa
        # below the vertex xi/(1+xi) of h the minimum over u >= kappa is h(vertex)
        tiny = 0.5 * xi / (1 + xi)
        assert float(th.eta(tiny, d)) ** 2 == pytest.approx(xi / (1 + xi), rel=1e-12)
    assert float(th.xi0(100, "paper")) == pytest.approx(1 / (np.pi * (100**2 - 1)))


def test_figure_5_extremes():
    assert th.gain_lower_bound("grn_v1", 300, 0, 5, 10) == pytest.approx(7500)
    assert th.gain_lower_bound("grn_v2", 300, 0, 5, 10) == pytest.approx(7500)
    assert th.gain_lower_bound("grn_v2", 100, 100, 5, 10) == pytest.approx(-6142.5187, abs=1e-3)
    assert th.gain_lower_bound("grn_v2", 300, 50, 10, 10) == pytest.approx(25000)
    r = np.linspace(0, 100, 101)
    for d in (100, 200, 300):
        for kind in ("grn_v1", "grn_v2"):
            g = th.gain_lower_bound(kind, d, r, 5, 10)
            assert np.all(np.diff(g) < 0)  # decreasing in r_star
            assert g.min() >= -6142.52 and g.max() <= 7500 + 1e-9


@pytest.mark.parametrize("kind", ["grn_v1", "grn_v2", "grn_v3"])
def test_gain_lower_bounds_below_exact_gains(kind):
    rng = np.random.default_rng(11)
    d, lo, hi = 16, 2.0, 4.0
    A = spd_target(rng, d, lo, hi)
    for r in (1, 5, 9):
        er_res = th.excess_risk("res", A, r)
        g = th.gain_lower_bound(kind, d, r, lo, hi, lemma="integer")
        for T, rp in th.feasible_matched_ranks(kind, d, r).items():
            gain = er_res - th.excess_risk(kind, A, rp)  # v2/v3: an under-estimate of the gain
            assert gain >= g - 1e-9 * er_res, (r, T)


def test_rank_savings_suffice():
    rng = np.random.default_rng(2)
    d, lo, hi = 30, 3.0, 5.0
    A = spd_target(rng, d, lo, hi)
    kappa = lo / hi
    for r in (5, 15, 25):
        rp = th.rank_savings("grn_v1", r, d, kappa)
        assert rp < r
        above = int(np.floor(rp)) + 1
        assert th.sufficient_condition("grn_v1", r, above, d, kappa)
        assert th.excess_risk("grn_v1", A, min(above, r)) < th.excess_risk("res", A, r)
    assert th.rank_savings("grn_v1", 10, d, 1.0) == 0.0
    assert th.rank_savings("grn_v3", 25, d, kappa) <= th.rank_savings("grn_v1", 25, d, kappa)


def test_task_complexity():
    rng = np.random.default_rng(0)
    A = spd_target(rng, 10, 2.0, 8.0)
    lo, hi, kappa = th.task_complexity(A)
    assert (lo, hi, kappa) == pytest.approx((2.0, 8.0, 0.25), rel=1e-10)


def test_normalised_gain_guarantee_falls_with_rank_and_vanishes_at_full_rank():
    """The 0-1 scaled G2 guarantee set against measured ranks (LM width experiment)."""
    d = 64
    g = th.normalised_gain_guarantee("grn_v2", d, np.arange(0, 2 * d), 0.5)
    assert g[0] == pytest.approx(1.0)  # normalised at r_* = 0
    assert np.all(np.diff(g) <= 1e-12)  # non-increasing in the collective rank
    assert np.all(g >= 0) and np.all(g[d:] == 0)  # clipped; r_* >= d: ResNet already exact
    # a larger kappa (more complex task) keeps a positive guarantee to a larger rank
    assert (th.normalised_gain_guarantee("grn_v2", d, 8, 0.8)
            > th.normalised_gain_guarantee("grn_v2", d, 8, 0.3))
