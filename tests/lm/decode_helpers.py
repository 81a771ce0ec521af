"""Cached decoding fed in chunks, to compare with the full pass at every position."""

import equinox as eqx
import jax.numpy as jnp


@eqx.filter_jit
def decoded(trunk, x_LxD, chunk):
    """The trunk output at every position, fed ``chunk`` tokens at a time through the cache."""
    cache, out = trunk.empty_cache(), []
    for start in range(0, x_LxD.shape[0], chunk):
        h, cache = trunk.decode(x_LxD[start:start + chunk], cache, jnp.asarray(start))
        out.append(h)
    return jnp.concatenate(out)
