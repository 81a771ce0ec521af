r"""Theorem 4.1, constructively: layer weights that realise each class member (numpy only).

For a target :math:`M` with :math:`\mathrm{rank}\,M \le r_*` (``base``: :math:`\le \min_t r_t`)
and layer ranks :math:`r_1,\dots,r_T`, :func:`realise` returns the weights of a T-layer linear
network whose end-to-end map is

=========  ==========================================  =====================================
kind       map                                          construction (App. A)
=========  ==========================================  =====================================
base       :math:`Mx`                                   SVD :math:`M=PSQ^\top`: layers 1..T-1
                                                        :math:`QQ^\top`, layer T :math:`PSQ^\top`
res        :math:`(I+M)x`                               induction, last layer by (A.1)/Woodbury
grn_v1     :math:`(\alpha I+M)x`                        every layer reads x; output
                                                        :math:`b=(\alpha,1,\dots,1)`
grn_v2     :math:`(D+M)x`                               same; output :math:`b_0=\mathrm{diag}D`
grn_v3     :math:`(D+M)x+\sigma(w^\top x)x`             see below
=========  ==========================================  =====================================

Semantics are those of :mod:`dca_theory.residual` / ``dca_theory.nets`` (mirrored here in numpy
so that ``theory`` needs no jax): layer t reads :math:`g_t = \mathrm{combine}_t([x, f_1, \dots,
f_{t-1}])`, emits :math:`f_t = V_t g_t`, and the output is :math:`\mathrm{combine}_{T+1}` of the
whole stack. GRN-v3's gate is per stack entry: :math:`\sum_i (b_i + \sigma(w^\top h_i)) \odot h_i`.

**GRN-v3 (corrected construction).** The paper sets the output weights of every layer slot to
1 (:math:`c = [1|\dots|1]`); but the output gate then also acts on the layer outputs, adding
:math:`\sigma(w^\top V_t x) V_t x`, which vanishes only if :math:`w^\top M = 0`. Fix: use the
per-feature biases. Pick :math:`u` with :math:`u^\top M = 0` and the support of ``w``
(exists generically since :math:`\mathrm{rank}\,M < d`), set :math:`\beta_i = w_i/u_i`
(:math:`1` where :math:`w_i = 0`), layer weights :math:`V_t = \mathrm{diag}(1/\beta) M_t` and
output bias :math:`\beta` on every layer slot. Then :math:`w^\top f_t = u^\top M_t x = 0` (the
gate is off on layer slots) and :math:`\beta \odot f_t = M_t x`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dca_theory import grn_formula, spectra
from dca_theory.theory._validate import ALL_KINDS

KINDS = ALL_KINDS  # the schemes with a stack combiner, in the theory's spelling


@dataclass(frozen=True)
class LinearNet:
    """Weights of a T-layer network: ``V[t]`` (d×d, rank ≤ r_t) and the T+1 combiners' ``b``
    (``None`` for base/res; shape (s,) for grn_v1; (s, d) for grn_v2/v3) and ``w`` (grn_v3)."""

    kind: str
    V: tuple[np.ndarray, ...]
    b: tuple[np.ndarray | None, ...]
    w: tuple[np.ndarray | None, ...]

    @property
    def depth(self) -> int:
        return len(self.V)

    @property
    def dim(self) -> int:
        return self.V[0].shape[0]


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def _combine(kind: str, b, w, stack: list[np.ndarray]) -> np.ndarray:
    """numpy mirror of the combiners of :mod:`dca_theory.residual` on rows ``(n, d)``; GRNs
    evaluate the one formula of :mod:`dca_theory.grn_formula`."""
    if kind == "base":
        return stack[-1]
    if kind == "res":
        return sum(stack[1:], stack[0])
    return grn_formula.combine(np.asarray(b), w if kind == "grn_v3" else None, _relu,
                               np.stack(stack))


def forward(net: LinearNet, X: np.ndarray) -> np.ndarray:
    """The network applied to the rows of ``X`` (n×d)."""
    X = np.atleast_2d(np.asarray(X, dtype=float))
    stack = [X]
    for t in range(net.depth):
        g = _combine(net.kind, net.b[t], net.w[t], stack)
        stack.append(g @ net.V[t].T)
    return _combine(net.kind, net.b[-1], net.w[-1], stack)


def end_to_end_matrix(net: LinearNet) -> np.ndarray:
    """The matrix W with ``forward(x) = W x`` (meaningful for the linear kinds only)."""
    if net.kind == "grn_v3":
        raise ValueError("grn_v3 is not linear; use forward()")
    return forward(net, np.eye(net.dim)).T


def numerical_rank(M: np.ndarray, rtol: float = 1e-10) -> int:
    """Number of singular values above ``rtol * max(sigma_max, 1)`` (the shared rule of
    :func:`dca_theory.spectra.numerical_rank` with a floor, so tiny matrices count as zero)."""
    return int(spectra.numerical_rank(M, rtol=rtol, atol=rtol))


def _check_ranks(ranks: Sequence[int], d: int) -> tuple[int, ...]:
    ranks = tuple(int(r) for r in ranks)
    if not ranks or any(r < 1 or r > d for r in ranks):
        raise ValueError(f"layer ranks must be a non-empty list of ints in [1, d={d}], "
                         f"got {ranks}")
    return ranks


def low_rank_factors(M: np.ndarray, max_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """``P, Q`` (d×m) with ``M = P Q^T``, m = numerical rank; ValueError if m > max_rank."""
    U, s, Vt = np.linalg.svd(M)
    m = numerical_rank(M)
    if m > max_rank:
        raise ValueError(f"rank(M) = {m} exceeds the allowed rank {max_rank}")
    return U[:, :m] * s[:m], Vt[:m].T


def split_low_rank(M: np.ndarray, ranks: Sequence[int]) -> list[np.ndarray]:
    """``M = sum_t M_t`` with ``rank M_t <= ranks[t]`` and ``col(M_t) ⊆ col(M)`` (SVD chunks)."""
    P, Q = low_rank_factors(M, sum(ranks))
    out, start = [], 0
    for r in ranks:
        out.append(P[:, start:start + r] @ Q[:, start:start + r].T)
        start += r
    return out


def _slot_input_weights(kind: str, t: int, d: int):
    """Combiner of layer t (stack size t+1) that feeds the model input x alone to the layer."""
    if kind == "grn_v1":
        return np.eye(t + 1)[0]
    return np.zeros((t + 1, d)) + (np.arange(t + 1) == 0)[:, None]


def _realise_base(M, ranks):
    P, Q = low_rank_factors(M, min(ranks))
    proj = Q @ Q.T
    V = [proj] * (len(ranks) - 1) + [P @ Q.T]
    return LinearNet("base", tuple(V), (None,) * (len(ranks) + 1), (None,) * (len(ranks) + 1))


def _realise_res(M, ranks):
    r"""Peel off the last layer with (A.1): :math:`V_T = BC^\top`, then realise
    :math:`M' = (I+V_T)^{-1}(I+M) - I = (I - P_1KQ_1^\top)P_2Q_2^\top` (Woodbury) with T-1
    layers. Factors are carried, never re-SVD'd, so ranks stay exact."""
    d = M.shape[0]
    P, Q = low_rank_factors(M, sum(ranks))
    V: list[np.ndarray] = []
    for r_t in reversed(ranks):
        P1, Q1, P2, Q2 = P[:, :r_t], Q[:, :r_t], P[:, r_t:], Q[:, r_t:]
        if P1.shape[1] == 0:
            V.append(np.zeros((d, d)))
            continue
        K = np.linalg.inv(np.eye(P1.shape[1]) + Q1.T @ P1)
        B, C = P1 @ K, Q1 @ (np.eye(P1.shape[1]) + P1.T @ Q1)
        V.append(B @ C.T)
        P, Q = P2 - P1 @ (K @ (Q1.T @ P2)), Q2
    V.reverse()
    return LinearNet("res", tuple(V), (None,) * (len(ranks) + 1), (None,) * (len(ranks) + 1))


