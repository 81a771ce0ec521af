"""Effective rank of the sublayer Jacobians beside DCA's gain in the evidence grid's
near-converged models (``experiments/lm_evidence_rank``): the panels of
:mod:`figures.fig_lm_rank` (rank fraction per sublayer against width, per layer, and D against
vanilla's update rank fraction with the pre-stated r).

Reads ``results_dir/lm_evidence_rank/summary.json`` only; returns [] when it is absent.
"""

from __future__ import annotations

from pathlib import Path

from .fig_lm_rank import draw
from .style import saved_summary

KIND = "experiment"
NAME = "fig_lm_evidence_rank"


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    return draw(saved_summary(results_dir, "lm_evidence_rank"), out_dir, NAME)
