"""Figures draw schemes only through ``figures.style``'s helpers, which read the scheme registry:
one colour and label per scheme, run variants as shades or line styles of their scheme."""

from __future__ import annotations

import matplotlib.colors
import pytest

from dca_theory import schemes
from figures.style import VARIANTS, scheme_color, scheme_label, scheme_linestyle, wrap_label


@pytest.mark.parametrize("name", [s for scheme in schemes.SCHEMES for s in scheme.spellings])
def test_schemes_look_as_the_registry_says(name):
    assert scheme_color(name) == schemes.get(name).color
    assert scheme_label(name) == schemes.get(name).label
    assert scheme_linestyle(name) == "-"


def test_open_gate_is_its_scheme_dashed():
    for name in ("grn_v3", "dca"):
        assert scheme_color(f"{name}_open") == scheme_color(name)
        assert scheme_label(f"{name}_open") == f"{scheme_label(name)} (open gate)"
        assert scheme_linestyle(f"{name}_open") == "--"


def test_k_dca_shades_lighten_as_k_shrinks():
    lightness = [sum(matplotlib.colors.to_rgb(scheme_color(k))) for k in ("1-dca", "2-dca",
                                                                            "4-dca", "dca")]
    assert lightness == sorted(lightness, reverse=True) and len(set(lightness)) == 4
    assert scheme_label("2-dca") == "2-DCA"


def test_variants_differ_from_each_other_and_from_other_schemes():
    colors = [scheme_color(n) for n in VARIANTS if n != "grn_v3_full"]
    assert len(set(colors)) == len(colors)
    assert not set(colors) & {s.color for s in schemes.SCHEMES}


def test_wrap_label_breaks_at_spaces_hyphens_and_before_a_parenthesis():
    assert wrap_label("GRN-v3 (open gate)") == "GRN-v3\n(open\ngate)"
    assert wrap_label("GRN-v1", width=5) == "GRN-\nv1"
    assert wrap_label("Hyper-Connections") == "Hyper-\nConnections"
    assert wrap_label("DenseFormer", width=5) == "DenseFormer"  # words are never split
