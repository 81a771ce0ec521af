r"""Does DCA's gain track low effective rank near convergence? The branches' Jacobian spectra
of the pre-registered evidence grid's trained models, beside its gain.

**Claim tested.** The bottleneck argument behind Table 2 (``dca-paper.md`` §1.5, §1.9, §8): a
GRN helps where the residual branches are low-rank compared with the width, and less as their
rank rises. :mod:`experiments.lm_rank` measured this after 400 steps, where the gain was small
(about -0.6 points) and flat in width; the evidence grid (:mod:`experiments.lm_evidence`) trains
to 8.19M tokens, where the gain is several times larger and may change with width, so the
argument can be checked where there is something to explain.

**Design.** The evidence grid's primary arms vanilla and DCA (default gate) on PTB-char, at
every width whose two runs are trained (6 paired seeds each; this experiment never trains: it
reads the parameters the grid left in its run cache). Per model and layer, the entropy-based
effective rank (:mod:`dca_theory.lab.branch_rank`) of the attention, MLP and residual-update
Jacobians, averaged over ``positions`` random validation positions; per seed and width,
D = 100 (ln ppl_DCA - ln ppl_vanilla) on the whole test split, the grid's own figure.

**Statistic, fixed before the runs** (the same as :mod:`experiments.lm_rank`'s, so the two
budgets compare; :mod:`dca_theory.lab.rank_gain`): the Pearson r over the (seed, width) cells
between D and vanilla's update effective-rank fraction, with a Fisher-z 95 % interval;
"tracks" if the interval lies above 0, "contradicts" if below, else "inconclusive". Beside it,
seed-clustered slopes against log2(width), and per width DCA's rank fraction minus vanilla's
(paired over seeds, t-interval). The verdict counts once all three widths are in (``complete``);
before that the summary is interim.

**Command.** ``DCA_DATA_DIR=../shared/data dca-theory run lm_evidence_rank [--quick]`` after
``dca-theory run lm_evidence [--quick]`` has trained the widths it should read (a fresh clone has
the grid's records but not its parameters, which are git-ignored: the grid has to be retrained
for this). ``--set positions=N`` changes the positions per model and layer; ``--set
grid_run=DIR`` reads the grid of the lm_evidence run that wrote ``DIR`` (its mode and ``--set``
overrides; the run cache beside ``DIR``), e.g. a customised smaller grid. Figure:
``figures/fig_lm_evidence_rank.py``.

**Runtime.** 42 s for widths 16 and 32 at 16 positions (24 models of depth 4, 2 cores shared
with the grid's training); quick: seconds after the quick grid.

**Expected result** (measured; ``paper/05_lm/rank.md``): at 400 steps the update's rank fraction
was about 0.68 at every width and DCA's within 0.002 of vanilla's; whether that holds near
convergence is what this run says.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from dca_theory.io import RunDir
from dca_theory.lab import lm_evidence as E
from dca_theory.lab.branch_rank import SUBLAYERS, branch_rank_profile
from dca_theory.lab.lm_runs import cached_corpus, ensure_run, load_models
from dca_theory.lab.lm_settings import experiment_settings
from dca_theory.lab.rank_gain import KINDS, PRIMARY_MEASURE, analyse, cells
from dca_theory.lab.statistics import paired
from dca_theory.overrides import record, run_dir, summary_entry

from . import lm_evidence

NAME = "lm_evidence_rank"


@dataclasses.dataclass(frozen=True)
class EvidenceRankSettings:
    """``positions``: random validation positions per model and layer; ``grid_run``: the
    folder of the lm_evidence run whose trained grid is read, e.g. a customised one's (empty:
    the mode's unchanged grid)."""

    positions: int = 16
    grid_run: str = ""

    def __post_init__(self) -> None:
        if self.positions < 1:
            raise ValueError(f"positions must be >= 1, got {self.positions}")

    @classmethod
    def preset(cls, quick: bool) -> EvidenceRankSettings:
        return cls(positions=4 if quick else 16)


def settings(quick: bool = False, overrides=()) -> EvidenceRankSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(EvidenceRankSettings, quick, overrides,
                               lambda q, s: lm_evidence.grid_source(s.grid_run, q, None, NAME))


