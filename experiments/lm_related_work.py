"""DCA against related residual schemes (paper Table 5) at CPU scale.

**Claim tested.** Paper Table 5 (6-layer LM1B): test perplexity Transformer 18.98 ± 0.01
(49.65M parameters), LAuReL-PA 18.99 ± 0.05 (49.75M), 1x1-DenseFormer 18.80 ± 0.11 (49.65M),
Hyper-Connections (dynamic) 18.65 ± 0.03 (49.68M), DCA 18.06 ± 0.01 (49.73M): DCA beats the
best prior method (Hyper-Connections) by 0.59 at a similar parameter count.

**Design.** The runs of :func:`dca_theory.lab.lm_grid.related_specs` (shared run cache): the
standard width-64, depth-4 CPU model of :mod:`dca_theory.lab.lm_runs` with ``residual`` =
vanilla, denseformer (1x1 DenseFormer: a depth-weighted average of all earlier block outputs
after every block), hyper_connections (dynamic, expansion 4, one per block), laurel_pa (rank-16
map of a learned combination of earlier states) and dca, each equal to vanilla at
initialisation (see :mod:`dca_theory.lm.baselines`), 400 steps, seeds 0, 1, 2 (same data
order: differences are paired by seed). The datasets are the module constant
``FULL_DATASETS``: Tiny Shakespeare (char), plus Penn Treebank (word) when its runs are in the
cache (the PTB rows are the last of the grid). Reported: parameters, test
perplexity per seed and mean ± std, the seed-paired difference of each method against vanilla
and of DCA against each method, with paired t-test p-values and 95% intervals.

**Command.** ``dca-theory run lm_related_work`` (full; cache ``experiments/results/lm_runs``;
writes ``experiments/results/lm_related_work``), or ``dca-theory run lm_related_work --quick``
(Tiny Shakespeare, width 16, depth 2, 30 steps, seeds 0, 1; cache ``runs/lm_runs``). Figure:
``figures/fig_lm_related_work.py``.

**Runtime.** Full, from an empty cache: 5 runs x 3 seeds per dataset, 2-4 minutes per run on 2
CPU cores, seconds on a GPU; from the filled cache: seconds (measured: 45 s wall, 4 s CPU,
under load). Quick: measured 3 min 58 s wall, 1 min 27 s CPU under load ~7 with the vanilla and
DCA runs already cached by ``lm_ablation --quick`` (3 new compilations); about 1 minute idle.

**Expected result** (measured, committed run, Tiny Shakespeare only; see
``paper/05_lm/related_work.md``): test ppl Transformer 10.468 ± 0.149, LAuReL-PA 10.413 ± 0.090,
1x1-DenseFormer 10.422 ± 0.128, Hyper-Connections 10.478 ± 0.184, DCA 10.382 ± 0.144. DCA is
lowest but its paired margins over the baselines (0.03-0.10) have p = 0.11-0.50.
"""

from __future__ import annotations

from pathlib import Path

from dca_theory.io import RunDir
from dca_theory.lab.lm_grid import RELATED_KINDS, related_specs
from dca_theory.lab.lm_runs import ensure_run
from dca_theory.lab.lm_settings import RelatedSettings, experiment_settings, run_cache, run_config
from dca_theory.lab.lm_tables import paper_summary, same_order, summarise_table
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_related_work"
KINDS: tuple[str, ...] = ("vanilla", *RELATED_KINDS, "dca")
QUICK_DATASETS: tuple[str, ...] = ("shakespeare",)
#: the datasets of the committed full run (its PTB runs were not in the cache)
FULL_DATASETS: tuple[str, ...] = ("shakespeare",)
PAIRS: list[tuple[str, str]] = [*[("vanilla", k) for k in KINDS[1:]],
                                *[(k, "dca") for k in RELATED_KINDS]]
#: paper Table 5 (6-layer LM1B): test perplexity ± std, parameters (millions)
PAPER_TABLE5 = {"vanilla": {"ppl": 18.98, "std": 0.01, "params_m": 49.65},
                "laurel_pa": {"ppl": 18.99, "std": 0.05, "params_m": 49.75},
                "denseformer": {"ppl": 18.80, "std": 0.11, "params_m": 49.65},
                "hyper_connections": {"ppl": 18.65, "std": 0.03, "params_m": 49.68},
                "dca": {"ppl": 18.06, "std": 0.01, "params_m": 49.73}}


def dataset_specs(quick: bool, datasets: tuple[str, ...] | None = None,
                  settings: RelatedSettings | None = None) -> dict[str, dict]:
    """``{dataset: {kind: RunSpec}}`` of this experiment."""
    s = settings or RelatedSettings.preset(quick)
    datasets = datasets or s.datasets
    return {d: related_specs(quick, d, s) for d in datasets}


def settings(quick: bool = False, overrides=()) -> RelatedSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(RelatedSettings, quick, overrides,
                               lambda q, s: dataset_specs(q, settings=s))


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    specs = dataset_specs(quick, settings=cfg)
    config = {"experiment": NAME, "quick": quick, "seeds": list(cfg.seeds),
              "runs": {d: {k: s.describe()
                           for k, s in by_kind.items()} for d, by_kind in specs.items()},
              "pairs": PAIRS}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    paper = paper_summary(PAPER_TABLE5, PAIRS)
    summary = {"datasets": {}, "paper_table5": paper, "cache": str(cache)}
    for data, by_kind in specs.items():
        records = {}
        for kind, s in by_kind.items():
            records[kind] = r = ensure_run(s, cache)
            run.log(dataset=data, kind=kind, key=s.key, params=r["n_params"],
                    test_ppl=r["test_ppl"], valid_ppl=r["valid_ppl"],
                    median_step_s=r["median_step_s"])
        table = summarise_table(records, PAIRS)
        table["order_vs_paper"] = same_order(table["order_by_test_ppl"], paper["order_by_ppl"])
        summary["datasets"][data] = table
    run.finish(summary | summary_entry(overrides))
    return run.path
