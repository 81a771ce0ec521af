"""The runs of the evidence experiment(``experiments/lm_evidence.py``): its settings
(``dca-theory run lm_evidence --set``), the learning-rate sweep and the grid of
:class:`~dca_theory.lab.lm_runs.RunSpec` s, all through the resumable run cache.

**Arms** (:data:`ARMS`), paired by seed: ``vanilla``; ``dca`` with the default GRN-v3 gate
(``bias_inside``, :mod:`dca_theory.gates`); ``dca_paper``, DCA with the paper's literal gate;
``vanilla_matched``, vanilla with its MLP widened to DCA's non-embedding parameter count
(:func:`dca_theory.lm.params.matched_vanilla_d_mlp`).

**Order.** First the sweep: vanilla at each width for every learning rate of ``lr_grid``, on
``sweep_seeds`` for ``sweep_steps`` steps (the main schedule's warm-up, so a sweep run is the
first ``sweep_steps`` steps of a main run), scored on the whole validation split. Where the
best rate of a width is the largest (or smallest) one tried, the sweep of that width goes on by
doubling (halving) it, at most ``lr_extend`` times, until the best rate is interior; a rate
whose loss diverges counts as worse than any (a ``diverged.json`` marker keeps it from being
retried). The best rate per width is then shared by every arm at that width (``lr_by_width``
skips the sweep).
Then the primary grid (``widths`` x arms on ``train.data``), then the secondary one (width
``secondary_width`` on each of ``secondary_data``, its rate the primary sweep's at that width),
then the related-work arms (:data:`RELATED_ARMS`: Attention Residuals, mHC, MUDDFormer, value
residuals) at ``related_width`` on ``train.data``, with that width's rate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dca_theory.io import write_json
from dca_theory.lab import rate_sweep
from dca_theory.lab.lm_runs import (
    LMGridSettings,
    RunSpec,
    ensure_run,
    is_cached,
    remove_partial,
    spec,
)
from dca_theory.lm.params import matched_vanilla_d_mlp
from dca_theory.lm.train_config import LMTrainConfig

ARMS: tuple[str, ...] = ("vanilla", "dca", "dca_paper", "vanilla_matched")
#: today's dense-connection methods beside DCA (the related-work arms; their LM trunks are in
#: dca_theory.lm.rivals and dca_theory.lm.mhc)
RELATED_ARMS: tuple[str, ...] = ("attn_res", "mhc", "muddformer", "value_residual")
DIVERGED = "diverged.json"  # marks a sweep run whose loss became non-finite
#: arm -> (residual, GRN-v3 gate); vanilla's gate is unused
ARM_MODEL: dict[str, tuple[str, str]] = {"vanilla": ("vanilla", "paper"),
                                         "dca": ("dca", "bias_inside"),
                                         "dca_paper": ("dca", "paper"),
                                         "dca_open": ("dca", "open"),
                                         "dca_bias_inside": ("dca", "bias_inside"),
                                         "vanilla_matched": ("vanilla", "paper"),
                                         **{arm: (arm, "paper") for arm in RELATED_ARMS}}
PRIMARY_DATA = "ptb-char"
SECONDARY_DATA: tuple[str, ...] = ("python-stdlib", "python-stdlib-bpe")

#: 32 sequences of 64 characters, 4000 steps: 8.19M training tokens per run (1.6 epochs of
#: PTB-char); whole-split validation every 250 steps (0.51M tokens)
FULL_TRAIN = LMTrainConfig(data=PRIMARY_DATA, batch_size=32, seq_len=64, steps=4000, lr=2e-3,
                           warmup_steps=100, log_every=250, eval_every=250, eval_batches=None,
                           bpe_vocab_size=2048, progress=True)
QUICK_TRAIN = LMTrainConfig(data=PRIMARY_DATA, batch_size=8, seq_len=32, steps=20, lr=3e-3,
                            warmup_steps=4, log_every=10, eval_every=10, eval_batches=2,
                            bpe_vocab_size=2048, progress=False)


def _positive(name: str, values) -> None:
    values = tuple(values)
    if not values or any(v <= 0 for v in values) or len(set(values)) != len(values):
        raise ValueError(f"{name} must be distinct values > 0, got "
                         f"{','.join(map(str, values)) or 'none'}")


def _members(what: str, values, valid) -> None:
    for v in values:
        if v not in valid:
            raise ValueError(f"unknown {what} {v!r}; valid: {', '.join(valid)}")


@dataclass(frozen=True)
class EvidenceSettings(LMGridSettings):
    """The evidence grid: ``arms`` at each of ``widths`` (``depth`` pre-LN layers, ``n_heads``
    heads, MLP ``mlp_ratio`` x width) on ``train.data``; the sweep (``lr_grid``,
    ``sweep_steps``, ``sweep_seeds``; or fixed rates ``lr_by_width``, one per width); and
    ``secondary_arms`` at ``secondary_width`` on each of ``secondary_data``; ``related_arms``
    at ``related_width`` on ``train.data``."""

    widths: tuple[int, ...] = (16, 32, 64)
    depth: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    arms: tuple[str, ...] = ARMS
    lr_grid: tuple[float, ...] = (1e-3, 2e-3, 4e-3, 8e-3)
    lr_by_width: tuple[float, ...] = ()
    lr_extend: int = 3
    sweep_steps: int = 500
    sweep_seeds: tuple[int, ...] = (0, 1)
    secondary_width: int = 32
    secondary_data: tuple[str, ...] = SECONDARY_DATA
    secondary_arms: tuple[str, ...] = ARMS
    related_width: int = 32
    related_arms: tuple[str, ...] = RELATED_ARMS

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("widths", self.widths)
        _positive("lr_grid", self.lr_grid)
        if (not self.sweep_seeds or min(self.sweep_seeds) < 0
                or len(set(self.sweep_seeds)) != len(self.sweep_seeds)):
            raise ValueError(f"sweep_seeds must be distinct integers >= 0, got "
                             f"{','.join(map(str, self.sweep_seeds)) or 'none'}")
        if self.lr_extend < 0:
            raise ValueError(f"lr_extend must be >= 0, got {self.lr_extend}")
        if self.depth < 1 or self.n_heads < 1 or self.mlp_ratio < 1 or self.sweep_steps < 1:
            raise ValueError(f"depth, n_heads, mlp_ratio and sweep_steps must be >= 1, got "
                             f"{self.depth}, {self.n_heads}, {self.mlp_ratio}, "
                             f"{self.sweep_steps}")
        for w in (*self.widths, self.secondary_width):
            if w % self.n_heads:
                raise ValueError(f"width {w} is not divisible by n_heads={self.n_heads}")
        _members("arm", (*self.arms, *self.secondary_arms), ARMS)
        _members("related arm", self.related_arms, RELATED_ARMS)
        if self.related_arms:
            self._width_with_rate("related_width", self.related_width)
        for needed in ("vanilla", "dca"):
            if needed not in self.arms:
                raise ValueError(f"arms must include {needed} (D is measured against it), got "
                                 f"{','.join(self.arms)}")
        if self.lr_by_width and len(self.lr_by_width) != len(self.widths):
            raise ValueError(f"lr_by_width needs one rate per width ({len(self.widths)}), got "
                             f"{len(self.lr_by_width)}")
        if any(not lr > 0 for lr in self.lr_by_width):
            raise ValueError(f"lr_by_width must be rates > 0, got "
                             f"{','.join(map(str, self.lr_by_width))}")
        _members("secondary dataset", self.secondary_data, SECONDARY_DATA)
        if self.secondary_data:
            self._width_with_rate("secondary_width", self.secondary_width)

    def _width_with_rate(self, name: str, width: int) -> None:
        if width not in self.widths:
            raise ValueError(f"{name} {width} must be one of widths "
                             f"{','.join(map(str, self.widths))} (it takes that width's rate)")

    @classmethod
    def preset(cls, quick: bool) -> EvidenceSettings:
        if quick:  # seconds per run: two tiny widths, one layer, two seeds, bytes only
            return cls(seeds=(0, 1), train=QUICK_TRAIN, widths=(8, 16), depth=1, n_heads=2,
                       mlp_ratio=2, lr_grid=(3e-3, 6e-3), lr_extend=1, sweep_steps=10,
                       sweep_seeds=(0,),
                       secondary_width=16, secondary_data=("python-stdlib",),
                       secondary_arms=("vanilla", "dca"), related_width=16,
                       related_arms=("attn_res",))
        return cls(seeds=(0, 1, 2, 3, 4, 5), train=FULL_TRAIN)


def arm_spec(settings, quick: bool, arm: str, width: int, data: str, lr: float,
             prefix: str = "ev") -> RunSpec:
    """One arm at one width on ``data`` at learning rate ``lr`` (``settings``: any grid
    settings with ``depth``, ``n_heads`` and ``mlp_ratio``; ``prefix`` starts the label)."""
    residual, gate = ARM_MODEL[arm]
    model = {"residual": residual, "grn_gate": gate, "d_model": width,
             "n_heads": settings.n_heads, "d_mlp": settings.mlp_ratio * width,
             "n_layers": settings.depth, "max_len": settings.train.seq_len}
    if arm == "vanilla_matched":
        from dca_theory.lm.config import ModelConfig

        dca = ModelConfig(**{**model, "residual": "dca", "grn_gate": "bias_inside"})
        model["d_mlp"] = matched_vanilla_d_mlp(dca)[0]
    return spec(f"{prefix}-{arm}-w{width}-lr{lr:g}", data, quick, grid=settings,
                train_changes={"lr": lr}, **model)


def sweep_spec(settings: EvidenceSettings, quick: bool, width: int, lr: float,
               arm: str = "vanilla") -> RunSpec:
    """``arm`` (vanilla: the registered sweep) at one (width, rate) of the sweep:
    ``sweep_steps`` steps, ``sweep_seeds``, scored once at the end on the whole validation
    split. Other arms give the post-hoc check of whether they prefer another rate."""
    steps = settings.sweep_steps
    sweep = settings.replace(seeds=settings.sweep_seeds, train=settings.train.replace(
        steps=steps, eval_every=steps, log_every=min(settings.train.log_every, steps)))
    data = settings.train.data
    tag = "" if arm == "vanilla" else f"{arm}-"  # the registered sweep keeps its cache keys
    return dataclasses.replace(arm_spec(sweep, quick, arm, width, data, lr),
                               label=f"{data}-ev-sweep-{tag}w{width}-lr{lr:g}")


def sweep_specs(settings: EvidenceSettings, quick: bool) -> dict[tuple[int, float], RunSpec]:
    """The sweep's runs over ``lr_grid`` (before any extension past its ends)."""
    return {(w, lr): sweep_spec(settings, quick, w, lr)
            for w in settings.widths for lr in settings.lr_grid}


