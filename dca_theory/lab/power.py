"""Power of the paired t-test, and the seed count that reaches a target power: the planning
arithmetic of the pre-registered LM designs (``paper/05_lm/evidence_design_2.md``).

A seed fixes the data order and the initial trunk weights of every arm, so a comparison of two
arms is a one-sample t-test on the per-seed differences D (``n`` seeds, ``n - 1`` degrees of
freedom). With true mean difference ``delta`` and per-seed standard deviation ``sd`` of D, the
statistic follows a noncentral t with noncentrality ``delta / (sd / sqrt(n))``; the power of the
two-sided test at level ``alpha`` is the probability that it lands beyond either critical value
(``scipy.stats.nct``). Where several tests bear on one claim and are Holm-adjusted, planning at
``alpha / k`` (Holm's strictest step, Bonferroni's level) gives a power that Holm's procedure
meets or exceeds for each test.
"""

from __future__ import annotations

import math

from scipy import stats


def paired_t_power(delta: float, sd: float, n: int, alpha: float = 0.05,
                   two_sided: bool = True) -> float:
    """Probability that a one-sample t-test on ``n`` per-seed differences with true mean
    ``delta`` and standard deviation ``sd`` rejects 0 at level ``alpha`` (two-sided unless
    ``two_sided`` is False, then in the direction of ``delta``)."""
    if not (isinstance(n, int) and n >= 2):
        raise ValueError(f"n must be an integer >= 2 (seeds), got {n!r}")
    if not sd > 0:
        raise ValueError(f"sd must be > 0, got {sd!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    df, nc = n - 1, abs(delta) / (sd / math.sqrt(n))
    if two_sided:
        crit = stats.t.ppf(1 - alpha / 2, df)
        # the far tail as sf at -nc: scipy's nct.cdf(-crit, df, nc) is nan for large nc
        return float(stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc))
    return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, nc))


def seeds_for_power(delta: float, sd: float, power: float = 0.8, alpha: float = 0.05,
                    two_sided: bool = True, max_seeds: int = 1000) -> int | None:
    """The smallest seed count whose paired t-test reaches ``power`` (None above
    ``max_seeds``). Power grows with ``n`` for a fixed ``delta / sd``, so the first ``n`` that
    reaches it is the answer."""
    if not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power!r}")
    for n in range(2, max_seeds + 1):
        if paired_t_power(delta, sd, n, alpha, two_sided) >= power:
            return n
    return None


def detectable_gain(sd: float, n: int, power: float = 0.8, alpha: float = 0.05,
                    two_sided: bool = True) -> float:
    """The smallest true gain ``delta`` that ``n`` seeds detect with ``power`` (bisection on
    the monotone :func:`paired_t_power`)."""
    lo, hi = 0.0, 1.0
    while paired_t_power(hi, sd, n, alpha, two_sided) < power:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if paired_t_power(mid, sd, n, alpha, two_sided) < power else (lo, mid)
    return hi
