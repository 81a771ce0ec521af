"""The paired-t power used to size the second pre-registered LM design: a published value, a
simulation of the test itself, and the seed count and detectable gain that invert it."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dca_theory.lab import power as P


def test_power_matches_the_published_value_for_a_medium_effect():
    # G*Power / Cohen: paired t, two-sided alpha 0.05, effect size dz = 0.5 needs 34 pairs,
    # at a power of 0.8078
    assert P.paired_t_power(0.5, 1.0, 34) == pytest.approx(0.8078, abs=5e-4)
    assert P.seeds_for_power(0.5, 1.0) == 34
    # only delta / sd matters, and the sign of delta does not for a two-sided test
    assert P.paired_t_power(-1.5, 3.0, 34) == pytest.approx(P.paired_t_power(0.5, 1.0, 34))


def test_power_is_the_rejection_rate_of_the_paired_t_test():
    # 20,000 simulated 8-seed experiments with delta / sd = 1: the t-test's rejection rate
    # agrees with the noncentral-t power to within 4 binomial standard errors
    rng = np.random.default_rng(0)
    d = rng.normal(1.5, 1.5, size=(20_000, 8))
    p = stats.ttest_1samp(d, 0.0, axis=1).pvalue
    for alpha in (0.05, 0.05 / 3):
        rate, want = float(np.mean(p < alpha)), P.paired_t_power(1.5, 1.5, 8, alpha)
        assert abs(rate - want) < 4 * np.sqrt(want * (1 - want) / 20_000), (alpha, rate, want)
    # a large effect stays a finite probability (scipy's lower-tail cdf is nan there)
    assert 0.9999 < P.paired_t_power(1.5, 0.64, 11, 0.05 / 3) <= 1.0
    # at delta = 0 the two-sided power is the level
    assert P.paired_t_power(0.0, 1.0, 6) == pytest.approx(0.05, abs=1e-12)


def test_seed_count_and_detectable_gain_invert_the_power():
    n = P.seeds_for_power(1.5, 1.85, alpha=0.05 / 3)
    assert P.paired_t_power(1.5, 1.85, n, 0.05 / 3) >= 0.8 > P.paired_t_power(1.5, 1.85, n - 1,
                                                                               0.05 / 3)
    g = P.detectable_gain(1.85, n, alpha=0.05 / 3)
    assert g <= 1.5 and P.paired_t_power(g, 1.85, n, 0.05 / 3) == pytest.approx(0.8, abs=1e-6)
    # a one-sided test needs fewer seeds than a two-sided one at the same level
    assert P.seeds_for_power(1.5, 1.85, two_sided=False) <= P.seeds_for_power(1.5, 1.85)
    assert P.seeds_for_power(0.01, 10.0, max_seeds=50) is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(delta=1.0, sd=1.0, n=1), "n must be"),
    (dict(delta=1.0, sd=0.0, n=5), "sd must be"),
    (dict(delta=1.0, sd=1.0, n=5, alpha=1.5), "alpha must"),
])
def test_bad_input_gets_a_one_line_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        P.paired_t_power(**kwargs)
