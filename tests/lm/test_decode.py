"""Cached decoding (:mod:`dca_theory.lm.decode`) against the full forward pass, and the cached
sampler (:func:`dca_theory.lm.sample.generate`) against the uncached one.

Weights are perturbed away from their init (so every GRN, DWA, hyper-connection and LAuReL map
is active). The tolerance is relative to the logit scale ``max |logits|``: float32 1e-5 (the
cached step sums attention over the whole buffer and multiplies one row at a time, so the
summation order differs from the full pass; measured: about 3e-7); bfloat16 3e-2 (a few
bfloat16 ulps, 2^-8 each: the residual stream is rounded to bfloat16 after every block, and a
different summation order can round one element to the next value; measured: about 5e-3).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_helpers import TINY, perturb, tokens

from dca_theory.lm.decode import DecodeCache, decode_step, max_stack_entries, supports_cache
from dca_theory.lm.model import build_model
from dca_theory.lm.sample import generate
from dca_theory.lm.trunk import ResidualTrunk

TOL = {"float32": 1e-5, "bfloat16": 3e-2}


@eqx.filter_jit
def _full(model, toks_L):
    return model(toks_L, inference=True)


@eqx.filter_jit
def _cached(model, toks_L):
    """Logits at every position by feeding the tokens one at a time through the cache."""
    def body(cache, tok):
        logits_V, cache = decode_step(model, cache, tok)
        return cache, logits_V

    return jax.lax.scan(body, DecodeCache.empty(model), toks_L)[1]


def _model(changes, key=0):
    cfg = TINY.replace(**changes)
    return perturb(build_model(cfg, key=jax.random.PRNGKey(key)), jax.random.PRNGKey(key + 1))


def _assert_cached_equals_full(model, dtype):
    toks = tokens(3)
    full = np.asarray(_full(model, toks).astype(jnp.float32))
    cached = np.asarray(_cached(model, toks).astype(jnp.float32))
    scale = float(np.max(np.abs(full)))
    np.testing.assert_allclose(cached, full, rtol=0, atol=TOL[dtype] * scale)


KINDS = [
    {"residual": "vanilla"},
    {"residual": "grn_v3"},
    {"residual": "dca"},
    {"residual": "dca", "k": 2, "n_layers": 4},  # block 3 reads k-DCA's middle sum
    {"residual": "laurel_pa"},
    pytest.param({"residual": "grn_v2", "grn_window": 2}, marks=pytest.mark.slow),
    pytest.param({"residual": "denseformer"}, marks=pytest.mark.slow),
    pytest.param({"residual": "hyper_connections"}, marks=pytest.mark.slow),
    pytest.param({"residual": "laurel_lr"}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("changes", KINDS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_cached_logits_equal_the_full_pass_at_every_position(changes):
    _assert_cached_equals_full(_model(changes), "float32")


@pytest.mark.parametrize("changes", [
    # ~20 s each; the float32 cache tests stay in the default run
    pytest.param({"param_dtype": "bfloat16"}, marks=pytest.mark.slow),
    pytest.param({"compute_dtype": "bfloat16"}, marks=pytest.mark.slow),
], ids=["bf16-params", "bf16-compute"])
def test_cached_logits_in_bfloat16(changes):
    _assert_cached_equals_full(_model({"residual": "dca", "k": 1, **changes}), "bfloat16")


@pytest.mark.parametrize("temperature, top_k", [(0.0, None), (1.0, 5)])
def test_cached_and_uncached_sampling_give_the_same_tokens(temperature, top_k):
    # max_len 8 and 10 new tokens after a 5-token prompt: the window slides past max_len, so
    # the cached sampler's re-fill is exercised too.
    model = _model({"residual": "dca", "k": 1, "max_len": 8})
    prompt = [3, 1, 4, 1, 5]
    kw = dict(max_len=8, key=jax.random.PRNGKey(7), temperature=temperature, top_k=top_k)
    with_cache = generate(model, prompt, 10, cache=True, **kw)
    without = generate(model, prompt, 10, cache=False, **kw)
    assert with_cache.tolist()[:5] == prompt and len(with_cache) == 15
    np.testing.assert_array_equal(with_cache, without)


class _UnknownTrunk(ResidualTrunk):
    """A trunk class the decoder has no step for (stands for a trunk added later)."""


def test_a_trunk_without_a_cached_step_falls_back_with_one_line(capsys):
    model = _model({"residual": "vanilla", "max_len": 8})
    trunk = model.trunk
    model = eqx.tree_at(lambda m: m.trunk, model,
                        _UnknownTrunk(cfg=trunk.cfg, blocks=trunk.blocks, grns=trunk.grns))
    assert not supports_cache(model)
    kw = dict(max_len=8, key=jax.random.PRNGKey(0), temperature=0.0)
    out = generate(model, [1, 2], 3, **kw)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "uncached sampler" in err and "_UnknownTrunk" in err
    np.testing.assert_array_equal(out, generate(model, [1, 2], 3, cache=False, **kw))
    with pytest.raises(ValueError, match="no cached decoding for trunk _UnknownTrunk; valid: "):
        decode_step(model, DecodeCache.empty(model), jnp.asarray(0, jnp.int32))


def test_cache_size_is_keys_and_values_per_block_and_position():
    model = build_model(TINY.replace(residual="dca", k=2), key=jax.random.PRNGKey(0))
    cache = DecodeCache.empty(model)
    # 2 (keys, values) × layers × positions × D float32 numbers, whatever the residual kind.
    assert cache.nbytes() == 2 * TINY.n_layers * TINY.max_len * TINY.d_model * 4
    assert max_stack_entries(model) == min(2 + 2, TINY.n_layers + 1)


@pytest.mark.parametrize("max_len", [0, TINY.max_len + 1])
def test_sampling_window_beyond_the_model_is_refused(max_len):
    model = build_model(TINY, key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=rf"max_len must be in \[1, {TINY.max_len}\]"):
        generate(model, [1], 1, max_len=max_len, key=jax.random.PRNGKey(0))


def test_a_batch_of_caches_decodes_under_vmap():
    # Two sequences side by side (one cache each, vmapped) give each sequence's own logits, to
    # float32's TOL (batched matmuls sum in another order: measured about 2e-6).
    model = _model({"residual": "dca", "k": 1, "max_len": 8})
    toks_BxL = jnp.stack([tokens(3, 8), tokens(4, 8)])
    batched = eqx.filter_jit(eqx.filter_vmap(_cached, in_axes=(None, 0)))(model, toks_BxL)
    for b in range(2):
        np.testing.assert_allclose(np.asarray(batched[b]), np.asarray(_cached(model, toks_BxL[b])),
                                   rtol=0,
                                   atol=TOL["float32"] * float(jnp.max(jnp.abs(batched[b]))))
