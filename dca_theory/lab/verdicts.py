"""The numbers behind the LM verdict table (``paper/05_lm_claims.md``), recomputed from the
committed result files: no training, no model code, only ``experiments/results/*/summary.json``,
the run cache's ``record.json`` / ``curves.npz`` and ``benchmarks/results/*.json``.

The unit is ``D = 100 (ln ppl_X - ln ppl_ref)`` per seed pair (log-perplexity points, about the
relative difference in %; negative when X is better), as in the pre-registered design. Each
claim's function returns its gaps with a 95 % t interval and a two-sided one-sample t-test over
the seed pairs, Holm-adjusted within the claim's own family when several tests bear on it
(:func:`gap_family`), and a verdict from one rule (:func:`verdict`). Claims that the runs could
not have shown get :data:`NOT_AT_BUDGET` with the reason; claims without a measurement get
:data:`NOT_TESTED` with what would test them. Verdicts are about the sign of an effect; sizes
are reported beside them, never judged.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats

from dca_theory.lab.statistics import (
    gap_at_equal_time,
    holm,
    log_ppl_gap,
    multiplier_per_seed,
    seed_clustered_slope,
)

REPRODUCED = "reproduced"
TREND = "reproduced in trend only"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_AT_BUDGET = "not tested at this budget"
NOT_TESTED = "not tested"
PENDING = "pending: the pre-registered grid (evidence_design.md) is being trained"
#: the pre-registered rule's outcomes (``lm_evidence_analysis.decision``) in this table's words
REGISTERED = {"supported": REPRODUCED, "contradicted at this scale": NOT_REPRODUCED,
              "inconclusive": INCONCLUSIVE}
VERDICTS = (REPRODUCED, TREND, NOT_REPRODUCED, INCONCLUSIVE, NOT_AT_BUDGET, NOT_TESTED)
ALPHA = 0.05


def _summary(results: Path, name: str) -> dict:
    return json.loads((Path(results) / name / "summary.json").read_text())


def gap(values, level: float = 0.95) -> dict:
    """Mean, ``level`` t interval, two-sided one-sample t-test p and sign counts of per-pair
    gaps (negative = the claim's architecture is better)."""
    d = np.asarray(values, float)
    if d.size < 2:
        raise ValueError(f"need >= 2 seed pairs for an interval, got {d.size}")
    mean, se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size))
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1) * se)
    p = float(2 * stats.t.sf(abs(mean) / se, d.size - 1)) if se > 0 else 0.0
    return {"mean": mean, "ci": [mean - half, mean + half], "p_value": p, "n": int(d.size),
            "lower": int((d < 0).sum()), "per_pair": d.tolist()}


def gap_family(gaps: dict[str, dict], family: str) -> dict[str, dict]:
    """Holm-adjust the p-values of the tests that bear on one claim (``family`` names them)."""
    names = list(gaps)
    adjusted = holm([gaps[n]["p_value"] for n in names])
    return {n: {**gaps[n], "p_holm": a, "family": family} for n, a in zip(names, adjusted)}


def verdict(g: dict, direction: int = -1) -> str:
    """The rule: ``reproduced`` if the mean lies in the paper's ``direction`` (-1: lower) with
    (Holm-adjusted, where there is a family) p < 0.05; ``reproduced in trend only`` if every
    pair lies in that direction but p >= 0.05; ``not reproduced`` if the interval excludes 0
    on the other side; else ``inconclusive``."""
    if direction not in (-1, 1):
        raise ValueError(f"direction must be -1 or 1, got {direction}")
    p = g.get("p_holm", g["p_value"])
    in_direction = np.sign(g["mean"]) == direction
    if in_direction and p < ALPHA:
        return REPRODUCED
    agree = g["lower"] if direction == -1 else g["n"] - g["lower"]
    if in_direction and agree == g["n"]:
        return TREND
    lo, hi = g["ci"]
    if (lo > 0) if direction == -1 else (hi < 0):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def weakest(verdicts) -> str:
    """A claim that every test must carry ("each generalisation helps") holds only as far as
    its weakest test: the lowest of ``verdicts`` in the order not reproduced < inconclusive <
    trend only < reproduced."""
    order = (NOT_REPRODUCED, INCONCLUSIVE, TREND, REPRODUCED)
    verdicts = list(verdicts)
    bad = [v for v in verdicts if v not in order]
    if bad or not verdicts:
        raise ValueError(f"verdicts must be non-empty and among {order}, got {verdicts}")
    return min(verdicts, key=order.index)


