"""The GPU version of the second evidence design (``paper/05_lm/evidence_design_2.md``).

Per call, one width of 64, 128, 256, 512, 1024 (the paper's Table 2 range; ``--widths``),
depth 4, 4 heads, MLP 4x width; arms ``vanilla``, ``vanilla_matched`` (MLP widened to DCA's
non-embedding count), ``dca_<gate>`` for the gate H4 picked (``--gate``) and ``dca_paper`` if
that is another; 4 seeds (100-103) under ``jax.vmap``; 64 sequences of 256 bytes per seed and
step, 3052 steps = 50.0M training tokens per seed and width, on the CPython standard library by
byte (PTB-char would repeat 10 times), bfloat16 compute, float32 weights; the training loop of
``benchmarks/gpu_lm_evidence.py`` (warm-up over 5 % of the steps, then inverse square root).

**Rates: from the CPU sweeps' scaling rule**, not a sweep inside the call (none fits in 10
minutes): each arm's rate at width 64 is the CPU sweep's best for that arm
(``experiments/results/lm_evidence_2/summary.json -> rates -> ptb-char/<arm>/w64``, or
``--rate64 ARM=LR``), halved at each doubling of width; where the CPU grid swept width 128
(part E) the summary records the rule's rate beside the CPU sweep's.

**Budget** (``--plan`` prints it; PaLM's FLOP count, ``lm_bench_common.model_flops_per_step``,
4 seeds x 50M tokens; at 40 % of one H200's 790 TFLOP/s bf16 peak = 316 TFLOP/s):

=====  ==================  ===================  ==========================
width  FLOPs per arm       three arms           seconds at 316 TFLOP/s
=====  ==================  ===================  ==========================
64     4.1e14              1.2e15               4 (latency-bound in fact)
128    1.3e15              3.9e15               12
256    4.5e15              1.3e16               43
512    1.65e16             5.0e16               157
1024   6.3e16              1.9e17               601 (200 per arm)
=====  ==================  ===================  ==========================

So **width 1024 does not fit one 10-minute call** with three arms (601 s of training alone,
before compilation and evaluation; a fourth arm if H4 picks a gate other than ``paper`` makes
800 s): it takes one call per arm (``--arms vanilla``, ...), about 200 s each, and
``--combine`` joins the calls. Every other width fits one call with all its arms. The narrow
widths will not reach 40 %: their matmuls are small, so their time is set by latency, not FLOPs.

Summary (``--combine`` over the calls' JSON files, or per call): per width D = 100 (ln ppl_arm -
ln ppl_base) per seed against vanilla and against the matched vanilla, with t-intervals; H1
(the seed-clustered slope of D(dca_paper - vanilla) on log2(width)) and H2 (dca_paper against
the matched vanilla, Holm over the widths) with the CPU design's rules
(:mod:`dca_theory.lab.lm_evidence2_analysis`), reported as a separate result.

Command (device machine; the corpus travels in an ignored folder, e.g. ``.gpu_data``)::

    PYTHONPATH=. DCA_DATA_DIR=.gpu_data python benchmarks/gpu_lm_evidence_2.py --widths 64 \
        --gate paper --json $OUT/gpu_ev2_w64.json

``--dry-run`` shrinks everything to a seconds-long CPU run (the test runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_lm_evidence import (  # noqa: E402
    add_training_args,
    check_training_args,
    head_of,
    train_model,
)
from lm_bench_common import emit, machine, model_flops_per_step, save_partial  # noqa: E402

from dca_theory.lab import lm_evidence2_analysis as A2  # noqa: E402
from dca_theory.lab import lm_evidence_analysis as A  # noqa: E402
from dca_theory.lm.config import ModelConfig  # noqa: E402
from dca_theory.lm.params import matched_vanilla_d_mlp  # noqa: E402

GATES = ("paper", "open", "bias_inside")
CPU_SUMMARY = (Path(__file__).resolve().parents[1] / "experiments" / "results" / "lm_evidence_2"
               / "summary.json")
PEAK_FLOPS, UTILISATION, BYTE_VOCAB = 790e12, 0.40, 256
FIRST_SEED = 100


def arms_for(gate: str) -> tuple[str, ...]:
    """vanilla, the matched vanilla, DCA with H4's gate, and dca_paper if that is another."""
    return ("vanilla", "vanilla_matched", "dca_paper", *(() if gate == "paper"
                                                        else (f"dca_{gate}",)))


