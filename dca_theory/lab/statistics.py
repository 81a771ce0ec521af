"""Summary statistics over seeds, shared by every multi-seed experiment: mean ± sample standard
deviation, and seed-paired differences with a paired t-test.

Runs of different architectures with the same seed see the same data order (and, for the LM,
the same initial block weights), so two architectures are compared seed by seed.
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def mean_std(values) -> dict:
    """Mean, sample standard deviation (ddof=1; 0 for a single value) and n."""
    v = np.asarray(values, float)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
            "n": int(v.size)}


def paired(a, b) -> dict:
    """Seed-paired difference ``b - a``: mean ± std, a two-sided paired t-test p-value, a 95%
    confidence interval, and on how many seeds ``b`` is lower (better for perplexity)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = b - a
    out = {**mean_std(d), "per_seed": d.tolist(), "b_lower_seeds": int((d < 0).sum())}
    if d.size > 1 and d.std(ddof=1) > 0:
        se = d.std(ddof=1) / np.sqrt(d.size)
        half = float(stats.t.ppf(0.975, d.size - 1) * se)
        out |= {"p_value": float(stats.ttest_rel(b, a).pvalue),
                "ci95": [float(d.mean() - half), float(d.mean() + half)]}
    else:
        out |= {"p_value": None, "ci95": None}
    return out


def welch(a, b) -> dict:
    """Unpaired difference of means ``mean(b) - mean(a)`` with Welch's t-test (unequal
    variances, Welch-Satterthwaite degrees of freedom): its two-sided p-value and 95 %
    confidence interval. For samples that share no pairing, e.g. seed-paired gaps measured on
    two different corpora. Needs >= 2 values in each with a nonzero spread in one."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.size < 2 or b.size < 2:
        raise ValueError(f"welch needs >= 2 values per sample, got {a.size} and {b.size}")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    diff, se = float(b.mean() - a.mean()), float(np.sqrt(va + vb))
    if se == 0:
        return {"mean": diff, "se": 0.0, "df": None, "p_value": None, "ci95": None}
    df = float((va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1)))
    half = float(stats.t.ppf(0.975, df) * se)
    return {"mean": diff, "se": se, "df": df,
            "p_value": float(2 * stats.t.sf(abs(diff) / se, df)),
            "ci95": [diff - half, diff + half]}


# ----------------------------------------------------------------------------- evidence


def log_ppl_gap(ppl_base, ppl_other) -> np.ndarray:
    """``D = 100 (ln ppl_other - ln ppl_base)`` per seed: the gap in log-perplexity points
    (about the relative perplexity difference in %, negative when ``other`` is better)."""
    return 100.0 * (np.log(np.asarray(ppl_other, float)) - np.log(np.asarray(ppl_base, float)))


def seed_clustered_slope(x, y, seeds, level: float = 0.95) -> dict:
    """Slope of ``y`` on ``x`` with a confidence interval clustered by seed.

    Inference is on the per-seed slopes: each seed's own least-squares slope over its points,
    then their mean with a t interval on ``G - 1`` degrees of freedom (``G`` seeds). With every
    seed measured at the same ``x`` values this mean *is* the pooled least-squares slope, and
    the interval is exact for normal seed effects of any form (a seed's own intercept, its own
    slope, correlated errors across its widths): the seed, not the point, is the independent
    unit. A cluster bootstrap would need far more than 4-8 clusters (4 seeds give 35 distinct
    resamples); a sandwich (CR1) standard error with ``G - 1`` degrees of freedom is the same
    idea with an asymptotic variance. Needs >= 2 seeds with >= 2 distinct ``x`` each.
    """
    x, y, seeds = np.asarray(x, float), np.asarray(y, float), np.asarray(seeds)
    if not x.shape == y.shape == seeds.shape:
        raise ValueError(f"x, y and seeds must have one shape, got {x.shape}, {y.shape}, "
                         f"{seeds.shape}")
    per_seed = {}
    for s in np.unique(seeds):
        xs, ys = x[seeds == s], y[seeds == s]
        if len(np.unique(xs)) >= 2:
            xc = xs - xs.mean()
            per_seed[s.item()] = float(xc @ (ys - ys.mean()) / (xc @ xc))
    if len(per_seed) < 2:
        raise ValueError(f"need >= 2 seeds with >= 2 distinct x each, got {len(per_seed)}")
    b = np.asarray(list(per_seed.values()))
    g = b.size
    se = float(b.std(ddof=1) / np.sqrt(g))
    half = float(stats.t.ppf(0.5 + level / 2, g - 1) * se)
    p = float(2 * stats.t.sf(abs(b.mean()) / se, g - 1)) if se > 0 else None
    return {"slope": float(b.mean()), "se": se, "ci": [float(b.mean() - half),
                                                       float(b.mean() + half)],
            "level": level, "df": g - 1, "p_value": p, "n_seeds": g,
            "per_seed_slope": {str(k): v for k, v in per_seed.items()}}


def holm(p_values) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (family-wise error), in the input order; ``None``
    stays ``None`` and does not count as a test."""
    idx = [i for i, p in enumerate(p_values) if p is not None]
    order = sorted(idx, key=lambda i: p_values[i])
    m, out, running = len(order), [None] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def fit_power_law(n_params, log_ppl) -> dict:
    """Least-squares fit of ``ln ppl = E + A N^-alpha`` over points ``(N, ln ppl)``
    (``N`` non-embedding parameters; needs >= 4 distinct ``N`` for a residual degree of
    freedom). Fitted on ``N / N_min`` for conditioning; ``A`` is reported for raw ``N``."""
    from scipy.optimize import curve_fit

    n, y = np.asarray(n_params, float), np.asarray(log_ppl, float)
    if len(np.unique(n)) < 4:
        raise ValueError(f"need >= 4 distinct parameter counts to fit E, A, alpha, got "
                         f"{len(np.unique(n))}")
    scale = n.min()

    def model(u, e, a, alpha):
        return e + a * u ** (-alpha)

    span = max(y.max() - y.min(), 1e-6)
    (e, a, alpha), _ = curve_fit(model, n / scale, y, p0=(y.min() - span, 2 * span, 0.5),
                                 bounds=([-np.inf, 0.0, 1e-3], [np.inf, np.inf, 5.0]),
                                 maxfev=20000)
    resid = y - model(n / scale, e, a, alpha)
    return {"E": float(e), "A": float(a * scale ** alpha), "alpha": float(alpha),
            "rms_residual": float(np.sqrt(np.mean(resid**2))), "n_points": int(n.size)}


