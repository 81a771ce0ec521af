"""D beside the branches' effective rank: the (seed, width) cells and the pre-stated statistic
shared by :mod:`experiments.lm_rank` (400-step runs) and :mod:`experiments.lm_evidence_rank`
(the pre-registered grid's near-converged runs).

**Statistic.** ``primary``: the Pearson correlation over the (seed, width) cells between
D = 100 (ln ppl_DCA - ln ppl_vanilla) and the vanilla model's effective-rank fraction of the
residual update (mean over layers of effective rank / width), with a Fisher-z 95 % interval.
The bottleneck argument predicts r > 0 (a lower rank fraction, a more negative D): "tracks" if
the interval lies above 0, "contradicts" if below, else "inconclusive"; r with each cell left
out in turn shows how much one cell carries. Beside it, seed-clustered slopes of D and of each
sublayer's rank fraction against log2(width), and DCA's rank fraction minus vanilla's; and,
descriptive (not pre-stated), the same correlations within widths (:func:`within_width`), which
separate "D follows the rank" from "both change with width".
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from dca_theory.lab.branch_rank import SUBLAYERS
from dca_theory.lab.lm_runs import ppl
from dca_theory.lab.statistics import log_ppl_gap, seed_clustered_slope

#: the two arms whose cells are compared (``records`` keys ``(kind, width)``)
KINDS: tuple[str, ...] = ("vanilla", "dca")
#: the rank fraction the primary statistic sets against D
PRIMARY_MEASURE = "update_eff_rank_frac"


def _layer_mean(layers: list[dict], key: str) -> float:
    return float(np.mean([layer[key] for layer in layers]))


def cells(records: dict, profiles: dict) -> list[dict]:
    """One row per (seed, width): D and both models' layer-mean rank fractions."""
    rows = []
    for w in sorted({w for _, w in records}):
        van, dca = records[("vanilla", w)], records[("dca", w)]
        gaps = log_ppl_gap(ppl(van), ppl(dca))
        for i, seed in enumerate(van["seeds"]):
            row = {"width": w, "seed": seed, "D": float(gaps[i])}
            for kind in KINDS:
                for part in SUBLAYERS:
                    key = f"{part}_eff_rank_frac"
                    row[f"{kind}_{key}"] = _layer_mean(profiles[(kind, w)][i], key)
            rows.append(row)
    return rows


def correlation(x, y, level: float = 0.95) -> dict:
    """Pearson r with a Fisher-z interval (needs >= 4 points), and Spearman's rho."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    r = float(stats.pearsonr(x, y).statistic)
    out = {"pearson_r": r, "n": int(x.size), "spearman_rho":
           float(stats.spearmanr(x, y).statistic), "ci": None, "verdict": "inconclusive"}
    if x.size >= 4 and abs(r) < 1:
        half = stats.norm.ppf(0.5 + level / 2) / np.sqrt(x.size - 3)
        lo, hi = np.tanh(np.arctanh(r) - half), np.tanh(np.arctanh(r) + half)
        out["ci"] = [float(lo), float(hi)]
        out["verdict"] = "tracks" if lo > 0 else "contradicts" if hi < 0 else "inconclusive"
    if x.size >= 4:  # how much one point carries: r with each point left out in turn
        keep = ~np.eye(x.size, dtype=bool)
        loo = [float(stats.pearsonr(x[k], y[k]).statistic) for k in keep]
        out["leave_one_out_r"] = {"min": float(np.nanmin(loo)), "max": float(np.nanmax(loo)),
                                 "all": loo}
    return out


def within_width(x, y, widths, level: float = 0.95) -> dict:
    """Pearson r after removing each width's mean from ``x`` and ``y`` (the partial correlation
    given width), with a Fisher-z interval on ``n - (k - 1) - 3`` degrees of freedom for ``k``
    widths (each removed mean costs one)."""
    x, y, widths = np.array(x, float), np.array(y, float), np.asarray(widths)  # copies
    for w in np.unique(widths):
        at = widths == w
        x[at], y[at] = x[at] - x[at].mean(), y[at] - y[at].mean()
    k = np.unique(widths).size
    dof = x.size - (k - 1) - 3
    r = float(stats.pearsonr(x, y).statistic)
    out = {"pearson_r": r, "n": int(x.size), "widths": int(k), "ci": None}
    if dof >= 1 and abs(r) < 1:
        half = stats.norm.ppf(0.5 + level / 2) / np.sqrt(dof)
        out["ci"] = [float(np.tanh(np.arctanh(r) - half)), float(np.tanh(np.arctanh(r) + half))]
    return out


def analyse(rows: list[dict]) -> dict:
    """The pre-stated statistic and the descriptive slopes and differences (module doc)."""
    x = [np.log2(r["width"]) for r in rows]
    seeds = [r["seed"] for r in rows]
    out: dict = {"primary": {"measure": f"vanilla_{PRIMARY_MEASURE}",
                             **correlation([r[f"vanilla_{PRIMARY_MEASURE}"] for r in rows],
                                           [r["D"] for r in rows])}}
    slopes = {"D": [r["D"] for r in rows]}
    for kind in KINDS:
        for part in SUBLAYERS:
            slopes[f"{kind}_{part}_eff_rank_frac"] = [r[f"{kind}_{part}_eff_rank_frac"]
                                                      for r in rows]
    out["slope_vs_log2_width"] = {}
    for name, y in slopes.items():
        try:
            out["slope_vs_log2_width"][name] = seed_clustered_slope(x, y, seeds)
        except ValueError:  # one seed or one width: no slope interval
            out["slope_vs_log2_width"][name] = None
    widths = [r["width"] for r in rows]
    if len(set(widths)) < len(rows):  # at least one width with two seeds
        d = [r["D"] for r in rows]
        out["within_width"] = {
            "D~vanilla_update": within_width([r[f"vanilla_{PRIMARY_MEASURE}"] for r in rows],
                                             d, widths),
            "D~dca_minus_vanilla_update": within_width(
                [r[f"dca_{PRIMARY_MEASURE}"] - r[f"vanilla_{PRIMARY_MEASURE}"] for r in rows],
                d, widths)}
    out["dca_minus_vanilla_frac"] = {
        part: float(np.mean([r[f"dca_{part}_eff_rank_frac"] - r[f"vanilla_{part}_eff_rank_frac"]
                             for r in rows])) for part in SUBLAYERS}
    return out
