"""Step times of several LM configurations measured alternately in one process.

The run records' ``median_step_s`` were taken by whatever process trained each run, under
whatever load the machine had then; ratios between runs trained at different times are
therefore unreliable on a shared machine. :func:`alternated_step_times` instead compiles one
single-model train step per configuration (the project's AdamW step, synthetic tokens of the
run's vocabulary, batch and sequence length), warms each up, then times one step of every
configuration per round in a rotating order, so that load changes hit all alike; it reports the
median over rounds.
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dca_theory.lm.config import ModelConfig
from dca_theory.lm.model import build_model
from dca_theory.lm.optim import make_optimizer
from dca_theory.lm.steps import make_train_step
from dca_theory.lm.train_config import TrainConfig


def _setup(cfg: ModelConfig, tc: TrainConfig):
    params, static = eqx.partition(build_model(cfg, key=jax.random.PRNGKey(0)),
                                   eqx.is_inexact_array)
    opt = make_optimizer(tc)
    seq = tc.seq_len or cfg.max_len
    tokens = jax.random.randint(jax.random.PRNGKey(1), (tc.batch_size, seq + 1), 0,
                                cfg.vocab_size)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
             "weights": jnp.ones((tc.batch_size, seq), jnp.float32)}
    step = jax.jit(make_train_step(static, opt, tc))
    return step, [params, opt.init(params), jax.random.PRNGKey(2), batch]


def alternated_step_times(configs: dict[str, tuple[ModelConfig, TrainConfig]], *,
                          repeats: int = 15, warmup: int = 2) -> dict[str, dict]:
    """``{name: {"median_s", "times_s"}}``: single-model train-step wall times, alternated."""
    if repeats < 1 or warmup < 1:
        raise ValueError(f"repeats and warmup must be >= 1, got {repeats}, {warmup}")
    steps, states = {}, {}
    for name, (cfg, tc) in configs.items():
        steps[name], states[name] = _setup(cfg, tc)
        for t in range(warmup):  # the first call compiles
            p, o, _ = steps[name](*states[name], np.int32(t))
            states[name][:2] = [p, o]
        jax.block_until_ready(states[name][0])
    names, times = list(configs), {n: [] for n in configs}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            p, o, m = steps[name](*states[name], np.int32(warmup + r))
            jax.block_until_ready((p, m))
            times[name].append(time.perf_counter() - t0)
            states[name][:2] = [p, o]
    return {n: {"median_s": float(np.median(ts)), "times_s": ts} for n, ts in times.items()}
