"""GRN-v3's gates in the LM and the ViT (dca_theory.gates): DCA = vanilla at init for the exact
gates (small_init only approximately, by a measured amount), which gates give w gradient at step
0, and retrofit per gate."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_helpers import TINY, assert_close_logits, logits, perturb, tokens

from dca_theory.gates import GATES
from dca_theory.lm.model import build_model
from dca_theory.lm.retrofit import retrofit
from dca_theory.residual import AbstractCombiner
from dca_theory.vit.config import preset as vit_preset
from dca_theory.vit.model import ViT
from dca_theory.vit.model import retrofit as vit_retrofit

#: small_init's w ~ N(0, 0.01^2) adds relu(w.h_i) >= 0 to every coefficient; at TINY's scale the
#: largest logit moves by 5.9 % of the logit scale (measured, key 0): not the vanilla model.
SMALL_INIT_LOGIT_CHANGE = (1e-3, 0.2)


def _w_grad_norm(model, toks):
    def loss(m):
        out = m(toks[:-1], inference=True)
        return -jnp.mean(jax.nn.log_softmax(out)[jnp.arange(toks.shape[0] - 1), toks[1:]])

    grads = eqx.filter_grad(loss)(model)
    is_combiner = lambda x: isinstance(x, AbstractCombiner)  # noqa: E731
    combiners = [c for c in jax.tree_util.tree_leaves(grads, is_leaf=is_combiner)
                 if is_combiner(c)]
    assert len(combiners) == 3 * TINY.n_layers + 1  # q, k, v per block and the final GRN
    # The first block's GRNs see one entry, x, and feed a LayerNorm: at b = 1 the gate scales
    # every feature of x alike, which the LayerNorm undoes, so their w has zero gradient at init
    # under every gate (until b becomes uneven across features). Left out of the minimum.
    norms = [float(jnp.linalg.norm(c.w)) for c in combiners if c.size > 1]
    return min(norms), max(float(jnp.linalg.norm(c.w)) for c in combiners)


@pytest.mark.parametrize("gate", list(GATES))
def test_dca_gate_identity_and_gradient_at_init(gate):
    key = jax.random.PRNGKey(0)
    vanilla = build_model(TINY, key=key)
    dca = build_model(TINY.replace(residual="dca", grn_gate=gate), key=key)
    toks = tokens()
    ours, theirs = logits(dca, toks), logits(vanilla, toks)
    if GATES[gate].exact_at_init:
        assert_close_logits(ours, theirs, "float32")  # the vanilla transformer's function
    else:
        change = float(jnp.max(jnp.abs(ours - theirs)) / jnp.max(jnp.abs(theirs)))
        lo, hi = SMALL_INIT_LOGIT_CHANGE
        assert lo < change < hi, change
    smallest, largest = _w_grad_norm(dca, toks)
    if GATES[gate].w_trains_from_init:
        assert smallest > 1e-6, smallest  # the w of every GRN over >= 2 entries moves
    else:
        assert largest == 0.0, largest  # ReLU'(0) = 0 at w = 0: no GRN's w can move


@pytest.mark.parametrize("gate", list(GATES))
def test_retrofit_per_gate(gate):
    key = jax.random.PRNGKey(1)
    src = perturb(build_model(TINY, key=key), jax.random.PRNGKey(2))
    target = TINY.replace(residual="dca", grn_gate=gate)
    if not GATES[gate].exact_at_init:
        with pytest.raises(ValueError, match=f"cannot retrofit into grn_gate='{gate}': its w "
                                             "starts at random.*valid gates: paper, open, "
                                             "bias_inside$"):
            retrofit(src, target)
        return
    dst = retrofit(src, target)
    assert dst.trunk.final.gate == gate
    assert_close_logits(logits(dst, tokens()), logits(src, tokens()), "float32")


@pytest.mark.parametrize("gate", ["bias_inside", "small_init"])
def test_vit_takes_the_gate(gate):
    cfg = vit_preset("digits_tiny", residual="dca", grn_gate=gate)
    model = ViT(cfg, key=jax.random.PRNGKey(0))
    assert model.trunk.final.gate == gate
    image = jax.random.uniform(jax.random.PRNGKey(1), (cfg.image_size, cfg.image_size,
                                                       cfg.channels), jnp.float32)
    assert np.all(np.isfinite(np.asarray(model(image, inference=True))))
    vanilla = ViT(cfg.replace(residual="vanilla"), key=jax.random.PRNGKey(0))
    if GATES[gate].exact_at_init:
        dst = vit_retrofit(vanilla, "dca")
        np.testing.assert_allclose(dst(image, inference=True), vanilla(image, inference=True),
                                   rtol=1e-5, atol=1e-5)
    else:
        with pytest.raises(ValueError, match="cannot retrofit into grn_gate='small_init'"):
            vit_retrofit(vanilla, "dca")
