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

from dca_theory import schemes
from dca_theory.lab import branch_rank as B
from dca_theory.lab import jacobian_rank as R
from dca_theory.lm.driver import BlockIO, layer_of, run_block, run_trunk
from dca_theory.lm.model import build_model
from dca_theory.lm.scanned import ScannedTrunk
from dca_theory.lm.zoo import mixer_class

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


# --- every kind through the stacked layout ------------------------------------------------

SMALL = F64.replace(d_model=16, n_heads=2, d_mlp=32, n_layers=3, max_len=16)
#: the kinds whose block reads only its q/k/v/r inputs (the rest hand it a hook)
READABLE = [s.name for s in schemes.SCHEMES if s.mixer and not mixer_class(s.name).hooks_block]


def _small(residual, **kw):
    return SMALL.replace(residual=residual, **kw)


@eqx.filter_jit
def _records(model, tokens_L):
    trunk = model.trunk
    return run_trunk(trunk.blocks, trunk.mixer, model.embed(tokens_L), causal=True, key=None,
                     collect=True)[1]


@eqx.filter_jit
def _branch_outputs(branch):
    return jax.vmap(lambda i: R.branch_at(branch, i))(jnp.arange(branch.q.shape[0]))


@eqx.filter_jit
def _block_jacobian(blk, io, i):
    """d (a + m)_i / d u for u added to token i of every input the block reads, through the
    driver's own block (:func:`run_block`) on the recorded inputs (``None``: the query's)."""
    L, D = io.q.shape

    def f(u_D):
        s_LxD = jnp.where((jnp.arange(L) == i)[:, None], u_D[None, :], 0.0)
        shift = lambda x: None if x is None else x + s_LxD  # noqa: E731
        out = run_block(blk, BlockIO(q=io.q + s_LxD, k=shift(io.k), v=shift(io.v),
                                     r=shift(io.r), kv_norms=io.kv_norms),
                        causal=True, key=None)
        return (out.a + out.m)[i]

    return jax.jacfwd(f)(jnp.zeros((D,), io.q.dtype))


def test_readable_kinds_are_the_lm_kinds_without_hooks():
    assert "attn_res" not in READABLE and "value_residual" not in READABLE
    assert {"vanilla", "grn_v1", "grn_v2", "grn_v3", "dca", "muddformer"} <= set(READABLE)


#: the default set covers each kind of input a block reads (one stream; a stack's GRN; DCA's
#: q/k/v with its own LN_k, LN_v, full and k-DCA; MUDDFormer's separate r); the rest is slow
DEFAULT_KINDS = [("vanilla", None), ("grn_v3", None), ("dca", None), ("dca", 1),
                 ("muddformer", None)]
KINDS = DEFAULT_KINDS + [pytest.param(r, None, marks=pytest.mark.slow) for r in READABLE
                         if (r, None) not in DEFAULT_KINDS]


@pytest.mark.parametrize("residual,k", KINDS)
def test_every_kind_branch_is_the_block_and_its_jacobian_the_blocks(residual, k):
    """Scanned model, every weight moved off its init: the branch assembled from the stacked
    block's layer t and the recorded inputs reproduces the block's output ``a + m`` (the
    record's ``out``, except LAuReL's, which adds its low-rank term) and its tied Jacobian
    equals the driver block's own (relative 1e-10, float64)."""
    cfg = _small(residual, k=k, layer_loop="scan")
    model = _perturb(build_model(cfg, key=jax.random.PRNGKey(1)), 3, 0.1)
    toks = jnp.asarray(np.arange(12) * 5 % cfg.vocab_size)
    records = _records(model, toks)
    branches = R.block_inputs(model, toks)
    positions = jnp.asarray([0, 6, 11])
    for t, branch in enumerate(branches):
        if not residual.startswith("laurel"):
            out = np.asarray(records["out"][t])
            got = np.asarray(_branch_outputs(branch))
            np.testing.assert_allclose(got, out, rtol=0, atol=TOL * np.abs(out).max())
        jac = np.asarray(R.token_jacobians(
            R.Branch(branch.parts, *(np.stack([x] * 3) for x in branch[1:])), positions))
        blk, io = layer_of(model.trunk.blocks, t), layer_of(records["io"], t)
        for n, i in enumerate(positions):
            ref = np.asarray(_block_jacobian(blk, io, i))
            np.testing.assert_allclose(jac[n], ref, rtol=0, atol=TOL * np.abs(ref).max())


@pytest.mark.parametrize("residual,k,n_layers", [("vanilla", None, 3), ("dca", None, 3),
                                                 ("dca", 2, 4), ("grn_v3", None, 3)])
def test_scanned_and_per_block_models_give_equal_jacobians(residual, k, n_layers):
    """Built from one key, the per-block model (converted to the stacked layout by the
    analysis) and the scanned model have equal Jacobians: relative 1e-10 in float64."""
    cfg = _small(residual, k=k, n_layers=n_layers)
    per_block = build_model(cfg, key=jax.random.PRNGKey(2))
    scanned = build_model(cfg.replace(layer_loop="scan"), key=jax.random.PRNGKey(2))
    assert not isinstance(per_block.trunk, ScannedTrunk)
    windows, positions = R.sample_positions(np.arange(200) % cfg.vocab_size, 12, 3)
    want = R.layer_jacobians(per_block, windows, positions)
    got = R.layer_jacobians(scanned, windows, positions)
    assert len(got) == n_layers
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=TOL * np.abs(w).max())
    prof = B.branch_rank_profile(scanned, np.arange(200) % cfg.vocab_size, 12, n=3)
    assert [p_["update_eff_rank"] for p_ in prof] == pytest.approx(
        [p_["update_eff_rank"] for p_ in B.branch_rank_profile(
            per_block, np.arange(200) % cfg.vocab_size, 12, n=3)], rel=1e-10)


@pytest.mark.parametrize("residual", ["attn_res", "value_residual"])
def test_kinds_whose_block_takes_a_hook_are_refused(residual):
    model = build_model(_small(residual, layer_loop="scan"), key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=rf"^the branch Jacobian analyses .* residual "
                                         rf"'{residual}' hands its block a hook; valid: "
                                         rf"vanilla, grn_v1, .*muddformer$"):
        B.branch_rank_profile(model, np.arange(100) % SMALL.vocab_size, 12, n=1)
