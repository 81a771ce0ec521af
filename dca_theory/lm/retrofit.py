r"""Retrofitting: turn a (trained) vanilla model into a DCA, k-DCA or GRN model computing the
same function (paper §5, Table 4: "adding DCA to a pre-trained model does not alter its
function").

Parameter map (proved in :mod:`dca_theory.lm.blocks`): embeddings, final LayerNorm and output
layer are copied; for each block, the attention and MLP weights are copied, the vanilla
pre-attention LayerNorm ``LN_1`` becomes each of ``LN_q``, ``LN_k``, ``LN_v`` and the pre-MLP
``LN_2`` becomes ``LN_h``; every GRN (per block and the output GRN) starts at b = 1, w = 0, where
it is the plain residual sum. For ``grn_v1|v2|v3`` targets the pre-LN blocks are copied as they
are and the GRNs start at b = 1 (w = 0). Other targets (``schemes.names(lm=True,
retrofit=True)``: MUDDFormer, value residuals) copy the blocks too, with the kind's own
parameters where it equals vanilla (a trunk's ``as_vanilla()`` sets them where its paper's
init does not). The functions agree up to floating-point summation
order (the GRN sums the stack at once; vanilla adds recursively).

Typical use (continue training a vanilla checkpoint as 2-DCA)::

    vanilla = <load the checkpoint into build_model(cfg, key=...)>
    dca = retrofit(vanilla, cfg.replace(residual="dca", k=2))

Only the target's non-architectural settings (dropout, dtypes, ``max_len``) may differ from the
source's; they are taken from the target config.
"""

from __future__ import annotations

import equinox as eqx
import jax

from dca_theory import gates, schemes
from dca_theory.lm.blocks import PreLNBlock
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.driver import layer_of, stack_layers
from dca_theory.lm.model import TransformerLM, build_model
from dca_theory.lm.scanned import ScannedTrunk
from dca_theory.lm.trunk import AbstractTrunk, DCATrunk

# Fields that fix parameter shapes: source and target must agree on them.
ARCH_FIELDS: tuple[str, ...] = ("vocab_size", "d_model", "n_heads", "d_mlp", "n_layers")


def check_retrofit_target(residual: str) -> str:
    """``residual`` if a vanilla model converts exactly into it (``Scheme.retrofit``), else a
    one-line ValueError naming the valid targets."""
    targets = schemes.names(lm=True, retrofit=True)
    if schemes.known(residual) and schemes.canonical(residual) in targets:
        return residual
    raise ValueError(f"cannot retrofit into residual={residual!r}; valid targets: "
                     f"{', '.join(targets)}")


def check_retrofit_gate(residual: str, gate: str) -> str:
    """``gate`` if a model of kind ``residual`` with that GRN-v3 gate equals the vanilla one at
    init (any gate for a scheme without one), else a one-line ValueError naming the valid
    gates."""
    if not schemes.get(residual).gated or gates.get(gate).exact_at_init:
        return gate
    exact = ", ".join(g.name for g in gates.GATES.values() if g.exact_at_init)
    raise ValueError(f"cannot retrofit into grn_gate={gate!r}: its w starts at random, so the "
                     f"model does not equal the vanilla one at init; valid gates: {exact}")


def transplant(src, tgt):
    """``tgt`` with its array leaves replaced by ``src``'s (same structure and shapes), cast to
    ``tgt``'s dtypes. Static fields (dropout rates, compute dtype) stay ``tgt``'s."""
    src_leaves = jax.tree_util.tree_leaves(eqx.filter(src, eqx.is_array))
    tgt_arrays, tgt_rest = eqx.partition(tgt, eqx.is_array)
    tgt_leaves, treedef = jax.tree_util.tree_flatten(tgt_arrays)
    if len(src_leaves) != len(tgt_leaves) or any(
        s.shape != t.shape for s, t in zip(src_leaves, tgt_leaves)
    ):
        raise ValueError(f"cannot transplant {type(src).__name__} into {type(tgt).__name__}: "
                         "parameter shapes differ")
    new = [s.astype(t.dtype) for s, t in zip(src_leaves, tgt_leaves)]
    return eqx.combine(jax.tree_util.tree_unflatten(treedef, new), tgt_rest)


