r"""Transformer building blocks: LayerNorm, attention, MLP, the pre-LN block and the DCA block.

Shape letters are listed in :mod:`dca_theory.lm.model`. Every module acts on ONE sequence
(``x_LxD``); batching is the caller's ``jax.vmap``. Nothing here knows about tokens or
positions, and causality is a call argument, so the ViT reuses these blocks unchanged.

**Vanilla pre-LN block** (Flax lm1b ``EncoderDecoder1DBlock``, the paper's baseline):

.. math::  a = \mathrm{Attn}(\mathrm{LN}_1(x)),\quad y = x + a,\quad
           \mathrm{out} = y + \mathrm{MLP}(\mathrm{LN}_2(y)).

We split it as ``out = x + f(x)`` with the *residual branch* ``f(x) = a + MLP(LN_2(x + a))``:
``f`` is what a block contributes to the residual stack (paper §3, ``f_t(g_t(x))``).

**DCA block** (paper §3.2, Figure 4; ``dca-paper.md`` §2.4), with ``G`` the stack:

.. math::  \tilde q, \tilde k, \tilde v = \mathrm{GRN}_q(G), \mathrm{GRN}_k(G), \mathrm{GRN}_v(G)
           \qquad (\text{three independent GRN-v3})
.. math::  a = \mathrm{Attn}(\mathrm{LN}_q(\tilde q), \mathrm{LN}_k(\tilde k),
           \mathrm{LN}_v(\tilde v)),\quad h = \mathrm{LN}_h(a + \tilde q),\quad
           o = \mathrm{MLP}(h) + a.

``o`` is the new stack entry (it does not contain ``q̃``). **Why DCA at init is vanilla:**
with b = 1, w = 0 every GRN returns the plain sum of the stack, which is exactly vanilla's
residual stream ``x``. So ``q̃ = k̃ = ṽ = x``; with ``LN_q = LN_k = LN_v = LN_1`` the attention
output is vanilla's ``a``; with ``LN_h = LN_2``, ``h = LN_2(x + a)`` is vanilla's MLP input;
and ``o = a + MLP(LN_2(x + a)) = f(x)``. The plain sum of the new stack, ``x + f(x)``, is the
vanilla block output, and the induction continues. :mod:`dca_theory.lm.retrofit` uses exactly
this parameter map.

**Precision.** Parameters, LayerNorm statistics and the softmax stay in the parameter dtype;
the inputs of every matmul are cast to ``compute_dtype`` (e.g. bfloat16; ``None``: the weights'
own dtype); attention scores and
the softmax use float32 (or float64 parameters), even when a trainer casts the weights
themselves to bfloat16. Branch outputs are cast back to the residual-stream dtype.

**Initialisation** (Flax lm1b): Xavier-uniform kernels, biases N(0, 1e-6²), LayerNorm scale 1
and bias 0. Attention projections have no bias; the ReLU MLP has biases. Dropout (rate
``dropout``) follows the attention output and each MLP layer; ``attn_dropout`` acts on the
attention probabilities (not broadcast over heads, as in Flax).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from dca_theory import random_draws as draws
from dca_theory.gates import KEY_SALT, LM_DEFAULT_GATE
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.fast.fused_grn import combine_and_norm
from dca_theory.lm.norm import at_least_float32, layer_norm
from dca_theory.residual import AbstractCombiner, make_combiner


def dtype_of(name: str) -> jnp.dtype:
    return jnp.dtype(name)


def matmul_dtype(compute_dtype: str | None, weight: Array) -> jnp.dtype:
    """``compute_dtype`` if set, else the weight's own dtype (so a trainer that casts the whole
    model to bfloat16 gets bfloat16 matmuls)."""
    return weight.dtype if compute_dtype is None else jnp.dtype(compute_dtype)


def xavier_uniform(key: PRNGKeyArray, fan_in: int, fan_out: int, dtype) -> Array:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return draws.uniform(key, (fan_in, fan_out), dtype, -limit, limit)


def small_bias(key: PRNGKeyArray, size: int, dtype) -> Array:
    # Flax lm1b's bias_init: normal(stddev=1e-6).
    return draws.normal(key, (size,), dtype, scale=1e-6)


def last_axis(p: Array, x: Array) -> Array:
    """Reshape a per-feature vector ``(D,)`` to broadcast against ``x (..., D)`` explicitly
    (tests run with ``jax_numpy_rank_promotion='raise'``)."""
    return p.reshape((1,) * (x.ndim - 1) + p.shape)


def dropout(x: Array, rate: float, key: PRNGKeyArray | None) -> Array:
    """Inverted dropout; the identity when ``key is None`` or ``rate == 0``."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def split_or_none(key: PRNGKeyArray | None, n: int) -> list[PRNGKeyArray | None]:
    return [None] * n if key is None else draws.split(key, n)


