r"""The residual trunk: how block inputs are formed from the stack of earlier outputs.

The trunk maps the embedded sequence ``x_LxD`` (model input, after positions) to ``h_LxD``,
the representation after the final residual combination and *before* the final LayerNorm. It
never sees tokens and takes causality as an argument, so the LM (``causal=True``) and the ViT
(``causal=False``) share it. Build one with :func:`dca_theory.lm.trunks.Trunk`
(``Trunk(cfg, key=key)``).

Residual kinds (``cfg.residual``), all built on :mod:`dca_theory.residual` (paper §3, stack
``G_t = [x, f_1, …, f_{t-1}]`` oldest first):

* ``vanilla`` — pre-LN transformer, ``x_{t+1} = x_t + f_t(x_t)``: the ``res`` combination in
  its recursive form (one running tensor; no stack is stored).
* ``grn_v1|v2|v3`` — Table 7's ablation: one GRN per block, ``g_t = GRN_t(G_t)``, replaces the
  block input of a normal pre-LN block; the block's stack entry is its residual branch
  ``f_t(g_t) = a + MLP(LN_2(g_t + a))``. **Decision:** a final GRN of the same kind combines
  the whole stack before the final LayerNorm, as DCA's output GRN does. Evidence: Appendix H's
  Figure 10 (a 30-layer *GRN-v3* model) has an "Outputs" panel over stack indices 0–30. With
  b = 1 (w = 0) every GRN is the plain sum, so the model equals vanilla at init either way.
  ``cfg.grn_window`` (Table 9) restricts every GRN, the final one included, to the stack
  entries ``cfg.grn_slots(t)`` (x plus the last ``window - 1`` outputs, or the last ``window``
  entries); the others are dropped, and each GRN's size follows its window.
* ``dca`` — three GRN-v3 per block (:class:`~dca_theory.lm.blocks.DCABlock`) and a final
  GRN-v3 over the whole stack; ``cfg.k`` truncates the stack to ``[x, Σ middle, last k]``
  through :class:`~dca_theory.residual.ResidualStack` (k-DCA, §3.1/§5). Block ``t`` (0-based)
  sees ``stack_size(t, k)`` entries; for ``k >= n_layers`` this is the full stack.
* baselines (``denseformer``, ``hyper_connections``, ``laurel_lr``, ``laurel_pa``) live in
  :mod:`dca_theory.lm.baselines`.

``cfg.layer_loop`` chooses the trunk: these per-block trunks, one traced copy of the block
per layer (``"unroll"``), or the one scanned trunk of every kind
(``"scan"``: :mod:`dca_theory.lm.scanned`, blocks stacked over layers), same function.

Block weights are drawn from the same per-layer keys for every kind, so models of different
kinds built from one key share their attention/MLP/LayerNorm weights (tests rely on this).

**Per-layer states** (``forward_with_states``), all ``L×D`` unless noted:
``embed`` (trunk input); ``block_{t}_in`` (what block t's attention reads as its query
input: the stream for vanilla, the GRN output for GRN kinds, ``q̃`` for DCA); ``block_{t}_out``
(block t's new stack entry); ``stream_{t}`` (the plain sum of everything so far after block t,
i.e. the ResNet residual stream); ``stack_{t}`` (``S×L×D``, the stack block t read; stack
kinds only); ``final`` (the trunk output).
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from dca_theory import random_draws as draws
from dca_theory import schemes
from dca_theory.gates import KEY_SALT
from dca_theory.lm.blocks import DCABlock, PreLNBlock, dtype_of, split_or_none
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.fast.fused_grn import combine_stack, middle_add
from dca_theory.residual import AbstractCombiner, ResidualStack, make_combiner, stack_size

States = dict[str, Array]


def block_keys(cfg: ModelConfig, key: PRNGKeyArray) -> list[Array]:
    """Per-layer init keys, identical for every residual kind."""
    return draws.split(key, cfg.n_layers)


def extra_key(key: PRNGKeyArray) -> PRNGKeyArray:
    """Key for a kind's extra parameters, independent of the shared block keys."""
    return jax.random.fold_in(key, 1)


class AbstractTrunk(eqx.Module):
    """``x_LxD -> h_LxD``. Dropout is active iff ``not inference and key is not None``."""

    cfg: eqx.AbstractVar[ModelConfig]

    @abc.abstractmethod
    def run(
        self, x_LxD: Array, *, causal: bool, key: PRNGKeyArray | None, collect: bool
    ) -> tuple[Float[Array, "L D"], States]:
        """The forward pass; fills the states dict only when ``collect`` is true."""

    def __call__(
        self, x_LxD: Float[Array, "L D"], *, causal: bool, key: PRNGKeyArray | None = None,
        inference: bool = False,
    ) -> Float[Array, "L D"]:
        h_LxD, _ = self.run(x_LxD, causal=causal, key=None if inference else key, collect=False)
        return h_LxD

    def forward_with_states(
        self, x_LxD: Float[Array, "L D"], *, causal: bool, key: PRNGKeyArray | None = None,
        inference: bool = False,
    ) -> tuple[Float[Array, "L D"], States]:
        return self.run(x_LxD, causal=causal, key=None if inference else key, collect=True)


