r"""Manifold-constrained Hyper-Connections (mHC) as a trunk, and the Sinkhorn projection.

**mHC** (Xie et al., "mHC: Manifold-Constrained Hyper-Connections", DeepSeek-AI,
arXiv 2512.24880, §4.1–4.2, eqs. (6)–(9)). Hyper-Connections (:mod:`.baselines`) widen the
stream to ``n`` rows ``x_l ∈ R^{n×D}`` (``n = hc_expansion``, ``x_0 = [x; …; x]``) and update

.. math::  x_{l+1} = \mathcal H^{res}_l x_l + \mathcal H^{post\top}_l\, f(\mathcal H^{pre}_l x_l),

with ``H^pre, H^post ∈ R^{1×n}`` and ``H^res ∈ R^{n×n}``. mHC computes the three from the
flattened, RMS-normalised stream ``x̃ = RMSNorm(vec(x_l)) ∈ R^{nD}`` (eq. (7)),

.. math::  \tilde H^{pre} = \alpha^{pre} (\tilde x\varphi^{pre}) + b^{pre},\quad
           \tilde H^{post} = \alpha^{post} (\tilde x\varphi^{post}) + b^{post},\quad
           \tilde H^{res} = \alpha^{res}\,\mathrm{mat}(\tilde x\varphi^{res}) + b^{res},

and constrains them (eq. (8)): ``H^pre = σ(H̃^pre)``, ``H^post = 2σ(H̃^post)`` and
``H^res = SinkhornKnopp(H̃^res)``, a doubly stochastic matrix: ``M⁽⁰⁾ = exp(H̃^res)``, then
``M⁽ᵗ⁾ = T_r(T_c(M⁽ᵗ⁻¹⁾))`` (column, then row normalisation) for ``t_max = 20`` iterations
(the paper's value, :data:`SINKHORN_ITERS`). Each normalisation divides by the sum plus
:data:`SINKHORN_EPS` = 1e-6 (DeepSeek's released ``hc_eps``), which guards a vanishing sum;
it runs in float32 at least (bfloat16 weights included) and is cast back to the stream dtype.
Rows are normalised last, so they sum to 1 up to ``eps``; columns keep the iteration's
residual, which is small for generic matrices (1e-4 on N(0, 1) logits) but larger near a
permutation matrix, where Sinkhorn converges slowly (4e-3 on our near-identity init; the
test states the tolerances).
The RMSNorm has no weight (the paper absorbs it into ``φ``). ``φ^pre, φ^post ∈ R^{nD×n}``,
``φ^res ∈ R^{nD×n²}`` are stored as one ``nD×(n²+2n)`` matrix, the biases as one vector.

**Decisions.** (1) One mHC per transformer *block* (``f`` the block's residual branch), as our
Hyper-Connections (:mod:`.baselines`); the paper wraps attention and FFN separately. (2) The
final stream is summed over its ``n`` rows before the final LayerNorm, as HC. (3) Init: the
paper gives ``α = 0.01`` (its Table 5); we take ``φ = 0`` (HC's ``W = 0``), ``b^post = 0``
(``H^post = 1``), ``b^res`` 0 on the diagonal and −4 off it (``H^res`` starts ≈ 0.95 I;
Sinkhorn cannot reach HC's exact ``I``), and ``b^pre = logit(p)`` with ``p`` leaning on stream
``t mod n`` (``(n+1)/(2n)`` there, ``1/(2n)`` elsewhere; HC's ``e_{t mod n}``): ``Σ p = 1`` so
the block reads the stream unscaled, and the lean breaks the symmetry between the rows (with
equal rows and uniform ``p`` they would receive equal gradients and never separate). ``n ≥ 2``
(``σ`` cannot start at 1).

**At init** every row equals vanilla's stream: rows start equal, a row-stochastic ``H^res``
keeps equal rows equal, ``H^post = 1`` adds ``f`` to each and ``H^pre`` (summing to 1) reads
the stream itself. So the model equals vanilla up to the Sinkhorn ``eps`` (row sums
``1/(1 + 1e-6)``) and LayerNorm's ``eps`` on the summed output (``LN(n y)`` vs ``LN(y)``), as
HC; no exact conversion from vanilla exists, so retrofit refuses it. Parameters per block:
``nD(n² + 2n) + (n² + 2n) + 3`` (49,179 for D = 512, n = 4).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from dca_theory.lm.baselines import run_streams
from dca_theory.lm.blocks import PreLNBlock, dtype_of
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.norm import at_least_float32
from dca_theory.lm.trunk import AbstractTrunk, block_keys

SINKHORN_ITERS = 20  # the paper's t_max
SINKHORN_EPS = 1e-6  # added to every row/column sum before dividing
RES_OFF_DIAGONAL = -4.0  # b^res off the diagonal at init: H^res ≈ 0.95 I


def sinkhorn(logits: Float[Array, "*batch N N"], *, iters: int = SINKHORN_ITERS,
             eps: float = SINKHORN_EPS) -> Float[Array, "*batch N N"]:
    """Sinkhorn–Knopp: ``exp(logits)`` alternately column- and row-normalised ``iters`` times
    (rows last, so row sums are 1 up to ``eps``; column sums up to the iteration's residual),
    in float32 at least, returned in ``logits``' dtype. A ``fori_loop``: twenty traced
    iterations per block made the float64 gradient's compilation about 3× slower (measured:
    15.5 s against 4.2 s for a 3-layer tiny model).

    The logits are shifted by their maximum (the largest entry of ``exp`` is 1, so nothing
    overflows), and the shift is a constant to the gradient, as in ``jax.nn.softmax``. The
    shift's own gradient is only the ``eps`` term's (9e-12 of the largest gradient of a tiny
    float64 mHC trunk), and taking it goes through ``max``'s tie count, the entries bit-equal
    to the maximum: where XLA computes ``z`` twice with one rounding different (in two
    fusions), no entry equals it and the gradient is inf. That happened at
    ``--xla_backend_optimization_level=0``: every parameter's gradient of a tiny mHC trunk
    came out non-finite."""
    acc = at_least_float32(logits.dtype)
    z = logits.astype(acc)
    m = jnp.exp(z - jax.lax.stop_gradient(jnp.max(z, axis=(-2, -1), keepdims=True)))

    def normalise(_, m):
        m = m / (jnp.sum(m, axis=-2, keepdims=True) + eps)  # columns
        return m / (jnp.sum(m, axis=-1, keepdims=True) + eps)  # rows

    return jax.lax.fori_loop(0, iters, normalise, m).astype(logits.dtype)


class ManifoldHyperConnection(eqx.Module):
    """The parameters of eqs. (7)–(8) for one block: ``φ``, ``b`` and ``α = (α^pre, α^post,
    α^res)``."""

    phi_PxM: Array  # P = nD (the flattened stream), M = n² + 2n: [pre | post | res]
    bias_M: Array
    alpha_3: Array
    n: int = eqx.field(static=True)
    eps: float = eqx.field(static=True)

    @classmethod
    def init(cls, cfg: ModelConfig, layer: int) -> ManifoldHyperConnection:
        n, d, dtype = cfg.hc_expansion, cfg.d_model, dtype_of(cfg.param_dtype)
        lean = layer % n
        p = [(n + 1) / (2 * n) if i == lean else 1 / (2 * n) for i in range(n)]
        b_pre = [math.log(q / (1 - q)) for q in p]
        b_res = [0.0 if i == j else RES_OFF_DIAGONAL for i in range(n) for j in range(n)]
        return cls(
            phi_PxM=jnp.zeros((n * d, n * n + 2 * n), dtype),
            bias_M=jnp.asarray(b_pre + [0.0] * n + b_res, dtype),
            alpha_3=jnp.full((3,), 0.01, dtype), n=n, eps=cfg.ln_eps,
        )

    def weights(self, h_LxNxD: Array) -> tuple[Array, Array, Array]:
        """Token-dependent ``H^pre (L×N)``, ``H^post (L×N)`` and ``H^res (L×N×N)``."""
        n = self.n
        L = h_LxNxD.shape[0]
        acc = at_least_float32(self.phi_PxM.dtype)
        x_LxP = h_LxNxD.reshape(L, -1).astype(acc)
        x_LxP = x_LxP * jax.lax.rsqrt(jnp.mean(x_LxP * x_LxP, axis=-1, keepdims=True) + self.eps)
        z_LxM = x_LxP @ self.phi_PxM.astype(acc)
        a, b = self.alpha_3.astype(acc), self.bias_M.astype(acc)[None]
        pre_LxN = jax.nn.sigmoid(a[0] * z_LxM[:, :n] + b[:, :n])
        post_LxN = 2.0 * jax.nn.sigmoid(a[1] * z_LxM[:, n:2 * n] + b[:, n:2 * n])
        res_LxNxN = sinkhorn((a[2] * z_LxM[:, 2 * n:] + b[:, 2 * n:]).reshape(L, n, n))
        dt = h_LxNxD.dtype
        return pre_LxN.astype(dt), post_LxN.astype(dt), res_LxNxN.astype(dt)


class ManifoldHyperConnectionsTrunk(AbstractTrunk):
    """mHC with expansion rate ``cfg.hc_expansion``, one per block (see the module docstring)."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: tuple[PreLNBlock, ...]
    mhcs: tuple[ManifoldHyperConnection, ...]

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> ManifoldHyperConnectionsTrunk:
        blocks = tuple(PreLNBlock.init(cfg, key=k) for k in block_keys(cfg, key))
        mhcs = tuple(ManifoldHyperConnection.init(cfg, t) for t in range(cfg.n_layers))
        return cls(cfg=cfg, blocks=blocks, mhcs=mhcs)

    def run(self, x_LxD, *, causal, key, collect):
        return run_streams(self.blocks, self.mhcs, x_LxD, self.cfg.hc_expansion,
                           lambda mhc, h: mhc.weights(h), "lij,ljd->lid", causal=causal,
                           key=key, collect=collect)
