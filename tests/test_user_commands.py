"""Every user command runs end to end in the default suite at a tiny size, its output read back.

Each experiment of ``experiments/`` runs through ``dca-theory run NAME --quick --set ...`` (in
process, to save JAX start-up), each benchmark of ``benchmarks/`` through its ``main`` with tiny
flags, and one run goes through the installed console script in a subprocess. The names are
discovered, so a new experiment or benchmark fails :func:`test_every_command_has_a_default_test`
until it gets a tiny setting (tests/tiny_commands.py, tests/bench_scripts.py) or a default (not
``slow``) test elsewhere. ``slow`` tests are only bigger repetitions of these paths. The
lm_evidence grid and the two experiments reading it run in tests/test_user_commands_evidence.py
(a second file, so that a second worker trains them).
"""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess

import numpy as np
import pytest
from bench_scripts import BENCH_ELSEWHERE, BENCH_TINY, BENCHMARKS, LIBRARIES
from tiny_commands import (
    ELSEWHERE,
    EVIDENCE,
    EVIDENCE_FIGURES,
    FIGURES_ELSEWHERE,
    TESTS,
    TINY,
    check_tiny_run,
    draw_figures,
)

import experiments
from dca_theory import cli
from dca_theory.io import read_json


def _experiment_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(experiments.__path__)
                  if not m.name.startswith("_"))


def _benchmark_names() -> list[str]:
    return sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem not in LIBRARIES)


def _named_test(node: str, name: str) -> None:
    """``node`` (``path::function``) is a test function, not ``slow``-marked, whose module names
    ``name``."""
    path, func = node.split("::")
    tree = ast.parse((TESTS.parent / path).read_text())
    found = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == func]
    assert found, f"{node} does not exist"
    marks = [ast.unparse(d) for d in found[0].decorator_list]
    assert not any("slow" in m for m in marks), f"{node} is slow-marked"
    assert name in (TESTS.parent / path).read_text(), f"{node}'s module never names {name}"


def test_every_command_has_a_default_test():
    for names, tiny, elsewhere, what in (
            (_experiment_names(), TINY, ELSEWHERE, "experiments"),
            (_benchmark_names(), BENCH_TINY, BENCH_ELSEWHERE, "benchmarks")):
        missing = [n for n in names if n not in tiny and n not in elsewhere]
        assert not missing, (f"{what} without a default-suite test: {missing}; give each a "
                             "tiny setting in tests/tiny_commands.py")
        assert set(tiny) | set(elsewhere) <= set(names), f"{what}: stale names in this file"
        for name, node in elsewhere.items():
            _named_test(node, name)
    assert set(LIBRARIES) <= {p.stem for p in BENCHMARKS.glob("*.py")}
    for name in LIBRARIES:  # a library has no command of its own
        assert "__main__" not in (BENCHMARKS / f"{name}.py").read_text()


@pytest.fixture(scope="module")
def results(tmp_path_factory, data_dir):
    """One results folder for every tiny run of this module, so the LM experiments share one
    run cache (``results/lm_runs``) and train a model only once."""
    os.environ["DCA_DATA_DIR"] = str(data_dir)
    return tmp_path_factory.mktemp("results")


# the lm_evidence grid and its readers run in tests/test_user_commands_evidence.py
HERE = sorted(set(TINY) - set(EVIDENCE))


@pytest.mark.parametrize("name", HERE)
def test_experiment_runs_end_to_end_at_tiny_size(name, results, capsys):
    check_tiny_run(name, results, capsys)


def test_figures_of_the_tiny_results(results, capsys, monkeypatch):
    """``dca-theory figures --experiments`` on the tiny runs above (run here if absent): every
    experiment figure but the lm_evidence grid's (drawn in
    tests/test_user_commands_evidence.py) and those of ``FIGURES_ELSEWHERE`` draws from
    results at this size."""
    import figures

    names = [m.__name__.rsplit(".", 1)[-1] for m in figures.figure_modules("experiment")]
    assert set(EVIDENCE_FIGURES) <= set(names) and set(FIGURES_ELSEWHERE) <= set(names)
    for name, node in FIGURES_ELSEWHERE.items():
        _named_test(node, name)
    elsewhere = set(EVIDENCE_FIGURES) | set(FIGURES_ELSEWHERE)
    draw_figures(results, HERE, [n for n in names if n not in elsewhere], capsys, monkeypatch)


def test_console_script_runs_an_experiment_in_a_fresh_process(tmp_path):
    """The installed entry point (not only :func:`dca_theory.cli.main`) end to end."""
    out = tmp_path / "fig1"
    sets = [a for v in TINY["fig1"] + ["kinds=res", "tasks=identity"] for a in ("--set", v)]
    proc = subprocess.run(["dca-theory", "run", "fig1", "--quick", "--out", str(out), *sets],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(TESTS.parent)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"results in {out}")
    assert set(read_json(out / "summary.json")["results"]) == {"identity/res"}


def _lm_commands() -> set[str]:
    from dca_theory.lm.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return set(sub.choices)


def test_every_lm_command_runs_end_to_end_at_tiny_size(tmp_path, capsys):
    """train -> eval -> sample -> info on a 1-layer model of a small corpus (one compile each);
    the bigger session with a resume and the uncached sampler is the slow test of
    tests/lm/test_lm_cli.py."""
    corpus = tmp_path / "colours.txt"
    rng = np.random.default_rng(2)
    words = ["red", "green", "blue", "cyan"]
    corpus.write_text("\n".join(" ".join(rng.choice(words, 7)) for _ in range(80)) + "\n")
    workdir = tmp_path / "run"
    ran = set()

    def lm(*argv):
        ran.add(argv[0])
        assert cli.main(["lm", *argv]) == 0
        return capsys.readouterr().out

    out = lm("train", "--preset", "tiny", "--residual", "vanilla", "--data", str(corpus),
             "--workdir", str(workdir), "--no-progress", "--layers", "1", "--d-model", "8",
             "--heads", "2", "--d-mlp", "16", "--max-len", "8", "--batch-size", "2",
             "--warmup", "1", "--steps", "2", "--eval-every", "2", "--eval-batches", "1",
             "--checkpoint-every", "2", "--bpe-vocab", "262")
    assert "validation perplexity by step: 2:" in out
    summary = read_json(workdir / "summary.json")
    assert np.isfinite(summary["final_train_loss"])
    out = lm("eval", "--workdir", str(workdir), "--split", "valid")
    assert out.startswith(f"checkpoint step 2 of {workdir}:\nvalid: loss ")
    assert lm("sample", "--workdir", str(workdir), "--prompt", "red", "--tokens", "3",
              "--top-k", "2").startswith("red")
    assert "vanilla" in lm("info", "--preset", "tiny")
    assert ran == _lm_commands()
