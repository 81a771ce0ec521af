"""Attention Residuals and static mHC in the linear model (theory/rivals.py): their classes in
Theorem 4.1's hierarchy and their excess risk.

Tolerances: constructions 1e-9 relative Frobenius (as Theorem 4.1's); exact identities of the
forward pass 1e-10; Monte Carlo 4 standard errors; Sinkhorn sums 1e-12."""

import numpy as np
import pytest

from dca_theory.theory import _checks_rivals as CR
from dca_theory.theory import constructions as C
from dca_theory.theory import rivals as RV
from dca_theory.theory.reference import tail_sq

RTOL = 1e-9


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _low_rank(rng, d, m):
    return rng.normal(size=(d, m)) @ rng.normal(size=(m, d)) / np.sqrt(d)


@pytest.mark.parametrize("ranks", [(1,), (2, 1), (1, 1, 2)])
def test_q_zero_nets_realise_scaled_resnets(ranks):
    rng = np.random.default_rng(0)
    d = 9
    M = _low_rank(rng, d, sum(ranks))
    net = RV.realise_mean_res(M, ranks)
    X = rng.normal(size=(30, d))
    out, alpha = RV.attn_res_forward(net, X)
    assert _rel(out, (X + X @ M.T) / (len(ranks) + 1)) <= RTOL
    np.testing.assert_allclose(alpha, 1.0 / (len(ranks) + 1), rtol=0, atol=1e-15)
    assert all(C.numerical_rank(V) <= r for V, r in zip(net.V, ranks))


def test_skip_identity_pairing_homogeneity_and_nonlinearity():
    rng = np.random.default_rng(1)
    d, ranks = 8, (2, 1, 1)
    net = RV.random_attn_res_net(d, ranks, rng, q_scale=3.0)
    X = rng.normal(size=(200, d))
    out, alpha = RV.attn_res_forward(net, X)
    out_neg, alpha_neg = RV.attn_res_forward(net, -X)
    U = np.linalg.svd(np.hstack(net.V))[0][:, :sum(ranks)]
    proj = np.eye(d) - U @ U.T
    assert _rel(out @ proj, alpha[0][:, None] * (X @ proj)) <= 1e-10
    np.testing.assert_allclose(alpha.sum(axis=0), 1.0, rtol=0, atol=1e-14)
    assert np.all(np.minimum(alpha[0], alpha_neg[0]) <= 0.5)
    assert _rel(RV.attn_res_forward(net, 1e3 * X)[0], 1e3 * out) <= 1e-12
    assert np.max(np.linalg.norm(out + out_neg, axis=1) / np.linalg.norm(out, axis=1)) > 1e-2


def test_one_layer_pairs_sum_to_one_and_the_bound_is_attained_at_identity():
    rng = np.random.default_rng(2)
    d, r = 7, 2
    net = RV.random_attn_res_net(d, (r,), rng, q_scale=3.0)
    X = rng.normal(size=(50, d))
    a, b = RV.attn_res_forward(net, X)[1][0], RV.attn_res_forward(net, -X)[1][0]
    np.testing.assert_allclose(a + b, 1.0, rtol=0, atol=1e-14)
    A = np.eye(d)
    assert RV.attn_res_lower_bound(A, r, 1) == pytest.approx((d - r) / 4, rel=1e-15)
    assert RV.attn_res_mean_risk(A, r, 1) == pytest.approx((d - r) / 4, rel=1e-12)


def test_mean_closed_form_matches_monte_carlo():
    rng = np.random.default_rng(3)
    d, ranks = 6, (1, 2)
    A = CR._spiked_target(rng, d, 2)
    T, r = len(ranks), sum(ranks)
    U, s, Vt = np.linalg.svd((T + 1) * A - np.eye(d))
    net = RV.realise_mean_res((U[:, :r] * s[:r]) @ Vt[:r], ranks)
    est = RV.risk_mc(net, A, 40000, rng)
    assert est.zscore(RV.attn_res_mean_risk(A, r, T)) <= 4.0


def test_search_never_beats_the_lower_bound():
    rng = np.random.default_rng(4)
    d, ranks = 5, (1, 1)
    A = np.eye(d)
    found = RV.attn_res_search(A, ranks, rng, restarts=1, n_fit=128, maxiter=40)
    lower = RV.attn_res_lower_bound(A, 2, 2)
    assert found["value"] >= lower - 4 * found["stderr"]
    assert found["value"] <= RV.attn_res_mean_risk(A, 2, 2) * 1.1  # starts at the q=0 optimum


@pytest.mark.parametrize("n", [1, 2, 4])
def test_mhc_class_is_n_times_resnet(n):
    rng = np.random.default_rng(5 + n)
    d, ranks = 10, (2, 1, 2)
    r = sum(ranks)
    for _ in range(5):
        W = RV.mhc_matrix(RV.random_mhc_net(d, ranks, n, rng))
        assert C.numerical_rank(W - n * np.eye(d), rtol=1e-9) <= r
    M = _low_rank(rng, d, r)
    assert _rel(RV.mhc_matrix(RV.realise_mhc(M, ranks, n, rng)), n * np.eye(d) + M) <= RTOL


def test_mhc_risk_is_eckart_young_and_n1_is_resnet():
    rng = np.random.default_rng(9)
    A = CR._spiked_target(rng, 8, 4)
    assert RV.mhc_excess_risk(A, 3, 1) == pytest.approx(tail_sq(A - np.eye(8), 3), rel=1e-12)
    assert RV.mhc_excess_risk(A, 3, 4) > RV.mhc_excess_risk(A, 3, 1)


def test_sinkhorn_is_doubly_stochastic():
    P = RV.sinkhorn(np.random.default_rng(10).normal(size=(5, 5)) * 3)
    np.testing.assert_allclose(P.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(P > 0)


def test_rival_rows_are_confirmed():
    rows = [row for _, check in CR.CHECKS for row in check(True)]
    assert len(rows) == len(CR.CHECKS)
    assert all(row.verdict == "confirmed" for row in rows), [r.worst for r in rows]
