r"""Attention Residuals and mHC in the low-rank linear model: their classes in Theorem 4.1's
hierarchy and their excess risk (numpy/scipy).

Setting of Section 4: layers :math:`f_t = V_t g_t`, :math:`\mathrm{rank}\,V_t \le r_t`,
:math:`r_* = \sum_t r_t < d`, :math:`S = \sum_t \mathrm{col}\,V_t` (:math:`\dim S\le r_*`),
:math:`\Pi` the orthogonal projector onto :math:`S^\perp`, x ~ N(0, I).

**AttnRes** (:class:`dca_theory.residual.SoftmaxOverDepth`): every combiner (T + 1 of them)
is :math:`\sum_i \alpha_i h_i`, :math:`\alpha = \mathrm{softmax}_i(q^\top h_i/\mathrm{rms}(h_i))`,
one pseudo-query q per combiner; the theory takes the RMSNorm's eps = 0 (a zero entry scores 0).
Call its class :math:`C_{ar}` and :math:`\alpha_0(x)` the output combiner's weight on x.

* **Skip structure.** Every layer output lies in S, so :math:`\Pi F(x) = \alpha_0(x)\,\Pi x`
  with :math:`0 < \alpha_0 < 1`.
* **Pairing.** Layer 1 reads x alone, so :math:`f_1 = V_1x` and the scores of x and
  :math:`f_1` are odd in x: one of x, -x has :math:`s_1 \ge s_0`, hence
  :math:`\min(\alpha_0(x), \alpha_0(-x)) \le 1/2` (:func:`attn_res_forward` returns
  :math:`\alpha`).
* **Containments.** At q = 0 every combiner is the mean; scaling ResNet's layers by the stack
  size gives :math:`C_{ar} \supseteq C_{res}/(T+1)` (:func:`realise_mean_res`). A linear member
  has a constant :math:`\alpha_0 = c \le 1/2` (pairing), so the linear part of :math:`C_{ar}`
  lies in :math:`\{cI + M: 0 < c \le 1/2\} \subset C_{v1}`.
* **Non-containments.** :math:`C_{res} \not\subseteq C_{ar}` and :math:`C_{base}\not\subseteq
  C_{ar}` (0 needs :math:`\alpha_0 = 0`); quantitatively :func:`attn_res_lower_bound`:
  with :math:`W = (S + \mathrm{col}(A - I))^\perp`, :math:`\Pi_W(Ax - F(x)) = (1 -
  \alpha_0)\Pi_W x`, and pairing gives :math:`ER^*_{ar}(A) \ge (d - r_* - \mathrm{rank}(A-I))_+/8`
  (I is at distance :math:`\ge (d - r_*)/8`). For T = 1 the pair's weights sum to 1
  (:math:`\alpha_0(-x) = 1 - \alpha_0(x)`), the bound is :math:`(\cdot)_+/4`, and for A = I it
  is attained at q = 0: :math:`ER^*_{ar}(I) = (d - r_*)/4`. Conversely
  :math:`C_{ar} \not\subseteq C_{v3}`, :math:`C_{in}`: a member is positively homogeneous
  (:math:`F(\lambda x) = \lambda F(x)`, :math:`\lambda > 0`; scores are scale-free) and
  generically not odd, while every GRN network (either gate) is :math:`Lx + O(\|x\|^2)` near 0
  with L linear; a homogeneous GRN network is therefore linear.
* **Risk.** Lower bound above; upper bounds: the q = 0 subclass,
  :math:`\mathrm{tail}_{r_*}(A - I/(T+1))` (closed form, :func:`attn_res_mean_risk`), and the
  best network found by L-BFGS with restarts on a Monte Carlo risk, re-estimated on fresh
  samples (:func:`attn_res_search`).

**mHC** (static, the linear model of :mod:`dca_theory.lm.mhc`): n streams
:math:`H_0 = [x;\dots;x]`, per layer :math:`H \leftarrow PH + \beta\,(V_t H^\top\alpha)^\top`
with P doubly stochastic, output :math:`\sum_j H_j` (the LM sums its rows too). The dynamic
(input-dependent) maps of the paper are not part of this linear model.

* :math:`P\mathbf 1 = \mathbf 1` keeps every stream's x coefficient at 1 and layer outputs lie
  in S, so :math:`F = nI + M`, :math:`\mathrm{rank}\,M \le r_*`; with equal streams
  (any P) it is :math:`n` times a ResNet (:func:`realise_mhc`): :math:`C_{mHC} = n\,C_{res}
  \subseteq C_{v1}`; n = 1 (P = 1) is :math:`C_{res}`. For n >= 2 and :math:`2r_* < d` it
  misses :math:`C_{res}` (and the linear part of :math:`C_{ar}`) entirely.
* **Risk** (exact, Eckart-Young): :math:`\mathrm{tail}_{r_*}(A - nI)` (:func:`mhc_excess_risk`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

from dca_theory.theory import constructions as C
from dca_theory.theory import montecarlo as MC
from dca_theory.theory.reference import tail_sq

SINKHORN_TOL = 1e-13  # row and column sums within this of 1


# --- AttnRes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttnResNet:
    """Layer weights ``V`` (T of d×d) and the T + 1 pseudo-queries ``q`` (layers, then output)."""

    V: tuple[np.ndarray, ...]
    q: tuple[np.ndarray, ...]

    @property
    def dim(self) -> int:
        return self.V[0].shape[0]


def depth_softmax(q: np.ndarray, stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(sum_i alpha_i h_i, alpha)`` over the first axis of ``stack`` (S, ..., B, n, d) with
    ``q`` (B, d): scores ``q . h_i / rms(h_i)`` (0 for a zero entry), softmax over S."""
    rms = np.sqrt(np.mean(stack * stack, axis=-1))
    dots = np.einsum("s...bnd,bd->s...bn", stack, q)
    scores = np.divide(dots, rms, out=np.zeros_like(dots), where=rms > 0)
    scores -= scores.max(axis=0)
    alpha = np.exp(scores)
    alpha /= alpha.sum(axis=0)
    return np.einsum("s...,s...d->...d", alpha, stack), alpha


