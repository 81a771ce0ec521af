"""Fault suite, run-directory bookkeeping: reruns and resumes after kills never write a NaN
summary, never repeat or lose an evaluation line; ``metrics.jsonl`` and ``config.json`` errors
name the file and line; the corpus fingerprint and the stored settings are checked on resume;
failed starts leave nothing behind."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from lm_train_helpers import build_bigram, float32, write_word_corpus

from dca_theory.lm import train as lm_train
from dca_theory.lm.checkpoint import Checkpointer
from dca_theory.lm.config import PRESETS
from dca_theory.lm.train_config import TRAIN_PRESETS

MODEL = PRESETS["tiny"].replace(d_model=16, max_len=16)


@pytest.fixture(autouse=True)
def _f32():
    with float32():
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_word_corpus(tmp_path_factory.mktemp("data") / "corpus.txt", seed=3,
                             words=["ash", "birch", "cedar", "elm", "fir", "oak", "yew"])


def run_cfg(corpus, **changes):
    return TRAIN_PRESETS["tiny"].replace(**{
        "data": str(corpus), "bpe_vocab_size": 260, "batch_size": 4, "steps": 4,
        "warmup_steps": 2, "log_every": 1, "eval_every": 2, "eval_batches": 1,
        "checkpoint_every": 2, "keep_checkpoints": 5, "progress": False, **changes})


@pytest.fixture(scope="module")
def _finished(corpus, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("finished") / "w"
    with float32():
        lm_train.train_and_evaluate(MODEL, run_cfg(corpus), workdir, build=build_bigram)
    return workdir


@pytest.fixture
def run(_finished, tmp_path):
    return Path(shutil.copytree(_finished, tmp_path / "w"))


def lines(workdir: Path) -> list[str]:
    return (workdir / "metrics.jsonl").read_text().splitlines()


def evals(workdir: Path) -> list[dict]:
    return [r for r in map(json.loads, lines(workdir)) if "loss" not in r]


def test_rerunning_a_finished_run_changes_neither_summary_nor_history(run, corpus, capsys):
    before = json.loads((run / "summary.json").read_text())
    history = lines(run)
    again = lm_train.train_and_evaluate(MODEL, run_cfg(corpus), run, build=build_bigram)
    assert "resuming from step 4 of 4 in" in capsys.readouterr().out
    assert lines(run) == history  # no repeated final evaluation
    assert math.isfinite(again["final_train_loss"])
    assert again["final_train_loss"] == before["final_train_loss"]
    for key in ("valid_loss", "test_loss", "valid_ppl_history", "test_tokens"):
        assert again[key] == before[key], key


def test_kill_during_the_final_evaluation_resumes_without_duplicates(run, corpus):
    history = lines(run)
    assert "test_loss" in history[-1]
    (run / "metrics.jsonl").write_text("\n".join(history[:-1]) + "\n")  # test score never logged
    (run / "summary.json").unlink()
    summary = lm_train.train_and_evaluate(MODEL, run_cfg(corpus), run, build=build_bigram)
    assert lines(run) == history and math.isfinite(summary["final_train_loss"])


def test_evaluation_lost_between_checkpoint_and_eval_is_redone(run, corpus):
    reference = evals(run)
    shutil.rmtree(run / "checkpoints" / "4")  # killed after checkpoint 2, before its evaluation
    kept = [ln for ln in lines(run) if json.loads(ln)["step"] < 2 or
            (json.loads(ln)["step"] == 2 and "loss" in json.loads(ln))]
    (run / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    (run / "summary.json").unlink()
    summary = lm_train.train_and_evaluate(MODEL, run_cfg(corpus), run, build=build_bigram)
    assert evals(run) == reference  # the step-2 evaluation is back, bitwise the same
    assert [s for s, _ in summary["valid_ppl_history"]] == [2, 4]


def test_partial_last_metrics_line_is_dropped_and_a_bad_middle_line_is_named(run, corpus):
    history = lines(run)
    (run / "metrics.jsonl").write_text("\n".join(history) + '\n{"step": 5, "lo')  # kill mid-write
    lm_train.train_and_evaluate(MODEL, run_cfg(corpus), run, build=build_bigram)
    assert lines(run) == history
    (run / "metrics.jsonl").write_text(history[0] + "\n{oops\n" + "\n".join(history[1:]) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl line 2: not valid JSON") as err:
        lm_train.train_and_evaluate(MODEL, run_cfg(corpus), run, build=build_bigram)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["model"].update(bogus=1), r"unknown model key 'bogus'"),
    (lambda r: r["train"].update(compute_dtype="int8"), r"compute_dtype must be one of"),
    (lambda r: r.update(extra={}), r"unknown key 'extra'"),
    (lambda r: r["train"].update(lr="fast"), r"lr must be a finite number"),
    (lambda r: r["model"].update(d_model=0), r"d_model must be a positive integer"),
])
def test_config_json_is_validated_on_load(run, edit, message, unchecked):
    # (unchecked: outside the tests no annotation is checked; the loader's checks stand)
    record = json.loads((run / "config.json").read_text())
    edit(record)
    (run / "config.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=message) as err:
        lm_train.load_run(run, build=build_bigram)
    assert "config.json" in str(err.value) and "\n" not in str(err.value)


def test_truncated_config_json_names_the_file_and_line(run):
    text = (run / "config.json").read_text()
    (run / "config.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"config\.json line \d+: not valid JSON"):
        lm_train.load_run(run, build=build_bigram)


def test_changed_corpus_is_refused_and_a_relative_path_to_it_resumes(run, corpus, tmp_path):
    record = json.loads((run / "config.json").read_text())
    assert len(record["corpus_sha256"]) == 64 and Path(record["train"]["data"]).is_absolute()
    cwd = os.getcwd()
    os.chdir(corpus.parent)
    try:  # the same file by a relative path: resumes (extends the run by two steps)
        summary = lm_train.train_and_evaluate(MODEL, run_cfg(corpus.name, steps=6), run,
                                              build=build_bigram)
    finally:
        os.chdir(cwd)
    assert summary["resumed_from"] == 4
    changed = tmp_path / "corpus.txt"
    changed.write_text(corpus.read_text().replace("oak", "pine"))
    record["train"]["data"] = str(changed)
    (run / "config.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"corpus .* changed since the run .* started"):
        lm_train.train_and_evaluate(MODEL, run_cfg(changed, steps=8), run, build=build_bigram)


def test_changed_optimiser_on_resume_is_refused_naming_the_stored_value(run, corpus):
    config = (run / "config.json").read_text()
    with pytest.raises(ValueError, match=r"train\.weight_decay \(stored 0\.1, given 0\.01\)"):
        lm_train.train_and_evaluate(MODEL, run_cfg(corpus, weight_decay=0.01, steps=6), run,
                                    build=build_bigram)
    assert (run / "config.json").read_text() == config


def test_failed_fresh_start_leaves_nothing_and_the_retry_starts(corpus, tmp_path, monkeypatch):
    workdir = tmp_path / "new"

    def explode(done):
        raise MemoryError("simulated: out of device memory at the first step")

    with pytest.raises(MemoryError, match=r"before the first checkpoint .* nothing was kept"):
        lm_train.train_and_evaluate(MODEL, run_cfg(corpus), workdir, build=build_bigram,
                                    hooks=[explode])
    assert not workdir.exists()
    # a start killed before its first checkpoint (only config.json left) starts afresh
    workdir.mkdir()
    (workdir / "config.json").write_text("{}")
    summary = lm_train.train_and_evaluate(MODEL, run_cfg(corpus, batch_size=2), workdir,
                                          build=build_bigram)
    assert summary["resumed_from"] == 0


def test_failure_after_a_checkpoint_leaves_a_resumable_run_and_names_the_removal(corpus,
                                                                                 tmp_path):
    workdir = tmp_path / "w"

    def explode(done):
        if done == 3:
            raise MemoryError("simulated")

    with pytest.raises(MemoryError, match=r"resumes from its newest checkpoint \(step 2\).*"
                                          r"remove it with: rm -r "):
        lm_train.train_and_evaluate(MODEL, run_cfg(corpus), workdir, build=build_bigram,
                                    hooks=[explode])
    assert Checkpointer(workdir).latest_step() == 2


def test_diverged_parameters_are_never_checkpointed_nor_claimed(corpus, tmp_path, monkeypatch):
    real = lm_train.make_train_step

    def overflowing(*args, **kw):  # the update overflows while the step's loss is finite
        step = real(*args, **kw)

        def poisoned(params, opt_state, rng, batch, i):
            params, opt_state, metrics = step(params, opt_state, rng, batch, i)
            return jax.tree_util.tree_map(lambda x: x * jnp.nan, params), opt_state, metrics
        return poisoned

    monkeypatch.setattr(lm_train, "make_train_step", overflowing)
    with pytest.raises(lm_train.NonFiniteLossError,
                       match=r"non-finite parameters after step 1; .*No checkpoint had been "
                             r"written") as err:
        lm_train.train_and_evaluate(MODEL, run_cfg(corpus, checkpoint_every=1), tmp_path / "w",
                                    build=build_bigram)
    assert "step 0" not in str(err.value)
    assert not (tmp_path / "w").exists()


def test_eval_of_a_diverged_checkpoint_is_an_error(run):
    from dca_theory.lm.optim import make_lm_optimizer

    model, _, _, train_cfg = lm_train.load_run(run, build=build_bigram)
    params = eqx.filter(model, eqx.is_inexact_array)
    state = (jax.tree_util.tree_map(lambda x: x * jnp.nan, params),
             make_lm_optimizer(train_cfg).init(params), jax.random.PRNGKey(0))
    ckpt = Checkpointer(run, keep=5)
    ckpt.save(6, state, {"step": 6, "data_step": 6, "seed": 0})
    ckpt.wait()
    ckpt.close()
    with pytest.raises(lm_train.NonFiniteLossError, match=r"checkpoint step 6 .* non-finite"):
        lm_train.evaluate_run(run, ("valid",), build=build_bigram)


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.unlink(), r"metrics\.jsonl is missing but the run has a checkpoint at step 4"),
    (lambda p: p.write_text(""), r"has no training loss at step 4, the run's last step"),
    (lambda p: p.write_text("\n".join(p.read_text().splitlines()[:2]) + "\n"),
     r"has no training loss at step 4"),
    (lambda p: p.write_text(p.read_text().replace('"loss": ', '"loss": "x", "was": ', 1)),
     r"metrics\.jsonl line 1: loss must be a number, got 'x'"),
    (lambda p: p.write_text(p.read_text().replace('"step": 1,', '"step": 1, "lr": null,', 1)),
     r"metrics\.jsonl line 1: lr must be a number, got None"),
])
def test_missing_or_damaged_history_is_refused_and_no_nan_summary_written(run, corpus, damage,
                                                                          message):
    """A finished run whose metrics.jsonl went missing cannot rebuild its training losses from
    a checkpoint: refused in one line instead of a summary with final_train_loss NaN."""
    summary = (run / "summary.json").read_text()
    damage(run / "metrics.jsonl")
    with pytest.raises(ValueError, match=message) as err:
        lm_train.train_and_evaluate(MODEL, run_cfg(corpus), run, build=build_bigram)
    assert "\n" not in str(err.value)
    assert (run / "summary.json").read_text() == summary  # neither removed nor rewritten


def test_config_naming_another_residual_is_named_not_the_checkpoints(run, corpus):
    record = json.loads((run / "config.json").read_text())
    assert record["model"]["residual"] == "vanilla"
    record["model"]["residual"] = "dca"
    (run / "config.json").write_text(json.dumps(record))
    expected = (r"config\.json: model\.residual is 'dca' but checkpoint step 4 was trained "
                r"with 'vanilla'; restore config\.json")
    with pytest.raises(ValueError, match=expected):
        lm_train.evaluate_run(run, ("valid",), build=build_bigram)
    with pytest.raises(ValueError, match=expected):  # a resume with matching flags, too
        lm_train.train_and_evaluate(MODEL.replace(residual="dca"), run_cfg(corpus, steps=6),
                                    run, build=build_bigram)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2", "4"]