def effective_params(fit: dict, log_ppl: float) -> float:
    """The ``N`` at which the fitted vanilla law reaches ``log_ppl`` (inf at or below E)."""
    excess = log_ppl - fit["E"]
    return float((fit["A"] / excess) ** (1.0 / fit["alpha"])) if excess > 0 else float("inf")


def effective_param_multiplier(fit: dict, n_params: float, log_ppl: float) -> float:
    """How many times ``n_params`` a vanilla model would need (by the fitted law) to reach
    ``log_ppl``: > 1 when the architecture is worth more than its parameters."""
    return effective_params(fit, log_ppl) / float(n_params)


def value_at(x_points, values, x: float) -> float:
    """``values`` linearly interpolated at ``x`` (``x`` within the points' range)."""
    xp, v = np.asarray(x_points, float), np.asarray(values, float)
    if not xp[0] <= x <= xp[-1]:
        raise ValueError(f"x={x} outside the curve's range [{xp[0]}, {xp[-1]}]")
    return float(np.interp(x, xp, v))


def gap_at_equal_time(time_base, loss_base, time_other, loss_other) -> dict:
    """``D`` between two validation-loss curves (nats, against each run's own cumulative
    wall seconds) at the last time both reached: the gap at equal compute time."""
    t = min(float(np.asarray(time_base)[-1]), float(np.asarray(time_other)[-1]))
    a, b = value_at(time_base, loss_base, t), value_at(time_other, loss_other, t)
    return {"time_s": t, "D": 100.0 * (b - a)}


def params_to_reach(params, ppls, target: float) -> float | None:
    """Parameters at which the piecewise-linear curve ppl(log params) through ``(params[i],
    ppls[i])`` (sorted by params) first reaches ``target``; ``None`` if it never does within
    the measured range (no extrapolation)."""
    p, y = np.asarray(params, float), np.asarray(ppls, float)
    if p.shape != y.shape or p.size < 1:
        raise ValueError(f"params and ppls must be equal-length, non-empty; got {p.shape}, "
                         f"{y.shape}")
    order = np.argsort(p)
    x, y = np.log(p[order]), y[order]
    if y[0] <= target:
        return float(p[order][0])
    for i in range(1, len(y)):
        if y[i] <= target:  # first segment that crosses the target
            frac = (y[i - 1] - target) / (y[i - 1] - y[i])
            return float(np.exp(x[i - 1] + frac * (x[i] - x[i - 1])))
    return None


def multiplier_per_seed(base_params, base_ppl_per_seed, params: float, ppl_per_seed,
                        level: float = 0.95) -> dict | None:
    """How many times ``params`` the base architecture needs to reach the other's perplexity,
    seed by seed: per seed, :func:`params_to_reach` on that seed's base curve
    (``base_ppl_per_seed[i][s]`` at ``base_params[i]``) at that seed's ``ppl_per_seed[s]``,
    over ``params``. A seed fixes the data order of every run, so each seed gives one
    multiplier; their geometric mean carries a t interval on the log multipliers (seeds - 1
    degrees of freedom). ``None`` if any seed's target lies beyond its base curve (no
    extrapolation)."""
    curves = np.asarray(base_ppl_per_seed, float)
    target = np.asarray(ppl_per_seed, float)
    if curves.ndim != 2 or curves.shape != (len(base_params), target.size) or target.size < 2:
        raise ValueError(f"need base_ppl_per_seed of shape (points, seeds) = "
                         f"({len(base_params)}, {target.size}) with >= 2 seeds; got "
                         f"{curves.shape}")
    need = [params_to_reach(base_params, curves[:, s], float(target[s]))
            for s in range(target.size)]
    if any(n is None for n in need):
        return None
    logm = np.log(np.asarray(need, float) / float(params))
    half = float(stats.t.ppf(0.5 + level / 2, logm.size - 1) * logm.std(ddof=1)
                 / np.sqrt(logm.size))
    mean = float(logm.mean())
    return {"geometric_mean": float(np.exp(mean)),
            "ci": [float(np.exp(mean - half)), float(np.exp(mean + half))],
            "per_seed": np.exp(logm).tolist(), "n": int(logm.size)}