def _forward_batched(V, q, X):
    """V (B, T, d, d), q (B, T+1, d), X (n, d) -> outputs (B, n, d), output weights (S, B, n)."""
    stack = [np.broadcast_to(X, (V.shape[0], *X.shape))]
    for t in range(V.shape[1]):
        g, _ = depth_softmax(q[:, t], np.stack(stack))
        stack.append(np.einsum("bnd,bed->bne", g, V[:, t]))
    return depth_softmax(q[:, -1], np.stack(stack))


def attn_res_forward(net: AttnResNet, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The network on the rows of X: outputs (n, d) and the output combiner's weights (T+1, n)."""
    X = np.atleast_2d(np.asarray(X, dtype=float))
    out, alpha = _forward_batched(np.stack(net.V)[None], np.stack(net.q)[None], X)
    return out[0], alpha[:, 0]


def realise_mean_res(M: np.ndarray, ranks) -> AttnResNet:
    """A q = 0 network computing ``(I + M) x / (T + 1)``: ResNet's layers (Theorem 4.1's
    construction) times their stack size, since a mean of t + 1 entries is the sum / (t + 1)."""
    res = C.realise("res", M, ranks)
    d, T = res.dim, res.depth
    return AttnResNet(tuple((t + 1) * V for t, V in enumerate(res.V)), (np.zeros(d),) * (T + 1))


def random_attn_res_net(d: int, ranks, rng: np.random.Generator, *, q_scale: float = 2.0
                        ) -> AttnResNet:
    """Random layers of rank exactly r_t and random pseudo-queries."""
    V = tuple(rng.standard_normal((d, r)) @ rng.standard_normal((r, d)) / np.sqrt(d)
              for r in ranks)
    q = tuple(q_scale * rng.standard_normal(d) / np.sqrt(d) for _ in range(len(ranks) + 1))
    return AttnResNet(V, q)


def attn_res_lower_bound(A: np.ndarray, r_star: int, T: int) -> float:
    """``(d - r_* - rank(A - I))_+ / 8`` (``/ 4`` for T = 1, where the pair's weights sum to
    1): no depth-T AttnRes network of collective rank r_* does better."""
    d = A.shape[0]
    k = C.numerical_rank(A - np.eye(d), rtol=1e-9)
    return max(d - r_star - k, 0) / (4.0 if T == 1 else 8.0)


def attn_res_mean_risk(A: np.ndarray, r_star: int, T: int) -> float:
    """Best risk of the q = 0 subclass ``{(I + M)/(T + 1)}``: ``tail_r(A - I/(T + 1))``."""
    return tail_sq(A - np.eye(A.shape[0]) / (T + 1), r_star)


def risk_mc(net: AttnResNet, A: np.ndarray, n: int, rng: np.random.Generator) -> MC.Estimate:
    """Monte Carlo ``E||Ax - F(x)||^2`` with its standard error (x ~ N(0, I))."""
    def sample(m, g):
        X = g.standard_normal((m, A.shape[0]))
        err = X @ A.T - attn_res_forward(net, X)[0]
        return np.einsum("nd,nd->n", err, err)

    return MC._mc(sample, n, rng)


def _unpack(z: np.ndarray, d: int, ranks) -> tuple[np.ndarray, np.ndarray]:
    """Parameter vectors (B, p) -> V (B, T, d, d) = P Q^T per layer, q (B, T+1, d)."""
    B, T, out, start = z.shape[0], len(ranks), [], 0
    for r in ranks:
        P = z[:, start:start + d * r].reshape(B, d, r)
        Q = z[:, start + d * r:start + 2 * d * r].reshape(B, d, r)
        out.append(np.einsum("bdr,ber->bde", P, Q))
        start += 2 * d * r
    return np.stack(out, axis=1), z[:, start:].reshape(B, T + 1, d)


def _pack(net: AttnResNet, ranks) -> np.ndarray:
    parts = []
    for V, r in zip(net.V, ranks):
        P, Q = C.low_rank_factors(V, r)
        pad = r - P.shape[1]
        parts += [np.pad(P, ((0, 0), (0, pad))).ravel(), np.pad(Q, ((0, 0), (0, pad))).ravel()]
    return np.concatenate([*parts, *net.q])


def attn_res_search(A: np.ndarray, ranks, rng: np.random.Generator, *, restarts: int = 3,
                    n_fit: int = 256, n_eval: int = 20000, maxiter: int = 200) -> dict:
    """Best AttnRes network found for target A: L-BFGS (vectorised forward differences) on the
    Monte Carlo risk of ``n_fit`` antithetic samples, from the q = 0 optimum of
    :func:`attn_res_mean_risk` plus ``restarts`` random starts; each start and each result
    re-estimated on ``n_eval`` fresh samples. Returns ``value`` (fresh-sample mean: an upper
    bound on ER* up to its ``stderr``), ``net`` and ``fit_values``."""
    A = np.asarray(A, dtype=float)
    d, T, ranks = A.shape[0], len(ranks), tuple(int(r) for r in ranks)
    half = rng.standard_normal((n_fit // 2, d))
    X = np.vstack([half, -half])  # antithetic: AttnRes treats x and -x differently
    Y = X @ A.T

    def losses(Z):
        out, _ = _forward_batched(*_unpack(Z, d, ranks), X)
        return np.mean(np.sum((out - Y) ** 2, axis=-1), axis=-1)

    def fun(z, h=1e-6):
        Z = np.vstack([z, z + h * np.eye(z.size)])
        val = losses(Z)
        return float(val[0]), (val[1:] - val[0]) / h

    U, s, Vt = np.linalg.svd((T + 1) * A - np.eye(d))
    M = (U[:, :sum(ranks)] * s[:sum(ranks)]) @ Vt[:sum(ranks)]
    starts = [_pack(realise_mean_res(M, ranks), ranks)]
    starts += [_pack(random_attn_res_net(d, ranks, rng), ranks) for _ in range(restarts)]
    best = {"value": np.inf}
    with threadpool_limits(limits=1, user_api="blas"):
        fits = []
        for z0 in starts:
            res = minimize(fun, z0, jac=True, method="L-BFGS-B", options={"maxiter": maxiter})
            fits.append(float(res.fun))
            for z in (z0, res.x):  # the start too: a fit to few samples can generalise worse
                V, q = _unpack(z[None], d, ranks)
                net = AttnResNet(tuple(V[0]), tuple(q[0]))
                est = risk_mc(net, A, n_eval, rng)
                if est.mean < best["value"]:
                    best = {"value": float(est.mean), "stderr": float(est.stderr), "net": net}
    return {**best, "fit_values": fits}


# --- mHC --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MhcNet:
    """T layers ``V`` (d×d) with per-layer stream mixing ``P`` (n×n, doubly stochastic), read
    weights ``alpha`` (n,) and write weights ``beta`` (n,)."""

    V: tuple[np.ndarray, ...]
    P: tuple[np.ndarray, ...]
    alpha: tuple[np.ndarray, ...]
    beta: tuple[np.ndarray, ...]

    @property
    def dim(self) -> int:
        return self.V[0].shape[0]


def sinkhorn(logits: np.ndarray, max_iter: int = 10000) -> np.ndarray:
    """The doubly stochastic matrix of ``exp(logits)`` (alternate column and row scaling until
    every sum is within :data:`SINKHORN_TOL` of 1)."""
    M = np.exp(logits - logits.max())
    for _ in range(max_iter):
        M = M / M.sum(axis=0, keepdims=True)
        M = M / M.sum(axis=1, keepdims=True)
        if np.max(np.abs(M.sum(axis=0) - 1.0)) < SINKHORN_TOL:
            return M
    raise ValueError(f"Sinkhorn did not converge in {max_iter} iterations")


def mhc_forward(net: MhcNet, X: np.ndarray) -> np.ndarray:
    """The network on the rows of X: streams start as n copies of x, output their sum."""
    X = np.atleast_2d(np.asarray(X, dtype=float))
    H = np.repeat(X[None], net.P[0].shape[0], axis=0)  # (n streams, N, d)
    for V, P, a, b in zip(net.V, net.P, net.alpha, net.beta):
        f = np.einsum("j,jnd->nd", a, H) @ V.T
        H = np.einsum("ij,jnd->ind", P, H) + b[:, None, None] * f[None]
    return H.sum(axis=0)


def mhc_matrix(net: MhcNet) -> np.ndarray:
    """The matrix W with ``mhc_forward(x) = W x``."""
    return mhc_forward(net, np.eye(net.dim)).T


def random_mhc_net(d: int, ranks, n: int, rng: np.random.Generator) -> MhcNet:
    """Random layers of rank r_t, Sinkhorn mixings of random logits, read/write weights of
    either sign."""
    V = tuple(rng.standard_normal((d, r)) @ rng.standard_normal((r, d)) / np.sqrt(d)
              for r in ranks)
    P = tuple(sinkhorn(rng.standard_normal((n, n))) for _ in ranks)
    return MhcNet(V, P, tuple(rng.standard_normal(n) for _ in ranks),
                  tuple(rng.standard_normal(n) for _ in ranks))


def realise_mhc(M: np.ndarray, ranks, n: int, rng: np.random.Generator) -> MhcNet:
    """An mHC network computing ``(nI + M) x`` with mHC's own constraints (read weights in
    (0, 1), write weights in (0, 2), any Sinkhorn mixing): equal streams, each ResNet's stream
    for ``M / n`` (Theorem 4.1's construction, layers divided by ``b · sum(a)``)."""
    res = C.realise("res", np.asarray(M, dtype=float) / n, ranks)
    a, b = rng.uniform(0.1, 0.9, n), float(rng.uniform(0.2, 1.8))
    T = res.depth
    return MhcNet(tuple(V / (b * a.sum()) for V in res.V),
                  tuple(sinkhorn(rng.standard_normal((n, n))) for _ in range(T)),
                  (a,) * T, (np.full(n, b),) * T)


def mhc_excess_risk(A: np.ndarray, r_star: int, n: int) -> float:
    """Exact ``ER*(C_mHC) = tail_r(A - nI)`` (Eckart-Young on the class ``nI + M``)."""
    return tail_sq(np.asarray(A, dtype=float) - n * np.eye(A.shape[0]), r_star)


def mhc_params(d: int, r_star, T: int, n: int):
    """``2 d r_*`` layer weights plus ``n^2 + 2n`` mixing, read and write weights per layer."""
    return 2 * d * np.asarray(r_star) + T * (n * n + 2 * n)