def pooled_gap(groups: dict[str, tuple[list, list]], level: float = 0.95) -> dict:
    """Pool seed-paired gaps over configurations: ``groups`` maps a configuration to
    ``(seeds, gaps)``. A seed shares its data order across configurations, so the seed is the
    independent unit: the interval is a t interval over each seed's mean gap (``G - 1``
    degrees of freedom). Agreement is a one-way ANOVA of the gaps across configurations
    (p >= 0.05 and one sign of every configuration mean); the sign count is over all pairs."""
    by_seed: dict[int, list[float]] = {}
    for seeds, d in groups.values():
        if len(seeds) != len(d):
            raise ValueError(f"seeds and gaps differ in length: {len(seeds)} != {len(d)}")
        for s, v in zip(seeds, d):
            by_seed.setdefault(int(s), []).append(float(v))
    clustered = gap([np.mean(v) for v in by_seed.values()], level)
    every = np.concatenate([np.asarray(d, float) for _, d in groups.values()])
    means = [float(np.mean(d)) for _, d in groups.values()]
    anova_p = float(stats.f_oneway(*[np.asarray(d, float) for _, d in groups.values()]).pvalue)
    return {"mean": float(every.mean()), "ci": clustered["ci"], "p_value": clustered["p_value"],
            "n_seeds": len(by_seed), "n_pairs": int(every.size),
            "lower": int((every < 0).sum()), "config_means": dict(zip(groups, means)),
            "heterogeneity_p": anova_p,
            "agree": bool(anova_p >= ALPHA and len({np.sign(m) for m in means}) == 1)}


def _pairs(rows: dict, ref: str, names) -> dict[str, list]:
    base = rows[ref]["test_ppl_per_seed"]
    return {n: log_ppl_gap(base, rows[n]["test_ppl_per_seed"]).tolist() for n in names}


def table7_ablation(results: Path) -> dict:
    """Table 7: each GRN generalisation and DCA against vanilla. Family: the four
    X - vanilla tests of one corpus. PTB (CPU) and the paper-size GPU run are recorded but
    could not show a gap: every model sits near the same perplexity after a few seconds of
    training."""
    kinds = ("grn_v1", "grn_v2", "grn_v3", "dca")
    out = {}
    for ds in ("shakespeare", "ptb"):
        rows = _summary(results, "lm_ablation")["datasets"][ds]["rows"]
        fam = gap_family({k: gap(d) for k, d in _pairs(rows, "vanilla", kinds).items()},
                         f"Table 7 on {ds}: {', '.join(kinds)} - vanilla")
        out[ds] = {k: {**g, "verdict": verdict(g)} for k, g in fam.items()}
        out[ds + "_mean_ppl"] = {k: float(np.mean(r["test_ppl_per_seed"]))
                                 for k, r in rows.items()}
    gpu = {k: json.loads((Path(results) / "lm_ablation_gpu" / f"ablation_{k}.json").read_text())
           for k in ("vanilla", *kinds)}
    steps = int(gpu["vanilla"]["valid_history"][-1]["step"])
    out["gpu"] = gap_family({k: gap(log_ppl_gap(gpu["vanilla"]["test_ppl"], gpu[k]["test_ppl"]))
                             for k in kinds}, "Table 7 on PTB (GPU): X - vanilla")
    out["gpu_steps"] = steps
    out["gpu_train_s"] = {k: steps * r["median_step_s"] for k, r in gpu.items()}
    out["verdict"] = {"shakespeare": weakest(g["verdict"] for g in out["shakespeare"].values()),
                      "ptb": NOT_AT_BUDGET, "gpu": NOT_AT_BUDGET}
    return out


