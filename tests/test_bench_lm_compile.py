"""Tests of ``benchmarks/lm_compile.py`` (compile + first step time by depth, unrolled trunk vs
``layer_loop="scan"``): its argument checks, and a dry run at tiny size whose record must hold
every figure the paper quotes."""

from __future__ import annotations

import json

import pytest
from bench_scripts import load


@pytest.fixture(scope="module")
def bench():
    return load("lm_compile")


@pytest.mark.parametrize("argv, bad", [
    (["--width", "100"], "--width"),
    (["--steps", "0"], "--steps"),
    (["--depths", "12", "0"], "--depths"),
])
def test_bad_arguments_give_one_line_errors(bench, argv, bad):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    message = str(exc.value)
    assert bad in message and "\n" not in message


def test_defaults_are_the_issue_config(bench):
    args = bench.parse_args([])
    assert (args.depths, args.width, args.step_depth) == ([12, 24, 48], 256, 24)
    assert args.variants == ["vanilla", "dca", "2-dca"]
    assert args.layer_loops == ["unroll", "scan"]


@pytest.mark.slow  # twelve tiny train steps compiled: about 2 minutes on the loaded 2-core CPU
def test_quick_dry_run_writes_every_figure(bench, tmp_path):
    path = tmp_path / "compile.json"
    record = bench.main(["--quick", "--json", str(path)])
    assert json.loads(path.read_text()) == json.loads(json.dumps(record))
    q = bench.QUICK
    names = {f"{v}/{loop}" for v in ("vanilla", "dca", "2-dca") for loop in ("unroll", "scan")}
    for depth in q["depths"]:
        res = record["compile"][str(depth)]
        assert set(res) == names
        assert all(r["compile_s"] > 0 and r["first_step_s"] > 0 and r["temp_bytes"] > 0
                   for r in res.values())
    step = record["step_depth"]
    assert step["depth"] == q["step_depth"]
    assert all(len(ts) == q["steps"] for ts in step["times_s"].values())
    assert set(step["scan_over_unroll"]) == {"vanilla", "dca", "2-dca"}
    assert set(record["ratios"]["deepest_over_shallowest"]) == names
    assert "loadavg_1_5_15" in record["machine_before"] and "machine_after" in record
