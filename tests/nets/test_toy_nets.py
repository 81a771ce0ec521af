"""Toy networks: identity at init, Theorem 4.1 structure, padding, states, argument errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory.nets import DeepLinear, MLPResNet
from dca_theory.residual import GRN_KINDS, make_combiner
from dca_theory.sim import numerical_rank

F64 = jnp.float64


def randomize_combiners(model, key):
    """Replace every combiner by one with random (non-identity) weights."""
    keys = jax.random.split(key, len(model.combiners))
    new = tuple(
        make_combiner(c.kind, c.size, c.dim, dtype=F64, init="random", key=k)
        for c, k in zip(model.combiners, keys)
    )
    return eqx.tree_at(lambda m: m.combiners, model, new)


@pytest.mark.parametrize("net, k", [(DeepLinear, None), (MLPResNet, 1)])
def test_grn_net_equals_resnet_at_init(net, k, getkey):
    key, x = getkey(), jax.random.normal(getkey(), (16, 12), F64)
    res = net(12, [2, 3, 1], 3, kind="res", k=k, dtype=F64, key=key)
    for kind in GRN_KINDS:
        grn = net(12, [2, 3, 1], 3, kind=kind, k=k, dtype=F64, key=key)
        # Same weights; b = 1, w = 0 make the combination the plain sum. Only the summation
        # order differs, so agreement is to float64 rounding (1e-12 relative).
        np.testing.assert_allclose(jax.vmap(grn)(x), jax.vmap(res)(x), rtol=1e-12, atol=1e-12)


def test_end_to_end_matrix_closed_forms(getkey):
    key = getkey()
    base = DeepLinear(10, 2, 3, kind="base", dtype=F64, key=key)
    res = DeepLinear(10, 2, 3, kind="res", dtype=F64, key=key)
    V = res.layer_matrices()
    eye = jnp.eye(10, dtype=F64)
    # Paper §1.1: base = V_T ... V_1, res = (I + V_T) ... (I + V_1).
    np.testing.assert_allclose(base.end_to_end_matrix(), V[2] @ V[1] @ V[0], rtol=1e-12)
    np.testing.assert_allclose(
        res.end_to_end_matrix(), (eye + V[2]) @ (eye + V[1]) @ (eye + V[0]), rtol=1e-12
    )
    # rank(base) <= min r_t = 2 (Theorem 4.1); default tol sigma_max * d * eps.
    assert numerical_rank(base.end_to_end_matrix()) == 2


def test_thm41_structure_with_random_combiners(getkey):
    """Â minus its skip part (I, αI, D) has rank <= r_* = 6 < d = 15, for random combiners."""
    for kind in ["res", "grn_v1", "grn_v2"]:
        net = DeepLinear(15, [1, 2, 3], 3, kind=kind, dtype=F64, key=getkey())
        if kind != "res":
            net = randomize_combiners(net, getkey())
        A_hat = net.end_to_end_matrix()
        skip = jax.vmap(net.skip)(jnp.eye(15, dtype=F64)).T
        assert numerical_rank(A_hat - skip) == 6  # generic weights: exactly r_*
        assert numerical_rank(A_hat) == 15


def test_padding_is_exact_and_stays_zero(getkey):
    """A padded net equals the unpadded one and its padded columns get no gradient."""
    key = getkey()
    padded = DeepLinear(8, [2, 3], 2, kind="grn_v2", pad_to=6, dtype=F64, key=key)
    assert padded.P.shape == (2, 8, 6)
    sliced = eqx.tree_at(lambda m: (m.P, m.Q, m.mask), padded,
                         (padded.P[..., :3], padded.Q[..., :3], padded.mask[:, :3]))
    x = jax.random.normal(getkey(), (5, 8), F64)
    np.testing.assert_array_equal(jax.vmap(padded)(x), jax.vmap(sliced)(x))

    def loss(m):
        return jnp.sum(jax.vmap(m)(x) ** 2)

    grads = eqx.filter_grad(loss)(padded)
    inactive = ~np.asarray(padded.mask)
    assert np.all(np.asarray(grads.P)[:, :, inactive[0]][0] == 0)
    assert np.all(np.asarray(grads.P).transpose(0, 2, 1)[inactive] == 0)
    assert np.all(np.asarray(grads.Q).transpose(0, 2, 1)[inactive] == 0)
    assert padded.param_count() == sliced.param_count() == 2 * 8 * 5 + 8 * (1 + 2 + 3)


def test_widths_can_be_vmapped(getkey):
    keys = jax.random.split(getkey(), 3)
    widths = jnp.array([1, 2, 4])
    nets = eqx.filter_vmap(
        lambda k, w: MLPResNet(6, w, 2, kind="grn_v1", pad_to=4, dtype=F64, key=k)
    )(keys, widths)
    np.testing.assert_array_equal(np.asarray(nets.mask).sum(axis=(1, 2)), 2 * np.array([1, 2, 4]))


def test_states(getkey):
    net = MLPResNet(7, 3, 4, kind="res", dtype=F64, key=getkey())
    x = jax.random.normal(getkey(), (7,), F64)
    y, states = net.forward(x)
    assert states["layer_inputs"].shape == states["layer_outputs"].shape == (4, 7)
    # ResNet: g_{t+1} = g_t + f_t and the output is the last stream state.
    np.testing.assert_allclose(states["stream"][:-1], states["layer_inputs"][1:], rtol=1e-12)
    np.testing.assert_allclose(states["stream"][-1], y, rtol=1e-12)
    np.testing.assert_array_equal(states["layer_inputs"][0], x)


@pytest.mark.slow  # ~15 s; the operator-level version is in tests/test_residual.py
def test_k_at_least_depth_equals_full_stack(getkey):
    key, kc, x = getkey(), getkey(), jax.random.normal(getkey(), (4, 9), F64)
    full = randomize_combiners(MLPResNet(9, 2, 3, kind="grn_v3", dtype=F64, key=key), kc)
    trunc = randomize_combiners(MLPResNet(9, 2, 3, kind="grn_v3", k=3, dtype=F64, key=key), kc)
    np.testing.assert_array_equal(jax.vmap(full)(x), jax.vmap(trunc)(x))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda k: DeepLinear(8, 2, 3, kind="grn_v9", key=k), "unknown residual kind 'grn_v9'"),
        (lambda k: MLPResNet(8, 2, 3, k=-1, key=k), "k must be None .* got -1"),
        (lambda k: MLPResNet(8, 9, 3, key=k), "rank 9 out of range: need 1 <= r_t <= dim=8"),
        (lambda k: DeepLinear(8, 0, 3, key=k), "rank 0 out of range"),
        (lambda k: DeepLinear(8, 2, 0, key=k), "depth T must be an integer >= 1, got 0"),
        (lambda k: DeepLinear(8, [1, 2], 3, key=k), "ranks must be one int or 3 ints"),
        (lambda k: MLPResNet(8, 2, 2, activation="swish", key=k), "unknown activation"),
        (lambda k: DeepLinear(8, 2, 2, kind="grn_v3", key=k).end_to_end_matrix(), "not linear"),
    ],
)
def test_errors_name_the_value(call, match, getkey):
    with pytest.raises(ValueError, match=match):
        call(getkey())
