"""GPU performance of the LM in one call: step-time ratios, MFU, memory, compile and decode times.

Claim tested: on one H200 in bfloat16, at 6 and 24 layers of width 512,
2-DCA's train step takes at most 1.10× and full DCA's at most 1.25× vanilla's, and vanilla's
step reaches at least 40 % model FLOP utilisation. The targets are printed next to the figures
with PASS/MISS, never asserted (on another device the verdicts are for information).

Command (on the device machine; one call of at most 10 minutes including start-up)::

    PYTHONPATH=. python benchmarks/gpu_perf.py --json $OUT/gpu_perf.json

Runtime: about ``--budget-s`` (default 420 s) after the imports, mostly compilation. A variant
is set up only if its cost, guessed from the set-ups measured so far (compile time taken linear
in depth), fits in what is left; the first one always runs. What does not fit is listed under
``skipped`` in the JSON, which is rewritten after every measurement, so a timeout keeps what was
measured. Not yet run on a GPU: how long the fused path takes to compile there is unknown (the
unfused 6-layer steps of ``paper/06_performance.md`` §6.6 compiled in 16-24 s on the H200).
``--smoke``: tiny sizes on the CPU, about 2 minutes on the shared 2-core CPU (the test's dry run).

Model: width 512, heads of 64, MLP 4× width, sequence 1024, batch 32, vocabulary 8192, dropout
0, float32 master weights with ``--compute-dtype`` (default bfloat16) matmuls, the project's
AdamW train step (``dca_theory.lm.steps.make_train_step``), synthetic tokens. Variants:
``vanilla``, ``2-dca``, ``dca`` (the default fused GRN path; on a GPU it is lowered without the
XLA:CPU workarounds, see :mod:`dca_theory.lm.fast.fused_grn`); ``--variants`` adds the rivals,
and the ``-scan`` variants (``layer_loop="scan"``, compile time flat in depth).
A vanilla step is 5.8 (6 layers) and 20.6 (24 layers) model TFLOP: at 20-40 % of the H200's
measured 789 TFLOP/s bf16 matmul rate (§6.6) about 18-37 and 65-130 ms, long enough that kernel
launches do not decide the ratios.

Pieces, in this order: the train step at each of ``--depths`` (6, 24), then decoding at the
deepest. What each figure means:

* **compile** (per variant): ``lower_s`` tracing and lowering, ``compile_s`` XLA compilation
  (``jax.jit(step).lower(...).compile()``), ``first_step_s`` the first call of the executable;
* **step time**: after ``--warmup`` steps, ``--rounds`` rounds of ``--chunk`` steps of every
  variant and of the matmul peak in a rotating order (a change of device clock or load hits
  all alike); a round's figure is its wall time over ``--chunk``; ``median_step_s`` is the
  median over rounds and ``step_ratio_to_vanilla`` the ratio of medians;
* **MFU**: model FLOPs per step (PaLM's count, :func:`lm_bench_common.model_flops_per_step`,
  the same vanilla count for every variant, so DCA's extra work shows as a lower MFU) over the
  median step time over the matmul peak: ``--peak-reps`` products of two ``--peak-n`` square
  matrices in the compute dtype per call, timed in the same rotation. XLA's own FLOP count of
  each compiled step (``cost_analysis``) is recorded beside it;
* **training peak memory**: ``argument + output + temp - alias`` bytes of the compiled train
  step (XLA's memory analysis, as ``lm_memory.py``); on a device with ``memory_stats()`` also
  the allocator's ``bytes_in_use`` before the variant's set-up and ``peak_bytes_in_use`` after
  its warm-up (the peak is process-wide and never resets: it is the variant's own only when it
  rose during that variant);
* **decode latency** per token (deepest config, context ``--seq``, parameters in the compute
  dtype): greedy decoding with the key/value cache, ``lm_decode.py``'s compiled step and
  rounds, alternated; ratios of medians and medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_decode  # noqa: E402
from lm_bench_common import (  # noqa: E402
    VARIANTS,
    apply_preset,
    emit,
    machine,
    model_config,
    model_flops_per_step,
    save_partial,
    train_setup,
)

from dca_theory.lm.params import param_count  # noqa: E402

GPU_VARIANTS = ("vanilla", "2-dca", "dca")
TARGET_STEP_RATIO = {"2-dca": 1.10, "dca": 1.25}  # at most, on an H200
TARGET_VANILLA_MFU = 0.40  # at least, on an H200
DATASHEET_BF16_FLOPS = 989e12  # H100/H200 SXM dense bf16, for reference beside the measured peak
SMOKE = {"depths": [2, 3], "width": 64, "seq": 16, "batch": 2, "vocab": 256, "rounds": 2,
         "chunk": 2, "warmup": 1, "peak_n": 256, "peak_reps": 4, "decode_tokens": 4,
         "decode_rounds": 2}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[6, 24])
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=8192, help="the project's BPE vocabulary size")
    p.add_argument("--variants", nargs="+", default=list(GPU_VARIANTS), choices=list(VARIANTS))
    p.add_argument("--compute-dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--rounds", type=int, default=9, help="alternated timing rounds per depth")
    p.add_argument("--chunk", type=int, default=10, help="steps per variant and round")
    p.add_argument("--warmup", type=int, default=3, help="steps after the first, untimed")
    p.add_argument("--peak-n", type=int, default=8192, help="side of the peak's square matmul")
    p.add_argument("--peak-reps", type=int, default=20, help="matmuls per timed peak call")
    p.add_argument("--decode-tokens", type=int, default=32, help="greedy tokens per round")
    p.add_argument("--decode-rounds", type=int, default=9)
    p.add_argument("--no-decode", action="store_true", help="skip the decode piece")
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--smoke", action="store_true", help=f"tiny sizes for a CPU dry run: {SMOKE}")
    p.add_argument("--json", default=None, help="also write the record to this file")
    args = p.parse_args(argv)
    apply_preset(args, args.smoke, SMOKE)
    args.variants = list(dict.fromkeys(args.variants))  # each once: they key the record
    for name in ("width", "seq", "batch", "vocab", "rounds", "chunk", "peak_n", "peak_reps",
                 "decode_tokens", "decode_rounds"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got "
                             f"{getattr(args, name)}")
    bad = [d for d in args.depths if d < 1]
    if bad:
        raise SystemExit(f"error: --depths must all be >= 1, got {bad[0]}")
    if args.warmup < 0:
        raise SystemExit(f"error: --warmup must be >= 0, got {args.warmup}")
    if args.width % 64:
        raise SystemExit(f"error: --width must be a multiple of 64 (head width), got {args.width}")
    if "vanilla" not in args.variants:
        raise SystemExit(f"error: --variants must include vanilla (the ratios' base), got "
                         f"{' '.join(args.variants)}")
    if args.decode_tokens > args.seq:
        raise SystemExit(f"error: --decode-tokens must be <= --seq ({args.seq}), got "
                         f"{args.decode_tokens}")
    if not args.budget_s > 0:
        raise SystemExit(f"error: --budget-s must be > 0, got {args.budget_s}")
    return args


class Budget:
    """Seconds left of ``--budget-s``, and whether a guessed cost still fits."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.perf_counter()

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, guess: float) -> bool:
        return self.spent() + guess <= self.seconds


