"""The buffer GRN kernel (:mod:`dca_theory.lm.fast.buffer_grn`) against the combiner classes it
implements, in float64: value and the gradient of every input, for each GRN kind and gate,
several GRNs at once (DCA's three) included. Tolerance 1e-12 relative to the largest
magnitude (float64 summation-order differences are ~1e-15; a wrong backward term is O(1))."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory.lm.fast.buffer_grn import buffer_grns
from dca_theory.residual import AbstractGRN, make_combiner

S, L, D = 5, 3, 4


def _max_rel(got, want) -> float:
    got, want = np.asarray(got), np.asarray(want)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


@pytest.mark.parametrize("kinds, gate", [
    (("grn_v3",) * 3, "bias_inside"), (("grn_v3",) * 3, "paper"), (("grn_v3",), "open"),
    (("grn_v3",), "small_init"), (("grn_v1",), "bias_inside"), (("grn_v2", "grn_v3"), "open"),
])
def test_kernel_equals_the_combiners_in_value_and_gradient(kinds, gate):
    buf = jax.random.normal(jax.random.PRNGKey(0), (S, 2, L, D), jnp.float64)
    grns = [make_combiner(k, S, D, init="random", key=jax.random.PRNGKey(i), gate=gate,
                          dtype=jnp.float64) for i, k in enumerate(kinds)]
    cots = [jax.random.normal(jax.random.PRNGKey(10 + i), (2, L, D), jnp.float64)
            for i in range(len(grns))]

    def reference(grns, buf):
        return sum(jnp.vdot(g(buf), c) for g, c in zip(grns, cots))

    def kernel(grns, buf):
        return sum(jnp.vdot(y, c) for y, c in zip(buffer_grns(grns, buf), cots))

    want, g_want = jax.value_and_grad(reference, argnums=(0, 1))(grns, buf)
    got, g_got = jax.jit(jax.value_and_grad(kernel, argnums=(0, 1)))(grns, buf)
    assert _max_rel(got, want) < 1e-12
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want), strict=True):
        assert _max_rel(a, b) < 1e-12


class _ScalarGated(AbstractGRN):
    """A GRN of a kind the kernel was not written for: one scalar b per entry and GRN-v3's
    gate (CONTRIBUTING.md's ``grn_v1_gated``), so its gate and b's shape come from its arrays."""

    kind: ClassVar[str] = "grn_v1"
    b: jax.Array
    w: jax.Array
    size: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    gate: str = eqx.field(static=True)

    @classmethod
    def identity(cls, size, dim, *, dtype, gate, key=None):
        return cls(b=jnp.ones((size,), dtype), w=jnp.zeros((dim,), dtype), size=size, dim=dim,
                   gate=gate)


@pytest.mark.parametrize("gate", ["paper", "bias_inside"])
def test_kernel_takes_the_gate_and_a_scalar_b_of_any_gated_grn(gate):
    k_b, k_w, k_h, k_c = jax.random.split(jax.random.PRNGKey(3), 4)
    grn = _ScalarGated(b=jax.random.normal(k_b, (S,), jnp.float64),
                       w=jax.random.normal(k_w, (D,), jnp.float64), size=S, dim=D, gate=gate)
    buf = jax.random.normal(k_h, (S, L, D), jnp.float64)
    cot = jax.random.normal(k_c, (L, D), jnp.float64)
    want = jax.grad(lambda g, h: jnp.vdot(g(h), cot), argnums=(0, 1))(grn, buf)
    got = jax.grad(lambda g, h: jnp.vdot(buffer_grns((g,), h)[0], cot), argnums=(0, 1))(grn, buf)
    assert _max_rel(buffer_grns((grn,), buf)[0], grn(buf)) < 1e-12
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.shape == b.shape and _max_rel(a, b) < 1e-12


def test_kernel_refuses_a_buffer_of_another_size():
    grn = make_combiner("grn_v3", S, D, dtype=jnp.float64)
    with pytest.raises(ValueError, match=r"stack shape \(4, 3, 4\) does not match"):
        buffer_grns((grn,), jnp.zeros((S - 1, L, D), jnp.float64))


@pytest.mark.parametrize("kinds, gate, count", [
    (("grn_v3",) * 3, "bias_inside", 3), (("grn_v3",) * 3, "paper", 1),
    (("grn_v1", "grn_v2", "grn_v3"), "open", S),
])
def test_counted_kernel_equals_the_combiners_on_the_written_slots(kinds, gate, count):
    """``buffer_grns_through``: the GRNs of the buffer with the slots from ``count`` on zeroed,
    the buffer passed through, and the buffer's cotangent that of both uses (the passed-through
    buffer's own cotangent added in place), under ``vmap`` over a batch as in the model, with
    ``count`` a traced integer as in the scan."""
    from dca_theory.lm.fast.buffer_grn import buffer_grns_through

    buf = jax.random.normal(jax.random.PRNGKey(0), (2, S, L, D), jnp.float64)  # batch first
    grns = [make_combiner(k, S, D, init="random", key=jax.random.PRNGKey(i), gate=gate,
                          dtype=jnp.float64) for i, k in enumerate(kinds)]
    cots = [jax.random.normal(jax.random.PRNGKey(10 + i), (2, L, D), jnp.float64)
            for i in range(len(grns))]
    later = jax.random.normal(jax.random.PRNGKey(20), (2, S, L, D), jnp.float64)
    written = (jnp.arange(S) < count).reshape(-1, 1, 1)

    def reference(grns, buf):
        ys = jax.vmap(lambda b: tuple(g(jnp.where(written, b, 0)) for g in grns))(buf)
        return sum(jnp.vdot(y, c) for y, c in zip(ys, cots)) + jnp.vdot(buf, later)

    def kernel(grns, buf, n):
        ys, through = jax.vmap(lambda b: buffer_grns_through(grns, b, n))(buf)
        return sum(jnp.vdot(y, c) for y, c in zip(ys, cots)) + jnp.vdot(through, later)

    want, g_want = jax.value_and_grad(reference, argnums=(0, 1))(grns, buf)
    got, g_got = jax.jit(jax.value_and_grad(kernel, argnums=(0, 1)))(grns, buf,
                                                                       jnp.asarray(count))
    assert _max_rel(got, want) < 1e-12
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want), strict=True):
        assert _max_rel(a, b) < 1e-12
