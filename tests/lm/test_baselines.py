"""Related-work baselines: shapes, causality, init = vanilla, and each method's formula.

Tiny preset. Formula checks run in float64 against direct re-implementations written from the
papers' equations (tolerance 1e-10: only summation order differs).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_helpers import (
    F64,
    TINY,
    L,
    apply_block,
    apply_branch,
    apply_trunk,
    causal_jacobian_norms,
    logits,
    perturb,
)
from zoo_helpers import tokens as toks

from dca_theory.lm.config import PRESETS
from dca_theory.lm.model import build_model

BASELINES = ("denseformer", "hyper_connections", "laurel_lr", "laurel_pa")


@pytest.mark.parametrize("residual", BASELINES)
def test_init_equals_vanilla_and_extra_params_matter(residual, getkey):
    key = getkey()
    vanilla = build_model(F64, key=key)
    model = build_model(F64.replace(residual=residual), key=key)
    out, ref = logits(model, toks()), logits(vanilla, toks())
    assert out.shape == (L, TINY.vocab_size) and bool(jnp.all(jnp.isfinite(out)))
    # Exact methods differ from vanilla only by float64 rounding. Hyper-Connections' trunk
    # output is n·x_T at init, and LN(n y) differs from LN(y) only through eps = 1e-6 relative
    # to var(y) ~ 1, hence 1e-5 there.
    tol = 1e-5 if residual == "hyper_connections" else 1e-12
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol * float(jnp.max(jnp.abs(ref))))
    # Perturbing only the method's own parameters must change the function.
    trunk = perturb(eqx.filter(model.trunk, eqx.is_array), getkey())
    blocks_same = eqx.tree_at(lambda t: t.blocks, trunk, model.trunk.blocks)
    changed = eqx.tree_at(lambda m: m.trunk, model, eqx.combine(blocks_same, model.trunk))
    assert float(jnp.max(jnp.abs(logits(changed, toks()) - ref))) > 1e-3


@pytest.mark.slow  # ~10 s each on 2 cores (a Jacobian compile per kind)
@pytest.mark.parametrize("residual", BASELINES)
def test_causal(residual, getkey):
    model = build_model(F64.replace(residual=residual), key=getkey())
    model = perturb(model, getkey(), 0.05)  # non-trivial mixing weights
    norms = causal_jacobian_norms(model, model.embed(toks()))
    assert np.all(np.triu(norms, 1) == 0.0)  # no position sees a later one
    assert np.all(np.diag(norms) > 0.0)


def test_denseformer_matches_dwa_formula(getkey):
    model = perturb(build_model(F64.replace(residual="denseformer"), key=getkey()), getkey())
    trunk = model.trunk
    x = jax.random.normal(getkey(), (L, TINY.d_model), jnp.float64)
    states, y = [x], x
    for blk, dwa in zip(trunk.blocks, trunk.dwa):
        states.append(apply_block(blk, y))  # X_i = B_i(Y_{i-1}), a full block output
        y = sum(a * s for a, s in zip(dwa.b, states))  # Y_i = sum_j alpha_ij X_j
    np.testing.assert_allclose(apply_trunk(trunk, x), y, rtol=1e-10, atol=1e-10)


def test_hyper_connections_match_formula(getkey):
    model = perturb(build_model(F64.replace(residual="hyper_connections"), key=getkey()),
                    getkey(), 0.3)
    trunk, n = model.trunk, TINY.hc_expansion
    x = np.asarray(jax.random.normal(getkey(), (L, TINY.d_model), jnp.float64))
    H = np.repeat(x[:, None, :], n, axis=1)
    for blk, hc in zip(trunk.blocks, trunk.hcs):
        p = jax.tree_util.tree_map(np.asarray, hc)
        mu, var = H.mean(-1, keepdims=True), H.var(-1, keepdims=True)
        Hn = (H - mu) / np.sqrt(var + TINY.ln_eps) * p.norm.scale + p.norm.bias
        B = p.s_beta * np.tanh(Hn @ p.w_beta_D) + p.b0_N               # (L, n)
        Am = p.s_alpha * np.tanh(Hn @ p.w_m_D) + p.am0_N               # (L, n)
        Ar = p.s_alpha * np.tanh(Hn @ p.w_r_DxN) + p.ar0_NxN           # (L, n, n)
        h0 = np.stack([Am[t] @ H[t] for t in range(L)])                # A_m^T H per token
        f = np.asarray(apply_branch(blk, jnp.asarray(h0)))
        H = np.stack([np.outer(B[t], f[t]) + Ar[t].T @ H[t] for t in range(L)])
    np.testing.assert_allclose(apply_trunk(trunk, jnp.asarray(x)), H.sum(1),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("residual", ["laurel_lr", "laurel_pa"])
def test_laurel_matches_formula(residual, getkey):
    model = perturb(build_model(F64.replace(residual=residual), key=getkey()), getkey())
    trunk = model.trunk
    x = jax.random.normal(getkey(), (L, TINY.d_model), jnp.float64)
    acts = [x]
    for t, (blk, lr) in enumerate(zip(trunk.blocks, trunk.low_rank)):
        xi = acts[-1]
        if residual == "laurel_lr":
            aug = xi @ lr.a_DxR @ lr.b_RxD                             # B A x_i
        else:                                                         # sum_j gamma_ij h_i(x_j)
            aug = sum(g * (xj @ lr.a_DxR @ lr.b_RxD) for g, xj in zip(trunk.gammas[t].b, acts))
        acts.append(apply_block(blk, xi) + aug)
    np.testing.assert_allclose(apply_trunk(trunk, x), acts[-1], rtol=1e-10, atol=1e-10)


def test_hc_expansion_is_configurable(getkey):
    model = build_model(TINY.replace(residual="hyper_connections", hc_expansion=2), key=getkey())
    assert model.trunk.hcs[0].ar0_NxN.shape == (2, 2)
    np.testing.assert_array_equal(model.trunk.hcs[1].am0_N, [0.0, 1.0])  # e_{t mod n}
    assert PRESETS["paper"].hc_expansion == 4
