"""The trunk's blocks through ``lax.scan`` (``layer_loop="scan"``, :mod:`dca_theory.lm.layer_scan`)
equal the unrolled trunk in float64: logits and the gradient of the loss with respect to every
parameter (relative to the largest gradient, 1e-10), for vanilla, full DCA and k-DCA at several
depths (k >= depth included, where k-DCA is full DCA), every GRN-v3 gate and both GRN paths;
dropout gives equal outputs for equal keys.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from tree_helpers import assert_trees_close
from zoo_helpers import F64, perturb, tokens
from zoo_helpers import logits as jit_logits

from dca_theory.gates import GATES
from dca_theory.lab.lm_runs import KEY_BASELINE_MODEL, _non_default
from dca_theory.lm import layer_scan
from dca_theory.lm.layer_scan import group_bounds
from dca_theory.lm.model import build_model

RTOL = 1e-10
# Narrower and shorter than the tiny preset: every case compiles both loops.
SMALL = F64.replace(d_model=16, n_heads=2, d_mlp=32, max_len=8)


def _loss(model, toks, key=None):
    logits = model(toks, key=key, inference=key is None)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[jnp.arange(toks.shape[0]), toks])


def _pair(cfg, key):
    """The same (perturbed) weights under ``layer_loop="unroll"`` and ``"scan"``."""
    unrolled = perturb(build_model(cfg, key=jax.random.PRNGKey(0)), key)
    scan_cfg = cfg.replace(layer_loop="scan")
    scanned = jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(build_model(scan_cfg, key=jax.random.PRNGKey(0))),
        jax.tree_util.tree_leaves(unrolled))
    return unrolled, scanned


@eqx.filter_jit
def _value_and_grad(model, toks, key):
    return eqx.filter_value_and_grad(_loss)(model, toks, key)


@eqx.filter_jit
def _logits_and_grad(model, toks):
    """Logits and every parameter gradient of the loss, in one compilation."""
    return model(toks, inference=True), eqx.filter_grad(_loss)(model, toks)


# Depths 1, 2, 3, 5: full DCA's buffer in one or two groups (3 blocks: groups of 2 and 1);
# k-DCA with k >= depth - 1 (the full stack: the buffer path) and k + 1 < depth (the unrolled
# head, then the fixed-size scan); both GRN paths. Each case compiles two float64 models with
# their gradients (up to a minute each on the loaded 2-core CPU), so most are marked slow.
FAST_CASES = [{"residual": "dca", "n_layers": 3}]
SLOW_CASES = [
    {"residual": "grn_v3", "n_layers": 3},
    {"residual": "dca", "k": 1, "n_layers": 3},
    {"residual": "vanilla", "n_layers": 3}, {"residual": "vanilla", "n_layers": 1},
    {"residual": "vanilla", "n_layers": 5},
    {"residual": "dca", "n_layers": 1}, {"residual": "dca", "n_layers": 2},
    {"residual": "dca", "n_layers": 5},
    {"residual": "dca", "k": 1, "n_layers": 1}, {"residual": "dca", "k": 1, "n_layers": 2},
    {"residual": "dca", "k": 2, "n_layers": 5}, {"residual": "dca", "k": 0, "n_layers": 3},
    {"residual": "dca", "n_layers": 5, "grn_impl": "reference"},
    {"residual": "dca", "k": 1, "n_layers": 3, "grn_impl": "reference"},
    {"residual": "grn_v1", "n_layers": 3}, {"residual": "grn_v2", "n_layers": 5},
    {"residual": "grn_v3", "n_layers": 1},
]
CASES = FAST_CASES + [pytest.param(c, marks=pytest.mark.slow) for c in SLOW_CASES]


@pytest.mark.parametrize("changes", CASES,
                         ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_scan_equals_unroll_in_value_and_gradient(changes, getkey):
    unrolled, scanned = _pair(SMALL.replace(**changes), getkey())
    toks = tokens(3, length=SMALL.max_len) % SMALL.vocab_size
    assert_trees_close(_logits_and_grad(scanned, toks), _logits_and_grad(unrolled, toks),
                       rtol=RTOL)


@pytest.mark.slow
@pytest.mark.parametrize("k", [None, 1])
def test_scan_on_the_fused_path(k, monkeypatch, getkey):
    """The scanned DCA trunk runs the reference GRNs by default (layer_scan.SCAN_GRN_IMPL); with
    None it takes cfg.grn_impl, here the fused path (over the buffer's slots for full DCA). (A
    depth no other test uses, so that the jitted functions trace afresh.)"""
    monkeypatch.setattr(layer_scan, "SCAN_GRN_IMPL", None)
    unrolled, scanned = _pair(SMALL.replace(residual="dca", k=k, n_layers=4), getkey())
    toks = tokens(3, length=SMALL.max_len) % SMALL.vocab_size
    assert_trees_close(_logits_and_grad(scanned, toks), _logits_and_grad(unrolled, toks),
                       rtol=RTOL)


@pytest.mark.slow
@pytest.mark.parametrize("gate", [g for g in GATES if g != "bias_inside"])
def test_every_gate(gate, getkey):
    """The zero-padded GRNs of full DCA's buffer add nothing under every gate, in value and
    gradient (bias_inside, the default, is in the cases above)."""
    cfg = SMALL.replace(residual="dca", n_layers=3, grn_gate=gate)
    unrolled, scanned = _pair(cfg, getkey())
    toks = tokens(4, length=SMALL.max_len) % SMALL.vocab_size
    assert_trees_close(_logits_and_grad(scanned, toks), _logits_and_grad(unrolled, toks),
                       rtol=RTOL)


@pytest.mark.slow
@pytest.mark.parametrize("changes", [
    {"residual": "dca"}, {"residual": "vanilla"}, {"residual": "dca", "k": 1},
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_dropout_uses_the_unrolled_keys(changes, getkey):
    cfg = SMALL.replace(n_layers=3, dropout=0.3, attn_dropout=0.2, **changes)
    unrolled, scanned = _pair(cfg, getkey())
    toks = tokens(5, length=SMALL.max_len) % SMALL.vocab_size
    key = jax.random.PRNGKey(11)
    loss_s, grad_s = _value_and_grad(scanned, toks, key)
    loss_u, grad_u = _value_and_grad(unrolled, toks, key)
    assert_trees_close((loss_s, grad_s), (loss_u, grad_u), rtol=RTOL)
    # Dropout is active: another key gives another loss.
    assert abs(float(_value_and_grad(scanned, toks, jax.random.PRNGKey(12))[0] - loss_s)) > 1e-6


def test_states_come_from_the_unrolled_loop():
    cfg = SMALL.replace(residual="dca", k=1, n_layers=3)
    model = build_model(cfg.replace(layer_loop="scan"), key=jax.random.PRNGKey(0))
    toks = tokens(6, length=SMALL.max_len) % SMALL.vocab_size
    logits, states = model.forward_with_states(toks, inference=True)
    assert {"block_2_out", "stack_2", "final"} <= set(states)
    assert_trees_close(logits, jit_logits(model, toks), rtol=RTOL)


@pytest.mark.parametrize("n, groups, expected", [
    (1, 4, [(0, 1)]), (3, 4, [(0, 1), (1, 2), (2, 3)]), (5, 2, [(0, 2), (2, 5)]),
    (24, 2, [(0, 12), (12, 24)]), (24, 4, [(0, 6), (6, 12), (12, 18), (18, 24)]),
])
def test_group_bounds_cover_every_block_once(n, groups, expected):
    assert group_bounds(n, groups) == expected


def test_bad_layer_loop_is_refused():
    with pytest.raises(ValueError, match=r"^unknown layer_loop 'loop'; valid: unroll, scan$"):
        SMALL.replace(layer_loop="loop")


def test_scan_for_other_residual_kinds_is_refused():
    with pytest.raises(ValueError, match=r"^layer_loop='scan' is implemented for residual in "
                                         r"vanilla, grn_v1, grn_v2, grn_v3, dca, got "
                                         r"residual='denseformer'$"):
        SMALL.replace(residual="denseformer", layer_loop="scan")
    with pytest.raises(ValueError, match=r"^layer_loop='scan' needs the whole stack, got "
                                         r"grn_window=2; use layer_loop='unroll'$"):
        SMALL.replace(residual="grn_v2", grn_window=2, layer_loop="scan")


def test_default_layer_loop_keeps_run_cache_keys():
    """Run-cache keys hash the fields that differ from KEY_BASELINE_MODEL: the default adds none."""
    assert "layer_loop" not in _non_default(SMALL, KEY_BASELINE_MODEL)
    scan_fields = _non_default(SMALL.replace(layer_loop="scan"), KEY_BASELINE_MODEL)
    assert scan_fields["layer_loop"] == "scan"


def _dca_scan_temp_bytes(depth: int) -> int:
    """XLA's temporary bytes of the scanned full-DCA train step (deterministic)."""
    from dca_theory.lab.steptime import train_step_setup
    from dca_theory.lm.train_config import LMTrainConfig

    cfg = SMALL.replace(residual="dca", n_layers=depth, layer_loop="scan", max_len=16,
                        param_dtype="float32", compute_dtype="float32")
    fn, args = train_step_setup(cfg, LMTrainConfig(seq_len=16, batch_size=2))
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_full_dca_scan_memory_grows_linearly_in_depth(monkeypatch):
    """Full DCA's hand-written backward pass (layer_scan.write_once_scan) keeps one buffer:
    doubling the depth less than doubles the step's temporary memory (1.6x at width 16, depth
    6 -> 12), where lax.scan's own autodiff, which saves the buffer every block read, grows
    like depth² (2.5x here)."""
    ratio = _dca_scan_temp_bytes(12) / _dca_scan_temp_bytes(6)
    assert ratio < 2.0
    monkeypatch.setattr(layer_scan, "write_once_scan", layer_scan.scan_blocks)
    assert _dca_scan_temp_bytes(12) / _dca_scan_temp_bytes(6) > ratio + 0.5
