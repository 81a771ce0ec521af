"""Parameter counts: the paper preset, closed form vs counted arrays (the paper's reported totals
and the ``lm info`` table: ``tests/lm/test_paper_param_counts.py``)."""

import jax
import pytest

from dca_theory import schemes
from dca_theory.lm.config import PRESETS, ModelConfig
from dca_theory.lm.model import build_model
from dca_theory.lm.params import count_params, param_count, traced_param_count

PAPER, TINY = PRESETS["paper"], PRESETS["tiny"]
LM_RESIDUALS = schemes.names(lm=True)
VARIANTS = [(r, None) for r in LM_RESIDUALS] + [("dca", 0), ("dca", 1), ("dca", 2), ("dca", 9)]


def test_paper_vanilla_is_flax_lm1b_count():
    # Exact: the Flax lm1b default model has 49,653,040 parameters (the paper's 49.65M).
    assert param_count(PAPER) == 49_653_040
    assert traced_param_count(PAPER) == 49_653_040


@pytest.mark.parametrize("residual,k", VARIANTS)
def test_closed_form_matches_model(residual, k):
    for base in (TINY, PAPER):
        cfg = base.replace(residual=residual, k=k)
        assert traced_param_count(cfg) == param_count(cfg), cfg


def test_counting_a_built_model_matches_abstract_count(getkey):
    cfg = TINY.replace(residual="dca", k=1)
    assert count_params(build_model(cfg, key=getkey())) == traced_param_count(cfg)


def test_k_dca_overhead_is_bounded_by_depth_independent_stack():
    # k-DCA stacks hold at most k + 2 entries: its GRN overhead stops growing with depth.
    def extra(n_layers, k):
        cfg = TINY.replace(residual="dca", k=k, n_layers=n_layers)
        return param_count(cfg) - param_count(cfg.replace(residual="vanilla", k=None))

    per_layer = extra(12, 2) - extra(11, 2)
    assert per_layer == extra(13, 2) - extra(12, 2)
    assert per_layer == 3 * (4 * TINY.d_model + TINY.d_model) + 2 * 2 * TINY.d_model
    assert extra(12, None) - extra(11, None) > per_layer


def test_abstract_count_allocates_nothing():
    # eval_shape must not materialise the 50M-parameter model (it returns ShapeDtypeStructs).
    import equinox as eqx

    shapes = eqx.filter_eval_shape(build_model, PAPER, key=jax.random.PRNGKey(0))
    assert all(isinstance(x, jax.ShapeDtypeStruct)
               for x in jax.tree_util.tree_leaves(shapes))


@pytest.mark.parametrize("width", [16, 32, 64])
def test_matched_vanilla_d_mlp_matches_dca_non_embedding_count(width):
    from dca_theory.lm.params import matched_vanilla_d_mlp, non_embedding_count

    dca = ModelConfig(vocab_size=50, max_len=64, d_model=width, n_heads=4, d_mlp=4 * width,
                      n_layers=4, residual="dca")
    d_mlp, mismatch = matched_vanilla_d_mlp(dca)
    matched = dca.replace(residual="vanilla", d_mlp=d_mlp)
    # the mismatch is what it says, and no other integer width comes closer
    assert non_embedding_count(matched) - non_embedding_count(dca) == mismatch
    per_unit = 4 * (2 * width + 1)
    assert abs(mismatch) <= per_unit / 2 and d_mlp > 4 * width
    # the closed form counts the trunk of the built model: embeddings and output excluded
    assert traced_param_count(matched) - non_embedding_count(matched) == 50 * width * 2 + 50


# Two tiny shapes, the second with more streams, a higher LAuReL rank, a k-DCA middle slot
# and a Table 9 window: every closed form's terms in D, T, n, r, k and the window.
SHAPES = [ModelConfig(vocab_size=11, max_len=4, d_model=8, n_heads=2, d_mlp=16, n_layers=2),
          ModelConfig(vocab_size=11, max_len=4, d_model=12, n_heads=3, d_mlp=8, n_layers=3,
                      hc_expansion=3, laurel_rank=2)]
SCANNED = ([{"residual": r} for r in LM_RESIDUALS]
           + [{"residual": "dca", "k": 1}, {"residual": "grn_v2", "grn_window": 2}])


@pytest.mark.parametrize("changes", SCANNED, ids=lambda c: "-".join(map(str, c.values())))
def test_mixer_closed_form_equals_the_scanned_trunks_arrays(changes):
    # Each mixer class's overhead(cfg) (no arrays) against the trunk its init builds: the
    # blocks are vanilla's, so the trunk's count less vanilla's is the mixer's.
    from dca_theory.lm.params import overhead
    from dca_theory.lm.scanned import param_count as trunk_count

    for base in SHAPES:
        cfg = base.replace(**changes)
        trunk, vanilla = (_zeros_like_init(c) for c in (cfg, base))
        assert overhead(cfg) == trunk_count(trunk) - trunk_count(vanilla), cfg


def _zeros_like_init(cfg):
    """``ScannedTrunk.init(cfg)``'s structure with zero arrays of its shapes: the counts read
    shapes only, and tracing the init is much quicker than running it op by op."""
    import equinox as eqx
    import jax.numpy as jnp

    from dca_theory.lm.scanned import ScannedTrunk

    shapes = eqx.filter_eval_shape(ScannedTrunk.init, cfg, key=jax.random.PRNGKey(0))
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes,
                        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
