"""Mid-run checkpoints of the multi-seed trainer (the training loop's orbax format): a run
interrupted and resumed ends exactly where an uninterrupted run ends; a checkpoint of another run,
or a damaged one, is refused in one line; the run cache deletes the checkpoints once the run's
record is written, and names a checkpoint of the older single-file format instead of reading it."""

import json

import jax
import numpy as np
import pytest

from dca_theory.lab import lm_runs
from dca_theory.lab import seeds as lab_seeds
from dca_theory.lab.lm_evidence_analysis import cumulative_eval_times
from dca_theory.lab.seeds import train_lm_seeds
from dca_theory.lm import data as lm_data
from dca_theory.lm.config import PRESETS
from dca_theory.lm.train_config import LMTrainConfig

TC = LMTrainConfig(data="shakespeare", seq_len=16, batch_size=4, steps=10, warmup_steps=2,
                   eval_every=3, eval_batches=1, log_every=1, progress=False)
# The checkpoint is a list of arrays, whatever the model: the cheapest model to compile will do
# (vanilla; the bit-for-bit equality covers every leaf of parameters and AdamW state).
CFG = PRESETS["tiny"].replace(residual="vanilla")


class Interrupt(Exception):
    pass


@pytest.fixture(scope="module")
def corpus(data_dir):
    return lm_data.load_corpus("shakespeare", data_dir)


def _stop_at(step):
    def log(**record):
        if record["kind"] == "train" and record["step"] == step:
            raise Interrupt
    return log


