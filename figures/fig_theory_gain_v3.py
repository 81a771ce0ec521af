"""Our G3: a lower bound on the gain of GRN-v3 over ResNet at equal parameter count (derived in
paper/01_theory.md section 1.9; the paper's G3 display is not recoverable), with Figure 5's
left-panel parameters (lam_min = 5, lam_max = 10, d in {100, 200, 300}).

Left: G3 against r_*. Right: G3 - G2, i.e. the extra v3 gain term c (lam_max - lam_min)^2 with
c = 1/(pi(d+2)) ("corrected") minus the extra rank the gate vectors w_t cost (Lemma C.1's v3
bound against v2's); dotted: the paper's constant 1/(pi(d+1)). It is negative for every r_* here
(-5 at r_* = 0 down to about -41 at r_* = 100, nearly independent of d because the c term is
O(1/d)): at these parameters the gates do not pay for themselves in the worst case.
"""

from __future__ import annotations

from pathlib import Path

from dca_theory.theory import gain_lower_bound

from . import style
from .fig_theory_gain import DIMS, LEFT

KIND = "theory"
NAME = "fig_g3_gain_lower_bound"


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    r, lo, hi = LEFT["r_star"], LEFT["lam_min"], LEFT["lam_max"]
    rows = []
    fig, axes = style.figure(2, height=2.5)
    for color, d in zip(style.SWEEP_COLORS, DIMS):
        g2 = gain_lower_bound("grn_v2", d, r, lo, hi)
        g3 = gain_lower_bound("grn_v3", d, r, lo, hi)
        g3p = gain_lower_bound("grn_v3", d, r, lo, hi, constant="paper")
        axes[0].plot(r, g3, color=color, label=f"G3, d={d}")
        axes[1].plot(r, g3 - g2, color=color, label=f"d={d}")
        axes[1].plot(r, g3p - g2, ":", color=color, lw=1.0)
        rows += [{"d": d, "r_star": float(x), "G2": float(a), "G3": float(b),
                  "G3_paper_constant": float(c)} for x, a, b, c in zip(r, g2, g3, g3p)]
    for ax in axes:
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set_xlabel(r"collective rank $r_*$")
    axes[0].set_ylabel("Reduction in test error (lower bound)")
    axes[0].set_title(r"G3 (ours), $\lambda_{min}=5,\ \lambda_{max}=10$")
    axes[1].set_ylabel(r"$G_3 - G_2$ (bounds)")
    axes[1].set_title("G3 - G2 (the three d curves coincide)")
    axes[1].plot([], [], "k:", lw=1.0, label=r"paper's $c=1/(\pi(d+1))$")
    axes[0].legend(loc="lower left")
    axes[1].legend(loc="lower left")
    return style.save(fig, out_dir, NAME, rows=rows)
