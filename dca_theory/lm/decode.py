r"""Incremental (cached) decoding: one token at a time, reusing earlier tokens' keys and values.

**What must be cached.** In every residual scheme of the LM zoo the only operation that mixes
*tokens* is attention inside a block; everything that mixes *layers* (the plain sum, a GRN, the
DCA block's three GRN-v3, a DenseFormer DWA, a hyper-connection, LAuReL's maps) acts on each
token separately. A GRN-v3 coefficient ``relu(b_i + w · h_i)`` reads entry ``h_i`` of one
token; LayerNorms are per token. So block ``t``'s key and value rows of an earlier token ``s``
depend on token ``s``'s own stack only, and that stack depends only on tokens ``≤ s``: once
computed, the rows never change. For DCA they are ``LN_k(k̃_s) W_k`` and ``LN_v(ṽ_s) W_v``
with ``k̃_s = GRN_k(G_s)`` over token ``s``'s stack at block ``t``; for a pre-LN block both read
``LN_1`` of the block input. Caching **K and V per block** therefore suffices for attention,
for every kind. The current token's stack (vanilla: one stream; k-DCA: ``[x, Σ middle, last
k]``, at most ``k + 2`` entries; full DCA: all ``t + 1`` entries at block ``t``) is built block
by block as the token goes up the trunk and is dropped afterwards: it is working memory of one
token, not a per-token cache. The cache per token of context is ``2 · n_layers · D`` numbers
for every kind; what DCA adds is the current token's stack, ``O(depth · D)`` for full DCA and
``O(k · D)`` for k-DCA, once per sequence.

**Layout.** :class:`DecodeCache` holds, per block, a preallocated ``max_len × H × K`` array of
keys and one of values (in the attention's matmul dtype, as the full forward pass computes
them) and ``length``, the number of tokens cached (the next token's position). A step writes
its row with ``lax.dynamic_update_slice`` and attends over the whole buffer with the rows at
positions ``> length`` masked, so every step has the same shapes and one compilation serves a
whole generation. Shape letters: :mod:`dca_theory.lm.model`; ``T`` is a token's single row.

**Which trunks.** The scanned trunk of every kind (``layer_loop="scan"``) decodes through
its own scan body (:meth:`~dca_theory.lm.scanned.ScannedTrunk.decode`). For the per-block
trunks :data:`STEPS` maps each trunk class to its step; a model whose trunk has none
(Attention Residuals, MUDDFormer, ResFormer, mHC, or a trunk added later) is decoded by the
uncached sampler
(:func:`dca_theory.lm.sample.generate` says so). The steps repeat their trunk's combination
code for one token; ``tests/lm/test_decode.py`` checks that cached decoding gives the full
forward pass's logits at every position, for every kind.

Decoding runs with dropout off (inference) and on one sequence; batch with ``jax.vmap``.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from dca_theory.lm.baselines import DenseFormerTrunk, HyperConnectionsTrunk, LaurelTrunk
from dca_theory.lm.blocks import Attention, DCABlock, PreLNBlock, matmul_dtype
from dca_theory.lm.fast.fused_grn import combine_stack
from dca_theory.lm.model import TransformerLM, sinusoidal_positions
from dca_theory.lm.trunk import AbstractTrunk, DCATrunk, ResidualTrunk
from dca_theory.residual import ResidualStack, stack_size

#: one block's cache: (keys, values), each ``max_len × H × K``
LayerCache = tuple[Array, Array]


class DecodeCache(eqx.Module):
    """Keys and values of every block for the tokens so far, in fixed-size buffers."""

    keys: Array  # n_layers × max_len × H × K
    values: Array
    length: Int[Array, ""]  # tokens cached = position of the next token

    @classmethod
    def empty(cls, model: TransformerLM) -> DecodeCache:
        trunk = model.trunk
        if hasattr(trunk, "empty_cache"):  # the scanned trunk
            keys, values = trunk.empty_cache()
        else:
            cfg, attn = model.cfg, trunk.blocks[0].attn
            shape = (cfg.n_layers, cfg.max_len, cfg.n_heads, cfg.d_model // cfg.n_heads)
            dtype = matmul_dtype(attn.compute_dtype, attn.w_k_DxD)
            keys, values = jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)
        return cls(keys=keys, values=values, length=jnp.zeros((), jnp.int32))

    def nbytes(self) -> int:
        """Bytes of the key/value buffers (the cache proper; ``length`` is one scalar)."""
        return sum(int(a.size) * a.dtype.itemsize for a in (self.keys, self.values))


def attend_cached(
    attn: Attention, xq_TxD: Array, xk_TxD: Array, xv_TxD: Array, layer: LayerCache,
    pos: Int[Array, ""],
) -> tuple[Float[Array, "1 D"], LayerCache]:
    """:class:`~dca_theory.lm.blocks.Attention` for the token at ``pos``: its key and value rows
    written into the cache, its query attending to rows ``0 … pos`` (the attention's own cached
    path, :meth:`~dca_theory.lm.blocks.Attention.forward`)."""
    out_TxD, _, layer = attn.forward(xq_TxD, xk_TxD, xv_TxD, causal=True, cache=layer,
                                     offset=pos)
    return out_TxD, layer


def pre_ln_branch_step(blk: PreLNBlock, x_TxD: Array, layer: LayerCache, pos):
    """:meth:`PreLNBlock.branch` for one token: ``(f(x), cache)``."""
    xn_TxD = blk.ln1(x_TxD)
    a_TxD, layer = attend_cached(blk.attn, xn_TxD, xn_TxD, xn_TxD, layer, pos)
    a_TxD = a_TxD.astype(x_TxD.dtype)
    m_TxD = blk.mlp(blk.ln2(x_TxD + a_TxD)).astype(x_TxD.dtype)
    return a_TxD + m_TxD, layer


def dca_block_step(blk: DCABlock, stack: ResidualStack, layer: LayerCache, pos):
    """:meth:`DCABlock.apply` for one token: ``(o, cache)``. The three GRN-v3 read this token's
    stack only; the earlier tokens' ``k̃`` and ``ṽ`` are in the cache as keys and values."""
    # The reference GRN path: one token's stack is a few D-vectors, and the fused path's
    # custom backward pass buys nothing when nothing is differentiated.
    (qn_TxD, kn_TxD, vn_TxD), (q_TxD, _, _), _ = blk.attention_inputs(
        stack.entries(), grn_impl="reference")
    a_TxD, layer = attend_cached(blk.attn, qn_TxD, kn_TxD, vn_TxD, layer, pos)
    a_TxD = a_TxD.astype(q_TxD.dtype)
    h_TxD = blk.ln_h(a_TxD + q_TxD)
    return blk.mlp(h_TxD).astype(q_TxD.dtype) + a_TxD, layer


