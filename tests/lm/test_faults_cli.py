"""Fault suite, command line: every bad input and OS error of ``dca-theory ...`` and
``dca-theory lm ...`` is one line on stderr, a nonzero exit status (2 bad input, 1 OS or memory
error) and no file left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dca_theory.cli import main

REPO = Path(__file__).resolve().parents[2]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("dca-theory: error: ") and "Traceback" not in err, err
    return err


def read_only_dir(tmp_path: Path) -> Path:
    """A folder in which nothing can be created (root ignores permissions: use sysfs)."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    if not Path("/sys/kernel").is_dir():
        pytest.skip("running as root without a read-only sysfs")
    return Path("/sys")


@pytest.fixture
def tiny_text(tmp_path) -> Path:
    path = tmp_path / "tiny.txt"
    path.write_text("tiny text\n")  # 10 bytes: too short for any split
    return path


@pytest.mark.parametrize("argv, message", [
    (["--seed", "-1"], "seed must be in [0, 2**31), got -1"),
    (["--lr", "inf"], "lr must be a finite number, got inf"),
    (["--lr", "nan"], "lr must be a finite number, got nan"),
    (["--b1", "nan"], "b1 must be a finite number"),
    (["--clip-norm", "inf"], "clip_norm must be a finite number"),
    (["--dropout", "nan"], "dropout must be in [0, 1)"),
    (["--batch-size", "0"], "batch_size must be an integer >= 1"),
    (["--grn-gate", "paper"], "--grn-gate paper needs a residual with GRN-v3's gate"),
    (["--residual", "grn_v1", "--grn-gate", "open"], "got grn_v1"),
    (["--residual", "dca", "--grn-gate", "sigmoid"], "sigmoid"),
    (["--data", "TINY"], "every split needs at least 2"),
    (["--data", "DIR"], "is a directory"),
    (["--data", "MISSING/corpus.txt"], "not found"),
])
def test_bad_train_input_is_one_line_exit_2_and_leaves_nothing(argv, message, tmp_path, capsys,
                                                               data_dir, tiny_text):
    workdir = tmp_path / "run"
    (tmp_path / "DIR").mkdir()
    paths = {"TINY": str(tiny_text), "DIR": str(tmp_path / "DIR"),
             "MISSING/corpus.txt": str(tmp_path / "MISSING/corpus.txt")}
    argv = [paths.get(a, a) for a in argv]
    base = ["lm", "train", "--preset", "tiny", "--workdir", str(workdir), "--no-progress",
            "--data-dir", str(data_dir), "--data", "shakespeare"]
    assert main(base + argv) == 2
    err = one_error_line(capsys)
    assert message in err and "<= 0" not in err
    assert not workdir.exists()


def test_workdir_that_is_a_file_is_named(tmp_path, capsys, data_dir):
    target = tmp_path / "file"
    target.write_text("mine")
    assert main(["lm", "train", "--preset", "tiny", "--workdir", str(target), "--no-progress",
                 "--data-dir", str(data_dir), "--data", "shakespeare"]) == 2
    assert "is a file, not a directory" in one_error_line(capsys)
    assert target.read_text() == "mine"


def test_workdir_in_a_read_only_folder_is_one_line_exit_1(tmp_path, capsys, data_dir):
    workdir = read_only_dir(tmp_path) / "dca-theory-test" / "run"
    assert main(["lm", "train", "--preset", "tiny", "--workdir", str(workdir), "--no-progress",
                 "--data-dir", str(data_dir), "--data", "shakespeare", "--steps", "1"]) == 1
    assert "dca-theory-test" in one_error_line(capsys)
    assert not workdir.parent.exists()


def test_batch_too_large_for_memory_is_one_line_exit_1_and_leaves_nothing(tmp_path, capsys,
                                                                          data_dir):
    workdir = tmp_path / "run"
    assert main(["lm", "train", "--preset", "tiny", "--workdir", str(workdir), "--no-progress",
                 "--data-dir", str(data_dir), "--data", "shakespeare",
                 "--batch-size", str(10**12)]) == 1
    err = one_error_line(capsys)
    assert "out of memory before the first checkpoint" in err and "nothing was kept" in err
    assert not workdir.exists()


