r"""Per-block GRN parameters in the stacked layout of the scanned trunk.

The scanned trunk (:mod:`dca_theory.lm.scanned`) stores every per-block parameter stacked over
layers. A GRN over the stack grows with the block (block t reads ``t + 1`` entries, or
``stack_size(t, k)`` for k-DCA), so each block's GRN is stored at the widest block's size,
its own ``b`` rows placed at the slots where the trunk's state keeps the entries they weigh
(:func:`scan_slots`), the other rows zero (:func:`placed_block`; :func:`picked_block` is the
inverse, :func:`padded_block` cuts or pads at the end). Why the zero rows stay zero in
training is in each mixer's module (:mod:`dca_theory.lm.zoo`).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from dca_theory.lm.blocks import DCABlock
from dca_theory.residual import AbstractGRN, stack_size


def scan_slots(cfg, t: int) -> tuple[int, ...]:
    """Where DCA block t's GRN entries sit in the stack the scanned trunk gives it
    (:mod:`dca_theory.lm.zoo.dca`). Full DCA: the buffer's first ``t + 1`` slots. k-DCA
    (``k + 1 < n_layers``): every block reads the fixed ``[x, middle, last k]`` stack; block
    ``t <= k`` has produced only ``t`` outputs, which sit in the last ``t`` slots, the middle
    and the older recent slots still holding zeros."""
    k, n = cfg.k, cfg.n_layers
    if k is None or k + 1 >= n or t > k:
        return tuple(range(stack_size(t, k)))
    width = k + 2
    return (0, *range(width - t, width))


def _with_grns(block: DCABlock | AbstractGRN, fn) -> DCABlock | AbstractGRN:
    if isinstance(block, AbstractGRN):
        return fn(block)
    return eqx.tree_at(lambda blk: (blk.grn_q, blk.grn_k, blk.grn_v), block,
                       (fn(block.grn_q), fn(block.grn_k), fn(block.grn_v)))


def _grn(grn: AbstractGRN, b) -> AbstractGRN:
    return type(grn)(b=b, w=grn.w, size=b.shape[0], dim=grn.dim, gate=grn.gate)


def placed_block(block: DCABlock | eqx.Module, slots: tuple[int, ...] | None,
                 width: int) -> eqx.Module:
    """``block`` (a DCA block or a GRN) reading ``width`` entries, its own ``b`` rows placed at
    ``slots`` and zeros elsewhere (entries whose coefficient is then 0). Blocks without GRNs
    (``slots`` None) are returned."""
    if slots is None:
        return block
    if slots == tuple(range(len(slots))):
        return padded_block(block, width)
    return _with_grns(block, lambda g: _grn(g, jnp.zeros((width, *g.b.shape[1:]), g.b.dtype)
                                            .at[jnp.asarray(slots)].set(g.b)))


def picked_block(block: DCABlock | AbstractGRN,
                 slots: tuple[int, ...]) -> DCABlock | AbstractGRN:
    """The inverse of :func:`placed_block`: the GRNs' ``b`` rows at ``slots``, in order."""
    if slots == tuple(range(len(slots))):
        return padded_block(block, len(slots))
    return _with_grns(block, lambda g: _grn(g, g.b[jnp.asarray(slots)]))


def padded_block(block: DCABlock | AbstractGRN, size: int) -> DCABlock | AbstractGRN:
    """``block`` (a DCA block, whose three GRN-v3 change, or a GRN) reading ``size`` entries:
    ``b`` zero-padded or cut at the end (extra entries get the coefficient 0 on zero slots).
    """
    def resize(grn: AbstractGRN) -> AbstractGRN:
        if size == grn.size:
            return grn
        pad = ((0, size - grn.size),) + ((0, 0),) * (grn.b.ndim - 1)
        return _grn(grn, grn.b[:size] if size < grn.size else jnp.pad(grn.b, pad))

    return _with_grns(block, resize)
