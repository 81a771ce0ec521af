"""Where a train step's time goes: XLA kernel time per kind, vanilla against DCA variants.

Traces a few forward + backward passes (``jax.grad`` of the loss, no optimizer) of each variant
with ``jax.profiler`` and sums the duration of the executed XLA kernels by name, with the
numeric suffix stripped (``multiply_add_fusion.12`` → ``multiply_add_fusion``; ``ynn_fusion``
are YNNPACK matmul / reduction kernels, ``dot`` XLA's own dot kernels). Prints, per kernel
kind, milliseconds per pass and calls per pass for every variant, largest DCA excess first,
and the JSON record. Beside the kernel sums: each variant's wall time per pass (median of
``--passes`` untraced passes) and ``kernel_overlap``, the kernels' summed time over the wall
time. Above 1, kernels ran side by side on the cores (XLA:CPU runs independent kernels
concurrently); a program whose kernels form one chain (a loop body) stays near 1, so its wall
time can grow more than its kernel time.

Usage: ``python benchmarks/lm_profile.py --depth 12 [--variants vanilla dca 2-dca]
[--json out.json]``. Runtime: about a minute at depth 12 on 2 cores (mostly compilation).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import (  # noqa: E402
    DEFAULT_VARIANTS,
    VARIANTS,
    check_positive,
    emit,
    machine,
    model_config,
    synthetic_batch,
)

from dca_theory.lm.model import build_model  # noqa: E402
from dca_theory.lm.steps import weighted_nll  # noqa: E402

# XLA kernels are named like their HLO instructions (``ynn_fusion.3``, ``dot``,
# ``wrapped_broadcast.1``); the profiler's host-side spans have capitals, spaces or ``::``
# (``CommonPjRtLoadedExecutable::ExecuteHelperOnSingleDevice`` spans a whole call), and each
# kernel's ``end: …`` marker a colon.
KERNEL_NAME = re.compile(r"[a-z][a-z0-9_.\-]*")


def kernel_times(variant: str, *, width: int, depth: int, batch: int, passes: int
                 ) -> tuple[dict, float]:
    """``{kernel kind: (ms per pass, calls per pass)}`` for one variant, and the median wall
    milliseconds of an untraced pass."""
    cfg = model_config(variant, width=width, depth=depth, seq=128, vocab=8192)
    params, static = eqx.partition(build_model(cfg, key=jax.random.PRNGKey(0)),
                                   eqx.is_inexact_array)
    data = synthetic_batch(batch, cfg.max_len, cfg.vocab_size)
    grad = jax.jit(jax.grad(lambda p: weighted_nll(p, static, data, None, jnp.float32)[0]))
    jax.block_until_ready(grad(params))
    jax.block_until_ready(grad(params))
    walls = []
    for _ in range(passes):
        t0 = time.perf_counter()
        jax.block_until_ready(grad(params))
        walls.append(1e3 * (time.perf_counter() - t0))
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        for _ in range(passes):
            jax.block_until_ready(grad(params))
        jax.profiler.stop_trace()
        trace_file = sorted(Path(tmp).rglob("*.trace.json.gz"))[-1]
        events = json.loads(gzip.decompress(trace_file.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    total, calls = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") != "X" or "dur" not in e or not KERNEL_NAME.fullmatch(e["name"]):
            continue
        kind = re.sub(r"\.\d+$", "", e["name"])
        total[kind] += e["dur"] / 1e3 / passes
        calls[kind] += 1 / passes
    return {k: (total[k], calls[k]) for k in total}, float(statistics.median(walls))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS),
                   choices=list(VARIANTS))
    p.add_argument("--top", type=int, default=15, help="kernel kinds to print")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    for name in ("depth", "width", "batch", "passes", "top"):
        check_positive(name, getattr(args, name))
    if "vanilla" not in args.variants:
        raise SystemExit("error: --variants must include vanilla (the reference), got "
                         f"{' '.join(args.variants)}")
    timed = {v: kernel_times(v, width=args.width, depth=args.depth, batch=args.batch,
                             passes=args.passes) for v in args.variants}
    per = {v: k for v, (k, _) in timed.items()}
    wall = {v: w for v, (_, w) in timed.items()}
    kinds = set().union(*per.values())
    worst = max(args.variants, key=lambda v: sum(t for t, _ in per[v].values()))

    def excess(k):
        return per[worst].get(k, (0, 0))[0] - per["vanilla"].get(k, (0, 0))[0]

    print(f"depth {args.depth}, width {args.width}, batch {args.batch}: ms (calls) per forward + "
          f"backward pass, sorted by {worst}'s excess over vanilla")
    print(f"{'kernel kind':28s}" + "".join(f"{v:>20s}" for v in args.variants))
    for k in sorted(kinds, key=excess, reverse=True)[:args.top]:
        print(f"{k[:28]:28s}" + "".join(
            f"{per[v].get(k, (0, 0))[0]:11.1f} ({per[v].get(k, (0, 0))[1]:5.0f})"
            for v in args.variants))
    sums = {v: sum(t for t, _ in per[v].values()) for v in args.variants}
    overlap = {v: sums[v] / wall[v] for v in args.variants}
    for label, row in (("all kernels", sums), ("wall time", wall)):
        print(f"{label:28s}" + "".join(f"{row[v]:11.1f} {'':7s}" for v in args.variants))
    print(f"{'kernel time / wall time':28s}" + "".join(f"{overlap[v]:11.2f} {'':7s}"
                                                       for v in args.variants))
    record = {"benchmark": "lm_profile", "config": vars(args).copy(), "machine": machine(),
              "kernel_ms_calls_per_pass": per, "total_kernel_ms_per_pass": sums,
              "wall_ms_per_pass": wall, "kernel_overlap": overlap}
    return emit(record, args.json)


if __name__ == "__main__":
    main()
