"""The decision rules of the second evidence design on synthetic inputs: H4's gate and the
default that follows it, H2's reading, the ranking check, the shared-rate confound and H5's
prediction and scoring (against the registered table of the design)."""

from __future__ import annotations

import numpy as np
import pytest

from dca_theory.lab import lm_evidence2_analysis as A2
from dca_theory.lab import lm_evidence2_theory as T
from dca_theory.lab.statistics import holm

SEEDS = list(range(100, 108))


def _rec(ln_ppl, seeds=SEEDS) -> dict:
    ln = np.asarray(ln_ppl, float)
    return {"seeds": list(seeds), "test_ppl": np.exp(ln).tolist(), "valid_ppl": np.exp(ln).tolist()}


def _gates(shift: dict[str, float], sd: float = 0.3, seed: int = 0, widths=(16, 32, 64)):
    """PTB-char-like records: each gate ``shift`` points from a common base, seed noise ``sd``
    points per (gate, width, seed)."""
    rng = np.random.default_rng(seed)
    recs = {}
    for w in widths:
        base = 1.5 + rng.normal(0, 0.02, len(SEEDS))
        for g, d in shift.items():
            recs[(f"dca_{g}", w)] = _rec(base + (d + rng.normal(0, sd, len(SEEDS))) / 100)
    return recs


def test_h4_a_clear_winner_becomes_the_default():
    recs = _gates({"paper": 0.0, "open": -1.0, "bias_inside": -3.0})
    out = A2.h4(recs, ("paper", "open", "bias_inside"), (16, 32, 64), SEEDS)
    assert list(out["pairs"]) == ["paper-open", "paper-bias_inside", "open-bias_inside"]
    # pair means recover the constructed gaps (noise sd 0.3 / sqrt(3 widths x 8 seeds))
    assert out["pairs"]["paper-bias_inside"]["mean"] == pytest.approx(3.0, abs=0.3)
    assert out["pairs"]["open-bias_inside"]["mean"] == pytest.approx(2.0, abs=0.3)
    # Holm over the three pairs, in their order
    p = [r["p_value"] for r in out["pairs"].values()]
    assert [r["p_holm"] for r in out["pairs"].values()] == holm(p)
    assert out["winner"] == "bias_inside" and out["default_gate"] == "bias_inside"
    # the gate means are consistent with the pairs (same seeds and widths)
    m = out["gate_mean"]
    assert m["paper"] - m["bias_inside"] == pytest.approx(
        out["pairs"]["paper-bias_inside"]["mean"], abs=1e-9)
    assert set(out["by_width"]) == {"16", "32", "64"}


def test_h4_no_winner_falls_back_to_paper_unless_paper_is_resolved_worse():
    # open and bias_inside tie, both 3 points below paper: no winner, paper resolved worse
    recs = _gates({"paper": 0.0, "open": -3.0, "bias_inside": -3.0}, seed=1)
    out = A2.h4(recs, ("paper", "open", "bias_inside"), (16, 32, 64), SEEDS)
    assert out["winner"] is None and "paper" not in out["not_resolved_worse"]
    assert out["default_gate"] == out["lowest_mean"] and out["default_gate"] != "paper"
    # every gate within noise: paper, the paper's printed form
    recs = _gates({"paper": 0.1, "open": 0.0, "bias_inside": 0.0}, seed=2)
    out = A2.h4(recs, ("paper", "open", "bias_inside"), (16, 32, 64), SEEDS)
    assert out["winner"] is None and out["default_gate"] == "paper"


