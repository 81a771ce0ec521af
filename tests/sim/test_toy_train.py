"""Training: vmapped equals looped, trained risk reaches the Eckart–Young optimum, errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory.nets import DeepLinear
from dca_theory.sim import (
    ToyTrainConfig,
    evaluate_toy,
    fit,
    fit_many,
    identity_target,
    spectral_target,
    train,
)

F64 = jnp.float64


@pytest.mark.slow  # ~30 s: compiles the vmapped and the single-model training programs
def test_fit_many_equals_separate_fits(getkey):
    keys = jax.random.split(getkey(), 2)
    nets = eqx.filter_vmap(lambda k: DeepLinear(6, 2, 2, kind="grn_v1", dtype=F64, key=k))(keys)
    cfg = ToyTrainConfig(steps=20, batch_size=8, optimizer="adam", learning_rate=1e-2)
    target = identity_target(6, F64)
    _, losses = fit_many(nets, target, keys, cfg)
    for i in range(2):
        one = jax.tree_util.tree_map(lambda a, i=i: a[i] if eqx.is_array(a) else a, nets)
        _, li = jax.jit(lambda m, k: fit(m, target, k, cfg), static_argnums=())(one, keys[i])
        # Same program up to batching: float64 rounding only.
        np.testing.assert_allclose(losses[i], li, rtol=1e-10)


def test_resnet_reaches_eckart_young_optimum(getkey):
    """Population training of a ResNet attains ER*(C_res) = sum_{i > r*} sigma_i(A - I)^2."""
    d, r_star = 6, 2
    target = spectral_target(d, 0.5, 2.0, key=getkey(), dtype=F64)
    lam = np.linalg.eigvalsh(np.asarray(target.A) - np.eye(d))[::-1]
    optimum = np.sum(lam[r_star:] ** 2)
    net = DeepLinear(d, 1, 2, kind="res", dtype=F64, key=getkey())
    cfg = ToyTrainConfig(steps=3000, optimizer="adam", learning_rate=1e-2, loss="population")
    trained, losses = train(net, target, getkey(), cfg)
    risk = float(np.sum((np.asarray(trained.end_to_end_matrix()) - np.asarray(target.A)) ** 2))
    assert losses[-1] < losses[0]
    # A trained optimum can never beat ER* (it is a minimum over the class) ...
    assert risk >= optimum * (1 - 1e-9)
    # ... and Adam gets within 1% of it here (a loose bound: the landscape is non-convex).
    assert risk <= optimum * 1.01


def test_evaluate_noise_floor(getkey):
    net = DeepLinear(5, 1, 1, kind="res", dtype=F64, key=getkey())
    net = eqx.tree_at(lambda m: m.P, net, jnp.zeros_like(net.P))  # exactly the identity
    target = identity_target(5, F64)
    assert float(evaluate_toy(net, target, getkey(), n=256)) == 0.0
    # MSE of pure N(0, 0.5^2) noise over 20480 draws: 0.25 within 5 SEM (SEM = 0.25*sqrt(2/n)).
    mse = float(evaluate_toy(net, target, getkey(), n=4096, noise_std=0.5))
    assert abs(mse - 0.25) < 5 * 0.25 * np.sqrt(2 / (4096 * 5))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"steps": 0}, "steps must be >= 1, got 0"),
        ({"optimizer": "lbfgs"}, "unknown optimizer 'lbfgs'"),
        ({"loss": "hinge"}, "unknown loss 'hinge'"),
        ({"learning_rate": float("nan")}, "non-finite"),
        ({"learning_rate": -1.0}, "learning_rate > 0"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ToyTrainConfig(**kwargs)


def test_population_loss_needs_linear(getkey):
    net = DeepLinear(4, 1, 1, kind="grn_v3", dtype=F64, key=getkey())
    with pytest.raises(ValueError, match="grn_v3"):
        train(net, identity_target(4, F64), getkey(), ToyTrainConfig(loss="population"))


def test_grn_v3_gate_gets_no_gradient_from_the_paper_init(getkey):
    """The printed gate (w = 0, ReLU'(0) = 0) never moves, so trained GRN-v3 equals GRN-v2;
    the default gate (bias inside the ReLU) trains w from the first step."""
    key, kt = getkey(), getkey()
    cfg = ToyTrainConfig(steps=30, batch_size=16, optimizer="adam", learning_rate=1e-2)
    target = spectral_target(6, 0.5, 1.0, key=getkey(), dtype=F64)
    live, _ = train(DeepLinear(6, 1, 2, kind="grn_v3", dtype=F64, key=key), target, kt, cfg)
    assert any(np.any(np.asarray(c.w) != 0) for c in live.combiners)
    v3, _ = train(DeepLinear(6, 1, 2, kind="grn_v3", gate="paper", dtype=F64, key=key), target,
                  kt, cfg)
    v2, _ = train(DeepLinear(6, 1, 2, kind="grn_v2", dtype=F64, key=key), target, kt, cfg)
    assert all(np.all(np.asarray(c.w) == 0) for c in v3.combiners)
    np.testing.assert_array_equal(v3.P, v2.P)  # bit-identical: the gate adds exactly 0
