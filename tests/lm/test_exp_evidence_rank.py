"""lm_evidence_rank: reads the evidence grid's trained parameters (never trains), and refuses
in one line when the grid has left none."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import lm_evidence_rank as E


def test_without_trained_grid_runs_it_refuses_and_writes_nothing(tmp_path):
    out = tmp_path / "results" / "lm_evidence_rank"
    with pytest.raises(ValueError, match=r"no width of the lm_evidence grid .* run "
                                         r"`dca-theory run lm_evidence --quick` first"):
        E.main(quick=True, out=out)
    assert not out.exists()


def test_settings_reject_bad_positions():
    with pytest.raises(ValueError, match="positions must be >= 1, got 0"):
        E.settings(True, ["positions=0"])
    assert E.settings(False).positions == 16


@pytest.mark.slow
def test_quick_mode_reads_the_quick_grid_and_draws(tmp_path, monkeypatch, data_dir):
    from dca_theory.io import read_json
    from experiments import lm_evidence
    from figures import fig_lm_evidence_rank

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    grid = read_json(lm_evidence.main(quick=True, out=tmp_path / "results" / "lm_evidence")
                     / "summary.json")
    run = E.main(quick=True, out=tmp_path / "results" / "lm_evidence_rank")
    s = read_json(run / "summary.json")
    assert s["widths"] == [8, 16] and s["complete"] and s["primary"]["n"] == 4
    for cell in s["cells"]:
        for kind in ("vanilla", "dca"):
            for part in ("attn", "mlp", "update"):
                assert 0.0 < cell[f"{kind}_{part}_eff_rank_frac"] <= 1.0  # eff. rank <= D
    # D is the grid's own gap, seed by seed (the same test perplexities the grid recorded)
    grid_d = grid["datasets"]["ptb-char"]["comparisons"]["dca-vanilla"]["test_D"]
    for w in (8, 16):
        ours = [c["D"] for c in s["cells"] if c["width"] == w]
        np.testing.assert_allclose(ours, grid_d[str(w)]["per_seed"], rtol=0, atol=1e-9)
        assert len(s["dca_minus_vanilla_by_width"][str(w)]["update"]["per_seed"]) == 2
    paths = fig_lm_evidence_rank.make(tmp_path / "fig", tmp_path / "results")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv", ".json"}
