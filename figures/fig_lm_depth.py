"""Depth scaling, vanilla against DCA (``experiments/lm_depth``; paper Figure 6 at CPU scale).

(a) Test perplexity against parameter count (log scale), one point per depth, mean ± std over
    seeds, labelled with the depth. (b) Seed-paired test-ppl differences: DCA - vanilla at the
    same depth, and DCA at depth d - vanilla at depth 2d (mean with 95% CI, seeds as dots).
Reads ``results_dir/lm_depth/summary.json`` only; returns [] when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import difference_label, figure, save, saved_summary, scheme_color, scheme_label

KIND = "experiment"
NAME = "fig_lm_depth"


def rows_of(summary: dict) -> list[dict]:
    """One CSV row per (kind, depth): parameters and test ppl mean / std."""
    rows = []
    for p in summary["points"]:
        v = np.asarray(p["test_ppl_per_seed"], float)
        rows.append({"kind": p["kind"], "depth": p["depth"], "params": p["params"],
                     "test_ppl_mean": float(v.mean()),
                     "test_ppl_std": float(v.std(ddof=1)) if v.size > 1 else 0.0})
    return rows


def _differences(summary: dict) -> list[tuple[str, dict]]:
    same = [(f"L{d}: DCA-van", r["paired_test_ppl"])
            for d, r in sorted(summary["depths"].items(), key=lambda kv: int(kv[0]))]
    cross = [(k.replace("dca_L", "DCA L").replace("-vanilla_L", " - van L"), v)
             for k, v in summary["dca_vs_vanilla_twice_as_deep"].items()]
    return same + cross


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_depth")
    if summary is None:
        return []
    rows = rows_of(summary)
    if not rows:
        return []
    fig, (ax, ax_d) = figure(2, height=2.4)
    for kind in ("vanilla", "dca"):
        pts = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["params"])
        x = [r["params"] for r in pts]
        ax.errorbar(x, [r["test_ppl_mean"] for r in pts], yerr=[r["test_ppl_std"] for r in pts],
                    color=scheme_color(kind), marker="o", ms=3, capsize=2, label=scheme_label(kind))
        for r in pts:
            ax.annotate(f"L{r['depth']}", (r["params"], r["test_ppl_mean"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points", color=scheme_color(kind))
    ax.set(xscale="log", xlabel="parameters", ylabel="test ppl",
           title="(a) perplexity vs parameters")
    ax.legend()
    diffs = _differences(summary)
    for i, (label, d) in enumerate(diffs):
        ci = d.get("ci95") or [d["mean"], d["mean"]]
        ax_d.errorbar(i, d["mean"], yerr=[[d["mean"] - ci[0]], [ci[1] - d["mean"]]], fmt="o",
                      ms=3, capsize=2, color=scheme_color("dca"))
        ax_d.scatter(np.full(len(d["per_seed"]), i + 0.15), d["per_seed"], s=6, color="0.5")
    ax_d.axhline(0, color="0.3", lw=0.6)
    ax_d.set_xticks(range(len(diffs)), [lbl for lbl, _ in diffs], rotation=30, ha="right")
    ax_d.set(ylabel="paired test-ppl difference", title=f"(b) {difference_label('dca')} (95% CI)")
    return save(fig, out_dir, NAME, rows=rows, data={"differences": dict(diffs)})