def trained_pairs(ev: E.EvidenceSettings, quick: bool,
                  cache: Path) -> tuple[dict, list[str], int, str]:
    """``(specs, missing, seq_len, data)``: the vanilla and DCA specs ``(kind, width)`` of the
    grid ``ev`` (its ``quick`` mode) at every width where both left parameters in ``cache``,
    and the keys of those that did not."""
    lrs, missing = E.rates(ev, quick, cache, only_cached=True)
    if lrs is None:
        return {}, missing, ev.train.seq_len, ev.train.data
    grid = E.grid_specs(ev, quick, {w: r["lr"] for w, r in lrs.items()})
    specs = {}
    for w in ev.widths:
        pair = {kind: grid[(ev.train.data, kind, w)] for kind in KINDS}
        absent = [s.key for s in pair.values()
                  if not (Path(cache) / s.key / "params.npz").is_file()]
        missing += absent
        if not absent:
            specs |= {(kind, w): s for kind, s in pair.items()}
    return specs, missing, ev.train.seq_len, ev.train.data


def per_width_difference(rows: list[dict]) -> dict:
    """Per width and sublayer: DCA's layer-mean rank fraction minus vanilla's, paired by seed."""
    out = {}
    for w in sorted({r["width"] for r in rows}):
        sel = [r for r in rows if r["width"] == w]
        out[str(w)] = {part: paired([r[f"vanilla_{part}_eff_rank_frac"] for r in sel],
                                    [r[f"dca_{part}_eff_rank_frac"] for r in sel])
                       for part in SUBLAYERS}
    return out


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    # the grid's own cache (next to --out, or next to grid_run, if given), whatever the other
    # overrides: this never trains
    ev, grid_quick, cache = lm_evidence.grid_source(cfg.grid_run, quick, out, NAME)
    specs, missing, seq_len, data = trained_pairs(ev, grid_quick, cache)
    if not specs:
        raise ValueError(f"no width of the lm_evidence grid has trained vanilla and DCA "
                         f"parameters in {cache}; run `dca-theory run lm_evidence"
                         f"{' --quick' if grid_quick else ''}` first (missing: "
                         f"{', '.join(missing) or 'the learning-rate sweep'})")
    config = {"experiment": NAME, "quick": quick, "data": data, "settings": cfg,
              "runs": {f"{k}-w{w}": s.key for (k, w), s in specs.items()},
              "rank": {"positions": cfg.positions, "split": "valid", "sublayers": SUBLAYERS},
              "primary_statistic": f"pearson(vanilla_{PRIMARY_MEASURE}, D), Fisher-z 95%"}
    run = RunDir(Path(out or run_dir(NAME, quick, overrides)), record(config, overrides),
                 overwrite=overwrite)
    corpus = cached_corpus(data)
    records, profiles = {}, {}
    for (kind, w), s in specs.items():
        records[(kind, w)] = ensure_run(s, cache)  # cached: trained_pairs saw its parameters
        profiles[(kind, w)] = [branch_rank_profile(m, corpus.valid, seq_len, cfg.positions,
                                                   seed=i)
                               for i, m in enumerate(load_models(s, cache))]
        for seed, layers in zip(s.seeds, profiles[(kind, w)], strict=True):
            for layer in layers:
                run.log(kind=kind, seed=seed, **layer)  # layer holds the width
    rows = cells(records, profiles)
    widths = sorted({w for _, w in specs})
    summary = {"widths": widths, "cells": rows, **analyse(rows),
               "dca_minus_vanilla_by_width": per_width_difference(rows),
               "profiles": {f"{k}-w{w}": p for (k, w), p in profiles.items()},
               "test_ppl": {f"{k}-w{w}": r["test_ppl"] for (k, w), r in records.items()},
               "mean_D_by_width": {str(w): float(np.mean([r["D"] for r in rows
                                                          if r["width"] == w]))
                                   for w in widths},
               "missing_runs": missing, "complete": not missing, "cache": str(cache),
               **summary_entry(overrides)}
    run.finish(summary)
    return run.path
