"""Decode latency per token and cache memory per token: vanilla vs full DCA vs 2-DCA (or every
LM kind, ``--variants all``).

Each variant (depth 24, width 256, heads width/64, MLP 4×width, context 128, vocabulary 8192,
float32 by default) decodes greedily with the key/value cache of :mod:`dca_theory.lm.decode`:
one compiled step per token (``jax.jit``, the cache donated and written in place), the next
token the argmax of the step's logits. After a warm-up, each round decodes ``--tokens`` tokens
from an empty cache with every variant in a rotating order (so a change of machine load hits
all alike); the latency per token of a round is its wall time over ``--tokens``, and the figure
is the median over rounds. Ratios are given two ways: of the medians, and the median of the
per-round ratios (variants timed back to back, so steadier on a loaded machine). The attention
reads the whole preallocated buffer with a mask, so a step costs the same at every position.

Memory, from the model and from XLA (``compiled.memory_analysis()``, deterministic):

* **cache per token of context**: the key/value buffers' bytes over ``context``, i.e.
  ``2 · depth · width`` numbers for every kind. DCA's keys and values of earlier tokens are GRN
  combinations of *their* stacks, computed once, so no earlier token's stack is kept (module
  docstring of :mod:`dca_theory.lm.decode`);
* **stack per sequence**: the stack of the token being decoded, the most ``D``-vectors a step
  holds at once (vanilla 1, 2-DCA k + 2 = 4, full DCA depth + 1 = 25) times ``width`` numbers;
  working memory of one token, not a per-token cache;
* **step temp**: XLA's temporary bytes of the compiled step (its whole working set).

Paper (Table 1's discussion, 24 layers): "k = 2 results in a model with 48 % lower inference
latency compared to k = 24", i.e. 2-DCA / full DCA = 0.52 (they give no absolute latencies and
do not say how they decode).

``--layer-loop scan`` decodes through the scanned trunk (:mod:`dca_theory.lm.scanned`: one
scan body over the stacked blocks, each reading and writing its rows of the cache), which
decodes every kind with the cache; the per-block trunks (``unroll``) have cached steps for
vanilla, the GRN kinds, DCA and the paper's related work only.

Usage::

    python benchmarks/lm_decode.py --rounds 25 --tokens 64 \
        --json benchmarks/results/lm_decode_w256.json
    python benchmarks/lm_decode.py --layer-loop scan --variants all \
        --json benchmarks/results/lm_decode_w256_scan_kinds.json     # every kind
    python benchmarks/lm_decode.py --quick          # tiny sizes, seconds (the test's dry run)

Prints a table and the JSON record (``os.getloadavg()`` before and after). Runtime on the 2-core
CPU: a few minutes at the default size (compiling the three depth-24 steps dominates).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import (  # noqa: E402
    KIND_VARIANTS,
    apply_preset,
    check_positive,
    emit,
    machine,
    model_config,
)

from dca_theory.lm.config import LAYER_LOOPS  # noqa: E402
from dca_theory.lm.decode import STEPS, DecodeCache, decode_step, max_stack_entries  # noqa: E402
from dca_theory.lm.model import build_model  # noqa: E402
from dca_theory.lm.params import param_count  # noqa: E402

DECODE_VARIANTS = ("vanilla", "dca", "2-dca")
PAPER_2DCA_OVER_DCA = 0.52  # "48 % lower inference latency" for k = 2 than k = 24
QUICK = {"depth": 2, "width": 64, "context": 16, "vocab": 256, "tokens": 4, "rounds": 2}


def compiled_step(model):
    """``(step, params)``: the greedy decoding step compiled for ``model`` (the cache donated),
    ``step(params, cache, token) -> (next_token, cache)``, and its compile seconds and memory."""
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def greedy(params, cache, token):
        logits_V, cache = decode_step(eqx.combine(params, static), cache, token)
        return jnp.argmax(logits_V).astype(jnp.int32), cache

    t0 = time.perf_counter()
    compiled = jax.jit(greedy, donate_argnums=(1,)).lower(
        params, DecodeCache.empty(model), jnp.zeros((), jnp.int32)).compile()
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    memory = None if mem is None else {name: int(getattr(mem, f"{name}_size_in_bytes")) for name
                                       in ("argument", "output", "temp", "alias")}
    return compiled, params, seconds, memory


def decode_round(step, params, model, tokens: int) -> float:
    """Seconds per token of ``tokens`` greedy steps from an empty cache."""
    cache, token = DecodeCache.empty(model), jnp.ones((), jnp.int32)
    jax.block_until_ready(cache)
    t0 = time.perf_counter()
    for _ in range(tokens):
        token, cache = step(params, cache, token)
    jax.block_until_ready(token)
    return (time.perf_counter() - t0) / tokens


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of ``a / b`` within each round: the two were timed back to back, so
    a change of machine load between rounds cancels (steadier than a ratio of medians)."""
    return statistics.median(x / y for x, y in zip(a, b))


def check_decodable(variants, args) -> None:
    """One-line ``SystemExit`` (before anything compiles) for a variant whose per-block trunk
    has no cached decoding step."""
    if args.layer_loop != "unroll":
        return
    for variant in variants:
        cfg = model_config(variant, width=args.width, depth=args.depth, seq=args.context,
                           vocab=args.vocab, param_dtype=args.dtype)
        model = eqx.filter_eval_shape(build_model, cfg, key=jax.random.PRNGKey(0))
        if type(model.trunk) not in STEPS:
            raise SystemExit(f"error: variant {variant!r} has no cached decoding with "
                             "--layer-loop unroll; use --layer-loop scan (every kind)")


