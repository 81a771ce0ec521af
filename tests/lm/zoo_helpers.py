"""Shared helpers for the model-zoo tests (test_model, test_baselines, test_retrofit, ...).

One jitted forward function for all zoo test files: models with equal structure (same config)
then reuse one compilation, which keeps the default test set fast on a 2-core CPU.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from perturbation import perturb  # noqa: F401  (re-exported for the LM tests)

from dca_theory.lm.config import PRESETS

TINY = PRESETS["tiny"]
F64 = TINY.replace(param_dtype="float64", compute_dtype="float64")
L = TINY.max_len
# float32: a few ulps of the logit scale (summation order differs: the GRN sums the stack at
# once, vanilla adds recursively); float64: the same relative to float64's epsilon.
TOL = {"float32": 1e-6, "float64": 1e-12}


@eqx.filter_jit
def logits(model, toks):
    return model(toks, inference=True)


@eqx.filter_jit
def logits_with_dropout(model, toks, key):
    return model(toks, key=key)


@eqx.filter_jit
def logits_and_gradient(model, toks):
    """The logits of ``toks`` and the gradient of their mean cross-entropy (each position
    scored against its own token: any scalar that every logit reaches will do), in one program
    per model: compiling dominates the zoo's float64 equality tests."""
    def loss(m):
        out = m(toks, inference=True)
        return jnp.mean(jax.nn.logsumexp(out, axis=-1) - out[jnp.arange(toks.shape[0]), toks]), out

    (_, out), grad = eqx.filter_value_and_grad(loss, has_aux=True)(model)
    return out, grad


def tokens(seed=0, length=L):
    return jax.random.randint(jax.random.PRNGKey(seed), (length,), 0, TINY.vocab_size)


def assert_close_logits(a, b, dtype):
    scale = float(jnp.max(jnp.abs(b)))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=TOL[dtype] * scale)


def causal_jacobian_norms(model, x_LxD):
    """``N[i, j] = ‖d logits[i, 3] / d x[j]‖`` for every pair of positions."""
    jac = eqx.filter_jit(
        lambda m, x: jax.jacrev(lambda y: m.apply_embedded(y, inference=True)[:, 3])(x)
    )(model, x_LxD)
    return np.asarray(jnp.linalg.norm(jac, axis=-1))


@eqx.filter_jit
def apply_block(block, x_LxD):
    """A pre-LN block's output ``x + f(x)`` (causal); one compilation per block structure."""
    return block(x_LxD, causal=True)


@eqx.filter_jit
def apply_branch(block, x_LxD):
    return block.branch(x_LxD, causal=True)


@eqx.filter_jit
def apply_trunk(trunk, x_LxD):
    return trunk(x_LxD, causal=True)


@eqx.filter_jit
def states_of(model, toks):
    return model.forward_with_states(toks, inference=True)[1]
