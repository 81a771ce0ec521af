"""Rank against width and GRN gain against width for MLP-ResNets
(``experiments/results/rank_vs_width``). Left: test MSE; middle: effective rank (exp entropy of
the normalised singular values, mean over inputs) of the Jacobian of the learned function minus
its own input-slot term (the numerical rank at rtol 1e-2 is in the CSV: it tracks min(T r, d)
because trained nets keep many small directions); right: relative GRN gain over the ResNet,
1 − MSE_GRN / MSE_ResNet. One row per teacher (k, α). Reads saved results only."""

from __future__ import annotations

import csv
from pathlib import Path

from dca_theory.io import read_json

from .style import FULL, figure, save, scheme_color, scheme_label

KIND = "experiment"


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    run = Path(results_dir) / "rank_vs_width"
    if not (run / "summary.json").exists():
        raise FileNotFoundError(f"no rank_vs_width results at {run}; run "
                                "`dca-theory run rank_vs_width` first")
    s = read_json(run / "summary.json")
    cfg, cells, gains = s["config"], s["cells"], s["gain_over_res"]
    paths, rows = [], []
    for k, a in cfg["teachers"]:
        fig, (ax_mse, ax_rank, ax_gain) = figure(3, width=FULL, height=2.2)
        tag = f"k={k},alpha={a}"
        for kind in cfg["kinds"]:
            ws = [w for w in cfg["widths"] if f"{tag}/{kind}/r={w}" in cells]
            c = [cells[f"{tag}/{kind}/r={w}"] for w in ws]
            col, lab = scheme_color(kind), scheme_label(kind)
            ax_mse.plot(ws, [x["test_mse_mean"] for x in c], "o-", color=col, ms=3, label=lab)
            ax_rank.plot(ws, [x["eff_rank_own_skip_mean"] for x in c], "o-", color=col, ms=3)
            if kind != "res":
                g = [gains[f"{tag}/{kind}/r={w}"]["rel"] for w in ws]
                ax_gain.plot(ws, g, "o-", color=col, ms=3, label=lab)
            rows += [{"teacher_rank": k, "alpha": a, "kind": kind, "width": w,
                      "test_mse": x["test_mse_mean"], "eff_rank": x["eff_rank_own_skip_mean"],
                      "jac_rank": x["jac_rank_own_skip_mean"],
                      "jac_rank_vs_identity": x["jac_rank_identity_mean"]}
                     for w, x in zip(ws, c)]
        wmax = max(cfg["widths"])
        ax_rank.plot(cfg["widths"], [min(cfg["depth"] * w, cfg["dim"]) for w in cfg["widths"]],
                     "k:", lw=1, label="min(T r, d)")
        ax_rank.axhline(k, color="k", lw=0.8, ls="--", label=f"teacher k={k}")
        for ax in (ax_mse, ax_rank, ax_gain):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("width r per block")
            ax.set_xlim(0.8, wmax * 1.25)
        ax_mse.set_yscale("log")
        ax_mse.set_ylabel("test MSE per coordinate")
        ax_rank.set_ylabel("effective rank of residual Jacobian")
        ax_gain.set_ylabel(f"1 - MSE_GRN / MSE_{scheme_label('res')}")
        ax_gain.axhline(0, color="k", lw=0.6)
        ax_mse.set_title(f"teacher y = {a:g} x + h(Gx), rank k={k}")
        ax_mse.legend()
        ax_rank.legend(loc="upper left")
        name = f"fig_toy_rank_width_k{k}_a{str(a).replace('.', 'p')}"
        paths += save(fig, out_dir, name)
    data = Path(out_dir) / "fig_toy_rank_width.csv"
    with open(data, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return paths + [data]
