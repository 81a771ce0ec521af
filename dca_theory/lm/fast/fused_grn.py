r"""The fast path of stack-reading GRNs: the LM's default (``ModelConfig.grn_impl="fused"``).

**What it replaces.** The reference path (``grn_impl="reference"``) is the readable one: stack
the entries into one ``(S, *batch, D)`` array, call each combiner
(:class:`~dca_theory.residual.AbstractCombiner`) on it, then the LayerNorms; autodiff does the
rest. It copies every entry once per block, and autodiff keeps, per GRN, the stacked array and
the broadcast coefficients ``b_i + gate_i`` (``S × batch × D`` each): over a depth-``n`` DCA
that is ``O(n²)`` extra activation memory and ``O(n²)`` copies, although every block output
already lives in memory once.

**Entry points.** The trunk and the DCA block call three helpers that take ``grn_impl`` and
return the same thing on either path, so that their code reads like the reference path:
:func:`combine_stack` (GRNs over a :class:`~dca_theory.residual.ResidualStack`),
:func:`combine_and_norm` (a DCA block's ``q̃, k̃, ṽ`` and their LayerNorms) and
:func:`middle_add` (the sum that folds k-DCA's middle entry).

**The fused GRNs.** :func:`combine_entries` computes ``n`` GRNs of kinds v1/v2/v3 over a
*tuple* of entries in one pass,

.. math::  y_j = \sum_i \big(b_{j,i} + \mathrm{gate}(w_j^\top h_i)\big) \odot h_i ,

and its custom VJP saves only the entries themselves (alive anyway as layer outputs), the
``S × batch × n_v3`` gate pre-activations and the parameters. The backward pass
(:func:`grn_backward`) recomputes the coefficients on the fly:

.. math::  \bar h_i = \sum_j c_{j,i} \odot \bar y_j + \sum_j \bar p_{j,i}\, w_j ,\quad
           \bar p_{j,i} = \mathrm{gate}'(p_{j,i}) \, \langle \bar y_j, h_i \rangle ,\quad
           \bar b_{j,i} = \sum_{\text{batch}} \bar y_j \odot h_i ,\quad
           \bar w_j = \sum_i \sum_{\text{batch}} \bar p_{j,i}\, h_i .

That is the bias-outside form (gates ``paper``, ``open``, ``small_init`` of :mod:`dca_theory.gates`;
``gate'(0)`` is 0 for ``paper`` and 1 for ``open``). With the bias inside (``bias_inside``,
:math:`c_{j,i} = \mathrm{relu}(b_{j,i} + p_{j,i})`) the derivative acts per feature, :math:`m =
\mathrm{relu}'(b_{j,i} + p_{j,i})`, on both parameters: :math:`\bar b_{j,i} = \sum_{\text{batch}} m
\odot \bar y_j \odot h_i` and :math:`\bar p_{j,i} = \langle m \odot \bar y_j, h_i \rangle`.
:func:`grn_layer_norm` fuses a DCA block's three GRNs with their LayerNorms
(:func:`dca_theory.lm.norm.layer_norm`): its backward pass keeps neither the GRN outputs nor the
normalised ones, only the entries and the gate pre-activations, and recomputes the rest (the
LayerNorm outputs are kept by the attention projections that read them, as in a pre-LN block).

**What XLA:CPU needs** (jax 0.10; measurements in ``paper/06_performance.md`` §6.1, §6.8). The
mechanism above is not enough on its own: four tricks make the compiled program do what it
says, and this is the only place that explains them. Tricks 1 and 2 work around XLA:CPU's
fusion and CSE passes and were measured there only, so they are lowered for the CPU alone
(``lax.platform_dependent``): the program lowered for a GPU or TPU has plain sums and a plain
recomputation, of the same values (``tests/lm/test_fast_path.py`` exports both and compares).

1. *Sums kept out of fusions* (:func:`separate_add`). XLA:CPU fuses a cheap elementwise
   producer into *every* consumer, recomputing it there. Along a chain that runs through the
   whole depth (k-DCA's running middle sum; an entry's running cotangent, to which every later
   block adds; a GRN output's total cotangent, read by every entry's backward pass) this
   recomputes the chain in each consumer and builds fusions of hundreds of operands.
   Optimisation barriers do not stop it (XLA:CPU drops them before fusion); a conditional
   does. So the sum is the branch of a ``lax.cond`` whose two branches both add: its value is
   ``a + b`` whatever the predicate. The branches must do work (JAX forwards a branch output
   that is a plain input), and the predicate must not be a compile-time constant (it would be
   folded): it is read from a parameter, the ``token``, which gets a zero cotangent. Under
   ``vmap`` a batched predicate would turn the conditional into a select, fused again; a
   custom vmap rule keeps the predicate one scalar (also when seeds are vmapped and the token
   is batched) and batches only the operands.
2. *Recomputation that cannot be merged* (``h + 0·ḡ`` in :func:`grn_layer_norm`'s backward).
   XLA:CPU drops optimisation barriers before common-subexpression elimination, so a plain
   recomputation of the GRN outputs in the backward pass (or ``jax.checkpoint``, any policy) is
   merged with the forward pass's, whose results then stay alive until the backward pass after
   all. Adding ``0 ·`` (one cotangent element) to each entry makes the recomputation a
   different expression that depends on the cotangents, so it can be neither merged nor
   scheduled early. The value is unchanged (``h + 0 = h``) unless the cotangent is not finite,
   when the gradient is not finite anyway.
3. *One thin matmul for the gate pre-activations* (:func:`grn_forward`). The GRN-v3 of a block
   read the same entries: ``h @ Wᵀ``, with ``W`` the ``(n_v3, D)`` stack of their ``w``, gives
   all their pre-activations of one entry in one call (and the weight cotangent is one
   ``tensordot`` per entry). On XLA:CPU this beats a multiply-and-reduce per GRN and a
   matrix-vector product (a naive loop). ``precision="highest"``, so that accelerators do not
   round the float32 gate inputs to TF32 / bf16 passes (same kernel on the CPU).
4. *Cotangents threaded block by block* (:func:`combine_threaded`, ``ResidualStack.with_entries``).
   Each fused GRN hands back the entries it read, and every later use reads the stack through
   them. An entry's cotangent then flows back through one chain and each block's backward pass
   adds its terms at once (through :func:`separate_add`, trick 1). Otherwise autodiff sums one
   term per later use at the end, and XLA fuses that whole accumulation into one consumer,
   with every later block's GRN cotangents alive until then.

The fused functions have custom VJPs, so they support reverse mode only: use
``grn_impl="reference"`` for ``jax.jvp`` / ``jax.jacfwd``. ``tests/lm/test_fast_path.py``
checks values and gradients against the reference path in float64, and that the conditional
of :func:`separate_add` survives compilation (a JAX or XLA upgrade that removed it would bring
the slow fusions back); ``tests/lm/test_fast_path_models.py`` compares whole models.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array

from dca_theory import gates, grn_formula
from dca_theory.gates import DEFAULT_GATE
from dca_theory.lm.config import GRN_IMPLS
from dca_theory.lm.norm import at_least_float32, layer_norm
from dca_theory.residual import GRNv1, GRNv2, GRNv3, ResidualStack

#: the combiner classes the fused kernels implement (``b_i (+ gate(w . h_i))`` coefficients)
FUSED_COMBINERS = (GRNv1, GRNv2, GRNv3)

Entries = tuple[Array, ...]



# --- separate_add: a sum kept out of XLA's fusions (trick 1) ------------------------------------


def _cpu_only(cpu, default, *args):
    """``cpu(*args)`` in the program lowered for XLA:CPU, ``default(*args)`` for every other
    platform (one traced program; ``lax.platform_dependent`` picks the branch at lowering).
    The tricks below were measured on the CPU only; elsewhere the plain expression, which
    computes the same value, is left to the compiler."""
    return jax.lax.platform_dependent(*args, cpu=cpu, default=default)


def _add_cond(a: Array, b: Array, token: Array) -> Array:
    pred = jnp.isfinite(token.reshape(-1)[0])
    return jax.lax.cond(pred, jnp.add, jnp.add, a, b)


@jax.custom_batching.custom_vmap
def _add_in_conditional(a: Array, b: Array, token: Array) -> Array:
    return _cpu_only(_add_cond, lambda a, b, token: a + b, a, b, token)


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
    consumers (trick 1 of the module docstring): the branch of a ``lax.cond`` whose predicate
    is read from ``token``, any array that is not a compile-time constant (e.g. a parameter;
    it gets a zero cotangent). ``a`` and ``b`` must have one shape and dtype.
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


# --- Fused GRNs over a tuple of entries ---------------------------------------------------------


def _gated(ws: tuple) -> tuple[list[int], Array | None]:
    """The GRN-v3 among ``ws`` (their indices) and their weights stacked to ``(n_v3, D)``."""
    v3 = [j for j, w in enumerate(ws) if w is not None]
    return v3, (jnp.stack([ws[j] for j in v3]) if v3 else None)


def _coefficient(gate: str, b: Array, i: int, h: Array, pre: Array | None, m: int | None):
    """Entry ``i``'s coefficient (``b_i``, ``b_i + relu(w · h_i)`` or ``relu(b_i + w · h_i)``)
    in a GRN, shaped to multiply ``h``; ``m`` is the GRN's column in ``pre`` (``None`` for
    v1/v2)."""
    spec = gates.get(gate)
    return grn_formula.coefficient(b[i], h, None if m is None else pre[..., m],
                                   spec.nonlinearity, spec.bias_inside)


def grn_forward(gate: str, entries: Entries, bs: tuple, ws: tuple):
    """``(outputs, pres)``: the GRN outputs and, per entry, the gate pre-activations
    ``w_j · h_i`` of the GRN-v3 among them, ``(*batch, n_v3)`` (``None`` without GRN-v3)."""
    v3, w_stack = _gated(ws)
    # One thin matmul per entry serves every GRN-v3, at full precision (trick 3).
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
    spec = gates.get(gate)
    d_entries, d_bs, d_w = [], [[] for _ in bs], None
    for i, h in enumerate(entries):
        dh = jnp.zeros((), jnp.result_type(h, *d_outs))
        gate_rows = []  # <ȳ_j, h_i> per token (through the gate), for each GRN-v3 j
        for j, (b, dy) in enumerate(zip(bs, d_outs)):
            prod = dy * h
            m = v3.index(j) if j in v3 else None
            if m is not None and spec.bias_inside:
                # c = relu(b + p): b and p = w.h_i both pass through relu' per feature.
                inside = grn_formula.per_feature(b[i], h) + pres[i][..., m, None]
                prod = jnp.where(spec.derivative_mask(inside), prod, 0)
            if b.ndim == 1:  # v1: one scalar per entry
                d_bs[j].append(jnp.sum(prod).astype(b.dtype))
            else:
                d_bs[j].append(jnp.sum(prod, axis=batch_axes).astype(b.dtype))
            if m is not None:
                gate_rows.append(jnp.sum(prod, axis=-1))
            dh = dh + _coefficient(gate, b, i, h, pres[i], m) * dy
        if v3:
            d_pre = jnp.stack(gate_rows, axis=-1)
            if not spec.bias_inside:  # c = b + relu(p): relu' acts on the scalar p
                d_pre = jnp.where(spec.derivative_mask(pres[i]), d_pre, 0)
            for m in range(len(v3)):
                dh = dh + d_pre[..., m, None] * grn_formula.per_feature(w_stack[m], h)
            term = jnp.tensordot(d_pre, h, axes=(batch_axes, batch_axes))  # (n_v3, D)
            d_w = term if d_w is None else d_w + term
        # The entry's running cotangent is materialised here, block by block (tricks 1, 4).
        d_entries.append(separate_add(d_through[i].astype(dh.dtype), dh, bs[0]).astype(h.dtype))
    d_bs = tuple(jnp.stack(rows) for rows in d_bs)
    d_ws = tuple(None if w is None else d_w[v3.index(j)].astype(w.dtype)
                 for j, w in enumerate(ws))
    return tuple(d_entries), d_bs, d_ws


_combine.defvjp(_combine_fwd, _combine_bwd)


def grn_arguments(combiners, entries: Entries) -> tuple[str, tuple, tuple]:
    """Check ``combiners`` against ``entries`` and return ``(gate, bs, ws)`` for
    :func:`grn_forward` (one-line ``ValueError`` on a mismatch)."""
    names = {c.gate for c in combiners if isinstance(c, GRNv3)}
    if len(names) > 1:
        raise ValueError(f"combine_entries needs one GRN-v3 gate, got {sorted(names)}")
    for c in combiners:
        if not isinstance(c, FUSED_COMBINERS):
            raise ValueError(f"combine_entries takes {', '.join(k.kind for k in FUSED_COMBINERS)}"
                             f" combiners only, got {c.kind!r}")
        if c.size != len(entries) or entries[0].shape[-1] != c.dim:
            raise ValueError(f"{len(entries)} entries of shape {entries[0].shape} do not match "
                             f"a {c.kind} combiner of size {c.size} and dim {c.dim}")
    bs = tuple(c.b for c in combiners)
    ws = tuple(c.w if isinstance(c, GRNv3) else None for c in combiners)
    return (names.pop() if names else DEFAULT_GATE), bs, ws


def combine_entries(combiners, entries: Entries) -> tuple[Array, ...]:
    """Apply GRN combiners (kinds ``grn_v1|v2|v3``, one gate) to a tuple of entries.

    Equals ``tuple(c(jnp.stack(entries)) for c in combiners)`` in value and gradient, without
    the stacked copy. Entries have shape ``(*batch, D)``; each combiner's size must be
    ``len(entries)``.
    """
    return combine_threaded(combiners, entries)[0]


def combine_threaded(combiners, entries: Entries) -> tuple[tuple[Array, ...], Entries]:
    """``(outputs, entries)``: :func:`combine_entries`, also passing the entries through.

    Read the stack through the returned entries in every later use, so that each entry's
    cotangent flows back through one chain, block by block (trick 4 of the module docstring).
    """
    gate, bs, ws = grn_arguments(combiners, entries)
    return _combine(gate, tuple(entries), bs, ws)


# --- GRNs followed by LayerNorms (a DCA block's q̃, k̃, ṽ and their LN_q, LN_k, LN_v) -----------


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
    # Recompute the GRN outputs as an expression XLA cannot merge with the forward pass's
    # (h + 0·ḡ, trick 2).
    recompute_from = _cpu_only(
        lambda g, *hs: tuple(h + 0.0 * g.reshape(-1)[0].astype(h.dtype) for h in hs),
        lambda g, *hs: hs, d_normed[0], *entries)
    outs, _ = grn_forward(gate, tuple(recompute_from), bs, ws)
    d_total, d_scales, d_biases = [], [], []
    for y, s, b, dn, dy in zip(outs, scales, biases, d_normed, d_outs):
        # layer_norm's own (JVP-derived) backward pass, on the recomputed GRN output.
        _, norm_vjp = jax.vjp(lambda y, s, b: layer_norm(y, s, b, eps, stat_dtype), y, s, b)
        dx, ds, db = norm_vjp(dn.astype(stat_dtype))
        # Materialised once: the backward pass of every entry reads it (trick 1).
        d_total.append(separate_add(dx, dy.astype(dx.dtype), bs[0]))
        d_scales.append(ds)
        d_biases.append(db)
    d_entries, d_bs, d_ws = grn_backward(gate, entries, bs, ws, pres, tuple(d_total), d_through)
    return d_entries, d_bs, d_ws, tuple(d_scales), tuple(d_biases)


_grn_norm.defvjp(_grn_norm_fwd, _grn_norm_bwd)


def grn_layer_norm(combiners, norms, entries, stat_dtype) -> tuple[tuple, tuple, tuple]:
    """``((LN_j(GRN_j(G)))_j, (GRN_j(G))_j, G)`` over a tuple of stack entries ``G``, with a
    backward pass that keeps only the entries and the gate pre-activations. The entries come
    back unchanged: read the stack through them afterwards (see :func:`combine_threaded`).
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


