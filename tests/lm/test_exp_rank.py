"""lm_rank: the pre-stated correlation (dca_theory.lab.rank_gain) and the quick mode with its
figure (the Jacobians themselves: tests/lm/test_branch_rank.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dca_theory.lab import rank_gain as G
from experiments import lm_rank as E


def test_correlation_verdicts_follow_the_fisher_interval():
    x = np.arange(8.0)
    up = G.correlation(x, x + 0.01 * np.sin(x))
    assert up["pearson_r"] > 0.99 and up["ci"][0] > 0 and up["verdict"] == "tracks"
    down = G.correlation(x, -x + 0.01 * np.cos(x))
    assert down["ci"][1] < 0 and down["verdict"] == "contradicts"
    flat = G.correlation(x[:4], np.array([1.0, -1.0, -1.0, 1.0]))
    assert flat["ci"][0] < 0 < flat["ci"][1] and flat["verdict"] == "inconclusive"
    # Fisher z: r = 0 at n = 7 gives tanh(±1.96 / 2)
    r0 = G.correlation(np.arange(7.0), np.array([0.0, 1, -1, 0, -1, 1, 0]))
    assert r0["pearson_r"] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(r0["ci"], [-np.tanh(1.959964 / 2), np.tanh(1.959964 / 2)],
                               rtol=1e-5)


def test_settings_reject_bad_positions():
    with pytest.raises(ValueError, match="positions must be >= 1, got 0"):
        E.settings(True, ["positions=0"])
    assert E.settings(False).seeds == E.FULL_SEEDS and E.settings(False).widths == (16, 32, 64)


@pytest.mark.slow
def test_quick_mode_and_figure(tmp_path, monkeypatch, data_dir):
    from dca_theory.io import read_json
    from figures import fig_lm_rank

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    run = E.main(quick=True, out=tmp_path / "results" / "lm_rank")
    summary = read_json(run / "summary.json")
    assert {(c["width"], c["seed"]) for c in summary["cells"]} == {(8, 0), (8, 1), (16, 0),
                                                                   (16, 1)}
    for cell in summary["cells"]:
        for kind in G.KINDS:
            for part in ("attn", "mlp", "update"):
                assert 0.0 < cell[f"{kind}_{part}_eff_rank_frac"] <= 1.0  # eff. rank <= D
    assert summary["primary"]["n"] == 4
    paths = fig_lm_rank.make(tmp_path / "fig", tmp_path / "results")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv", ".json"}


def test_leave_one_out_shows_a_single_point_carrying_r():
    x = np.array([0.0, 0.1, -0.1, 0.05, 1.0])
    y = np.array([0.1, -0.1, 0.1, -0.1, 5.0])  # r driven by the last point alone
    out = G.correlation(x, y)
    assert out["pearson_r"] > 0.95 and len(out["leave_one_out_r"]["all"]) == 5
    assert out["leave_one_out_r"]["all"][-1] < 0 and out["leave_one_out_r"]["min"] < 0


def test_within_width_correlation_removes_what_the_widths_share():
    rng = np.random.default_rng(3)
    widths = np.repeat([16, 32, 64], 6)
    noise = 0.3 * rng.normal(size=18)
    # both rise with width, and within a width y follows x exactly up to a small noise
    x = np.log2(widths) + noise
    y = 5 * np.log2(widths) - 2 * noise + 0.01 * rng.normal(size=18)
    w = G.within_width(x, y, widths)
    assert w["pearson_r"] < -0.99 and w["widths"] == 3 and w["n"] == 18
    # against the partial correlation from a regression on width dummies
    dummies = (widths[:, None] == np.array([16, 32, 64])[None]).astype(float)
    res = [v - dummies @ np.linalg.lstsq(dummies, v, rcond=None)[0] for v in (x, y)]
    assert w["pearson_r"] == pytest.approx(np.corrcoef(*res)[0, 1], abs=1e-12)
    # the interval uses n - 2 - 3 = 13 degrees of freedom
    half = 1.959963984540054 / np.sqrt(13)
    assert w["ci"] == pytest.approx(list(np.tanh(np.arctanh(w["pearson_r"]) + [-half, half])),
                                    abs=1e-9)
    # pooled over widths, the shared trend makes the raw correlation positive
    assert G.correlation(x, y)["pearson_r"] > 0
