r"""``hyper_connections`` and ``mhc``: the residual stream widened to ``n`` streams.

The model input is copied into ``n = hc_expansion`` streams ``H`` (``L×N×D``). Block t's
connection gives token-dependent weights from the streams: ``in`` (``L×N``, the block reads
``Σ_n in_n H_n``), ``out`` (``L×N``, the block's branch ``f = a + m`` is added to stream n with
weight ``out_n``) and ``res`` (``L×N×N``, mixing the streams), so
``H ← res·H + out ⊗ f``; the trunk output is the sum of the streams. Dynamic
Hyper-Connections (``in, out, res = A_m, B, A_r``, mixing over ``A_r``'s first index) are in
:mod:`dca_theory.lm.baselines`; mHC (``H^pre, H^post, H^res``, Sinkhorn-projected) in
:mod:`dca_theory.lm.mhc`; each module's docstring has the equations and decisions, and
``run_streams`` there is the per-block loop this mixer runs in the driver.

**Layout.** The streams are the state's ``carry``; no buffer. Each block's connection has one
shape whatever the block, so they are stacked over blocks as they are (no padding). The
weights are computed once per block, in :meth:`~StreamsMixer.read` (which needs ``in``), and
handed to :meth:`~StreamsMixer.write` through ``BlockIO.aux``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from dca_theory.lm.baselines import HyperConnection
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.driver import BlockIO, Mixer, State, branch_inputs, stack_layers
from dca_theory.lm.mhc import ManifoldHyperConnection


class StreamsMixer(Mixer):
    """``n`` residual streams with one connection per block (see the module docstring)."""

    layers: eqx.AbstractVar[Any]
    n: eqx.AbstractVar[int]
    #: the per-block connection class (``init(cfg, layer)``, ``weights(streams)``)
    connection: ClassVar[type]
    #: the per-block trunk's field holding its connections, one per block
    trunk_field: ClassVar[str]
    #: the einsum of ``res`` with the streams (the papers order ``res``'s indices differently)
    residual_mix: ClassVar[str]

    @classmethod
    def init(cls, cfg: ModelConfig, *, key=None) -> StreamsMixer:
        # No draws: the connections' init is deterministic (as in the per-block trunks).
        conns = [cls.connection.init(cfg, t) for t in range(cfg.n_layers)]
        return cls(layers=stack_layers(conns), n=cfg.hc_expansion)

    @classmethod
    def from_trunk(cls, trunk) -> StreamsMixer:
        return cls(layers=stack_layers(getattr(trunk, cls.trunk_field)),
                   n=trunk.cfg.hc_expansion)

    @staticmethod
    def weights(p, h_LxNxD):
        """Block ``p``'s ``(in_LxN, out_LxN, res_LxNxN)`` from the streams (mHC's order)."""
        return p.weights(h_LxNxD)

    def param_count(self) -> int:
        return sum(x.size for x in jax.tree.leaves(eqx.filter(self.layers, eqx.is_array)))

    def start(self, x_LxD, n_layers):
        L, D = x_LxD.shape
        return State(None, jnp.broadcast_to(x_LxD[:, None, :], (L, self.n, D)))

    def read(self, p, state, t):
        in_LxN, out_LxN, res_LxNxN = self.weights(p, state.carry)
        return BlockIO(q=jnp.einsum("ln,lnd->ld", in_LxN, state.carry),
                       aux=(out_LxN, res_LxNxN))

    def write(self, p, state, t, io, out):
        out_LxN, res_LxNxN = io.aux
        h_LxNxD = (jnp.einsum(self.residual_mix, res_LxNxN, state.carry)
                   + jnp.einsum("ln,ld->lnd", out_LxN, out.a + out.m))
        return State(None, h_LxNxD)

    def output(self, state):
        return jnp.sum(state.carry, axis=1)

    def record(self, p, before, after, io, out):
        return {"in": io.q, "out": out.a + out.m, "stream": jnp.sum(after.carry, axis=1),
                "io": branch_inputs(io)}


class HyperConnectionsMixer(StreamsMixer):
    """Dynamic Hyper-Connections, one per block."""

    layers: HyperConnection  # stacked over blocks
    n: int = eqx.field(static=True)
    connection: ClassVar[type] = HyperConnection
    trunk_field: ClassVar[str] = "hcs"
    residual_mix: ClassVar[str] = "lnm,lnd->lmd"  # A_r^T H

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        # T (4D + nD + 2 + 2n + n²) (see dca_theory.lm.baselines)
        d, n = cfg.d_model, cfg.hc_expansion
        return cfg.n_layers * (2 * d + 2 * d + n * d + 2 + 2 * n + n * n)

    @staticmethod
    def weights(p: HyperConnection, h_LxNxD):  # HC gives (B, A_m, A_r): out, in, res
        b_LxN, am_LxN, ar_LxNxN = p.weights(h_LxNxD)
        return am_LxN, b_LxN, ar_LxNxN


class MHCMixer(StreamsMixer):
    """Manifold-constrained Hyper-Connections, one per block."""

    layers: ManifoldHyperConnection  # stacked over blocks
    n: int = eqx.field(static=True)
    connection: ClassVar[type] = ManifoldHyperConnection
    trunk_field: ClassVar[str] = "mhcs"
    residual_mix: ClassVar[str] = "lij,ljd->lid"  # H^res H

    @classmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        # T (nD m + m + 3) with m = n² + 2n (see dca_theory.lm.mhc)
        n = cfg.hc_expansion
        m = n * n + 2 * n
        return cfg.n_layers * (n * cfg.d_model * m + m + 3)
