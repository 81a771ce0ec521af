"""Train and evaluate the transformer LM on real text: ``train_and_evaluate(model_cfg, train_cfg,
workdir)``.

The work directory is the run: ``config.json`` (model + training config), ``tokenizer.json``,
``metrics.jsonl`` (one JSON line per logged step or evaluation), ``checkpoints/<step>/`` (orbax)
and, once finished, ``summary.json``. Calling again on the same directory resumes from the
newest checkpoint; because batches and dropout keys are pure functions of ``(seed, step)`` a
resumed run ends with bitwise the same parameters as an uninterrupted one (on CPU).

Metrics are pulled to the host one step late (the device is never idle waiting for the host);
a non-finite loss or gradient stops the run with :class:`NonFiniteLossError`, keeping the last
good checkpoint (checkpoints are only written after the step's metrics were checked).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
from tqdm.auto import tqdm

from dca_theory.io import atomic_write_text, environment, read_json, write_json
from dca_theory.lm import data as lm_data
from dca_theory.lm import sharding as shd
from dca_theory.lm.checkpoint import Checkpointer
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.steps import make_eval_step, make_train_step
from dca_theory.lm.train_config import LMTrainConfig

Builder = Callable[..., eqx.Module]


class NonFiniteLossError(FloatingPointError):
    """Training produced NaN/Inf; the message names the step and the last good checkpoint."""


def default_builder(cfg: ModelConfig, *, key) -> eqx.Module:
    from dca_theory.lm.model import build_model

    return build_model(cfg, key=key)


def resolve_configs(model_cfg: ModelConfig, train_cfg: LMTrainConfig,
                    corpus: lm_data.Corpus) -> tuple[ModelConfig, int]:
    """The data defines ``vocab_size``; ``seq_len`` defaults to ``max_len``, never above it."""
    seq_len = train_cfg.seq_len or model_cfg.max_len
    if seq_len > model_cfg.max_len:
        raise ValueError(f"seq_len {seq_len} exceeds the model's max_len {model_cfg.max_len}")
    lm_data.check_seq_len(corpus, seq_len)
    return model_cfg.replace(vocab_size=corpus.vocab_size), seq_len


def _config_record(model_cfg: ModelConfig, train_cfg: LMTrainConfig) -> dict:
    from dca_theory.io import to_jsonable

    return {"model": to_jsonable(model_cfg), "train": to_jsonable(train_cfg)}


def load_configs(workdir: str | Path) -> tuple[ModelConfig, LMTrainConfig]:
    path = Path(workdir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no training run in {workdir} (missing {path})")
    record = read_json(path)
    return ModelConfig(**record["model"]), LMTrainConfig(**record["train"])


def _check_resume_compatible(workdir: Path, model_cfg: ModelConfig,
                             train_cfg: LMTrainConfig) -> None:
    saved_model, saved_train = load_configs(workdir)
    fixed = ("data", "seed", "batch_size", "grad_accum", "seq_len", "compute_dtype")
    diffs = [f"model.{k}" for k, v in vars(saved_model).items() if getattr(model_cfg, k) != v]
    diffs += [f"train.{k}" for k in fixed if getattr(train_cfg, k) != getattr(saved_train, k)]
    if diffs:
        raise ValueError(f"workdir {workdir} holds a run with a different {', '.join(diffs)}; "
                         "resume with the same settings or choose a new --workdir")


def _load_corpus(train_cfg: LMTrainConfig, workdir: Path,
                 init_from: Path | None = None) -> lm_data.Corpus:
    tok_path = workdir / "tokenizer.json"
    if not tok_path.is_file() and init_from is not None:
        tok_path = init_from / "tokenizer.json"  # a retrofitted model keeps its vocabulary
    saved = lm_data.Tokenizer.load(tok_path) if tok_path.is_file() else None
    return lm_data.load_corpus(train_cfg.data, train_cfg.data_dir,
                               bpe_vocab_size=train_cfg.bpe_vocab_size, tokenizer=saved)


def _truncate_metrics(path: Path, last_step: int) -> None:
    """On resume drop lines logged after the checkpoint we restart from."""
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines()
             if ln.strip() and json.loads(ln)["step"] <= last_step]
    atomic_write_text(path, "".join(ln + "\n" for ln in lines))


def _append_metrics(path: Path, record: dict) -> None:
    from dca_theory.io import to_jsonable

    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(to_jsonable(record), sort_keys=True) + "\n")


def evaluate_lm(eval_fn, params, tokens: np.ndarray, *, seq_len: int, batch_size: int, mesh,
                max_batches: int | None = None) -> dict[str, float]:
    """Mean NLL per token and perplexity over (up to ``max_batches`` batches of) a split."""
    nll, weight = 0.0, 0.0
    for batch in lm_data.eval_batches(tokens, seq_len=seq_len, batch_size=batch_size,
                                      max_batches=max_batches):
        s, w = eval_fn(params, shd.put_batch(batch, mesh))
        nll, weight = nll + float(s), weight + float(w)
    loss = nll / weight
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": int(weight)}


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
    the number of completed steps after each step (tests use one to simulate a crash).
    """
    train_cfg = train_cfg.validate()
    workdir = Path(workdir)
    init_from = Path(init_from) if init_from is not None else None
    resuming = (workdir / "config.json").is_file()
    corpus = _load_corpus(train_cfg, workdir, init_from)
    model_cfg, seq_len = resolve_configs(model_cfg, train_cfg, corpus)
    if resuming:
        _check_resume_compatible(workdir, model_cfg, train_cfg)
        done = [int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()]
        if done and max(done) > train_cfg.steps:
            raise ValueError(f"workdir {workdir} already holds a checkpoint at step {max(done)}"
                             f" > --steps {train_cfg.steps}; pass --steps >= {max(done)}")
    mesh = shd.make_mesh()
    shd.check_batch_divisible(train_cfg.batch_size, train_cfg.grad_accum, mesh)
    init_key, rng = jax.random.split(jax.random.PRNGKey(train_cfg.seed))
    # (when resuming, the checkpoint restored below overrides this initial model)
    model = _initial_model(model_cfg, init_from, build, init_key)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    # Everything is validated (the model built): only now touch the work directory.
    workdir.mkdir(parents=True, exist_ok=True)
    write_json(workdir / "config.json", _config_record(model_cfg, train_cfg))
    corpus.tokenizer.save(workdir / "tokenizer.json")
    (workdir / "summary.json").unlink(missing_ok=True)

    optimizer = make_lm_optimizer(train_cfg)
    opt_state = optimizer.init(params)
    param_sh = shd.state_shardings(params, mesh, fsdp=train_cfg.fsdp)
    opt_sh = shd.state_shardings(opt_state, mesh, fsdp=train_cfg.fsdp)
    rep, batch_sh = shd.replicated(mesh), shd.batch_sharding(mesh)
    params, opt_state = shd.put_state(params, param_sh), shd.put_state(opt_state, opt_sh)
    rng = jax.device_put(rng, rep)

    ckpt = Checkpointer(workdir, keep=train_cfg.keep_checkpoints)
    start = ckpt.latest_step() or 0
    if start:
        (params, opt_state, rng), meta = ckpt.restore((params, opt_state, rng))
        assert meta["data_step"] == start, "checkpoint data position disagrees with its step"
    _truncate_metrics(workdir / "metrics.jsonl", start)

    step_fn = jax.jit(make_train_step(static, optimizer, train_cfg),
                      in_shardings=(param_sh, opt_sh, rep, batch_sh, rep),
                      out_shardings=(param_sh, opt_sh, rep), donate_argnums=(0, 1))
    eval_fn = jax.jit(make_eval_step(static, train_cfg), in_shardings=(param_sh, batch_sh),
                      out_shardings=(rep, rep))
    eval_kw = {"seq_len": seq_len, "batch_size": train_cfg.batch_size // train_cfg.grad_accum,
               "mesh": mesh}
    loop = _Loop(workdir, train_cfg, ckpt, start)
    try:
        for step in range(start, train_cfg.steps):
            batch = lm_data.train_batch(corpus.train, seq_len=seq_len,
                                        batch_size=train_cfg.batch_size, seed=train_cfg.seed,
                                        step=step)
            params, opt_state, metrics = step_fn(params, opt_state, rng,
                                                 shd.put_batch(batch, mesh), np.int32(step))
            loop.push(step + 1, metrics)  # checks the *previous* step's metrics
            done = step + 1
            for hook in hooks:
                hook(done)
            if done % train_cfg.checkpoint_every == 0 or done == train_cfg.steps:
                loop.flush()
                ckpt.save(done, (params, opt_state, rng),
                          {"step": done, "data_step": done, "seed": train_cfg.seed})
                loop.last_good = done
            if done % train_cfg.eval_every == 0 and done != train_cfg.steps:
                loop.flush()
                result = evaluate_lm(eval_fn, params, corpus.valid, **eval_kw,
                                     max_batches=train_cfg.eval_batches)
                loop.log_eval(done, "valid", result)
        loop.flush()
    finally:
        ckpt.wait()
        ckpt.close()
        loop.close()

    final = {s: evaluate_lm(eval_fn, params, corpus.split(s), **eval_kw) for s in ("valid", "test")}
    for split, result in final.items():
        loop.log_eval(train_cfg.steps, split, result)
    summary = {
        "steps": train_cfg.steps, "resumed_from": start, "seq_len": seq_len,
        "init_from": str(init_from) if init_from is not None else None,
        "devices": mesh.size, "processes": jax.process_count(),
        "n_params": int(sum(x.size for x in jax.tree_util.tree_leaves(params))),
        "final_train_loss": loop.last_loss,
        **{f"{s}_{k}": v for s, r in final.items() for k, v in r.items()},
        "valid_ppl_history": loop.valid_history, "tokens_per_s": loop.tokens_per_s,
        "model": model_cfg, "train": train_cfg, "environment": environment(),
    }
    write_json(workdir / "summary.json", summary)
    return json.loads((workdir / "summary.json").read_text(encoding="utf-8"))