def best_rates(sweep: dict[tuple[int, float], dict]) -> dict[int, dict]:
    """Per width: the rate with the lowest mean whole-split validation loss, and every
    rate's mean validation perplexity (the recorded sweep; ``inf`` for a diverged rate)."""
    out: dict[int, dict] = {}
    for (w, lr), record in sorted(sweep.items()):
        out.setdefault(w, {"valid_ppl": {}})["valid_ppl"][f"{lr:g}"] = float(
            np.exp(np.mean(record["valid_loss"])))
    for w, entry in out.items():
        best = min(entry["valid_ppl"], key=entry["valid_ppl"].get)
        entry["lr"] = float(best)
        entry["at_grid_edge"] = best in (min(entry["valid_ppl"], key=float),
                                         max(entry["valid_ppl"], key=float))
    return out


def next_rate(settings: EvidenceSettings, width: int, tried: dict[float, dict]) -> float | None:
    """The rate to try next at ``width`` (twice the largest tried if it is the best, half the
    smallest if that is), or ``None`` once the best is interior or ``lr_extend`` is spent."""
    loss = {lr: float(np.mean(r["valid_loss"])) for lr, r in tried.items()}
    return rate_sweep.next_rate(settings.lr_grid, loss, settings.lr_extend)


def is_diverged(s: RunSpec, cache) -> bool:
    """Whether ``s`` was trained and its loss became non-finite (it is not retried)."""
    return (Path(cache) / s.key / DIVERGED).is_file()


