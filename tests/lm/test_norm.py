"""The lean LayerNorm (:func:`dca_theory.lm.norm.layer_norm`, used by every model) equals the
written-out formula (:func:`dca_theory.lm.norm.layer_norm_reference`) in value and gradient
(float64, 1e-11 of the largest magnitude), and keeps its dtypes."""

import jax
import jax.numpy as jnp
import pytest
from tree_helpers import assert_trees_close

from dca_theory.lm.blocks import LayerNorm
from dca_theory.lm.norm import layer_norm, layer_norm_reference


@pytest.mark.parametrize("shape", [(7,), (5, 7), (2, 3, 7)])
def test_lean_layer_norm_equals_reference(shape, getkey):
    x = 3.0 + 2.0 * jax.random.normal(getkey(), shape, jnp.float64)
    scale = 1.0 + 0.1 * jax.random.normal(getkey(), (7,), jnp.float64)
    bias = 0.1 * jax.random.normal(getkey(), (7,), jnp.float64)
    weight = jax.random.normal(getkey(), shape, jnp.float64)

    def loss(fn):
        return lambda x, s, b: jnp.sum(jnp.tanh(fn(x, s, b, 1e-6, jnp.float64)) * weight)

    assert_trees_close(layer_norm(x, scale, bias, 1e-6, jnp.float64),
                       layer_norm_reference(x, scale, bias, 1e-6, jnp.float64))
    assert_trees_close(jax.grad(loss(layer_norm), argnums=(0, 1, 2))(x, scale, bias),
                       jax.grad(loss(layer_norm_reference), argnums=(0, 1, 2))(x, scale, bias))


def test_lean_layer_norm_keeps_dtypes(getkey):
    x = jax.random.normal(getkey(), (4, 8), jnp.bfloat16)
    ln = LayerNorm.init(8, 1e-6, jnp.float32)
    assert ln(x).dtype == jnp.float32 and ln(x, jnp.bfloat16).dtype == jnp.bfloat16
    g = jax.grad(lambda x: jnp.sum(ln(x)).astype(jnp.float32))(x)
    assert g.dtype == jnp.bfloat16
