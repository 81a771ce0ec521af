"""The settings and runs of the second evidence design (``paper/05_lm/evidence_design_2.md``):
every arm at its own learning rate, the three GRN-v3 gates, width 128, fresh seeds.

**Arms** (:data:`ARMS`), paired by seed: ``vanilla``; ``vanilla_matched`` (MLP widened to
DCA's non-embedding count); ``dca_<gate>`` for each gate of :data:`GATES` (names as in
:mod:`dca_theory.gates`). The related-work arms are those of the first design
(:data:`dca_theory.lab.lm_evidence.RELATED_ARMS`).

**Seeds.** ``seeds`` is the pool (100-111); a part that uses ``n`` seeds uses the first ``n``.
So seeds 100-107 are common to every PTB-char arm at widths up to 64 (``common_seeds``).

**Parts** (:data:`PARTS`, run in this order; a sitting may run a prefix, ``--set parts=A,B``):
A, the rate sweeps at ``widths``; B, the ranking check; C, the main grid at ``widths``;
D, the shared-rate comparison; E, the ``wide_widths`` (sweep and grid); F, the secondary corpus;
G, the related-work arms. How each is read: :mod:`dca_theory.lab.lm_evidence2_analysis`.

**Rates.** A sweep cell (data, arm, width) starts at ``r0 x start_factors`` (r0 from the first
design's sweeps, per family: :func:`r0`; at a wide width, the arm's best rate at the next
narrower width times the width ratio) and is extended by :mod:`dca_theory.lab.rate_sweep`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dca_theory.lab import lm_evidence as E
from dca_theory.lab.lm_runs import DATASETS, LMGridSettings, RunSpec

GATES: tuple[str, ...] = ("paper", "open", "bias_inside")
#: the arms every part compares; the DCA arms are ``dca_<gate>``
ARMS: tuple[str, ...] = ("vanilla", "vanilla_matched", *(f"dca_{g}" for g in GATES))
#: the arms of the largest seed counts (H1, H2) and of every wide width
CORE_ARMS: tuple[str, ...] = ("vanilla", "vanilla_matched", "dca_paper")
VANILLA_FAMILY: tuple[str, ...] = ("vanilla", "vanilla_matched")
PARTS: tuple[str, ...] = ("A", "B", "C", "D", "E", "F", "G")
PART_NAMES = {"A": "sweeps", "B": "ranking check", "C": "main grid", "D": "shared rate",
              "E": "wide widths", "F": "secondary corpus", "G": "related work"}
PREFIX = "ev2"  # the run-cache label prefix of this design's runs

#: 32 x 64 tokens x 4000 steps = 8.19M tokens, the first design's budget and schedule
FULL_TRAIN = E.FULL_TRAIN


def arm_of(gate: str) -> str:
    return f"dca_{gate}"


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _csv(values) -> str:
    return ",".join(map(str, values)) or "none"


@dataclass(frozen=True)
class RunGrid(LMGridSettings):
    """What one run needs of the design: its seeds, its training and the model's shape."""

    depth: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4


