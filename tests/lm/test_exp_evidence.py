"""lm_evidence: its settings and specs (fast), its statistics on synthetic records,
and (slow) the quick mode end to end with the figure."""

from __future__ import annotations

import numpy as np
import pytest

from dca_theory.cli import main as cli_main
from dca_theory.lab import lm_evidence as E
from dca_theory.lab import lm_evidence_analysis as A
from dca_theory.lm.params import non_embedding_count


def test_full_grid_arms_widths_budget_and_matched_arm():
    s = E.EvidenceSettings.preset(False)
    specs = E.grid_specs(s, False, {w: 2e-3 for w in s.widths})
    primary = {k: v for k, v in specs.items() if k[0] == "ptb-char" and k[1] in E.ARMS}
    assert len(primary) == 12 and len(s.seeds) >= 4
    for (_, arm, w), spec in primary.items():
        t = spec.train
        assert t.steps * t.batch_size * t.seq_len >= 8_000_000 and t.eval_batches is None
        assert spec.model.n_layers == 4 and spec.model.d_model == w and spec.final_batches is None
    # the matched arm's trunk is DCA's to within half an MLP unit (4 (2D + 1) / 2)
    for w in s.widths:
        dca = primary[("ptb-char", "dca", w)].model.replace(vocab_size=50)
        matched = primary[("ptb-char", "vanilla_matched", w)].model.replace(vocab_size=50)
        assert abs(non_embedding_count(matched) - non_embedding_count(dca)) <= 2 * (2 * w + 1)
        assert primary[("ptb-char", "dca", w)].model.grn_gate == "bias_inside"
        assert primary[("ptb-char", "dca_paper", w)].model.grn_gate == "paper"
    assert {k[0] for k in specs} == {"ptb-char", "python-stdlib", "python-stdlib-bpe"}
    # the related-work arms: width 32 on the primary data, with width 32's rate and DCA's budget
    related = {k: v for k, v in primary.items() if k[1] in E.RELATED_ARMS}
    assert related == {}  # not counted among the 12 above: they come after the secondary grid
    rel = {arm: specs[("ptb-char", arm, 32)] for arm in E.RELATED_ARMS}
    for arm, spec in rel.items():
        assert spec.model.residual == arm and spec.model.d_model == 32
        assert spec.train == primary[("ptb-char", "dca", 32)].train
        assert spec.seeds == primary[("ptb-char", "dca", 32)].seeds
    assert list(specs)[-4:] == [("ptb-char", arm, 32) for arm in E.RELATED_ARMS]


