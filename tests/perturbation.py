"""Weights moved away from their init, for tests that compare two implementations off the
trivial point (zero-initialised heads, identity gates)."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np

from dca_theory import random_draws

# NumPy adds ``x + noise`` with the rounding of XLA's eager add for these
_NUMPY_EXACT = (np.dtype(np.float32), np.dtype(np.float64))


def perturb(tree, key, scale=0.1):
    """Add N(0, scale²) noise to every float array of ``tree``. The draws and the sum are made
    without compiling a program per leaf shape (:mod:`dca_theory.random_draws`, NumPy), which
    with ``jax.random.normal`` and eager ``+`` was a third of a second per new shape."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = random_draws.split(key, len(leaves))

    def noisy(x, k):
        if not eqx.is_inexact_array(x):
            return x
        noise = random_draws.normal(k, x.shape, x.dtype, scale=scale)
        if x.dtype in _NUMPY_EXACT:
            return jax.device_put(np.asarray(x) + np.asarray(noise))
        return x + noise

    return jax.tree_util.tree_unflatten(treedef, [noisy(x, k) for x, k in zip(leaves, keys)])
