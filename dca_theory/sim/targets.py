r"""Regression targets for the toy networks (``dca-paper.md`` §1.1, §1.9, §1.10).

* :func:`spectral_target`: :math:`y = A x` with :math:`A - I = U \mathrm{diag}(\lambda) U^\top
  \succeq 0` and :math:`\lambda` spread over :math:`[\lambda_{\min}, \lambda_{\max}]` (Thm 4.3's
  setting; :math:`\kappa = \lambda_{\min}/\lambda_{\max}`).
* :func:`identity_target` and :func:`gaussian_target` (Figure 1 (a) and (b)).
* :class:`BottleneckTeacher`: :math:`y = \alpha x + h(g(x))` with :math:`g(x) = G x`,
  :math:`G \in \mathbb{R}^{k\times d}` with orthonormal rows and :math:`h(z) = H_2 \tanh(H_1 z +
  c)`. Its residual part :math:`h\circ g` has bottleneck rank and Jacobian rank exactly
  :math:`k` (Jacot 2023: :math:`J = H_2\,\mathrm{diag}(\tanh')\,H_1 G`, rank k for generic
  weights since :math:`\tanh' > 0`).

Inputs are always :math:`x \sim N(0, I_d)`; noise is added by the trainer.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from dca_theory import random_draws as draws


def check_finite(name: str, *arrays) -> None:
    """Raise a one-line ValueError if any array holds NaN or Inf (skipped under tracing)."""
    for a in arrays:
        if a is None or isinstance(a, jax.core.Tracer):
            continue
        arr = np.asarray(a)
        if not np.all(np.isfinite(arr)):
            bad = arr[~np.isfinite(arr)].ravel()[0]
            raise ValueError(f"{name} holds non-finite values (e.g. {bad}); data must be finite")


def _check_dim(dim) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
    return int(dim)


class LinearTarget(eqx.Module):
    """``y = A x + b``."""

    A: Float[Array, "d d"]
    b: Float[Array, " d"]

    def __init__(self, A, b=None):
        A = jnp.asarray(A)
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ValueError(f"A must be a square matrix, got shape {A.shape}")
        b = jnp.zeros(A.shape[0], A.dtype) if b is None else jnp.asarray(b, A.dtype)
        if b.shape != (A.shape[0],):
            raise ValueError(f"b must have shape ({A.shape[0]},), got {b.shape}")
        check_finite("target matrix A", A)
        check_finite("target bias b", b)
        self.A, self.b = A, b

    def __call__(self, x: Float[Array, " d"]) -> Float[Array, " d"]:
        return self.A @ x + self.b

    @property
    def dim(self) -> int:
        return self.A.shape[0]


def identity_target(dim: int, dtype=jnp.float32) -> LinearTarget:
    return LinearTarget(jnp.eye(_check_dim(dim), dtype=dtype))


def gaussian_target(dim: int, *, key: Array, bias: bool = True, dtype=jnp.float32) -> LinearTarget:
    """A and b with i.i.d. N(0, 1) entries (Figure 1 (b))."""
    dim = _check_dim(dim)
    ka, kb = jax.random.split(key)
    b = draws.normal(kb, (dim,), dtype) if bias else None
    return LinearTarget(draws.normal(ka, (dim, dim), dtype), b)


def spectral_target(
    dim: int, lam_min: float, lam_max: float, *, key: Array, spacing: str = "linear",
    dtype=jnp.float32,
) -> LinearTarget:
    """``A = I + U diag(λ) Uᵀ``, U Haar-orthogonal, λ from λ_max down to λ_min (A − I ⪰ 0)."""
    dim = _check_dim(dim)
    if not (np.isfinite(lam_min) and np.isfinite(lam_max)) or not 0 <= lam_min <= lam_max:
        raise ValueError(f"need 0 <= lam_min <= lam_max (finite), got {lam_min}, {lam_max}")
    if spacing == "linear":
        lam = np.linspace(lam_max, lam_min, dim)
    elif spacing == "geometric":
        if lam_min <= 0:
            raise ValueError(f"geometric spacing needs lam_min > 0, got {lam_min}")
        lam = np.geomspace(lam_max, lam_min, dim)
    else:
        raise ValueError(f"unknown spacing {spacing!r}; valid: linear, geometric")
    q, r = jnp.linalg.qr(draws.normal(key, (dim, dim), dtype))
    u = q * jnp.sign(jnp.diag(r))[None, :]  # Haar measure (Mezzadri 2007)
    A = jnp.eye(dim, dtype=dtype) + (u * jnp.asarray(lam, dtype)[None, :]) @ u.T
    return LinearTarget(A)


class BottleneckTeacher(eqx.Module):
    """``y = alpha * x + h(G x)``: identity-like skip plus a residual of bottleneck rank k.

    Args:
        dim: d. rank: k (1 <= k <= d). alpha: the skip scale (1 = ResNet-friendly; alpha != 1
        puts (alpha - 1) I into the residual a ResNet must fit, which a GRN-v1 absorbs).
        hidden: width of h (default 2 * max(k, pad_rank)). scale: RMS per coordinate of h(g(x))
        for x ~ N(0, I) (set by rescaling H_2 on 4096 samples). pad_rank: store G with this
        many rows, the ones past k zero (same function, rank k), so that teachers of different
        ranks stack into one batch for ``fit_many``.
    """

    G: Float[Array, "k d"]
    H1: Float[Array, "m k"]
    c: Float[Array, " m"]
    H2: Float[Array, "d m"]
    alpha: Float[Array, ""]

    def __init__(
        self, dim: int, rank: int, *, key: Array, alpha: float = 1.0, hidden: int | None = None,
        scale: float = 1.0, pad_rank: int | None = None, dtype=jnp.float32,
    ):
        dim = _check_dim(dim)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not (
            1 <= rank <= dim
        ):
            raise ValueError(f"teacher bottleneck rank must be an integer in [1, {dim}], "
                             f"got {rank!r}")
        check_finite("teacher alpha/scale", np.array([alpha, scale], dtype=float))
        stored = rank if pad_rank is None else int(pad_rank)
        if not rank <= stored <= dim:
            raise ValueError(f"pad_rank must lie in [rank={rank}, dim={dim}], got {pad_rank}")
        m = 2 * stored if hidden is None else hidden
        kg, k1, kc, k2, ks = jax.random.split(key, 5)
        q, _ = jnp.linalg.qr(draws.normal(kg, (dim, rank), dtype))
        self.G = jnp.zeros((stored, dim), dtype).at[:rank].set(q.T)
        # math.sqrt: a Python float keeps ``dtype`` (a NumPy float64 would widen it under x64)
        self.H1 = draws.normal(k1, (m, stored), dtype) * 1.5 / math.sqrt(rank)
        self.c = draws.normal(kc, (m,), dtype, scale=0.5)
        self.H2 = draws.normal(k2, (dim, m), dtype) / math.sqrt(m)
        self.alpha = jnp.asarray(alpha, dtype)
        probe = jax.vmap(self.residual)(draws.normal(ks, (4096, dim), dtype))
        rms = jnp.sqrt(jnp.mean(probe**2))
        self.H2 = self.H2 * (scale / rms)

    @property
    def dim(self) -> int:
        return self.G.shape[1]

    @property
    def rank(self) -> int:
        """k: the number of non-zero rows of G (host-side)."""
        return int(np.sum(np.any(np.asarray(self.G) != 0, axis=1)))

    def residual(self, x: Float[Array, " d"]) -> Float[Array, " d"]:
        """h(g(x)), the part of bottleneck rank k."""
        return self.H2 @ jnp.tanh(self.H1 @ (self.G @ x) + self.c)

    def skip(self, x: Float[Array, " d"]) -> Float[Array, " d"]:
        return self.alpha * x

    def __call__(self, x: Float[Array, " d"]) -> Float[Array, " d"]:
        return self.skip(x) + self.residual(x)
