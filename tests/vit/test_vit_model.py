"""The ViT: patch embedding = strided convolution, sin-cos positions, shapes for every residual
kind, DCA-at-init = vanilla with the same weights, the ViT-S/16 parameter count, bad configs.

Equality tests run in float64 at 1e-6 relative to the logit scale (the brief's tolerance; the
only difference between the models is the order of summation of the residual stream, so the
observed gap is ~1e-15). The convolution comparison uses 1e-10: the same products, summed in a
different order by ``conv_general_dilated``.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from perturbation import perturb

from dca_theory.lm.trunk import DCATrunk, ResidualTrunk
from dca_theory.residual import make_combiner
from dca_theory.vit.config import PRESETS, ViTConfig, preset
from dca_theory.vit.model import ViT, count_params, param_count, patchify, retrofit, sincos_2d

TINY64 = preset("digits_tiny", param_dtype="float64")


@eqx.filter_jit
def logits_jit(model, images_BxHxWxC):
    # One jitted function for the file: one compilation per model structure instead of
    # op-by-op dispatch, which dominates the run time of these tests on CPU.
    return jax.vmap(model)(images_BxHxWxC)


def forward(model, image_HxWxC):
    return logits_jit(model, image_HxWxC[None])[0]


def image(cfg, seed=0):
    shape = (cfg.image_size, cfg.image_size, cfg.channels)
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.dtype(cfg.param_dtype))


def assert_close(a, b):
    scale = float(jnp.max(jnp.abs(b)))
    assert scale > 0.1  # a non-degenerate comparison (perturbed head)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6 * scale)


def test_patch_embedding_equals_strided_convolution(getkey):
    cfg = preset("digits_tiny", channels=3, param_dtype="float64")
    model = perturb(ViT(cfg, key=getkey()), getkey(), 0.3)
    x_HxWxC = image(cfg)
    p, d = cfg.patch_size, cfg.d_model
    kernel = model.w_patch_PxD.reshape(p, p, cfg.channels, d)  # patches flatten as (row, col, ch)
    conv = jax.lax.conv_general_dilated(x_HxWxC[None], kernel, (p, p), "VALID",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))[0]
    expected = conv.reshape(cfg.num_patches, d) + model.b_patch_D[None, :] + model.pos_NxD
    got = eqx.filter_jit(lambda m, x: m.embed(x))(model, x_HxWxC)[1:]  # drop the class token
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=0, atol=1e-10)


def test_patchify_order():
    x = jnp.arange(4 * 4 * 1.0).reshape(4, 4, 1)
    # Patch (0, 1) of a 4x4 image in 2x2 patches holds pixels (0,2), (0,3), (1,2), (1,3).
    np.testing.assert_array_equal(np.asarray(patchify(x, 2)[1]), [2.0, 3.0, 6.0, 7.0])


def test_sincos_2d_matches_big_vision_formula():
    grid, dim = 3, 8
    got = np.asarray(sincos_2d(grid, dim))
    omega = 1.0 / 10_000.0 ** (np.arange(dim // 4) / (dim // 4 - 1))
    for n in range(grid * grid):
        y, x = divmod(n, grid)  # row-major patches: token n is row y, column x
        row = np.concatenate([np.sin(x * omega), np.cos(x * omega), np.sin(y * omega),
                              np.cos(y * omega)])
        np.testing.assert_allclose(got[n], row, rtol=0, atol=1e-6)  # float32 trig


@pytest.mark.parametrize("residual,k,pool,positions", [
    # Default: GAP + sin-cos here; class token + learned positions run in the retrofit tests.
    ("vanilla", None, "gap", "sincos2d"),
    pytest.param("dca", None, "gap", "sincos2d", marks=pytest.mark.slow),
    pytest.param("dca", 1, "cls", "learned", marks=pytest.mark.slow),
    pytest.param("grn_v2", None, "gap", "learned", marks=pytest.mark.slow),
])
def test_shapes_and_finite(residual, k, pool, positions, getkey):
    cfg = preset("digits_tiny", residual=residual, k=k, pool=pool, positions=positions)
    model = perturb(ViT(cfg, key=getkey()), getkey(), 0.3)
    images = jax.random.normal(getkey(), (3, 8, 8, 1))
    logits = logits_jit(model, images)
    assert logits.shape == (3, cfg.num_classes) and bool(jnp.all(jnp.isfinite(logits)))
    h, states = eqx.filter_jit(lambda m, x: m.forward_with_states(x))(model, images[0])
    assert states["final"].shape == (cfg.num_tokens, cfg.d_model)
    assert cfg.num_tokens == 16 + (pool == "cls")


@pytest.mark.parametrize("residual,k", [
    ("dca", None), ("dca", 1), pytest.param("grn_v3", None, marks=pytest.mark.slow)])
def test_retrofit_equals_vanilla_with_same_weights(residual, k, getkey):
    vanilla = perturb(ViT(TINY64, key=getkey()), getkey(), 0.3)
    model = retrofit(vanilla, residual, k)
    assert isinstance(model.trunk, DCATrunk if residual == "dca" else ResidualTrunk)
    assert model.cfg.residual == residual and model.cfg.k == k
    x = image(TINY64, seed=1)
    assert_close(forward(model, x), forward(vanilla, x))


def test_dca_from_same_key_equals_vanilla_at_init(getkey):
    # The trunk draws block weights from per-layer keys shared by every kind, so "same key"
    # means "same weights"; perturb the head so the logits are not trivially zero.
    key, head_key = getkey(), getkey()
    models = {}
    for residual in ("vanilla", "dca"):
        m = ViT(TINY64.replace(residual=residual), key=key)
        models[residual] = eqx.tree_at(
            lambda m: m.w_head_DxK, m,
            jax.random.normal(head_key, m.w_head_DxK.shape, m.w_head_DxK.dtype))
    x = image(TINY64, seed=2)
    assert_close(forward(models["dca"], x), forward(models["vanilla"], x))


def test_dca_with_trained_grns_differs_from_vanilla(getkey):
    # Negative control: the equality above is not vacuous.
    vanilla = perturb(ViT(TINY64, key=getkey()), getkey(), 0.3)
    model = retrofit(vanilla, "dca")
    blk = model.trunk.blocks[1]
    grn = make_combiner("grn_v3", blk.grn_q.size, TINY64.d_model, dtype=jnp.float64,
                        init="random", key=getkey(), gate=blk.grn_q.gate)
    model = eqx.tree_at(lambda m: m.trunk.blocks[1].grn_q, model, grn)
    x = image(TINY64, seed=3)
    assert float(jnp.max(jnp.abs(forward(model, x) - forward(vanilla, x)))) > 1e-3


def test_retrofit_rejects_bad_input(getkey):
    vanilla = ViT(TINY64, key=getkey())
    with pytest.raises(ValueError, match="cannot retrofit into residual='laurel_pa'"):
        retrofit(vanilla, "laurel_pa")
    with pytest.raises(ValueError, match="needs a vanilla source"):
        retrofit(retrofit(vanilla, "dca"), "dca")


def test_s16_parameter_count():
    # ViT-S/16 by hand: patch Dense (16*16*3 -> 384, bias); per block 4 bias-free 384x384
    # attention maps, a 384-1536-384 MLP with biases, 2 LayerNorms; final LN; 1000-way head.
    # GAP + fixed sin-cos positions add no parameters.
    d, f, depth = 384, 1536, 12
    per_block = 4 * d * d + (d * f + f) + (f * d + d) + 2 * 2 * d
    expected = (16 * 16 * 3 * d + d) + depth * per_block + 2 * d + (d * 1000 + 1000)
    assert param_count(PRESETS["s16"]) == expected == 21_956_200  # "22M" in the paper
    # DCA adds 3 GRN-v3 and 2 LayerNorms per block and one output GRN-v3 (stack sizes t+1).
    grn = sum(3 * ((t + 1) * d + d) + 2 * 2 * d for t in range(depth)) + (depth + 1) * d + d
    assert param_count(preset("s16", residual="dca")) == expected + grn


def test_param_count_matches_built_model(getkey):
    cfg = preset("digits_tiny", residual="dca")
    assert param_count(cfg) == count_params(ViT(cfg, key=getkey()))


@pytest.mark.parametrize("changes,match", [
    ({"image_size": 10, "patch_size": 4}, "not a multiple of patch_size"),
    ({"residual": "resnet"}, "unknown residual 'resnet'"),
    ({"pool": "max"}, "pool must be one of cls, gap"),
    ({"positions": "rope"}, "positions must be one of"),
    ({"d_model": 18, "n_heads": 2}, "divisible by 4"),
    ({"k": 2}, "only valid with residual='dca'"),
    ({"n_layers": 0}, "n_layers must be an integer >= 1"),
    ({"layer_loop": "fori"}, "unknown layer_loop .fori.; valid: "),
])
def test_bad_config(changes, match):
    with pytest.raises(ValueError, match=match):
        ViTConfig(**changes)


def test_unknown_preset_and_wrong_image_shape(getkey):
    with pytest.raises(ValueError, match="unknown ViT preset 'b16'"):
        preset("b16")
    model = ViT(PRESETS["digits_tiny"], key=getkey())
    with pytest.raises(ValueError, match=r"expected \(8, 8, 1\)"):
        model(jnp.zeros((8, 8, 3)))


def _scanned(vit: ViT) -> ViT:
    """``vit`` with its per-block trunk converted (exactly) to the scanned layout."""
    from dca_theory.lm.scanned import ScannedTrunk

    fresh = ViT(vit.cfg.replace(layer_loop="scan"), key=jax.random.PRNGKey(0))
    trunk = ScannedTrunk.from_trunk(vit.trunk)
    trunk = ScannedTrunk(cfg=fresh.trunk.cfg, blocks=trunk.blocks, mixer=trunk.mixer)
    rest = lambda m: (m.w_patch_PxD, m.b_patch_D, m.pos_NxD, m.cls_D,  # noqa: E731
                      m.final_norm, m.w_head_DxK, m.b_head_K)
    fresh = eqx.tree_at(rest, fresh, rest(vit), is_leaf=lambda x: x is None)
    return eqx.tree_at(lambda m: m.trunk, fresh, trunk)


@eqx.filter_jit
def _logits_and_image_gradient(model, image_HxWxC):
    return model(image_HxWxC), jax.grad(lambda x: jnp.sum(jnp.sin(model(x))))(image_HxWxC)


@pytest.mark.parametrize("residual", ["dca", "value_residual"])
def test_scanned_vit_equals_the_per_block_vit_in_float64(residual, getkey):
    """The ViT runs the LM's one scanned driver (``layer_loop="scan"``, non-causal): the same
    init from one key, and the same logits and input gradient as the per-block trunk, to 1e-10
    relative (float64 summation order; a mis-placed slot or a causal mask gives O(1))."""
    cfg = TINY64.replace(residual=residual)
    key = getkey()
    per_block, scanned = ViT(cfg, key=key), ViT(cfg.replace(layer_loop="scan"), key=key)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)),
                                     eqx.filter(scanned, eqx.is_array),
                                     eqx.filter(_scanned(per_block), eqx.is_array)))
    per_block = perturb(per_block, getkey(), 0.3)
    x = image(cfg, seed=1)
    for got, want in zip(_logits_and_image_gradient(_scanned(per_block), x),
                         _logits_and_image_gradient(per_block, x)):
        scale = float(jnp.max(jnp.abs(want)))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-10 * scale)


def test_retrofit_into_the_scanned_vit_keeps_the_function(getkey):
    vanilla = perturb(ViT(TINY64.replace(layer_loop="scan"), key=getkey()), getkey(), 0.3)
    model = retrofit(vanilla, "dca")
    assert model.cfg.layer_loop == "scan" and model.cfg.residual == "dca"
    x = image(TINY64, seed=1)
    assert_close(forward(model, x), forward(vanilla, x))
