"""Train-step time of the LM: vanilla vs full DCA, 2-DCA and the rivals, as ratios to vanilla.

For each depth, the variants (by default vanilla, DCA, 2-DCA and the rivals Attention
Residuals, mHC, MUDDFormer and value residuals; same width, heads = width/64, MLP 4×width,
sequence 128, synthetic tokens) are built, their train steps
(``dca_theory.lm.steps.make_train_step``: forward, backward, AdamW) are jitted and warmed up, and
then timed *alternately* in the same process: each repeat times one step of every variant, in
a rotating order, so that a change of machine load hits all variants alike. The figure is the
median over repeats; the ratio is median(variant) / median(vanilla). Paper (Table 1, 24 layers,
TPU): 2-DCA/vanilla = 8.14/5.39 = 1.51, full DCA/vanilla = 8.14/3.72 = 2.19. Targets:
≤ 1.07 and ≤ 1.20 at depth 24, at widths 256 and 512.

Usage::

    python benchmarks/lm_step_time.py --depths 6 24 --width 256 --repeats 7 \
        --json benchmarks/results/lm_step_time_w256.json

Prints a table and the JSON record (``os.getloadavg()`` included). Runtime on a 2-core CPU:
a few minutes at width 256 (mostly compilation).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import (  # noqa: E402
    DEFAULT_VARIANTS,
    PAPER_STEP_TIME_RATIO,
    RIVAL_VARIANTS,
    VARIANTS,
    check_positive,
    emit,
    machine,
    model_config,
    save_partial,
    train_config,
)

from dca_theory.lab.steptime import alternated_step_times  # noqa: E402
from dca_theory.lm.params import param_count  # noqa: E402


def time_depth(depth: int, args) -> dict:
    configs = {}
    for variant in args.variants:
        cfg = model_config(variant, width=args.width, depth=depth, seq=args.seq,
                           vocab=args.vocab, dropout=args.dropout)
        configs[variant] = (cfg, train_config(cfg, args.batch, args.compute_dtype))
    timed = alternated_step_times(
        configs, repeats=args.repeats, warmup=args.warmup,
        log=lambda v, s: print(f"  depth {depth} {v:8s} compiled + {args.warmup} warm-up steps "
                               f"in {s:.1f} s", flush=True))
    times = {v: r["times_s"] for v, r in timed.items()}
    med = {v: statistics.median(ts) for v, ts in times.items()}
    out = {"depth": depth, "times_s": times, "median_s": med}
    if "vanilla" in med:
        out["ratio_to_vanilla"] = {v: med[v] / med["vanilla"] for v in med}
    out["params"] = {v: param_count(model_config(v, width=args.width, depth=depth, seq=args.seq,
                                                vocab=args.vocab)) for v in args.variants}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[6, 24])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192, help="the project's BPE vocabulary size")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--variants", nargs="+", default=[*DEFAULT_VARIANTS, *RIVAL_VARIANTS],
                   choices=list(VARIANTS))
    p.add_argument("--json", default=None, help="also write the record to this file")
    args = p.parse_args(argv)
    for name in ("width", "seq", "batch", "vocab", "repeats", "warmup"):
        check_positive(name, getattr(args, name))
    for d in args.depths:
        check_positive("depths", d)
    if args.width % 64:
        raise SystemExit(f"error: --width must be a multiple of 64 (head width), got {args.width}")
    record = {"benchmark": "lm_step_time", "config": vars(args).copy(),
              "machine_before": machine(), "paper_ratio_depth24": PAPER_STEP_TIME_RATIO,
              "targets_depth24": {"2-dca": 1.07, "dca": 1.20}, "results": []}
    for depth in args.depths:
        record["results"].append(time_depth(depth, args))
        save_partial(record, args.json)
    record["machine_after"] = machine()

    print(f"\nwidth {args.width}, seq {args.seq}, batch {args.batch}, vocab {args.vocab}, "
          f"{args.repeats} repeats, load {record['machine_before']['loadavg_1_5_15'][0]:.1f}"
          f" -> {record['machine_after']['loadavg_1_5_15'][0]:.1f}")
    print(f"{'depth':>5s} {'variant':14s} {'params':>10s} {'median step [s]':>16s} "
          f"{'ratio':>7s} {'paper (d24)':>11s} {'target':>7s}")
    for res in record["results"]:
        for v in args.variants:
            ratio = res.get("ratio_to_vanilla", {}).get(v, float("nan"))
            target = record["targets_depth24"].get(v)
            print(f"{res['depth']:5d} {v:14s} {res['params'][v]:10d} {res['median_s'][v]:16.4f} "
                  f"{ratio:7.3f} {PAPER_STEP_TIME_RATIO.get(v, float('nan')):11.2f} "
                  f"{'' if target is None else f'<={target:.2f}':>7s}")
    return emit(record, args.json)


if __name__ == "__main__":
    main()
