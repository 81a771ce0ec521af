"""Proposition 4.4: the collective rank a GRN needs to beat a ResNet of collective rank r_*,
r'_* = (r_* - d kappa^2)/(1 - kappa^2) for GRN-v1/v2 and the same with eta for GRN-v3
(clipped at 0: any rank suffices), for d = 100 and several kappa. The grey diagonal is r'_* = r_*
(no saving). The GRN-v3 curves lie on top of the GRN-v1/v2 ones: eta - kappa = O(1/d^2).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.theory import rank_savings

from . import style

KIND = "theory"
NAME = "fig_rank_savings"
D = 100
KAPPAS = (0.2, 0.5, 0.8, 0.95)
R_STAR = np.linspace(0.0, 99.0, 199)


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    rows = []
    fig, ax = style.figure(1, height=2.6)
    ax.plot(R_STAR, R_STAR, color="0.6", lw=0.8, label=r"$r'_*=r_*$")
    for color, kappa in zip(style.SWEEP_COLORS, KAPPAS):
        v12 = rank_savings("grn_v1", R_STAR, D, kappa)
        v3 = rank_savings("grn_v3", R_STAR, D, kappa)
        ax.plot(R_STAR, v12, "-", color=color, label=fr"$\kappa={kappa}$")
        ax.plot(R_STAR, v3, "--", color=color, lw=1.0)
        rows += [{"kappa": kappa, "d": D, "r_star": float(r), "r_prime_v1_v2": float(a),
                  "r_prime_v3": float(b)} for r, a, b in zip(R_STAR, v12, v3)]
    ax.plot([], [], "k--", lw=1.0, label="GRN-v3 (dashed; overlaps)")
    ax.set_xlabel(r"ResNet collective rank $r_*$")
    ax.set_ylabel(r"GRN rank needed $r'_*$")
    ax.set_title(f"Proposition 4.4, d={D} (solid: GRN-v1/v2)")
    ax.legend(loc="upper left")
    return style.save(fig, out_dir, NAME, rows=rows)
