r"""Related-work residual schemes of the paper's Tables 5 and 6, as trunks.

Each baseline wraps the same pre-LN blocks as vanilla (:class:`~dca_theory.lm.blocks.PreLNBlock`)
and treats a whole transformer block as one "layer" with residual branch
``f(x) = a + MLP(LN_2(x + a))``; ``x_0`` is the embedded input and ``x_i`` the stream entering
block ``i``. Every scheme is initialised so that the model equals vanilla with the same block
weights (exactly, except Hyper-Connections: see there).

**1×1 DenseFormer** (Pagliardini et al., "DenseFormer: Enhancing Information Flow in
Transformers via Depth Weighted Averaging", NeurIPS 2024, eq. (1)–(2)). With
``X_i = B_i(Y_{i-1})`` the full block output (``B_i(y) = y + f_i(y)``) and ``X_0`` the
embeddings, a Depth-Weighted-Average after every block gives the next input

.. math::  Y_i = \mathrm{DWA}_i(X_0, \dots, X_i) = \sum_{j=0}^{i} \alpha_{i,j} X_j,

scalar weights initialised ``α_{i,i} = 1``, ``α_{i,j<i} = 0`` (vanilla at init). "1×1" is
dilation = period = 1 (a DWA after every block over every earlier output). ``Y_T`` goes to the
final LayerNorm. The DWA is the shared ``grn_v1`` combiner over the stack of *states*
``[X_0, …, X_i]`` with ``b`` initialised one-hot on the newest entry.
Parameters: Σ_{i=1}^{T}(i+1) scalars (27 for T = 6).

**Dynamic Hyper-Connections** (Zhu et al., "Hyper-Connections", ICLR 2025, §2, eqs. (1)–(11)).
The stream is widened to ``n`` copies ``H ∈ R^{n×D}`` (``n = hc_expansion``, default 4;
``H^0 = [x_0; …; x_0]``). A layer ``𝒯`` with hyper-connection matrix
``[[0, B], [A_m, A_r]]`` (``B ∈ R^{1×n}``, ``A_m ∈ R^{n×1}``, ``A_r ∈ R^{n×n}``) computes

.. math::  h_0 = A_m^\top H,\qquad \hat H = B^\top\, \mathcal T(h_0)^\top + A_r^\top H,

and the dynamic version makes the matrices input dependent (eqs. (9)–(11)), with
``H̄ = norm(H)`` (a LayerNorm per stream):

.. math::  B = s_\beta \tanh(\bar H W_\beta)^\top + B_0,\quad
           A_m = s_\alpha \tanh(\bar H W_m) + A_{m,0},\quad
           A_r = s_\alpha \tanh(\bar H W_r) + A_{r,0}.

Init (HC paper §2.3): ``W_β, W_m, W_r = 0``, ``s_α = s_β = 0.01``, ``B_0 = 1``,
``A_{m,0} = e_{t mod n}`` for layer ``t``, ``A_{r,0} = I_n``. The final ``H`` is summed over
its ``n`` rows before the final LayerNorm. At init every row equals vanilla's stream ``x_t``,
so the trunk output is ``n·x_T``: the model equals vanilla up to LayerNorm's ``eps``
(``LN(n y) ≠ LN(y)`` only through ``eps``). **Decision:** we apply one hyper-connection per
transformer *block* (``𝒯 = f``); the HC paper wraps attention and FFN separately. One HC per
block with n = 4 gives 49,677,772 parameters for the paper preset, matching Table 5's 49.68M;
per-sublayer HC would give 49.70M.

**LAuReL** (Menghani et al., "LAuReL: Learned Augmented Residual Layer", ICML 2025, §2; general
form ``x_{i+1} = α f(x_i) + g(x_i, x_{i-1}, …, x_0)``):

* LAuReL-LR (low rank, eq. for ``g = (I + B A) x_i``): ``x_{i+1} = f(x_i) + x_i + B_i A_i x_i``
  with ``A_i ∈ R^{r×D}``, ``B_i ∈ R^{D×r}``; ``A_i`` Xavier-uniform, ``B_i = 0`` (vanilla at
  init; ``r = laurel_rank``).
* LAuReL-PA (previous activations): ``x_{i+1} = f(x_i) + x_i + Σ_{j≤i} γ_{i,j} h_i(x_j)`` with a
  rank-r linear ``h_i(x) = B_i A_i x`` and learned scalars ``γ_{i,j}`` (init 1; ``B_i = 0``,
  so vanilla at init). By linearity ``Σ_j γ_{i,j} h_i(x_j) = h_i(Σ_j γ_{i,j} x_j)``: one
  low-rank map per block after a ``grn_v1`` combination of the earlier states.
  **Decision:** the sum includes the current ``x_i``; with r = 16 this gives 49,751,365
  parameters for the paper preset, Table 5's 49.75M (the exact LAuReL-PA form and rank used by
  the DCA authors are not stated).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from dca_theory import random_draws as draws
from dca_theory.lm.blocks import LayerNorm, PreLNBlock, dtype_of, split_or_none, xavier_uniform
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.trunk import AbstractTrunk, States, block_keys, extra_key
from dca_theory.residual import AbstractCombiner, ResidualStack, make_combiner


def _blocks(cfg: ModelConfig, key: PRNGKeyArray) -> tuple[PreLNBlock, ...]:
    return tuple(PreLNBlock.init(cfg, key=k) for k in block_keys(cfg, key))


class DenseFormerTrunk(AbstractTrunk):
    """1×1 DenseFormer: a DWA (``grn_v1`` over block-output states) after every block."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: tuple[PreLNBlock, ...]
    dwa: tuple[AbstractCombiner, ...]  # dwa[i] combines [X_0, …, X_{i+1}]

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> DenseFormerTrunk:
        dtype = dtype_of(cfg.param_dtype)
        dwa = []
        for i in range(cfg.n_layers):
            c = make_combiner("grn_v1", i + 2, cfg.d_model, dtype=dtype)
            dwa.append(eqx.tree_at(lambda c: c.b, c, jnp.zeros((i + 2,), dtype).at[-1].set(1)))
        return cls(cfg=cfg, blocks=_blocks(cfg, key), dwa=tuple(dwa))

    def run(self, x_LxD, *, causal, key, collect):
        states: States = {"embed": x_LxD} if collect else {}
        stack, y_LxD = ResidualStack.start(x_LxD), x_LxD
        for t, (blk, dwa, k) in enumerate(
            zip(self.blocks, self.dwa, split_or_none(key, len(self.blocks)))
        ):
            f_LxD = blk.branch(y_LxD, causal=causal, key=k)
            if collect:
                states |= {f"block_{t}_in": y_LxD, f"block_{t}_out": f_LxD}
            stack = stack.push(y_LxD + f_LxD)  # X_{t+1}, the full block output
            g_SxLxD = stack.array()
            y_LxD = dwa(g_SxLxD)
            if collect:
                states |= {f"stack_{t}": g_SxLxD, f"stream_{t}": y_LxD}
        if collect:
            states["final"] = y_LxD
        return y_LxD, states


