"""DCA against related residual schemes (``experiments/lm_related_work``; paper Table 5 at CPU
scale). Same layout as :mod:`figures.fig_lm_ablation`: per dataset, mean test perplexity ± std
with seed dots and the paired difference against vanilla; last panel, the change against vanilla
in percent, ours next to the paper's. Reads ``results_dir/lm_related_work/summary.json`` only.
"""

from __future__ import annotations

from pathlib import Path

from .fig_lm_ablation import draw
from .style import saved_summary

KIND = "experiment"
NAME = "fig_lm_related_work"
ORDER = ("vanilla", "laurel_pa", "denseformer", "hyper_connections", "dca")  # paper Table 5


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_related_work")
    if summary is None:
        return []
    return draw(summary, summary["paper_table5"], out_dir, NAME, ORDER)
