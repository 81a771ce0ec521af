"""Theorem 4.1 constructively: the layer weights of constructions.py realise each class member.

End-to-end maps must equal the target map to 1e-9 relative Frobenius error (the brief's bar;
observed errors are ~1e-13, from a few d x d products and one small inverse). The numpy forward
pass is also checked against the shared JAX residual operator (dca_theory.residual) itself."""

import numpy as np
import pytest

from dca_theory.theory import constructions as C

RTOL = 1e-9


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _case(rng, kind, d=9, ranks=(2, 1, 3)):
    m = min(ranks) if kind == "base" else sum(ranks)
    M = rng.normal(size=(d, m)) @ rng.normal(size=(m, d)) / np.sqrt(d)
    args = dict(alpha=float(rng.normal()), D=rng.normal(size=d), w=rng.normal(size=d))
    return M, args


@pytest.mark.parametrize("kind", C.KINDS)
@pytest.mark.parametrize("seed", range(5))
def test_construction_realises_class_member(kind, seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(4, 14))
    ranks = [int(rng.integers(1, 3)) for _ in range(int(rng.integers(1, 4)))]
    M, args = _case(rng, kind, d, ranks)
    net = C.realise(kind, M, ranks, rng=rng, **args)
    X = rng.normal(size=(30, d))
    assert _rel(C.forward(net, X), C.target_map(kind, M, X, **args)) < RTOL
    assert all(C.numerical_rank(V) <= r for V, r in zip(net.V, ranks))


def test_res_last_layer_is_p1q1t():
    # (A.1): V_T = B C^T reduces to P1 Q1^T for the first r_T singular directions.
    rng = np.random.default_rng(0)
    M, _ = _case(rng, "res", 8, (2, 2))
    net = C.realise("res", M, [2, 2])
    P, Q = C.low_rank_factors(M, 4)
    assert _rel(net.V[-1], P[:, :2] @ Q[:, :2].T) < 1e-12


def test_paper_v3_construction_fails_unless_w_orthogonal_to_range():
    rng = np.random.default_rng(1)
    d, ranks = 8, [1, 2]
    M, args = _case(rng, "grn_v3", d, ranks)
    X = rng.normal(size=(40, d))
    paper = C.realise("grn_v3", M, ranks, paper_v3=True, **args)
    # Generic w: the output gate also fires on the layer slots -> a gross error.
    assert _rel(C.forward(paper, X), C.target_map("grn_v3", M, X, **args)) > 1e-2
    U = np.linalg.svd(M)[0]
    args["w"] = U[:, 3:] @ rng.normal(size=d - 3)  # w^T M = 0
    paper = C.realise("grn_v3", M, ranks, paper_v3=True, **args)
    assert _rel(C.forward(paper, X), C.target_map("grn_v3", M, X, **args)) < RTOL


@pytest.mark.parametrize("kind", ["base", "res", "grn_v1", "grn_v2"])
def test_random_nets_lie_in_the_class(kind):
    """The converse inclusion: any weights give a map of the class (numerical rank)."""
    rng = np.random.default_rng(2)
    d, ranks = 10, [1, 2, 2]
    for _ in range(5):
        net = C.random_net(kind, d, ranks, rng)
        W = C.end_to_end_matrix(net)
        low = {"base": W, "res": W - np.eye(d)}.get(kind)
        if kind == "grn_v1":
            low = W - net.b[-1][0] * np.eye(d)
        if kind == "grn_v2":
            low = W - np.diag(net.b[-1][0])
        allowed = min(ranks) if kind == "base" else sum(ranks)
        assert C.numerical_rank(low, rtol=1e-9) <= allowed
        assert C.numerical_rank(low, rtol=1e-9) == allowed  # generic weights reach it


@pytest.mark.parametrize("kind", C.KINDS)
def test_numpy_forward_matches_shared_jax_operator(kind):
    import equinox as eqx
    import jax.numpy as jnp

    from dca_theory.residual import ResidualStack, combine, make_combiner

    rng = np.random.default_rng(3)
    d, ranks = 7, [1, 2]
    M, args = _case(rng, kind, d, ranks)
    net = C.realise(kind, M, ranks, rng=rng, **args)
    X = rng.normal(size=(6, d))

    def comb(t):  # Theorem 4.1's GRN-v3 is the paper's gate (bias outside the ReLU)
        if net.b[t] is None:
            return make_combiner(kind, t + 1, d, dtype=jnp.float64, gate="paper")
        comb = make_combiner(kind, t + 1, d, dtype=jnp.float64, gate="paper")
        comb = eqx.tree_at(lambda c: c.b, comb, jnp.asarray(net.b[t]))
        if net.w[t] is None:
            return comb
        return eqx.tree_at(lambda c: c.w, comb, jnp.asarray(net.w[t]))

    stack = ResidualStack.start(jnp.asarray(X))
    for t in range(net.depth):
        stack = stack.push(combine(comb(t), stack) @ jnp.asarray(net.V[t]).T)
    y = np.asarray(combine(comb(net.depth), stack))
    np.testing.assert_allclose(y, C.forward(net, X), rtol=1e-12, atol=1e-12)
    assert _rel(y, C.target_map(kind, M, X, **args)) < RTOL


def test_v3_gate_scaling_properties():
    rng = np.random.default_rng(4)
    d = 6
    M = rng.normal(size=(d, 2)) @ rng.normal(size=(2, d))
    w = rng.normal(size=d)
    beta = C.gate_free_scaling(M, w, rng)
    assert np.all(beta != 0)
    # w^T diag(1/beta) M = 0: the output gate is off on every layer slot.
    assert np.linalg.norm((w / beta) @ M) < 1e-10 * np.linalg.norm(w) * np.linalg.norm(M)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: C.realise("grn_v4", np.eye(3), [1]), "unknown kind"),
        (lambda: C.realise("res", np.ones((3, 2)), [1]), "square"),
        (lambda: C.realise("res", np.eye(3), [1]), "exceeds the allowed rank 1"),
        (lambda: C.realise("base", np.eye(4)[:, :2] @ np.eye(4)[:2], [1, 3]),
         "exceeds the allowed rank 1"),
        (lambda: C.realise("grn_v1", np.zeros((3, 3)), [0]), "layer ranks"),
        (lambda: C.realise("grn_v2", np.zeros((3, 3)), [1], D=np.ones(2)), "length d=3"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