def setup(variant: str, args) -> dict:
    cfg = model_config(variant, width=args.width, depth=args.depth, seq=args.context,
                       vocab=args.vocab, param_dtype=args.dtype)
    cfg = dataclasses.replace(cfg, layer_loop=args.layer_loop)
    model = build_model(cfg, key=jax.random.PRNGKey(0))
    step, params, compile_s, memory = compiled_step(model)
    for _ in range(args.warmup):
        decode_round(step, params, model, args.tokens)
    cache = DecodeCache.empty(model)
    itemsize = jnp.dtype(args.dtype).itemsize
    info = {"params": param_count(cfg), "compile_s": compile_s, "step_memory_bytes": memory,
            "cache_bytes": cache.nbytes(),
            "cache_bytes_per_context_token": cache.nbytes() / args.context,
            "stack_entries": max_stack_entries(model),
            "stack_bytes_per_sequence": max_stack_entries(model) * args.width * itemsize}
    print(f"  {variant:17s} compiled in {compile_s:.1f} s", flush=True)
    return {"step": step, "params": params, "model": model, "info": info}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=24)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--context", type=int, default=128, help="cache length (the model's max_len)")
    p.add_argument("--vocab", type=int, default=8192, help="the project's BPE vocabulary size")
    p.add_argument("--tokens", type=int, default=32, help="decoded tokens per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds per variant")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="parameter (and so cache and matmul) dtype")
    p.add_argument("--variants", nargs="+", default=list(DECODE_VARIANTS),
                   choices=[*KIND_VARIANTS, "all"],
                   help="LM kinds to decode ('all': every kind of the registry, and 2-DCA)")
    p.add_argument("--layer-loop", default="unroll", choices=LAYER_LOOPS,
                   help="the trunk: per-block ('unroll') or the scanned trunk ('scan')")
    quick = ", ".join(f"{k} {v}" for k, v in QUICK.items())
    p.add_argument("--quick", action="store_true", help=f"tiny sizes for a dry run ({quick})")
    p.add_argument("--json", default=None, help="also write the record to this file")
    args = p.parse_args(argv)
    if "all" in args.variants:
        args.variants = list(KIND_VARIANTS)
    apply_preset(args, args.quick, QUICK)
    for name in ("depth", "width", "context", "vocab", "tokens", "rounds"):
        check_positive(name, getattr(args, name))
    if args.warmup < 0:
        raise SystemExit(f"error: --warmup must be >= 0, got {args.warmup}")
    if args.width % 64:
        raise SystemExit(f"error: --width must be a multiple of 64 (head width), got {args.width}")
    if args.tokens > args.context:
        raise SystemExit(f"error: --tokens must be <= --context ({args.context}), got "
                         f"{args.tokens}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    record = {"benchmark": "lm_decode", "config": vars(args).copy(), "machine_before": machine(),
              "paper_2dca_over_dca_latency": PAPER_2DCA_OVER_DCA}
    check_decodable(args.variants, args)
    runs = {v: setup(v, args) for v in args.variants}
    times = {v: [] for v in args.variants}
    for r in range(args.rounds):
        order = args.variants[r % len(args.variants):] + args.variants[:r % len(args.variants)]
        for v in order:
            run = runs[v]
            times[v].append(decode_round(run["step"], run["params"], run["model"], args.tokens))
    record["machine_after"] = machine()
    med = {v: statistics.median(ts) for v, ts in times.items()}
    record["latency_s_per_token"] = times
    record["median_latency_s_per_token"] = med
    record["memory"] = {v: runs[v]["info"] for v in args.variants}
    if "vanilla" in med:
        record["latency_ratio_to_vanilla"] = {v: med[v] / med["vanilla"] for v in med}
        record["latency_ratio_to_vanilla_paired"] = {v: paired_ratio(times[v], times["vanilla"])
                                                     for v in med}
    if "dca" in med and "2-dca" in med:
        record["latency_2dca_over_dca"] = med["2-dca"] / med["dca"]
        record["latency_2dca_over_dca_paired"] = paired_ratio(times["2-dca"], times["dca"])

    load = (record["machine_before"]["loadavg_1_5_15"][0],
            record["machine_after"]["loadavg_1_5_15"][0])
    print(f"\ndepth {args.depth}, width {args.width}, context {args.context}, vocab {args.vocab},"
          f" {args.dtype}, {args.tokens} tokens x {args.rounds} rounds, load {load[0]:.1f} -> "
          f"{load[1]:.1f}")
    print(f"{'variant':17s} {'ms/token':>9s} {'vs vanilla':>10s} {'cache B/token':>13s} "
          f"{'stack B/seq':>11s} {'step temp B':>11s} {'compile s':>9s}")
    for v in args.variants:
        info = runs[v]["info"]
        temp = (info["step_memory_bytes"] or {}).get("temp", float("nan"))
        ratio = record.get("latency_ratio_to_vanilla", {}).get(v, float("nan"))
        print(f"{v:17s} {1e3 * med[v]:9.3f} {ratio:10.3f} "
              f"{info['cache_bytes_per_context_token']:13.0f} "
              f"{info['stack_bytes_per_sequence']:11d} {temp:11.0f} {info['compile_s']:9.1f}")
    if "latency_2dca_over_dca" in record:
        print(f"2-DCA / full DCA latency: {record['latency_2dca_over_dca']:.3f} (ratio of "
              f"medians), {record['latency_2dca_over_dca_paired']:.3f} (median of per-round "
              f"ratios); paper: {PAPER_2DCA_OVER_DCA:.2f}")
    return emit(record, args.json)


if __name__ == "__main__":
    main()
