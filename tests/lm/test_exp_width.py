"""lm_width: the per-token branch Jacobian and its rank (dca_theory/lab/jacobian_rank.py) and
the width summary (the theory overlay: tests/theory/test_closed_forms.py); one slow test runs
the quick mode and draws the figure."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_helpers import F64, tokens

from dca_theory.lab import jacobian_rank as R
from dca_theory.lab.analysis import residual_states
from dca_theory.lm.model import build_model

D = F64.d_model
# float64 everywhere: the two code paths differ only in summation order (a few ulps)
TOL = 1e-10


KEY = jax.random.PRNGKey(0)


@pytest.fixture(scope="module")
def models():
    """Built once per module (eager model building is slow on a loaded CPU): vanilla and DCA
    at init (same key: same block weights) and with every weight perturbed (GRNs away from
    the identity)."""
    init = {r: build_model(F64.replace(residual=r), key=KEY) for r in ("vanilla", "dca")}
    moved = {r: _perturb(m, seed=7, scale=0.1) for r, m in init.items()}
    return {"init": init, "moved": moved}


def _perturb(tree, seed, scale):
    """Add N(0, scale²) noise to every float array (host RNG: no per-shape compilation)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda x: x + jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype)
        if eqx.is_inexact_array(x) else x, tree)


@eqx.filter_jit
def _diag_block_reference(blk, x_LxD, i):
    """d branch(x)_i / d x_i by differentiating the model's own ``blk.branch``."""
    return jax.jacfwd(lambda u: blk.branch(x_LxD.at[i].set(u), causal=True)[i])(x_LxD[i])


@eqx.filter_jit
def _dca_block_output(blk, stack_SxLxD):
    return blk(stack_SxLxD, causal=True)[0]


@eqx.filter_jit
def _branch_at(branch, i):
    return R.branch_at(branch, i)


def test_vanilla_token_jacobian_is_the_branch_jacobian(models):
    model = models["moved"]["vanilla"]
    branch = R.block_inputs(model, tokens())[1]
    x_LxD = jnp.asarray(branch.q)
    blk = model.trunk.blocks[1]
    positions = jnp.asarray([0, 5, x_LxD.shape[0] - 1])
    jac = R.token_jacobians(R.Branch(branch.parts, *[x_LxD[None].repeat(3, 0)] * 4), positions)
    for n, i in enumerate(positions):
        ref = _diag_block_reference(blk, x_LxD, i)
        np.testing.assert_allclose(jac[n], ref, rtol=0, atol=TOL * float(jnp.abs(ref).max()))


def test_dca_branch_is_the_dca_block_output(models):
    model = models["moved"]["dca"]
    states = residual_states(model, tokens())
    inputs = R.block_inputs(model, tokens())
    for t in (0, 2):
        blk, stack = model.trunk.blocks[t], jnp.asarray(states[f"stack_{t}"])
        o_ref = _dca_block_output(blk, stack)
        for i in (0, 9):
            o = _branch_at(inputs[t], jnp.asarray(i))
            np.testing.assert_allclose(o, o_ref[i], rtol=0, atol=TOL * float(jnp.abs(o_ref).max()))


def test_dca_at_init_has_vanilla_jacobians(models):
    """At b = 1, w = 0 DCA computes vanilla's function, so the tied Jacobian must agree."""
    van, dca = models["init"]["vanilla"], models["init"]["dca"]
    windows, positions = R.sample_positions(np.arange(200) % F64.vocab_size, 16, 3)
    for jv, jd in zip(R.layer_jacobians(van, windows, positions),
                      R.layer_jacobians(dca, windows, positions)):
        np.testing.assert_allclose(jd, jv, rtol=0, atol=TOL * float(np.abs(jv).max()))


def _rank_r_model(model, key, r):
    """``model`` with branches of rank <= r: attention output zero, MLP output rank r."""
    blocks = []
    for t, blk in enumerate(model.trunk.blocks):
        ka, kb = jax.random.split(jax.random.fold_in(key, t))
        w = jax.random.normal(ka, (F64.d_mlp, r)) @ jax.random.normal(kb, (r, D)) / D
        blk = eqx.tree_at(lambda b: (b.attn.w_o_DxD, b.mlp.w_out_FxD), blk,
                          (jnp.zeros((D, D)), w))
        blocks.append(blk)
    return eqx.tree_at(lambda m: m.trunk.blocks, model, tuple(blocks))


