"""``dca-theory lm {train,eval,sample,info}``: the DCA transformer language model from the shell.

Typical session (tiny model, Penn Treebank, a few minutes on a laptop CPU)::

    dca-theory lm train --preset tiny --residual dca --k 2 --data ptb --workdir runs/tiny-dca2
    dca-theory lm train --workdir runs/tiny-dca2 ...    # same flags again: resumes
    dca-theory lm eval --workdir runs/tiny-dca2
    dca-theory lm sample --workdir runs/tiny-dca2 --prompt "the company said" --tokens 20
    dca-theory lm info --preset paper

User errors raise ``ValueError``/``FileNotFoundError``, which ``dca-theory`` prints as one line
``dca-theory: error: ...`` with exit status 2; OS and memory errors (a full disk, a work directory
that another ``train`` holds) are one line with status 1. Every setting is validated, all flags
together, before the work directory is written. A non-finite loss stops training with status 3
(and ``eval`` of a diverged checkpoint exits 3); the same command with a lower ``--lr`` resumes
from the last good checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dca_theory import schemes
from dca_theory.lm import distributed
from dca_theory.lm.config import PRESETS, ModelConfig
from dca_theory.lm.train_config import TRAIN_PRESETS, LMTrainConfig


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags as a ValueError (one line, exit 2) instead of usage."""

    def error(self, message):
        raise ValueError(f"{self.prog}: {message} (see --help)")


# (flag, LMTrainConfig field, type, help)
_TRAIN_FLAGS = [
    ("--steps", "steps", int, "optimiser steps"),
    ("--batch-size", "batch_size", int, "global batch size in sequences"),
    ("--seq-len", "seq_len", int, "tokens per training sequence (default: model max_len)"),
    ("--grad-accum", "grad_accum", int, "micro-batches per step (gradient accumulation)"),
    ("--lr", "lr", float, "peak learning rate (paper: 0.0016)"),
    ("--warmup", "warmup_steps", int, "linear warm-up steps (paper: 1000)"),
    ("--b1", "b1", float, "AdamW beta1 (paper: 0.9)"),
    ("--b2", "b2", float, "AdamW beta2 (paper: 0.98)"),
    ("--eps", "eps", float, "AdamW epsilon (paper: 1e-9)"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay (paper: 0.1)"),
    ("--clip-norm", "clip_norm", float, "clip gradients to this global norm (default: off)"),
    ("--seed", "seed", int, "seed of initialisation, data order and dropout"),
    ("--log-every", "log_every", int, "steps between metrics.jsonl lines"),
    ("--eval-every", "eval_every", int, "steps between validation evaluations"),
    ("--eval-batches", "eval_batches", int, "batches per periodic evaluation (final: all)"),
    ("--checkpoint-every", "checkpoint_every", int, "steps between checkpoints"),
    ("--keep", "keep_checkpoints", int, "checkpoints to keep"),
    ("--bpe-vocab", "bpe_vocab_size", int, "BPE vocabulary size for a text-file corpus"),
]
# (flag, ModelConfig field, type, help)
_MODEL_FLAGS = [
    ("--layers", "n_layers", int, "transformer blocks"),
    ("--d-model", "d_model", int, "model width"),
    ("--heads", "n_heads", int, "attention heads"),
    ("--d-mlp", "d_mlp", int, "MLP hidden width"),
    ("--max-len", "max_len", int, "longest sequence the model accepts"),
    ("--dropout", "dropout", float, "dropout rate (also attention dropout)"),
    ("--grn-gate", "grn_gate", str, "GRN-v3 gate (grn_v3, dca): 'paper' (default, chosen on "
     "language: b + ReLU(w.h) as printed; w stays 0), 'bias_inside' (ReLU(b + w.h), exact at "
     "init, w trains), 'open' (as paper, ReLU'(0)=1 so w trains) or 'small_init' "
     "(w ~ N(0, 0.01^2))"),
    ("--layer-loop", "layer_loop", str, "'unroll' (default: the fastest step) or 'scan' "
     "(vanilla, grn_v1|v2|v3, dca: the blocks in one lax.scan, trained stacked; compile time "
     "flat in depth, a slower step)"),
]


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train (or resume) a language model",
                       description="Train a transformer LM on real text, or resume the run in "
                       "--workdir if it already holds one. Flags left out take the preset's "
                       "values; the vocabulary size always comes from the data.")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="model + training preset: 'tiny' (CPU, minutes) or 'paper' (LM1B "
                   "6-layer model and the paper's optimiser schedule)")
    p.add_argument("--residual", choices=schemes.names(lm=True), default=None,
                   help="residual scheme (default: vanilla)")
    p.add_argument("--k", type=int, default=None, help="k-DCA window (only with --residual "
                   "dca; default: full DCA)")
    p.add_argument("--data", default=None, help="'ptb', 'shakespeare', 'ptb-char', "
                   "'python-stdlib' (bytes), 'python-stdlib-bpe' or a path to a UTF-8 text "
                   "file (byte-level BPE); default ptb")
    p.add_argument("--data-dir", default=None, help="folder holding ptb/, tinyshakespeare/ and "
                   "python-stdlib/ (default: $DCA_DATA_DIR)")
    p.add_argument("--workdir", default=None, help="run directory; resumes if it holds a run "
                   "(default: runs/lm-PRESET-RESIDUAL[-kK]-DATA)")
    for flag, _, typ, text in _TRAIN_FLAGS + _MODEL_FLAGS:
        p.add_argument(flag, type=typ, default=None, help=text)
    p.add_argument("--init-from", default=None, metavar="WORKDIR",
                   help="retrofit: start from the trained model of another run (e.g. vanilla), "
                   "converted to --residual without changing its function (paper Table 4)")
    p.add_argument("--bf16", action="store_true", help="compute in bfloat16 (f32 master weights)")
    p.add_argument("--fsdp", action="store_true", help="shard parameters over devices (FSDP)")
    p.add_argument("--distributed", action="store_true",
                   help="multi-host: call jax.distributed.initialize() first (automatic when "
                   "$JAX_COORDINATOR_ADDRESS is set)")
    distributed.add_flags(p)  # --coordinator, --num-processes, --process-id
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train)


