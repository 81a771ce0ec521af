"""Training throughput of our 2-DCA against the public PyTorch ``deep-cross-attention``.

Target: at a matching config (width 512, depth 6, 8 heads of width 64, MLP 4×, k = 2,
sequence 128, float32, CPU) our k-DCA trains at >= 1.5× the tokens/s of the PyPI package
``deep-cross-attention`` 0.1.1 (lucidrains; ``DCAGPT``).

Both train steps do the same job on the same synthetic tokens: forward, mean next-token
cross-entropy, backward, one AdamW update (β = (0.9, 0.98), eps 1e-9, weight decay 0.1, the
paper's recipe).

* ours: ``dca_theory.lm.steps.make_train_step`` for ``residual="dca", k=2`` (the paper's k-DCA
  stack [input, sum of middle outputs, last k], §3.1), ``jax.jit``-compiled, optax AdamW;
* theirs: ``DCAGPT(...)(ids, return_loss=True)``, ``loss.backward()``, ``torch.optim.AdamW``
  (its default CPU implementation), eager PyTorch (no ``torch.compile``: the package's own use);
* for reference, our vanilla pre-LN transformer step in the same rounds.

The models are *not* identical (``shared/reference/dca-paper.md`` §6): ``DCAGPT`` keeps the
FIRST k and LAST k layer outputs in its stack (not the paper's [input, Σ middle, last k]), puts
an RMSNorm inside every GRN, uses RMSNorm instead of LayerNorm, rotary positions instead of
learned ones, GELU, and no biases in attention. The parameter counts of both are printed; the
work per step differs by a few per cent, not by the factor measured.

Protocol: every step is compiled (ours) and warmed up (``--warmup`` steps each), then the
variants are timed *alternately* in one process: each of ``--repeats`` rounds times one step of
every variant in a rotating order, so that a change of machine load hits all alike. The figure
is the median over rounds; tokens/s = batch·seq / median step time; the ratio is
tokens/s(ours 2-DCA) / tokens/s(theirs). ``os.getloadavg()`` before and after, the thread
settings of both libraries and the parameter counts go into the JSON record.

Model FLOP utilisation (MFU) of our two steps, against the machine's matmul FLOP/s measured in
the same rounds: a jitted float32 (1024 x 1024) @ (1024 x 1024) product, 8 times per call, is
one more variant of the rotation, so the peak and the steps see the same load. Model FLOPs per
step are the transformer's (PaLM's count): 6 T N + 12 T L d s, with T = batch·seq tokens, N the
matmul weights (per layer 4 d² + 2 d d_mlp, plus the d x V output projection), L layers, width d
and sequence s. DCA's GRN work is not counted, so its overhead shows as a lower MFU. XLA's own
count for the compiled step (``cost_analysis``) is recorded beside it. ``--no-torch`` measures
ours and the peak only (no torch needed).

Usage::

    python benchmarks/vs_pytorch.py --repeats 5 --json benchmarks/results/vs_pytorch_w512.json
    python benchmarks/vs_pytorch.py --smoke          # tiny sizes, seconds

Needs the ``bench`` extra (``pip install -e '.[bench]'``: torch, deep-cross-attention). Runtime
on a 2-core CPU: a few minutes at the default size (mostly the JAX compilation).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import (  # noqa: E402
    apply_preset,
    check_positive,
    emit,
    machine,
    model_config,
    model_flops_per_step,
    synthetic_batch,
    train_setup,
)

from dca_theory.lm.params import param_count  # noqa: E402

TARGET_RATIO = 1.5
OURS_KDCA, OURS_VANILLA, THEIRS = "ours_kdca", "ours_vanilla", "theirs_dcagpt"
PEAK = "matmul_peak"  # not a model: the machine's matmul FLOP/s, timed in the same rotation
PEAK_N, PEAK_REPS = 1024, 8
SMOKE = {"width": 64, "depth": 2, "seq": 16, "batch": 2, "vocab": 256, "repeats": 2,
         "warmup": 1}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--k", type=int, default=2, help="k of k-DCA (both implementations)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192, help="the project's BPE vocabulary size")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--smoke", action="store_true",
                   help=f"tiny sizes for a quick check: {SMOKE} (overrides those flags)")
    p.add_argument("--json", default=None, help="also write the record to this file")
    p.add_argument("--no-torch", action="store_true",
                   help="time ours and the matmul peak only (MFU; no torch needed)")
    args = p.parse_args(argv)
    apply_preset(args, args.smoke, SMOKE)
    for name in ("width", "depth", "k", "seq", "batch", "vocab", "repeats", "warmup"):
        check_positive(name, getattr(args, name))
    if args.width % 64:
        raise SystemExit(f"error: --width must be a multiple of 64 (head width), got {args.width}")
    return args


def thread_settings() -> dict:
    import torch

    return {"torch_num_threads": torch.get_num_threads(),
            "torch_num_interop_threads": torch.get_num_interop_threads(),
            # XLA:CPU sizes its Eigen thread pool from the visible cores unless XLA_FLAGS says
            # otherwise; record both.
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "visible_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "")}


def torch_setup(args, tokens: np.ndarray):
    """``(step_fn, n_params)``: one eager DCAGPT train step (forward, CE, backward, AdamW)."""
    import torch
    from deep_cross_attention import DCAGPT

    torch.manual_seed(0)
    model = DCAGPT(num_tokens=args.vocab, dim=args.width, depth=args.depth,
                   past_layers_k=args.k, dim_head=64, heads=args.width // 64,
                   ff_expansion_factor=4.0)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.6e-3, betas=(0.9, 0.98), eps=1e-9,
                                  weight_decay=0.1)
    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))  # (batch, seq + 1)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = model(ids, return_loss=True)
        loss.backward()
        optimizer.step()
        return float(loss.detach())  # eager: the work is done when this returns

    # Trainable only: each RotaryEmbedding also registers its dim_head/2 fixed frequencies as a
    # parameter with requires_grad=False.
    return step, int(sum(p.numel() for p in model.parameters() if p.requires_grad))


def peak_setup():
    """``(step_fn, None)``: one call multiplies two float32 1024² matrices ``PEAK_REPS`` times."""
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (PEAK_N, PEAK_N), jnp.float32)
    f = jax.jit(lambda x: x @ x)

    def step() -> float:
        for _ in range(PEAK_REPS):
            out = f(a)
        out.block_until_ready()
        return 0.0

    return step, None


def jax_setup(variant: str, args, xla_flops: dict | None = None, name: str = ""):
    """``(step_fn, n_params)`` for our jitted train step; state is carried across calls.
    ``xla_flops[name]`` receives XLA's FLOP count of the compiled step."""
    cfg = model_config(variant, width=args.width, depth=args.depth, seq=args.seq,
                       vocab=args.vocab)
    if cfg.k is not None:
        cfg = dataclasses.replace(cfg, k=args.k)
    fn, call_args = train_setup(cfg, args.batch)
    jitted = jax.jit(fn)
    if xla_flops is not None:
        cost = jitted.lower(*call_args).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        xla_flops[name] = float(cost.get("flops", float("nan"))) if cost else float("nan")
    state = {"args": call_args}

    def step() -> float:
        params, opt_state, metrics = jitted(*state["args"])
        jax.block_until_ready((params, metrics))
        state["args"] = (params, opt_state, *state["args"][2:])
        return float(metrics["loss"])

    return step, param_count(cfg)


