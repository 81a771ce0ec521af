"""Per-sublayer Jacobians of a trained LM (dca_theory/lab/branch_rank.py): the update Jacobian
is the branch Jacobian of dca_theory/lab/jacobian_rank.py, the three obey the chain rule, and
branches of known rank give effective ranks within that rank. float64 throughout."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_helpers import F64

from dca_theory.lab import branch_rank as B
from dca_theory.lab import jacobian_rank as R
from dca_theory.lm.model import build_model

D = F64.d_model
TOL = 1e-10  # float64: the code paths differ in summation order only


def _perturb(tree, seed, scale):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda x: x + jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype)
        if eqx.is_inexact_array(x) else x, tree)


@pytest.fixture(scope="module")
def models():
    """Vanilla and DCA with every weight moved off its initial value (GRNs off the identity)."""
    return {r: _perturb(build_model(F64.replace(residual=r), key=jax.random.PRNGKey(0)), 7, 0.1)
            for r in ("vanilla", "dca")}


def _jacobians(model, t=0, n=4):
    windows, positions = R.sample_positions(np.arange(300) % F64.vocab_size, 16, n)
    branch = R.layer_branches(model, windows)[t]
    jac = np.asarray(B.sublayer_jacobians(branch, jnp.asarray(positions)))
    return jac, R.layer_jacobians(model, windows, positions)[t]


@pytest.mark.parametrize("residual", ["vanilla", "dca"])
def test_update_is_the_branch_jacobian_and_obeys_the_chain_rule(models, residual):
    jac, branch = _jacobians(models[residual])
    attn, mlp, update = jac
    scale = float(np.abs(update).max())
    np.testing.assert_allclose(update, branch, rtol=0, atol=TOL * scale)
    # f = a + m(q + a): J_f = J_a + J_m (I + J_a)
    np.testing.assert_allclose(update, attn + mlp @ (np.eye(D) + attn), rtol=0,
                               atol=TOL * scale)


def test_known_ranks(models, getkey):
    """Attention output zeroed and an MLP output of rank r: J_attn = 0 (effective rank 0),
    J_mlp and J_update have rank <= r, so their effective ranks are <= r."""
    r = 3
    ka, kb = jax.random.split(getkey())
    w = jax.random.normal(ka, (F64.d_mlp, r)) @ jax.random.normal(kb, (r, D)) / D
    blk = eqx.tree_at(lambda b: (b.attn.w_o_DxD, b.mlp.w_out_FxD), models["vanilla"].trunk
                      .blocks[0], (jnp.zeros((D, D)), w))
    model = eqx.tree_at(lambda m: m.trunk.blocks[0], models["vanilla"], blk)
    prof = B.branch_rank_profile(model, np.arange(300) % F64.vocab_size, 16, n=5)
    first = prof[0]
    assert first["attn_eff_rank"] == 0.0 and first["attn_stable_rank"] == 0.0
    for name in ("mlp", "update"):
        assert 1.0 <= first[f"{name}_eff_rank"] <= r + 1e-9
        assert first[f"{name}_eff_rank_frac"] == pytest.approx(first[f"{name}_eff_rank"] / D)
        assert first[f"{name}_stable_rank"] <= first[f"{name}_eff_rank"] + 1e-9
    # untouched layers are generic: effective rank well above r
    assert all(layer["update_eff_rank"] > r for layer in prof[1:])
    assert [layer["layer"] for layer in prof] == list(range(F64.n_layers))
