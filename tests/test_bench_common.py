"""The benchmarks' shared variants: the named-gate variants differ from DCA / 2-DCA (the LM's
default gate) in the GRN-v3 gate only, so a paired step-time run measures each gate's own cost."""

from __future__ import annotations

import dataclasses

from bench_scripts import load

from dca_theory import gates


def test_named_gate_variants_differ_from_the_default_in_the_gate_only():
    common = load("lm_bench_common")
    for base in ("dca", "2-dca"):
        default = common.model_config(base, width=64, depth=3, seq=8, vocab=32)
        assert default.grn_gate == gates.LM_DEFAULT_GATE
        for suffix, gate in (("paper-gate", "paper"), ("bias-inside-gate", "bias_inside")):
            named = common.model_config(f"{base}-{suffix}", width=64, depth=3, seq=8, vocab=32)
            assert named.grn_gate == gate
            assert dataclasses.replace(named, grn_gate=default.grn_gate) == default


def test_scan_variants_differ_from_their_base_in_the_layer_loop_only():
    common = load("lm_bench_common")
    for base in ("vanilla", "dca", "2-dca"):
        unrolled = common.model_config(base, width=64, depth=3, seq=8, vocab=32)
        scanned = common.model_config(f"{base}-scan", width=64, depth=3, seq=8, vocab=32)
        assert (unrolled.layer_loop, scanned.layer_loop) == ("unroll", "scan")
        assert dataclasses.replace(scanned, layer_loop="unroll") == unrolled
