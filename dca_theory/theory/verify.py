r"""``dca-theory verify``: the verification report of every Section 4 claim.

Each row names a claim (theorem / lemma / proposition / equation of Heddes et al. 2025), says
what was checked and on how many cases, the worst error or the number of violations, and a
verdict:

* ``confirmed`` — the claim (in the form given in ``shared/reference/dca-paper.md``) holds in
  every case, to the stated tolerance;
* ``corrected`` — the printed/reconstructed form is wrong, and our corrected form (named in the
  row) passes every case;
* ``open`` — not decidable here (e.g. checked only by trained networks, see ``experiments/``);
* ``FAILED`` — a check failed (a bug or a wrong claim we have not corrected). The command's exit
  status is nonzero iff some row has this verdict.

Every random case comes from ``numpy.random.default_rng`` with a fixed seed per row, so the
report is reproducible. ``--quick`` uses fewer cases. Runtime: about 20 s (default) or 8 s
(quick) on one CPU core. The checks themselves live in :mod:`._checks_expressivity`
(Thm 4.1, 4.2, Lemma B.1, eq. A.1) and :mod:`._checks_tradeoff` (Lemma C.1, Thm 4.3,
Prop. 4.4, Figure 5).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

VERDICTS = ("confirmed", "corrected", "open", "FAILED")


@dataclass(frozen=True)
class Row:
    """One line of the report."""

    claim: str
    checked: str
    cases: int
    worst: str
    verdict: str
    note: str = ""

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


def verdict(ok: bool | np.bool_, corrected: bool | np.bool_ = False) -> str:
    """``FAILED`` unless ``ok``; then ``corrected`` or ``confirmed``."""
    if not ok:
        return "FAILED"
    return "corrected" if corrected else "confirmed"


def _checks() -> list[tuple[str, Callable[[bool], list[Row]]]]:
    from dca_theory.theory import _checks_expressivity as E
    from dca_theory.theory import _checks_tradeoff as T

    return [*E.CHECKS, *T.CHECKS]


def run_checks(quick: bool = False) -> list[Row]:
    """Run every check; a check that raises becomes a ``FAILED`` row naming the exception."""
    rows: list[Row] = []
    for claim, check in _checks():
        try:
            rows += check(quick)
        except Exception as err:  # report, do not crash: one broken check must not hide others
            tb = traceback.extract_tb(err.__traceback__)[-1]
            rows.append(Row(claim, "check raised an exception", 0,
                            f"{type(err).__name__}: {err}"[:200], "FAILED",
                            f"at {tb.filename.rsplit('/', 1)[-1]}:{tb.lineno}"))
    return rows


def format_table(rows: list[Row]) -> str:
    """A plain-text table (claim | checked | cases | worst | verdict), notes underneath."""
    head = ("claim", "what was checked", "cases", "worst error / violations", "verdict")
    body = [(r.claim, r.checked, str(r.cases), r.worst, r.verdict) for r in rows]
    widths = [min(max(len(x[i]) for x in [head, *body]), cap)
              for i, cap in enumerate((28, 50, 6, 58, 9))]

    def line(cells):
        return "  ".join(_clip(c, w).ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [line(head), line(["-" * w for w in widths])]
    for r, cells in zip(rows, body):
        out.append(line(cells))
        for text in _wrap_long(r.checked, widths[1], 50):
            out.append(" " * (widths[0] + 2) + text)
        if r.note:
            out.append(" " * (widths[0] + 2) + "note: " + r.note)
    return "\n".join(out)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _wrap_long(text: str, width: int, cap: int) -> list[str]:
    """Continuation lines for a 'checked' cell longer than its column."""
    if len(text) <= cap:
        return []
    import textwrap

    return ["… " + t for t in textwrap.wrap(text[cap - 1:], width)]


def summary(rows: list[Row]) -> dict:
    counts = {v: sum(r.verdict == v for r in rows) for v in VERDICTS}
    return {"rows": len(rows), **counts, "ok": counts["FAILED"] == 0}


def main(as_json: bool = False, quick: bool = False) -> int:
    """Print the report (table or JSON); return 1 if any check FAILED, else 0."""
    start = time.perf_counter()
    rows = run_checks(quick)
    info = summary(rows)
    info["seconds"] = round(time.perf_counter() - start, 2)
    info["quick"] = quick
    if as_json:
        print(json.dumps({"summary": info, "checks": [asdict(r) for r in rows]}, indent=2))
    else:
        print(format_table(rows))
        print(f"\n{info['rows']} checks: {info['confirmed']} confirmed, {info['corrected']} "
              f"corrected, {info['open']} open, {info['FAILED']} FAILED "
              f"({info['seconds']} s{', quick' if quick else ''})")
    return 0 if info["ok"] else 1
