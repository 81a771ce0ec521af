"""Retrofitting a vanilla model into DCA / k-DCA / GRN models preserves its logits (Table 4).

The source is a vanilla model with every weight moved away from its init (noise on all arrays,
LayerNorm scales and biases included), standing in for a trained checkpoint. Tolerances as in
test_model: 1e-6 (float32) / 1e-12 (float64) of the logit scale; they differ only by the order
of summing the stack.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from zoo_helpers import TINY, L, assert_close_logits, logits, perturb

from dca_theory.lm.model import build_model
from dca_theory.lm.params import count_params, param_count
from dca_theory.lm.retrofit import retrofit


def trained_vanilla(cfg, key):
    return perturb(build_model(cfg, key=key), jax.random.fold_in(key, 7))


@pytest.mark.parametrize("residual,k,dtype", [
    ("dca", None, "float32"), ("dca", 1, "float64"),
    pytest.param("grn_v3", None, "float32", marks=pytest.mark.slow),
    pytest.param("dca", None, "float64", marks=pytest.mark.slow),
    pytest.param("dca", 2, "float32", marks=pytest.mark.slow),
    pytest.param("dca", 0, "float64", marks=pytest.mark.slow),
    pytest.param("grn_v1", None, "float64", marks=pytest.mark.slow),
])
def test_retrofit_preserves_logits(residual, k, dtype, getkey):
    cfg = TINY.replace(param_dtype=dtype, compute_dtype=dtype)
    src = trained_vanilla(cfg, getkey())
    dst = retrofit(src, cfg.replace(residual=residual, k=k))
    assert dst.cfg.residual == residual and dst.cfg.k == k
    assert count_params(dst) == param_count(dst.cfg)
    toks = jax.random.randint(getkey(), (L,), 0, TINY.vocab_size)
    assert_close_logits(logits(dst, toks), logits(src, toks), dtype)


@pytest.mark.parametrize("residual, source_loop", [
    ("dca", "unroll"), ("value_residual", "scan"), ("muddformer", "unroll"),
    pytest.param("grn_v2", "scan", marks=pytest.mark.slow),
])
def test_retrofit_into_the_scanned_trunk_preserves_logits(residual, source_loop, getkey):
    """Into ``layer_loop="scan"`` targets, from either layout: the blocks are transplanted
    stacked and the mixer sets its own vanilla map (DCA's LN_k = LN_v = LN_1, ResFormer's
    λ = (1, 0))."""
    cfg = TINY.replace(param_dtype="float64", compute_dtype="float64")
    src = trained_vanilla(cfg.replace(layer_loop=source_loop), getkey())
    dst = retrofit(src, cfg.replace(residual=residual, layer_loop="scan"))
    assert dst.cfg.layer_loop == "scan" and count_params(dst) == param_count(dst.cfg)
    toks = jax.random.randint(getkey(), (L,), 0, TINY.vocab_size)
    assert_close_logits(logits(dst, toks), logits(src, toks), "float64")
    back = retrofit(src, cfg.replace(residual=residual))  # and a per-block target
    assert_close_logits(logits(back, toks), logits(src, toks), "float64")


def test_retrofit_uses_target_settings_and_can_train(getkey):
    src = trained_vanilla(TINY, getkey())
    dst = retrofit(src, TINY.replace(residual="dca", k=1, dropout=0.2, grn_gate="bias_inside"))
    assert dst.trunk.blocks[0].rate == 0.2 and dst.trunk.blocks[0].mlp.rate == 0.2
    toks = jax.random.randint(getkey(), (L,), 0, TINY.vocab_size)

    def loss(m):
        lp = jax.nn.log_softmax(m(toks[:-1], inference=True))
        return -jnp.mean(jnp.take_along_axis(lp, toks[1:, None], axis=1))

    grads = eqx.filter_jit(eqx.filter_grad(loss))(dst)
    # The GRN biases receive gradient, so training continues from the retrofitted model.
    assert float(jnp.max(jnp.abs(grads.trunk.blocks[1].grn_q.b))) > 0
    assert float(jnp.max(jnp.abs(grads.trunk.final.b))) > 0
    # So do the gate weights with the gate relu(b + w.h): relu'(1) = 1 at b = 1, w = 0 (with
    # the literal gate b + relu(w.h), the LM's default, exactly zero: tests/lm/test_gate.py).
    assert float(jnp.max(jnp.abs(grads.trunk.final.w))) > 0
    assert float(jnp.max(jnp.abs(grads.trunk.blocks[1].grn_q.w))) > 0


def test_retrofit_bad_inputs(getkey):
    src = build_model(TINY, key=getkey())
    with pytest.raises(ValueError, match="needs a vanilla source"):
        retrofit(build_model(TINY.replace(residual="dca"), key=getkey()), TINY)
    with pytest.raises(ValueError, match="cannot retrofit into residual='denseformer'"):
        retrofit(src, TINY.replace(residual="denseformer"))
    with pytest.raises(ValueError, match="cannot retrofit into grn_window=2"):
        retrofit(src, TINY.replace(residual="grn_v3", grn_window=2))
    with pytest.raises(ValueError, match="d_model differs"):
        retrofit(src, TINY.replace(residual="dca", d_model=64, n_heads=4))
