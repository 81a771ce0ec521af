"""The multi-seed trainer: seeds are independent runs, step 0 scores the initial model, and the
record is consistent with the per-step arrays."""

import equinox as eqx
import jax
import numpy as np
import pytest

from dca_theory.lab.seeds import init_models, train_lm_seeds
from dca_theory.lm import data as lm_data
from dca_theory.lm.config import PRESETS
from dca_theory.lm.steps import weighted_nll
from dca_theory.lm.train_config import LMTrainConfig

TC = LMTrainConfig(data="shakespeare", seq_len=16, batch_size=4, steps=3, warmup_steps=1,
                   eval_every=2, eval_batches=1, log_every=1, progress=False)


@pytest.fixture(scope="module")
def corpus(data_dir):
    return lm_data.load_corpus("shakespeare", data_dir)


def test_seeds_are_independent_and_step0_scores_the_initial_model(corpus):
    cfg = PRESETS["tiny"]
    both = train_lm_seeds(cfg, TC, (3, 5), corpus=corpus, final_batches=2, keep_params=True)
    alone = train_lm_seeds(cfg, TC, (5,), corpus=corpus, final_batches=2)
    # seed 5 trained next to seed 3 (vmap) = seed 5 alone; only summation order may differ
    np.testing.assert_allclose(both.loss_SxT[1], alone.loss_SxT[0], rtol=1e-5)
    np.testing.assert_allclose(both.final["test"][1], alone.final["test"][0], rtol=1e-5)
    assert not np.allclose(both.loss_SxT[0], both.loss_SxT[1])  # different data and init
    # the loss logged at step 0 is the initial model's loss on seed 3's first batch
    model = init_models(both.model_cfg, (3,))[0]
    batch = lm_data.train_batch(corpus.train, seq_len=16, batch_size=4, seed=3, step=0)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    nll, w = weighted_nll(params, static, batch, None, jax.numpy.float32)
    np.testing.assert_allclose(both.loss_SxT[0, 0], float(nll / w), rtol=1e-5)
    rec = both.record()
    assert [e["step"] for e in rec["valid_history"]] == [2, 3]
    np.testing.assert_allclose(rec["test_ppl"], np.exp(both.final["test"]))
    assert rec["final_train_loss"] == both.loss_SxT[:, -1].tolist()
    # the trained parameters of seed 5 moved away from its initial ones
    trained = both.model(1)
    assert not np.allclose(trained.embed_VxD, init_models(both.model_cfg, (5,))[0].embed_VxD)


def test_bad_seeds_and_start_models_are_refused(corpus, unchecked):
    cfg = PRESETS["tiny"]
    with pytest.raises(ValueError, match="seeds must be distinct"):
        train_lm_seeds(cfg, TC, (1, 1), corpus=corpus)
    with pytest.raises(ValueError, match="starting models for 2 seeds"):
        train_lm_seeds(cfg, TC, (1, 2), corpus=corpus, models=[object()])


@pytest.mark.slow
def test_scanned_models_train_and_count_without_the_padding(corpus):
    """``layer_loop="scan"`` models (dca_theory.lm.scanned) train seed-stacked; the runs hand
    back the scanned model and count parameters without the stored GRN padding."""
    from dca_theory.lm.params import count_params, param_count
    from dca_theory.lm.scanned import ScannedTrunk

    cfg = PRESETS["tiny"].replace(residual="dca", n_layers=3, layer_loop="scan")
    runs = train_lm_seeds(cfg, TC, (0, 1), corpus=corpus, final_batches=1, keep_params=True)
    assert runs.n_params == param_count(runs.model_cfg)
    model = runs.model(1)
    assert isinstance(model.trunk, ScannedTrunk) and count_params(model) == runs.n_params
    assert np.all(np.isfinite(runs.final["test"]))