def gate_free_scaling(M: np.ndarray, w: np.ndarray, rng: np.random.Generator,
                      tries: int = 20) -> np.ndarray:
    r"""Output bias :math:`\beta` (no zero entry) with :math:`w^\top\mathrm{diag}(1/\beta)M = 0`.

    Needs :math:`u \in \ker M^\top` with the support of ``w``; of ``tries`` random candidates
    the one with the largest :math:`\min_i |u_i|/\|u\|` on the support (best conditioned) is
    kept. ValueError if none exists (a non-generic pair (M, w))."""
    d = M.shape[0]
    support = np.abs(w) > 0
    if not support.any():
        return np.ones(d)
    U, s, _ = np.linalg.svd(M)
    null = U[:, numerical_rank(M):]  # orthonormal basis of ker M^T
    off = null[~support]
    if off.shape[0]:
        _, so, vto = np.linalg.svd(off)
        null = null @ vto[int(np.sum(so > 1e-10)):].T  # vanish off the support of w
    if null.shape[1] == 0:
        raise ValueError("no u with u^T M = 0 on the support of w: (M, w) is not generic")
    best, score = None, 0.0
    for _ in range(tries):
        u = null @ rng.standard_normal(null.shape[1])
        sc = np.min(np.abs(u[support])) / np.linalg.norm(u)
        if sc > score:
            best, score = u, sc
    if best is None or score < 1e-8:
        raise ValueError("every u in ker M^T vanishes somewhere on the support of w")
    beta = np.ones(d)
    beta[support] = w[support] / best[support]
    return beta


