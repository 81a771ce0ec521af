r"""GRN-v3's gates on the toy teachers: does any gate give GRN-v3 an advantage over GRN-v2?

Claim under test (paper §3.1, Theorem 4.2): GRN-v3's input-dependent gate adds expressivity
over GRN-v2. With the literal gate ``paper`` (b + ReLU(w·h), w = 0, ReLU'(0) = 0) w never
trains, so GRN-v3 *is* GRN-v2; the live gates (``open``, ``bias_inside``, ``small_init``,
:mod:`dca_theory.gates`) let w train. Measured on the teachers of the three toy experiments:

* ``prop45``: MLP-ResNet, d = 24, widths (2, 3, 4), full-rank bottleneck teacher with α = 2
  (:mod:`experiments.prop45`), Adam;
* ``rank_vs_width``: MLP-ResNet, d = 64, T = 4, widths {2, 16}, bottleneck teachers
  (k, α) ∈ {(2, 2.0), (8, 1.0)} (:mod:`experiments.rank_vs_width`), AdamW;
* ``risk_vs_params``: deep linear, d = 32, T = 4, ranks {1, 4}, A = I + U diag(λ) Uᵀ with
  λ ∈ [1, 4] (:mod:`experiments.risk_vs_params`); Adam on fresh mini-batches (GRN-v3 is not
  linear, so the population loss of the linear kinds does not apply).

Per run: test MSE on 4096 fresh inputs, the norm of w's gradient at step 0 (summed over the
net's GRNs) and the norm of w at the end. Decision rule, fixed before the runs: per setup and
gate, D = 100·(ln MSE_v3 − ln MSE_v2) paired by seed (same init and data); a gate gives GRN-v3
an advantage where D's 95 % t-interval lies below 0 *and* its Holm-adjusted p-value (over all
setup × gate tests) is below 0.05. With 3 seeds a t-interval is wide; the per-seed values are
saved with it.

Command: ``dca-theory run toy_gates [--quick] [--set KEY=VALUE ...]``.
Runtime: full 28 min on the loaded 2 cores (7 configurations × 5 models, one compiled program
each); quick about 1.5 min there.
Expected result (measured, ``paper/02_toy_networks.md`` §2.6): ``paper`` gives GRN-v2's numbers
(w's gradient and final norm exactly 0); on the rank_vs_width teachers ``bias_inside`` lowers
the error by 18–90 % of ln MSE in every seed (confirmed with 6 fresh seeds), the other gates show
no consistent sign; in the linear model only ``open`` gains (about 2 %).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats
from tqdm import tqdm

from dca_theory import gates
from dca_theory import random_draws as draws
from dca_theory.io import RunDir
from dca_theory.lab.statistics import holm, paired
from dca_theory.nets import DeepLinear, MLPResNet
from dca_theory.overrides import apply_overrides, check_at_least_one, record, run_dir, summary_entry
from dca_theory.residual import AbstractCombiner
from dca_theory.sim import BottleneckTeacher, ToyTrainConfig, fit_many, spectral_target

NAME = "toy_gates"
SETUPS: tuple[str, ...] = ("prop45", "rank_vs_width", "risk_vs_params")


@dataclasses.dataclass(frozen=True)
class GatesConfig:
    gates: tuple[str, ...] = ("paper", "open", "bias_inside", "small_init")
    setups: tuple[str, ...] = SETUPS
    seeds: int = 3
    scale: float = 1.0  # multiplies every setup's steps (quick mode: fewer)
    test_inputs: int = 4096
    seed: int = 0

    def __post_init__(self):
        if not self.gates or not self.setups:
            raise ValueError("gates and setups must not be empty")
        object.__setattr__(self, "gates", tuple(gates.canonical(g) for g in self.gates))
        for s in self.setups:
            if s not in SETUPS:
                raise ValueError(f"unknown setup {s!r}; valid: {', '.join(SETUPS)}")
        check_at_least_one(self, "test_inputs")
        if self.seeds < 2:
            raise ValueError(f"seeds must be >= 2 (paired differences), got {self.seeds}")
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")


QUICK = GatesConfig(gates=("paper", "bias_inside"), setups=("prop45", "risk_vs_params"),
                    seeds=2, scale=0.05, test_inputs=512)


def settings(quick: bool = False, overrides=()) -> GatesConfig:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return apply_overrides(QUICK if quick else GatesConfig(), overrides)


def _configs(setup: str, quick: bool):
    """``(label, build(kind, gate, key), teacher, train config, d)`` of one setup."""
    f32 = jnp.float32
    if setup == "prop45":
        d = 10 if quick else 24
        teacher = BottleneckTeacher(d, d, alpha=2.0, key=jax.random.PRNGKey(3), dtype=f32)
        tcfg = ToyTrainConfig(steps=600, batch_size=64, optimizer="adam", learning_rate=3e-3)
        yield ("widths=2,3,4", lambda kind, gate, k: MLPResNet(
            d, [2, 3, 4], 3, kind=kind, gate=gate, key=k), teacher, tcfg, d)
    elif setup == "rank_vs_width":
        d = 16 if quick else 64
        tcfg = ToyTrainConfig(steps=1500, batch_size=128, optimizer="adamw",
                              learning_rate=3e-3, weight_decay=1e-3)
        for i, (rank, alpha) in enumerate(((2, 2.0), (8, 1.0))):
            teacher = BottleneckTeacher(d, rank, alpha=alpha, key=jax.random.PRNGKey(100 + i),
                                        dtype=f32)
            for width in (2, 16):
                yield (f"k={rank},alpha={alpha},width={width}", lambda kind, gate, k, w=width:
                       MLPResNet(d, w, 4, kind=kind, gate=gate, key=k), teacher, tcfg, d)
    else:
        d = 12 if quick else 32
        teacher = spectral_target(d, 1.0, 4.0, key=jax.random.PRNGKey(1), dtype=f32)
        tcfg = ToyTrainConfig(steps=3000, batch_size=256, optimizer="adam", learning_rate=3e-3)
        for rank in (1, 4):
            yield (f"rank={rank}", lambda kind, gate, k, r=rank: DeepLinear(
                d, r, 4, kind=kind, gate=gate, key=k), teacher, tcfg, d)


def _w_norm(tree) -> jax.Array:
    """L2 norm of every GRN-v3 w in ``tree`` together (0 for a net without gates)."""
    is_c = lambda x: isinstance(x, AbstractCombiner)  # noqa: E731
    ws = [c.w for c in jax.tree_util.tree_leaves(tree, is_leaf=is_c)
          if is_c(c) and getattr(c, "w", None) is not None]
    return jnp.sqrt(sum(jnp.sum(w**2) for w in ws)) if ws else jnp.zeros(())


@eqx.filter_jit
def _step0_w_grad(models, teacher, x):
    def one(m):
        grads = eqx.filter_grad(
            lambda m: jnp.mean((jax.vmap(m)(x) - jax.vmap(teacher)(x)) ** 2))(m)
        return _w_norm(grads)

    return eqx.filter_vmap(one)(models)


@eqx.filter_jit
def _test_mse(models, teacher, x):
    return eqx.filter_vmap(
        lambda m: jnp.mean((jax.vmap(m)(x) - jax.vmap(teacher)(x)) ** 2))(models)


def _train(build, kind, gate, teacher, tcfg, dim, cfg) -> dict:
    keys = jnp.stack([jax.random.PRNGKey(cfg.seed * 1009 + s) for s in range(cfg.seeds)])
    models = draws.build_each(lambda k: build(kind, gate, k), keys)
    x0 = draws.normal(jax.random.PRNGKey(cfg.seed + 11), (256, dim), jnp.float32)
    grad0 = _step0_w_grad(models, teacher, x0)
    tcfg = dataclasses.replace(tcfg, steps=max(10, round(tcfg.steps * cfg.scale)))
    trained, losses = fit_many(models, teacher, keys, tcfg)
    x_test = draws.normal(jax.random.PRNGKey(cfg.seed + 12), (cfg.test_inputs, dim),
                               jnp.float32)
    return {"test_mse": np.asarray(_test_mse(trained, teacher, x_test)).tolist(),
            "w_grad_step0": np.asarray(grad0).tolist(),
            "w_norm_final": np.asarray(eqx.filter_vmap(_w_norm)(trained)).tolist(),
            "train_loss_final": np.asarray(losses[:, -1]).tolist(), "steps": tcfg.steps}


def compare(rows: dict) -> list[dict]:
    """Per setup, configuration and gate: D = 100·(ln MSE_v3 − ln MSE_v2), paired by seed, with
    its t-interval and the Holm-adjusted p-value over every test; ``advantage`` by the rule of
    the module docstring."""
    out = []
    for (setup, label), by_kind in rows.items():
        base = np.log(by_kind["grn_v2"]["test_mse"])
        for gate, r in by_kind.items():
            if gate == "grn_v2":
                continue
            d = paired(100 * base, 100 * np.log(r["test_mse"]))
            out.append({"setup": setup, "config": label, "gate": gate, "D": d,
                        "w_grad_step0_mean": float(np.mean(r["w_grad_step0"])),
                        "w_norm_final_mean": float(np.mean(r["w_norm_final"]))})
    # a test without a p-value (zero spread: the paper gate equals GRN-v2) counts as p = 1
    ps = [1.0 if c["D"]["p_value"] is None else c["D"]["p_value"] for c in out]
    for c, p in zip(out, holm(ps)):
        ci = c["D"]["ci95"]
        c["holm_p"] = p
        c["advantage"] = bool(ci is not None and ci[1] < 0 and p < 0.05)
    return out


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    run = RunDir(out or run_dir(NAME, quick, overrides), record(cfg, overrides),
                 overwrite=overwrite)
    jobs = [(s, c) for s in cfg.setups for c in _configs(s, quick)]
    rows: dict = {}
    with tqdm(total=len(jobs) * (len(cfg.gates) + 1), desc="toy_gates runs") as bar:
        for setup, (label, build, teacher, tcfg, dim) in jobs:
            by_kind = rows.setdefault((setup, label), {})
            for gate in ("grn_v2", *cfg.gates):
                kind = "grn_v2" if gate == "grn_v2" else "grn_v3"
                r = _train(build, kind, gates.DEFAULT_GATE if gate == "grn_v2" else gate,
                           teacher, tcfg, dim, cfg)
                by_kind[gate] = r
                run.log(setup=setup, config=label, gate=gate, **r)
                bar.update()
    comparisons = compare(rows)
    run.finish({"config": dataclasses.asdict(cfg), "comparisons": comparisons,
                "runs": [{"setup": s, "config": c, "gate": g, **r}
                         for (s, c), by in rows.items() for g, r in by.items()],
                "any_advantage": any(c["advantage"] for c in comparisons),
                "t_critical_95": float(stats.t.ppf(0.975, cfg.seeds - 1)),
                **summary_entry(overrides)})
    return run.path
