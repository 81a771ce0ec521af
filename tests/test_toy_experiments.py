"""Smoke runs of the toy experiments' quick modes (slow: each compiles several programs), the
figures drawn from them, and fast argument checks."""

import dataclasses
import importlib
import json

import pytest

from experiments import rank_vs_width

TOY = ["fig1", "risk_vs_params", "rank_vs_width", "prop45", "toy_gates"]
# toy_gates' prop45 setup runs by default (tests/test_user_commands.py); here the other one
SLOW_OVERRIDES = {"toy_gates": ["setups=risk_vs_params"]}
FIGS = {"fig1": "fig_toy_fig1", "risk_vs_params": "fig_toy_risk",
        "rank_vs_width": "fig_toy_rank_width", "toy_gates": "fig_toy_gates"}


@pytest.mark.slow
@pytest.mark.parametrize("name", TOY)
def test_quick_run_writes_run_dir_and_figure(name, tmp_path):
    mod = importlib.import_module(f"experiments.{name}")
    path = mod.main(quick=True, out=tmp_path / name, overrides=SLOW_OVERRIDES.get(name, ()))
    for f in ("config.json", "metrics.jsonl", "summary.json"):
        assert (path / f).is_file()
    summary = json.loads((path / "summary.json").read_text())
    lines = (path / "metrics.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line) for line in lines)
    if name == "prop45":
        assert summary["all_hold"]  # Prop. 4.5 is a theorem: it must hold on every run
    if name == "toy_gates":  # the literal gate's w can neither get gradient nor move
        paper = [c for c in summary["comparisons"] if c["gate"] == "paper"]
        assert paper and all(c["w_grad_step0_mean"] == c["w_norm_final_mean"] == 0.0
                             for c in paper)
    if name in FIGS:
        fig = importlib.import_module(f"figures.{FIGS[name]}")
        outs = fig.make(tmp_path / "figs", tmp_path)
        assert any(p.suffix == ".png" for p in outs) and all(p.stat().st_size for p in outs)


def test_refuses_to_overwrite_a_finished_run(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(FileExistsError, match="already holds a finished run"):
        rank_vs_width.main(quick=True, out=tmp_path)


def test_rank_vs_width_rejects_width_above_d(tmp_path):
    with pytest.raises(ValueError, match="width 17 out of range: need 1 <= width <= d=16"):
        dataclasses.replace(rank_vs_width.QUICK, widths=(1, 17))


def test_figures_need_results(tmp_path):
    fig = importlib.import_module("figures.fig_toy_fig1")
    with pytest.raises(FileNotFoundError, match="no fig1 results"):
        fig.make(tmp_path, tmp_path)
