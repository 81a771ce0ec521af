r"""The decoder-only transformer LM: embeddings → trunk (causal) → final LayerNorm → logits.

Shape legend for every ``lm/`` module (nanodo-style suffixes, e.g. ``x_LxD``):

====  ==============================================  ====  ==========================
B     batch                                           K     head width ``D / H``
L     sequence length                                 F     MLP width
D     model width (``d_model``)                       V     vocabulary
H     attention heads                                 S     residual-stack size
N     hyper-connection streams (``hc_expansion``)     R     LAuReL rank
====  ==============================================  ====  ==========================

The recipe is the Flax lm1b example (the paper's baseline, ``dca-paper.md`` §3.3): token
embeddings N(0, 1) (not scaled), plus fixed sinusoidal positions (Flax ``sinusoidal_init``:
sines in the first D/2 features, cosines in the second), embedding dropout, the residual
trunk of :mod:`dca_theory.lm.trunk` with a causal mask, a final LayerNorm and an *untied*
output Dense layer with bias. Positions are computed on the fly, so they are not parameters.

The model maps ONE sequence ``tokens_L`` to ``logits_LxV``; ``logits[i]`` scores the token
at position ``i + 1`` (the caller shifts targets; the model does not shift its input).
Batch with ``jax.vmap``. Dropout is active iff ``not inference and key is not None``.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from dca_theory import random_draws as draws
from dca_theory.lm.blocks import (
    LayerNorm,
    dropout,
    dtype_of,
    last_axis,
    matmul_dtype,
    small_bias,
    xavier_uniform,
)
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.trunk import AbstractTrunk, States
from dca_theory.lm.trunks import Trunk


def sinusoidal_positions(length: int, dim: int, dtype=jnp.float32) -> Float[Array, "L D"]:
    """Flax lm1b's fixed sinusoidal table (``min_scale=1``, ``max_scale=1e4``)."""
    half = dim // 2
    position = np.arange(length, dtype=np.float64)[:, None]
    scale = -math.log(1e4) / max(half - 1, 1)
    div = np.exp(np.arange(half, dtype=np.float64) * scale)[None, :]
    pe = np.zeros((length, dim))
    pe[:, :half] = np.sin(position * div)
    pe[:, half: 2 * half] = np.cos(position * div)
    return jnp.asarray(pe, dtype)


class TransformerLM(eqx.Module):
    """Token embeddings + sinusoidal positions → :class:`Trunk` → LayerNorm → Dense(V)."""

    cfg: ModelConfig = eqx.field(static=True)
    embed_VxD: Array
    trunk: AbstractTrunk
    final_norm: LayerNorm
    w_out_DxV: Array
    b_out_V: Array

    def embed(
        self, tokens_L: Int[Array, " L"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "L D"]:
        """Token embeddings plus positions, then dropout (the trunk input)."""
        (L,) = tokens_L.shape
        if L > self.cfg.max_len:
            raise ValueError(f"sequence length {L} exceeds max_len={self.cfg.max_len}")
        x_LxD = jnp.take(self.embed_VxD, tokens_L, axis=0)
        x_LxD = x_LxD + sinusoidal_positions(L, self.cfg.d_model, x_LxD.dtype)
        return dropout(x_LxD, self.cfg.dropout, key)

    def head(self, h_LxD: Float[Array, "L D"]) -> Float[Array, "L V"]:
        """Final LayerNorm and the untied output layer; logits in the parameter dtype."""
        cd = matmul_dtype(self.cfg.compute_dtype, self.w_out_DxV)
        y_LxV = self.final_norm(h_LxD).astype(cd) @ self.w_out_DxV.astype(cd)
        y_LxV = y_LxV.astype(self.w_out_DxV.dtype)
        return y_LxV + last_axis(self.b_out_V, y_LxV)

    def forward_with_states(
        self, tokens_L: Int[Array, " L"], *, key: PRNGKeyArray | None = None,
        inference: bool = False,
    ) -> tuple[Float[Array, "L V"], States]:
        """Logits and the per-layer residual-stream states (see :mod:`dca_theory.lm.trunk`)."""
        key = None if inference else key
        k_emb, k_trunk = (None, None) if key is None else jax.random.split(key)
        h_LxD, states = self.trunk.forward_with_states(
            self.embed(tokens_L, key=k_emb), causal=True, key=k_trunk
        )
        return self.head(h_LxD), states

    def apply_embedded(
        self, x_LxD: Float[Array, "L D"], *, key: PRNGKeyArray | None = None,
        inference: bool = False,
    ) -> Float[Array, "L V"]:
        """Logits from a trunk input (embeddings + positions); used for gradient tests."""
        return self.head(self.trunk(x_LxD, causal=True, key=key, inference=inference))

    def __call__(
        self, tokens_L: Int[Array, " L"], *, key: PRNGKeyArray | None = None,
        inference: bool = False,
    ) -> Float[Array, "L V"]:
        key = None if inference else key
        k_emb, k_trunk = (None, None) if key is None else jax.random.split(key)
        return self.apply_embedded(self.embed(tokens_L, key=k_emb), key=k_trunk)


def build_model(cfg: ModelConfig, *, key: PRNGKeyArray) -> TransformerLM:
    """Initialise a model (Flax lm1b init). Models of any residual kind built from the same
    key share their embeddings, block weights and output layer."""
    dtype = dtype_of(cfg.param_dtype)
    k_emb, k_trunk, k_out, k_bias = draws.split(key, 4)
    return TransformerLM(
        cfg=cfg,
        embed_VxD=draws.normal(k_emb, (cfg.vocab_size, cfg.d_model), dtype),
        trunk=Trunk(cfg, key=k_trunk),
        final_norm=LayerNorm.init(cfg.d_model, cfg.ln_eps, dtype),
        w_out_DxV=xavier_uniform(k_out, cfg.d_model, cfg.vocab_size, dtype),
        b_out_V=small_bias(k_bias, cfg.vocab_size, dtype),
    )
