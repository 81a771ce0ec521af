r"""``dca``: DeepCrossAttention (paper §3.2, Figure 4), full stack or k-DCA.

Block t reads three GRN-v3 over the stack, ``q̃, k̃, ṽ = GRN_q(G), GRN_k(G), GRN_v(G)``;
attention gets ``LN_q q̃, LN_k k̃, LN_v ṽ`` and the MLP ``LN_h(a + q̃)``; the new stack entry
is ``o = a + m`` (it does not contain ``q̃``). ``LN_q`` and ``LN_h`` are the block's own
``LN_1`` and ``LN_2`` (so a vanilla model's blocks carry over, :mod:`dca_theory.lm.retrofit`);
``LN_k`` and ``LN_v`` are this mixer's. A final GRN-v3 combines the stack. Why this equals
vanilla at init is in :mod:`dca_theory.lm.blocks`.

**Stack.** Full DCA (``k is None`` or ``k + 1 >= n_layers``, where k-DCA is full DCA) keeps a
``(T + 1)``-slot write-once buffer, block t writing slot ``t + 1``. k-DCA reads the fixed
stack ``[x, middle, last k]``, which starts as ``[x, 0, …, 0]`` and shifts by one entry per
block while the oldest of the last k is added into the middle (adding zeros until block
``k + 1``, where the middle becomes the first output exactly). Without a dropout key
(inference, decoding) the stack itself is the carry: ``k + 2`` entries, whatever the depth.
With one (training, :meth:`~dca_theory.lm.driver.Mixer.start_for_training`), the entries go
into a ``(T + k + 1)``-slot write-once buffer ``[x, 0 (k slots), o_0, …, o_{T-1}]``, block t
writing slot ``k + 1 + t`` and reading its last k at slots ``t + 1, …, t + k``, and the carry
is only the middle and that window's start: the scan's backward pass saves its carry once per
block, so carrying the stack would save all ``k + 2`` entries per block (2-DCA at depth 24,
width 256: 48 MiB where the middle needs 12). Both forms give the same values.

**Layout.** The three GRNs of every block are stored over the widest stack (``T + 1`` or
``k + 2`` slots), stacked over blocks, block t's ``b`` rows at the slots its entries occupy
(:func:`~dca_theory.lm.layer_stack.scan_slots`: the first ``t + 1`` for full DCA; for k-DCA's
first ``k + 1`` blocks, ``x`` and the last ``t`` slots), zeros elsewhere. The zero rows weigh
slots holding zeros when read (under every gate of :mod:`dca_theory.gates` the zero entry
contributes 0 and its row's gradient is 0), so they stay zero under AdamW.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from dca_theory import schemes
from dca_theory.lm.blocks import LayerNorm
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
from dca_theory.lm.layer_stack import picked_block, placed_block, scan_slots
from dca_theory.residual import GRNv3, stack_size


class DCALayer(eqx.Module):
    """One block's DCA parameters besides its pre-LN block: three GRN-v3, ``LN_k``, ``LN_v``."""

    grn_q: GRNv3
    grn_k: GRNv3
    grn_v: GRNv3
    ln_k: LayerNorm
    ln_v: LayerNorm


