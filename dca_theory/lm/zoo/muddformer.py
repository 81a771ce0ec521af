r"""``muddformer``: MUDDFormer, four dynamic dense streams (queries, keys, values, residual).

After block ``i`` (outputs ``X_0 = x, …, X_{i+1}``) an aggregate
``X̄^c = Σ_j A^c_i[j] X_j`` with ``A_i = GELU(RMSNorm(X_{i+1}) W_1) W_2 + B_i`` forms the next
block's four inputs; block ``i`` computes ``a = Attn(LN_1 X̄^Q, LN_1 X̄^K, LN_1 X̄^V)`` and
``X_{i+1} = X̄^R + a + MLP(LN_2(X̄^R + a))``; the last aggregate has one stream, the trunk
output. Equations, init (identity, exactly) and decisions (``LN_1`` shared by q/k/v) are in
:mod:`dca_theory.lm.rivals`, whose :class:`~dca_theory.lm.rivals.DenseAggregate` this reuses.

**Layout.** The outputs ``X_j`` live in a ``(T + 1)``-slot write-once buffer (block i writes
slot ``i + 1``); the four streams are the carry (``4×L×D``). Aggregate ``i`` has ``C_i`` streams
(4, the last 1) over ``S_i = i + 2`` outputs; all are stored at ``C = 4`` streams × ``T + 1``
slots (hidden and output index ``c·(T + 1) + s``, stream-major), stacked over blocks, block i's
entries placed at its ``(c, s)``, zeros elsewhere. The padding stays exactly zero in training:

* a padded hidden unit has a zero ``W_1`` column and a zero ``W_2`` row: its pre-activation is 0,
  ``GELU(0) = 0``, so it sends nothing, its ``W_2`` row gets gradient ``0 · …`` and its ``W_1``
  column gets the gradient through that zero row, 0;
* a padded output ``(c, s)`` (its ``W_2`` column, its ``B`` entry) weighs slot ``s ≥ i + 2``,
  still zero when aggregate i reads it, or a stream ``c ≥ 1`` of the last aggregate, which
  nothing reads: either way its gradient is 0 (and its value 0, so those streams are zeros).

AdamW leaves a zero parameter with zero gradient at zero.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array

from dca_theory.lm.config import ModelConfig
from dca_theory.lm.driver import (
    BlockIO,
    BlockOut,
    Mixer,
    State,
    branch_inputs,
    new_buffer,
    stack_layers,
    write_slot,
)
from dca_theory.lm.rivals import MUDD_STREAMS, DenseAggregate, dense_aggregates


class MuddFormerMixer(Mixer):
    """One dense aggregate per block over a write-once buffer of block outputs."""

    layers: DenseAggregate  # padded to MUDD_STREAMS × (T + 1), stacked over blocks

    @classmethod
    def init(cls, cfg: ModelConfig, *, key) -> MuddFormerMixer:
        return cls.from_aggregates(cfg, dense_aggregates(cfg, key))

    @classmethod
    def from_trunk(cls, trunk) -> MuddFormerMixer:
        return cls.from_aggregates(trunk.cfg, trunk.dense)

    @classmethod
    def from_aggregates(cls, cfg: ModelConfig, dense) -> MuddFormerMixer:
        """From the per-block trunk's aggregates, each at its own ``C_i × S_i``."""
        width = cfg.n_layers + 1
        return cls(layers=stack_layers([_padded(agg, width) for agg in dense]))

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        # Σ_{i<T} (D w_i + w_i² + w_i) with w_i = C_i (i + 2), C_i = 4 (1 for the last block)
        t = cfg.n_layers
        widths = [(MUDD_STREAMS if i < t - 1 else 1) * (i + 2) for i in range(t)]
        return sum(cfg.d_model * w + w * w + w for w in widths)

    def param_count(self) -> int:
        # per aggregate D·O + O² + O real entries, O = C_i·S_i (the padding excluded)
        n, d = self.layers.w1_DxH.shape[:2]
        widths = [(MUDD_STREAMS if i < n - 1 else 1) * (i + 2) for i in range(n)]
        return sum(d * w + w * w + w for w in widths)

    def start(self, x_LxD, n_layers):
        return State(new_buffer(x_LxD, n_layers + 1), jnp.stack([x_LxD] * MUDD_STREAMS))

    def read(self, p, state, t):
        q_LxD, k_LxD, v_LxD, r_LxD = state.carry
        return BlockIO(q=q_LxD, k=k_LxD, v=v_LxD, r=r_LxD)

    def write(self, p: DenseAggregate, state, t, io, out):
        x_LxD = _block_output(io, out)
        buffer = write_slot(state.buffer, x_LxD, t + 1)
        return State(buffer, p(buffer, x_LxD))

    def output(self, state):
        return state.carry[0]  # the last aggregate's one stream

    def record(self, p, before, after, io, out):
        return {"in": io.q, "out": out.a + out.m, "stream": _block_output(io, out),
                "io": branch_inputs(io)}


def _block_output(io: BlockIO, out: BlockOut) -> Array:
    """``X_{i+1} = (X̄^R + a) + m``, summed in the per-block trunk's order."""
    return (io.r + out.a) + out.m


def _padded(agg: DenseAggregate, width: int) -> DenseAggregate:
    """``agg`` at ``MUDD_STREAMS`` streams × ``width`` slots, its entries at their ``(c, s)``."""
    c, s = agg.static_CxS.shape
    o = MUDD_STREAMS * width
    at = jnp.asarray([ci * width + si for ci in range(c) for si in range(s)])
    return DenseAggregate(
        w1_DxH=jnp.zeros((agg.w1_DxH.shape[0], o), agg.w1_DxH.dtype).at[:, at].set(agg.w1_DxH),
        w2_HxO=jnp.zeros((o, o), agg.w2_HxO.dtype).at[at[:, None], at[None, :]].set(agg.w2_HxO),
        static_CxS=jnp.zeros((MUDD_STREAMS, width), agg.static_CxS.dtype).at[:c, :s].set(
            agg.static_CxS),
        eps=agg.eps)
