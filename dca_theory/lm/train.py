"""Train and evaluate the transformer LM on real text: ``train_and_evaluate(model_cfg, train_cfg,
workdir)``.

The work directory is the run: ``config.json`` (model + training config), ``tokenizer.json``,
``metrics.jsonl`` (one JSON line per logged step or evaluation), ``checkpoints/<step>/`` (orbax)
and, once finished, ``summary.json``. Calling again on the same directory resumes from the
newest checkpoint that restores cleanly (a damaged newer one is named, moved to
``damaged_checkpoints/`` and never deleted); because batches and dropout keys are pure functions
of ``(seed, step)`` a resumed run ends with bitwise the same parameters as an uninterrupted one
(on CPU). The history is idempotent: resuming (or rerunning a finished run) never repeats an
evaluation line, redoes an evaluation at the checkpointed step if a kill lost it, and reuses the
final evaluation if it was logged. A fresh start that fails before its first checkpoint removes
the files it wrote (:class:`dca_theory.lm.run_files.StartFiles`). Of several processes
(:mod:`dca_theory.lm.distributed`) process 0 alone writes these files; every process takes part
in each checkpoint save.

Training runs through the one loop of :mod:`dca_theory.lm.seed_loop` with this run's seed as
its only seed: parameters, optimiser state and dropout key carry a seed axis of length 1, in the
checkpoints too (checkpoints written before that axis restore into it). Metrics are pulled to
the host one step late (the device is never idle waiting for the host);
a non-finite loss or gradient, or non-finite parameters at a checkpoint, stop the run with
:class:`NonFiniteLossError`, keeping the last good checkpoint (checkpoints are only written after
the step's metrics and the parameters were checked).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from dca_theory.io import environment, to_jsonable, write_json
from dca_theory.lm import data as lm_data
from dca_theory.lm import distributed, run_files, workdir_lock
from dca_theory.lm import seed_loop as sl
from dca_theory.lm import sharding as shd
from dca_theory.lm.checkpoint import Checkpointer
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.params import count_params
from dca_theory.lm.seed_loop import NonFiniteLossError, default_builder
from dca_theory.lm.steps import make_train_step
from dca_theory.lm.train_config import LMTrainConfig

Builder = Callable[..., eqx.Module]
__all__ = ["NonFiniteLossError", "default_builder", "evaluate_run", "load_run", "restore_run",
           "train_and_evaluate"]


def resolve_configs(model_cfg: ModelConfig, train_cfg: LMTrainConfig,
                    corpus: lm_data.Corpus) -> tuple[ModelConfig, int]:
    """The data defines ``vocab_size``; ``seq_len`` defaults to ``max_len``, never above it."""
    seq_len = train_cfg.seq_len or model_cfg.max_len
    if seq_len > model_cfg.max_len:
        raise ValueError(f"seq_len {seq_len} exceeds the model's max_len {model_cfg.max_len}")
    lm_data.check_seq_len(corpus, seq_len)
    return model_cfg.replace(vocab_size=corpus.vocab_size), seq_len


def load_configs(workdir: str | Path) -> tuple[ModelConfig, LMTrainConfig]:
    """The run's configs from ``config.json``, validated (see :func:`run_files.load_record`)."""
    model_cfg, train_cfg, _ = run_files.load_record(workdir)
    return model_cfg, train_cfg


def _load_corpus(train_cfg: LMTrainConfig, workdir: Path | None,
                 init_from: Path | None = None) -> lm_data.Corpus:
    """The corpus, tokenised with the run's saved tokenizer when resuming (``workdir``)."""
    tok_path = workdir / "tokenizer.json" if workdir is not None else None
    if (tok_path is None or not tok_path.is_file()) and init_from is not None:
        tok_path = init_from / "tokenizer.json"  # a retrofitted model keeps its vocabulary
    saved = lm_data.Tokenizer.load(tok_path) if tok_path and tok_path.is_file() else None
    return lm_data.load_corpus(train_cfg.data, train_cfg.data_dir,
                               bpe_vocab_size=train_cfg.bpe_vocab_size, tokenizer=saved)


def scores(loss_S: np.ndarray, tokens: int) -> dict[str, float]:
    """The one seed's mean NLL per token, perplexity and token count of a split."""
    loss = float(loss_S[0])
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": tokens}


