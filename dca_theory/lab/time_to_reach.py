"""Time to reach a quality: when does one training curve first reach another's final value?

Paper Table 1 reports, per architecture, the training time to reach the Transformer's final
perplexity, normalised by the Transformer's. Measured here on the periodic validation curves of
cached multi-seed runs (:mod:`dca_theory.lab.lm_runs`): per seed, the first step at which the
other run's curve falls to vanilla's *last periodic* validation perplexity (linear
interpolation between evaluations, no extrapolation), times its step time, over vanilla's steps
times vanilla's step time. The final whole-split evaluation uses other batches than the
periodic ones, so it is left out of the curve.

Used by ``experiments/lm_k.py`` (Table 1, across k) and ``experiments/lm_depth.py`` (across
depths).
"""

from __future__ import annotations

import numpy as np

from dca_theory.lab.statistics import mean_std


def periodic_curve(curves: dict[str, np.ndarray], final_step: int) -> tuple[np.ndarray,
                                                                            np.ndarray]:
    """``(steps_E, valid_ppl_ExS)`` of the periodic evaluations only (the final whole-split
    evaluation at ``final_step`` uses other batches and is dropped)."""
    steps = np.asarray(curves["eval_steps"])
    keep = steps < final_step
    return steps[keep], np.exp(np.asarray(curves["eval_valid_loss"])[keep])


def first_crossing(steps, values, target: float) -> float | None:
    """First step at which the piecewise-linear curve through ``(steps, values)`` reaches
    ``target`` from above; ``None`` if it never does. Steps must increase."""
    s, v = np.asarray(steps, float), np.asarray(values, float)
    if s.shape != v.shape or s.size < 1:
        raise ValueError(f"steps and values must be equal-length, non-empty; got {s.shape}, "
                         f"{v.shape}")
    if np.any(np.diff(s) <= 0):
        raise ValueError(f"steps must be strictly increasing, got {s.tolist()}")
    if v[0] <= target:
        return float(s[0])
    for i in range(1, len(v)):
        if v[i] <= target:
            return float(s[i - 1] + (v[i - 1] - target) / (v[i - 1] - v[i]) * (s[i] - s[i - 1]))
    return None


def time_to_reach(vanilla: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray],
                  step_s_vanilla: float, step_s_other: float) -> dict:
    """Per seed: steps for ``other`` to reach vanilla's last periodic valid ppl, the step ratio
    and the time ratio (steps x step time, normalised by vanilla's)."""
    v_steps, v_ppl = vanilla
    o_steps, o_ppl = other
    n_seeds = v_ppl.shape[1]
    steps, step_ratio, time_ratio = [], [], []
    for s in range(n_seeds):
        hit = first_crossing(o_steps, o_ppl[:, s], float(v_ppl[-1, s]))
        steps.append(hit)
        step_ratio.append(None if hit is None else hit / float(v_steps[-1]))
        time_ratio.append(None if hit is None
                          else hit * step_s_other / (float(v_steps[-1]) * step_s_vanilla))
    reached = [t for t in time_ratio if t is not None]
    return {"steps_per_seed": steps, "step_ratio_per_seed": step_ratio,
            "time_ratio_per_seed": time_ratio, "seeds_reached": len(reached),
            "time_ratio": mean_std(reached) if reached else None,
            "step_ratio": mean_std([r for r in step_ratio if r is not None]) if reached else None,
            "target_valid_ppl_per_seed": v_ppl[-1].tolist(), "target_step": float(v_steps[-1])}
