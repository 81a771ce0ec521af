r"""Train several seeds of one LM configuration at once (``vmap`` over seeds), for experiments.

:func:`dca_theory.lm.train.train_and_evaluate` trains one model into a resumable work directory
with checkpoints; the claim experiments of ``experiments/lm_*.py`` instead need many small runs
with every step's loss (for spike counts) and wall time (for time-to-quality). This module reuses
the very same pieces: :func:`~dca_theory.lm.steps.make_train_step` (loss, AdamW, the paper's
schedule), :func:`~dca_theory.lm.steps.make_eval_step` and the deterministic batches of
:mod:`dca_theory.lm.data`, and maps them over a leading seed axis ``S``.

Seed ``s`` gets its own initialisation key (``PRNGKey(s)``, split as in ``train_and_evaluate``),
its own data order (``train_batch(..., seed=s, step=t)``) and its own dropout keys, so the
seeds are independent runs that share one compiled step. The same seed gives *different
architectures the same data order*, so differences between residual kinds are paired by seed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from dca_theory.lab import seed_checkpoint
from dca_theory.lm import data as lm_data
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.params import count_params
from dca_theory.lm.steps import make_eval_step, make_train_step
from dca_theory.lm.train import default_builder, resolve_configs
from dca_theory.lm.train_config import LMTrainConfig


@dataclass
class SeedRuns:
    """What :func:`train_lm_seeds` measured. Arrays have a leading seed axis ``S``.

    ``loss_SxT`` / ``grad_norm_SxT``: training loss and gradient norm of every step;
    ``step_time_T``: wall seconds of every (all-seed) step, the first one including compilation;
    ``evals``: ``{"step", "valid_loss": [S]}`` every ``eval_every`` steps (on
    ``eval_batches`` batches) and at the end (whole split); ``final``: whole-split valid / test
    loss per seed.
    """

    model_cfg: ModelConfig
    train_cfg: LMTrainConfig
    seeds: tuple[int, ...]
    n_params: int
    loss_SxT: np.ndarray
    grad_norm_SxT: np.ndarray
    step_time_T: np.ndarray
    evals: list[dict] = field(default_factory=list)
    final: dict[str, np.ndarray] = field(default_factory=dict)
    params: object = None  # stacked trained parameters (leading axis S)
    static: object = None
    restart_steps: tuple[int, ...] = (0,)  # steps whose time includes compilation (a process start)

    def model(self, i: int):
        """The trained model of the ``i``-th seed."""
        return eqx.combine(jax.tree_util.tree_map(lambda x: x[i], self.params), self.static)

    @property
    def median_step_s(self) -> float:
        """Median wall time of one all-seed step, the compiling steps (every process start:
        step 0 and each resume) excluded."""
        keep = np.ones(len(self.step_time_T), bool)
        keep[list(self.restart_steps)] = False
        return float(np.median(self.step_time_T[keep] if keep.any() else self.step_time_T))

    def record(self) -> dict:
        """A JSON-ready summary (per-seed numbers, no per-step arrays)."""
        final = {f"{k}_loss": v.tolist() for k, v in self.final.items()}
        final |= {f"{k}_ppl": np.exp(v).tolist() for k, v in self.final.items()}
        return {"n_params": self.n_params, "seeds": list(self.seeds),
                "median_step_s": self.median_step_s, "compile_step_s": float(self.step_time_T[0]),
                "restart_steps": list(self.restart_steps),
                "final_train_loss": self.loss_SxT[:, -1].tolist(),
                "valid_history": [{"step": e["step"], "valid_ppl": np.exp(e["valid_loss"]).tolist()}
                                  for e in self.evals], **final}


def stack_models(models: Sequence[eqx.Module]):
    """``(params with leading seed axis, static)`` of equal-structure models."""
    params = [eqx.filter(m, eqx.is_inexact_array) for m in models]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params)
    return stacked, eqx.filter(models[0], eqx.is_inexact_array, inverse=True)


def init_models(model_cfg: ModelConfig, seeds: Sequence[int], *,
                build: Callable = default_builder) -> list[eqx.Module]:
    """One freshly initialised model per seed, keyed exactly as ``train_and_evaluate`` does."""
    return [build(model_cfg, key=jax.random.split(jax.random.PRNGKey(int(s)))[0]) for s in seeds]


def _stacked_batch(tokens, seeds, step: int, seq_len: int, batch_size: int) -> dict:
    batches = [lm_data.train_batch(tokens, seq_len=seq_len, batch_size=batch_size, seed=int(s),
                                   step=step) for s in seeds]
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def _evaluate(eval_fn, params, tokens, *, seq_len, batch_size, max_batches) -> np.ndarray:
    """Mean token NLL per seed over (up to ``max_batches`` batches of) a split."""
    nll, weight = 0.0, 0.0
    for batch in lm_data.eval_batches(tokens, seq_len=seq_len, batch_size=batch_size,
                                      max_batches=max_batches):
        s, w = eval_fn(params, batch)
        nll, weight = nll + np.asarray(s, np.float64), weight + np.asarray(w, np.float64)
    return nll / weight


def train_lm_seeds(model_cfg: ModelConfig, train_cfg: LMTrainConfig, seeds: Sequence[int], *,
                   corpus: lm_data.Corpus | None = None, models: Sequence[eqx.Module] | None = None,
                   build: Callable = default_builder, desc: str | None = None,
                   log: Callable[..., None] | None = None, keep_params: bool = False,
                   final_batches: int | None = None, checkpoint: str | Path | None = None,
                   checkpoint_every: int | None = None) -> SeedRuns:
    """Train ``len(seeds)`` models of ``model_cfg`` with ``train_cfg`` (its ``seed`` is ignored).

    ``models`` gives the starting models (one per seed, e.g. retrofitted ones); by default they
    are freshly initialised. ``log(**record)`` receives every ``log_every``-th step and every
    evaluation (``seed``-indexed lists). A non-finite loss stops with ``FloatingPointError``.

    ``checkpoint``: a file for mid-run checkpoints (:mod:`dca_theory.lab.seed_checkpoint`),
    written every ``checkpoint_every`` steps (default: ``train_cfg.eval_every``); if it exists the
    run continues from it, with the same result as an uninterrupted run. The caller deletes it
    once the run's results are saved.
    """
    train_cfg = train_cfg.validate()
    seeds = tuple(int(s) for s in seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct integers, got {seeds!r}")
    if train_cfg.grad_accum != 1 or train_cfg.fsdp:
        raise ValueError("train_lm_seeds supports grad_accum=1 and fsdp=False only")
    if corpus is None:
        corpus = lm_data.load_corpus(train_cfg.data, train_cfg.data_dir,
                                     bpe_vocab_size=train_cfg.bpe_vocab_size)
    model_cfg, seq_len = resolve_configs(model_cfg, train_cfg, corpus)
    if models is None:
        models = init_models(model_cfg, seeds, build=build)
    if len(models) != len(seeds):
        raise ValueError(f"got {len(models)} starting models for {len(seeds)} seeds")
    params, static = stack_models(models)
    optimizer = make_lm_optimizer(train_cfg)
    opt_state = jax.vmap(optimizer.init)(params)
    rng_S = jnp.stack([jax.random.split(jax.random.PRNGKey(s))[1] for s in seeds])
    step_fn = jax.jit(jax.vmap(make_train_step(static, optimizer, train_cfg),
                               in_axes=(0, 0, 0, 0, None)), donate_argnums=(0, 1))
    eval_fn = jax.jit(jax.vmap(make_eval_step(static, train_cfg), in_axes=(0, None)))
    eval_kw = {"seq_len": seq_len, "batch_size": train_cfg.batch_size}

    n_steps, n_seeds = train_cfg.steps, len(seeds)
    loss = np.zeros((n_seeds, n_steps))
    gnorm = np.zeros((n_seeds, n_steps))
    times = np.zeros(n_steps)
    evals: list[dict] = []
    start, restarts = 0, [0]
    if checkpoint is not None:
        fp = seed_checkpoint.fingerprint(model_cfg, train_cfg, seeds, (params, opt_state))
        every = checkpoint_every or train_cfg.eval_every
        partial = seed_checkpoint.load(checkpoint, (params, opt_state), fp)
        if partial is not None:
            start, (params, opt_state), evals = partial.step, partial.state, partial.evals
            loss[:, :start], gnorm[:, :start] = partial.loss_SxT, partial.grad_norm_SxT
            times[:start], restarts = partial.step_time_T, [*partial.restart_steps, start]
            print(f"resuming {desc or model_cfg.residual} from step {start} of {n_steps} "
                  f"({checkpoint})", file=sys.stderr)
    bar = tqdm(total=n_steps, initial=start, desc=desc or model_cfg.residual,
               disable=not train_cfg.progress, unit="step", dynamic_ncols=True, leave=False)
    try:
        for step in range(start, n_steps):
            batch = _stacked_batch(corpus.train, seeds, step, seq_len, train_cfg.batch_size)
            start = time.perf_counter()
            params, opt_state, metrics = step_fn(params, opt_state, rng_S, batch, np.int32(step))
            m = jax.device_get(metrics)  # waits for the step: the time below is the step's
            times[step] = time.perf_counter() - start
            loss[:, step], gnorm[:, step] = m["loss"], m["grad_norm"]
            if not (np.all(np.isfinite(m["loss"])) and np.all(np.isfinite(m["grad_norm"]))):
                bad = [s for s, v in zip(seeds, m["loss"]) if not np.isfinite(v)]
                raise FloatingPointError(f"non-finite loss at step {step + 1} for seeds {bad} "
                                         f"({model_cfg.residual}, {train_cfg.data})")
            done = step + 1
            bar.update(1)
            if log is not None and (done % train_cfg.log_every == 0 or done == n_steps):
                log(step=done, kind="train", loss=m["loss"].tolist(),
                    grad_norm=m["grad_norm"].tolist(), step_s=times[step])
            if done % train_cfg.eval_every == 0 and done != n_steps:
                v = _evaluate(eval_fn, params, corpus.valid, **eval_kw,
                              max_batches=train_cfg.eval_batches)
                evals.append({"step": done, "valid_loss": v})
                bar.set_postfix(valid_ppl=f"{float(np.exp(v.mean())):.2f}")
                if log is not None:
                    log(step=done, kind="eval", valid_loss=v.tolist())
            if checkpoint is not None and done % every == 0 and done != n_steps:
                seed_checkpoint.save(checkpoint, done, (params, opt_state), loss, gnorm, times,
                                     evals, restarts, fp)
    finally:
        bar.close()
    final = {s: _evaluate(eval_fn, params, corpus.split(s), **eval_kw, max_batches=final_batches)
             for s in ("valid", "test")}
    evals.append({"step": n_steps, "valid_loss": final["valid"]})
    if log is not None:
        log(step=n_steps, kind="final", **{f"{s}_loss": v.tolist() for s, v in final.items()})
    n_params = count_params(eqx.combine(jax.tree_util.tree_map(lambda x: x[0], params), static))
    return SeedRuns(model_cfg, train_cfg, seeds, n_params, loss, gnorm, times, evals, final,
                    params if keep_params else None, static if keep_params else None,
                    tuple(restarts))
