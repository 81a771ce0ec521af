r"""Is the GRN gain on the α = 1 teacher an optimisation effect? (§2.5)

**Claim tested.** ``paper/02_toy_networks.md`` §2.5: on the ResNet-friendly teacher
``y = x + h(Gx)`` (k = 8, α = 1, d = 64) GRN-v1 beats the ResNet by a gain that *grows* with
width (1 - MSE_v1 / MSE_res = 0.01 / 0.14 / 0.59 at r = 4 / 16 / 64 after 1500 AdamW steps),
although the ResNet class already contains the teacher's form. §2.5 calls it an optimisation
effect of the extra scalar weights. If so, it should shrink when both nets are trained to
convergence.

**Design.** The §2.5 teacher (``rank_vs_width``'s third, built the same way: key ``seed + 102``,
G padded to 16 rows), T = 4 GELU blocks, widths 4, 16, 64, ResNet and GRN-v1 from the same
initial weights (paired), 2 restarts (initialisations) each. Three arms:

* ``adamw_short``: §2.5's protocol (AdamW lr 3e-3, weight decay 1e-3 on the layer weights, 1500
  steps of 128 fresh inputs): the gain under test, re-measured at the same seeds;
* ``adam_long``: Adam, no weight decay, ``adam_steps`` steps of ``adam_batch`` fresh inputs, the
  learning rate decayed from 3e-3 to 0 on a cosine (population risk, no overfitting possible);
* ``lbfgs``: full-batch L-BFGS (optax, zoom line search), no weight decay, ``lbfgs_steps``
  iterations on a fixed set of ``train_size`` inputs (a different optimiser family and a
  deterministic objective).

Per arm, kind and width: test MSE on 4096 fresh inputs (best and mean over restarts), the
training loss's relative fall over the last 20% of the run (a convergence check: near 0 =
converged), and the gain ``1 - MSE_v1 / MSE_res`` of the best restarts; ``survives`` is a
converged arm's gain divided by ``adamw_short``'s.

**Command.** ``dca-theory run toy_convergence [--quick] [--set KEY=VALUE ...]`` (e.g.
``--set widths=16,64 --set restarts=3 --set adam_steps=20000``).

**Runtime.** Full ~17 minutes on 2 busy cores (L-BFGS is two thirds of it); quick (d = 16, 2
widths, short runs) ~2 minutes, mostly compilation.

**Expected result** (measured; ``paper/02_toy_networks.md`` §2.5): best-restart gain 0.02 / 0.12
/ 0.61 at r = 4 / 16 / 64 for ``adamw_short``; 8000 Adam steps *raise* it to -0.05 / 0.22 / 0.84
(the ResNet has stopped improving, GRN-v1 has not); L-BFGS (not converged, overfits its 4096
inputs) reverses it: -0.35 / -1.13 / -2.49.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dca_theory import gates
from dca_theory import random_draws as draws
from dca_theory.io import RunDir
from dca_theory.nets import MLPResNet
from dca_theory.overrides import apply_overrides, check_at_least_one, record, run_dir, summary_entry
from dca_theory.residual import check_kind
from dca_theory.sim import BottleneckTeacher, ToyTrainConfig
from dca_theory.sim.train import fit

NAME = "toy_convergence"
ARMS: tuple[str, ...] = ("adamw_short", "adam_long", "lbfgs")
TAIL = 0.2  # the convergence check compares the loss at 80% of the run with its end


@dataclasses.dataclass(frozen=True)
class ConvergenceConfig:
    dim: int = 64
    depth: int = 4
    widths: tuple[int, ...] = (4, 16, 64)
    kinds: tuple[str, ...] = ("res", "grn_v1")
    teacher_rank: int = 8
    teacher_alpha: float = 1.0
    teacher_pad_rank: int = 16  # as rank_vs_width stores it beside its k = 16 teacher
    restarts: int = 2
    short_steps: int = 1500
    adam_steps: int = 8000
    adam_batch: int = 256
    learning_rate: float = 3e-3
    lbfgs_steps: int = 600
    train_size: int = 4096
    test_inputs: int = 4096
    log_every: int = 50
    seed: int = 0
    gate: str = "paper"

    def __post_init__(self):
        check_at_least_one(self, "dim", "depth", "restarts", "short_steps", "adam_steps",
                           "adam_batch", "lbfgs_steps", "train_size", "test_inputs",
                           "log_every")
        bad = [w for w in self.widths if not 1 <= w <= self.dim]
        if not self.widths or bad:
            raise ValueError(f"widths must be non-empty integers in [1, d={self.dim}], "
                             f"got {self.widths}")
        if "res" not in self.kinds:
            raise ValueError(f"kinds must include the baseline 'res', got {self.kinds}")
        for kind in self.kinds:
            check_kind(kind)
        if not 1 <= self.teacher_rank <= self.teacher_pad_rank <= self.dim:
            raise ValueError(f"need 1 <= teacher_rank <= teacher_pad_rank <= d, got "
                             f"{self.teacher_rank}, {self.teacher_pad_rank}, {self.dim}")
        object.__setattr__(self, "gate", gates.canonical(self.gate))


QUICK = ConvergenceConfig(dim=16, widths=(2, 8), teacher_rank=2, teacher_pad_rank=4,
                          short_steps=100, adam_steps=200, adam_batch=64, lbfgs_steps=40,
                          train_size=256, test_inputs=512, log_every=10)


def settings(quick: bool = False, overrides=()) -> ConvergenceConfig:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return apply_overrides(QUICK if quick else ConvergenceConfig(), overrides)


def teacher(cfg: ConvergenceConfig) -> BottleneckTeacher:
    return BottleneckTeacher(cfg.dim, cfg.teacher_rank, alpha=cfg.teacher_alpha,
                             pad_rank=cfg.teacher_pad_rank,
                             key=jax.random.PRNGKey(cfg.seed + 102))


def lbfgs_fit(model, x_NxD, y_NxD, steps: int):
    """Full-batch L-BFGS on the mean squared error; returns ``(model, losses)``."""
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def loss_fn(p):
        return jnp.mean((jax.vmap(eqx.combine(p, static))(x_NxD) - y_NxD) ** 2)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss_fn)

    def step(carry, _):
        p, s = carry
        value, grad = value_and_grad(p, state=s)
        with jax.numpy_dtype_promotion("standard"):  # optax's line search mixes scalar types
            updates, s = opt.update(grad, s, p, value=value, grad=grad, value_fn=loss_fn)
        return (optax.apply_updates(p, updates), s), value

    (params, _), losses = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
    return eqx.combine(params, static), losses


def _train(arm: str, models, keys, cfg: ConvergenceConfig, target):
    """Train a restart-stacked batch of models with one arm's optimiser."""
    if arm == "lbfgs":
        kx = jax.random.PRNGKey(cfg.seed + 7)
        x = jax.random.normal(kx, (cfg.train_size, cfg.dim), jnp.float32)
        y = jax.vmap(target)(x)
        return eqx.filter_vmap(lambda m: lbfgs_fit(m, x, y, cfg.lbfgs_steps))(models)
    if arm == "adamw_short":
        tcfg = ToyTrainConfig(steps=cfg.short_steps, batch_size=128, optimizer="adamw",
                              learning_rate=cfg.learning_rate, weight_decay=1e-3)
        lr = cfg.learning_rate
    else:
        tcfg = ToyTrainConfig(steps=cfg.adam_steps, batch_size=cfg.adam_batch, optimizer="adam",
                              learning_rate=cfg.learning_rate)
        lr = optax.cosine_decay_schedule(cfg.learning_rate, cfg.adam_steps)
    return eqx.filter_vmap(lambda m, k: fit(m, target, k, tcfg, lr))(models, keys)


