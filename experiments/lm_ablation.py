"""Ablation of the GRN variants and DCA (paper Table 7) on Tiny Shakespeare (char) and Penn
Treebank (word) at CPU scale.

**Claim tested.** Paper Table 7 (6-layer LM1B, 500k steps): test perplexity Transformer 18.98 ±
0.02, GRN-v1 18.80 ± 0.11, GRN-v2 18.43 ± 0.04, GRN-v3 18.41 ± 0.10, DCA 18.06 ± 0.01; each step
of generalisation (v1 -> v2 -> v3 -> three GRN-v3 per block = DCA) lowers the perplexity, DCA
by 0.92 (-4.8%) against the Transformer. Parameters 49.65M / 49.65M / 49.66M / 49.68M / 49.73M.

**Design.** The runs of :func:`dca_theory.lab.lm_grid.ablation_specs` (shared run cache): the
width-64, depth-4 pre-LN transformer of :mod:`dca_theory.lab.lm_runs` (4 heads, MLP 256, 400
steps of 16 sequences, lr 2e-3, 40 warm-up steps, AdamW as in the paper), with
``residual`` = vanilla, grn_v1, grn_v2, grn_v3 (one GRN per block) and dca (three GRN-v3 per
block plus an output GRN), seeds 0, 1, 2 (same data order for every architecture: differences
are paired by seed). At the paper's initialisation (b = 1, w = 0) with the ReLU gate, the GRN-v3
weights w get zero gradient, so GRN-v3 / DCA train as if they had GRN-v2 gates; the rows
``grn_v3_open`` / ``dca_open`` (Tiny Shakespeare only) use the ``open`` gate (same function,
derivative 1 at 0), with which w trains; the full mode includes them only if they are cached
(``OPTIONAL_FULL_KINDS``; the summary's ``left_out`` lists missing ones). Reported: whole-split
test perplexity per seed, mean ± std, seed-paired differences (each kind - vanilla, v2 - v1,
v3 - v2, DCA - v3, open - paper gate) with paired t-test p-values and 95% intervals, relative
change against vanilla (%) next to the paper's, and the parameter counts.

**Command.** ``dca-theory run lm_ablation`` (full; reads / fills the cache
``experiments/results/lm_runs``; writes ``experiments/results/lm_ablation``), or
``dca-theory run lm_ablation --quick`` (Tiny Shakespeare only, width 16, depth 2, 30 steps,
seeds 0, 1; cache ``runs/lm_runs``). Figure: ``figures/fig_lm_ablation.py``.

**Runtime.** Full, from an empty cache: 12 runs x 3 seeds; about 2-4 minutes per run on 2 CPU
cores (~40 CPU-minutes), seconds on a GPU; with the cache filled (by ``python -m
dca_theory.lab.lm_grid``) it only reads records (measured: 73 s wall, 4 s CPU, under load ~8).
Quick, from an empty cache: measured 6 min 15 s wall, 3 min 4 s CPU (7 small compilations of
~35 s each) on the 2-core machine under load ~7; expected ~1.5 minutes idle.

**Expected result** (measured, committed run; ``paper/05_lm/ablation.md``). Tiny Shakespeare test
ppl (mean ± std, 3 seeds): Transformer 10.468 ± 0.149, GRN-v1 10.466 ± 0.156, GRN-v2 10.433 ±
0.143, GRN-v3 10.440 ± 0.144, DCA 10.382 ± 0.144 (paired DCA - Transformer -0.085 ± 0.027, p =
0.031, 3/3 seeds; -0.81% against the paper's -4.85%); open gate: GRN-v3 10.535, DCA 10.411.
Penn Treebank (~458 ppl after 400 steps): all differences <= 0.3%, none with p < 0.05.
"""

from __future__ import annotations

from pathlib import Path

