"""lm_k: one slow test runs the quick mode (from the quick cache) and draws the figure. The
time-to-reach measure is tested in ``tests/lab/test_time_to_reach.py``."""

from __future__ import annotations

import pytest

from experiments import lm_k as K


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
