"""The one training loop (dca_theory.lm.seed_loop): seeds trained together compute what each
seed trained alone computes, chunks of steps compute what single steps compute, a run resumed
from a checkpoint ends where an uninterrupted one ends, an old one-seed checkpoint restores into
the seed-stacked state, and a non-finite loss stops the run naming step and seeds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_train_helpers import build_bigram

from dca_theory.lm import data as lm_data
from dca_theory.lm import seed_loop as sl
from dca_theory.lm.checkpoint import Checkpointer
from dca_theory.lm.config import PRESETS
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.steps import make_train_step
from dca_theory.lm.train_config import LMTrainConfig

TC = LMTrainConfig(data="shakespeare", seq_len=16, batch_size=4, steps=6, warmup_steps=2,
                   eval_every=3, eval_batches=1, progress=False)


@pytest.fixture(scope="module")
def corpus(data_dir):
    return lm_data.load_corpus("shakespeare", data_dir)


@pytest.fixture(scope="module")
def cfg(corpus):
    # the stand-in model (the loop is the same for every model; the zoo's compile for minutes);
    # dropout on, so that the dropout keys must match too
    return PRESETS["tiny"].replace(vocab_size=corpus.vocab_size, max_len=16, dropout=0.1)


def _train(cfg, corpus, seeds, *, chunk=1, sampler=None, start_state=None, start=0,
           steps=TC.steps, at_stop=None, stops=lambda d: False, hooks=()):
    """``(params, opt_state, losses [steps, S], valid loss [S])`` of a run of the loop."""
    params, static = sl.stack_models(sl.init_models(cfg, seeds, build=build_bigram))
    optimizer = make_lm_optimizer(TC)
    opt_state = jax.vmap(optimizer.init)(params)
    if start_state is not None:
        params, opt_state = start_state
    sampler = sampler or sl.HostBatches(corpus.train, seeds, seq_len=16, batch_size=4)
    run = sl.make_chunk_step(make_train_step(static, optimizer, TC), sampler)
    losses = np.full((TC.steps, len(seeds)), np.nan)

    def record(step0, m, seconds):
        losses[step0:step0 + m["loss"].shape[0]] = m["loss"]

    params, opt_state = sl.train_loop(params, opt_state, run, sampler,
                                      rng_S=sl.dropout_keys(seeds), start=start, steps=steps,
                                      chunk=chunk, seeds=seeds, on_metrics=record,
                                      at_stop=at_stop, stops=stops, hooks=hooks)
    valid, _ = sl.evaluate(sl.make_eval_fn(static, TC), params, corpus.valid, seq_len=16,
                           batch_size=4, max_batches=2)
    return params, opt_state, losses, valid


def test_seeds_together_equal_each_seed_alone_and_chunks_equal_single_steps(cfg, corpus):
    _, _, both, valid_both = _train(cfg, corpus, (0, 1))
    for i, seed in enumerate((0, 1)):
        _, _, alone, valid_alone = _train(cfg, corpus, (seed,))
        # Not float64: the models hold float32 parameters and compute in float32 (the LM's
        # compute dtypes are float32 and bfloat16). A vmapped matmul may sum in another order
        # than the single one: losses of about 5 measured 1-2 float32 ulps (4.8e-7) apart, so
        # rtol 1e-6 (about 10 ulps, room for 6 steps of drift); another seed's batches move
        # the loss far more (the last assertion).
        np.testing.assert_allclose(both[:, i], alone[:, 0], rtol=1e-6, atol=0)
        np.testing.assert_allclose(valid_both[i], valid_alone[0], rtol=1e-6, atol=0)
    assert not np.allclose(both[:, 0], both[:, 1])  # different data and initialisation
    # three steps per compiled call (lax.scan) compute what one step per call does
    _, _, chunked, valid_chunked = _train(cfg, corpus, (0, 1), chunk=3)
    np.testing.assert_allclose(chunked, both, rtol=1e-6, atol=0)
    np.testing.assert_allclose(valid_chunked, valid_both, rtol=1e-6, atol=0)


class Interrupt(Exception):
    pass


def test_a_run_resumed_from_a_checkpoint_equals_an_uninterrupted_one(cfg, corpus, tmp_path):
    seeds = (0, 1)
    params, opt_state, losses, valid = _train(cfg, corpus, seeds)
    ckpt = Checkpointer(tmp_path, seed_stacked=True)

    def save(done, p, o):
        ckpt.save(done, (p, o, sl.dropout_keys(seeds)), sl.checkpoint_meta(done, seeds, cfg))

    def kill(done):
        if done == 5:
            raise Interrupt

    with pytest.raises(Interrupt):  # killed after step 5; the newest checkpoint is step 4
        _train(cfg, corpus, seeds, at_stop=save, stops=lambda d: d % 2 == 0, hooks=[kill])
    ckpt.wait()
    template = _train(cfg, corpus, seeds, steps=0)[:2]
    step, (p, o, _), meta = ckpt.restore_newest((*template, sl.dropout_keys(seeds)))
    ckpt.close()
    assert step == 4 and meta["seeds"] == [0, 1]
    p2, o2, rest, valid2 = _train(cfg, corpus, seeds, start_state=(p, o), start=4)
    np.testing.assert_array_equal(rest[4:], losses[4:])  # the same inputs: bit for bit
    np.testing.assert_array_equal(valid2, valid)
    for a, b in zip(jax.tree_util.tree_leaves((p2, o2)),
                    jax.tree_util.tree_leaves((params, opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_device_windows_chunked_equal_single_steps(cfg, corpus):
    seeds = (0, 1)
    keys = jnp.stack([jax.random.PRNGKey(1000 + s) for s in seeds])
    windows = sl.DeviceWindows(jnp.asarray(corpus.train[:4096]), keys, seq_len=16, batch_size=4)
    _, _, one, _ = _train(cfg, corpus, seeds, sampler=windows)
    _, _, chunked, _ = _train(cfg, corpus, seeds, sampler=windows, chunk=6)
    np.testing.assert_allclose(chunked, one, rtol=1e-6, atol=0)
    assert np.all(np.isfinite(one)) and not np.allclose(one[:, 0], one[:, 1])


def test_a_one_seed_checkpoint_without_the_seed_axis_restores_stacked(cfg, tmp_path):
    params, _ = sl.stack_models(sl.init_models(cfg, (3,), build=build_bigram))
    one = sl.seed_slice(params, 0)
    old = Checkpointer(tmp_path)
    old.save(2, one, {"step": 2, "data_step": 2, "seed": 3})  # the CLI's meta before the axis
    old.wait()
    old.close()
    ckpt = Checkpointer(tmp_path, seed_stacked=True)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    step, restored, meta = ckpt.restore_newest(zeros)
    ckpt.close()
    assert step == 2 and meta["seed"] == 3
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(params)):
        assert a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_non_finite_loss_stops_naming_the_step_and_the_seeds(cfg, corpus):
    class Poisoned(sl.HostBatches):
        def host(self, step0, k):
            data = super().host(step0, k)
            if step0 == 2:  # seed 1's weights all zero: its mean loss is 0/0
                data["weights"][:, 1] = 0.0
            return data

    sampler = Poisoned(corpus.train, (0, 1), seq_len=16, batch_size=4)
    with pytest.raises(sl.NonFiniteLossError, match=r"non-finite loss nan / grad norm .* at "
                                                    r"step 3 for seeds \[1\]"):
        _train(cfg, corpus, (0, 1), sampler=sampler)
