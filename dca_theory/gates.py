r"""GRN-v3's input-dependent gate, by name: where the bias sits, how w starts, which ReLU.

GRN-v3 (paper §3.1) weights stack entry :math:`h_i` by a coefficient :math:`c_i\in R^D` that
depends on the entry itself through one scalar :math:`w^\top h_i` per token. The paper prints

.. math::  c_i = b_i + \mathrm{ReLU}(w^\top h_i),\qquad b = 1,\ w = 0 \text{ at init,}

and at :math:`w = 0` every gate input is exactly 0. Whether :math:`w` then ever trains is
decided by the derivative the framework gives ReLU at 0: ``jax.nn.relu`` and ``torch.relu`` give
0 (so :math:`w` gets exactly zero gradient at every step and GRN-v3 trains as GRN-v2), while
``jnp.maximum(x, 0)`` gives 0.5 and PyTorch's ``clamp_min`` gives 1. It is a property of how
ReLU is spelled, not a convention the frameworks share.

=================  =============================================  ====================  ======
gate               coefficient :math:`c_i`                        init                  exact
=================  =============================================  ====================  ======
``paper``          :math:`b_i + \mathrm{ReLU}(w^\top h_i)`,       b = 1, w = 0          yes
                   ReLU'(0) = 0: w never trains
``open``           the same values, ReLU'(0) = 1: w trains        b = 1, w = 0          yes
``bias_inside``    :math:`\mathrm{ReLU}(b_i + w^\top h_i)`         b = 1, w = 0          yes
``small_init``     :math:`b_i + \mathrm{ReLU}(w^\top h_i)`        b = 1, w ~ N(0, s²)   no
=================  =============================================  ====================  ======

*exact*: the GRN equals the plain residual sum at initialisation, so DCA equals the vanilla
transformer exactly and a vanilla checkpoint converts exactly (retrofit). ``small_init`` adds
:math:`\mathrm{ReLU}(w^\top h_i)\ge 0` to every coefficient at init, a relative change of
order :math:`s\,\|h_i\|` (measured by ``tests/test_gates.py``).

Each domain's default is chosen on evidence from that domain. **The toy networks**
(:data:`DEFAULT_GATE`, ``bias_inside``): all its parameters get gradient from the first step
(ReLU'(1) = 1), the model starts exactly at vanilla, and it is the only form under which the
paper's Figure 10 reading ("negative bias ... the layers are filtered out as a result of the
ReLU activation") is possible: a bias outside the ReLU is never filtered by it. The
measurements behind it are in ``paper/01_theory.md`` and ``paper/02_toy_networks.md``. **The
language model and the ViT** (:data:`LM_DEFAULT_GATE`, ``paper``; the ViT runs the LM's
trunk): the second pre-registered LM design's H4 compared the three exact gates on PTB-char
at widths 16-64, each at its own learning rate, 8 paired seeds: no gate wins, ``paper`` is
not resolved from ``open`` (D = +0.12 log-perplexity points, mean over the widths)
and is 2.04 points below ``bias_inside``, and the rule then picks ``paper``
(``paper/05_lm/evidence_result_2.md``, H4). With it w never trains, so the LM's GRN-v3 computes
GRN-v2's function. The old names ``relu`` (= ``paper``) and ``relu_open`` (= ``open``) are
aliases.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jaxtyping import Array


@jax.custom_jvp
def relu_open(x: Array) -> Array:
    """ReLU whose derivative at 0 is 1 instead of ``jax.nn.relu``'s 0 (same values).

    At w = 0 every gate input is exactly 0; with derivative 1 there the gate weights w get the
    gradient they would get just above 0, while the forward function (and so the identity at
    init) is unchanged.
    """
    return jnp.maximum(x, 0)


@relu_open.defjvp
def _relu_open_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return relu_open(x), jnp.where(x >= 0, dx, jnp.zeros_like(dx))


@dataclass(frozen=True)
class Gate:
    """One GRN-v3 gate: ``c_i = relu(b_i + w.h_i)`` if ``bias_inside`` else
    ``b_i + relu(w.h_i)``, ``relu`` the :attr:`nonlinearity`; w starts at N(0, w_init_std²)."""

    name: str
    summary: str
    bias_inside: bool
    nonlinearity: Callable[[Array], Array]
    open_at_zero: bool  # the nonlinearity's derivative at 0 is 1 (else 0)
    w_init_std: float = 0.0
    aliases: tuple[str, ...] = ()

    @property
    def exact_at_init(self) -> bool:
        """Whether the GRN equals the plain residual sum at initialisation."""
        return self.w_init_std == 0.0

    @property
    def w_trains_from_init(self) -> bool:
        """Whether w gets a nonzero gradient at the initialisation (generically)."""
        return self.bias_inside or self.open_at_zero or self.w_init_std > 0

    def derivative_mask(self, pre: Array) -> Array:
        """Where the nonlinearity passes its input's derivative (``pre`` its input)."""
        return (pre >= 0) if self.open_at_zero else (pre > 0)


