"""The decision rule of experiments/toy_gates.py on synthetic paired runs."""

import numpy as np
import pytest

from experiments import toy_gates


def _rows(shift, noise, seeds=5, rng=np.random.default_rng(0)):
    base = np.exp(rng.normal(0, 0.3, seeds))
    v3 = base * np.exp(shift + noise * rng.normal(size=seeds))
    zero = [0.0] * seeds
    return {("s", "c"): {"grn_v2": {"test_mse": base.tolist()},
                         "open": {"test_mse": v3.tolist(), "w_grad_step0": zero,
                                  "w_norm_final": zero}}}


@pytest.mark.parametrize("shift, advantage", [(-0.10, True), (0.0, False), (0.10, False)])
def test_decision_rule(shift, advantage):
    (c,) = toy_gates.compare(_rows(shift, noise=0.01))
    assert np.isclose(c["D"]["mean"], 100 * shift, atol=2.0)  # D in percent of ln MSE
    assert c["advantage"] is advantage


def test_settings_name_the_bad_gate():
    with pytest.raises(ValueError, match="unknown GRN-v3 gate 'tanh'; valid gates: paper"):
        toy_gates.settings(True, ["gates=tanh"])
    assert toy_gates.settings(True, ["gates=relu,relu_open"]).gates == ("paper", "open")