def test_default_gate_rule_on_constructed_pairs():
    def pair(mean, p):
        return {"mean": mean, "p_holm": p}

    # paper beats both at Holm p < 0.05: it wins
    pairs = {"paper-open": pair(-2, 0.01), "paper-bias_inside": pair(-3, 0.001),
             "open-bias_inside": pair(-1, 0.2)}
    out = A2.default_gate(pairs, {"paper": 0.0, "open": 2.0, "bias_inside": 3.0})
    assert out["winner"] == "paper" and out["default_gate"] == "paper"
    # open lowest, beats bias_inside but not paper (p 0.06): paper not resolved worse -> paper
    pairs = {"paper-open": pair(1, 0.06), "paper-bias_inside": pair(-1, 0.3),
             "open-bias_inside": pair(-2, 0.01)}
    out = A2.default_gate(pairs, {"paper": 1.0, "open": 0.0, "bias_inside": 2.0})
    assert out["winner"] is None and out["lowest_mean"] == "open"
    assert out["not_resolved_worse"] == ["paper", "open"] and out["default_gate"] == "paper"
    # the same with paper resolved worse than open: open
    pairs["paper-open"] = pair(1, 0.04)
    out = A2.default_gate(pairs, {"paper": 1.0, "open": 0.0, "bias_inside": 2.0})
    assert out["default_gate"] == "open" and out["not_resolved_worse"] == ["open"]


def test_h2_outcome_reads_the_interval_and_the_holm_p():
    assert A2.h2_outcome({"ci95": [-3, -1], "p_value": 0.001, "p_holm": 0.003}) == A2.BEATS
    assert A2.h2_outcome({"ci95": [-3, -0.1], "p_value": 0.03, "p_holm": 0.09}) == A2.INCONCLUSIVE
    assert A2.h2_outcome({"ci95": [0.5, 2], "p_value": 0.01, "p_holm": 0.02}) == A2.WORSE
    # outside the Holm family (width 128) the raw p stands in
    assert A2.h2_outcome({"ci95": [-3, -1], "p_value": 0.01, "p_holm": None}) == A2.BEATS
    # per width, Holm over the family widths only; seeds paired across unequal counts
    rng = np.random.default_rng(3)
    recs = {}
    for w, n in ((16, 12), (32, 12), (64, 8), (128, 4)):
        seeds = list(range(100, 100 + n))
        base = 1.5 + rng.normal(0, 0.02, n)
        recs[("vanilla_matched", w)] = _rec(base, seeds)
        recs[("dca_paper", w)] = _rec(base - (2 + rng.normal(0, 0.5, n)) / 100, seeds)
    recs[("dca_paper", 16)] = _rec(np.log(recs[("dca_paper", 16)]["test_ppl"])[:8], SEEDS)
    out = A2.h2(recs, "dca_paper", (16, 32, 64))
    assert [out[w]["n"] for w in ("16", "32", "64", "128")] == [8, 12, 8, 4]
    assert out["128"]["p_holm"] is None
    fam = [out[w]["p_value"] for w in ("16", "32", "64")]
    assert [out[w]["p_holm"] for w in ("16", "32", "64")] == holm(fam)
    assert all(out[w]["outcome"] == A2.BEATS for w in ("16", "32", "64"))


def test_ranking_check_and_shared_rate():
    full = {"vanilla": {0.032: 1.500, 0.016: 1.503}, "dca_paper": {0.016: 1.504, 0.008: 1.500}}
    out = A2.ranking_check(full, {"vanilla": 0.032, "dca_paper": 0.016}, 0.5)
    assert out["arms"]["vanilla"]["holds"] and out["arms"]["dca_paper"]["holds"]  # 0.4 <= 0.5
    assert out["arms"]["dca_paper"]["points_best_minus_second"] == pytest.approx(0.4)
    assert out["passed"]
    full["dca_paper"][0.016] = 1.506
    assert not A2.ranking_check(full, {"vanilla": 0.032, "dca_paper": 0.016}, 0.5)["passed"]
    # the confound: dca_paper at vanilla's rate 1.5 points worse than at its own, 6 seeds
    six = SEEDS[:6]
    recs, shared = {}, {}
    for w in (16, 32):
        base = np.full(12, 1.5) + np.arange(12) * 0.001
        recs[("vanilla", w)] = _rec(base, range(100, 112))
        recs[("vanilla_matched", w)] = _rec(base + 0.01, range(100, 112))
        recs[("dca_paper", w)] = _rec(base - 0.02, range(100, 112))
        shared[w] = _rec(base[:6] - 0.02 + 0.015 + np.arange(6) * 1e-4, six)
    out = A2.shared_rate(recs, shared, (16, 32), six)
    assert out["confound"]["16"]["mean"] == pytest.approx(1.5 + 0.025, abs=1e-6)
    assert out["confound"]["16"]["n"] == 6
    # at the shared rate, D against the matched vanilla: -0.5 - 1 points, plus the drift
    assert out["h2_at_shared_rate"]["32"]["mean"] == pytest.approx(-1.5 + 0.025, abs=1e-6)


