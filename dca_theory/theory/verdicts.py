"""One row of the verification report (``dca-theory verify``) and the verdicts it can carry.

Its own module because both sides use it: the checks (:mod:`._checks_expressivity`,
:mod:`._checks_tradeoff`) build rows, and the report (:mod:`.verify`) runs the checks and
prints the rows. Verdicts:

* ``confirmed``: the claim (in the form given in ``shared/reference/dca-paper.md``) holds in
  every case, to the stated tolerance;
* ``corrected``: the printed/reconstructed form is wrong, and our corrected form (named in the
  row) passes every case;
* ``open``: not decidable here (e.g. checked only by trained networks, see ``experiments/``);
* ``FAILED``: a check failed (a bug or a wrong claim we have not corrected).
"""

from __future__ import annotations

from dataclasses import dataclass

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
