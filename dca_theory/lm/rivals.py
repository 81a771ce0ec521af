r"""Recent rivals of DCA as trunks: Attention Residuals, MUDDFormer and value residual learning.

All three wrap the same pre-LN blocks as vanilla (:class:`~dca_theory.lm.blocks.PreLNBlock`:
``a = Attn(LN_1 x)``, ``out = x + a + MLP(LN_2(x + a))``), so models of every kind built from
one key share their block weights. ``x_0`` is the embedded input. (mHC lives in
:mod:`dca_theory.lm.mhc`; DenseFormer, Hyper-Connections and LAuReL in :mod:`.baselines`.)

**Attention Residuals, Full AttnRes** (Kimi Team, "Attention Residuals", arXiv 2603.15031).
Every *sublayer* (attention and MLP separately) reads a softmax-weighted sum over depth of the
earlier sublayer outputs, the embedding included: with sources ``v_0 = x_0, v_1 = a_0,
v_2 = m_0, …`` (``a_t`` block t's attention output, ``m_t`` its MLP output), sublayer ``l``
reads

.. math::  h_l = \sum_{i<l} \alpha_{i\to l}\, v_i,\qquad
           \alpha_{i\to l} = \mathrm{softmax}_i\big(w_l^\top \mathrm{RMSNorm}_l(v_i)\big),

with one learned pseudo-query ``w_l ∈ R^D`` and one RMSNorm (scale ``g_l ∈ R^D``) per
sublayer: attention gets ``Attn(LN_1 h)``, the MLP ``MLP(LN_2 h)``. **Decision:** the trunk
output is one more AttnRes over all ``2T + 1`` sources (vanilla's output is their plain sum),
as DCA's output GRN. Init (the paper's): ``w_l = 0``, so ``α`` is uniform and ``h_l`` is the
*mean* of the sources where vanilla has their *sum*. **At init** it therefore equals vanilla
only up to LayerNorm's ``eps``: every sublayer reads its input through a LayerNorm, and
``LN(s/n) = LN(s)`` but for ``eps`` (the relative gap grows like ``n² eps / var``, ~1e-4 at
6 layers). No exact conversion from vanilla exists (the weights are a softmax: they cannot be
all 1), so retrofit refuses it. Parameters: ``2D`` per sublayer plus the output, ``2D(2T+1)``.
Block AttnRes (attention over block summaries, for memory at depth) is not built: at our
depths (6–30 sublayers) the full form costs little.

**MUDDFormer** (Xiao et al., "MUDDFormer: Breaking Residual Bottlenecks in Transformers via
Multiway Dynamic Dense Connections", ICML 2025, arXiv 2502.12170, §3). After block ``i``
(outputs ``X_0 = x_0, X_1, …, X_{i+1}``, ``X_j`` full block outputs) a depth-wise aggregate
with *dynamic* weights forms four separate inputs for the next block, for its queries, keys,
values and residual (``c ∈ {Q, K, V, R}``):

.. math::  \bar X^c_{i+1} = \sum_{j=0}^{i+1} A^c_{i}[j]\, X_j,\qquad
           A_i = \mathrm{GELU}\big(\mathrm{RMSNorm}(X_{i+1}) W_1\big) W_2 + B_i,

``W_1 ∈ R^{D×4(i+2)}``, ``W_2 ∈ R^{4(i+2)×4(i+2)}``, static ``B_i ∈ R^{4×(i+2)}``; the
RMSNorm has no scale and GELU is the exact (erf) one, as the released code. The block then
computes ``a = Attn(LN_1 X̄^Q, LN_1 X̄^K, LN_1 X̄^V)``, ``h = X̄^R + a``,
``X_{i+2} = h + MLP(LN_2 h)``. After the last block one stream only (the output, ``C = 1``).
**Decisions:** ``LN_1`` is shared by the q/k/v inputs (the released code's ``sepln`` gives
each its own; sharing keeps vanilla's block weights exactly), and no ``round64`` of the hidden
width. Init: the released code loads trained weights (its ``B_i`` are drawn at random); we set
``W_1`` Xavier-uniform, ``W_2 = 0`` and ``B_i`` one-hot on the newest output ``X_{i+1}``, so
every stream is vanilla's stream: **identity at init, exactly**, and retrofit is exact.
Parameters: ``Σ_i (D C_i S_i + (C_i S_i)² + C_i S_i)`` with ``S_i = i + 2`` and ``C_i = 4``
(1 after the last block): 46,120 for the paper preset.

**Value residual learning, ResFormer** (Zhou et al., "Value Residual Learning",
arXiv 2410.17897, eq. for ResFormer). Every layer after the first attends over values mixed
with the first layer's values: with ``V_1 = LN_1(x_0) W_V^{(1)}`` (per head),

.. math::  V'_n = \lambda_{n,1} V_n + \lambda_{n,2} V_1 \qquad (n \ge 2),

learned scalars initialised to the paper's ``λ = 0.5, 0.5``. **At init** it is *not* vanilla:
the paper's values already mix half of ``V_1`` in; with ``λ = (1, 0)`` it is vanilla exactly,
which :meth:`ValueResidualTrunk.as_vanilla` sets, so retrofit is exact. Parameters
``2(T − 1)``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from dca_theory import random_draws as draws
from dca_theory.lm.blocks import (
    PreLNBlock,
    dropout,
    dtype_of,
    split_or_none,
    xavier_uniform,
)
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.norm import at_least_float32
from dca_theory.lm.trunk import AbstractTrunk, States, block_keys, extra_key

MUDD_STREAMS = 4  # queries, keys, values, residual


def _blocks(cfg: ModelConfig, key: PRNGKeyArray) -> tuple[PreLNBlock, ...]:
    return tuple(PreLNBlock.init(cfg, key=k) for k in block_keys(cfg, key))


def _rms_normalise(x: Array, eps: float) -> Array:
    """``x / rms(x)`` over the last axis, in float32 at least."""
    acc = at_least_float32(x.dtype)
    x = x.astype(acc)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


class DepthAttention(eqx.Module):
    """One Full-AttnRes aggregation: ``Σ_i softmax_i(w · RMSNorm(v_i)) v_i`` over depth, with
    ``RMSNorm(v) = g ⊙ v / rms(v)``."""

    query_D: Float[Array, " D"]  # the pseudo-query w_l
    norm_scale_D: Float[Array, " D"]  # RMSNorm_l's scale g_l
    eps: float = eqx.field(static=True)

    @classmethod
    def init(cls, cfg: ModelConfig) -> DepthAttention:
        d, dtype = cfg.d_model, dtype_of(cfg.param_dtype)
        return cls(query_D=jnp.zeros((d,), dtype), norm_scale_D=jnp.ones((d,), dtype),
                   eps=cfg.ln_eps)

    def __call__(self, sources: tuple[Array, ...], normed: tuple[Array, ...]
                 ) -> Float[Array, "L D"]:
        """``sources`` are the ``v_i`` (``L×D`` each), ``normed`` their ``v_i / rms(v_i)``.

        Why not one stacked ``S×L×D`` array: every sublayer would stack (and autodiff keep) a
        copy of all earlier outputs, quadratic in depth. ``(g ⊙ v̂_i) · w = v̂_i · (g ⊙ w)``
        needs one matrix-vector product per source, and the weighted sum keeps only ``α``.
        """
        acc = normed[0].dtype
        q_D = self.norm_scale_D.astype(acc) * self.query_D.astype(acc)
        alpha_SxL = jax.nn.softmax(jnp.stack([k_LxD @ q_D for k_LxD in normed]), axis=0)
        h_LxD = sum(a_L[:, None] * v_LxD.astype(acc) for a_L, v_LxD in zip(alpha_SxL, sources))
        return h_LxD.astype(sources[0].dtype)


class AttnResTrunk(AbstractTrunk):
    """Full Attention Residuals: one :class:`DepthAttention` per sublayer, one for the output."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: tuple[PreLNBlock, ...]
    mixers: tuple[DepthAttention, ...]  # 2 per block (attention, MLP), then the output

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> AttnResTrunk:
        mixers = tuple(DepthAttention.init(cfg) for _ in range(2 * cfg.n_layers + 1))
        return cls(cfg=cfg, blocks=_blocks(cfg, key), mixers=mixers)

    def run(self, x_LxD, *, causal, key, collect):
        states: States = {"embed": x_LxD} if collect else {}
        sources, normed = [x_LxD], [_rms_normalise(x_LxD, self.cfg.ln_eps)]

        def add(v_LxD):
            sources.append(v_LxD)
            normed.append(_rms_normalise(v_LxD, self.cfg.ln_eps))

        for t, (blk, k) in enumerate(zip(self.blocks, split_or_none(key, len(self.blocks)))):
            k_att, k_drop, k_mlp = split_or_none(k, 3)
            in_LxD = self.mixers[2 * t](tuple(sources), tuple(normed))
            xn_LxD = blk.ln1(in_LxD)
            a_LxD = blk.attn(xn_LxD, xn_LxD, xn_LxD, causal=causal, key=k_att)
            add(dropout(a_LxD, blk.rate, k_drop).astype(x_LxD.dtype))
            mid_LxD = self.mixers[2 * t + 1](tuple(sources), tuple(normed))
            add(blk.mlp(blk.ln2(mid_LxD), key=k_mlp).astype(x_LxD.dtype))
            if collect:
                states |= {f"block_{t}_in": in_LxD, f"block_{t}_out": sources[-2] + sources[-1],
                           f"stream_{t}": sum(sources[1:], sources[0])}
        h_LxD = self.mixers[-1](tuple(sources), tuple(normed))
        if collect:
            states["final"] = h_LxD
        return h_LxD, states


