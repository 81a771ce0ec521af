"""Tests of ``benchmarks/gpu_perf.py`` (the one-call GPU performance script) on the CPU.

The argument checks, the lowering of the script's steps for a GPU (exported for CUDA) and a run
whose budget is spent after the first variant run by default;
the whole ``--smoke`` dry run (every piece at tiny size) is marked slow: compiling its six train
steps and three decode steps took about 2 minutes on the shared 2-core CPU.
"""

from __future__ import annotations

import json
import statistics

import pytest
from bench_scripts import load


@pytest.fixture(scope="module")
def bench():
    return load("gpu_perf")


@pytest.mark.parametrize("argv, bad", [
    (["--width", "100"], "--width must be a multiple of 64 (head width), got 100"),
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--peak-n", "-8"], "--peak-n must be >= 1, got -8"),
    (["--depths", "6", "0"], "--depths must all be >= 1, got 0"),
    (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["--variants", "dca", "2-dca"], "--variants must include vanilla"),
    (["--decode-tokens", "2000"], "--decode-tokens must be <= --seq (1024), got 2000"),
    (["--budget-s", "0"], "--budget-s must be > 0, got 0.0"),
])
def test_bad_arguments_give_one_line_errors(bench, argv, bad):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    message = str(exc.value)
    assert bad in message and "\n" not in message


def test_defaults_are_the_issue_configs(bench):
    # Issue 18: 6 and 24 layers x width 512, bf16, vanilla / 2-DCA / full DCA, within 8 minutes.
    args = bench.parse_args([])
    assert (args.depths, args.width, args.compute_dtype) == ([6, 24], 512, "bfloat16")
    assert args.variants == ["vanilla", "2-dca", "dca"] and args.budget_s <= 8 * 60
    assert bench.TARGET_STEP_RATIO == {"2-dca": 1.10, "dca": 1.25}
    assert bench.TARGET_VANILLA_MFU == 0.40


@pytest.mark.slow  # about 11 s of compilation; the default suite stays under its time budget
def test_a_spent_budget_skips_the_later_pieces_and_says_so(bench, tmp_path):
    # The first variant always runs; after it (seconds of compilation) a 1 s budget is spent,
    # so every later variant and piece is skipped, with its reason in the JSON.
    out = tmp_path / "tiny.json"
    record = bench.main(["--smoke", "--budget-s", "1", "--json", str(out)])
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(json.dumps(record))
    first = record["pieces"]["train@2"]
    assert list(first["variants"]) == ["vanilla"]
    assert len(first["step_times_s"]["vanilla"]) == first["rounds"] == 2
    skipped = [(s["piece"], s["variant"]) for s in record["skipped"]]
    assert skipped == [("train@2", "2-dca"), ("train@2", "dca"), ("train@3", "vanilla"),
                       ("train@3", "2-dca"), ("train@3", "dca"), ("decode@3", "vanilla"),
                       ("decode@3", "2-dca"), ("decode@3", "dca")]
    assert all("guessed > 1 s" in s["reason"] for s in record["skipped"])
    assert record["pieces"]["train@3"]["variants"] == {}
    assert "median_latency_s_per_token" not in record["pieces"]["decode@3"]
    verdict = {row["target"]: row["verdict"] for row in record["verdicts"]}
    assert verdict["train@2 2-dca step / vanilla <= 1.10"] == "not measured"
    assert verdict["train@3 vanilla MFU >= 40%"] == "not measured"
    assert verdict["train@2 vanilla MFU >= 40%"] in ("PASS", "MISS")


@pytest.mark.parametrize("variant", ["vanilla", "2-dca", "dca",
                                     pytest.param("2-dca-scan", marks=pytest.mark.slow)])
