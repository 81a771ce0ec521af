r"""The one LM training loop: several seeds of one configuration trained at once (``vmap``).

Design. Three callers train the transformer LM: the CLI (``dca-theory lm train``, one seed, a
resumable work directory; :mod:`dca_theory.lm.train`), the experiments' run cache (several
seeds, every step's loss and time; :mod:`dca_theory.lab.seeds`) and the GPU scripts (many steps
per compiled call, batches drawn on the device; ``benchmarks/gpu_lm_evidence.py``). All three
run the pieces of this module, and keep only what is theirs (the CLI its files and metric
lines, the run cache its curves and records, the GPU script its token marks):

* **State.** Parameters, optimiser state and dropout keys carry a leading seed axis ``S`` (one
  seed is ``S = 1``): :func:`init_models` keys seed ``s``'s model with the first half of
  ``split(PRNGKey(s))`` and :func:`dropout_keys` gives the second half, for every caller alike.
* **Step.** :func:`make_chunk_step` is :func:`dca_theory.lm.steps.make_train_step` vmapped over
  seeds; ``k > 1`` steps run in one ``lax.scan`` inside one compiled call (``k = 1`` calls the
  step alone). A *sampler* gives each chunk its data on the host (:meth:`host`) and each step
  its batch inside the compiled call (:meth:`draw`): :class:`HostBatches` are the deterministic
  ``lm.data.train_batch(seed=s, step=t)`` batches of the CLI and the experiments (seed ``s``
  gives every architecture the same data order), :class:`DeviceWindows` the random windows the
  GPU scripts draw on the device.
* **Evaluation.** :func:`evaluate`: mean token NLL per seed over fixed batches of a split.
* **Loop.** :func:`train_loop`: progress bar, metrics fetched one chunk late if asked (the
  device never waits for the host), a non-finite loss or gradient norm raises
  :class:`NonFiniteLossError`, hooks after every chunk, and *stops* (steps where the caller
  evaluates or checkpoints; a chunk never runs past one).
* **Checkpoints.** :class:`dca_theory.lm.checkpoint.Checkpointer` with state
  ``(params_S, opt_state_S, rng_S)`` and a meta from :func:`checkpoint_meta` (step, seeds,
  model config, the caller's extras). Batches and dropout keys are functions of (seed, step),
  so a resumed run computes exactly what an uninterrupted one does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dca_theory import random_draws as draws
from dca_theory.io import to_jsonable
from dca_theory.lm import data as lm_data
from dca_theory.lm.steps import make_eval_step
from dca_theory.lm.train_config import LMTrainConfig


class NonFiniteLossError(FloatingPointError):
    """Training produced NaN/Inf; the message names the step and the seeds."""


def default_builder(cfg, *, key) -> eqx.Module:
    from dca_theory.lm.model import build_model

    return build_model(cfg, key=key)


def seed_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """``(init key, dropout key)`` of seed ``seed``."""
    init_key, rng = draws.split(jax.random.PRNGKey(int(seed)))
    return init_key, rng


def init_models(model_cfg, seeds: Sequence[int], *,
                build: Callable = default_builder) -> list[eqx.Module]:
    """One freshly initialised model per seed."""
    return [build(model_cfg, key=seed_keys(s)[0]) for s in seeds]


def dropout_keys(seeds: Sequence[int]) -> jax.Array:
    """The dropout keys of ``seeds``, stacked: ``[S, 2]``."""
    return jnp.stack([seed_keys(s)[1] for s in seeds])


def stack_models(models: Sequence[eqx.Module]):
    """``(params with leading seed axis, static)`` of equal-structure models."""
    params = draws.stack_leaves([eqx.filter(m, eqx.is_inexact_array) for m in models])
    return params, eqx.filter(models[0], eqx.is_inexact_array, inverse=True)


def init_optimizer(optimizer: optax.GradientTransformation, params):
    """Every seed's optimiser state for seed-stacked ``params``, in one compiled program (an
    eager ``vmap`` of ``optimizer.init`` compiles each leaf's initialiser apart: 0.8 s against
    0.3 s for a tiny DCA)."""
    return jax.jit(jax.vmap(optimizer.init))(params)


def seed_slice(tree, i: int):
    """Seed ``i``'s part of a seed-stacked tree."""
    return jax.tree_util.tree_map(lambda x: x[i], tree)