@pytest.mark.parametrize("item, message", [
    ("arms=vanilla,dcaa", "unknown arm 'dcaa'; valid: vanilla, dca, dca_paper, vanilla_matched"),
    ("arms=dca,dca_paper", "arms must include vanilla"),
    ("lr_by_width=1e-3", "lr_by_width needs one rate per width (2), got 1"),
    ("secondary_width=32", "secondary_width 32 must be one of widths 8,16"),
    ("widths=8,15", "width 15 is not divisible by n_heads=2"),
    ("sweep_seeds=0,0", "sweep_seeds must be distinct integers >= 0, got 0,0"),
    ("lr_by_width=1e-3,0", "lr_by_width must be rates > 0, got 0.001,0.0"),
    ("related_arms=attn_res,dca", "unknown related arm 'dca'; valid: attn_res, mhc, muddformer, "
                                  "value_residual"),
    ("related_width=32", "related_width 32 must be one of widths 8,16"),
])
def test_bad_settings_are_one_line_errors(item, message, capsys):
    assert cli_main(["run", "lm_evidence", "--quick", "--set", item, "--show"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def _record(ppl_by_seed, history=()):
    ppl = np.asarray(ppl_by_seed, float)
    return {"test_ppl": ppl.tolist(), "valid_ppl": ppl.tolist(),
            "valid_history": [{"step": s, "valid_ppl": (ppl * f).tolist()} for s, f in history]}


def _three_widths(seed: int, shifts) -> dict:
    """Synthetic runs at widths 16, 32, 64 with 6 seeds: vanilla at ln ppl about 3, and each
    arm in ``shifts`` moved by ``shift(i, noise)`` points at the i-th width (one seed-noise
    draw per width, shared by the arms)."""
    rng = np.random.default_rng(seed)
    records = {}
    for i, w in enumerate((16, 32, 64)):
        base = 3.0 + rng.normal(0, 0.01, 6)
        noise = rng.normal(0, 0.05, 6)
        records[("vanilla", w)] = _record(np.exp(base))
        for arm, shift in shifts.items():
            records[(arm, w)] = _record(np.exp(base + shift(i, noise) / 100))
    return records


def test_decision_rule_on_synthetic_records():
    # D(dca - vanilla) = -2, -1, 0 points at widths 16, 32, 64 for every seed but with seed
    # noise, so the slope is +1 per doubling; DCA beats the matched arm by about 2 points everywhere
    records = _three_widths(0, {"dca": lambda i, noise: -2 + i + noise,
                                "vanilla_matched": lambda i, noise: i + noise / 2})
    gaps = A.per_width_gaps(records, "dca", "vanilla")
    assert gaps["16"]["mean"] == pytest.approx(-2, abs=0.1)
    slope = A.slope(gaps, range(6))
    assert slope["slope"] == pytest.approx(1.0, abs=0.1) and slope["ci"][0] > 0
    matched = A.per_width_gaps(records, "dca", "vanilla_matched")
    assert A.decision(slope, matched)["verdict"] == "supported"
    flat = {"slope": 0.02, "ci": [-0.1, 0.1]}
    assert A.decision(flat, matched)["verdict"] == "contradicted at this scale"
    assert A.decision({"slope": 0.3, "ci": [-0.1, 0.7]}, matched)["verdict"] == "inconclusive"
    # Holm over the three widths never lowers a p-value
    assert all(g["p_holm"] >= g["p_value"] for g in gaps.values())
    # with every registered width present the rule decides as without the check
    assert A.decision(slope, matched, (16, 32, 64), gaps)["verdict"] == "supported"


def test_the_paper_gate_arm_gets_the_same_rule_post_hoc_and_the_registered_one_is_unchanged():
    # DCA (default gate) flat at -1 everywhere; the paper's gate -3, -2, -1 and 1 point better
    # than the matched arm: only the post-hoc entry is "supported"
    records = _three_widths(2, {"vanilla_matched": lambda i, noise: -2 + i + noise,
                                "dca": lambda i, noise: -1 + noise,
                                "dca_paper": lambda i, noise: -3 + i + noise})
    curves = {k: {"step_time": np.ones(2), "eval_steps": np.array([1, 2]),
                  "eval_valid_loss": np.full((2, 6), 1.0)} for k in records}
    out = A.summarise(records, curves, {k: 1 for k in records}, range(6), 1, primary=True,
                      widths=(16, 32, 64))
    assert out["decision"]["verdict"] == "contradicted at this scale"
    post = out["paper_gate_by_the_rule_post_hoc"]
    assert post["verdict"] == "supported" and post["slope"] == pytest.approx(1.0, abs=0.1)


def test_the_decision_waits_for_every_registered_width():
    # widths 16 and 32 trained, 64 not: a clear two-width slope is interim, never a verdict
    records = {}
    for i, w in enumerate((16, 32)):
        base = np.full(6, 3.0) + np.arange(6) * 0.01
        records[("vanilla", w)] = _record(np.exp(base))
        records[("dca", w)] = _record(np.exp(base + (-3 + 2 * i) / 100))
        records[("vanilla_matched", w)] = _record(np.exp(base + (-2 + 2 * i) / 100))
    gaps = A.per_width_gaps(records, "dca", "vanilla")
    slope = A.slope(gaps, range(6))
    matched = A.per_width_gaps(records, "dca", "vanilla_matched")
    d = A.decision(slope, matched, (16, 32, 64), gaps)
    assert d["verdict"] == "pending" and d["missing_widths"] == [64]
    assert d["interim_slope"]["widths"] == [16, 32]
    assert d["interim_slope"]["slope"] == pytest.approx(2.0, abs=1e-6)
    # the matched arm missing at a width also keeps the rule waiting
    del matched["32"]
    assert A.decision(slope, matched, (16, 32), gaps)["missing_widths"] == [32]


def test_related_arms_are_holm_adjusted_over_the_arms_of_a_width():
    rng = np.random.default_rng(1)
    base = 3.0 + rng.normal(0, 0.01, 6)
    shift = {"vanilla": 0.0, "dca": -2.0, "attn_res": -1.0, "mhc": -1.5, "muddformer": 0.0}
    records = {(arm, 32): _record(np.exp(base + (d + rng.normal(0, 0.2, 6)) / 100))
               for arm, d in shift.items()}
    out = A.related(records, ["attn_res", "mhc", "muddformer"])
    assert set(out) == {"vanilla", "dca"}
    assert set(out["dca"]) == {"attn_res-w32", "mhc-w32", "muddformer-w32"}
    assert out["dca"]["muddformer-w32"]["mean"] == pytest.approx(2.0, abs=0.3)
    assert out["vanilla"]["mhc-w32"]["mean"] == pytest.approx(-1.5, abs=0.3)
    p = {k: r["p_value"] for k, r in out["vanilla"].items()}
    assert [out["vanilla"][k]["p_holm"] for k in p] == A.st.holm(list(p.values()))


def test_the_gates_by_tokenisation_compare_corpora_unpaired_and_holm_adjusted():
    # gate gap G = D(dca - dca_paper) at width 32: about +3 on "chars", +3 on "bytes", -3 on
    # "bpe" (seed noise sd 0.5): only the pairs with "bpe" differ
    rng = np.random.default_rng(5)

    def corpus(g):
        base = 3.0 + rng.normal(0, 0.01, 6)
        records = {("dca_paper", 32): _record(np.exp(base)),
                   ("dca", 32): _record(np.exp(base + (g + rng.normal(0, 0.5, 6)) / 100))}
        return {"comparisons": {"dca-dca_paper": {"test_D": A.per_width_gaps(
            records, "dca", "dca_paper")}}}

    data = {"chars": corpus(3.0), "bytes": corpus(3.0), "bpe": corpus(-3.0),
            "no gate arms": {"comparisons": {}}}
    out = A.gate_by_tokenisation(data, 32)
    assert list(out["G"]) == ["chars", "bytes", "bpe"]
    assert set(out["pairs"]) == {"bytes - chars", "bpe - chars", "bpe - bytes"}
    assert out["pairs"]["bpe - chars"]["mean"] == pytest.approx(-6.0, abs=1.0)
    assert out["pairs"]["bpe - chars"]["p_holm"] < 0.05
    assert out["pairs"]["bytes - chars"]["ci95"][0] < 0 < out["pairs"]["bytes - chars"]["ci95"][1]
    p = [r["p_value"] for r in out["pairs"].values()]
    assert [r["p_holm"] for r in out["pairs"].values()] == A.st.holm(p)
    assert out["depends_on_tokenisation"] is True
    same = A.gate_by_tokenisation({k: data[k] for k in ("chars", "bytes")}, 32)
    assert same["depends_on_tokenisation"] is False
    assert A.gate_by_tokenisation({"chars": data["chars"]}, 32)["depends_on_tokenisation"] is None
    assert A.gate_by_tokenisation(data, 64)["pairs"] == {}


def test_the_figure_shows_every_corpus_and_the_gate_comparison(tmp_path):
    import csv
    import json

    from figures import fig_lm_evidence

    arms = {"dca": lambda i, noise: -2 + i + noise, "dca_paper": lambda i, noise: -3 + noise / 3,
            "vanilla_matched": lambda i, noise: i + noise}
    datasets = {}
    for name, seed in (("chars", 6), ("bytes", 7)):
        records = _three_widths(seed, arms)
        if name == "bytes":  # a secondary corpus: width 32 only
            records = {k: r for k, r in records.items() if k[1] == 32}
        curves = {k: {"step_time": np.ones(2), "eval_steps": np.array([1, 2]),
                      "eval_valid_loss": np.full((2, 6), 1.0)} for k in records}
        datasets[name] = A.summarise(records, curves, {k: 1 for k in records}, range(6), 1,
                                     primary=name == "chars", widths=(16, 32, 64))
    summary = {"primary_data": "chars", "datasets": datasets,
               "gate_by_tokenisation": A.gate_by_tokenisation(datasets, 32)}
    (tmp_path / "lm_evidence").mkdir()
    (tmp_path / "lm_evidence" / "summary.json").write_text(json.dumps(summary))
    paths = fig_lm_evidence.make(tmp_path / "fig", tmp_path)
    with open(tmp_path / "fig" / "fig_lm_evidence.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["data"], r["width"]) for r in rows if r["comparison"] == "dca-dca_paper"} == {
        ("chars", "16"), ("chars", "32"), ("chars", "64"), ("bytes", "32")}
    saved = json.loads((tmp_path / "fig" / "fig_lm_evidence.json").read_text())
    assert set(saved["gate_by_tokenisation"]["pairs"]) == {"bytes - chars"}
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv", ".json"}


def test_trajectory_and_equal_time_on_synthetic_curves():
    records = {("vanilla", 16): _record([10.0, 10.0], [(1, 2.0), (2, 1.0)]),
               ("dca", 16): _record([9.0, 9.0], [(1, 2.0), (2, 1.0)])}
    traj = A.trajectory(records, "dca", "vanilla", tokens_per_step=100)
    assert [p["tokens"] for p in traj["16"]] == [100, 200]
    assert traj["16"][1]["D_mean"] == pytest.approx(100 * np.log(0.9), abs=1e-9)
    # DCA's steps take twice as long: at vanilla's end (2 s) DCA has done 1 step
    curves = {("vanilla", 16): {"step_time": np.array([5.0, 1.0]), "eval_steps": np.array([1, 2]),
                                "eval_valid_loss": np.array([[2.0, 2.0], [1.5, 1.5]])},
              ("dca", 16): {"step_time": np.array([9.0, 2.0]), "eval_steps": np.array([1, 2]),
                            "eval_valid_loss": np.array([[1.9, 1.9], [1.4, 1.4]])}}
    eq = A.equal_time(curves, "dca", "vanilla")["16"]
    # vanilla: times 1, 2 (compilation replaced by the median); dca: 2, 4; common time 2 s
    assert eq["time_s"] == 2.0 and eq["D_mean"] == pytest.approx(100 * (1.9 - 1.5))
    assert eq["time_ratio"] == pytest.approx(2.0)


@pytest.mark.slow  # one quick grid (minutes) feeds the three experiments that read it
def test_quick_grid_and_the_experiments_reading_it(tmp_path, monkeypatch, data_dir):
    from dca_theory.io import read_json
    from experiments import lm_evidence
    from figures import fig_lm_evidence

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    run = lm_evidence.main(quick=True, out=tmp_path / "results" / "lm_evidence")
    s = read_json(run / "summary.json")
    assert s["complete"] and set(s["lr_sweep"]) == {"8", "16"}
    # the grid, extended once past an end where the best rate sat there (lr_extend=1)
    assert all(r["lr"] in (1.5e-3, 3e-3, 6e-3, 1.2e-2) for r in s["lr_sweep"].values())
    assert all(len(r["valid_ppl"]) in (2, 3) for r in s["lr_sweep"].values())
    assert set(s["datasets"]) == {"ptb-char", "python-stdlib"}
    primary = s["datasets"]["ptb-char"]
    assert len(primary["rows"]) == 9 and primary["decision"]["verdict"] in (
        "supported", "contradicted at this scale", "inconclusive")
    d = primary["comparisons"]["dca-vanilla"]
    assert [len(g["per_seed"]) for g in d["test_D"].values()] == [2, 2]
    assert [p["tokens"] for p in d["trajectory"]["8"]] == [10 * 8 * 32, 20 * 8 * 32]
    assert primary["power_law"]["fit"] is None or primary["power_law"]["fit"]["n_points"] == 4
    assert set(primary["related"]["dca"]) == {"attn_res-w16"}
    # the quick secondary grid has no paper's-gate arm: one corpus, so H3 is not read across
    assert s["gate_by_tokenisation"]["depends_on_tokenisation"] is None
    paths = fig_lm_evidence.make(tmp_path / "fig", tmp_path / "results")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv", ".json"}
    _check_rank_run(tmp_path, s)  # reads the grid's parameters: trains nothing
    _check_lr_run(tmp_path)  # trains the arms the grid lacks, reuses its sweep


def _check_rank_run(tmp_path, grid):
    """lm_evidence_rank on the quick grid: effective ranks, and the grid's own gap D."""
    from dca_theory.io import read_json
    from experiments import lm_evidence_rank as E
    from figures import fig_lm_evidence_rank

    run = E.main(quick=True, out=tmp_path / "results" / "lm_evidence_rank")
    s = read_json(run / "summary.json")
    assert s["widths"] == [8, 16] and s["complete"] and s["primary"]["n"] == 4
    for cell in s["cells"]:
        for kind in ("vanilla", "dca"):
            for part in ("attn", "mlp", "update"):
                assert 0.0 < cell[f"{kind}_{part}_eff_rank_frac"] <= 1.0  # eff. rank <= D
    # D is the grid's own gap, seed by seed (the same test perplexities the grid recorded)
    grid_d = grid["datasets"]["ptb-char"]["comparisons"]["dca-vanilla"]["test_D"]
    for w in (8, 16):
        ours = [c["D"] for c in s["cells"] if c["width"] == w]
        np.testing.assert_allclose(ours, grid_d[str(w)]["per_seed"], rtol=0, atol=1e-9)
        assert len(s["dca_minus_vanilla_by_width"][str(w)]["update"]["per_seed"]) == 2
    paths = fig_lm_evidence_rank.make(tmp_path / "fig", tmp_path / "results")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv", ".json"}


def _check_lr_run(tmp_path):
    """lm_evidence_lr on the quick grid: vanilla at the shared rate is the grid's sweep run."""
    import math

    from dca_theory.io import read_json
    from experiments import lm_evidence_lr as L

    cache = tmp_path / "results" / "lm_runs"
    before = {p.name for p in cache.iterdir()}
    run = L.main(quick=True, out=tmp_path / "results" / "lm_evidence_lr")
    s, runs = read_json(run / "summary.json"), read_json(run / "config.json")["runs"]
    new = {p.name for p in cache.iterdir()} - before
    # vanilla at the shared rate is the grid's own sweep run, read from its cache
    assert {runs[f"vanilla-w{w}-x1"] for w in s["widths"]} <= before
    full = {r["key"] for r in s["full_budget"].values()}
    assert new and new <= set(runs.values()) | full
    for w, r in s["full_budget"].items():  # DCA's own best rate, trained like the grid's arm
        assert r["rate"] == s["widths"][w]["arms"]["dca"]["best_rate"]
        assert r["rate"] != s["widths"][w]["arms"]["dca"]["shared_rate"]
        # D(own) - D(shared) is DCA's own-rate run against its shared-rate run, seed by seed
        assert [a - b for a, b in zip(r["D_own_rate"]["per_seed"],
                                      r["D_shared_rate"]["per_seed"])] == pytest.approx(
            r["own_minus_shared_rate"]["per_seed"], abs=1e-9)
    for w, row in s["widths"].items():
        shared = row["arms"]["vanilla"]["shared_rate"]
        assert set(row["arms"]) == {"vanilla", "dca"}
        assert row["arms"]["dca"]["handicap"] >= 0
        assert row["D_at_shared_rate"]["rates"] == {"dca": shared, "vanilla": shared}
        assert len(row["D_at_shared_rate"]["D_per_seed"]) == len(s["seeds"])
        # the quick grid evaluates at the sweep's last step, so every arm has its reproduction
        assert set(row["reproduction"]) == {"vanilla", "dca"}
        for r in row["reproduction"].values():
            assert len(r["per_seed"]) == len(s["seeds"]) and math.isfinite(r["max_abs"])



@pytest.mark.parametrize("diverge_above, extend, tried, best, edge", [
    (None, 3, ["0.001", "0.002", "0.004", "0.008", "0.016", "0.032"], 0.016, False),
    (0.02, 3, ["0.001", "0.002", "0.004", "0.008", "0.016", "0.032"], 0.016, False),
    (None, 0, ["0.001", "0.002", "0.004", "0.008"], 0.008, True),
])
def test_the_sweep_extends_past_the_grid_end_until_the_best_rate_is_interior(
        tmp_path, monkeypatch, diverge_above, extend, tried, best, edge):
    """A validation loss with its minimum at lr = 0.02 (above the grid's 8e-3): the sweep
    doubles past the top until a rate is worse (0.032), or until it diverges there (marked,
    not retried); with ``lr_extend=0`` it stays at the flagged edge."""
    calls = []

    def fake_run(s, cache, log=None):
        lr = s.train.lr
        calls.append(lr)
        if diverge_above is not None and lr > diverge_above:
            raise FloatingPointError("non-finite loss at step 7")
        return {"valid_loss": [float(np.log2(lr / 0.02) ** 2) + 1.0] * 2}

    monkeypatch.setattr(E, "ensure_run", fake_run)
    cfg = E.EvidenceSettings.preset(False).replace(widths=(16,), secondary_width=16,
                                                  related_width=16, lr_extend=extend)
    lrs, missing = E.rates(cfg, False, tmp_path)
    assert not missing and list(lrs[16]["valid_ppl"]) == tried
    assert lrs[16]["lr"] == best and lrs[16]["at_grid_edge"] is edge
    if diverge_above is not None:
        assert lrs[16]["valid_ppl"]["0.032"] == float("inf")
        n = len(calls)
        E.rates(cfg, False, tmp_path)  # the diverged rate is marked and not trained again
        assert 0.032 not in calls[n:]


def test_equal_time_without_overlap_is_none_not_an_error():
    curves = {("vanilla", 8): {"step_time": np.array([1.0, 1.0]), "eval_steps": np.array([1, 2]),
                               "eval_valid_loss": np.array([[2.0], [1.5]])},
              ("dca", 8): {"step_time": np.array([5.0, 5.0]), "eval_steps": np.array([1, 2]),
                           "eval_valid_loss": np.array([[1.9], [1.4]])}}
    eq = A.equal_time(curves, "dca", "vanilla")["8"]
    assert eq["D_mean"] is None and eq["time_ratio"] == pytest.approx(5.0)


def test_a_diverged_grid_run_is_marked_reported_and_not_retried(tmp_path, monkeypatch):
    cfg = E.EvidenceSettings.preset(False)
    s = E.arm_spec(cfg, False, "dca", 16, "ptb-char", 0.064)
    (tmp_path / s.key / "partial" / "checkpoints" / "250").mkdir(parents=True)  # mid-run
    (tmp_path / s.key / "partial.npz").write_bytes(b"checkpoint")  # the older format's
    calls, logged = [], []

    def diverging(spec, cache, log=None):
        calls.append(spec.key)
        raise FloatingPointError("non-finite loss at step 812 for seeds [3] (dca, ptb-char)")

    monkeypatch.setattr(E, "ensure_run", diverging)
    assert E.run_unless_diverged(s, tmp_path, log=lambda **r: logged.append(r)) is None
    assert E.is_diverged(s, tmp_path) and not (tmp_path / s.key / "partial").exists()
    assert not (tmp_path / s.key / "partial.npz").exists()
    assert logged[0]["kind"] == "diverged" and "step 812" in logged[0]["error"]
    assert E.run_unless_diverged(s, tmp_path) is None and calls == [s.key]  # not retried
