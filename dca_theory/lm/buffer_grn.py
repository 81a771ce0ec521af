r"""GRNs over a stacked buffer with a lean backward pass: the scanned trunk's GRN kernel.

The scanned trunk (:mod:`dca_theory.lm.driver`) keeps the stack as one ``(S, *batch, D)``
buffer, and a block's GRNs (DCA's three, a GRN kind's one) all read it. :func:`buffer_grns`
computes ``n`` GRNs of kinds v1/v2/v3 (one gate, :mod:`dca_theory.gates`) over it,

.. math::  y_j = \sum_i c_{j,i} \odot h_i ,\qquad
           c_{j,i} = b_{j,i}\ \text{(v1, v2)},\quad
           \mathrm{gate}(b_{j,i}, w_j^\top h_i)\ \text{(v3)},

with the same value and gradient as calling each :class:`~dca_theory.residual.AbstractGRN` on
the buffer (tested in float64), faster on the CPU:

* **Forward**: one thin matmul ``h @ Wᵀ`` gives every GRN-v3's gate pre-activations of all
  entries at once; the weighted sums accumulate entry by entry in a ``fori_loop``
  (:data:`FORWARD_UNROLL` entries per iteration) instead of reducing a broadcast
  ``S × batch × D`` coefficient array, which XLA:CPU materialises (measured at width 256,
  batch 4 × 128 tokens, ``S = 25``, one GRN: about 1 ms against 33 ms).
* **Backward** (hand-written): it keeps only the buffer, the pre-activations and the
  parameters, and recomputes the coefficients. With ``m = gate'`` where the gate passes its
  input's derivative,

  .. math::  \bar h_i = \sum_j c_{j,i} \odot \bar y_j + \sum_j \bar p_{j,i}\, w_j,\quad
             \bar p_{j,i} = \langle m \odot \bar y_j, h_i \rangle,\quad
             \bar b_{j,i} = \sum_{\text{batch}} m \odot \bar y_j \odot h_i,\quad
             \bar w_j = \sum_i \sum_{\text{batch}} \bar p_{j,i}\, h_i

  (bias inside the gate: ``m`` per feature, on both ``b`` and ``p``; bias outside: ``m`` on the
  scalar ``p`` only, ``b̄`` without it). Autodiff of the reference would keep each GRN's
  broadcast coefficients.

Plain JAX (no platform switch): the formulation is what XLA:CPU needs and costs nothing
elsewhere.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array

from dca_theory import gates
from dca_theory.grn_formula import per_entry, per_feature
from dca_theory.residual import AbstractGRN

#: entries per iteration of the forward pass's loop over the buffer (a loop, not one
#: Python term per entry, so the program does not grow with the depth)
FORWARD_UNROLL = 4


def buffer_grns(grns: Sequence[AbstractGRN], buffer: Array) -> tuple[Array, ...]:
    """``tuple(g(buffer) for g in grns)`` (GRNs of one gate, each of size
    ``buffer.shape[0]``), through the lean kernel of the module docstring. A GRN is gated
    when it has a gate vector ``w`` (GRN-v3, or a new GRN kind with a gate), whatever its
    class."""
    names = {g.gate for g in grns if g.w is not None}
    if len(names) > 1:
        raise ValueError(f"buffer_grns needs one GRN-v3 gate, got {sorted(names)}")
    for g in grns:
        g.check_stack(buffer)
    gate = names.pop() if names else gates.DEFAULT_GATE
    bs = tuple(g.b for g in grns)
    ws = tuple(g.w for g in grns)
    return _grns(gate, bs, ws, buffer)


def _pre_activations(ws: tuple, buffer: Array) -> Array | None:
    """``(S, *batch, n_v3)``: every GRN-v3's ``w · h_i`` (``None`` without GRN-v3)."""
    gated = [w for w in ws if w is not None]
    if not gated:
        return None
    return jnp.matmul(buffer, jnp.stack(gated).T.astype(buffer.dtype), precision="highest")