def test_the_scripts_steps_lower_for_a_gpu(bench, variant):
    # No GPU here: exporting for CUDA runs JAX's lowering for that platform (the fused path's
    # GPU branch included), so the device run cannot fail there. Tiny sizes, bf16 as on the GPU.
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    from jax import export
    from lm_bench_common import model_config, train_setup

    from dca_theory.lm.decode import DecodeCache, decode_step
    from dca_theory.lm.model import build_model

    cfg = model_config(variant, width=64, depth=2, seq=16, vocab=256)
    fn, state = train_setup(cfg, 2, "bfloat16")
    train = export.export(jax.jit(fn), platforms=("cuda",))(*state)
    assert train.platforms == ("cuda",) and "bf16" in train.mlir_module()
    model = build_model(model_config(variant, width=64, depth=2, seq=16, vocab=256,
                                     param_dtype="bfloat16"), key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    step = jax.jit(lambda p, c, t: decode_step(eqx.combine(p, static), c, t))
    decode = export.export(step, platforms=("cuda",))(params, DecodeCache.empty(model),
                                                       jnp.zeros((), jnp.int32))
    assert decode.platforms == ("cuda",)


def check_train_piece(bench, piece: dict, cfg: dict) -> None:
    """The piece's figures are the stated functions of its raw timings and analyses."""
    from lm_bench_common import model_config

    variants = cfg["variants"]
    assert list(piece["variants"]) == variants
    for v in variants:
        info = piece["variants"][v]
        assert info["compile_s"] > 0 and info["lower_s"] > 0 and info["first_step_s"] > 0
        assert len(info["warmup_steps_s"]) == cfg["warmup"]
        mem = info["train_memory"]
        assert mem["peak"] == mem["argument"] + mem["output"] + mem["temp"] - mem["alias"]
        times = piece["step_times_s"][v]
        assert len(times) == piece["rounds"] and all(t > 0 for t in times)
        assert piece["median_step_s"][v] == statistics.median(times)
    med, peak = piece["median_step_s"], piece["matmul_peak_flops_per_s"]
    assert peak == pytest.approx(2 * cfg["peak_n"] ** 3 * cfg["peak_reps"]
                                 / statistics.median(piece["matmul_peak_call_s"]), rel=1e-12)
    flops = bench.model_flops_per_step(
        model_config("vanilla", width=cfg["width"], depth=piece["depth"], seq=cfg["seq"],
                     vocab=cfg["vocab"]), cfg["batch"])
    assert piece["model_flops_per_step"] == flops
    for v in variants:
        assert piece["step_ratio_to_vanilla"][v] == pytest.approx(med[v] / med["vanilla"],
                                                                  rel=1e-12)
        assert piece["mfu"][v] == pytest.approx(flops / med[v] / peak, rel=1e-12)
        assert piece["tokens_per_s"][v] == pytest.approx(cfg["batch"] * cfg["seq"] / med[v],
                                                         rel=1e-12)
        assert piece["train_memory_ratio_to_vanilla"][v] == pytest.approx(
            piece["variants"][v]["train_memory"]["peak"]
            / piece["variants"]["vanilla"]["train_memory"]["peak"], rel=1e-12)
    # The GRNs' parameters and stack: DCA's compiled step needs more memory than vanilla's.
    assert piece["train_memory_ratio_to_vanilla"]["dca"] > 1.0


@pytest.mark.slow  # six tiny train steps and three decode steps to compile: about 2 minutes
def test_smoke_run_measures_every_piece_consistently(bench, tmp_path):
    out = tmp_path / "smoke.json"
    record = bench.main(["--smoke", "--json", str(out)])
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(json.dumps(record))
    cfg = record["config"]
    assert record["skipped"] == [] and record["elapsed_s"] <= cfg["budget_s"]
    assert list(record["pieces"]) == ["train@2", "train@3", "decode@3"]
    for depth in cfg["depths"]:
        check_train_piece(bench, record["pieces"][f"train@{depth}"], cfg)
    dec = record["pieces"]["decode@3"]
    med = dec["median_latency_s_per_token"]
    for v in ("vanilla", "2-dca", "dca"):
        assert len(dec["latency_s_per_token"][v]) == cfg["decode_rounds"]
        assert med[v] == statistics.median(dec["latency_s_per_token"][v])
        assert dec["latency_ratio_to_vanilla"][v] == pytest.approx(med[v] / med["vanilla"],
                                                                   rel=1e-12)
        # keys and values of every block, in the compute dtype (bf16: 2 bytes)
        assert dec["variants"][v]["cache_bytes_per_context_token"] == 2 * 3 * cfg["width"] * 2
    assert dec["latency_2dca_over_dca"] == pytest.approx(med["2-dca"] / med["dca"], rel=1e-12)
    # each verdict follows from its value and the target's direction
    for row in record["verdicts"]:
        limit = float(row["target"].split()[-1].rstrip("%"))
        if "MFU" in row["target"]:
            assert (row["verdict"] == "PASS") == (row["value"] >= limit / 100)
        else:
            assert (row["verdict"] == "PASS") == (row["value"] <= limit)
    assert len(record["verdicts"]) == 3 * len(cfg["depths"])
