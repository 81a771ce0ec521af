"""The benchmarks' shared variants: the paper-gate variants differ from DCA / 2-DCA in the
GRN-v3 gate only, so a paired step-time run measures the gate's own cost."""

from __future__ import annotations

import dataclasses

from bench_scripts import load


def test_paper_gate_variants_differ_from_the_default_in_the_gate_only():
    common = load("lm_bench_common")
    for base in ("dca", "2-dca"):
        default = common.model_config(base, width=64, depth=3, seq=8, vocab=32)
        paper = common.model_config(f"{base}-paper-gate", width=64, depth=3, seq=8, vocab=32)
        assert (default.grn_gate, paper.grn_gate) == ("bias_inside", "paper")
        assert dataclasses.replace(paper, grn_gate=default.grn_gate) == default


def test_scan_variants_differ_from_their_base_in_the_layer_loop_only():
    common = load("lm_bench_common")
    for base in ("vanilla", "dca", "2-dca"):
        unrolled = common.model_config(base, width=64, depth=3, seq=8, vocab=32)
        scanned = common.model_config(f"{base}-scan", width=64, depth=3, seq=8, vocab=32)
        assert (unrolled.layer_loop, scanned.layer_loop) == ("unroll", "scan")
        assert dataclasses.replace(scanned, layer_loop="unroll") == unrolled
