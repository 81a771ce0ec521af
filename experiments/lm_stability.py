"""Training stability: loss spikes of the Transformer against DCA, over every cached LM run.

**Claim tested.** Paper §5 (Figures 7 and 8, LM1B, 12-42 layers): "we observe clear loss
spikes with the transformer model ... training DCA is more stable, showing no significant loss
spikes even for large models". No count or definition is given.

**Design.** A loss spike is defined precisely in :mod:`dca_theory.lab.stability`: step ``t`` is
a spike step if ``loss_t - median(previous 25 losses) > max(0.1 nats, c * 1.4826 * MAD)``, tested
only after the warm-up (and the first window), consecutive spike steps forming one event;
``c = 6`` is the headline, ``c`` in {4, 6, 8} the sensitivity. This experiment scans EVERY run in
the run cache (``record.json`` + ``curves.npz``; whatever the other ``lm_*`` experiments and the
background grid trained: widths 16-128, depths 2-8, both datasets, GRN variants, k-DCA, the
related-work baselines, retrofitting) and counts the events of each seed run. Runs are grouped
by residual family: ``vanilla``; ``dca_family`` (dca at any k, grn_v1/v2/v3, either gate);
``baselines`` (DenseFormer, Hyper-Connections, LAuReL); ``retrofit`` (continued from a trained
vanilla model; listed, kept out of the comparisons, which are about training from scratch).
A run no longer than the window or its warm-up (the rule tests none of its steps) is skipped
with a note (``skipped_too_short``: its key, its length and the least that would do).
Reported per family: events per 1000 tested steps with an exact Poisson 95% interval; the exact
conditional (binomial) test of the rate ratio DCA-family / vanilla and baselines / vanilla;
Fisher's exact test on seed runs with at least one event; the same restricted to *matched*
configurations (dataset, width, depth with both a vanilla and a DCA run); and the largest
gradient norm over its post-warm-up median per seed run (Mann-Whitney U test); and how many
events coincide (within 2 steps) with an event of another residual kind on the same dataset and
seed, i.e. on the same batches (seed ``s`` gives every architecture the same data order): shared
events point at hard batches, not at one architecture's instability. When even "all events in
vanilla" could not reach p < 0.05, the summary says there are too few spikes to tell.

**Command.** ``dca-theory run lm_stability`` (full: reads ``experiments/results/lm_runs``; run
it LAST, after ``python -m dca_theory.lab.lm_grid``; rerunning picks up new runs; writes
``experiments/results/lm_stability``), or ``dca-theory run lm_stability --quick`` (trains, if
absent, the quick vanilla and DCA runs of ``lm_ablation --quick`` into ``runs/lm_runs`` and
scans that cache). Figure: ``figures/fig_lm_stability.py``.

**Runtime.** Full: seconds (only reads curves; measured 33 s wall, 4 s CPU, 27 runs, under
load). Quick, from an empty cache: under a minute on an idle 2-core machine (two small
compilations; the slow test took 72 s CPU under load); seconds when ``lm_ablation --quick`` ran
first (measured 28 s wall, 4 s CPU).

**Expected result** (measured, committed run over 27 cached runs / 81 seed runs; see
``paper/05_lm/stability.md``): at c = 6 no spike in any run of any architecture (0 events in
6,480 Transformer and 17,280 DCA-family tested steps), so the claim cannot be tested at this
scale; at c = 4, 8 Transformer events (1.23 / 1000 steps) against 21 DCA-family events (1.22 /
1000; ratio 0.98, p = 1.0), 33 of all 34 events shared with another architecture on the same
batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import stats

from dca_theory import gates
from dca_theory.io import RunDir, read_json, to_jsonable
from dca_theory.lab.lm_grid import ablation_specs
from dca_theory.lab.lm_runs import ensure_run
from dca_theory.lab.lm_settings import (
    StabilitySettings,
    ablation_settings,
    experiment_settings,
    run_cache,
    run_config,
)
from dca_theory.lab.stability import (
    SpikeRule,
    detect_spikes,
    fisher_runs_with_spikes,
    grad_norm_ratio,
    poisson_rate,
    rate_ratio_test,
)
from dca_theory.lm.train_config import LMTrainConfig
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_stability"
#: the spike rule of the committed run (``--set window=... c=... abs_floor=... c_grid=...``)
PRESET = StabilitySettings.preset(False)
WINDOW, C, ABS_FLOOR = PRESET.window, PRESET.c, PRESET.abs_floor
C_GRID: tuple[float, ...] = PRESET.c_grid
FAMILIES = {"vanilla": "vanilla", "dca": "dca_family", "grn_v1": "dca_family",
            "grn_v2": "dca_family", "grn_v3": "dca_family", "denseformer": "baselines",
            "hyper_connections": "baselines", "laurel_pa": "baselines", "laurel_lr": "baselines"}
GROUPS: tuple[str, ...] = ("vanilla", "dca_family", "baselines", "retrofit")


def load_cached_runs(cache: Path) -> list[dict]:
    """Every finished run of the cache: its record, resolved configs and per-step curves."""
    train_defaults = to_jsonable(LMTrainConfig())
    runs = []
    for record_path in sorted(Path(cache).glob("*/record.json")):
        curves_path = record_path.parent / "curves.npz"
        if not curves_path.is_file():
            continue
        record = read_json(record_path)
        with np.load(curves_path) as f:
            loss, grad = f["loss"].astype(float), f["grad_norm"].astype(float)
        runs.append({"record": record, "model": record["resolved_model"],
                     "train": train_defaults | record["train"], "loss_SxT": loss,
                     "grad_norm_SxT": grad})
    return runs


def split_too_short(runs: list[dict], rule: StabilitySettings = PRESET
                    ) -> tuple[list[dict], list[dict]]:
    """``(runs, skipped)``: the runs whose curves reach past the spike window and their warm-up
    (the rule tests at least one step of them), and a note ``{key, steps, min_steps}`` for each
    of the others (they have no exposure: counting them would divide by zero steps)."""
    kept, skipped = [], []
    for run in runs:
        first = SpikeRule(rule.window, rule.c, rule.abs_floor,
                          int(run["train"]["warmup_steps"])).first_tested
        steps = int(run["loss_SxT"].shape[-1])
        if steps > first:
            kept.append(run)
        else:
            skipped.append({"key": run["record"]["key"], "steps": steps, "min_steps": first + 1})
    return kept, skipped


def group_of(run: dict) -> str:
    if run["record"]["init_from"] is not None:
        return "retrofit"
    return FAMILIES.get(run["model"]["residual"], "baselines")


def analyse_seed_runs(runs: list[dict], c_grid=None,
                      rule: StabilitySettings = PRESET) -> list[dict]:
    """One row per (cached run, seed): spike events at every ``c`` (default: ``rule.c_grid``),
    exposure, gradient ratio."""
    c_grid = rule.c_grid if c_grid is None else c_grid
    rows = []
    for run in runs:
        rec, model, train = run["record"], run["model"], run["train"]
        skip = int(train["warmup_steps"])
        for i, seed in enumerate(rec["seeds"]):
            loss = run["loss_SxT"][i]
            events = {c: detect_spikes(loss, SpikeRule(rule.window, c, rule.abs_floor, skip))
                      for c in c_grid}
            headline = SpikeRule(rule.window, rule.c, rule.abs_floor, skip)
            rows.append({
                "key": rec["key"], "label": rec["label"], "seed": seed, "group": group_of(run),
                "residual": model["residual"], "k": model["k"], "gate": model["grn_gate"],
                "data": train["data"], "d_model": model["d_model"], "n_layers": model["n_layers"],
                "steps": int(loss.size), "tested_steps": headline.tested_steps(loss.size),
                "n_events": {str(c): len(e) for c, e in events.items()},
                "events": {str(c): [{"start": e.start, "end": e.end, "peak_excess": e.peak_excess,
                                     "peak_ratio": e.peak_ratio} for e in ev]
                           for c, ev in events.items()},
                "grad_norm_ratio": grad_norm_ratio(run["grad_norm_SxT"][i], max(skip, 1)),
            })
    return rows


def group_counts(rows: list[dict], c: float) -> dict:
    """Per group: events, tested steps, rate per 1000 steps (exact interval), runs with events."""
    out = {}
    for g in GROUPS:
        sel = [r for r in rows if r["group"] == g]
        if not sel:
            continue
        count = sum(r["n_events"][str(c)] for r in sel)
        exposure = sum(r["tested_steps"] for r in sel)
        out[g] = {**poisson_rate(count, exposure), "seed_runs": len(sel),
                  "seed_runs_with_events": sum(r["n_events"][str(c)] > 0 for r in sel),
                  "cached_runs": len({r["key"] for r in sel})}
    return out


def compare(counts: dict, a: str, b: str) -> dict | None:
    """Rate-ratio and Fisher tests of group ``b`` against group ``a``, and whether the events
    are too few to tell (even all of them in ``a`` would not give p < 0.05)."""
    if a not in counts or b not in counts:
        return None
    ca, cb = counts[a], counts[b]
    test = rate_ratio_test(ca["count"], ca["exposure"], cb["count"], cb["exposure"])
    n = test["n_events"]
    best_p = rate_ratio_test(n, ca["exposure"], 0, cb["exposure"])["p_value"]
    fisher = fisher_runs_with_spikes(ca["seed_runs_with_events"], ca["seed_runs"],
                                     cb["seed_runs_with_events"], cb["seed_runs"])
    return {"rate_ratio": test, "fisher_runs_with_events": fisher,
            "smallest_possible_p": best_p, "too_few_to_tell": bool(best_p >= 0.05)}


def matched_rows(rows: list[dict]) -> list[dict]:
    """Vanilla and DCA (any k, either gate) seed runs of configurations that have both."""
    def config(r):
        return (r["data"], r["d_model"], r["n_layers"])

    scratch = [r for r in rows if r["group"] != "retrofit"]
    have = {res: {config(r) for r in scratch if r["residual"] == res} for res in ("vanilla", "dca")}
    both = have["vanilla"] & have["dca"]
    return [r for r in scratch if r["residual"] in ("vanilla", "dca") and config(r) in both]


def shared_events(rows: list[dict], c: float, tolerance: int = 2) -> dict:
    """How many events (from-scratch runs) coincide, within ``tolerance`` steps, with an event
    of a run of a *different* residual kind on the same dataset and seed. Seed ``s`` feeds every
    architecture (and every width and depth) the same batches, so a shared event points at a
    hard batch rather than at an instability of one architecture."""
    scratch = [r for r in rows if r["group"] != "retrofit"]
    total, shared = 0, 0
    for r in scratch:
        others = [o for o in scratch if o["residual"] != r["residual"]
                  and (o["data"], o["seed"]) == (r["data"], r["seed"])]
        other_starts = [e["start"] for o in others for e in o["events"][str(c)]]
        for e in r["events"][str(c)]:
            total += 1
            shared += any(abs(e["start"] - t) <= tolerance for t in other_starts)
    return {"events": total, "shared_with_other_kind": shared, "tolerance_steps": tolerance}


def grad_ratio_summary(rows: list[dict]) -> dict:
    out = {}
    for g in GROUPS:
        v = [r["grad_norm_ratio"] for r in rows if r["group"] == g]
        if v:
            out[g] = {"median": float(np.median(v)), "mean": float(np.mean(v)),
                      "max": float(np.max(v)), "n": len(v)}
    va = [r["grad_norm_ratio"] for r in rows if r["group"] == "vanilla"]
    for g in ("dca_family", "baselines"):
        vb = [r["grad_norm_ratio"] for r in rows if r["group"] == g]
        if va and vb and g in out:
            out[g]["mannwhitney_p_vs_vanilla"] = float(stats.mannwhitneyu(va, vb).pvalue)
    return out


def example_pair(rows: list[dict], c: float = C) -> dict | None:
    """The vanilla seed run with the most events (ties: deepest, then widest) and the DCA run
    (full stack, paper gate) of the same dataset, width, depth and seed."""
    vanilla = [r for r in rows if r["group"] == "vanilla"]
    dca = {(r["data"], r["d_model"], r["n_layers"], r["seed"]): r for r in rows
           if r["group"] == "dca_family" and r["residual"] == "dca" and r["k"] is None
           and gates.canonical(r["gate"]) == "paper"}
    ranked = sorted(vanilla, key=lambda r: (r["n_events"][str(c)], r["n_layers"], r["d_model"]),
                    reverse=True)
    for v in ranked:
        d = dca.get((v["data"], v["d_model"], v["n_layers"], v["seed"]))
        if d is not None:
            return {"vanilla": v, "dca": d}
    return None


def summarise(rows: list[dict], rule: StabilitySettings = PRESET) -> dict:
    by_c = {}
    for c in rule.c_grid:
        counts = group_counts(rows, c)
        m_counts = group_counts(matched_rows(rows), c)
        by_c[str(c)] = {"groups": counts,
                        "dca_family_vs_vanilla": compare(counts, "vanilla", "dca_family"),
                        "baselines_vs_vanilla": compare(counts, "vanilla", "baselines"),
                        "matched_groups": m_counts,
                        "matched_dca_vs_vanilla": compare(m_counts, "vanilla", "dca_family"),
                        "shared_events": shared_events(rows, c)}
    return {"rule": {"window": rule.window, "c": rule.c, "abs_floor_nats": rule.abs_floor,
                     "skip": "each run's warm-up steps", "c_grid": list(rule.c_grid)},
            "by_c": by_c, "headline": by_c[str(rule.c)],
            "grad_norm_ratio": grad_ratio_summary(rows),
            "n_cached_runs": len({r["key"] for r in rows}), "n_seed_runs": len(rows),
            "seed_runs": rows}


def quick_specs(quick: bool, settings: StabilitySettings | None = None) -> dict:
    """The ablation's vanilla and DCA runs, which a quick run trains if missing."""
    s = settings or StabilitySettings.preset(quick)
    specs = ablation_specs(quick, s.train.data, ablation_settings(s))
    return {k: specs[k] for k in ("vanilla", "dca")}


