"""The training layout of ``layer_loop="scan"`` (:mod:`dca_theory.lm.layer_stack`): the blocks
stored as one stacked module.

* the round trip saved → training → saved layout is exact (bit for bit, same tree);
* in float64 the training layout gives the unrolled trunk's logits and gradients (relative to
  the largest gradient, 1e-10), and the zero-padded GRN entries get a gradient of exactly 0;
* AdamW steps in the training layout equal AdamW steps on the unrolled model (float64, 1e-9) and
  leave the padded entries exactly 0, so nothing of the padding reaches the saved model;
* the train step's program (its jaxpr, sub-programs included) has the same number of equations
  at every depth in the training layout, and grows with depth when the same scan stacks the
  blocks in each forward pass: the structural reason compile time is flat in depth;
* the trainers (``train_and_evaluate`` and ``train_lm_seeds``) train in the training layout and
  hand back, save and count parameters in the saved one.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tree_helpers import assert_trees_close
from zoo_helpers import F64, perturb, tokens

from dca_theory.lab.steptime import synthetic_batch
from dca_theory.lm import layer_stack
from dca_theory.lm.layer_stack import BlockStack, to_saved_layout, to_training_layout
from dca_theory.lm.model import build_model
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.steps import make_train_step
from dca_theory.lm.train_config import LMTrainConfig

SMALL = F64.replace(d_model=16, n_heads=2, d_mlp=32, max_len=8, layer_loop="scan")
KINDS = [{"residual": "vanilla", "n_layers": 3}, {"residual": "dca", "n_layers": 3},
         {"residual": "dca", "k": 1, "n_layers": 4}, {"residual": "grn_v2", "n_layers": 3}]


def _ids(c):
    return "-".join(f"{k}={v}" for k, v in c.items())


def _model(changes, key):
    return perturb(build_model(SMALL.replace(**changes), key=jax.random.PRNGKey(0)), key)


def _loss(model, toks):
    logits = model(toks, inference=True)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[jnp.arange(toks.shape[0]), toks])


@eqx.filter_jit
def _logits_and_grad(model, toks):
    return model(toks, inference=True), eqx.filter_grad(_loss)(model, toks)


def _padding_mask(blocks: BlockStack, field: str = "grn_q") -> np.ndarray:
    """True where a stacked GRN ``b`` entry is padding (none of its block's own entries)."""
    b = blocks.stacked.b if field == "b" else getattr(blocks.stacked, field).b
    mask = np.ones(b.shape[:2], bool)
    for t, slots in enumerate(blocks.slots):
        mask[t, list(slots)] = False
    return mask


@pytest.mark.parametrize("changes", KINDS, ids=_ids)
def test_round_trip_is_exact(changes, getkey):
    model = _model(changes, getkey())
    training = to_training_layout(model)
    assert isinstance(training.trunk.blocks, BlockStack)
    assert len(training.trunk.blocks) == model.cfg.n_layers
    back = to_saved_layout(training)
    assert jax.tree.structure(back) == jax.tree.structure(model)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(model)):
        assert np.array_equal(a, b)
    # the unrolled layout and other models pass through unchanged
    unrolled = build_model(SMALL.replace(layer_loop="unroll", **changes),
                           key=jax.random.PRNGKey(0))
    assert to_training_layout(unrolled) is unrolled
    assert to_saved_layout(unrolled) is unrolled


# (the AdamW test below, in the default run, covers the training layout's gradients through
# the steps they drive)
@pytest.mark.slow
@pytest.mark.parametrize("changes", KINDS, ids=_ids)
def test_training_layout_equals_unrolled_trunk(changes, getkey):
    model = _model(changes, getkey())
    unrolled = jax.tree_util.tree_unflatten(jax.tree.structure(build_model(
        SMALL.replace(layer_loop="unroll", **changes), key=jax.random.PRNGKey(0))),
        jax.tree.leaves(model))
    toks = tokens(3, length=SMALL.max_len) % SMALL.vocab_size
    logits, grads = _logits_and_grad(to_training_layout(model), toks)
    if changes["residual"] == "grn_v2":
        stacked = grads.trunk.grns[0]
        assert np.all(np.asarray(stacked.stacked.b)[_padding_mask(stacked, "b")] == 0.0)
    if changes["residual"] == "dca":
        pad = _padding_mask(grads.trunk.blocks)
        for grn in ("grn_q", "grn_k", "grn_v"):
            assert np.all(np.asarray(getattr(grads.trunk.blocks.stacked, grn).b)[pad] == 0.0)
    assert_trees_close((logits, to_saved_layout(grads)), _logits_and_grad(unrolled, toks),
                       rtol=1e-10)


def _adamw_steps(model, n_steps: int):
    """``n_steps`` AdamW steps (the project's optimiser and schedule) on one fixed sequence."""
    tc = LMTrainConfig(lr=1e-2, warmup_steps=0)
    opt = make_lm_optimizer(tc)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    toks = tokens(4, length=SMALL.max_len) % SMALL.vocab_size

    @jax.jit
    def step(params, state):
        grads = jax.grad(lambda p: _loss(eqx.combine(p, static), toks))(params)
        with jax.numpy_dtype_promotion("standard"):  # as make_train_step: optax's float ** int
            updates, state = opt.update(grads, state, params)
        return eqx.apply_updates(params, updates), state

    state = opt.init(params)
    for _ in range(n_steps):
        params, state = step(params, state)
    return eqx.combine(params, static)


