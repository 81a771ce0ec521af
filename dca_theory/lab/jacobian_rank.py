r"""Per-layer Jacobian rank of a trained LM's residual branches (reviewers' request on Table 2).

The paper explains Table 2's shrinking DCA gain by the theory's "gain falls as the collective
rank rises" (Theorem 4.3(ii), ``dca-paper.md`` §1.5, §1.9, §8) and *argues* that the bottleneck
rank of a layer equals the width; it never measures it. Here we estimate it.

**The object.** Block ``t`` adds the residual branch ``f_t`` to the stack; for a pre-LN block
(and DCA's body, Figure 4) with query / key / value inputs ``q, k, v`` (``L×D``)

.. math::  a = \mathrm{Attn}(\mathrm{LN}_q q, \mathrm{LN}_k k, \mathrm{LN}_v v),\qquad
           f = a + \mathrm{MLP}(\mathrm{LN}_h(q + a)).

Vanilla: ``q = k = v =`` the residual stream, ``LN_q = LN_k = LN_v = LN_1``, ``LN_h = LN_2``
(exactly :meth:`PreLNBlock.branch`). DCA: ``q, k, v`` are the three GRN-v3 outputs of the
stack (exactly the ``o`` of :class:`DCABlock`). The branch mixes positions (attention), so the
per-token residual function is the *diagonal block* of its Jacobian:

.. math::  J_t(i) = \partial f_t(q + e_i u,\, k + e_i u,\, v + e_i u)_i / \partial u
           \;\in R^{D\times D},

the response of token ``i``'s branch output to a shift of token ``i``'s input, every other
position held fixed. For vanilla this is the ``D×D`` Jacobian of ``blk.branch`` at token ``i``;
for DCA the same shift is applied to ``q̃, k̃, ṽ`` together (the "tied" Jacobian
``J_q + J_k + J_v``, which equals vanilla's at DCA's initialisation). No identity is
subtracted: the skip path is not part of ``f_t``.

**Estimates** (:mod:`dca_theory.sim.rank`, reused): per position the numerical rank at the
default tolerance ``σ_max · D · eps(float32)`` and at ``rtol = 1e-2`` (singular values above 1%
of the largest), the effective rank (entropy) and the stable rank; per layer the maximum (the
Jacobian rank :math:`\max_x \mathrm{rank} J(x)`, a lower bound on the bottleneck rank) and the
mean over positions. Positions are drawn from validation text.

**Cost.** One ``jacfwd`` with ``D`` tangents per position; only the attention runs over the whole
sequence, the MLP only at token ``i``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from dca_theory.lab.analysis import residual_states
from dca_theory.lm.blocks import DCABlock, PreLNBlock
from dca_theory.sim.rank import JacobianRank
from dca_theory.spectra import effective_rank, numerical_rank, singular_values, stable_rank

RTOL = 1e-2  # the "structural" rank: singular values above 1% of the largest


def branch_parts(blk) -> tuple:
    """``(LN_q, LN_k, LN_v, Attn, LN_h, MLP)`` of a pre-LN or DCA block (see module doc)."""
    if isinstance(blk, DCABlock):
        return blk.ln_q, blk.ln_k, blk.ln_v, blk.attn, blk.ln_h, blk.mlp
    if isinstance(blk, PreLNBlock):
        return blk.ln1, blk.ln1, blk.ln1, blk.attn, blk.ln2, blk.mlp
    raise ValueError(f"unsupported block type {type(blk).__name__}; valid: PreLNBlock, DCABlock")


def branch_at(parts: tuple, q_LxD: Array, k_LxD: Array, v_LxD: Array,
              i: Int[Array, ""]) -> Float[Array, " D"]:
    """The branch output ``f_i`` at token ``i`` (causal attention over the whole sequence)."""
    ln_q, ln_k, ln_v, attn, ln_h, mlp = parts
    a_LxD = attn(ln_q(q_LxD), ln_k(k_LxD), ln_v(v_LxD), causal=True)
    a_D = a_LxD[i].astype(q_LxD.dtype)
    # the MLP is per token: run it on token i only (same function, 1/L of the cost)
    return a_D + mlp(ln_h(q_LxD[i] + a_D)[None])[0].astype(q_LxD.dtype)


@eqx.filter_jit
def token_jacobians(parts: tuple, q_NxLxD: Array, k_NxLxD: Array, v_NxLxD: Array,
                    positions_N: Int[Array, " N"]) -> Float[Array, "N D D"]:
    """``J(i_n)`` (module doc) of window ``n`` at position ``positions_N[n]``, for every n."""
    _, L, D = q_NxLxD.shape

    def one(args):
        q_LxD, k_LxD, v_LxD, i = args

        def f(u_D):
            shift_LxD = jnp.where((jnp.arange(L) == i)[:, None], u_D[None, :], 0.0)
            return branch_at(parts, q_LxD + shift_LxD, k_LxD + shift_LxD, v_LxD + shift_LxD, i)

        return jax.jacfwd(f)(jnp.zeros((D,), q_LxD.dtype))

    # a few windows at a time: D tangents x L x D per window would not fit all at once
    return jax.lax.map(one, (q_NxLxD, k_NxLxD, v_NxLxD, positions_N), batch_size=8)


def block_inputs(model, tokens_L) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(q, k, v)`` each block's branch reads, from one forward pass over ``tokens_L``
    (per-block models: ``layer_loop="unroll"``)."""
    if model.cfg.layer_loop != "unroll":
        raise ValueError(f"the Jacobian analyses read per-block models, got layer_loop="
                         f"{model.cfg.layer_loop!r}; valid: 'unroll'")
    states = residual_states(model, jnp.asarray(tokens_L))
    out = []
    for t, blk in enumerate(model.trunk.blocks):
        if isinstance(blk, DCABlock):
            stack = jnp.asarray(states[f"stack_{t}"])
            out.append(tuple(np.asarray(g(stack)) for g in (blk.grn_q, blk.grn_k, blk.grn_v)))
        else:  # vanilla / GRN kinds: q = k = v = the block input
            x = states[f"block_{t}_in"]
            out.append((x, x, x))
    return out


