r"""``dca-theory verify``: the verification report of every Section 4 claim.

Each row names a claim (theorem / lemma / proposition / equation of Heddes et al. 2025), says
what was checked and on how many cases, the worst error or the number of violations, and a
verdict (``confirmed``, ``corrected``, ``open`` or ``FAILED``; defined with the row in
:mod:`.verdicts`). The command's exit status is nonzero iff some row is ``FAILED``.

Every random case comes from ``numpy.random.default_rng`` with a fixed seed per row, so the
report is reproducible. ``--quick`` uses fewer cases. Runtime: about 20 s (default) or 8 s
(quick) on one CPU core. The checks themselves live in :mod:`._checks_expressivity`
(Thm 4.1, 4.2, Lemma B.1, eq. A.1), :mod:`._checks_tradeoff` (Lemma C.1, Thm 4.3,
Prop. 4.4, Figure 5), :mod:`._checks_bias_inside` (GRN-v3 with the bias inside the ReLU) and
:mod:`._checks_rivals` (Attention Residuals and mHC in the linear model).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict

from dca_theory.theory.verdicts import VERDICTS, Row


def _checks() -> list[tuple[str, Callable[[bool], list[Row]]]]:
    from dca_theory.theory import _checks_bias_inside as B
    from dca_theory.theory import _checks_expressivity as E
    from dca_theory.theory import _checks_rivals as R
    from dca_theory.theory import _checks_tradeoff as T

    return [*E.CHECKS, *T.CHECKS, *B.CHECKS, *R.CHECKS]


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
