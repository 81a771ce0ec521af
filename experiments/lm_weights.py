"""Which stack entries do trained GRNs weight? The learned biases b of GRN-v3 and DCA models
per stack slot (paper Appendix H, Figure 10), and the gate weights w, on Tiny Shakespeare.

**Claim tested.** Paper Figure 10 (30-layer GRN-v3 on LM1B): per GRN, the median over features
of the bias b per stack entry and a 90% band; "The layers tend to weight the inputs and the
last few layers the most and frequently assign a negative bias for the intermediate layers,
indicating that the layers are filtered out as a result of the ReLU activation." The authors
also cite this figure as the motivation of k-DCA (first and last layers matter most). The
plotted values lie in about [-0.2, 0.3] although b starts at 1 (``dca-paper.md`` App. H:
unresolved).

**Design.** The trained models of :func:`dca_theory.lab.lm_grid.ablation_specs` (Tiny Shakespeare,
width 64, depth 4, 400 steps, seeds 0, 1, 2): ``grn_v3`` and ``dca`` with the paper's ReLU gate and
``grn_v3_open`` / ``dca_open`` with the ``open`` gate; ``<kind>_bias_inside`` and
``<kind>_small_init`` train the same model with those gates (:mod:`dca_theory.gates`; the bias
inside is the form under which Figure 10's "negative bias ... filtered out by the ReLU" reading is
possible). For every GRN and seed, :func:`dca_theory.lab.analysis.bias_profile` gives the median and
5-95% band of b over the 64 features per stack slot. Shape checks over every GRN with at least 3
slots: are the two largest slot medians the input and the newest output? Is the input's the largest
(or the smallest)? Are all intermediate slots below both ends? What fraction of intermediate medians
is negative? The gate weights w: L2 norm and max |w| per GRN and seed. With the paper's gate and w =
0 at init, ReLU'(0) = 0 gives w exactly zero gradient, so w must stay exactly 0 (AdamW's decay of 0
is 0); with the open gate w trains. AdamW's decoupled weight decay acts on b too: ``decay_only_b``
is where b = 1 would end with no gradient at all (our 400 steps: ~0.96; the paper's 500k-step
recipe: ~1e-3, which may explain why Figure 10's biases lie in [-0.2, 0.3] although b starts at 1).

**Command.** ``dca-theory run lm_weights`` (full; reads the cache ``experiments/results/lm_runs``,
writes ``experiments/results/lm_weights``) or ``dca-theory run lm_weights --quick`` (width 16,
depth 2, 30 steps, seeds 0, 1; cache ``runs/lm_runs``). Figure: ``figures/fig_lm_weights.py``.

**Runtime.** With the parameters in the cache: about 30 s (8 x 3 models loaded, their effective
weights over 8 validation sequences). Parameters are not committed, so on a fresh clone the 8
runs x 3 seeds retrain first: about 45 minutes on the loaded 2-core machine. Quick, from an empty
quick cache: about 1.5 minutes there (8 small compilations).

**Expected result** (measured, committed run; see ``paper/05_lm/weights.md``): every median of
b lies within ±0.05 of the decay-only value 0.962 under all four gates (no negative bias). With
the paper gate w is exactly 0 everywhere; with every live gate ||w|| per GRN is about 0.2. With
the bias inside, the effective weights of block GRNs put the input first and switch intermediate
entries off (up to 52 % of coefficients 0); the output GRN weights the input least under every
gate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.io import RunDir
from dca_theory.lab.lm_grid import ablation_specs
from dca_theory.lab.lm_runs import ensure_run, load_models, spec
from dca_theory.lab.lm_settings import (
    WEIGHT_KINDS,
    WeightsSettings,
    ablation_settings,
    experiment_settings,
    run_cache,
    run_config,
    split_gate,
)
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_weights"
KINDS: tuple[str, ...] = WEIGHT_KINDS


def shape_check(median: list[float]) -> dict | None:
    """Figure 10's pattern on one GRN's slot medians (oldest slot first: input ... newest).

    ``None`` with fewer than 3 slots (no intermediate entry). Otherwise: whether the input and
    the newest output hold the two largest medians, whether the input holds the largest (or
    the smallest), whether every intermediate median lies below both ends, and the fraction of
    intermediate medians below zero.
    """
    m = np.asarray(median, float)
    if m.size < 3:
        return None
    mid = m[1:-1]
    top2 = set(np.argsort(-m, kind="stable")[:2].tolist())
    return {"ends_top2": top2 == {0, m.size - 1},
            "input_largest": bool(m[0] > m[1:].max()), "input_smallest": bool(m[0] < m[1:].min()),
            "intermediate_below_ends": bool(mid.max() < min(m[0], m[-1])),
            "frac_intermediate_negative": float((mid < 0).mean()),
            "input_minus_intermediate": float(m[0] - mid.mean()),
            "last_minus_intermediate": float(m[-1] - mid.mean())}


def aggregate_checks(checks: list[dict]) -> dict:
    """Fractions (over GRNs x seeds) of the :func:`shape_check` results."""
    checks = [c for c in checks if c is not None]
    if not checks:
        return {"n": 0}
    return {"n": len(checks),
            "frac_ends_top2": float(np.mean([c["ends_top2"] for c in checks])),
            "frac_input_largest": float(np.mean([c["input_largest"] for c in checks])),
            "frac_input_smallest": float(np.mean([c["input_smallest"] for c in checks])),
            "frac_intermediate_below_ends": float(np.mean([c["intermediate_below_ends"]
                                                           for c in checks])),
            "mean_frac_intermediate_negative": float(np.mean(
                [c["frac_intermediate_negative"] for c in checks])),
            "mean_input_minus_intermediate": float(np.mean(
                [c["input_minus_intermediate"] for c in checks])),
            "mean_last_minus_intermediate": float(np.mean(
                [c["last_minus_intermediate"] for c in checks]))}


def w_stats(arrays_per_seed: list[dict[str, np.ndarray]]) -> dict:
    """Per GRN: L2 norm and max |w| per seed; overall max |w| and mean norm."""
    per_grn: dict[str, dict] = {}
    for arrays in arrays_per_seed:
        for name, w in arrays.items():
            if not name.endswith(".w"):
                continue
            g = per_grn.setdefault(name[:-2], {"norm": [], "max_abs": []})
            g["norm"].append(float(np.linalg.norm(w)))
            g["max_abs"].append(float(np.max(np.abs(w))))
    if not per_grn:
        return {"per_grn": {}, "max_abs": None, "mean_norm": None, "all_exactly_zero": None}
    return {"per_grn": per_grn,
            "max_abs": max(max(g["max_abs"]) for g in per_grn.values()),
            "mean_norm": float(np.mean([np.mean(g["norm"]) for g in per_grn.values()])),
            "all_exactly_zero": all(max(g["max_abs"]) == 0.0 for g in per_grn.values())}


def seed_mean_profiles(profiles_per_seed: list[list[dict]]) -> list[dict]:
    """Per GRN: the seed mean of the per-seed median / low / high of b per slot."""
    out = []
    for rows in zip(*profiles_per_seed):
        if len({r["grn"] for r in rows}) != 1:
            raise ValueError("seeds disagree on the GRN order")
        out.append({"grn": rows[0]["grn"], "slots": rows[0]["slots"],
                    "num_outputs": rows[0]["num_outputs"],
                    **{k: np.mean([r[k] for r in rows], axis=0).tolist()
                       for k in ("median", "low", "high")}})
    return out


def decay_only_factor(train_cfg) -> float:
    """What AdamW's decoupled weight decay alone does to a parameter over a run:
    ``prod_s (1 - eta(s) * wd)`` with the run's learning-rate schedule eta. A bias b that gets
    no gradient ends at this factor times its init 1 (the optimiser decays every parameter, as
    the Flax lm1b example does)."""
    from dca_theory.lm.optim import learning_rate

    eta = np.asarray(learning_rate(train_cfg)(np.arange(train_cfg.steps)), np.float64)
    return float(np.prod(1.0 - eta * train_cfg.weight_decay))


def analyse(models, tokens_NxL=None) -> dict:
    """Bias profiles, shape checks and w statistics of one run's trained models (one per seed);
    with ``tokens_NxL`` (validation sequences) also what each GRN-v3 weights its entries by once
    its gate acts (:func:`dca_theory.lab.analysis.effective_profile`), seed-averaged."""
    from dca_theory.lab.analysis import bias_profile, effective_profile, grn_weights

    effective = None
    if tokens_NxL is not None:
        per_seed = [effective_profile(m, tokens_NxL) for m in models]
        effective = [{**rows[0], **{k: np.mean([r[k] for r in rows], axis=0).tolist()
                                    for k in ("median_coefficient", "mean_gate_input",
                                              "mean_abs_gate_input", "frac_switched_off")}}
                     for rows in zip(*per_seed)]
    profiles = [bias_profile(m) for m in models]
    checks = [shape_check(r["median"]) for prof in profiles for r in prof]
    return {"profiles_per_seed": profiles, "profile_seed_mean": seed_mean_profiles(profiles),
            "shape": aggregate_checks(checks),
            "shape_output_grn": aggregate_checks(
                [shape_check(r["median"]) for prof in profiles for r in prof
                 if r["grn"] == "output"]),
            "w": w_stats([grn_weights(m) for m in models]),
            "effective_seed_mean": effective}


def weight_specs(quick: bool, settings: WeightsSettings | None = None) -> dict:
    """``{row: RunSpec}`` of ``settings.kinds``: the ablation's runs where it has them (the
    paper and open gates), else the same run with the row's gate."""
    s = settings or WeightsSettings.preset(quick)
    grid = ablation_settings(s)
    ablation = ablation_specs(quick, s.train.data, grid)
    out = {}
    for row in s.kinds:
        kind, gate = split_gate(row)
        out[row] = ablation.get(row) or spec(row, s.train.data, quick, grid=grid, residual=kind,
                                             grn_gate=gate)
    return out


