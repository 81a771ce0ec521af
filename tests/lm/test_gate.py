"""GRN-v3 gate choice in the LM: the paper's init w = 0 with ReLU'(0) = 0 freezes w."""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from zoo_helpers import TINY, assert_close_logits, logits, tokens

from dca_theory.lm.model import build_model
from dca_theory.residual import AbstractCombiner


def _w_grad_norm(model, toks):
    def loss(m):
        out = m(toks[:-1], inference=True)
        return -jnp.mean(jax.nn.log_softmax(out)[jnp.arange(toks.shape[0] - 1), toks[1:]])

    grads = eqx.filter_grad(loss)(model)
    is_combiner = lambda x: isinstance(x, AbstractCombiner)  # noqa: E731
    combiners = [c for c in jax.tree_util.tree_leaves(grads, is_leaf=is_combiner)
                 if is_combiner(c)]
    assert len(combiners) == 3 * TINY.n_layers + 1  # q, k, v per block and the final GRN
    return float(sum(jnp.linalg.norm(c.w) for c in combiners))


@pytest.mark.parametrize("gate, frozen", [("relu", True), ("relu_open", False)])
def test_dca_gate_gradient_and_identity_at_init(gate, frozen):
    key = jax.random.PRNGKey(0)
    vanilla = build_model(TINY, key=key)
    dca = build_model(TINY.replace(residual="dca", grn_gate=gate), key=key)
    toks = tokens()
    # Both gates compute the same function at init: the vanilla transformer's.
    assert_close_logits(logits(dca, toks), logits(vanilla, toks), "float32")
    norm = _w_grad_norm(dca, toks)
    assert (norm == 0.0) if frozen else (norm > 1e-6), norm
