"""Tests of ``benchmarks/vs_pytorch.py`` (our k-DCA train step against the PyTorch DCAGPT).

The argument checks run by default (no torch needed). The smoke run builds both models, trains a
few steps and is marked slow: on the shared 2-core CPU its JAX compilation alone took minutes.
"""

from __future__ import annotations

import json
import math
import statistics

import pytest
from bench_scripts import load


@pytest.fixture(scope="module")
def bench():
    return load("vs_pytorch")


@pytest.mark.parametrize("argv, bad", [
    (["--width", "100"], "--width"),
    (["--batch", "0"], "--batch"),
    (["--repeats", "-1"], "--repeats"),
    (["--k", "0"], "--k"),
])
def test_bad_arguments_give_one_line_errors(bench, argv, bad):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    message = str(exc.value)
    assert bad in message and "\n" not in message


def test_defaults_are_the_target_config(bench):
    # The target's config: width 512, depth 6, 8 heads of 64, k = 2, seq 128, batch 8, vocab 8192.
    args = bench.parse_args([])
    assert (args.width, args.depth, args.k, args.seq, args.batch, args.vocab) == \
        (512, 6, 2, 128, 8, 8192)
    assert args.width // 64 == 8


def dcagpt_param_count(vocab: int, d: int, depth: int, k: int) -> int:
    """DCAGPT's parameters counted from its architecture (deep-cross-attention 0.1.1).

    Per block over a stack of y = min(2k, i + 1) entries: a 3-output GRN (RMSNorm d, w 3d,
    bias 3yd), attention (an unused RMSNorm d, RMSNorm + d×d projection for q, k, v, output
    d×d, heads·64 = d), pre-FF RMSNorm d, MLP d→4d→d with biases. Then a 1-output GRN over
    min(2k, depth + 1) entries, the final RMSNorm and the untied d×V logits. (The rotary
    embeddings' fixed frequencies are registered as parameters but not trainable: not counted.)
    """
    total = vocab * d
    for i in range(depth):
        y = min(2 * k, i + 1)
        total += (d + 3 * d + 3 * y * d) + (d + 3 * (d + d * d) + d * d) + d \
            + (d * 4 * d + 4 * d + 4 * d * d + d)
    total += d + d + min(2 * k, depth + 1) * d
    return total + d + d * vocab


@pytest.mark.slow
def test_smoke_run_writes_a_complete_record(bench, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("deep_cross_attention")
    out = tmp_path / "vs.json"
    returned = bench.main(["--smoke", "--json", str(out)])
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["config"] == returned["config"]
    cfg = record["config"]
    names = ("ours_kdca", "ours_vanilla", "theirs_dcagpt")
    for name in names:
        ts = record["times_s"][name]
        assert len(ts) == cfg["repeats"] and all(t > 0 for t in ts)
        assert record["median_s"][name] == statistics.median(ts)
        # tokens/s is batch·seq over the median step time (exact arithmetic, float rounding).
        assert record["tokens_per_s"][name] == pytest.approx(
            cfg["batch"] * cfg["seq"] / record["median_s"][name], rel=1e-12)
        # At initialisation both models predict nearly uniformly: cross-entropy is ln V plus
        # half the logit variance, O(0.1-0.5) here; 1.0 allows for either init scheme.
        assert abs(record["first_loss"][name] - math.log(cfg["vocab"])) < 1.0
    assert record["ratio_ours_over_theirs"] == pytest.approx(
        record["tokens_per_s"]["ours_kdca"] / record["tokens_per_s"]["theirs_dcagpt"], rel=1e-12)
    # The comparison is only fair if DCAGPT is built at the intended config: its parameter
    # count must equal the one derived from the architecture (exact integer).
    assert record["params"]["theirs_dcagpt"] == dcagpt_param_count(
        cfg["vocab"], cfg["width"], cfg["depth"], cfg["k"])
    # The GRNs add parameters over our vanilla transformer.
    assert record["params"]["ours_kdca"] > record["params"]["ours_vanilla"]
    for field in ("torch_num_threads", "XLA_FLAGS", "visible_cores"):
        assert field in record["threads"]
    for when in ("machine_before", "machine_after"):
        assert len(record[when]["loadavg_1_5_15"]) == 3


def test_model_flops_follow_the_palm_count(bench):
    # width 64, depth 2, MLP 256, vocab 256, seq 16, batch 2: matmul weights per layer
    # 4·64² + 2·64·256 = 49152, output 64·256 = 16384; T = 32 tokens.
    from dca_theory.lm.config import ModelConfig

    cfg = ModelConfig(vocab_size=256, max_len=16, d_model=64, n_heads=1, d_mlp=256, n_layers=2)
    n = 2 * 49152 + 16384
    assert bench.model_flops_per_step(cfg, 2) == 6 * 32 * n + 12 * 32 * 2 * 64 * 16


@pytest.mark.slow
def test_no_torch_run_reports_mfu_against_the_same_rounds_matmul_peak(bench, tmp_path):
    out = tmp_path / "mfu.json"
    record = bench.main(["--smoke", "--no-torch", "--json", str(out)])
    assert json.loads(out.read_text(encoding="utf-8"))["mfu"] == record["mfu"]
    assert "theirs_dcagpt" not in record["median_s"] and "ratio_ours_over_theirs" not in record
    assert len(record["matmul_peak_times_s"]) == record["config"]["repeats"]
    for name in ("ours_kdca", "ours_vanilla"):
        # MFU = model FLOPs / median step / peak, a fraction of the machine's matmul rate
        expected = record["model_flops_per_step"] / record["median_s"][name] / \
            record["matmul_peak_flops_per_s"]
        assert record["mfu"][name] == pytest.approx(expected, rel=1e-12)
        assert 0 < record["mfu"][name] < 1.5  # tiny sizes can beat a 1024² matmul only a little
        # XLA's count of the compiled step includes the optimizer and softmax: at least the
        # matmul count's order of magnitude
        assert record["xla_flops_per_step"][name] > 0.3 * record["model_flops_per_step"]
