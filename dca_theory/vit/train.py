r"""Train ViT classifiers with AdamW, several seeds at once (``vmap`` over seeds).

Objective: mean softmax cross-entropy :math:`-\frac1B\sum_b \log p_\theta(y_b\mid x_b)`.
Optimiser (big_vision style): global-norm gradient clipping, then AdamW with linear warm-up and
cosine decay to zero. Weight decay applies to Dense weight matrices only: not to biases, norms,
positions, the class token, or the GRN/DCA weights ``b, w``. Decaying ``b`` (initialised to 1)
towards 0 would pull a DCA model away from the residual network it equals at initialisation.

All seeds share one compiled step: models, optimiser states and data orders carry a leading seed
axis ``S``. Each seed has its own initialisation key, data order and dropout keys, so the seeds
are independent runs that merely share the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float, Int
from tqdm.auto import tqdm

from dca_theory.lm.seed_loop import init_optimizer
from dca_theory.vit.config import ViTConfig
from dca_theory.vit.data import ImageSplit
from dca_theory.vit.model import ViT


@dataclass(frozen=True)
class ViTTrainConfig:
    """Optimisation settings. ``eval_every`` steps between test-set evaluations."""

    steps: int = 1500
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.05
    b1: float = 0.9
    b2: float = 0.999
    grad_clip: float = 1.0
    eval_every: int = 250

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"ViTTrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps={self.steps}), "
                             f"got {self.warmup_steps}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


def decay_mask(params) -> object:
    """True for Dense weight matrices: leaves named ``w_*`` (``w_q_DxD``, ``w_head_DxK``, ...)
    with ndim >= 2. The GRN's ``w`` (a vector) and ``b``, norms and positions are excluded."""

    def is_matrix(path, leaf) -> bool:
        name = str(getattr(path[-1], "name", "")) if path else ""
        return name.startswith("w_") and jnp.ndim(leaf) >= 2

    return jax.tree_util.tree_map_with_path(is_matrix, params)


