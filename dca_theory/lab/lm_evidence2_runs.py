"""The parts of the second evidence design, in their registered order, through the resumable
run cache (settings and parts: :mod:`dca_theory.lab.lm_evidence2`).

:class:`Grid2` trains (or reads) every run a part needs with ``train`` (default
:func:`dca_theory.lab.lm_evidence.run_unless_diverged`: a diverged run is a result, scored as
worse than any); with ``only_cached`` it trains nothing and lists what is missing instead. Its
``rank_of`` measures a trained vanilla model's residual-update rank for H5.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dca_theory.io import read_json, write_json
from dca_theory.lab import lm_evidence as E
from dca_theory.lab import lm_evidence2_analysis as A2
from dca_theory.lab import rate_sweep
from dca_theory.lab.lm_evidence2 import CORE_ARMS, Evidence2Settings, arm_of
from dca_theory.lab.lm_runs import RunSpec, is_cached

NOT_RUN = object()  # a run neither cached nor trained (only_cached)


#: beside a run's record: its measured update rank, which outlives the parameters (the run
#: cache commits records and curves, never ``params.npz``)
RANK_FILE = "update_rank.json"


def measure_update_rank(s: RunSpec, cache, positions: int, *, retrain: bool = False,
                        log=None) -> dict | None:
    """Per seed the layer-mean effective-rank fraction of the residual update of the trained
    models of ``s``: read from the run's :data:`RANK_FILE` if it was measured at ``positions``,
    else measured on the cached parameters and saved there. Without parameters: None, or with
    ``retrain`` the parameters are first restored by retraining (a replicate checked against
    the record, :func:`dca_theory.lab.lm_runs.restore_params`; its gaps to the record are
    saved with the ranks)."""
    from dca_theory.lab.branch_rank import branch_rank_profile
    from dca_theory.lab.lm_runs import RESTORED, cached_corpus, load_models, restore_params

    saved = Path(cache) / s.key / RANK_FILE
    if saved.is_file() and (old := read_json(saved)).get("positions") == positions:
        return old
    if not (Path(cache) / s.key / "params.npz").is_file():
        if not retrain:
            return None
        restore_params(s, cache, log=log)
    corpus = cached_corpus(s.train.data, s.train.bpe_vocab_size)
    fracs = []
    for i, m in enumerate(load_models(s, cache)):
        layers = branch_rank_profile(m, corpus.valid, s.train.seq_len, positions, seed=i)
        fracs.append(float(np.mean([layer["update_eff_rank_frac"] for layer in layers])))
    out = {"update_frac": fracs, "layers": s.model.n_layers, "key": s.key,
           "positions": positions}
    if (restored := Path(cache) / s.key / RESTORED).is_file():  # measured on a replicate
        out["models"] = read_json(restored)
    write_json(saved, out)
    return out


class Grid2:
    def __init__(self, cfg: Evidence2Settings, quick: bool, cache, *, log=None,
                 only_cached: bool = False, train: Callable | None = None,
                 rank_of: Callable | None = None):
        self.cfg, self.quick, self.cache, self.log = cfg, quick, Path(cache), log
        self.only_cached = only_cached
        self.train = train or E.run_unless_diverged
        self.rank_of = rank_of or (lambda s: measure_update_rank(
            s, self.cache, cfg.rank_positions, retrain=cfg.h5_retrain and not only_cached,
            log=log))
        self.missing: list[str] = []
        self.diverged: list[str] = []
        self.used: dict[str, dict] = {}  # key -> record of every run read or trained
        self.sweeps: dict[str, dict] = {}  # "data/arm/w<width>" -> the sweep cell
        self.ranking: dict | None = None
        self.rates: dict[str, dict] = {}  # "data/arm/w<width>" -> the rate the runs use
        self.records: dict[str, dict] = {}  # data -> {(arm, width): main record}
        self.specs: dict[str, dict] = {}  # data -> {(arm, width): main spec}
        self.shared: dict[int, dict] = {}

    # ------------------------------------------------------------------------------- runs
    def get(self, s: RunSpec):
        if self.only_cached and not (is_cached(s, self.cache) or E.is_diverged(s, self.cache)):
            self.missing.append(s.key)
            return NOT_RUN
        r = self.train(s, self.cache, log=self.log)
        if r is None:
            self.diverged.append(s.key)
        else:
            self.used[s.key] = r
        return r

    def _loss(self, s: RunSpec) -> float | None:
        r = self.get(s)
        if r is NOT_RUN:
            return None
        return math.inf if r is None else float(np.mean(r["valid_loss"]))

    def sweep(self, data: str, arm: str, width: int, r0: float) -> dict:
        """One sweep cell (the rule: :mod:`dca_theory.lab.rate_sweep`)."""
        cfg, keys = self.cfg, {}

        def loss_of(lr):
            s = cfg.sweep_spec(self.quick, arm, width, data, lr)
            keys[f"{lr:g}"] = s.key
            return self._loss(s)

        losses, complete = rate_sweep.sweep([r0 * f for f in cfg.start_factors], loss_of,
                                            cfg.max_extend)
        cell = {"r0": r0, "valid_ln_ppl": {f"{lr:g}": v for lr, v in sorted(losses.items())},
                "complete": complete, "keys": keys}
        if complete and losses:
            cell |= rate_sweep.best_rate(losses)
        self.sweeps[f"{data}/{arm}/w{width}"] = cell
        return cell

    def rate(self, data: str, arm: str, width: int) -> float | None:
        """The rate ``arm``'s runs use: its sweep's best, or, where the ranking check failed,
        the better at the full budget of its sweep's two best (seeds ``sweep_seeds``)."""
        cell = self.sweeps.get(f"{data}/{arm}/w{width}", {})
        if "lr" not in cell or self.ranking_pending():
            return None
        lr, how = cell["lr"], "sweep best"
        if self.ranking is not None and self.ranking.get("passed") is False and cell["second"]:
            full = {r: self._loss(self.cfg.run_spec(self.quick, arm, width, data, r,
                                                    self.cfg.sweep_seeds))
                    for r in (cell["lr"], cell["second"])}
            if any(v is None for v in full.values()):
                return None
            lr, how = min(full, key=full.get), "better of the two best at the full budget"
        self.rates[f"{data}/{arm}/w{width}"] = {"lr": lr, "how": how,
                                                "at_grid_edge": cell["at_grid_edge"]}
        return lr

    def ranking_pending(self) -> bool:
        """Whether the ranking check (part B) can run but has not: no full-budget run waits on
        a rate it may change. (With a single rate per sweep, as in quick mode, there is no
        runner-up to check, and nothing waits.)"""
        if self.ranking is not None:
            return False
        data, w = self.cfg.train.data, self.cfg.ranking_width
        return all(self.sweeps.get(f"{data}/{a}/w{w}", {}).get("second") is not None
                   for a in ("vanilla", "dca_paper"))

    def main_run(self, data: str, arm: str, width: int, seeds) -> None:
        lr = self.rate(data, arm, width)
        if lr is None:
            return
        s = self.cfg.run_spec(self.quick, arm, width, data, lr, seeds)
        r = self.get(s)
        self.specs.setdefault(data, {})[(arm, width)] = s
        if isinstance(r, dict):
            self.records.setdefault(data, {})[(arm, width)] = r

    # ------------------------------------------------------------------------------ parts
    def part_a(self) -> None:
        cfg = self.cfg
        for w in cfg.widths:
            for arm in cfg.arms():
                self.sweep(cfg.train.data, arm, w, cfg.r0(arm, w))

    def part_b(self) -> None:
        cfg, data, w = self.cfg, self.cfg.train.data, self.cfg.ranking_width
        full, best = {}, {}
        for arm in ("vanilla", "dca_paper"):
            cell = self.sweeps.get(f"{data}/{arm}/w{w}", {})
            if cell.get("second") is None:
                return
            losses = {lr: self._loss(cfg.run_spec(self.quick, arm, w, data, lr, cfg.sweep_seeds))
                      for lr in (cell["lr"], cell["second"])}
            if any(v is None for v in losses.values()):
                return
            full[arm], best[arm] = losses, cell["lr"]
        self.ranking = A2.ranking_check(full, best, cfg.ranking_tolerance)

    def part_c(self) -> None:
        cfg = self.cfg
        for w in cfg.widths:
            for arm in cfg.arms():
                self.main_run(cfg.train.data, arm, w, cfg.main_seeds(arm, w))

    def part_d(self) -> None:
        cfg, data = self.cfg, self.cfg.train.data
        for w in cfg.widths:
            shared, own = self.rate(data, "vanilla", w), self.rate(data, "dca_paper", w)
            if shared is None or own is None:
                continue
            if f"{shared:g}" == f"{own:g}":  # no confound to measure: the own-rate run stands
                main = self.records.get(data, {}).get(("dca_paper", w))
                if main is not None:
                    self.shared[w] = A2.restrict(main, cfg.pool(cfg.shared_seeds))
                continue
            r = self.get(cfg.run_spec(self.quick, "dca_paper", w, data, shared,
                                      cfg.pool(cfg.shared_seeds)))
            if isinstance(r, dict):
                self.shared[w] = r

    def h4(self) -> dict:
        cfg = self.cfg
        return A2.h4(self.records.get(cfg.train.data, {}), cfg.gates, cfg.widths,
                     cfg.pool(cfg.common_seeds))

    def part_e(self) -> None:
        cfg, data = self.cfg, self.cfg.train.data
        gate = self.h4().get("default_gate")
        arms = list(CORE_ARMS) + ([arm_of(gate)] if gate not in (None, "paper") else [])
        narrower = list(cfg.widths)
        for w in cfg.wide_widths:
            prev = max(narrower)
            for arm in arms:
                best = self.sweeps.get(f"{data}/{arm}/w{prev}", {}).get("lr")
                if best is not None:
                    self.sweep(data, arm, w, best * prev / w)
                    self.main_run(data, arm, w, cfg.main_seeds(arm, w))
            narrower.append(w)

    def part_f(self) -> None:
        cfg, w = self.cfg, self.cfg.secondary_width
        for data in cfg.secondary_data:
            for arm in cfg.arms():
                self.sweep(data, arm, w, cfg.r0(arm, w))
                self.main_run(data, arm, w, cfg.pool(cfg.secondary_seeds))

    def part_g(self) -> None:
        cfg, w = self.cfg, self.cfg.related_width
        for arm in cfg.related_arms:
            self.sweep(cfg.train.data, arm, w, cfg.r0(arm, w))
            self.main_run(cfg.train.data, arm, w, cfg.pool(cfg.related_seeds))

    def run(self) -> None:
        """The parts of ``cfg.parts``, in the registered order; part C's runs are also read
        (never trained) when a later part needs them and C is not among ``parts``."""
        for part in "ABCDEFG":
            if part in self.cfg.parts:
                getattr(self, f"part_{part.lower()}")()
            elif part in "ABC":  # later parts read the rates and H4 from these if cached
                keep, self.only_cached = self.only_cached, True
                getattr(self, f"part_{part.lower()}")()
                self.only_cached = keep

    def ranks(self) -> dict[tuple[str, int], dict]:
        """H5's ranks: every trained vanilla main run's update rank, per (corpus, width)."""
        out = {}
        for data, specs in self.specs.items():
            for (arm, w), s in specs.items():
                if arm == "vanilla" and (arm, w) in self.records.get(data, {}):
                    r = self.rank_of(s)
                    if r is not None:
                        out[(data, w)] = r
        return out

    def cpu_hours(self) -> float:
        """Training hours of the runs read or trained (their logged step times; validation
        passes not included)."""
        total = 0.0
        for key in self.used:
            path = self.cache / key / "curves.npz"
            if path.is_file():
                with np.load(path) as f:
                    total += float(f["step_time"].sum())
        return total / 3600
