r"""``laurel_lr`` and ``laurel_pa``: LAuReL's learned augmented residual, one per block.

LAuReL-LR: ``h ← h + (a + m) + B_t A_t h`` (a rank-r map of the block input). LAuReL-PA:
``h ← h + (a + m) + B_t A_t (Σ_{j≤t} γ_{t,j} x_j)`` over the states ``x_0 = x, …, x_t = h``
entering blocks ``0 … t``, the ``γ_t`` a ``grn_v1`` combiner (init 1). ``B_t = 0`` at init, so
both equal vanilla. The paper, equations and decisions: :mod:`dca_theory.lm.baselines`.

**Layout.** ``h`` is the state's ``carry``. The low-rank maps have one shape per block and are
stacked over blocks. LAuReL-PA keeps the states in a ``(T + 1)``-slot write-once buffer, block
t writing the state it produces to slot ``t + 1`` (the last, ``x_T``, is read by no block;
its slot keeps every block's write the same, as the write-once scan expects).
Every ``γ_t`` is stored over all ``T + 1`` slots, stacked over blocks: its own ``t + 1``
scalars first, zeros after. The zero rows weigh slots that still hold zeros when block t
combines the buffer, so their gradient is exactly 0 and AdamW leaves them at zero. The
augmentation is computed in :meth:`~LaurelMixer.read` and handed to
:meth:`~LaurelMixer.write` through ``BlockIO.aux``.
"""

from __future__ import annotations

import equinox as eqx
import jax

from dca_theory import random_draws as draws
from dca_theory.lm.baselines import LowRank
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
from dca_theory.lm.trunk import extra_key
from dca_theory.residual import GRNv1, make_combiner


class LaurelLayer(eqx.Module):
    """One block's LAuReL parameters: the low-rank map and (PA) the ``γ`` over the states."""

    low_rank: LowRank
    gamma: GRNv1 | None


class LaurelMixer(Mixer):
    """LAuReL-LR (``previous`` False) or LAuReL-PA (``previous`` True)."""

    layers: LaurelLayer  # stacked over blocks
    previous: bool = eqx.field(static=True)

    @classmethod
    def init(cls, cfg: ModelConfig, *, key) -> LaurelMixer:
        # LaurelTrunk.init's draws: one low-rank map per block from the extra key.
        keys = draws.split(extra_key(key), cfg.n_layers)
        low_rank = [LowRank.init(cfg, key=k) for k in keys]
        gammas = None
        if cfg.residual == "laurel_pa":
            dtype = dtype_of(cfg.param_dtype)
            gammas = [make_combiner("grn_v1", t + 1, cfg.d_model, dtype=dtype)
                      for t in range(cfg.n_layers)]
        return cls.from_parts(low_rank, gammas)

    @classmethod
    def from_trunk(cls, trunk) -> LaurelMixer:
        return cls.from_parts(trunk.low_rank, trunk.gammas)

    @classmethod
    def from_parts(cls, low_rank, gammas) -> LaurelMixer:
        """From one low-rank map per block and (PA) one ``γ`` per block at its own size."""
        if gammas is None:
            return cls(layers=stack_layers([LaurelLayer(lr, None) for lr in low_rank]),
                       previous=False)
        width = len(low_rank) + 1
        return cls(layers=stack_layers([LaurelLayer(lr, padded_block(g, width))
                                        for lr, g in zip(low_rank, gammas)]), previous=True)

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        # laurel_lr 2 T D r (A_t and B_t); laurel_pa adds Σ_{i=1}^{T} i (γ_t over t + 1 states)
        low_rank = cfg.n_layers * 2 * cfg.d_model * cfg.laurel_rank
        if cfg.residual == "laurel_pa":
            return low_rank + sum(range(1, cfg.n_layers + 1))
        return low_rank

    def param_count(self) -> int:
        low_rank = sum(x.size for x in jax.tree.leaves(self.layers.low_rank))
        n = self.layers.low_rank.a_DxR.shape[0]
        return low_rank + (sum(t + 1 for t in range(n)) if self.previous else 0)

    def start(self, x_LxD, n_layers):
        return State(new_buffer(x_LxD, n_layers + 1) if self.previous else None, x_LxD)

    def read(self, p: LaurelLayer, state, t):
        h_LxD = state.carry
        aug_LxD = p.low_rank(p.gamma(state.buffer) if self.previous else h_LxD)
        return BlockIO(q=h_LxD, aux=aug_LxD)

    def write(self, p, state, t, io, out):
        h_LxD = state.carry + (out.a + out.m) + io.aux
        buffer = write_slot(state.buffer, h_LxD, t + 1) if self.previous else None
        return State(buffer, h_LxD)

    def output(self, state):
        return state.carry

    def record(self, p, before, after, io, out):
        return {"in": io.q, "out": (out.a + out.m) + io.aux, "stream": after.carry,
                "io": branch_inputs(io)}
