r"""``attn_res``: Full Attention Residuals, every sublayer a softmax attention over depth.

Sources ``v_0 = x, v_1 = a_0, v_2 = m_0, …`` (block t's attention output ``a_t`` and MLP output
``m_t``); sublayer ``l`` reads ``h_l = Σ_{i<l} softmax_i(w_l · RMSNorm_l(v_i)) v_i``: block t's
attention gets ``Attn(LN_1 h_{2t})``, its MLP ``MLP(LN_2 h_{2t+1})`` (over the sources up to
``a_t``), and one more such attention over all ``2T + 1`` sources is the trunk output. The depth
attention is the toy nets' :class:`~dca_theory.residual.SoftmaxOverDepth` with the LM's RMSNorm
scale ``g_l`` kept (``2D`` parameters per sublayer). The decisions (the output combiner, the
init ``w = 0``: the mean, not vanilla's sum) are in :mod:`dca_theory.lm.rivals`.

**Layout.** The sources live in a ``(2T + 1)``-slot write-once buffer: ``x`` in slot 0, ``a_t``
in slot ``2t + 1``, ``m_t`` in slot ``2t + 2`` (``slots_per_block = 2``). Each sublayer's
``(w, g)`` is stored over the whole buffer (the two of a block stacked over blocks, the output's
apart): nothing is padded, the parameters do not depend on the stack's size. What the size
changes is which slots hold sources: a softmax would give the zero slots not yet written a
nonzero weight, so each sublayer masks the slots from the number of its sources on
(``2t + 1`` for block t's attention, ``2t + 2`` for its MLP; from ``t``, so in the scan): their
weight is exactly 0 and so is their gradient.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

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
from dca_theory.residual import SoftmaxOverDepth


class AttnResLayer(eqx.Module):
    """One block's two depth attentions: before its attention and before its MLP."""

    attn: SoftmaxOverDepth
    mlp: SoftmaxOverDepth


class AttnResMixer(Mixer):
    """A depth attention per sublayer over a write-once buffer of the sources, and the output's."""

    layers: AttnResLayer
    final: SoftmaxOverDepth
    slots_per_block = 2
    block_reads_state = True  # the MLP input is a depth attention over the buffer
    hooks_block = True

    @classmethod
    def init(cls, cfg: ModelConfig, *, key=None) -> AttnResMixer:
        from dca_theory.lm.rivals import DepthAttention

        return cls.from_depth_attentions(
            cfg, [DepthAttention.init(cfg) for _ in range(2 * cfg.n_layers + 1)])

    @classmethod
    def from_trunk(cls, trunk) -> AttnResMixer:
        return cls.from_depth_attentions(trunk.cfg, trunk.mixers)

    @classmethod
    def from_depth_attentions(cls, cfg: ModelConfig, mixers) -> AttnResMixer:
        """From the per-block trunk's ``DepthAttention`` of every sublayer, then the output's."""
        size = 2 * cfg.n_layers + 1

        def over_buffer(m) -> SoftmaxOverDepth:
            return SoftmaxOverDepth(q=m.query_D, size=size, dim=cfg.d_model, eps=m.eps,
                                    g=m.norm_scale_D)

        layers = [AttnResLayer(attn=over_buffer(mixers[2 * t]), mlp=over_buffer(mixers[2 * t + 1]))
                  for t in range(cfg.n_layers)]
        return cls(layers=stack_layers(layers), final=over_buffer(mixers[-1]))

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        # 2D(2T + 1): (w, g) per sublayer (two per block) and the output's
        return 2 * cfg.d_model * (2 * cfg.n_layers + 1)

    def param_count(self) -> int:
        return 2 * self.final.dim * self.final.size  # (w, g) per sublayer and the output

    def start(self, x_LxD, n_layers):
        return State(new_buffer(x_LxD, 2 * n_layers + 1), ())

    def read(self, p: AttnResLayer, state, t):
        buffer = state.buffer

        def mlp_input(a_LxD):  # the MLP's sources include a_t
            return p.mlp(write_slot(buffer, a_LxD, 2 * t + 1), count=2 * t + 2)

        return BlockIO(q=p.attn(buffer, count=2 * t + 1), mlp_input=mlp_input)

    def write(self, p, state, t, io, out):
        buffer = write_slot(state.buffer, out.a, 2 * t + 1)
        return State(write_slot(buffer, out.m, 2 * t + 2), ())

    def output(self, state):
        return self.final(state.buffer)

    def record(self, p, before, after, io, out):
        return {"in": io.q, "out": out.a + out.m, "stream": jnp.sum(after.buffer, axis=0),
                "io": branch_inputs(io)}
