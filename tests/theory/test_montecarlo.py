"""Monte Carlo estimates of the GRN-v3 Gaussian expectations against their closed forms.

Fixed seeds make every test deterministic. Agreement is required within 4 standard errors for
a scalar and 5 for the max over <= 25 matrix entries (a Bonferroni allowance); the wrong
(d+1) constant must be rejected by more than 8 standard errors."""

import numpy as np
import pytest

from dca_theory.theory import montecarlo as MC


@pytest.mark.parametrize("d", [1, 3, 5])
def test_lemma_b1_e1(d):
    rng = np.random.default_rng(d)
    w = np.eye(d)[0]
    est = MC.relu_outer_moment(w, 100_000, rng)
    exact = (np.eye(d) + np.outer(w, w)) / np.sqrt(2 * np.pi)  # Lemma B.1
    np.testing.assert_allclose(MC.relu_outer_closed_form(w), exact, rtol=1e-15)
    assert np.max(est.zscore(exact)) < 5.0


def test_lemma_b1_rotated_to_random_w():
    rng = np.random.default_rng(11)
    w = rng.normal(size=4) * 2.0
    est = MC.relu_outer_moment(w, 100_000, rng)
    assert np.max(est.zscore(MC.relu_outer_closed_form(w))) < 5.0


@pytest.mark.parametrize("d", [2, 5, 10])
def test_norm_moment_is_d_plus_2_not_d_plus_1(d):
    rng = np.random.default_rng(100 + d)
    w = rng.normal(size=d)
    est = MC.relu_norm_moment(w, 200_000, rng)
    np.testing.assert_allclose(MC.relu_norm_closed_form(w), w @ w * (d + 2) / 2, rtol=1e-15)
    assert est.zscore(MC.relu_norm_closed_form(w, 2)) < 4.0
    assert est.zscore(MC.relu_norm_closed_form(w, 1)) > 8.0


@pytest.mark.parametrize("d", [2, 6])
def test_v3_risk_closed_form(d):
    rng = np.random.default_rng(200 + d)
    B, w = rng.normal(size=(d, d)), rng.normal(size=d)
    est = MC.v3_risk(B, w, 200_000, rng)
    assert est.zscore(MC.v3_risk_closed_form(B, w)) < 4.0
    # w = 0: no gate, the risk is |B|_F^2 exactly.
    assert MC.v3_risk_closed_form(B, np.zeros(d)) == pytest.approx(np.sum(B * B), rel=1e-15)


def test_standard_error_shrinks_like_one_over_sqrt_n():
    w = np.array([1.0, -0.5, 0.25])
    small = MC.relu_norm_moment(w, 10_000, np.random.default_rng(0))
    large = MC.relu_norm_moment(w, 160_000, np.random.default_rng(0))
    # 16x the samples -> 4x smaller SE; 15% slack for the noise in the SE estimate itself.
    assert large.stderr == pytest.approx(small.stderr / 4, rel=0.15)


def test_chunking_does_not_change_the_estimate():
    w = np.array([0.3, 1.0])

    def sample(m, g):
        x = g.standard_normal((m, 2))
        return np.maximum(x @ w, 0.0)

    a = MC._mc(sample, 1000, np.random.default_rng(5), chunk=1000)
    b = MC._mc(sample, 1000, np.random.default_rng(5), chunk=1000)
    assert a.mean == b.mean and a.n == 1000


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: MC.relu_norm_moment(np.ones(3), 1, np.random.default_rng(0)), "n \\(samples\\)"),
        (lambda: MC.relu_outer_moment(np.ones(0), 10, np.random.default_rng(0)), "d must be"),
        (lambda: MC.v3_risk(np.ones((2, 3)), np.ones(3), 10, np.random.default_rng(0)),
         "B must be 3x3"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
