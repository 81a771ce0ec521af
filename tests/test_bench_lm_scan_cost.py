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
    (["--variants", "dca-scan-g4"], "dca-scan-g4"),
    (["--variants", "nope"], "nope"),
])
def test_bad_arguments_give_one_line_errors(bench, argv, bad):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    message = str(exc.value)
    assert bad in message and "\n" not in message


def test_knob_variants_name_their_settings(bench):
    assert bench.variant_spec("dca-scan-rebuild") == ("dca", "scan",
                                                      {"reads_written_only": False})
    assert bench.variant_spec("dca-scan-refgrn")[2] == bench.REFERENCE


def test_scan_settings_are_restored_even_after_an_error(bench):
    from dca_theory.lm.zoo import dca as zoo_dca

    through = zoo_dca.buffer_grns_through
    changes = {"reads_written_only": False, "block_reads_state": True,
               "buffer_grns_through": bench.reference_grns_through}
    with pytest.raises(RuntimeError), bench.scan_settings(changes):
        assert not zoo_dca.DCAMixer.reads_written_only and zoo_dca.DCAMixer.block_reads_state
        assert zoo_dca.buffer_grns_through is bench.reference_grns_through
        raise RuntimeError("tracing failed")
    assert zoo_dca.buffer_grns_through is through and zoo_dca.DCAMixer.reads_written_only
    # the class attribute DCAMixer only inherited is gone again, not shadowed by a copy
    assert "block_reads_state" not in vars(zoo_dca.DCAMixer)
    assert zoo_dca.DCAMixer.block_reads_state is False


def test_reference_grns_compute_what_the_buffer_kernels_do(bench):
    # the refgrn variant changes how the GRNs are computed, not the model
    from dca_theory.lm.fast.buffer_grn import buffer_grns, buffer_grns_through
    from dca_theory.residual import GRNv3

    kb, kw, kh = jax.random.split(jax.random.PRNGKey(0), 3)
    grns = [GRNv3(b=b, w=w, size=5, dim=8) for b, w in
            zip(jax.random.normal(kb, (3, 5, 8)), jax.random.normal(kw, (3, 8)))]
    buffer = jax.random.normal(kh, (5, 3, 8))
    for ref, lean in zip(bench.reference_grns(grns, buffer), buffer_grns(grns, buffer)):
        assert jnp.allclose(ref, lean, rtol=1e-5, atol=1e-5)
    (refs, _), (leans, _) = (f(grns, buffer, 3) for f in (bench.reference_grns_through,
                                                         buffer_grns_through))
    for ref, lean in zip(refs, leans):
        assert jnp.allclose(ref, lean, rtol=1e-5, atol=1e-5)


def test_vanilla_gradient_does_three_matmuls_per_forward_matmul(bench):
    args = bench.parse_args(["--smoke"])
    train, fwd = (bench.measure("vanilla", 2, mode, args) for mode in bench.MODES)
    # the backward pass does two matmuls per forward matmul
    assert 2.9 < train["dot_flops"] / fwd["dot_flops"] < 3.1
    assert train["static"]["while"] == 0 and train["temp_bytes"] > fwd["temp_bytes"] > 0


def test_smoke_run_records_the_work_of_every_program(bench, tmp_path):
    path = tmp_path / "cost.json"
    record = bench.main(["--smoke", "--modes", "train", "--json", str(path)])
    assert json.loads(path.read_text()) == json.loads(json.dumps(record))
    results = record["results"][str(bench.SMOKE["depths"][0])]["train"]
    assert set(results) == set(bench.SMOKE["variants"])
    for res in results.values():
        assert res["dot_flops"] > 0 and res["bytes"] > 0 and res["temp_bytes"] > 0
    shadow, rebuilt, once = (results[v] for v in ("dca-scan", "dca-scan-rebuild",
                                                  "dca-scan-writeonce"))
    # the write-once scan recomputes each block's forward pass in the backward pass (one more
    # matmul per three; the output projection is not recomputed); the shadow scan recomputes
    # only the mixer steps
    assert 1.1 < once["dot_flops"] / shadow["dot_flops"] < 1.34
    # rebuilding each block's buffer (the later slots zeroed) is a pass over the whole buffer
    # per block that reading the final buffer as it is does without
    assert rebuilt["bytes"] > shadow["bytes"]
    # the GRNs visit the slots written so far: loops of run-time length, 2 per block
    assert shadow["dynamic_loops"] >= 2 * bench.SMOKE["depths"][0]
    assert "loadavg_1_5_15" in record["machine_before"] and "machine_after" in record