def device_memory() -> dict | None:
    """The allocator's counters of the first device, where the backend has them (GPU)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 (backends without the counters raise or return None)
        return None
    if not stats:
        return None
    return {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
            if k in stats}


def memory_analysis(compiled) -> dict | None:
    m = compiled.memory_analysis()
    if m is None:
        return None
    out = {name: int(getattr(m, f"{name}_size_in_bytes"))
           for name in ("argument", "output", "temp", "alias")}
    out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def xla_flops(compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 (a backend without the analysis must not end the run)
        return None
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def peak_setup(n: int, reps: int, dtype: str):
    """``call()``: ``reps`` products of two ``n``-square matrices, waited for."""
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(ka, (n, n), jnp.dtype(dtype))
    b = jax.random.normal(kb, (n, n), jnp.dtype(dtype))
    f = jax.jit(lambda x, y: x @ y)

    def call():
        for _ in range(reps):
            out = f(a, b)
        out.block_until_ready()

    call()  # compiles
    return call


def build_variant(variant: str, depth: int, args) -> dict:
    """Compile one variant's train step, run its first and warm-up steps; its figures and state."""
    before = device_memory()
    start = time.perf_counter()
    cfg = model_config(variant, width=args.width, depth=depth, seq=args.seq, vocab=args.vocab)
    fn, state = train_setup(cfg, args.batch, args.compute_dtype)  # model and AdamW state, eager
    t0 = time.perf_counter()
    lowered = jax.jit(fn).lower(*state)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    state = run_steps(compiled, state, 1)
    t3 = time.perf_counter()
    warm = []
    for _ in range(args.warmup):
        t = time.perf_counter()
        state = run_steps(compiled, state, 1)
        warm.append(time.perf_counter() - t)
    info = {"params": param_count(cfg), "build_s": t0 - start, "lower_s": t1 - t0,
            "compile_s": t2 - t1, "first_step_s": t3 - t2, "warmup_steps_s": warm,
            "setup_s": time.perf_counter() - start, "train_memory": memory_analysis(compiled),
            "xla_flops_per_step": xla_flops(compiled), "device_memory_before": before,
            "device_memory_after": device_memory()}
    return {"compiled": compiled, "state": state, "info": info}


