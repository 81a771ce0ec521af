r"""Per-layer Jacobian rank of a trained LM's residual branches (reviewers' request on Table 2).

The paper explains Table 2's shrinking DCA gain by the theory's "gain falls as the collective
rank rises" (Theorem 4.3(ii), ``dca-paper.md`` §1.5, §1.9, §8) and *argues* that the bottleneck
rank of a layer equals the width; it never measures it. Here we estimate it.

**The object.** Block ``t`` adds the residual branch ``f_t`` to the state. Every kind runs
the one pre-LN block of :mod:`dca_theory.lm.driver`, handed by its mixer the query, key, value
and MLP-residual inputs ``q, k, v, r`` (``L×D``; ``k, v, r`` default to ``q``) and the key/value
LayerNorms (the block's ``LN_1`` unless the mixer has its own):

.. math::  a = \mathrm{Attn}(\mathrm{LN}_1 q, \mathrm{LN}_k k, \mathrm{LN}_v v),\qquad
           f = a + \mathrm{MLP}(\mathrm{LN}_2(r + a)).

Vanilla and the GRN kinds: ``q = k = v = r =`` the block input (exactly
:meth:`PreLNBlock.branch`). DCA: ``q, k, v`` are the three GRN-v3 outputs of the stack and
``r = q`` (exactly the ``o`` of Figure 4). MUDDFormer: its four streams. The branch mixes
positions (attention), so the per-token residual function is the *diagonal block* of its
Jacobian:

.. math::  J_t(i) = \partial f_t(q + e_i u,\, k + e_i u,\, v + e_i u,\, r + e_i u)_i
           / \partial u \;\in R^{D\times D},

the response of token ``i``'s branch output to a shift of token ``i``'s inputs, every other
position held fixed. For vanilla this is the ``D×D`` Jacobian of ``blk.branch`` at token ``i``;
where the inputs differ (DCA, MUDDFormer) the same shift is applied to all of them (the "tied"
Jacobian ``J_q + J_k + J_v (+ J_r)``, which for DCA equals vanilla's at DCA's initialisation).
No identity is subtracted: the skip path is not part of ``f_t``.

**Where the branch comes from.** One code path for every kind: the model's trunk in the
stacked layout (:class:`~dca_theory.lm.scanned.ScannedTrunk`; a per-block trunk is converted
exactly by :meth:`~dca_theory.lm.scanned.ScannedTrunk.from_trunk`), one collecting pass of the
driver per window, whose records hold each block's inputs
(:func:`~dca_theory.lm.driver.branch_inputs`), and the block's parts from layer ``t`` of the
stacked blocks. Kinds whose mixer hands the block a hook (``Mixer.hooks_block``: the branch
reads the state beyond ``q, k, v, r``) are refused.

**Estimates** (:mod:`dca_theory.sim.rank`, reused): per position the numerical rank at the
default tolerance ``σ_max · D · eps(float32)`` and at ``rtol = 1e-2`` (singular values above 1%
of the largest), the effective rank (entropy) and the stable rank; per layer the maximum (the
Jacobian rank :math:`\max_x \mathrm{rank} J(x)`, a lower bound on the bottleneck rank) and the
mean over positions. Positions are drawn from validation text.

**Cost.** One ``jacfwd`` with ``D`` tangents per position; only the attention runs over the whole
sequence, the MLP only at token ``i``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from dca_theory import schemes
from dca_theory.lab.analysis import stacked_trunk
from dca_theory.lm.driver import layer_of, run_trunk
from dca_theory.lm.zoo import mixer_class
from dca_theory.sim.rank import JacobianRank
from dca_theory.spectra import effective_rank, numerical_rank, singular_values, stable_rank

RTOL = 1e-2  # the "structural" rank: singular values above 1% of the largest


class Branch(NamedTuple):
    """Block t's residual branch (module doc): its parts ``(LN_1, LN_k, LN_v, Attn, LN_2,
    MLP)`` and the inputs it reads, ``L×D`` for one window or ``N×L×D`` for ``N``."""

    parts: tuple
    q: Any
    k: Any
    v: Any
    r: Any


def scanned_model(model):
    """``model`` with its trunk in the stacked layout (converted exactly if per-block), and
    refused in one line if its kind's block reads more than ``q, k, v, r``."""
    kind = model.cfg.residual
    if mixer_class(kind).hooks_block:
        valid = [s.name for s in schemes.SCHEMES
                 if s.mixer and not mixer_class(s.name).hooks_block]
        raise ValueError(f"the branch Jacobian analyses read a block's q/k/v/r inputs only; "
                         f"residual {kind!r} hands its block a hook; valid: {', '.join(valid)}")
    return eqx.tree_at(lambda m: m.trunk, model, stacked_trunk(model.trunk))


