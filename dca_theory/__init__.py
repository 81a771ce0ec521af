"""dca_theory: the theory, toy networks and transformer of DeepCrossAttention (Heddes et al. 2025).

Sub-packages: ``theory`` (closed forms and sympy; imports no training code), ``nets`` and
``sim`` (toy networks, training, rank tools), ``lm`` (the DCA transformer language model),
``vit`` (the same trunk on images), ``lab`` (what the experiments share to measure them).
The residual operator shared by all of them is :mod:`dca_theory.residual`.

The names in ``__all__`` are the public API: the residual operator and its schemes, the toy
nets, the main closed forms of the theory, and the language model's configuration, model and
training entry points. Everything else stays importable from its module but is not promised.
The names load lazily, on first use, so that ``import dca_theory`` (and with it
``dca-theory figures`` and ``dca-theory verify``) does not load JAX.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public name -> the module that defines it (a module itself where the name is the module's).
_PUBLIC = {
    # the residual operator (paper §3) and the table of schemes
    "ResidualStack": "dca_theory.residual",
    "make_combiner": "dca_theory.residual",
    "combine": "dca_theory.residual",
    "AbstractCombiner": "dca_theory.residual",
    "NewestOnly": "dca_theory.residual",
    "PlainSum": "dca_theory.residual",
    "GRNv1": "dca_theory.residual",
    "GRNv2": "dca_theory.residual",
    "GRNv3": "dca_theory.residual",
    "SoftmaxOverDepth": "dca_theory.residual",
    "schemes": "dca_theory",
    "Scheme": "dca_theory.schemes",
    # the toy networks
    "DeepLinear": "dca_theory.nets",
    "MLPResNet": "dca_theory.nets",
    # the theory's main closed forms (Theorems 4.2, 4.3, Proposition 4.4, Lemma C.1)
    "excess_risk": "dca_theory.theory",
    "excess_risk_bound": "dca_theory.theory",
    "delta_decomposition": "dca_theory.theory",
    "task_complexity": "dca_theory.theory",
    "matched_rank": "dca_theory.theory",
    "rank_loss_bound": "dca_theory.theory",
    "threshold": "dca_theory.theory",
    "gain_lower_bound": "dca_theory.theory",
    "normalised_gain_guarantee": "dca_theory.theory",
    "rank_savings": "dca_theory.theory",
    # the transformer language model
    "ModelConfig": "dca_theory.lm.config",
    "LMTrainConfig": "dca_theory.lm.train_config",
    "TransformerLM": "dca_theory.lm.model",
    "build_model": "dca_theory.lm.model",
    "load_corpus": "dca_theory.lm.data",
    "train_and_evaluate": "dca_theory.lm.train",
    "load_run": "dca_theory.lm.train",
    "evaluate_run": "dca_theory.lm.train",
    "generate": "dca_theory.lm.sample",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    """Load a public name on first use (PEP 562) and keep it, so later uses cost nothing."""
    home = _PUBLIC.get(name)
    if home is None:
        raise AttributeError(f"module 'dca_theory' has no attribute {name!r}")
    if home == __name__:  # a sub-module exported by its own name
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
