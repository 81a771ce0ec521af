r"""AdamW with the paper's learning-rate schedule (Flax lm1b ``create_learning_rate_schedule``).

.. math::
    \eta(s) = \eta_0 \cdot \begin{cases} s / s_w & s < s_w \\
                                        \sqrt{s_w / s} & s \ge s_w \end{cases}

linear warm-up from 0 over :math:`s_w` steps, then inverse square root decay (Raffel et al.
2020, as cited in the paper's §3.3), with :math:`s` the number of optimiser updates already
made. AdamW uses β1 = 0.9, β2 = 0.98, eps = 1e-9, weight decay 0.1 by default (decoupled, applied
to every parameter, as ``optax.adamw`` without a mask does in the lm1b example). Optional
global-norm gradient clipping runs before AdamW.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from dca_theory.lm.train_config import LMTrainConfig


def learning_rate(cfg: LMTrainConfig):
    """The schedule as an ``optax`` schedule (a function of the update count)."""
    lr, warmup = cfg.lr, cfg.warmup_steps

    def schedule(count):
        step = jnp.asarray(count, jnp.float32)
        if warmup == 0:
            return lr * jnp.ones_like(step)
        warm = step / warmup
        decay = jnp.sqrt(warmup / jnp.maximum(step, warmup))
        return lr * jnp.where(step < warmup, warm, decay)

    return schedule


def make_lm_optimizer(cfg: LMTrainConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(learning_rate(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay)
    if cfg.clip_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw)
