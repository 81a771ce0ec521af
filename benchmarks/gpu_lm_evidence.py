"""The GPU version of the evidence experiment's primary comparison, in one call.

Widths 32, 64, 128, 256 x {vanilla, DCA (default gate)} x 4 seeds trained at once per
(width, arm) under ``jax.vmap``; pre-LN, depth 4, 4 heads, MLP 4x width, sequence 256, 64
sequences per seed and step, 3052 steps = 50.0M training tokens per seed (``--tokens``),
bfloat16 compute with float32 weights, the project's training loop
(:mod:`dca_theory.lm.seed_loop`; its AdamW step: the paper's betas, eps and weight decay, linear
warm-up over 5 % of the steps, then inverse square root), one learning rate for every width
(``--lr``, not tuned per width: there is no time for a sweep inside the call).

Data: the CPython standard library by **byte** (:mod:`dca_theory.lm.corpora`): 28M training
bytes, so 50M tokens are 1.8 epochs, where PTB-char's 5.1M characters would be repeated 10
times. Batches are drawn on the device (random windows, a key per seed, step and width), so no
host work sits between the ``--chunk`` steps one compiled ``lax.scan`` runs.

Measured per run: validation loss on the first ``--valid-tokens`` tokens of the split at
about 0.5, 1, 2, 4, 8, 16, 32 and 50M tokens; at the end the whole validation and test
splits; wall time and compilation time. Summary: per width, D = 100 (ln ppl_DCA - ln
ppl_vanilla) per seed with its t-interval, and the slope of D on log2(width) with the
seed-clustered CI of :func:`dca_theory.lab.statistics.seed_clustered_slope`. The JSON is
rewritten after every run; ``--budget-s`` skips a run that would not finish in time (runs go
narrow to wide, vanilla and DCA alternating, so what finishes is a complete prefix of widths).

Command (device machine; the corpus travels in an ignored folder, e.g. ``.gpu_data``)::

    PYTHONPATH=. DCA_DATA_DIR=.gpu_data python benchmarks/gpu_lm_evidence.py \
        --json $OUT/gpu_lm_evidence.json

``--smoke`` shrinks everything to a CPU dry run (its defaults: :data:`SMOKE`; a flag given
beside it still wins, so ``--smoke --widths 8 --depth 1 --arms vanilla`` is a seconds-long one);
``--arms`` trains a subset of the arms (D pairs the widths that have both).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import emit, machine, save_partial  # noqa: E402

from dca_theory.lab import statistics as st  # noqa: E402
from dca_theory.lm import data as lm_data  # noqa: E402
from dca_theory.lm.config import ModelConfig  # noqa: E402
from dca_theory.lm.optim import make_lm_optimizer  # noqa: E402
from dca_theory.lm.params import non_embedding_count  # noqa: E402
from dca_theory.lm.seed_loop import (  # noqa: E402
    DeviceWindows,
    NonFiniteLossError,
    dropout_keys,
    evaluate,
    init_models,
    make_chunk_step,
    make_eval_fn,
    stack_models,
    train_loop,
)
from dca_theory.lm.steps import make_train_step  # noqa: E402
from dca_theory.lm.train_config import LMTrainConfig  # noqa: E402

ARMS = {"vanilla": ("vanilla", "paper"), "dca": ("dca", "bias_inside")}
CHECKPOINTS_M = (0.5, 1, 2, 4, 8, 16, 32, 50)
#: ``--smoke``'s defaults: two narrow widths, two layers, two seeds, 2048 tokens per seed
SMOKE = {"widths": [8, 16], "seeds": 2, "tokens": 2048, "batch": 4, "seq": 16, "depth": 2,
         "heads": 2, "chunk": 8, "valid_tokens": 512, "eval_batch": 8, "dtype": "float32"}


def train_arm(arm: str, width: int, args, corpus) -> dict:
    residual, gate = ARMS[arm]
    cfg = ModelConfig(vocab_size=corpus.vocab_size, max_len=args.seq, d_model=width,
                      n_heads=args.heads, d_mlp=4 * width, n_layers=args.depth,
                      residual=residual, grn_gate=gate, dropout=0.0, attn_dropout=0.0)
    return {"arm": arm, "width": width, "gate": gate,
            **train_model(cfg, args.lr, args, corpus, tuple(range(args.seeds)))}


def train_model(cfg: ModelConfig, lr: float, args, corpus, seeds: tuple[int, ...]) -> dict:
    """Train ``cfg`` on every seed of ``seeds`` at once (vmapped) for ``args.tokens`` tokens
    per seed in whole chunks of ``args.chunk`` steps; the measurements of the module doc."""
    steps = -(-args.tokens // (args.batch * args.seq))
    steps = -(-steps // args.chunk) * args.chunk  # whole chunks
    tc = LMTrainConfig(data="python-stdlib", batch_size=args.batch, seq_len=args.seq,
                       steps=steps, lr=lr, warmup_steps=max(1, steps // 20),
                       compute_dtype=args.dtype, progress=False)
    params, static = stack_models(init_models(cfg, seeds))
    optimizer = make_lm_optimizer(tc)
    opt_state = jax.vmap(optimizer.init)(params)
    sampler = DeviceWindows(jnp.asarray(corpus.train),
                            jnp.stack([jax.random.PRNGKey(1000 + s) for s in seeds]),
                            seq_len=tc.seq_len, batch_size=tc.batch_size)
    run = make_chunk_step(make_train_step(static, optimizer, tc), sampler)
    eval_fn = make_eval_fn(static, tc)
    valid_head = corpus.valid[: args.valid_tokens + 1]
    tok_per_step = args.batch * args.seq
    marks = sorted({max(1, round(m * 1e6 / tok_per_step / args.chunk)) * args.chunk
                    for m in CHECKPOINTS_M if m * 1e6 <= args.tokens} | {steps})
    history, losses, compile_s = [], [], []

    def on_chunk(step0: int, m: dict, seconds: float) -> None:
        if not compile_s:
            compile_s.append(seconds)  # the first chunk's call includes its compilation
        losses.append(m["loss"].mean(axis=0))

    def at_mark(done: int, p, o) -> None:
        if done in marks:
            v, _ = evaluate(eval_fn, p, valid_head, seq_len=args.seq, batch_size=args.eval_batch)
            history.append({"step": done, "tokens": done * tok_per_step,
                            "valid_head_loss": v.tolist()})

    def non_finite(what: str) -> NonFiniteLossError:
        return NonFiniteLossError(f"{what} at width {cfg.d_model} ({cfg.residual}, gate "
                                  f"{cfg.grn_gate})")

    start = time.perf_counter()
    params, _ = train_loop(params, opt_state, run, sampler, rng_S=dropout_keys(seeds), start=0,
                           steps=steps, chunk=args.chunk, seeds=seeds, on_metrics=on_chunk,
                           stops=lambda done: done in marks, at_stop=at_mark,
                           non_finite=non_finite)
    train_s = time.perf_counter() - start
    final = {s: evaluate(eval_fn, params, getattr(corpus, s), seq_len=args.seq,
                         batch_size=args.eval_batch)[0] for s in ("valid", "test")}
    n_params = int(sum(x[0].size for x in jax.tree_util.tree_leaves(
        eqx.filter(params, eqx.is_inexact_array))))
    return {"params": n_params, "d_mlp": cfg.d_mlp,
            "non_embedding_params": non_embedding_count(cfg), "steps": steps,
            "tokens_per_seed": steps * tok_per_step, "lr": lr, "seeds": list(seeds),
            "train_s": train_s,
            "compile_s": compile_s[0], "wall_s": time.perf_counter() - start,
            "tokens_per_s": steps * tok_per_step * len(seeds) / train_s,
            "valid_loss": final["valid"].tolist(), "test_loss": final["test"].tolist(),
            "valid_ppl": np.exp(final["valid"]).tolist(),
            "test_ppl": np.exp(final["test"]).tolist(), "history": history,
            "train_loss_per_chunk": np.asarray(losses).tolist()}


def add_training_args(p: argparse.ArgumentParser, chunk: int, help_chunk: str = "") -> None:
    """The options every GPU evidence script shares: seeds, model shape, token budget, batch,
    chunking, dtype, evaluation and the time budget."""
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--tokens", type=int, default=50_000_000, help="training tokens per seed")
    p.add_argument("--batch", type=int, default=64, help="sequences per seed and step")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--chunk", type=int, default=chunk,
                   help=f"steps per compiled scan{help_chunk}")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--valid-tokens", type=int, default=1_000_000)
    p.add_argument("--eval-batch", type=int, default=256)
    p.add_argument("--budget-s", type=float, default=560.0)


def check_training_args(args) -> None:
    """One-line errors for a count below 1 or a width the heads do not divide."""
    for name in ("seeds", "depth", "heads", "tokens", "batch", "seq", "chunk", "valid_tokens",
                 "eval_batch"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got "
                             f"{getattr(args, name)}")
    bad = [w for w in args.widths if w < 1 or w % args.heads]
    if bad:
        raise SystemExit(f"error: width {bad[0]} must be >= 1 and divisible by --heads "
                         f"{args.heads}")


def head_of(corpus, eval_tokens: int):
    """The corpus cut for a dry run: the first 64k training bytes, ``eval_tokens`` of the
    validation and test splits."""
    return lm_data.Corpus(corpus.name, corpus.tokenizer, corpus.train[:65536],
                          corpus.valid[:eval_tokens], corpus.test[:eval_tokens])


def summarise(runs: dict[tuple[str, int], dict], seeds: int) -> dict:
    widths = sorted({w for a, w in runs if ("vanilla", w) in runs and ("dca", w) in runs})
    per_width = {}
    for w in widths:
        d = st.log_ppl_gap(runs[("vanilla", w)]["test_ppl"], runs[("dca", w)]["test_ppl"])
        per_width[str(w)] = st.paired(np.zeros_like(d), d)
    out = {"test_D": per_width, "slope": None}
    if len(widths) >= 2:
        x = [np.log2(w) for w in widths for _ in range(seeds)]
        y = [v for w in widths for v in per_width[str(w)]["per_seed"]]
        out["slope"] = st.seed_clustered_slope(x, y, list(range(seeds)) * len(widths))
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256])
    add_training_args(p, chunk=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                   help="the arms to train (D pairs the widths that have both)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes to test the script on CPU (flags given still win)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.smoke:  # the tiny sizes become the defaults, so that a flag given overrides them
        p.set_defaults(**SMOKE)
        args = p.parse_args(argv)
    check_training_args(args)
    corpus = lm_data.load_corpus("python-stdlib")
    if args.smoke:
        corpus = head_of(corpus, 4096)
    record = {"benchmark": "gpu_lm_evidence", "args": vars(args), "machine": machine(),
              "runs": {}, "skipped": []}
    start, runs, longest = time.perf_counter(), {}, {}
    for w in sorted(args.widths):
        for arm in dict.fromkeys(args.arms):  # in the order given, once each
            spent = time.perf_counter() - start
            guess = longest.get(arm, 0.0) * 2.2  # a run costs about twice the narrower one's
            if spent + guess > args.budget_s:
                record["skipped"].append(f"{arm}-w{w}")
                print(f"{arm} w{w}: skipped ({spent:.0f} s spent of {args.budget_s:.0f})",
                      flush=True)
                continue
            r = train_arm(arm, w, args, corpus)
            longest[arm] = r["wall_s"]
            runs[(arm, w)] = r
            record["runs"][f"{arm}-w{w}"] = r
            record["summary"] = summarise(runs, args.seeds)
            print(f"{arm:8s} w{w:<4d} test ppl {np.round(r['test_ppl'], 4).tolist()}  "
                  f"{r['tokens_per_s']:,.0f} tok/s  compile {r['compile_s']:.1f}s  "
                  f"wall {r['wall_s']:.0f}s", flush=True)
            save_partial(record, args.json)
    record["total_s"] = time.perf_counter() - start
    return emit(record, args.json)


if __name__ == "__main__":
    main()
