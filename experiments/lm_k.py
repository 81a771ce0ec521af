"""First-and-last-k DCA: perplexity, step time and time to reach the Transformer's final
perplexity (paper Table 1) on Tiny Shakespeare (char) at CPU scale.

**Claim tested.** Paper Table 1 (24-layer LM1B): Transformer 8.14 batches/s, final ppl 15.14;
1-, 2-, 4-, 8-, 16-, 24-DCA 5.62 / 5.39 / 5.01 / 4.35 / 3.86 / 3.72 batches/s, ppl 14.48 /
14.41 / 14.50 / 14.49 / 14.35 / 14.35, and normalised time to reach the Transformer's final
perplexity 0.33 / 0.33 / 0.37 / 0.47 / 0.40 / 0.39: "DCA then obtains the final perplexity of
the transformer in a third of the time" ("3x faster"), and "reducing k speeds up training while
only slightly increasing the perplexity".

**Design.** The runs of :func:`dca_theory.lab.lm_grid.k_specs` at depth 8 (width 64, 4 heads, MLP
256, 400 steps, seeds 0, 1, 2, same data order per seed): vanilla, 1-, 2-, 4-DCA and full DCA
(= 8-DCA). Reported per kind: whole-split test perplexity (mean ± std) and the paired difference
against vanilla; the step time, measured here by
:func:`dca_theory.lab.steptime.alternated_step_times` (one single-model train step per kind,
the run's config, timed alternately in one process, 15 rounds, median: the records'
grid-process times were taken under varying load and are kept as ``grid_step_time_ratio``
only; neither is the paper's TPU batches/s); and the time to reach vanilla's final perplexity
(:func:`dca_theory.lab.time_to_reach.time_to_reach`): per seed, the first step at which the
kind's periodic validation ppl curve (every 25 steps on the same 6 validation batches; linear
interpolation between evals) falls to vanilla's *last periodic* validation ppl of that seed
(step 375; the step-400 point is the whole split and is not comparable), times the kind's step
time, divided by vanilla's 375 steps times vanilla's step time. ``None`` if a seed never reaches
the target within 375 steps. Step ratios (without step time) are reported too.

**Command.** ``dca-theory run lm_k`` (full; reads / fills ``experiments/results/lm_runs``;
writes ``experiments/results/lm_k``) or ``dca-theory run lm_k --quick`` (depth 3: vanilla,
1-DCA, DCA; width 16, 30 steps, seeds 0, 1; cache ``runs/lm_runs``). ``main(only_cached=True)``
uses only the runs already cached and never trains. Figure: ``figures/fig_lm_k.py``.

**Runtime.** Full from an empty cache: 5 depth-8 runs x 3 seeds, ~40-60 CPU-minutes on 2 cores;
with the cache filled it reads records and curves and times the five step functions (~3
minutes, mostly compilation). Quick from an empty cache:
~1.5 minutes on an idle 2-core machine.

**Expected result** (measured; ``paper/05_lm/k.md``): test ppl vanilla 10.120 ± 0.142;
1-, 2-, 4-DCA and DCA 10.029 / 10.028 / 10.029 / 10.030 (each -0.09, 3/3 seeds, p = 0.02-0.04);
step time 1.25 / 1.32 / 1.30 / 1.43x vanilla's; steps to reach vanilla's final valid ppl
0.963-0.965 of vanilla's, time 1.21 / 1.27 / 1.25 / 1.37x (paper: 0.33-0.47): no "3x" speed-up
at this scale; smaller k is cheaper per step at no perplexity cost.
"""

from __future__ import annotations

from pathlib import Path

