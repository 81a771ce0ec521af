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
(at least float32); tests compare values and gradients with the reference in float64.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from dca_theory.lm.fast_path import grn_arguments, grn_backward, grn_forward, separate_add


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


# --- GRNs followed by LayerNorms (a DCA block's q̃, k̃, ṽ and their LN_q, LN_k, LN_v) ---------
#
# The pair's backward pass keeps neither the GRN outputs nor the normalised ones: it keeps the
# stack entries (alive anyway as layer outputs) and the gate pre-activations, and recomputes
# the rest. The LayerNorm outputs themselves are kept by the
# attention projections that read them, as in a pre-LN block.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _grn_norm(gate, eps, stat_dtype, entries, bs, ws, scales, biases):
    outs, _ = grn_forward(gate, entries, bs, ws)
    normed = tuple(layer_norm(y, s, b, eps, stat_dtype) for y, s, b in zip(outs, scales, biases))
    return normed, outs, entries


def _grn_norm_fwd(gate, eps, stat_dtype, entries, bs, ws, scales, biases):
    outs, pres = grn_forward(gate, entries, bs, ws)
    normed = tuple(layer_norm(y, s, b, eps, stat_dtype) for y, s, b in zip(outs, scales, biases))
    return (normed, outs, entries), (entries, bs, ws, pres, scales, biases)


def _grn_norm_bwd(gate, eps, stat_dtype, residuals, cotangents):
    entries, bs, ws, pres, scales, biases = residuals
    d_normed, d_outs, d_through = cotangents
    # Recompute the GRN outputs (O(S) elementwise work). XLA:CPU drops optimisation barriers
    # before common-subexpression elimination, so a plain recomputation would be merged with
    # the forward pass's and its results kept alive until here after all (as jax.checkpoint
    # is, on CPU). Adding 0 · (a cotangent element) makes the recomputation a different
    # expression that depends on the cotangents: it cannot be merged or scheduled early. The
    # value is unchanged (h + 0 = h) unless the cotangent is not finite, when the gradient is
    # not finite anyway.
    zero = 0.0 * d_normed[0].reshape(-1)[0].astype(entries[0].dtype)
    outs, _ = grn_forward(gate, tuple(h + zero for h in entries), bs, ws)
    d_total, d_scales, d_biases = [], [], []
    for y, s, b, dn, dy in zip(outs, scales, biases, d_normed, d_outs):
        # layer_norm's own (JVP-derived) backward pass, on the recomputed GRN output.
        _, norm_vjp = jax.vjp(lambda y, s, b: layer_norm(y, s, b, eps, stat_dtype), y, s, b)
        dx, ds, db = norm_vjp(dn.astype(stat_dtype))
        # Materialised once: the backward pass of every entry reads it.
        d_total.append(separate_add(dx, dy.astype(dx.dtype), bs[0]))
        d_scales.append(ds)
        d_biases.append(db)
    d_entries, d_bs, d_ws = grn_backward(gate, entries, bs, ws, pres, tuple(d_total), d_through)
    return d_entries, d_bs, d_ws, tuple(d_scales), tuple(d_biases)


_grn_norm.defvjp(_grn_norm_fwd, _grn_norm_bwd)


def grn_layer_norm(combiners, norms, entries, stat_dtype) -> tuple[tuple, tuple, tuple]:
    """``((LN_j(GRN_j(G)))_j, (GRN_j(G))_j, G)`` over a tuple of stack entries ``G``, with the
    lean backward pass described above. The entries come back unchanged: read the stack
    through them afterwards (see :func:`dca_theory.lm.fast_path.combine_threaded`).
    ``norms`` are LayerNorm modules (``scale``, ``bias``, ``eps``; one ``eps`` for all), cast
    to ``stat_dtype`` for the statistics."""
    gate, bs, ws = grn_arguments(combiners, tuple(entries))
    eps = {n.eps for n in norms}
    if len(eps) != 1 or len(norms) != len(combiners):
        raise ValueError(f"need one LayerNorm per combiner with one eps, got {len(norms)} "
                         f"norms for {len(combiners)} combiners, eps {sorted(eps)}")
    scales = tuple(n.scale.astype(stat_dtype) for n in norms)
    biases = tuple(n.bias.astype(stat_dtype) for n in norms)
    return _grn_norm(gate, eps.pop(), stat_dtype, tuple(entries), bs, ws, scales, biases)