def masked_weight_decay(rate: float, mask_P: Array) -> optax.GradientTransformation:
    """``u + rate * mask * params`` (optax's ``add_decayed_weights`` with an elementwise mask)."""

    def update(updates, state, params):
        return updates + rate * mask_P * params, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_vit_optimizer(tc: ViTTrainConfig, mask_P: Array) -> optax.GradientTransformation:
    """Clipping, then AdamW (= scale_by_adam, decoupled decay, learning rate) on the flat
    parameter vector; ``mask_P`` is 1 where weight decay applies."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, tc.lr, tc.warmup_steps, tc.steps, 0.0)
    return optax.chain(
        optax.clip_by_global_norm(tc.grad_clip),
        optax.scale_by_adam(b1=tc.b1, b2=tc.b2),
        masked_weight_decay(tc.weight_decay, mask_P),
        optax.scale_by_learning_rate(schedule),
    )


def cross_entropy(logits_BxK: Float[Array, "B K"], labels_B: Int[Array, " B"]):
    """Per-example cross-entropy and correctness."""
    loss_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxK, labels_B)
    return loss_B, (jnp.argmax(logits_BxK, axis=-1).astype(labels_B.dtype) == labels_B)


def init_models(cfg: ViTConfig, seeds) -> ViT:
    """``len(seeds)`` ViTs stacked along a leading seed axis (one init key per seed)."""
    # Built one by one and stacked: eager init reuses the per-op compilations across seeds and
    # residual kinds, which is much faster on CPU than compiling a jitted, vmapped init.
    models = [ViT(cfg, key=jax.random.PRNGKey(int(s))) for s in seeds]
    params = [eqx.filter(m, eqx.is_inexact_array) for m in models]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params)
    return eqx.combine(stacked, eqx.filter(models[0], eqx.is_inexact_array, inverse=True))


@dataclass(frozen=True)
class FlatModels:
    """Stacked models as one parameter matrix ``(S, P)`` plus what rebuilds them.

    The optimiser then updates one array instead of ~100 leaves, which cuts compile time.
    """

    flat_SxP: Array
    unravel: Callable  # (P,) -> parameter pytree of one model
    static: object  # the non-parameter part of the models
    mask_P: Array  # 1.0 where weight decay applies

    @classmethod
    def build(cls, models: ViT) -> FlatModels:
        params, static = eqx.partition(models, eqx.is_inexact_array)
        one = jax.tree_util.tree_map(lambda x: x[0], params)
        _, unravel = ravel_pytree(one)
        mask = jax.tree_util.tree_map(lambda m, x: jnp.full(x.shape, m, x.dtype),
                                      decay_mask(one), one)
        flat_SxP = jax.vmap(lambda p: ravel_pytree(p)[0])(params)
        return cls(flat_SxP, unravel, static, ravel_pytree(mask)[0])

    def model(self, flat_P: Array) -> ViT:
        return eqx.combine(self.unravel(flat_P), self.static)

    def models(self, flat_SxP: Array) -> ViT:
        """The stacked models (leading seed axis) for parameters ``flat_SxP``."""
        return eqx.combine(jax.vmap(self.unravel)(flat_SxP), self.static)


def _batch_logits(model: ViT, images, key, inference: bool):
    if key is None:  # inference: no dropout, no keys
        return jax.vmap(lambda im: model(im, inference=True))(images)
    keys = jax.random.split(key, images.shape[0])
    return jax.vmap(lambda im, k: model(im, key=k, inference=inference))(images, keys)


def make_step(fm: FlatModels, opt: optax.GradientTransformation) -> Callable:
    """One jitted AdamW step for every seed: ``(flat_SxP, opt_S, x, y, idx_SxB, keys_S, t)``;
    seed ``s`` uses dropout key ``fold_in(keys_S[s], t)`` at step ``t``."""

    def loss_fn(flat_P, images, labels, key):
        logits = _batch_logits(fm.model(flat_P), images, key, inference=False)
        loss_B, correct_B = cross_entropy(logits, labels)
        return jnp.mean(loss_B), jnp.mean(correct_B)

    def one_seed(flat_P, opt_state, x_all, y_all, idx_B, key, t):
        (loss, acc), grad_P = jax.value_and_grad(loss_fn, has_aux=True)(
            flat_P, x_all[idx_B], y_all[idx_B], jax.random.fold_in(key, t))
        with jax.numpy_dtype_promotion("standard"):  # optax: Python float ** int32 step count
            updates, opt_state = opt.update(grad_P, opt_state, flat_P)
        return flat_P + updates, opt_state, loss, acc

    @jax.jit
    def step(flat_SxP, opt_state, x_all, y_all, idx_SxB, keys_S, t):
        return jax.vmap(one_seed, in_axes=(0, 0, None, None, 0, 0, None))(
            flat_SxP, opt_state, x_all, y_all, idx_SxB, keys_S, t)

    return step


def make_eval(fm: FlatModels) -> Callable:
    """Jitted ``(flat_SxP, images, labels) -> (loss_sum_S, correct_S)`` at inference."""

    def one_seed(flat_P, images, labels):
        logits = _batch_logits(fm.model(flat_P), images, None, True)
        loss_B, correct_B = cross_entropy(logits, labels)
        return jnp.sum(loss_B), jnp.sum(correct_B)

    return jax.jit(jax.vmap(one_seed, in_axes=(0, None, None)))


def evaluate_vit(eval_fn: Callable, params, split: ImageSplit, batch_size: int = 512):
    """Mean test loss and accuracy per seed, as numpy arrays ``(S,)``."""
    loss = correct = 0.0
    for start in range(0, len(split), batch_size):
        images = jnp.asarray(split.images[start:start + batch_size])
        labels = jnp.asarray(split.labels[start:start + batch_size])
        batch_loss, batch_correct = eval_fn(params, images, labels)
        loss, correct = loss + np.asarray(batch_loss), correct + np.asarray(batch_correct)
    return loss / len(split), correct / len(split)


def data_orders(n: int, tc: ViTTrainConfig, seeds) -> np.ndarray:
    """Per-seed example indices ``(S, steps, B)``: epoch-wise reshuffling without replacement."""
    per_epoch = n // tc.batch_size
    if per_epoch < 1:
        raise ValueError(f"batch_size {tc.batch_size} exceeds the {n} training examples")
    epochs = -(-tc.steps // per_epoch)
    orders = []
    for seed in seeds:
        rng = np.random.default_rng([int(seed), 1])  # independent of the init key stream
        idx = np.concatenate([rng.permutation(n)[:per_epoch * tc.batch_size]
                              for _ in range(epochs)])
        orders.append(idx[:tc.steps * tc.batch_size].reshape(tc.steps, tc.batch_size))
    return np.stack(orders).astype(np.int32)


def train_vit_seeds(cfg: ViTConfig, tc: ViTTrainConfig, train: ImageSplit, test: ImageSplit, seeds,
                    *, log: Callable[..., None] | None = None, desc: str = "train",
                    progress: bool = True) -> dict:
    """Train one ViT per seed on ``train``; evaluate on ``test`` every ``eval_every`` steps.

    ``log(**metrics)`` (e.g. :meth:`dca_theory.io.RunDir.log`) receives one record per
    evaluation with per-seed lists. Returns the final per-seed metrics, the evaluation history
    and the trained (stacked) models.
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    fm = FlatModels.build(init_models(cfg, seeds))
    params = fm.flat_SxP
    opt = make_vit_optimizer(tc, fm.mask_P)
    opt_state = init_optimizer(opt, params)
    step, eval_fn = make_step(fm, opt), make_eval(fm)
    orders = data_orders(len(train), tc, seeds)
    x_all, y_all = jnp.asarray(train.images), jnp.asarray(train.labels)
    dropout_keys = jnp.stack([jax.random.PRNGKey(s + 10_000) for s in seeds])
    history: list[dict] = []
    running = jnp.zeros(len(seeds))  # summed on device: no host sync between evaluations
    bar = tqdm(range(1, tc.steps + 1), desc=desc, disable=not progress, leave=False)
    for t in bar:
        params, opt_state, loss_S, _ = step(params, opt_state, x_all, y_all,
                                            jnp.asarray(orders[:, t - 1]), dropout_keys,
                                            jnp.asarray(t, jnp.int32))
        running = running + loss_S.astype(running.dtype)
        if t % tc.eval_every == 0 or t == tc.steps:
            n_since = t - (history[-1]["step"] if history else 0)
            running = np.asarray(running)
            if not np.all(np.isfinite(running)):
                raise FloatingPointError(f"non-finite training loss at step {t} ({desc})")
            test_loss, test_acc = evaluate_vit(eval_fn, params, test)
            record = {"step": t, "train_loss": (running / n_since).tolist(),
                      "test_loss": test_loss.tolist(), "test_acc": test_acc.tolist()}
            history.append(record)
            if log is not None:
                log(run=desc, **record)
            bar.set_postfix(acc=f"{test_acc.mean():.3f}", loss=f"{test_loss.mean():.3f}")
            running = jnp.zeros(len(seeds))
    return {"seeds": seeds, "test_loss": history[-1]["test_loss"],
            "test_acc": history[-1]["test_acc"], "history": history,
            "models": fm.models(params)}
