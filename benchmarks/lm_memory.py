"""Memory of the LM from XLA's compiled memory analysis: training peak and inference activations.

Both figures come from ``jax.jit(f).lower(...).compile().memory_analysis()``, which is a
property of the compiled program (deterministic; no allocator noise, no timing):

* **training peak** of the train step (forward, backward, AdamW):
  ``argument + output + temp - alias`` bytes (parameters, optimizer state and batch in; new
  parameters and state out; ``temp`` holds the activations kept for the backward pass).
  Ratio DCA / vanilla; paper: 6.6 / 5.3 GB = 1.25 on a 179M model; target ≤ 1.05.
* **inference activations**: ``temp`` bytes of the jitted forward pass (logits are the output,
  weights the arguments; neither counts). Paper §3.1/§5: full DCA keeps every layer output
  (linear in depth), k-DCA keeps k + 2 tensors (flat in depth). Target: k-DCA depth 24 vs
  depth 6 within 10%.

Usage::

    python benchmarks/lm_memory.py --depths 6 24 --width 256 \
        --json benchmarks/results/lm_memory_w256.json

Variants: by default vanilla, DCA, 2-DCA and the rivals (``attn_res``, ``mhc``, ``muddformer``,
``value_residual``); ``--variants`` picks others. Runtime: compilation only, about a minute per
(variant, depth) on a loaded 2-core CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import (  # noqa: E402
    DEFAULT_VARIANTS,
    PAPER_MEMORY_RATIO,
    RIVAL_VARIANTS,
    VARIANTS,
    check_positive,
    emit,
    machine,
    model_config,
    save_partial,
    synthetic_batch,
    train_setup,
)

from dca_theory.lm.model import build_model  # noqa: E402

MIB = 2.0**20


def analysis_dict(compiled) -> dict:
    m = compiled.memory_analysis()
    out = {name: int(getattr(m, f"{name}_size_in_bytes")) for name in
           ("argument", "output", "temp", "alias", "generated_code")}
    out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def shapes(tree):
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "shape") else x, tree)


def train_memory(cfg, batch: int) -> dict:
    step, args = train_setup(cfg, batch)
    return analysis_dict(jax.jit(step).lower(*shapes(args)).compile())


def inference_memory(cfg, batch: int, *, trunk_only: bool = False) -> dict:
    """Memory of the jitted forward pass; ``trunk_only``: embeddings → trunk output, without
    the final LayerNorm and the B×L×V logits (whose buffer otherwise dominates ``temp``)."""
    model = build_model(cfg, key=jax.random.PRNGKey(0))
    tokens = synthetic_batch(batch, cfg.max_len, cfg.vocab_size)["inputs"]

    def forward(m, seq):
        if trunk_only:
            return m.trunk(m.embed(seq), causal=True, inference=True)
        return m(seq, inference=True)

    fwd = jax.jit(lambda m, t: jax.vmap(lambda s: forward(m, s))(t))
    return analysis_dict(fwd.lower(model, tokens).compile())


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[6, 24])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--variants", nargs="+", default=[*DEFAULT_VARIANTS, *RIVAL_VARIANTS],
                   choices=list(VARIANTS))
    p.add_argument("--skip-train", action="store_true", help="inference memory only")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    for name in ("width", "seq", "batch", "vocab"):
        check_positive(name, getattr(args, name))
    record = {"benchmark": "lm_memory", "config": vars(args).copy(), "machine": machine(),
              "paper_train_memory_ratio": PAPER_MEMORY_RATIO, "target_train_ratio": 1.05,
              "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "train": {}, "inference": {}, "inference_trunk": {}}
    for depth in args.depths:
        for v in args.variants:
            cfg = model_config(v, width=args.width, depth=depth, seq=args.seq, vocab=args.vocab)
            t = time.perf_counter()
            key = f"{v}@{depth}"
            record["inference"][key] = inference_memory(cfg, args.batch)
            record["inference_trunk"][key] = inference_memory(cfg, args.batch, trunk_only=True)
            if not args.skip_train:
                record["train"][key] = train_memory(cfg, args.batch)
            print(f"  {key}: compiled in {time.perf_counter() - t:.1f} s", flush=True)
            save_partial(record, args.json)

    print(f"\nwidth {args.width}, seq {args.seq}, batch {args.batch}, vocab {args.vocab} "
          f"(MiB; ratios to vanilla at the same depth)")
    print(f"{'depth':>5s} {'variant':14s} {'train peak':>11s} {'ratio':>6s} {'train temp':>11s} "
          f"{'infer temp':>11s} {'ratio':>6s} {'trunk temp':>11s}")
    for depth in args.depths:
        base = f"vanilla@{depth}"
        for v in args.variants:
            key = f"{v}@{depth}"
            inf = record["inference"][key]["temp"]
            inf_ratio = inf / record["inference"][base]["temp"] if base in record["inference"] \
                else float("nan")
            tr = record["train"].get(key)
            tr_ratio = (tr["peak"] / record["train"][base]["peak"]
                        if tr and base in record["train"] else float("nan"))
            tr_peak = f"{tr['peak'] / MIB:11.1f}" if tr else f"{'-':>11s}"
            tr_temp = f"{tr['temp'] / MIB:11.1f}" if tr else f"{'-':>11s}"
            trunk = record["inference_trunk"][key]["temp"]
            print(f"{depth:5d} {v:14s} {tr_peak} {tr_ratio:6.3f} {tr_temp} "
                  f"{inf / MIB:11.2f} {inf_ratio:6.3f} {trunk / MIB:11.2f}")
    if len(args.depths) >= 2:
        d0, d1 = min(args.depths), max(args.depths)
        for part in ("inference", "inference_trunk"):
            growth = {v: record[part][f"{v}@{d1}"]["temp"] / record[part][f"{v}@{d0}"]["temp"]
                      for v in args.variants}
            record[f"{part}_growth"] = {"from_depth": d0, "to_depth": d1, "ratio": growth}
            print(f"{part} temp growth depth {d0} -> {d1} (target for k-DCA: <= 1.10): "
                  + ", ".join(f"{v} x{g:.2f}" for v, g in growth.items()))
    return emit(record, args.json)


if __name__ == "__main__":
    main()
