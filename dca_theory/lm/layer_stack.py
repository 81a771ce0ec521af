r"""A trunk's blocks stored as one stacked module: the training layout of ``layer_loop="scan"``.

**Why.** A ``lax.scan`` over the blocks compiles the block once, but if the parameters are kept
one module per block (the saved layout: checkpoints, retrofit, analysis and decode read it),
every forward pass first stacks them (one concatenation per array leaf, its split in the
backward pass) and AdamW updates every block's arrays separately (dozens of operations per
array). Both grow with depth, so the compile time did too (``paper/06_performance.md`` §6.10).
Stored stacked, the trunk's blocks are *one* module whose array leaves have a leading
``layer`` axis (:class:`BlockStack`), so the scan reads them as they are and AdamW sees the same
few arrays at any depth: the program no longer grows with the number of layers.

**GRN entries.** DCA block t's three GRN-v3 read ``stack_size(t, k)`` entries, so their ``b``
differ in shape from block to block. In the stack every ``b`` has as many rows as the widest
block's, block t's own rows sitting where the scanned trunk keeps the entries they weigh
(:func:`scan_slots`: the first rows for full DCA's buffer; the last ones, after ``x``, for
k-DCA's first ``k + 1`` blocks), the other rows zero. Those rows stay exactly zero in training:
they weigh stack slots that hold zeros when the block reads them (see
:mod:`dca_theory.lm.layer_scan`) or are not read at all, so their gradient is exactly 0, and
AdamW (elementwise, with decoupled weight decay) leaves a zero parameter with zero gradient at
zero. So the round trip :func:`to_saved_layout` ∘ :func:`to_training_layout` is exact, and
training in either layout is the same computation up to floating-point order (tested in
float64).

Use :func:`to_training_layout` on a model before partitioning it for a train step and
:func:`to_saved_layout` on what comes back; both return the model unchanged unless its
``cfg.layer_loop`` is ``"scan"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from dca_theory.lm.blocks import DCABlock
from dca_theory.residual import AbstractGRN, stack_size


class BlockStack(eqx.Module):
    """``n`` blocks of one structure as one module (``stacked``) whose array leaves carry a
    leading ``layer`` axis. ``slots[t]`` says in which of the stored GRN entries block t's own
    entries sit (``None`` for blocks without GRNs; see :func:`scan_slots`), so that
    :meth:`unstack` restores every block exactly."""

    stacked: eqx.Module
    slots: tuple[tuple[int, ...] | None, ...] = eqx.field(static=True)

    @classmethod
    def stack(cls, blocks: Sequence[eqx.Module],
              slots: Sequence[tuple[int, ...] | None] | None = None) -> BlockStack:
        """Stack ``blocks``; a DCA block's GRN entries go to ``slots[t]`` (default: its first
        entries) of as many entries as the widest slot needs, the other entries zero."""
        if slots is None:
            slots = [None if grn_size(b) is None else tuple(range(grn_size(b))) for b in blocks]
        slots = tuple(None if s is None else tuple(s) for s in slots)
        if any(s is not None for s in slots):
            width = 1 + max(max(s) for s in slots)
            blocks = [placed_block(b, s, width) for b, s in zip(blocks, slots)]
        arrays = [eqx.filter(b, eqx.is_array) for b in blocks]
        static = eqx.filter(blocks[0], eqx.is_array, inverse=True)
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *arrays)
        return cls(stacked=eqx.combine(stacked, static), slots=slots)

    def __len__(self) -> int:
        return len(self.slots)

    def unstack(self) -> tuple[eqx.Module, ...]:
        """The blocks one module each, every GRN back at its own size."""
        return tuple(self.block(t) for t in range(len(self)))

    def block(self, t: int) -> eqx.Module:
        """Block ``t`` as its own module (GRNs at their own size)."""
        block = jax.tree.map(lambda x: x[t] if eqx.is_array(x) else x, self.stacked)
        return block if self.slots[t] is None else picked_block(block, self.slots[t])

    def group(self, start: int, stop: int):
        """``(arrays, static)`` of blocks ``start, …, stop - 1`` for a scan: the arrays with
        their leading axis sliced (one slice per leaf, whatever the number of blocks)."""
        block = jax.tree.map(lambda x: x[start:stop] if eqx.is_array(x) else x, self.stacked)
        return eqx.partition(block, eqx.is_array)


def scan_slots(cfg, t: int) -> tuple[int, ...]:
    """Where DCA block t's GRN entries sit in the stack the scanned trunk gives it
    (:mod:`dca_theory.lm.layer_scan`). Full DCA: the buffer's first ``t + 1`` slots. k-DCA
    (``k + 1 < n_layers``): every block reads the fixed ``[x, middle, last k]`` stack; block
    ``t <= k`` has produced only ``t`` outputs, which sit in the last ``t`` slots, the middle
    and the older recent slots still holding zeros."""
    k, n = cfg.k, cfg.n_layers
    if k is None or k + 1 >= n or t > k:
        return tuple(range(stack_size(t, k)))
    width = k + 2
    return (0, *range(width - t, width))


def grn_size(block: eqx.Module) -> int | None:
    """The number of stack entries a DCA block's GRNs (or a GRN, stacked as a block of the GRN
    kinds' trunk) read; ``None`` for other blocks."""
    if isinstance(block, AbstractGRN):
        return block.size
    return block.grn_q.size if isinstance(block, DCABlock) else None


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
    ``slots`` and zeros elsewhere (entries whose coefficient is then 0; see
    :mod:`dca_theory.lm.layer_scan`). Blocks without GRNs (``slots`` None) are returned."""
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
    ``b`` zero-padded or cut at the end (extra entries get the coefficient 0 on zero slots; see
    :mod:`dca_theory.lm.layer_scan`).
    """
    def resize(grn: AbstractGRN) -> AbstractGRN:
        if size == grn.size:
            return grn
        pad = ((0, size - grn.size),) + ((0, 0),) * (grn.b.ndim - 1)
        return _grn(grn, grn.b[:size] if size < grn.size else jnp.pad(grn.b, pad))

    return _with_grns(block, resize)


