r"""Training the toy networks with optax: jit-compiled, vmapped over seeds (and anything else).

Inputs are drawn fresh every step, :math:`x \sim N(0, I_d)` (the paper's n ≫ d regime), the
target is any callable module (see :mod:`dca_theory.sim.targets`) plus optional Gaussian noise,
and the loss is the per-coordinate MSE :math:`\frac{1}{Bd}\sum_b \|f(x_b) - y_b\|^2`. For
linear models ``loss="population"`` trains on the exact risk instead,
:math:`E\|y - \hat A x\|^2 / d = (\|A - \hat A\|_F^2 + \|b\|^2)/d` (``dca-paper.md`` §1.3), which
removes sampling noise when the trained risk is compared with the theory's optimum.

:func:`fit` trains one model; :func:`fit_many` maps it over a leading axis of stacked models
(seeds, widths padded to one shape, learning rates, ...) in one compiled program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float

from dca_theory import random_draws as draws
from dca_theory.sim.targets import check_finite

OPTIMIZERS = ("sgd", "adam", "adamw")
LOSSES = ("sample", "population")


@dataclasses.dataclass(frozen=True)
class ToyTrainConfig:
    """Steps, mini-batch, optimizer (``sgd`` or ``adam``), learning rate, label noise and
    ``loss`` (``sample``: fresh mini-batches; ``population``: exact risk of a linear model)."""

    steps: int = 1000
    batch_size: int = 100
    optimizer: str = "sgd"
    learning_rate: float = 1e-2
    noise_std: float = 0.0
    loss: str = "sample"
    weight_decay: float = 0.0  # adamw only; decays the layer weights, never the combiners

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; "
                             f"valid: {', '.join(OPTIMIZERS)}")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; valid: {', '.join(LOSSES)}")
        check_finite("learning_rate/noise_std", jnp.array([self.learning_rate, self.noise_std]))
        if self.learning_rate <= 0 or self.noise_std < 0:
            raise ValueError(f"need learning_rate > 0 and noise_std >= 0, got "
                             f"{self.learning_rate}, {self.noise_std}")


def _layer_weights(params):
    """Weight-decay mask: the stacked layer weights (P, Q, U, V: 3-D), not the GRN b, w."""
    return jax.tree_util.tree_map(lambda a: a is not None and a.ndim == 3, params)


def make_toy_optimizer(name: str, learning_rate, weight_decay: float = 0.0):
    """``learning_rate`` may be a traced scalar (so learning rates can be vmapped)."""
    if name == "sgd":
        return optax.sgd(learning_rate)
    if name == "adam":
        return optax.adam(learning_rate)
    if name == "adamw":
        return optax.adamw(learning_rate, weight_decay=weight_decay, mask=_layer_weights)
    raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")


def _dtype_of(model) -> jnp.dtype:
    leaves = [x for x in jax.tree_util.tree_leaves(model) if eqx.is_inexact_array(x)]
    return leaves[0].dtype


def sample_mse(model, target: Callable, x: Float[Array, "B d"], noise) -> Array:
    y = jax.vmap(target)(x) + noise
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def population_mse(model, target) -> Array:
    """(‖A − Â‖_F² + ‖b‖²)/d for a linear model with ``end_to_end_matrix`` and a LinearTarget."""
    A_hat = model.end_to_end_matrix()
    d = A_hat.shape[0]
    return (jnp.sum((target.A - A_hat) ** 2) + jnp.sum(target.b**2)) / d


def fit(model, target, key: Array, cfg: ToyTrainConfig, learning_rate=None):
    """Train one model; return ``(trained_model, losses)`` with the loss before every step."""
    lr = cfg.learning_rate if learning_rate is None else learning_rate
    params, static = eqx.partition(model, eqx.is_inexact_array)
    opt = make_toy_optimizer(cfg.optimizer, lr, cfg.weight_decay)
    dtype = _dtype_of(model)
    dim = model.dim

    def loss_fn(p, k):
        m = eqx.combine(p, static)
        if cfg.loss == "population":
            return population_mse(m, target)
        kx, kn = jax.random.split(k)
        x = jax.random.normal(kx, (cfg.batch_size, dim), dtype)
        noise = cfg.noise_std * jax.random.normal(kn, (cfg.batch_size, dim), dtype)
        return sample_mse(m, target, x, noise)

    def step(carry, k):
        p, s = carry
        loss, g = jax.value_and_grad(loss_fn)(p, k)
        with jax.numpy_dtype_promotion("standard"):  # optax: Python float ** int32 step count
            updates, s = opt.update(g, s, p)
        return (optax.apply_updates(p, updates), s), loss

    (params, _), losses = jax.lax.scan(
        step, (params, opt.init(params)), jax.random.split(key, cfg.steps)
    )
    return eqx.combine(params, static), losses


def _check_inputs(model, target, cfg: ToyTrainConfig) -> None:
    check_finite("model parameters", *[
        x for x in jax.tree_util.tree_leaves(model) if eqx.is_inexact_array(x)
    ])
    check_finite("target", *[
        x for x in jax.tree_util.tree_leaves(target) if eqx.is_inexact_array(x)
    ])
    if cfg.loss == "population" and not hasattr(target, "A"):
        raise ValueError("loss='population' needs a LinearTarget (a target with matrix A)")
    if cfg.loss == "population" and not getattr(model, "linear", False):
        raise ValueError("loss='population' needs a linear model (a DeepLinear whose combiners "
                         f"are linear); kind {getattr(model, 'kind', type(model).__name__)!r} "
                         "is not linear")


@eqx.filter_jit
def _fit_many_jit(models, target, keys, lrs, cfg, target_batched):
    in_axes = (0, 0 if target_batched else None, 0, 0)
    return eqx.filter_vmap(lambda m, t, k, lr: fit(m, t, k, cfg, lr), in_axes=in_axes)(
        models, target, keys, lrs
    )


def fit_many(
    models, target, keys: Array, cfg: ToyTrainConfig, *, learning_rates=None,
    target_batched: bool = False,
):
    """Train a batch of models (stacked on a leading axis, e.g. built with
    ``eqx.filter_vmap``) in one compiled program.

    ``target`` is shared, or stacked too with ``target_batched=True``; ``learning_rates`` is
    ``None`` (``cfg.learning_rate`` for all) or one value per model. Returns ``(models,
    losses)`` with ``losses`` of shape ``(n_models, steps)``.
    """
    _check_inputs(models, target, cfg)
    n = keys.shape[0]
    lr = jnp.full((n,), cfg.learning_rate) if learning_rates is None else jnp.asarray(
        learning_rates)
    if lr.shape != (n,):
        raise ValueError(f"learning_rates must have shape ({n},), got {lr.shape}")
    return _fit_many_jit(models, target, keys, lr.astype(_dtype_of(models)), cfg, target_batched)


def train(model, target, key: Array, cfg: ToyTrainConfig):
    """Train one model (jit-compiled); see :func:`fit`."""
    _check_inputs(model, target, cfg)
    return eqx.filter_jit(fit)(model, target, key, cfg)


def evaluate_toy(model, target, key: Array, *, n: int = 4096, noise_std: float = 0.0) -> Array:
    """Test MSE per coordinate on ``n`` fresh inputs x ~ N(0, I)."""
    dtype = _dtype_of(model)
    kx, kn = jax.random.split(key)
    x = draws.normal(kx, (n, model.dim), dtype)
    return sample_mse(model, target, x, draws.normal(kn, x.shape, dtype, scale=noise_std))