def table5_related_work(results: Path) -> dict:
    """Table 5: DCA against each baseline. Family: DCA - {DenseFormer, Hyper-Connections,
    LAuReL-PA}."""
    rows = _summary(results, "lm_related_work")["datasets"]["shakespeare"]["rows"]
    base = [k for k in rows if k not in ("dca", "vanilla")]
    pairs = {b: log_ppl_gap(rows[b]["test_ppl_per_seed"], rows["dca"]["test_ppl_per_seed"])
             for b in base}
    fam = gap_family({b: gap(d) for b, d in pairs.items()}, "Table 5: DCA - each baseline")
    judged = {b: {**g, "verdict": verdict(g)} for b, g in fam.items()}
    return {"dca_minus": judged, "baselines": base,
            "verdict": weakest(g["verdict"] for g in judged.values())}


def _config_gaps(rows: dict) -> tuple[list, list]:
    return (rows["dca"]["seeds"],
            log_ppl_gap(rows["vanilla"]["test_ppl_per_seed"], rows["dca"]["test_ppl_per_seed"])
            .tolist())


def table2_width(results: Path) -> dict:
    """Table 2: per-width DCA - vanilla (family: the widths) and the seed-clustered slope of D
    on log2(width) (the paper: positive, the gain shrinks)."""
    widths = _summary(results, "lm_width")["widths"]
    per = {w: _config_gaps(r) for w, r in widths.items()}
    fam = gap_family({w: gap(d) for w, (_, d) in per.items()}, "Table 2: DCA - vanilla per width")
    x = [np.log2(int(w)) for w, (s, _) in per.items() for _ in s]
    slope = seed_clustered_slope(x, [v for _, d in per.values() for v in d],
                                 [v for s, _ in per.values() for v in s])
    lo, hi = slope["ci"]
    judged = {w: {**g, "verdict": verdict(g)} for w, g in fam.items()}
    out = {"per_width": judged, "slope": slope, "preregistered": registered_label(results),
           "verdict": {"gain at every width": weakest(g["verdict"] for g in judged.values()),
                       "gain shrinks with width": _slope_verdict(lo, hi)}}
    near = _near_convergence_slope(results)
    if near is not None:
        # the grid's slope judged by this table's sign rule: a reading added after the
        # registered verdict was known, at the rate tuned on vanilla (which handicaps DCA
        # most at the widest model), so it is reported beside the verdicts, never as one
        out["near_convergence_slope"] = {**near,
                                         "sign_by_the_table_rule_post_hoc":
                                         _slope_verdict(*near["ci"])}
    return out


def _slope_verdict(lo: float, hi: float) -> str:
    return NOT_REPRODUCED if hi < 0 else (REPRODUCED if lo > 0 else INCONCLUSIVE)


def _near_convergence_slope(results: Path) -> dict | None:
    """The evidence grid's primary slope (DCA - vanilla on log2 width) once every registered
    width has run, else None."""
    s = _evidence(results)
    if s is None:
        return None
    d = s["datasets"].get(s["primary_data"], {}).get("decision", {})
    return ({"slope": d["slope"], "ci": d["ci"], "data": s["primary_data"]}
            if d.get("verdict") in REGISTERED else None)


