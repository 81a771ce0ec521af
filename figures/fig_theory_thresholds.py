"""Theorem 4.3(i): the largest collective rank, as a fraction r_*/d, below which each GRN beats
a ResNet at equal parameter count, against the task complexity kappa = lam_min/lam_max.

Solid: equations (4.1)-(4.3) (Lemma C.1 with real-valued ranks; (4.3) with the corrected
constant). Dotted: the same sufficient condition with integer ranks and the exact worst case over
GRN depths (``threshold(..., lemma="integer")``), which is much smaller at small kappa because
one extra GRN weight can cost a whole rank. (4.1)/d does not depend on d.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.theory import threshold

from . import style

KIND = "theory"
NAME = "fig_thresholds"
DIMS = (10, 100, 1000)
KAPPA = np.linspace(0.01, 1.0, 100)
PANELS = {"grn_v1": "GRN-v1 (4.1)", "grn_v2": "GRN-v2 (4.2)", "grn_v3": "GRN-v3 (4.3)"}


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    rows = []
    fig, axes = style.figure(3, height=2.3, sharey=True)
    for ax, (kind, title) in zip(axes, PANELS.items()):
        for color, d in zip(style.SWEEP_COLORS, DIMS):
            cont = threshold(kind, KAPPA, d) / d
            integer = threshold(kind, KAPPA, d, lemma="integer") / d
            ax.plot(KAPPA, cont, "-", color=color, label=f"d={d}")
            ax.plot(KAPPA, integer, ":", color=color, lw=1.1)
            rows += [{"kind": kind, "d": d, "kappa": float(k), "threshold_over_d": float(c),
                      "integer_threshold_over_d": float(i)}
                     for k, c, i in zip(KAPPA, cont, integer)]
        ax.set_title(title)
        ax.set_xlabel(r"$\kappa=\lambda_{min}/\lambda_{max}$")
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel(r"largest $r_*/d$ where the GRN wins")
    axes[0].plot([], [], "k:", lw=1.1, label="integer ranks")
    axes[0].legend(loc="lower right")
    return style.save(fig, out_dir, NAME, rows=rows)