def _initial_model(model_cfg: ModelConfig, init_from: Path | None, build: Builder, key):
    """A fresh model, or (retrofitting, paper Table 4) the trained model of the run in
    ``init_from`` converted to ``model_cfg``'s residual kind without changing its function."""
    if init_from is None:
        return build(model_cfg, key=key)
    from dca_theory.lm.retrofit import retrofit

    source, _, source_cfg, _ = load_run(init_from, build=build)
    if source_cfg.vocab_size != model_cfg.vocab_size:
        raise ValueError(f"--init-from run {init_from} has vocab_size {source_cfg.vocab_size}, "
                         f"this data {model_cfg.vocab_size}; train on the same data")
    return retrofit(source, model_cfg)


def train_and_evaluate(model_cfg: ModelConfig, train_cfg: LMTrainConfig, workdir: str | Path, *,
                       build: Builder = default_builder, init_from: str | Path | None = None,
                       hooks: Sequence[Callable[[int], None]] = ()) -> dict:
    """Train (or resume) in ``workdir`` and return the summary dict (also ``summary.json``).

    ``init_from`` starts from the trained model of another run (retrofitting: a vanilla run
    continued as DCA / k-DCA / GRN); the optimiser state starts fresh. ``hooks`` are called with
    the number of completed steps after each step (tests use one to simulate a crash). A second
    trainer on the same ``workdir`` is turned away at once (:mod:`dca_theory.lm.workdir_lock`).
    """
    workdir = Path(workdir)
    run_files.check_workdir(workdir)
    if not distributed.is_primary():  # several processes: the first holds the directory
        return _train(model_cfg, train_cfg, workdir, build, init_from, hooks)
    with workdir_lock.hold(workdir):
        return _train(model_cfg, train_cfg, workdir, build, init_from, hooks)