def figure6_depth(results: Path) -> dict:
    """Figure 6: DCA - vanilla per depth (family: the depths) and pooled over them, the
    parameter multiplier a vanilla model needs, and DCA at depth d against vanilla at 2d."""
    s = _summary(results, "lm_depth")
    per = {d: _config_gaps(r) for d, r in s["depths"].items()}
    fam = {d: {**g, "verdict": verdict(g)} for d, g in gap_family(
        {d: gap(v) for d, (_, v) in per.items()}, "Figure 6: DCA - vanilla per depth").items()}
    deeper = {}
    for name in s["dca_vs_vanilla_twice_as_deep"]:
        dca_d, van_d = (name.split("-")[i].split("_L")[1] for i in (0, 1))
        g = gap(log_ppl_gap(s["depths"][van_d]["vanilla"]["test_ppl_per_seed"],
                            s["depths"][dca_d]["dca"]["test_ppl_per_seed"]))
        deeper[name] = {**g, "verdict": verdict(g)}
    mult = [v["param_efficiency"] for v in s["param_efficiency"].values()
            if v["param_efficiency"] is not None]
    van = sorted((p for p in s["points"] if p["kind"] == "vanilla"), key=lambda p: p["params"])
    per_seed = {str(p["depth"]): multiplier_per_seed(
        [v["params"] for v in van], [v["test_ppl_per_seed"] for v in van], p["params"],
        p["test_ppl_per_seed"]) for p in s["points"] if p["kind"] == "dca"}
    pooled = pooled_gap(per)
    return {"per_depth": fam,
            "pooled": {**pooled, "verdict": verdict(pooled)},
            "vanilla_param_multiplier": mult,
            # per seed on that seed's vanilla curve: the interval the seed-mean figure lacks
            "vanilla_param_multiplier_per_seed": {d: m for d, m in per_seed.items()
                                                  if m is not None},
            "dca_vs_vanilla_twice_as_deep": deeper,
            "verdict": verdict(pooled) if pooled["agree"] else
            weakest(g["verdict"] for g in fam.values())}


def pooled_dca_vs_vanilla(results: Path) -> dict:
    """DCA - vanilla pooled over every width and depth configuration (each run once: width 64
    is depth 4), if they agree."""
    groups: dict[str, tuple[list, list]] = {}
    for name, part in (("lm_width", "widths"), ("lm_depth", "depths")):
        for label, rows in _summary(results, name)[part].items():
            key = rows["dca"]["key"]
            if key not in {k for k, _ in groups.values()}:
                groups[f"{part[:-1]} {label}"] = (key, _config_gaps(rows))
    pooled = pooled_gap({n: g for n, (_, g) in groups.items()})
    return {**pooled, "configurations": list(groups), "verdict": verdict(pooled)}


def table1_k(results: Path) -> dict:
    """Table 1: k-DCA at depth 8 against vanilla (family: 1-, 2-, 4-DCA and DCA), step-time
    ratios, and the time to reach vanilla's final perplexity (descriptive only: at 400 steps
    vanilla's final perplexity lies on a steep curve, so time-to-quality is not yet the
    paper's converged quantity)."""
    s = _summary(results, "lm_k")
    rows, kinds = s["rows"], [k for k in s["rows"] if k != "vanilla"]
    fam = gap_family({k: gap(d) for k, d in _pairs(rows, "vanilla", kinds).items()},
                     "Table 1: k-DCA - vanilla")
    judged = {k: {**g, "verdict": verdict(g)} for k, g in fam.items()}
    return {"minus_vanilla": judged,
            # timed alternately in one process (the grid's own step times saw changing loads)
            "step_time_ratio": {k: rows[k]["step_time_ratio"] for k in kinds},
            "time_to_reach_ratio": {k: v["time_ratio"]["mean"]
                                    for k, v in s["time_to_reach_vanilla"].items()},
            "verdict": {"k-DCA below vanilla": weakest(g["verdict"] for g in judged.values()),
                        "3x faster": NOT_AT_BUDGET}}


def _equal_time(results: Path, base_key: str, other_key: str) -> list[float]:
    """Per seed: D in validation loss (x100 nats, the periodic evaluation's batches) at
    vanilla's last time, each run's time axis its eval steps x its own median step time in the
    grid (the first step holds the compilation)."""
    def curve(key):
        run = Path(results) / "lm_runs" / key
        z, rec = np.load(run / "curves.npz"), json.loads((run / "record.json").read_text())
        return z["eval_steps"] * rec["median_step_s"], z["eval_valid_loss"]
    (tb, lb), (to, lo) = curve(base_key), curve(other_key)
    return [gap_at_equal_time(tb, lb[:, i], to, lo[:, i])["D"] for i in range(lb.shape[1])]


