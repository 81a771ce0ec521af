"""The shared residual operator: identity at init, k-stack semantics, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory.residual import (
    COMBINERS,
    GRN_KINDS,
    ResidualStack,
    combine,
    make_combiner,
    stack_size,
)


@pytest.mark.parametrize("kind", GRN_KINDS)
@pytest.mark.parametrize("batch", [(), (3,), (2, 5)])
def test_grn_equals_plain_sum_at_init(kind, batch, getkey):
    stack = jax.random.normal(getkey(), (4, *batch, 7))
    comb = make_combiner(kind, 4, 7, dtype=stack.dtype)
    # Exact: b = 1 multiplies and ReLU(0 . h) = 0 adds nothing.
    np.testing.assert_array_equal(comb(stack), jnp.sum(stack, axis=0))


@pytest.mark.parametrize("gate", ["paper", "open", "bias_inside", "small_init"])
def test_grn_v3_formula_with_random_weights(gate, getkey):
    stack = jax.random.normal(getkey(), (3, 5, 4))
    comb = make_combiner("grn_v3", 3, 4, dtype=stack.dtype, init="random", key=getkey(),
                         gate=gate)

    def coefficient(i):  # written out per gate (dca_theory.gates' table)
        p = (stack[i] @ comb.w)[:, None]
        b = comb.b[i][None, :]
        return jax.nn.relu(b + p) if gate == "bias_inside" else b + jax.nn.relu(p)

    expect = sum(coefficient(i) * stack[i] for i in range(3))
    np.testing.assert_allclose(comb(stack), expect, rtol=1e-12)
    np.testing.assert_allclose(jnp.sum(comb.weights(stack) * stack, 0), expect, rtol=1e-12)


def test_base_takes_newest(getkey):
    st = ResidualStack.start(jnp.ones(3)).push(2 * jnp.ones(3))
    np.testing.assert_array_equal(combine(make_combiner("base", 2, 3), st), 2 * jnp.ones(3))


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_k_stack_slots(k):
    outs = [float(i + 1) * jnp.ones(2) for i in range(6)]
    st = ResidualStack.start(jnp.zeros(2) + 100.0, k=k)
    for n, f in enumerate(outs, start=1):
        st = st.push(f)
        assert st.size == stack_size(n, k) <= k + 2
        vals = [float(e[0]) for e in st.array()]
        assert vals[0] == 100.0
        if n > k:
            assert vals[1] == sum(range(1, n - k + 1))  # the middle sum
        assert vals[len(vals) - min(n, k):] == list(range(n - min(n, k) + 1, n + 1))
        np.testing.assert_array_equal(st.total(), 100.0 + sum(range(1, n + 1)))


def test_k_at_least_depth_is_full_stack(getkey):
    outs = [jax.random.normal(getkey(), (3,)) for _ in range(4)]
    full, trunc = ResidualStack.start(outs[0]), ResidualStack.start(outs[0], k=4)
    for f in outs[1:]:
        full, trunc = full.push(f), trunc.push(f)
    np.testing.assert_array_equal(full.array(), trunc.array())


def test_param_counts():
    counts = [make_combiner(k, 5, 8).param_count() for k in ("res", "grn_v1", "grn_v2", "grn_v3")]
    assert counts == [0, 5, 40, 48]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: make_combiner("grn_v4", 2, 2), "unknown residual kind 'grn_v4'"),
        (lambda: ResidualStack.start(jnp.ones(2), k=-1), "k must be None"),
        (lambda: make_combiner("grn_v1", 0, 2), "stack size and dim"),
        (lambda: make_combiner("grn_v1", 2, 3)(jnp.ones((3, 3))), "does not match"),
    ],
)
def test_errors_name_the_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_unknown_gate():
    with pytest.raises(ValueError, match="unknown GRN-v3 gate 'tanh'; valid gates: paper "
                                         r"\(or relu\), open \(or relu_open\), bias_inside"):
        make_combiner("grn_v3", 2, 2, gate="tanh")


@pytest.mark.parametrize("kind", sorted(COMBINERS))
def test_linear_flag_says_whether_the_weights_depend_on_the_stack(kind, getkey):
    # The toy nets trust ``linear`` for the end-to-end matrix and the population risk, so it
    # must agree with the weights themselves: constant over stacks iff linear.
    c = make_combiner(kind, 3, 5, dtype=jnp.float64, init="random", key=getkey())
    s1, s2 = (jax.random.normal(getkey(), (3, 2, 5), jnp.float64) for _ in range(2))
    same = bool(jnp.allclose(c.weights(s1), c.weights(s2), atol=1e-12))
    assert c.linear == same


@pytest.mark.parametrize("kind", ["base", "vanilla", "grn_v1", "grn_v2", "grn_v3"])
def test_input_term_is_the_input_slot_alone(kind, getkey):
    # c_0(x) * x: the combination minus what the other entries contribute with x zeroed.
    c = make_combiner(kind, 3, 5, dtype=jnp.float64, init="random", key=getkey())
    stack = jax.random.normal(getkey(), (3, 5), jnp.float64)
    rest = c(stack.at[0].set(0.0))
    expected = c(stack) - rest if c.linear else c.weights(stack)[0] * stack[0]
    np.testing.assert_allclose(c.input_term(stack[0], 3), expected, atol=1e-12)