class DenseAggregate(eqx.Module):
    """MUDDFormer's depth-wise aggregate after one block: ``C`` streams from ``S`` outputs."""

    w1_DxH: Array
    w2_HxO: Array  # O = C·S, laid out stream-major (C, S)
    static_CxS: Array
    eps: float = eqx.field(static=True)

    @classmethod
    def init(cls, cfg: ModelConfig, streams: int, size: int, *, key: PRNGKeyArray
             ) -> DenseAggregate:
        d, dtype, width = cfg.d_model, dtype_of(cfg.param_dtype), streams * size
        return cls(w1_DxH=xavier_uniform(key, d, width, dtype),
                   w2_HxO=jnp.zeros((width, width), dtype),
                   static_CxS=jnp.zeros((streams, size), dtype).at[:, -1].set(1),
                   eps=cfg.ln_eps)

    def __call__(self, outs_SxLxD: Array, newest_LxD: Array) -> Float[Array, "C L D"]:
        C, S = self.static_CxS.shape
        xn_LxD = _rms_normalise(newest_LxD, self.eps).astype(self.w1_DxH.dtype)
        dw_LxO = jax.nn.gelu(xn_LxD @ self.w1_DxH, approximate=False) @ self.w2_HxO
        dw_LxCxS = dw_LxO.reshape(-1, C, S) + self.static_CxS[None]
        return jnp.einsum("lcs,sld->cld", dw_LxCxS.astype(outs_SxLxD.dtype), outs_SxLxD)


