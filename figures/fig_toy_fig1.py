"""Figure 1 (both panels): training MSE (log scale) of ResNet vs GRN-v1/v2/v3 on (a) the
identity and (b) a random linear map y = A x + b, from ``experiments/results/fig1``.
The curve of each kind is the median over seeds at its best learning rate (see
``experiments/fig1.py``), the band spans the seeds, and a dashed line shows the single best run
when it used another learning rate. Reads saved results only."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.io import read_json

from .style import figure, save, scheme_color, scheme_label

KIND = "experiment"
TITLES = {"identity": "(a) learn the identity", "gaussian": "(b) learn y = Ax + b"}


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    run = Path(results_dir) / "fig1"
    if not (run / "summary.json").exists():
        raise FileNotFoundError(f"no fig1 results at {run}; run `dca-theory run fig1` first")
    summary = read_json(run / "summary.json")
    curves = np.load(run / "curves.npz")
    cfg = summary["config"]
    fig, axes = figure(2, height=3.0)
    rows = []
    for ax, task in zip(axes, cfg["tasks"]):
        for kind in cfg["kinds"]:
            key = f"{task}__{kind}"
            if key not in curves:
                continue
            c = np.where(np.isfinite(curves[key]), curves[key], np.nan)  # (seeds, steps)
            steps = np.arange(c.shape[1])
            lr = summary["results"][f"{task}/{kind}"]["best_lr"]
            med = np.nanmedian(c, axis=0)
            color, label = scheme_color(kind), scheme_label(kind)
            ax.plot(steps, med, color=color, label=f"{label} (lr {lr:g})")
            ax.fill_between(steps, np.nanmin(c, 0), np.nanmax(c, 0), color=color,
                            alpha=0.2, lw=0)
            if f"{key}__best_run" in curves:
                b = summary["results"][f"{task}/{kind}"]["best_single_run"]
                if b["lr"] != lr:
                    ax.plot(steps, curves[f"{key}__best_run"], color=color,
                            ls="--", lw=0.8, label=f"{label} best run (lr {b['lr']:g})")
            rows += [{"task": task, "kind": kind, "lr": lr, "step": int(s), "mse_median": m}
                     for s, m in zip(steps[::10], med[::10])]
        ax.set_yscale("log")
        ax.set_xlabel(f"SGD step (batch {cfg['batch_size']})")
        ax.set_ylabel("training MSE per coordinate")
        ax.set_title(TITLES.get(task, task))
    # One legend under both panels: in (b) the curves fill the whole axes. ResNet, GRN-v2 and
    # GRN-v3 overlap in (a) (v3 equals v2: its gate gets no gradient from w = 0).
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4)
    return save(fig, out_dir, "fig_toy_fig1", rows=rows)
