"""Comparing two pytrees of arrays (the fast path against the reference)."""

import jax
import jax.numpy as jnp
import numpy as np

# Relative to the largest magnitude in the whole compared tree: some gradients are exactly 0
# in exact arithmetic (e.g. LN_k's bias: softmax ignores a shift shared by all keys) and only
# rounding noise (~1e-18) in either path.
RTOL = 1e-11


def assert_trees_close(a, b, rtol=RTOL):
    xs, ys = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(xs) == len(ys)
    scale = max(float(jnp.max(jnp.abs(y))) for y in ys)
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=rtol * scale)
