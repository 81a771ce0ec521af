"""Invalid arguments raise a one-line ValueError naming the argument and the valid range."""

from __future__ import annotations

import numpy as np
import pytest

from dca_theory import theory as th

A4 = np.eye(4) + np.diag([3.0, 2.0, 1.5, 1.0])  # A - I positive definite

BAD_CALLS = [
    # (call, words the message must contain)
    (lambda: th.excess_risk("res", A4, 4), ["r_star", "< d=4"]),
    (lambda: th.excess_risk("res", A4, -1), ["r_star", "0 <= r_star"]),
    (lambda: th.excess_risk("res", A4, 1.5), ["r_star", "integer"]),
    (lambda: th.excess_risk("resnet", A4, 1), ["kind", "grn_v1"]),
    (lambda: th.excess_risk("res", np.ones((3, 4)), 1), ["square", "(3, 4)"]),
    (lambda: th.excess_risk("res", np.ones(3), 1), ["square"]),
    (lambda: th.excess_risk("grn_v1", np.full((3, 3), np.nan), 1), ["A", "finite"]),
    (lambda: th.excess_risk_bound("grn_v3", A4, 1, constant="exact"), ["constant", "paper"]),
    (lambda: th.excess_risk_bound("base", A4, 1), ["kind", "grn_v3"]),
    (lambda: th.task_complexity(np.eye(3) + np.diag([1.0, 0.0, 2.0])), ["positive definite"]),
    (lambda: th.task_complexity(np.eye(3) + np.triu(np.ones((3, 3)))), ["symmetric"]),
    (lambda: th.param_count("grn_v2", 0, 1, 1), ["d", ">= 1"]),
    (lambda: th.param_count("grn_v2", 10, 3, 0), ["T", ">= 1"]),
    (lambda: th.param_count("grn_v2", -5, 3, 2), ["d", ">= 1"]),
    (lambda: th.param_count("grn_v2", 10, 10, 2), ["r_star", "< d=10"]),
    (lambda: th.matched_rank("grn_v1", 10, 3, -2), ["T", ">= 1"]),
    (lambda: th.threshold("grn_v1", 0.0, 10), ["kappa", "(0, 1]"]),
    (lambda: th.threshold("grn_v1", 1.5, 10), ["kappa", "(0, 1]"]),
    (lambda: th.threshold("grn_v2", [0.5, np.inf], 10), ["kappa", "finite"]),
    (lambda: th.threshold("res", 0.5, 10), ["kind", "grn_v1"]),
    (lambda: th.threshold("grn_v3", 0.5, 10, lemma="loose"), ["lemma", "tight"]),
    (lambda: th.rank_savings("grn_v1", 12, 10, 0.5), ["r_star", "< d=10"]),
    (lambda: th.rank_savings("grn_v1", 2, 10, -0.5), ["kappa", "(0, 1]"]),
    (lambda: th.gain_lower_bound("grn_v1", 10, 11, 1, 2), ["r_star", "<= d=10"]),
    (lambda: th.gain_lower_bound("grn_v1", 10, 5, 0, 2), ["lam_min", "> 0"]),
    (lambda: th.gain_lower_bound("grn_v1", 10, 5, 3, 2), ["lam_min", "<= lam_max"]),
    (lambda: th.gain_lower_bound("grn_v1", 10, 5, np.nan, 2), ["lam_min", "finite"]),
    (lambda: th.lemma_c1_bound("grn_v2", 10, -1), ["r_star"]),
]


@pytest.mark.parametrize("call,words", BAD_CALLS)
def test_invalid_arguments_raise_one_line_value_error(call, words):
    with pytest.raises(ValueError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_cli_turns_value_errors_into_exit_code_2(capsys):
    # The CLI contract (dca_theory.cli.main): ValueError -> one line on stderr, status 2.
    from dca_theory.cli import main

    assert main(["run", "no_such_experiment_name"]) == 2
    assert capsys.readouterr().err.startswith("dca-theory: error: ")


def test_theory_does_not_import_jax():
    # `dca-theory figures` must start fast: the closed forms use numpy/scipy only.
    import subprocess
    import sys

    code = ("import sys, dca_theory.theory; "
            "sys.exit(1 if any(m.split('.')[0] in ('jax', 'equinox', 'optax') "
            "for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