class LayerNorm(eqx.Module):
    """LayerNorm over the last axis; statistics in the parameter dtype (at least float32).

    Runs :func:`dca_theory.lm.norm.layer_norm` (a lean custom backward pass)."""

    scale: Float[Array, " D"]
    bias: Float[Array, " D"]
    eps: float = eqx.field(static=True)

    @classmethod
    def init(cls, dim: int, eps: float, dtype) -> LayerNorm:
        return cls(scale=jnp.ones((dim,), dtype), bias=jnp.zeros((dim,), dtype), eps=eps)

    def __call__(self, x: Float[Array, "*batch D"], out_dtype=None) -> Float[Array, "*batch D"]:
        stat_dtype = at_least_float32(self.scale.dtype)
        y = layer_norm(x, self.scale.astype(stat_dtype), self.bias.astype(stat_dtype),
                       self.eps, stat_dtype)
        return y.astype(out_dtype or self.scale.dtype)


class Attention(eqx.Module):
    """Multi-head dot-product attention without projection biases (Flax lm1b)."""

    w_q_DxD: Array
    w_k_DxD: Array
    w_v_DxD: Array
    w_o_DxD: Array
    n_heads: int = eqx.field(static=True)
    rate: float = eqx.field(static=True)
    compute_dtype: str | None = eqx.field(static=True)

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> Attention:
        d, dtype = cfg.d_model, dtype_of(cfg.param_dtype)
        kq, kk, kv, ko = draws.split(key, 4)
        return cls(
            w_q_DxD=xavier_uniform(kq, d, d, dtype), w_k_DxD=xavier_uniform(kk, d, d, dtype),
            w_v_DxD=xavier_uniform(kv, d, d, dtype), w_o_DxD=xavier_uniform(ko, d, d, dtype),
            n_heads=cfg.n_heads, rate=cfg.attn_dropout, compute_dtype=cfg.compute_dtype,
        )

    def __call__(
        self, xq_LxD: Array, xk_LxD: Array, xv_LxD: Array, *, causal: bool,
        key: PRNGKeyArray | None = None, mix_values: Callable[[Array], Array] | None = None,
    ) -> Float[Array, "L D"]:
        """``mix_values`` maps the projected values ``v_LxHxK`` before they are attended
        (value residual learning mixes in the first layer's values there)."""
        return self.forward(xq_LxD, xk_LxD, xv_LxD, causal=causal, key=key,
                            mix_values=mix_values)[0]

    def forward(
        self, xq_LxD: Array, xk_LxD: Array, xv_LxD: Array, *, causal: bool,
        key: PRNGKeyArray | None = None, mix_values: Callable[[Array], Array] | None = None,
        cache: tuple[Array, Array] | None = None, offset: Array | None = None,
    ) -> tuple[Float[Array, "L D"], Array, tuple[Array, Array] | None]:
        """``(output, values, cache)``: the attention output, the projected values before
        ``mix_values`` (value residual learning keeps the first layer's) and the updated cache.

        With ``cache = (keys_MxHxK, values_MxHxK)`` (``M = max_len`` rows) the ``L`` tokens sit
        at positions ``offset, …, offset + L - 1``: their key and value rows are written into
        the cache there and each query attends to the cached rows at positions up to its own
        (causal; rows not yet written are masked). Without a cache the keys and values are the
        inputs' own and ``causal`` masks the future. One code path for both, so the cached
        decode computes what the full pass computes."""
        # Scores and softmax in float32 at least, even if the weights were cast to bf16.
        cd = matmul_dtype(self.compute_dtype, self.w_q_DxD)
        acc = at_least_float32(self.w_q_DxD.dtype)
        L, D = xq_LxD.shape
        H = self.n_heads
        K = D // H

        def proj(x_LxD, w_DxD):
            return (x_LxD.astype(cd) @ w_DxD.astype(cd)).reshape(L, H, K)

        q_LxHxK = proj(xq_LxD, self.w_q_DxD)
        k_LxHxK = proj(xk_LxD, self.w_k_DxD)
        raw_LxHxK = proj(xv_LxD, self.w_v_DxD)
        v_LxHxK = raw_LxHxK if mix_values is None else mix_values(raw_LxHxK)
        q_pos = jnp.arange(L)
        if cache is not None:
            at = (offset, jnp.zeros_like(offset), jnp.zeros_like(offset))
            k_LxHxK = jax.lax.dynamic_update_slice(cache[0], k_LxHxK.astype(cache[0].dtype), at)
            v_LxHxK = jax.lax.dynamic_update_slice(cache[1], v_LxHxK.astype(cache[1].dtype), at)
            cache, causal = (k_LxHxK, v_LxHxK), True
            q_pos = jnp.arange(L, dtype=offset.dtype) + offset
        s_HxLxS = jnp.einsum("qhk,shk->hqs", q_LxHxK, k_LxHxK, preferred_element_type=acc)
        s_HxLxS = s_HxLxS / jnp.sqrt(jnp.asarray(K, acc))
        if causal:
            mask_LxS = jnp.arange(k_LxHxK.shape[0], dtype=q_pos.dtype)[None, :] <= q_pos[:, None]
            s_HxLxS = jnp.where(mask_LxS[None], s_HxLxS, jnp.finfo(acc).min)
        p_HxLxS = dropout(jax.nn.softmax(s_HxLxS, axis=-1), self.rate, key)
        o_LxHxK = jnp.einsum("hqs,shk->qhk", p_HxLxS.astype(cd), v_LxHxK)
        return o_LxHxK.reshape(L, D) @ self.w_o_DxD.astype(cd), raw_LxHxK, cache

    def project_values(self, xv_LxD: Array) -> Float[Array, "L H K"]:
        """The per-head values ``v_LxHxK`` this attention computes from ``xv_LxD``."""
        cd = matmul_dtype(self.compute_dtype, self.w_v_DxD)
        return (xv_LxD.astype(cd) @ self.w_v_DxD.astype(cd)).reshape(
            xv_LxD.shape[0], self.n_heads, -1)


