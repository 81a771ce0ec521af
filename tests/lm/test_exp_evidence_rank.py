"""lm_evidence_rank: reads the evidence grid's trained parameters (never trains), and refuses
in one line when the grid has left none."""

from __future__ import annotations

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