def run(args) -> dict:
    batch = synthetic_batch(args.batch, args.seq, args.vocab)  # the tokens our step sees
    ids = np.concatenate([np.asarray(batch["inputs"]), np.asarray(batch["targets"])[:, -1:]],
                         axis=1)  # (batch, seq + 1): DCAGPT splits inputs/labels itself
    steps, params, first_loss, setup_s, xla_flops = {}, {}, {}, {}, {}
    builders = {OURS_KDCA: lambda: jax_setup("2-dca", args, xla_flops, OURS_KDCA),
                OURS_VANILLA: lambda: jax_setup("vanilla", args, xla_flops, OURS_VANILLA),
                PEAK: peak_setup}
    if not args.no_torch:
        builders[THEIRS] = lambda: torch_setup(args, ids)
    for name, build in builders.items():
        t = time.perf_counter()
        steps[name], params[name] = build()
        first_loss[name] = steps[name]()  # compiles ours; allocates theirs
        for _ in range(args.warmup - 1):
            steps[name]()
        setup_s[name] = time.perf_counter() - t
        print(f"  {name:14s} built, compiled and warmed up ({args.warmup} steps) "
              f"in {setup_s[name]:.1f} s", flush=True)
    names = list(builders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - t)
    tokens_per_step = args.batch * args.seq
    peak_times = times.pop(PEAK)
    for d in (params, first_loss):
        d.pop(PEAK)
    median = {n: statistics.median(ts) for n, ts in times.items()}
    tok_s = {n: tokens_per_step / m for n, m in median.items()}
    peak = 2.0 * PEAK_N**3 * PEAK_REPS / statistics.median(peak_times)
    cfg = model_config("vanilla", width=args.width, depth=args.depth, seq=args.seq,
                       vocab=args.vocab)
    flops = model_flops_per_step(cfg, args.batch)
    record = {"times_s": times, "median_s": median, "tokens_per_s": tok_s,
              "params": params, "first_loss": first_loss, "setup_s": setup_s,
              "log_vocab": math.log(args.vocab), "tokens_per_step": tokens_per_step,
              "matmul_peak_times_s": peak_times, "matmul_peak_flops_per_s": peak,
              "model_flops_per_step": flops, "xla_flops_per_step": xla_flops,
              "mfu": {n: flops / median[n] / peak for n in (OURS_KDCA, OURS_VANILLA)}}
    if THEIRS in median:
        import torch

        record |= {"ratio_ours_over_theirs": tok_s[OURS_KDCA] / tok_s[THEIRS],
                   "ratio_vanilla_over_theirs": tok_s[OURS_VANILLA] / tok_s[THEIRS],
                   "torch_version": torch.__version__}
    return record


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not args.no_torch:
        try:
            import deep_cross_attention  # noqa: F401
            import torch  # noqa: F401
        except ImportError as err:
            raise SystemExit(f"error: {err.name} is not installed; pip install -e '.[bench]' "
                             "(or --no-torch for ours and the MFU only)") from err
    record = {"benchmark": "vs_pytorch", "config": vars(args).copy(),
              "issue_target_ratio": TARGET_RATIO,
              "threads": None if args.no_torch else thread_settings(),
              "machine_before": machine(),
              "note": ("DCAGPT (deep-cross-attention 0.1.1) keeps the first k and last k layer "
                       "outputs, not the paper's [input, sum of middle, last k]; it uses "
                       "RMSNorm (also inside each GRN), rotary positions and GELU; eager "
                       "PyTorch, default torch.optim.AdamW")}
    record.update(run(args))
    record["machine_after"] = machine()

    load = (record["machine_before"]["loadavg_1_5_15"][0],
            record["machine_after"]["loadavg_1_5_15"][0])
    th = record["threads"] or {"torch_num_threads": "-", "XLA_FLAGS": os.environ.get(
        "XLA_FLAGS", "")}
    print(f"\nwidth {args.width}, depth {args.depth}, heads {args.width // 64}, k {args.k}, "
          f"seq {args.seq}, batch {args.batch}, vocab {args.vocab}, float32 CPU, "
          f"{args.repeats} alternated rounds; load {load[0]:.1f} -> {load[1]:.1f} on "
          f"{record['machine_before']['cpu_count']} cores; torch threads "
          f"{th['torch_num_threads']}, XLA_FLAGS {th['XLA_FLAGS']!r}")
    print(f"{'variant':14s} {'params':>11s} {'median step [s]':>16s} {'tokens/s':>10s} "
          f"{'vs theirs':>9s} {'MFU':>6s} {'first loss':>10s}")
    for name in record["median_s"]:
        ratio = (record["tokens_per_s"][name] / record["tokens_per_s"][THEIRS]
                 if THEIRS in record["median_s"] else float("nan"))
        mfu = record["mfu"].get(name, float("nan"))
        print(f"{name:14s} {record['params'][name]:11d} {record['median_s'][name]:16.4f} "
              f"{record['tokens_per_s'][name]:10.1f} {ratio:9.2f} {mfu:6.1%} "
              f"{record['first_loss'][name]:10.3f}")
    print(f"matmul peak {record['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s; model FLOPs per "
          f"step {record['model_flops_per_step'] / 1e9:.2f} G (XLA's count: "
          + ", ".join(f"{n} {v / 1e9:.2f} G" for n, v in record["xla_flops_per_step"].items())
          + ")")
    if "ratio_ours_over_theirs" in record:
        print(f"ours {args.k}-DCA / theirs (tokens/s): {record['ratio_ours_over_theirs']:.2f} "
              f"(target >= {TARGET_RATIO})")
    return emit(record, args.json)


if __name__ == "__main__":
    main()
