"""lm_depth: parameter-efficiency interpolation and the summaries on synthetic records; one
slow test runs the quick mode and draws the figure."""

from __future__ import annotations

import pytest

from experiments import lm_depth as Dp


def test_params_to_reach_interpolates_in_log_params():
    params, ppls = [1e4, 1e6], [20.0, 10.0]
    # halfway in ppl is halfway in log(params): the geometric mean
    assert Dp.params_to_reach(params, ppls, 15.0) == pytest.approx(1e5, rel=1e-12)
    assert Dp.params_to_reach(params, ppls, 25.0) == pytest.approx(1e4)  # smallest suffices
    assert Dp.params_to_reach(params, ppls, 9.0) is None  # beyond the range: no extrapolation
    # unsorted input is sorted by parameters first
    assert Dp.params_to_reach([1e6, 1e4], [10.0, 20.0], 15.0) == pytest.approx(1e5, rel=1e-12)
    with pytest.raises(ValueError, match="equal-length"):
        Dp.params_to_reach([1.0, 2.0], [1.0], 1.0)


def _record(n_params, ppls):
    return {"key": f"k{n_params}", "label": "x", "n_params": n_params, "seeds": [0, 1, 2],
            "test_ppl": ppls, "valid_ppl": ppls, "final_train_loss": [1.0, 1.0, 1.0],
            "median_step_s": 0.1}


def test_summaries_on_synthetic_records():
    records = {("vanilla", 2): _record(1000, [12.0, 12.2, 12.1]),
               ("vanilla", 4): _record(2000, [11.0, 11.1, 11.2]),
               ("dca", 2): _record(1100, [11.5, 11.6, 11.4]),
               ("dca", 4): _record(2200, [10.5, 10.6, 10.4])}
    rows = Dp.depth_rows(records)
    assert rows["2"]["paired_test_ppl"]["mean"] == pytest.approx(-0.6)
    assert rows["4"]["paired_test_ppl"]["b_lower_seeds"] == 3
    cross = Dp.cross_depth(records)
    assert list(cross) == ["dca_L2-vanilla_L4"]  # no vanilla at depth 8
    assert cross["dca_L2-vanilla_L4"]["mean"] == pytest.approx(11.5 - 11.1)
    assert cross["dca_L2-vanilla_L4"]["param_ratio_dca_over_vanilla"] == pytest.approx(0.55)
    eff = Dp.efficiency(records)
    # DCA L2 at 11.5 lies 60% of the way from vanilla's 12.1 (1000 params) to 11.1 (2000),
    # i.e. at 1000 * 2**0.6 parameters on the log scale
    assert eff["2"]["vanilla_params_needed"] == pytest.approx(1000 * 2**0.6, rel=1e-9)
    assert eff["2"]["param_efficiency"] == pytest.approx(1000 * 2**0.6 / 1100, rel=1e-9)
    assert eff["4"]["beyond_vanilla_range"] and eff["4"]["param_efficiency"] is None


@pytest.mark.slow
def test_quick_mode_and_figure(tmp_path, monkeypatch, data_dir):
    from dca_theory.io import read_json
    from figures import fig_lm_depth

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    run = Dp.main(quick=True, out=tmp_path / "results" / "lm_depth")
    summary = read_json(run / "summary.json")
    assert set(summary["depths"]) == {"1", "2"} and summary["complete"]
    paths = fig_lm_depth.make(tmp_path / "fig", tmp_path / "results")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv", ".json"}
