"""Alternated train-step timing (:mod:`dca_theory.lab.steptime`), shared by ``lm_k`` and the
benchmarks."""

from __future__ import annotations

import pytest

from dca_theory.lab.steptime import alternated_step_times
from dca_theory.lm.config import PRESETS
from dca_theory.lm.train_config import LMTrainConfig


def test_alternated_step_times_times_every_config_each_round():
    tc = LMTrainConfig(batch_size=2, seq_len=8, warmup_steps=1)
    cfgs = {"a": (PRESETS["tiny"], tc), "b": (PRESETS["tiny"].replace(n_layers=1), tc)}
    out = alternated_step_times(cfgs, repeats=3, warmup=1)
    assert set(out) == {"a", "b"}
    for r in out.values():
        assert len(r["times_s"]) == 3 and all(t > 0 for t in r["times_s"])
        assert r["median_s"] == sorted(r["times_s"])[1]  # median of three
    with pytest.raises(ValueError, match="repeats and warmup must be >= 1"):
        alternated_step_times(cfgs, repeats=0)