def _check(source: TransformerLM, target: ModelConfig) -> None:
    if source.cfg.residual != "vanilla":
        raise ValueError(
            f"retrofit needs a vanilla source model, got residual={source.cfg.residual!r}"
        )
    check_retrofit_target(target.residual)
    check_retrofit_gate(target.residual, target.grn_gate)
    if target.grn_window is not None:  # a window drops stack entries: not the plain sum
        raise ValueError(f"cannot retrofit into grn_window={target.grn_window}: a windowed GRN "
                         "does not equal the residual sum at init; valid: grn_window=None")
    for name in ARCH_FIELDS:
        if getattr(source.cfg, name) != getattr(target, name):
            raise ValueError(f"{name} differs: source {getattr(source.cfg, name)} vs target "
                             f"{getattr(target, name)}; retrofit keeps the architecture")


def retrofit(source: TransformerLM, target: ModelConfig) -> TransformerLM:
    """The ``target``-kind model computing the same function as the vanilla ``source``."""
    _check(source, target)
    fresh = build_model(target, key=jax.random.PRNGKey(0))  # shapes, statics, identity GRNs
    out = eqx.tree_at(lambda m: m.trunk, fresh, retrofit_trunk(source.trunk, fresh.trunk, target))
    for get in (lambda m: m.embed_VxD, lambda m: m.final_norm, lambda m: m.w_out_DxV,
                lambda m: m.b_out_V):
        out = eqx.tree_at(get, out, transplant(get(source), get(out)))
    return out


def retrofit_trunk(source: AbstractTrunk, fresh: AbstractTrunk, target: ModelConfig
                   ) -> AbstractTrunk:
    """The trunk of ``target``'s kind and layout with the vanilla ``source`` trunk's blocks
    (either layout), computing its function; ``fresh`` (a new trunk of ``target``) gives the
    shapes, the statics and the GRNs' identity init. The LM and the ViT share it."""
    if target.layer_loop == "scan":
        return _scanned_trunk(source, fresh)
    return _per_block_trunk(source, fresh, target)


def _scanned_trunk(source: AbstractTrunk, fresh: ScannedTrunk) -> ScannedTrunk:
    """A scanned trunk (blocks stacked over layers) with the source's blocks and the mixer's
    own vanilla map (:meth:`~dca_theory.lm.driver.Mixer.for_vanilla`)."""
    src = source.blocks
    if not isinstance(source, ScannedTrunk):
        src = stack_layers(src)
    blocks = transplant(src, fresh.blocks)
    return eqx.tree_at(lambda t: (t.blocks, t.mixer), fresh,
                       (blocks, fresh.mixer.for_vanilla(blocks)))


def _per_block_trunk(source: AbstractTrunk, fresh: AbstractTrunk, target: ModelConfig
                     ) -> AbstractTrunk:
    """A per-block trunk (one module per block) with the source's blocks."""
    src = source.blocks
    if isinstance(source, ScannedTrunk):
        src = [layer_of(src, t) for t in range(target.n_layers)]
    if target.residual == "dca":
        return DCATrunk.from_pre_ln(
            target, tuple(transplant(b, f) for b, f in zip(src, _pre_ln_of(fresh))))
    trunk = eqx.tree_at(lambda t: t.blocks, fresh,
                        tuple(transplant(b, f) for b, f in zip(src, fresh.blocks)))
    if hasattr(trunk, "as_vanilla"):  # a kind whose own init is not vanilla (value_residual)
        trunk = trunk.as_vanilla()
    return trunk


def _pre_ln_of(trunk: DCATrunk):
    """The pre-LN view of a fresh DCA trunk's blocks (statics from the target config)."""
    return tuple(
        PreLNBlock(ln1=b.ln_q, attn=b.attn, ln2=b.ln_h, mlp=b.mlp, rate=b.rate)
        for b in trunk.blocks
    )
