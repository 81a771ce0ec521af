r"""The GRN formula, written once for numpy and JAX arrays alike.

A GRN combines the stack entries :math:`h_i` with per-entry coefficients

.. math::  y = \sum_i c_i \odot h_i ,\qquad c_i = b_i\ (+\ \mathrm{gate}(w^\top h_i))
           \quad\text{or, bias inside,}\quad c_i = \mathrm{gate}(b_i + w^\top h_i),

``b_i`` a scalar (GRN-v1) or a ``D``-vector (GRN-v2/v3), the gate term GRN-v3's only
(:mod:`dca_theory.gates` names the forms). The
functions below use only array methods and operators (``reshape``, ``@``, ``*``, ``sum``), so the
JAX combiners (:mod:`dca_theory.residual`), the fast LM path (:mod:`dca_theory.lm.fast.fused_grn`)
and the theory's numpy mirror (:mod:`dca_theory.theory.constructions`) all evaluate this one
definition; the caller supplies the gate function (JAX's ReLU with its derivative convention,
or numpy's ``maximum``).
"""

from __future__ import annotations


def per_feature(row, like):
    """``row`` (a scalar ``()`` or a ``(D,)`` vector) reshaped to broadcast against ``like``
    ``(*batch, D)`` explicitly (the tests forbid implicit rank promotion)."""
    return row.reshape((1,) * (like.ndim - row.ndim) + row.shape)


def per_entry(params, stack):
    """Per-entry parameters ``(S,)`` or ``(S, D)`` shaped to broadcast against a stack
    ``(S, *batch, D)``."""
    if params.ndim == 1:
        return params.reshape(params.shape + (1,) * (stack.ndim - 1))
    return params.reshape(params.shape[:1] + (1,) * (stack.ndim - params.ndim) + params.shape[1:])


def _gated(b, gate_input, gate, bias_inside):
    """``gate(b + p)`` or ``b + gate(p)``, ``p`` the gate input with a trailing feature axis."""
    return gate(b + gate_input[..., None]) if bias_inside else b + gate(gate_input)[..., None]


def coefficient(b_i, h, gate_input=None, gate=None, bias_inside=False):
    """Entry ``i``'s coefficient shaped to multiply ``h`` ``(*batch, D)``; ``gate_input`` is
    ``w · h_i`` (``(*batch,)``), ``None`` for GRN-v1/v2."""
    c = per_feature(b_i, h)
    return c if gate_input is None else _gated(c, gate_input, gate, bias_inside)


def coefficients(b, w, gate, stack, bias_inside=False):
    """All coefficients ``c`` of a stack ``(S, *batch, D)`` at once (``w=None``: v1/v2), so that
    the GRN output is ``(c * stack).sum(0)``. Shape: ``b``'s broadcast against the stack."""
    c = per_entry(b, stack)
    return c if w is None else _gated(c, stack @ w, gate, bias_inside)


def combine(b, w, gate, stack, bias_inside=False):
    """The GRN output ``sum_i c_i ⊙ h_i`` over a stack ``(S, *batch, D)``."""
    return (coefficients(b, w, gate, stack, bias_inside) * stack).sum(0)