def realise(kind: str, M: np.ndarray, ranks: Sequence[int], *, alpha: float = 1.0,
            D: np.ndarray | None = None, w: np.ndarray | None = None,
            rng: np.random.Generator | None = None, paper_v3: bool = False) -> LinearNet:
    r"""Layer weights of a ``kind`` network with layer ranks ``ranks`` realising the Theorem 4.1
    class member with low-rank part ``M`` (and ``alpha`` for grn_v1, diagonal ``D`` as a
    vector for grn_v2/v3, gate ``w`` for grn_v3). ``paper_v3=True`` uses the paper's output
    weights (all ones on layer slots), which is exact only when :math:`w^\top M = 0`."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    M = np.asarray(M, dtype=float)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"M must be a square matrix, got shape {M.shape}")
    d = M.shape[0]
    ranks = _check_ranks(ranks, d)
    T = len(ranks)
    if kind == "base":
        return _realise_base(M, ranks)
    if kind == "res":
        return _realise_res(M, ranks)
    D = np.ones(d) if D is None else np.asarray(D, dtype=float)
    w = np.zeros(d) if w is None else np.asarray(w, dtype=float)
    if D.shape != (d,) or w.shape != (d,):
        raise ValueError(f"D (diagonal) and w must be vectors of length d={d}")
    inner = [_slot_input_weights(kind, t, d) for t in range(T)]
    if kind == "grn_v1":
        V = split_low_rank(M, ranks)
        final = np.concatenate([[alpha], np.ones(T)])
        return LinearNet(kind, tuple(V), (*inner, final), (None,) * (T + 1))
    if kind == "grn_v2" or paper_v3:
        beta = np.ones(d)
    else:
        beta = gate_free_scaling(M, w, rng if rng is not None else np.random.default_rng(0))
    V = [Mt / beta[:, None] for Mt in split_low_rank(M, ranks)]
    final = np.vstack([D[None, :], np.tile(beta, (T, 1))])
    gates = (None,) * (T + 1) if kind == "grn_v2" else (*[np.zeros(d)] * T, w)
    return LinearNet(kind, tuple(V), (*inner, final), gates)


def target_map(kind: str, M: np.ndarray, X: np.ndarray, *, alpha: float = 1.0,
               D: np.ndarray | None = None, w: np.ndarray | None = None) -> np.ndarray:
    """The class member of Theorem 4.1 applied to the rows of ``X``."""
    d = M.shape[0]
    X = np.atleast_2d(np.asarray(X, dtype=float))
    if kind == "base":
        return X @ M.T
    if kind == "res":
        return X + X @ M.T
    if kind == "grn_v1":
        return alpha * X + X @ M.T
    D = np.ones(d) if D is None else np.asarray(D, dtype=float)
    out = X * D[None, :] + X @ M.T
    if kind == "grn_v3" and w is not None:
        out = out + np.maximum(X @ w, 0.0)[:, None] * X
    return out


def random_net(kind: str, d: int, ranks: Sequence[int], rng: np.random.Generator) -> LinearNet:
    """A network with random weights (layer t of rank exactly r_t, random combiner weights):
    for the "⊆" direction of Theorem 4.1."""
    ranks = _check_ranks(ranks, d)
    T = len(ranks)
    V = tuple(rng.standard_normal((d, r)) @ rng.standard_normal((r, d)) / d for r in ranks)
    if kind in ("base", "res"):
        return LinearNet(kind, V, (None,) * (T + 1), (None,) * (T + 1))
    if kind == "grn_v1":
        b = tuple(1.0 + 0.5 * rng.standard_normal(t + 1) for t in range(T + 1))
    else:
        b = tuple(1.0 + 0.5 * rng.standard_normal((t + 1, d)) for t in range(T + 1))
    w = tuple(rng.standard_normal(d) if kind == "grn_v3" else None for _ in range(T + 1))
    return LinearNet(kind, V, b, w)
