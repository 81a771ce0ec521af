"""Every user command runs end to end in the default suite at a tiny size, its output read back.

Each experiment of ``experiments/`` runs through ``dca-theory run NAME --quick --set ...`` (in
process, to save JAX start-up), each benchmark of ``benchmarks/`` through its ``main`` with tiny
flags, and one run goes through the installed console script in a subprocess. The names are
discovered, so a new experiment or benchmark fails :func:`test_every_command_has_a_default_test`
until it gets a tiny setting here or a default (not ``slow``) test elsewhere. ``slow`` tests are
only bigger repetitions of these paths.
"""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from bench_scripts import BENCH_ELSEWHERE, BENCH_TINY, BENCHMARKS, LIBRARIES

import experiments
from dca_theory import cli
from dca_theory.io import read_json, read_jsonl

TESTS = Path(__file__).resolve().parent
# Five training steps, every step logged and evaluated, two seeds (vmapped: compiled once; the
# figures need a spread, and lm_retrofit's pretrained model is then lm_ablation's vanilla run):
# the LM experiments' own records, tables and verdict code all run, on the smallest curves they
# accept (lm_stability's spike window of 3 steps reads every cached run, so every run has more
# than 3).
LM = ["train.steps=5", "train.log_every=1", "train.eval_every=1", "train.eval_batches=1",
      "train.warmup_steps=1", "seeds=0,1"]
TOY = {  # experiment -> --set values of a run in seconds
    "fig1": ["dim=4", "depth=2", "rank=1", "batch_size=8", "steps=12", "log_every=4",
             "learning_rates=0.01"],
    "prop45": ["dim=4", "widths=1", "steps=5", "batch_size=8", "jacobian_inputs=2"],
    "rank_vs_width": ["dim=4", "widths=1,4", "buckets=4", "teachers=1:2.0", "steps=5",
                      "batch_size=8", "test_inputs=16", "log_every=5", "jacobian_inputs=2"],
    "risk_vs_params": ["dim=4", "ranks=1", "steps=5", "log_every=5"],
    # the cheaper setup, the printed gate only (GRN-v2 and GRN-v3 trained: one comparison)
    "toy_gates": ["seeds=2", "test_inputs=16", "setups=prop45", "gates=paper", "scale=0.01"],
    "toy_convergence": ["dim=4", "depth=2", "widths=2", "teacher_rank=1", "teacher_pad_rank=2",
                        "restarts=1", "short_steps=5", "adam_steps=5", "adam_batch=8",
                        "lbfgs_steps=2", "train_size=16", "test_inputs=16", "log_every=5"],
    "lm_verdicts": [],  # reads the committed results
    "vit_digits": ["model.n_layers=1", "train.steps=4", "train.warmup_steps=1",
                   "train.eval_every=2", "train.batch_size=16"],
}
LM_TINY = {
    "lm_ablation": ["kinds=vanilla,dca", "open_gate_kinds="],
    "lm_depth": ["depths=2"],  # its vanilla run is lm_k's
    # its fits need two seeds and two widths; one sweep rate, not extended, as long as the grid
    # (so lm_evidence_lr's reproduction compares a sweep run with the grid's at its last step)
    "lm_evidence": ["widths=8,16", "arms=vanilla,dca", "lr_grid=0.003",
                    "lr_extend=0", "sweep_steps=5", "secondary_data=", "related_arms="],
    "lm_inputs": [],
    "lm_k": ["ks=1", "depth=2"],
    "lm_rank": [],
    "lm_related_work": ["kinds=denseformer"],
    "lm_retrofit": ["continue_steps=4"],
    "lm_stability": ["window=3"],
    "lm_weights": ["kinds=grn_v3,dca"],
    "lm_width": ["widths=8"],
}
# experiments reading another tiny run (run first where absent): that run and the --set values
# ("{results}" is the module's results folder); lm_evidence_lr's rate 4x the grid's trains DCA
# for the full budget when it beats the shared rate (it did, by about 40 points, in 5 steps)
READERS = {
    "lm_evidence_lr": ("lm_evidence", ["grid_run={results}/lm_evidence", "widths=16",
                                       "factors=1,4", "full_widths=16"]),
    "lm_evidence_rank": ("lm_evidence", ["grid_run={results}/lm_evidence", "positions=2"]),
}
TINY = {**TOY, **{name: LM + sets for name, sets in LM_TINY.items()},
        **{name: sets for name, (_, sets) in READERS.items()}}
# commands whose end-to-end default test lives elsewhere (checked to exist and not be slow)
ELSEWHERE: dict[str, str] = {
    # every part A-G through main() with a stand-in trainer (real tiny training is slow-marked)
    "lm_evidence_2": "tests/lm/test_exp_evidence_2.py::"
                     "test_every_part_runs_in_order_and_the_rules_apply",
}


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
                             "tiny setting in tests/test_user_commands.py")
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


