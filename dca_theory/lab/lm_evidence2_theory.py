"""H5 of the second evidence design: the theory's prediction from each trained vanilla model's
measured rank, scored against the measured gain (``paper/05_lm/evidence_design_2.md``, "H5").

Per (corpus, width): r_* is the effective rank of the residual update, averaged over the layers
(``update_eff_rank_frac`` x width, :mod:`dca_theory.lab.branch_rank`), seed-averaged; Theorem
4.3(i) says a GRN can gain at equal parameters if r_* < ``threshold(kind, kappa, d)``, and (ii)
sizes the gain (``normalised_gain_guarantee``, 0 to 1). Kind ``grn_v2`` for ``dca_paper`` (w
frozen at 0), ``grn_v3`` for the trainable gates. The collective rank (the sum over layers) is
reported beside. Scoring: :func:`score`.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from dca_theory.theory import normalised_gain_guarantee, threshold

KIND = {"dca_paper": "grn_v2", "dca_open": "grn_v3", "dca_bias_inside": "grn_v3"}
HIT, MISS, UNEXPLAINED, CONSISTENT = "hit", "miss against", "unexplained gain", "consistent"


def prediction(kind: str, d: int, r_star: float, kappa: float) -> dict:
    """Theorem 4.3 at one cell: the threshold as a fraction of ``d``, whether ``r_star`` lies
    below it (a gain is guaranteed) and the guaranteed size (0 to 1)."""
    thr = float(threshold(kind, kappa, d))
    return {"kappa": kappa, "threshold_frac": thr / d, "r_frac": r_star / d,
            "gain_guaranteed": bool(r_star < thr),
            "guaranteed_size": float(normalised_gain_guarantee(kind, d, r_star, kappa))}


def score(guaranteed: bool, gain_resolved: bool) -> str:
    """*hit* (guaranteed, resolved), *miss against* (guaranteed, not resolved), *unexplained
    gain* (not guaranteed, resolved: no contradiction, the theorem being sufficient only),
    *consistent* (neither)."""
    if guaranteed:
        return HIT if gain_resolved else MISS
    return UNEXPLAINED if gain_resolved else CONSISTENT


def h5(ranks: dict[tuple[str, int], dict], h2_by: dict[tuple[str, str], dict],
       kappas, primary: str) -> dict:
    """``ranks[(corpus, width)]``: ``{"update_frac": [per seed], "layers": L}`` of the vanilla
    models; ``h2_by[(corpus, arm)]``: H2's per-width entries (``outcome``, ``mean``). Per cell
    and DCA arm the prediction at every kappa (the first is the headline) with the layer-mean
    and the collective rank, and the score at the headline; beside it, the Spearman
    correlation over ``primary``'s widths between the guarantee at the largest kappa and
    -mean D of ``dca_paper``."""
    from dca_theory.lab.lm_evidence2_analysis import BEATS

    cells = {}
    for (corpus, w), r in sorted(ranks.items()):
        frac = float(np.mean(r["update_frac"]))
        for arm, kind in KIND.items():
            gap = h2_by.get((corpus, arm), {}).get(str(w))
            if gap is None:
                continue
            preds = {f"{k:g}": prediction(kind, w, frac * w, k) for k in kappas}
            collective = {f"{k:g}": prediction(kind, w, frac * w * r["layers"], k)
                          for k in kappas}
            head = preds[f"{kappas[0]:g}"]
            cells[f"{corpus}/{arm}/w{w}"] = {
                "corpus": corpus, "arm": arm, "width": w, "kind": kind,
                "r_frac_mean": frac, "r_frac_per_seed": list(r["update_frac"]),
                "prediction": preds, "collective_rank_prediction": collective,
                "D_matched": {"mean": gap["mean"], "ci95": gap["ci95"],
                              "outcome": gap["outcome"]},
                "score": score(head["gain_guaranteed"], gap["outcome"] == BEATS)}
    top = f"{max(kappas):g}"
    pts = [(c["prediction"][top]["guaranteed_size"], -c["D_matched"]["mean"])
           for c in cells.values() if c["corpus"] == primary and c["arm"] == "dca_paper"]
    rho = (float(stats.spearmanr(*zip(*pts)).statistic)
           if len(pts) >= 3 and len({p[0] for p in pts}) > 1 else None)
    return {"headline_kappa": kappas[0], "cells": cells,
            "spearman_guarantee_vs_gain": {"kappa": max(kappas), "rho": rho, "n": len(pts)}}
