r"""LayerNorm with a lean backward pass: it keeps the normalised input and ``1/σ`` only.

Autodiff of the straightforward formula (:func:`layer_norm_reference`) keeps, per call, the
centred input, the normalised input, ``2 (x - μ)`` from the square's derivative and the output:
four ``*batch × D`` tensors. Training a transformer keeps one per LayerNorm call and per layer,
and a DCA block has four LayerNorms where a pre-LN block has two. :func:`layer_norm` computes the
same function with a custom JVP whose reverse mode keeps ``x̂ = (x - μ)/σ`` and ``1/σ``:

.. math::  \bar x = \frac{1}{\sigma}\Big(\bar{\hat x} - \overline{\bar{\hat x}}
           - \hat x\, \overline{\bar{\hat x} \odot \hat x}\Big), \quad
           \bar{\hat x} = \bar y \odot \gamma, \quad
           \bar\gamma = \textstyle\sum \bar y \odot \hat x, \quad
           \bar\beta = \textstyle\sum \bar y ,

with overlines over ``D`` meaning feature means. Statistics are computed in ``stat_dtype``
(at least float32); tests compare values and gradients with the reference in float64. DCA
blocks fuse it with their GRNs on the fast path (:mod:`dca_theory.lm.fast.fused_grn`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def at_least_float32(dtype) -> jnp.dtype:
    """``dtype`` widened to float32 if narrower (statistics and scores of a bf16 model in f32):
    ``jnp.promote_types(dtype, float32)``, spelled so that it also holds under strict promotion."""
    dtype = jnp.dtype(dtype)
    return dtype if dtype.itemsize >= 4 else jnp.dtype(jnp.float32)


def _row(p: Array, x: Array) -> Array:
    return p.reshape((1,) * (x.ndim - 1) + p.shape)


def layer_norm_reference(x: Float[Array, "*batch D"], scale: Array, bias: Array, eps: float,
                         stat_dtype) -> Array:
    """LayerNorm over the last axis, written out (autodiff keeps its intermediates)."""
    x32 = x.astype(stat_dtype)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return y * _row(scale, y) + _row(bias, y)


def _normalise(x, eps, stat_dtype):
    x32 = x.astype(stat_dtype)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    centred = x32 - mean
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(centred), axis=-1, keepdims=True) + eps)
    return centred * rstd, rstd


def _scale_shift(xhat: Array, scale: Array, bias: Array) -> Array:
    return xhat * _row(scale, xhat) + _row(bias, xhat)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def layer_norm(x: Float[Array, "*batch D"], scale: Array, bias: Array, eps: float,
               stat_dtype) -> Array:
    """Same value as :func:`layer_norm_reference` (in ``stat_dtype``), lean backward pass.

    A custom JVP (not VJP), so forward mode (``jax.jacfwd``) works too: its tangent is linear
    in the input tangents with coefficients ``x̂``, ``1/σ`` and ``γ``, which is all that reverse
    mode then keeps."""
    return _scale_shift(_normalise(x, eps, stat_dtype)[0], scale, bias)


@layer_norm.defjvp
def _layer_norm_jvp(eps, stat_dtype, primals, tangents):
    x, scale, bias = primals
    dx, d_scale, d_bias = tangents
    xhat, rstd = _normalise(x, eps, stat_dtype)
    y = _scale_shift(xhat, scale, bias)
    dx = dx.astype(xhat.dtype)
    dxhat = rstd * (dx - jnp.mean(dx, axis=-1, keepdims=True)
                    - xhat * jnp.mean(dx * xhat, axis=-1, keepdims=True))
    dy = dxhat * _row(scale, xhat) + xhat * _row(d_scale, xhat) + _row(d_bias, xhat)
    return y, dy

