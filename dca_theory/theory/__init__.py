"""Closed forms of the paper's Section 4 (low-rank linear model), numpy/scipy only.

Public API (float64, vectorised where natural):

* :mod:`.risk`: ``excess_risk``, ``excess_risk_bound`` (Theorem 4.2), ``delta_decomposition``,
  ``nu_max``, ``nu_tilde_max``, ``task_complexity``;
* :mod:`.tradeoff`: ``param_count``, ``matched_rank``, ``best_matched_rank``,
  ``worst_matched_rank``, ``lemma_c1_bound``, ``rank_loss_bound`` (Lemma C.1), ``threshold``,
  ``gain_lower_bound`` (Theorem 4.3), ``normalised_gain_guarantee`` (its 0-1 scale),
  ``rank_savings`` (Proposition 4.4), ``eta``, ``xi0``, ``v3_constant``,
  ``sufficient_condition``.

This package must import only numpy and scipy (no jax), so that ``dca-theory figures`` and
``dca-theory verify`` start fast.
"""

from dca_theory.theory.risk import (
    DeltaDecomposition,
    delta_decomposition,
    excess_risk,
    excess_risk_bound,
    nu_max,
    nu_tilde_max,
    task_complexity,
)
from dca_theory.theory.tradeoff import (
    best_matched_rank,
    eta,
    feasible_matched_ranks,
    gain_lower_bound,
    lemma_c1_bound,
    matched_rank,
    normalised_gain_guarantee,
    param_count,
    rank_loss_bound,
    rank_savings,
    sufficient_condition,
    threshold,
    v3_constant,
    worst_matched_rank,
    xi0,
)

__all__ = [
    "DeltaDecomposition",
    "best_matched_rank",
    "delta_decomposition",
    "eta",
    "excess_risk",
    "excess_risk_bound",
    "feasible_matched_ranks",
    "gain_lower_bound",
    "lemma_c1_bound",
    "matched_rank",
    "normalised_gain_guarantee",
    "nu_max",
    "nu_tilde_max",
    "param_count",
    "rank_loss_bound",
    "rank_savings",
    "sufficient_condition",
    "task_complexity",
    "threshold",
    "v3_constant",
    "worst_matched_rank",
    "xi0",
]
