"""Spike detection on synthetic loss curves with planted spikes, and the rate statistics
(:mod:`dca_theory.lab.stability`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dca_theory.lab.stability import (
    MAD_TO_SIGMA,
    SpikeRule,
    detect_spikes,
    fisher_runs_with_spikes,
    grad_norm_ratio,
    poisson_rate,
    rate_ratio_test,
    spike_excess,
)

RULE = SpikeRule(window=25, c=6.0, abs_floor=0.1, skip=40)


def curve(n=400, noise=0.03, seed=0):
    """A training-loss-like curve: exponential decay 4.5 -> 1.5 nats plus Gaussian batch noise
    (0.03 nats, the size of the batch noise of our 1,024-token batches)."""
    t = np.arange(n)
    rng = np.random.default_rng(seed)
    return 1.5 + 3.0 * np.exp(-t / 30) + noise * rng.standard_normal(n)


def flat(n=400, noise=0.03, seed=1):
    """A flat 2-nat curve with Gaussian batch noise (no trend inflating the MAD)."""
    return 2.0 + noise * np.random.default_rng(seed).standard_normal(n)


@pytest.mark.parametrize("seed", range(5))
def test_noise_only_has_no_spikes(seed):
    # a 6-sigma exceedance of Gaussian noise has probability ~1e-9 per step: none in 360 steps
    assert detect_spikes(curve(seed=seed), RULE) == []


@pytest.mark.parametrize("seed", range(5))
def test_planted_spikes_found_exactly(seed):
    loss = curve(seed=seed)
    starts = [120, 250, 251, 252, 330]  # one 3-step event at 250..252
    for t in starts:
        loss[t] += 0.5
    events = detect_spikes(loss, RULE)
    assert [(e.start, e.end) for e in events] == [(120, 120), (250, 252), (330, 330)]
    for e in events:
        # the planted jump is 0.5 nats; the window median is off by at most a few noise sigmas
        assert e.peak_excess == pytest.approx(0.5, abs=0.15)
        assert e.peak_ratio > 1


def test_warmup_and_first_window_are_not_tested():
    loss = flat()
    loss[10] += 2.0  # inside the first window and the warm-up
    loss[35] += 2.0  # after the first window, still in the 40-step warm-up
    assert detect_spikes(loss, RULE) == []
    assert [e.start for e in detect_spikes(loss, SpikeRule(skip=0))] == [35]
    excess, threshold = spike_excess(loss, RULE)
    assert np.isnan(excess[:40]).all() and np.isfinite(excess[40:]).all()
    assert RULE.tested_steps(400) == 360 == np.isfinite(threshold).sum()


def test_absolute_floor_protects_smooth_windows():
    # an almost noiseless curve: a 0.05-nat bump is many MADs but below the 0.1-nat floor
    loss = curve(noise=1e-4)
    loss[200] += 0.05
    assert detect_spikes(loss, RULE) == []
    loss[200] += 0.1
    assert [e.start for e in detect_spikes(loss, RULE)] == [200]


def test_threshold_scales_with_c_in_robust_sigmas():
    # 2 +- s alternating over an even window (26): median 2, MAD exactly s, sigma_hat = 1.4826 s
    s, w = 0.2, 26
    loss = np.array([2.0 + s * (-1) ** t for t in range(80)])
    _, threshold = spike_excess(loss, SpikeRule(window=w, c=4.0, abs_floor=0.0))
    np.testing.assert_allclose(threshold[w:], 4.0 * MAD_TO_SIGMA * s, rtol=1e-12)
    bump = loss.copy()
    bump[60] = 2.0 + 5.0 * MAD_TO_SIGMA * s  # 5 robust sigmas above the window median 2
    assert len(detect_spikes(bump, SpikeRule(window=w, c=4.0, abs_floor=0.0))) == 1
    assert detect_spikes(bump, SpikeRule(window=w, c=6.0, abs_floor=0.0)) == []


def test_diverged_step_counts_as_spike():
    loss = curve()
    loss[300] = np.inf
    assert [e.start for e in detect_spikes(loss, RULE)] == [300]


def test_bad_rule_and_curve_rejected():
    with pytest.raises(ValueError, match="window"):
        SpikeRule(window=2)
    with pytest.raises(ValueError, match="c must"):
        SpikeRule(c=0)
    with pytest.raises(ValueError, match="1-D"):
        detect_spikes(np.zeros((2, 50)))


def test_grad_norm_ratio():
    g = np.ones(100)
    g[:10] = 50.0  # warm-up transients are skipped
    g[60] = 7.0
    assert grad_norm_ratio(g, skip=10) == pytest.approx(7.0)
    with pytest.raises(ValueError, match="skip"):
        grad_norm_ratio(g, skip=100)


def test_poisson_rate_garwood_interval():
    # textbook values: 0 events -> upper 95% limit 3.689 events ("rule of 3.7"); 10 events ->
    # (4.795, 18.39)
    zero = poisson_rate(0, 1000)
    assert zero["rate"] == 0 and zero["ci95"][0] == 0
    assert zero["ci95"][1] == pytest.approx(3.689, abs=1e-3)
    ten = poisson_rate(10, 2000)
    assert ten["rate"] == pytest.approx(5.0)
    np.testing.assert_allclose(ten["ci95"], [4.795 / 2, 18.39 / 2], rtol=1e-3)


def test_rate_ratio_test():
    same = rate_ratio_test(10, 1000, 10, 1000)
    assert same["ratio"] == pytest.approx(1.0) and same["p_value"] == pytest.approx(1.0)
    assert same["ci95"][0] < 1 < same["ci95"][1]
    # 20 events in group a, 0 in b at equal exposure: p = 2 * 0.5^20
    none_b = rate_ratio_test(20, 1000, 0, 1000)
    assert none_b["ratio"] == 0 and none_b["ci95"][0] == 0
    assert none_b["p_value"] == pytest.approx(2 * 0.5**20, rel=1e-9)
    # unequal exposure: ratio is per step, and the interval covers it
    r = rate_ratio_test(6, 3000, 4, 1000)
    assert r["ratio"] == pytest.approx((4 / 1000) / (6 / 3000))
    assert r["ci95"][0] < r["ratio"] < r["ci95"][1]
    empty = rate_ratio_test(0, 1000, 0, 500)
    assert empty["p_value"] == 1.0 and empty["ci95"][1] == math.inf
    with pytest.raises(ValueError, match="exposures"):
        rate_ratio_test(1, 0, 1, 10)


def test_fisher_runs_with_spikes():
    out = fisher_runs_with_spikes(6, 6, 0, 6)
    # hypergeometric: P(table this extreme) = 2 / C(12, 6)
    assert out["p_value"] == pytest.approx(2 / math.comb(12, 6), rel=1e-9)
    with pytest.raises(ValueError, match="group b"):
        fisher_runs_with_spikes(1, 3, 4, 3)
