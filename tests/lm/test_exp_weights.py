"""lm_weights (paper Figure 10): the shape checks, w statistics and seed averaging on synthetic
profiles, the analysis of real (tiny) models; one slow test runs the quick mode and draws the
figures."""

from __future__ import annotations

import equinox as eqx
import numpy as np
import pytest

from dca_theory.lm.config import PRESETS
from dca_theory.lm.model import build_model
from experiments import lm_weights as E

TINY = PRESETS["tiny"]


def test_shape_check_on_the_papers_pattern():
    # U shape: input and last highest, intermediate negative (Figure 10's description)
    c = E.shape_check([0.3, -0.1, -0.05, 0.0, 0.25])
    assert c["ends_top2"] and c["intermediate_below_ends"]
    assert c["input_largest"] and not c["input_smallest"]
    assert c["frac_intermediate_negative"] == pytest.approx(2 / 3)
    assert c["input_minus_intermediate"] == pytest.approx(0.3 + 0.05, abs=1e-12)


def test_shape_check_on_other_patterns():
    rising = E.shape_check([0.1, 0.2, 0.3, 0.4])  # newest weighted most, input least
    assert not rising["ends_top2"] and not rising["intermediate_below_ends"]
    assert rising["input_smallest"] and not rising["input_largest"]
    assert rising["frac_intermediate_negative"] == 0.0
    # one intermediate slot above the input: top-2 fails, "below both ends" fails too
    assert not E.shape_check([0.2, 0.3, 0.1, 0.5])["intermediate_below_ends"]
    assert E.shape_check([1.0, 1.0]) is None  # no intermediate slot


def test_aggregate_counts_only_grns_with_intermediate_slots():
    checks = [E.shape_check(m) for m in ([0.3, -0.1, 0.25], [0.1, 0.2, 0.3], [1.0])]
    agg = E.aggregate_checks(checks)
    assert agg["n"] == 2 and agg["frac_ends_top2"] == 0.5
    assert agg["frac_input_largest"] == 0.5 and agg["frac_input_smallest"] == 0.5
    assert agg["mean_frac_intermediate_negative"] == 0.5
    assert E.aggregate_checks([None]) == {"n": 0}


def test_w_stats():
    seeds = [{"block_1.w": np.array([0.0, 0.0]), "block_1.b": np.ones(2),
              "output.w": np.array([3.0, -4.0])},
             {"block_1.w": np.array([0.0, 1.0]), "output.w": np.zeros(2)}]
    s = E.w_stats(seeds)
    assert s["per_grn"]["output"]["norm"] == [5.0, 0.0]
    assert s["per_grn"]["block_1"]["max_abs"] == [0.0, 1.0]
    assert s["max_abs"] == 4.0 and s["all_exactly_zero"] is False
    assert E.w_stats([{"output.w": np.zeros(3)}])["all_exactly_zero"] is True


def test_seed_mean_profiles():
    a = [{"grn": "output", "slots": ["input", "out_0"], "num_outputs": 1,
          "median": [1.0, 2.0], "low": [0.0, 1.0], "high": [2.0, 3.0]}]
    b = [{**a[0], "median": [3.0, 4.0]}]
    (m,) = E.seed_mean_profiles([a, b])
    assert m["median"] == [2.0, 3.0] and m["low"] == [0.0, 1.0]
    with pytest.raises(ValueError, match="GRN order"):
        E.seed_mean_profiles([a, [{**a[0], "grn": "block_0"}]])


def test_analyse_untrained_models(getkey):
    """At init b = 1 everywhere (flat profiles, no U shape) and w = 0 exactly."""
    # jitted build: eager model building is slow on a loaded CPU
    model = eqx.filter_jit(build_model)(TINY.replace(residual="grn_v3"), key=getkey())
    res = E.analyse([model, model])
    assert res["w"]["all_exactly_zero"] is True
    out = [r for r in res["profile_seed_mean"] if r["grn"] == "output"][0]
    assert out["median"] == [1.0] * (TINY.n_layers + 1)
    assert res["shape"]["frac_intermediate_below_ends"] == 0.0  # ties: not strictly below
    moved = eqx.tree_at(lambda m: m.trunk.grns[-1].w, model, model.trunk.grns[-1].w + 0.5)
    assert E.analyse([moved])["w"]["per_grn"]["output"]["max_abs"] == [0.5]


@pytest.mark.parametrize("kinds", [("vanilla",), ()])
def test_bad_kinds_raise_before_any_work(kinds, tmp_path):
    with pytest.raises(ValueError, match="non-empty subset"):
        E.main(quick=True, out=tmp_path / "w", kinds=kinds)
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_quick_mode_and_figures(tmp_path, monkeypatch, data_dir):
    from dca_theory.io import read_json
    from figures import fig_lm_weights

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    s = read_json(E.main(quick=True, out=tmp_path / "lm_weights") / "summary.json")
    # ReLU'(0) = 0 at w = 0: the paper gate's w never moves; every live gate's does
    assert s["kinds"]["grn_v3"]["w"]["all_exactly_zero"] is True
    assert s["kinds"]["dca"]["w"]["all_exactly_zero"] is True
    for gate in ("open", "bias_inside", "small_init"):
        for kind in ("grn_v3", "dca"):
            assert s["kinds"][f"{kind}_{gate}"]["grn_gate"] == gate
            assert s["kinds"][f"{kind}_{gate}"]["w"]["max_abs"] > 0.0
    paths = fig_lm_weights.make(tmp_path / "fig", tmp_path)
    assert sorted(q.name for q in paths if q.suffix == ".png") == [
        "fig_lm_weights_dca.png", "fig_lm_weights_grn_v3.png"]


def test_effective_profile_equals_b_at_w0_and_sees_switched_off_entries():
    """With w = 0 the effective weight is b (bias outside) or relu(b) (bias inside); a negative
    bias inside the ReLU switches the entry off for every token and feature."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    from zoo_helpers import TINY

    from dca_theory.lab.analysis import effective_profile
    from dca_theory.lm.model import build_model

    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, TINY.max_len), 0, TINY.vocab_size)
    for gate in ("paper", "bias_inside"):
        model = build_model(TINY.replace(residual="grn_v3", grn_gate=gate),
                            key=jax.random.PRNGKey(1))
        last = model.trunk.grns[-1]
        b = jnp.full_like(last.b, 0.5).at[1].set(-0.25)
        model = eqx.tree_at(lambda m: m.trunk.grns[-1].b, model, b)
        out = {r["grn"]: r for r in effective_profile(model, tokens)}["output"]
        expect = [0.5, 0.0 if gate == "bias_inside" else -0.25] + [0.5] * (last.size - 2)
        np.testing.assert_allclose(out["median_coefficient"], expect, atol=1e-7)
        assert out["frac_switched_off"][1] == (1.0 if gate == "bias_inside" else 0.0)
        assert out["mean_abs_gate_input"] == [0.0] * last.size
