"""Whole models on the fast path (``grn_impl="fused"``, :mod:`dca_theory.lm.fast.fused_grn`) equal
them on the reference path (``grn_impl="reference"``) in float64: logits and the gradient of
the loss with respect to every parameter, for DCA, k-DCA and the GRN ablation kinds. The
fast path's operations one by one: ``test_fast_path.py``.
"""

import equinox as eqx
import jax
import pytest
from tree_helpers import assert_trees_close
from zoo_helpers import F64, logits_and_gradient, perturb, tokens

from dca_theory.lm.model import build_model


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
    (logits, grad), (ref_logits, ref_grad) = (logits_and_gradient(m, toks)
                                              for m in (model, reference))
    assert_trees_close(logits, ref_logits)
    assert_trees_close(eqx.filter(grad, eqx.is_array), eqx.filter(ref_grad, eqx.is_array))


def test_unknown_grn_impl_is_refused():
    with pytest.raises(ValueError, match="unknown grn_impl 'fast'; valid: fused, reference"):
        F64.replace(grn_impl="fast")
