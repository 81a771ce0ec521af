"""GRN-v3's gates (dca_theory.gates) through the one residual operator: value at init, which
parameters get gradient at step 0, DCA = vanilla at init, retrofit, names and the warning."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory import gates
from dca_theory.gates import GATES
from dca_theory.nets import DeepLinear, MLPResNet
from dca_theory.nets._common import make_combiners
from dca_theory.residual import make_combiner

EXACT = [g.name for g in GATES.values() if g.exact_at_init]
LIVE = {"paper": False, "open": True, "bias_inside": True, "small_init": True}


def _loss_and_stack(getkey, batch=(6,), size=3, dim=5):
    stack = jax.random.normal(getkey(), (size, *batch, dim), jnp.float64)
    target = jax.random.normal(getkey(), (*batch, dim), jnp.float64)
    return stack, lambda comb: jnp.sum((comb(stack) - target) ** 2)


@pytest.mark.parametrize("gate", list(GATES))
def test_value_at_init(gate, getkey):
    """Exact gates equal the plain sum bit for bit; small_init adds relu(w.h_i) >= 0 per entry."""
    stack, _ = _loss_and_stack(getkey)
    comb = make_combiner("grn_v3", 3, 5, dtype=jnp.float64, gate=gate, key=getkey())
    if GATES[gate].exact_at_init:
        np.testing.assert_array_equal(comb(stack), jnp.sum(stack, axis=0))
        np.testing.assert_array_equal(comb.w, 0.0)
    else:
        np.testing.assert_allclose(float(jnp.std(comb.w)), gates.SMALL_INIT_STD, rtol=0.9)
        extra = jax.nn.relu(stack @ comb.w)[..., None] * stack
        np.testing.assert_allclose(comb(stack), jnp.sum(stack + extra, axis=0), rtol=1e-12)


@pytest.mark.parametrize("gate", list(GATES))
def test_which_parameters_get_gradient_at_step_0(gate, getkey):
    stack, loss = _loss_and_stack(getkey)
    comb = make_combiner("grn_v3", 3, 5, dtype=jnp.float64, gate=gate, key=getkey())
    g = jax.grad(loss)(comb)
    assert float(jnp.min(jnp.abs(g.b))) > 0  # every b_i entry moves
    w_norm = float(jnp.linalg.norm(g.w))
    assert (w_norm > 1e-6) == LIVE[gate] == GATES[gate].w_trains_from_init, w_norm
    if gate == "paper":
        np.testing.assert_array_equal(g.w, 0.0)


def test_open_and_bias_inside_give_w_the_same_first_gradient(getkey):
    """At b = 1, w = 0: d/dw of b + relu_open(w.h) and of relu(b + w.h) are both
    sum_{s,l} <ȳ_l, h_{s,l}> h_{s,l}, ȳ the output's cotangent; checked against that sum."""
    stack, loss = _loss_and_stack(getkey)
    y_bar = jax.grad(lambda y: loss(lambda _: y))(jnp.sum(stack, 0))
    expect = jnp.einsum("ld,sld,sle->e", y_bar, stack, stack)
    for gate in ("open", "bias_inside"):
        g = jax.grad(loss)(make_combiner("grn_v3", 3, 5, dtype=jnp.float64, gate=gate))
        np.testing.assert_allclose(g.w, expect, rtol=1e-12)
    assert float(jnp.linalg.norm(expect)) > 1e-3


def test_bias_inside_filters_an_entry_with_a_negative_bias(getkey):
    """relu(b + w.h) with b_i < 0 and w = 0 drops entry i entirely (Figure 10's reading);
    b_i + relu(w.h) never does."""
    stack, _ = _loss_and_stack(getkey)
    b = jnp.ones((3, 5), jnp.float64).at[1].set(-0.2)
    inside = eqx.tree_at(lambda c: c.b, make_combiner("grn_v3", 3, 5, dtype=jnp.float64), b)
    np.testing.assert_allclose(inside(stack), stack[0] + stack[2], rtol=1e-12)
    outside = eqx.tree_at(lambda c: c.b, make_combiner("grn_v3", 3, 5, dtype=jnp.float64,
                                                       gate="paper"), b)
    np.testing.assert_allclose(outside(stack), stack[0] - 0.2 * stack[1] + stack[2], rtol=1e-12)


