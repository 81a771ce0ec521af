r"""Pure training and evaluation steps for the transformer LM (no I/O, no Python state).

The loss is the mean next-token cross-entropy over the weighted target positions of a batch,

.. math::  \mathcal L = \frac{\sum_{b,l} w_{bl}\, (-\log p_\theta(y_{bl}\mid x_{b,\le l}))}
                             {\sum_{b,l} w_{bl}},

and perplexity is :math:`\exp\mathcal L` (the paper's metric, §3.3). Gradient accumulation sums
the *numerator and denominator* over micro-batches before dividing, so an accumulated step has
the same gradient as one large batch, whatever the weights.

Models follow the zoo's contract: ``model(tokens_L, *, key=None, inference=False) ->
logits_LxV`` for one sequence; batching is ``jax.vmap``. The trainable parameters are the inexact
array leaves of the model (``eqx.partition(model, eqx.is_inexact_array)``); the rest is static.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from dca_theory.lm.optim import learning_rate
from dca_theory.lm.train_config import LMTrainConfig

Batch = dict[str, ArrayLike]  # NumPy arrays from the loader, jax arrays once traced


def cast_floating(tree, dtype):
    """Cast every floating array leaf (mixed precision: f32 master weights, ``dtype`` compute)."""
    return jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, tree)


def weighted_nll(params, static, batch: Batch, key, compute_dtype) -> tuple[jax.Array, jax.Array]:
    """Sum of weighted token NLLs and sum of weights; dropout on iff ``key`` is not None."""
    model = eqx.combine(cast_floating(params, compute_dtype), static)
    inputs_BxL = batch["inputs"]
    if key is None:
        logits_BxLxV = jax.vmap(lambda t: model(t, inference=True))(inputs_BxL)
    else:
        keys = jax.random.split(key, inputs_BxL.shape[0])
        logits_BxLxV = jax.vmap(lambda t, k: model(t, key=k))(inputs_BxL, keys)
    # cast to f32 for the softmax: bf16 log-sum-exp over a 10k vocabulary loses digits.
    nll_BxL = optax.softmax_cross_entropy_with_integer_labels(
        logits_BxLxV.astype(jnp.float32), batch["targets"])
    weights_BxL = batch["weights"].astype(jnp.float32)
    return jnp.sum(nll_BxL * weights_BxL), jnp.sum(weights_BxL)


def make_grad_fn(static, compute_dtype) -> Callable:
    """``grad_fn(params, batch, key) -> (grads of the NLL sum, (nll_sum, weight_sum))``."""

    def nll_with_aux(p, b, k):
        nll, w = weighted_nll(p, static, b, k, compute_dtype)
        return nll, (nll, w)

    return jax.grad(nll_with_aux, has_aux=True)


def accumulate_gradients(grad_fn, params, batch: Batch, key, n_micro: int):
    """Mean-loss gradient of ``batch`` computed over ``n_micro`` sequential micro-batches.

    Returns ``(grads, nll_sum, weight_sum)``; micro-batch ``i`` draws dropout from
    ``fold_in(key, i)``.
    """
    micro = jax.tree_util.tree_map(
        lambda x: x.reshape(n_micro, x.shape[0] // n_micro, *x.shape[1:]), batch)

    def accumulate(carry, xs):
        grads_sum, nll_sum, w_sum = carry
        i, mb = xs
        g, (nll, w) = grad_fn(params, mb, jax.random.fold_in(key, i))
        grads_sum = jax.tree_util.tree_map(jnp.add, grads_sum, g)
        return (grads_sum, nll_sum + nll, w_sum + w), None

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
    (grads, nll, w), _ = jax.lax.scan(accumulate, init, (jnp.arange(n_micro), micro))
    return jax.tree_util.tree_map(lambda g: g / w, grads), nll, w


def make_train_step(static, optimizer: optax.GradientTransformation,
                    cfg: LMTrainConfig) -> Callable:
    """``train_step(params, opt_state, rng, batch, step) -> (params, opt_state, metrics)``.

    The batch of ``cfg.batch_size`` rows is split into ``cfg.grad_accum`` sequential
    micro-batches; dropout keys are ``fold_in(fold_in(rng, step), micro)`` so that a resumed run
    draws exactly the same randomness.
    """
    grad_fn = make_grad_fn(static, jnp.dtype(cfg.compute_dtype))
    schedule = learning_rate(cfg)

    def train_step(params, opt_state, rng, batch: Batch, step):
        step_key = jax.random.fold_in(rng, step)
        grads, nll, w = accumulate_gradients(grad_fn, params, batch, step_key, cfg.grad_accum)
        with jax.numpy_dtype_promotion("standard"):  # optax: Python float ** int32 step count
            updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": nll / w, "grad_norm": optax.global_norm(grads),
                   "lr": schedule(step), "tokens": w}
        return params, opt_state, metrics

    return train_step


def make_eval_step(static, cfg: LMTrainConfig) -> Callable:
    """``eval_step(params, batch) -> (nll_sum, weight_sum)`` without dropout."""
    compute_dtype = jnp.dtype(cfg.compute_dtype)

    def eval_step(params, batch: Batch):
        return weighted_nll(params, static, batch, None, compute_dtype)

    return eval_step