def figures78_equal_time(results: Path) -> dict:
    """Figures 7/8: DCA (depths 2, 4, 8) and 2-DCA (depth 8) against vanilla at equal training
    time (the vanilla run's end). Family: those four tests; the claim (DCA and 2-DCA lower at
    equal time) must hold in each, so it takes the weakest. DCA behind with Holm p < 0.05 is a
    result by the table's rule, whatever caused it: at 400 steps the curves still fall
    steeply, so equal time weighs DCA's slower steps against a slope, and the step times carry
    the shared machine's load; the verdict is about this budget, not the paper's converged
    curves."""
    depth, k = _summary(results, "lm_depth")["depths"], _summary(results, "lm_k")["rows"]
    pairs = {f"dca depth {d}": (r["vanilla"]["key"], r["dca"]["key"]) for d, r in depth.items()}
    pairs["2-dca depth 8"] = (k["vanilla"]["key"], k["2-dca"]["key"])
    fam = gap_family({n: gap(_equal_time(results, *keys)) for n, keys in pairs.items()},
                     "Figures 7/8: X - vanilla at equal time")
    judged = {n: {**g, "verdict": verdict(g)} for n, g in fam.items()}
    return {"at_vanilla_end": judged, "verdict": weakest(g["verdict"] for g in judged.values())}


def table9_inputs(results: Path) -> dict:
    """Table 9: GRN-v3 over the model input + last entries against the last entries only."""
    rows = _summary(results, "lm_inputs")["rows"]
    g = gap(log_ppl_gap(rows["grn_v3_last"]["test_ppl_per_seed"],
                        rows["grn_v3_input_last"]["test_ppl_per_seed"]))
    return {**g, "verdict": verdict(g)}


def table4_retrofit(results: Path) -> dict:
    """Table 4: the retrofit keeps the function (worst relative logit difference; reproduced
    below 1e-5, float32's scale), then continued DCA against continued vanilla."""
    s = _summary(results, "lm_retrofit")
    rel = float(s["preservation"]["worst"]["rel_logit_diff"])
    c = s["continued"]
    g = gap(log_ppl_gap(c["vanilla"]["test_ppl_per_seed"], c["dca"]["test_ppl_per_seed"]))
    return {"rel_logit_diff": rel, "gain": g, "continued_steps": c["dca"]["steps"],
            "verdict": {"function kept": REPRODUCED if rel < 1e-5 else NOT_REPRODUCED,
                        "then DCA improves": verdict(g)}}


def figure10_weights(results: Path) -> dict:
    """Figure 10: how far the median bias b moved from its weight-decay-only path (every
    GRN, entry and gate, seed means), its smallest value, and the largest fraction of effective
    coefficients a live gate switched off."""
    s = _summary(results, "lm_weights")
    medians = [m for k in s["kinds"].values() for grn in k["profile_seed_mean"]
               for m in grn["median"]]
    off = [f for k in s["kinds"].values() for grn in k["effective_seed_mean"]
           for f in grn["frac_switched_off"]]
    return {"decay_only_b": s["decay_only_b"],
            "max_abs_b_minus_decay_path": float(np.max(np.abs(np.subtract(medians,
                                                                          s["decay_only_b"])))),
            "min_median_b": float(np.min(medians)), "max_frac_switched_off": float(max(off)),
            "verdict": NOT_AT_BUDGET}


def stability_spikes(results: Path) -> dict:
    """Figures 7/8's loss spikes: events at the headline rule and the DCA-family / vanilla
    rate ratio at the loosest threshold of the grid."""
    s = _summary(results, "lm_stability")
    head = s["headline"]["groups"]
    loose = s["by_c"][min(s["by_c"], key=float)]["dca_family_vs_vanilla"]["rate_ratio"]
    headline = s["headline"]["dca_family_vs_vanilla"]
    # the claim is a difference in spike rates: with no spike in any architecture at the
    # headline rule the runs could not have shown one, so it is not tested at this budget;
    # otherwise the rate-ratio test decides
    if headline["too_few_to_tell"]:
        rule = NOT_AT_BUDGET
    else:
        ratio, p = headline["rate_ratio"]["ratio"], headline["rate_ratio"]["p_value"]
        rule = REPRODUCED if ratio < 1 and p < ALPHA else INCONCLUSIVE
    return {"headline_c": s["rule"]["c"], "events_at_headline": {k: v["count"] for k, v in
                                                                 head.items()},
            "loose_c": float(min(s["by_c"], key=float)), "loose_rate_ratio": loose["ratio"],
            "loose_p": loose["p_value"], "seed_runs": s["n_seed_runs"], "verdict": rule}