from dca_theory.io import RunDir
from dca_theory.lab.lm_grid import k_specs
from dca_theory.lab.lm_runs import ensure_run, is_cached, load_curves, ppl
from dca_theory.lab.lm_settings import KSettings, experiment_settings, run_cache, run_config
from dca_theory.lab.lm_tables import row_summary
from dca_theory.lab.statistics import paired
from dca_theory.lab.steptime import alternated_step_times
from dca_theory.lab.time_to_reach import periodic_curve, time_to_reach
from dca_theory.lm.config import ModelConfig
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_k"
STEP_TIME_REPEATS = {"full": 15, "quick": 3}
#: paper Table 1 (24-layer LM1B): speed (batches/s), normalised time to reach, final ppl
PAPER_TABLE1 = {"vanilla": {"speed": 8.14, "time": 1.00, "ppl": 15.14, "ppl_std": 0.06},
                "1-dca": {"speed": 5.62, "time": 0.33, "ppl": 14.48, "ppl_std": 0.05},
                "2-dca": {"speed": 5.39, "time": 0.33, "ppl": 14.41, "ppl_std": 0.04},
                "4-dca": {"speed": 5.01, "time": 0.37, "ppl": 14.50, "ppl_std": 0.03},
                "8-dca": {"speed": 4.35, "time": 0.47, "ppl": 14.49, "ppl_std": 0.02},
                "16-dca": {"speed": 3.86, "time": 0.40, "ppl": 14.35, "ppl_std": 0.07},
                "dca": {"speed": 3.72, "time": 0.39, "ppl": 14.35, "ppl_std": 0.00}}


def settings(quick: bool = False, overrides=()) -> KSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(KSettings, quick, overrides, k_specs)


def main(quick: bool = False, out=None, overwrite: bool = False, *,
         only_cached: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    specs = k_specs(quick, cfg)
    config = {"experiment": NAME, "quick": quick, "seeds": list(cfg.seeds),
              "runs": {k: s.describe()
                       for k, s in specs.items()}, "only_cached": only_cached,
              "step_time": "alternated single-model train steps in this process "
                            "(dca_theory.lab.steptime); the records' grid-process times too",
              "step_time_repeats": STEP_TIME_REPEATS["quick" if quick else "full"]}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    records, curves, missing = {}, {}, []
    for kind, s in specs.items():
        if only_cached and not is_cached(s, cache):
            missing.append(s.key)
            continue
        records[kind] = r = ensure_run(s, cache)
        curves[kind] = periodic_curve(load_curves(s, cache), s.train.steps)
        run.log(kind=kind, key=s.key, params=r["n_params"], test_ppl=r["test_ppl"],
                median_step_s=r["median_step_s"])
    # Step times from one process, alternated (the records' were taken under varying load).
    bench = alternated_step_times(
        {k: (ModelConfig(**records[k]["resolved_model"]), specs[k].train) for k in records},
        repeats=STEP_TIME_REPEATS["quick" if quick else "full"])
    run.log(kind="step_times", **{k: v["median_s"] for k, v in bench.items()})
    rows, reach, reach_grid = {}, {}, {}
    for kind, r in records.items():
        rows[kind] = row_summary(r) | {"step_s": bench[kind]["median_s"],
                                       "step_times_s": bench[kind]["times_s"]}
        if kind != "vanilla" and "vanilla" in records:
            rows[kind]["paired_test_ppl_vs_vanilla"] = paired(ppl(records["vanilla"]), ppl(r))
            rows[kind]["step_time_ratio"] = bench[kind]["median_s"] / bench["vanilla"]["median_s"]
            rows[kind]["grid_step_time_ratio"] = (r["median_step_s"]
                                                  / records["vanilla"]["median_step_s"])
            reach[kind] = time_to_reach(curves["vanilla"], curves[kind],
                                        bench["vanilla"]["median_s"], bench[kind]["median_s"])
            reach_grid[kind] = time_to_reach(curves["vanilla"], curves[kind],
                                             records["vanilla"]["median_step_s"],
                                             r["median_step_s"])
    summary = {"rows": rows, "time_to_reach_vanilla": reach,
               "time_to_reach_vanilla_grid_step_times": reach_grid, "paper_table1": PAPER_TABLE1,
               "curves": {k: {"steps": c[0].tolist(), "valid_ppl_mean": c[1].mean(1).tolist(),
                              "valid_ppl_per_seed": c[1].T.tolist()} for k, c in curves.items()},
               "depth": next(iter(specs.values())).model.n_layers,
               "missing_runs": missing, "complete": not missing, "cache": str(cache),
               **summary_entry(overrides)}
    run.finish(summary)
    return run.path
