"""The prepared accelerator checks, sized for one short run on one GPU.

``bench``: at the paper's 6-layer, width-512 preset (8 heads, MLP 2048, sequence 128,
vocabulary 8192, dropout 0) in bfloat16 compute (float32 master weights), vanilla, 2-DCA and full
DCA train steps are compiled once each (``lower().compile()``: the same executable gives XLA's
memory analysis and the timings), warmed up, then timed alternately in ``--repeats`` rounds of
``--chunk`` steps. Reported: median step time, tokens/s, model FLOP/s and MFU (model FLOPs =
6 · non-embedding-and-output parameters · tokens + 12 · layers · width · seq · tokens for
attention, over the bf16 peak measured in the same run by an 8192³ matmul and over the datasheet
989 TFLOP/s), step-time and peak-memory ratios to vanilla.

``ablation``: Table 7 at the paper's size on Penn Treebank: vanilla, DCA, GRN-v3,
GRN-v2, GRN-v1 (in that order, so the most important finish first), 3 seeds at once
(:func:`dca_theory.lab.seeds.train_lm_seeds`), batch 32 × 128 words per seed, bf16 compute,
AdamW with the paper's β/eps/weight decay, lr 1e-3, 100 warm-up steps, inverse-sqrt decay,
dropout 0.1 (paper preset), ``--steps`` steps each; whole-split valid/test perplexity. Each
model's record is written as soon as it finishes; ``--budget-s`` stops before a model that
would not fit.

Commands (on the device machine; the corpus travels in an ignored folder)::

    PYTHONPATH=. python benchmarks/gpu_lm.py bench --json $OUT/gpu_bench.json
    PYTHONPATH=. DCA_DATA_DIR=.gpu_data python benchmarks/gpu_lm.py ablation --out $OUT

``--smoke`` shrinks both to a seconds-long CPU run (for testing the script itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import (  # noqa: E402
    DEFAULT_VARIANTS,
    emit,
    machine,
    model_config,
    train_setup,
)

from dca_theory.lm.params import param_count  # noqa: E402

DATASHEET_BF16_FLOPS = 989e12  # H100/H200 SXM dense bf16


def matmul_peak(n: int, reps: int = 10) -> float:
    """Achieved bf16 matmul FLOP/s on an n×n×n product (the ceiling for MFU)."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.bfloat16)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    t = time.perf_counter()
    for _ in range(reps):
        out = f(a, a)
    out.block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - t)


def model_flops_per_token(cfg) -> float:
    n = param_count(cfg) - cfg.vocab_size * cfg.d_model  # embeddings are lookups, not matmuls
    return 6.0 * n + 12.0 * cfg.n_layers * cfg.d_model * cfg.max_len


