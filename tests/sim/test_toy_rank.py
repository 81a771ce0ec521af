"""Rank tools recover ranks known by construction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory.sim import (
    BottleneckTeacher,
    LinearTarget,
    effective_rank,
    jacobian_rank,
    numerical_rank,
    stable_rank,
)

F64 = jnp.float64


@pytest.mark.parametrize("r", [1, 4, 9])
def test_numerical_rank_of_low_rank_products(r, getkey):
    # Gaussian factors: sigma_r is O(1) while the default tol is ~1e-13, so the rank is exact.
    m = jax.random.normal(getkey(), (12, r), F64) @ jax.random.normal(getkey(), (r, 15), F64)
    assert numerical_rank(m) == r
    assert 1.0 <= stable_rank(m) <= r + 1e-12  # stable rank never exceeds the rank
    assert 1.0 <= effective_rank(m) <= r + 1e-12


def test_tolerances_and_equal_singular_values():
    m = np.diag([1.0, 1e-3, 1e-9, 0.0])
    assert numerical_rank(m) == 3  # default tol = 1 * 4 * 2.2e-16 keeps 1e-9
    assert numerical_rank(m, rtol=1e-6) == 2
    assert numerical_rank(m, tol=1e-2) == 1
    # exp(entropy) of r equal singular values is r; ‖M‖_F²/‖M‖_2² = (9 + 16)/16.
    np.testing.assert_allclose(effective_rank(np.diag([2.0, 2.0, 2.0, 0.0])), 3.0, rtol=1e-12)
    np.testing.assert_allclose(stable_rank(np.diag([3.0, 4.0])), 25 / 16, rtol=1e-12)
    assert effective_rank(np.zeros((3, 3))) == 0 and stable_rank(np.zeros((3, 3))) == 0


@pytest.mark.parametrize("k", [1, 3, 6])
def test_jacobian_rank_of_bottleneck_teacher(k, getkey):
    teacher = BottleneckTeacher(16, k, alpha=2.0, key=getkey(), dtype=F64)
    xs = jax.random.normal(getkey(), (12, 16), F64)
    # Residual part h∘g has Jacobian H2 diag(tanh') H1 G: rank exactly k at every input.
    est = jacobian_rank(teacher, xs, subtract=teacher.skip)
    assert est.rank == k and np.all(est.ranks == k)
    assert est.singular_values.shape == (12, 16)
    # Subtracting the identity leaves (alpha - 1) I + M: full rank.
    assert jacobian_rank(teacher, xs, subtract="identity").rank == 16
    # The scalar estimate (median eigenvalue) finds alpha since k < d / 2.
    assert jacobian_rank(teacher, xs, subtract="scalar", rtol=1e-8).rank == k


def test_jacobian_rank_of_composition_through_a_linear_map(getkey):
    """f = ψ ∘ A ∘ φ with bijections ψ, φ: rank_J = rank(A) (Jacot 2023)."""
    a = jax.random.normal(getkey(), (10, 4), F64) @ jax.random.normal(getkey(), (4, 10), F64)

    def f(x):
        return jnp.sinh(a @ jnp.tanh(x))

    est = jacobian_rank(f, jax.random.normal(getkey(), (8, 10), F64), subtract=None)
    assert est.rank == 4


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: numerical_rank(np.array([[1.0, np.nan]])), "non-finite"),
        (lambda: numerical_rank(np.eye(2), tol=-1.0), "tol must be a finite number >= 0"),
        (lambda: numerical_rank(np.ones(3)), "expected a matrix"),
        (lambda: LinearTarget(np.array([[1.0, np.inf], [0.0, 1.0]])), "non-finite values"),
        (lambda: jacobian_rank(jnp.sin, np.ones((2, 2)), subtract="diag"), "unknown subtract"),
        (lambda: BottleneckTeacher(4, 5, key=jax.random.PRNGKey(0)), "rank must be an integer"),
    ],
)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