class DCAMixer(Mixer):
    """DCA's three GRN-v3 per block over the stack, and the final GRN-v3."""

    layers: DCALayer
    final: GRNv3
    k: int | None = eqx.field(static=True)
    n_layers: int = eqx.field(static=True)

    # full DCA's GRNs read the buffer through buffer_grns_through: only the slots written so
    # far; k-DCA's reads and writes read slots 0 .. t + k, all written before block t
    reads_written_only = True

    @property
    def full(self) -> bool:
        return self.k is None or self.k + 1 >= self.n_layers

    @classmethod
    def init(cls, cfg: ModelConfig, *, key) -> DCAMixer:
        # The draws of the per-block DCA modules (same key, same values), then this layout.
        from dca_theory.lm.trunk import DCATrunk

        return cls.from_trunk(DCATrunk.init(cfg, key=key))

    @classmethod
    def from_trunk(cls, trunk) -> DCAMixer:
        """From a DCA trunk of one module per block (its blocks' pre-LN parts are
        :func:`pre_ln_blocks`)."""
        cfg, blocks = trunk.cfg, trunk.blocks
        width = stack_size(cfg.n_layers, cfg.k)
        layers = []
        for t, b in enumerate(blocks):
            s = scan_slots(cfg, t)
            layers.append(DCALayer(grn_q=placed_block(b.grn_q, s, width),
                                   grn_k=placed_block(b.grn_k, s, width),
                                   grn_v=placed_block(b.grn_v, s, width),
                                   ln_k=b.ln_k, ln_v=b.ln_v))
        return cls(layers=stack_layers(layers), final=trunk.final, k=cfg.k,
                   n_layers=cfg.n_layers)

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        # per block three GRN-v3 (3 (S_t D + D)) and two more LayerNorms than vanilla
        # (LN_q, LN_k, LN_v, LN_h instead of LN_1, LN_2: +4D); plus the output GRN-v3;
        # k-DCA caps S_t at k + 2
        d, t, grn_v3 = cfg.d_model, cfg.n_layers, schemes.get("grn_v3")
        grns = sum(3 * grn_v3.combiner_params(stack_size(i, cfg.k), d) for i in range(t))
        final = grn_v3.combiner_params(stack_size(t, cfg.k), d)
        return grns + final + t * 2 * 2 * d

    def param_count(self) -> int:
        grn_v3, d = schemes.get("grn_v3"), self.final.dim
        grns = sum(3 * grn_v3.combiner_params(stack_size(t, self.k), d)
                   for t in range(self.n_layers))
        return grns + self.final.param_count() + self.n_layers * 2 * 2 * d

    def start(self, x_LxD, n_layers):
        if self.full:
            return State(new_buffer(x_LxD, n_layers + 1), ())
        return State(None, new_buffer(x_LxD, self.k + 2))  # the stack [x, 0, 0, …]

    def start_for_training(self, x_LxD, n_layers):
        if self.full:
            return self.start(x_LxD, n_layers)
        # carry: the middle, and the slot where block t's last k start (t + 1)
        return State(new_buffer(x_LxD, n_layers + self.k + 1),
                     (jnp.zeros_like(x_LxD), jnp.ones((), jnp.int32)))

    def for_vanilla(self, blocks):
        # LN_q = LN_1 and LN_h = LN_2 are the blocks' own; LN_k and LN_v copy LN_1
        return eqx.tree_at(lambda m: (m.layers.ln_k, m.layers.ln_v), self,
                           (blocks.ln1, blocks.ln1))

    def named_combiners(self):
        out = {}
        for t in range(self.n_layers):
            p, slots = layer_of(self.layers, t), self.stack_slots(t)
            out |= {f"block_{t}.{n}": (picked_block(g, slots), t)
                    for n, g in (("q", p.grn_q), ("k", p.grn_k), ("v", p.grn_v))}
        return out | {"output": (self.final, self.n_layers)}

    def _stack(self, state):
        """The stack the next block reads (full DCA: the buffer, unwritten slots zero)."""
        if self.full:
            return state.buffer
        if state.buffer is None:
            return state.carry
        middle, start = state.carry
        recent = jax.lax.dynamic_slice_in_dim(state.buffer, start, self.k)
        return jnp.concatenate([state.buffer[:1], middle[None], recent])

    def read(self, p: DCALayer, state, t):
        return self.read_through(p, state, t)[0]

    def read_through(self, p: DCALayer, state, t):
        grns = (p.grn_q, p.grn_k, p.grn_v)
        if self.full:  # block t has written slots 0..t
            (q_LxD, k_LxD, v_LxD), buffer = buffer_grns_through(grns, state.buffer, t + 1)
            state = State(buffer, ())
        else:
            q_LxD, k_LxD, v_LxD = buffer_grns(grns, self._stack(state))
        return BlockIO(q=q_LxD, k=k_LxD, v=v_LxD, r=q_LxD, kv_norms=(p.ln_k, p.ln_v)), state

    def write(self, p, state, t, io, out):
        o_LxD = out.a + out.m
        if self.full:
            return State(write_new_slot(state.buffer, o_LxD, t + 1), ())
        if state.buffer is None:  # push o; the oldest of the last k joins the middle
            s = state.carry
            recent = jnp.concatenate([s[2:], o_LxD[None].astype(s.dtype)])
            return State(None, jnp.concatenate([s[:1], (s[1] + recent[0])[None], recent[1:]]))
        # the same in the buffer: the oldest of the last k is slot t + 1 (a zero slot before
        # block k; o itself for k = 0)
        middle, start = state.carry
        buffer = write_new_slot(state.buffer, o_LxD, t + self.k + 1)
        oldest = jax.lax.dynamic_index_in_dim(buffer, start, keepdims=False)
        return State(buffer, (middle + oldest, start + 1))

    def output(self, state):
        return buffer_grns((self.final,), self._stack(state))[0]

    def record(self, p, before, after, io, out):
        return {"in": io.q, "out": out.a + out.m,
                "stream": jnp.sum(self._stack(after), axis=0), "stack": self._stack(before),
                "io": branch_inputs(io)}

    def stack_slots(self, t):
        return scan_slots(self, t)  # reads k and n_layers, which this mixer holds


def pre_ln_blocks(trunk) -> list:
    """A per-block DCA trunk's blocks as pre-LN blocks: ``LN_1 = LN_q``, ``LN_2 = LN_h``."""
    from dca_theory.lm.blocks import PreLNBlock

    return [PreLNBlock(ln1=b.ln_q, attn=b.attn, ln2=b.ln_h, mlp=b.mlp, rate=b.rate)
            for b in trunk.blocks]