# ~40 s; the default run keeps the run cache's resume and the trainer's bitwise resume
@pytest.mark.slow
def test_a_resumed_run_equals_an_uninterrupted_one_bit_for_bit(corpus, tmp_path):
    whole = train_lm_seeds(CFG, TC, (0, 1), corpus=corpus, keep_params=True, final_batches=2)
    ckpt = tmp_path / "partial"
    with pytest.raises(Interrupt):  # killed after step 7; the last checkpoint is at step 4
        train_lm_seeds(CFG, TC, (0, 1), corpus=corpus, checkpoint=ckpt, checkpoint_every=4,
                       log=_stop_at(7))
    assert (ckpt / "checkpoints" / "4").is_dir()
    resumed = train_lm_seeds(CFG, TC, (0, 1), corpus=corpus, keep_params=True, final_batches=2,
                             checkpoint=ckpt, checkpoint_every=4)
    assert resumed.restart_steps == (0, 4)
    np.testing.assert_array_equal(resumed.loss_SxT, whole.loss_SxT)
    np.testing.assert_array_equal(resumed.grad_norm_SxT, whole.grad_norm_SxT)
    for a, b in zip(jax.tree_util.tree_leaves(resumed.params),
                    jax.tree_util.tree_leaves(whole.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [e["step"] for e in resumed.evals] == [e["step"] for e in whole.evals] == [3, 6, 9, 10]
    for a, b in zip(resumed.evals, whole.evals):
        np.testing.assert_array_equal(a["valid_loss"], b["valid_loss"])
    np.testing.assert_array_equal(resumed.final["test"], whole.final["test"])
    assert resumed.record()["restart_steps"] == [0, 4]


def test_a_checkpoint_of_another_run_or_a_damaged_one_is_refused(corpus, tmp_path, capsys):
    ckpt = tmp_path / "partial"
    with pytest.raises(Interrupt):
        train_lm_seeds(CFG, TC, (0, 1), corpus=corpus, checkpoint=ckpt, checkpoint_every=2,
                       log=_stop_at(3))
    with pytest.raises(ValueError, match="belongs to a different run") as err:
        train_lm_seeds(CFG, TC.replace(lr=TC.lr * 2), (0, 1), corpus=corpus, checkpoint=ckpt)
    assert "\n" not in str(err.value) and str(ckpt) in str(err.value)
    with pytest.raises(ValueError, match="belongs to a different run"):
        train_lm_seeds(CFG, TC, (0, 2), corpus=corpus, checkpoint=ckpt)
    # a config field the checkpoint's writer did not have yet is not a difference
    stored = json.loads(lab_seeds.fingerprint(CFG, TC.validate(), (0, 1), ()))
    current = {**stored, "model": {**stored["model"], "a_later_field": "x"}}
    assert lab_seeds.same_run(json.dumps(stored), json.dumps(current))
    changed = {**stored, "model": {**stored["model"], "d_model": 2 * CFG.d_model}}
    assert not lab_seeds.same_run(json.dumps(stored), json.dumps(changed))
    # the only checkpoint (step 2) truncated: it does not restore, and it is not deleted
    for f in (ckpt / "checkpoints" / "2" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(f.read_bytes()[:8])
    with pytest.raises(ValueError, match="restores cleanly") as err:
        train_lm_seeds(CFG, TC, (0, 1), corpus=corpus, checkpoint=ckpt)
    assert "\n" not in str(err.value)
    assert [p.name for p in (ckpt / "checkpoints").iterdir()] == ["2"]


def test_the_run_cache_resumes_and_then_deletes_its_checkpoint(corpus, tmp_path, monkeypatch,
                                                               capsys):
    spec = lm_runs.RunSpec(label="ckpt", model=CFG, train=TC, seeds=(0, 1), final_batches=2)
    monkeypatch.setattr(lm_runs, "CHECKPOINT_EVERY", 4)
    monkeypatch.setattr(lm_runs, "cached_corpus", lambda *a: corpus)
    folder = tmp_path / spec.key

    def stop(**record):
        if record.get("kind") == "train" and record["step"] == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        lm_runs.ensure_run(spec, tmp_path, log=stop)
    assert (folder / lm_runs.PARTIAL).is_dir() and not lm_runs.is_cached(spec, tmp_path)
    record = lm_runs.ensure_run(spec, tmp_path)
    assert "resuming ckpt from step 4 of 10" in capsys.readouterr().err
    assert record["restart_steps"] == [0, 4]
    assert not (folder / lm_runs.PARTIAL).exists()
    curves = lm_runs.load_curves(spec, tmp_path)
    # the resumed step's compilation is replaced by the median step, like step 0's
    t = curves["step_time"].astype(float)
    median = np.median(np.delete(t, [0, 4]))
    expected = np.cumsum(np.where(np.isin(np.arange(10), [0, 4]), median, t))
    np.testing.assert_allclose(cumulative_eval_times(curves), expected[curves["eval_steps"] - 1])


def test_the_run_cache_names_a_checkpoint_of_the_older_format(corpus, tmp_path, monkeypatch):
    spec = lm_runs.RunSpec(label="old", model=CFG, train=TC, seeds=(0, 1), final_batches=2)
    monkeypatch.setattr(lm_runs, "cached_corpus", lambda *a: corpus)
    (tmp_path / spec.key).mkdir()
    (tmp_path / spec.key / lm_runs.OLD_PARTIAL).write_bytes(b"PK")
    with pytest.raises(ValueError, match=r"partial\.npz is a checkpoint in a format .* delete "
                                         r"it to train this run from step 0") as err:
        lm_runs.ensure_run(spec, tmp_path)
    assert "\n" not in str(err.value) and not lm_runs.is_cached(spec, tmp_path)


def test_restore_params_retrains_the_same_models_and_keeps_the_record(corpus, tmp_path,
                                                                      monkeypatch):
    """A committed run has no parameters; restoring retrains them from the seeds (bit for bit
    on one host and code version) and leaves the record and curves as they were (so does
    ``load_models``, which restores them). A replicate whose perplexities differ from the
    record's by rounding-sized gaps (mean 0) is used and its gaps saved; one whose mean moves
    moves nothing and names the run."""
    spec = lm_runs.RunSpec(label="restore", model=CFG, train=TC, seeds=(0, 1), final_batches=2)
    monkeypatch.setattr(lm_runs, "cached_corpus", lambda *a: corpus)
    folder = tmp_path / spec.key
    lm_runs.ensure_run(spec, tmp_path)
    with np.load(folder / "params.npz") as f:
        trained = {k: f[k] for k in f.files}
    kept = {n: (folder / n).read_bytes() for n in ("record.json", "curves.npz")}
    (folder / "params.npz").unlink()
    assert lm_runs.restore_params(spec, tmp_path) == folder / "params.npz"
    with np.load(folder / "params.npz") as f:
        assert set(f.files) == set(trained)
        for k in f.files:
            np.testing.assert_array_equal(f[k], trained[k])
    assert {n: (folder / n).read_bytes() for n in kept} == kept
    assert not (folder / lm_runs.RESTORE).exists()
    gaps = json.loads((folder / lm_runs.RESTORED).read_text())
    assert gaps["test"]["per_seed"] == [0.0, 0.0] and gaps["valid"]["mean"] == 0.0
    # the analyses' loader restores the same way, record and curves untouched
    (folder / "params.npz").unlink()
    models = lm_runs.load_models(spec, tmp_path)
    assert len(models) == 2 and (folder / "params.npz").is_file()
    assert {n: (folder / n).read_bytes() for n in kept} == kept

    # a record from another host: the same experiment, seeds 0.4 points apart either way
    record = json.loads(kept["record.json"])
    record["test_ppl"] = [record["test_ppl"][0] * np.exp(0.004),
                          record["test_ppl"][1] * np.exp(-0.004)]
    (folder / "record.json").write_text(json.dumps(record))
    (folder / "params.npz").unlink()
    lm_runs.restore_params(spec, tmp_path)
    gaps = json.loads((folder / lm_runs.RESTORED).read_text())
    assert gaps["test"]["per_seed"] == pytest.approx([-0.4, 0.4], abs=1e-9)
    assert gaps["test"]["mean"] == pytest.approx(0.0, abs=1e-9)

    # another experiment: every seed 1 % away, so the mean moves by a point
    record["test_ppl"] = [p * 1.01 for p in json.loads(kept["record.json"])["test_ppl"]]
    (folder / "record.json").write_text(json.dumps(record))
    (folder / "params.npz").unlink()
    with pytest.raises(ValueError, match=r"restore-\w+: retrained test perplexities .* differ "
                                         r"from the record's .* by a mean of -1.00 points .* "
                                         r"parameters not restored") as err:
        lm_runs.restore_params(spec, tmp_path)
    assert "\n" not in str(err.value) and not (folder / "params.npz").exists()
    tampered = (folder / "record.json").read_bytes()
    with pytest.raises(ValueError, match=r"parameters not restored"):
        lm_runs.load_models(spec, tmp_path)
    assert (folder / "record.json").read_bytes() == tampered


def test_restore_params_refuses_a_run_not_in_the_cache(tmp_path):
    spec = lm_runs.RunSpec(label="absent", model=CFG, train=TC, seeds=(0,), final_batches=2)
    with pytest.raises(ValueError, match=r"absent-\w+ is not in the run cache .* train it"):
        lm_runs.restore_params(spec, tmp_path)
