"""``layer_loop="scan"``: the scanned trunk (:mod:`dca_theory.lm.scanned`) as a model option.

* ``build_model`` with ``layer_loop="scan"`` builds the scanned trunk with exactly the values of
  the per-block model from the same key, and the whole model (embeddings, head) gives the same
  logits and gradients in float64 (relative to the largest, 1e-10);
* the per-layer states come out of the scan;
* AdamW steps leave the stacked GRNs' zero padding exactly zero (its gradient is exactly 0), so
  the stored padding never carries a value;
* the train step's program has the same number of equations at depths 4 and 8 (compile time
  flat in depth), where the per-block model's grows;
* the trainer saves, restores and counts the scanned model (padding excluded);
* every LM kind has a mixer, so ``scan`` is valid for each; bad values are refused in one line.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tree_helpers import assert_trees_close
from zoo_helpers import F64, logits_and_gradient, perturb, tokens

from dca_theory import schemes
from dca_theory.lab.lm_runs import KEY_BASELINE_MODEL, _non_default
from dca_theory.lab.steptime import synthetic_batch
from dca_theory.lm import layer_stack
from dca_theory.lm.driver import layer_of, read_groups
from dca_theory.lm.model import build_model
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.params import count_params, param_count
from dca_theory.lm.scanned import ScannedTrunk
from dca_theory.lm.steps import make_train_step
from dca_theory.lm.train_config import LMTrainConfig

RTOL = 1e-10
SMALL = F64.replace(d_model=16, n_heads=2, d_mlp=32, max_len=8)


def _scanned(model):
    """The per-block ``model`` with its trunk converted (exactly) to the scanned layout."""
    cfg = model.cfg.replace(layer_loop="scan")
    trunk = ScannedTrunk.from_trunk(model.trunk)
    trunk = ScannedTrunk(cfg=cfg, blocks=trunk.blocks, mixer=trunk.mixer)
    return dataclasses.replace(model, cfg=cfg, trunk=trunk)


# The model around the trunk (embedding, positions, head) is the same for every kind; each
# kind's trunk is compared in tests/lm/test_scanned.py, so DCA here repeats a covered path.
@pytest.mark.parametrize("changes", [
    {"residual": "vanilla", "n_layers": 2},
    pytest.param({"residual": "dca", "n_layers": 3}, marks=pytest.mark.slow),
    pytest.param({"residual": "hyper_connections", "n_layers": 2}, marks=pytest.mark.slow),
], ids=lambda c: c["residual"])
def test_scan_model_equals_the_per_block_model(changes):
    cfg = SMALL.replace(**changes)
    unrolled = build_model(cfg, key=jax.random.PRNGKey(0))
    scanned = build_model(cfg.replace(layer_loop="scan"), key=jax.random.PRNGKey(0))
    assert isinstance(scanned.trunk, ScannedTrunk)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)),
                                     eqx.filter(scanned, eqx.is_array),
                                     eqx.filter(_scanned(unrolled), eqx.is_array)))
    unrolled = perturb(unrolled, jax.random.PRNGKey(1))
    toks = tokens(5, length=cfg.max_len) % cfg.vocab_size
    logits_u, grad_u = logits_and_gradient(unrolled, toks)
    logits_s, grad_s = logits_and_gradient(_scanned(unrolled), toks)
    assert_trees_close(logits_s, logits_u, rtol=RTOL)
    assert_trees_close(eqx.filter(grad_s, eqx.is_array),
                       eqx.filter(_scanned(grad_u), eqx.is_array), rtol=RTOL)


def test_states_come_from_the_scan():
    cfg = SMALL.replace(residual="dca", k=1, n_layers=3, layer_loop="scan")
    model = build_model(cfg, key=jax.random.PRNGKey(0))
    toks = tokens(6, length=SMALL.max_len) % SMALL.vocab_size
    logits, states = model.forward_with_states(toks, inference=True)
    assert {"block_2_out", "stack_2", "final"} <= set(states)
    assert states["stack_0"].shape == (1, cfg.max_len, cfg.d_model)  # x alone
    assert states["stack_2"].shape == (3, cfg.max_len, cfg.d_model)  # [x, middle, last 1]
    assert_trees_close(logits, model(toks, inference=True), rtol=RTOL)


def _padding(model) -> list[np.ndarray]:
    """The stored zero padding of a scanned DCA model's GRNs (every b row outside its
    block's slots)."""
    mixer, out = model.trunk.mixer, []
    for t in range(model.cfg.n_layers):
        p = layer_of(mixer.layers, t)
        pad = [i for i in range(p.grn_q.size) if i not in mixer.stack_slots(t)]
        out += [np.asarray(g.b)[pad] for g in (p.grn_q, p.grn_k, p.grn_v)]
    return out


