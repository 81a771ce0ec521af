"""lm_inputs (paper Table 9): the summaries on synthetic run records; one slow test runs the
quick mode and draws the figure."""

from __future__ import annotations

import pytest

from experiments import lm_inputs as E


def record(kind: str, test_ppl, history, window=None, grn_input=True) -> dict:
    """A cached-run record with only the fields the summaries read."""
    return {"key": f"k-{kind}", "label": kind, "n_params": 100, "seeds": [0, 1, 2],
            "resolved_model": {"grn_window": window, "grn_input": grn_input},
            "test_ppl": list(test_ppl), "valid_ppl": [p + 0.5 for p in test_ppl],
            "valid_history": [{"step": s, "valid_ppl": list(v)} for s, v in history]}


def records() -> dict:
    hist = [(25, [30.0, 31.0, 32.0]), (50, [20.0, 21.0, 22.0])]
    gap = [(25, [29.0, 30.5, 31.0]), (50, [19.9, 21.0, 21.7])]  # input helps early, less later
    return {"vanilla": record("vanilla", [10.0, 11.0, 12.0], hist),
            "grn_v3_last": record("last", [9.5, 10.6, 11.4], hist, 3, False),
            "grn_v3_input_last": record("input", [9.4, 10.3, 11.3], gap, 3, True),
            "grn_v3_full": record("full", [9.3, 10.4, 11.2], hist)}


def test_paired_differences_and_relative_change():
    s = E.summarise(records())
    d = s["paired_test_ppl"]["grn_v3_input_last-grn_v3_last"]
    # exact arithmetic on the synthetic numbers (float64 rounding only)
    assert d["per_seed"] == pytest.approx([-0.1, -0.3, -0.1], abs=1e-12)
    assert d["mean"] == pytest.approx(-0.5 / 3, abs=1e-12) and d["b_lower_seeds"] == 3
    assert d["ci95"][0] < d["mean"] < d["ci95"][1]  # a symmetric t interval around the mean
    assert s["relative_to_vanilla_pct"]["grn_v3_last"] == pytest.approx(
        100 * (31.5 / 33.0 - 1), abs=1e-10)
    assert s["order_by_test_ppl"][0] == "grn_v3_full"
    assert s["rows"]["grn_v3_last"]["grn_window"] == 3
    assert s["rows"]["grn_v3_last"]["grn_input"] is False


def test_paper_differences():
    paper = E.summarise(records())["paper_table9"]
    # Table 9: 20.227 - 20.301 = -0.074; 20.301 - 20.878 = -0.577
    assert paper["differences"]["grn_v3_input_last-grn_v3_last"] == pytest.approx(-0.074,
                                                                                 abs=1e-9)
    assert paper["differences"]["grn_v3_last-vanilla"] == pytest.approx(-0.577, abs=1e-9)


def test_valid_gap_per_step():
    gap = E.summarise(records())["valid_gap_input_minus_last"]
    assert [g["step"] for g in gap] == [25, 50]
    assert gap[0]["per_seed"] == pytest.approx([-1.0, -0.5, -1.0], abs=1e-12)
    assert gap[1]["mean"] == pytest.approx((-0.1 + 0.0 - 0.3) / 3, abs=1e-12)


def test_valid_gap_needs_the_same_schedule():
    a = record("a", [1.0], [(25, [2.0])])
    b = record("b", [1.0], [(50, [2.0])])
    with pytest.raises(ValueError, match="evaluation steps differ"):
        E.valid_gap(a, b)


def test_unpaired_seeds_are_an_error():
    recs = records()
    recs["vanilla"]["seeds"] = [0, 1, 3]
    with pytest.raises(ValueError, match="share their seeds"):
        E.summarise(recs)


@pytest.mark.slow
def test_quick_mode_and_figure(tmp_path, monkeypatch, data_dir):
    from figures import fig_lm_inputs

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    path = E.main(quick=True, out=tmp_path / "lm_inputs")
    from dca_theory.io import read_json

    s = read_json(path / "summary.json")
    assert set(s["rows"]) == set(E.KINDS) and s["window"] == 2
    # windowed GRN-v3 has fewer GRN parameters than the full stack, more than vanilla
    p = {k: r["params"] for k, r in s["rows"].items()}
    assert p["vanilla"] < p["grn_v3_last"] == p["grn_v3_input_last"] < p["grn_v3_full"]
    paths = fig_lm_inputs.make(tmp_path / "fig", tmp_path)
    assert {q.suffix for q in paths} == {".png", ".pdf", ".csv"}
