"""Compile time of the LM train step by depth: the unrolled trunk vs ``layer_loop="scan"``.

Claim (the targets it prints): with the blocks in a ``lax.scan`` (the scanned trunk,
:mod:`dca_theory.lm.scanned`, its parameters stacked over layers), compile + first step at
depth 24, width 256 on the CPU takes DCA and 2-DCA at most 1.5× vanilla's time and at most 30 s,
and depth 48 at most 1.3× depth 12, while the unrolled trunk (``layer_loop="unroll"``, the
default) compiles one copy of the block per layer. Expected: the compilation alone is flat in
depth with the scan (its program has the same size at every depth,
``tests/lm/test_layer_loop.py``); compile + first step is not, for
full DCA, whose first step (a whole training step) grows with depth².

For each depth, variant (vanilla, full DCA, 2-DCA; width, heads = width/64, MLP 4×width,
sequence 128, batch 4, vocabulary 8192, dropout 0, float32) and layer loop, the project's train
step (``dca_theory.lm.steps.make_train_step``: forward, backward, AdamW) is built and timed as
``jax.jit(step).lower(*args).compile()`` plus its first call; the loops alternate (their order
flips from one variant to the next) so that a change of machine load hits both alike. At the
step depth (24) the compiled steps are kept and timed warm afterwards, alternated in a rotating
order for ``--steps`` rounds (medians), and XLA's temporary bytes of each compiled step are
recorded (``memory_analysis()``, deterministic). Ratios: variant / vanilla, scan / unroll and
depth 48 (the largest) / depth 12 (the smallest), of compile + first step and (``compile_only``)
of the compilation alone.

Usage::

    python benchmarks/lm_compile.py --depths 12 24 48 --width 256 --layer-loop scan \
        --json benchmarks/results/lm_compile_w256_scan.json     # about 4 minutes
    python benchmarks/lm_compile.py --depths 12 24 48 --layer-loop scan --variants vanilla grn_v3
    python benchmarks/lm_compile.py --quick          # tiny sizes, seconds (the test's dry run)

Prints a table and the JSON record (``os.getloadavg()`` before and after). Runtime on the 2-core
CPU: about 15 minutes with both loops at depths 12 and 24 (the unrolled depth-24 DCA alone
compiles for minutes); 4 minutes for the scan alone at depths 12, 24 and 48.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import (  # noqa: E402
    RIVAL_VARIANTS,
    apply_preset,
    check_positive,
    emit,
    machine,
    model_config,
    save_partial,
    train_config,
)

from dca_theory.lab.steptime import train_step_setup  # noqa: E402
from dca_theory.lm.config import LAYER_LOOPS  # noqa: E402

COMPILE_VARIANTS = ("vanilla", "dca", "2-dca")
#: --variants may also name the GRN kinds' representative (one GRN-v3 per block) and the rivals
EXTRA_VARIANTS = ("grn_v3", *RIVAL_VARIANTS)
TARGETS = {"variant_over_vanilla_depth24": 1.5, "total_s_depth24": 30.0,
           "deepest_over_shallowest": 1.3}
QUICK = {"depths": [1, 2], "width": 64, "seq": 8, "batch": 1, "vocab": 64, "steps": 2,
         "step_depth": 2}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[12, 24, 48])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192, help="the project's BPE vocabulary size")
    p.add_argument("--variants", nargs="+", default=list(COMPILE_VARIANTS),
                   choices=[*COMPILE_VARIANTS, *EXTRA_VARIANTS])
    p.add_argument("--layer-loop", nargs="+", default=list(LAYER_LOOPS), choices=LAYER_LOOPS,
                   dest="layer_loops")
    p.add_argument("--steps", type=int, default=5, help="warm steps timed at --step-depth")
    p.add_argument("--step-depth", type=int, default=24,
                   help="depth whose warm step time is measured (skipped if not in --depths)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a dry run in seconds")
    p.add_argument("--json", default=None, help="also write the record to this file")
    args = p.parse_args(argv)
    apply_preset(args, args.quick, QUICK)
    for name in ("width", "seq", "batch", "vocab", "steps", "step_depth"):
        check_positive(name.replace("_", "-"), getattr(args, name))
    for d in args.depths:
        check_positive("depths", d)
    if args.width % 64:
        raise SystemExit(f"error: --width must be a multiple of 64 (head width), got {args.width}")
    return args


def compile_and_first_step(variant: str, loop: str, depth: int, args) -> tuple[dict, tuple]:
    """Seconds to lower and compile the jitted train step and to run its first call, the
    compiled step's temporary bytes, and ``(compiled, args)`` for warm timing."""
    cfg = model_config(variant, width=args.width, depth=depth, seq=args.seq,
                       vocab=args.vocab).replace(layer_loop=loop)
    fn, step_args = train_step_setup(cfg, train_config(cfg, args.batch))
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*step_args).compile()
    t1 = time.perf_counter()
    params, opt_state, metrics = compiled(*step_args)
    jax.block_until_ready((params, metrics))
    t2 = time.perf_counter()
    record = {"compile_s": t1 - t0, "first_step_s": t2 - t1, "total_s": t2 - t0,
              "temp_bytes": compiled.memory_analysis().temp_size_in_bytes}
    return record, (compiled, (params, opt_state, *step_args[2:]))


