r"""Train several seeds of one LM configuration at once, for experiments: the per-step record.

The loop is :func:`dca_theory.lm.seed_loop.train_loop` (seeds vmapped in one compiled step; the
CLI trains its one seed through the same loop). The claim experiments of ``experiments/lm_*.py``
need many small runs with every step's loss (for spike counts) and wall time (for
time-to-quality); :func:`train_lm_seeds` keeps those, evaluates on the validation split every
``eval_every`` steps, and checkpoints in the loop's format, so that a run interrupted with its
sitting continues from its last checkpoint and ends exactly where an uninterrupted run ends.

Seed ``s`` gets its own initialisation key (``PRNGKey(s)``, split as in ``train_and_evaluate``),
its own data order (``train_batch(..., seed=s, step=t)``) and its own dropout keys, so the
seeds are independent runs that share one compiled step. The same seed gives *different
architectures the same data order*, so differences between residual kinds are paired by seed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
from tqdm.auto import tqdm

from dca_theory.io import to_jsonable
from dca_theory.lm import data as lm_data
from dca_theory.lm import seed_loop as sl
from dca_theory.lm.checkpoint import Checkpointer
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.params import count_params
from dca_theory.lm.seed_loop import default_builder, init_models, stack_models
from dca_theory.lm.steps import make_train_step
from dca_theory.lm.train import resolve_configs
from dca_theory.lm.train_config import LMTrainConfig

__all__ = ["SeedRuns", "fingerprint", "init_models", "same_run", "stack_models",
           "train_lm_seeds"]

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


def fingerprint(model_cfg, train_cfg, seeds, state) -> str:
    """A JSON string identifying the run a checkpoint belongs to (``progress``, ``log_every`` and
    ``data_dir`` excluded: they do not change the trained result)."""
    train = to_jsonable(train_cfg)
    for volatile in ("progress", "log_every", "data_dir"):
        train.pop(volatile, None)
    shapes = [[list(x.shape), str(x.dtype)] for x in jax.tree_util.tree_leaves(state)]
    return json.dumps({"model": to_jsonable(model_cfg), "train": train, "seeds": list(seeds),
                       "leaves": shapes}, sort_keys=True)


def same_run(stored: str, current: str) -> bool:
    """Whether two fingerprints name one run: equal seeds and leaf shapes, and equal values of
    every config field that both record (a config field added later, at a value that computes
    the same result, does not orphan the checkpoints written before it)."""
    a, b = json.loads(stored), json.loads(current)
    if a["seeds"] != b["seeds"] or a["leaves"] != b["leaves"]:
        return False
    return all(a[part][k] == b[part][k] for part in ("model", "train")
               for k in a[part].keys() & b[part].keys())


class _Record:
    """The per-step arrays, evaluations and restarts of a run (what its checkpoints carry in
    their meta besides the loop's state)."""

    def __init__(self, n_seeds: int, n_steps: int):
        self.loss = np.zeros((n_seeds, n_steps))
        self.gnorm = np.zeros((n_seeds, n_steps))
        self.times = np.zeros(n_steps)
        self.evals: list[dict] = []
        self.restarts = [0]

    def meta(self, step: int, fp: str) -> dict:
        return {"run": fp, "restart_steps": list(self.restarts),
                "loss": self.loss[:, :step].tolist(), "grad_norm": self.gnorm[:, :step].tolist(),
                "step_time": self.times[:step].tolist(),
                "evals": [{"step": e["step"], "valid_loss": e["valid_loss"].tolist()}
                          for e in self.evals]}

    def resume(self, step: int, meta: dict) -> None:
        self.loss[:, :step], self.gnorm[:, :step] = meta["loss"], meta["grad_norm"]
        self.times[:step] = meta["step_time"]
        self.evals = [{"step": e["step"], "valid_loss": np.asarray(e["valid_loss"])}
                      for e in meta["evals"]]
        self.restarts = [*meta["restart_steps"], step]


def _restore(ckpt: Checkpointer, folder: Path, template, fp: str):
    """``(step, state, meta)`` of the newest checkpoint that restores, or None if there is none;
    a checkpoint of another run is a one-line ``ValueError``."""
    if not ckpt.steps():
        return None
    stored = ckpt.meta(ckpt.steps()[-1]) or {}
    if "run" in stored and not same_run(stored["run"], fp):
        raise ValueError(f"{folder} belongs to a different run (configuration, seeds or parameter "
                         "shapes differ); move it aside to start this run from step 0")
    step, state, meta = ckpt.restore_newest(template, notify=lambda m: print(m, file=sys.stderr))
    if not same_run(meta["run"], fp):
        raise ValueError(f"{folder} belongs to a different run (configuration, seeds or parameter "
                         "shapes differ); move it aside to start this run from step 0")
    return step, state, meta


def train_lm_seeds(model_cfg: ModelConfig, train_cfg: LMTrainConfig, seeds: Sequence[int], *,
                   corpus: lm_data.Corpus | None = None, models: Sequence[eqx.Module] | None = None,
                   build: Callable = default_builder, desc: str | None = None,
                   log: Callable[..., None] | None = None, keep_params: bool = False,
                   final_batches: int | None = None, checkpoint: str | Path | None = None,
                   checkpoint_every: int | None = None) -> SeedRuns:
    """Train ``len(seeds)`` models of ``model_cfg`` with ``train_cfg`` (its ``seed`` is ignored).

    ``models`` gives the starting models (one per seed, e.g. retrofitted ones); by default they
    are freshly initialised. ``log(**record)`` receives every ``log_every``-th step and every
    evaluation (``seed``-indexed lists). A non-finite loss stops with
    :class:`~dca_theory.lm.seed_loop.NonFiniteLossError` (a ``FloatingPointError``).

    ``checkpoint``: a folder for mid-run checkpoints (the loop's format, in
    ``<checkpoint>/checkpoints/<step>``), written every ``checkpoint_every`` steps (default:
    ``train_cfg.eval_every``); if one exists the run continues from it, with the same result as
    an uninterrupted run. The caller deletes the folder once the run's results are saved.
    """
    train_cfg = train_cfg.validate()
    seeds = sl.check_seeds(seeds)
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
    opt_state = sl.init_optimizer(optimizer, params)
    rng_S = sl.dropout_keys(seeds)
    sampler = sl.HostBatches(corpus.train, seeds, seq_len=seq_len,
                             batch_size=train_cfg.batch_size)
    run = sl.make_chunk_step(make_train_step(static, optimizer, train_cfg), sampler)
    eval_fn = sl.make_eval_fn(static, train_cfg)
    eval_kw = {"seq_len": seq_len, "batch_size": train_cfg.batch_size}
    n_steps = train_cfg.steps
    rec, start = _Record(len(seeds), n_steps), 0
    ckpt, fp, every = None, None, checkpoint_every or train_cfg.eval_every
    if checkpoint is not None:
        fp = fingerprint(model_cfg, train_cfg, seeds, (params, opt_state))
        ckpt = Checkpointer(checkpoint, keep=2, seed_stacked=True)
        restored = _restore(ckpt, Path(checkpoint), (params, opt_state, rng_S), fp)
        if restored is not None:
            start, (params, opt_state, _), meta = restored
            rec.resume(start, meta)
            print(f"resuming {desc or model_cfg.residual} from step {start} of {n_steps} "
                  f"({checkpoint})", file=sys.stderr)

    def on_metrics(step0: int, m: dict, seconds: float) -> None:
        for row in range(m["loss"].shape[0]):
            step = step0 + row
            rec.loss[:, step], rec.gnorm[:, step] = m["loss"][row], m["grad_norm"][row]
            rec.times[step] = seconds / m["loss"].shape[0]
            done = step + 1
            if log is not None and (done % train_cfg.log_every == 0 or done == n_steps):
                log(step=done, kind="train", loss=m["loss"][row].tolist(),
                    grad_norm=m["grad_norm"][row].tolist(), step_s=rec.times[step])

    def at_stop(done: int, p, o) -> None:
        if done % train_cfg.eval_every == 0 and done != n_steps:
            v, _ = sl.evaluate(eval_fn, p, corpus.valid, **eval_kw,
                               max_batches=train_cfg.eval_batches)
            rec.evals.append({"step": done, "valid_loss": v})
            bar.set_postfix(valid_ppl=f"{float(np.exp(v.mean())):.2f}")
            if log is not None:
                log(step=done, kind="eval", valid_loss=v.tolist())
        if ckpt is not None and done % every == 0 and done != n_steps:
            ckpt.save(done, (p, o, rng_S), sl.checkpoint_meta(done, seeds, model_cfg,
                                                                **rec.meta(done, fp)))

    def non_finite(what: str) -> sl.NonFiniteLossError:
        return sl.NonFiniteLossError(f"{what} ({model_cfg.residual}, {train_cfg.data})")

    bar = tqdm(total=n_steps, initial=start, desc=desc or model_cfg.residual,
               disable=not train_cfg.progress, unit="step", dynamic_ncols=True, leave=False)
    try:
        params, opt_state = sl.train_loop(
            params, opt_state, run, sampler, rng_S=rng_S, start=start, steps=n_steps,
            seeds=seeds, on_metrics=on_metrics, at_stop=at_stop, bar=bar, non_finite=non_finite,
            stops=lambda d: d % train_cfg.eval_every == 0 or (ckpt is not None and d % every == 0))
    finally:
        bar.close()
        if ckpt is not None:
            ckpt.wait()
            ckpt.close()
    final = {s: sl.evaluate(eval_fn, params, corpus.split(s), **eval_kw,
                            max_batches=final_batches)[0] for s in ("valid", "test")}
    rec.evals.append({"step": n_steps, "valid_loss": final["valid"]})
    if log is not None:
        log(step=n_steps, kind="final", **{f"{s}_loss": v.tolist() for s, v in final.items()})
    n_params = count_params(eqx.combine(sl.seed_slice(params, 0), static))
    return SeedRuns(model_cfg, train_cfg, seeds, n_params, rec.loss, rec.gnorm, rec.times,
                    rec.evals, final, params if keep_params else None,
                    static if keep_params else None, tuple(rec.restarts))