def _train(model_cfg: ModelConfig, train_cfg: LMTrainConfig, workdir: Path, build: Builder,
           init_from: str | Path | None, hooks: Sequence[Callable[[int], None]]) -> dict:
    train_cfg = train_cfg.validate()
    train_cfg = train_cfg.replace(data=run_files.normalise_data(train_cfg.data))
    init_from = Path(init_from) if init_from is not None else None
    resuming = run_files.holds_run(workdir)
    fingerprint = run_files.corpus_fingerprint(train_cfg.data)
    stored_lr = None
    if resuming:  # before the corpus is tokenised (the data, hence the saved tokenizer, set
        # vocab_size): a changed setting fails at once
        stored_model, stored_train = load_configs(workdir)
        run_files.check_resume_compatible(workdir, model_cfg.replace(
            vocab_size=stored_model.vocab_size), train_cfg, fingerprint)
        stored_lr = stored_train.lr
    corpus = _load_corpus(train_cfg, workdir if resuming else None, init_from)
    model_cfg, seq_len = resolve_configs(model_cfg, train_cfg, corpus)
    if resuming:
        done = [int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()]
        if done and max(done) > train_cfg.steps:
            raise ValueError(f"workdir {workdir} already holds a checkpoint at step {max(done)}"
                             f" > --steps {train_cfg.steps}; pass --steps >= {max(done)}")
    mesh = shd.make_mesh()
    shd.check_batch_divisible(train_cfg.batch_size, train_cfg.grad_accum, mesh)
    seeds = (train_cfg.seed,)  # the loop's seed axis holds this run's one seed
    init_key, _ = sl.seed_keys(train_cfg.seed)
    # (when resuming, the checkpoint restored below overrides this initial model)
    model = _initial_model(model_cfg, init_from, build, init_key)
    params, static = sl.stack_models([model])
    optimizer = make_lm_optimizer(train_cfg)
    opt_state = sl.init_optimizer(optimizer, params)
    rng = sl.dropout_keys(seeds)
    param_sh = shd.state_shardings(params, mesh, fsdp=train_cfg.fsdp)
    opt_sh = shd.state_shardings(opt_state, mesh, fsdp=train_cfg.fsdp)
    rep, batch_sh = shd.replicated(mesh), shd.batch_sharding(mesh)
    params, opt_state = shd.put_state(params, param_sh), shd.put_state(opt_state, opt_sh)
    rng = shd.put_state(rng, rep)
    start = 0
    # Several processes: process 0 alone writes the run's files; every process takes part in
    # each checkpoint save (orbax writes each array shard from the process that holds it).
    primary = distributed.is_primary()
    if resuming:  # restore before writing anything: no checkpoint restoring is an error
        start, (params, opt_state, rng) = run_files.resume(workdir, train_cfg,
                                                           (params, opt_state, rng),
                                                           move_damaged=primary)
        metrics_path = workdir / "metrics.jsonl"
        run_files.check_history(metrics_path, run_files.read_metrics(metrics_path), start,
                                train_cfg.steps)
    rows = distributed.process_rows(train_cfg.batch_size, jax.process_index(),
                                    jax.process_count())
    if jax.process_count() > 1:
        print(f"process {jax.process_index()} of {jax.process_count()}: rows "
              f"{rows.start}:{rows.stop} of every batch of {train_cfg.batch_size}", flush=True)

    # Everything is validated (the model built, the checkpoint restored): only now write.
    fresh = None if resuming or not primary else run_files.StartFiles(workdir)
    ckpt = None
    try:
        if primary:
            workdir.mkdir(parents=True, exist_ok=True)
            write_json(workdir / "config.json", run_files.config_record(model_cfg, train_cfg,
                                                                        fingerprint))
            corpus.tokenizer.save(workdir / "tokenizer.json")
            if fresh is not None:  # the history exists from the start (see check_history)
                (workdir / "metrics.jsonl").write_text("")
            (workdir / "summary.json").unlink(missing_ok=True)
        # keep the history up to the checkpoint: later lines are redone, not repeated
        history = run_files.rewrite_metrics(workdir / "metrics.jsonl",
                                            lambda r: r["step"] <= start, write=primary)
        if primary and stored_lr is not None and stored_lr != train_cfg.lr:
            run_files.append_metrics(workdir / "metrics.jsonl", {
                "step": start, "lr_from": stored_lr, "lr_to": train_cfg.lr})
            print(f"peak learning rate changed from {stored_lr} to {train_cfg.lr} at step {start}")
        distributed.barrier("lm-train-files")  # the workdir exists before orbax looks at it
        ckpt = Checkpointer(workdir, keep=train_cfg.keep_checkpoints, seed_stacked=True)
        sampler = sl.HostBatches(
            corpus.train, seeds, seq_len=seq_len, batch_size=train_cfg.batch_size, rows=rows,
            place=lambda b: shd.put_batch(b, mesh, global_rows=train_cfg.batch_size))
        run = sl.make_chunk_step(make_train_step(static, optimizer, train_cfg), sampler,
                                 shardings=(param_sh, opt_sh, rep, batch_sh))
        eval_fn = sl.make_eval_fn(static, train_cfg, shardings=(param_sh, batch_sh, rep))
        all_finite = jax.jit(lambda p: jnp.all(jnp.stack(
            [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(p)])))

        def evaluate(p, split: str, max_batches: int | None = None) -> dict[str, float]:
            return scores(*sl.evaluate(
                eval_fn, p, corpus.split(split), seq_len=seq_len,
                batch_size=train_cfg.batch_size // train_cfg.grad_accum, max_batches=max_batches,
                place=lambda b: shd.put_batch(b, mesh)))

        loop = _Loop(workdir, train_cfg, ckpt, start, history, primary)

        def at_stop(done: int, p, o) -> None:
            if done % train_cfg.checkpoint_every == 0 or done == train_cfg.steps:
                if not bool(all_finite(p)):
                    raise loop.non_finite(f"non-finite parameters after step {done}")
                ckpt.save(done, (p, o, rng), sl.checkpoint_meta(done, seeds, model_cfg))
            if done % train_cfg.eval_every == 0 and done != train_cfg.steps:
                loop.log_eval(done, "valid", evaluate(p, "valid", train_cfg.eval_batches))

        try:
            if (start and start % train_cfg.eval_every == 0 and start != train_cfg.steps
                    and not any(r["step"] == start and "valid_loss" in r for r in history)):
                # a kill between the checkpoint and its evaluation lost this point: redo it
                loop.log_eval(start, "valid", evaluate(params, "valid", train_cfg.eval_batches))
            params, opt_state = sl.train_loop(
                params, opt_state, run, sampler, rng_S=rng, start=start, steps=train_cfg.steps,
                seeds=seeds, on_metrics=loop.record, at_stop=at_stop, hooks=hooks, lag=True,
                bar=loop.bar, non_finite=loop.non_finite,
                stops=lambda d: (d % train_cfg.checkpoint_every == 0
                                 or d % train_cfg.eval_every == 0))
        finally:
            ckpt.wait()
            loop.close()
        final = {}
        for split in ("valid", "test"):  # a final evaluation already logged is reused
            final[split] = run_files.logged_eval(history, train_cfg.steps, split)
            if final[split] is None:
                final[split] = evaluate(params, split)
                loop.log_eval(train_cfg.steps, split, final[split])
    except BaseException as err:
        if ckpt is not None:
            with contextlib.suppress(Exception):  # a failed save raises again here; err says it
                ckpt.wait()
        finished = ckpt is not None and bool(ckpt.steps())
        if ckpt is not None:
            ckpt.close()
        if fresh is not None and not finished:
            fresh.remove()  # a start that failed before its first checkpoint leaves nothing
        if run_files.disk_full(err):
            raise OSError(run_files.disk_full_message(workdir, ckpt, finished)) from None
        if run_files.out_of_memory(err):
            raise MemoryError(run_files.memory_message(err, workdir, ckpt, finished)) from None
        raise
    ckpt.close()
    summary = {
        "steps": train_cfg.steps, "resumed_from": start, "seq_len": seq_len,
        "init_from": str(init_from) if init_from is not None else None,
        "devices": mesh.size, "processes": jax.process_count(),
        "n_params": count_params(eqx.combine(sl.seed_slice(params, 0), static)),
        "final_train_loss": loop.last_loss,
        **{f"{s}_{k}": v for s, r in final.items() for k, v in r.items()},
        "valid_ppl_history": loop.valid_history, "tokens_per_s": loop.tokens_per_s,
        "model": model_cfg, "train": train_cfg, "environment": environment(),
    }
    if not primary:
        return json.loads(json.dumps(to_jsonable(summary)))
    write_json(workdir / "summary.json", summary)
    return json.loads((workdir / "summary.json").read_text(encoding="utf-8"))


