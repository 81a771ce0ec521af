"""The optimised DCA paths equal the straightforward ones (issue 6).

* ``DCABlock.qkv`` (one fused pass of the three GRN-v3 over the stack) equals calling the three
  :class:`~dca_theory.residual.Combiner` objects one by one (paper §3.2, Figure 4);
* ``DCABlock.call_entries`` (stacking + GRNs rematerialised in the backward pass) equals
  ``DCABlock(jnp.stack(entries))`` in value and in gradient;
* the whole DCA / k-DCA LM: the fast trunk (``collect=False``) equals the plain trunk that
  ``forward_with_states`` runs (``collect=True``: stacked array, no checkpoint), in logits and in
  the gradient of a loss with respect to every parameter.

Weights are perturbed away from the identity init (b = 1, w = 0), so that every GRN gate is
active on some entries and inactive on others. float64 throughout: the fused einsums sum in a
different order from ``sum(weights * stack)``, so equality holds to a few float64 ulps of the
values' scale (tolerance 1e-12 relative), not bit for bit.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory.lm.blocks import DCABlock
from dca_theory.lm.model import build_model

from zoo_helpers import F64, perturb, tokens

RTOL = 1e-12  # float64 ulps × the number of summed terms (S·D ≤ 128 here)


def assert_trees_close(a, b, rtol=RTOL):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        scale = max(float(jnp.max(jnp.abs(y))), 1e-30)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=rtol * scale)


def random_block(key, size: int, gate: str) -> DCABlock:
    """A DCA block over ``size`` stack entries with every weight perturbed from its init."""
    blk = DCABlock.init(F64.replace(grn_gate=gate), size, key=key)
    return perturb(blk, jax.random.fold_in(key, 1))


@pytest.mark.parametrize("gate", ["relu", "relu_open"])
def test_fused_qkv_equals_three_grns(getkey, gate):
    blk = random_block(getkey(), 4, gate)
    stack = jax.random.normal(getkey(), (4, F64.max_len, F64.d_model), jnp.float64)
    fused = blk.qkv(stack)
    plain = (blk.grn_q(stack), blk.grn_k(stack), blk.grn_v(stack))
    # the gates must really be mixed on/off, or the test would not exercise the ReLU
    pre = jnp.einsum("sld,d->sl", stack, blk.grn_q.w)
    assert 0 < int(jnp.sum(pre > 0)) < pre.size
    assert_trees_close(fused, plain)


def test_call_entries_equals_stacked_call_and_gradient(getkey):
    blk = random_block(getkey(), 3, "relu_open")
    entries = tuple(jax.random.normal(getkey(), (F64.max_len, F64.d_model), jnp.float64)
                    for _ in range(3))

    def loss_fast(b, es):
        o, q = b.call_entries(es, causal=True)
        return jnp.sum(jnp.sin(o)) + jnp.sum(q * q)

    def loss_plain(b, es):
        o, q = b(jnp.stack(es), causal=True)
        return jnp.sum(jnp.sin(o)) + jnp.sum(q * q)

    vf, gf = eqx.filter_value_and_grad(loss_fast)(blk, entries)
    vp, gp = eqx.filter_value_and_grad(loss_plain)(blk, entries)
    np.testing.assert_allclose(float(vf), float(vp), rtol=RTOL)
    assert_trees_close(gf, gp)
    ge_f = jax.grad(loss_fast, argnums=1)(blk, entries)
    ge_p = jax.grad(loss_plain, argnums=1)(blk, entries)
    assert_trees_close(ge_f, ge_p)


# k = 1 (the truncated stack with a middle slot) compiles two more models: slow set.
@pytest.mark.parametrize("k", [None, pytest.param(1, marks=pytest.mark.slow)])
def test_fast_trunk_equals_plain_trunk(getkey, k):
    cfg = F64.replace(residual="dca", k=k, grn_gate="relu_open")
    model = perturb(build_model(cfg, key=getkey()), getkey())
    toks = tokens(3)

    def loss(m, collect: bool):
        if collect:  # plain path: stacked arrays, no rematerialisation
            logits, _ = m.forward_with_states(toks, inference=True)
        else:
            logits = m(toks, inference=True)
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[:, 0]), logits

    (lf, logits_f), gf = eqx.filter_jit(
        eqx.filter_value_and_grad(lambda m: loss(m, False), has_aux=True))(model)
    (lp, logits_p), gp = eqx.filter_jit(
        eqx.filter_value_and_grad(lambda m: loss(m, True), has_aux=True))(model)
    assert_trees_close(logits_f, logits_p)
    np.testing.assert_allclose(float(lf), float(lp), rtol=RTOL)
    assert_trees_close(gf, gp)


def test_qkv_rejects_wrong_stack_size(getkey):
    blk = random_block(getkey(), 3, "relu")
    with pytest.raises(ValueError, match="does not match this DCA block"):
        blk.qkv(jnp.zeros((4, F64.max_len, F64.d_model), jnp.float64))
