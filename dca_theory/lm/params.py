r"""Parameter counts per residual kind, in closed form and by counting a model's arrays.

``count_params(model)`` sums the trainable arrays of a built model; ``param_count(cfg)`` is the
closed form below, and ``traced_param_count(cfg)`` counts the shapes ``eqx.filter_eval_shape``
traces, so the paper preset is counted without allocating it. Tests check that they agree for
every kind.

Closed form (T layers, width D, MLP width F, vocabulary V): vanilla is ``V D`` (embeddings) +
``T (4D + 4D² + 2DF + F + D)`` (2 LayerNorms, attention without biases, ReLU MLP with biases) +
``2D`` (final LN) + ``D V + V`` (untied output); paper preset: **49,653,040**, the paper's
49.65M (Flax lm1b; positions are fixed). Every other kind runs vanilla's blocks and adds its
mixer's parameters, whose closed form is the mixer class's ``overhead(cfg)``
(:meth:`dca_theory.lm.driver.Mixer.overhead`; e.g. ``grn_v1`` ``Σ_{s=1}^{T+1} s``, DCA
``Σ_t 3 (S_t D + D) + (S_T D + D) + 4TD``), found through the kind's registry row.

The paper's reported totals next to ours (``dca-theory lm info``) are in
:mod:`dca_theory.lm.paper_param_counts`.
"""

from __future__ import annotations

import equinox as eqx
import jax

from dca_theory.lm.config import ModelConfig
from dca_theory.lm.zoo import mixer_class


def count_params(model) -> int:
    """The model's trainable parameters: the scalars of its floating-point arrays, less the
    zero padding a scanned trunk's mixer stores (a GRN over the widest stack for every block;
    :mod:`dca_theory.lm.layer_stack`), which its ``param_count`` leaves out."""
    total = _scalars(model)
    mixer = getattr(getattr(model, "trunk", None), "mixer", None)
    if mixer is not None:
        total += mixer.param_count() - _scalars(mixer)
    return total


def _scalars(tree) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_inexact_array)))


def traced_param_count(cfg: ModelConfig) -> int:
    """Count by tracing :func:`build_model` shapes only (no memory for the weights)."""
    from dca_theory.lm.model import build_model

    shapes = eqx.filter_eval_shape(build_model, cfg, key=jax.random.PRNGKey(0))
    return sum(x.size for x in jax.tree_util.tree_leaves(shapes) if hasattr(x, "size"))


def _vanilla(cfg: ModelConfig) -> int:
    d, f, v, t = cfg.d_model, cfg.d_mlp, cfg.vocab_size, cfg.n_layers
    block = 2 * 2 * d + 4 * d * d + (d * f + f + f * d + d)
    return v * d + t * block + 2 * d + d * v + v


def overhead(cfg: ModelConfig) -> int:
    """Parameters ``cfg.residual`` adds to the vanilla model of the same size (its mixer
    class's closed form)."""
    return mixer_class(cfg.residual).overhead(cfg)


def param_count(cfg: ModelConfig) -> int:
    """Closed-form parameter count of ``build_model(cfg)``."""
    return _vanilla(cfg) + overhead(cfg)


def non_embedding_count(cfg: ModelConfig) -> int:
    """Parameters outside the token embedding and the output projection (weights and bias):
    the trunk whose size the scaling laws count (``N`` of ``E + A N^-alpha``)."""
    return param_count(cfg) - cfg.vocab_size * cfg.d_model - (cfg.d_model * cfg.vocab_size
                                                               + cfg.vocab_size)


def matched_vanilla_d_mlp(cfg: ModelConfig) -> tuple[int, int]:
    """``(d_mlp, mismatch)``: the MLP width at which vanilla at ``cfg``'s width and depth has
    the non-embedding parameter count of ``cfg`` (e.g. DCA) as nearly as an integer width
    allows, and vanilla's count minus ``cfg``'s there. One more MLP unit adds ``T (2D + 1)``
    parameters (a column of W_in, its bias, a row of W_out), so ``|mismatch| <= T (2D + 1) / 2``
    (at depth 4: at most 0.5 % of DCA's trunk at width 16, 0.13 % at 64; for DCA with MLP 4x
    width the mismatch is +32 parameters at widths 16, 32 and 64)."""
    target = non_embedding_count(cfg)
    vanilla = cfg.replace(residual="vanilla", k=None)
    per_unit = cfg.n_layers * (2 * cfg.d_model + 1)
    fixed = non_embedding_count(vanilla.replace(d_mlp=1)) - per_unit  # the trunk without MLP units
    d_mlp = max(1, round((target - fixed) / per_unit))
    return d_mlp, non_embedding_count(vanilla.replace(d_mlp=d_mlp)) - target
