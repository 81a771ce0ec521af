"""Width scaling of DCA's gain (paper Table 2) with the per-layer Jacobian rank the reviewers
asked for, on Tiny Shakespeare (char) at CPU scale.

**Claim tested.** Paper Table 2 (12-layer LM1B): DCA's perplexity gain shrinks with width,
-2.82 (45.75 -> 42.94, -6.2%) at width 64, -1.57 (-6.2%) at 192, -1.03 (-5.5%) at 384,
-0.59 (-4.0%) at 768, -0.39 (-2.9%) at 1024, "consistent with our theoretical results" (the
gain bound of Theorem 4.3(ii) falls as the collective rank rises). The authors argued in review
that a layer's bottleneck rank equals the width, without measuring it.

**Design.** The runs of :func:`dca_theory.lab.lm_grid.width_specs`: vanilla and DCA at widths 16,
32, 64 (depth 4, 4 heads, MLP 4x width, 400 steps, seeds 0, 1, 2, same data order per
seed). Reported per width: whole-split test perplexity (mean ± std), the seed-paired DCA -
vanilla difference (absolute and relative, paired t-test, 95% CI) and a regression of the
per-seed relative difference on log2(width) (does the relative gain shrink?). **Beyond the
paper:** for seed 0 of every width and both kinds, the per-token Jacobian of every block's
residual branch (:mod:`dca_theory.lab.jacobian_rank`) at 32 random validation positions:
numerical rank at the float32 default tolerance and at rtol 1e-2, effective and stable rank, as
fractions of the width. The theory overlay is Theorem 4.3(ii)'s G2 bound,
``dca_theory.theory.gain_lower_bound("grn_v2", d, r_*, lam_min=kappa, lam_max=1)`` normalised
by its value at r_* = 0 and clipped at 0
(:func:`dca_theory.theory.normalised_gain_guarantee`), at d = width and r_* = the
vanilla model's *collective* rank (sum over the 4 layers). GRN-v2 because DCA with the
paper's ReLU gate trains exactly as GRN-v2 gates (w gets zero gradient at w = 0). For
r_* >= d the theory predicts no gain (a ResNet of collective rank d already fits any A
exactly), so the prediction is 0 there. kappa (the task's eigenvalue
ratio) is unknown for text; 0.5 (Figure 5's lam_min/lam_max) is the headline, 0.3 and 0.8 are
reported too.

**Command.** ``dca-theory run lm_width`` (full; reads / fills ``experiments/results/lm_runs``;
writes ``experiments/results/lm_width``) or ``dca-theory run lm_width --quick`` (widths 8 and
16, depth 2, 30 steps, seeds 0, 1; cache ``runs/lm_runs``). ``main(only_cached=True)``
summarises only the runs already in the cache (listing the missing ones) and never trains.
Figure: ``figures/fig_lm_width.py``.

**Runtime.** Full from an empty cache: 6 runs x 3 seeds, ~15-25 CPU-minutes on 2 cores, a few
minutes on a GPU (width 128 would add two ~7-minute runs: ``--set widths=16,32,64,128``); with
the cache filled only the rank analysis runs: ~1 CPU-minute (6 models x 4 layers x 32
Jacobians). Quick from an empty cache: ~1.5 minutes on an idle 2-core machine.

**Expected result** (measured, widths 16-64; see
``paper/05_lm/width.md``): DCA - vanilla test ppl -0.124 / -0.075 / -0.085 (-0.86 / -0.61 /
-0.81%) at widths 16 / 32 / 64, 3/3 seeds each (p = 0.03 / 0.05 / 0.03); no trend of the
relative gain with width (slope +0.02 ± 0.11 points per doubling, p = 0.84). Every layer's
branch Jacobian has rank exactly D - 1 (LayerNorm removes the all-ones direction); collective
rank ~3.9 x width, outside the theorem's r_* < d, so the G2 guarantee is 0 at every width.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import stats

from dca_theory.io import RunDir
from dca_theory.lab.jacobian_rank import RTOL, model_rank_profile
from dca_theory.lab.lm_grid import width_specs
from dca_theory.lab.lm_runs import cached_corpus, ensure_run, is_cached, load_models, ppl
from dca_theory.lab.lm_settings import WidthSettings, experiment_settings, run_cache, run_config
from dca_theory.lab.lm_tables import row_summary
from dca_theory.lab.statistics import paired
from dca_theory.overrides import run_dir, summary_entry
from dca_theory.theory import normalised_gain_guarantee

NAME = "lm_width"
KINDS: tuple[str, ...] = ("vanilla", "dca")
#: paper Table 2 (12-layer LM1B): width -> (Transformer ppl, std, DCA ppl, std)
PAPER_TABLE2 = {64: (45.75, 0.06, 42.94, 0.07), 192: (25.49, 0.15, 23.92, 0.04),
                384: (18.86, 0.04, 17.83, 0.04), 768: (14.70, 0.04, 14.11, 0.07),
                1024: (13.61, 0.01, 13.22, 0.06)}
RANK_POSITIONS = {False: 32, True: 6}  # validation positions per model (full / quick)
RANK_SEED_INDEX = 0  # the rank analysis uses seed 0's trained models only
THEORY_KIND = "grn_v2"
THEORY_KAPPAS: tuple[float, ...] = (0.3, 0.5, 0.8)
HEADLINE_KAPPA = 0.5
#: rank measures whose collective value (sum over layers) is set against the theory
RANK_MEASURES: tuple[str, ...] = ("rank_eps_mean", "rank_rtol_mean", "effective_rank_mean",
                                  "stable_rank_mean")


def paper_rows() -> dict:
    """Table 2 with the absolute and relative DCA - Transformer differences."""
    return {str(w): {"vanilla": v, "vanilla_std": vs, "dca": d, "dca_std": ds,
                     "diff": d - v, "relative_pct": 100.0 * (d / v - 1.0)}
            for w, (v, vs, d, ds) in PAPER_TABLE2.items()}


def width_rows(records: dict[tuple[str, int], dict]) -> dict[str, dict]:
    """Per width with both kinds: rows, paired DCA - vanilla test-ppl difference (absolute and
    per-seed relative, %)."""
    out = {}
    for w in sorted({w for _, w in records}):
        if not all((k, w) in records for k in KINDS):
            continue
        van, dca = (records[(k, w)] for k in KINDS)
        rel = 100.0 * (np.asarray(ppl(dca)) / np.asarray(ppl(van)) - 1.0)
        out[str(w)] = {"width": w, "vanilla": row_summary(van), "dca": row_summary(dca),
                       "paired_test_ppl": paired(ppl(van), ppl(dca)),
                       "relative_pct": paired(np.zeros_like(rel), rel),  # one-sample t-test
                       "param_overhead_pct": 100.0 * (dca["n_params"] / van["n_params"] - 1)}
    return out


def width_trend(rows: dict[str, dict]) -> dict:
    """Least-squares slope of the per-seed relative difference (%) on log2(width): a positive
    slope with a small p-value means the (negative) gain shrinks with width, as in Table 2."""
    x, y = [], []
    for r in rows.values():
        for v in r["relative_pct"]["per_seed"]:
            x.append(np.log2(r["width"]))
            y.append(v)
    if len(set(x)) < 2:
        return {"slope_pct_per_doubling": None, "p_value": None, "n_points": len(x)}
    fit = stats.linregress(x, y)
    means = [r["relative_pct"]["mean"] for r in rows.values()]
    return {"slope_pct_per_doubling": float(fit.slope), "stderr": float(fit.stderr),
            "p_value": float(fit.pvalue), "n_points": len(x),
            "gain_shrinks_monotonically": bool(np.all(np.diff(means) > 0))}


def theory_points(ranks: dict[str, dict]) -> dict[str, dict]:
    """Per width: the vanilla model's collective rank / width for each measure and the
    normalised G2 prediction at it, for each kappa."""
    out = {}
    for w, by_kind in ranks.items():
        if "vanilla" not in by_kind:
            continue
        layers, d = by_kind["vanilla"], int(w)
        entry = {}
        for m in RANK_MEASURES:
            r_star = float(sum(layer[m] for layer in layers))
            gains = {str(k): normalised_gain_guarantee(THEORY_KIND, d, r_star, k)
                     for k in THEORY_KAPPAS}
            entry[m] = {"collective_rank": r_star, "collective_frac": r_star / d,
                        "guaranteed_gain_norm": gains}
        out[w] = entry
    return out


def _log_rank(run, kind, layers):
    for layer in layers:  # each layer's stats include its width
        run.log(kind=kind, **{k: v for k, v in layer.items() if k != "mean_spectrum"})


def settings(quick: bool = False, overrides=()) -> WidthSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(WidthSettings, quick, overrides, width_specs)


def main(quick: bool = False, out=None, overwrite: bool = False, *,
         only_cached: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    specs = width_specs(quick, cfg)
    config = {"experiment": NAME, "quick": quick, "seeds": list(cfg.seeds),
              "runs": {f"{k}-w{w}": s.describe()
                       for (k, w), s in specs.items()},
              "rank": {"positions": RANK_POSITIONS[quick], "seed_index": RANK_SEED_INDEX,
                       "rtol": RTOL, "split": "valid"},
              "theory": {"kind": THEORY_KIND, "kappas": THEORY_KAPPAS,
                         "headline_kappa": HEADLINE_KAPPA}, "only_cached": only_cached}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    records, missing = {}, []
    for (kind, w), s in specs.items():
        if only_cached and not is_cached(s, cache):
            missing.append(s.key)
            continue
        records[(kind, w)] = r = ensure_run(s, cache)
        run.log(width=w, kind=kind, key=s.key, params=r["n_params"], test_ppl=r["test_ppl"],
                valid_ppl=r["valid_ppl"])
    rows = width_rows(records)
    corpus = cached_corpus(cfg.train.data)
    ranks: dict[str, dict] = {}
    for (kind, w), s in specs.items():
        if (kind, w) not in records:
            continue
        model = load_models(s, cache)[RANK_SEED_INDEX]
        layers = model_rank_profile(model, corpus.valid, s.train.seq_len, RANK_POSITIONS[quick])
        ranks.setdefault(str(w), {})[kind] = layers
        _log_rank(run, kind, layers)
    summary = {"widths": rows, "trend": width_trend(rows), "ranks": ranks,
               "theory": theory_points(ranks), "paper_table2": paper_rows(),
               "missing_runs": missing, "complete": not missing, "cache": str(cache),
               **summary_entry(overrides)}
    run.finish(summary)
    return run.path
