r"""Second pre-registered evidence design: every arm at its own learning rate, the GRN-v3 gate
on language, width 128, and the theory's prediction scored.

**Claim tested.** Paper Table 2 and §4 (H1: DCA's gain shrinks as width grows; H2: it beats a
vanilla model with the same non-embedding parameters), the gate and the tokenisation (H3),
which GRN-v3 gate gives DCA the lowest perplexity on language (H4, whose rule picks the LM's
default gate), and Theorem 4.3's prediction from the vanilla models' measured rank (H5).

**Design** (fixed in ``paper/05_lm/evidence_design_2.md`` before any run; settings and parts in
:mod:`dca_theory.lab.lm_evidence2`, runs in :mod:`dca_theory.lab.lm_evidence2_runs`, rules in
:mod:`dca_theory.lab.lm_evidence2_analysis` and :mod:`dca_theory.lab.lm_evidence2_theory`).
PTB-char, pre-LN depth 4, 4 heads, MLP 4x width, widths 16, 32, 64 (every arm) and 128 (the
core arms and H4's gate); arms vanilla, vanilla_matched, dca_paper, dca_open, dca_bias_inside;
32 x 64 tokens x 4000 steps = 8.19M tokens per run; fresh seeds 100-111 (12 / 12 / 8 / 4 seeds
for the core arms at widths 16 / 32 / 64 / 128, 8 for the other gates). Every arm at its own
rate: a sweep per arm, width and corpus (1000 steps, seeds 100 and 101, starting at half, once
and twice the first design's best rate, extended by doubling or halving at most 4 times until
the best is interior, else flagged ``at_grid_edge``), checked at the full budget at width 32
(part B). Beside it, dca_paper at vanilla's rate (6 seeds). Secondary: ``python-stdlib-bpe`` at
width 32, five arms, 8 seeds; related work (Attention Residuals, mHC, MUDDFormer, value
residuals) at width 32 on PTB-char, 8 seeds, each at its own rate.

**Command.** ``DCA_DATA_DIR=../shared/data dca-theory run lm_evidence_2`` runs parts A-G in
order, resumably (finished runs stay in ``experiments/results/lm_runs``); a sitting runs a
prefix with ``--set parts=A,B --out experiments/results/lm_evidence_2 --overwrite`` (``--out``
keeps the committed cache; ``paper/05_lm/evidence_result_2.md`` lists the commands per part).
``--quick``: widths 8 and 16, one layer, two gates, one related arm, two seeds, 12 steps.
``main(only_cached=True)`` summarises what is cached and lists the missing runs.

**Runtime** (the design's cost table): about 38-40 CPU-hours for parts A-G on the 2-core
machine, parts A-D about 21. Quick: 8 tiny runs, 67 s at a load average of 7-8 on the
2-core machine, 116 s at 11 (about 65 CPU-seconds, nearly all compilation).

**Expected result.** Not known before the runs; the design states each rule's outcomes.
"""

from __future__ import annotations

from pathlib import Path

from dca_theory.io import RunDir
from dca_theory.lab import lm_evidence2 as L
from dca_theory.lab import lm_evidence2_analysis as A2
from dca_theory.lab.lm_evidence2_runs import Grid2
from dca_theory.lab.lm_evidence2_theory import h5
from dca_theory.lab.lm_evidence_analysis import related
from dca_theory.lab.lm_settings import experiment_settings, run_cache, run_config
from dca_theory.lab.lm_tables import row_summary
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_evidence_2"


def settings(quick: bool = False, overrides=()) -> L.Evidence2Settings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(L.Evidence2Settings, quick, overrides, L.validate)


def _rows(grid: Grid2, data: str) -> dict:
    return {f"{arm}-w{w}": {**row_summary(r), "lr": grid.specs[data][(arm, w)].train.lr,
                            "d_mlp": grid.specs[data][(arm, w)].model.d_mlp,
                            "code": r.get("environment", {}).get("git")}
            for (arm, w), r in grid.records.get(data, {}).items()}


def code_versions(grid: Grid2) -> dict:
    """Per corpus and width, the code versions (git) its runs were trained with: the design
    never mixes them inside one width's arms, so more than one is flagged."""
    out = {}
    for data, recs in grid.records.items():
        for w in sorted({w for _, w in recs}):
            found = sorted({str(r.get("environment", {}).get("git")) for (a, v), r in
                            recs.items() if v == w})
            out[f"{data}/w{w}"] = {"versions": found, "mixed": len(found) > 1}
    return out


def analyse(grid: Grid2) -> dict:
    """Every registered statistic the cached runs allow (each waits for its runs)."""
    cfg, primary = grid.cfg, grid.cfg.train.data
    recs = grid.records.get(primary, {})
    dca_arms = [L.arm_of(g) for g in cfg.gates]
    wide_seeds = cfg.pool(min(cfg.core_seeds[len(cfg.widths):], default=2))
    out = {"H1": A2.h1(recs, cfg.widths, cfg.wide_widths, cfg.pool(cfg.common_seeds),
                       wide_seeds),
           "H2": {arm: A2.h2(recs, arm, cfg.widths) for arm in dca_arms},
           "H4": grid.h4(),
           "shared_rate": A2.shared_rate(recs, grid.shared, cfg.widths,
                                         cfg.pool(cfg.shared_seeds)),
           "secondary": {}}
    h2_by = {(primary, arm): out["H2"][arm] for arm in dca_arms}
    for data in cfg.secondary_data:
        sec, w = grid.records.get(data, {}), cfg.secondary_width
        out["secondary"][data] = {
            "H2": {arm: A2.h2(sec, arm, (w,)) for arm in dca_arms},
            "H4_pairs": A2.h4(sec, cfg.gates, (w,), cfg.pool(cfg.secondary_seeds))
            | {"enters_the_rule": False}}
        h2_by |= {(data, arm): out["secondary"][data]["H2"][arm] for arm in dca_arms}
    if "bias_inside" in cfg.gates:
        out["H3"] = A2.h3({d: grid.records.get(d, {}) for d in (primary, *cfg.secondary_data)},
                          cfg.secondary_width)
    ran = [a for a in cfg.related_arms if (a, cfg.related_width) in recs]
    out["related"] = related(recs, ran, bases=("vanilla", "dca_paper")) if ran else {}
    out["H5"] = h5(grid.ranks(), h2_by, cfg.kappas, primary)
    return out


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=(), *,
         only_cached: bool = False, train=None, rank_of=None) -> Path:
    """``train`` / ``rank_of`` replace the trainer and the rank measurement (tests)."""
    cfg = settings(quick, overrides)
    config = {"experiment": NAME, "quick": quick, "settings": cfg, "only_cached": only_cached}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    grid = Grid2(cfg, quick, cache, log=run.log, only_cached=only_cached, train=train,
                 rank_of=rank_of)
    grid.run()
    summary = {"parts_run": list(cfg.parts), "primary_data": cfg.train.data,
               "waiting_for_ranking_check": grid.ranking_pending(),
               "sweeps": grid.sweeps, "ranking_check": grid.ranking, "rates": grid.rates,
               "rows": {d: _rows(grid, d) for d in grid.records},
               **analyse(grid), "code_versions": code_versions(grid),
               "cpu_hours": grid.cpu_hours(), "missing_runs": sorted(set(grid.missing)),
               "diverged_runs": grid.diverged, "complete": not grid.missing,
               "cache": str(cache), **summary_entry(overrides)}
    run.finish(summary)
    return run.path