def test_names_aliases_and_errors():
    assert gates.canonical("relu") == "paper" and gates.canonical("relu_open") == "open"
    assert make_combiner("grn_v3", 2, 3, gate="relu_open").gate == "open"
    with pytest.raises(ValueError, match=r"unknown GRN-v3 gate 'sigmoid'; valid gates: .*"
                                         "bias_inside, small_init$"):
        gates.canonical("sigmoid")
    with pytest.raises(ValueError, match="'small_init' draws w at random: pass a PRNG key"):
        make_combiner("grn_v3", 2, 3, gate="small_init")


def test_each_domain_defaults_to_its_own_gate():
    """The toy networks train w by default (``bias_inside``); the language model and the ViT,
    which share its trunk, default to the gate the LM evidence picked."""
    from dca_theory.lm.config import ModelConfig
    from dca_theory.vit.config import preset as vit_preset

    assert gates.DEFAULT_GATE == "bias_inside" and gates.GATES[gates.DEFAULT_GATE].bias_inside
    assert make_combiners("grn_v3", 2, 3, None, jnp.float32)[0].gate == gates.DEFAULT_GATE
    assert gates.LM_DEFAULT_GATE in gates.GATES
    assert ModelConfig().grn_gate == gates.LM_DEFAULT_GATE
    assert vit_preset("digits_tiny", residual="dca").grn_gate == gates.LM_DEFAULT_GATE


def test_the_toy_networks_warn_once_in_one_line_about_the_paper_gate(capsys, monkeypatch):
    """A toy network with the literal gate warns that w cannot train (its default gate trains
    w); the language model builds with it silently, where it is the default."""
    from dca_theory.lm.config import ModelConfig
    from dca_theory.lm.model import build_model

    monkeypatch.setattr(gates, "_warned", set())
    build_model(ModelConfig(vocab_size=11, max_len=4, d_model=8, n_heads=1, d_mlp=8,
                            n_layers=2, residual="dca", grn_gate="paper"),
                key=jax.random.PRNGKey(0))
    make_combiner("grn_v3", 2, 3, gate="paper")
    assert capsys.readouterr().err == ""
    make_combiners("grn_v3", 2, 3, None, jnp.float32, gate="paper")
    make_combiners("grn_v3", 3, 3, None, jnp.float32, gate="relu")
    make_combiners("grn_v2", 2, 3, None, jnp.float32, gate="paper")
    err = capsys.readouterr().err
    assert err == gates.FROZEN_GATE_WARNING + "\n"
    assert "cannot train" in err and "\n" not in err.rstrip("\n")


@pytest.mark.parametrize("net", ["linear", "mlp"])
def test_toy_nets_take_the_gate(net, getkey):
    """The gate reaches every combiner of a toy net; exact gates keep the ResNet at init."""
    x = jax.random.normal(getkey(), (4, 6), jnp.float32)
    key = getkey()
    build = ((lambda kind, gate: DeepLinear(6, 2, 3, kind=kind, gate=gate, key=key))
             if net == "linear" else
             (lambda kind, gate: MLPResNet(6, 2, 3, kind=kind, gate=gate, key=key)))
    res = build("res", "bias_inside")
    for gate in GATES:
        model = build("grn_v3", gate)
        assert {c.gate for c in model.combiners} == {gate}
        if GATES[gate].exact_at_init:
            np.testing.assert_allclose(jax.vmap(model)(x), jax.vmap(res)(x), rtol=1e-6,
                                       atol=1e-6)


def test_relu_derivative_at_zero_depends_on_the_spelling():
    """The README's statement: the derivative at 0 is a property of the function used, not a
    convention shared by frameworks."""
    zero = jnp.zeros((), jnp.float32)
    assert float(jax.grad(jax.nn.relu)(zero)) == 0.0
    assert float(jax.grad(lambda x: jnp.maximum(x, 0.0))(zero)) == 0.5
    assert float(jax.grad(gates.relu_open)(zero)) == 1.0