class _Loop:
    """Host-side bookkeeping of the CLI's run: metrics lines, evaluation lines, the progress
    bar and the message of a non-finite stop (naming the last good checkpoint)."""

    def __init__(self, workdir: Path, cfg: LMTrainConfig, ckpt: Checkpointer, start: int,
                 history: list[dict], primary: bool = True):
        self.path, self.cfg, self.ckpt = workdir / "metrics.jsonl", cfg, ckpt
        self.primary = primary  # only process 0 writes metrics and shows progress
        trained = [r for r in history if "loss" in r]  # a rerun of a finished run trains nothing
        self.last_loss = float(trained[-1]["loss"]) if trained else float("nan")
        self.valid_history: list[tuple[int, float]] = [
            (r["step"], r["valid_ppl"]) for r in history if "valid_ppl" in r]
        self.tokens_per_s = float(trained[-1]["tokens_per_s"]) if trained else 0.0
        self._t, self._tokens = time.perf_counter(), 0.0
        self.bar = tqdm(total=cfg.steps, initial=start, disable=not (cfg.progress and primary),
                        unit="step", dynamic_ncols=True)

    def record(self, step0: int, metrics: dict, seconds: float) -> None:
        """The checked metrics (``[k, 1]`` arrays) of steps ``step0 + 1 ...``: a metrics line
        every ``log_every`` steps and at the last one."""
        for row in range(metrics["loss"].shape[0]):
            step = step0 + row + 1
            m = {k: float(v[row, 0]) for k, v in metrics.items()}
            self.last_loss, self._tokens = m["loss"], self._tokens + m["tokens"]
            if step % self.cfg.log_every == 0 or step == self.cfg.steps:
                now = time.perf_counter()
                self.tokens_per_s = self._tokens / max(now - self._t, 1e-9)
                self._t, self._tokens = now, 0.0
                if self.primary:
                    run_files.append_metrics(self.path, {
                        "step": step, "loss": m["loss"], "lr": m["lr"],
                        "grad_norm": m["grad_norm"], "tokens_per_s": self.tokens_per_s})
                self.bar.set_postfix(loss=f"{m['loss']:.3f}", tok_s=f"{self.tokens_per_s:,.0f}")

    def non_finite(self, what: str) -> NonFiniteLossError:
        self.ckpt.wait()
        last = self.ckpt.steps()
        where = (f"Last good checkpoint: step {last[-1]} in {self.ckpt.directory} (the same "
                 "command with a lower --lr resumes from it)" if last else
                 "No checkpoint had been written, so nothing was kept")
        return NonFiniteLossError(f"{what}; stopped. {where}")

    def log_eval(self, step: int, split: str, result: dict) -> None:
        if split == "valid":
            self.valid_history.append((step, result["ppl"]))
        self._t = time.perf_counter()  # evaluation time is not training throughput
        if not self.primary:
            return
        run_files.append_metrics(self.path, {"step": step, f"{split}_loss": result["loss"],
                                             f"{split}_ppl": result["ppl"],
                                             f"{split}_tokens": result["tokens"]})
        self.bar.write(f"step {step}: {split} loss {result['loss']:.4f}, "
                       f"perplexity {result['ppl']:.2f}")

    def close(self) -> None:
        self.bar.close()


