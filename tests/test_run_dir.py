"""``dca_theory.io.RunDir``: a run that fails leaves no directory that looks like a run."""

import pytest

from dca_theory import cli
from dca_theory.io import RunDir, failed_runs_discarded
from experiments import fig1


def test_a_failed_run_removes_what_it_wrote_and_the_folder_it_made(tmp_path):
    with pytest.raises(RuntimeError), failed_runs_discarded():
        run = RunDir(tmp_path / "run", {"a": 1})
        run.log(step=0)
        raise RuntimeError("crash mid-run")
    assert not (tmp_path / "run").exists()


def test_a_failed_run_keeps_the_resume_cache_and_a_folder_it_did_not_make(tmp_path):
    with pytest.raises(KeyboardInterrupt), failed_runs_discarded():
        run = RunDir(tmp_path, {"a": 1})
        (tmp_path / "job_0.npz").write_bytes(b"cached work")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["job_0.npz"]
    assert run.path == tmp_path


def test_a_finished_run_and_a_run_outside_the_block_are_left_alone(tmp_path):
    with pytest.raises(RuntimeError), failed_runs_discarded():
        done = RunDir(tmp_path / "done", {"a": 1})
        done.finish({"x": 1})
        raise RuntimeError
    assert {p.name for p in (tmp_path / "done").iterdir()} == {"config.json", "summary.json"}
    with pytest.raises(RuntimeError):
        RunDir(tmp_path / "outside", {})
        raise RuntimeError
    assert (tmp_path / "outside" / "config.json").is_file()


def test_a_crashing_experiment_run_leaves_no_run_directory(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("training failed")

    monkeypatch.setattr(fig1, "_cached_job", crash)  # fails after config.json is written
    with pytest.raises(RuntimeError, match="training failed"):
        cli.main(["run", "fig1", "--quick", "--out", str(tmp_path / "fig1")])
    assert not (tmp_path / "fig1").exists()
