"""``dca-theory lm ...``: help, bad input (one line, exit 2, nothing written), a tiny end-to-end
train → resume → eval → sample session, and ``info``."""

from __future__ import annotations

import numpy as np
import pytest

from dca_theory.cli import main


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(2)
    words = ["red", "green", "blue", "cyan", "magenta", "yellow", "black"]
    path = tmp_path / "colours.txt"
    path.write_text("\n".join(" ".join(rng.choice(words, 7)) for _ in range(150)) + "\n")
    return path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("dca-theory: error: "), err
    return err


def test_help_lists_the_sub_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["lm", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for word in ("train", "eval", "sample", "info"):
        assert word in out
    with pytest.raises(SystemExit):
        main(["lm", "train", "--help"])
    out = capsys.readouterr().out
    assert "--workdir" in out and "resumes" in out and "--grad-accum" in out


@pytest.mark.parametrize("argv, message", [
    (["--residual", "vanilla", "--k", "2"], "--k 2 needs --residual dca"),
    (["--data", "wiki"], "unknown corpus 'wiki'"),
    (["--steps", "0"], "steps must be an integer >= 1"),
    (["--seq-len", "64"], "seq_len 64 exceeds the model's max_len 32"),
    (["--data-dir", "/nonexistent/dir"], "data directory /nonexistent/dir"),
    (["--residual", "resnet"], "invalid choice: 'resnet'"),
    (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    (["--batch-size", "6", "--grad-accum", "4"], "not divisible by grad_accum"),
    (["--layer-loop", "loop"], "unknown layer_loop 'loop'; valid: unroll, scan"),
])
def test_bad_train_input_is_one_line_exit_2_and_writes_nothing(argv, message, tmp_path, capsys,
                                                               data_dir):
    workdir = tmp_path / "run"
    base = ["lm", "train", "--preset", "tiny", "--workdir", str(workdir), "--no-progress"]
    if "--data-dir" not in argv:
        base += ["--data-dir", str(data_dir)]
    assert main(base + argv) == 2
    assert message in _error_line(capsys)
    assert not workdir.exists()  # no half-written run or checkpoint


def test_eval_and_sample_of_a_missing_run(tmp_path, capsys):
    assert main(["lm", "eval", "--workdir", str(tmp_path / "none")]) == 2
    assert "no training run in" in _error_line(capsys)
    assert main(["lm", "sample", "--workdir", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "no training run in" in _error_line(capsys)


@pytest.mark.slow  # compiles the real model three times: ~1 min of CPU
def test_train_resume_eval_sample_end_to_end(tmp_path, corpus, capsys):
    workdir = tmp_path / "run"
    small = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-mlp", "32",
             "--max-len", "16", "--batch-size", "4", "--warmup", "2", "--eval-every", "2",
             "--eval-batches", "1", "--checkpoint-every", "2", "--bpe-vocab", "270"]
    argv = ["lm", "train", "--preset", "tiny", "--residual", "dca", "--k", "1", "--data",
            str(corpus), "--workdir", str(workdir), "--no-progress", *small]
    assert main(argv + ["--steps", "2"]) == 0
    assert main(argv + ["--steps", "4"]) == 0  # same workdir: resumes from step 2
    out = capsys.readouterr().out
    assert f"resuming from step 2 of 4 in {workdir}" in out  # said even with --no-progress
    assert "validation perplexity by step: 2:" in out and "4:" in out
    assert main(["lm", "eval", "--workdir", str(workdir), "--split", "test"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"checkpoint step 4 of {workdir}:\ntest: loss ") and "perplexity" in out
    sample = ["lm", "sample", "--workdir", str(workdir), "--prompt", "red green",
              "--tokens", "20", "--top-k", "3"]  # 20 tokens: past max_len 16, the window slides
    assert main(sample) == 0
    cached = capsys.readouterr().out
    assert cached.startswith("red green")
    assert main(sample + ["--no-cache"]) == 0  # the uncached sampler: the same text
    assert capsys.readouterr().out == cached
    assert main(["lm", "sample", "--workdir", str(workdir), "--prompt", "",
                 "--tokens", "5"]) == 2
    assert "zero tokens" in _error_line(capsys)


def test_info_reports_the_paper_parameter_count(capsys):
    assert main(["lm", "info", "--preset", "paper"]) == 0
    out = capsys.readouterr().out
    assert "49,653,040" in out  # the paper's 49.65M vanilla model (Flax lm1b defaults)
    for kind in ("vanilla", "dca", "grn_v1"):
        assert kind in out


@pytest.mark.slow  # two real-model runs: ~1 min of CPU
def test_retrofit_vanilla_run_into_dca_keeps_its_function(tmp_path, corpus, capsys):
    pytest.importorskip("dca_theory.lm.retrofit")
    from dca_theory.io import read_json

    small = ["--preset", "tiny", "--data", str(corpus), "--no-progress", "--layers", "2",
             "--d-model", "16", "--heads", "2", "--d-mlp", "32", "--max-len", "16",
             "--batch-size", "4", "--warmup", "2", "--eval-every", "100", "--bpe-vocab", "270"]
    assert main(["lm", "train", *small, "--residual", "vanilla", "--steps", "3",
                 "--workdir", str(tmp_path / "vanilla")]) == 0
    # one step of the continued run has learning rate 0 (warm-up starts at 0), so the
    # retrofitted model is evaluated exactly as converted
    assert main(["lm", "train", *small, "--residual", "dca", "--k", "1", "--steps", "1",
                 "--init-from", str(tmp_path / "vanilla"), "--workdir", str(tmp_path / "dca")]) == 0
    before = read_json(tmp_path / "vanilla" / "summary.json")
    after = read_json(tmp_path / "dca" / "summary.json")
    assert after["init_from"] == str(tmp_path / "vanilla")
    assert after["model"]["residual"] == "dca" and after["n_params"] > before["n_params"]
    # same function up to f32 summation order (the GRN sums the stack at once)
    assert after["valid_loss"] == pytest.approx(before["valid_loss"], rel=1e-5)
    assert after["test_loss"] == pytest.approx(before["test_loss"], rel=1e-5)
