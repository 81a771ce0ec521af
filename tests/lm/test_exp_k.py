"""lm_k: time-to-reach interpolation and summaries on synthetic curves; one slow test runs the
quick mode (from the quick cache) and draws the figure."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import lm_k as K


def test_first_crossing_interpolates_linearly():
    steps, values = [25, 50, 75], [10.0, 8.0, 6.0]
    assert K.first_crossing(steps, values, 7.0) == pytest.approx(62.5)  # halfway 8 -> 6
    assert K.first_crossing(steps, values, 8.0) == 50.0  # exactly on a point
    assert K.first_crossing(steps, values, 12.0) == 25.0  # already below at the first eval
    assert K.first_crossing(steps, values, 5.0) is None  # never reached: no extrapolation


def test_first_crossing_takes_the_first_of_several_crossings():
    # goes below 7 at step 37.5, bounces above, crosses again later: the first one counts
    assert K.first_crossing([25, 50, 75, 100], [8.0, 6.0, 9.0, 5.0], 7.0) == pytest.approx(37.5)


def test_first_crossing_rejects_bad_input():
    with pytest.raises(ValueError, match="strictly increasing"):
        K.first_crossing([25, 25], [1.0, 2.0], 1.5)
    with pytest.raises(ValueError, match="equal-length"):
        K.first_crossing([25, 50], [1.0], 1.5)


def _curve(rate, steps):
    """Valid ppl 5 + 20 exp(-rate step): decreasing, seeds with slightly different rates."""
    s = np.asarray(steps, float)[:, None]
    return 5.0 + 20.0 * np.exp(-np.asarray(rate)[None, :] * s)


def test_time_to_reach_on_exponential_curves():
    steps = np.arange(25, 400, 25)  # periodic evals 25 .. 375
    van = (steps, _curve([0.010, 0.011], steps))
    fast = (steps, _curve([0.030, 0.033], steps))  # 3x the rate: reaches in ~1/3 the steps
    out = K.time_to_reach(van, fast, step_s_vanilla=1.0, step_s_other=1.5)
    assert out["seeds_reached"] == 2
    # exact crossing at 375/3 = 125 steps; linear interpolation between evals 25 apart on a
    # convex curve overshoots by at most a fraction of one interval (here < 3 steps)
    for hit in out["steps_per_seed"]:
        assert hit == pytest.approx(125.0, abs=3.0)
    for step_r, time_r in zip(out["step_ratio_per_seed"], out["time_ratio_per_seed"]):
        assert time_r == pytest.approx(1.5 * step_r)  # time ratio = step ratio x step-time ratio
    assert out["time_ratio"]["mean"] == pytest.approx(1.5 / 3, abs=0.02)


def test_time_to_reach_of_vanilla_itself_is_one_and_slow_runs_are_none():
    steps = np.arange(25, 400, 25)
    van = (steps, _curve([0.01, 0.01], steps))
    same = K.time_to_reach(van, van, 2.0, 2.0)
    assert same["time_ratio_per_seed"] == [1.0, 1.0]
    slow = K.time_to_reach(van, (steps, _curve([0.005, 0.005], steps)), 1.0, 1.0)
    assert slow["seeds_reached"] == 0 and slow["time_ratio"] is None


def test_periodic_curve_drops_the_whole_split_point():
    curves = {"eval_steps": np.array([25, 50, 75]),
              "eval_valid_loss": np.log(np.array([[9.0, 8.0], [7.0, 6.0], [5.0, 4.0]]))}
    steps, ppl = K.periodic_curve(curves, final_step=75)
    assert steps.tolist() == [25, 50]
    np.testing.assert_allclose(ppl, [[9.0, 8.0], [7.0, 6.0]], rtol=1e-12)


@pytest.mark.slow
def test_quick_mode_and_figure(tmp_path, monkeypatch, data_dir):
    from dca_theory.io import read_json
    from figures import fig_lm_k

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    run = K.main(quick=True, out=tmp_path / "results" / "lm_k")
    summary = read_json(run / "summary.json")
    assert set(summary["rows"]) == {"vanilla", "1-dca", "dca"} and summary["complete"]
    paths = fig_lm_k.make(tmp_path / "fig", tmp_path / "results")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv", ".json"}


def test_alternated_step_times_times_every_config_each_round():
    from dca_theory.lm.config import PRESETS
    from dca_theory.lm.train_config import LMTrainConfig
    from dca_theory.lm.steptime import alternated_step_times

    tc = LMTrainConfig(batch_size=2, seq_len=8, warmup_steps=1)
    cfgs = {"a": (PRESETS["tiny"], tc), "b": (PRESETS["tiny"].replace(n_layers=1), tc)}
    out = alternated_step_times(cfgs, repeats=3, warmup=1)
    assert set(out) == {"a", "b"}
    for r in out.values():
        assert len(r["times_s"]) == 3 and all(t > 0 for t in r["times_s"])
        assert r["median_s"] == sorted(r["times_s"])[1]  # median of three
    with pytest.raises(ValueError, match="repeats and warmup must be >= 1"):
        alternated_step_times(cfgs, repeats=0)
