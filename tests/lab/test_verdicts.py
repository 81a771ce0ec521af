"""The LM verdict statistics (``dca_theory.lab.verdicts``): Holm on a case worked by hand, the
pooling over configurations on synthetic records, the verdict rule, and the whole table read
from the committed result files (finite numbers, known labels, no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dca_theory.lab import verdicts as V
from dca_theory.lab.statistics import holm

ROOT = Path(__file__).resolve().parents[2]
RESULTS, BENCHMARKS = ROOT / "experiments" / "results", ROOT / "benchmarks" / "results"


def test_holm_matches_a_hand_computed_case():
    # sorted p: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06, kept monotone), 0.5 (x1)
    assert holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06], abs=1e-12)
    fam = V.gap_family({"a": {"p_value": 0.03}, "b": {"p_value": 0.01}}, "two tests")
    assert fam["a"]["p_holm"] == pytest.approx(0.03) and fam["b"]["p_holm"] == pytest.approx(0.02)
    assert fam["a"]["family"] == "two tests"


def test_gap_is_a_one_sample_t_test():
    from scipy import stats

    d = [-1.0, -0.6, -0.8, -0.9]
    g = V.gap(d)
    assert g["p_value"] == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue, rel=1e-12)
    assert g["mean"] == pytest.approx(-0.825, abs=1e-12)
    assert g["ci"][0] < g["mean"] < g["ci"][1] < 0
    assert g["lower"] == 4 and g["n"] == 4
    with pytest.raises(ValueError, match="need >= 2 seed pairs"):
        V.gap([1.0])


def _groups(rng, offsets, seeds=(0, 1, 2, 3), seed_sd=0.3, noise_sd=0.05):
    """Gaps per configuration: a shared seed effect (a seed's data order is shared by every
    configuration) plus small noise around each configuration's offset."""
    seed_effect = dict(zip(seeds, rng.normal(0.0, seed_sd, len(seeds))))
    return {f"c{i}": (list(seeds), [o + seed_effect[s] + rng.normal(0.0, noise_sd)
                                    for s in seeds]) for i, o in enumerate(offsets)}


def test_pooling_clusters_by_seed_and_counts_every_pair():
    groups = _groups(np.random.default_rng(0), [-0.8, -0.8, -0.8])
    pooled = V.pooled_gap(groups)
    every = np.concatenate([d for _, d in groups.values()])
    assert pooled["mean"] == pytest.approx(every.mean(), abs=1e-12)
    assert pooled["n_pairs"] == 12 and pooled["n_seeds"] == 4
    assert pooled["lower"] == int((every < 0).sum())
    # the interval is the t interval over the 4 seed means, not over 12 "independent" pairs
    seed_means = [np.mean([d[i] for _, d in groups.values()]) for i in range(4)]
    assert pooled["ci"] == pytest.approx(V.gap(seed_means)["ci"], abs=1e-12)
    assert pooled["agree"]


def test_pooling_flags_configurations_that_disagree():
    pooled = V.pooled_gap(_groups(np.random.default_rng(1), [-1.0, 0.0, 1.0], seed_sd=0.0))
    assert not pooled["agree"] and pooled["heterogeneity_p"] < 0.05
    with pytest.raises(ValueError, match="differ in length"):
        V.pooled_gap({"c": ([0, 1], [0.1])})


@pytest.mark.parametrize(("gap", "direction", "expected"), [
    ({"mean": -1.0, "p_value": 0.01, "n": 3, "lower": 3, "ci": [-2, -0.1]}, -1, V.REPRODUCED),
    ({"mean": -1.0, "p_value": 0.01, "p_holm": 0.09, "n": 3, "lower": 3, "ci": [-2, -0.1]}, -1,
     V.TREND),
    ({"mean": -0.1, "p_value": 0.5, "n": 3, "lower": 2, "ci": [-1, 1]}, -1, V.INCONCLUSIVE),
    ({"mean": 2.0, "p_value": 0.01, "n": 3, "lower": 0, "ci": [1, 3]}, -1, V.NOT_REPRODUCED),
    ({"mean": 2.0, "p_value": 0.01, "n": 3, "lower": 0, "ci": [1, 3]}, 1, V.REPRODUCED),
])
def test_verdict_rule(gap, direction, expected):
    assert V.verdict(gap, direction) == expected


