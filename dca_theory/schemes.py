r"""Every residual scheme, named once: what it is, where it runs, how figures draw it.

A *scheme* is a way of forming each layer's input from the outputs of earlier layers (paper §3).
This module is the one table of them. Every other module asks it (``get``, ``names``) instead
of keeping its own tuple of names, and every figure takes its label and colour from it. It is
plain Python (no numpy, no jax), so the closed-form theory can import it without training code.

=====================  ========  ==========================================================  =======
scheme (aliases)       family    layer input                                                 where
=====================  ========  ==========================================================  =======
``base``               plain     newest output only (no residual connection)                 toy
``vanilla`` (``res``)  plain     sum of the stack (ResNet / pre-LN transformer)              toy, LM
``grn_v1``             grn       :math:`\sum_i b_i h_i`                                      toy, LM
``grn_v2``             grn       :math:`\sum_i b_i \odot h_i`                                toy, LM
``grn_v3``             grn       :math:`\sum_i (b_i + \mathrm{gate}(w^\top h_i)) \odot h_i`  toy, LM
``dca``                dca       three GRN-v3 per block for q, k, v (§3.2); k-DCA            LM
``denseformer``        baseline  depth-weighted average (Pagliardini et al. 2024)            LM
``hyper_connections``  baseline  n residual streams mixed per block (Zhu et al.)             LM
``laurel_lr``          baseline  LAuReL low-rank (Menghani et al. 2024)                      LM
``laurel_pa``          baseline  LAuReL previous-activations                                 LM
``attn_res``           baseline  softmax over depth, pseudo-queries (Kimi 2026)              toy, LM
``mhc``                baseline  Hyper-Connections, Sinkhorn mixing (DeepSeek 2025)          LM
``muddformer``         baseline  dynamic dense q/k/v/residual streams (Xiao et al.)          LM
``value_residual``     baseline  first layer's values mixed in (ResFormer)                   LM
=====================  ========  ==========================================================  =======

"toy" schemes have a combiner over the stack (:mod:`dca_theory.residual`) used by the toy nets;
``theory=True`` marks the ones with a theory in the low-rank linear model: Section 4's five
classes (``base`` to ``grn_v3``) and two rivals placed in its hierarchy by
:mod:`dca_theory.theory.rivals` (``attn_res``, ``mhc``; mHC's n streams are no stack combiner,
so it has a theory but no toy combiner); "LM" schemes are
``ModelConfig.residual`` kinds, also used by the ViT.

**Adding a GRN-like scheme** takes a row in :data:`SCHEMES` below and its combiner class in
:mod:`dca_theory.residual` (the row names the GRN mixer for the LM); **any other LM scheme** a
row and its mixer class in :mod:`dca_theory.lm.zoo` (``Scheme.mixer``), which holds how the
scheme reads and writes the residual state and its closed-form parameter count
(CONTRIBUTING.md walks through both); the registry's tests and the operator's tests pick
either up. Entering the theory (``theory=True``: an expressivity class, a construction, rows in
``dca-theory verify``) is a separate step.

**Parameter counts.** :meth:`Scheme.combiner_params` is the one count of a combiner's
parameters, used by the combiner classes, the toy nets, the LM and the theory. Over a depth-T
network the nets hold T + 1 combiners of stack sizes 1, ..., T + 1 (one in front of every layer
and one for the output). The paper's §4.2 count (Lemma C.1) keeps only the weights between
layers: T(T−1)/2 pairs, plus one gate vector per layer for GRN-v3.
:func:`network_combiner_params` gives both (``convention="nets"`` / ``"paper"``); they differ
by the input-slot weights (T + 1 of them), the output combiner's T layer slots and, for
GRN-v3, the output combiner's gate vector: ``(2T + 1)·p + d`` with ``p`` the parameters per
entry (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAMILIES: tuple[str, ...] = ("plain", "grn", "dca", "baseline")
# How many parameters a combiner stores per stack entry: none, one scalar, or one d-vector.
PER_ENTRY: tuple[str, ...] = ("none", "scalar", "vector")


@dataclass(frozen=True)
class Scheme:
    """One residual scheme. ``name`` is canonical; ``aliases`` are accepted everywhere."""

    name: str
    family: str
    label: str  # legends, tables, axis ticks
    color: str  # matplotlib colour; one per scheme across every figure
    summary: str  # one line for listings (``dca-theory lm info``, CONTRIBUTING.md)
    aliases: tuple[str, ...] = ()
    toy: bool = False  # has a stack combiner (dca_theory.residual): the toy nets
    theory: bool = False  # analysed in Section 4 (expressivity classes, risk, trade-offs)
    lm: bool = False  # a ``ModelConfig.residual`` kind (LM and ViT)
    takes_k: bool = False  # a k-truncated stack (k-DCA) applies
    grn_window: bool = False  # Table 9's restricted GRN stacks apply
    retrofit: bool = False  # a vanilla model converts exactly into this scheme at init
    per_entry: str = "none"  # combiner parameters per stack entry (see PER_ENTRY)
    gate_vector: bool = False  # combiner has one gate vector w in R^d (GRN-v3)
    query_vector: bool = False  # combiner has one pseudo-query q in R^d (AttnRes)
    gated: bool = False  # has GRN-v3 gates, so the gate choice applies (dca_theory.gates)
    # the LM mixer class (dca_theory.lm.zoo), as "module:Class" so this table needs no jax;
    # every ``lm`` scheme has one (it also holds the closed-form parameter count)
    mixer: str = ""
    # the fewest residual streams (``ModelConfig.hc_expansion``) the LM kind accepts
    min_hc_expansion: int = 1
    # the total the paper reports for its 6-layer LM1B model (Tables 5 and 7), in millions
    paper_params_m: float | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} of {self.name!r}; valid: {FAMILIES}")
        if self.per_entry not in PER_ENTRY:
            raise ValueError(f"per_entry {self.per_entry!r} of {self.name!r}; valid: {PER_ENTRY}")
        if self.lm and not self.mixer:
            raise ValueError(f"LM scheme {self.name!r} has no mixer; valid: a 'module:Class' "
                             "path to its dca_theory.lm.driver.Mixer subclass")

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def entry_params(self, dim: int) -> int:
        """Parameters a combiner of this scheme stores per stack entry."""
        return {"none": 0, "scalar": 1, "vector": dim}[self.per_entry]

    def combiner_params(self, size: int, dim: int) -> int:
        """Trainable parameters of one combiner over ``size`` stack entries of width ``dim``."""
        return size * self.entry_params(dim) + self.shared_params(dim)

    def shared_params(self, dim: int) -> int:
        """Parameters of one combiner that no stack entry owns: GRN-v3's gate vector w or
        AttnRes's pseudo-query q (one d-vector each)."""
        return dim if (self.gate_vector or self.query_vector) else 0