class HyperConnection(eqx.Module):
    """One dynamic hyper-connection (the parameters of eqs. (9)–(11) for one layer)."""

    norm: LayerNorm
    w_beta_D: Array
    w_m_D: Array
    w_r_DxN: Array
    s_alpha: Array
    s_beta: Array
    b0_N: Array
    am0_N: Array
    ar0_NxN: Array

    @classmethod
    def init(cls, cfg: ModelConfig, layer: int) -> HyperConnection:
        n, d, dtype = cfg.hc_expansion, cfg.d_model, dtype_of(cfg.param_dtype)
        return cls(
            norm=LayerNorm.init(d, cfg.ln_eps, dtype),
            w_beta_D=jnp.zeros((d,), dtype), w_m_D=jnp.zeros((d,), dtype),
            w_r_DxN=jnp.zeros((d, n), dtype),
            s_alpha=jnp.asarray(0.01, dtype), s_beta=jnp.asarray(0.01, dtype),
            b0_N=jnp.ones((n,), dtype), am0_N=jnp.zeros((n,), dtype).at[layer % n].set(1),
            ar0_NxN=jnp.eye(n, dtype=dtype),
        )

    def weights(self, h_LxNxD: Array) -> tuple[Array, Array, Array]:
        """Token-dependent ``B (L×N)``, ``A_m (L×N)`` and ``A_r (L×N×N)``."""
        hn_LxNxD = self.norm(h_LxNxD)
        b_LxN = self.s_beta * jnp.tanh(hn_LxNxD @ self.w_beta_D) + self.b0_N[None]
        am_LxN = self.s_alpha * jnp.tanh(hn_LxNxD @ self.w_m_D) + self.am0_N[None]
        ar_LxNxN = self.s_alpha * jnp.tanh(hn_LxNxD @ self.w_r_DxN) + self.ar0_NxN[None]
        return b_LxN, am_LxN, ar_LxNxN

