"""Today's rivals of DCA (Attention Residuals, mHC, MUDDFormer, value residuals) as LM kinds:
behaviour at init, causality, jit = eager, mHC's doubly stochastic mixing, each formula against
a direct re-implementation, checkpoints, bfloat16 and retrofit.

Tiny preset. Float64 comparisons use 1e-12 of the logit scale where only summation order
differs; the documented LayerNorm-``eps`` gaps at init have their own bounds (see each test).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf
from zoo_helpers import F64, TINY, L, apply_branch, apply_trunk, logits, perturb
from zoo_helpers import tokens as toks

from dca_theory.lm.checkpoint import Checkpointer
from dca_theory.lm.mhc import SINKHORN_ITERS, sinkhorn
from dca_theory.lm.model import build_model
from dca_theory.lm.retrofit import retrofit

RIVALS = ("attn_res", "mhc", "muddformer", "value_residual")
# Relative gap to vanilla at init (float64), by kind. muddformer: exact (static weights one-hot,
# W_2 = 0). mhc: Sinkhorn's eps (row sums 1/(1 + 1e-6)) and LN(n y) vs LN(y) (eps = 1e-6),
# measured 1.3e-6. attn_res: every sublayer reads the mean of its n sources where vanilla reads
# their sum, LN(s / n) vs LN(s), so eps grows by up to n² = 13² (measured 8.8e-6).
INIT_GAP = {"attn_res": 1e-4, "mhc": 1e-5, "muddformer": 1e-12}


def _scale(ref):
    return float(jnp.max(jnp.abs(ref)))


@pytest.mark.parametrize("residual", RIVALS)
def test_behaviour_at_init_and_own_params_matter(residual, getkey):
    key = getkey()
    ref = logits(build_model(F64, key=key), toks())
    model = build_model(F64.replace(residual=residual), key=key)
    out = logits(model, toks())
    assert out.shape == (L, TINY.vocab_size) and bool(jnp.all(jnp.isfinite(out)))
    gap = float(jnp.max(jnp.abs(out - ref))) / _scale(ref)
    if residual == "value_residual":
        # Not identity at init: the paper's λ = (0.5, 0.5) mixes half of V_1 in from the start;
        # λ = (1, 0) is vanilla exactly.
        assert gap > 1e-2
        vanilla_like = eqx.tree_at(lambda m: m.trunk, model, model.trunk.as_vanilla())
        np.testing.assert_allclose(logits(vanilla_like, toks()), ref, rtol=0,
                                   atol=1e-12 * _scale(ref))
    else:
        assert gap < INIT_GAP[residual], gap
    # Perturbing only the method's own parameters must change the function.
    trunk = perturb(eqx.filter(model.trunk, eqx.is_array), getkey())
    blocks_same = eqx.tree_at(lambda t: t.blocks, trunk, model.trunk.blocks)
    changed = eqx.tree_at(lambda m: m.trunk, model, eqx.combine(blocks_same, model.trunk))
    assert float(jnp.max(jnp.abs(logits(changed, toks()) - out))) > 1e-3 * _scale(ref)


@pytest.mark.parametrize("residual", RIVALS)
def test_causal(residual, getkey):
    model = perturb(build_model(F64.replace(residual=residual), key=getkey()), getkey(), 0.05)
    a, b = toks(1), toks(1)
    cut = L // 2
    b = b.at[cut:].set((a[cut:] + 1) % TINY.vocab_size)  # change every later token
    la, lb = logits(model, a), logits(model, b)
    # Masked scores get exp(min) = 0 exactly, so earlier logits agree to rounding.
    np.testing.assert_allclose(la[:cut], lb[:cut], rtol=0, atol=1e-12 * _scale(la))
    assert float(jnp.max(jnp.abs(la[cut:] - lb[cut:]))) > 1e-3


@pytest.mark.parametrize("residual", RIVALS)
def test_jit_equals_eager(residual, getkey):
    # Same structure as the other tests' models, so the jitted side reuses their compilation.
    model = perturb(build_model(F64.replace(residual=residual), key=getkey()), getkey(), 0.05)
    eager = model(toks(), inference=True)
    np.testing.assert_allclose(logits(model, toks()), eager, rtol=0,
                               atol=1e-12 * _scale(eager))


@pytest.mark.parametrize("dtype,row_tol,col_tol", [
    # float32: rows are normalised last, so they sum to 1/(1 + 1e-6) up to rounding; columns
    # keep Sinkhorn's residual after the paper's 20 iterations: measured 1.1e-4 on N(0, 1)
    # logits but 3.8e-3 on the model's near-identity matrices (Sinkhorn converges slowly near
    # a permutation matrix), hence 1e-2.
    ("float32", 1e-5, 1e-2),
    # bfloat16 output: each entry rounded to 8 significant bits (relative 2^-8 = 3.9e-3),
    # so a row of entries that add to 1 is off by at most 3.9e-3; columns add the residual.
    ("bfloat16", 1e-2, 2e-2),
])
def test_mhc_mixing_is_doubly_stochastic(dtype, row_tol, col_tol, getkey):
    dt = jnp.dtype(dtype)
    assert SINKHORN_ITERS == 20  # the paper's t_max
    z = jax.random.normal(getkey(), (256, 4, 4), jnp.float32).astype(dt)
    # ... and the matrices a perturbed mHC block produces from a random stream.
    model = perturb(build_model(TINY.replace(residual="mhc"), key=getkey()), getkey(), 0.3)
    mhc = jax.tree_util.tree_map(lambda x: x.astype(dt) if eqx.is_inexact_array(x) else x,
                                 model.trunk.mhcs[1])
    h = jax.random.normal(getkey(), (L, TINY.hc_expansion, TINY.d_model), jnp.float32)
    _, _, res = eqx.filter_jit(mhc.weights)(h.astype(dt))
    for m in (jax.jit(sinkhorn)(z), res):
        assert m.dtype == dt
        m = np.asarray(m.astype(jnp.float32))
        assert np.all(m >= 0)
        assert np.max(np.abs(m.sum(-1) - 1)) <= row_tol
        assert np.max(np.abs(m.sum(-2) - 1)) <= col_tol


def test_mhc_needs_two_streams():
    with pytest.raises(ValueError, match="needs hc_expansion >= 2"):
        TINY.replace(residual="mhc", hc_expansion=1)


def _rms(x, eps=TINY.ln_eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


def _ln(ln, x):
    p = jax.tree_util.tree_map(np.asarray, ln)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + ln.eps) \
        * p.scale + p.bias


def _attn(attn, xq, xk, xv, v_mix=None):
    """Causal multi-head attention in numpy (no biases), ``v_mix`` applied to the values."""
    w = jax.tree_util.tree_map(np.asarray, attn)
    H, (n, D) = attn.n_heads, xq.shape
    q, k, v = (np.reshape(x @ m, (n, H, D // H)) for x, m in
               ((xq, w.w_q_DxD), (xk, w.w_k_DxD), (xv, w.w_v_DxD)))
    v = v if v_mix is None else v_mix(v)
    s = np.einsum("qhk,shk->hqs", q, k) / np.sqrt(D // H)
    s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("hqs,shk->qhk", p, v).reshape(n, D) @ w.w_o_DxD


def _mlp(mlp, x):
    w = jax.tree_util.tree_map(np.asarray, mlp)
    return np.maximum(x @ w.w_in_DxF + w.b_in_F, 0) @ w.w_out_FxD + w.b_out_D


@pytest.mark.parametrize("residual", RIVALS)
def test_matches_formula(residual, getkey):
    """Each trunk against its paper's equations, re-implemented in numpy (float64, 1e-10)."""
    model = perturb(build_model(F64.replace(residual=residual), key=getkey()), getkey(), 0.3)
    trunk, blocks = model.trunk, model.trunk.blocks
    x = np.asarray(jax.random.normal(getkey(), (L, TINY.d_model), jnp.float64))
    if residual == "attn_res":
        def depth_attention(mix, vs):
            V = np.stack(vs)
            logit = (_rms(V) * np.asarray(mix.norm_scale_D)) @ np.asarray(mix.query_D)
            a = np.exp(logit - logit.max(0))
            return np.einsum("sl,sld->ld", a / a.sum(0), V)
        vs = [x]
        for t, blk in enumerate(blocks):
            xn = _ln(blk.ln1, depth_attention(trunk.mixers[2 * t], vs))
            vs.append(_attn(blk.attn, xn, xn, xn))
            vs.append(_mlp(blk.mlp, _ln(blk.ln2, depth_attention(trunk.mixers[2 * t + 1], vs))))
        expected = depth_attention(trunk.mixers[-1], vs)
    elif residual == "mhc":
        n = TINY.hc_expansion
        H = np.repeat(x[:, None, :], n, axis=1)
        for blk, m in zip(blocks, trunk.mhcs):
            p = jax.tree_util.tree_map(np.asarray, m)
            z = _rms(H.reshape(L, -1)) @ p.phi_PxM
            pre = 1 / (1 + np.exp(-(p.alpha_3[0] * z[:, :n] + p.bias_M[:n])))
            post = 2 / (1 + np.exp(-(p.alpha_3[1] * z[:, n:2 * n] + p.bias_M[n:2 * n])))
            R = (p.alpha_3[2] * z[:, 2 * n:] + p.bias_M[2 * n:]).reshape(L, n, n)
            M = np.exp(R - R.max((1, 2), keepdims=True))  # eps below is relative to max 1
            for _ in range(SINKHORN_ITERS):  # T_r(T_c(M)), eps 1e-6 on every sum
                M = M / (M.sum(-2, keepdims=True) + 1e-6)
                M = M / (M.sum(-1, keepdims=True) + 1e-6)
            f = np.asarray(apply_branch(blk, jnp.asarray(np.einsum("ln,lnd->ld", pre, H))))
            H = np.einsum("lij,ljd->lid", M, H) + post[:, :, None] * f[:, None, :]
        expected = H.sum(1)
    elif residual == "muddformer":
        outs, (q, k, v, r) = [x], (x,) * 4
        for t, (blk, agg) in enumerate(zip(blocks, trunk.dense)):
            h = r + _attn(blk.attn, _ln(blk.ln1, q), _ln(blk.ln1, k), _ln(blk.ln1, v))
            outs.append(h + _mlp(blk.mlp, _ln(blk.ln2, h)))
            w = jax.tree_util.tree_map(np.asarray, agg)
            hid = _rms(outs[-1]) @ w.w1_DxH
            gelu = 0.5 * hid * (1 + erf(hid / np.sqrt(2)))  # exact GELU
            C, S = w.static_CxS.shape
            A = (gelu @ w.w2_HxO).reshape(L, C, S) + w.static_CxS
            streams = np.einsum("lcs,sld->cld", A, np.stack(outs))
            q, k, v, r = streams if t + 1 < len(blocks) else (None, None, None, streams[0])
        expected = r
    else:  # value_residual: V'_n = λ_1 V_n + λ_2 V_1 for n >= 2
        h, v1 = x, None
        for t, blk in enumerate(blocks):
            xn = _ln(blk.ln1, h)
            w_v = np.asarray(blk.attn.w_v_DxD)
            if t == 0:
                v1 = (xn @ w_v).reshape(L, TINY.n_heads, -1)
                mix = None
            else:
                lam = np.asarray(trunk.lambdas_Tx2[t - 1])
                mix = lambda v, lam=lam: lam[0] * v + lam[1] * v1  # noqa: E731
            a = _attn(blk.attn, xn, xn, xn, mix)
            h = h + a + _mlp(blk.mlp, _ln(blk.ln2, h + a))
        expected = h
    np.testing.assert_allclose(apply_trunk(trunk, jnp.asarray(x)), expected, rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize("residual", RIVALS)
def test_checkpoint_round_trip(residual, getkey, tmp_path):
    model = perturb(build_model(F64.replace(residual=residual), key=getkey()), getkey())
    params, static = eqx.partition(model, eqx.is_inexact_array)
    ckpt = Checkpointer(tmp_path, keep=1)
    ckpt.save(3, params, {"step": 3})
    ckpt.wait()
    template, _ = eqx.partition(build_model(model.cfg, key=getkey()), eqx.is_inexact_array)
    restored, meta = ckpt.restore(template)
    ckpt.close()
    assert meta["step"] == 3
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise
    again = eqx.combine(restored, static)
    np.testing.assert_array_equal(logits(again, toks()), logits(model, toks()))


@pytest.mark.slow  # two bfloat16 compilations per kind
@pytest.mark.parametrize("residual", RIVALS)
def test_bf16_close_to_float32(residual, getkey):
    key = getkey()
    cfg = TINY.replace(residual=residual)
    ref = logits(build_model(cfg, key=key), toks())
    bf = logits(build_model(cfg.replace(compute_dtype="bfloat16"), key=key), toks())
    assert bf.dtype == jnp.float32
    # bfloat16 keeps 8 mantissa bits (~4e-3 per op); a 3-layer model stays within 5%.
    assert float(jnp.max(jnp.abs(bf - ref))) / _scale(ref) < 5e-2
    cast = jax.tree_util.tree_map(
        lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x,
        build_model(cfg, key=key))
    out = logits(cast, toks())
    assert out.dtype == jnp.bfloat16
    assert float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref))) / _scale(ref) < 5e-2


@pytest.mark.parametrize("residual", RIVALS)
def test_retrofit_exact_or_refused(residual, getkey):
    vanilla = perturb(build_model(F64, key=getkey()), getkey())
    target = F64.replace(residual=residual)
    if residual in ("attn_res", "mhc"):  # softmax / Sinkhorn weights cannot all be 1
        with pytest.raises(ValueError, match=f"cannot retrofit into residual='{residual}'"):
            retrofit(vanilla, target)
        return
    model = retrofit(vanilla, target)
    assert model.cfg.residual == residual
    ref = logits(vanilla, toks())
    gap = float(jnp.max(jnp.abs(logits(model, toks()) - ref))) / _scale(ref)
    assert gap < 1e-12, gap
