"""The scanned trunk (:mod:`dca_theory.lm.driver`, :mod:`dca_theory.lm.scanned`) against the
per-block trunks it replaces, in float64, and its cached decoding against its full pass.

**Same numbers.** For each kind a per-block trunk is built, its weights perturbed away from
init (every GRN active), and converted (:meth:`ScannedTrunk.from_trunk`). The scanned trunk
built from the same key must equal the converted init exactly (same draws, same layout); with
dropout on (same keys), the loss, the gradient of every parameter (the per-block gradients
converted the same way: the conversion is linear, so it maps gradients to gradients) and of
the input, and every per-layer state must agree to 1e-10 relative to the largest magnitude:
float64's summation-order differences are ~1e-15 relative, and a wrong term (a mis-placed
slot, a missed dropout key) gives O(1) errors.

**Decoding.** Tokens fed through :meth:`ScannedTrunk.decode` one at a time (and in chunks)
must give the full causal pass's outputs at every position, to 1e-12 relative in float64.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decode_helpers import decoded
from zoo_helpers import F64, perturb

from dca_theory.lm.params import overhead
from dca_theory.lm.scanned import ScannedTrunk, param_count
from dca_theory.lm.trunks import Trunk

RTOL = 1e-10
# Small (every case compiles a per-block and a scanned trunk with gradients): 3 layers still
# give k-DCA (k = 1) a middle slot, 6 positions a 3-token decode chunk.
CFG = F64.replace(n_layers=3, d_model=16, n_heads=2, d_mlp=32, max_len=6, dropout=0.1,
                  attn_dropout=0.1, grn_impl="reference")

KINDS = [
    {"residual": "vanilla"},
    {"residual": "grn_v3", "grn_window": 2},  # a window: slots outside it are masked
    {"residual": "dca"},
    {"residual": "dca", "k": 1},  # the fixed [x, middle, last k] stack carried
    pytest.param({"residual": "grn_v1"}, marks=pytest.mark.slow),
    pytest.param({"residual": "grn_v2", "grn_window": 2, "grn_input": False},
                 marks=pytest.mark.slow),
    pytest.param({"residual": "grn_v3"}, marks=pytest.mark.slow),
    pytest.param({"residual": "dca", "k": 0}, marks=pytest.mark.slow),
    pytest.param({"residual": "dca", "k": 2, "grn_gate": "paper"}, marks=pytest.mark.slow),
    {"residual": "attn_res"},  # sources masked by count, the MLP reading a_t too
    {"residual": "muddformer"},  # four streams carried, aggregates padded to 4 × (T + 1)
    {"residual": "value_residual"},  # block 0's values carried, mixed before the cache
    # one block: AttnRes's output over 3 sources, MUDDFormer's only aggregate the 1-stream
    # last, ResFormer with no λ (block 0's row only)
    pytest.param({"residual": "attn_res", "n_layers": 1}, marks=pytest.mark.slow),
    pytest.param({"residual": "muddformer", "n_layers": 1}, marks=pytest.mark.slow),
    pytest.param({"residual": "value_residual", "n_layers": 1}, marks=pytest.mark.slow),
    # one block, one read group (no group stops to search)
    pytest.param({"residual": "dca", "n_layers": 1}, marks=pytest.mark.slow),
    {"residual": "denseformer"},
    {"residual": "hyper_connections"},
    {"residual": "mhc"},
    {"residual": "laurel_lr"},
    {"residual": "laurel_pa"},
]


def _ids(changes):
    return "-".join(f"{k}={v}" for k, v in changes.items())


def _loss(trunk, x_LxD, key):
    return jnp.sum(jnp.sin(trunk(x_LxD, causal=True, key=key)))


def _max_rel(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _assert_trees_close(got, want, what):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves), what
    scale = max(float(np.max(np.abs(np.asarray(w)))) for w in want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert g.shape == w.shape, what
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=RTOL * scale,
                                   err_msg=what)


@pytest.mark.parametrize("changes", KINDS, ids=_ids)
def test_scanned_trunk_equals_the_per_block_trunk_in_float64(changes):
    cfg = CFG.replace(**changes)
    key = jax.random.PRNGKey(0)
    old = Trunk(cfg, key=key)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)),
                                     ScannedTrunk.init(cfg, key=key),
                                     ScannedTrunk.from_trunk(old)))
    old = perturb(old, jax.random.PRNGKey(1))
    new = ScannedTrunk.from_trunk(old)
    assert param_count(new) == sum(x.size for x in jax.tree.leaves(
        eqx.filter(old, eqx.is_inexact_array)))
    assert new.mixer.param_count() == overhead(cfg)  # what the kind adds to vanilla
    x_LxD = jax.random.normal(jax.random.PRNGKey(2), (cfg.max_len, cfg.d_model), jnp.float64)
    drop = jax.random.PRNGKey(3)
    (l_old, g_old, gx_old, s_old), (l_new, g_new, gx_new, s_new) = (
        _loss_gradients_states(t, x_LxD, drop) for t in (old, new))
    assert _max_rel(l_new, l_old) < RTOL
    _assert_trees_close(eqx.filter(g_new, eqx.is_array),
                        eqx.filter(ScannedTrunk.from_trunk(g_old), eqx.is_array), "gradients")
    assert _max_rel(gx_new, gx_old) < RTOL
    assert set(s_new) == set(s_old)
    for name in s_old:
        assert _max_rel(s_new[name], s_old[name]) < RTOL, name


@eqx.filter_jit
def _loss_gradients_states(trunk, x_LxD, key):
    """The loss, its gradients (trunk parameters, input) and the per-layer states: one program
    per trunk, since compiling dominates these tiny cases."""
    loss, (g_trunk, g_x) = eqx.filter_value_and_grad(
        lambda tx: _loss(tx[0], tx[1], key))((trunk, x_LxD))
    return loss, g_trunk, g_x, trunk.forward_with_states(x_LxD, causal=True)[1]


@pytest.mark.parametrize("changes", KINDS, ids=_ids)
def test_scanned_decode_equals_the_full_pass_at_every_position(changes):
    cfg = CFG.replace(**changes)
    trunk = ScannedTrunk.from_trunk(perturb(Trunk(cfg, key=jax.random.PRNGKey(0)),
                                            jax.random.PRNGKey(1)))
    x_LxD = jax.random.normal(jax.random.PRNGKey(2), (cfg.max_len, cfg.d_model), jnp.float64)
    full = eqx.filter_jit(lambda t, x: t(x, causal=True))(trunk, x_LxD)
    for chunk in (1, 3):
        assert _max_rel(decoded(trunk, x_LxD, chunk), full) < 1e-12, chunk


@pytest.mark.parametrize("k", [0, 2])
def test_k_dca_trains_on_a_buffer_with_the_values_of_its_carried_stack(k):
    """k-DCA's two states (:meth:`DCAMixer.start`, the stack carried; ``start_for_training``,
    a write-once buffer, chosen by the dropout key) give the same output and per-layer states
    to 1e-12 and gradients to 1e-10 relative in float64 (dropout off, so the key changes no
    value; k = 0 has no last-k window, k = 2 one that starts in the zero slots)."""
    cfg = CFG.replace(residual="dca", k=k, n_layers=4, dropout=0.0, attn_dropout=0.0)
    trunk = ScannedTrunk.from_trunk(perturb(Trunk(cfg, key=jax.random.PRNGKey(0)),
                                            jax.random.PRNGKey(1)))
    assert not trunk.mixer.full
    x_LxD = jax.random.normal(jax.random.PRNGKey(2), (cfg.max_len, cfg.d_model), jnp.float64)

    @eqx.filter_jit
    def run(trunk, x_LxD, key):
        loss, grads = eqx.filter_value_and_grad(lambda t: _loss(t, x_LxD, key))(trunk)
        return loss, grads, trunk.forward_with_states(x_LxD, causal=True, key=key)[1]

    (l_c, g_c, s_c), (l_b, g_b, s_b) = run(trunk, x_LxD, None), run(trunk, x_LxD,
                                                                    jax.random.PRNGKey(3))
    assert _max_rel(l_b, l_c) < 1e-12
    _assert_trees_close(eqx.filter(g_b, eqx.is_array), eqx.filter(g_c, eqx.is_array), "grads")
    for name in s_c:
        assert _max_rel(s_b[name], s_c[name]) < 1e-12, name
