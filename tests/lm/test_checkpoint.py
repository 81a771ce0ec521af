"""Checkpoints: contents, atomic resume, and bitwise-exact kill-and-resume on CPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_train_helpers import build_bigram, float32, write_word_corpus

from dca_theory.io import to_jsonable
from dca_theory.lm import train as lm_train
from dca_theory.lm.checkpoint import Checkpointer
from dca_theory.lm.config import PRESETS
from dca_theory.lm.seed_loop import stack_models
from dca_theory.lm.train_config import TRAIN_PRESETS

# dropout > 0 so that resuming must also reproduce the RNG stream exactly
MODEL = PRESETS["tiny"].replace(d_model=16, max_len=16, dropout=0.2)


class Crash(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _f32():
    with float32():
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_word_corpus(tmp_path_factory.mktemp("data") / "corpus.txt", seed=1,
                             words=["one", "two", "three", "four", "five", "six", "seven"])


def _cfg(corpus, steps=7):
    # grad_accum 2 and an odd total step count: the last checkpoint is not periodic
    return TRAIN_PRESETS["tiny"].replace(
        data=str(corpus), bpe_vocab_size=260, batch_size=4, grad_accum=2, steps=steps,
        warmup_steps=2, log_every=1, eval_every=100, eval_batches=1, checkpoint_every=2,
        keep_checkpoints=5, progress=False)


@pytest.fixture(scope="module")
def _finished_two_step_run(corpus, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("finished") / "w"
    with float32():
        lm_train.train_and_evaluate(MODEL, _cfg(corpus, steps=2), workdir, build=build_bigram)
    return workdir


@pytest.fixture
def two_step_run(_finished_two_step_run, tmp_path):
    """A private copy of one finished 2-step run (trained once per module to save time)."""
    return Path(shutil.copytree(_finished_two_step_run, tmp_path / "w"))


def _params(workdir, step=None):
    model, *_ = lm_train.load_run(workdir, build=build_bigram, step=step)
    return jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_inexact_array))


def _crash_at(n):
    def hook(done):
        if done == n:
            raise Crash(f"simulated kill after step {n}")
    return hook


def test_killed_and_resumed_run_is_bitwise_identical(tmp_path, corpus):
    ref = lm_train.train_and_evaluate(MODEL, _cfg(corpus), tmp_path / "ref", build=build_bigram)
    with pytest.raises(Crash):  # dies after step 5: the newest checkpoint is step 4
        lm_train.train_and_evaluate(MODEL, _cfg(corpus), tmp_path / "run", build=build_bigram,
                                    hooks=[_crash_at(5)])
    assert Checkpointer(tmp_path / "run").latest_step() == 4
    assert not (tmp_path / "run" / "summary.json").exists()
    resumed = lm_train.train_and_evaluate(MODEL, _cfg(corpus), tmp_path / "run",
                                          build=build_bigram)
    assert resumed["resumed_from"] == 4
    for a, b in zip(_params(tmp_path / "ref"), _params(tmp_path / "run")):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise, not allclose
    assert resumed["valid_loss"] == ref["valid_loss"]
    steps = [r["step"] for r in lm_train._read_lines(tmp_path / "run" / "metrics.jsonl")
             if "loss" in r]
    assert steps == list(range(1, 8))  # lines after the checkpoint were dropped, not repeated


def test_checkpoint_holds_state_step_rng_and_data_position(two_step_run, corpus):
    from dca_theory.lm.optim import make_lm_optimizer

    cfg = _cfg(corpus, steps=2)
    model, tok, model_cfg, train_cfg = lm_train.load_run(two_step_run, build=build_bigram)
    assert model_cfg.vocab_size == tok.vocab_size and train_cfg == cfg
    # the state is stacked over the run's seeds (lm.seed_loop): one seed, a leading axis of 1
    params, _ = stack_models([model])
    template = (params, jax.vmap(make_lm_optimizer(cfg).init)(params),
                jax.random.PRNGKey(123)[None])
    ckpt = Checkpointer(two_step_run)
    try:
        assert ckpt.latest_step() == 2
        (_, opt_state, rng), meta = ckpt.restore(template)
    finally:
        ckpt.close()
    assert meta == {"step": 2, "data_step": 2, "seeds": [0], "model": to_jsonable(model_cfg)}
    counts = [x for x in jax.tree_util.tree_leaves(opt_state) if x.dtype == jnp.int32]
    assert counts and all(c.tolist() == [2] for c in counts)  # AdamW made exactly two updates
    expected_rng = jax.random.split(jax.random.PRNGKey(cfg.seed))[1]
    np.testing.assert_array_equal(rng, expected_rng[None])


def test_finished_run_is_not_retrained_and_can_be_extended(two_step_run, corpus):
    again = lm_train.train_and_evaluate(MODEL, _cfg(corpus, steps=2), two_step_run,
                                        build=build_bigram, hooks=[_crash_at(1)])
    assert again["resumed_from"] == 2  # the crash hook never fired: no step was retrained
    with pytest.raises(ValueError, match="checkpoint at step 2 > --steps 1"):
        lm_train.train_and_evaluate(MODEL, _cfg(corpus, steps=1), two_step_run,
                                    build=build_bigram)
    longer = lm_train.train_and_evaluate(MODEL, _cfg(corpus, steps=4), two_step_run,
                                         build=build_bigram)
    assert longer["resumed_from"] == 2 and Checkpointer(two_step_run).latest_step() == 4


def test_resume_with_a_different_model_is_refused(two_step_run, corpus):
    with pytest.raises(ValueError, match=r"different model\.d_model"):
        lm_train.train_and_evaluate(MODEL.replace(d_model=8), _cfg(corpus, steps=4),
                                    two_step_run, build=build_bigram)
    assert Checkpointer(two_step_run).latest_step() == 2  # nothing was overwritten
