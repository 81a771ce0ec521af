r"""Rank against width: vanilla ResNet vs GRN-v1/v2/v3 MLP-ResNets on bottleneck teachers.

Claim (paper §4.3–4.4, ``dca-paper.md`` §1.7, §1.9): the GRN gain over the ResNet is largest
when the collective rank r_* = T·r is small compared with d and shrinks as the width r grows;
the learned function's bottleneck (Jacobian) rank grows with width until the target's rank.

Setup: d = 64, T = 4 blocks ``V_t gelu(U_t z)`` of width r ∈ {1, 2, 4, 8, 16, 32, 64};
teachers ``y = α x + h(G x)`` of bottleneck rank k (default k ∈ {2, 16} with α = 2, whose
residual y − x = x + h(Gx) is full rank for a ResNet but rank k for a GRN, plus k = 8 with
α = 1 as a ResNet-friendly control). AdamW (lr 3e-3, weight decay 1e-3 on the layer weights
only, so that unused directions die out and the rank is measurable), fresh N(0, I) batches.
Measured per run: test MSE (4096 fresh inputs) and the Jacobian rank (rtol 1e-2 of σ_max) and
effective rank over 16 inputs of the learned function minus (i) its own input-slot term
(Prop. 4.5's residual part), (ii) the identity, (iii) the teacher's α x; per layer, the rank of
V_t U_t.

Speed: widths are padded into buckets (default {1..16} -> 16, {32, 64} -> 64) so that one compiled
program trains every (width, teacher, seed) of a bucket under ``jax.vmap``.

Command: ``dca-theory run rank_vs_width [--quick] [--set KEY=VALUE ...]`` (``--show`` lists the
settings, e.g. ``--set dim=128 --set widths=1,2,4,8 --set kinds=res,grn_v1
--set teachers=2:2.0,8:1.0``; teachers are ``rank:alpha`` pairs).
Runtime: full ~10–20 min on 2 idle CPU cores (8 compiled programs); quick < 1 minute.
Expected result: test error falls with width for every kind; for α = 2 the GRNs beat the
ResNet at small width by a margin that shrinks as width grows; the GRN's residual rank
saturates near k while the ResNet's (vs identity) keeps growing toward d.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from dca_theory import gates
from dca_theory import random_draws as draws
from dca_theory.io import RunDir, read_json, to_jsonable, write_json
from dca_theory.nets import MLPResNet
from dca_theory.overrides import apply_overrides, check_at_least_one, record, run_dir, summary_entry
from dca_theory.residual import check_kind
from dca_theory.sim import (
    BottleneckTeacher,
    ToyTrainConfig,
    effective_rank,
    fit_many,
    numerical_rank,
)

NAME = "rank_vs_width"


@dataclasses.dataclass(frozen=True)
class RankWidthConfig:
    dim: int = 64
    depth: int = 4
    widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    buckets: tuple[int, ...] = (16, 64)  # pad each width to the first bucket >= it
    kinds: tuple[str, ...] = ("res", "grn_v1", "grn_v2", "grn_v3")
    teachers: tuple[tuple[int, float], ...] = ((2, 2.0), (16, 2.0), (8, 1.0))
    seeds: int = 2
    steps: int = 1500
    batch_size: int = 128
    learning_rate: float = 3e-3
    weight_decay: float = 1e-3
    rank_rtol: float = 1e-2
    jacobian_inputs: int = 16
    test_inputs: int = 4096
    log_every: int = 50
    seed: int = 0
    # GRN-v3's gate: the printed form, as in the committed results (experiments/toy_gates.py
    # compares the gates of dca_theory.gates)
    gate: str = "paper"

    def __post_init__(self):
        _check(self)


def _bucket_of(width: int, buckets) -> int:
    for b in buckets:
        if width <= b:
            return b
    raise ValueError(f"width {width} exceeds the largest bucket {max(buckets)}")


def _check(cfg: RankWidthConfig) -> None:
    for name in ("widths", "buckets", "kinds", "teachers"):
        if not getattr(cfg, name):
            raise ValueError(f"{name} must not be empty")
    check_at_least_one(cfg, "dim", "depth", "seeds", "steps", "batch_size", "jacobian_inputs",
                       "test_inputs", "log_every")
    bad = [w for w in cfg.widths if not 1 <= w <= cfg.dim]
    if bad:
        raise ValueError(f"width {bad[0]} out of range: need 1 <= width <= d={cfg.dim}")
    if max(cfg.buckets) > cfg.dim:
        raise ValueError(f"bucket {max(cfg.buckets)} exceeds d={cfg.dim}")
    _bucket_of(max(cfg.widths), cfg.buckets)
    for kind in cfg.kinds:
        check_kind(kind)
    object.__setattr__(cfg, "gate", gates.canonical(cfg.gate))
    bad_rank = [k for k, _ in cfg.teachers if not 1 <= k <= cfg.dim]
    if bad_rank:
        raise ValueError(f"teacher rank {bad_rank[0]} out of range: need 1 <= k <= d={cfg.dim}")


QUICK = RankWidthConfig(dim=16, depth=2, widths=(1, 4, 16), buckets=(16,),
                        kinds=("res", "grn_v1"), teachers=((2, 2.0),), seeds=1, steps=80,
                        jacobian_inputs=4, test_inputs=512)


def settings(quick: bool = False, overrides=()) -> RankWidthConfig:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return apply_overrides(QUICK if quick else RankWidthConfig(), overrides)


def _teachers(cfg: RankWidthConfig):
    k_max = max(k for k, _ in cfg.teachers)
    return [
        BottleneckTeacher(cfg.dim, k, alpha=a, pad_rank=k_max,
                          key=jax.random.PRNGKey(cfg.seed + 100 + i))
        for i, (k, a) in enumerate(cfg.teachers)
    ]


def _stack(trees):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


@eqx.filter_jit
def _measure(models, teachers, xs, x_test):
    """Per model: test MSE and the Jacobians needed for the rank estimates."""

    def one(m, t):
        mse = jnp.mean((jax.vmap(m)(x_test) - jax.vmap(t)(x_test)) ** 2)
        jac = jax.vmap(jax.jacfwd(m))(xs)
        jac_skip = jax.vmap(jax.jacfwd(m.skip))(xs)
        layers = jnp.einsum("tdr,trs->tds", m.V, m.U)
        return mse, jac, jac_skip, layers, t.alpha

    return eqx.filter_vmap(one)(models, teachers)


def run_bucket(kind: str, bucket: int, widths, cfg, teachers, pbar=None) -> list[dict]:
    combos = [(w, ti, s) for w in widths for ti in range(len(teachers))
              for s in range(cfg.seeds)]
    keys = jnp.stack([jax.random.PRNGKey(cfg.seed * 7919 + 1000 * w + 10 * ti + s)
                      for w, ti, s in combos])
    wv = jnp.asarray([w for w, _, _ in combos])
    models = draws.build_each(lambda k, w: MLPResNet(
        cfg.dim, w, cfg.depth, kind=kind, gate=cfg.gate, pad_to=bucket, key=k), keys, wv)
    tstack = _stack([teachers[ti] for _, ti, _ in combos])
    tcfg = ToyTrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, optimizer="adamw",
                          learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay)
    trained, losses = fit_many(models, tstack, keys, tcfg, target_batched=True)
    kx, kt = jax.random.split(jax.random.PRNGKey(cfg.seed + 5))
    # float32 like the models, also when a caller has enabled x64
    xs = draws.normal(kx, (cfg.jacobian_inputs, cfg.dim), jnp.float32)
    x_test = draws.normal(kt, (cfg.test_inputs, cfg.dim), jnp.float32)
    mse, jac, jac_skip, layers, alpha = jax.device_get(_measure(trained, tstack, xs, x_test))
    eye = np.eye(cfg.dim, dtype=jac.dtype)
    rows = []
    for i, (w, ti, s) in enumerate(combos):
        parts = {"own_skip": jac[i] - jac_skip[i], "identity": jac[i] - eye,
                 "teacher_skip": jac[i] - alpha[i] * eye}
        row = {"kind": kind, "width": w, "r_star": w * cfg.depth,
               "teacher_rank": cfg.teachers[ti][0], "teacher_alpha": cfg.teachers[ti][1],
               "seed": s, "test_mse": float(mse[i]),
               "train_loss_final": float(np.mean(np.asarray(losses[i, -20:]))),
               "loss_curve": np.asarray(losses[i, :: cfg.log_every]).tolist()}
        for name, J in parts.items():
            row[f"jac_rank_{name}"] = int(numerical_rank(J, rtol=cfg.rank_rtol).max())
            row[f"eff_rank_{name}"] = float(effective_rank(J).mean())
            row[f"spectrum_{name}"] = np.linalg.svd(J, compute_uv=False).mean(0).tolist()
        row["layer_ranks"] = numerical_rank(layers[i], rtol=cfg.rank_rtol).tolist()
        rows.append(row)
    if pbar is not None:
        pbar.update(len(combos))
    return rows


def _aggregate(rows, cfg) -> dict:
    out = {}
    for k, a in cfg.teachers:
        for kind in cfg.kinds:
            for w in cfg.widths:
                sel = [r for r in rows if r["kind"] == kind and r["width"] == w
                       and r["teacher_rank"] == k and r["teacher_alpha"] == a]
                if not sel:
                    continue
                key = f"k={k},alpha={a}/{kind}/r={w}"
                out[key] = {
                    "test_mse_mean": float(np.mean([r["test_mse"] for r in sel])),
                    "test_mse_per_seed": [r["test_mse"] for r in sel],
                    **{f"{m}_mean": float(np.mean([r[m] for r in sel])) for m in (
                        "jac_rank_own_skip", "jac_rank_identity", "jac_rank_teacher_skip",
                        "eff_rank_own_skip", "eff_rank_identity")},
                    "layer_ranks_mean": np.mean([r["layer_ranks"] for r in sel], 0).tolist(),
                }
    gains = {}
    for k, a in cfg.teachers:
        for kind in cfg.kinds:
            if kind == "res":
                continue
            for w in cfg.widths:
                base = out.get(f"k={k},alpha={a}/res/r={w}")
                grn = out.get(f"k={k},alpha={a}/{kind}/r={w}")
                if base and grn:
                    gains[f"k={k},alpha={a}/{kind}/r={w}"] = {
                        "abs": base["test_mse_mean"] - grn["test_mse_mean"],
                        "rel": 1 - grn["test_mse_mean"] / base["test_mse_mean"]}
    return {"cells": out, "gain_over_res": gains}


def _groups(cfg) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for w in cfg.widths:
        groups.setdefault(_bucket_of(w, cfg.buckets), []).append(w)
    return groups


def _cached_bucket(path: Path, kind, bucket, widths, cfg, teachers, pbar=None) -> list[dict]:
    """Run one (kind, bucket) program or load its rows from a previous (interrupted) run."""
    cache = path / f"job_{kind}__{bucket}.json"
    if cache.exists() and read_json(cache)["config"] == to_jsonable(cfg):
        rows = read_json(cache)["rows"]
        if pbar is not None:
            pbar.update(len(rows))
        return rows
    rows = run_bucket(kind, bucket, widths, cfg, teachers, pbar)
    write_json(cache, {"config": cfg, "rows": rows})
    return rows


def work(out=None, quick: bool = False, overrides=()) -> None:
    """Worker: run every (kind, bucket) job not yet cached or claimed (``.lock``) in the run
    directory; start several to share a sweep, then ``main`` assembles it."""
    cfg = settings(quick, overrides)
    path = Path(out or run_dir(NAME, quick, overrides))
    path.mkdir(parents=True, exist_ok=True)
    teachers = _teachers(cfg)
    for kind in cfg.kinds:
        for bucket, widths in _groups(cfg).items():
            lock = path / f"job_{kind}__{bucket}.lock"
            try:
                lock.touch(exist_ok=False)
            except FileExistsError:
                continue
            try:
                _cached_bucket(path, kind, bucket, widths, cfg, teachers)
            finally:
                lock.unlink(missing_ok=True)


def summarize_cached(out=None, quick: bool = False, overrides=()) -> Path:
    """Write the run's summary from the jobs cached so far (``complete: false`` and the list
    of missing jobs if the sweep is unfinished); never trains."""
    cfg = settings(quick, overrides)
    path = Path(out or run_dir(NAME, quick, overrides))
    rows, missing = [], []
    for kind in cfg.kinds:
        for bucket in _groups(cfg):
            cache = path / f"job_{kind}__{bucket}.json"
            if cache.exists() and read_json(cache)["config"] == to_jsonable(cfg):
                rows += read_json(cache)["rows"]
            else:
                missing.append(f"{kind}/bucket={bucket}")
    run = RunDir(path, record(cfg, overrides), overwrite=True)
    for r in rows:
        run.log(**r)
    run.finish({"config": dataclasses.asdict(cfg), "complete": not missing,
                "missing_jobs": missing, **_aggregate(rows, cfg), **summary_entry(overrides)})
    return run.path


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    run = RunDir(out or run_dir(NAME, quick, overrides), record(cfg, overrides),
                 overwrite=overwrite)
    teachers = _teachers(cfg)
    total = len(cfg.kinds) * len(cfg.widths) * len(cfg.teachers) * cfg.seeds
    rows = []
    with tqdm(total=total, desc="rank_vs_width runs", unit="run") as pbar:
        for kind in cfg.kinds:
            for bucket, widths in _groups(cfg).items():
                new = _cached_bucket(run.path, kind, bucket, widths, cfg, teachers, pbar)
                for r in new:
                    run.log(**r)
                rows += new
    summary = {"config": dataclasses.asdict(cfg), "complete": True, "missing_jobs": [],
               **_aggregate(rows, cfg), **summary_entry(overrides)}
    run.finish(summary)
    return run.path
