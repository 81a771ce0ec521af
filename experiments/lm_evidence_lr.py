r"""Did sharing vanilla's learning rate handicap DCA in the evidence grid? A post-hoc rate
check, run after the grid's width 64 was trained and decided on nothing in advance.

**Question.** The pre-registered grid (:mod:`experiments.lm_evidence`) gives every arm the rate
that was best for *vanilla* at its width (a 500-step sweep). If DCA's best rate differs, the
shared rate favours vanilla at that width, and a width trend in D may be partly a tuning
artefact. Width 16's vanilla rate also sits at the top of its extended sweep, so vanilla may be
under-tuned there, which would favour DCA at the smallest width: both would steepen the slope.

**Design.** For each width of ``widths`` and each arm of ``arms``: the grid's sweep run (same
steps, seeds, schedule and whole-split validation score; :func:`dca_theory.lab.lm_evidence.
sweep_spec`) at the grid's rate for that width times each of ``factors``. Vanilla's runs at
the factors the registered sweep already tried come from the cache; the rest are trained
through it (resumable, like the grid).

**Statistic and reading, written before these runs:** per width and arm, the mean over the
sweep's 2 seeds of the validation ln-perplexity at each rate; the arm's best rate; its
*handicap* h = 100 (ln ppl at the shared rate - ln ppl at its own best rate) >= 0. Beside them,
D at 500 steps at the shared rate and at each arm's own best rate. Reading: where DCA's h is
below 0.5 points, the shared rate is not what sets DCA's result at that width; where it is
larger, the grid's D at that width is read as favouring vanilla by about h at this budget.
Likewise vanilla's h at width 16 bounds how much its rate at the sweep's edge flatters DCA.
Two seeds and 500 steps: this is a check of the design, not a test, and its numbers are not
the 8.19M-token D. How far a sweep cell can be trusted is measured, not assumed: at the shared
rate a sweep run is the first 500 steps of the grid's run for the same seeds (same batches,
schedule and initial weights; only the number of vmapped seeds differs), so ``reproduction``
gives, per arm and seed, 100 (ln ppl of the sweep run - ln ppl of the grid's run at the same
step); a handicap within that spread is not resolved.

**Full-budget follow-up.** At each width of ``full_widths`` where DCA's best sweep rate is not
the shared one, DCA is also trained like the grid's arm (6 seeds, 8.19M tokens) at its own
best rate, and compared on the test split with the grid's vanilla (at vanilla's own best
rate): D per seed, its mean and 95 % t-interval, beside the grid's D at the shared rate. The
default is width 64, where the grid's DCA ended above vanilla; this choice was made after
seeing that, so the follow-up is post hoc and says so wherever it is reported.

**Command.** ``DCA_DATA_DIR=../shared/data dca-theory run lm_evidence_lr [--quick]`` after the
grid's sweep (``dca-theory run lm_evidence``) has run; ``--set widths=64`` /
``--set factors=0.5,1,2`` narrow it; ``--set grid_run=DIR`` reads the grid of the lm_evidence
run that wrote ``DIR`` (its mode and ``--set`` overrides; the run cache beside ``DIR``), e.g. a
customised smaller grid.

**Runtime.** About 2-4 min per new sweep run on the 2-core machine (width 16 to 64); 13 new
sweep runs at the defaults; a full-budget run takes what a grid run does (about 45 min at width
64 on a quiet machine). Quick: a minute after the quick grid's sweep.

**Expected result.** Not known before the runs; ``paper/05_lm/evidence_result.md`` reports it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from dca_theory.io import RunDir
from dca_theory.lab import lm_evidence as E
from dca_theory.lab.lm_evidence_analysis import rate_check
from dca_theory.lab.lm_runs import is_cached
from dca_theory.lab.lm_settings import experiment_settings
from dca_theory.lab.statistics import log_ppl_gap, paired
from dca_theory.overrides import record, run_dir, summary_entry

from . import lm_evidence

NAME = "lm_evidence_lr"


@dataclasses.dataclass(frozen=True)
class EvidenceLrSettings:
    """``widths`` (grid widths; empty: all of them), ``arms`` (grid arms), ``factors`` (times
    the grid's rate at a width; 1 must be among them: it is the shared rate),
    ``full_widths`` (where DCA is also trained for the full budget at its own best rate) and
    ``grid_run`` (the folder of the lm_evidence run whose grid is read, e.g. a customised
    one's; empty: the mode's unchanged grid)."""

    widths: tuple[int, ...] = ()
    arms: tuple[str, ...] = ("vanilla", "dca")
    factors: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    full_widths: tuple[int, ...] = (64,)
    grid_run: str = ""

    def __post_init__(self) -> None:
        if 1.0 not in self.factors or min(self.factors) <= 0:
            raise ValueError(f"factors must be > 0 and include 1 (the shared rate), got "
                             f"{','.join(f'{f:g}' for f in self.factors) or 'none'}")
        bad = [a for a in self.arms if a not in E.ARM_MODEL]
        if bad or not self.arms:
            raise ValueError(f"arms {','.join(bad) or 'none'} invalid; valid: "
                             f"{','.join(E.ARM_MODEL)}")

    @classmethod
    def preset(cls, quick: bool) -> EvidenceLrSettings:
        return cls(factors=(0.5, 1.0, 2.0), full_widths=(16,)) if quick else cls()


def _validate(quick: bool, cfg: EvidenceLrSettings) -> None:
    grid = lm_evidence.grid_source(cfg.grid_run, quick, None, NAME)[0].widths
    for name in ("widths", "full_widths"):
        bad = [w for w in getattr(cfg, name) if w not in grid]
        if bad:
            raise ValueError(f"{name} {','.join(map(str, bad))} are not grid widths; valid: "
                             f"{','.join(map(str, grid))}")
    off = [w for w in cfg.full_widths if cfg.widths and w not in cfg.widths]
    if off:
        raise ValueError(f"full_widths {','.join(map(str, off))} must be among widths "
                         f"{','.join(map(str, cfg.widths))} (their sweep picks the rate)")
    if cfg.full_widths and "dca" not in cfg.arms:
        raise ValueError("full_widths needs the dca arm in arms (its best rate picks the run)")


def full_budget(ev, quick: bool, cache, width: int, rate: float, shared: float,
                log) -> dict:
    """DCA trained like the grid's arm at ``rate`` against the grid's vanilla at ``shared``
    (test split, paired by seed), beside the grid's DCA at ``shared``."""
    grid = E.grid_specs(ev, quick, {w: shared for w in ev.widths})
    van, dca_shared = grid[(ev.train.data, "vanilla", width)], grid[(ev.train.data, "dca", width)]
    missing = [s.key for s in (van, dca_shared) if not is_cached(s, cache)]
    if missing:
        return {"rate": rate, "missing_grid_runs": missing}
    own = E.arm_spec(ev, quick, "dca", width, ev.train.data, rate)
    r = E.run_unless_diverged(own, cache, log=log)
    base = E.run_unless_diverged(van, cache)
    at_shared = E.run_unless_diverged(dca_shared, cache)
    if r is None:
        return {"rate": rate, "key": own.key, "diverged": True}
    return {"rate": rate, "key": own.key,
            "D_own_rate": _d(base["test_ppl"], r["test_ppl"]),
            "D_shared_rate": _d(base["test_ppl"], at_shared["test_ppl"]),
            "own_minus_shared_rate": _d(at_shared["test_ppl"], r["test_ppl"])}


def reproduction(ev, quick: bool, cache, width: int, shared: float, arms, records) -> dict:
    """Per arm: the sweep run at ``shared`` against the grid's own run at the same step and
    seeds, ``100 (ln ppl_sweep - ln ppl_grid)`` per seed on the whole validation split (arms
    whose grid run is not cached are left out)."""
    grid = E.grid_specs(ev, quick, {w: shared for w in ev.widths})
    out = {}
    for arm in arms:
        g, sweep = grid[(ev.train.data, arm, width)], records.get((arm, width, shared))
        if sweep is None or not is_cached(g, cache):
            continue
        at = {h["step"]: h["valid_ppl"] for h in E.run_unless_diverged(g, cache)["valid_history"]}
        if ev.sweep_steps not in at:
            continue
        main = [at[ev.sweep_steps][list(g.seeds).index(seed)] for seed in ev.sweep_seeds]
        d = log_ppl_gap(main, np.exp(sweep["valid_loss"]))
        out[arm] = {"per_seed": d.tolist(), "max_abs": float(np.max(np.abs(d)))}
    return out


def _d(ppl_base, ppl_other) -> dict:
    """D per seed with its mean, 95 % t-interval and one-sample p (``paired`` against 0)."""
    d = log_ppl_gap(ppl_base, ppl_other)
    return paired(np.zeros_like(d), d)


def settings(quick: bool = False, overrides=()) -> EvidenceLrSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(EvidenceLrSettings, quick, overrides, _validate)


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    # the grid's own cache (next to --out, or next to grid_run, if given): its sweep runs are
    # reused, not retrained; ``gq`` is the grid's mode (the grid_run's own, if given)
    ev, gq, cache = lm_evidence.grid_source(cfg.grid_run, quick, out, NAME)
    lrs, missing = E.rates(ev, gq, cache, only_cached=True)
    if lrs is None:
        raise ValueError(f"the lm_evidence sweep has not run in {cache}; run `dca-theory run "
                         f"lm_evidence{' --quick' if gq else ''}` first (missing: "
                         f"{', '.join(missing)})")
    widths = cfg.widths or ev.widths
    specs = {(arm, w, f): E.sweep_spec(ev, gq, w, lrs[w]["lr"] * f, arm)
             for w in widths for arm in cfg.arms for f in cfg.factors}
    config = {"experiment": NAME, "quick": quick, "settings": cfg, "data": ev.train.data,
              "shared_rate": {str(w): lrs[w]["lr"] for w in widths},
              "runs": {f"{a}-w{w}-x{f:g}": s.key for (a, w, f), s in specs.items()}}
    run = RunDir(Path(out or run_dir(NAME, quick, overrides)), record(config, overrides),
                 overwrite=overwrite)
    records = {}
    for (arm, w, f), s in specs.items():
        r = E.run_unless_diverged(s, cache, log=run.log)
        records[(arm, w, s.train.lr)] = r  # None: diverged, which rate_check scores as worst
        run.log(arm=arm, width=w, lr=s.train.lr, key=s.key,
                diverged=r is None)
    checks = {w: rate_check(records, w, lrs[w]["lr"])
              | {"reproduction": reproduction(ev, gq, cache, w, lrs[w]["lr"], cfg.arms,
                                              records)}
              for w in widths}
    full = {}
    for w in cfg.full_widths:
        best = checks[w]["arms"]["dca"]["best_rate"]
        if f"{best:g}" != f"{lrs[w]['lr']:g}":
            full[str(w)] = full_budget(ev, gq, cache, w, best, lrs[w]["lr"], run.log)
    summary = {"widths": {str(w): c for w, c in checks.items()}, "full_budget": full,
               "sweep_steps": ev.sweep_steps, "seeds": list(ev.sweep_seeds),
               "tokens": ev.sweep_steps * ev.train.batch_size * ev.train.seq_len,
               "cache": str(cache), **summary_entry(overrides)}
    run.finish(summary)
    return run.path
