"""The LM verdict table's statistics, recomputed from the committed result files (no training).

**Claims covered.** Every LM claim of the paper in ``paper/05_lm_claims.md``: Tables 1-9 (LM
rows), Figures 6-8 and 10, the loss spikes, "k = 2: 48 % lower inference latency", LAuReL-LR and
the ViT's Table 8. Per claim (:mod:`dca_theory.lab.verdicts`): seed-paired gaps
``D = 100 (ln ppl_X - ln ppl_ref)`` with a 95 % t interval and p, Holm-adjusted within the
claim's family of tests, pooled over configurations that agree (seed-clustered interval), and
a verdict from one stated rule; "not tested at this budget" where the runs could not show the
effect, "not tested" where nothing was measured.

**Command.** ``dca-theory run lm_verdicts`` (writes ``experiments/results/lm_verdicts``);
``--quick`` is the same computation into ``runs/lm_verdicts-quick``. ``--set results=DIR`` /
``--set benchmarks=DIR`` read another results tree.

**Runtime.** A few seconds (JSON and a handful of ``curves.npz``), CPU or GPU alike.

**Expected result** (committed files): DCA - vanilla pooled over five width/depth
configurations -0.82 [-1.15, -0.48] log-ppl points (seed-clustered), 15 of 15 seed pairs
lower, configurations agreeing (ANOVA p = 0.64); per-width and per-depth gaps Holm-significant
only at depth 2; width slope +0.02 [-0.48, +0.53] points per doubling; 2-DCA / DCA decode
latency 0.94 [0.85, 1.04] on the CPU (paper 0.52).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dca_theory.io import RunDir
from dca_theory.lab.verdicts import all_verdicts
from dca_theory.overrides import apply_overrides, record, run_dir, summary_entry

NAME = "lm_verdicts"


@dataclasses.dataclass(frozen=True)
class VerdictSettings:
    """Where the committed measurements are read from (relative to the working directory)."""

    results: str = "experiments/results"
    benchmarks: str = "benchmarks/results"

    def __post_init__(self):
        for name in ("results", "benchmarks"):
            path = Path(getattr(self, name))
            if not path.is_dir():
                raise ValueError(f"{name}={str(path)!r} is not a folder; valid: a results "
                                 f"folder such as {getattr(VerdictSettings, name)!r}")


def settings(quick: bool = False, overrides=()) -> VerdictSettings:
    """The settings with ``--set key=value`` overrides applied (quick and full are the same:
    nothing here trains)."""
    return apply_overrides(VerdictSettings(), overrides)


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    run = RunDir(out or run_dir(NAME, quick, overrides), record(cfg, overrides),
                 overwrite=overwrite)
    verdicts = all_verdicts(cfg.results, cfg.benchmarks)
    for claim, numbers in verdicts.items():
        run.log(claim=claim, verdict=numbers.get("verdict"))
    run.finish({"claims": verdicts, "settings": dataclasses.asdict(cfg),
                **summary_entry(overrides)})
    return run.path