def settings(quick: bool = False, overrides=()) -> StabilitySettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(StabilitySettings, quick, overrides, quick_specs)


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    config = {"experiment": NAME, "quick": quick,
              "rule": {"window": cfg.window, "c": cfg.c, "abs_floor": cfg.abs_floor,
                       "c_grid": cfg.c_grid},
              "groups": FAMILIES}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    if quick:  # make sure the quick cache holds at least a vanilla and a DCA run
        specs = quick_specs(True, cfg)
        for kind in ("vanilla", "dca"):
            ensure_run(specs[kind], cache)
    runs = load_cached_runs(cache)
    if not runs:
        raise FileNotFoundError(f"no cached runs (record.json + curves.npz) under {cache}; "
                                "train them first: python -m dca_theory.lab.lm_grid")
    runs, too_short = split_too_short(runs, cfg)
    if not runs:
        first = too_short[0]
        raise ValueError(f"every cached run under {cache} is too short for the spike window "
                         f"(window={cfg.window} and the warm-up): {first['key']} has "
                         f"{first['steps']} steps, at least {first['min_steps']} are needed; "
                         f"lower --set window or train longer runs")
    for note in too_short:
        print(f"lm_stability: skipped {note['key']}: {note['steps']} steps, the spike rule "
              f"tests none (it needs at least {note['min_steps']})")
    rows = analyse_seed_runs(runs, rule=cfg)
    for r in rows:
        run.log(**{k: r[k] for k in ("key", "seed", "group", "steps", "tested_steps",
                                     "n_events", "grad_norm_ratio")})
    summary = summarise(rows, cfg) | {"cache": str(cache), "skipped_too_short": too_short}
    pair = example_pair(rows, cfg.c)
    if pair is not None:
        curves = {}
        for name, r in pair.items():
            src = next(x for x in runs if x["record"]["key"] == r["key"])
            i = src["record"]["seeds"].index(r["seed"])
            curves[f"{name}_loss"], curves[f"{name}_grad_norm"] = (
                src["loss_SxT"][i], src["grad_norm_SxT"][i])
        run.save_arrays("example_curves.npz", **curves)
        summary["example_pair"] = {n: {"key": r["key"], "seed": r["seed"], "label": r["label"]}
                                   for n, r in pair.items()}
    run.finish(summary | summary_entry(overrides))
    return run.path
