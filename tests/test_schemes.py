"""The scheme registry: one name per scheme, aliases, and one parameter count that ties the
paper's §4.2 convention to what the nets store."""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

from dca_theory import schemes
from dca_theory.nets import DeepLinear
from dca_theory.residual import COMBINERS, make_combiner


def test_every_spelling_names_one_scheme():
    spellings = [s for scheme in schemes.SCHEMES for s in scheme.spellings]
    assert len(spellings) == len(set(spellings))
    assert schemes.canonical("res") == "vanilla"


def test_every_toy_scheme_has_exactly_one_combiner_class():
    assert set(COMBINERS) == set(schemes.names(toy=True))
    for name, cls in COMBINERS.items():
        assert cls.kind == name


def test_every_lm_scheme_names_a_mixer_class():
    from dca_theory.lm.driver import Mixer
    from dca_theory.lm.zoo import mixer_class

    for name in schemes.names(lm=True):
        assert issubclass(mixer_class(name), Mixer), name
    with pytest.raises(ValueError, match="LM scheme 'x' has no mixer; valid: a 'module:Class'"):
        schemes.Scheme("x", "baseline", "x", "#000000", "x", lm=True)


def test_every_scheme_has_its_own_colour():
    colours = [s.color for s in schemes.SCHEMES]
    assert len(colours) == len(set(colours))


@pytest.mark.parametrize("name, expected", [("2-dca", "2-DCA"), ("dca", "DCA"),
                                            ("grn_v3_open", "GRN-v3 (open gate)"),
                                            ("res", "vanilla")])
def test_labels_of_run_variants(name, expected):
    assert schemes.label(name) == expected


def test_unknown_name_is_a_one_line_error_listing_aliases():
    with pytest.raises(ValueError, match=r"unknown residual scheme 'grn_v9'; valid: base, vanilla, "
                                         r"res, grn_v1"):
        schemes.get("grn_v9")
    with pytest.raises(ValueError, match="unknown scheme property 'fast'"):
        schemes.names(fast=True)


@pytest.mark.parametrize("kind", schemes.names(toy=True))
@pytest.mark.parametrize("size, dim", [(1, 3), (4, 8)])
def test_combiner_param_count_equals_its_arrays(kind, size, dim):
    comb = make_combiner(kind, size, dim)
    arrays = jax.tree_util.tree_leaves(eqx.filter(comb, eqx.is_array))
    assert comb.param_count() == sum(a.size for a in arrays)


@pytest.mark.parametrize("kind", schemes.names(toy=True))
@pytest.mark.parametrize("depth", [1, 2, 5])
def test_paper_convention_is_the_nets_count_less_input_and_output_slots(kind, depth):
    """§4.2 counts T(T-1)/2 pairs (plus d·T gates for GRN-v3); a net also weights the input slot
    of each of its T + 1 combiners and the output combiner's T layer slots, and has one more
    gate vector (the output's; AttnRes: pseudo-query): nets = paper + (2T + 1)·p + d·[GRN-v3 or
    AttnRes], p per entry."""
    dim = 6
    scheme = schemes.get(kind)
    nets = schemes.network_combiner_params(kind, depth, dim)
    paper = schemes.network_combiner_params(kind, depth, dim, convention="paper")
    gate = scheme.shared_params(dim)
    assert nets == paper + (2 * depth + 1) * scheme.entry_params(dim) + gate
    net = DeepLinear(dim, 1, depth, kind=kind, key=jax.random.PRNGKey(0), dtype=jnp.float32)
    combiner_arrays = jax.tree_util.tree_leaves(eqx.filter(net.combiners, eqx.is_array))
    assert sum(a.size for a in combiner_arrays) == nets
