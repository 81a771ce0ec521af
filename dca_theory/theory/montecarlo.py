r"""Monte Carlo estimates of the Gaussian expectations in the GRN-v3 bound (Theorem 4.2,
Appendix B), numpy only, for x ~ N(0, I_d) and σ = ReLU.

* :func:`relu_outer_moment`: :math:`E[\sigma(w^\top x)\, x x^\top]`; Lemma B.1 gives
  :math:`(\|w\| I + w w^\top/\|w\|)/\sqrt{2\pi}` (for :math:`w = e_1`: :math:`(I + e_1e_1^\top)
  /\sqrt{2\pi}`).
* :func:`relu_norm_moment`: :math:`E[\sigma(w^\top x)^2 \|x\|^2]`; the closed form is
  :math:`\|w\|^2 (d+2)/2` (see :func:`dca_theory.theory.symbolic.relu_norm_moment`).
* :func:`v3_risk`: :math:`E\|Bx - \sigma(w^\top x)x\|^2`, against :func:`v3_risk_closed_form`.

Every estimate comes with its standard error (sample std / √n), so callers can test agreement
at a stated number of standard errors. Samples are drawn in chunks to bound memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SQRT_2PI = float(np.sqrt(2.0 * np.pi))


@dataclass(frozen=True)
class Estimate:
    """A Monte Carlo mean with its standard error (same shape)."""

    mean: np.ndarray | np.floating  # a NumPy scalar for a scalar statistic
    stderr: np.ndarray | np.floating
    n: int

    def zscore(self, exact) -> np.ndarray | np.floating:
        """|mean - exact| / stderr, elementwise."""
        return np.abs(self.mean - np.asarray(exact)) / self.stderr


def _check(d: int, n: int) -> None:
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    if n < 2:
        raise ValueError(f"n (samples) must be >= 2, got {n}")


def _mc(sample_fn, n: int, rng: np.random.Generator, chunk: int = 50_000) -> Estimate:
    """Mean and standard error of ``sample_fn(x_chunk)`` (one value, or array, per sample)."""
    total = total_sq = None
    done = 0
    while done < n:
        m = min(chunk, n - done)
        vals = sample_fn(m, rng)
        s, s2 = vals.sum(axis=0), (vals * vals).sum(axis=0)
        total = s if total is None else total + s
        total_sq = s2 if total_sq is None else total_sq + s2
        done += m
    mean = total / n
    var = np.maximum(total_sq / n - mean * mean, 0.0) * n / (n - 1)
    return Estimate(mean=mean, stderr=np.sqrt(var / n), n=n)


def relu_outer_moment(w: np.ndarray, n: int, rng: np.random.Generator) -> Estimate:
    r"""Estimate :math:`E[\sigma(w^\top x) x x^\top]` (a d×d matrix)."""
    w = np.asarray(w, dtype=float)
    d = w.shape[0]
    _check(d, n)

    def sample(m, g):
        x = g.standard_normal((m, d))
        return np.maximum(x @ w, 0.0)[:, None, None] * x[:, :, None] * x[:, None, :]

    return _mc(sample, n, rng, chunk=max(1, 2_000_000 // (d * d)))


def relu_outer_closed_form(w: np.ndarray) -> np.ndarray:
    r"""Lemma B.1 rotated to direction ``w``: :math:`(\|w\| I + ww^\top/\|w\|)/\sqrt{2\pi}`."""
    w = np.asarray(w, dtype=float)
    nw = np.linalg.norm(w)
    if nw == 0:
        return np.zeros((w.size, w.size))
    return (nw * np.eye(w.size) + np.outer(w, w) / nw) / SQRT_2PI


def relu_norm_moment(w: np.ndarray, n: int, rng: np.random.Generator) -> Estimate:
    r"""Estimate :math:`E[\sigma(w^\top x)^2 \|x\|^2]`."""
    w = np.asarray(w, dtype=float)
    d = w.shape[0]
    _check(d, n)

    def sample(m, g):
        x = g.standard_normal((m, d))
        return np.maximum(x @ w, 0.0) ** 2 * np.einsum("nd,nd->n", x, x)

    return _mc(sample, n, rng)


def relu_norm_closed_form(w: np.ndarray, d_shift: int = 2) -> float:
    r""":math:`\|w\|^2 (d + \text{d\_shift})/2`; ``d_shift=2`` is correct, ``1`` is the value the
    paper's constant :math:`1/(\pi(d+1))` implies."""
    w = np.asarray(w, dtype=float)
    return float(w @ w) * (w.size + d_shift) / 2.0


def v3_risk(B: np.ndarray, w: np.ndarray, n: int, rng: np.random.Generator) -> Estimate:
    r"""Estimate :math:`E\|Bx - \sigma(w^\top x)x\|^2` (the GRN-v3 excess risk of
    :math:`x \mapsto (D+M)x + \sigma(w^\top x)x` when :math:`B = A - D - M`)."""
    B, w = np.asarray(B, dtype=float), np.asarray(w, dtype=float)
    d = w.shape[0]
    _check(d, n)
    if B.shape != (d, d):
        raise ValueError(f"B must be {d}x{d} to match w, got shape {B.shape}")

    def sample(m, g):
        x = g.standard_normal((m, d))
        res = x @ B.T - np.maximum(x @ w, 0.0)[:, None] * x
        return np.einsum("nd,nd->n", res, res)

    return _mc(sample, n, rng)


def v3_risk_closed_form(B: np.ndarray, w: np.ndarray, d_shift: int = 2) -> float:
    r""":math:`\|B\|_F^2 - 2(\|w\|\mathrm{tr}B + w^\top Bw/\|w\|)/\sqrt{2\pi}
    + \|w\|^2(d+2)/2` (Lemma B.1 and the norm moment; ``w = 0`` gives :math:`\|B\|_F^2`)."""
    B, w = np.asarray(B, dtype=float), np.asarray(w, dtype=float)
    nw = float(np.linalg.norm(w))
    cross = 0.0 if nw == 0 else (nw * np.trace(B) + w @ B @ w / nw) / SQRT_2PI
    return float(np.sum(B * B) - 2.0 * cross + relu_norm_closed_form(w, d_shift))