def check_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    seeds = tuple(int(s) for s in seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct integers, got {seeds!r}")
    return seeds


# ----------------------------------------------------------------------------- samplers


class HostBatches:
    """Seed ``s``'s batch of step ``t`` is ``lm_data.train_batch(tokens, seed=s, step=t)``.

    Without ``place`` a chunk of ``k`` steps is one NumPy array ``[k, S, B, L]`` per field. With
    ``place`` (the CLI: one seed, one step per call) the batch of ``rows`` is placed on the
    device mesh by ``place`` and the seed axis is added inside the compiled step, so that the
    mesh shards the batch rows."""

    def __init__(self, tokens, seeds: Sequence[int], *, seq_len: int, batch_size: int,
                 rows: slice | None = None, place: Callable[[dict], dict] | None = None):
        if place is not None and len(seeds) != 1:
            raise ValueError(f"placed host batches serve one seed, got {len(seeds)}")
        self.tokens, self.seeds, self.place = tokens, tuple(seeds), place
        self.rows = rows if rows is not None else slice(None)
        self.seq_len, self.batch_size = seq_len, batch_size

    def _batch(self, seed: int, step: int) -> dict:
        return lm_data.train_batch(self.tokens, seq_len=self.seq_len, batch_size=self.batch_size,
                                   seed=seed, step=step, rows=self.rows)

    def host(self, step0: int, k: int):
        if self.place is not None:
            if k != 1:
                raise ValueError(f"placed host batches run one step per call, got {k}")
            return self.place(self._batch(self.seeds[0], step0))
        per_step = [[self._batch(s, step0 + i) for s in self.seeds] for i in range(k)]
        return {f: np.stack([np.stack([b[f] for b in seeds]) for seeds in per_step])
                for f in per_step[0][0]}

    def draw(self, data, i, step):
        if self.place is not None:
            return jax.tree_util.tree_map(lambda x: x[None], data)
        return jax.tree_util.tree_map(lambda x: x[i], data)


class DeviceWindows:
    """Random windows of ``seq_len + 1`` tokens drawn on the device: seed ``s`` at step ``t``
    draws with ``fold_in(data_keys[s], t)``, so no host work sits between the steps of a chunk.
    ``tokens`` travels as an argument of the compiled call (a captured array would be baked into
    the program as a constant)."""

    def __init__(self, tokens: jax.Array, data_keys_S: jax.Array, *, seq_len: int,
                 batch_size: int):
        self.tokens, self.keys = tokens, data_keys_S
        self.seq_len, self.batch_size = seq_len, batch_size

    def host(self, step0: int, k: int):
        return self.tokens, self.keys

    def draw(self, data, i, step):
        tokens, keys = data
        seq, batch = self.seq_len, self.batch_size

        def one(key):
            starts = jax.random.randint(jax.random.fold_in(key, step), (batch,), 0,
                                        tokens.shape[0] - seq - 1)
            win = tokens[starts[:, None] + jnp.arange(seq + 1)[None, :]]
            return {"inputs": win[:, :-1], "targets": win[:, 1:],
                    "weights": jnp.ones((batch, seq), jnp.float32)}

        return jax.vmap(one)(keys)


# ----------------------------------------------------------------------------- compiled steps


def make_chunk_step(train_step: Callable, sampler, *, shardings=None):
    """``run(k, params_S, opt_state_S, rng_S, step0, data) -> (params_S, opt_state_S,
    metrics)``: ``k`` steps of ``train_step`` (one seed's step, from
    :func:`~dca_theory.lm.steps.make_train_step`) vmapped over seeds, in one compiled call (one
    compilation per ``k``); every metric has shape ``[k, S]``. ``shardings``: ``(params,
    opt_state, replicated, data)`` shardings of the CLI's mesh, or None."""
    step_fn = jax.vmap(train_step, in_axes=(0, 0, 0, 0, None))

    def chunk(k, params, opt_state, rng_S, step0, data):
        if k == 1:
            params, opt_state, m = step_fn(params, opt_state, rng_S,
                                           sampler.draw(data, 0, step0), step0)
            return params, opt_state, jax.tree_util.tree_map(lambda x: x[None], m)

        def body(carry, i):
            p, o = carry
            step = step0 + i
            p, o, m = step_fn(p, o, rng_S, sampler.draw(data, i, step), step)
            return (p, o), m

        (params, opt_state), m = jax.lax.scan(body, (params, opt_state),
                                              jnp.arange(k, dtype=jnp.int32))
        return params, opt_state, m

    compiled: dict[int, Callable] = {}

    def run(k: int, params, opt_state, rng_S, step0, data):
        if k not in compiled:
            kw = {}
            if shardings is not None:
                p_sh, o_sh, rep, d_sh = shardings
                kw = {"in_shardings": (p_sh, o_sh, rep, rep, d_sh),
                      "out_shardings": (p_sh, o_sh, rep)}
            compiled[k] = jax.jit(lambda *a, k=k: chunk(k, *a), donate_argnums=(0, 1), **kw)
        return compiled[k](params, opt_state, rng_S, np.int32(step0), data)

    return run


def make_eval_fn(static, cfg: LMTrainConfig, *, shardings=None):
    """``eval_fn(params_S, batch) -> (nll_sum_S, weight_sum_S)``, compiled; ``shardings``:
    ``(params, batch, replicated)`` shardings, or None."""
    fn = jax.vmap(make_eval_step(static, cfg), in_axes=(0, None))
    if shardings is None:
        return jax.jit(fn)
    p_sh, b_sh, rep = shardings
    return jax.jit(fn, in_shardings=(p_sh, b_sh), out_shardings=(rep, rep))


def evaluate(eval_fn, params_S, tokens: np.ndarray, *, seq_len: int, batch_size: int,
             max_batches: int | None = None,
             place: Callable[[dict], dict] | None = None) -> tuple[np.ndarray, int]:
    """``(mean token NLL per seed, tokens scored)`` over (up to ``max_batches`` of) the fixed
    batches of a split; ``place`` puts each batch on the device mesh."""
    nll, weight = 0.0, 0.0
    for batch in lm_data.eval_batches(tokens, seq_len=seq_len, batch_size=batch_size,
                                      max_batches=max_batches):
        s, w = eval_fn(params_S, place(batch) if place is not None else batch)
        nll, weight = nll + np.asarray(s, np.float64), weight + np.asarray(w, np.float64)
    weight = np.atleast_1d(weight)
    if not np.all(weight > 0):
        raise ValueError("cannot evaluate an empty split (0 tokens)")
    return np.atleast_1d(nll) / weight, int(weight[0])


# ----------------------------------------------------------------------------- the loop


def train_loop(params, opt_state, run, sampler, *, rng_S, start: int, steps: int,
               chunk: int = 1, seeds: Sequence[int] = (0,),
               on_metrics: Callable[[int, dict, float], None] | None = None,
               stops: Callable[[int], bool] = lambda done: False,
               at_stop: Callable[[int, object, object], None] | None = None,
               hooks: Sequence[Callable[[int], None]] = (), lag: bool = False, bar=None,
               non_finite: Callable[[str], BaseException] = NonFiniteLossError):
    """Train from step ``start`` to ``steps`` and return ``(params, opt_state)``.

    Chunks hold ``chunk`` steps, shortened so that none runs past a step where ``stops(done)``
    is true; there (and at the end) every pending metric is checked first, then
    ``at_stop(done, params, opt_state)`` runs (the caller's evaluation and checkpoint).
    ``on_metrics(step0, metrics, seconds)`` receives each chunk's metrics as NumPy ``[k, S]``
    arrays once checked and the wall seconds from the call to the fetch (one chunk late with
    ``lag``, so that the device never waits for the host; without it, the chunk's own time).
    ``hooks`` are called with the completed step count after each chunk. A non-finite loss or
    gradient norm raises ``non_finite(what)``."""
    pending: list = []

    def flush() -> None:
        while pending:
            step0, k, metrics, t0 = pending.pop(0)
            m = {key: np.asarray(v) for key, v in jax.device_get(metrics).items()}
            seconds = time.perf_counter() - t0
            ok = np.isfinite(m["loss"]) & np.isfinite(m["grad_norm"])
            if not ok.all():
                row, col = (int(x[0]) for x in np.nonzero(~ok))
                bad = [s for s, good in zip(seeds, ok[row]) if not good]
                which = f" for seeds {bad}" if len(seeds) > 1 else ""
                raise non_finite(f"non-finite loss {m['loss'][row, col]} / grad norm "
                                 f"{m['grad_norm'][row, col]} at step {step0 + row + 1}{which}")
            if bar is not None:
                bar.update(k)
            if on_metrics is not None:
                on_metrics(step0, m, seconds)

    step = start
    while step < steps:
        k = 1
        while k < min(chunk, steps - step) and not stops(step + k):
            k += 1
        data = sampler.host(step, k)
        t0 = time.perf_counter()
        params, opt_state, metrics = run(k, params, opt_state, rng_S, step, data)
        pending.append((step, k, metrics, t0))
        if lag:  # check the previous chunk while this one runs
            newest = pending.pop()
            flush()
            pending.append(newest)
        else:
            flush()
        step += k
        for hook in hooks:
            hook(step)
        if stops(step) or step == steps:
            flush()
            if at_stop is not None:
                at_stop(step, params, opt_state)
    flush()
    return params, opt_state


def checkpoint_meta(step: int, seeds: Sequence[int], model_cfg, **extra) -> dict:
    """The meta of a checkpoint after ``step`` steps; ``seeds`` marks its state as stacked
    over seeds (:meth:`dca_theory.lm.checkpoint.Checkpointer.restore`)."""
    return {"step": int(step), "data_step": int(step), "seeds": [int(s) for s in seeds],
            "model": to_jsonable(model_cfg), **extra}
