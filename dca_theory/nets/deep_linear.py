r"""The low-rank deep linear network of Section 4.1 (``dca-paper.md`` §1.1).

Layer :math:`t` is :math:`f_t(z) = V_t z` with the factored weight :math:`V_t = P_t Q_t^\top`,
:math:`P_t, Q_t \in \mathbb{R}^{d\times r_t}`, so :math:`\mathrm{rank}\,V_t \le r_t` always
holds; the collective rank is :math:`r_* = \sum_t r_t`. The residual kind chooses the class of
Theorem 4.1: ``base`` gives :math:`\prod_t V_t`, ``res`` gives :math:`\prod_t (I + V_t)`,
``grn_v1``/``grn_v2`` give :math:`\alpha I + M` / :math:`D + M` with :math:`\mathrm{rank}\,M \le
r_*`. ``grn_v3`` adds the input-dependent gate and is no longer linear; ``attn_res`` (softmax
weights over the stack) is not linear either (:mod:`dca_theory.theory.rivals`).
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
from dca_theory.residual import AbstractCombiner, check_k, check_kind, linear_kinds


class DeepLinear(ResidualNet):
    """T factored linear layers joined by a residual combination of any kind.

    Args:
        dim: feature dimension d.
        ranks: rank r_t of every layer (one int or T ints; a traced array under vmap).
        depth: number of layers T.
        kind: ``base``, ``res``, ``grn_v1``, ``grn_v2``, ``grn_v3`` or ``attn_res``.
        k: optional k-DCA window (``None``: the full stack).
        gate: GRN-v3's gate (:mod:`dca_theory.gates`; default ``bias_inside``).
        init_std: std of the entries of P_t and Q_t (default ``d**-0.5``: each V_t then has
            O(1) singular values, the scale at which the factorisation matters).
        pad_to: stored width (>= max rank) so nets of different ranks share one shape.
        key: PRNG key.
    """

    P: Float[Array, "T d r"]
    Q: Float[Array, "T d r"]
    mask: Bool[Array, "T r"]
    combiners: tuple[AbstractCombiner, ...]
    kind: str = eqx.field(static=True)
    k: int | None = eqx.field(static=True)

    def __init__(
        self,
        dim: int,
        ranks: int | Sequence[int] | Array,
        depth: int,
        *,
        kind: str = "res",
        k: int | None = None,
        gate: str = DEFAULT_GATE,
        init_std: float | None = None,
        pad_to: int | None = None,
        dtype=jnp.float32,
        key: Array,
    ):
        check_dims(dim, depth)
        check_kind(kind)
        check_k(k)
        r, width = rank_array(ranks, depth, dim, pad_to)
        std = dim**-0.5 if init_std is None else init_std
        kp, kq = jax.random.split(key)
        self.mask = rank_mask(r, width)
        m = self.mask.astype(dtype)[:, None, :]
        self.P = draws.normal(kp, (depth, dim, width), dtype, scale=std) * m
        self.Q = draws.normal(kq, (depth, dim, width), dtype, scale=std) * m
        self.combiners = make_combiners(kind, depth, dim, k, dtype,
                                        key=jax.random.fold_in(key, KEY_SALT), gate=gate)
        self.kind, self.k = kind, k

    @property
    def depth(self) -> int:
        return self.P.shape[0]

    @property
    def dim(self) -> int:
        return self.P.shape[1]

    def _layer(self, t: int, g: Float[Array, " d"]) -> Float[Array, " d"]:
        m = jax.lax.stop_gradient(self.mask[t]).astype(g.dtype)
        return (self.P[t] * m[None, :]) @ ((self.Q[t] * m[None, :]).T @ g)

    def layer_matrices(self) -> Float[Array, "T d d"]:
        """The layer weights V_t = P_t Q_t^T (masked)."""
        m = self.mask.astype(self.P.dtype)[:, None, :]
        return jnp.einsum("tdr,ter->tde", self.P * m, self.Q * m)

    @property
    def linear(self) -> bool:
        """Whether the net is one linear map: every combiner's coefficients are constant."""
        return all(c.linear for c in self.combiners)

    def end_to_end_matrix(self) -> Float[Array, "d d"]:
        """The matrix Â with f(x) = Â x (kinds whose combiners are linear: not a gated
        ``grn_v3``, not ``attn_res``)."""
        if not self.linear:
            raise ValueError(f"end_to_end_matrix: kind {self.kind!r} is not linear (its "
                             "combiners' weights depend on the input); valid kinds: "
                             f"{', '.join(linear_kinds())}")
        eye = jnp.eye(self.dim, dtype=self.P.dtype)
        return jax.vmap(self)(eye).T  # column j is f(e_j)
