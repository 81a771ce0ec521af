"""GRN-v3 with and without the model input in its window (``experiments/lm_inputs``; paper
Table 9 at CPU scale).

Left: whole-split test perplexity per run kind; dots are seeds, grey lines join one seed's
runs (same data order), the bar is the mean ± std (the paper's Table 9 numbers, on another
scale, are in the summary and the report). Right: the seed-paired validation
perplexity difference (input + last w-1) - (last w) along training, mean ± std over seeds; below
zero means the model input helps. Reads ``results_dir/lm_inputs/summary.json`` only; writes
PNG, PDF and a CSV of the plotted numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import figure, save, saved_summary, scheme_color, scheme_label, wrap_label

KIND = "experiment"
NAME = "fig_lm_inputs"
ORDER = ("vanilla", "grn_v3_last", "grn_v3_input_last", "grn_v3_full")


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_inputs")
    if summary is None:
        return []
    rows_by_kind = summary["rows"]
    kinds = [k for k in ORDER if k in rows_by_kind]
    fig, (ax_ppl, ax_gap) = figure(2, height=2.4)
    per_seed = np.array([rows_by_kind[k]["test_ppl_per_seed"] for k in kinds])  # kinds x seeds
    for seed_row in per_seed.T:
        ax_ppl.plot(range(len(kinds)), seed_row, color="0.75", lw=0.7, zorder=1)
    rows = []
    for i, k in enumerate(kinds):
        stats = rows_by_kind[k]["test_ppl"]
        ax_ppl.scatter(np.full(per_seed.shape[1], i), per_seed[i], color=scheme_color(k), s=10,
                       zorder=2)
        ax_ppl.errorbar(i + 0.18, stats["mean"], yerr=stats["std"], fmt="o", ms=3.5,
                        color=scheme_color(k), capsize=2)
        rows.append({"panel": "test_ppl", "kind": k, "step": "", "mean": stats["mean"],
                     "std": stats["std"], "per_seed": " ".join(f"{v:.4f}" for v in per_seed[i])})
    ax_ppl.set(xticks=range(len(kinds)), xticklabels=[wrap_label(scheme_label(k)) for k in kinds],
               ylabel="test perplexity", xlim=(-0.4, len(kinds) - 0.4),
               title=f"window w = {summary['window']}")
    ax_ppl.tick_params(axis="x", labelsize=6)
    gap = summary.get("valid_gap_input_minus_last", [])
    if gap:
        step = np.array([g["step"] for g in gap])
        mean = np.array([g["mean"] for g in gap])
        std = np.array([g["std"] for g in gap])
        ax_gap.axhline(0.0, color="0.5", lw=0.7)
        ax_gap.plot(step, mean, color=scheme_color("grn_v3_input_last"), marker="o", ms=2.5)
        ax_gap.fill_between(step, mean - std, mean + std, color=scheme_color("grn_v3_input_last"),
                            alpha=0.2, lw=0)
        rows += [{"panel": "valid_gap", "kind": "input_last-last", "step": int(g["step"]),
                  "mean": g["mean"], "std": g["std"],
                  "per_seed": " ".join(f"{v:.4f}" for v in g["per_seed"])} for g in gap]
    w = summary["window"]
    ax_gap.set(xlabel="training step", ylabel="valid ppl difference",
               title=f"(input + last {w - 1}) - (last {w})")
    return save(fig, out_dir, NAME, rows=rows)
