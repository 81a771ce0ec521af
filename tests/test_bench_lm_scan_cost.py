"""Tests of ``benchmarks/lm_scan_cost.py`` (the executed work of the LM's compiled programs,
unrolled vs scanned trunk) and of its HLO reader ``benchmarks/hlo_executed.py``."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from bench_scripts import load


@pytest.fixture(scope="module")
def bench():
    return load("lm_scan_cost")


@pytest.fixture(scope="module")
def hlo():
    return load("hlo_executed")


def _matmul_chain(n: int):
    def f(x, ws):
        return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0].sum()
    return jax.jit(f).lower(jnp.ones((32, 32)), jnp.ones((n, 32, 32))).compile()


def test_executed_work_counts_every_loop_iteration(hlo):
    # XLA's cost analysis counts a while body once; the reader multiplies by the trip count.
    c4, c16 = _matmul_chain(4), _matmul_chain(16)
    e4, e16 = hlo.executed(c4.as_text()), hlo.executed(c16.as_text())
    assert e4["dot_flops"] == 4 * 2 * 32**3 and e16["dot_flops"] == 16 * 2 * 32**3
    xla = [c.cost_analysis() for c in (c4, c16)]
    xla = [x[0] if isinstance(x, list) else x for x in xla]
    assert xla[0]["flops"] == pytest.approx(xla[1]["flops"], rel=0.01)
    # every iteration reads its 4 KiB weight slice, not the whole stacked array
    assert 3.0 < e16["bytes"] / e4["bytes"] < 4.5
    assert e16["static"]["while"] == 1 and e16["ops"]["while"] == 1


def test_shape_bytes_reads_arrays_and_tuples(hlo):
    assert hlo.shape_bytes("f32[4,8]{1,0}") == 128
    assert hlo.shape_bytes("(s32[], bf16[3,2]{1,0}, pred[5])") == 4 + 12 + 5


@pytest.mark.parametrize("argv, bad", [
    (["--width", "100"], "--width"),
    (["--depths", "12", "0"], "--depths"),
    (["--variants", "dca-scan-g0"], "dca-scan-g0"),
    (["--variants", "nope"], "nope"),
])
def test_bad_arguments_give_one_line_errors(bench, argv, bad):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    message = str(exc.value)
    assert bad in message and "\n" not in message


def test_group_variants_set_the_scan_groups(bench):
    assert bench.variant_spec("dca-scan-g4", 12) == ("dca", "scan", {"DCA_SCAN_GROUPS": 4})
    assert bench.variant_spec("dca-scan-gdepth", 12)[2] == {"DCA_SCAN_GROUPS": 12}


def test_smoke_run_records_the_work_of_every_program(bench, tmp_path):
    path = tmp_path / "cost.json"
    record = bench.main(["--smoke", "--json", str(path)])
    assert json.loads(path.read_text()) == json.loads(json.dumps(record))
    results = record["results"]["3"]
    for mode in bench.MODES:
        assert set(results[mode]) == set(bench.SMOKE["variants"])
        for res in results[mode].values():
            assert res["dot_flops"] > 0 and res["bytes"] > 0 and res["temp_bytes"] > 0
    train, fwd = results["train"]["vanilla"], results["forward"]["vanilla"]
    # the backward pass does two matmuls per forward matmul
    assert 2.9 < train["dot_flops"] / fwd["dot_flops"] < 3.1
    # the scanned DCA's hand-written backward pass also recomputes each block's forward pass
    # (most of the matmuls at this size: the output projection is 64 x 64)
    scan_train, scan_fwd = results["train"]["dca-scan-g1"], results["forward"]["dca-scan-g1"]
    assert 3.4 < scan_train["dot_flops"] / scan_fwd["dot_flops"] < 4.0
    assert scan_train["static"]["while"] == 2 and train["static"]["while"] == 0
    assert "loadavg_1_5_15" in record["machine_before"] and "machine_after" in record


def test_attribution_sorts_kernels_by_pass_and_by_grn(bench):
    top = {"maximum_multiply_fusion | L | body/closed_call/mul": 3.0,
           "ynn_fusion | L | closed_call/jvp()/reduce_sum": 2.0,
           "ynn_fusion | L | closed_call/transpose(jvp())/dot_general": 1.5,
           "bitcast_dynamic-update-slice_fusion | L | while/body/dynamic_update_slice": 1.0,
           "dot | - | ?": 0.5}
    assert bench.attribution(top) == {"loop, forward: GRN": 3.0,
                                      "loop, recomputed forward: GRN": 2.0,
                                      "loop, VJP: other": 1.5,
                                      "loop: buffer updates, slices, copies": 1.0,
                                      "outside loops": 0.5}