# --- The entry points: one call for either path (``ModelConfig.grn_impl``) ----------------------


def _fused(grn_impl: str, combiners=()) -> bool:
    """Whether to take the fast path: ``grn_impl == "fused"`` and every combiner is one this
    module's kernels implement (a combiner class without a kernel, e.g. a new scheme, runs on
    the reference path, which is correct for any combiner)."""
    if grn_impl not in GRN_IMPLS:
        raise ValueError(f"unknown grn_impl {grn_impl!r}; valid: {', '.join(GRN_IMPLS)}")
    return grn_impl == "fused" and all(isinstance(c, FUSED_COMBINERS) for c in combiners)


def combine_stack(combiners, stack: ResidualStack, grn_impl: str, *,
                  slots: Sequence[int] | None = None) -> tuple[tuple[Array, ...], ResidualStack]:
    """``(outputs, stack)``: each combiner applied to the stack's entries at ``slots`` (all of
    them by default), and the stack to read from now on.

    Reference: the entries stacked into one array and each combiner called on it; the stack
    comes back as it was. Fused: :func:`combine_threaded`; the stack comes back holding the
    threaded entries (those outside ``slots`` are not threaded)."""
    entries = stack.entries()
    slots = range(len(entries)) if slots is None else slots
    window = tuple(entries[i] for i in slots)
    if not _fused(grn_impl, combiners):
        stacked = jnp.stack(window)
        return tuple(c(stacked) for c in combiners), stack
    outputs, window = combine_threaded(combiners, window)
    threaded = list(entries)
    for i, entry in zip(slots, window):
        threaded[i] = entry
    return outputs, stack.with_entries(threaded)


