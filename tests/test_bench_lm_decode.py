"""Tests of ``benchmarks/lm_decode.py`` (cached decode latency and cache memory): its argument
checks, and a dry run at tiny size whose record must hold every figure the README quotes."""

from __future__ import annotations

import json

import pytest
from bench_scripts import load


@pytest.fixture(scope="module")
def bench():
    return load("lm_decode")


@pytest.mark.parametrize("argv, bad", [
    (["--width", "100"], "--width"),
    (["--rounds", "0"], "--rounds"),
    (["--warmup", "-1"], "--warmup"),
    (["--tokens", "200", "--context", "128"], "--tokens"),
])
def test_bad_arguments_give_one_line_errors(bench, argv, bad):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    message = str(exc.value)
    assert bad in message and "\n" not in message


def test_defaults_are_the_issue_config(bench):
    args = bench.parse_args([])
    assert (args.depth, args.width, args.variants) == (24, 256, ["vanilla", "dca", "2-dca"])


def test_quick_dry_run_writes_every_figure(bench, tmp_path):
    path = tmp_path / "decode.json"
    record = bench.main(["--quick", "--json", str(path)])
    assert json.loads(path.read_text()) == json.loads(json.dumps(record))
    q = bench.QUICK
    for variant in ("vanilla", "dca", "2-dca"):
        times = record["latency_s_per_token"][variant]
        assert len(times) == q["rounds"] and all(t > 0 for t in times)
        mem = record["memory"][variant]
        # keys and values, per block, per context position: the same for every kind
        assert mem["cache_bytes_per_context_token"] == 2 * q["depth"] * q["width"] * 4
    stacks = {v: record["memory"][v]["stack_entries"] for v in ("vanilla", "dca", "2-dca")}
    assert stacks == {"vanilla": 1, "dca": q["depth"] + 1, "2-dca": min(4, q["depth"] + 1)}
    assert record["latency_2dca_over_dca"] > 0 and record["latency_2dca_over_dca_paired"] > 0
    assert "loadavg_1_5_15" in record["machine_before"] and "machine_after" in record


def test_scanned_trunk_decodes_the_kinds_without_per_block_steps(bench):
    """The scanned trunk decodes every kind with the cache, the rivals that the per-block trunks
    cannot decode included; the cache holds keys and values of every block whatever the kind."""
    q = bench.QUICK
    variants = ["vanilla", "attn_res", "mhc"]
    record = bench.main(["--quick", "--layer-loop", "scan", "--variants", *variants])
    for variant in variants:
        assert all(t > 0 for t in record["latency_s_per_token"][variant])
        assert record["memory"][variant]["cache_bytes_per_context_token"] == (
            2 * q["depth"] * q["width"] * 4)
    # mHC's state: hc_expansion streams of D numbers per token
    assert record["memory"]["mhc"]["stack_entries"] == 4


def test_per_block_trunk_without_a_cached_step_is_a_one_line_error(bench):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--quick", "--variants", "vanilla", "mhc"])
    assert "'mhc'" in str(exc.value) and "--layer-loop scan" in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.slow
def test_every_kind_decodes_through_the_scanned_trunk(bench):
    record = bench.main(["--quick", "--layer-loop", "scan", "--variants", "all"])
    assert set(record["median_latency_s_per_token"]) == set(bench.KIND_VARIANTS)
