"""``dca-theory run lm_* --set``: every LM experiment's settings are listed, validated with
one-line errors, and without overrides build exactly the runs (cache keys) of the committed
results; a customised run trains into the standard cache and writes to its own directory."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from dca_theory.cli import main as cli_main
from dca_theory.io import to_jsonable
from dca_theory.lab import lm_grid
from dca_theory.lab.lm_settings import LMGridSettings

REPO = Path(__file__).resolve().parents[2]

#: experiment -> one of its own settings (besides seeds and train.*)
OWN_KNOB = {"lm_ablation": "open_gate_kinds", "lm_related_work": "datasets",
            "lm_width": "widths", "lm_depth": "depths", "lm_k": "ks", "lm_inputs": "window",
            "lm_retrofit": "continue_steps", "lm_weights": "kinds", "lm_stability": "c_grid"}


def _specs(name: str, quick: bool, settings=None) -> dict:
    """``{name: RunSpec}`` of every run an experiment reads, flattened."""
    mod = importlib.import_module(f"experiments.{name}")
    build = {"lm_ablation": mod.__dict__.get("dataset_specs"),
             "lm_related_work": lambda q, s: mod.dataset_specs(q, settings=s),
             "lm_width": lm_grid.width_specs, "lm_depth": lm_grid.depth_specs,
             "lm_k": lm_grid.k_specs, "lm_inputs": lm_grid.inputs_specs,
             "lm_retrofit": lm_grid.retrofit_specs,
             "lm_weights": mod.__dict__.get("weight_specs"),
             "lm_stability": mod.__dict__.get("quick_specs")}[name]
    out = {}
    for key, value in build(quick, settings).items():
        for inner, s in (value.items() if isinstance(value, dict) else [("", value)]):
            out[f"{key}/{inner}"] = s
    return out


@pytest.mark.parametrize("name", sorted(OWN_KNOB))
def test_show_lists_shared_and_own_settings(name, capsys):
    assert cli_main(["run", name, "--quick", "--show", "--set", "seeds=0",
                     "--set", "train.steps=70"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{name} settings (quick preset, with --set;")
    assert re.search(r"^  seeds +tuple of int += 0$", out, re.M)
    assert re.search(r"^  train\.steps +int += 70$", out, re.M)
    assert re.search(rf"^  {OWN_KNOB[name]} ", out, re.M)


@pytest.mark.parametrize("name", sorted(OWN_KNOB))
def test_bad_key_and_bad_value_are_one_line_errors(name, capsys):
    assert cli_main(["run", name, "--quick", "--set", "train.stpes=3", "--show"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dca-theory: error: unknown setting 'train.stpes'; valid: seeds, ")
    assert f", {OWN_KNOB[name]}" in err and "\n" not in err
    assert cli_main(["run", name, "--set", "train.lr=fast", "--show"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "dca-theory: error: bad value for setting 'train.lr': 'fast' (expected float)"


@pytest.mark.parametrize("name, item, message", [
    ("lm_width", "widths=8,9", "width 9 is not divisible by n_heads=2"),
    ("lm_width", "train.seq_len=64", "train.seq_len=64 exceeds the model's max_len=32"),
    ("lm_ablation", "kinds=vanilla,resnet", "unknown residual 'resnet'; valid: vanilla (or res)"),
    ("lm_ablation", "open_gate_kinds=grn_v1", "unknown open-gate kind 'grn_v1'; valid: grn_v3"),
    ("lm_ablation", "datasets=lm1b", "unknown dataset 'lm1b'; valid: shakespeare, ptb"),
    ("lm_ablation", "train.data=ptb", "set datasets=ptb instead of train.data"),
    ("lm_k", "ks=0", "ks must be integers >= 1 or none"),
    ("lm_depth", "seeds=0,0", "seeds must be distinct integers >= 0"),
    ("lm_depth", "train.warmup_steps=-1", "warmup_steps must be >= 0, got -1"),
    ("lm_k", "train.steps=10", "train.eval_every=10 must be below train.steps=10"),
    ("lm_inputs", "window=1", "window must be >= 2, got 1"),
    ("lm_weights", "kinds=vanilla", "kinds must be a non-empty subset of grn_v3, grn_v3_open, "
                   "grn_v3_bias_inside"),
    ("lm_stability", "c=5", "c_grid must include c=5.0"),
])
def test_settings_validate_through_their_configs(name, item, message):
    mod = importlib.import_module(f"experiments.{name}")
    with pytest.raises(ValueError, match=re.escape(message)):
        mod.settings(True, [item])


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
@pytest.mark.parametrize("name", sorted(OWN_KNOB))
def test_no_overrides_builds_the_standard_specs(name, quick):
    mod = importlib.import_module(f"experiments.{name}")
    settings = mod.settings(quick, [])
    assert isinstance(settings, LMGridSettings)
    assert settings == type(settings).preset(quick)
    with_settings, default = _specs(name, quick, settings), _specs(name, quick)
    assert {k: s.key for k, s in with_settings.items()} == {k: s.key for k, s in default.items()}
    assert [to_jsonable(s.describe()) for s in with_settings.values()] == [
        to_jsonable(s.describe()) for s in default.values()]


@pytest.mark.parametrize("name", sorted(set(OWN_KNOB) - {"lm_stability"}))
def test_full_specs_reproduce_the_committed_cache_keys(name):
    config = REPO / "experiments" / "results" / name / "config.json"
    if not config.is_file():
        pytest.skip(f"no committed {name} run")
    committed = set(re.findall(r'"key": "([^"]+)"', config.read_text()))
    assert committed == {s.key for s in _specs(name, False).values()}


def test_an_override_changes_only_the_runs_it_touches():
    from experiments import lm_width

    default = lm_width.settings(True, [])
    custom = lm_width.settings(True, ["widths=16,24", "seeds=0"])
    assert custom.widths == (16, 24) and custom.seeds == (0,) and custom.train == default.train
    keys = {k: s.key for k, s in lm_grid.width_specs(True, custom).items()}
    assert keys[("vanilla", 16)] != lm_grid.width_specs(True)[("vanilla", 16)].key
    longer = lm_width.settings(True, ["train.steps=31"])
    assert lm_grid.width_specs(True, longer)[("dca", 8)].train.steps == 31


@pytest.mark.slow  # ~35 s; the default run keeps the generic CLI end-to-end with overrides
def test_cli_lm_run_with_overrides_end_to_end(tmp_path, monkeypatch, data_dir, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    items = ["depths=1", "seeds=0", "train.steps=4", "train.batch_size=2",
             "train.eval_every=2", "train.log_every=2", "train.warmup_steps=1"]
    argv = ["run", "lm_depth", "--quick"]
    for item in items:
        argv += ["--set", item]
    assert cli_main(argv) == 0
    (path,) = (tmp_path / "runs").glob("lm_depth-quick-set-*")
    summary = json.loads((path / "summary.json").read_text())
    config = json.loads((path / "config.json").read_text())
    assert summary["overrides"] == config["overrides"] == dict(i.split("=") for i in items)
    assert config["settings"]["depths"] == [1] and summary["complete"]
    assert set(summary["depths"]) == {"1"}
    # the runs went into the standard quick cache, under keys of their own
    cached = sorted(p.name for p in (tmp_path / "runs" / "lm_runs").iterdir())
    assert cached == sorted(s.key for s in lm_grid.depth_specs(
        True, importlib.import_module("experiments.lm_depth").settings(True, items)).values())
    assert f"results in {path.relative_to(tmp_path)}" in capsys.readouterr().out
