"""The evidence statistics of ``dca_theory.lab.statistics``: the seed-clustered slope and its
coverage, Welch's unpaired interval, Holm's adjustment, the vanilla power-law fit and the
equal-time gap."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dca_theory.lab import statistics as st

WIDTHS = np.array([16, 32, 64])


def _synthetic_grid(rng, slope, n_seeds, seed_slope_sd=0.15, noise_sd=0.3, intercept_sd=0.5):
    """D per (seed, width): a seed's own intercept and slope (both shared by its widths, as
    a seed's data order is) plus independent noise; the mean slope is ``slope``."""
    x = np.log2(np.tile(WIDTHS, n_seeds)).astype(float)
    seeds = np.repeat(np.arange(n_seeds), WIDTHS.size)
    own_b = rng.normal(0.0, seed_slope_sd, n_seeds)[seeds]
    own_a = rng.normal(0.0, intercept_sd, n_seeds)[seeds]
    y = -0.8 + own_a + (slope + own_b) * (x - 5.0) + rng.normal(0.0, noise_sd, x.size)
    return x, y, seeds


def test_clustered_slope_equals_pooled_least_squares_on_a_balanced_grid():
    x, y, seeds = _synthetic_grid(np.random.default_rng(0), 0.3, 5)
    fit = st.seed_clustered_slope(x, y, seeds)
    assert fit["slope"] == pytest.approx(np.polyfit(x, y, 1)[0], abs=1e-12)
    assert fit["df"] == 4 and fit["ci"][0] < fit["slope"] < fit["ci"][1]


@pytest.mark.parametrize("n_seeds", [4, 8])
def test_clustered_slope_ci_covers_the_true_slope_at_the_nominal_rate(n_seeds):
    # 4000 synthetic experiments with a seed-level random slope: the 95 % interval must cover
    # the true slope 0.95 +- 0.011 of the time (3 binomial standard errors of 4000 draws).
    rng = np.random.default_rng(1)
    hits = []
    for _ in range(4000):
        x, y, seeds = _synthetic_grid(rng, 0.25, n_seeds)
        lo, hi = st.seed_clustered_slope(x, y, seeds)["ci"]
        hits.append(lo <= 0.25 <= hi)
    assert np.mean(hits) == pytest.approx(0.95, abs=0.011)


def test_pointwise_ols_interval_would_undercover_with_seed_slopes():
    # Why clustering matters: treating the 12 points as independent (scipy's linregress
    # interval) covers clearly less than 95 % when seeds carry their own slopes.
    from scipy import stats

    rng = np.random.default_rng(2)
    hits = []
    for _ in range(2000):
        x, y, seeds = _synthetic_grid(rng, 0.25, 4, seed_slope_sd=0.4, noise_sd=0.1,
                                         intercept_sd=0.0)
        r = stats.linregress(x, y)
        half = stats.t.ppf(0.975, x.size - 2) * r.stderr
        hits.append(abs(r.slope - 0.25) <= half)
    assert np.mean(hits) < 0.85


def test_clustered_slope_one_line_errors():
    with pytest.raises(ValueError, match="need >= 2 seeds with >= 2 distinct x each, got 1"):
        st.seed_clustered_slope([4, 5, 6], [0, 1, 2], [0, 0, 0])
    with pytest.raises(ValueError, match="one shape"):
        st.seed_clustered_slope([4, 5], [0, 1, 2], [0, 0, 0])


def test_holm_matches_the_hand_computed_adjustment():
    # sorted 0.01, 0.02, 0.04 (m = 3): 0.03, max(0.03, 0.04), max(0.04, 0.04); None untouched
    assert st.holm([0.04, None, 0.01, 0.02]) == pytest.approx([0.04, None, 0.03, 0.04])
    assert st.holm([0.5, 0.6]) == [1.0, 1.0]