def test_adamw_keeps_the_stored_padding_zero():
    cfg = SMALL.replace(residual="dca", n_layers=3, layer_loop="scan", param_dtype="float32",
                        compute_dtype="float32")
    model = perturb(build_model(cfg, key=jax.random.PRNGKey(0)), jax.random.PRNGKey(1))
    model = eqx.tree_at(lambda m: m.trunk, model,  # padding back to zero after perturbing
                        ScannedTrunk.from_trunk(_per_block(model)))
    assert sum(p.size for p in _padding(model)) > 0
    params, static = eqx.partition(model, eqx.is_inexact_array)
    tc = LMTrainConfig(seq_len=cfg.max_len, batch_size=2, weight_decay=0.1, warmup_steps=1)
    opt = make_lm_optimizer(tc)
    step = jax.jit(make_train_step(static, opt, tc))
    state = opt.init(params)
    batch = synthetic_batch(2, cfg.max_len, cfg.vocab_size)
    before = params
    for i in range(3):
        params, state, _ = step(params, state, jax.random.PRNGKey(i), batch,
                                jnp.asarray(i, jnp.int32))
    trained = eqx.combine(params, static)
    assert not np.allclose(trained.embed_VxD, eqx.combine(before, static).embed_VxD)
    assert all(np.all(p == 0.0) for p in _padding(trained))
    assert count_params(trained) == param_count(cfg)


def _per_block(model):
    """A scanned DCA model's trunk in the per-block layout (test helper: the inverse map)."""
    from dca_theory.lm.trunk import DCATrunk

    cfg = model.cfg.replace(layer_loop="unroll")
    mixer = model.trunk.mixer
    blocks = []
    fresh = DCATrunk.init(cfg, key=jax.random.PRNGKey(0))
    for t, blk in enumerate(fresh.blocks):
        p, b = layer_of(mixer.layers, t), layer_of(model.trunk.blocks, t)
        slots = mixer.stack_slots(t)
        blocks.append(eqx.tree_at(
            lambda d: (d.grn_q, d.grn_k, d.grn_v, d.ln_q, d.ln_k, d.ln_v, d.attn, d.ln_h, d.mlp),
            blk, (*(layer_stack.picked_block(g, slots) for g in (p.grn_q, p.grn_k, p.grn_v)),
                  b.ln1, p.ln_k, p.ln_v, b.attn, b.ln2, b.mlp)))
    return eqx.tree_at(lambda tr: (tr.blocks, tr.final), fresh, (tuple(blocks), mixer.final))


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


def _train_step_equations(cfg) -> int:
    params, static = eqx.partition(build_model(cfg, key=jax.random.PRNGKey(0)),
                                   eqx.is_inexact_array)
    tc = LMTrainConfig(seq_len=cfg.max_len, batch_size=1)
    opt = make_lm_optimizer(tc)
    args = (params, opt.init(params), jax.random.PRNGKey(1),
            synthetic_batch(1, cfg.max_len, cfg.vocab_size), jnp.asarray(0, jnp.int32))
    return _equations(jax.make_jaxpr(make_train_step(static, opt, tc))(*args).jaxpr)