@pytest.mark.parametrize("r", [1, 3, 7])
def test_rank_of_a_branch_with_known_rank(models, getkey, r):
    model = _rank_r_model(models["moved"]["vanilla"], getkey(), r)
    prof = R.model_rank_profile(model, np.arange(300) % F64.vocab_size, 16, n=6)
    for layer in prof:
        # J = (LN_2 Jacobian) W_in diag(relu') W_out: rank <= r, = r for generic weights unless
        # fewer than r ReLU units are active (impossible here: 64 units, ~half active)
        assert layer["rank_eps_max"] == r
        assert layer["rank_rtol_max"] <= r
        assert layer["stable_rank_mean"] <= r + 1e-9  # stable rank <= rank
        assert layer["effective_rank_mean"] <= r + 1e-9
        assert layer["rank_eps_max_frac"] == pytest.approx(r / D)


def test_generic_branches_have_rank_d_minus_1(models):
    """Generic weights: every branch has rank D - 1, not D, because each LayerNorm's Jacobian
    annihilates the all-ones direction and every path of f passes through one."""
    model = models["moved"]["vanilla"]
    windows, positions = R.sample_positions(np.arange(300) % 64, 16, 4)
    for jac in R.layer_jacobians(model, windows, positions):
        assert R.rank_stats(jac)["rank_eps_max"] == D - 1
        np.testing.assert_allclose(jac @ np.ones(D), 0.0, atol=TOL * np.abs(jac).max())


def test_sample_positions_ranges_and_errors():
    windows, pos = R.sample_positions(np.arange(100), 10, 50, seed=3)
    assert windows.shape == (50, 10) and pos.shape == (50,)
    assert np.all(np.diff(windows, axis=1) == 1)  # contiguous windows of the stream
    assert pos.min() >= 0 and pos.max() <= 9 and len(set(pos.tolist())) > 5
    with pytest.raises(ValueError, match="exceeds the validation split"):
        R.sample_positions(np.arange(10), 10, 1)
    with pytest.raises(ValueError, match=">= 1"):
        R.sample_positions(np.arange(100), 10, 0)


# ----------------------------------------------------------------------------- the experiment


def _record(ppls, n_params=1000):
    return {"key": "k", "label": "x", "n_params": n_params, "seeds": [0, 1, 2],
            "test_ppl": ppls, "valid_ppl": ppls, "final_train_loss": [1.0] * 3,
            "median_step_s": 0.1}


def test_width_rows_and_trend_on_synthetic_records():
    from experiments import lm_width as W

    # relative DCA - vanilla: -4% at width 16, -2% at 32, -1% at 64 (shrinking with width)
    records = {}
    for w, rel in ((16, -0.04), (32, -0.02), (64, -0.01)):
        van = np.array([20.0, 21.0, 22.0])
        records[("vanilla", w)] = _record(van.tolist())
        jitter = np.array([-0.001, 0.0, 0.001])  # per-seed spread (a t-test needs some)
        records[("dca", w)] = _record((van * (1 + rel + jitter)).tolist(), n_params=1100)
    records[("vanilla", 128)] = _record([10.0, 10.0, 10.0])  # no DCA partner: skipped
    rows = W.width_rows(records)
    assert list(rows) == ["16", "32", "64"]
    np.testing.assert_allclose(rows["16"]["relative_pct"]["per_seed"], [-4.1, -4.0, -3.9],
                               rtol=1e-12)
    assert rows["32"]["paired_test_ppl"]["mean"] == pytest.approx(
        np.mean(np.array([20.0, 21.0, 22.0]) * (-0.02 + np.array([-0.001, 0.0, 0.001]))))
    assert rows["64"]["param_overhead_pct"] == pytest.approx(10.0)
    trend = W.width_trend(rows)
    # -4, -2, -1 % against log2(width) = 4, 5, 6: least-squares slope +1.5 % per doubling
    assert trend["slope_pct_per_doubling"] == pytest.approx(1.5)
    assert trend["gain_shrinks_monotonically"] and trend["n_points"] == 9


@pytest.mark.slow
def test_quick_mode_and_figure(tmp_path, monkeypatch, data_dir):
    from dca_theory.io import read_json
    from experiments import lm_width as W
    from figures import fig_lm_width

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    run = W.main(quick=True, out=tmp_path / "results" / "lm_width")
    summary = read_json(run / "summary.json")
    assert set(summary["widths"]) == {"8", "16"} and summary["complete"]
    for w in ("8", "16"):
        for kind in ("vanilla", "dca"):
            layers = summary["ranks"][w][kind]
            assert len(layers) == 2  # quick depth
            assert all(x["rank_eps_max"] <= int(w) - 1 for x in layers)  # LayerNorm: <= D - 1
    paths = fig_lm_width.make(tmp_path / "fig", tmp_path / "results")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv", ".json"}
