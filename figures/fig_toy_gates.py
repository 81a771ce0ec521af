"""GRN-v3's gates on the toy teachers (``experiments/results/toy_gates``): left, D = 100·(ln MSE
of GRN-v3 with each gate − ln MSE of GRN-v2), seed-paired mean with its 95 % t-interval, one row
per setup and configuration (below 0: the gate helps); right, the norm of w's gradient at step 0
(filled) and of w at the end (open), log scale, 0 drawn at the axis floor. Reads saved results
only."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory import gates

from .style import FULL, figure, gate_color, save, saved_summary

KIND = "experiment"
NAME = "fig_toy_gates"


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "toy_gates")
    if summary is None:
        return []
    comps = summary["comparisons"]
    rows_order = list(dict.fromkeys((c["setup"], c["config"]) for c in comps))
    gate_names = list(dict.fromkeys(c["gate"] for c in comps))
    fig, (ax, ax_w) = figure(2, width=FULL, height=0.35 * len(rows_order) + 1.2)
    offsets = np.linspace(-0.3, 0.3, len(gate_names))
    floor = 1e-8
    for off, gate in zip(offsets, gate_names):
        color = gate_color(gate)
        for y, key in enumerate(rows_order):
            (c,) = [c for c in comps if (c["setup"], c["config"]) == key and c["gate"] == gate]
            d = c["D"]
            lo, hi = d["ci95"] if d["ci95"] else (d["mean"], d["mean"])
            ax.errorbar(d["mean"], y + off, xerr=[[d["mean"] - lo], [hi - d["mean"]]],
                        fmt="o", ms=3, color=color, lw=1,
                        label=gates.canonical(gate) if y == 0 else None)
            ax_w.plot(max(c["w_grad_step0_mean"], floor), y + off, "o", ms=3, color=color)
            ax_w.plot(max(c["w_norm_final_mean"], floor), y + off, "o", ms=3, mfc="none",
                      color=color)
    labels = [f"{s}: {c}" for s, c in rows_order]
    for a in (ax, ax_w):
        a.set_yticks(range(len(rows_order)))
        a.invert_yaxis()
    ax.set_yticklabels(labels, fontsize=6)
    ax_w.set_yticklabels([])
    ax.axvline(0, color="black", lw=0.6)
    ax.set_xlabel("$D = 100\\,(\\ln \\mathrm{MSE}_{v3} - \\ln \\mathrm{MSE}_{v2})$\n"
                  "seed-paired mean, 95 % CI")
    ax_w.set_xscale("log")
    ax_w.set_xlabel("$\\|\\nabla_w\\|$ at step 0 (filled), $\\|w\\|$ at the end (open)\n"
                    "0 drawn at $10^{-8}$")
    ax.legend(fontsize=6, title="gate", title_fontsize=6)
    rows = [{"setup": c["setup"], "config": c["config"], "gate": c["gate"],
             "D_mean": c["D"]["mean"], "D_ci95": c["D"]["ci95"], "holm_p": c["holm_p"],
             "advantage": c["advantage"], "w_grad_step0": c["w_grad_step0_mean"],
             "w_norm_final": c["w_norm_final_mean"]} for c in comps]
    return save(fig, out_dir, NAME, rows=rows)