@eqx.filter_jit
def _block_ios(model, tokens_L: Int[Array, " L"]):
    """Every block's :func:`~dca_theory.lm.driver.branch_inputs`, stacked over layers."""
    trunk = model.trunk
    _, records = run_trunk(trunk.blocks, trunk.mixer, model.embed(tokens_L), causal=True,
                           key=None, collect=True)
    return records["io"]


def _branches(scanned, tokens_L) -> list[Branch]:
    ios = _block_ios(scanned, jnp.asarray(tokens_L))
    if ios is None:  # a mixer handing hooks without declaring hooks_block
        raise TypeError(f"{type(scanned.trunk.mixer).__name__} hands its block a hook: "
                        "set hooks_block = True")
    out = []
    for t in range(scanned.cfg.n_layers):
        blk, io = layer_of(scanned.trunk.blocks, t), layer_of(ios, t)
        ln_k, ln_v = io.kv_norms or (blk.ln1, blk.ln1)
        q = np.asarray(io.q)
        k, v, r = (q if x is None else np.asarray(x) for x in (io.k, io.v, io.r))
        out.append(Branch((blk.ln1, ln_k, ln_v, blk.attn, blk.ln2, blk.mlp), q, k, v, r))
    return out


def block_inputs(model, tokens_L) -> list[Branch]:
    """Every block's :class:`Branch`, its inputs from one forward pass over ``tokens_L``."""
    return _branches(scanned_model(model), tokens_L)


def layer_branches(model, windows_NxL: np.ndarray) -> list[Branch]:
    """Every block's :class:`Branch` with its inputs stacked over the windows (``N×L×D``)."""
    scanned = scanned_model(model)
    per_window = [_branches(scanned, w) for w in windows_NxL]  # [window][block]
    return [Branch(first.parts, *(np.stack([getattr(w[t], f) for w in per_window])
                                  for f in ("q", "k", "v", "r")))
            for t, first in enumerate(per_window[0])]


def branch_at(branch: Branch, i: Int[Array, ""]) -> Float[Array, " D"]:
    """The branch output ``f_i`` at token ``i`` (causal attention over the whole sequence)."""
    ln_q, ln_k, ln_v, attn, ln_h, mlp = branch.parts
    q_LxD = branch.q
    a_LxD = attn(ln_q(q_LxD), ln_k(branch.k), ln_v(branch.v), causal=True)
    a_D = a_LxD[i].astype(q_LxD.dtype)
    # the MLP is per token: run it on token i only (same function, 1/L of the cost)
    return a_D + mlp(ln_h(branch.r[i] + a_D)[None])[0].astype(q_LxD.dtype)


def shifted(branch: Branch, i: Int[Array, ""], u_D: Array) -> Branch:
    """``branch`` with ``u`` added to token ``i`` of every input (``L×D`` inputs)."""
    L = branch.q.shape[0]
    shift_LxD = jnp.where((jnp.arange(L) == i)[:, None], u_D[None, :], 0.0)
    return Branch(branch.parts, *(x + shift_LxD for x in branch[1:]))


def per_window(branch: Branch):
    """``branch``'s inputs as the ``xs`` of a map over windows, and the function rebuilding
    one window's :class:`Branch` from them."""
    return tuple(branch[1:]), lambda qkvr: Branch(branch.parts, *qkvr)


@eqx.filter_jit
def token_jacobians(branch: Branch, positions_N: Int[Array, " N"]) -> Float[Array, "N D D"]:
    """``J(i_n)`` (module doc) of window ``n`` at position ``positions_N[n]``, for every n
    (``branch``'s inputs ``N×L×D``)."""
    D = branch.q.shape[-1]
    xs, window = per_window(branch)

    def one(args):
        qkvr, i = args
        b = window(qkvr)
        return jax.jacfwd(lambda u: branch_at(shifted(b, i, u), i))(jnp.zeros((D,), b.q.dtype))

    # a few windows at a time: D tangents x L x D per window would not fit all at once
    return jax.lax.map(one, (xs, positions_N), batch_size=8)


def layer_jacobians(model, windows_NxL: np.ndarray, positions_N: np.ndarray) -> list[np.ndarray]:
    """Per block, ``J(i)`` at ``positions_N[n]`` of validation window ``n`` (``N×D×D``)."""
    return [np.asarray(token_jacobians(b, jnp.asarray(positions_N)))
            for b in layer_branches(model, windows_NxL)]


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
