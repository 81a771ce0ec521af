"""Every benchmark script of ``benchmarks/`` runs end to end at a tiny size in the default suite
(the sizes are in tests/bench_scripts.py; tests/test_user_commands.py checks that each script has
one). The scripts' own --smoke/--quick presets are bigger: their tests are the slow ones."""

from __future__ import annotations

import json

import pytest
from bench_scripts import BENCH_TINY, load


@pytest.mark.parametrize("name", sorted(BENCH_TINY))
def test_benchmark_runs_end_to_end_at_tiny_size(name, tmp_path, data_dir, monkeypatch, capsys):
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    monkeypatch.chdir(tmp_path)  # anything a script writes by default lands here
    out = tmp_path / f"{name}.json"
    load(name).main([*BENCH_TINY[name], "--json", str(out)])
    record = json.loads(out.read_text())
    assert isinstance(record, dict) and record
    assert capsys.readouterr().out  # every script reports what it measured


def test_profile_reports_wall_time_and_the_kernels_overlap(capsys):
    """lm_profile's overlap is the kernels' summed time over the wall time of a pass (both
    positive), and only kernels are summed: no host span, which would cover a whole call."""
    record = load("lm_profile").main(["--depth", "1", "--width", "8", "--batch", "1",
                                      "--passes", "1", "--variants", "vanilla", "--top", "1"])
    kernels = record["kernel_ms_calls_per_pass"]["vanilla"]
    assert kernels and all(":" not in k and " " not in k for k in kernels)
    wall = record["wall_ms_per_pass"]["vanilla"]
    total = record["total_kernel_ms_per_pass"]["vanilla"]
    assert wall > 0 and total > 0
    assert abs(record["kernel_overlap"]["vanilla"] - total / wall) < 1e-12
    assert "kernel time / wall time" in capsys.readouterr().out