_GRN = "dca_theory.lm.zoo.grn:GRNMixer"
_LAUREL = "dca_theory.lm.zoo.laurel:LaurelMixer"

SCHEMES: tuple[Scheme, ...] = (
    Scheme("base", "plain", "no residual", "#9467bd", "the newest layer output only",
           toy=True, theory=True),
    Scheme("vanilla", "plain", "vanilla", "#4c4c4c", "plain residual sum (ResNet, pre-LN)",
           aliases=("res",), toy=True, theory=True, lm=True, retrofit=True,
           mixer="dca_theory.lm.zoo.plain:VanillaMixer", paper_params_m=49.65),
    Scheme("grn_v1", "grn", "GRN-v1", "#1f77b4", "one scalar weight per stack entry",
           toy=True, theory=True, lm=True, grn_window=True, retrofit=True, per_entry="scalar",
           mixer=_GRN, paper_params_m=49.65),
    Scheme("grn_v2", "grn", "GRN-v2", "#d62728", "one weight vector per stack entry",
           toy=True, theory=True, lm=True, grn_window=True, retrofit=True, per_entry="vector",
           mixer=_GRN, paper_params_m=49.66),
    Scheme("grn_v3", "grn", "GRN-v3", "#2ca02c", "GRN-v2 plus an input-dependent ReLU gate",
           toy=True, theory=True, lm=True, grn_window=True, retrofit=True, per_entry="vector",
           gate_vector=True, gated=True, mixer=_GRN, paper_params_m=49.68),
    Scheme("dca", "dca", "DCA", "#ff7f0e", "three GRN-v3 per block for queries, keys, values",
           lm=True, takes_k=True, retrofit=True, gated=True,
           mixer="dca_theory.lm.zoo.dca:DCAMixer", paper_params_m=49.73),
    Scheme("denseformer", "baseline", "DenseFormer", "#8c564b",
           "depth-weighted average of earlier outputs", lm=True,
           mixer="dca_theory.lm.zoo.denseformer:DenseFormerMixer", paper_params_m=49.65),
    Scheme("hyper_connections", "baseline", "Hyper-Connections", "#e377c2",
           "n residual streams mixed per block", lm=True,
           mixer="dca_theory.lm.zoo.streams:HyperConnectionsMixer", paper_params_m=49.68),
    Scheme("laurel_lr", "baseline", "LAuReL-LR", "#bcbd22", "LAuReL low-rank residual", lm=True,
           mixer=_LAUREL),
    Scheme("laurel_pa", "baseline", "LAuReL-PA", "#17becf",
           "LAuReL over previous activations", lm=True, mixer=_LAUREL, paper_params_m=49.75),
    Scheme("attn_res", "baseline", "AttnRes", "#393b79",
           "softmax attention over depth with a pseudo-query per sublayer", toy=True,
           theory=True, lm=True, query_vector=True,
           mixer="dca_theory.lm.zoo.attn_res:AttnResMixer"),
    Scheme("mhc", "baseline", "mHC", "#ad494a",
           "Hyper-Connections with doubly stochastic (Sinkhorn) stream mixing", theory=True,
           lm=True, mixer="dca_theory.lm.zoo.streams:MHCMixer",
           min_hc_expansion=2),  # one stream has nothing to mix
    Scheme("muddformer", "baseline", "MUDDFormer", "#637939",
           "dynamic dense connections, separate q, k, v and residual streams", lm=True,
           retrofit=True, mixer="dca_theory.lm.zoo.muddformer:MuddFormerMixer"),
    Scheme("value_residual", "baseline", "ResFormer", "#8c6d31",
           "value residuals: later layers mix in the first layer's values", lm=True,
           retrofit=True, mixer="dca_theory.lm.zoo.value_residual:ValueResidualMixer"),
)

