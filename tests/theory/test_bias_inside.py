"""GRN-v3 with the bias inside the ReLU (theory/bias_inside.py): its class against C_GRN-v2 and
the paper's C_GRN-v3, its Gaussian risk, and (4.3) with the gate's constant c = 0.

Tolerances: constructions 1e-9 relative Frobenius (as Theorem 4.1's); finite-difference
Jacobians 1e-6 (central differences at 1e-5); closed forms vs their definitions 1e-12; Monte
Carlo 4 standard errors."""

import numpy as np
import pytest

from dca_theory import theory as TH
from dca_theory.theory import _checks_bias_inside as CB
from dca_theory.theory import bias_inside as BI
from dca_theory.theory import constructions as C
from dca_theory.theory import montecarlo as MC
from dca_theory.theory import reference as R

RTOL = 1e-9


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _target(rng, d, m, n_neg):
    M = rng.normal(size=(d, m)) @ rng.normal(size=(m, d)) / np.sqrt(d)
    D = np.abs(rng.normal(size=d)) + 0.1
    D[:n_neg] *= -1
    return M, D


@pytest.mark.parametrize("seed", range(4))
def test_v2_plus_members_are_realised_with_signs_in_the_layers(seed):
    rng = np.random.default_rng(seed)
    d, ranks = 9, [2, 1, 2]
    M, D = _target(rng, d, 3, n_neg=2)  # rank 3 + 2 negative entries = r* = 5
    net = BI.realise_v2_plus(M, D, ranks, absorb=True)
    X = rng.normal(size=(25, d))
    assert _rel(BI.forward_inside(net, X), X @ (np.diag(D) + M).T) < RTOL
    assert all(C.numerical_rank(V) <= r for V, r in zip(net.V, ranks))


def test_broken_sign_handling_is_detected():
    # The same weights without moving the negative entries into the layers: ReLU(b) clamps
    # the input slot's negative coefficients to 0, so the map is wrong; the check must see it.
    rng = np.random.default_rng(0)
    d, ranks = 9, [2, 1, 2]
    M, D = _target(rng, d, 3, n_neg=2)
    v2 = C.realise("grn_v2", M, ranks, D=D)
    broken = C.LinearNet("grn_v3", v2.V, v2.b, (None,) * len(v2.b))
    X = rng.normal(size=(25, d))
    assert _rel(BI.forward_inside(broken, X), X @ (np.diag(D) + M).T) > 0.05
    with pytest.raises(ValueError, match="absorb=True"):
        BI.realise_v2_plus(M, D, ranks)
    with pytest.raises(ValueError, match="exceeds the allowed rank"):
        BI.realise_v2_plus(M, D - 10.0, ranks, absorb=True)  # 9 negatives: rank 12 > 5


@pytest.mark.parametrize("seed", range(3))
def test_jacobian_at_zero_is_the_gate_free_relu_b_net(seed):
    rng = np.random.default_rng(seed)
    d, ranks = 8, [1, 2]
    net = BI.random_inside_net(d, ranks, rng)  # biases of both signs, gates on
    h = 1e-5
    up, down = BI.forward_inside(net, h * np.eye(d)), BI.forward_inside(net, -h * np.eye(d))
    fd = (up - down).T / (2 * h)
    L = BI.linearisation(net)
    assert _rel(fd, L) < 1e-6
    low = L - np.diag(np.maximum(net.b[-1][0], 0.0))  # D >= 0 plus rank <= r*
    assert C.numerical_rank(low, rtol=1e-9) <= sum(ranks)
    # ... while the network itself is not linear (the gates act away from 0)
    X = 3.0 * rng.normal(size=(10, d))
    assert _rel(BI.forward_inside(net, X), X @ L.T) > 1e-3


