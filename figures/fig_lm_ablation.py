"""GRN-variant ablation (``experiments/lm_ablation``; paper Table 7 at CPU scale).

One panel per dataset: mean test perplexity per architecture (bar, ± 1 std over seeds) with one
dot per seed, a grey line joining the values of one seed (same data order for all rows); the
paired difference against vanilla (mean, p-value) is written above each bar.
Last panel: change of the mean test perplexity against vanilla in percent, ours per dataset next
to the paper's (LM1B). Reads ``results_dir/lm_ablation/summary.json`` only; writes PNG, PDF, a
CSV of the per-seed values and a JSON of the plotted summary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import (
    FULL,
    figure,
    save,
    saved_summary,
    scheme_color,
    scheme_label,
    scheme_linestyle,
    wrap_label,
)

KIND = "experiment"
NAME = "fig_lm_ablation"
ORDER = ("vanilla", "grn_v1", "grn_v2", "grn_v3", "dca", "grn_v3_open", "dca_open",
         "denseformer", "hyper_connections", "laurel_pa")
DATA_LABELS = {"shakespeare": "Tiny Shakespeare (char)", "ptb": "Penn Treebank (word)"}
DATA_MARKERS = {"shakespeare": "o", "ptb": "s"}


def per_seed_rows(summary: dict) -> list[dict]:
    """One CSV row per (dataset, kind, seed)."""
    rows = []
    for data, table in summary["datasets"].items():
        for kind, row in table["rows"].items():
            for seed, value in zip(row["seeds"], row["test_ppl_per_seed"]):
                rows.append({"dataset": data, "kind": kind, "seed": seed, "test_ppl": value,
                             "params": row["params"]})
    return rows


def tick_labels(kinds) -> list[str]:
    """Scheme labels wrapped to the width of one bar (up to ten bars in a third of a page)."""
    return [wrap_label(scheme_label(k), width=5) for k in kinds]


def bar_panel(ax, table: dict, title: str, order=ORDER) -> None:
    """Bars of mean test ppl ± std, seed dots joined per seed, ``Δ vs vanilla`` labels."""
    kinds = [k for k in order if k in table["rows"]]
    lows = []
    for i, kind in enumerate(kinds):
        row = table["rows"][kind]
        mean, std = row["test_ppl"]["mean"], row["test_ppl"]["std"]
        seeds = np.asarray(row["test_ppl_per_seed"])
        dashed = scheme_linestyle(kind) != "-"  # open gate: its scheme's colour, dashed edge
        ax.bar(i, mean, color=scheme_color(kind), alpha=0.6, width=0.7,
               edgecolor="k" if dashed else "none", ls=scheme_linestyle(kind), lw=0.6)
        ax.errorbar(i, mean, yerr=std, color="k", capsize=2, lw=0.8)
        ax.scatter(np.full(seeds.size, i), seeds, color="k", s=5, zorder=3)
        lows.append(seeds.min())
        diff = table["paired_test_ppl"].get(f"{kind}-vanilla")
        if diff is not None and diff["p_value"] is not None:
            ax.annotate(f"{diff['mean']:+.2f}\np={diff['p_value']:.2g}",
                        (i, max(mean + std, seeds.max())), textcoords="offset points",
                        xytext=(0, 2), ha="center", fontsize=5)
    by_seed = np.array([table["rows"][k]["test_ppl_per_seed"] for k in kinds])  # kinds x seeds
    for seed_line in by_seed.T:  # seeds share data order: join each seed's values
        ax.plot(np.arange(len(kinds)), seed_line, color="0.5", lw=0.5, zorder=2)
    highs = by_seed.max(axis=1)
    span = max(highs) - min(lows)
    ax.set_ylim(min(lows) - 0.6 * span, max(highs) + 0.5 * span)
    ax.set_xticks(range(len(kinds)), tick_labels(kinds), fontsize=5.5)
    ax.set(ylabel="test perplexity", title=title)


def relative_panel(ax, summary: dict, paper: dict, order=ORDER) -> None:
    """Change of the mean test perplexity against vanilla (%): ours per dataset vs the paper."""
    ours = set().union(*(t["relative_to_reference_pct"] for t in summary["datasets"].values()))
    paper_rel = paper["relative_to_reference_pct"]
    kinds = [k for k in order if k != "vanilla" and (k in paper_rel or k in ours)]
    x = np.arange(len(kinds))
    ax.bar(x, [paper_rel.get(k, np.nan) for k in kinds], color="0.8", width=0.7,
           label="paper (LM1B)")
    for data, table in summary["datasets"].items():
        rel = table["relative_to_reference_pct"]
        ax.scatter(x, [rel.get(k, np.nan) for k in kinds], marker=DATA_MARKERS.get(data, "^"),
                   color=[scheme_color(k) for k in kinds], edgecolor="k", lw=0.4, s=14, zorder=3,
                   label=DATA_LABELS.get(data, data))
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(x, tick_labels(kinds), fontsize=5.5)
    ax.set(ylabel=f"test ppl vs {scheme_label('vanilla')} (%)", title="relative change")
    ax.legend(loc="lower left")


def draw(summary: dict, paper: dict, out_dir: Path, name: str, order=ORDER) -> list[Path]:
    """The figure of one table summary (``order``: the rows, left to right)."""
    datasets = sorted(summary["datasets"], key=lambda d: (d not in DATA_LABELS, d != "shakespeare"))
    fig, axes = figure(len(datasets) + 1, width=FULL, height=2.4)
    for ax, data in zip(axes, datasets):
        bar_panel(ax, summary["datasets"][data], DATA_LABELS.get(data, data), order)
    relative_panel(axes[-1], summary, paper, order)
    plotted = {"datasets": {d: {k: summary["datasets"][d][k]
                                for k in ("rows", "paired_test_ppl", "relative_to_reference_pct")}
                            for d in datasets}, "paper": paper}
    return save(fig, out_dir, name, rows=per_seed_rows(summary), data=plotted)


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_ablation")
    if summary is None:
        return []
    return draw(summary, summary["paper_table7"], out_dir, NAME)
