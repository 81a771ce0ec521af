"""The rivals (Attention Residuals, mHC, MUDDFormer, value residuals) in the ViT, through the
shared trunk (``causal=False``): shapes, finite logits, every token seen by every token, and
the exact retrofits (float64, 1e-12 of the logit scale: the same sums in another order)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from perturbation import perturb

from dca_theory.vit.config import preset
from dca_theory.vit.model import ViT, param_count, retrofit

RIVALS = ("attn_res", "mhc", "muddformer", "value_residual")


@eqx.filter_jit
def logits_jit(model, images):
    return jax.vmap(model)(images)


@pytest.mark.parametrize("residual", RIVALS)
def test_forward_shapes_finite_and_not_causal(residual, getkey):
    cfg = preset("digits_tiny", residual=residual, param_dtype="float64")
    model = perturb(ViT(cfg, key=getkey()), getkey(), 0.3)
    assert param_count(cfg) > param_count(cfg.replace(residual="vanilla"))
    images = jax.random.normal(getkey(), (3, 8, 8, 1), jnp.float64)
    out = logits_jit(model, images)
    assert out.shape == (3, cfg.num_classes) and bool(jnp.all(jnp.isfinite(out)))
    # Not causal: the class token (position 0) reads the last patch too.
    trunk = eqx.filter_jit(lambda m, x: m.trunk(x, causal=False))
    x = model.embed(images[0])
    bump = jax.random.normal(getkey(), x.shape[1:], x.dtype)  # not a constant: LN removes it
    moved = trunk(model, x.at[-1].add(bump))[0] - trunk(model, x)[0]
    assert float(jnp.max(jnp.abs(moved))) > 1e-6


@pytest.mark.parametrize("residual", ["muddformer", "value_residual"])
def test_retrofit_equals_vanilla(residual, getkey):
    vanilla = perturb(ViT(preset("digits_tiny", param_dtype="float64"), key=getkey()), getkey(),
                      0.3)
    model = retrofit(vanilla, residual)
    assert model.cfg.residual == residual
    images = jax.random.normal(getkey(), (2, 8, 8, 1), jnp.float64)
    ref = logits_jit(vanilla, images)
    np.testing.assert_allclose(logits_jit(model, images), ref, rtol=0,
                               atol=1e-12 * float(jnp.max(jnp.abs(ref))))
