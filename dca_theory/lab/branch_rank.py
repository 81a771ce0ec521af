r"""Effective rank of each sublayer's Jacobian in a trained LM: attention, MLP and the whole
residual update, per layer (the theory's mechanism).

The bottleneck argument behind "DCA's gain shrinks with width" (``dca-paper.md`` §1.9, §8)
needs the residual branches to be *low rank* compared with the width: only then can a GRN's
scalar weights absorb what a ResNet must spend rank on. :mod:`.jacobian_rank` showed that
the numerical rank of every branch is D - 1 (full, up to LayerNorm's null direction), which
says nothing about how the spectrum is spread; here the entropy-based effective rank
(:func:`dca_theory.spectra.effective_rank`, Roy & Vetterli 2007) of each part is measured
separately, since a full-rank MLP could hide a low-rank attention or the reverse.

**The three Jacobians** of block ``t`` at token ``i`` (notation of :mod:`.jacobian_rank`:
``a = Attn(LN_1 q, LN_k k, LN_v v)``, ``h = r + a``, ``m = MLP(LN_2 h)``, ``f = a + m``), for
every kind :mod:`.jacobian_rank` reads, from the same stacked-layout branches:

* ``attn``: :math:`\partial a_i / \partial u` for a shift ``u`` of token ``i``'s inputs
  ``q, k, v, r`` together (every other position fixed), the attention sublayer's response to
  its input;
* ``mlp``: :math:`\partial m_i / \partial h_i`, the MLP sublayer's Jacobian with respect to its
  own input (exact per token: the MLP does not mix positions);
* ``update``: :math:`\partial f_i / \partial u`, the residual update the block adds, equal to
  ``attn + mlp · (I + attn)`` by the chain rule (the object of :mod:`.jacobian_rank`).

Per layer each is reported as the effective rank averaged over the sampled positions, the same
divided by the width, and the stable rank (``‖J‖_F² / ‖J‖_2²``) beside it.

**Cost.** One ``jacfwd`` of ``D`` tangents per position for ``attn`` and ``update`` together
(the attention runs over the whole window) and one of the per-token MLP.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from dca_theory.lab.jacobian_rank import (
    Branch,
    layer_branches,
    per_window,
    sample_positions,
    shifted,
)
from dca_theory.spectra import effective_rank, stable_rank

#: the sublayers whose Jacobians are measured, in the order of :func:`sublayer_jacobians`
SUBLAYERS: tuple[str, ...] = ("attn", "mlp", "update")


def _sublayer_outputs(branch: Branch, i: Int[Array, ""]) -> tuple[Array, Array, Array]:
    """``(a_i, h_i, f_i)`` at token ``i``: attention output, MLP input, residual update."""
    ln_q, ln_k, ln_v, attn, ln_h, mlp = branch.parts
    q_LxD = branch.q
    a_D = attn(ln_q(q_LxD), ln_k(branch.k), ln_v(branch.v), causal=True)[i].astype(q_LxD.dtype)
    h_D = branch.r[i] + a_D
    return a_D, h_D, a_D + mlp(ln_h(h_D)[None])[0].astype(q_LxD.dtype)


@eqx.filter_jit
def sublayer_jacobians(branch: Branch, positions_N: Int[Array, " N"]) -> Float[Array, "3 N D D"]:
    """The ``attn``, ``mlp`` and ``update`` Jacobians (module doc) of window ``n`` at position
    ``positions_N[n]``, stacked in the order of :data:`SUBLAYERS` (``branch``'s inputs
    ``N×L×D``)."""
    D = branch.q.shape[-1]
    ln_h, mlp = branch.parts[4:]
    mlp_part = lambda h_D: mlp(ln_h(h_D)[None])[0].astype(h_D.dtype)  # noqa: E731
    xs, window = per_window(branch)

    def one(args):
        qkvr, i = args
        b = window(qkvr)

        def attn_update(u_D):
            a_D, _, f_D = _sublayer_outputs(shifted(b, i, u_D), i)
            return jnp.stack([a_D, f_D])

        j_attn, j_update = jax.jacfwd(attn_update)(jnp.zeros((D,), b.q.dtype))
        h_D = _sublayer_outputs(b, i)[1]
        return jnp.stack([j_attn, jax.jacfwd(mlp_part)(h_D), j_update])

    # a few windows at a time: D tangents x L x D per window would not fit all at once
    out_Nx3xDxD = jax.lax.map(one, (xs, positions_N), batch_size=8)
    return jnp.moveaxis(out_Nx3xDxD, 1, 0)


def sublayer_rank_stats(jac_3xNxDxD: np.ndarray) -> dict:
    """Per sublayer: mean effective rank over positions, as a fraction of the width, and the
    mean stable rank."""
    d = int(jac_3xNxDxD.shape[-1])
    out: dict = {"width": d, "n_positions": int(jac_3xNxDxD.shape[1])}
    for name, jac in zip(SUBLAYERS, jac_3xNxDxD, strict=True):
        eff = float(np.mean(effective_rank(jac)))
        out[f"{name}_eff_rank"] = eff
        out[f"{name}_eff_rank_frac"] = eff / d
        out[f"{name}_stable_rank"] = float(np.mean(stable_rank(jac)))
    return out


def branch_rank_profile(model, valid_tokens: np.ndarray, seq_len: int, n: int,
                        seed: int = 0) -> list[dict]:
    """:func:`sublayer_rank_stats` of every block of ``model`` (``layer`` 0-based) at ``n``
    random validation positions (:func:`.jacobian_rank.sample_positions`)."""
    windows, positions = sample_positions(valid_tokens, seq_len, n, seed)
    out = []
    for t, branch in enumerate(layer_branches(model, windows)):
        jac = np.asarray(sublayer_jacobians(branch, jnp.asarray(positions)))
        out.append({"layer": t, **sublayer_rank_stats(jac)})
    return out
