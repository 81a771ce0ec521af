"""The learning-rate sweep rule (dca_theory.lab.rate_sweep) on synthetic loss curves: it ends
with an interior best rate or flags the edge, never extends more than it may, and treats a
diverged rate as worse than any."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dca_theory.lab import rate_sweep as R


def _bowl(optimum: float):
    """A loss whose minimum over rates lies at ``optimum`` (quadratic in log2 rate)."""
    return lambda lr: 1.0 + (math.log2(lr) - math.log2(optimum)) ** 2


@pytest.mark.parametrize("optimum", [1e-4, 3e-3, 8e-3, 1e-2, 5e-2, 1.0])
def test_the_sweep_ends_interior_or_flagged_at_the_edge(optimum):
    start = (4e-3, 8e-3, 1.6e-2)
    losses, complete = R.sweep(start, _bowl(optimum), max_extend=4)
    best = R.best_rate(losses)
    assert complete and len(losses) <= len(start) + 4
    # the best tried is the grid point nearest the optimum in log2, unless the extensions ran out
    nearest = min(losses, key=lambda lr: abs(math.log2(lr / optimum)))
    assert best["lr"] == nearest
    if best["at_grid_edge"]:
        assert len(losses) == len(start) + 4  # flagged only once the 4 extensions are spent
        assert optimum < min(losses) or optimum > max(losses)
    else:
        assert min(losses) < best["lr"] < max(losses)
    # every rate is a power-of-two multiple of the starting rates (doubling / halving)
    for lr in losses:
        assert abs(math.log2(lr / 8e-3) - round(math.log2(lr / 8e-3))) < 1e-9


def test_extension_direction_count_and_divergence():
    # best at the top: double; at the bottom: halve; interior: stop
    assert R.next_rate([1, 2, 4], {1: 3.0, 2: 2.0, 4: 1.0}, 4) == 8
    assert R.next_rate([1, 2, 4], {1: 1.0, 2: 2.0, 4: 3.0}, 4) == 0.5
    assert R.next_rate([1, 2, 4], {1: 2.0, 2: 1.0, 4: 3.0}, 4) is None
    # the extension budget counts every rate beyond the start, in both directions
    assert R.next_rate([1, 2, 4], {0.5: 1.0, 1: 2.0, 2: 3.0, 4: 4.0}, 1) is None
    # a diverged (non-finite) largest rate is worse than any: the finite best is interior
    assert R.best_rate({1: 2.0, 2: 1.0, 4: math.nan})["lr"] == 2
    assert R.next_rate([1, 2, 4], {1: 2.0, 2: 1.5, 4: math.inf}, 4) is None
    # everything diverged: halve
    assert R.next_rate([1, 2], {1: math.inf, 2: math.inf}, 4) == 0.5
    best = R.best_rate({1: 2.0, 2: 1.0, 4: 1.5})
    assert best["second"] == 4 and best["ranked"] == [2, 4, 1] and not best["at_grid_edge"]


def test_a_missing_run_leaves_the_sweep_incomplete_and_unextended():
    seen = []

    def loss_of(lr):
        seen.append(lr)
        return None if lr == 4 else 1.0 / lr  # best at the top, but 4 is not available

    losses, complete = R.sweep([1, 2, 4], loss_of, 4)
    assert not complete and seen == [1, 2, 4] and set(losses) == {1, 2}


def test_the_first_design_keeps_its_rule():
    # lm_evidence's next_rate delegates here: same answers as its own rule had
    from dca_theory.lab import lm_evidence as E

    s = E.EvidenceSettings.preset(True)  # lr_grid 3e-3, 6e-3; lr_extend 1
    tried = {3e-3: {"valid_loss": [2.0, 2.2]}, 6e-3: {"valid_loss": [1.0, 1.2]}}
    assert E.next_rate(s, 8, tried) == pytest.approx(1.2e-2)
    tried[1.2e-2] = {"valid_loss": [0.5, np.inf]}
    assert E.next_rate(s, 8, tried) is None  # the one extension is spent