@pytest.mark.parametrize("changes", [
    {"residual": "dca"}, pytest.param({"residual": "muddformer"}, marks=pytest.mark.slow),
    pytest.param({"residual": "dca", "k": 2}, marks=pytest.mark.slow)],
    ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_train_step_program_does_not_grow_with_depth(changes):
    cfg = SMALL.replace(param_dtype="float32", compute_dtype="float32", **changes)
    scanned = [_train_step_equations(cfg.replace(n_layers=d, layer_loop="scan"))
               for d in (4, 8)]
    assert scanned[0] == scanned[1]
    unrolled = [_train_step_equations(cfg.replace(n_layers=d)) for d in (4, 8)]
    assert unrolled[1] > unrolled[0] + 4 * 10  # dozens of operations per extra block


def test_trainer_saves_restores_and_counts_the_scanned_model(tmp_path):
    from lm_train_helpers import write_word_corpus

    from dca_theory.lm import train as lm_train
    from dca_theory.lm.train_config import TRAIN_PRESETS

    corpus = write_word_corpus(tmp_path / "corpus.txt", seed=0,
                               words=["alpha", "beta", "gamma", "delta", "eps"])
    cfg = SMALL.replace(residual="dca", n_layers=3, param_dtype="float32",
                        compute_dtype="float32", max_len=16, layer_loop="scan")
    tc = TRAIN_PRESETS["tiny"].replace(
        data=str(corpus), bpe_vocab_size=260, batch_size=2, steps=2, warmup_steps=1,
        eval_every=2, eval_batches=1, checkpoint_every=2, progress=False)
    summary = lm_train.train_and_evaluate(cfg, tc, tmp_path / "w")
    model, _, model_cfg, _ = lm_train.load_run(tmp_path / "w")
    assert isinstance(model.trunk, ScannedTrunk)
    assert summary["n_params"] == param_count(model_cfg) == count_params(model)


@pytest.mark.parametrize("n, expected", [
    (1, ([1], [1])), (3, ([1, 2, 3], [1, 2, 3])), (5, ([1, 2, 4, 5], [1, 2, 4, 5])),
    (24, ([6, 12, 18, 24], [6, 12, 18, 24])),
])
def test_read_groups_cover_every_block_once(n, expected):
    assert read_groups(n, 1) == expected
    stops, widths = read_groups(n, 2)  # two slots per block: 1 + 2 (stop - 1)
    assert widths == [1 + 2 * (s - 1) for s in stops]


@pytest.mark.parametrize("k, expected", [
    (2, [(0,), (0, 3), (0, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)]),  # [x, middle, last 2]
    (None, [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 3, 4)]),  # the buffer's first slots
    (4, [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 3, 4)]),  # k + 1 >= depth: full DCA
])
def test_scan_slots_put_each_output_where_the_scan_keeps_it(k, expected):
    cfg = SMALL.replace(residual="dca", k=k, n_layers=5)
    assert [layer_stack.scan_slots(cfg, t) for t in range(5)] == expected


def test_every_lm_kind_scans():
    for kind in schemes.names(lm=True):
        assert schemes.get(kind).mixer, kind
        assert SMALL.replace(residual=kind, layer_loop="scan").layer_loop == "scan"
    assert SMALL.replace(residual="grn_v2", grn_window=2, layer_loop="scan").grn_window == 2


def test_bad_layer_loop_is_refused():
    with pytest.raises(ValueError, match=r"^unknown layer_loop 'loop'; valid: unroll, scan$"):
        SMALL.replace(layer_loop="loop")


def test_default_layer_loop_keeps_run_cache_keys():
    """Run-cache keys hash the fields that differ from KEY_BASELINE_MODEL: the default adds none."""
    assert "layer_loop" not in _non_default(SMALL, KEY_BASELINE_MODEL)
    scan_fields = _non_default(SMALL.replace(layer_loop="scan"), KEY_BASELINE_MODEL)
    assert scan_fields["layer_loop"] == "scan"


def _scan_temp_bytes(depth: int, residual: str) -> int:
    """XLA's temporary bytes of the scanned train step (deterministic)."""
    from dca_theory.lab.steptime import train_step_setup

    cfg = SMALL.replace(residual=residual, n_layers=depth, layer_loop="scan", max_len=16,
                        param_dtype="float32", compute_dtype="float32")
    fn, args = train_step_setup(cfg, LMTrainConfig(seq_len=16, batch_size=2))
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_full_dca_scan_memory_grows_like_vanillas():
    """The shadow scan (dca_theory.lm.fast.buffer_scans) keeps one buffer, so full DCA's training
    memory grows linearly in depth as vanilla's does: from depth 12 to 24 its growth is within
    15 % of vanilla's (measured at width 16: 1.94× against 1.85×), where a buffer saved per
    block would add a depth² term."""
    growth = {r: _scan_temp_bytes(24, r) / _scan_temp_bytes(12, r) for r in ("dca", "vanilla")}
    assert growth["dca"] < 1.15 * growth["vanilla"], growth
