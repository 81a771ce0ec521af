r"""Fast path for GRNs: several combiners over one stack of entries, never stacked, with a
hand-written backward pass that keeps only the entries.

:class:`~dca_theory.residual.Combiner` applied to ``stack.array()`` is the straightforward
reference: it copies every entry into a fresh ``(S, *batch, D)`` array, once per block, and
autodiff then keeps, per GRN, the stacked array and the broadcast coefficients
``b_i + gate_i`` (``S × batch × D`` each) for the backward pass. Over a depth-``n`` DCA that is
``O(n²)`` extra activation memory and ``O(n²)`` copies, although every block output already
lives in memory once.

:func:`combine_entries` computes ``n`` GRNs of kinds v1/v2/v3 (DCA's three: q̃, k̃, ṽ) over a
*tuple* of entries in one pass,

.. math::  y_j = \sum_i \big(b_{j,i} + \mathrm{gate}(w_j^\top h_i)\big) \odot h_i ,

and its custom VJP saves only the entries themselves (already alive as layer outputs), the
``S × batch × n`` gate pre-activations and the parameters. The backward pass recomputes the
coefficients on the fly:

.. math::  \bar h_i = \sum_j c_{j,i} \odot \bar y_j + \sum_j \bar p_{j,i}\, w_j ,\quad
           \bar p_{j,i} = \mathrm{gate}'(p_{j,i}) \, \langle \bar y_j, h_i \rangle ,\quad
           \bar b_{j,i} = \sum_{\text{batch}} \bar y_j \odot h_i ,\quad
           \bar w_j = \sum_i \sum_{\text{batch}} \bar p_{j,i}\, h_i .

``gate'`` follows :data:`dca_theory.residual.GATES`: ``relu`` has derivative 0 at 0 (JAX's),
``relu_open`` has 1. Tests check values and gradients against the reference path in float64
(``tests/test_residual_fused.py``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array

from dca_theory.residual import GATES

Entries = tuple[Array, ...]


def _per_feature(b_row: Array, h: Array) -> Array:
    """``b_i`` (a scalar for v1, ``(D,)`` for v2/v3) shaped to broadcast against ``h``."""
    return b_row.reshape((1,) * (h.ndim - b_row.ndim) + b_row.shape)


def _gate_open(gate: str, pre: Array) -> Array:
    """``gate'(pre)`` as a 0/1 array: where the gate passes its input's derivative."""
    return (pre >= 0) if gate == "relu_open" else (pre > 0)


@jax.custom_batching.custom_vmap
def _add_in_conditional(a: Array, b: Array, token: Array) -> Array:
    pred = jnp.isfinite(token.reshape(-1)[0])
    return jax.lax.cond(pred, jnp.add, jnp.add, a, b)


@_add_in_conditional.def_vmap
def _add_in_conditional_vmap(axis_size, in_batched, a, b, token):
    # Under vmap the predicate stays one scalar, read from the (possibly batched) token, so the
    # conditional is never turned into a select; only the operands carry the batch axis.
    a_batched, b_batched, _ = in_batched
    if a_batched != b_batched:
        a, b = (x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
                for x, batched in ((a, a_batched), (b, b_batched)))
    return _add_in_conditional(a, b, token), a_batched or b_batched


@jax.custom_vjp
def separate_add(a: Array, b: Array, token: Array) -> Array:
    """``a + b``, computed by XLA as its own small computation rather than fused into its
    consumers.

    XLA:CPU fuses cheap elementwise producers into every consumer, duplicating them. Along a
    chain that runs through the whole depth (k-DCA's running middle sum; an entry's cotangent,
    to which every later block adds) this recomputes the chain in each consumer and builds
    fusions of hundreds of operands (paper/06_performance.md §6.1, §6.8). Optimisation
    barriers do not stop it (XLA:CPU drops them before fusion); a conditional does. The sum is
    therefore the branch of a ``lax.cond`` whose two branches both add, so its value is
    ``a + b`` whatever the predicate. The predicate is read from ``token`` (any array that is
    not a compile-time constant, e.g. a parameter; it gets a zero cotangent). A custom vmap
    rule keeps the predicate a single scalar under ``vmap``, also over seeds when the token is
    batched, since a batched predicate would turn the conditional into a select that is fused
    again. ``a`` and ``b`` must have one shape and dtype.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"separate_add needs operands of one shape and dtype, got "
                         f"{a.shape} {a.dtype} and {b.shape} {b.dtype}")
    return _add_in_conditional(a, b, token)


def _separate_add_fwd(a, b, token):
    return separate_add(a, b, token), token


def _separate_add_bwd(token, g):
    return g, g, jnp.zeros_like(token)


separate_add.defvjp(_separate_add_fwd, _separate_add_bwd)


def _gated(ws: tuple) -> tuple[list[int], Array | None]:
    """The GRN-v3 among ``ws`` (their indices) and their weights stacked to ``(n_v3, D)``."""
    v3 = [j for j, w in enumerate(ws) if w is not None]
    return v3, (jnp.stack([ws[j] for j in v3]) if v3 else None)


def _coefficient(gate: str, b: Array, i: int, h: Array, pre: Array | None, m: int | None):
    """Entry ``i``'s coefficient ``b_i (+ gate(w · h_i))`` in a GRN, shaped to multiply ``h``;
    ``m`` is the GRN's column in ``pre`` (``None`` for v1/v2)."""
    coef = _per_feature(b[i], h)
    return coef if m is None else coef + GATES[gate](pre[..., m])[..., None]


