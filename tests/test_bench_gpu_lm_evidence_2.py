"""``benchmarks/gpu_lm_evidence_2.py`` (the GPU version of the second evidence design): its
FLOP plan against the design's budget, the rate rule, the summary's rules on synthetic runs,
and a dry run on the CPU at tiny size (every arm trains, is scored and paired)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_scripts import load


@pytest.fixture(scope="module")
def bench():
    return load("gpu_lm_evidence_2")


@pytest.mark.parametrize("argv, bad", [(["--seeds", "0"], "--seeds"),
                                       (["--widths", "30"], "width 30"),
                                       (["--arms", "dca_open"], "arm 'dca_open' is not among"),
                                       (["--rate64", "dca=1e-3", "--rates-from", "none"],
                                        "--rate64 expects ARM=LR")])
def test_bad_arguments_are_one_line_errors(bench, argv, bad):
    with pytest.raises(SystemExit, match=bad):
        bench.main(argv)


def test_the_plan_is_the_design_budget_and_width_1024_needs_one_call_per_arm(bench, tmp_path):
    out = tmp_path / "plan.json"
    p = bench.main(["--plan", "--json", str(out)])["plan"]
    assert set(p["rows"]) == {f"{a}-w{w}" for a in ("vanilla", "vanilla_matched", "dca_paper")
                              for w in (64, 128, 256, 512, 1024)}
    w1024 = [p["rows"][f"{a}-w1024"] for a in ("vanilla", "vanilla_matched", "dca_paper")]
    # 6 N T with N ~ 12 d^2 L = 50M and T = 4 seeds x 50M tokens: ~6e16 per arm (+ attention)
    assert all(6.0e16 < r["flops"] < 6.6e16 for r in w1024)
    assert sum(r["seconds"] for r in w1024) > 600 > max(r["seconds"] for r in w1024)
    assert all(p["rows"][f"vanilla-w{w}"]["seconds"] < 200 for w in (64, 128, 256, 512))
    assert json.loads(out.read_text())["plan"]["total_flops"] == pytest.approx(p["total_flops"])
    # H4 picking another gate adds its arm beside dca_paper
    assert bench.arms_for("bias_inside") == ("vanilla", "vanilla_matched", "dca_paper",
                                             "dca_bias_inside")


def test_rates_follow_the_scaling_rule_from_the_cpu_summary(bench, tmp_path):
    cpu = tmp_path / "summary.json"
    cpu.write_text(json.dumps({"rates": {f"ptb-char/{a}/w64": {"lr": lr} for a, lr in
                                         (("vanilla", 0.016), ("vanilla_matched", 0.016),
                                          ("dca_paper", 0.008))}}))
    args = bench.parse(["--rates-from", str(cpu), "--rate64", "dca_paper=0.004"])
    r64 = bench.rates_at_64(args, bench.arms_for("paper"))
    assert r64 == {"dca_paper": 0.004, "vanilla": 0.016, "vanilla_matched": 0.016}
    assert [bench.rate("vanilla", w, r64) for w in (64, 128, 1024)] == [0.016, 0.008, 0.001]
    # where the CPU grid swept width 128, the rule's rate is reported beside its best
    cpu.write_text(json.dumps({"rates": {"ptb-char/vanilla/w64": {"lr": 0.016},
                                         "ptb-char/vanilla/w128": {"lr": 0.004}}}))
    assert bench.rule_against_cpu_128(args, r64) == {
        "vanilla": {"rule": 0.008, "cpu_sweep": 0.004}}
    missing = "no width-64 rate for vanilla_matched, dca_paper, dca_bias_inside"
    with pytest.raises(SystemExit, match=missing):
        bench.rates_at_64(bench.parse(["--rates-from", str(cpu), "--gate", "bias_inside"]),
                          bench.arms_for("bias_inside"))


def test_summary_applies_the_cpu_rules_to_synthetic_runs(bench):
    rng = np.random.default_rng(0)
    seeds = [100, 101, 102, 103]
    runs = {}
    for i, w in enumerate((64, 128, 256)):
        base = 1.2 + rng.normal(0, 0.01, 4)
        for arm, d in (("vanilla", 0.0), ("vanilla_matched", -0.5), ("dca_paper", -3 + i)):
            runs[(arm, w)] = {"seeds": seeds, "test_ppl": np.exp(
                base + (d + rng.normal(0, 0.1, 4)) / 100).tolist()}
    s = bench.summarise(runs)
    assert s["against_vanilla"]["dca_paper"]["64"]["mean"] == pytest.approx(-3, abs=0.3)
    assert s["H1"]["slope"] == pytest.approx(1.0, abs=0.2) and s["H1"]["ci"][0] > 0
    assert s["H1"]["verdict"] == "supported"  # and H2 holds at 64 and 128 (Holm over 3 widths)
    assert s["against_matched"]["dca_paper"]["256"]["outcome"] == "inconclusive" or \
        s["against_matched"]["dca_paper"]["256"]["mean"] < 0


def _dry_run(bench, tmp_path, *extra) -> dict:
    out = tmp_path / "gpu.json"
    bench.main(["--dry-run", "--rates-from", str(tmp_path / "none.json"), "--json", str(out),
                *extra])
    record = json.loads(out.read_text())
    for r in record["runs"].values():
        assert r["tokens_per_seed"] == r["steps"] * 4 * 16 >= 1024 and r["steps"] % 8 == 0
        assert r["seeds"] == [100, 101] and np.all(np.isfinite(r["test_ppl"]))
        assert r["lr"] == pytest.approx(2e-3 * 64 / 8)  # the rule from the dry run's 2e-3
        # trained: every seed's loss fell from the first chunk to the last
        assert np.all(np.less(r["train_loss_per_chunk"][-1], r["train_loss_per_chunk"][0]))
    return record


def test_dry_run_trains_the_matched_vanilla(bench, data_dir, monkeypatch, tmp_path):
    # one arm (two compilations, seconds): the matched arm, the one this script adds
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    record = _dry_run(bench, tmp_path, "--arms", "vanilla_matched")
    r = record["runs"]["vanilla_matched-w8"]
    assert sorted(record["runs"]) == ["vanilla_matched-w8"] and r["gate"] is None
    assert r["d_mlp"] > 4 * 8  # widened to DCA's non-embedding count


@pytest.mark.slow  # every arm: six compilations, about a minute on the shared 2-core CPU
def test_dry_run_trains_every_arm_and_pairs_them(bench, data_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    record = _dry_run(bench, tmp_path)
    assert sorted(record["runs"]) == ["dca_paper-w8", "vanilla-w8", "vanilla_matched-w8"]
    v, d = record["runs"]["vanilla-w8"], record["runs"]["dca_paper-w8"]
    np.testing.assert_allclose(record["summary"]["against_vanilla"]["dca_paper"]["8"]["per_seed"],
                               100 * (np.log(d["test_ppl"]) - np.log(v["test_ppl"])), rtol=1e-9)