def layer_jacobians(model, windows_NxL: np.ndarray, positions_N: np.ndarray) -> list[np.ndarray]:
    """Per block, ``J(i)`` at ``positions_N[n]`` of validation window ``n`` (``N×D×D``)."""
    inputs = [block_inputs(model, w) for w in windows_NxL]  # [window][block] -> (q, k, v)
    out = []
    for t, blk in enumerate(model.trunk.blocks):
        q, k, v = (np.stack([inp[t][j] for inp in inputs]) for j in range(3))
        out.append(np.asarray(token_jacobians(branch_parts(blk), q, k, v,
                                              jnp.asarray(positions_N))))
    return out


def rank_stats(jac_NxDxD: np.ndarray, rtol: float = RTOL) -> dict:
    """Rank estimates of one layer's Jacobians, absolute and divided by the width ``D``."""
    d = jac_NxDxD.shape[-1]
    at_eps = JacobianRank(rank=int(numerical_rank(jac_NxDxD).max()),
                          ranks=numerical_rank(jac_NxDxD), tol="sigma_max*D*eps(float32)",
                          effective_ranks=effective_rank(jac_NxDxD),
                          singular_values=singular_values(jac_NxDxD))
    ranks_rtol = numerical_rank(jac_NxDxD, rtol=rtol)
    stable = stable_rank(jac_NxDxD)
    out = {"width": d, "n_positions": int(jac_NxDxD.shape[0]),
           "rank_eps_max": at_eps.rank, "rank_eps_mean": float(at_eps.ranks.mean()),
           "rank_rtol_max": int(ranks_rtol.max()), "rank_rtol_mean": float(ranks_rtol.mean()),
           "effective_rank_mean": float(at_eps.effective_ranks.mean()),
           "stable_rank_mean": float(stable.mean()), "rtol": rtol,
           "mean_spectrum": (at_eps.mean_spectrum / at_eps.mean_spectrum[0]).tolist()}
    for key in ("rank_eps_max", "rank_eps_mean", "rank_rtol_max", "rank_rtol_mean",
                "effective_rank_mean", "stable_rank_mean"):
        out[f"{key}_frac"] = out[key] / d
    return out


def sample_positions(valid_tokens: np.ndarray, seq_len: int, n: int,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random validation windows of ``seq_len`` tokens and one random position in each
    (uniform over the window, so contexts of every length appear)."""
    if n < 1:
        raise ValueError(f"number of positions must be >= 1, got {n}")
    if len(valid_tokens) <= seq_len:
        raise ValueError(f"seq_len {seq_len} exceeds the validation split "
                         f"({len(valid_tokens)} tokens)")
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(valid_tokens) - seq_len, size=n)
    windows = valid_tokens[starts[:, None] + np.arange(seq_len)[None, :]]
    return windows, rng.integers(0, seq_len, size=n)


def model_rank_profile(model, valid_tokens: np.ndarray, seq_len: int, n: int,
                       seed: int = 0) -> list[dict]:
    """:func:`rank_stats` for every block of ``model`` (``layer`` 0-based)."""
    windows, positions = sample_positions(valid_tokens, seq_len, n, seed)
    return [{"layer": t, **rank_stats(j)}
            for t, j in enumerate(layer_jacobians(model, windows, positions))]
