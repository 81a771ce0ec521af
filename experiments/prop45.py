r"""Proposition 4.5 check: trained MLP nets stay in their stated classes.

Claim (``dca-paper.md`` §1.9): for f_t(z) = V_t φ(U_t z) with U_t ∈ R^{r_t×d} and
r_* = Σ r_t: C_base ⊆ {rank_BN ≤ min r_t}, C_res ⊆ {id + f: rank_BN f ≤ r_*}, C_GRN-v1 ⊆
{α id + f}, C_GRN-v2 ⊆ {D x + f(x)}. We train every kind on a full-rank target (so the nets
use all their capacity) and measure, at 32 inputs, the numerical rank (default tolerance
σ_max · d · eps, float64) of J_f(x) minus the Jacobian of the net's own input-slot term
(I, α I, D, or (b + ReLU(wᵀx)) ⊙ x for GRN-v3, which the paper does not cover). The bound must
hold exactly; J_f − I is also reported to show that the GRN classes are genuinely larger.

Command: ``dca-theory run prop45 [--quick] [--set KEY=VALUE ...]`` (``--show`` lists the settings).
Runtime: ~1–3 min on 2 idle CPU cores; quick < 1 minute.
Expected result: rank ≤ min r_t for base and ≤ r_* for every other kind (equality generically);
J_f − I has full rank d for the GRNs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
from tqdm import tqdm

from dca_theory import gates
from dca_theory import random_draws as draws
from dca_theory.io import RunDir
from dca_theory.nets import MLPResNet
from dca_theory.overrides import apply_overrides, check_at_least_one, record, run_dir, summary_entry
from dca_theory.residual import check_kind
from dca_theory.sim import BottleneckTeacher, ToyTrainConfig, fit_many, jacobian_rank

NAME = "prop45"


@dataclasses.dataclass(frozen=True)
class Prop45Config:
    dim: int = 24
    widths: tuple[int, ...] = (2, 3, 4)
    kinds: tuple[str, ...] = ("base", "res", "grn_v1", "grn_v2", "grn_v3")
    teacher_alpha: float = 2.0
    seeds: int = 2
    steps: int = 600
    batch_size: int = 64
    learning_rate: float = 3e-3
    jacobian_inputs: int = 32
    seed: int = 0
    # GRN-v3's gate: the printed form, as in the committed results (experiments/toy_gates.py
    # compares the gates of dca_theory.gates)
    gate: str = "paper"

    def __post_init__(self):
        if not self.widths or not self.kinds:
            raise ValueError("widths and kinds must not be empty")
        check_at_least_one(self, "dim", "seeds", "steps", "batch_size", "jacobian_inputs")
        bad = [w for w in self.widths if not 1 <= w <= self.dim]
        if bad:
            raise ValueError(f"width {bad[0]} out of range: need 1 <= width <= d={self.dim}")
        for kind in self.kinds:
            check_kind(kind)
        object.__setattr__(self, "gate", gates.canonical(self.gate))


QUICK = Prop45Config(dim=10, widths=(1, 2), kinds=("base", "res", "grn_v1"), seeds=1,
                     steps=50, jacobian_inputs=6)


def settings(quick: bool = False, overrides=()) -> Prop45Config:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return apply_overrides(QUICK if quick else Prop45Config(), overrides)


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    jax.config.update("jax_enable_x64", True)  # the default tolerance is float64 eps
    cfg = settings(quick, overrides)
    run = RunDir(out or run_dir(NAME, quick, overrides), record(cfg, overrides),
                 overwrite=overwrite)
    depth, r_star = len(cfg.widths), sum(cfg.widths)
    teacher = BottleneckTeacher(cfg.dim, cfg.dim, alpha=cfg.teacher_alpha,
                                key=jax.random.PRNGKey(cfg.seed + 3), dtype=jnp.float64)
    xs = draws.normal(jax.random.PRNGKey(cfg.seed + 4), (cfg.jacobian_inputs, cfg.dim),
                           jnp.float64)
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed), cfg.seeds)
    tcfg = ToyTrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, optimizer="adam",
                          learning_rate=cfg.learning_rate)
    results = {}
    for kind in tqdm(cfg.kinds, desc="prop45 kinds"):
        models = draws.build_each(lambda k, kind=kind: MLPResNet(
            cfg.dim, list(cfg.widths), depth, kind=kind, gate=cfg.gate, dtype=jnp.float64,
            key=k), keys)
        trained, losses = fit_many(models, teacher, keys, tcfg)
        bound = min(cfg.widths) if kind == "base" else r_star
        for s in range(cfg.seeds):
            m = jax.tree_util.tree_map(lambda a, s=s: a[s] if eqx.is_array(a) else a, trained)
            own = jacobian_rank(m, xs, subtract=m.skip)
            ident = jacobian_rank(m, xs, subtract="identity")
            row = {"kind": kind, "seed": s, "bound": bound, "rank_minus_own_skip": own.rank,
                   "rank_minus_identity": ident.rank, "holds": own.rank <= bound,
                   "loss_initial": float(losses[s, 0]), "loss_final": float(losses[s, -1]),
                   "spectrum_minus_own_skip": own.mean_spectrum.tolist()}
            run.log(**row)
            results[f"{kind}/seed={s}"] = row
    run.finish({"config": dataclasses.asdict(cfg), "r_star": r_star, "results": results,
                "all_hold": all(r["holds"] for r in results.values()),
                **summary_entry(overrides)})
    return run.path