# --- One token through each trunk: (trunk, x_TxD, layers, pos) -> (h_TxD, layers) -------------


def _residual_step(trunk: ResidualTrunk, x_TxD, layers, pos):
    out = []
    if trunk.grns is None:  # vanilla: the recursive sum
        h_TxD = x_TxD
        for blk, layer in zip(trunk.blocks, layers):
            f_TxD, layer = pre_ln_branch_step(blk, h_TxD, layer, pos)
            h_TxD = h_TxD + f_TxD
            out.append(layer)
        return h_TxD, tuple(out)
    cfg = trunk.cfg

    def combine(grn, stack):
        slots = None if cfg.grn_window is None else cfg.grn_slots(stack.num_outputs)
        return combine_stack((grn,), stack, "reference", slots=slots)[0][0]

    stack = ResidualStack.start(x_TxD)
    for blk, grn, layer in zip(trunk.blocks, trunk.grns, layers):
        f_TxD, layer = pre_ln_branch_step(blk, combine(grn, stack), layer, pos)
        stack = stack.push(f_TxD)
        out.append(layer)
    return combine(trunk.grns[-1], stack), tuple(out)


def _dca_step(trunk: DCATrunk, x_TxD, layers, pos):
    stack, out = ResidualStack.start(x_TxD, k=trunk.cfg.k), []
    for blk, layer in zip(trunk.blocks, layers):
        o_TxD, layer = dca_block_step(blk, stack, layer, pos)
        stack = stack.push(o_TxD)  # k-DCA folds the oldest output into the middle sum
        out.append(layer)
    return trunk.final(stack.array()), tuple(out)


def _denseformer_step(trunk: DenseFormerTrunk, x_TxD, layers, pos):
    stack, y_TxD, out = ResidualStack.start(x_TxD), x_TxD, []
    for blk, dwa, layer in zip(trunk.blocks, trunk.dwa, layers):
        f_TxD, layer = pre_ln_branch_step(blk, y_TxD, layer, pos)
        stack = stack.push(y_TxD + f_TxD)
        y_TxD = dwa(stack.array())
        out.append(layer)
    return y_TxD, tuple(out)


def _hyper_connections_step(trunk: HyperConnectionsTrunk, x_TxD, layers, pos):
    n, out = trunk.cfg.hc_expansion, []
    h_TxNxD = jnp.broadcast_to(x_TxD[:, None, :], (1, n, x_TxD.shape[1]))
    for blk, hc, layer in zip(trunk.blocks, trunk.hcs, layers):
        b_TxN, am_TxN, ar_TxNxN = hc.weights(h_TxNxD)
        in_TxD = jnp.einsum("ln,lnd->ld", am_TxN, h_TxNxD)
        f_TxD, layer = pre_ln_branch_step(blk, in_TxD, layer, pos)
        h_TxNxD = (jnp.einsum("ln,ld->lnd", b_TxN, f_TxD)
                   + jnp.einsum("lnm,lnd->lmd", ar_TxNxN, h_TxNxD))
        out.append(layer)
    return jnp.sum(h_TxNxD, axis=1), tuple(out)