#: validation sequences the effective weights are averaged over (from the split's start)
EFFECTIVE_SEQUENCES = 8


def validation_tokens(s) -> np.ndarray:
    """``EFFECTIVE_SEQUENCES`` consecutive validation sequences of the run's length."""
    from dca_theory.lab.lm_runs import cached_corpus

    seq_len = s.train.seq_len or s.model.max_len
    valid = np.asarray(cached_corpus(s.train.data).valid)
    return valid[: EFFECTIVE_SEQUENCES * seq_len].reshape(EFFECTIVE_SEQUENCES, seq_len)


def settings(quick: bool = False, overrides=()) -> WeightsSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(WeightsSettings, quick, overrides, weight_specs)


def main(quick: bool = False, out=None, overwrite: bool = False,
         kinds: tuple[str, ...] = KINDS, overrides=()) -> Path:
    """``kinds`` selects a subset of :data:`KINDS` (e.g. only the runs already cached)."""
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {', '.join(KINDS)}, got {kinds!r}")
    cfg = settings(quick, overrides)
    if tuple(kinds) != KINDS:
        cfg = cfg.replace(kinds=tuple(kinds))
    specs = weight_specs(quick, cfg)
    config = {"experiment": NAME, "quick": quick, "seeds": list(cfg.seeds),
              "runs": {k: s.describe()
                       for k, s in specs.items()}}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    from dca_theory.lm.train_config import LMTrainConfig

    train = next(iter(specs.values())).train
    # The paper's recipe (LMTrainConfig's defaults: lr 0.0016, 1000 warm-up steps, 500k steps,
    # weight decay 0.1): a b = 1 that gets no gradient would decay to about 1e-3.
    summary = {"kinds": {}, "cache": str(cache), "band_percentiles": [5.0, 95.0],
               "decay_only_b": decay_only_factor(train),
               "paper_decay_only_b": decay_only_factor(LMTrainConfig())}
    for kind in specs:
        s = specs[kind]
        models = load_models(s, cache)  # without parameters: retrained, checked against the record
        record = ensure_run(s, cache)  # the record of the models analysed
        result = analyse(models, validation_tokens(s))
        result |= {"key": s.key, "grn_gate": s.model.grn_gate, "residual": s.model.residual,
                   "test_ppl": record["test_ppl"]}
        summary["kinds"][kind] = result
        run.log(kind=kind, key=s.key, w_max_abs=result["w"]["max_abs"],
                w_mean_norm=result["w"]["mean_norm"], **{f"shape_{k}": v for k, v in
                                                         result["shape"].items()})
    run.finish(summary | summary_entry(overrides))
    return run.path
