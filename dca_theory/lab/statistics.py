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