def test_numpy_mirror_matches_the_jax_bias_inside_combiners():
    import equinox as eqx
    import jax.numpy as jnp

    from dca_theory.residual import ResidualStack, combine, make_combiner

    rng = np.random.default_rng(5)
    d, ranks = 6, [1, 2]
    net = BI.random_inside_net(d, ranks, rng)

    def comb(t):
        c = make_combiner("grn_v3", t + 1, d, dtype=jnp.float64, gate="bias_inside")
        c = eqx.tree_at(lambda c: c.b, c, jnp.asarray(net.b[t]))
        return eqx.tree_at(lambda c: c.w, c, jnp.asarray(net.w[t]))

    X = rng.normal(size=(5, d))
    stack = ResidualStack.start(jnp.asarray(X))
    for t in range(net.depth):
        stack = stack.push(combine(comb(t), stack) @ jnp.asarray(net.V[t]).T)
    y = np.asarray(combine(comb(net.depth), stack))
    np.testing.assert_allclose(y, BI.forward_inside(net, X), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d,r", [(3, 1), (6, 2), (10, 9)])
def test_minus_identity_is_at_distance_d_minus_r_from_v2_plus(d, r):
    assert BI.v2_plus_distance_to_negative_diagonal(-np.ones(d), r) == d - r
    rng = np.random.default_rng(d)
    for _ in range(20):  # no D >= 0 brings -I - D closer than d - r after a rank-r fit
        D = rng.exponential(size=d) * rng.integers(0, 2, size=d)
        assert R.tail_sq(-np.eye(d) - np.diag(D), r) >= d - r - 1e-12


def test_paper_gate_layer_slots_stay_in_their_subspace():
    rng = np.random.default_rng(2)
    d, ranks = 11, [2, 1, 2]
    net = C.random_net("grn_v3", d, ranks, rng)
    basis = BI.paper_gate_subspace(net)
    assert basis.shape[1] <= 2 * sum(ranks)
    proj = np.eye(d) - basis @ basis.T
    X = rng.normal(size=(40, d))
    slot0 = X * net.b[-1][0] + np.maximum(X @ net.w[-1], 0.0)[:, None] * X
    rest = (C.forward(net, X) - slot0) @ proj
    assert np.linalg.norm(rest) <= 1e-10 * np.linalg.norm(C.forward(net, X))


def test_bias_inside_quadratic_term_misses_every_paper_gate():
    rng = np.random.default_rng(3)
    d, r = 9, 3
    Q, _ = np.linalg.qr(rng.normal(size=(d, 2 * r)))
    proj = np.eye(d) - Q @ Q.T
    w = rng.normal(size=d)
    half = rng.normal(size=(3000, d))
    X = np.vstack([half, -half])
    bound = BI.quadratic_gap_lower_bound(w, proj)
    assert bound >= 0.5 * (w @ w) * (d - 2 * r) - 1e-12
    for w_paper in (w, -w, np.zeros(d), 2 * w, rng.normal(size=d)):
        sample = 0.5 * np.mean((X @ w) ** 2 * np.einsum("nd,nd->n", X @ proj, X))
        assert BI.quadratic_gap_sq(w_paper, w, proj, X)[0] >= sample * (1 - 1e-12)
    vals = (half @ w) ** 2 * np.einsum("nd,nd->n", half @ proj, half)
    assert abs(0.5 * vals.mean() - bound) <= 4 * 0.5 * vals.std(ddof=1) / np.sqrt(len(vals))


@pytest.mark.parametrize("gate", BI.GATES)
def test_gate_risk_closed_form_matches_monte_carlo(gate):
    rng = np.random.default_rng(7)
    d = 4
    B, bias, w = rng.normal(size=(d, d)), rng.normal(size=d), rng.normal(size=d)
    est = BI.gate_risk_mc(B, bias, w, 200_000, rng, gate=gate)
    assert est.zscore(BI.gate_risk(B, bias, w, gate)) <= 4.0


def test_paper_gate_risk_is_lemma_b1s_and_w0_is_v2():
    rng = np.random.default_rng(8)
    d = 5
    B, D, w = rng.normal(size=(d, d)), rng.normal(size=d), rng.normal(size=d)
    got = BI.gate_risk(B + np.diag(D), D, w, "paper")
    assert abs(got - MC.v3_risk_closed_form(B, w)) <= 1e-12 * abs(got)
    assert abs(BI.gate_risk(B, np.abs(D), np.zeros(d)) - np.sum((B - np.diag(np.abs(D))) ** 2)) \
        <= 1e-12 * np.sum(B * B)


def test_moments_match_quadrature_and_sympy():
    from dca_theory.theory import symbolic as S

    for beta, n in ((1.0, 0.3), (-0.4, 0.7), (0.0, 1.2)):
        got = np.array(BI.gate_moments(np.array(beta), n))
        np.testing.assert_allclose(got, CB._moment_quadrature(beta, n), rtol=1e-8)
    sym = S.bias_inside_moments()
    assert sym["ok"] and sym["ungated_limit_ok"]


def test_no_gain_from_the_gate_around_a_positive_bias():
    # ReLU(beta + w.x) = beta + w.x away from a tail of mass e^-(beta/|w|)^2/2: the gate's
    # first-order term (w.x) x is odd, so it costs |w|^2 (d+2) and gains nothing.
    rng = np.random.default_rng(9)
    d = 5
    B, beta = rng.normal(size=(d, d)), 1.0 + rng.uniform(size=d)
    base = np.sum((B - np.diag(beta)) ** 2)
    for scale in (1e-3, 1e-2, 0.05):
        w = scale * rng.normal(size=d) / np.sqrt(d)
        got = BI.gate_risk(B, beta, w)
        assert abs(got - (base + (w @ w) * (d + 2))) <= 1e-12 * base
    # the paper's gate at the same point gains to first order: its risk drops below base
    t = np.trace(B - np.diag(beta)) + np.linalg.eigvalsh((B + B.T) / 2 - np.diag(beta))[-1]
    if t > 0:
        e = np.linalg.eigh((B + B.T) / 2 - np.diag(beta))[1][:, -1]
        assert BI.gate_risk(B, beta, 1e-2 * e, "paper") < base


def test_clamped_v2_bound_equals_v2_bound_when_a_minus_i_is_psd():
    rng = np.random.default_rng(10)
    for _ in range(5):
        d = int(rng.integers(3, 9))
        r = int(rng.integers(1, d))
        A = R.random_target(d, rng, kind="shifted_psd", lam_min=0.1, lam_max=3.0)
        assert BI.v2_plus_bound(A, r) == pytest.approx(TH.excess_risk_bound("grn_v2", A, r),
                                                       rel=1e-12, abs=1e-12)
        for D, M in BI.v2_plus_choice_points(A, r):  # attained in C_v2+ by the choices
            assert np.all(D >= 0) and C.numerical_rank(M) <= r
        vals = [np.sum((A - np.diag(D) - M) ** 2) for D, M in BI.v2_plus_choice_points(A, r)]
        assert min(vals) == pytest.approx(BI.v2_plus_bound(A, r), rel=1e-10, abs=1e-12)


def test_clamped_v2_bound_is_attained_for_general_targets():
    rng = np.random.default_rng(11)
    for _ in range(5):
        d = int(rng.integers(3, 9))
        r = int(rng.integers(1, d))
        A = -R.random_target(d, rng)  # negative diagonals: clamping matters
        vals = [np.sum((A - np.diag(D) - M) ** 2) for D, M in BI.v2_plus_choice_points(A, r)]
        assert min(vals) == pytest.approx(BI.v2_plus_bound(A, r), rel=1e-10, abs=1e-12)
        assert BI.v2_plus_bound(A, r) >= TH.excess_risk_bound("grn_v2", A, r) - 1e-12


def test_threshold_inside_is_4_3_at_eta_equal_kappa():
    for d in (10, 100, 1000):
        kappa = np.linspace(0.05, 1.0, 20)
        got = BI.threshold_inside(kappa, d)
        np.testing.assert_array_less(got, TH.threshold("grn_v3", kappa[:-1], d).tolist() + [d + 1])
        assert got[-1] == pytest.approx(d)
    assert TH.threshold("grn_v3", 0.1, 100) - BI.threshold_inside(0.1, 100) == pytest.approx(
        0.0050, abs=5e-5)


def test_verify_rows_pass():
    for _, check in CB.CHECKS:
        for row in check(True):
            assert row.verdict == "confirmed", (row.claim, row.worst)