def test_welch_matches_scipys_unequal_variance_t_test_and_interval():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.0, 1.0, 6), rng.normal(1.5, 2.5, 6)
    r = st.welch(a, b)
    ref = stats.ttest_ind(b, a, equal_var=False)
    assert r["mean"] == pytest.approx(b.mean() - a.mean(), rel=1e-12)
    assert r["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert r["ci95"] == pytest.approx(list(ref.confidence_interval(0.95)), rel=1e-9)
    # unequal spreads: Satterthwaite's df lies between the smaller sample's and the pooled one
    assert 5 <= r["df"] <= 10


def test_welch_interval_covers_the_true_difference_at_the_nominal_rate():
    rng = np.random.default_rng(4)
    hits = [lo <= 1.0 <= hi for lo, hi in
            (st.welch(rng.normal(0.0, 0.5, 6), rng.normal(1.0, 2.0, 6))["ci95"]
             for _ in range(2000))]
    assert np.mean(hits) == pytest.approx(0.95, abs=0.015)  # 3.1 binomial s.e. at n = 2000


def test_welch_one_line_errors_and_zero_spread():
    with pytest.raises(ValueError, match="welch needs >= 2 values per sample, got 1 and 3"):
        st.welch([1.0], [1.0, 2.0, 3.0])
    assert st.welch([1.0, 1.0], [2.0, 2.0])["p_value"] is None


def test_log_ppl_gap_is_100_log_ratio():
    d = st.log_ppl_gap([10.0, 4.0], [9.0, 4.0])
    np.testing.assert_allclose(d, [100 * np.log(0.9), 0.0], rtol=1e-12)


def test_power_law_fit_recovers_a_known_law_and_the_multiplier():
    e, a, alpha = 1.2, 40.0, 0.35
    n = np.array([1.3e4, 2.0e4, 5.0e4, 7.0e4, 2.0e5, 2.4e5])
    fit = st.fit_power_law(n, e + a * n ** (-alpha))
    assert fit["E"] == pytest.approx(e, abs=1e-5)
    assert fit["A"] == pytest.approx(a, rel=1e-4) and fit["alpha"] == pytest.approx(alpha,
                                                                                     abs=1e-5)
    # a model at N = 5e4 as good as vanilla at 1e5 is worth 2x its parameters
    mult = st.effective_param_multiplier(fit, 5.0e4, e + a * 1.0e5 ** (-alpha))
    assert mult == pytest.approx(2.0, rel=1e-4)
    assert st.effective_params(fit, e - 0.1) == float("inf")
    with pytest.raises(ValueError, match="need >= 4 distinct parameter counts"):
        st.fit_power_law(n[:3], n[:3])


def test_gap_at_equal_time_interpolates_at_the_shorter_run_end():
    # base reaches 2.0 nats at 100 s; the other run is slower (150 s) and at 100 s sits at 2.1
    g = st.gap_at_equal_time([10, 100], [3.0, 2.0], [15, 150], [3.1, 1.9])
    assert g["time_s"] == 100 and g["D"] == pytest.approx(100 * (1.9 + (3.1 - 1.9) * 50 / 135
                                                                 - 2.0), abs=1e-9)


def test_multiplier_per_seed_reads_each_seed_on_its_own_curve():
    # two seeds; seed 0's curve is 20 -> 10 over 1e4 -> 1e6 parameters, seed 1's 22 -> 12:
    # a target halfway in perplexity needs the geometric mean of the parameter range, 1e5
    m = st.multiplier_per_seed([1e4, 1e6], [[20.0, 22.0], [10.0, 12.0]], 5e4, [15.0, 17.0])
    assert m["per_seed"] == pytest.approx([2.0, 2.0], rel=1e-12)
    assert m["geometric_mean"] == pytest.approx(2.0) and m["ci"] == pytest.approx([2.0, 2.0])
    # unequal seeds: the interval is the t interval of the log multipliers, exponentiated
    m = st.multiplier_per_seed([1e4, 1e6], [[20.0, 20.0, 20.0], [10.0, 10.0, 10.0]], 1e4,
                               [15.0, 12.5, 17.5])
    logm = np.log(np.asarray(m["per_seed"]))
    half = stats.t.ppf(0.975, 2) * logm.std(ddof=1) / np.sqrt(3)
    assert m["ci"] == pytest.approx(np.exp([logm.mean() - half, logm.mean() + half]))
    assert m["ci"][0] < m["geometric_mean"] < m["ci"][1]
    # a seed beyond its base curve: no extrapolation, no multiplier
    assert st.multiplier_per_seed([1e4, 1e6], [[20.0, 20.0], [10.0, 10.0]], 1e4,
                                  [15.0, 9.0]) is None
    with pytest.raises(ValueError, match="shape"):
        st.multiplier_per_seed([1e4, 1e6], [[20.0, 10.0]], 1e4, [15.0, 15.0])