def model_for(arm: str, width: int, args, vocab: int) -> ModelConfig:
    dca = ModelConfig(vocab_size=vocab, max_len=args.seq, d_model=width, n_heads=args.heads,
                      d_mlp=4 * width, n_layers=args.depth, residual="dca", grn_gate="paper",
                      dropout=0.0, attn_dropout=0.0)
    if arm == "vanilla":
        return dca.replace(residual="vanilla")
    if arm == "vanilla_matched":
        return dca.replace(residual="vanilla", d_mlp=matched_vanilla_d_mlp(dca)[0])
    return dca.replace(grn_gate=arm.removeprefix("dca_"))


def rate(arm: str, width: int, rate64: dict[str, float]) -> float:
    """The scaling rule: the width-64 CPU rate halved at each doubling of width."""
    return rate64[arm] * 64 / width


def rates_at_64(args, arms) -> dict[str, float]:
    """``--rate64`` values, else the CPU summary's width-64 rates (``--dry-run``: 2e-3)."""
    out = {}
    for item in args.rate64 or []:
        arm, _, value = item.partition("=")
        if arm not in arms or not value:
            raise SystemExit(f"error: --rate64 expects ARM=LR with ARM one of {', '.join(arms)}, "
                             f"got {item!r}")
        out[arm] = float(value)
    summary = Path(args.rates_from)
    cpu = json.loads(summary.read_text()).get("rates", {}) if summary.is_file() else {}
    if cpu:
        for arm in arms:
            if arm not in out and f"ptb-char/{arm}/w64" in cpu:
                out[arm] = cpu[f"ptb-char/{arm}/w64"]["lr"]
    missing = [a for a in arms if a not in out]
    if missing and args.dry_run:
        out |= {a: 2e-3 for a in missing}
    elif missing:
        raise SystemExit(f"error: no width-64 rate for {', '.join(missing)}: give --rate64 "
                         f"ARM=LR or a CPU summary with them (--rates-from {summary})")
    return out


def rule_against_cpu_128(args, rate64: dict[str, float]) -> dict:
    """The scaling rule's rate at width 128 beside the CPU sweep's best there (part E), for
    the arms the CPU grid swept at 128."""
    summary = Path(args.rates_from)
    cpu = json.loads(summary.read_text()).get("rates", {}) if summary.is_file() else {}
    return {arm: {"rule": rate(arm, 128, rate64), "cpu_sweep": cpu[f"ptb-char/{arm}/w128"]["lr"]}
            for arm in rate64 if f"ptb-char/{arm}/w128" in cpu}