@pytest.mark.parametrize("argv, message", [
    (["eval", "--batch-size", "-4"], "--batch-size must be an integer >= 1, got -4"),
    (["eval", "--batch-size", "0"], "--batch-size must be an integer >= 1, got 0"),
    (["sample", "--prompt", "x", "--temperature", "nan"], "--temperature must be a finite"),
    (["sample", "--prompt", "x", "--temperature", "inf"], "--temperature must be a finite"),
    (["sample", "--prompt", "x", "--temperature", "-1"], "--temperature must be a finite"),
    (["eval"], "no training run in"),
    (["eval", "--checkpoint-step", "3"], "no training run in"),
])
def test_bad_eval_and_sample_input_is_one_line_exit_2(argv, message, tmp_path, capsys):
    workdir = tmp_path / "none"
    assert main(["lm", *argv, "--workdir", str(workdir)]) == 2
    assert message in one_error_line(capsys)
    assert not workdir.exists()


def test_truncated_config_json_is_named_by_eval(tmp_path, capsys):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text('{"model": {"d_model": 16,\n "n_lay')
    assert main(["lm", "eval", "--workdir", str(workdir)]) == 2
    assert "config.json line 2: not valid JSON" in one_error_line(capsys)


def test_read_only_output_folders_are_one_line_exit_1(tmp_path, capsys):
    out = read_only_dir(tmp_path) / "dca-theory-test"
    assert main(["figures", "--out", str(out / "figs")]) == 1
    assert "dca-theory-test" in one_error_line(capsys)
    assert main(["run", "rank_vs_width", "--quick", "--out", str(out / "run"),
                 "--set", "widths=1"]) == 1
    assert "dca-theory-test" in one_error_line(capsys)


def test_closed_pipe_is_one_line_exit_1(tmp_path):
    """``dca-theory run --list | head -0``: the reader is gone before anything is written."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "dca_theory.cli", "run", "--list"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert err.strip() == ("dca-theory: error: output closed before it was all written "
                           "(broken pipe)"), err


@pytest.mark.parametrize("argv", [["lm", "info"], ["run", "--list"], ["lm", "info", "--preset",
                                                                       "tiny"]])
def test_closed_stdout_is_one_line_exit_1_before_any_work(argv):
    """``dca-theory lm info >&-``: no descriptor 1 at all (not a pipe whose reader left)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m",
                           "dca_theory.cli", *argv], cwd=REPO, env=env,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == ("dca-theory: error: standard output is closed, so the results "
                                   "would be lost; redirect it instead (e.g. >/dev/null or "
                                   ">out.txt)"), proc.stderr


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc")
def test_folders_under_proc_are_os_errors_exit_1(tmp_path, capsys, data_dir):
    """``/proc`` refuses new folders with "No such file or directory": an OS error, not input."""
    assert main(["lm", "train", "--preset", "tiny", "--workdir", "/proc/dca-theory-test/run",
                 "--no-progress", "--data-dir", str(data_dir), "--data", "shakespeare"]) == 1
    assert "cannot create the folder /proc/dca-theory-test" in one_error_line(capsys)
    assert main(["figures", "--out", "/proc/dca-theory-test"]) == 1
    assert "cannot create the folder /proc/dca-theory-test" in one_error_line(capsys)


def test_model_flags_are_validated_together_after_all_are_applied(capsys):
    """The tiny preset has 4 heads: 6 is not divisible by 4, but by the 2 heads given too."""
    from dca_theory.lm.cli import _configs, build_parser

    args = build_parser().parse_args(["train", "--d-model", "6", "--heads", "2"])
    model_cfg, _ = _configs(args)
    assert (model_cfg.d_model, model_cfg.n_heads) == (6, 2)
    assert main(["lm", "train", "--d-model", "6", "--heads", "4"]) == 2
    assert "d_model=6 must be divisible by n_heads=4" in one_error_line(capsys)


@pytest.mark.parametrize("argv, message", [
    (["run", "fig1", "--show", "--set", "init_std=inf"],
     "bad value for setting 'init_std': 'inf' (expected a finite float"),
    (["run", "fig1", "--show", "--set", "init_std=nan"], "'nan' (expected a finite float"),
    (["lm", "sample", "--workdir", "WORKDIR", "--prompt", "x", "--seed", "-3"],
     "--seed must be in [0, 2**31), got -3"),
    (["lm", "train", "--residual", "dca", "--k", "5", "--layers", "1", "--workdir", "WORKDIR"],
     "--k 5 exceeds the 1 layer(s) of the model; valid: 0 to 1"),
])
def test_lax_inputs_are_refused_in_one_line_exit_2(argv, message, tmp_path, capsys):
    workdir = tmp_path / "run"
    assert main([str(workdir) if a == "WORKDIR" else a for a in argv]) == 2
    assert message in one_error_line(capsys)
    assert not workdir.exists()