def _read_lines(path: Path) -> list[dict]:
    return run_files.read_metrics(path)


def restore_run(workdir: str | Path, *, build: Builder = default_builder,
                step: int | None = None, notify: Callable[[str], None] = print):
    """``(model, tokenizer, model_cfg, train_cfg, step)`` of the newest checkpoint that restores
    cleanly (damaged newer ones are named through ``notify``), or of checkpoint ``step``."""
    workdir = Path(workdir)
    model_cfg, train_cfg = load_configs(workdir)
    tokenizer = lm_data.Tokenizer.load(workdir / "tokenizer.json")
    params, static = sl.stack_models(sl.init_models(model_cfg, (train_cfg.seed,), build=build))
    opt_state = sl.init_optimizer(make_lm_optimizer(train_cfg), params)
    rng = sl.dropout_keys((train_cfg.seed,))
    ckpt = Checkpointer(workdir, keep=train_cfg.keep_checkpoints, seed_stacked=True)
    try:
        for folder in ckpt.unfinished():
            notify(f"ignoring {folder}: a checkpoint save that a kill interrupted")
        run_files.check_checkpoints_match(workdir, model_cfg, ckpt)
        step, (params, _, _), _ = ckpt.restore_newest((params, opt_state, rng), step=step,
                                                      notify=notify)
    finally:
        ckpt.close()
    return eqx.combine(sl.seed_slice(params, 0), static), tokenizer, model_cfg, train_cfg, step


def load_run(workdir: str | Path, *, build: Builder = default_builder, step: int | None = None):
    """The trained model of a run: ``(model, tokenizer, model_cfg, train_cfg)``."""
    model, tokenizer, model_cfg, train_cfg, _ = restore_run(workdir, build=build, step=step)
    return model, tokenizer, model_cfg, train_cfg


def evaluate_run(workdir: str | Path, splits: Sequence[str] = ("valid", "test"), *,
                 data_dir: str | None = None, batch_size: int | None = None,
                 build: Builder = default_builder, step: int | None = None,
                 notify: Callable[[str], None] = print) -> dict[str, dict[str, float]]:
    """Perplexity of a run's newest restorable checkpoint (or checkpoint ``step``) on whole
    splits, with its own tokenizer and data; each split's dict also holds the scored ``step``.
    A non-finite loss (a diverged checkpoint) raises :class:`NonFiniteLossError`."""
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"--batch-size must be an integer >= 1, got {batch_size}")
    model, tokenizer, model_cfg, train_cfg, step = restore_run(workdir, build=build, step=step,
                                                               notify=notify)
    if data_dir is not None:
        train_cfg = train_cfg.replace(data_dir=data_dir)
    corpus = lm_data.load_corpus(train_cfg.data, train_cfg.data_dir,
                                 bpe_vocab_size=train_cfg.bpe_vocab_size, tokenizer=tokenizer)
    seq_len = train_cfg.seq_len or model_cfg.max_len
    lm_data.check_seq_len(corpus, seq_len)
    mesh = shd.make_mesh()
    batch_size = batch_size or train_cfg.batch_size // train_cfg.grad_accum
    shd.check_batch_divisible(batch_size, 1, mesh)
    params, static = sl.stack_models([model])
    eval_fn = sl.make_eval_fn(static, train_cfg)
    results = {}
    for split in splits:
        r = scores(*sl.evaluate(eval_fn, params, corpus.split(split), seq_len=seq_len,
                                batch_size=batch_size, place=lambda b: shd.put_batch(b, mesh)))
        if not math.isfinite(r["loss"]):
            raise NonFiniteLossError(f"checkpoint step {step} in {workdir} scores a non-finite "
                                     f"{split} loss ({r['loss']}): the run diverged")
        results[split] = {**r, "step": step}
    return results