def run_steps(compiled, state: tuple, n: int) -> tuple:
    """``n`` train steps, waited for; the new ``(params, opt_state, rng, batch, step)``."""
    for _ in range(n):
        params, opt_state, metrics = compiled(*state)
        state = (params, opt_state, *state[2:])
    jax.block_until_ready((params, metrics))
    return state


def guess_cost(costs: dict, variant: str, depth: int) -> float:
    """Seconds a variant's set-up at ``depth`` may take, from the set-ups measured so far:
    the same variant at another depth scaled linearly, else the dearest at this depth, else 0."""
    same = [(d, s) for (v, d), s in costs.items() if v == variant]
    if same:
        return max(s * depth / d for d, s in same)
    here = [s for (_, d), s in costs.items() if d == depth]
    return max(here, default=0.0)


def train_piece(piece: dict, args, budget: Budget, costs: dict, skipped: list, save) -> None:
    """Fill ``piece`` (``{"depth", "variants"}``, in the record) with the train-step figures."""
    depth = piece["depth"]
    flops = model_flops_per_step(model_config("vanilla", width=args.width, depth=depth,
                                              seq=args.seq, vocab=args.vocab), args.batch)
    piece["model_flops_per_step"] = flops
    built = {}
    for v in args.variants:
        guess = guess_cost(costs, v, depth)
        if not budget.fits(guess):
            skipped.append({"piece": f"train@{depth}", "variant": v, "reason": (
                f"{budget.spent():.1f} s spent + {guess:.1f} s guessed > {budget.seconds:g} s")})
            print(f"  depth {depth} {v}: skipped (budget)", flush=True)
            save()
            continue
        built[v] = build_variant(v, depth, args)
        info = built[v]["info"]
        costs[(v, depth)] = info["setup_s"]
        piece["variants"][v] = info
        print(f"  depth {depth} {v:8s} lower {info['lower_s']:.1f} s, compile "
              f"{info['compile_s']:.1f} s, first step {info['first_step_s']:.2f} s", flush=True)
        save()
    if "vanilla" not in built:
        return
    peak = peak_setup(args.peak_n, args.peak_reps, args.compute_dtype)
    names = [*built, "matmul_peak"]
    t = time.perf_counter()
    peak()
    per_round = time.perf_counter() - t + sum(
        args.chunk * statistics.median(b["info"]["warmup_steps_s"] or [b["info"]["first_step_s"]])
        for b in built.values())
    left = budget.seconds - budget.spent()
    rounds = max(min(3, args.rounds), min(args.rounds, int(left // max(per_round, 1e-9))))
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            if n == "matmul_peak":
                peak()
            else:
                built[n]["state"] = run_steps(built[n]["compiled"], built[n]["state"],
                                              args.chunk)
            times[n].append((time.perf_counter() - t) / (1 if n == "matmul_peak" else args.chunk))
    peak_times = times.pop("matmul_peak")
    peak_flops = 2.0 * args.peak_n**3 * args.peak_reps / statistics.median(peak_times)
    median = {v: statistics.median(ts) for v, ts in times.items()}
    piece |= {"rounds": rounds, "step_times_s": times, "median_step_s": median,
              "step_ratio_to_vanilla": {v: median[v] / median["vanilla"] for v in median},
              "matmul_peak_call_s": peak_times, "matmul_peak_flops_per_s": peak_flops,
              "mfu": {v: flops / median[v] / peak_flops for v in median},
              "tokens_per_s": {v: args.batch * args.seq / median[v] for v in median}}
    if jax.default_backend() == "gpu":
        piece["mfu_vs_datasheet_bf16"] = {v: flops / median[v] / DATASHEET_BF16_FLOPS
                                          for v in median}
    mem = {v: piece["variants"][v]["train_memory"] for v in built}
    if all(m is not None for m in mem.values()):
        piece["train_memory_ratio_to_vanilla"] = {
            v: m["peak"] / mem["vanilla"]["peak"] for v, m in mem.items()}
    save()


def decode_piece(piece: dict, args, budget: Budget, costs: dict, skipped: list, save) -> None:
    """Fill ``piece`` (``{"depth", "variants"}``, in the record) with the decode figures."""
    depth = piece["depth"]
    ns = SimpleNamespace(width=args.width, depth=depth, context=args.seq, vocab=args.vocab,
                         dtype=args.compute_dtype, warmup=1, tokens=args.decode_tokens,
                         layer_loop="unroll")
    piece |= {"context": args.seq, "dtype": args.compute_dtype}
    runs = {}
    for v in (v for v in args.variants if v in lm_decode.DECODE_VARIANTS):
        # decoding compiles one token's step (no backward): guessed at half the train step's
        guess = 0.5 * guess_cost(costs, v, depth)
        if not budget.fits(guess):
            skipped.append({"piece": f"decode@{depth}", "variant": v, "reason": (
                f"{budget.spent():.1f} s spent + {guess:.1f} s guessed > {budget.seconds:g} s")})
            save()
            continue
        runs[v] = lm_decode.setup(v, ns)
        piece["variants"][v] = runs[v]["info"]
        save()
    if "vanilla" not in runs:
        return
    names = list(runs)
    times = {v: [] for v in names}
    for r in range(args.decode_rounds):
        for v in names[r % len(names):] + names[:r % len(names)]:
            run = runs[v]
            times[v].append(lm_decode.decode_round(run["step"], run["params"], run["model"],
                                                   args.decode_tokens))
    med = {v: statistics.median(ts) for v, ts in times.items()}
    piece |= {"latency_s_per_token": times, "median_latency_s_per_token": med,
              "latency_ratio_to_vanilla": {v: med[v] / med["vanilla"] for v in med},
              "latency_ratio_to_vanilla_paired": {
                  v: lm_decode.paired_ratio(times[v], times["vanilla"]) for v in med}}
    if "dca" in med and "2-dca" in med:
        piece["latency_2dca_over_dca"] = med["2-dca"] / med["dca"]
    save()


def verdicts(record: dict) -> list[dict]:
    """The issue's H200 targets against this run's figures: PASS, MISS, or not measured."""
    rows = []
    for key, piece in record["pieces"].items():
        if not key.startswith("train@"):
            continue
        ratios, mfu = piece.get("step_ratio_to_vanilla", {}), piece.get("mfu", {})
        for v, limit in TARGET_STEP_RATIO.items():
            if v in record["config"]["variants"]:
                value = ratios.get(v)
                rows.append({"target": f"{key} {v} step / vanilla <= {limit:.2f}", "value": value,
                             "verdict": "not measured" if value is None else
                             ("PASS" if value <= limit else "MISS")})
        value = mfu.get("vanilla")
        rows.append({"target": f"{key} vanilla MFU >= {TARGET_VANILLA_MFU:.0%}", "value": value,
                     "verdict": "not measured" if value is None else
                     ("PASS" if value >= TARGET_VANILLA_MFU else "MISS")})
    return rows


def print_summary(record: dict) -> None:
    cfg = record["config"]
    print(f"\n{record['device']}: width {cfg['width']}, seq {cfg['seq']}, batch {cfg['batch']}, "
          f"vocab {cfg['vocab']}, {cfg['compute_dtype']}; {record['elapsed_s']:.0f} s of "
          f"{cfg['budget_s']:g} s budget")
    print(f"{'piece':10s} {'variant':8s} {'compile s':>9s} {'1st step s':>10s} "
          f"{'step ms':>9s} {'ratio':>6s} {'MFU':>6s} {'train MiB':>10s} {'ratio':>6s}")
    for key, piece in record["pieces"].items():
        if not key.startswith("train@"):
            continue
        for v, info in piece["variants"].items():
            nan = float("nan")
            med = piece.get("median_step_s", {}).get(v, nan)
            mem = (info["train_memory"] or {}).get("peak", nan)
            print(f"{key:10s} {v:8s} {info['compile_s']:9.1f} {info['first_step_s']:10.2f} "
                  f"{1e3 * med:9.3f} {piece.get('step_ratio_to_vanilla', {}).get(v, nan):6.3f} "
                  f"{piece.get('mfu', {}).get(v, nan):6.1%} {mem / 2**20:10.1f} "
                  f"{piece.get('train_memory_ratio_to_vanilla', {}).get(v, nan):6.3f}")
        if "matmul_peak_flops_per_s" in piece:
            print(f"{key:10s} matmul peak {piece['matmul_peak_flops_per_s'] / 1e12:.4g} TFLOP/s "
                  f"({cfg['peak_n']}² {cfg['compute_dtype']}), {piece['rounds']} rounds")
    for key, piece in record["pieces"].items():
        if key.startswith("decode@"):
            for v, med in piece.get("median_latency_s_per_token", {}).items():
                print(f"{key:10s} {v:8s} compile {piece['variants'][v]['compile_s']:.1f} s, "
                      f"{1e3 * med:.3f} ms/token, "
                      f"x{piece['latency_ratio_to_vanilla'][v]:.3f} vanilla")
    for row in record["verdicts"]:
        value = "-" if row["value"] is None else f"{row['value']:.3f}"
        print(f"target (H200) {row['target']:40s} {value:>7s}  {row['verdict']}")
    for s in record["skipped"]:
        print(f"skipped {s['piece']} {s['variant']}: {s['reason']}")


def main(argv=None) -> dict:
    args = parse_args(argv)
    budget = Budget(args.budget_s)
    dev = jax.devices()[0]
    record = {"benchmark": "gpu_perf", "config": vars(args).copy(), "machine_before": machine(),
              "device": f"{dev.platform} {dev.device_kind}",
              "targets": {"step_ratio_to_vanilla_at_most": TARGET_STEP_RATIO,
                          "vanilla_mfu_at_least": TARGET_VANILLA_MFU, "device": "H200"},
              "pieces": {}, "skipped": [], "verdicts": []}

    def save():
        record["elapsed_s"] = budget.spent()
        record["verdicts"] = verdicts(record)
        save_partial(record, args.json)

    costs: dict = {}
    for depth in args.depths:
        piece = record["pieces"][f"train@{depth}"] = {"depth": depth, "variants": {}}
        train_piece(piece, args, budget, costs, record["skipped"], save)
    if not args.no_decode:
        depth = max(args.depths)
        piece = record["pieces"][f"decode@{depth}"] = {"depth": depth, "variants": {}}
        decode_piece(piece, args, budget, costs, record["skipped"], save)
    record["machine_after"] = machine()
    save()
    print_summary(record)
    return emit(record, args.json)


if __name__ == "__main__":
    main()
