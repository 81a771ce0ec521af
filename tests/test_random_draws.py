"""``random_draws`` returns jax.random's own bits for every shape, dtype and key kind, and falls
back to jax.random under tracing; exact equality (tolerance 0) is the contract."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory import random_draws as draws

SHAPES = [(), (7,), (2, 3, 4), (17, 33)]  # 1, 7, 24 and 561 elements: two buckets
DTYPES = [jnp.float32, jnp.float64, jnp.bfloat16]
KEYS = {"typed": jax.random.key(3), "raw": jax.random.PRNGKey(3)}


def same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key_kind", KEYS)
def test_normal_and_uniform_equal_jax_random_bit_for_bit(dtype, key_kind):
    key = KEYS[key_kind]
    for shape in SHAPES:
        same(draws.normal(key, shape, dtype), jax.random.normal(key, shape, dtype))
        same(draws.uniform(key, shape, dtype, -0.3, 0.7),
             jax.random.uniform(key, shape, dtype, -0.3, 0.7))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e-6, 0.1, 0.0, 0.37])
def test_scaled_normal_equals_jax_multiply(dtype, scale):
    key = jax.random.key(11)
    for shape in [(5,), (4, 9)]:
        want = scale * jax.random.normal(key, shape, dtype)
        same(draws.normal(key, shape, dtype, scale=scale), want)


def test_one_compiled_sampler_serves_every_shape_in_a_bucket():
    """The point of the module: no XLA compilation for a new shape inside a compiled bucket."""
    key = jax.random.key(0)
    draws.normal(key, (5, 6), jnp.float32)  # compiles the 256-element bucket
    with _programs_built() as compiled:
        for shape in [(3, 7), (200,), (16, 16), (2, 2, 2)]:
            draws.normal(key, shape, jnp.float32)
    assert compiled == []


@pytest.mark.parametrize("key_kind", KEYS)
def test_split_equals_the_listed_jax_split_bit_for_bit(key_kind):
    key = KEYS[key_kind]
    for n in (1, 2, 4, 15, 16, 17, 40):  # inside, at and past the first bucket
        got, want = draws.split(key, n), list(jax.random.split(key, n))
        assert len(got) == n
        for g, w in zip(got, want):
            assert isinstance(g, jax.Array) and g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(jax.random.key_data(g) if key_kind == "typed" else g,
                                          jax.random.key_data(w) if key_kind == "typed" else w)


def test_split_compiles_nothing_for_a_new_count_inside_a_bucket():
    key = jax.random.PRNGKey(1)
    draws.split(key, 3)  # compiles the 16-key bucket
    with _programs_built() as compiled:
        for n in (2, 5, 9, 16):
            draws.split(key, n)
    assert compiled == []
    traced = jax.jit(lambda k: jnp.stack(draws.split(k, 3)))(key)  # a tracer: jax.random's
    np.testing.assert_array_equal(traced, jax.random.split(key, 3))


@contextlib.contextmanager
def _programs_built():
    """A list that gets one entry per program built inside the block: compiled, or read from
    the tests' compilation cache (conftest)."""
    built = []
    build = jax._src.compiler.compile_or_get_cached

    def counting(*a, **k):
        built.append(1)
        return build(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jax._src.compiler, "compile_or_get_cached", counting)
        yield built


def test_traced_and_batched_keys_fall_back_to_jax_random():
    keys = jax.random.split(jax.random.key(5), 3)
    got = jax.vmap(lambda k: draws.normal(k, (4,), scale=0.5))(keys)
    same(got, jax.vmap(lambda k: 0.5 * jax.random.normal(k, (4,)))(keys))
    got = jax.jit(lambda k: draws.uniform(k, (2, 3)))(keys[0])
    same(got, jax.random.uniform(keys[0], (2, 3)))


def test_non_partitionable_threefry_falls_back_to_jax_random():
    key, before = jax.random.key(2), jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        assert not draws._bucketable(key)
        same(draws.normal(key, (3, 4)), jax.random.normal(key, (3, 4)))
    finally:
        jax.config.update("jax_threefry_partitionable", before)


def _leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        same(x, y)


def test_build_each_equals_filter_vmap_bit_for_bit():
    """The toy experiments' initial models: a key per model, and a width or rank that vmap
    sees traced (masks from it) and build_each concrete."""
    import equinox as eqx

    from dca_theory.nets.deep_linear import DeepLinear
    from dca_theory.nets.mlp import MLPResNet

    keys = jnp.stack([jax.random.PRNGKey(s) for s in (3, 8, 13)])
    widths = jnp.asarray([1, 3, 2])

    def mlp(k, w):
        return MLPResNet(6, w, 3, kind="grn_v3", gate="small_init", pad_to=4, key=k)

    def linear(k, r):
        return DeepLinear(5, r, 2, kind="grn_v2", pad_to=3, dtype=jnp.float64, key=k)

    for build, args in ((mlp, (keys, widths)), (linear, (keys, jnp.asarray([1, 3, 2])))):
        got = draws.build_each(build, *args)
        _leaves_equal(got, eqx.filter_vmap(build)(*args))
        assert eqx.tree_equal(eqx.filter(got, eqx.is_array, inverse=True),
                              eqx.filter(build(*(a[0] for a in args)), eqx.is_array,
                                         inverse=True))


def test_build_each_refuses_models_that_differ_in_more_than_arrays():
    from dca_theory.nets.mlp import MLPResNet

    keys = jnp.stack([jax.random.PRNGKey(s) for s in (0, 1)])
    kinds = ["vanilla", "grn_v3"]
    with pytest.raises(ValueError, match="model 1 differs from model 0"):
        draws.build_each(lambda k, i: MLPResNet(4, 2, 2, kind=kinds[int(i)], key=k),
                         keys, jnp.arange(2))