def test_weakest_and_bad_inputs():
    assert V.weakest([V.REPRODUCED, V.TREND, V.INCONCLUSIVE]) == V.INCONCLUSIVE
    with pytest.raises(ValueError, match="direction must be -1 or 1, got 0"):
        V.verdict({"mean": 1.0, "p_value": 0.1, "n": 2, "lower": 0, "ci": [0, 2]}, 0)
    with pytest.raises(ValueError, match="among"):
        V.weakest(["maybe"])


def _finite_numbers(obj, path=""):
    """Every number in a nested summary, with where it sits."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _finite_numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _finite_numbers(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, obj


def _labels(v):
    return list(v.values()) if isinstance(v, dict) else [v]


@pytest.fixture(scope="module")
def table():
    return V.all_verdicts(RESULTS, BENCHMARKS)


def test_the_table_reads_the_committed_files_with_finite_numbers_and_known_labels(table):
    expected = {"pooled_dca_vs_vanilla", "table7_ablation", "table5_related_work",
                "table2_width", "table3_model_scaling", "table6_c4_related_work",
                "figure6_depth", "table1_k", "figures78_equal_time", "decode_latency_k2",
                "table9_inputs", "table4_retrofit", "figure10_weights", "stability_spikes",
                "laurel_lr", "vit_table8", "evidence_preregistered"}
    assert set(table) == expected
    for claim, numbers in table.items():
        for label in _labels(numbers["verdict"]):
            # only the pre-registered grid may still be training
            known = V.VERDICTS + ((V.PENDING,) if claim == "evidence_preregistered" else ())
            assert label in known, (claim, label)
        for where, x in _finite_numbers(numbers):
            assert math.isfinite(x), f"{claim}{where} = {x}"
    # the runs that could not show an effect are labelled so, whatever their numbers
    assert table["table7_ablation"]["verdict"]["ptb"] == V.NOT_AT_BUDGET
    assert table["table1_k"]["verdict"]["3x faster"] == V.NOT_AT_BUDGET
    # no spike in any architecture: nothing the runs could have compared
    spikes = table["stability_spikes"]
    assert sum(spikes["events_at_headline"].values()) == 0
    assert spikes["verdict"] == V.NOT_AT_BUDGET
    # equal time: the claim must hold in each test, so it takes the weakest of them
    eq = table["figures78_equal_time"]
    assert eq["verdict"] == V.weakest(g["verdict"] for g in eq["at_vanilla_end"].values())
    # the near-convergence slope's sign is a post-hoc reading, never one of the verdicts
    near = table["table2_width"]["near_convergence_slope"]
    assert "sign_by_the_table_rule_post_hoc" in near
    assert not any("near convergence" in k for k in table["table2_width"]["verdict"])
    # the per-seed parameter multiplier's interval holds its geometric mean
    for m in table["figure6_depth"]["vanilla_param_multiplier_per_seed"].values():
        assert m["ci"][0] <= m["geometric_mean"] <= m["ci"][1] and m["n"] >= 2
    # the width claim quotes the pre-registered grid's own outcome, whatever it is
    decision = json.loads((RESULTS / "lm_evidence" / "summary.json").read_text())[
        "datasets"]["ptb-char"]["decision"]
    assert table["table2_width"]["preregistered"].startswith(
        decision["verdict"] if decision["verdict"] in V.REGISTERED else "pending")


def _evidence_summary(tmp_path, verdict, matched_ci):
    """A minimal lm_evidence summary: the decision and one matched comparison per width."""
    decision = ({"verdict": verdict, "slope": 0.9, "ci": [-0.4, 2.2]} if verdict != "pending"
                else {"verdict": "pending", "missing_widths": [64]})
    test_d = {w: {"mean": sum(ci) / 2, "ci95": ci, "p_value": 0.01 if ci[1] < 0 else 0.2,
                  "p_holm": 0.02 if ci[1] < 0 else 0.2, "n": 6,
                  "b_lower_seeds": 6 if ci[1] < 0 else 5, "per_seed": [ci[0]] * 6}
              for w, ci in matched_ci.items()}
    comps = {"dca-vanilla_matched": {"test_D": test_d}, "dca-dca_paper": {"test_D": test_d}}
    post_hoc = {"verdict": "supported", "slope": 2.4, "ci": [2.1, 2.7]}
    s = {"primary_data": "ptb-char", "missing_runs": [],
         "gate_by_tokenisation": {"width": 32, "depends_on_tokenisation": None},
         "datasets": {"ptb-char": {"decision": decision, "comparisons": comps,
                                   "paper_gate_by_the_rule_post_hoc": post_hoc}}}
    (tmp_path / "lm_evidence").mkdir(parents=True)
    (tmp_path / "lm_evidence" / "summary.json").write_text(json.dumps(s))
    return tmp_path


def test_the_preregistered_row_maps_the_registered_rule_and_waits_while_pending(tmp_path):
    done = _evidence_summary(tmp_path / "a", "inconclusive",
                             {"16": [-3.0, -1.0], "32": [-2.0, 0.5]})
    v = V.evidence_preregistered(done)["verdict"]
    assert v["H1 gain shrinks with width"] == V.INCONCLUSIVE
    # the rule applied to the paper's gate post hoc is reported and decides nothing
    post = V.evidence_preregistered(done)["paper_gate_by_the_rule_post_hoc"]
    assert post["verdict"] == "supported" and "post hoc" not in str(v)
    assert V.evidence_preregistered(done)["gate_by_tokenisation"]["width"] == 32
    # H2 must hold at every width: width 16 alone is reproduced, width 32's interval reaches 0
    assert V.evidence_preregistered(done)["dca_minus_matched"]["16"]["verdict"] == V.REPRODUCED
    assert v["H2 DCA beats matched vanilla"] == V.INCONCLUSIVE
    assert V.registered_label(done).startswith("inconclusive (slope +0.90 [-0.40, +2.20]")
    # the width claim judges the grid's slope by the table's sign rule: CI [-0.4, 2.2] holds 0
    near = V._near_convergence_slope(done)
    assert near["ci"] == [-0.4, 2.2] and V._slope_verdict(*near["ci"]) == V.INCONCLUSIVE
    assert V._slope_verdict(0.1, 2.0) == V.REPRODUCED and V._slope_verdict(-2, -0.1) == \
        V.NOT_REPRODUCED
    pending = _evidence_summary(tmp_path / "b", "pending", {"16": [-3.0, -1.0]})
    assert V._near_convergence_slope(pending) is None
    assert set(V.evidence_preregistered(pending)["verdict"].values()) == {V.PENDING}
    assert V.registered_label(pending) == V.PENDING
    assert set(V.evidence_preregistered(tmp_path / "none")["verdict"].values()) == {V.PENDING}


def test_the_pooled_gap_is_the_mean_of_the_committed_per_seed_perplexities(table):
    # recomputed here from the width and depth summaries, independently of the module
    width = json.loads((RESULTS / "lm_width" / "summary.json").read_text())["widths"]
    depth = json.loads((RESULTS / "lm_depth" / "summary.json").read_text())["depths"]
    rows = {r["dca"]["key"]: r for r in [*width.values(), *depth.values()]}
    d = [100 * math.log(b / a) for r in rows.values()
         for a, b in zip(r["vanilla"]["test_ppl_per_seed"], r["dca"]["test_ppl_per_seed"])]
    pooled = table["pooled_dca_vs_vanilla"]
    assert pooled["n_pairs"] == len(d) and pooled["lower"] == sum(x < 0 for x in d)
    assert pooled["mean"] == pytest.approx(np.mean(d), abs=1e-9)
    assert pooled["ci"][0] < pooled["mean"] < pooled["ci"][1]


def test_holm_is_applied_within_each_family(table):
    fam = table["table7_ablation"]["shakespeare"]
    adjusted = holm([g["p_value"] for g in fam.values()])
    assert [g["p_holm"] for g in fam.values()] == pytest.approx(adjusted, abs=1e-12)
    assert all(g["p_holm"] >= g["p_value"] for g in fam.values())


def test_experiment_writes_its_summary_through_the_run_directory(tmp_path):
    from experiments import lm_verdicts

    with pytest.raises(ValueError, match="results='.*' is not a folder"):
        lm_verdicts.settings(overrides=[f"results={tmp_path / 'absent'}"])
    out = lm_verdicts.main(quick=True, out=tmp_path / "run",
                           overrides=[f"results={RESULTS}", f"benchmarks={BENCHMARKS}"])
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "config.json").exists() and set(summary["claims"]) >= {"table2_width"}
    assert summary["overrides"]["results"] == str(RESULTS)