#: the toy networks' GRN-v3 gate (``nets/``, ``sim/``): see the module docstring
DEFAULT_GATE = "bias_inside"
#: the language model's and the ViT's GRN-v3 gate (they share one trunk), chosen by the LM
#: evidence: see the module docstring
LM_DEFAULT_GATE = "paper"
#: ``small_init``'s standard deviation of w at init
SMALL_INIT_STD = 0.01
#: folded into a PRNG key to draw ``small_init``'s w, so that no other parameter's draw changes
KEY_SALT = 7

GATES: dict[str, Gate] = {g.name: g for g in (
    Gate("paper", "b + ReLU(w.h), ReLU'(0) = 0: the literal form; w = 0 never trains",
         bias_inside=False, nonlinearity=jax.nn.relu, open_at_zero=False, aliases=("relu",)),
    Gate("open", "b + ReLU(w.h), ReLU'(0) = 1: same values as 'paper', w trains",
         bias_inside=False, nonlinearity=relu_open, open_at_zero=True, aliases=("relu_open",)),
    Gate("bias_inside", "ReLU(b + w.h), b = 1, w = 0: exact at init, every parameter trains",
         bias_inside=True, nonlinearity=jax.nn.relu, open_at_zero=False),
    Gate("small_init", f"b + ReLU(w.h), w ~ N(0, {SMALL_INIT_STD}^2): vanilla only "
         "approximately at init", bias_inside=False, nonlinearity=jax.nn.relu,
         open_at_zero=False, w_init_std=SMALL_INIT_STD),
)}
_ALIASES = {a: g.name for g in GATES.values() for a in g.aliases}


def known() -> str:
    """The valid gate names for error messages (``paper (or relu), open (or relu_open), ...``)."""
    return ", ".join(g.name + (f" (or {', '.join(g.aliases)})" if g.aliases else "")
                     for g in GATES.values())


def canonical(name: str) -> str:
    """The gate's name (an alias such as ``relu`` becomes ``paper``); one-line ValueError for
    an unknown one."""
    if isinstance(name, str) and name in GATES:
        return name
    if isinstance(name, str) and name in _ALIASES:
        return _ALIASES[name]
    raise ValueError(f"unknown GRN-v3 gate {name!r}; valid gates: {known()}")


def get(name: str) -> Gate:
    return GATES[canonical(name)]


_warned: set[str] = set()

FROZEN_GATE_WARNING = ("warning: GRN-v3 gate 'paper' (b + ReLU(w.h) with w = 0 and ReLU'(0) = 0)"
                       " gives w no gradient, so w cannot train; gates that train: "
                       "bias_inside (the toy networks' default), open, small_init")


def warn_if_frozen(name: str) -> None:
    """Print one warning line on stderr (once per process) if ``name`` is the literal gate,
    whose w cannot train. The toy networks call it (their default gate trains w); the language
    model does not, since the literal gate is its default."""
    if canonical(name) == "paper" and "paper" not in _warned:
        _warned.add("paper")
        print(FROZEN_GATE_WARNING, file=sys.stderr)
