"""Whole models on the fast path (``grn_impl="fused"``, :mod:`dca_theory.lm.fast_path`) equal
them on the reference path (``grn_impl="reference"``) in float64: logits and the gradient of
the loss with respect to every parameter, for DCA, k-DCA and the GRN ablation kinds. The
fast path's operations one by one: ``test_fast_path.py``.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from tree_helpers import assert_trees_close
from zoo_helpers import F64, perturb, tokens

from dca_theory.lm.model import build_model


def _loss(model, toks):
    logits = model(toks, inference=True)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[jnp.arange(toks.shape[0]), toks])


@pytest.mark.parametrize("changes", [
    # full DCA (~35 s) is slow; k = 1 runs the same fused GRN kernels over a shorter stack
    pytest.param({"residual": "dca"}, marks=pytest.mark.slow), {"residual": "dca", "k": 1},
    {"residual": "grn_v2", "grn_window": 2},
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