def _run_tiny(name: str, results: Path) -> Path:
    if name in READERS and not (results / READERS[name][0] / "summary.json").exists():
        _run_tiny(READERS[name][0], results)
    out = results / name
    argv = ["run", name, "--quick", "--out", str(out), "--overwrite"]
    for value in TINY[name]:
        argv += ["--set", value.format(results=results)]
    assert cli.main(argv) == 0
    return out


@pytest.mark.parametrize("name", sorted(TINY))
def test_experiment_runs_end_to_end_at_tiny_size(name, results, capsys):
    out = _run_tiny(name, results)
    assert capsys.readouterr().out.strip().endswith(f"results in {out}")
    config, summary = read_json(out / "config.json"), read_json(out / "summary.json")
    assert summary["environment"]["python"] and config
    assert summary.get("complete", True) is not False
    if (out / "metrics.jsonl").exists():
        assert all(isinstance(r, dict) for r in read_jsonl(out / "metrics.jsonl"))
    if name == "prop45":
        assert summary["all_hold"]  # Prop. 4.5 is a theorem: it holds on every run
    if name == "toy_gates":  # the printed gate's w can neither get gradient nor move
        paper = [c for c in summary["comparisons"] if c["gate"] == "paper"]
        assert paper and all(c["w_grad_step0_mean"] == c["w_norm_final_mean"] == 0.0
                             for c in paper)
    if name == "fig1":
        res = summary["results"]
        assert set(res) == {f"{t}/{k}" for t in ("identity", "gaussian") for k in ("res", "grn_v1")}
        assert "output_weights" in res["identity/grn_v1"]["best_run"]  # GRN only: res has none
        assert "output_weights" not in res["identity/res"]["best_run"]
        assert all(np.isfinite(r["initial_loss_median"]) for r in res.values())
    if name in READERS:
        _check_evidence_reader(name, summary, read_json(results / "lm_evidence" / "summary.json"))


def _check_evidence_reader(name: str, s: dict, grid: dict) -> None:
    """lm_evidence_lr and lm_evidence_rank read the tiny grid named by ``grid_run``."""
    assert s["cache"] == grid["cache"]  # the grid's own run cache
    if name == "lm_evidence_rank":  # D is the grid's own gap, seed by seed
        assert s["widths"] == [8, 16] and s["complete"] and s["primary"]["n"] == 4
        grid_d = grid["datasets"]["ptb-char"]["comparisons"]["dca-vanilla"]["test_D"]
        for w in (8, 16):
            ours = [c["D"] for c in s["cells"] if c["width"] == w]
            np.testing.assert_allclose(ours, grid_d[str(w)]["per_seed"], rtol=0, atol=1e-9)
        assert all(0.0 < c[f"{k}_update_eff_rank_frac"] <= 1.0  # effective rank <= width
                   for c in s["cells"] for k in ("vanilla", "dca"))
        return
    row = s["widths"]["16"]
    shared = grid["lr_sweep"]["16"]["lr"]
    assert {a["shared_rate"] for a in row["arms"].values()} == {shared}
    assert set(row["arms"]["dca"]["valid_ln_ppl"]) == {f"{shared:g}", f"{4 * shared:g}"}
    assert all(a["handicap"] >= 0 for a in row["arms"].values())
    # at the shared rate a sweep run is the first steps of the grid's run (float32 noise apart)
    assert set(row["reproduction"]) == {"vanilla", "dca"}
    assert all(r["max_abs"] < 0.05 for r in row["reproduction"].values())
    assert set(s["full_budget"]) == {"16"}
    for r in s["full_budget"].values():  # DCA at its own best rate, trained like the grid's arm
        assert r["rate"] == row["arms"]["dca"]["best_rate"] != shared
        np.testing.assert_allclose(np.subtract(r["D_own_rate"]["per_seed"],
                                               r["D_shared_rate"]["per_seed"]),
                                   r["own_minus_shared_rate"]["per_seed"], rtol=0, atol=1e-9)


def test_figures_of_the_tiny_results(results, capsys, monkeypatch):
    """``dca-theory figures --experiments`` on the tiny runs above (run here if absent): every
    experiment figure draws from results at this size. The theory figures, drawn by the same
    command, are left out here (tests/test_theory_figures.py draws each)."""
    import figures

    experiment_figures = figures.figure_modules("experiment")
    monkeypatch.setattr(figures, "figure_modules",
                        lambda kind=None: [] if kind == "theory" else experiment_figures)
    for name in sorted(TINY):
        if not (results / name / "summary.json").exists():
            _run_tiny(name, results)
    capsys.readouterr()
    out = results.parent / "figures"
    assert cli.main(["figures", "--experiments", "--results", str(results), "--out",
                     str(out)]) == 0
    printed = [Path(line) for line in capsys.readouterr().out.split()]
    for mod in experiment_figures:
        name = mod.__name__.rsplit(".", 1)[-1]
        drawn = [p for p in printed if p.name.startswith(name)]
        assert drawn, f"{name} drew nothing"
    assert all(p.is_file() and p.stat().st_size for p in printed)



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
