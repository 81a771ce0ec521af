r"""Parameter counts per residual kind, in closed form and by counting a model's arrays.

``count_params(model)`` sums the trainable arrays of a built model; ``param_count(cfg)`` is the
closed form below, and ``traced_param_count(cfg)`` counts the shapes ``eqx.filter_eval_shape``
traces, so the paper preset is counted without allocating it. Tests check that they agree for
every kind.

Closed form (T layers, width D, MLP width F, vocabulary V, ``S_t`` the stack size of block t):

* vanilla: ``V D`` (embeddings) + ``T (4D + 4D² + 2DF + F + D)`` (2 LayerNorms, attention
  without biases, ReLU MLP with biases) + ``2D`` (final LN) + ``D V + V`` (untied output).
  Paper preset: **49,653,040**, the paper's 49.65M (Flax lm1b; positions are fixed).
* grn_v1 / v2 / v3: one GRN over ``S_t = t + 1`` entries per block plus the output GRN over
  ``T + 1``: ``Σ_{s=1}^{T+1} s``, ``D Σ s`` and ``D Σ s + D(T+1)`` extra (§4.2's counts, plus the
  output GRN). With ``grn_window`` (Table 9) each ``s`` is ``len(cfg.grn_slots(t))``.
* dca: per block three GRN-v3 (``3 (S_t D + D)``) and two more LayerNorms than vanilla
  (``LN_q, LN_k, LN_v, LN_h`` instead of ``LN_1, LN_2``: ``+4D``); plus the output GRN-v3.
  k-DCA caps ``S_t`` at ``k + 2``.
* denseformer ``Σ_{i=1}^{T} (i+1)``; hyper_connections ``T (4D + nD + 2 + 2n + n²)``;
  laurel_lr ``2 T D r``; laurel_pa ``2 T D r + Σ_{i=1}^{T} i`` (see :mod:`.baselines`).
* attn_res ``2D(2T + 1)``; muddformer ``Σ_{i<T} (D w_i + w_i² + w_i)`` with
  ``w_i = C_i (i + 2)``, ``C_i = 4`` (1 for the last block); value_residual ``2(T − 1)``
  (see :mod:`.rivals`); mhc ``T (nD m + m + 3)`` with ``m = n² + 2n`` (see :mod:`.mhc`).

The paper's reported totals next to ours (``dca-theory lm info``) are in
:mod:`dca_theory.lm.paper_param_counts`.
"""

from __future__ import annotations

import equinox as eqx
import jax

from dca_theory import schemes
from dca_theory.lm.config import ModelConfig
from dca_theory.residual import stack_size


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
    """Parameters ``cfg.residual`` adds to the vanilla model of the same size."""
    d, t, kind = cfg.d_model, cfg.n_layers, cfg.residual
    if kind == "vanilla":
        return 0
    if schemes.get(kind).family == "grn":
        sizes = [len(cfg.grn_slots(i)) for i in range(t + 1)]
        return schemes.network_combiner_params(kind, t, d, stack_sizes=sizes)
    if kind == "dca":
        grn_v3 = schemes.get("grn_v3")
        grns = sum(3 * grn_v3.combiner_params(stack_size(i, cfg.k), d) for i in range(t))
        final = grn_v3.combiner_params(stack_size(t, cfg.k), d)
        return grns + final + t * 2 * 2 * d
    if kind == "denseformer":
        return sum(i + 1 for i in range(1, t + 1))
    if kind == "hyper_connections":
        n = cfg.hc_expansion
        return t * (2 * d + 2 * d + n * d + 2 + 2 * n + n * n)
    if kind == "laurel_lr":
        return t * 2 * d * cfg.laurel_rank
    if kind == "laurel_pa":
        return t * 2 * d * cfg.laurel_rank + sum(range(1, t + 1))
    if kind == "attn_res":
        return 2 * d * (2 * t + 1)
    if kind == "mhc":
        n = cfg.hc_expansion
        m = n * n + 2 * n
        return t * (n * d * m + m + 3)
    if kind == "muddformer":
        widths = [(4 if i < t - 1 else 1) * (i + 2) for i in range(t)]
        return sum(d * w + w * w + w for w in widths)
    if kind == "value_residual":
        return 2 * (t - 1)
    raise ValueError(f"no closed-form count for residual {kind!r}; add one in lm/params.py")


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