def combine_and_norm(combiners, norms, entries: Entries | Array,
                     grn_impl: str) -> tuple[tuple[Array, ...], tuple[Array, ...], Entries | Array]:
    """``((LN_j(GRN_j(G)))_j, (GRN_j(G))_j, entries)`` over the stack entries ``G``, each
    ``LN_j`` a LayerNorm module returning its parameters' dtype; read the stack through the
    returned entries from now on. ``G`` is a tuple of entries or one ``S×…×D`` array (returned
    as it is on the reference path).

    Reference: the entries stacked into one array, each combiner called on it, then each
    LayerNorm; the entries come back as they were. Fused: :func:`grn_layer_norm`."""
    if not _fused(grn_impl, combiners):
        # An array is the stack already (a scanned trunk's buffer): no per-entry slices.
        stacked = entries if isinstance(entries, jax.Array) else jnp.stack(tuple(entries))
        raw = tuple(c(stacked) for c in combiners)
        # (an array comes back as the array: slicing it into entries nobody reads would add
        # one slice per slot to the program, which a scan's body does not clean up)
        return tuple(n(y) for n, y in zip(norms, raw)), raw, \
            entries if isinstance(entries, jax.Array) else tuple(entries)
    entries = tuple(entries)
    stat_dtype = at_least_float32(norms[0].scale.dtype)
    normed, raw, entries = grn_layer_norm(combiners, norms, entries, stat_dtype)
    return tuple(y.astype(n.scale.dtype) for n, y in zip(norms, normed)), raw, entries


def middle_add(grn_impl: str, token: Array):
    """The sum ``ResidualStack.push(add=...)`` folds k-DCA's middle entry with:
    :func:`separate_add` reading ``token`` (a parameter) on the fast path, ``jnp.add`` on the
    reference path."""
    return functools.partial(separate_add, token=token) if _fused(grn_impl) else jnp.add
