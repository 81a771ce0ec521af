"""First-and-last-k DCA against the Transformer (``experiments/lm_k``; paper Table 1 at CPU
scale).

(a) Periodic validation perplexity (mean over seeds) against training step, with vanilla's last
    periodic value (the target) as a dotted line. (b) The same against estimated training time
    (step x the run's median step time). (c) Normalised time to reach vanilla's final ppl:
    ours (mean ± std over the seeds that reach it) next to the paper's Table 1.
Reads ``results_dir/lm_k/summary.json`` only; returns [] when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import figure, save, saved_summary, scheme_color, scheme_label

KIND = "experiment"
NAME = "fig_lm_k"
ORDER = ("vanilla", "1-dca", "2-dca", "4-dca", "dca")


def _label(kind: str, depth: int) -> str:
    """The scheme's label; full DCA also says which k-DCA it equals at this depth."""
    same = f" (= {scheme_label(f'{depth}-dca')})" if kind == "dca" else ""
    return scheme_label(kind) + same


def rows_of(summary: dict) -> list[dict]:
    """One CSV row per kind: test ppl, step time, time / step ratios to reach vanilla."""
    rows = []
    for kind in ORDER:
        if kind not in summary["rows"]:
            continue
        r, reach = summary["rows"][kind], summary["time_to_reach_vanilla"].get(kind)
        rows.append({"kind": kind, "params": r["params"],
                     "test_ppl_mean": r["test_ppl"]["mean"], "test_ppl_std": r["test_ppl"]["std"],
                     "step_s": r.get("step_s", r["median_step_s"]),
                     "time_ratio_mean": (reach["time_ratio"]["mean"]
                                         if reach and reach["time_ratio"] else
                                         (1.0 if kind == "vanilla" else None)),
                     "time_ratio_std": (reach["time_ratio"]["std"]
                                        if reach and reach["time_ratio"] else None),
                     "seeds_reached": reach["seeds_reached"] if reach else None})
    return rows


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_k")
    if summary is None:
        return []
    rows = rows_of(summary)
    if not rows:
        return []
    depth = summary["depth"]
    fig, (ax_s, ax_t, ax_r) = figure(3, height=2.4)
    target = None
    for kind in ORDER:
        c = summary["curves"].get(kind)
        if c is None:
            continue
        steps = np.asarray(c["steps"], float)
        y = np.asarray(c["valid_ppl_mean"])
        row = summary["rows"][kind]
        step_s = row.get("step_s", row["median_step_s"])  # alternated single-model step time
        ax_s.plot(steps, y, color=scheme_color(kind), label=_label(kind, depth))
        ax_t.plot(steps * step_s, y, color=scheme_color(kind))
        if kind == "vanilla":
            target = y[-1]
    for ax in (ax_s, ax_t):
        if target is not None:
            ax.axhline(target, color="0.3", ls=":", lw=0.8)
        ax.set(ylabel="valid ppl (6 batches)")
    ax_s.set(xlabel="step", title=f"(a) depth {depth}: validation ppl")
    ax_t.set(xlabel="estimated time (s)", title="(b) against step time")
    ax_s.legend()
    kinds = [r["kind"] for r in rows]
    ours = [r["time_ratio_mean"] if r["time_ratio_mean"] is not None else np.nan for r in rows]
    err = [r["time_ratio_std"] or 0.0 for r in rows]
    paper = [summary["paper_table1"].get(k, {}).get("time", np.nan) for k in kinds]
    x = np.arange(len(kinds))
    ax_r.bar(x - 0.2, ours, 0.4, yerr=err, color=[scheme_color(k) for k in kinds], capsize=2,
             label="ours")
    ax_r.bar(x + 0.2, paper, 0.4, color="0.8", label="paper (24 layers)")
    ax_r.axhline(1.0, color="0.3", lw=0.6)
    ax_r.set_xticks(x, [scheme_label(k) for k in kinds], rotation=30, ha="right")
    ax_r.set(ylabel="time to vanilla's final ppl (norm.)", title="(c) time to reach")
    ax_r.legend()
    return save(fig, out_dir, NAME, rows=rows, data={"paper_table1": summary["paper_table1"]})
