"""Achieved FLOP/s of the ``rank_vs_width`` training sweep vs the machine's matmul FLOP/s.

Both are measured in the same process: first a float32 (n × n) @ (n × n) matmul, jitted and
repeated (the practical peak), then one padded, vmapped training program of the sweep (one
kind, one width bucket, as in ``experiments/rank_vs_width.py``), timed after compilation. The
sweep's FLOPs are counted analytically: per model and step, 2·B·d·r_pad for each of the two
matmuls of each block, ×3 for forward + backward, plus the teacher's forward pass; combiner and
optimizer work is ignored (so the achieved figure is a slight underestimate).

Usage: ``python benchmarks/toy_flops.py [--steps 200] [--dim 64 --widths 1 2 4 8 16 --pad 16]
[--json out.json]``; the d ≥ 256 point: ``--dim 256 --widths 64 128 256 --pad 256
--batch 1024``. Prints a table and the JSON record.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_bench_common import check_positive, emit  # noqa: E402

from dca_theory.nets import MLPResNet
from dca_theory.sim import BottleneckTeacher, ToyTrainConfig, fit_many


def matmul_flops(n: int = 1024, reps: int = 20) -> float:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    t = time.perf_counter()
    for _ in range(reps):
        out = f(a)
    out.block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - t)


def sweep_flops(steps: int, *, dim=64, depth=4, widths=(1, 2, 4, 8, 16), pad=16, seeds=2,
                batch=128, teacher_rank=16, kind="grn_v1") -> dict:
    keys = jax.random.split(jax.random.PRNGKey(1), len(widths) * seeds)
    wv = jnp.repeat(jnp.asarray(widths), seeds)
    models = eqx.filter_vmap(lambda k, w: MLPResNet(dim, w, depth, kind=kind, pad_to=pad,
                                                    key=k))(keys, wv)
    teacher = BottleneckTeacher(dim, teacher_rank, alpha=2.0, key=jax.random.PRNGKey(2))
    cfg = ToyTrainConfig(steps=steps, batch_size=batch, optimizer="adamw", learning_rate=3e-3,
                         weight_decay=1e-3)
    t0 = time.perf_counter()
    jax.block_until_ready(fit_many(models, teacher, keys, cfg))  # compile + run
    t1 = time.perf_counter()
    jax.block_until_ready(fit_many(models, teacher, keys, cfg))  # run only
    t2 = time.perf_counter()
    n_models = len(widths) * seeds
    m = teacher.H1.shape[0]
    per_step = n_models * batch * (3 * depth * 2 * 2 * dim * pad
                                   + 2 * (teacher_rank * dim + m * teacher_rank + dim * m))
    return {"models": n_models, "steps": steps, "compile_plus_run_s": t1 - t0,
            "run_s": t2 - t1, "flops": per_step * steps, "flops_per_s": per_step * steps /
            (t2 - t1)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dim", type=int, default=64, help="input/output dimension d")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                   help="bottleneck widths r of the sweep")
    p.add_argument("--pad", type=int, default=16, help="every width is padded to this bucket")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the record to this file")
    args = p.parse_args(argv)
    for name in ("steps", "dim", "pad", "batch", "seeds"):
        check_positive(name, getattr(args, name))
    bad = [w for w in args.widths if not 1 <= w <= min(args.pad, args.dim)]
    if bad:
        raise SystemExit(f"toy_flops: error: widths {bad} must lie in [1, min(--pad, --dim)] = "
                         f"[1, {min(args.pad, args.dim)}]")
    peak = matmul_flops()
    sweep = sweep_flops(args.steps, dim=args.dim, widths=tuple(args.widths), pad=args.pad,
                        seeds=args.seeds, batch=args.batch)
    record = {"backend": jax.default_backend(), "config": vars(args).copy(),
              "matmul_flops_per_s": peak, **sweep,
              "fraction_of_matmul": sweep["flops_per_s"] / peak,
              "loadavg_1_5_15": list(os.getloadavg())}
    print(f"{'quantity':32s} {'value':>14s}")
    print(f"{'matmul 1024^3 float32 [GFLOP/s]':32s} {peak / 1e9:14.2f}")
    print(f"{'sweep program [GFLOP/s]':32s} {sweep['flops_per_s'] / 1e9:14.2f}")
    print(f"{'fraction of matmul':32s} {record['fraction_of_matmul']:14.3f}")
    print(f"{'models x steps':32s} {sweep['models']:>8d} x {sweep['steps']:<5d}")
    print(f"{'run time [s] (compile+run [s])':32s} {sweep['run_s']:8.2f} "
          f"({sweep['compile_plus_run_s']:.1f})")
    return emit(record, args.json)


if __name__ == "__main__":
    main()
