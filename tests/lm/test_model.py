"""The transformer LM: shapes, jit, causality, DCA-at-init = vanilla, k-DCA, dtypes, bad configs.

All on the tiny preset (3 layers, width 32, L = 32). Tolerances: float32 results are compared at
1e-6 relative to the logit scale (a few float32 ulps: the GRN sums the stack at once while
vanilla adds recursively, so the two differ only by rounding); float64 at 1e-12.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_helpers import (
    F64,
    TINY,
    L,
    apply_block,
    assert_close_logits,
    causal_jacobian_norms,
    logits_with_dropout,
    states_of,
    tokens,
)
from zoo_helpers import logits as logits_jit

from dca_theory.lm.config import PRESETS, ModelConfig
from dca_theory.lm.model import build_model, sinusoidal_positions
from dca_theory.residual import make_combiner

close = assert_close_logits


def randomize_grns(model, key):
    """Replace every GRN by one with random b, w (so k-DCA tests exercise non-trivial weights)."""
    is_comb = lambda x: hasattr(x, "kind") and hasattr(x, "size")  # noqa: E731
    leaves = [x for x in jax.tree_util.tree_leaves(model, is_leaf=is_comb) if is_comb(x)]
    keys = jax.random.split(key, len(leaves))
    new = [make_combiner(c.kind, c.size, c.dim, dtype=c.b.dtype, init="random", key=k,
                         gate=c.gate) for c, k in zip(leaves, keys)]
    it = iter(new)
    return jax.tree_util.tree_map(lambda x: next(it) if is_comb(x) else x, model, is_leaf=is_comb)


@pytest.mark.parametrize("residual,k", [("dca", 1)])
def test_shapes_finite_and_jit_matches_eager(residual, k, getkey):
    # Two layers with k = 1 already use every slot kind (input, middle, recent); eager
    # execution compiles op by op, so fewer layers keep this test fast.
    model = build_model(TINY.replace(residual=residual, k=k, n_layers=2), key=getkey())
    toks = tokens()
    eager = model(toks)
    jitted = logits_jit(model, toks)
    assert eager.shape == (L, TINY.vocab_size) and eager.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(eager)))
    # XLA may fuse/reorder float32 ops under jit: agree to a few ulps of the logit scale.
    np.testing.assert_allclose(jitted, eager, atol=1e-5 * float(jnp.max(jnp.abs(eager))))


@pytest.mark.parametrize("residual,k", [
    ("dca", 1), pytest.param("vanilla", None, marks=pytest.mark.slow),
    pytest.param("grn_v3", None, marks=pytest.mark.slow),
])
def test_causality_via_gradients(residual, k, getkey):
    cfg = F64.replace(residual=residual, k=k, n_layers=2)  # 2 layers: input, middle and recent
    model = randomize_grns(build_model(cfg, key=getkey()), getkey())
    # d logits[i] / d x[j] for every (i, j): zero for j > i (exactly: masked probabilities are 0).
    norms = causal_jacobian_norms(model, model.embed(tokens()))
    for i in (0, 5, L - 1):
        assert np.all(norms[i, i + 1:] == 0.0), f"position {i} depends on the future"
        assert np.all(norms[i, : i + 1] > 0.0), f"position {i} ignores part of its past"


@pytest.mark.parametrize("residual,k,dtype", [
    ("dca", None, "float32"), ("dca", None, "float64"), ("dca", 1, "float32"),
    pytest.param("grn_v3", None, "float32", marks=pytest.mark.slow),
    pytest.param("grn_v1", None, "float32", marks=pytest.mark.slow),
    pytest.param("grn_v2", None, "float32", marks=pytest.mark.slow),
    pytest.param("dca", 0, "float64", marks=pytest.mark.slow),
    pytest.param("dca", 2, "float64", marks=pytest.mark.slow),
])
def test_grn_models_equal_vanilla_at_init(residual, k, dtype):
    key = jax.random.PRNGKey(3)  # same key: same embeddings, block weights and output layer
    cfg = TINY.replace(param_dtype=dtype, compute_dtype=dtype)
    vanilla = build_model(cfg, key=key)
    other = build_model(cfg.replace(residual=residual, k=k), key=key)
    toks = tokens(1)
    close(logits_jit(other, toks), logits_jit(vanilla, toks), dtype)


def test_grn_models_differ_from_vanilla_with_random_grns(getkey):
    # Guards the test above: a non-identity GRN really changes the function.
    key = getkey()
    vanilla = build_model(TINY, key=key)
    dca = randomize_grns(build_model(TINY.replace(residual="dca"), key=key), getkey())
    diff = jnp.max(jnp.abs(logits_jit(dca, tokens()) - logits_jit(vanilla, tokens())))
    assert diff > 1e-2


@pytest.mark.parametrize("k", [3, pytest.param(10, marks=pytest.mark.slow)])  # 3 = depth
def test_k_at_least_depth_equals_full_dca(k, getkey):
    key = getkey()
    full = randomize_grns(build_model(TINY.replace(residual="dca"), key=key), getkey())
    trunc = build_model(TINY.replace(residual="dca", k=k), key=key)
    # Same parameter shapes, so full DCA's (random) parameters load into the k-DCA model.
    full_leaves = jax.tree_util.tree_leaves(eqx.filter(full, eqx.is_array))
    trunc_params, trunc_static = eqx.partition(trunc, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(trunc_params)
    assert [x.shape for x in leaves] == [x.shape for x in full_leaves]
    moved = eqx.combine(jax.tree_util.tree_unflatten(treedef, full_leaves), trunc_static)
    np.testing.assert_array_equal(logits_jit(moved, tokens()), logits_jit(full, tokens()))


def test_k_dca_stack_slots(getkey):
    """k = 1, 3 layers: block 2 reads [x, out_0 (middle), out_1]; the output GRN [x, o0+o1, o2]."""
    model = build_model(F64.replace(residual="dca", k=1), key=getkey())
    st = states_of(model, tokens())
    assert {"embed", "block_0_in", "block_2_out", "stream_2", "final"} <= set(st)
    assert [st[f"stack_{t}"].shape[0] for t in range(3)] == [1, 2, 3]
    np.testing.assert_array_equal(st["stack_2"][0], st["embed"])
    np.testing.assert_array_equal(st["stack_2"][1], st["block_0_out"])
    np.testing.assert_array_equal(st["stack_2"][2], st["block_1_out"])
    assert model.trunk.final.size == 3
    expected = st["embed"] + (st["block_0_out"] + st["block_1_out"]) + st["block_2_out"]
    np.testing.assert_allclose(st["final"], expected, rtol=1e-12, atol=1e-12)


def test_vanilla_block_matches_numpy_reference(getkey):
    """One pre-LN block against an independent numpy implementation (float64)."""
    cfg = F64.replace(n_layers=1)
    model = build_model(cfg, key=getkey())
    blk = model.trunk.blocks[0]
    x = np.asarray(jax.random.normal(getkey(), (L, cfg.d_model), jnp.float64))

    def ln(v, m):
        mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + cfg.ln_eps) * np.asarray(m.scale) + np.asarray(m.bias)

    W = {n: np.asarray(getattr(blk.attn, n)) for n in ("w_q_DxD", "w_k_DxD", "w_v_DxD", "w_o_DxD")}
    xn, H = ln(x, blk.ln1), cfg.n_heads
    K = cfg.d_model // H
    heads = []
    for h in range(H):
        sl = slice(h * K, (h + 1) * K)
        q, k_, v = ((xn @ W[n])[:, sl] for n in ("w_q_DxD", "w_k_DxD", "w_v_DxD"))
        s = q @ k_.T / np.sqrt(K) + np.triu(np.full((L, L), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append((p / p.sum(-1, keepdims=True)) @ v)
    y = x + np.concatenate(heads, -1) @ W["w_o_DxD"]
    m = blk.mlp
    z = np.maximum(ln(y, blk.ln2) @ np.asarray(m.w_in_DxF) + np.asarray(m.b_in_F), 0)
    expect = y + z @ np.asarray(m.w_out_FxD) + np.asarray(m.b_out_D)
    np.testing.assert_allclose(apply_block(blk, jnp.asarray(x)), expect, rtol=1e-10, atol=1e-10)


def test_sinusoidal_positions_flax_layout():
    pe = np.asarray(sinusoidal_positions(8, 6, jnp.float64))
    np.testing.assert_array_equal(pe[0], [0, 0, 0, 1, 1, 1])  # sin(0) | cos(0)
    div = np.exp(-np.log(1e4) * np.arange(3) / 2)  # min_scale 1, max_scale 1e4, D/2 - 1 = 2
    np.testing.assert_allclose(pe[5], np.r_[np.sin(5 * div), np.cos(5 * div)], rtol=1e-14)


@pytest.mark.slow  # two compilations of a dropout model (~15 s on 2 busy cores)
def test_dropout_only_with_key_and_not_inference(getkey):
    model = build_model(TINY.replace(dropout=0.3, attn_dropout=0.3, residual="dca"), key=getkey())
    toks, k = tokens(), getkey()
    base = logits_jit(model, toks)
    drop = logits_with_dropout(model, toks, k)
    assert float(jnp.max(jnp.abs(drop - base))) > 1e-3
    np.testing.assert_array_equal(logits_with_dropout(model, toks, k), drop)  # same key, same
    assert float(jnp.max(jnp.abs(logits_with_dropout(model, toks, getkey()) - drop))) > 1e-3


@pytest.mark.slow  # one bfloat16 compilation
def test_bf16_compute_close_to_float32(getkey):
    key = getkey()
    ref = logits_jit(build_model(TINY.replace(residual="dca"), key=key), tokens())
    bf = logits_jit(build_model(TINY.replace(residual="dca", compute_dtype="bfloat16"), key=key),
                    tokens())
    assert bf.dtype == jnp.float32  # params stay float32, so do the logits
    # bfloat16 keeps 8 mantissa bits (rel. error ~4e-3 per op); a 3-layer model stays within 5%.
    err = float(jnp.max(jnp.abs(bf - ref)) / jnp.max(jnp.abs(ref)))
    assert err < 5e-2
    # A trainer may instead cast every weight to bfloat16 (compute_dtype=None follows the
    # weights); LayerNorm statistics and the softmax still run in float32.
    model = build_model(TINY.replace(residual="dca"), key=key)
    cast = jax.tree_util.tree_map(
        lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x, model)
    out = logits_jit(cast, tokens())
    assert out.dtype == jnp.bfloat16
    assert float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref))) < 5e-2


def test_too_long_sequence(getkey):
    model = build_model(TINY, key=getkey())
    with pytest.raises(ValueError, match="exceeds max_len"):
        model(jnp.zeros((L + 1,), jnp.int32))


@pytest.mark.parametrize("changes,match", [
    ({"residual": "resnet"}, "unknown residual"),
    ({"residual": "dca", "k": -1}, "k must be"),
    ({"residual": "grn_v3", "k": 2}, "only valid with residual='dca'"),
    ({"d_model": 30}, "divisible by n_heads"),
    ({"n_layers": 0}, "n_layers must be a positive integer"),
    ({"d_mlp": -4}, "d_mlp must be a positive integer"),
    ({"vocab_size": 0}, "vocab_size must be"),
    ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
    ({"attn_dropout": -0.1}, "attn_dropout must be in"),
    ({"compute_dtype": "int8"}, "compute_dtype must be one of"),
])
def test_bad_config_values(changes, match):
    with pytest.raises(ValueError, match=match) as err:
        TINY.replace(**changes)
    assert "\n" not in str(err.value)


def test_presets_are_valid_configs():
    assert PRESETS["paper"] == ModelConfig()
    assert PRESETS["tiny"].n_layers == 3