def _laurel_step(trunk: LaurelTrunk, x_TxD, layers, pos):
    stack, h_TxD, out = ResidualStack.start(x_TxD), x_TxD, []
    for t, (blk, lr, layer) in enumerate(zip(trunk.blocks, trunk.low_rank, layers)):
        f_TxD, layer = pre_ln_branch_step(blk, h_TxD, layer, pos)
        aug_TxD = lr(h_TxD) if trunk.gammas is None else lr(trunk.gammas[t](stack.array()))
        h_TxD = h_TxD + f_TxD + aug_TxD
        if trunk.gammas is not None and t + 1 < len(trunk.blocks):
            stack = stack.push(h_TxD)
        out.append(layer)
    return h_TxD, tuple(out)


#: the one-token step of each trunk class (exact classes: a subclass may change the pass)
STEPS: dict[type[AbstractTrunk], Callable] = {
    ResidualTrunk: _residual_step,
    DCATrunk: _dca_step,
    DenseFormerTrunk: _denseformer_step,
    HyperConnectionsTrunk: _hyper_connections_step,
    LaurelTrunk: _laurel_step,
}


def supports_cache(model: TransformerLM) -> bool:
    """Whether :func:`decode_step` knows ``model``'s trunk (the scanned trunk decodes
    itself, :meth:`~dca_theory.lm.scanned.ScannedTrunk.decode`)."""
    return hasattr(model.trunk, "decode") or type(model.trunk) in STEPS


def max_stack_entries(model: TransformerLM) -> int:
    """The most per-token stack entries (``D``-vectors) a decoding step holds at once: 1 for
    vanilla and LAuReL-LR (the stream), ``k + 2`` for k-DCA, ``n_layers + 1`` for full DCA, the
    GRN kinds and DenseFormer, ``grn_window`` for a windowed GRN (what it reads at once; entries
    that left the window are dead), ``hc_expansion`` for Hyper-Connections, ``n_layers`` for
    LAuReL-PA."""
    cfg, trunk = model.cfg, model.trunk
    if hasattr(trunk, "mixer"):  # the scanned trunk: the D-vectors its state holds
        state = jax.eval_shape(lambda x: trunk.mixer.start(x, cfg.n_layers),
                               jax.ShapeDtypeStruct((1, cfg.d_model), jnp.float32))
        return sum(leaf.size for leaf in jax.tree.leaves(state)) // cfg.d_model
    if isinstance(trunk, ResidualTrunk) and trunk.grns is None:
        return 1
    if isinstance(trunk, ResidualTrunk) and cfg.grn_window is not None:
        return cfg.grn_window
    if isinstance(trunk, HyperConnectionsTrunk):
        return cfg.hc_expansion
    if isinstance(trunk, LaurelTrunk):  # PA's γ combine the states x_0 … x_{n-1}
        return 1 if trunk.gammas is None else cfg.n_layers
    return stack_size(cfg.n_layers, cfg.k if isinstance(trunk, DCATrunk) else None)


def decode_step(
    model: TransformerLM, cache: DecodeCache, token: Int[Array, ""]
) -> tuple[Float[Array, " V"], DecodeCache]:
    """Feed ``token`` at position ``cache.length``: ``(logits of the next token, cache)``.

    The caller keeps ``cache.length < max_len`` (the buffers are full after ``max_len``
    tokens; :func:`dca_theory.lm.sample.generate` re-fills a sliding window instead)."""
    step = STEPS.get(type(model.trunk))
    if step is None and not hasattr(model.trunk, "decode"):
        raise ValueError(f"no cached decoding for trunk {type(model.trunk).__name__}; valid: "
                         f"{', '.join(c.__name__ for c in STEPS)}")
    pos = cache.length
    cfg = model.cfg
    x_TxD = jnp.take(model.embed_VxD, token, axis=0)[None]
    positions_LxD = sinusoidal_positions(cfg.max_len, cfg.d_model, x_TxD.dtype)
    x_TxD = x_TxD + jax.lax.dynamic_slice_in_dim(positions_LxD, pos, 1)
    if step is None:
        h_TxD, (keys, values) = model.trunk.decode(x_TxD, (cache.keys, cache.values), pos)
    else:
        h_TxD, layers = step(model.trunk, x_TxD, tuple(zip(cache.keys, cache.values)), pos)
        keys, values = (jnp.stack([layer[i] for layer in layers]) for i in (0, 1))
    cache = DecodeCache(keys=keys, values=values, length=pos + 1)
    return model.head(h_TxD)[0], cache


def prefill(
    model: TransformerLM, tokens_L: Int[Array, " L"], length: Int[Array, ""]
) -> tuple[Float[Array, " V"], DecodeCache]:
    """The cache of the first ``length`` tokens of the ``max_len`` buffer ``tokens_L`` and the
    logits of the token after them, by :func:`decode_step` over the prompt (one compiled loop
    for any prompt length; ``length >= 1``)."""
    def body(i, carry):
        _, cache = carry
        return decode_step(model, cache, tokens_L[i])

    logits_V = jnp.zeros((model.cfg.vocab_size,), model.b_out_V.dtype)
    return jax.lax.fori_loop(0, length, body, (logits_V, DecodeCache.empty(model)))
