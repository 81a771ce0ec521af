"""``grn_v1`` / ``grn_v2`` / ``grn_v3`` (Table 7's ablation): one GRN per block over the stack.

Block t's input is ``GRN_t(G_t)`` over the stack ``G_t = [x, f_0, …, f_{t-1}]`` of the model
input and the earlier residual branches ``f = a + m``; its branch is the next stack entry; a
final GRN of the same kind combines the whole stack before the final LayerNorm (the decision
and its evidence are in :mod:`dca_theory.lm.trunk`). The GRNs are the toy nets' combiner
classes (:mod:`dca_theory.residual`).

**Layout.** The stack lives in a ``(T + 1)``-slot buffer (:class:`~dca_theory.lm.driver.State`),
block t writing slot ``t + 1``. Every per-block GRN is stored over all ``T + 1`` slots (stacked
over blocks), its own ``b`` rows at the slots it reads (``cfg.grn_slots``), zeros elsewhere.
Those zero rows stay zero in training: they weigh slots that hold zeros when block t reads them
(not yet written, or masked out by Table 9's window), so their gradient is exactly 0, and
AdamW leaves a zero parameter with zero gradient at zero.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dca_theory import random_draws as draws
from dca_theory import schemes
from dca_theory.gates import KEY_SALT
from dca_theory.lm.blocks import dtype_of
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.driver import (
    BlockIO,
    Mixer,
    State,
    branch_inputs,
    layer_of,
    new_buffer,
    stack_layers,
    write_new_slot,
)
from dca_theory.lm.fast.buffer_grn import buffer_grns, buffer_grns_through
from dca_theory.lm.layer_stack import padded_block, picked_block, placed_block
from dca_theory.residual import AbstractGRN, make_combiner


class GRNMixer(Mixer):
    """One GRN per block and a final one, over a write-once buffer of the stack."""

    layers: AbstractGRN  # block t's GRN over all T + 1 slots, stacked over blocks
    final: AbstractGRN
    slots: tuple[tuple[int, ...], ...] = eqx.field(static=True)  # per block, then the final
    windowed: bool = eqx.field(static=True)

    @property
    def narrows(self) -> bool:  # a window masks the buffer: its reads are cut to groups
        return self.windowed

    @property
    def reads_written_only(self) -> bool:  # else: buffer_grns_through, written slots only
        return not self.windowed

    @classmethod
    def init(cls, cfg: ModelConfig, *, key) -> GRNMixer:
        keys = draws.split(jax.random.fold_in(key, KEY_SALT), cfg.n_layers + 1)
        grns = [make_combiner(cfg.residual, len(cfg.grn_slots(t)), cfg.d_model,
                              dtype=dtype_of(cfg.param_dtype), gate=cfg.grn_gate, key=keys[t])
                for t in range(cfg.n_layers + 1)]
        return cls.from_grns(cfg, grns)

    @classmethod
    def from_grns(cls, cfg: ModelConfig, grns) -> GRNMixer:
        """From one GRN per block and the final one, each at its own size."""
        n = cfg.n_layers
        slots = tuple(cfg.grn_slots(t) for t in range(n + 1))
        layers = stack_layers([placed_block(g, s, n + 1) for g, s in zip(grns[:-1], slots)])
        final = placed_block(grns[-1], slots[-1], n + 1)
        return cls(layers=layers, final=final, slots=slots, windowed=cfg.grn_window is not None)

    @classmethod
    def from_trunk(cls, trunk) -> GRNMixer:
        return cls.from_grns(trunk.cfg, trunk.grns)

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        # one GRN over S_t = t + 1 entries per block plus the output GRN over T + 1:
        # Σ_{s=1}^{T+1} s, D Σ s and D Σ s + D(T+1) for v1, v2, v3 (§4.2's counts plus the
        # output GRN); with grn_window (Table 9) each s is len(cfg.grn_slots(t))
        sizes = [len(cfg.grn_slots(i)) for i in range(cfg.n_layers + 1)]
        return schemes.network_combiner_params(cfg.residual, cfg.n_layers, cfg.d_model,
                                               stack_sizes=sizes)

    def param_count(self) -> int:
        return schemes.network_combiner_params(self.final.kind, len(self.slots) - 1,
                                               self.final.dim,
                                               stack_sizes=[len(s) for s in self.slots])

    def named_combiners(self):
        n = len(self.slots) - 1
        out = {f"block_{t}": (picked_block(layer_of(self.layers, t), self.slots[t]), t)
               for t in range(n)}
        return out | {"output": (picked_block(self.final, self.slots[-1]), n)}

    def narrow(self, p, width):
        return padded_block(p, width)

    def _visible(self, buffer, t):
        """The buffer with the slots outside block t's window zeroed (Table 9)."""
        if not self.windowed:
            return buffer
        mask = np.zeros((len(self.slots), len(self.slots)), np.float64)  # a trace-time constant
        for i, s in enumerate(self.slots):
            mask[i, list(s)] = 1
        mask = jnp.asarray(mask[:, :buffer.shape[0]], buffer.dtype)
        return buffer * mask[t].reshape((-1,) + (1,) * (buffer.ndim - 1))

    def start(self, x_LxD, n_layers):
        return State(new_buffer(x_LxD, n_layers + 1), ())

    def read(self, p, state, t):
        return self.read_through(p, state, t)[0]

    def read_through(self, p, state, t):
        if self.windowed:
            return BlockIO(q=buffer_grns((p,), self._visible(state.buffer, t))[0]), state
        (g_LxD,), buffer = buffer_grns_through((p,), state.buffer, t + 1)  # slots 0..t
        return BlockIO(q=g_LxD), State(buffer, state.carry)

    def write(self, p, state, t, io, out):
        return State(write_new_slot(state.buffer, out.a + out.m, t + 1), ())

    def output(self, state):
        return buffer_grns((self.final,), self._visible(state.buffer, len(self.slots) - 1))[0]

    def record(self, p, before, after, io, out):
        return {"in": io.q, "out": out.a + out.m, "stream": jnp.sum(after.buffer, axis=0),
                "stack": before.buffer, "io": branch_inputs(io)}

    def stack_slots(self, t):
        return self.slots[t]