class ResidualTrunk(AbstractTrunk):
    """Pre-LN blocks with the vanilla sum or one GRN per block (Table 7 ablation)."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: tuple[PreLNBlock, ...]
    grns: tuple[AbstractCombiner, ...] | None  # one per block, then the final one (GRN kinds)

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> ResidualTrunk:
        blocks = tuple(PreLNBlock.init(cfg, key=k) for k in block_keys(cfg, key))
        grns = None
        if schemes.get(cfg.residual).family == "grn":
            dtype = dtype_of(cfg.param_dtype)
            gate_keys = draws.split(jax.random.fold_in(key, KEY_SALT), cfg.n_layers + 1)
            grns = tuple(
                make_combiner(cfg.residual, len(cfg.grn_slots(t)), cfg.d_model, dtype=dtype,
                              gate=cfg.grn_gate, key=gate_keys[t])
                for t in range(cfg.n_layers + 1)
            )
        return cls(cfg=cfg, blocks=blocks, grns=grns)

    def _window(self, stack: ResidualStack) -> tuple[Float[Array, "L D"], ...]:
        """The stack entries the next GRN reads (all of them unless ``cfg.grn_window``)."""
        if self.cfg.grn_window is None:
            return stack.entries()
        entries = stack.entries()
        return tuple(entries[i] for i in self.cfg.grn_slots(stack.num_outputs))

    def _combine(self, grn: AbstractCombiner, stack: ResidualStack):
        """``(GRN output, stack to read from now on)``: the GRN over the stack entries of its
        window (see :func:`~dca_theory.lm.fast.fused_grn.combine_stack`)."""
        slots = None if self.cfg.grn_window is None else self.cfg.grn_slots(stack.num_outputs)
        (y,), stack = combine_stack((grn,), stack, self.cfg.grn_impl, slots=slots)
        return y, stack

    def run(self, x_LxD, *, causal, key, collect):
        states: States = {"embed": x_LxD} if collect else {}
        blocks = self.blocks
        keys = split_or_none(key, len(blocks))
        if self.grns is None:  # vanilla: the recursive form of the plain sum
            h_LxD = x_LxD
            for t, (blk, k) in enumerate(zip(blocks, keys)):
                f_LxD = blk.branch(h_LxD, causal=causal, key=k)
                if collect:
                    states |= {f"block_{t}_in": h_LxD, f"block_{t}_out": f_LxD}
                h_LxD = h_LxD + f_LxD
                if collect:
                    states[f"stream_{t}"] = h_LxD
        else:
            stack = ResidualStack.start(x_LxD)
            grns = self.grns
            for t, (blk, grn, k) in enumerate(zip(blocks, grns, keys)):
                if collect:
                    states[f"stack_{t}"] = jnp.stack(self._window(stack))
                in_LxD, stack = self._combine(grn, stack)
                f_LxD = blk.branch(in_LxD, causal=causal, key=k)
                stack = stack.push(f_LxD)
                if collect:
                    states |= {f"block_{t}_in": in_LxD, f"block_{t}_out": f_LxD,
                               f"stream_{t}": stack.total()}
            h_LxD, _ = self._combine(grns[-1], stack)
        if collect:
            states["final"] = h_LxD
        return h_LxD, states


class DCATrunk(AbstractTrunk):
    """DCA (full stack, ``k=None``) or k-DCA: DCA blocks and a final GRN-v3 (paper §3.2)."""

    cfg: ModelConfig = eqx.field(static=True)
    blocks: tuple[DCABlock, ...]
    final: AbstractCombiner

    @classmethod
    def init(cls, cfg: ModelConfig, *, key: PRNGKeyArray) -> DCATrunk:
        blocks = tuple(PreLNBlock.init(cfg, key=k) for k in block_keys(cfg, key))
        return cls.from_pre_ln(cfg, blocks, key=jax.random.fold_in(key, KEY_SALT))

    @classmethod
    def from_pre_ln(cls, cfg: ModelConfig, blocks: tuple[PreLNBlock, ...],
                    key: PRNGKeyArray | None = None) -> DCATrunk:
        """Wrap pre-LN blocks into DCA blocks with identity-initialised GRNs (``key`` draws
        the gate weights of a gate that starts them at random, ``small_init``)."""
        keys = [None] * (len(blocks) + 1) if key is None else draws.split(key, len(blocks) + 1)
        dca = tuple(
            DCABlock.from_pre_ln(b, stack_size(t, cfg.k), gate=cfg.grn_gate, key=keys[t])
            for t, b in enumerate(blocks)
        )
        final = make_combiner("grn_v3", stack_size(cfg.n_layers, cfg.k), cfg.d_model,
                              dtype=dtype_of(cfg.param_dtype), gate=cfg.grn_gate,
                              key=keys[-1])
        return cls(cfg=cfg, blocks=dca, final=final)

    def run(self, x_LxD, *, causal, key, collect):
        states: States = {"embed": x_LxD} if collect else {}
        impl = self.cfg.grn_impl
        add = middle_add(impl, token=self.final.b)  # k-DCA: fused_grn folds the middle sum
        stack = ResidualStack.start(x_LxD, k=self.cfg.k)
        blocks = self.blocks
        for t, (blk, k) in enumerate(zip(blocks, split_or_none(key, len(blocks)))):
            o_LxD, q_LxD, entries = blk.apply(stack.entries(), causal=causal, key=k,
                                              grn_impl=impl)
            stack = stack.with_entries(entries)  # threaded by lm.fast.fused_grn
            if collect:
                states |= {f"stack_{t}": stack.array(), f"block_{t}_in": q_LxD,
                           f"block_{t}_out": o_LxD}
            stack = stack.push(o_LxD, add=add)
            if collect:
                states[f"stream_{t}"] = stack.total()
        (h_LxD,), _ = combine_stack((self.final,), stack, impl)
        if collect:
            states["final"] = h_LxD
        return h_LxD, states
