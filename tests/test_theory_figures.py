"""Every theory figure renders into a temporary folder with PNG, PDF and a parseable data file;
Figure 5's data reproduces the paper's extreme values."""

from __future__ import annotations

import csv
import json

import pytest

from figures import figure_modules

THEORY = figure_modules("theory")


def test_theory_figures_are_registered():
    names = {m.NAME for m in THEORY}
    assert {"fig5_gain_lower_bounds", "fig_g3_gain_lower_bound", "fig_thresholds",
            "fig_rank_savings", "fig_excess_risk_vs_params", "fig_risk_schemes"} <= names


@pytest.mark.parametrize("mod", THEORY, ids=[m.__name__ for m in THEORY])
def test_theory_figure_renders_with_data(mod, tmp_path, monkeypatch):
    if hasattr(mod, "RANKS"):  # the numerical-optimisation figure: two ranks are enough here
        monkeypatch.setattr(mod, "RANKS", (8, 32))
    paths = mod.make(tmp_path, tmp_path / "no_results")
    suffixes = {p.suffix for p in paths}
    assert {".png", ".pdf"} <= suffixes and suffixes & {".csv", ".json"}
    for path in paths:
        assert path.exists() and path.stat().st_size > 0
        if path.suffix == ".csv":
            with open(path, newline="") as fh:
                rows = list(csv.DictReader(fh))
            assert rows and all(v not in ("", None) for v in rows[0].values())
        if path.suffix == ".json":
            assert json.loads(path.read_text())["rows"]
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_figure_5_extremes(tmp_path):
    from figures import fig_theory_gain

    [csv_path] = [p for p in fig_theory_gain.make(tmp_path, tmp_path) if p.suffix == ".csv"]
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    left = [r for r in rows if r["panel"] == "left"]
    right = [r for r in rows if r["panel"] == "right"]
    top = max(left, key=lambda r: float(r["gain"]))
    bottom = min(left, key=lambda r: float(r["gain"]))
    # paper: left from 7500 (d=300, r*=0) down to about -6143 (G2, d=100, r*=100)
    assert float(top["gain"]) == pytest.approx(7500) and top["d"] == "300"
    assert float(top["x"]) == 0.0
    assert float(bottom["gain"]) == pytest.approx(-6142.52, abs=0.01)
    assert (bottom["kind"], bottom["d"], float(bottom["x"])) == ("grn_v2", "100", 100.0)
    # right panel peaks at exactly 25000 (d=300, lam_min=lam_max=10)
    peak = max(right, key=lambda r: float(r["gain"]))
    assert float(peak["gain"]) == pytest.approx(25000) and peak["d"] == "300"


def test_experiment_figures_without_results_fail_before_drawing(tmp_path, capsys):
    from dca_theory.cli import main

    out = tmp_path / "figs"
    assert main(["figures", "--experiments", "--results", str(tmp_path / "none"),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no saved results at {tmp_path / 'none'}" in err
    assert "--results DIR" in err
    assert not out.exists()
