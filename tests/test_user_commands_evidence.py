"""The lm_evidence grid and the two experiments reading it (lm_evidence_lr, lm_evidence_rank)
end to end at their tiny settings (tests/tiny_commands.py), and the figures drawn from them.

The other experiments run in tests/test_user_commands.py, which also checks that every
experiment has a default test; these three are a file of their own so that, with ``--dist
loadfile``, a second worker trains them while the first trains the others.
"""

from __future__ import annotations

import os

import pytest
from tiny_commands import EVIDENCE, EVIDENCE_FIGURES, check_tiny_run, draw_figures


@pytest.fixture(scope="module")
def results(tmp_path_factory, data_dir):
    """One results folder for the module: the readers find the grid and its run cache."""
    os.environ["DCA_DATA_DIR"] = str(data_dir)
    return tmp_path_factory.mktemp("results")


@pytest.mark.parametrize("name", EVIDENCE)
def test_evidence_experiment_runs_end_to_end_at_tiny_size(name, results, capsys):
    check_tiny_run(name, results, capsys)


def test_figures_of_the_tiny_evidence_results(results, capsys, monkeypatch):
    """``dca-theory figures --experiments`` draws the grid's figures at this size."""
    draw_figures(results, list(EVIDENCE), EVIDENCE_FIGURES, capsys, monkeypatch)