class MLP(eqx.Module):
    """Dense(F) → ReLU → dropout → Dense(D) → dropout, with biases (Flax lm1b ``MlpBlock``)."""

    w_in_DxF: Array
    b_in_F: Array
    w_out_FxD: Array
    b_out_D: Array
    rate: float = eqx.field(static=True)
    compute_dtype: str | None = eqx.field(static=True)

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> MLP:
        d, f, dtype = cfg.d_model, cfg.d_mlp, dtype_of(cfg.param_dtype)
        k1, k2, k3, k4 = draws.split(key, 4)
        return cls(
            w_in_DxF=xavier_uniform(k1, d, f, dtype), b_in_F=small_bias(k2, f, dtype),
            w_out_FxD=xavier_uniform(k3, f, d, dtype), b_out_D=small_bias(k4, d, dtype),
            rate=cfg.dropout, compute_dtype=cfg.compute_dtype,
        )

    def __call__(self, x_LxD: Array, *, key: PRNGKeyArray | None = None) -> Float[Array, "L D"]:
        cd = matmul_dtype(self.compute_dtype, self.w_in_DxF)
        k1, k2 = split_or_none(key, 2)
        h_LxF = x_LxD.astype(cd) @ self.w_in_DxF.astype(cd)
        h_LxF = jax.nn.relu(h_LxF + last_axis(self.b_in_F.astype(cd), h_LxF))
        h_LxF = dropout(h_LxF, self.rate, k1)
        y_LxD = h_LxF @ self.w_out_FxD.astype(cd)
        return dropout(y_LxD + last_axis(self.b_out_D.astype(cd), y_LxD), self.rate, k2)


class PreLNBlock(eqx.Module):
    """The vanilla pre-LN block, exposed as its residual branch ``f(x) = a + MLP(LN2(x + a))``."""

    ln1: LayerNorm
    attn: Attention
    ln2: LayerNorm
    mlp: MLP
    rate: float = eqx.field(static=True)

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> PreLNBlock:
        ka, km = draws.split(key)
        dtype = dtype_of(cfg.param_dtype)
        return cls(
            ln1=LayerNorm.init(cfg.d_model, cfg.ln_eps, dtype), attn=Attention.init(cfg, key=ka),
            ln2=LayerNorm.init(cfg.d_model, cfg.ln_eps, dtype), mlp=MLP.init(cfg, key=km),
            rate=cfg.dropout,
        )

    def branch(
        self, x_LxD: Array, *, causal: bool, key: PRNGKeyArray | None = None
    ) -> Float[Array, "L D"]:
        """The residual branch f(x); the block output is ``x + f(x)``."""
        k_att, k_drop, k_mlp = split_or_none(key, 3)
        xn_LxD = self.ln1(x_LxD)
        a_LxD = self.attn(xn_LxD, xn_LxD, xn_LxD, causal=causal, key=k_att)
        a_LxD = dropout(a_LxD, self.rate, k_drop).astype(x_LxD.dtype)
        m_LxD = self.mlp(self.ln2(x_LxD + a_LxD), key=k_mlp).astype(x_LxD.dtype)
        return a_LxD + m_LxD

    def __call__(
        self, x_LxD: Array, *, causal: bool, key: PRNGKeyArray | None = None
    ) -> Float[Array, "L D"]:
        return x_LxD + self.branch(x_LxD, causal=causal, key=key)


