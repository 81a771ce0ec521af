"""Time to reach a quality (:mod:`dca_theory.lab.time_to_reach`, paper Table 1's measure):
interpolation, and the per-seed ratios on synthetic exponential curves."""

from __future__ import annotations

import numpy as np
import pytest

from dca_theory.lab.time_to_reach import first_crossing, periodic_curve, time_to_reach


def test_first_crossing_interpolates_linearly():
    steps, values = [25, 50, 75], [10.0, 8.0, 6.0]
    assert first_crossing(steps, values, 7.0) == pytest.approx(62.5)  # halfway 8 -> 6
    assert first_crossing(steps, values, 8.0) == 50.0  # exactly on a point
    assert first_crossing(steps, values, 12.0) == 25.0  # already below at the first eval
    assert first_crossing(steps, values, 5.0) is None  # never reached: no extrapolation


def test_first_crossing_takes_the_first_of_several_crossings():
    # goes below 7 at step 37.5, bounces above, crosses again later: the first one counts
    assert first_crossing([25, 50, 75, 100], [8.0, 6.0, 9.0, 5.0], 7.0) == pytest.approx(37.5)


def test_first_crossing_rejects_bad_input():
    with pytest.raises(ValueError, match="strictly increasing"):
        first_crossing([25, 25], [1.0, 2.0], 1.5)
    with pytest.raises(ValueError, match="equal-length"):
        first_crossing([25, 50], [1.0], 1.5)


def _curve(rate, steps):
    """Valid ppl 5 + 20 exp(-rate step): decreasing, seeds with slightly different rates."""
    s = np.asarray(steps, float)[:, None]
    return 5.0 + 20.0 * np.exp(-np.asarray(rate)[None, :] * s)


def test_time_to_reach_on_exponential_curves():
    steps = np.arange(25, 400, 25)  # periodic evals 25 .. 375
    van = (steps, _curve([0.010, 0.011], steps))
    fast = (steps, _curve([0.030, 0.033], steps))  # 3x the rate: reaches in ~1/3 the steps
    out = time_to_reach(van, fast, step_s_vanilla=1.0, step_s_other=1.5)
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
    same = time_to_reach(van, van, 2.0, 2.0)
    assert same["time_ratio_per_seed"] == [1.0, 1.0]
    slow = time_to_reach(van, (steps, _curve([0.005, 0.005], steps)), 1.0, 1.0)
    assert slow["seeds_reached"] == 0 and slow["time_ratio"] is None


def test_periodic_curve_drops_the_whole_split_point():
    curves = {"eval_steps": np.array([25, 50, 75]),
              "eval_valid_loss": np.log(np.array([[9.0, 8.0], [7.0, 6.0], [5.0, 4.0]]))}
    steps, ppl = periodic_curve(curves, final_step=75)
    assert steps.tolist() == [25, 50]
    np.testing.assert_allclose(ppl, [[9.0, 8.0], [7.0, 6.0]], rtol=1e-12)
