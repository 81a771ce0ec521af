"""Every optimised path equals the straightforward one (float64, stated tolerances).

* the lean LayerNorm (:func:`dca_theory.lm.norm.layer_norm`) against the written-out formula;
* DCA's fused GRN + LayerNorm (:func:`dca_theory.lm.norm.grn_layer_norm`) against three
  Combiner calls on the stacked array followed by three LayerNorms;
* whole models, ``grn_impl="fused"`` against ``grn_impl="reference"``: logits and the gradient
  of the loss with respect to every parameter, for DCA, k-DCA and the GRN ablation kinds.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_helpers import F64, perturb, tokens

from dca_theory.lm.blocks import LayerNorm
from dca_theory.lm.model import build_model
from dca_theory.lm.norm import grn_layer_norm, layer_norm, layer_norm_reference
from dca_theory.residual import make_combiner

# Relative to the largest magnitude in the whole compared tree: some gradients are exactly 0
# in exact arithmetic (e.g. LN_k's bias: softmax ignores a shift shared by all keys) and only
# rounding noise (~1e-18) in either path.
RTOL = 1e-11


def assert_trees_close(a, b, rtol=RTOL):
    xs, ys = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(xs) == len(ys)
    scale = max(float(jnp.max(jnp.abs(y))) for y in ys)
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=rtol * scale)


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


@pytest.mark.parametrize("gate", ["relu", "relu_open"])
def test_grn_layer_norm_equals_reference(gate, getkey):
    size, dim = 4, 6
    entries = tuple(jax.random.normal(getkey(), (5, dim), jnp.float64) for _ in range(size))
    grns = [make_combiner("grn_v3", size, dim, dtype=jnp.float64, init="random", key=getkey(),
                          gate=gate) for _ in range(3)]
    norms = [perturb(LayerNorm.init(dim, 1e-6, jnp.float64), getkey()) for _ in range(3)]
    weights = [jax.random.normal(getkey(), (5, dim), jnp.float64) for _ in range(6)]

    def fused(grns, norms, entries):
        normed, raw, _ = grn_layer_norm(grns, norms, entries, jnp.float64)
        return sum(jnp.sum(jnp.sin(y) * w) for y, w in zip(normed + raw, weights))

    def reference(grns, norms, entries):
        raw = tuple(g(jnp.stack(entries)) for g in grns)
        normed = tuple(n(x) for n, x in zip(norms, raw))
        return sum(jnp.sum(jnp.sin(y) * w) for y, w in zip(normed + raw, weights))

    np.testing.assert_allclose(fused(grns, norms, entries), reference(grns, norms, entries),
                               rtol=RTOL)
    assert_trees_close(eqx.filter_grad(fused)(grns, norms, entries),
                       eqx.filter_grad(reference)(grns, norms, entries))
    assert_trees_close(jax.grad(fused, argnums=2)(grns, norms, entries),
                       jax.grad(reference, argnums=2)(grns, norms, entries))


def _loss(model, toks):
    logits = model(toks, inference=True)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[jnp.arange(toks.shape[0]), toks])


@pytest.mark.parametrize("changes", [
    {"residual": "dca"}, {"residual": "dca", "k": 1}, {"residual": "grn_v2", "grn_window": 2},
    pytest.param({"residual": "grn_v3"}, marks=pytest.mark.slow),
    pytest.param({"residual": "dca", "grn_gate": "relu_open"}, marks=pytest.mark.slow),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_fused_model_equals_reference_model(changes, getkey):
    cfg = F64.replace(**changes)
    # Random GRN weights (not the identity init) so that every gate is active somewhere.
    model = perturb(build_model(cfg, key=jax.random.PRNGKey(0)), getkey())
    # The same weights under the reference config (cfg is static: move the leaves over).
    ref_cfg = cfg.replace(grn_impl="reference")
    reference = jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(build_model(ref_cfg, key=jax.random.PRNGKey(0))),
        jax.tree_util.tree_leaves(model))
    toks = tokens(3)
    assert_trees_close(model(toks, inference=True), reference(toks, inference=True))
    assert_trees_close(eqx.filter_grad(_loss)(model, toks),
                       eqx.filter_grad(_loss)(reference, toks))


def test_unknown_grn_impl_is_refused():
    with pytest.raises(ValueError, match="unknown grn_impl 'fast'; valid: fused, reference"):
        F64.replace(grn_impl="fast")
