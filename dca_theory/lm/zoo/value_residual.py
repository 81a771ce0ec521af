r"""``value_residual``: ResFormer, every block after the first attends over mixed values.

Block ``n ≥ 1`` attends over ``V'_n = λ_{n,1} V_n + λ_{n,2} V_1``, ``V_1`` block 0's projected
values (``LN_1(x) W_V``, per head); the stream is vanilla's ``h ← h + a + m``. Equations, init
(``λ = 0.5, 0.5``) and why retrofit sets ``λ = (1, 0)`` are in :mod:`dca_theory.lm.rivals`.

**Layout.** The carry is ``(h, V_1)`` (``V_1`` zeros until block 0 writes it). The ``λ`` are
one ``T×2`` array stacked over blocks; block 0's row is stored but never read: block 0's values
are selected unmixed (``jnp.where`` on ``t == 0``), so that row stays zero with gradient
exactly 0. ``V_1`` is carried in float32 at least, so a bfloat16 value projection round-trips
exactly. Cached decoding needs nothing more: the attention mixes the values before it writes
them into the cache, so the cache holds each block's mixed values.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax.numpy as jnp

from dca_theory.lm.config import ModelConfig
from dca_theory.lm.driver import BlockIO, Mixer, State, branch_inputs
from dca_theory.lm.norm import at_least_float32


class ValueResidualMixer(Mixer):
    """Vanilla's stream plus block 0's values mixed into every later block's."""

    layers: Any  # λ_Tx2: row t holds block t's (λ_own, λ_first); row 0 unused (zero)
    n_heads: int = eqx.field(static=True)
    hooks_block = True  # mix_values: block 0's values enter every later block

    @classmethod
    def init(cls, cfg: ModelConfig, *, key=None) -> ValueResidualMixer:
        from dca_theory.lm.rivals import initial_lambdas

        return cls.from_lambdas(cfg, initial_lambdas(cfg))

    @classmethod
    def from_trunk(cls, trunk) -> ValueResidualMixer:
        return cls.from_lambdas(trunk.cfg, trunk.lambdas_Tx2)

    @classmethod
    def from_lambdas(cls, cfg: ModelConfig, lam) -> ValueResidualMixer:
        """From the per-block trunk's ``(T - 1)×2`` λ (blocks 1, …): block 0's row prepended."""
        return cls(layers=jnp.concatenate([jnp.zeros((1, 2), lam.dtype), lam]),
                   n_heads=cfg.n_heads)

    def for_vanilla(self, blocks):
        """λ = (1, 0) for every block after the first: vanilla exactly."""
        lam = jnp.zeros_like(self.layers).at[1:, 0].set(1)
        return eqx.tree_at(lambda m: m.layers, self, lam)

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        # 2(T − 1): (λ_own, λ_first) for every block after the first
        return 2 * (cfg.n_layers - 1)

    def param_count(self) -> int:
        return 2 * (self.layers.shape[0] - 1)

    def start(self, x_LxD, n_layers):
        L, D = x_LxD.shape
        v1 = jnp.zeros((L, self.n_heads, D // self.n_heads), at_least_float32(x_LxD.dtype))
        return State(None, (x_LxD, v1))

    def read(self, p, state, t):
        h_LxD, v1_LxHxK = state.carry

        def mix(v_LxHxK):
            lam = p.astype(v_LxHxK.dtype)
            mixed = lam[0] * v_LxHxK + lam[1] * v1_LxHxK.astype(v_LxHxK.dtype)
            return jnp.where(t == 0, v_LxHxK, mixed)

        return BlockIO(q=h_LxD, mix_values=mix)

    def write(self, p, state, t, io, out):
        h_LxD, v1_LxHxK = state.carry
        v1_LxHxK = jnp.where(t == 0, out.values.astype(v1_LxHxK.dtype), v1_LxHxK)
        return State(None, (h_LxD + (out.a + out.m), v1_LxHxK))

    def output(self, state):
        return state.carry[0]

    def record(self, p, before, after, io, out):
        return {"in": io.q, "out": out.a + out.m, "stream": after.carry[0],
                "io": branch_inputs(io)}
