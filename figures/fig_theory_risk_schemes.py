"""Excess risk against parameter count for every scheme with a theory, on one target family:
A = I + U diag(lam) U^T, d = 12, U (d×6) Haar-random with seed 0, lam evenly spread in [1, 4];
T = 2 layers, collective rank r_* in RANK_GRID (split as evenly as the layers allow).

base (rank min_t r_t = r_* // T), res, GRN-v1 and mHC (n = 4, static, streams summed) are exact;
GRN-v2 is the best value of its search; GRN-v3 is Theorem 4.2's bound. AttnRes: the band runs
from its lower bound (d - r_* - rank(A - I))_+/8 to the q = 0 closed form tail_r(A - I/(T+1));
markers are the best networks found by L-BFGS (Monte Carlo risk on fresh samples; see
:mod:`dca_theory.theory.rivals`). Parameters follow §4.2's count (Lemma C.1): 2 d r_* plus the
combiners' (AttnRes d per layer, mHC n^2 + 2n per layer). Runtime: about 20 s on one core.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory import schemes
from dca_theory.theory import excess_risk, excess_risk_bound, param_count
from dca_theory.theory import rivals as RV

from . import style

KIND = "theory"
NAME = "fig_risk_schemes"
D, K, T, SEED, HC_STREAMS = 12, 6, 2, 0, 4
LAM_MIN, LAM_MAX = 1.0, 4.0
RANK_GRID = (2, 4, 6, 8, 10)
SEARCH_RANKS = (2, 6, 10)  # AttnRes's numerical optimum (a few seconds each)


def sample_target(d: int = D, k: int = K, seed: int = SEED) -> np.ndarray:
    rng = np.random.default_rng(seed)
    Q, R = np.linalg.qr(rng.standard_normal((d, d)))
    U = (Q * np.sign(np.diag(R)))[:, :k]  # Haar measure
    return np.eye(d) + (U * np.linspace(LAM_MIN, LAM_MAX, k)) @ U.T


def _split(r: int) -> tuple[int, ...]:
    return tuple(r // T + (t < r % T) for t in range(T))


def compute() -> list[dict]:
    A, rows = sample_target(), []
    rng = np.random.default_rng(SEED)
    for r in RANK_GRID:
        def add(kind, value, params, how):
            rows.append({"kind": kind, "r_star": r, "params": int(params), "excess_risk": value,
                         "how": how})

        add("base", excess_risk("base", A, r // T), param_count("base", D, r, T), "exact")
        for kind in ("res", "grn_v1", "grn_v2"):
            value, info = excess_risk(kind, A, r, return_info=True)
            add(kind, value, param_count(kind, D, r, T), "exact" if info["exact"] else "best found")
        add("grn_v3", excess_risk_bound("grn_v3", A, r), param_count("grn_v3", D, r, T),
            "Thm 4.2 bound")
        ar_params = 2 * D * r + schemes.network_combiner_params("attn_res", T, D,
                                                                convention="paper")
        add("attn_res", RV.attn_res_mean_risk(A, r, T), ar_params, "q=0 closed form")
        add("attn_res", RV.attn_res_lower_bound(A, r, T), ar_params, "lower bound")
        if r in SEARCH_RANKS:
            found = RV.attn_res_search(A, _split(r), rng, restarts=1, n_fit=128, maxiter=60)
            add("attn_res", found["value"], ar_params, "best found")
        add("mhc", RV.mhc_excess_risk(A, r, HC_STREAMS), RV.mhc_params(D, r, T, HC_STREAMS),
            "exact")
    return rows


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    rows = compute()
    fig, ax = style.figure(1, width=4.4, height=3.0)

    def curve(kind, how):
        pts = [p for p in rows if p["kind"] == kind and p["how"] == how]
        return np.array([p["params"] for p in pts]), np.array([p["excess_risk"] for p in pts])

    for kind, how in (("base", "exact"), ("res", "exact"), ("grn_v1", "exact"),
                      ("grn_v2", "best found"), ("grn_v3", "Thm 4.2 bound"), ("mhc", "exact")):
        x, y = curve(kind, how)
        label = style.scheme_label(kind) + (f" (n={HC_STREAMS})" if kind == "mhc" else "")
        ax.plot(x, y, "o-" if how != "Thm 4.2 bound" else "--", ms=2.5,
                color=style.scheme_color(kind), label=f"{label}: {how}")
    color = style.scheme_color("attn_res")
    x, upper = curve("attn_res", "q=0 closed form")
    _, lower = curve("attn_res", "lower bound")
    ax.fill_between(x, np.maximum(lower, 1e-2), upper, color=color, alpha=0.2, lw=0,
                    label="AttnRes: lower bound to q=0")
    ax.plot(x, upper, "-", color=color, label="AttnRes: q=0 closed form")
    xs, ys = curve("attn_res", "best found")
    ax.plot(xs, ys, "s", ms=3.5, color=color, label="AttnRes: best found")
    ax.set_yscale("log")
    ax.set_ylim(1e-2, 3e2)
    ax.set_xlabel("number of parameters")
    ax.set_ylabel(r"excess risk $\|A-\hat A\|_F^2$ (or $E\|Ax-F(x)\|^2$)")
    ax.set_title(rf"d={D}, T={T}, A-I of rank {K}, spectrum in [{LAM_MIN:g}, {LAM_MAX:g}]")
    ax.legend(fontsize=5.5, loc="upper right", ncol=2)
    return style.save(fig, out_dir, NAME, rows=rows)