def _configs(args) -> tuple[ModelConfig, LMTrainConfig]:
    model_cfg = PRESETS[args.preset]
    if args.residual is not None:
        model_cfg = model_cfg.replace(residual=args.residual)
    if args.k is not None:
        if not schemes.get(model_cfg.residual).takes_k:
            raise ValueError(f"--k {args.k} needs --residual "
                             f"{' or '.join(schemes.names(lm=True, takes_k=True))} "
                             f"(got {model_cfg.residual})")
        model_cfg = model_cfg.replace(k=args.k)
    if args.grn_gate is not None and not schemes.get(model_cfg.residual).gated:
        gated = ", ".join(n for n in schemes.names(lm=True) if schemes.get(n).gated)
        raise ValueError(f"--grn-gate {args.grn_gate} needs a residual with GRN-v3's gate "
                         f"({gated}); got {model_cfg.residual}")
    changes = {}
    for flag, field, _, _ in _MODEL_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            changes[field] = value
            if field == "dropout":
                changes["attn_dropout"] = value
    # all at once: --d-model 6 --heads 2 is judged as a pair, not against the preset's heads
    model_cfg = model_cfg.replace(**changes)
    if model_cfg.k is not None and model_cfg.k > model_cfg.n_layers:
        raise ValueError(f"--k {model_cfg.k} exceeds the {model_cfg.n_layers} layer(s) of the "
                         f"model; valid: 0 to {model_cfg.n_layers} (or leave --k out for full "
                         "DCA)")
    train_cfg = TRAIN_PRESETS[args.preset]
    for flag, field, _, _ in _TRAIN_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            train_cfg = train_cfg.replace(**{field: value})
    changes = {"data": args.data or train_cfg.data, "data_dir": args.data_dir,
               "fsdp": args.fsdp, "progress": not args.no_progress}
    if args.bf16:
        changes["compute_dtype"] = "bfloat16"
    return model_cfg, train_cfg.replace(**changes).validate()


