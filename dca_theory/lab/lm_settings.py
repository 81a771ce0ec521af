"""The command-line settings of the language-model experiments (``dca-theory run lm_* --set``).

Every ``lm_*`` experiment's training runs are :class:`~dca_theory.lab.lm_runs.RunSpec` s built by
:mod:`dca_theory.lab.lm_grid` from one of these frozen dataclasses: the knobs every experiment
shares (seeds and the training config) in :class:`~dca_theory.lab.lm_runs.LMGridSettings`, an
experiment's own sweep (widths, depths, ks, residual kinds, datasets) in a subclass.
``preset(quick)`` gives the quick or full preset, which is exactly what the experiments have
always run, so without overrides every spec, cache key and committed result stays as it was.
An override changes the specs it touches; those get new cache keys (the key hashes the model
and training configs and the seeds). A run with overrides trains into ``runs/lm_runs`` (see
:func:`run_cache`), so the committed cache only ever holds the default grid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dca_theory import schemes
from dca_theory.lab.lm_runs import DATASETS, STANDARD_DATA, LMGridSettings, cache_dir
from dca_theory.lab.stability import SpikeRule
from dca_theory.overrides import apply_overrides, record, run_dir

__all__ = ["LMGridSettings", "AblationSettings", "RelatedSettings", "WidthSettings",
           "DepthSettings", "KSettings", "RetrofitSettings", "InputsSettings", "WeightsSettings",
           "StabilitySettings", "ablation_settings", "experiment_settings", "run_cache",
           "run_config"]

#: residual kinds the LM trains (``vanilla`` also spelled ``res``)
LM_KINDS: tuple[str, ...] = schemes.names(lm=True)
#: kinds with GRN-v3 gates, so that the gate choice changes training (dca_theory.gates)
GATED_KINDS: tuple[str, ...] = schemes.names(lm=True, gated=True)


def _check_kinds(kinds: tuple[str, ...], what: str = "kinds") -> None:
    if not kinds:
        raise ValueError(f"{what} must not be empty")
    for kind in kinds:
        schemes.check(kind, LM_KINDS, what="residual")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"{what} must not repeat a kind, got {','.join(kinds)}")


def _check_periodic_eval(train) -> None:
    """Time to reach (Table 1's metric) reads the periodic validation curve: it must have a
    point before the last step."""
    if train.eval_every >= train.steps:
        raise ValueError(f"train.eval_every={train.eval_every} must be below train.steps="
                         f"{train.steps} (time to reach needs a periodic validation curve)")


def _check_positive(name: str, values: tuple[int, ...]) -> None:
    if not values:
        raise ValueError(f"{name} must not be empty")
    bad = [v for v in values if v < 1]
    if bad:
        raise ValueError(f"{name} must be >= 1, got {bad[0]}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must not repeat a value, got {','.join(map(str, values))}")


@dataclass(frozen=True)
class MultiDatasetSettings(LMGridSettings):
    """An experiment with a table per dataset: the runs of dataset ``d`` train on ``d``, so
    ``train.data`` keeps its preset and ``datasets`` chooses."""

    datasets: tuple[str, ...] = (STANDARD_DATA,)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.datasets:
            raise ValueError("datasets must not be empty")
        for data in self.datasets:
            if data not in DATASETS:
                raise ValueError(f"unknown dataset {data!r}; valid: {', '.join(DATASETS)}")
        if self.train.data != STANDARD_DATA:
            raise ValueError(f"this experiment trains on each of its datasets; set datasets="
                             f"{self.train.data} instead of train.data")


@dataclass(frozen=True)
class AblationSettings(MultiDatasetSettings):
    """Paper Table 7: ``kinds`` with the paper's gate, plus ``open_gate_kinds`` again with the
    ``open`` gate (rows ``<kind>_open``, on Tiny Shakespeare only)."""

    kinds: tuple[str, ...] = ("vanilla", "grn_v1", "grn_v2", "grn_v3", "dca")
    open_gate_kinds: tuple[str, ...] = GATED_KINDS

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_kinds(self.kinds)
        for kind in self.open_gate_kinds:
            schemes.check(kind, GATED_KINDS, what="open-gate kind")

    @classmethod
    def _extra(cls, quick: bool) -> dict:
        return {"datasets": (STANDARD_DATA,) if quick else ("shakespeare", "ptb")}


@dataclass(frozen=True)
class RelatedSettings(MultiDatasetSettings):
    """Paper Table 5: vanilla, the related-work ``kinds`` and DCA."""

    kinds: tuple[str, ...] = ("denseformer", "hyper_connections", "laurel_pa")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_kinds(self.kinds)


@dataclass(frozen=True)
class WidthSettings(LMGridSettings):
    """Paper Table 2: vanilla and DCA at each of ``widths`` (``n_heads`` heads, MLP width
    ``mlp_ratio`` x width)."""

    widths: tuple[int, ...] = (16, 32, 64)
    n_heads: int = 4
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive("widths", self.widths)
        _check_positive("n_heads", (self.n_heads,))
        _check_positive("mlp_ratio", (self.mlp_ratio,))
        bad = [w for w in self.widths if w % self.n_heads]
        if bad:
            raise ValueError(f"width {bad[0]} is not divisible by n_heads={self.n_heads}")

    @classmethod
    def _extra(cls, quick: bool) -> dict:
        return {"widths": (8, 16), "n_heads": 2, "mlp_ratio": 2} if quick else {}


@dataclass(frozen=True)
class DepthSettings(LMGridSettings):
    """Paper Figure 6: vanilla and DCA at each of ``depths`` (layers)."""

    depths: tuple[int, ...] = (2, 4, 8)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive("depths", self.depths)
        _check_periodic_eval(self.train)

    @classmethod
    def _extra(cls, quick: bool) -> dict:
        return {"depths": (1, 2)} if quick else {}


@dataclass(frozen=True)
class KSettings(LMGridSettings):
    """Paper Table 1: vanilla and k-DCA for each of ``ks`` (none: full DCA) at ``depth``."""

    ks: tuple[int | None, ...] = (1, 2, 4, None)
    depth: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.ks:
            raise ValueError("ks must not be empty")
        bad = [k for k in self.ks if k is not None and k < 1]
        if bad:
            raise ValueError(f"ks must be integers >= 1 or none (full DCA), got {bad[0]}")
        if len(set(self.ks)) != len(self.ks):
            raise ValueError("ks must not repeat a value")
        _check_positive("depth", (self.depth,))
        _check_periodic_eval(self.train)

    @classmethod
    def _extra(cls, quick: bool) -> dict:
        return {"ks": (1, None), "depth": 3} if quick else {}


@dataclass(frozen=True)
class RetrofitSettings(LMGridSettings):
    """Paper Table 4: the trained vanilla model (``train``) continued for ``continue_steps``
    steps as vanilla and as DCA."""

    continue_steps: int = 200

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive("continue_steps", (self.continue_steps,))

    @classmethod
    def _extra(cls, quick: bool) -> dict:
        return {"continue_steps": 20} if quick else {}


@dataclass(frozen=True)
class InputsSettings(LMGridSettings):
    """Paper Table 9: GRN-v3 over the last ``window`` stack entries, without and with the
    model input."""

    window: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 2:  # the input slot plus at least one output
            raise ValueError(f"window must be >= 2, got {self.window}")

    @classmethod
    def _extra(cls, quick: bool) -> dict:
        return {"window": 2} if quick else {}


#: the rows of lm_weights: GRN-v3 and DCA with each gate of dca_theory.gates (the paper's
#: literal gate unsuffixed, the others as ``<kind>_<gate>``)
WEIGHT_GATES: tuple[str, ...] = ("paper", "open", "bias_inside", "small_init")
WEIGHT_KINDS: tuple[str, ...] = tuple(
    k if g == "paper" else f"{k}_{g}" for k in ("grn_v3", "dca") for g in WEIGHT_GATES)


def split_gate(row: str) -> tuple[str, str]:
    """``(kind, gate)`` of an lm_weights row (``dca_bias_inside`` -> ``("dca", "bias_inside")``)."""
    for gate in WEIGHT_GATES[1:]:
        if row.endswith("_" + gate):
            return row[: -len(gate) - 1], gate
    return row, "paper"


@dataclass(frozen=True)
class WeightsSettings(LMGridSettings):
    """Figure 10: the learned GRN weights of the ``kinds`` runs (the ablation's runs)."""

    kinds: tuple[str, ...] = WEIGHT_KINDS

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = [k for k in self.kinds if k not in WEIGHT_KINDS]
        if bad or not self.kinds:
            raise ValueError(f"kinds must be a non-empty subset of {', '.join(WEIGHT_KINDS)}, "
                             f"got {','.join(self.kinds) or 'none'}")



@dataclass(frozen=True)
class StabilitySettings(LMGridSettings):
    """Loss spikes in every cached run (``dca_theory.lab.stability``): a spike starts where the
    loss exceeds its running median over ``window`` steps by ``c`` robust deviations and at
    least ``abs_floor`` nats; ``c_grid`` is the sensitivity sweep. ``seeds`` and ``train`` set
    the vanilla and DCA runs a quick run trains first (a full run only reads the cache)."""

    window: int = 25
    c: float = 6.0
    abs_floor: float = 0.1
    c_grid: tuple[float, ...] = (4.0, 6.0, 8.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        for c in (self.c, *self.c_grid):
            SpikeRule(self.window, c, self.abs_floor)  # its own validation
        if self.c not in self.c_grid:
            raise ValueError(f"c_grid must include c={self.c}, got "
                             f"{','.join(map(str, self.c_grid))}")


def ablation_settings(grid: LMGridSettings) -> AblationSettings:
    """The ablation's settings with ``grid``'s seeds and training config, on ``train.data``
    (for the experiments that read the ablation's runs: lm_weights, lm_stability)."""
    return AblationSettings.preset(False).replace(
        seeds=grid.seeds, train=grid.train.replace(data=STANDARD_DATA),
        datasets=(grid.train.data,))


def experiment_settings(cls: type, quick: bool, overrides: Sequence[str] | Mapping[str, str],
                        build_specs: Callable[[bool, Any], Any]) -> Any:
    """``cls``'s quick or full preset with ``--set`` overrides applied, validated by the
    dataclass and then by building the experiment's specs once (so that a model or training
    config the settings imply, e.g. a width not divisible by the heads, fails at once with
    ModelConfig's or LMTrainConfig's one-line error, before anything trains)."""
    settings = apply_overrides(cls.preset(quick), overrides)
    build_specs(quick, settings)
    return settings


def run_cache(name: str, quick: bool, out: str | Path | None,
              overrides: Sequence[str] | Mapping[str, str] = ()) -> Path:
    """The run cache of an experiment run: next to ``out`` if given, else next to the run's
    default directory. Without overrides that is the mode's standard cache (``runs/lm_runs``
    quick, ``experiments/results/lm_runs`` full); with overrides it is ``runs/lm_runs`` in either
    mode, so that customised runs never add to the committed cache, which ``lm_stability``
    scans whole. (Unchanged runs of a full-mode customised study are retrained there; to share
    the committed cache deliberately, give ``--out`` next to it.)"""
    return cache_dir(Path(out) if out is not None else run_dir(name, quick, overrides))


def run_config(config: dict, settings: LMGridSettings,
               overrides: Sequence[str] | Mapping[str, str] = ()) -> Any:
    """What ``config.json`` holds: ``config`` as always without overrides, else with the
    settings and the overrides added."""
    return record({**config, "settings": settings} if overrides else config, overrides)