def test_h5_prediction_reproduces_the_registered_table():
    # evidence_design_2.md: widths 16 / 32 / 64, r_*/d 0.398 / 0.418 / 0.453
    rows = {16: (0.416, 0.05, 0.0, 0.50, 0.49), 32: (0.371, 0.0, 0.0, 0.45, 0.44),
            64: (0.338, 0.0, 0.0, 0.37, 0.37)}
    frac = {16: 0.398, 32: 0.418, 64: 0.453}
    for d, (thr, g2, g3, g2_08, g3_08) in rows.items():
        p = T.prediction("grn_v2", d, frac[d] * d, 0.5)
        assert p["threshold_frac"] == pytest.approx(thr, abs=5e-4)
        assert p["guaranteed_size"] == pytest.approx(g2, abs=5e-3)
        assert p["gain_guaranteed"] == (d == 16)  # the registered prediction: width 16 only
        assert T.prediction("grn_v3", d, frac[d] * d, 0.5)["guaranteed_size"] == pytest.approx(
            g3, abs=5e-3)
        assert T.prediction("grn_v2", d, frac[d] * d, 0.8)["guaranteed_size"] == pytest.approx(
            g2_08, abs=5e-3)
        assert T.prediction("grn_v3", d, frac[d] * d, 0.8)["guaranteed_size"] == pytest.approx(
            g3_08, abs=5e-3)
    assert not T.prediction("grn_v3", 16, 0.398 * 16, 0.5)["gain_guaranteed"]


def test_h5_scores_each_cell():
    assert [T.score(True, True), T.score(True, False), T.score(False, True),
            T.score(False, False)] == [T.HIT, T.MISS, T.UNEXPLAINED, T.CONSISTENT]
    ranks = {("ptb-char", 16): {"update_frac": [0.39, 0.406], "layers": 4},
             ("ptb-char", 32): {"update_frac": [0.42, 0.42], "layers": 4},
             ("ptb-char", 64): {"update_frac": [0.45, 0.45], "layers": 4}}
    gap = {"16": {"mean": -2.0, "ci95": [-3, -1], "outcome": A2.BEATS},
           "32": {"mean": -1.0, "ci95": [-3, -0.5], "outcome": A2.BEATS},
           "64": {"mean": 0.5, "ci95": [-1, 2], "outcome": A2.INCONCLUSIVE}}
    out = T.h5(ranks, {("ptb-char", "dca_paper"): gap}, (0.5, 0.3, 0.8), "ptb-char")
    cells = out["cells"]
    assert cells["ptb-char/dca_paper/w16"]["score"] == T.HIT
    assert cells["ptb-char/dca_paper/w32"]["score"] == T.UNEXPLAINED
    assert cells["ptb-char/dca_paper/w64"]["score"] == T.CONSISTENT
    # the collective rank (4 layers) is above the width: nothing guaranteed at any kappa
    assert not any(p["gain_guaranteed"] for c in cells.values()
                   for p in c["collective_rank_prediction"].values())
    # kappa 0.8 guarantee falls with width while the gain (-D) falls: rho = +1
    assert out["spearman_guarantee_vs_gain"]["rho"] == pytest.approx(1.0)
