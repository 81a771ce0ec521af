"""Symbolic derivations (dca_theory.theory.symbolic) and their agreement with the closed forms.

Exact checks are sympy identities (simplify(lhs - rhs) == 0); comparisons with the numpy closed
forms of ``tradeoff.py`` use rtol 1e-12 (float64 round-off of a few operations)."""

import numpy as np
import pytest
import sympy as sp

from dca_theory import theory as TH
from dca_theory.theory import symbolic as S

SQRT_2PI = sp.sqrt(2 * sp.pi)


@pytest.fixture(scope="module")
def thresholds():
    return S.thresholds()  # the slowest derivation (~1 s); shared by the tests below


def test_gauss_moments_are_textbook_values():
    x = sp.Symbol("x", real=True)
    # E[x^2] = 1, E[x^4] = 3, E[relu(x)] = 1/sqrt(2 pi), E[relu(x)^2] = 1/2.
    assert S.gauss_moment(x**2) == 1
    assert S.gauss_moment(x**4) == 3
    assert sp.simplify(S.gauss_moment(x, positive_only=True) - 1 / SQRT_2PI) == 0
    assert S.gauss_moment(x**2, positive_only=True) == sp.Rational(1, 2)


@pytest.mark.parametrize("d", [1, 2, 4])
def test_lemma_b1(d):
    out = S.lemma_b1(d)
    assert out["ok"]
    assert sp.simplify(out["matrix"][0, 0] - 2 / SQRT_2PI) == 0  # E[relu(x1) x1^2]
    if d > 1:
        assert sp.simplify(out["matrix"][1, 1] - 1 / SQRT_2PI) == 0
        assert out["matrix"][0, 1] == 0


def test_lemma_b1_rejects_bad_dimension():
    with pytest.raises(ValueError, match="d must be >= 1"):
        S.lemma_b1(0)


def test_relu_norm_moment_is_d_plus_2():
    out = S.relu_norm_moment()
    d, wn = sp.symbols("d w_norm", positive=True)
    assert out["ok"]
    assert sp.simplify(out["value"] - wn**2 * (d + 2) / 2) == 0
    assert out["e_relu_sq_x1_sq"] == sp.Rational(3, 2)
    # The paper's (d+1) is reproduced exactly by the fourth-moment slip, and only then.
    assert out["slip_gives_d_plus_1"]
    assert sp.simplify(out["value"] - out["d_plus_1_slip"]) != 0


def test_v3_constant_is_one_over_pi_d_plus_2():
    out = S.v3_constant()
    d = sp.Symbol("d", positive=True)
    assert out["ok"]
    assert sp.simplify(out["constant"] - 1 / (sp.pi * (d + 2))) == 0
    # The paper's constant claims a larger reduction than the proof delivers.
    t = sp.Symbol("t", positive=True)
    assert sp.simplify(out["paper_minus_correct"] - t**2 / (sp.pi * (d + 1) * (d + 2))) == 0
    # ... and the package's numeric constant agrees (rtol 1e-15: one division).
    for dd in (2, 7, 100):
        np.testing.assert_allclose(TH.v3_constant(dd, "corrected"), 1 / (np.pi * (dd + 2)),
                                   rtol=1e-15)
        np.testing.assert_allclose(TH.v3_constant(dd, "paper"), 1 / (np.pi * (dd + 1)),
                                   rtol=1e-15)


def test_woodbury_step():
    out = S.woodbury_step(3, 2, 1)
    assert out["v_equals_p1q1t"] and out["woodbury_ok"] and out["rank_step_ok"]
    # The remainder factors through r - r_T columns.
    assert out["left_factor"].shape == (3, 1) and out["right_factor"].shape == (1, 3)


def test_woodbury_step_rejects_bad_split():
    with pytest.raises(ValueError, match="r_last"):
        S.woodbury_step(3, 2, 2)


def test_grn_v1_alpha():
    out = S.grn_v1_alpha()
    tr, n2 = sp.symbols("trDelta normDelta2", real=True)
    m = sp.Symbol("d_minus_r", positive=True)
    assert out["ok"]
    assert sp.simplify(out["alpha_star"] - (1 + tr / m)) == 0
    assert sp.simplify(out["value"] - (n2 - tr**2 / m)) == 0


def test_thresholds_match_recon_forms(thresholds):
    out = thresholds
    assert out["ok"]
    for kind in ("grn_v1", "grn_v2", "grn_v3"):
        assert out[kind]["matches_recon"]
        assert out[kind]["leading_coeff"] == -1  # condition holds *between* the roots


@pytest.mark.parametrize("kind", ["grn_v1", "grn_v2", "grn_v3"])
@pytest.mark.parametrize("constant", ["corrected", "paper"])
def test_symbolic_thresholds_equal_closed_forms(kind, constant, thresholds):
    thr = thresholds[kind]["threshold"]
    var = sp.Symbol("eta" if kind == "grn_v3" else "kappa", positive=True)
    f = sp.lambdify((var, sp.Symbol("d", positive=True)), thr, "numpy")
    kappa = np.linspace(0.02, 1.0, 40)
    for d in (2, 10, 100, 300):
        q = TH.eta(kappa, d, constant) if kind == "grn_v3" else kappa
        got = TH.threshold(kind, kappa, d, constant=constant, lemma="paper")
        # rtol 1e-12 relative to max(1, |thr|): float64 evaluation of the same algebra.
        np.testing.assert_allclose(f(q, d), got, rtol=1e-12, atol=1e-12)


def test_threshold_sanity_values_of_4_1():
    # dca-paper.md §1.5 lists (4.1) at these kappa: r*/d < 0.189, 0.496, 0.714, 0.917, 1.
    kappa = np.array([0.1, 0.3, 0.5, 0.8, 1.0])
    got = TH.threshold("grn_v1", kappa, 1000) / 1000
    np.testing.assert_allclose(got, [0.189, 0.496, 0.714, 0.917, 1.0], atol=6e-4)


def test_eta_identity():
    out = S.eta_identity()
    u, xi = sp.symbols("u xi", positive=True)
    assert out["ok"]
    assert sp.simplify(out["argmin_u"] - xi / (1 + xi)) == 0
    assert sp.simplify(out["d_dxi"] - (1 - u) ** 2) == 0  # increasing in xi

