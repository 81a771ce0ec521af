"""Loss spikes, Transformer against DCA (``experiments/lm_stability``; paper §5, Figures 7/8).

Left: training loss of one vanilla seed run and the DCA run of the same dataset, size and seed
(the vanilla run with the most detected spikes), detected spike events (``c = 6``) marked, the
untested start (warm-up, first window) shaded. Middle: spike events per 1000 tested steps per
group (vanilla, DCA family, related-work baselines) at ``c`` = 4, 6, 8, with exact Poisson 95%
intervals and the event counts. Right: per seed run, the largest gradient norm over its
post-warm-up median. Reads ``results_dir/lm_stability`` only (``summary.json``,
``example_curves.npz``); writes PNG, PDF, a CSV of the per-group rates and a JSON of the
per-seed-run values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.io import read_json

from .style import FULL, figure, save, scheme_color, scheme_label

KIND = "experiment"
NAME = "fig_lm_stability"
GROUPS = ("vanilla", "dca_family", "baselines")
# groups that are schemes take the registry's look; the DCA family is drawn as DCA
GROUP_COLORS = {"vanilla": scheme_color("vanilla"), "dca_family": scheme_color("dca"),
                "baselines": "#9467bd"}
GROUP_LABELS = {"vanilla": scheme_label("vanilla"), "dca_family": "DCA / GRN",
                "baselines": "baselines"}
C = "6.0"  # the headline threshold of experiments/lm_stability


def rate_rows(summary: dict) -> list[dict]:
    """One row per (c, group): events, tested steps, rate per 1000 steps and its interval."""
    rows = []
    for c, block in summary["by_c"].items():
        for g, v in block["groups"].items():
            rows.append({"c": float(c), "group": g, "events": v["count"],
                         "tested_steps": v["exposure"], "rate_per_1000": v["rate"],
                         "ci95_low": v["ci95"][0], "ci95_high": v["ci95"][1],
                         "seed_runs": v["seed_runs"],
                         "seed_runs_with_events": v["seed_runs_with_events"]})
    return rows


def example_panel(ax, summary: dict, curves: dict, warmup: int) -> None:
    pair = summary["example_pair"]
    rows = {(r["key"], r["seed"]): r for r in summary["seed_runs"]}
    post = []
    for name in ("vanilla", "dca"):
        loss = curves[f"{name}_loss"]
        row = rows[(pair[name]["key"], pair[name]["seed"])]
        ax.plot(np.arange(1, loss.size + 1), loss, color=scheme_color(name), lw=0.7,
                label=f"{scheme_label(name)} ({len(row['events'][C])} spikes)")
        starts = [e["start"] for e in row["events"][C]]
        ax.scatter(np.asarray(starts) + 1, loss[starts], marker="v", color="red", s=14, zorder=3)
        post.append(loss[warmup:])
    lo = min(float(p.min()) for p in post)
    hi = max(float(np.percentile(p, 99.5)) for p in post)
    ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.3 * (hi - lo))
    ax.axvspan(0, warmup, color="0.9", lw=0)
    v = rows[(pair["vanilla"]["key"], pair["vanilla"]["seed"])]
    ax.set(xlabel="step", ylabel="training loss (nats)",
           title=f"{v['data']}, width {v['d_model']}, depth {v['n_layers']}, seed {v['seed']}")
    ax.legend(loc="upper right")


def rate_panel(ax, summary: dict) -> None:
    cs = list(summary["by_c"])
    width = 0.8 / len(GROUPS)
    for j, g in enumerate(GROUPS):
        for i, c in enumerate(cs):
            v = summary["by_c"][c]["groups"].get(g)
            if v is None:
                continue
            x = i + (j - (len(GROUPS) - 1) / 2) * width
            ax.bar(x, v["rate"], width, color=GROUP_COLORS[g], alpha=0.7,
                   label=GROUP_LABELS[g] if i == 0 else None)
            ax.errorbar(x, v["rate"], yerr=[[v["rate"] - v["ci95"][0]], [v["ci95"][1] - v["rate"]]],
                        color="k", lw=0.6, capsize=1.5)
            ax.annotate(str(v["count"]), (x, v["ci95"][1]), textcoords="offset points",
                        xytext=(0, 1), ha="center", fontsize=5)
    ax.set_xticks(range(len(cs)), [f"c = {float(c):g}" for c in cs])
    ax.set(ylabel="spikes per 1000 tested steps", title="spike rate (95% CI, counts)")
    ax.legend(loc="upper left")


def grad_panel(ax, summary: dict) -> None:
    rng = np.random.default_rng(0)  # horizontal jitter only
    for j, g in enumerate(GROUPS):
        v = [r["grad_norm_ratio"] for r in summary["seed_runs"] if r["group"] == g]
        if v:
            ax.scatter(j + rng.uniform(-0.2, 0.2, len(v)), v, color=GROUP_COLORS[g], s=5,
                       alpha=0.7)
            ax.hlines(np.median(v), j - 0.3, j + 0.3, color="k", lw=1)
    ratios = [r["grad_norm_ratio"] for r in summary["seed_runs"]]
    if max(ratios) > 10 * min(ratios):  # log scale only when the peaks span a decade
        ax.set_yscale("log")
    ax.set_xticks(range(len(GROUPS)), [GROUP_LABELS[g] for g in GROUPS])
    ax.set(ylabel="max / median gradient norm", title="gradient-norm peaks (per seed run)")


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    run = Path(results_dir) / "lm_stability"
    if not (run / "summary.json").is_file():
        return []
    summary = read_json(run / "summary.json")
    fig, axes = figure(3, width=FULL, height=2.4)
    if "example_pair" in summary and (run / "example_curves.npz").is_file():
        with np.load(run / "example_curves.npz") as f:
            curves = {k: f[k] for k in f.files}
        v = summary["example_pair"]["vanilla"]
        warmup = next(r for r in summary["seed_runs"] if r["key"] == v["key"])
        example_panel(axes[0], summary, curves, warmup["steps"] - warmup["tested_steps"])
    else:
        axes[0].set_axis_off()
    rate_panel(axes[1], summary)
    grad_panel(axes[2], summary)
    per_run = [{k: r[k] for k in ("key", "seed", "group", "residual", "data", "d_model",
                                  "n_layers", "tested_steps", "n_events", "grad_norm_ratio")}
               for r in summary["seed_runs"]]
    return save(fig, out_dir, NAME, rows=rate_rows(summary), data={"seed_runs": per_run})