def block_list(blocks) -> tuple[eqx.Module, ...]:
    """A trunk's blocks one module each, whichever layout they are stored in."""
    return blocks.unstack() if isinstance(blocks, BlockStack) else tuple(blocks)


def grn_list(grns) -> tuple[eqx.Module, ...]:
    """The GRN kinds' combiners (one per block, then the final one) one module each, whichever
    layout they are stored in."""
    if isinstance(grns[0], BlockStack):
        return (*grns[0].unstack(), grns[-1])
    return tuple(grns)


def to_training_layout(model: eqx.Module) -> eqx.Module:
    """``model`` with its trunk's blocks as one :class:`BlockStack` (and, for the GRN kinds, the
    per-block GRNs as another, the final GRN kept apart) if its ``cfg.layer_loop`` is
    ``"scan"``; otherwise (other models, such as the training tests' stand-ins, included)
    ``model`` itself."""
    trunk = getattr(model, "trunk", None)
    blocks = getattr(trunk, "blocks", None)
    if blocks is None or trunk.cfg.layer_loop != "scan" or isinstance(blocks, BlockStack):
        return model
    slots = None
    if isinstance(trunk.blocks[0], DCABlock):
        slots = [scan_slots(trunk.cfg, t) for t in range(len(trunk.blocks))]
    model = eqx.tree_at(lambda m: m.trunk.blocks, model, BlockStack.stack(trunk.blocks, slots))
    grns = getattr(trunk, "grns", None)
    if grns is not None:
        model = eqx.tree_at(lambda m: m.trunk.grns, model,
                            (BlockStack.stack(grns[:-1]), grns[-1]))
    return model


def to_saved_layout(model: eqx.Module) -> eqx.Module:
    """``model`` with its trunk's blocks one module each (the inverse of
    :func:`to_training_layout`; exact)."""
    trunk = getattr(model, "trunk", None)
    if not isinstance(getattr(trunk, "blocks", None), BlockStack):
        return model
    model = eqx.tree_at(lambda m: m.trunk.blocks, model, trunk.blocks.unstack())
    grns = getattr(trunk, "grns", None)
    if grns is not None and isinstance(grns[0], BlockStack):
        model = eqx.tree_at(lambda m: m.trunk.grns, model, (*grns[0].unstack(), grns[-1]))
    return model