from dca_theory.io import RunDir
from dca_theory.lab.lm_grid import ABLATION_KINDS, OPEN_GATE_KINDS, ablation_specs
from dca_theory.lab.lm_runs import ensure_run, is_cached
from dca_theory.lab.lm_settings import (
    AblationSettings,
    experiment_settings,
    run_cache,
    run_config,
)
from dca_theory.lab.lm_tables import paper_summary, same_order, summarise_table
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_ablation"
OPEN_KINDS = tuple(f"{k}_open" for k in OPEN_GATE_KINDS)
#: rows per dataset: the open-gate runs exist for Tiny Shakespeare only (see dca_theory.lab.lm_grid)
KINDS = {"shakespeare": (*ABLATION_KINDS, *OPEN_KINDS), "ptb": ABLATION_KINDS}
#: rows a full run without overrides reads only if the background grid (``python -m
#: dca_theory.lab.lm_grid``) has cached them (it trains them late); the summary lists those
#: left out. Quick mode and runs with ``--set`` train them.
OPTIONAL_FULL_KINDS: tuple[str, ...] = OPEN_KINDS
QUICK_DATASETS: tuple[str, ...] = ("shakespeare",)
FULL_DATASETS: tuple[str, ...] = ("shakespeare", "ptb")
#: seed-paired differences ``b - a`` reported for every dataset
PAIRS: list[tuple[str, str]] = [
    *[("vanilla", k) for k in (*ABLATION_KINDS[1:], *OPEN_KINDS)],
    ("grn_v1", "grn_v2"), ("grn_v2", "grn_v3"), ("grn_v3", "dca"),
    ("grn_v3", "grn_v3_open"), ("dca", "dca_open"), ("grn_v3_open", "dca_open"),
]
#: paper Table 7 (6-layer LM1B): test perplexity ± std, parameters (millions)
PAPER_TABLE7 = {"vanilla": {"ppl": 18.98, "std": 0.02, "params_m": 49.65},
                "grn_v1": {"ppl": 18.80, "std": 0.11, "params_m": 49.65},
                "grn_v2": {"ppl": 18.43, "std": 0.04, "params_m": 49.66},
                "grn_v3": {"ppl": 18.41, "std": 0.10, "params_m": 49.68},
                "dca": {"ppl": 18.06, "std": 0.01, "params_m": 49.73}}


def dataset_specs(quick: bool, settings: AblationSettings | None = None) -> dict[str, dict]:
    """``{dataset: {kind: RunSpec}}`` of this experiment (the open-gate rows on Tiny
    Shakespeare only)."""
    s = settings or AblationSettings.preset(quick)
    return {d: {k: spec for k, spec in ablation_specs(quick, d, s).items()
                if k in s.kinds or d == "shakespeare"}
            for d in s.datasets}


def settings(quick: bool = False, overrides=()) -> AblationSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(AblationSettings, quick, overrides, dataset_specs)


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    specs = dataset_specs(quick, cfg)
    config = {"experiment": NAME, "quick": quick, "seeds": list(cfg.seeds),
              "runs": {d: {k: s.describe()
                           for k, s in by_kind.items()} for d, by_kind in specs.items()},
              "pairs": PAIRS}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    paper = paper_summary(PAPER_TABLE7, PAIRS)
    summary = {"datasets": {}, "paper_table7": paper, "cache": str(cache), "left_out": []}
    for data, by_kind in specs.items():
        records = {}
        for kind, s in by_kind.items():
            optional = not quick and not overrides and kind in OPTIONAL_FULL_KINDS
            if optional and not is_cached(s, cache):
                summary["left_out"].append({"dataset": data, "kind": kind, "key": s.key})
                continue
            records[kind] = r = ensure_run(s, cache)
            run.log(dataset=data, kind=kind, key=s.key, params=r["n_params"],
                    test_ppl=r["test_ppl"], valid_ppl=r["valid_ppl"],
                    median_step_s=r["median_step_s"])
        table = summarise_table(records, PAIRS)
        table["order_vs_paper"] = same_order(
            [k for k in table["order_by_test_ppl"] if k in PAPER_TABLE7], paper["order_by_ppl"])
        summary["datasets"][data] = table
    if summary["left_out"]:
        print(f"{NAME}: left out {len(summary['left_out'])} uncached open-gate runs; train them "
              "with: python -m dca_theory.lab.lm_grid", flush=True)
    run.finish(summary | summary_entry(overrides))
    return run.path
