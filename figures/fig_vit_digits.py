"""ViT on scikit-learn digits, vanilla against DCA (``experiments/vit_digits``; paper Table 8 at
CPU scale).

Left: test accuracy against training step, mean over seeds with a +-1 std band. Middle: test
loss against step. Right: final test accuracy per seed; a grey line joins the two models of one
seed (same initial weights and data order), so the paired difference is visible. Reads the saved
run directory only (``results_dir/vit_digits``); writes PNG, PDF and a CSV of the curves.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.io import read_json, read_jsonl

from .style import difference_label, figure, save, scheme_color, scheme_label

KIND = "experiment"
NAME = "fig_vit_digits"
KINDS = ("vanilla", "dca")


def curves(records: list[dict]) -> list[dict]:
    """One row per (kind, step): mean and std over seeds of test accuracy and loss."""
    rows = []
    for rec in records:
        acc, loss = np.asarray(rec["test_acc"]), np.asarray(rec["test_loss"])
        rows.append({"kind": rec["run"], "step": rec["step"], "n_seeds": acc.size,
                     "test_acc_mean": acc.mean(), "test_acc_std": acc.std(ddof=1),
                     "test_loss_mean": loss.mean(), "test_loss_std": loss.std(ddof=1)})
    return rows


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    run = Path(results_dir) / "vit_digits"
    if not (run / "summary.json").exists():
        raise FileNotFoundError(f"no vit_digits results at {run}; run "
                                "`dca-theory run vit_digits` first")
    summary = read_json(run / "summary.json")
    rows = curves(read_jsonl(run / "metrics.jsonl"))
    fig, (ax_acc, ax_loss, ax_seed) = figure(3, height=2.3)
    for kind in KINDS:
        pts = [r for r in rows if r["kind"] == kind]
        step = np.array([r["step"] for r in pts])
        for ax, metric in ((ax_acc, "test_acc"), (ax_loss, "test_loss")):
            mean = np.array([r[f"{metric}_mean"] for r in pts])
            std = np.array([r[f"{metric}_std"] for r in pts])
            ax.plot(step, mean, color=scheme_color(kind), label=scheme_label(kind))
            ax.fill_between(step, mean - std, mean + std, color=scheme_color(kind), alpha=0.2,
                            lw=0)
    ax_acc.set(xlabel="step", ylabel="test accuracy")
    ax_loss.set(xlabel="step", ylabel="test loss")
    ax_acc.legend(loc="lower right")
    per_kind = summary["per_kind"]
    accs = np.array([per_kind[k]["test_acc_per_seed"] for k in KINDS])  # (2, seeds)
    for seed_pair in accs.T:
        ax_seed.plot([0, 1], seed_pair, color="0.7", lw=0.8, zorder=1)
    for i, kind in enumerate(KINDS):
        ax_seed.scatter(np.full(accs.shape[1], i), accs[i], color=scheme_color(kind), s=12,
                        zorder=2)
        stats = per_kind[kind]["test_acc"]
        ax_seed.errorbar(i + 0.15, stats["mean"], yerr=stats["std"], fmt="o", ms=3,
                         color=scheme_color(kind), capsize=2)
    paired = summary["paired_dca_minus_vanilla"]["test_acc"]
    ax_seed.set(xticks=[0, 1], xticklabels=[scheme_label(k) for k in KINDS], xlim=(-0.4, 1.5),
                ylabel="final test accuracy",
                title=f"{difference_label('dca')}: {100 * paired['mean']:+.2f} "
                      f"± {100 * paired['std']:.2f} pts")
    return save(fig, out_dir, NAME, rows=rows)