def decode_latency_k2(benchmarks: Path) -> dict:
    """"k = 2 gives 48 % lower inference latency than full DCA": the per-round ratio of
    2-DCA's to DCA's decode latency (rounds alternate the variants, so they pair), as a
    geometric mean with a t interval on the log ratios."""
    b = json.loads((Path(benchmarks) / "lm_decode_w256.json").read_text())
    lat = b["latency_s_per_token"]
    logr = np.log(np.asarray(lat["2-dca"]) / np.asarray(lat["dca"]))
    g = gap(logr)
    paper = b["paper_2dca_over_dca_latency"]
    lo, hi = np.exp(g["ci"])
    return {"ratio": float(np.exp(g["mean"])), "ci": [float(lo), float(hi)], "p_value":
            g["p_value"], "rounds": g["n"], "paper_ratio": paper, "depth": b["config"]["depth"],
            "width": b["config"]["width"], "backend": b["machine_before"]["backend"],
            "verdict": NOT_REPRODUCED if lo > paper else (REPRODUCED if hi < 1 else
                                                          INCONCLUSIVE)}


def laurel_lr(results: Path) -> dict:
    """The reviewers' LAuReL-LR: measured only if a related-work run of it is committed."""
    rows = _summary(results, "lm_related_work")["datasets"]["shakespeare"]["rows"]
    if "laurel_lr" not in rows:
        return {"measured": False, "verdict": NOT_TESTED}
    g = gap(log_ppl_gap(rows["laurel_lr"]["test_ppl_per_seed"], rows["dca"]["test_ppl_per_seed"]))
    return {"measured": True, "dca_minus_laurel_lr": g, "verdict": verdict(g)}


def vit_table8(results: Path) -> dict:
    """Table 8: DCA - vanilla ViT test accuracy (points) on the digits, paired by seed."""
    s = _summary(results, "vit_digits")
    acc = [100.0 * a for a in s["paired_dca_minus_vanilla"]["test_acc"]["per_seed"]]
    g = gap(acc)
    paper = s["paper_table8"]
    paper = 100.0 * (paper["dca"]["accuracy"] - paper["vanilla"]["accuracy"])
    return {**g, "paper_points": paper, "verdict": verdict(g, direction=1)}


def not_tested(what_would_test: str, *, bears_on_it: str | None = None) -> dict:
    """A claim without a measurement: the verdict, what would test it and, where the
    pre-registered grid bears on it, that grid's outcome (``bears_on_it``)."""
    out = {"verdict": NOT_TESTED, "would_test": what_would_test}
    return out | {"preregistered": bears_on_it} if bears_on_it else out


def _evidence(results: Path) -> dict | None:
    path = Path(results) / "lm_evidence" / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def registered_label(results: Path) -> str:
    """The pre-registered width-slope outcome in one line: the rule's verdict with the slope
    and its interval, or :data:`PENDING` while a registered width is missing."""
    s = _evidence(results)
    if s is None:
        return PENDING
    d = s["datasets"].get(s["primary_data"], {}).get("decision", {"verdict": "pending"})
    if d["verdict"] not in REGISTERED:
        return PENDING
    lo, hi = d["ci"]
    return (f"{d['verdict']} (slope {d['slope']:+.2f} [{lo:+.2f}, {hi:+.2f}] per doubling, "
            f"evidence_design.md)")


def _from_summary(g: dict) -> dict:
    """A per-width comparison of the evidence summary in :func:`gap`'s keys."""
    return {"mean": g["mean"], "ci": g["ci95"], "p_value": g["p_value"], "p_holm": g["p_holm"],
            "n": g["n"], "lower": g["b_lower_seeds"], "per_pair": g["per_seed"]}


