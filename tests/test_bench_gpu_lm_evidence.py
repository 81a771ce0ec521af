"""``benchmarks/gpu_lm_evidence.py`` (the GPU version of the evidence experiment) dry-runs at
tiny size on the CPU: one arm at one width by default (its scanned train step compiles in
seconds), every (width, arm) in the slow repetition; the summary pairs the arms seed by seed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_scripts import load


@pytest.fixture(scope="module")
def bench():
    return load("gpu_lm_evidence")


@pytest.mark.parametrize("argv, bad", [(["--seeds", "0"], "--seeds"),
                                       (["--widths", "30"], "width 30"),
                                       (["--chunk", "0"], "--chunk")])
def test_bad_arguments_are_one_line_errors(bench, argv, bad):
    with pytest.raises(SystemExit, match=bad):
        bench.main(argv)


def test_an_unknown_arm_is_a_usage_error(bench, capsys):
    with pytest.raises(SystemExit, match="2"):
        bench.main(["--arms", "vanilla", "mhc"])
    assert "argument --arms: invalid choice: 'mhc'" in capsys.readouterr().err


def _check_run(r: dict, seeds: int, chunk: int) -> None:
    """One (width, arm) run of a dry run with ``--batch 4 --seq 16``."""
    # whole chunks of 4 x 16 tokens, at least the 2048 asked for
    assert r["tokens_per_seed"] == r["steps"] * 4 * 16 >= 2048 and r["steps"] % chunk == 0
    assert len(r["test_ppl"]) == seeds and np.all(np.isfinite(r["test_ppl"]))
    assert r["history"][-1]["step"] == r["steps"]
    # trained: every seed's loss fell from the first chunk to the last
    assert np.all(np.less(r["train_loss_per_chunk"][-1], r["train_loss_per_chunk"][0]))


def test_dry_run_of_one_arm_at_one_width(bench, data_dir, monkeypatch, tmp_path):
    """``--smoke`` with flags that win over its defaults: one layer, one width, vanilla only."""
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    out = tmp_path / "gpu.json"
    bench.main(["--smoke", "--widths", "8", "--depth", "1", "--chunk", "4", "--arms", "vanilla",
                "--json", str(out)])
    record = json.loads(out.read_text())
    assert record["args"]["seeds"] == 2 and record["args"]["depth"] == 1  # smoke's and ours
    assert list(record["runs"]) == ["vanilla-w8"] and not record["skipped"]
    _check_run(record["runs"]["vanilla-w8"], seeds=2, chunk=4)
    assert record["summary"] == {"test_D": {}, "slope": None}  # no DCA run to pair it with


def test_summary_pairs_the_arms_seed_by_seed(bench):
    """D = 100 (ln ppl_DCA - ln ppl_vanilla) per seed at each width with both arms, and the
    slope on log2(width) once two widths have both (here exactly -1 point per doubling)."""
    ppl = {("vanilla", 8): [10.0, 20.0], ("dca", 8): [10.0 * np.exp(0.02), 20.0 * np.exp(0.03)],
           ("vanilla", 16): [9.0, 18.0], ("dca", 16): [9.0 * np.exp(0.01), 18.0 * np.exp(0.02)],
           ("vanilla", 32): [8.0, 16.0]}  # no DCA at 32: left out
    s = bench.summarise({k: {"test_ppl": v} for k, v in ppl.items()}, seeds=2)
    assert sorted(s["test_D"]) == ["16", "8"]
    np.testing.assert_allclose(s["test_D"]["8"]["per_seed"], [2.0, 3.0], rtol=0, atol=1e-9)
    np.testing.assert_allclose(s["test_D"]["16"]["per_seed"], [1.0, 2.0], rtol=0, atol=1e-9)
    assert s["slope"]["n_seeds"] == 2
    assert s["slope"]["slope"] == pytest.approx(-1.0, abs=1e-9)


@pytest.mark.slow  # compiling four scanned train steps: 1-6 minutes on the shared 2-core CPU
def test_smoke_run_trains_every_width_and_arm_and_pairs_them(bench, data_dir, monkeypatch,
                                                              tmp_path):
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    out = tmp_path / "gpu.json"
    bench.main(["--smoke", "--json", str(out)])
    record = json.loads(out.read_text())
    assert sorted(record["runs"]) == ["dca-w16", "dca-w8", "vanilla-w16", "vanilla-w8"]
    for r in record["runs"].values():
        _check_run(r, seeds=2, chunk=8)
    s = record["summary"]
    assert sorted(s["test_D"]) == ["16", "8"] and s["slope"]["n_seeds"] == 2
    v, d = record["runs"]["vanilla-w8"], record["runs"]["dca-w8"]
    expected = 100 * (np.log(d["test_ppl"]) - np.log(v["test_ppl"]))
    np.testing.assert_allclose(s["test_D"]["8"]["per_seed"], expected, rtol=1e-9)
