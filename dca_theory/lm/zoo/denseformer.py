r"""``denseformer``: 1×1 DenseFormer, a depth-weighted average (DWA) after every block.

Block t reads ``y`` (``Y_t``; ``y = x`` before the first block), its full output
``X_{t+1} = y + a + m`` joins the stack of states ``[X_0 = x, X_1, …]``, and the next input is
``y ← DWA_t(X_0, …, X_{t+1})``, a ``grn_v1`` combiner (one scalar per state) initialised
one-hot on the newest state (vanilla at init). The last ``y`` goes to the final LayerNorm. The
paper, equations and decisions: :mod:`dca_theory.lm.baselines`.

**Layout.** The states live in a ``(T + 1)``-slot write-once buffer
(:class:`~dca_theory.lm.driver.State`), block t writing slot ``t + 1``; ``y`` is the ``carry``.
Every DWA is stored over all ``T + 1`` slots, stacked over blocks: DWA t's own ``b`` in the
first ``t + 2`` rows, zeros after. The zero rows weigh slots that still hold zeros when block t
combines the buffer (slots after ``t + 1`` are written later), so their gradient is exactly 0
and AdamW leaves them at zero.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from dca_theory.lm.blocks import dtype_of
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.driver import (
    BlockIO,
    Mixer,
    State,
    branch_inputs,
    new_buffer,
    stack_layers,
    write_slot,
)
from dca_theory.lm.layer_stack import padded_block
from dca_theory.residual import GRNv1, make_combiner


class DenseFormerMixer(Mixer):
    """One DWA per block over a write-once buffer of the block-output states."""

    layers: GRNv1  # DWA t over all T + 1 slots, stacked over blocks

    @classmethod
    def init(cls, cfg: ModelConfig, *, key=None) -> DenseFormerMixer:
        # No draws: b is one-hot on the newest state, as DenseFormerTrunk.init sets it.
        n, dtype = cfg.n_layers, dtype_of(cfg.param_dtype)
        dwa = []
        for t in range(n):
            c = make_combiner("grn_v1", n + 1, cfg.d_model, dtype=dtype)
            dwa.append(eqx.tree_at(lambda c: c.b, c, jnp.zeros((n + 1,), dtype).at[t + 1].set(1)))
        return cls(layers=stack_layers(dwa))

    @classmethod
    def from_trunk(cls, trunk) -> DenseFormerMixer:
        width = trunk.cfg.n_layers + 1
        return cls(layers=stack_layers([padded_block(c, width) for c in trunk.dwa]))

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        # Σ_{i=1}^{T} (i + 1): DWA i - 1 weighs the states X_0 … X_i
        return sum(i + 1 for i in range(1, cfg.n_layers + 1))

    def param_count(self) -> int:
        n = self.layers.b.shape[0]
        return sum(t + 2 for t in range(n))  # DWA t weighs X_0 … X_{t+1}

    def start(self, x_LxD, n_layers):
        return State(new_buffer(x_LxD, n_layers + 1), x_LxD)

    def read(self, p, state, t):
        return BlockIO(q=state.carry)

    def write(self, p: GRNv1, state, t, io, out):
        buffer = write_slot(state.buffer, state.carry + (out.a + out.m), t + 1)
        return State(buffer, p(buffer))

    def output(self, state):
        return state.carry

    def record(self, p, before, after, io, out):
        return {"in": io.q, "out": out.a + out.m, "stream": after.carry,
                "stack": after.buffer, "io": branch_inputs(io)}

    def stack_slots(self, t):
        return tuple(range(t + 2))  # the old trunk records the stack DWA t combined