def grn_forward(gate: str, entries: Entries, bs: tuple, ws: tuple):
    """``(outputs, pres)``: the GRN outputs and, per entry, the gate pre-activations
    ``w_j · h_i`` of the GRN-v3 among them, ``(*batch, n_v3)`` (``None`` without GRN-v3)."""
    v3, w_stack = _gated(ws)
    # One thin matmul per entry serves every GRN-v3: faster on XLA:CPU than a
    # multiply-and-reduce per GRN (and than a matrix-vector product, which is a naive loop).
    # Full precision, so that accelerators do not round the gate inputs to TF32 / bf16 passes.
    pres = tuple(None if w_stack is None else jnp.matmul(h, w_stack.T, precision="highest")
                 for h in entries)
    outs = []
    for j, b in enumerate(bs):
        m = v3.index(j) if j in v3 else None
        terms = [_coefficient(gate, b, i, h, pres[i], m) * h for i, h in enumerate(entries)]
        outs.append(functools.reduce(jnp.add, terms))
    return tuple(outs), pres


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _combine(gate: str, entries: Entries, bs: tuple, ws: tuple):
    return grn_forward(gate, entries, bs, ws)[0], entries


def _combine_fwd(gate, entries, bs, ws):
    outs, pres = grn_forward(gate, entries, bs, ws)
    return (outs, entries), (entries, bs, ws, pres)


def _combine_bwd(gate, residuals, cotangents):
    d_outs, d_through = cotangents
    return grn_backward(gate, *residuals, d_outs, d_through)


def grn_backward(gate: str, entries: Entries, bs: tuple, ws: tuple, pres: tuple, d_outs,
                 d_through: Entries):
    """Cotangents ``(entries, bs, ws)`` of :func:`grn_forward` given the outputs' ``d_outs``,
    added to ``d_through``, the entries' cotangents from their later uses (see
    :func:`combine_threaded`)."""
    batch_axes = tuple(range(entries[0].ndim - 1))
    v3, w_stack = _gated(ws)
    d_entries, d_bs, d_w = [], [[] for _ in bs], None
    for i, h in enumerate(entries):
        dh = jnp.zeros((), jnp.result_type(h, *d_outs))
        gate_rows = []  # <ȳ_j, h_i> per token, for each GRN-v3 j
        for j, (b, dy) in enumerate(zip(bs, d_outs)):
            prod = dy * h
            if b.ndim == 1:  # v1: one scalar per entry
                d_bs[j].append(jnp.sum(prod).astype(b.dtype))
            else:
                d_bs[j].append(jnp.sum(prod, axis=batch_axes).astype(b.dtype))
            m = v3.index(j) if j in v3 else None
            if m is not None:
                gate_rows.append(jnp.sum(prod, axis=-1))
            dh = dh + _coefficient(gate, b, i, h, pres[i], m) * dy
        if v3:
            d_pre = jnp.where(_gate_open(gate, pres[i]), jnp.stack(gate_rows, axis=-1), 0)
            for m in range(len(v3)):
                dh = dh + d_pre[..., m, None] * _per_feature(w_stack[m], h)
            term = jnp.tensordot(d_pre, h, axes=(batch_axes, batch_axes))  # (n_v3, D)
            d_w = term if d_w is None else d_w + term
        # The entry's running cotangent is materialised here, block by block: otherwise XLA
        # fuses its whole accumulation (one term per later block) into each consumer.
        d_entries.append(separate_add(d_through[i].astype(dh.dtype), dh, bs[0]).astype(h.dtype))
    d_bs = tuple(jnp.stack(rows) for rows in d_bs)
    d_ws = tuple(None if w is None else d_w[v3.index(j)].astype(w.dtype)
                 for j, w in enumerate(ws))
    return tuple(d_entries), d_bs, d_ws


_combine.defvjp(_combine_fwd, _combine_bwd)


def grn_arguments(combiners, entries: Entries) -> tuple[str, tuple, tuple]:
    """Check ``combiners`` against ``entries`` and return ``(gate, bs, ws)`` for
    :func:`grn_forward` (one-line ``ValueError`` on a mismatch)."""
    gates = {c.gate for c in combiners if c.kind == "grn_v3"}
    if len(gates) > 1:
        raise ValueError(f"combine_entries needs one GRN-v3 gate, got {sorted(gates)}")
    for c in combiners:
        if c.kind not in ("grn_v1", "grn_v2", "grn_v3"):
            raise ValueError(f"combine_entries takes GRN kinds only, got {c.kind!r}")
        if c.size != len(entries) or entries[0].shape[-1] != c.dim:
            raise ValueError(f"{len(entries)} entries of shape {entries[0].shape} do not match "
                             f"a {c.kind} combiner of size {c.size} and dim {c.dim}")
    bs = tuple(c.b for c in combiners)
    ws = tuple(c.w if c.kind == "grn_v3" else None for c in combiners)
    return (gates.pop() if gates else "relu"), bs, ws


def combine_entries(combiners, entries: Entries) -> tuple[Array, ...]:
    """Apply GRN combiners (kinds ``grn_v1|v2|v3``, one gate) to a tuple of entries.

    Equals ``tuple(c(jnp.stack(entries)) for c in combiners)`` in value and gradient, without
    the stacked copy. Entries have shape ``(*batch, D)``; each combiner's size must be
    ``len(entries)``.
    """
    return combine_threaded(combiners, entries)[0]


def combine_threaded(combiners, entries: Entries) -> tuple[tuple[Array, ...], Entries]:
    """``(outputs, entries)``: :func:`combine_entries`, also passing the entries through.

    Read the stack through the returned entries in every later use. Then each entry's
    cotangent flows back through one chain, block by block, and every block's backward pass
    adds its own terms to it (see :func:`grn_backward`), instead of autodiff summing one
    term per use at the end.
    """
    gate, bs, ws = grn_arguments(combiners, entries)
    return _combine(gate, tuple(entries), bs, ws)