@dataclass(frozen=True)
class Evidence2Settings(LMGridSettings):
    """The second design. ``widths`` (every arm, H1, H2, H4) with ``r0_vanilla`` / ``r0_dca``
    the starting rate per width of the vanilla and the DCA (and related-work) family;
    ``wide_widths`` (the core arms and H4's gate); ``gates``; model ``depth``, ``n_heads``,
    MLP ``mlp_ratio`` x width. Seed counts: ``core_seeds`` per width of ``widths`` +
    ``wide_widths`` (the core arms; at a wide width every arm), ``gate_seeds`` (the other gates
    at ``widths``), ``common_seeds`` (the seed-clustered statistics), ``shared_seeds`` (part D),
    ``secondary_seeds``, ``related_seeds``. Sweep: ``sweep_steps`` on ``sweep_seeds``, starting
    at ``start_factors`` x r0, at most ``max_extend`` extensions; the ranking check at
    ``ranking_width`` within ``ranking_tolerance`` points. H5: ``kappas`` (headline first) and
    ``rank_positions``; ``h5_retrain`` retrains a vanilla run whose parameters are gone to
    measure its rank (:func:`dca_theory.lab.lm_runs.restore_params`; off: such a run waits).
    ``parts``: which parts this sitting runs."""

    widths: tuple[int, ...] = (16, 32, 64)
    r0_vanilla: tuple[float, ...] = (0.064, 0.032, 0.016)
    r0_dca: tuple[float, ...] = (0.032, 0.016, 0.008)
    wide_widths: tuple[int, ...] = (128,)
    gates: tuple[str, ...] = GATES
    depth: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    core_seeds: tuple[int, ...] = (12, 12, 8, 4)
    gate_seeds: int = 8
    common_seeds: int = 8
    shared_seeds: int = 6
    sweep_steps: int = 1000
    sweep_seeds: tuple[int, ...] = (100, 101)
    start_factors: tuple[float, ...] = (0.5, 1.0, 2.0)
    max_extend: int = 4
    ranking_width: int = 32
    ranking_tolerance: float = 0.5
    secondary_data: tuple[str, ...] = ("python-stdlib-bpe",)
    secondary_width: int = 32
    secondary_seeds: int = 8
    related_arms: tuple[str, ...] = E.RELATED_ARMS
    related_width: int = 32
    related_seeds: int = 8
    kappas: tuple[float, ...] = (0.5, 0.3, 0.8)
    rank_positions: int = 16
    h5_retrain: bool = False
    parts: tuple[str, ...] = PARTS

    def __post_init__(self) -> None:
        super().__post_init__()
        E._positive("widths", (*self.widths, *self.wide_widths))
        _check(not set(self.widths) & set(self.wide_widths),
               f"wide_widths {_csv(self.wide_widths)} must not repeat widths {_csv(self.widths)}")
        _check(not self.wide_widths or min(self.wide_widths) > max(self.widths),
               f"wide_widths {_csv(self.wide_widths)} must be wider than every width (their "
               f"starting rate comes from the next narrower width)")
        _check(len(self.widths) >= 2, f"widths needs >= 2 widths (a slope), got "
               f"{_csv(self.widths)}")
        for name in ("r0_vanilla", "r0_dca"):
            values = getattr(self, name)
            _check(len(values) == len(self.widths) and all(v > 0 for v in values),
                   f"{name} needs one rate > 0 per width ({len(self.widths)}), got "
                   f"{_csv(values)}")
        _check(len(self.core_seeds) == len(self.widths) + len(self.wide_widths),
               f"core_seeds needs one count per width and wide width "
               f"({len(self.widths) + len(self.wide_widths)}), got {_csv(self.core_seeds)}")
        counts = {"core_seeds": min(self.core_seeds), "gate_seeds": self.gate_seeds,
                  "common_seeds": self.common_seeds, "shared_seeds": self.shared_seeds,
                  "secondary_seeds": self.secondary_seeds, "related_seeds": self.related_seeds}
        for name, n in counts.items():
            _check(2 <= n <= len(self.seeds), f"{name} must lie in 2..{len(self.seeds)} (the "
                   f"seed pool), got {n}")
        _check(self.common_seeds <= min(self.gate_seeds, *self.core_seeds[:len(self.widths)]),
               f"common_seeds {self.common_seeds} must not exceed any arm's count at widths")
        _check(len(self.sweep_seeds) >= 1 and len(set(self.sweep_seeds)) == len(
            self.sweep_seeds) and min(self.sweep_seeds) >= 0,
            f"sweep_seeds must be distinct integers >= 0, got {_csv(self.sweep_seeds)}")
        E._positive("start_factors", self.start_factors)
        _check(self.max_extend >= 0, f"max_extend must be >= 0, got {self.max_extend}")
        _check(self.sweep_steps >= 1 and self.depth >= 1 and self.mlp_ratio >= 1
               and self.rank_positions >= 1, "sweep_steps, depth, mlp_ratio and "
               "rank_positions must be >= 1")
        for w in (*self.widths, *self.wide_widths):
            _check(w % self.n_heads == 0, f"width {w} is not divisible by n_heads={self.n_heads}")
        E._members("gate", self.gates, GATES)
        _check("paper" in self.gates, f"gates must include paper (the primary arm), got "
               f"{_csv(self.gates)}")
        E._members("related arm", self.related_arms, E.RELATED_ARMS)
        E._members("secondary dataset", self.secondary_data, DATASETS)
        E._members("part", self.parts, PARTS)
        for name in ("ranking_width", "secondary_width", "related_width"):
            _check(getattr(self, name) in self.widths, f"{name} {getattr(self, name)} must be "
                   f"one of widths {_csv(self.widths)} (its starting rate)")
        _check(bool(self.kappas) and all(0 < k < 1 for k in self.kappas),
               f"kappas must lie in (0, 1), got {_csv(self.kappas)}")
        _check(self.ranking_tolerance >= 0, "ranking_tolerance must be >= 0")

    @classmethod
    def preset(cls, quick: bool) -> Evidence2Settings:
        if not quick:
            return cls(seeds=tuple(range(100, 112)), train=FULL_TRAIN)
        # Eight runs of seconds each: two tiny widths, one layer, two gates, two seeds, one
        # starting rate per sweep, shared by both families (so part D reuses part C's run).
        # The sweep's budget and seeds are the main runs', so a sweep run at the chosen rate is
        # the main run (one cache entry). The quick mode checks the machinery, not the numbers;
        # the wide widths, the secondary corpus and the related work are left to --set.
        steps = 12
        train = E.QUICK_TRAIN.replace(steps=steps, eval_every=steps, log_every=steps,
                                      batch_size=4, seq_len=16, warmup_steps=2, eval_batches=1)
        return cls(seeds=(100, 101), train=train, widths=(8, 16), r0_vanilla=(8e-3, 4e-3),
                   r0_dca=(8e-3, 4e-3), wide_widths=(), gates=("paper", "bias_inside"),
                   depth=1, n_heads=2, mlp_ratio=2, core_seeds=(2, 2), gate_seeds=2,
                   common_seeds=2, shared_seeds=2, sweep_steps=steps, sweep_seeds=(100, 101),
                   start_factors=(1.0,), max_extend=0, ranking_width=8, secondary_data=(),
                   secondary_width=8, secondary_seeds=2, related_arms=(), related_width=8,
                   related_seeds=2, rank_positions=2)

    # ----------------------------------------------------------------------- what runs where
    def arms(self) -> tuple[str, ...]:
        """The arms at ``widths`` (vanilla, the matched vanilla, one DCA arm per gate)."""
        return ("vanilla", "vanilla_matched", *(arm_of(g) for g in self.gates))

    def pool(self, n: int) -> tuple[int, ...]:
        return tuple(self.seeds[:n])

    def main_seeds(self, arm: str, width: int) -> tuple[int, ...]:
        """The seeds of ``arm``'s full-budget run at ``width`` on the primary corpus."""
        all_widths = (*self.widths, *self.wide_widths)
        if arm in CORE_ARMS or width in self.wide_widths:
            return self.pool(self.core_seeds[all_widths.index(width)])
        return self.pool(self.gate_seeds)

    def r0(self, arm: str, width: int) -> float:
        """The first design's best rate for ``arm``'s family at ``width`` (one of ``widths``)."""
        table = self.r0_vanilla if arm in VANILLA_FAMILY else self.r0_dca
        return table[self.widths.index(width)]

    def run_spec(self, quick: bool, arm: str, width: int, data: str, lr: float,
                 seeds: tuple[int, ...], steps: int | None = None) -> RunSpec:
        """One run: the full budget, or ``steps`` steps scored once at the end (a sweep)."""
        train = self.train
        if steps is not None:
            train = train.replace(steps=steps, eval_every=steps,
                                  log_every=min(train.log_every, steps))
        # the model and the run's own seeds and training (not a new settings object: one run's
        # seeds need not satisfy the design's counts)
        grid = RunGrid(seeds=tuple(seeds), train=train, depth=self.depth,
                       n_heads=self.n_heads, mlp_ratio=self.mlp_ratio)
        return E.arm_spec(grid, quick, arm, width, data, lr, prefix=PREFIX)

    def sweep_spec(self, quick: bool, arm: str, width: int, data: str, lr: float) -> RunSpec:
        return self.run_spec(quick, arm, width, data, lr, self.sweep_seeds, self.sweep_steps)


def validate(quick: bool, settings: Evidence2Settings) -> None:
    """Build one spec per (arm, width, corpus) with placeholder rates, so that a model or
    training config the settings imply fails before anything trains."""
    for data in (settings.train.data, *settings.secondary_data):
        for w in (*settings.widths, *settings.wide_widths):
            for arm in (*settings.arms(), *settings.related_arms):
                settings.sweep_spec(quick, arm, w, data, settings.train.lr)