def dense_aggregates(cfg: ModelConfig, key: PRNGKeyArray) -> tuple[DenseAggregate, ...]:
    """MUDDFormer's initial aggregates, one after each block (the last: one stream)."""
    t = cfg.n_layers
    keys = draws.split(extra_key(key), t)
    return tuple(DenseAggregate.init(cfg, MUDD_STREAMS if i < t - 1 else 1, i + 2, key=keys[i])
                 for i in range(t))


class MuddFormerTrunk(AbstractTrunk):
    """MUDDFormer: pre-LN blocks fed four dynamic dense streams (q, k, v, residual)."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: tuple[PreLNBlock, ...]
    dense: tuple[DenseAggregate, ...]  # dense[i] follows block i

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> MuddFormerTrunk:
        return cls(cfg=cfg, blocks=_blocks(cfg, key), dense=dense_aggregates(cfg, key))

    def run(self, x_LxD, *, causal, key, collect):
        states: States = {"embed": x_LxD} if collect else {}
        outs, (q_LxD, k_LxD, v_LxD, r_LxD) = [x_LxD], (x_LxD,) * MUDD_STREAMS
        h_LxD = x_LxD
        for t, (blk, agg, kk) in enumerate(
            zip(self.blocks, self.dense, split_or_none(key, len(self.blocks)))
        ):
            k_att, k_drop, k_mlp = split_or_none(kk, 3)
            a_LxD = blk.attn(blk.ln1(q_LxD), blk.ln1(k_LxD), blk.ln1(v_LxD), causal=causal,
                             key=k_att)
            a_LxD = r_LxD + dropout(a_LxD, blk.rate, k_drop).astype(x_LxD.dtype)
            out_LxD = a_LxD + blk.mlp(blk.ln2(a_LxD), key=k_mlp).astype(x_LxD.dtype)
            outs.append(out_LxD)
            streams_CxLxD = agg(jnp.stack(outs), out_LxD)
            if collect:
                states |= {f"block_{t}_in": q_LxD, f"block_{t}_out": out_LxD - r_LxD,
                           f"stream_{t}": out_LxD}
            if t + 1 < len(self.blocks):
                q_LxD, k_LxD, v_LxD, r_LxD = streams_CxLxD
            else:
                h_LxD = streams_CxLxD[0]
        if collect:
            states["final"] = h_LxD
        return h_LxD, states


def initial_lambdas(cfg: ModelConfig) -> Array:
    """ResFormer's initial ``(λ_own, λ_first) = (0.5, 0.5)`` of blocks 1, …, ``T - 1``."""
    return jnp.full((cfg.n_layers - 1, 2), 0.5, dtype_of(cfg.param_dtype))