def run_streams(blocks, mixers, x_LxD, n: int, weights, residual_mix: str, *, causal, key,
                collect) -> tuple[Array, States]:
    """The n-stream residual loop shared by Hyper-Connections and mHC: the model input copied
    into ``n`` streams; per block, ``weights(mixer, streams)`` gives ``(in_LxN, out_LxN,
    res_LxNxN)``, which read the block input from the streams, write the block output back and
    mix the streams (``residual_mix``: the einsum of ``res`` with the streams, whose index order
    differs between the papers); the trunk output is the streams' sum."""
    states: States = {"embed": x_LxD} if collect else {}
    h_LxNxD = jnp.broadcast_to(x_LxD[:, None, :], (x_LxD.shape[0], n, x_LxD.shape[1]))
    for t, (blk, mixer, k) in enumerate(zip(blocks, mixers, split_or_none(key, len(blocks)))):
        in_LxN, out_LxN, res_LxNxN = weights(mixer, h_LxNxD)
        in_LxD = jnp.einsum("ln,lnd->ld", in_LxN, h_LxNxD)
        f_LxD = blk.branch(in_LxD, causal=causal, key=k)
        h_LxNxD = (jnp.einsum(residual_mix, res_LxNxN, h_LxNxD)
                   + jnp.einsum("ln,ld->lnd", out_LxN, f_LxD))
        if collect:
            states |= {f"block_{t}_in": in_LxD, f"block_{t}_out": f_LxD,
                       f"stream_{t}": jnp.sum(h_LxNxD, axis=1)}
    out_LxD = jnp.sum(h_LxNxD, axis=1)
    if collect:
        states["final"] = out_LxD
    return out_LxD, states


class HyperConnectionsTrunk(AbstractTrunk):
    """Dynamic Hyper-Connections with expansion rate ``cfg.hc_expansion``, one per block."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: tuple[PreLNBlock, ...]
    hcs: tuple[HyperConnection, ...]

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> HyperConnectionsTrunk:
        hcs = tuple(HyperConnection.init(cfg, t) for t in range(cfg.n_layers))
        return cls(cfg=cfg, blocks=_blocks(cfg, key), hcs=hcs)

    def run(self, x_LxD, *, causal, key, collect):
        # Hyper-Connections' (b, A_m, A_r): output weights, input weights, residual mixing
        # A_r^T H (the paper mixes over its first index).
        return run_streams(self.blocks, self.hcs, x_LxD, self.cfg.hc_expansion,
                           lambda hc, h: (lambda b, am, ar: (am, b, ar))(*hc.weights(h)),
                           "lnm,lnd->lmd", causal=causal, key=key, collect=collect)


class LowRank(eqx.Module):
    """``x ↦ B A x`` with ``A ∈ R^{r×D}`` (Xavier-uniform) and ``B ∈ R^{D×r}`` (zeros)."""

    a_DxR: Array
    b_RxD: Array

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> LowRank:
        d, r, dtype = cfg.d_model, cfg.laurel_rank, dtype_of(cfg.param_dtype)
        return cls(a_DxR=xavier_uniform(key, d, r, dtype), b_RxD=jnp.zeros((r, d), dtype))

    def __call__(self, x_LxD: Array) -> Float[Array, "L D"]:
        return (x_LxD @ self.a_DxR) @ self.b_RxD


class LaurelTrunk(AbstractTrunk):
    """LAuReL-LR (``gammas is None``) or LAuReL-PA (``gammas[i]`` combines ``[x_0..x_i]``)."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: tuple[PreLNBlock, ...]
    low_rank: tuple[LowRank, ...]
    gammas: tuple[AbstractCombiner, ...] | None

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> LaurelTrunk:
        keys = draws.split(extra_key(key), cfg.n_layers)
        low_rank = tuple(LowRank.init(cfg, key=k) for k in keys)
        gammas = None
        if cfg.residual == "laurel_pa":
            dtype = dtype_of(cfg.param_dtype)
            gammas = tuple(make_combiner("grn_v1", i + 1, cfg.d_model, dtype=dtype)
                           for i in range(cfg.n_layers))
        return cls(cfg=cfg, blocks=_blocks(cfg, key), low_rank=low_rank, gammas=gammas)

    def run(self, x_LxD, *, causal, key, collect):
        states: States = {"embed": x_LxD} if collect else {}
        stack, h_LxD = ResidualStack.start(x_LxD), x_LxD
        for t, (blk, lr, k) in enumerate(
            zip(self.blocks, self.low_rank, split_or_none(key, len(self.blocks)))
        ):
            f_LxD = blk.branch(h_LxD, causal=causal, key=k)
            if self.gammas is None:
                aug_LxD = lr(h_LxD)
            else:
                aug_LxD = lr(self.gammas[t](stack.array()))  # Σ_j γ_{t,j} h_t(x_j)
            if collect:
                states |= {f"block_{t}_in": h_LxD, f"block_{t}_out": f_LxD + aug_LxD}
            h_LxD = h_LxD + f_LxD + aug_LxD
            if self.gammas is not None and t + 1 < len(self.blocks):
                stack = stack.push(h_LxD)
            if collect:
                states[f"stream_{t}"] = h_LxD
        if collect:
            states["final"] = h_LxD
        return h_LxD, states


BASELINE_TRUNKS: dict[str, type[AbstractTrunk]] = {
    "denseformer": DenseFormerTrunk,
    "hyper_connections": HyperConnectionsTrunk,
    "laurel_lr": LaurelTrunk,
    "laurel_pa": LaurelTrunk,
}
