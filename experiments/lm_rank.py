r"""Does DCA's gain track low effective rank of the residual branches?

**Claim tested.** The paper explains Table 2's shrinking gain by the bottleneck argument of
Theorem 4.3 (``dca-paper.md`` §1.5, §1.9, §8): a GRN helps where the residual branches are
low-rank compared with the width, and less as their rank rises. :mod:`experiments.lm_width`
found every branch's *numerical* rank full (D - 1); this experiment measures the softer,
entropy-based effective rank (:mod:`dca_theory.lab.branch_rank`) of each sublayer separately,
attention, MLP and the whole residual update, per layer, and sets it beside the gain.

**Design.** Vanilla and DCA (paper gate) at widths 16, 32, 64 (depth 4, 4 heads, MLP 4x width,
400 steps of 16 x 64 characters of Tiny Shakespeare, the standard CPU settings of
:mod:`dca_theory.lab.lm_runs`), seeds 0 and 1, paired by seed. Per seed and width:
``D = 100 (ln ppl_DCA - ln ppl_vanilla)`` on the whole test split; per model and layer the
effective rank of the three Jacobians averaged over 16 random validation positions. The runs go
to the git-ignored cache ``runs/lm_runs`` (two seeds are not the committed cache's three, and
``lm_stability`` scans that cache whole).

**Statistic, fixed before the runs.** ``rho``: the Pearson correlation, over the
(seed, width) cells, between D and the vanilla model's effective-rank fraction of the residual
update (mean over layers of effective rank / width), with a Fisher-z 95% interval. The bottleneck
argument predicts rho > 0 (a lower rank fraction, a more negative D). Verdict: "tracks" if the
interval lies above 0, "contradicts" if it lies below 0, else "inconclusive"; r with each cell
left out in turn shows how much one cell carries. Beside it, with
seed-clustered intervals (:func:`dca_theory.lab.statistics.seed_clustered_slope`): the slopes of
D and of each sublayer's rank fraction against log2(width) (the argument needs the fraction to
rise where the gain shrinks), and DCA's rank fraction minus vanilla's, per sublayer.

**Command.** ``dca-theory run lm_rank [--quick] [--set KEY=VALUE ...]`` (e.g. ``--set
widths=16,32 --set seeds=0,1,2 --set positions=8``). Figure: ``figures/fig_lm_rank.py``.

**Runtime.** Full: 6 runs x 2 seeds, ~10 minutes of training on 2 busy cores plus ~2 minutes of
Jacobians; quick (widths 8, 16, depth 2, 30 steps): ~2 minutes.

**Expected result** (measured; ``paper/05_lm/rank.md``): D = -0.87 / -0.48 / -0.62 at widths
16 / 32 / 64; effective rank / width of the update ~0.68 at every width (attention 0.47 / 0.43 /
0.38, MLP 0.66-0.69), DCA's within 0.002 of vanilla's; r = +0.82 [+0.03, +0.98] ("tracks" by the
rule), +0.47 with the width-16 seed-0 cell left out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dca_theory.io import RunDir
from dca_theory.lab.branch_rank import SUBLAYERS, branch_rank_profile
from dca_theory.lab.lm_grid import width_specs
from dca_theory.lab.lm_runs import cached_corpus, ensure_run, load_models
from dca_theory.lab.lm_settings import WidthSettings, experiment_settings, run_cache, run_config
from dca_theory.lab.rank_gain import PRIMARY_MEASURE, analyse, cells
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_rank"
FULL_SEEDS: tuple[int, ...] = (0, 1)


@dataclasses.dataclass(frozen=True)
class RankSettings(WidthSettings):
    """:class:`WidthSettings` plus ``positions``: validation positions per model and layer."""

    positions: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.positions < 1:
            raise ValueError(f"positions must be >= 1, got {self.positions}")

    @classmethod
    def preset(cls, quick: bool) -> RankSettings:
        base = WidthSettings.preset(quick)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        return cls(**(fields | ({"positions": 4} if quick else {"seeds": FULL_SEEDS})))


def settings(quick: bool = False, overrides=()) -> RankSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(RankSettings, quick, overrides, width_specs)


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    specs = width_specs(quick, cfg)
    config = {"experiment": NAME, "quick": quick, "seeds": list(cfg.seeds),
              "runs": {f"{k}-w{w}": s.describe() for (k, w), s in specs.items()},
              "rank": {"positions": cfg.positions, "split": "valid", "sublayers": SUBLAYERS},
              "primary_statistic": f"pearson(vanilla_{PRIMARY_MEASURE}, D), Fisher-z 95%"}
    path = Path(out or run_dir(NAME, quick, overrides))
    run = RunDir(path, run_config(config, cfg, overrides), overwrite=overwrite)
    # full mode keeps its 2-seed runs out of the committed cache (module doc)
    cache = run_cache(NAME, quick, out, overrides) if quick or out else Path("runs/lm_runs")
    corpus = cached_corpus(cfg.train.data)
    records, profiles = {}, {}
    for (kind, w), s in specs.items():
        records[(kind, w)] = r = ensure_run(s, cache)
        models = load_models(s, cache)
        profiles[(kind, w)] = [branch_rank_profile(m, corpus.valid, s.train.seq_len,
                                                   cfg.positions, seed=i)
                               for i, m in enumerate(models)]
        for seed, layers in zip(s.seeds, profiles[(kind, w)], strict=True):
            for layer in layers:
                run.log(kind=kind, seed=seed, test_ppl=r["test_ppl"][s.seeds.index(seed)],
                        **layer)
    rows = cells(records, profiles)
    summary = {"cells": rows, **analyse(rows),
               "profiles": {f"{k}-w{w}": p for (k, w), p in profiles.items()},
               "params": {f"{k}-w{w}": r["n_params"] for (k, w), r in records.items()},
               "cache": str(cache), **summary_entry(overrides)}
    run.finish(summary)
    return run.path
