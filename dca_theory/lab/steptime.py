"""Train-step timing shared by the experiments (``lm_k``) and the benchmarks (``benchmarks/``).

:func:`train_step_setup` builds the project's AdamW train step
(:func:`dca_theory.lm.steps.make_train_step`) for one model config, with a fixed synthetic batch
of the config's vocabulary. :func:`alternated_step_times` compiles one such step per
configuration, warms each up, then times one step of every configuration per round in a
rotating order, so that a change of machine load hits all alike; it reports the median over
rounds. (Run records' own step times were taken by whatever process trained each run, under the
load of that moment, and compare badly across runs on a shared machine.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dca_theory.lm.config import ModelConfig
from dca_theory.lm.model import build_model
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.steps import make_train_step
from dca_theory.lm.train_config import LMTrainConfig


def synthetic_batch(batch: int, seq: int, vocab: int) -> dict[str, jax.Array]:
    """Uniform random tokens (fixed key): a timing input, not data."""
    tokens = jax.random.randint(jax.random.PRNGKey(7), (batch, seq + 1), 0, vocab)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
            "weights": jnp.ones((batch, seq), jnp.float32)}


def train_step_setup(cfg: ModelConfig, tc: LMTrainConfig) -> tuple[Callable, tuple]:
    """``(step_fn, args)`` with ``step_fn(*args) -> (params, opt_state, metrics)`` (not jitted);
    ``args = (params, opt_state, rng, batch, step)`` for ``tc.batch_size`` x ``tc.seq_len``."""
    model = build_model(cfg, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    optimizer = make_lm_optimizer(tc)
    batch = synthetic_batch(tc.batch_size, tc.seq_len or cfg.max_len, cfg.vocab_size)
    args = (params, optimizer.init(params), jax.random.PRNGKey(1), batch,
            jnp.asarray(0, jnp.int32))
    return make_train_step(static, optimizer, tc), args


def alternated_step_times(configs: dict[str, tuple[ModelConfig, LMTrainConfig]], *,
                          repeats: int = 15, warmup: int = 2,
                          log: Callable[[str, float], None] | None = None) -> dict[str, dict]:
    """``{name: {"median_s", "times_s"}}``: train-step wall times, alternated across configs.

    ``log(name, seconds)`` is told how long each config took to compile and warm up.
    """
    if repeats < 1 or warmup < 1:
        raise ValueError(f"repeats and warmup must be >= 1, got {repeats}, {warmup}")
    steps, states = {}, {}
    for name, (cfg, tc) in configs.items():
        fn, args = train_step_setup(cfg, tc)
        steps[name] = jax.jit(fn)
        t0 = time.perf_counter()
        for _ in range(warmup):  # the first call compiles
            params, opt_state, _ = steps[name](*args)
            args = (params, opt_state, *args[2:])
        jax.block_until_ready(args[0])
        if log is not None:
            log(name, time.perf_counter() - t0)
        states[name] = args
    names, times = list(configs), {n: [] for n in configs}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            args = states[name]
            t0 = time.perf_counter()
            params, opt_state, metrics = steps[name](*args)
            jax.block_until_ready((params, metrics))
            times[name].append(time.perf_counter() - t0)
            states[name] = (params, opt_state, *args[2:])
    return {n: {"median_s": float(np.median(ts)), "times_s": ts} for n, ts in times.items()}