def _cmd_train(args) -> int:
    from dca_theory.lm.train import NonFiniteLossError, train_and_evaluate

    model_cfg, train_cfg = _configs(args)
    distributed.setup(args)  # several processes: join them before anything touches a device
    if args.workdir is None:
        k = f"-k{model_cfg.k}" if model_cfg.k is not None else ""
        args.workdir = f"runs/lm-{args.preset}-{model_cfg.residual}{k}-{Path(train_cfg.data).stem}"
    try:
        summary = train_and_evaluate(model_cfg, train_cfg, args.workdir,
                                     init_from=args.init_from)
    except NonFiniteLossError as err:
        print(f"dca-theory: error: {err}", file=sys.stderr)
        return 3
    history = ", ".join(f"{s}: {p:.2f}" for s, p in summary["valid_ppl_history"])
    print(f"validation perplexity by step: {history}")
    print(f"final: valid perplexity {summary['valid_ppl']:.2f}, test perplexity "
          f"{summary['test_ppl']:.2f} ({summary['n_params']:,} parameters); run in {args.workdir}")
    return 0


def _cmd_eval(args) -> int:
    from dca_theory.lm.train import NonFiniteLossError, evaluate_run

    try:
        results = evaluate_run(args.workdir, args.split, data_dir=args.data_dir,
                               batch_size=args.batch_size, step=args.checkpoint_step)
    except NonFiniteLossError as err:
        print(f"dca-theory: error: {err}", file=sys.stderr)
        return 3
    print(f"checkpoint step {next(iter(results.values()))['step']} of {args.workdir}:")
    for split, r in results.items():
        print(f"{split}: loss {r['loss']:.4f}, perplexity {r['ppl']:.2f} ({r['tokens']:,} tokens)")
    return 0


def _cmd_sample(args) -> int:
    import jax

    from dca_theory.lm.sample import generate
    from dca_theory.lm.train import load_run

    if not args.temperature >= 0 or args.temperature == float("inf"):  # checked before loading
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if not 0 <= args.seed < 2**31:  # as lm train's --seed
        raise ValueError(f"--seed must be in [0, 2**31), got {args.seed}")
    model, tokenizer, model_cfg, _ = load_run(args.workdir, step=args.checkpoint_step)
    prompt = tokenizer.encode(args.prompt)
    if tokenizer.kind == "word":  # encode() ends every line with <eos>; continue the line instead
        prompt = prompt[:-1]
    out = generate(model, prompt, args.tokens, max_len=model_cfg.max_len,
                   key=jax.random.PRNGKey(args.seed), temperature=args.temperature,
                   top_k=args.top_k, cache=not args.no_cache)
    print(tokenizer.decode(out))
    return 0


def _cmd_info(args) -> int:
    from dca_theory.lm.paper_param_counts import info_table

    cfg = PRESETS[args.preset]
    if args.vocab_size is not None:
        cfg = cfg.replace(vocab_size=args.vocab_size)
    print(info_table(cfg))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dca-theory lm", description="The DCA transformer language model "
                     "(Heddes et al., ICML 2025): train on PTB, Tiny Shakespeare or any text "
                     "file, evaluate perplexity, sample text, count parameters.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)

    p = sub.add_parser("eval", help="perplexity of a trained run on valid/test",
                       description="Evaluate the newest checkpoint in --workdir that restores "
                       "cleanly (or --checkpoint-step N) on whole splits.")
    p.add_argument("--workdir", required=True, help="run directory written by 'lm train'")
    p.add_argument("--split", nargs="+", choices=("train", "valid", "test"),
                   default=["valid", "test"], help="splits to score (default: valid test)")
    p.add_argument("--data-dir", default=None, help="data folder if it moved since training")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per eval batch")
    p.add_argument("--checkpoint-step", type=int, default=None, metavar="N",
                   help="score checkpoint N (default: the newest that restores cleanly)")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("sample", help="generate text from a trained run",
                       description="Continue --prompt with --tokens sampled tokens.")
    p.add_argument("--workdir", required=True, help="run directory written by 'lm train'")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--tokens", type=int, default=50, help="tokens to generate (default 50)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k likeliest only")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--checkpoint-step", type=int, default=None, metavar="N",
                   help="sample from checkpoint N (default: the newest that restores cleanly)")
    p.add_argument("--no-cache", action="store_true", help="rerun the model on the whole "
                   "window for every token instead of decoding with a key/value cache (same "
                   "tokens, slower)")
    p.set_defaults(func=_cmd_sample)

    p = sub.add_parser("info", help="parameter counts per residual kind",
                       description="Print the parameter count of every residual kind.")
    p.add_argument("--preset", choices=sorted(PRESETS), default="paper")
    p.add_argument("--vocab-size", type=int, default=None, help="override the vocabulary size")
    p.set_defaults(func=_cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
