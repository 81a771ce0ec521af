"""The tiny ``--set`` values of every experiment's default end-to-end run, and the helpers that
run one and draw the figures of a set of runs (tests/test_user_commands.py and
tests/test_user_commands_evidence.py).

The runs are split over the two files only for wall time: with ``--dist loadfile`` a file runs
on one worker, and the lm_evidence grid with the two experiments reading it (``EVIDENCE``)
trains as many tiny LMs as the other experiments together. The groups share no run: the grid
trains on ptb-char under its own keys, the other LM experiments on Tiny Shakespeare.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
# the experiments of tests/test_user_commands_evidence.py and the figures drawn from them; the
# other experiments and figures are tests/test_user_commands.py's
EVIDENCE = ("lm_evidence", "lm_evidence_lr", "lm_evidence_rank")
EVIDENCE_FIGURES = ("fig_lm_evidence", "fig_lm_evidence_rank")
# figures drawn from a result that only a test elsewhere makes (checked to exist, not slow)
FIGURES_ELSEWHERE = {
    "fig_lm_evidence_2": "tests/lm/test_exp_evidence_2.py::"
                         "test_every_part_runs_in_order_and_the_rules_apply",
}
# commands whose end-to-end default test lives elsewhere (checked to exist and not be slow)
ELSEWHERE: dict[str, str] = {
    # every part A-G through main() with a stand-in trainer (real tiny training is slow-marked)
    "lm_evidence_2": "tests/lm/test_exp_evidence_2.py::"
                     "test_every_part_runs_in_order_and_the_rules_apply",
}


def run_tiny(name: str, results: Path) -> Path:
    """``dca-theory run NAME --quick`` at its tiny setting into ``results/NAME`` (the run it
    reads first, where absent)."""
    if name in READERS and not (results / READERS[name][0] / "summary.json").exists():
        run_tiny(READERS[name][0], results)
    out = results / name
    argv = ["run", name, "--quick", "--out", str(out), "--overwrite"]
    for value in TINY[name]:
        argv += ["--set", value.format(results=results)]
    assert cli.main(argv) == 0
    return out


def draw_figures(results: Path, names: list[str], figure_names, capsys, monkeypatch) -> None:
    """``dca-theory figures --experiments`` on the tiny runs ``names`` (run here if absent),
    drawing the experiment figures ``figure_names`` only: each draws something, every file
    drawn is non-empty. The theory figures, drawn by the same command, are left out here
    (tests/test_theory_figures.py draws each)."""
    import figures

    chosen = [m for m in figures.figure_modules("experiment")
              if m.__name__.rsplit(".", 1)[-1] in figure_names]
    assert len(chosen) == len(set(figure_names)), "a named figure module does not exist"
    monkeypatch.setattr(figures, "figure_modules",
                        lambda kind=None: [] if kind == "theory" else chosen)
    for name in names:
        if not (results / name / "summary.json").exists():
            run_tiny(name, results)
    capsys.readouterr()
    out = results.parent / "figures"
    assert cli.main(["figures", "--experiments", "--results", str(results), "--out",
                     str(out)]) == 0
    printed = [Path(line) for line in capsys.readouterr().out.split()]
    for mod in chosen:
        name = mod.__name__.rsplit(".", 1)[-1]
        drawn = [p for p in printed if p.name.startswith(name)]
        assert drawn, f"{name} drew nothing"
    assert all(p.is_file() and p.stat().st_size for p in printed)


def check_tiny_run(name: str, results: Path, capsys) -> None:
    """Run ``name`` at its tiny setting and read back what it wrote."""
    out = run_tiny(name, results)
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
