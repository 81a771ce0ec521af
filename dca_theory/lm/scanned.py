r"""The trunk every residual kind runs through: stacked pre-LN blocks, one mixer, one driver.

:class:`ScannedTrunk` holds the blocks as one :class:`~dca_theory.lm.blocks.PreLNBlock` whose
array leaves have a leading ``layer`` axis, and the kind's mixer (:mod:`dca_theory.lm.zoo`,
named by the kind's row of :mod:`dca_theory.schemes`). :mod:`dca_theory.lm.driver` runs it:
one ``lax.scan`` body whatever the depth, the per-layer states out of the same scan, cached
decoding through the same body. Its per-layer states use :mod:`dca_theory.lm.trunk`'s names.

Blocks are drawn from the same per-layer keys as the per-block trunks, and each mixer draws
its parameters as they do, so a model built from one key has the same values in either
layout; :meth:`ScannedTrunk.from_trunk` converts a per-block trunk exactly (tested in float64
against its forward pass and every gradient).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from dca_theory.lm.blocks import PreLNBlock, matmul_dtype
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.driver import Mixer, decode_trunk, run_trunk, stack_layers
from dca_theory.lm.trunk import AbstractTrunk, States, block_keys
from dca_theory.lm.zoo import mixer_class


class ScannedTrunk(AbstractTrunk):
    """``x_LxD -> h_LxD`` through :func:`~dca_theory.lm.driver.run_trunk`."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: PreLNBlock  # stacked over layers
    mixer: Mixer

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> ScannedTrunk:
        blocks = stack_layers([PreLNBlock.init(cfg, key=k) for k in block_keys(cfg, key)])
        mixer = mixer_class(cfg.residual).init(cfg, key=key)
        return cls(cfg=cfg, blocks=blocks, mixer=mixer)

    @classmethod
    def from_trunk(cls, trunk: AbstractTrunk) -> ScannedTrunk:
        """The same trunk, given in the per-block layout (exact). NumPy leaves (a model read
        back from a run's saved arrays) become JAX arrays first."""
        from dca_theory.lm.zoo.dca import pre_ln_blocks

        trunk = jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, trunk)

        kind = trunk.cfg.residual
        blocks = pre_ln_blocks(trunk) if kind == "dca" else list(trunk.blocks)
        return cls(cfg=trunk.cfg, blocks=stack_layers(blocks),
                   mixer=mixer_class(kind).from_trunk(trunk))

    def run(self, x_LxD, *, causal, key, collect):
        h_LxD, records = run_trunk(self.blocks, self.mixer, x_LxD, causal=causal, key=key,
                                   collect=collect)
        if not collect:
            return h_LxD, {}
        states: States = {"embed": x_LxD}
        for t in range(self.cfg.n_layers):
            states |= {f"block_{t}_in": records["in"][t], f"block_{t}_out": records["out"][t],
                       f"stream_{t}": records["stream"][t]}
            slots = self.mixer.stack_slots(t)
            if slots is not None:
                states[f"stack_{t}"] = records["stack"][t][jnp.asarray(slots)]
        states["final"] = h_LxD
        return h_LxD, states

    def empty_cache(self) -> tuple[Array, Array]:
        """Zero key and value caches, ``T×max_len×H×K`` each, in the attention's matmul
        dtype (as the full pass computes them)."""
        cfg = self.cfg
        attn = self.blocks.attn
        dtype = matmul_dtype(attn.compute_dtype, attn.w_k_DxD)
        shape = (cfg.n_layers, cfg.max_len, cfg.n_heads, cfg.d_model // cfg.n_heads)
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    def decode(self, x_LxD: Float[Array, "L D"], cache: tuple[Array, Array],
               offset: Int[Array, ""]) -> tuple[Float[Array, "L D"], tuple[Array, Array]]:
        """The trunk output of ``L`` new tokens at positions ``offset, …`` with the cache of the
        tokens before them, and the cache with theirs written (inference)."""
        return decode_trunk(self.blocks, self.mixer, x_LxD, cache, offset)


def param_count(trunk: ScannedTrunk) -> int:
    """The trunk's trainable parameters: the blocks' arrays and the mixer's own count (its
    stored padding excluded)."""
    blocks = sum(x.size for x in jax.tree.leaves(eqx.filter(trunk.blocks, eqx.is_array)))
    return blocks + trunk.mixer.param_count()
