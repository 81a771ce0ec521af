"""``benchmarks/gpu_lm_evidence.py`` (the GPU version of the evidence experiment) dry-runs at
tiny size on the CPU (marked slow): every (width, arm) trains, is scored, and the summary pairs
them."""

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


@pytest.mark.slow  # compiling four scanned train steps: 1-6 minutes on the shared 2-core CPU
def test_smoke_run_trains_every_width_and_arm_and_pairs_them(bench, data_dir, monkeypatch,
                                                              tmp_path):
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    out = tmp_path / "gpu.json"
    bench.main(["--smoke", "--json", str(out)])
    record = json.loads(out.read_text())
    assert sorted(record["runs"]) == ["dca-w16", "dca-w8", "vanilla-w16", "vanilla-w8"]
    for r in record["runs"].values():
        # whole chunks of 8 steps of 4 x 16 tokens, at least the 2048 asked for
        assert r["tokens_per_seed"] == r["steps"] * 4 * 16 >= 2048 and r["steps"] % 8 == 0
        assert len(r["test_ppl"]) == 2 and np.all(np.isfinite(r["test_ppl"]))
        assert r["history"][-1]["step"] == r["steps"]
        # trained: every seed's loss fell from the first chunk to the last
        assert np.all(np.less(r["train_loss_per_chunk"][-1], r["train_loss_per_chunk"][0]))
    s = record["summary"]
    assert sorted(s["test_D"]) == ["16", "8"] and s["slope"]["n_seeds"] == 2
    v, d = record["runs"]["vanilla-w8"], record["runs"]["dca-w8"]
    expected = 100 * (np.log(d["test_ppl"]) - np.log(v["test_ppl"]))
    np.testing.assert_allclose(s["test_D"]["8"]["per_seed"], expected, rtol=1e-9)
