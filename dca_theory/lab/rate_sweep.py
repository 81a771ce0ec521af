"""The learning-rate sweep rule of the LM evidence designs, on losses alone: which rate is best,
whether it sits at an edge of the rates tried, and which rate to try next.

A sweep starts from a fixed set of rates and, while the best rate is the largest (smallest) one
tried, doubles (halves) it, at most ``max_extend`` times in all; a best rate that is still at an
edge then is flagged ``at_grid_edge``. A non-finite loss (a diverged run) counts as worse than
any finite one; among equal losses the smaller rate ranks first (so a sweep where everything
diverged goes on by halving).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable


def _clean(losses: dict[float, float]) -> dict[float, float]:
    if not losses:
        raise ValueError("no rate has a loss yet")
    return {float(lr): (float(v) if math.isfinite(v) else math.inf) for lr, v in losses.items()}


def ranked(losses: dict[float, float]) -> list[float]:
    """The rates tried, best (lowest loss) first."""
    clean = _clean(losses)
    return sorted(clean, key=lambda lr: (clean[lr], lr))


def best_rate(losses: dict[float, float]) -> dict:
    """``{"lr", "second", "at_grid_edge", "ranked"}``: the best rate, the runner-up (None with
    one rate), whether the best is the largest or smallest tried, and every rate best first."""
    order = ranked(losses)
    best = order[0]
    return {"lr": best, "second": order[1] if len(order) > 1 else None,
            "at_grid_edge": best in (min(order), max(order)), "ranked": order}


def _same(a: float, b: float) -> bool:
    return f"{a:g}" == f"{b:g}"  # rates are compared as the cache labels print them


def next_rate(start: Iterable[float], losses: dict[float, float],
              max_extend: int) -> float | None:
    """The rate to try next: twice the largest tried if it is the best, half the smallest if
    that is; ``None`` once the best is interior or ``max_extend`` rates beyond ``start`` have
    been tried."""
    start = list(start)
    extra = [lr for lr in losses if not any(_same(lr, s) for s in start)]
    if len(extra) >= max_extend:
        return None
    best = best_rate(losses)["lr"]
    if best == max(losses):
        return max(losses) * 2
    if best == min(losses):
        return min(losses) / 2
    return None


def sweep(start: Iterable[float], loss_of: Callable[[float], float | None],
          max_extend: int) -> tuple[dict[float, float], bool]:
    """``(loss per rate tried, complete)``: ``loss_of`` at every rate of ``start``, then at each
    :func:`next_rate` until there is none. ``loss_of`` returning ``None`` (a run not available,
    e.g. not cached yet) leaves the sweep incomplete: it is not extended past it."""
    losses: dict[float, float] = {}
    complete = True
    todo = list(start)
    while todo:
        lr = todo.pop(0)
        loss = loss_of(lr)
        if loss is None:
            complete = False
            continue
        losses[lr] = loss
        if not todo and complete:
            nxt = next_rate(start, losses, max_extend)
            todo = [] if nxt is None else [nxt]
    return losses, complete
