r"""Autoregressive sampling from a trained LM: :math:`y_{t+1} \sim \mathrm{softmax}(z_t / T)`,
optionally restricted to the ``top_k`` most likely tokens.

The model is causal, so running it on a fixed-length buffer of ``max_len`` tokens (zero-padded
on the right) and reading the logits at the last real position gives exactly the next-token
distribution; one compiled function serves every step. Once the text is longer than ``max_len``
the window slides (the model only ever sees its trained context length). No KV cache: sampling is
for inspecting a model, not for serving it.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def _next_token_fn(model, temperature: float, top_k: int | None):
    @eqx.filter_jit
    def next_token(model, buffer_L, pos, key):
        logits_V = model(buffer_L, inference=True)[pos].astype(jnp.float32)
        if temperature == 0.0:
            return jnp.argmax(logits_V).astype(jnp.int32)
        logits_V = logits_V / temperature
        if top_k is not None:
            kth = jax.lax.top_k(logits_V, min(top_k, logits_V.shape[0]))[0][-1]
            logits_V = jnp.where(logits_V < kth, -jnp.inf, logits_V)
        return jax.random.categorical(key, logits_V).astype(jnp.int32)

    return next_token


def generate(model, prompt: Sequence[int], n_tokens: int, *, max_len: int, key,
             temperature: float = 1.0, top_k: int | None = None) -> np.ndarray:
    """Return ``prompt`` followed by ``n_tokens`` sampled tokens (``temperature=0``: greedy)."""
    if len(prompt) == 0:
        raise ValueError("the prompt encodes to zero tokens; give a non-empty --prompt")
    if n_tokens < 0:
        raise ValueError(f"number of tokens must be >= 0, got {n_tokens}")
    if not temperature >= 0 or temperature == float("inf"):  # also refuses nan
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    next_token = _next_token_fn(model, float(temperature), top_k)
    tokens = [int(t) for t in prompt]
    for i in range(n_tokens):
        window = tokens[-max_len:]
        buffer_L = np.zeros(max_len, np.int32)
        buffer_L[: len(window)] = window
        # positions are traced (an array), so every step reuses one compiled function
        pos = jnp.asarray(len(window) - 1, jnp.int32)
        tok = next_token(model, jnp.asarray(buffer_L), pos, jax.random.fold_in(key, i))
        tokens.append(int(tok))
    return np.asarray(tokens, np.int32)