def evidence_preregistered(results: Path) -> dict:
    """The pre-registered grid (``paper/05_lm/evidence_design.md``): H1 the width slope, by the
    registered rule; H2 DCA against the parameter-matched vanilla per width (Holm over the
    widths, the summary's own), holding as far as its weakest width; both :data:`PENDING`
    until every registered width has run. H3 (the gates, default - paper's, on every corpus
    that ran; Holm over the corpora, and the corpora's gaps compared pairwise) is two-sided
    and not a claim of the paper, so it is reported without a verdict label."""
    s = _evidence(results)
    if s is None:
        return {"verdict": {"H1 gain shrinks with width": PENDING,
                            "H2 DCA beats matched vanilla": PENDING}}
    data = s["datasets"]
    primary = data.get(s["primary_data"], {})
    decision = primary.get("decision", {"verdict": "pending"})
    decided = decision["verdict"] in REGISTERED
    matched = {w: _from_summary(g) for w, g in primary.get("comparisons", {})
               .get("dca-vanilla_matched", {}).get("test_D", {}).items()}
    matched = {w: {**g, "verdict": verdict(g)} for w, g in matched.items()}
    gates = {f"{name} w{w}": _from_summary(g) for name, d in data.items()
             for w, g in d["comparisons"].get("dca-dca_paper", {}).get("test_D", {}).items()}
    gates = gap_family(gates, "H3: default - paper's gate, every corpus and width")
    return {"decision": decision, "dca_minus_matched": matched,
            # the registered secondary slope of D(dca - matched vanilla) on log2(width)
            "dca_minus_matched_slope": primary.get("comparisons", {})
            .get("dca-vanilla_matched", {}).get("slope"),
            # the rule applied to the paper's-gate arm: post hoc, reported, never a verdict
            "paper_gate_by_the_rule_post_hoc": primary.get("paper_gate_by_the_rule_post_hoc"),
            "default_minus_paper_gate": gates, "corpora_run": sorted(data),
            # whether the gate gap differs between corpora (Welch, Holm over the pairs)
            "gate_by_tokenisation": s.get("gate_by_tokenisation"),
            "missing_runs": len(s["missing_runs"]),
            "verdict": {"H1 gain shrinks with width": REGISTERED.get(decision["verdict"],
                                                                     PENDING),
                        "H2 DCA beats matched vanilla": (weakest(g["verdict"] for g in
                                                                 matched.values())
                                                         if decided else PENDING)}}


def all_verdicts(results: str | Path = "experiments/results",
                 benchmarks: str | Path = "benchmarks/results") -> dict:
    """Every claim's numbers, keyed by claim."""
    r = Path(results)
    return {
        "pooled_dca_vs_vanilla": pooled_dca_vs_vanilla(r),
        "table7_ablation": table7_ablation(r),
        "table5_related_work": table5_related_work(r),
        "table2_width": table2_width(r),
        "table3_model_scaling": not_tested(
            "8-DCA against the transformer at several model sizes on a data-rich corpus; the "
            "pre-registered width slope (full DCA) bears on its shrinking gain",
            bears_on_it=registered_label(r)),
        "table6_c4_related_work": not_tested(
            "8-DCA against LAuReL-PA, DenseFormer and Hyper-Connections (stack 4 and 10) on a "
            "data-rich corpus"),
        "figure6_depth": figure6_depth(r),
        "table1_k": table1_k(r),
        "figures78_equal_time": figures78_equal_time(r),
        "decode_latency_k2": decode_latency_k2(Path(benchmarks)),
        "table9_inputs": table9_inputs(r),
        "table4_retrofit": table4_retrofit(r),
        "figure10_weights": figure10_weights(r),
        "stability_spikes": stability_spikes(r),
        "laurel_lr": laurel_lr(r),
        "vit_table8": vit_table8(r),
        "evidence_preregistered": evidence_preregistered(r),
    }