def plan(widths, arms, args, vocab: int = BYTE_VOCAB) -> dict:
    """FLOPs per (width, arm) for the whole call and seconds at ``UTILISATION`` of the peak."""
    steps = -(-args.tokens // (args.batch * args.seq))
    rows = {}
    for w in widths:
        for arm in arms:
            f = (model_flops_per_step(model_for(arm, w, args, vocab), args.batch) * steps
                 * args.seeds)
            rows[f"{arm}-w{w}"] = {"flops": f, "seconds": f / (PEAK_FLOPS * UTILISATION)}
    return {"rows": rows, "total_flops": sum(r["flops"] for r in rows.values()),
            "total_seconds": sum(r["seconds"] for r in rows.values()),
            "assumed_flops_per_s": PEAK_FLOPS * UTILISATION}


def summarise(runs: dict[tuple[str, int], dict]) -> dict:
    """Per width D against vanilla and the matched vanilla; H1 and H2 with the CPU rules."""
    records = {k: {"seeds": r["seeds"], "test_ppl": r["test_ppl"]} for k, r in runs.items()}
    widths = sorted({w for _, w in records})
    seeds = sorted({s for r in records.values() for s in r["seeds"]})
    out = {"widths": widths, "against_vanilla": {}, "against_matched": {}}
    for arm in sorted({a for a, _ in records} - {"vanilla"}):
        out["against_vanilla"][arm] = A.per_width_gaps(records, arm, "vanilla")
        if arm != "vanilla_matched":
            out["against_matched"][arm] = A2.h2(records, arm, widths)
    out["H1"] = A2.h1(records, widths, (), seeds, seeds) if len(widths) >= 2 else None
    return out


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--gate", default="paper", choices=GATES, help="the gate H4 picked")
    p.add_argument("--arms", nargs="+", default=None, help="a subset (width 1024: one per call)")
    p.add_argument("--rate64", nargs="+", default=None, help="ARM=LR at width 64")
    p.add_argument("--rates-from", default=str(CPU_SUMMARY))
    add_training_args(p, chunk=109, help_chunk=" (3052 = 28 x 109)")
    p.add_argument("--plan", action="store_true", help="print the FLOP budget and stop")
    p.add_argument("--combine", nargs="+", default=None, help="summarise these calls' JSONs")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes: test the script on CPU")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.dry_run:
        args.widths, args.seeds, args.tokens, args.batch, args.seq = [8], 2, 1024, 4, 16
        args.depth, args.heads = 1, 2
        args.chunk, args.valid_tokens, args.eval_batch, args.dtype = 8, 256, 8, "float32"
    check_training_args(args)
    valid = arms_for(args.gate)
    wrong = [a for a in args.arms or [] if a not in valid]
    if wrong:
        raise SystemExit(f"error: arm {wrong[0]!r} is not among {', '.join(valid)} "
                         f"(--gate {args.gate})")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    if args.combine:
        runs = {}
        for path in args.combine:
            for r in json.loads(Path(path).read_text())["runs"].values():
                runs[(r["arm"], r["width"])] = r
        return emit({"benchmark": "gpu_lm_evidence_2", "combined": args.combine,
                     "summary": summarise(runs)}, args.json)
    arms = tuple(args.arms or arms_for(args.gate))
    if args.plan:
        return emit({"benchmark": "gpu_lm_evidence_2", "plan": plan(args.widths, arms, args)},
                    args.json)
    rate64 = rates_at_64(args, arms)
    from dca_theory.lm import data as lm_data

    corpus = lm_data.load_corpus("python-stdlib")
    if args.dry_run:
        corpus = head_of(corpus, 2048)
    seeds = tuple(range(FIRST_SEED, FIRST_SEED + args.seeds))
    record = {"benchmark": "gpu_lm_evidence_2", "args": vars(args), "machine": machine(),
              "rate_rule": "CPU sweep's width-64 best, halved per doubling", "rate64": rate64,
              "rule_against_cpu_sweep_at_128": rule_against_cpu_128(args, rate64),
              "plan": plan(args.widths, arms, args, corpus.vocab_size), "runs": {},
              "skipped": []}
    start, runs, walls = time.perf_counter(), {}, {}  # walls: width -> its longest run
    for w in sorted(args.widths):
        for arm in arms:
            spent = time.perf_counter() - start
            # a run costs what the longest at its width did, or ~2.2x the narrower width's
            narrower = max((t for v, t in walls.items() if v < w), default=0.0)
            guess = walls.get(w, narrower * 2.2)
            if spent + guess > args.budget_s:
                record["skipped"].append(f"{arm}-w{w}")
                print(f"{arm} w{w}: skipped ({spent:.0f} s spent of {args.budget_s:.0f})",
                      flush=True)
                continue
            cfg = model_for(arm, w, args, corpus.vocab_size)
            gate = cfg.grn_gate if cfg.residual == "dca" else None
            r = {"arm": arm, "width": w, "gate": gate,
                 **train_model(cfg, rate(arm, w, rate64), args, corpus, seeds)}
            walls[w] = max(walls.get(w, 0.0), r["wall_s"])
            runs[(arm, w)] = r
            record["runs"][f"{arm}-w{w}"] = r
            record["summary"] = summarise(runs)
            print(f"{arm:16s} w{w:<5d} lr {r['lr']:.2e} test ppl "
                  f"{np.round(r['test_ppl'], 4).tolist()} {r['tokens_per_s']:,.0f} tok/s "
                  f"compile {r['compile_s']:.1f}s wall {r['wall_s']:.0f}s", flush=True)
            save_partial(record, args.json)
    record["total_s"] = time.perf_counter() - start
    return emit(record, args.json)


if __name__ == "__main__":
    main()