_BY_SPELLING: dict[str, Scheme] = {s: scheme for scheme in SCHEMES for s in scheme.spellings}


def names(*, family: str | None = None, **flags: bool) -> tuple[str, ...]:
    """Canonical names of the schemes of ``family`` (any if None) whose boolean properties
    equal ``flags`` (e.g. ``names(lm=True, retrofit=True)``), in table order."""
    for flag in flags:
        if not isinstance(getattr(SCHEMES[0], flag, None), bool):
            raise ValueError(f"unknown scheme property {flag!r}; valid: toy, theory, lm, "
                             "takes_k, grn_window, retrofit, gate_vector, query_vector, "
                             "gated")
    return tuple(
        s.name for s in SCHEMES
        if all(getattr(s, k) == v for k, v in flags.items())
        and (family is None or s.family == family)
    )


def get(name: str) -> Scheme:
    """The scheme named (or aliased) ``name``; a one-line ValueError lists the valid names."""
    try:
        return _BY_SPELLING[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown residual scheme {name!r}; valid: "
                         f"{', '.join(_BY_SPELLING)}") from None


def check(name: str, allowed: tuple[str, ...], what: str = "residual scheme") -> str:
    """``name`` as given if it (or its canonical name) is among ``allowed``, else a one-line
    ValueError naming the bad value and the valid ones."""
    if name in allowed or (name in _BY_SPELLING and get(name).name in allowed):
        return name
    raise ValueError(f"unknown {what} {name!r}; valid: {', '.join(map(_with_aliases, allowed))}")


def _with_aliases(name: str) -> str:
    """``vanilla (or res)`` for a canonical name with aliases, else the name itself."""
    scheme = _BY_SPELLING.get(name)
    if scheme is None or scheme.name != name or not scheme.aliases:
        return name
    return f"{name} (or {', '.join(scheme.aliases)})"


def known(name: str) -> bool:
    """Whether ``name`` is a scheme's name or alias."""
    return name in _BY_SPELLING


def canonical(name: str) -> str:
    return get(name).name


def network_combiner_params(name: str, depth: Any, dim: Any, *, convention: str = "nets",
                            stack_sizes=None) -> Any:
    """Combiner parameters of a depth-``depth`` network (an int; with ``convention="paper"``
    ``depth`` and ``dim`` may also be integer arrays, as the theory's vectorised counts pass).

    ``"nets"``: what the toy nets and the LM store, the T + 1 combiners over ``stack_sizes``
    (default the full stack, 1, ..., T + 1). ``"paper"``: §4.2's count, T(T−1)/2 pairs times
    the per-entry parameters plus d·T for GRN-v3's gates (see the module docstring).
    """
    scheme = get(name)
    if convention == "paper":
        pairs = depth * (depth - 1) // 2
        return pairs * scheme.entry_params(dim) + depth * scheme.shared_params(dim)
    if convention != "nets":
        raise ValueError(f"convention must be 'nets' or 'paper', got {convention!r}")
    sizes = range(1, depth + 2) if stack_sizes is None else stack_sizes
    return sum(scheme.combiner_params(s, dim) for s in sizes)


def label(name: str) -> str:
    """The figure label of a scheme or a run variant of one: ``2-dca`` → ``2-DCA``, an
    ``_open`` suffix (gate with ReLU'(0) = 1) → ``… (open gate)``."""
    if name.endswith("_open"):
        return f"{label(name[:-len('_open')])} (open gate)"
    k, sep, rest = name.partition("-")
    if sep and k.isdigit():
        return f"{k}-{label(rest)}"
    return get(name).label


def color(name: str) -> str:
    """The figure colour of a scheme; run variants (``2-dca``, ``grn_v3_open``) take their
    scheme's colour (figures tell variants apart by line style or shade)."""
    if name.endswith("_open"):
        return color(name[:-len("_open")])
    k, sep, rest = name.partition("-")
    if sep and k.isdigit():
        return color(rest)
    return get(name).color
