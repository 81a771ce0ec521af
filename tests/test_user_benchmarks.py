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
