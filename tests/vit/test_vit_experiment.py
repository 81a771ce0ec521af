"""Smoke tests of ``experiments/vit_digits``: the run directory and the summary it writes."""

import dataclasses

import pytest

import experiments.vit_digits as exp
from dca_theory.io import read_json, read_jsonl
from dca_theory.vit.train import TrainConfig


def check_run(path, n_seeds):
    config, summary = read_json(path / "config.json"), read_json(path / "summary.json")
    assert config["experiment"] == "vit_digits"
    for kind in ("vanilla", "dca"):
        stats = summary["per_kind"][kind]
        assert stats["test_acc"]["n"] == n_seeds and 0 <= stats["test_acc"]["mean"] <= 1
        assert stats["params"] > 0
    assert summary["per_kind"]["dca"]["params"] > summary["per_kind"]["vanilla"]["params"]
    paired = summary["paired_dca_minus_vanilla"]["test_acc"]
    assert len(paired["per_seed"]) == n_seeds
    records = read_jsonl(path / "metrics.jsonl")
    assert {r["run"] for r in records} == {"vanilla", "dca"}


def test_tiny_run_writes_a_complete_run_directory(tmp_path, monkeypatch):
    # The quick spec shrunk further (1 layer, 6 steps) so the default test set stays fast; the
    # real quick mode is the slow test below.
    tiny = {"model": exp.QUICK["model"].replace(n_layers=1), "seeds": (0, 1),
            "train": TrainConfig(steps=6, batch_size=64, warmup_steps=1, eval_every=3)}
    monkeypatch.setattr(exp, "QUICK", tiny)
    path = exp.main(quick=True, out=tmp_path / "run")
    check_run(path, n_seeds=2)
    with pytest.raises(FileExistsError, match="already holds a finished run"):
        exp.main(quick=True, out=tmp_path / "run")


@pytest.mark.slow
def test_quick_mode(tmp_path):
    check_run(exp.main(quick=True, out=tmp_path / "quick"), n_seeds=len(exp.QUICK["seeds"]))


def test_full_spec_has_five_seeds_and_valid_configs():
    assert len(exp.FULL["seeds"]) >= 5 and len(set(exp.FULL["seeds"])) == len(exp.FULL["seeds"])
    assert dataclasses.is_dataclass(exp.FULL["train"])