@pytest.mark.slow  # ~30 s; the default run keeps the layout's exact round trip
def test_adamw_in_the_training_layout_equals_the_unrolled_model(getkey):
    changes = {"residual": "dca", "k": 1, "n_layers": 3}
    model = _model(changes, getkey())
    unrolled = jax.tree_util.tree_unflatten(jax.tree.structure(build_model(
        SMALL.replace(layer_loop="unroll", **changes), key=jax.random.PRNGKey(0))),
        jax.tree.leaves(model))
    trained = _adamw_steps(to_training_layout(model), 3)
    pad = _padding_mask(trained.trunk.blocks)
    assert pad.any()
    for grn in ("grn_q", "grn_k", "grn_v"):
        assert np.all(np.asarray(getattr(trained.trunk.blocks.stacked, grn).b)[pad] == 0.0)
    reference = _adamw_steps(unrolled, 3)
    assert not np.allclose(reference.embed_VxD, unrolled.embed_VxD)  # the steps moved it
    assert_trees_close(jax.tree.leaves(to_saved_layout(trained)), jax.tree.leaves(reference),
                       rtol=1e-9)


def _equations(jaxpr) -> int:
    """Equations of a jaxpr, those of its sub-programs (scan bodies, conditionals) included."""
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    n += _equations(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    n += _equations(sub)
    return n


def _train_step_equations(cfg, stacked: bool) -> int:
    model = build_model(cfg, key=jax.random.PRNGKey(0))
    if stacked:
        model = to_training_layout(model)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    tc = LMTrainConfig(seq_len=cfg.max_len, batch_size=1)
    opt = make_lm_optimizer(tc)
    args = (params, opt.init(params), jax.random.PRNGKey(1),
            synthetic_batch(1, cfg.max_len, cfg.vocab_size), jnp.asarray(0, jnp.int32))
    return _equations(jax.make_jaxpr(make_train_step(static, opt, tc))(*args).jaxpr)


@pytest.mark.parametrize("changes", [
    {"residual": "dca"}, pytest.param({"residual": "vanilla"}, marks=pytest.mark.slow),
    pytest.param({"residual": "dca", "k": 2}, marks=pytest.mark.slow),
    pytest.param({"residual": "grn_v3"}, marks=pytest.mark.slow)], ids=_ids)
def test_train_step_program_does_not_grow_with_depth(changes):
    cfg = SMALL.replace(param_dtype="float32", compute_dtype="float32", **changes)
    stacked = [_train_step_equations(cfg.replace(n_layers=d), True) for d in (4, 8)]
    assert stacked[0] == stacked[1]
    restacked = [_train_step_equations(cfg.replace(n_layers=d), False) for d in (4, 8)]
    assert restacked[1] > restacked[0] + 4 * 10  # dozens of operations per extra block


def test_padded_block_cuts_and_pads_b(getkey):
    block = build_model(SMALL.replace(residual="dca", n_layers=3),
                        key=jax.random.PRNGKey(0)).trunk.blocks[1]  # reads 2 entries
    wide = layer_stack.padded_block(block, 4)
    assert wide.grn_k.size == 4 and wide.grn_k.b.shape == (4, SMALL.d_model)
    assert np.all(np.asarray(wide.grn_k.b[2:]) == 0.0)
    back = layer_stack.padded_block(wide, 2)
    assert np.array_equal(back.grn_k.b, block.grn_k.b) and back.grn_k.size == 2


def test_trainer_saves_and_counts_the_saved_layout(tmp_path):
    """A scanned DCA model trained by ``train_and_evaluate``: its checkpoint restores as one
    module per block, equal in every array to what the unrolled layout holds, and the summary
    counts the parameters without the padding."""
    from lm_train_helpers import write_word_corpus

    from dca_theory.lm import train as lm_train
    from dca_theory.lm.params import param_count
    from dca_theory.lm.train_config import TRAIN_PRESETS

    text_corpus = write_word_corpus(tmp_path / "corpus.txt", seed=0,
                                    words=["alpha", "beta", "gamma", "delta", "eps"])

    cfg = SMALL.replace(residual="dca", n_layers=3, param_dtype="float32",
                        compute_dtype="float32", max_len=16)
    tc = TRAIN_PRESETS["tiny"].replace(
        data=str(text_corpus), bpe_vocab_size=260, batch_size=2, steps=2, warmup_steps=1,
        eval_every=2, eval_batches=1, checkpoint_every=2, progress=False)
    summary = lm_train.train_and_evaluate(cfg, tc, tmp_path / "w")
    model, _, model_cfg, _ = lm_train.load_run(tmp_path / "w")
    assert isinstance(model.trunk.blocks, tuple) and len(model.trunk.blocks) == 3
    assert [b.grn_q.b.shape[0] for b in model.trunk.blocks] == [1, 2, 3]
    assert summary["n_params"] == param_count(model_cfg)
    assert summary["n_params"] == sum(x.size for x in jax.tree.leaves(
        eqx.filter(model, eqx.is_inexact_array)))


@pytest.mark.parametrize("k, expected", [
    (2, [(0,), (0, 3), (0, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)]),  # [x, middle, last 2]
    (None, [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 3, 4)]),  # the buffer's first slots
    (4, [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 3, 4)]),  # k + 1 >= depth: full DCA
])
def test_scan_slots_put_each_output_where_the_scan_keeps_it(k, expected):
    cfg = SMALL.replace(residual="dca", k=k, n_layers=5)
    assert [layer_stack.scan_slots(cfg, t) for t in range(5)] == expected