class DCABlock(eqx.Module):
    """DCA decoder block (Figure 4): three GRN-v3 over the stack give q̃, k̃, ṽ."""

    grn_q: AbstractCombiner
    grn_k: AbstractCombiner
    grn_v: AbstractCombiner
    ln_q: LayerNorm
    ln_k: LayerNorm
    ln_v: LayerNorm
    attn: Attention
    ln_h: LayerNorm
    mlp: MLP
    rate: float = eqx.field(static=True)

    @classmethod
    def init(cls, cfg: ModelConfig, stack_size: int, *, key: PRNGKeyArray) -> DCABlock:
        return cls.from_pre_ln(PreLNBlock.init(cfg, key=key), stack_size, gate=cfg.grn_gate,
                               key=jax.random.fold_in(key, KEY_SALT))

    @classmethod
    def from_pre_ln(cls, block: PreLNBlock, stack_size: int, *, gate: str = LM_DEFAULT_GATE,
                    key: PRNGKeyArray | None = None) -> DCABlock:
        """The DCA block computing the same function as ``block`` when its GRNs are at init
        (b = 1, w = 0): LN_q = LN_k = LN_v = LN_1 and LN_h = LN_2 (see the module docstring).
        ``key`` draws w for a gate that starts it at random (``small_init``)."""
        dim = block.ln1.scale.shape[0]
        dtype = block.ln1.scale.dtype
        keys = (None,) * 3 if key is None else tuple(jax.random.split(key, 3))
        grn = [make_combiner("grn_v3", stack_size, dim, dtype=dtype, gate=gate, key=k)
               for k in keys]
        return cls(
            grn_q=grn[0], grn_k=grn[1], grn_v=grn[2],
            ln_q=block.ln1, ln_k=block.ln1, ln_v=block.ln1, attn=block.attn,
            ln_h=block.ln2, mlp=block.mlp, rate=block.rate,
        )

    def attention_inputs(self, stack: Array | tuple[Array, ...], *, grn_impl: str = "fused"):
        """``((LN_q(q̃), LN_k(k̃), LN_v(ṽ)), (q̃, k̃, ṽ), entries)`` from the stack, given as an
        ``S×L×D`` array or a tuple of entries: three :class:`AbstractCombiner` calls on the stacked
        entries, then the three LayerNorms. ``entries`` is the stack's tuple of entries, to
        read the stack through from now on. ``grn_impl`` picks the path (same values and
        gradients; the fused one is described in :mod:`dca_theory.lm.fast.fused_grn`).
        """
        grns, norms = (self.grn_q, self.grn_k, self.grn_v), (self.ln_q, self.ln_k, self.ln_v)
        return combine_and_norm(grns, norms, stack, grn_impl)

    def apply(
        self, stack: Array | tuple[Array, ...], *, causal: bool,
        key: PRNGKeyArray | None = None, grn_impl: str = "fused",
    ) -> tuple[Float[Array, "L D"], Float[Array, "L D"], tuple[Array, ...] | Array]:
        """``(o, q̃, entries)``: the new stack entry, the query input and the stack's entries
        (to read the stack through from now on; see :meth:`attention_inputs`; a stack given
        as an array comes back as it is on the reference path)."""
        k_att, k_drop, k_mlp = split_or_none(key, 3)
        (qn_LxD, kn_LxD, vn_LxD), (q_LxD, _, _), entries = self.attention_inputs(
            stack, grn_impl=grn_impl)
        a_LxD = self.attn(qn_LxD, kn_LxD, vn_LxD, causal=causal, key=k_att)
        a_LxD = dropout(a_LxD, self.rate, k_drop).astype(q_LxD.dtype)
        h_LxD = self.ln_h(a_LxD + q_LxD)
        o_LxD = self.mlp(h_LxD, key=k_mlp).astype(q_LxD.dtype) + a_LxD
        return o_LxD, q_LxD, entries

    def __call__(
        self, stack: Array | tuple[Array, ...], *, causal: bool,
        key: PRNGKeyArray | None = None, grn_impl: str = "fused",
    ) -> tuple[Float[Array, "L D"], Float[Array, "L D"]]:
        """Return ``(o, q̃)``: the new stack entry and the query input (for analysis)."""
        return self.apply(stack, causal=causal, key=key, grn_impl=grn_impl)[:2]
