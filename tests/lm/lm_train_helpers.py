"""Shared helpers for the LM training tests: a tiny stand-in model and an f32 switch.

The stand-in has the model zoo's call signature (``model(tokens_L, *, key=None,
inference=False) -> logits_LxV``) and is causal (each position sees itself and the previous
token), so the training machinery can be tested independently of the zoo.
"""

from __future__ import annotations

import contextlib
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dca_theory.lm.config import ModelConfig


class BigramMLP(eqx.Module):
    embed: eqx.nn.Embedding
    mix: eqx.nn.Linear
    out: eqx.nn.Linear
    dropout: eqx.nn.Dropout

    def __init__(self, cfg: ModelConfig, *, key):
        k1, k2, k3 = jax.random.split(key, 3)
        d = cfg.d_model
        self.embed = eqx.nn.Embedding(cfg.vocab_size, d, key=k1, dtype=jnp.float32)
        self.mix = eqx.nn.Linear(2 * d, d, key=k2, dtype=jnp.float32)
        self.out = eqx.nn.Linear(d, cfg.vocab_size, key=k3, dtype=jnp.float32)
        self.dropout = eqx.nn.Dropout(cfg.dropout)

    def __call__(self, tokens_L, *, key=None, inference=False):
        x_LxD = jax.vmap(self.embed)(tokens_L)
        prev_LxD = jnp.concatenate([jnp.zeros_like(x_LxD[:1]), x_LxD[:-1]], axis=0)
        h_LxD = jax.nn.gelu(jax.vmap(self.mix)(jnp.concatenate([x_LxD, prev_LxD], axis=1)))
        h_LxD = self.dropout(h_LxD, key=key, inference=inference or key is None)
        return jax.vmap(self.out)(h_LxD)


def build_bigram(cfg: ModelConfig, *, key) -> BigramMLP:
    return BigramMLP(cfg, key=key)


def write_word_corpus(path, *, seed: int, words) -> str:
    """A small text file of 200 lines of 9 random ``words`` (a corpus for tiny LM runs)."""
    rng = np.random.default_rng(seed)
    path.write_text("\n".join(" ".join(rng.choice(words, 9)) for _ in range(200)) + "\n")
    return path


@contextlib.contextmanager
def float32():
    """LM tests run in float32 (conftest enables x64 for the theory tests)."""
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", old)


def host_devices_env(count: int = 4) -> dict[str, str]:
    """The environment of a float32, CPU-only subprocess with ``count`` host devices, the
    flags the tests run with (tests/conftest.py) kept beside them."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}"
    return dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu", JAX_ENABLE_X64="0")
