r"""The MLP-ResNet of Proposition 4.5 (``dca-paper.md`` §1.9).

Layer :math:`t` is :math:`f_t(z) = V_t\,\varphi(U_t z)` with :math:`U_t \in \mathbb{R}^{r_t\times
d}` and :math:`V_t \in \mathbb{R}^{d\times r_t}`, so the Jacobian of every layer has rank at most
:math:`r_t` and (Prop. 4.5) the model minus its input-slot term has bottleneck rank at most
:math:`r_* = \sum_t r_t`. Widths can be padded (see :mod:`dca_theory.nets._common`).
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from dca_theory import random_draws as draws
from dca_theory.gates import DEFAULT_GATE, KEY_SALT
from dca_theory.nets._common import (
    ResidualNet,
    check_dims,
    make_combiners,
    rank_array,
    rank_mask,
)
from dca_theory.residual import AbstractCombiner, check_k, check_kind

ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu, "tanh": jnp.tanh}


class MLPResNet(ResidualNet):
    """T one-hidden-layer blocks ``V_t φ(U_t z)`` of width r_t, joined residually.

    Args:
        dim: feature dimension d.
        widths: hidden width r_t of every block (one int, T ints, or traced under vmap).
        depth: number of blocks T.
        kind: residual kind (``base``, ``res``, ``grn_v1``, ``grn_v2``, ``grn_v3``, ``attn_res``).
        k: optional k-DCA window.
        gate: GRN-v3's gate (:mod:`dca_theory.gates`; default ``bias_inside``).
        activation: ``gelu`` (default: smooth, no dead units, so the Jacobian of a block has
            rank exactly r_t generically), ``relu`` or ``tanh``.
        pad_to: stored width (>= max width).
        key: PRNG key.

    Init: U ~ N(0, 1/d) (unit-variance pre-activations), V ~ N(0, 1/(r_t T)) so that the sum
    of the T branches starts at O(1) whatever the width.
    """

    U: Float[Array, "T r d"]
    V: Float[Array, "T d r"]
    mask: Bool[Array, "T r"]
    combiners: tuple[AbstractCombiner, ...]
    kind: str = eqx.field(static=True)
    k: int | None = eqx.field(static=True)
    activation: str = eqx.field(static=True)

    def __init__(
        self,
        dim: int,
        widths: int | Sequence[int] | Array,
        depth: int,
        *,
        kind: str = "res",
        k: int | None = None,
        gate: str = DEFAULT_GATE,
        activation: str = "gelu",
        pad_to: int | None = None,
        dtype=jnp.float32,
        key: Array,
    ):
        check_dims(dim, depth)
        check_kind(kind)
        check_k(k)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
        r, width = rank_array(widths, depth, dim, pad_to)
        ku, kv = jax.random.split(key)
        self.mask = rank_mask(r, width)
        m = self.mask.astype(dtype)
        v_std = 1.0 / jnp.sqrt(jnp.maximum(r, 1).astype(dtype) * depth)
        self.U = draws.normal(ku, (depth, width, dim), dtype, scale=dim**-0.5) * m[:, :, None]
        self.V = (
            v_std[:, None, None] * draws.normal(kv, (depth, dim, width), dtype) * m[:, None, :]
        )
        self.combiners = make_combiners(kind, depth, dim, k, dtype,
                                        key=jax.random.fold_in(key, KEY_SALT), gate=gate)
        self.kind, self.k, self.activation = kind, k, activation

    @property
    def depth(self) -> int:
        return self.U.shape[0]

    @property
    def dim(self) -> int:
        return self.U.shape[2]

    def _layer(self, t: int, g: Float[Array, " d"]) -> Float[Array, " d"]:
        m = jax.lax.stop_gradient(self.mask[t]).astype(g.dtype)
        hidden = ACTIVATIONS[self.activation](self.U[t] @ g) * m
        return self.V[t] @ hidden
