r"""A trunk's blocks stored as one stacked module: the training layout of ``layer_loop="scan"``.

**Why.** A ``lax.scan`` over the blocks compiles the block once, but if the parameters are kept
one module per block (the saved layout: checkpoints, retrofit, analysis and decode read it),
every forward pass first stacks them (one concatenation per array leaf, its split in the
backward pass) and AdamW updates every block's arrays separately (dozens of operations per
array). Both grow with depth, so the compile time did too (``paper/06_performance.md`` §6.10).
Stored stacked, the trunk's blocks are *one* module whose array leaves have a leading
``layer`` axis (:class:`BlockStack`), so the scan reads them as they are and AdamW sees the same
few arrays at any depth: the program no longer grows with the number of layers.

**GRN sizes.** DCA block t's three GRN-v3 read ``stack_size(t, k)`` entries, so their ``b``
differ in shape from block to block. In the stack every ``b`` is zero-padded at the end to the
largest size (:func:`padded_block`). The padded entries stay exactly zero in training: the
trunk never reads them or reads them against stack slots that are still zero (see
:mod:`dca_theory.lm.layer_scan`), so their gradient is exactly 0, and AdamW (elementwise, with
decoupled weight decay) leaves a zero parameter with zero gradient at zero. So the round trip
:func:`to_saved_layout` ∘ :func:`to_training_layout` is exact, and training in either layout
is the same computation up to floating-point order (tested in float64).

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
from dca_theory.residual import GRNv3


class BlockStack(eqx.Module):
    """``n`` blocks of one structure as one module (``stacked``) whose array leaves carry a
    leading ``layer`` axis; ``sizes`` are the blocks' own GRN sizes (``None`` for blocks
    without GRNs), restored by :meth:`unstack`."""

    stacked: eqx.Module
    sizes: tuple[int | None, ...] = eqx.field(static=True)

    @classmethod
    def stack(cls, blocks: Sequence[eqx.Module]) -> BlockStack:
        sizes = tuple(grn_size(b) for b in blocks)
        if None not in sizes:
            blocks = [padded_block(b, max(sizes)) for b in blocks]
        arrays = [eqx.filter(b, eqx.is_array) for b in blocks]
        static = eqx.filter(blocks[0], eqx.is_array, inverse=True)
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *arrays)
        return cls(stacked=eqx.combine(stacked, static), sizes=sizes)

    def __len__(self) -> int:
        return len(self.sizes)

    def unstack(self) -> tuple[eqx.Module, ...]:
        """The blocks one module each, every GRN back at its own size."""
        return tuple(self.block(t) for t in range(len(self)))

    def block(self, t: int) -> eqx.Module:
        """Block ``t`` as its own module (GRNs at their own size)."""
        block = jax.tree.map(lambda x: x[t] if eqx.is_array(x) else x, self.stacked)
        return block if self.sizes[t] is None else padded_block(block, self.sizes[t])

    def group(self, start: int, stop: int):
        """``(arrays, static)`` of blocks ``start, …, stop - 1`` for a scan: the arrays with
        their leading axis sliced (one slice per leaf, whatever the number of blocks)."""
        block = jax.tree.map(lambda x: x[start:stop] if eqx.is_array(x) else x, self.stacked)
        return eqx.partition(block, eqx.is_array)


def grn_size(block: eqx.Module) -> int | None:
    """The number of stack entries a DCA block's GRNs read (``None`` for other blocks)."""
    return block.grn_q.size if isinstance(block, DCABlock) else None


def padded_block(block: DCABlock, size: int) -> DCABlock:
    """``block`` with its three GRN-v3 reading ``size`` entries: ``b`` zero-padded or cut at the
    end (extra entries get the coefficient 0 on zero slots; see :mod:`dca_theory.lm.layer_scan`).
    """
    def resize(grn: GRNv3) -> GRNv3:
        if size == grn.size:
            return grn
        b = grn.b[:size] if size < grn.size else jnp.pad(grn.b, ((0, size - grn.size), (0, 0)))
        return GRNv3(b=b, w=grn.w, size=size, dim=grn.dim, gate=grn.gate)

    return eqx.tree_at(lambda blk: (blk.grn_q, blk.grn_k, blk.grn_v), block,
                       (resize(block.grn_q), resize(block.grn_k), resize(block.grn_v)))


def block_list(blocks) -> tuple[eqx.Module, ...]:
    """A trunk's blocks one module each, whichever layout they are stored in."""
    return blocks.unstack() if isinstance(blocks, BlockStack) else tuple(blocks)


def to_training_layout(model: eqx.Module) -> eqx.Module:
    """``model`` with its trunk's blocks as one :class:`BlockStack` if its
    ``cfg.layer_loop`` is ``"scan"``; otherwise (other models, such as the training tests'
    stand-ins, included) ``model`` itself."""
    trunk = getattr(model, "trunk", None)
    blocks = getattr(trunk, "blocks", None)
    if blocks is None or trunk.cfg.layer_loop != "scan" or isinstance(blocks, BlockStack):
        return model
    return eqx.tree_at(lambda m: m.trunk.blocks, model, BlockStack.stack(trunk.blocks))


def to_saved_layout(model: eqx.Module) -> eqx.Module:
    """``model`` with its trunk's blocks one module each (the inverse of
    :func:`to_training_layout`; exact)."""
    if not isinstance(getattr(getattr(model, "trunk", None), "blocks", None), BlockStack):
        return model
    return eqx.tree_at(lambda m: m.trunk.blocks, model, model.trunk.blocks.unstack())