def bench(args) -> dict:
    width, depth = (64, 2) if args.smoke else (512, 6)
    batch, seq = (2, 16) if args.smoke else (args.batch, 128)
    peak = matmul_peak(256 if args.smoke else 8192)
    compiled, states, mem = {}, {}, {}
    for v in DEFAULT_VARIANTS:
        cfg = model_config(v, width=width, depth=depth, seq=seq, vocab=8192)
        fn, call_args = train_setup(cfg, batch, "bfloat16")
        t = time.perf_counter()
        compiled[v] = jax.jit(fn).lower(*call_args).compile()
        m = compiled[v].memory_analysis()
        mem[v] = None if m is None else int(m.temp_size_in_bytes + m.argument_size_in_bytes
                                            + m.output_size_in_bytes - m.alias_size_in_bytes)
        for _ in range(3):
            params, opt_state, _ = compiled[v](*call_args)
            call_args = (params, opt_state, *call_args[2:])
        jax.block_until_ready(call_args[0])
        print(f"{v}: compiled and warmed up in {time.perf_counter() - t:.1f} s", flush=True)
        states[v] = call_args
    times = {v: [] for v in DEFAULT_VARIANTS}
    names = list(DEFAULT_VARIANTS)
    for r in range(args.repeats):
        for v in names[r % 3:] + names[:r % 3]:
            call_args = states[v]
            t = time.perf_counter()
            for _ in range(args.chunk):
                params, opt_state, metrics = compiled[v](*call_args)
                call_args = (params, opt_state, *call_args[2:])
            jax.block_until_ready((params, metrics))
            times[v].append((time.perf_counter() - t) / args.chunk)
            states[v] = call_args
    rows = {}
    for v in DEFAULT_VARIANTS:
        cfg = model_config(v, width=width, depth=depth, seq=seq, vocab=8192)
        step = statistics.median(times[v])
        tok_s = batch * seq / step
        flops = model_flops_per_token(cfg) * tok_s
        rows[v] = {"params": param_count(cfg), "median_step_s": step, "tokens_per_s": tok_s,
                   "model_flops_per_s": flops, "mfu_vs_measured_peak": flops / peak,
                   "mfu_vs_datasheet": flops / DATASHEET_BF16_FLOPS, "train_bytes": mem[v],
                   "step_ratio_to_vanilla": step / statistics.median(times["vanilla"]),
                   "memory_ratio_to_vanilla": (None if mem[v] is None or not mem["vanilla"]
                                               else mem[v] / mem["vanilla"]), "times_s": times[v]}
        print(f"{v:8s} step {step * 1e3:8.3f} ms  {tok_s:12,.0f} tok/s  MFU {flops / peak:6.1%} "
              f"(datasheet {flops / DATASHEET_BF16_FLOPS:6.1%})  "
              f"step x{rows[v]['step_ratio_to_vanilla']:.3f}"
              f"  mem x{rows[v]['memory_ratio_to_vanilla'] or float('nan'):.3f}", flush=True)
    return {"benchmark": "gpu_lm bench", "width": width, "depth": depth, "batch": batch,
            "seq": seq, "compute_dtype": "bfloat16", "measured_bf16_peak_flops": peak,
            "repeats": args.repeats, "chunk": args.chunk, "results": rows, "machine": machine()}


def ablation(args) -> None:
    from dca_theory.lab.seeds import train_lm_seeds
    from dca_theory.lm import data as lm_data
    from dca_theory.lm.config import PRESETS
    from dca_theory.lm.train_config import LMTrainConfig

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = lm_data.load_corpus("ptb")
    model = PRESETS["paper"].replace(max_len=128)
    steps = 20 if args.smoke else args.steps
    tc = LMTrainConfig(data="ptb", seq_len=16 if args.smoke else 128,
                       batch_size=2 if args.smoke else 32, steps=steps, lr=1e-3,
                       warmup_steps=5 if args.smoke else 100, eval_every=100, eval_batches=10,
                       compute_dtype="bfloat16", progress=False)
    if args.smoke:
        model = model.replace(d_model=32, n_heads=2, d_mlp=64, n_layers=2, max_len=16)
    start, per_model = time.perf_counter(), None
    for kind in ("vanilla", "dca", "grn_v3", "grn_v2", "grn_v1"):
        spent = time.perf_counter() - start
        if per_model is not None and spent + 1.3 * per_model > args.budget_s:
            print(f"{kind}: skipped, {spent:.0f} s spent of a {args.budget_s} s budget", flush=True)
            continue
        t = time.perf_counter()
        runs = train_lm_seeds(model.replace(residual=kind), tc, (0, 1, 2), corpus=corpus,
                              final_batches=4 if args.smoke else None)
        per_model = max(per_model or 0.0, time.perf_counter() - t)
        rec = {"kind": kind, **runs.record(), "wall_s": time.perf_counter() - t,
               "loss_curve_every_10": runs.loss_SxT[:, ::10].tolist(),
               "train": dataclasses.asdict(tc), "machine": machine()}
        (out / f"ablation_{kind}.json").write_text(json.dumps(rec, default=str), "utf-8")
        print(f"{kind}: test ppl {[round(x, 2) for x in rec['test_ppl']]}, "
              f"{rec['median_step_s'] * 1e3:.1f} ms/step, {rec['wall_s']:.0f} s", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("bench", "ablation"))
    p.add_argument("--smoke", action="store_true", help="tiny sizes: test the script on CPU")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--chunk", type=int, default=10)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--budget-s", type=float, default=280.0)
    p.add_argument("--out", default="runs/gpu_ablation")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    for name in ("batch", "repeats", "chunk", "steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name} must be >= 1, got {getattr(args, name)}")
    if args.what == "bench":
        emit(bench(args), args.json)
    else:
        ablation(args)


if __name__ == "__main__":
    main()
