"""The fast path's operations (:mod:`dca_theory.lm.fast.fused_grn`) equal the reference path, value
and gradient in float64, and refuse what they cannot compute:

* the fused GRNs (:func:`combine_entries`) against ``Combiner`` calls on the stacked array, to
  1e-12 relative;
* DCA's fused GRN + LayerNorm (:func:`grn_layer_norm`) against three ``Combiner`` calls followed
  by three LayerNorms, to 1e-11 of the largest magnitude;
* the entry points the trunk and blocks call, on both values of ``grn_impl``;
* :func:`separate_add`: an exact sum whose XLA conditional survives compilation.

Whole models on both paths: ``test_fast_path_models.py``.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_helpers import perturb

from dca_theory.gates import GATES
from dca_theory.lm.blocks import LayerNorm
from dca_theory.lm.fast.fused_grn import (
    combine_and_norm,
    combine_entries,
    combine_stack,
    grn_layer_norm,
    middle_add,
    separate_add,
)
from dca_theory.residual import ResidualStack, make_combiner

RTOL = 1e-12
# Relative to the largest magnitude in the whole compared tree: some gradients are exactly 0
# in exact arithmetic (e.g. a LayerNorm bias that a softmax ignores) and only rounding noise
# (~1e-18) on either path.
TREE_RTOL = 1e-11


def _loss_reference(combs, entries):
    stack = jnp.stack(entries)
    return sum(jnp.sum(jnp.sin(c(stack)) * (j + 1.0)) for j, c in enumerate(combs))


def _loss_fused(combs, entries):
    return sum(jnp.sum(jnp.sin(y) * (j + 1.0))
               for j, y in enumerate(combine_entries(combs, entries)))


def _assert_trees_close(a, b):
    """Each leaf to ``RTOL`` of its own largest magnitude (at least 1)."""
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        scale = max(float(jnp.max(jnp.abs(x))), 1.0)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=RTOL * scale)


def _assert_within_tree_scale(a, b):
    """Every leaf to ``TREE_RTOL`` of the largest magnitude in the whole tree ``b``."""
    xs, ys = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(xs) == len(ys)
    scale = max(float(jnp.max(jnp.abs(y))) for y in ys)
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=TREE_RTOL * scale)


@pytest.mark.parametrize("gate", list(GATES))
@pytest.mark.parametrize("init, batch", [("random", ()), ("random", (3, 5)), ("identity", (6,))])
def test_fused_equals_reference(gate, init, batch, getkey):
    size, dim = 4, 5
    entries = tuple(jax.random.normal(getkey(), (*batch, dim), jnp.float64) for _ in range(size))
    # DCA's three GRN-v3 plus a v1 and a v2, so every kind's backward is exercised together.
    combs = [make_combiner(kind, size, dim, dtype=jnp.float64, init=init, key=getkey(), gate=gate)
             for kind in ("grn_v3", "grn_v3", "grn_v3", "grn_v1", "grn_v2")]
    np.testing.assert_allclose(_loss_fused(combs, entries), _loss_reference(combs, entries),
                               rtol=RTOL)
    _assert_trees_close(eqx.filter_grad(_loss_fused)(combs, entries),
                        eqx.filter_grad(_loss_reference)(combs, entries))
    _assert_trees_close(jax.grad(_loss_fused, argnums=1)(combs, entries),
                        jax.grad(_loss_reference, argnums=1)(combs, entries))


@pytest.mark.parametrize("gate, moves", [("paper", False), ("open", True), ("bias_inside", True),
                                         ("small_init", True)])
def test_gate_derivative_at_init_matches_reference(gate, moves, getkey):
    """At init the paper's gate input w.h is exactly 0 and ReLU'(0) = 0 keeps w still; the
    open gate (ReLU'(0) = 1), the bias inside (ReLU'(1) = 1) and a random w let it move. The
    fused backward must reproduce each."""
    entries = tuple(jax.random.normal(getkey(), (7, 3), jnp.float64) for _ in range(3))
    comb = make_combiner("grn_v3", 3, 3, dtype=jnp.float64, gate=gate, key=getkey())
    g = eqx.filter_grad(_loss_fused)([comb], entries)[0]
    assert (float(jnp.max(jnp.abs(g.w))) > 0) == moves
    _assert_trees_close(g, eqx.filter_grad(_loss_reference)([comb], entries)[0])


def test_fused_under_vmap_and_jit(getkey):
    entries = tuple(jax.random.normal(getkey(), (4, 6, 5), jnp.float64) for _ in range(3))
    combs = [make_combiner("grn_v3", 3, 5, dtype=jnp.float64, init="random", key=getkey())]

    def per_row(fn):
        return eqx.filter_jit(eqx.filter_grad(
            lambda c, e: jnp.sum(jax.vmap(lambda *row: fn(c, row), in_axes=0)(*e))))

    _assert_trees_close(per_row(_loss_fused)(combs, entries),
                        per_row(_loss_reference)(combs, entries))


def test_mixed_dtypes_keep_each_dtype(getkey):
    entries = tuple(jax.random.normal(getkey(), (3, 4), jnp.float32) for _ in range(2))
    comb = make_combiner("grn_v3", 2, 4, dtype=jnp.float32, init="random", key=getkey())
    (y,) = combine_entries([comb], entries)
    assert y.dtype == jnp.float32
    g = eqx.filter_grad(lambda c: jnp.sum(combine_entries([c], entries)[0]))(comb)
    assert g.b.dtype == g.w.dtype == jnp.float32


def test_errors(getkey):
    entries = tuple(jnp.ones((2, 4)) for _ in range(3))
    with pytest.raises(ValueError, match="size 2"):
        combine_entries([make_combiner("grn_v2", 2, 4)], entries)
    with pytest.raises(ValueError, match="combiners only, got 'vanilla'"):
        combine_entries([make_combiner("res", 3, 4)], entries)
    with pytest.raises(ValueError, match="one GRN-v3 gate"):
        combine_entries([make_combiner("grn_v3", 3, 4, gate="paper"),
                         make_combiner("grn_v3", 3, 4, gate="open")], entries)


def test_bias_inside_backward_where_the_relu_cuts(getkey):
    """The bias-inside gate with b around 0, so that relu(b + w.h) is 0 for about half the
    features and tokens: the fused backward's per-feature mask must equal autodiff's."""
    size, dim = 4, 5
    entries = tuple(jax.random.normal(getkey(), (6, dim), jnp.float64) for _ in range(size))
    combs = [make_combiner("grn_v3", size, dim, dtype=jnp.float64, gate="bias_inside")
             for _ in range(3)]
    combs = [eqx.tree_at(lambda c: (c.b, c.w), c, (jax.random.normal(getkey(), c.b.shape,
                                                                      jnp.float64),
                                                    jax.random.normal(getkey(), c.w.shape,
                                                                      jnp.float64)))
             for c in combs]
    coefficients = combs[0].weights(jnp.stack(entries))
    assert 0.2 < float(jnp.mean(coefficients == 0)) < 0.8  # the cut is exercised
    _assert_trees_close(eqx.filter_grad(_loss_fused)(combs, entries),
                        eqx.filter_grad(_loss_reference)(combs, entries))
    _assert_trees_close(jax.grad(_loss_fused, argnums=1)(combs, entries),
                        jax.grad(_loss_reference, argnums=1)(combs, entries))


@pytest.mark.parametrize("gate", list(GATES))
def test_grn_layer_norm_equals_reference(gate, getkey):
    size, dim = 4, 6
    entries = tuple(jax.random.normal(getkey(), (5, dim), jnp.float64) for _ in range(size))
    grns = [make_combiner("grn_v3", size, dim, dtype=jnp.float64, init="random", key=getkey(),
                          gate=gate) for _ in range(3)]
    norms = [perturb(LayerNorm.init(dim, 1e-6, jnp.float64), getkey()) for _ in range(3)]
    weights = [jax.random.normal(getkey(), (5, dim), jnp.float64) for _ in range(6)]

    def fused(grns, norms, entries):
        normed, raw, _ = grn_layer_norm(grns, norms, entries, jnp.float64)
        return sum(jnp.sum(jnp.sin(y) * w) for y, w in zip(normed + raw, weights))

    def reference(grns, norms, entries):
        raw = tuple(g(jnp.stack(entries)) for g in grns)
        normed = tuple(n(x) for n, x in zip(norms, raw))
        return sum(jnp.sum(jnp.sin(y) * w) for y, w in zip(normed + raw, weights))

    np.testing.assert_allclose(fused(grns, norms, entries), reference(grns, norms, entries),
                               rtol=TREE_RTOL)
    _assert_within_tree_scale(eqx.filter_grad(fused)(grns, norms, entries),
                              eqx.filter_grad(reference)(grns, norms, entries))
    _assert_within_tree_scale(jax.grad(fused, argnums=2)(grns, norms, entries),
                              jax.grad(reference, argnums=2)(grns, norms, entries))


def test_entry_points_give_the_same_tuple_on_both_paths(getkey):
    """combine_stack (windowed: entries outside the window come back untouched),
    combine_and_norm and middle_add return equal values whatever ``grn_impl``."""
    dim = 5
    xs = [jax.random.normal(getkey(), (3, dim), jnp.float64) for _ in range(5)]
    stack = ResidualStack.start(xs[0], k=2)
    for x in xs[1:]:
        stack = stack.push(x)
    comb = make_combiner("grn_v3", 2, dim, dtype=jnp.float64, init="random", key=getkey())
    grns = [make_combiner("grn_v3", stack.size, dim, dtype=jnp.float64, init="random",
                          key=getkey()) for _ in range(3)]
    norms = [perturb(LayerNorm.init(dim, 1e-6, jnp.float64), getkey()) for _ in range(3)]
    results = {}
    for impl in ("fused", "reference"):
        (y,), after = combine_stack((comb,), stack, impl, slots=(1, 3))
        assert after.entries()[0] is stack.entries()[0] and after.entries()[2] is stack.entries()[2]
        tripled = combine_and_norm(grns, norms, stack.entries(), impl)
        total = middle_add(impl, comb.b)(xs[1], xs[2])
        results[impl] = (y, after.entries(), tripled, total)
    _assert_within_tree_scale(results["fused"], results["reference"])


def test_entry_points_refuse_an_unknown_grn_impl():
    stack = ResidualStack.start(jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="unknown grn_impl 'fast'; valid: fused, reference"):
        combine_stack((make_combiner("grn_v3", 1, 4),), stack, "fast")
    with pytest.raises(ValueError, match="unknown grn_impl 'fast'"):
        middle_add("fast", jnp.ones(1))


def _compiled_text(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


@pytest.mark.parametrize("token", [jnp.ones(3), jnp.full(3, jnp.nan)])
def test_separate_add_is_a_sum_kept_out_of_fusions(token, getkey):
    """``a + b`` in value and gradient whatever the predicate the token gives (a NaN token
    takes the other branch), computed inside an XLA conditional that survives compilation
    (the fusion barrier), also under vmap with an unbatched token. Fails if JAX or XLA
    learns to remove the conditional, which would bring back the slow fusions."""
    a, b = (jax.random.normal(getkey(), (4, 6, 5), jnp.float64) for _ in range(2))
    np.testing.assert_array_equal(separate_add(a, b, token), a + b)
    ga, gb = jax.grad(lambda a, b: jnp.sum(jnp.sin(separate_add(a, b, token))), (0, 1))(a, b)
    np.testing.assert_allclose(ga, jnp.cos(a + b), rtol=1e-14)
    np.testing.assert_array_equal(ga, gb)

    def per_row(x, y, t):  # the token is an argument, as a parameter is (a constant folds)
        return jax.vmap(lambda x, y: separate_add(x * 2.0, y, t))(x, y)

    np.testing.assert_array_equal(per_row(a, b, token), 2.0 * a + b)
    assert "conditional(" in _compiled_text(per_row, a, b, token)


def test_separate_add_keeps_its_conditional_under_vmap_over_seeds(getkey):
    """Seeds vmapped around examples: the token (a parameter) is batched over seeds, yet the
    custom vmap rule keeps one scalar predicate, so the conditional survives; exact values and
    gradients, also with one operand unbatched."""
    a, b = (jax.random.normal(getkey(), (3, 4, 5), jnp.float64) for _ in range(2))
    tokens = jax.random.normal(getkey(), (3, 2), jnp.float64)  # one per seed

    def seeds(a, b, t):
        return jax.vmap(lambda a, b, t: jax.vmap(lambda x, y: separate_add(x, y, t))(a, b))(
            a, b, t)

    np.testing.assert_array_equal(seeds(a, b, tokens), a + b)
    assert "conditional(" in _compiled_text(seeds, a, b, tokens)
    g = jax.grad(lambda a, b: jnp.sum(seeds(a, b, tokens) ** 2), (0, 1))(a, b)
    np.testing.assert_allclose(g[0], 2 * (a + b), rtol=1e-14)
    np.testing.assert_array_equal(g[0], g[1])
    half = jax.vmap(lambda x, t: separate_add(x, b[0], t))(a, tokens)  # b unbatched
    np.testing.assert_array_equal(half, a + b[:1])


def test_separate_add_refuses_mixed_operands():
    with pytest.raises(ValueError, match=r"one shape and dtype, got \(2,\) float\d+ and \(3,\)"):
        separate_add(jnp.ones(2), jnp.ones(3), jnp.ones(1))


def test_push_folds_the_middle_with_the_given_add(getkey):
    calls = []

    def add(x, y):
        calls.append(1)
        return x + y

    xs = [jax.random.normal(getkey(), (3,)) for _ in range(5)]
    stack = ResidualStack.start(xs[0], k=2)
    for x in xs[1:]:
        stack = stack.push(x, add=add)
    assert len(calls) == 1  # outputs 1, 2 stay recent; 3 evicts 1 (no add); 4 folds 2 in
    np.testing.assert_allclose(stack.middle, xs[1] + xs[2])
    assert len(stack.recent) == 2 and stack.total().shape == (3,)


def _exported_text(fn, platform: str, *args) -> str:
    from jax import export

    return export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()


def test_the_cpu_tricks_are_lowered_for_the_cpu_only(getkey):
    """The conditional of ``separate_add`` and the ``h + 0·ḡ`` recomputation were measured on
    XLA:CPU only: the program exported for a GPU has neither (no predicate is computed, so no
    ``is_finite``), for ``separate_add`` alone and for a whole fused DCA gradient; the CPU
    program keeps both. (The values are the same expressions: ``a + b`` and ``h``.)"""
    a, b = (jax.random.normal(getkey(), (4, 6), jnp.float32) for _ in range(2))
    token = jnp.ones(3, jnp.float32)
    assert "is_finite" in _exported_text(separate_add, "cpu", a, b, token)
    assert "is_finite" not in _exported_text(separate_add, "cuda", a, b, token)

    from dca_theory.lm.config import PRESETS
    from dca_theory.lm.model import build_model

    cfg = PRESETS["tiny"].replace(residual="dca", k=2, n_layers=3, dropout=0.0,
                                  attn_dropout=0.0)
    model = build_model(cfg, key=getkey())
    tokens = jnp.zeros((cfg.max_len,), jnp.int32)

    params, static = eqx.partition(model, eqx.is_inexact_array)

    def loss_grad(p):
        return eqx.filter_grad(lambda m: jnp.sum(m(tokens)))(eqx.combine(p, static))

    cpu, cuda = (_exported_text(loss_grad, plat, params) for plat in ("cpu", "cuda"))
    assert cpu.count("is_finite") >= cfg.n_layers  # middle sums, entry and output cotangents
    assert "is_finite" not in cuda