def _columns(ws: tuple) -> list[int | None]:
    """Each GRN's column in the pre-activations (``None`` for v1/v2)."""
    out, m = [], 0
    for w in ws:
        out.append(None if w is None else m)
        m += w is not None
    return out


def _coefficient(spec, b_i, h, pre):
    """Entry i's coefficient of one GRN, shaped to multiply ``h``; ``pre`` its ``w · h_i``
    (``None`` for v1/v2)."""
    c = per_feature(b_i.astype(h.dtype), h)
    if pre is None:
        return c
    pre = pre[..., None]
    return spec.nonlinearity(c + pre) if spec.bias_inside else c + spec.nonlinearity(pre)


def _forward(gate: str, bs, ws, buffer):
    spec = gates.get(gate)
    pres = _pre_activations(ws, buffer)
    cols = _columns(ws)

    def add_entry(i, outs):
        h = jax.lax.dynamic_index_in_dim(buffer, i, keepdims=False)
        pre = None if pres is None else jax.lax.dynamic_index_in_dim(pres, i, keepdims=False)
        return tuple(
            y + _coefficient(spec, jax.lax.dynamic_index_in_dim(b, i, keepdims=False), h,
                             None if m is None else pre[..., m]) * h
            for y, b, m in zip(outs, bs, cols))

    zeros = tuple(jnp.zeros(buffer.shape[1:], buffer.dtype) for _ in bs)
    outs = jax.lax.fori_loop(0, buffer.shape[0], add_entry, zeros,
                             unroll=min(FORWARD_UNROLL, buffer.shape[0]))
    return outs, pres


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grns(gate: str, bs, ws, buffer):
    return _forward(gate, bs, ws, buffer)[0]


def _grns_fwd(gate, bs, ws, buffer):
    outs, pres = _forward(gate, bs, ws, buffer)
    return outs, (bs, ws, buffer, pres)


def _grns_bwd(gate, residuals, d_outs):
    bs, ws, h, pres = residuals
    spec = gates.get(gate)
    cols = _columns(ws)
    d_h = jnp.zeros_like(h)
    d_bs, d_ws = [], []
    for b, w, m, dy in zip(bs, ws, cols, d_outs):
        dy = dy.astype(h.dtype)[None]
        # b̄ sums over the batch, and over the features too for a scalar b per entry
        b_axes = tuple(range(1, h.ndim - (b.ndim == 2)))
        if m is None:  # v1 / v2: c = b
            prod = dy * h
            d_b = jnp.sum(prod, axis=b_axes)
            d_h = d_h + per_entry(b.astype(h.dtype), h) * dy
            d_bs.append(d_b.astype(b.dtype))
            d_ws.append(None)
            continue
        pre = pres[..., m]  # (S, *batch)
        b_full = per_entry(b.astype(h.dtype), h)
        if spec.bias_inside:
            inside = b_full + pre[..., None]
            mask = spec.derivative_mask(inside)
            c = spec.nonlinearity(inside)
            prod = jnp.where(mask, dy * h, 0)
            d_pre = jnp.sum(prod, axis=-1)
            d_b = jnp.sum(prod, axis=b_axes)
        else:
            c = b_full + spec.nonlinearity(pre)[..., None]
            prod = dy * h
            d_b = jnp.sum(prod, axis=b_axes)
            d_pre = jnp.where(spec.derivative_mask(pre), jnp.sum(prod, axis=-1), 0)
        d_h = d_h + c * dy + d_pre[..., None] * per_feature(w.astype(h.dtype), h)
        d_w = jnp.tensordot(d_pre, h, axes=(tuple(range(h.ndim - 1)),) * 2)
        d_bs.append(d_b.astype(b.dtype))
        d_ws.append(d_w.astype(w.dtype))
    return tuple(d_bs), tuple(d_ws), d_h


_grns.defvjp(_grns_fwd, _grns_bwd)