_train_jit = eqx.filter_jit(_train)


def run_cell(arm: str, kind: str, width: int, cfg: ConvergenceConfig, target) -> list[dict]:
    """Every restart of one (arm, kind, width); the same initial weights for every kind."""
    keys = jnp.stack([jax.random.PRNGKey(cfg.seed * 7919 + 1000 * width + r)
                      for r in range(cfg.restarts)])
    models = draws.build_each(lambda k: MLPResNet(cfg.dim, width, cfg.depth, kind=kind,
                                                  gate=cfg.gate, key=k), keys)
    trained, losses = _train_jit(arm, models, keys, cfg, target)
    x_test = draws.normal(jax.random.PRNGKey(cfg.seed + 5), (cfg.test_inputs, cfg.dim),
                               jnp.float32)
    y_test = jax.vmap(target)(x_test)
    mse = eqx.filter_vmap(lambda m: jnp.mean((jax.vmap(m)(x_test) - y_test) ** 2))(trained)
    losses = np.asarray(losses)
    steps = losses.shape[1]
    every = max(1, cfg.log_every * steps // max(cfg.adam_steps, 1)) if arm == "lbfgs" else (
        cfg.log_every)
    rows = []
    for r in range(cfg.restarts):
        tail = losses[r, int((1 - TAIL) * (steps - 1))]
        end = float(np.mean(losses[r, -max(1, steps // 100):]))
        rows.append({"arm": arm, "kind": kind, "width": width, "restart": r,
                     "test_mse": float(mse[r]), "train_loss_final": end,
                     "tail_relative_fall": float((tail - end) / tail) if tail > 0 else 0.0,
                     "loss_curve": losses[r, ::every].tolist()})
    return rows


def aggregate(rows: list[dict], cfg: ConvergenceConfig) -> dict:
    """Per arm and width: best and mean test MSE per kind, the best-restart gain of each GRN
    over ``res``, and the share of ``adamw_short``'s gain a longer arm keeps."""
    cells: dict = {}
    for arm in ARMS:
        for w in cfg.widths:
            entry = {}
            for kind in cfg.kinds:
                sel = [r for r in rows if (r["arm"], r["kind"], r["width"]) == (arm, kind, w)]
                if sel:
                    mses = [r["test_mse"] for r in sel]
                    entry[kind] = {"best_mse": min(mses), "mean_mse": float(np.mean(mses)),
                                   "max_tail_fall": max(r["tail_relative_fall"] for r in sel)}
            for kind in cfg.kinds:
                if kind != "res" and kind in entry and "res" in entry:
                    entry[f"gain_{kind}"] = 1 - entry[kind]["best_mse"] / entry["res"]["best_mse"]
            cells[f"{arm}/r={w}"] = entry
    for arm in ARMS[1:]:
        for w in cfg.widths:
            for kind in cfg.kinds:
                key = f"gain_{kind}"
                short = cells.get(f"adamw_short/r={w}", {}).get(key)
                long = cells.get(f"{arm}/r={w}", {}).get(key)
                if short is not None and long is not None:
                    cells[f"{arm}/r={w}"][f"survives_{kind}"] = long / short if short else None
    return cells


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    run = RunDir(out or run_dir(NAME, quick, overrides), record(cfg, overrides),
                 overwrite=overwrite)
    target = teacher(cfg)
    rows = []
    for arm in ARMS:
        for w in cfg.widths:
            for kind in cfg.kinds:
                new = run_cell(arm, kind, w, cfg, target)
                for r in new:
                    run.log(**{k: v for k, v in r.items() if k != "loss_curve"})
                rows += new
    run.finish({"config": dataclasses.asdict(cfg), "cells": aggregate(rows, cfg),
                "runs": rows, **summary_entry(overrides)})
    return run.path