class _Loop:
    """Host-side bookkeeping: delayed metric fetch, NaN guard, JSON lines, progress bar."""

    def __init__(self, workdir: Path, cfg: LMTrainConfig, ckpt: Checkpointer, start: int):
        self.path, self.cfg, self.ckpt = workdir / "metrics.jsonl", cfg, ckpt
        self.last_good, self.pending = start, None
        self.last_loss = float("nan")
        self.valid_history: list[tuple[int, float]] = [
            (r["step"], r["valid_ppl"]) for r in _read_lines(self.path) if "valid_ppl" in r]
        self.tokens_per_s = 0.0
        self._t, self._tokens = time.perf_counter(), 0.0
        self.bar = tqdm(total=cfg.steps, initial=start, disable=not cfg.progress,
                        unit="step", dynamic_ncols=True)

    def push(self, step: int, metrics) -> None:
        self.flush()
        self.pending = (step, metrics)

    def flush(self) -> None:
        if self.pending is None:
            return
        step, metrics = self.pending
        self.pending = None
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])):
            self.ckpt.wait()
            raise NonFiniteLossError(
                f"non-finite loss {m['loss']} / grad norm {m['grad_norm']} at step {step}; "
                f"stopped. Last good checkpoint: step {self.last_good} in {self.ckpt.directory}")
        self.last_loss, self._tokens = m["loss"], self._tokens + m["tokens"]
        self.bar.update(1)
        if step % self.cfg.log_every == 0 or step == self.cfg.steps:
            now = time.perf_counter()
            self.tokens_per_s = self._tokens / max(now - self._t, 1e-9)
            self._t, self._tokens = now, 0.0
            _append_metrics(self.path, {"step": step, "loss": m["loss"], "lr": m["lr"],
                                        "grad_norm": m["grad_norm"],
                                        "tokens_per_s": self.tokens_per_s})
            self.bar.set_postfix(loss=f"{m['loss']:.3f}", tok_s=f"{self.tokens_per_s:,.0f}")

    def log_eval(self, step: int, split: str, result: dict) -> None:
        _append_metrics(self.path, {"step": step, f"{split}_loss": result["loss"],
                                    f"{split}_ppl": result["ppl"]})
        if split == "valid":
            self.valid_history.append((step, result["ppl"]))
        self.bar.write(f"step {step}: {split} loss {result['loss']:.4f}, "
                       f"perplexity {result['ppl']:.2f}")
        self._t = time.perf_counter()  # evaluation time is not training throughput

    def close(self) -> None:
        self.bar.close()