class ValueResidualTrunk(AbstractTrunk):
    """ResFormer: blocks after the first attend over ``λ_1 V_n + λ_2 V_1``."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: tuple[PreLNBlock, ...]
    lambdas_Tx2: Array  # row t - 1 holds (λ_own, λ_first) of block t >= 1

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> ValueResidualTrunk:
        return cls(cfg=cfg, blocks=_blocks(cfg, key), lambdas_Tx2=initial_lambdas(cfg))

    def as_vanilla(self) -> ValueResidualTrunk:
        """The same trunk with ``λ = (1, 0)``: the vanilla model with these blocks, exactly."""
        lam = jnp.zeros_like(self.lambdas_Tx2).at[:, 0].set(1)
        return eqx.tree_at(lambda t: t.lambdas_Tx2, self, lam)

    def run(self, x_LxD, *, causal, key, collect):
        states: States = {"embed": x_LxD} if collect else {}
        h_LxD, v1_LxHxK = x_LxD, None
        for t, (blk, k) in enumerate(zip(self.blocks, split_or_none(key, len(self.blocks)))):
            k_att, k_drop, k_mlp = split_or_none(k, 3)
            xn_LxD = blk.ln1(h_LxD)
            mix = None
            if t == 0:
                v1_LxHxK = blk.attn.project_values(xn_LxD)
            else:
                lam = self.lambdas_Tx2[t - 1].astype(v1_LxHxK.dtype)
                mix = lambda v, lam=lam: lam[0] * v + lam[1] * v1_LxHxK  # noqa: E731
            a_LxD = blk.attn(xn_LxD, xn_LxD, xn_LxD, causal=causal, key=k_att, mix_values=mix)
            a_LxD = dropout(a_LxD, blk.rate, k_drop).astype(h_LxD.dtype)
            f_LxD = a_LxD + blk.mlp(blk.ln2(h_LxD + a_LxD), key=k_mlp).astype(h_LxD.dtype)
            if collect:
                states |= {f"block_{t}_in": h_LxD, f"block_{t}_out": f_LxD}
            h_LxD = h_LxD + f_LxD
            if collect:
                states[f"stream_{t}"] = h_LxD
        if collect:
            states["final"] = h_LxD
        return h_LxD, states


RIVAL_TRUNKS: dict[str, type[AbstractTrunk]] = {
    "attn_res": AttnResTrunk,
    "muddformer": MuddFormerTrunk,
    "value_residual": ValueResidualTrunk,
}
