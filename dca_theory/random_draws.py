"""Initial parameters drawn without compiling a sampler for every shape.

``jax.random.normal(key, shape)`` outside ``jit`` compiles one XLA program per shape and dtype
(0.15-0.9 s each on a 2-core CPU), so building a model of a new size, as every test and every
experiment's first step does, spends most of its time compiling samplers. The functions here
return the *same bits*: with JAX's partitionable threefry (``jax_threefry_partitionable``, the
default), element ``i`` of a draw depends only on the key and ``i``'s row-major position, so a
draw of shape ``(a, b)`` equals the first ``a * b`` elements of a flat draw of any larger size.
A flat draw of the next power of two (at least ``_MIN_BUCKET``) therefore serves every shape up
to it with one compiled sampler per bucket; the slice, reshape and scale happen in NumPy, which
needs no compilation and rounds a single multiply exactly as XLA does. Under ``jit``/``vmap``
(a traced key), for a batch of keys, or for another PRNG implementation, the call goes straight
to ``jax.random``. ``dtype`` defaults to JAX's default float, as ``jax.random``'s does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PRNGKeyArray

M = TypeVar("M")
_MIN_BUCKET = 256
_MIN_KEYS = 16  # the smallest bucket of split counts
# NumPy rounds ``scale * x`` as XLA does for these; other dtypes are scaled by JAX.
_NUMPY_SCALED = (np.dtype(np.float32), np.dtype(np.float64))


def _bucketable(key: PRNGKeyArray) -> bool:
    """A single concrete threefry key, with the partitionable bit layout that slicing needs."""
    if isinstance(key, jax.core.Tracer) or not jax.config.jax_threefry_partitionable:
        return False
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key.shape == () and str(jax.random.key_impl(key)) == "threefry2x32"
    return key.shape == (2,) and jax.config.jax_default_prng_impl == "threefry2x32"


def _bucket(n: int, smallest: int = _MIN_BUCKET) -> int:
    return max(smallest, 1 << max(n - 1, 0).bit_length())


def _finish(flat: Array, shape: tuple[int, ...], scale: float | None) -> Array:
    n = math.prod(shape)
    x = np.asarray(flat)[:n].reshape(shape)
    # device_put, not jnp.asarray: the latter compiles a small program per shape.
    if scale is None:
        return jax.device_put(x)
    if x.dtype in _NUMPY_SCALED:
        return jax.device_put(x * scale)
    return scale * jax.device_put(x)


def normal(key: PRNGKeyArray, shape: tuple[int, ...], dtype=float, *,
           scale: float | None = None) -> Array:
    """``jax.random.normal(key, shape, dtype)`` (times ``scale``), bit for bit."""
    shape = tuple(shape)
    if not _bucketable(key):
        x = jax.random.normal(key, shape, dtype)
        return x if scale is None else scale * x
    return _finish(jax.random.normal(key, (_bucket(math.prod(shape)),), dtype), shape, scale)


def uniform(key: PRNGKeyArray, shape: tuple[int, ...], dtype=float, minval: float = 0.0,
            maxval: float = 1.0) -> Array:
    """``jax.random.uniform(key, shape, dtype, minval, maxval)``, bit for bit."""
    shape = tuple(shape)
    if not _bucketable(key):
        return jax.random.uniform(key, shape, dtype, minval, maxval)
    flat = jax.random.uniform(key, (_bucket(math.prod(shape)),), dtype, minval, maxval)
    return _finish(flat, shape, None)


def split(key: PRNGKeyArray, n: int = 2) -> list[Array]:
    """``list(jax.random.split(key, n))``, bit for bit: the ``n`` keys one by one. Eagerly,
    ``jax.random.split`` compiles a splitter per ``n`` and iterating its result compiles an
    unstack per ``n``; with partitionable threefry key ``i`` of a split depends only on ``i``,
    so one split per bucket of counts serves every ``n`` in it, and the keys are sliced in
    NumPy and put back on the device one by one (a ``device_put`` compiles nothing)."""
    if not _bucketable(key) or jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return list(jax.random.split(key, n))
    rows = np.asarray(jax.random.split(key, _bucket(n, _MIN_KEYS)))
    return [jax.device_put(row) for row in rows[:n]]


def build_each(build: Callable[..., M], *args) -> M:
    """``eqx.filter_vmap(build)(*args)``, bit for bit: the models of ``build(args[0][i], …)``
    with their arrays stacked, but built one at a time, so that their draws reuse the compiled
    samplers above. Under ``vmap`` every initialising operation is compiled again for the batch
    (about 8 s of toy_gates' 25 s of compilation at its tiny size). The models must differ
    only in their arrays."""
    n = len(args[0])
    models = [build(*(a[i] for a in args)) for i in range(n)]
    static = eqx.filter(models[0], eqx.is_array, inverse=True)
    for i, m in enumerate(models[1:], 1):
        if not eqx.tree_equal(eqx.filter(m, eqx.is_array, inverse=True), static):
            raise ValueError(f"build_each: model {i} differs from model 0 in more than its "
                             "arrays (a static field or the tree's structure); vmap could not "
                             "batch it either")
    return eqx.combine(stack_leaves([eqx.filter(m, eqx.is_array) for m in models]), static)


def stack_leaves(trees):
    """Equal-structure pytrees of arrays as one, each leaf stacked on a new leading axis, in
    NumPy (an eager ``jnp.stack`` compiles a program per leaf shape)."""
    return jax.tree.map(lambda *xs: jax.device_put(np.stack([np.asarray(x) for x in xs])),
                        *trees)
