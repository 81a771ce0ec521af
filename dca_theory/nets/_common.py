r"""What the two toy networks share: argument checks, the combiners and the forward pass.

Paper §3 / App. A (``shared/reference/dca-paper.md`` §1.1, §2.1): layer :math:`t` receives
:math:`g_t = \mathrm{combine}_t(G_t)` over the stack :math:`G_t = [x, f_1, \dots, f_{t-1}]` and
the model output is :math:`y = \mathrm{combine}_{T+1}(G_{T+1})`. With ``kind="res"`` this is the
ResNet :math:`g_{t+1} = g_t + f_t`; with ``kind="base"`` it is the plain product of the layers.

Widths may be *padded*: parameters are stored at width ``pad_to`` and a boolean ``mask`` keeps
only the first ``r_t`` columns of layer ``t``. Padded columns are multiplied by zero, receive zero
gradient and never move, so a padded net is the same function, with the same training dynamics,
as the unpadded one (tested). Padding lets one compiled program train many widths under
``jax.vmap``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from dca_theory import gates, schemes
from dca_theory.gates import DEFAULT_GATE
from dca_theory.residual import (
    AbstractCombiner,
    ResidualStack,
    check_k,
    check_kind,
    combine,
    make_combiner,
    stack_size,
)


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def check_dims(dim: int, depth: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
        raise ValueError(f"depth T must be an integer >= 1, got {depth!r}")


def rank_array(ranks, depth: int, dim: int, pad_to: int | None) -> tuple[Array, int]:
    """Per-layer ranks as an int array ``(T,)`` and the stored (padded) width.

    ``ranks`` is one int (every layer), a sequence of ``T`` ints, or a traced array (inside
    ``jax.vmap``; then ``pad_to`` is required and the values cannot be checked here).
    """
    if _is_traced(ranks) or (isinstance(ranks, jax.Array) and _is_traced(ranks)):
        if pad_to is None:
            raise ValueError("traced ranks need an explicit pad_to (the stored width)")
        r = jnp.broadcast_to(jnp.asarray(ranks), (depth,))
        return r, int(pad_to)
    arr = np.broadcast_to(np.asarray(ranks), (depth,)) if np.ndim(ranks) == 0 else np.asarray(
        ranks
    )
    if arr.shape != (depth,):
        raise ValueError(f"ranks must be one int or {depth} ints (one per layer), got {ranks!r}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"ranks must be integers, got {ranks!r}")
    bad = [int(r) for r in arr if r < 1 or r > dim]
    if bad:
        raise ValueError(f"layer width/rank {bad[0]} out of range: need 1 <= r_t <= dim={dim}")
    width = int(arr.max()) if pad_to is None else int(pad_to)
    if width < int(arr.max()) or width > dim:
        raise ValueError(f"pad_to={pad_to} must lie in [max rank {int(arr.max())}, dim={dim}]")
    return jnp.asarray(arr, dtype=jnp.int32), width


def rank_mask(ranks: Array, width: int) -> Bool[Array, "T r"]:
    return jnp.arange(width, dtype=ranks.dtype)[None, :] < ranks[:, None]


def make_combiners(
    kind: str, depth: int, dim: int, k: int | None, dtype, init: str = "identity", key=None,
    gate: str = DEFAULT_GATE,
) -> tuple[AbstractCombiner, ...]:
    """The ``T + 1`` combiners: one in front of every layer and one for the output; ``gate``
    names GRN-v3's gate (:mod:`dca_theory.gates`; ``small_init`` needs ``key``)."""
    check_kind(kind)
    check_k(k)
    if schemes.get(kind).gated:
        gates.warn_if_frozen(gate)
    keys = list(jax.random.split(key, depth + 1)) if key is not None else [None] * (depth + 1)
    return tuple(
        make_combiner(kind, stack_size(t, k), dim, dtype=dtype, init=init, key=keys[t],
                      gate=gate)
        for t in range(depth + 1)
    )


def combiner_params(kind: str, depth: int, dim: int, k: int | None) -> int:
    """Parameters of the ``depth + 1`` combiners (see :func:`schemes.network_combiner_params`)."""
    sizes = [stack_size(t, k) for t in range(depth + 1)]
    return schemes.network_combiner_params(kind, depth, dim, stack_sizes=sizes)


def residual_forward(
    combiners: Sequence[AbstractCombiner],
    k: int | None,
    x: Float[Array, " d"],
    layer: Callable[[int, Array], Array],
) -> tuple[Float[Array, " d"], dict[str, Array]]:
    """Run the residual recursion; return the output and the per-layer states.

    States: ``layer_inputs[t] = g_t`` (what layer t sees), ``layer_outputs[t] = f_t(g_t)``
    (the new stack entry) and ``stream[t]`` = the plain sum of the stack after layer t (the
    ResNet residual stream; for ``res`` it equals ``g_{t+1}``).
    """
    stack = ResidualStack.start(x, k)
    ins, outs, stream = [], [], []
    for t in range(len(combiners) - 1):
        g = combine(combiners[t], stack)
        f = layer(t, g)
        stack = stack.push(f)
        ins.append(g)
        outs.append(f)
        stream.append(stack.total())
    y = combine(combiners[-1], stack)
    return y, {
        "layer_inputs": jnp.stack(ins),
        "layer_outputs": jnp.stack(outs),
        "stream": jnp.stack(stream),
    }


def skip_term(combiner: AbstractCombiner, x: Float[Array, " d"], size: int
              ) -> Float[Array, " d"]:
    """The output combiner's contribution from the model-input slot alone, ``c_0(x) ⊙ x``.

    Every other slot is a sum of layer outputs whose Jacobians have rank <= r_t, so the
    Jacobian of the model minus the Jacobian of this term has rank <= r_* (Prop. 4.5).
    """
    return combiner.input_term(x, size)


class ResidualNet(eqx.Module):
    """What both toy nets share once a subclass defines ``depth``, ``dim``, ``_layer`` and the
    fields ``mask``, ``combiners``, ``kind`` and ``k``: the forward pass over the residual stack,
    the output's skip term and the parameter count."""

    def forward(self, x: Float[Array, " d"]) -> tuple[Float[Array, " d"], dict[str, Array]]:
        """Output and per-layer residual-stream states (see ``residual_forward``)."""
        return residual_forward(self.combiners, self.k, x, self._layer)

    def __call__(self, x: Float[Array, " d"]) -> Float[Array, " d"]:
        return self.forward(x)[0]

    def skip(self, x: Float[Array, " d"]) -> Float[Array, " d"]:
        """The input-slot term of the output combination (x, αx, Dx, (b+ReLU(wᵀx))⊙x)."""
        return skip_term(self.combiners[-1], x, stack_size(self.depth, self.k))

    def param_count(self) -> int:
        """Trainable parameters at the active ranks: 2 d r_* plus the combiners'."""
        r_star = int(self.mask.sum())
        return 2 * self.dim * r_star + combiner_params(self.kind, self.depth, self.dim, self.k)
