r"""Decisive evidence on DCA's LM gain and its width trend: near-converged,
parameter-matched, powered, with a pre-registered decision rule.

**Claim tested.** Paper Table 2 and §4: DCA lowers perplexity and the gain shrinks as width
grows ("consistent with our theoretical results"). Our 400-step runs found a small gain
(about -0.8 % log-perplexity, 15 of 15 seed pairs) with no width trend, but were too short, had
3 seeds and did not separate architecture from DCA's extra parameters.

**Design** (pre-registered in ``paper/05_lm/evidence_design.md``; runs in
:mod:`dca_theory.lab.lm_evidence`, statistics in :mod:`dca_theory.lab.lm_evidence_analysis`).
PTB at character level (50 symbols); pre-LN, depth 4, 4 heads, MLP 4x width, widths 16, 32, 64;
arms vanilla, DCA with the default gate (``bias_inside``), DCA with the paper's gate, and
vanilla with its MLP widened to DCA's non-embedding parameter count; 6 paired seeds (vmapped),
32 x 64 characters per step, 4000 steps = 8.19M training tokens per run (1.6 epochs);
learning rate per width from a vanilla sweep (1e-3, 2e-3, 4e-3, 8e-3; 500 steps, 2 seeds,
whole validation split), shared by all arms; validation on the whole split every 250 steps
(0.51M tokens); test once at the end. Secondary: the four arms at width 32 on the CPython
standard library by byte (no repetition: 8.19M of 28M bytes) and by byte-level BPE (2048
symbols). Last, the related-work arms (Attention Residuals, mHC, MUDDFormer, value residuals)
at width 32 on PTB-char, same seeds, budget and rate. Primary statistic: the slope of
D = 100 (ln ppl_DCA - ln ppl_vanilla) against log2(width), seed-clustered 95 % CI; decision
rule in the design document.

**Command.** ``dca-theory run lm_evidence`` (full; trains into / reads
``experiments/results/lm_runs``, so it can be stopped and restarted: finished runs are kept)
or ``dca-theory run lm_evidence --quick`` (widths 8 and 16, depth 1, 2 seeds, 20 steps, the
byte corpus as the only secondary; cache ``runs/lm_runs``). ``main(only_cached=True)``
summarises the runs already cached and lists the missing ones. Figure:
``figures/fig_lm_evidence.py``.

**Runtime** (estimates from measured throughput; the design document has the tables): the
sweep and the primary grid about 14 CPU-hours on a quiet 2-core machine (about 34 under the
load average of 8-12 measured on 2026-12-01), the two secondary corpora about 13 more. Quick:
about 2 CPU-minutes of compilation-dominated work.

**Expected result.** Not known before the runs (that is the point): the design document states
the three outcomes and what each means.
"""

from __future__ import annotations

from pathlib import Path

from dca_theory.io import RunDir, read_json
from dca_theory.lab import lm_evidence as E
from dca_theory.lab.lm_evidence_analysis import gate_by_tokenisation, summarise
from dca_theory.lab.lm_runs import cache_dir, is_cached, load_curves
from dca_theory.lab.lm_settings import experiment_settings, run_cache, run_config
from dca_theory.lab.lm_tables import row_summary
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.params import non_embedding_count
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_evidence"


def settings(quick: bool = False, overrides=()) -> E.EvidenceSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(E.EvidenceSettings, quick, overrides, E.validate)


def grid_source(grid_run: str, quick: bool, out, name: str
                ) -> tuple[E.EvidenceSettings, bool, Path]:
    """``(settings, quick, run cache)`` of the grid that ``name`` (an experiment reading this
    grid's runs: lm_evidence_lr, lm_evidence_rank) reads. ``grid_run`` empty: this mode's
    unchanged grid, its cache next to ``out`` (else next to ``name``'s default run folder).
    Else the folder an lm_evidence run wrote: the grid of its recorded mode and ``--set``
    overrides, and the cache next to that folder, where it trained (so a customised grid, such
    as the tests' tiny one, can be read as well as the standard ones)."""
    if not grid_run:
        return settings(quick), quick, cache_dir(Path(out) if out is not None
                                                  else run_dir(name, quick))
    config_path = Path(grid_run) / "config.json"
    config = read_json(config_path) if config_path.is_file() else {}
    if not isinstance(config, dict) or config.get("experiment") != NAME:
        raise ValueError(f"grid_run {grid_run} is not a folder an lm_evidence run wrote (no "
                         f"config.json of {NAME} in it); valid: the --out of `dca-theory run "
                         f"{NAME}`, or empty for the standard grid")
    grid_quick = bool(config["quick"])
    grid = settings(grid_quick, config.get("overrides", {}))
    return grid, grid_quick, cache_dir(Path(grid_run))


def _sweep(cfg, quick, cache, only_cached, run) -> tuple[dict | None, list[str]]:
    return E.rates(cfg, quick, cache, log=run.log, only_cached=only_cached)


def main(quick: bool = False, out=None, overwrite: bool = False, *,
         only_cached: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    config = {"experiment": NAME, "quick": quick, "settings": cfg, "only_cached": only_cached}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    lrs, missing = _sweep(cfg, quick, cache, only_cached, run)
    summary = {"lr_sweep": {str(w): r for w, r in (lrs or {}).items()}, "datasets": {},
               "cache": str(cache)}
    diverged: list[str] = []
    if lrs is not None:
        specs = E.grid_specs(cfg, quick, {w: r["lr"] for w, r in lrs.items()})
        by_data: dict[str, dict] = {}
        for (data, arm, w), s in specs.items():
            if only_cached and not (is_cached(s, cache) or E.is_diverged(s, cache)):
                missing.append(s.key)
                continue
            r = E.run_unless_diverged(s, cache, log=run.log)
            if r is None:  # a result, not a gap: reported, and the comparisons go without it
                diverged.append(s.key)
                continue
            entry = by_data.setdefault(data, {"records": {}, "curves": {}, "n_params": {},
                                              "rows": {}})
            entry["records"][(arm, w)] = r
            entry["curves"][(arm, w)] = load_curves(s, cache)
            entry["n_params"][(arm, w)] = non_embedding_count(ModelConfig(**r["resolved_model"]))
            entry["rows"][f"{arm}-w{w}"] = {**row_summary(r), "lr": s.train.lr,
                                           "non_embedding_params": entry["n_params"][(arm, w)],
                                           "d_mlp": s.model.d_mlp,
                                           "valid_history": r["valid_history"]}
            run.log(data=data, arm=arm, width=w, key=s.key, test_ppl=r["test_ppl"])
        tokens_per_step = cfg.train.batch_size * cfg.train.seq_len
        for data, e in by_data.items():
            summary["datasets"][data] = {
                "rows": e["rows"],
                **summarise(e["records"], e["curves"], e["n_params"], cfg.seeds,
                            tokens_per_step, primary=data == cfg.train.data,
                            related_arms=cfg.related_arms, widths=cfg.widths)}
    summary["gate_by_tokenisation"] = gate_by_tokenisation(summary["datasets"],
                                                           cfg.secondary_width)
    summary |= {"primary_data": cfg.train.data, "missing_runs": missing,
                "diverged_runs": diverged,
                "complete": not missing, **summary_entry(overrides)}
    run.finish(summary)
    return run.path
