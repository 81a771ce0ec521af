"""Depth scaling: test perplexity against parameter count, vanilla against DCA (paper
Figure 6) on Tiny Shakespeare (char) at CPU scale.

**Claim tested.** Paper Figure 6 (LM1B, 6-42 layers, 0.6e8-1.6e8 parameters, perplexity
14-19): "DCA obtains a lower perplexity for a given parameter budget ... the 30-layer DCA model
obtains a better perplexity than the 42-layer transformer"; the improvement "is maintained with
depth" (Table 2's text). Per-point numbers are not published (plot only).

**Design.** The runs of :func:`dca_theory.lab.lm_grid.depth_specs`: vanilla and DCA at depths 2,
4, 8 (width 64, 4 heads, MLP 256, 400 steps, seeds 0, 1, 2, same data order per seed).
Reported: per depth and kind the parameter count and whole-split test perplexity (mean ± std);
the seed-paired DCA - vanilla difference per depth; the cross-depth comparisons "DCA at depth d
against vanilla at depth 2d" (paired by seed, with the parameter ratio); and the *parameter
efficiency*: the parameter count vanilla would need to match DCA's perplexity at each depth,
read off vanilla's perplexity-vs-log(parameters) curve by linear interpolation between its
depths (:func:`dca_theory.lab.statistics.params_to_reach`; ``None`` when DCA is better than
every vanilla depth, since that would need extrapolation), divided by DCA's parameter count
(its per-seed interval is in ``lm_verdicts``). Also, per depth, full DCA's
time to reach vanilla's final validation perplexity (Table 1's metric, :mod:`experiments.lm_k`).

**Command.** ``dca-theory run lm_depth`` (full; reads / fills ``experiments/results/lm_runs``;
writes ``experiments/results/lm_depth``) or ``dca-theory run lm_depth --quick`` (depths 1 and
2, width 16, 30 steps, seeds 0, 1; cache ``runs/lm_runs``). ``main(only_cached=True)`` uses
only the runs already cached and never trains. Figure: ``figures/fig_lm_depth.py``.

**Runtime.** Full from an empty cache: 6 runs x 3 seeds, ~30-40 CPU-minutes on 2 cores (depth
8 dominates); with the cache filled it only reads records (seconds). Quick from an empty cache:
~1 minute on an idle 2-core machine.

**Expected result** (measured, committed run; see ``paper/05_lm/depth.md``): DCA - vanilla
test ppl -0.095 / -0.085 / -0.090 (-0.8 to -0.9%) at depths 2 / 4 / 8, 3/3 seeds each
(p = 0.003 / 0.031 / 0.042); vanilla needs 1.20x / 1.16x DCA's parameters to match DCA at
depths 2 / 4; DCA at depth d is worse than vanilla at 2d (+0.22, +0.26 ppl).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.io import RunDir
from dca_theory.lab.lm_grid import depth_specs
from dca_theory.lab.lm_runs import ensure_run, is_cached, load_curves, ppl
from dca_theory.lab.lm_settings import DepthSettings, experiment_settings, run_cache, run_config
from dca_theory.lab.lm_tables import row_summary
from dca_theory.lab.statistics import paired, params_to_reach
from dca_theory.lab.time_to_reach import periodic_curve, time_to_reach
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_depth"
KINDS: tuple[str, ...] = ("vanilla", "dca")
PAPER_FIGURE6 = {"depths": [6, 12, 18, 24, 30, 36, 42],
                 "claim": "30-layer DCA has a lower perplexity than the 42-layer Transformer",
                 "per_point_numbers": "NOT FOUND (plot only)"}


def depth_rows(records: dict[tuple[str, int], dict]) -> dict[str, dict]:
    """Per depth with both kinds: rows and the paired DCA - vanilla test-ppl difference."""
    out = {}
    for d in sorted({d for _, d in records}):
        if all((k, d) in records for k in KINDS):
            van, dca = records[("vanilla", d)], records[("dca", d)]
            out[str(d)] = {"depth": d, "vanilla": row_summary(van), "dca": row_summary(dca),
                           "paired_test_ppl": paired(ppl(van), ppl(dca))}
    return out


def cross_depth(records: dict[tuple[str, int], dict]) -> dict[str, dict]:
    """DCA at depth d against vanilla at depth 2d (paired by seed: same data order)."""
    out = {}
    for (kind, d), dca in records.items():
        if kind == "dca" and ("vanilla", 2 * d) in records:
            van = records[("vanilla", 2 * d)]
            out[f"dca_L{d}-vanilla_L{2 * d}"] = {
                **paired(ppl(van), ppl(dca)),
                "param_ratio_dca_over_vanilla": dca["n_params"] / van["n_params"]}
    return out


def efficiency(records: dict[tuple[str, int], dict]) -> dict[str, dict]:
    """Per DCA depth: the parameters vanilla needs for DCA's mean test ppl, over DCA's."""
    van = sorted((d, r) for (k, d), r in records.items() if k == "vanilla")
    if len(van) < 1:
        return {}
    params = [r["n_params"] for _, r in van]
    curve = [float(np.mean(ppl(r))) for _, r in van]
    out = {}
    for (kind, d), r in sorted(records.items()):
        if kind != "dca":
            continue
        need = params_to_reach(params, curve, float(np.mean(ppl(r))))
        out[str(d)] = {"dca_params": r["n_params"], "vanilla_params_needed": need,
                       "param_efficiency": None if need is None else need / r["n_params"],
                       "beyond_vanilla_range": need is None}
    return out


def time_to_reach_by_depth(specs: dict, records: dict, cache: Path) -> dict[str, dict]:
    """Per depth: full DCA's time to reach vanilla's final periodic valid ppl (Table 1's
    metric, defined in :func:`dca_theory.lab.time_to_reach.time_to_reach`), from the same runs."""
    out = {}
    for d in sorted({d for _, d in records}):
        if all((k, d) in records for k in KINDS):
            van, dca = (periodic_curve(load_curves(specs[(k, d)], cache), specs[(k, d)].train.steps)
                        for k in KINDS)
            out[str(d)] = time_to_reach(van, dca, records[("vanilla", d)]["median_step_s"],
                                        records[("dca", d)]["median_step_s"])
    return out


def settings(quick: bool = False, overrides=()) -> DepthSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(DepthSettings, quick, overrides, depth_specs)


def main(quick: bool = False, out=None, overwrite: bool = False, *,
         only_cached: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    specs = depth_specs(quick, cfg)
    config = {"experiment": NAME, "quick": quick, "seeds": list(cfg.seeds),
              "runs": {f"{k}-L{d}": s.describe()
                       for (k, d), s in specs.items()}, "only_cached": only_cached}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    records, missing = {}, []
    for (kind, d), s in specs.items():
        if only_cached and not is_cached(s, cache):
            missing.append(s.key)
            continue
        records[(kind, d)] = r = ensure_run(s, cache)
        run.log(depth=d, kind=kind, key=s.key, params=r["n_params"], test_ppl=r["test_ppl"],
                valid_ppl=r["valid_ppl"], median_step_s=r["median_step_s"])
    summary = {"depths": depth_rows(records), "dca_vs_vanilla_twice_as_deep": cross_depth(records),
               "param_efficiency": efficiency(records), "paper_figure6": PAPER_FIGURE6,
               "time_to_reach_vanilla": time_to_reach_by_depth(specs, records, cache),
               "points": [{"kind": k, "depth": d, "params": r["n_params"],
                           "test_ppl_per_seed": ppl(r)} for (k, d), r in sorted(records.items())],
               "missing_runs": missing, "complete": not missing, "cache": str(cache),
               **summary_entry(overrides)}
    run.finish(summary)
    return run.path