def warm_step_times(steps: dict[str, tuple], rounds: int) -> dict[str, list[float]]:
    """Wall time of one warm step of every compiled step per round, in a rotating order."""
    names, times = list(steps), {n: [] for n in steps}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            compiled, step_args = steps[name]
            t0 = time.perf_counter()
            params, opt_state, metrics = compiled(*step_args)
            jax.block_until_ready((params, metrics))
            times[name].append(time.perf_counter() - t0)
            steps[name] = (compiled, (params, opt_state, *step_args[2:]))
    return times


def ratios(record: dict, args) -> dict:
    """variant / vanilla per depth and loop; scan / unroll; deepest / shallowest depth: of
    compile + first step (the issue's measure), and of the compilation alone (``compile_only``:
    the first step's run time grows with depth as any step's does)."""
    out = _ratios(record["total_s"], args)
    compile_s = {d: {n: r["compile_s"] for n, r in by_name.items()}
                 for d, by_name in record["compile"].items()}
    out["compile_only"] = _ratios(compile_s, args)
    return out


def _ratios(total: dict, args) -> dict:
    out = {"variant_over_vanilla": {}, "scan_over_unroll": {}, "deepest_over_shallowest": {}}
    lo, hi = min(args.depths), max(args.depths)
    for loop in args.layer_loops:
        for v in args.variants:
            name = f"{v}/{loop}"
            if "vanilla" in args.variants:
                out["variant_over_vanilla"][name] = {
                    str(d): total[str(d)][name] / total[str(d)][f"vanilla/{loop}"]
                    for d in args.depths}
            if hi > lo:
                out["deepest_over_shallowest"][name] = total[str(hi)][name] / total[str(lo)][name]
    if set(LAYER_LOOPS) <= set(args.layer_loops):
        out["scan_over_unroll"] = {v: {str(d): total[str(d)][f"{v}/scan"]
                                       / total[str(d)][f"{v}/unroll"] for d in args.depths}
                                   for v in args.variants}
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    record = {"benchmark": "lm_compile", "config": vars(args).copy(),
              "machine_before": machine(), "targets": TARGETS,
              "total_s": {}, "compile": {}, "step_depth": None}
    kept = {}
    for depth in args.depths:
        record["compile"][str(depth)], record["total_s"][str(depth)] = {}, {}
        for i, variant in enumerate(args.variants):
            loops = args.layer_loops if i % 2 == 0 else args.layer_loops[::-1]
            for loop in loops:
                name = f"{variant}/{loop}"
                res, state = compile_and_first_step(variant, loop, depth, args)
                print(f"  depth {depth:3d} {name:14s} compile {res['compile_s']:7.1f} s, first "
                      f"step {res['first_step_s']:6.2f} s, temp {res['temp_bytes'] / 2**20:7.1f}"
                      f" MiB", flush=True)
                record["compile"][str(depth)][name] = res
                record["total_s"][str(depth)][name] = res["total_s"]
                if depth == args.step_depth:
                    kept[name] = state
                save_partial(record, args.json)
    if kept:
        times = warm_step_times(kept, args.steps)
        med = {n: statistics.median(ts) for n, ts in times.items()}
        record["step_depth"] = {"depth": args.step_depth, "times_s": times, "median_s": med}
        if set(LAYER_LOOPS) <= set(args.layer_loops):
            record["step_depth"]["scan_over_unroll"] = {
                v: med[f"{v}/scan"] / med[f"{v}/unroll"] for v in args.variants}
        if "vanilla" in args.variants:
            record["step_depth"]["variant_over_vanilla"] = {
                n: med[n] / med[f"vanilla/{n.split('/')[1]}"] for n in med}
    record["ratios"] = ratios(record, args)
    record["machine_after"] = machine()
    _print_table(record, args)
    return emit(record, args.json)


def _print_table(record: dict, args) -> None:
    print(f"\nwidth {args.width}, seq {args.seq}, batch {args.batch}, vocab {args.vocab}; load "
          f"{record['machine_before']['loadavg_1_5_15'][0]:.1f} -> "
          f"{record['machine_after']['loadavg_1_5_15'][0]:.1f}")
    print(f"{'depth':>5s} {'variant/loop':16s} {'compile+1st [s]':>15s} {'/ vanilla':>9s} "
          f"{'scan/unroll':>11s} {'temp [MiB]':>10s}")
    r = record["ratios"]
    for depth in args.depths:
        for name, res in record["compile"][str(depth)].items():
            v = name.split("/")[0]
            over_v = r["variant_over_vanilla"].get(name, {}).get(str(depth), float("nan"))
            s_u = r["scan_over_unroll"].get(v, {}).get(str(depth), float("nan"))
            print(f"{depth:5d} {name:16s} {res['total_s']:15.1f} {over_v:9.2f} {s_u:11.2f} "
                  f"{res['temp_bytes'] / 2**20:10.1f}")
    for name, ratio in r["deepest_over_shallowest"].items():
        alone = r["compile_only"]["deepest_over_shallowest"][name]
        print(f"depth {max(args.depths)} / depth {min(args.depths)}, {name}: {ratio:.2f} "
              f"(compilation alone: {alone:.2f})")
    step = record["step_depth"]
    if step:
        for name, med in step["median_s"].items():
            print(f"warm step, depth {step['depth']}, {name}: {med:.4f} s "
                  f"({step.get('variant_over_vanilla', {}).get(name, float('nan')):.3f}× vanilla)")
        for v, ratio in step.get("scan_over_unroll", {}).items():
            print(f"warm step scan / unroll, {v}: {ratio:.3f}")


if __name__ == "__main__":
    main()