def _read_lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def load_run(workdir: str | Path, *, build: Builder = default_builder, step: int | None = None):
    """The trained model of a run: ``(model, tokenizer, model_cfg, train_cfg)``."""
    workdir = Path(workdir)
    model_cfg, train_cfg = load_configs(workdir)
    tokenizer = lm_data.Tokenizer.load(workdir / "tokenizer.json")
    init_key, rng = jax.random.split(jax.random.PRNGKey(train_cfg.seed))
    params, static = eqx.partition(build(model_cfg, key=init_key), eqx.is_inexact_array)
    opt_state = make_lm_optimizer(train_cfg).init(params)
    ckpt = Checkpointer(workdir, keep=train_cfg.keep_checkpoints)
    try:
        (params, _, _), _ = ckpt.restore((params, opt_state, rng), step=step)
    finally:
        ckpt.close()
    return eqx.combine(params, static), tokenizer, model_cfg, train_cfg


def evaluate_run(workdir: str | Path, splits: Sequence[str] = ("valid", "test"), *,
                 data_dir: str | None = None, batch_size: int | None = None,
                 build: Builder = default_builder) -> dict[str, dict[str, float]]:
    """Perplexity of a run's newest checkpoint on whole splits (its own tokenizer and data)."""
    model, tokenizer, model_cfg, train_cfg = load_run(workdir, build=build)
    if data_dir is not None:
        train_cfg = train_cfg.replace(data_dir=data_dir)
    corpus = lm_data.load_corpus(train_cfg.data, train_cfg.data_dir,
                                 bpe_vocab_size=train_cfg.bpe_vocab_size, tokenizer=tokenizer)
    seq_len = train_cfg.seq_len or model_cfg.max_len
    mesh = shd.make_mesh()
    batch_size = batch_size or train_cfg.batch_size // train_cfg.grad_accum
    shd.check_batch_divisible(batch_size, 1, mesh)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    eval_fn = jax.jit(make_eval_step(static, train_cfg))
    return {s: evaluate_lm(eval_fn, params, corpus.split(s), seq_len=seq_len,
                           batch_size=batch_size, mesh=mesh) for s in splits}
