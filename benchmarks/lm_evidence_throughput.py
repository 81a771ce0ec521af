"""Training and validation throughput of the evidence grid's runs (``experiments/lm_evidence``),
to size the grid: for each width and arm, the full preset's vmapped-seed run (6 seeds, 32 x 64
characters per seed and step, PTB-char) trains ``--steps`` steps; reported: the median all-seed
step time (compilation excluded), tokens/s over all seeds, the time of one whole-split
validation pass (timed on ``--eval-batches`` batches and scaled), and the estimated wall hours of
one full run (4000 steps plus 16 whole-split validations plus the final valid and test passes).

Command (about 5 minutes on the 2-core CPU)::

    PYTHONPATH=. python benchmarks/lm_evidence_throughput.py \
        --json benchmarks/results/lm_evidence_throughput.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import check_positive, emit, machine  # noqa: E402

from dca_theory.lab import lm_evidence as E  # noqa: E402
from dca_theory.lab.lm_runs import cached_corpus  # noqa: E402
from dca_theory.lab.seeds import train_lm_seeds  # noqa: E402
from dca_theory.lm.seed_loop import evaluate, make_eval_fn  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--arms", nargs="+", default=["vanilla", "dca"], choices=E.ARMS)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    check_positive("--steps", args.steps)
    check_positive("--eval-batches", args.eval_batches)
    settings = E.EvidenceSettings.preset(False)
    tc = settings.train
    corpus = cached_corpus(tc.data)
    n_valid_batches = -(-(len(corpus.valid) - 1) // (tc.seq_len * tc.batch_size))
    n_test_batches = -(-(len(corpus.test) - 1) // (tc.seq_len * tc.batch_size))
    n_evals = tc.steps // tc.eval_every - 1  # periodic ones; the last step's is the final one
    record = {"machine": machine(), "seeds": len(settings.seeds), "batch": tc.batch_size,
              "seq_len": tc.seq_len, "steps_timed": args.steps, "runs": {}}
    for w in args.widths:
        for arm in args.arms:
            s = E.arm_spec(settings, False, arm, w, tc.data, tc.lr)
            t = s.train.replace(steps=args.steps, eval_every=args.steps, progress=False)
            runs = train_lm_seeds(s.model, t, s.seeds, corpus=corpus, keep_params=True,
                                  final_batches=1)
            eval_fn = make_eval_fn(runs.static, t)
            kw = {"seq_len": tc.seq_len, "batch_size": tc.batch_size}
            evaluate(eval_fn, runs.params, corpus.valid, **kw, max_batches=1)  # compile
            start = time.perf_counter()
            evaluate(eval_fn, runs.params, corpus.valid, **kw, max_batches=args.eval_batches)
            eval_batch_s = (time.perf_counter() - start) / args.eval_batches
            step_s = runs.median_step_s
            tokens = len(s.seeds) * tc.batch_size * tc.seq_len
            run_s = (tc.steps * step_s + eval_batch_s * (n_evals * n_valid_batches
                                                         + n_valid_batches + n_test_batches))
            record["runs"][f"{arm}-w{w}"] = {
                "params": runs.n_params, "median_step_s": step_s,
                "tokens_per_s": tokens / step_s, "valid_pass_s": eval_batch_s * n_valid_batches,
                "full_run_h": run_s / 3600.0,
                "eval_share": 1.0 - tc.steps * step_s / run_s}
            print(f"{arm:16s} w{w:<3d} step {step_s:.3f}s  {tokens / step_s:8.0f} tok/s  "
                  f"valid pass {eval_batch_s * n_valid_batches:5.1f}s  run {run_s / 3600:.2f} h",
                  flush=True)
    record["loadavg_after"] = list(np.round(os.getloadavg(), 2))
    return emit(record, args.json)


if __name__ == "__main__":
    main()
