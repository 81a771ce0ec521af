r"""The residual operator: one definition shared by the theory, the toy nets and the LM.

Paper, Section 3 (see ``shared/reference/dca-paper.md`` §2.1–2.3). A residual network keeps the
*stack* of all previous layer outputs

.. math::  G_t = [x, f_1, \dots, f_{t-1}]  \qquad (\text{oldest first; the paper: newest first})

and feeds layer :math:`t` some combination :math:`g_t = \mathrm{combine}(G_t)`. Each scheme with a
stack combiner (:mod:`dca_theory.schemes`: ``base``, ``vanilla``/``res``, ``grn_v1``,
``grn_v2``, ``grn_v3``, ``attn_res``) is one final class below, built by :func:`make_combiner`:

==============  ===================================================================  ============
class           combination                                                          init
==============  ===================================================================  ============
``NewestOnly``  newest entry only (no residual)                                      --
``PlainSum``    :math:`\sum_i h_i` (plain ResNet sum)                                --
``GRNv1``       :math:`\sum_i b_i h_i`, :math:`b\in R^{s}`                           b = 1
``GRNv2``       :math:`\sum_i b_i \odot h_i`, :math:`b\in R^{s\times d}`             b = 1
``GRNv3``       :math:`\sum_i c_i(h_i) \odot h_i`, gated (:mod:`~dca_theory.gates`)  b = 1, w = 0
==============  ===================================================================  ============

``SoftmaxOverDepth`` (``attn_res``, Attention Residuals) combines
:math:`\sum_i \mathrm{softmax}_i(q^\top \hat h_i)\, h_i` (:math:`\hat h` the RMS-normalised
entry, one pseudo-query q; q = 0 at init).

GRN-v3's coefficient :math:`c_i(h_i)` is :math:`\mathrm{ReLU}(b_i + w^\top h_i)` with the default
gate ``bias_inside`` and :math:`b_i + \mathrm{ReLU}(w^\top h_i)` as printed in the paper; the
forms and why the default differs are in :mod:`dca_theory.gates`.

The GRN formula itself is :mod:`dca_theory.grn_formula` (shared with the theory's numpy mirror
and the LM's fast path); parameter counts come from
:meth:`dca_theory.schemes.Scheme.combiner_params`.

At initialisation every GRN equals the plain residual sum exactly (GRN-v3 with every gate but
``small_init``, whose w starts random). AttnRes's softmax weights cannot all be 1: at q = 0 it
is the *mean* of the stack, the plain sum divided by S.

**k-truncated stack (k-DCA, §3.1/§5).** Instead of every output, the stack holds
``[x, sum of the middle outputs, last k outputs]``. While no more than ``k`` outputs exist there
is no middle slot, so the stack is exactly the full stack; with ``k >= depth`` k-DCA *is* full DCA
(same shapes, same parameters, same function). Slot semantics are fixed: slot 0 is the model
input, slot 1 (once it exists) the running sum of the outputs that have left the last-k window,
and the remaining slots the last k outputs, oldest first.

Stacks are arrays of shape ``(S, *batch, D)``: ``S`` stack entries, any batch/sequence axes, and
the feature axis ``D`` last. A combiner maps such a stack to ``(*batch, D)``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from dca_theory import gates, grn_formula, schemes
from dca_theory import random_draws as draws

#: schemes with a stack combiner (toy nets, theory); aliases such as ``res`` are accepted too
COMBINER_KINDS: tuple[str, ...] = schemes.names(toy=True)
GRN_KINDS: tuple[str, ...] = schemes.names(toy=True, family="grn")


def check_kind(kind: str, allowed: Sequence[str] = COMBINER_KINDS) -> str:
    """Return ``kind`` if it (or the scheme it aliases) is one of ``allowed``, else raise a
    one-line ValueError."""
    return schemes.check(kind, tuple(allowed), what="residual kind")


def check_k(k: int | None) -> int | None:
    """Validate a k-DCA window: ``None`` (full stack) or an integer ``k >= 0``."""
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be None (full stack) or an integer >= 0, got {k!r}")
    return k


def stack_size(num_outputs: int, k: int | None) -> int:
    """Size of the stack after ``num_outputs`` layer outputs (plus the model input).

    Full stack: ``num_outputs + 1``. k-truncated: the same while ``num_outputs <= k``, then
    ``k + 2`` (input, middle sum, last k).
    """
    if num_outputs < 0:
        raise ValueError(f"num_outputs must be >= 0, got {num_outputs}")
    if k is None or num_outputs <= k:
        return num_outputs + 1
    return k + 2


class AbstractCombiner(eqx.Module):
    """One residual combination ``stack (S, *batch, D) -> (*batch, D)``.

    Each scheme with a stack combiner is one final subclass (built by :func:`make_combiner`)
    owning its call, its weight view (:meth:`weights`, the ``c`` of ``sum_i c_i * h_i``), its
    use on a :class:`ResidualStack` and, through :mod:`dca_theory.schemes`, its parameter count.
    """

    kind: ClassVar[str]  # the scheme's canonical name
    size: eqx.AbstractVar[int]
    dim: eqx.AbstractVar[int]

    @abc.abstractmethod
    def __call__(self, stack: Float[Array, "S *batch D"]) -> Float[Array, "*batch D"]:
        """The combination of a stacked array."""

    @abc.abstractmethod
    def weights(self, stack: Float[Array, "S *batch D"]) -> Float[Array, "S *batch D"]:
        """The effective per-entry, per-feature weights c with ``combine(G) = sum_i c_i * h_i``."""

    @abc.abstractmethod
    def on_stack(self, stack: ResidualStack) -> Float[Array, "*batch D"]:
        """The combination of a :class:`ResidualStack` (without stacking where possible)."""

    @classmethod
    @abc.abstractmethod
    def identity(cls, size: int, dim: int, *, dtype, gate: str, key=None) -> AbstractCombiner:
        """The combiner at the paper's initialisation, where it equals the plain sum (or, for
        ``base``, the newest entry); ``key`` draws GRN-v3's w for a gate that starts it at
        random (``small_init``)."""

    @property
    def linear(self) -> bool:
        """Whether the coefficients c are independent of the entries, so that linear layers
        joined by this combiner make one linear map (the toy nets' ``end_to_end_matrix`` and
        population risk). A combiner that does not say otherwise counts as nonlinear."""
        return False

    def input_term(self, x: Float[Array, "*batch D"], size: int) -> Float[Array, "*batch D"]:
        """The output of the input slot alone, ``c_0(x) ⊙ x``, in a stack of ``size`` entries
        (Prop. 4.5's skip term). Default: the combination of ``[x, 0, ..., 0]``, right for every
        combiner whose zero entries add nothing and whose c_0 ignores the other entries."""
        stack = jnp.zeros((size, *x.shape), x.dtype).at[0].set(x)
        return self(stack)

    def param_count(self) -> int:
        return schemes.get(self.kind).combiner_params(self.size, self.dim)

    def check_stack(self, stack: Array) -> None:
        if stack.shape[0] != self.size or stack.shape[-1] != self.dim:
            raise ValueError(
                f"stack shape {stack.shape} does not match this {self.kind} combiner: "
                f"expected ({self.size}, ..., {self.dim})"
            )


class NewestOnly(AbstractCombiner):
    """``base``: the newest entry alone (a network without residual connections)."""

    kind: ClassVar[str] = "base"
    size: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)

    def __call__(self, stack):
        self.check_stack(stack)
        return stack[-1]

    def weights(self, stack):
        return jnp.ones_like(stack).at[:-1].set(0.0)

    def on_stack(self, stack):
        return stack.newest()

    @property
    def linear(self) -> bool:
        return True

    def input_term(self, x, size):
        return jnp.zeros_like(x)

    @classmethod
    def identity(cls, size, dim, *, dtype, gate, key=None):
        return cls(size=size, dim=dim)


class PlainSum(AbstractCombiner):
    """``vanilla`` (``res``): the plain residual sum of every entry."""

    kind: ClassVar[str] = "vanilla"
    size: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)

    def __call__(self, stack):
        self.check_stack(stack)
        return jnp.sum(stack, axis=0)

    def weights(self, stack):
        return jnp.ones_like(stack)

    def on_stack(self, stack):
        return stack.total()  # the recursive sum: no stacked copy

    @property
    def linear(self) -> bool:
        return True

    def input_term(self, x, size):
        return x

    @classmethod
    def identity(cls, size, dim, *, dtype, gate, key=None):
        return cls(size=size, dim=dim)


class AbstractGRN(AbstractCombiner):
    """A GRN, ``sum_i (b_i (+ gate(w . h_i))) * h_i`` (:mod:`dca_theory.grn_formula`)."""

    b: eqx.AbstractVar[Array]
    w: eqx.AbstractVar[Array | None]
    gate: eqx.AbstractVar[str]

    def __call__(self, stack):
        self.check_stack(stack)
        return jnp.sum(self._coefficients(stack) * stack, axis=0)

    def weights(self, stack):
        return self._coefficients(stack) * jnp.ones_like(stack)

    def on_stack(self, stack):
        return self(stack.array())

    @property
    def linear(self) -> bool:
        return self.w is None  # a gate vector makes c depend on the entries

    def _coefficients(self, stack):
        gate = gates.get(self.gate)
        return grn_formula.coefficients(self.b, self.w, gate.nonlinearity, stack,
                                        gate.bias_inside)


class GRNv1(AbstractGRN):
    """``grn_v1``: one scalar ``b_i`` per entry, ``b`` of shape ``(S,)``."""

    kind: ClassVar[str] = "grn_v1"
    b: Float[Array, " S"]
    size: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    w: None = None
    gate: str = eqx.field(static=True, default=gates.DEFAULT_GATE)  # unused: no gate

    @classmethod
    def identity(cls, size, dim, *, dtype, gate, key=None):
        return cls(b=jnp.ones((size,), dtype), size=size, dim=dim)


class GRNv2(AbstractGRN):
    """``grn_v2``: one vector ``b_i`` per entry, ``b`` of shape ``(S, D)``."""

    kind: ClassVar[str] = "grn_v2"
    b: Float[Array, "S D"]
    size: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    w: None = None
    gate: str = eqx.field(static=True, default=gates.DEFAULT_GATE)  # unused: no gate

    @classmethod
    def identity(cls, size, dim, *, dtype, gate, key=None):
        return cls(b=jnp.ones((size, dim), dtype), size=size, dim=dim)


class GRNv3(AbstractGRN):
    """``grn_v3``: GRN-v2 plus one input-dependent scalar ``w . h_i`` per entry (and token),
    shared by all D features, through the gate named ``gate`` (:mod:`dca_theory.gates`)."""

    kind: ClassVar[str] = "grn_v3"
    b: Float[Array, "S D"]
    w: Float[Array, " D"]
    size: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    gate: str = eqx.field(static=True, default=gates.DEFAULT_GATE)

    @classmethod
    def identity(cls, size, dim, *, dtype, gate, key=None):
        spec = gates.get(gate)
        w = jnp.zeros((dim,), dtype)
        if spec.w_init_std:
            if key is None:
                raise ValueError(f"GRN-v3 gate {spec.name!r} draws w at random: pass a PRNG key")
            w = draws.normal(key, (dim,), dtype, scale=spec.w_init_std)
        return cls(b=jnp.ones((size, dim), dtype), w=w, size=size, dim=dim, gate=spec.name)


class SoftmaxOverDepth(AbstractCombiner):
    r"""``attn_res``: Attention Residuals' depth attention,
    :math:`\sum_i \mathrm{softmax}_i(q^\top \hat h_i)\, h_i` with
    :math:`\hat h = g \odot h / \sqrt{\mathrm{mean}(h^2) + \epsilon}` and one learned
    pseudo-query q.

    The LM keeps the paper's RMSNorm scale ``g`` per sublayer (:mod:`dca_theory.lm.zoo.attn_res`);
    it enters only as :math:`g \odot q`, so the toy nets leave it ``None`` (the same functions).
    Weights are positive and sum to 1 (a convex combination); at q = 0 they are 1/S. Scores and
    the sum run in float32 at least (a bfloat16 stack's statistics).
    """

    kind: ClassVar[str] = "attn_res"
    q: Float[Array, " D"]
    size: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    eps: float = eqx.field(static=True, default=1e-6)
    g: Float[Array, " D"] | None = None  # RMSNorm scale (the LM's); None: 1

    def __call__(self, stack, count=None):
        """The combination; with ``count``, of the first ``count`` entries only (the later
        slots of a preallocated stack get weight exactly 0, whatever they hold)."""
        self.check_stack(stack)
        acc = _at_least_float32(stack.dtype)
        alpha = self.softmax_weights(stack, count)
        # a contraction over S: no S×…×D product is formed
        return jnp.einsum("s...,s...d->...d", alpha, stack.astype(acc)).astype(stack.dtype)

    def weights(self, stack):
        return self.softmax_weights(stack)[..., None] * jnp.ones_like(stack)

    def softmax_weights(self, stack: Float[Array, "S *batch D"], count=None
                        ) -> Float[Array, " S *batch"]:
        """The softmax weights over the S entries (summing to 1 for every batch element);
        with ``count`` (an int or a traced scalar), 0 for the entries from ``count`` on."""
        acc = _at_least_float32(stack.dtype)
        stack = stack.astype(acc)
        q = self.q.astype(acc) if self.g is None else self.g.astype(acc) * self.q.astype(acc)
        rms = jnp.sqrt(jnp.mean(stack * stack, axis=-1) + jnp.asarray(self.eps, acc))
        scores = (stack @ q) / rms
        if count is not None:
            slot = jnp.arange(stack.shape[0]).reshape((-1,) + (1,) * (scores.ndim - 1))
            scores = jnp.where(slot < count, scores, jnp.finfo(acc).min)
        return jax.nn.softmax(scores, axis=0)

    def on_stack(self, stack):
        return self(stack.array())

    def input_term(self, x, size):
        raise ValueError("kind 'attn_res' has no input-slot term of its own (its softmax "
                         "weight on x depends on every entry); valid kinds: base, vanilla, "
                         "grn_v1, grn_v2, grn_v3")

    @classmethod
    def identity(cls, size, dim, *, dtype, gate, key=None):
        return cls(q=jnp.zeros((dim,), dtype), size=size, dim=dim)


def _at_least_float32(dtype) -> jnp.dtype:
    """``dtype`` widened to float32 if narrower (:func:`dca_theory.lm.norm.at_least_float32`;
    this module sits below the LM)."""
    dtype = jnp.dtype(dtype)
    return dtype if dtype.itemsize >= 4 else jnp.dtype(jnp.float32)


#: the combiner class of each scheme, by canonical name (see :mod:`dca_theory.schemes`)
COMBINERS: dict[str, type[AbstractCombiner]] = {
    c.kind: c for c in (NewestOnly, PlainSum, GRNv1, GRNv2, GRNv3, SoftmaxOverDepth)
}


def linear_kinds() -> tuple[str, ...]:
    """Canonical names of the stack combiners that are linear at the default gate."""
    return tuple(kind for kind in COMBINERS if make_combiner(kind, 1, 1).linear)


def make_combiner(
    kind: str, size: int, dim: int, *, dtype=jnp.float32, init: str = "identity", key=None,
    gate: str = gates.DEFAULT_GATE,
) -> AbstractCombiner:
    """Build a combiner over a stack of ``size`` entries of dimension ``dim``.

    ``init="identity"`` (the paper's: b = 1, w = 0) makes every GRN equal the plain residual
    sum (AttnRes: q = 0, the mean). ``init="random"`` perturbs b and w (AttnRes: q) with
    N(0, 0.1^2) noise (needs ``key``); it exists so that tests can check code paths with
    non-trivial weights. ``gate`` names the GRN-v3 gate (:mod:`dca_theory.gates`;
    ``small_init`` needs ``key`` to draw w).
    """
    cls = COMBINERS[schemes.canonical(check_kind(kind))]
    gate = gates.canonical(gate)
    if size < 1 or dim < 1:
        raise ValueError(f"stack size and dim must be >= 1, got size={size}, dim={dim}")
    if init not in ("identity", "random"):
        raise ValueError(f"init must be 'identity' or 'random', got {init!r}")
    gate_key = None if key is None else jax.random.fold_in(key, gates.KEY_SALT)
    combiner = cls.identity(size, dim, dtype=dtype, gate=gate, key=gate_key)
    if init == "random" and isinstance(combiner, AbstractGRN):
        if key is None:
            raise ValueError("init='random' needs a PRNG key")
        kb, kw = jax.random.split(key)
        noise = draws.normal(kb, combiner.b.shape, dtype, scale=0.1)
        combiner = eqx.tree_at(lambda c: c.b, combiner, combiner.b + noise)
        if combiner.w is not None:
            noise = draws.normal(kw, combiner.w.shape, dtype, scale=0.1)
            combiner = eqx.tree_at(lambda c: c.w, combiner, combiner.w + noise)
    if init == "random" and isinstance(combiner, SoftmaxOverDepth):
        if key is None:
            raise ValueError("init='random' needs a PRNG key")
        noise = draws.normal(key, combiner.q.shape, dtype, scale=0.1)
        combiner = eqx.tree_at(lambda c: c.q, combiner, combiner.q + noise)
    return combiner


class ResidualStack(eqx.Module):
    """The stack of the model input and the layer outputs so far (immutable; ``push`` returns
    a new stack).

    ``k=None`` keeps every output. With an integer ``k`` it keeps ``[x, middle, last k]`` and
    its size never exceeds ``k + 2``: outputs leaving the window are added into ``middle``.
    """

    inputs: Array
    middle: Array | None
    recent: tuple[Array, ...]
    k: int | None = eqx.field(static=True)

    @classmethod
    def start(cls, x: Float[Array, "*batch D"], k: int | None = None) -> ResidualStack:
        return cls(inputs=x, middle=None, recent=(), k=check_k(k))

    @property
    def num_outputs(self) -> int:
        """Layer outputs pushed so far (static: known at trace time)."""
        return self._num_outputs

    _num_outputs: int = eqx.field(static=True, default=0)

    def push(self, f: Float[Array, "*batch D"], add=jnp.add) -> ResidualStack:
        """The stack with ``f`` on top; ``add(middle, oldest)`` folds an output leaving the
        k-window into the middle sum (the LM's fast path passes its own:
        :mod:`dca_theory.lm.fast.fused_grn`)."""
        recent, middle = self.recent + (f,), self.middle
        if self.k is not None and len(recent) > self.k:
            oldest, recent = recent[0], recent[1:]
            middle = oldest if middle is None else add(middle, oldest)
        return ResidualStack(
            inputs=self.inputs, middle=middle, recent=recent, k=self.k,
            _num_outputs=self._num_outputs + 1,
        )

    @property
    def size(self) -> int:
        return 1 + (self.middle is not None) + len(self.recent)

    def entries(self) -> tuple[Array, ...]:
        mid = () if self.middle is None else (self.middle,)
        return (self.inputs, *mid, *self.recent)

    def with_entries(self, entries: Sequence[Array]) -> ResidualStack:
        """The same stack holding ``entries`` (slot order of :meth:`entries`) instead (the LM's
        fast path threads its entries through here: :mod:`dca_theory.lm.fast.fused_grn`)."""
        if len(entries) != self.size:
            raise ValueError(f"a stack of size {self.size} cannot hold {len(entries)} entries")
        mid = None if self.middle is None else entries[1]
        return ResidualStack(inputs=entries[0], middle=mid,
                             recent=tuple(entries[1 + (mid is not None):]), k=self.k,
                             _num_outputs=self._num_outputs)

    def array(self) -> Float[Array, "S *batch D"]:
        """The stack as one array, slot order ``[x, (middle), recent...]``."""
        return jnp.stack(self.entries())

    def total(self) -> Float[Array, "*batch D"]:
        """Plain residual sum of every entry (equals the ResNet residual stream)."""
        return sum(self.entries()[1:], self.inputs)

    def newest(self) -> Float[Array, "*batch D"]:
        return self.recent[-1] if self.recent else self.inputs


def combine(combiner: AbstractCombiner, stack: ResidualStack) -> Float[Array, "*batch D"]:
    """Apply a combiner to a stack (``vanilla`` and ``base`` without stacking it)."""
    return combiner.on_stack(stack)
