"""``--set key=value``: coercion to the field's type, one-line errors, validation through the
settings dataclass, the run directory of a customised run, and the CLI end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dca_theory.cli import main as cli_main
from dca_theory.overrides import apply_overrides, describe, parse_assignments, record, run_dir


@dataclasses.dataclass(frozen=True)
class Inner:
    steps: int = 10
    lr: float = 1e-3


@dataclasses.dataclass(frozen=True)
class Settings:
    dim: int = 8
    scale: float = 1.0
    name: str = "res"
    flag: bool = False
    window: int | None = None
    widths: tuple[int, ...] = (1, 2)
    kinds: tuple[str, ...] = ("res",)
    pairs: tuple[tuple[int, float], ...] = ((2, 2.0),)
    inner: Inner = Inner()

    def __post_init__(self):
        if any(w > self.dim for w in self.widths):
            raise ValueError(f"width {max(self.widths)} exceeds dim={self.dim}")


@pytest.mark.parametrize("text, field, value", [
    ("dim=16", "dim", 16),
    ("scale=3e-3", "scale", 3e-3),
    ("scale=2", "scale", 2.0),
    ("name=grn_v1", "name", "grn_v1"),
    ("flag=true", "flag", True),
    ("flag=0", "flag", False),
    ("window=none", "window", None),
    ("window=3", "window", 3),
    ("widths=1,2,4", "widths", (1, 2, 4)),
    ("widths=", "widths", ()),
    ("kinds=res,grn_v1", "kinds", ("res", "grn_v1")),
    ("pairs=2:2.0,8:1", "pairs", ((2, 2.0), (8, 1.0))),
])
def test_values_are_coerced_to_the_field_type(text, field, value):
    cfg = apply_overrides(Settings(), [text])
    assert getattr(cfg, field) == value
    assert type(getattr(cfg, field)) is type(value)


def test_nested_settings_are_dotted_and_no_overrides_is_identity():
    cfg = apply_overrides(Settings(), ["inner.steps=5", "inner.lr=0.1"])
    assert cfg.inner == Inner(steps=5, lr=0.1)
    base = Settings()
    assert apply_overrides(base, []) is base


def test_unknown_key_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown setting 'wdith'; valid: dim, scale, .*"
                                         r"inner\.steps, inner\.lr$"):
        apply_overrides(Settings(), ["wdith=3"])
    with pytest.raises(ValueError, match="unknown setting 'inner.x'"):
        apply_overrides(Settings(), ["inner.x=3"])
    with pytest.raises(ValueError, match="'inner' is a group; set one of its fields"):
        apply_overrides(Settings(), ["inner=3"])


@pytest.mark.parametrize("text, message", [
    ("dim=1.5", "bad value for setting 'dim': '1.5' (expected int)"),
    ("flag=maybe", "bad value for setting 'flag': 'maybe' (expected bool)"),
    ("widths=1,x", "bad value for setting 'widths': '1,x' (expected tuple of int)"),
    ("window=big", "bad value for setting 'window': 'big' (expected int or none)"),
    ("pairs=2", "bad value for setting 'pairs': '2' (expected tuple of (int:float))"),
])
def test_bad_value_names_key_value_and_type(text, message):
    with pytest.raises(ValueError) as err:
        apply_overrides(Settings(), [text])
    assert str(err.value) == message


def test_malformed_assignment():
    with pytest.raises(ValueError, match="--set expects KEY=VALUE, got 'dim'"):
        parse_assignments(["dim"])


def test_dataclass_validation_runs_once_on_all_overrides_together():
    with pytest.raises(ValueError, match="width 4 exceeds dim=2"):
        apply_overrides(Settings(), ["dim=2", "widths=1,4"])
    # each alone would be invalid in the other order; together they are fine
    cfg = apply_overrides(Settings(), ["dim=2", "widths=1"])
    assert (cfg.dim, cfg.widths) == (2, (1,))


def test_experiment_settings_validate_kinds_and_widths():
    from experiments import rank_vs_width

    with pytest.raises(ValueError, match="unknown residual kind 'resnet'; valid: base"):
        rank_vs_width.settings(True, ["kinds=res,resnet"])
    with pytest.raises(ValueError, match="width 32 out of range: need 1 <= width <= d=16"):
        rank_vs_width.settings(True, ["widths=1,32"])
    assert rank_vs_width.settings(True, []) == rank_vs_width.QUICK


def test_describe_shows_values_as_they_are_set():
    lines = describe(Settings())
    assert any(line.startswith("pairs") and line.endswith("= 2:2.0") for line in lines)
    assert any(line.startswith("window") and line.endswith("= none") for line in lines)
    assert any(line.startswith("inner.steps") for line in lines)


def test_customised_runs_are_recorded_and_kept_apart():
    assert run_dir("fig1", False) == Path("experiments/results/fig1")
    custom = run_dir("fig1", False, ["dim=4"])
    assert custom.parent == Path("runs") and custom.name.startswith("fig1-set-")
    assert run_dir("fig1", True, ["dim=4"]).name.startswith("fig1-quick-set-")
    assert custom != run_dir("fig1", False, ["dim=5"])
    base = Settings()
    assert record(base) is base  # default runs write the usual config.json
    assert record(base, ["dim=4"])["overrides"] == {"dim": "4"}


TINY = ["dim=4", "depth=1", "widths=1,2", "buckets=2", "kinds=res", "teachers=1:2.0",
        "steps=3", "batch_size=4", "jacobian_inputs=2", "test_inputs=8", "log_every=1"]


def test_cli_run_with_overrides_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["run", "rank_vs_width", "--quick"]
    for item in TINY:
        argv += ["--set", item]
    assert cli_main(argv) == 0
    (path,) = (tmp_path / "runs").glob("rank_vs_width-quick-set-*")
    assert not (tmp_path / "experiments").exists()
    summary = json.loads((path / "summary.json").read_text())
    config = json.loads((path / "config.json").read_text())
    assert summary["config"]["dim"] == 4 and summary["config"]["widths"] == [1, 2]
    assert summary["overrides"] == config["overrides"] == dict(i.split("=") for i in TINY)
    assert sorted(summary["cells"]) == ["k=1,alpha=2.0/res/r=1", "k=1,alpha=2.0/res/r=2"]
    assert f"results in {path.relative_to(tmp_path)}" in capsys.readouterr().out


def test_cli_bad_key_exits_2_with_one_line(capsys):
    assert cli_main(["run", "rank_vs_width", "--quick", "--set", "d=128"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dca-theory: error: unknown setting 'd'; valid: dim, depth, widths")
    assert "\n" not in err


def test_cli_show_lists_settings(capsys):
    assert cli_main(["run", "prop45", "--quick", "--show", "--set", "seeds=3"]) == 0
    out = capsys.readouterr().out
    assert "kinds" in out and "base,res,grn_v1" in out
    assert "seeds                        int                      = 3" in out
