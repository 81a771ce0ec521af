"""AttnRes's softmax-over-depth combiner in the toy nets: its formula, its weights, training and
its parameter count."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory import schemes
from dca_theory.nets import DeepLinear, MLPResNet
from dca_theory.residual import SoftmaxOverDepth, make_combiner
from dca_theory.sim import ToyTrainConfig, evaluate_toy, train
from dca_theory.sim.targets import LinearTarget

F64 = jnp.float64


def numpy_attn_res(q: np.ndarray, stack: np.ndarray, eps: float) -> np.ndarray:
    """sum_i softmax_i(q . h_i / rms(h_i)) h_i over the first axis, written out in numpy."""
    rms = np.sqrt(np.mean(stack**2, axis=-1) + eps)
    scores = np.einsum("s...d,d->s...", stack, q) / rms
    w = np.exp(scores - scores.max(axis=0))
    w = w / w.sum(axis=0)
    return np.einsum("s...,s...d->...d", w, stack)


@pytest.mark.parametrize("batch", [(), (3,), (2, 5)])
def test_formula_equals_numpy(batch, getkey):
    comb = make_combiner("attn_res", 4, 6, dtype=F64)
    q = 2.0 * jax.random.normal(getkey(), (6,), F64)
    comb = eqx.tree_at(lambda c: c.q, comb, q)
    stack = jax.random.normal(getkey(), (4, *batch, 6), F64)
    want = numpy_attn_res(np.asarray(q), np.asarray(stack), comb.eps)
    np.testing.assert_allclose(comb(stack), want, rtol=1e-12, atol=1e-12)


def test_weights_are_positive_and_sum_to_one(getkey):
    comb = make_combiner("attn_res", 5, 8, dtype=F64, init="random", key=getkey())
    stack = 3.0 * jax.random.normal(getkey(), (5, 7, 8), F64)
    alpha = comb.softmax_weights(stack)
    assert bool(jnp.all(alpha > 0))
    np.testing.assert_allclose(alpha.sum(axis=0), 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(comb.weights(stack)[..., 0], alpha, rtol=0, atol=0)


def test_at_init_it_is_the_mean_of_the_stack(getkey):
    comb = make_combiner("attn_res", 4, 6, dtype=F64)
    stack = jax.random.normal(getkey(), (4, 2, 6), F64)
    np.testing.assert_allclose(comb(stack), stack.mean(axis=0), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("depth", [1, 3])
def test_net_param_count_equals_the_built_arrays(depth, getkey):
    net = DeepLinear(6, 2, depth, kind="attn_res", dtype=F64, key=getkey())
    combiner_arrays = jax.tree_util.tree_leaves(eqx.filter(net.combiners, eqx.is_array))
    # one pseudo-query per combiner, T + 1 combiners
    assert sum(a.size for a in combiner_arrays) == (depth + 1) * 6
    assert net.param_count() == 2 * 6 * 2 * depth + (depth + 1) * 6
    assert schemes.network_combiner_params("attn_res", depth, 6, convention="paper") == depth * 6
    assert all(isinstance(c, SoftmaxOverDepth) for c in net.combiners)


# DeepLinear (~20 s) is slow; MLPResNet trains through the same mixing by default
@pytest.mark.parametrize("net_cls", [pytest.param(DeepLinear, marks=pytest.mark.slow), MLPResNet])
def test_nets_train_with_attn_res(net_cls, getkey):
    """A short smoke: 150 Adam steps on y = A x lower the test MSE by at least 30%."""
    d = 8
    A = jnp.eye(d, dtype=F64) + 0.5 * jax.random.normal(getkey(), (d, d), F64) / np.sqrt(d)
    target = LinearTarget(A)
    net = net_cls(d, 2, 3, kind="attn_res", dtype=F64, key=getkey())
    before = float(evaluate_toy(net, target, getkey(), n=2048))
    cfg = ToyTrainConfig(steps=150, batch_size=64, optimizer="adam", learning_rate=1e-2)
    trained, losses = train(net, target, getkey(), cfg)
    after = float(evaluate_toy(trained, target, getkey(), n=2048))
    assert np.all(np.isfinite(np.asarray(losses)))
    assert after < 0.7 * before
    assert not np.allclose(np.asarray(trained.combiners[-1].q), 0.0)  # the queries learn


def test_linear_only_refusals(getkey):
    net = DeepLinear(6, 2, 2, kind="attn_res", dtype=F64, key=getkey())
    with pytest.raises(ValueError, match="kind 'attn_res' is not linear"):
        net.end_to_end_matrix()
    with pytest.raises(ValueError, match="kind 'attn_res' has no input-slot term"):
        net.skip(jnp.ones(6, F64))
