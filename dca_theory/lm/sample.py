r"""Autoregressive sampling from a trained LM: :math:`y_{t+1} \sim \mathrm{softmax}(z_t / T)`,
optionally restricted to the ``top_k`` most likely tokens.

Two ways to get the logits :math:`z_t` of the next token, with the same tokens as result:

* **cached** (the default, :mod:`dca_theory.lm.decode`): the prompt fills a key/value cache
  once, then each new token is one compiled step that attends over the cache;
* **uncached** (``cache=False``, and any model whose trunk has no cached step): the model runs
  on a fixed-length buffer of ``max_len`` tokens (zero-padded on the right) and the logits at
  the last real position are read; the model is causal, so that is exactly the next-token
  distribution, and one compiled function serves every step.

Once the text is longer than ``max_len`` the window slides (the model only ever sees its
trained context length). Every position then moves, so the cached sampler re-fills its cache
from the window at each such step: the cache saves work only while the text fits ``max_len``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dca_theory.lm.decode import decode_step, prefill, supports_cache


def _pick(logits_V, key, temperature: float, top_k: int | None):
    """The next token from float32 logits: argmax at ``temperature == 0``, else a sample."""
    if temperature == 0.0:
        return jnp.argmax(logits_V).astype(jnp.int32)
    logits_V = logits_V / temperature
    if top_k is not None:
        kth = jax.lax.top_k(logits_V, min(top_k, logits_V.shape[0]))[0][-1]
        logits_V = jnp.where(logits_V < kth, -jnp.inf, logits_V)
    return jax.random.categorical(key, logits_V).astype(jnp.int32)


def _next_token_fn(temperature: float, top_k: int | None):
    @eqx.filter_jit
    def next_token(model, buffer_L, pos, key):
        logits_V = model(buffer_L, inference=True)[pos].astype(jnp.float32)
        return _pick(logits_V, key, temperature, top_k)

    return next_token


def _cached_fns(temperature: float, top_k: int | None):
    @eqx.filter_jit
    def pick(logits_V, key):
        return _pick(logits_V.astype(jnp.float32), key, temperature, top_k)

    return eqx.filter_jit(prefill), eqx.filter_jit(decode_step), pick


def _buffer(window: Sequence[int], max_len: int) -> jax.Array:
    buffer_L = np.zeros(max_len, np.int32)
    buffer_L[: len(window)] = window
    return jnp.asarray(buffer_L)


def _check(model, prompt, n_tokens: int, max_len: int, temperature: float,
           top_k: int | None) -> None:
    if not 1 <= max_len <= model.cfg.max_len:
        raise ValueError(f"max_len must be in [1, {model.cfg.max_len}] (the model's max_len), "
                         f"got {max_len}")
    if len(prompt) == 0:
        raise ValueError("the prompt encodes to zero tokens; give a non-empty --prompt")
    if n_tokens < 0:
        raise ValueError(f"number of tokens must be >= 0, got {n_tokens}")
    if not temperature >= 0 or temperature == float("inf"):  # also refuses nan
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")


def generate(model, prompt: Sequence[int] | np.ndarray, n_tokens: int, *, max_len: int, key,
             temperature: float = 1.0, top_k: int | None = None,
             cache: bool = True) -> np.ndarray:
    """Return ``prompt`` followed by ``n_tokens`` sampled tokens (``temperature=0``: greedy).

    ``cache`` decodes incrementally (:mod:`dca_theory.lm.decode`); a model whose trunk has no
    cached step falls back to the uncached sampler with one line on stderr. Both give the same
    tokens for the same ``key`` (step ``i`` samples with ``fold_in(key, i)``)."""
    _check(model, prompt, n_tokens, max_len, temperature, top_k)
    tokens = [int(t) for t in prompt]
    if cache and not supports_cache(model):
        print(f"sample: no cached decoding for the {model.cfg.residual!r} trunk "
              f"({type(model.trunk).__name__}); using the uncached sampler", file=sys.stderr)
        cache = False
    if not cache:
        next_token = _next_token_fn(float(temperature), top_k)
        for i in range(n_tokens):
            window = tokens[-max_len:]
            # positions are traced (an array), so every step reuses one compiled function
            pos = jnp.asarray(len(window) - 1, jnp.int32)
            tokens.append(int(next_token(model, _buffer(window, max_len), pos,
                                         jax.random.fold_in(key, i))))
        return np.asarray(tokens, np.int32)

    fill, step, pick = _cached_fns(float(temperature), top_k)

    def refill():
        window = tokens[-max_len:]
        return fill(model, _buffer(window, max_len), jnp.asarray(len(window), jnp.int32))

    logits_V, state = refill()
    for i in range(n_tokens):
        tok = pick(logits_V, jax.random.fold_in(key, i))
        tokens.append(int(tok))
        if i + 1 == n_tokens:
            break
        if len(tokens) <= max_len:  # the cache holds len(tokens) - 1 rows: room for this one
            logits_V, state = step(model, state, tok)
        else:  # the window slides: every position changes
            logits_V, state = refill()
    return np.asarray(tokens, np.int32)
