"""The ViT training loop: weight-decay mask, data orders, loss decreases, seeds independent."""

import jax
import numpy as np
import pytest

from dca_theory.vit.config import preset
from dca_theory.vit.data import ImageSplit, load_digits
from dca_theory.vit.model import ViT
from dca_theory.vit.train import ViTTrainConfig, data_orders, decay_mask, train_vit_seeds

ONE_LAYER = preset("digits_tiny", n_layers=1)


@pytest.fixture(scope="module")
def small_digits():
    train, test = load_digits()
    # 256 training / 120 test images keep the compiled shapes and the run small.
    return (ImageSplit(train.images[:256], train.labels[:256], train.class_names),
            ImageSplit(test.images[:120], test.labels[:120], test.class_names))


def test_decay_mask_selects_weight_matrices_only():
    model = ViT(preset("digits_tiny", residual="dca"), key=jax.random.PRNGKey(0))
    mask = decay_mask(model)
    blk = mask.trunk.blocks[0]
    assert blk.attn.w_q_DxD and blk.mlp.w_in_DxF and mask.w_patch_PxD and mask.w_head_DxK
    # GRN weights (b starts at 1), norms, biases, positions and the class token are not decayed.
    assert not any([blk.grn_q.b, blk.grn_q.w, blk.ln_q.scale, blk.mlp.b_in_F, mask.pos_NxD,
                    mask.cls_D, mask.b_head_K, mask.trunk.final.b])


def test_data_orders_are_epoch_permutations():
    tc = ViTTrainConfig(steps=7, batch_size=4, warmup_steps=1)
    orders = data_orders(10, tc, seeds=[0, 1])  # 2 batches per epoch (2 examples dropped)
    assert orders.shape == (2, 7, 4)
    for seed_order in orders:
        for epoch in range(3):
            chunk = seed_order[2 * epoch:2 * epoch + 2].ravel()
            assert len(set(chunk.tolist())) == 8  # no example twice within an epoch
    assert not np.array_equal(orders[0], orders[1])
    with pytest.raises(ValueError, match="batch_size 4 exceeds the 3 training examples"):
        data_orders(3, tc, seeds=[0])


@pytest.mark.slow  # the experiment smoke test checks the same for both kinds, faster
def test_training_lowers_the_loss(small_digits):
    train, test = small_digits
    tc = ViTTrainConfig(steps=60, batch_size=32, lr=5e-3, warmup_steps=5, eval_every=30)
    r = train_vit_seeds(ONE_LAYER, tc, train, test, seeds=[0, 1], progress=False)
    # The zero-initialised head starts every model at loss ln 10 = 2.303 and accuracy ~0.1;
    # 60 AdamW steps must move both clearly. Observed: loss 1.84-1.91, accuracy 0.37-0.42;
    # the thresholds leave room for platform rounding.
    assert max(r["test_loss"]) < 2.1 and min(r["test_acc"]) > 0.25
    assert r["history"][0]["step"] == 30 and r["history"][-1]["step"] == 60


@pytest.mark.slow
def test_seeds_are_independent_of_their_batch_mates(small_digits):
    train, test = small_digits
    tc = ViTTrainConfig(steps=10, batch_size=32, lr=3e-3, warmup_steps=2, eval_every=10)
    both = train_vit_seeds(ONE_LAYER, tc, train, test, seeds=[0, 1], progress=False)
    alone = train_vit_seeds(ONE_LAYER, tc, train, test, seeds=[1], progress=False)
    # Same seed, same init and data order: equal up to float32 rounding of batched matmuls.
    np.testing.assert_allclose(both["test_loss"][1], alone["test_loss"][0], rtol=1e-4)


def test_bad_train_config():
    with pytest.raises(ValueError, match=r"warmup_steps must be in \[0, steps=10\)"):
        ViTTrainConfig(steps=10, warmup_steps=10)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ViTTrainConfig(batch_size=0)