def run_unless_diverged(s: RunSpec, cache, log=None) -> dict | None:
    """The cached record of ``s`` (trained if needed), or ``None`` if its loss became
    non-finite, now or in an earlier sitting: a result of that run, marked so that the grid
    goes on with the others instead of stopping or retrying it."""
    if is_diverged(s, cache):
        return None
    try:
        return ensure_run(s, cache, log=log)
    except FloatingPointError as err:
        write_json(Path(cache) / s.key / DIVERGED, {"key": s.key, "error": str(err)})
        remove_partial(Path(cache) / s.key)
        if log is not None:
            log(run=s.label, kind="diverged", error=str(err))
        return None


def _sweep_record(s: RunSpec, cache, log) -> dict:
    record = run_unless_diverged(s, cache, log)  # a diverged rate is worse than any other
    return {"valid_loss": [math.inf]} if record is None else record


def rates(settings: EvidenceSettings, quick: bool, cache, *, log=None,
          only_cached: bool = False) -> tuple[dict[int, dict] | None, list[str]]:
    """``(learning rate per width, missing run keys)``: ``lr_by_width`` if given, else the
    sweep's, its runs trained or read from the cache (with ``only_cached``, the keys of the
    sweep runs not cached yet instead, and ``None``)."""
    if settings.lr_by_width:
        return {w: {"lr": lr, "valid_ppl": {}, "at_grid_edge": False}
                for w, lr in zip(settings.widths, settings.lr_by_width)}, []
    records: dict[tuple[int, float], dict] = {}
    missing: list[str] = []
    for w in settings.widths:
        todo = list(settings.lr_grid)
        while todo:
            lr = todo.pop(0)
            s = sweep_spec(settings, quick, w, lr)
            if only_cached and not (is_cached(s, cache) or is_diverged(s, cache)):
                missing.append(s.key)
                continue
            records[(w, lr)] = _sweep_record(s, cache, log)
            if not todo and not missing:
                nxt = next_rate(settings, w, {r: rec for (v, r), rec in records.items()
                                              if v == w})
                todo = [] if nxt is None else [nxt]
    return (None, missing) if missing else (best_rates(records), [])


def grid_specs(settings: EvidenceSettings, quick: bool,
               lrs: dict[int, float]) -> dict[tuple[str, str, int], RunSpec]:
    """``(data, arm, width) -> spec``: the primary grid, then the secondary one, then the
    related-work arms (at ``related_width`` on the primary data)."""
    out = {(settings.train.data, arm, w): arm_spec(settings, quick, arm, w, settings.train.data,
                                                   lrs[w])
           for w in settings.widths for arm in settings.arms}
    w = settings.secondary_width
    for data in settings.secondary_data:
        for arm in settings.secondary_arms:
            out[(data, arm, w)] = arm_spec(settings, quick, arm, w, data, lrs[w])
    w, data = settings.related_width, settings.train.data
    for arm in settings.related_arms:
        out[(data, arm, w)] = arm_spec(settings, quick, arm, w, data, lrs[w])
    return out


def validate(quick: bool, settings: EvidenceSettings) -> None:
    """Build every spec once (placeholder rates) so that a bad model or training config the
    settings imply fails before anything trains."""
    sweep_specs(settings, quick)
    grid_specs(settings, quick, {w: settings.train.lr for w in settings.widths})
