"""Figure 5 of the paper: lower bounds on the gains G1 (GRN-v1) and G2 (GRN-v2) over ResNet at
equal parameter count (Theorem 4.3(ii)), with the paper's parameters.

Left: lam_min = 5, lam_max = 10, r_* in [0, 100], d in {100, 200, 300}.
Right: lam_max = 10, r_* = 50, lam_min in [2, 10].
Expected: left from 7500 (d = 300, r_* = 0) down to about -6143 (G2, d = 100, r_* = 100);
right peaking at 25000 (d = 300, lam_min = 10).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.theory import gain_lower_bound

from . import style

KIND = "theory"
NAME = "fig5_gain_lower_bounds"
DIMS = (100, 200, 300)
LEFT = {"lam_min": 5.0, "lam_max": 10.0, "r_star": np.linspace(0.0, 100.0, 201)}
RIGHT = {"lam_max": 10.0, "r_star": 50.0, "lam_min": np.linspace(2.0, 10.0, 161)}
CURVES = {"grn_v1": ("G1", "-"), "grn_v2": ("G2", "--")}


def curves(kinds=("grn_v1", "grn_v2"), **kwargs) -> list[dict]:
    """One row per point: panel, kind, d, x, gain (the data behind the figure)."""
    rows = []
    for kind in kinds:
        for d in DIMS:
            left = gain_lower_bound(kind, d, LEFT["r_star"], LEFT["lam_min"], LEFT["lam_max"],
                                    **kwargs)
            right = gain_lower_bound(kind, d, RIGHT["r_star"], RIGHT["lam_min"],
                                     RIGHT["lam_max"], **kwargs)
            rows += [{"panel": "left", "kind": kind, "d": d, "x": float(x), "gain": float(g)}
                     for x, g in zip(LEFT["r_star"], left)]
            rows += [{"panel": "right", "kind": kind, "d": d, "x": float(x), "gain": float(g)}
                     for x, g in zip(RIGHT["lam_min"], right)]
    return rows


def draw(rows: list[dict], labels: dict[str, tuple[str, str]], title: str):
    fig, axes = style.figure(2, height=2.6)
    for ax, panel in zip(axes, ("left", "right")):
        for kind, (label, ls) in labels.items():
            for color, d in zip(style.SWEEP_COLORS, DIMS):
                pts = [(r["x"], r["gain"]) for r in rows
                       if r["panel"] == panel and r["kind"] == kind and r["d"] == d]
                x, y = np.array(pts).T
                ax.plot(x, y, ls, color=color, label=f"{label}, d={d}")
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set_ylabel("Reduction in test error (lower bound)")
    axes[0].set_xlabel(r"collective rank $r_*$")
    axes[0].set_title(r"$\lambda_{min}=5,\ \lambda_{max}=10$")
    axes[1].set_xlabel(r"$\lambda_{min}$")
    axes[1].set_title(r"$\lambda_{max}=10,\ r_*=50$")
    axes[0].legend(ncol=2, loc="lower left")
    fig.suptitle(title, fontsize=8)
    return fig


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    rows = curves()
    fig = draw(rows, CURVES, "Figure 5: lower bounds on the gains of GRN-v1/v2 over ResNet "
                             "(Theorem 4.3(ii))")
    return style.save(fig, out_dir, NAME, rows=rows)
