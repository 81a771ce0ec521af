"""Shared look of the figures: sizes, rcParams, colours, and one ``save`` helper that writes
PNG + PDF + the data behind the figure (CSV or JSON) side by side.

Schemes are drawn only through :func:`scheme_color`, :func:`scheme_label` and
:func:`scheme_linestyle`, which read :mod:`dca_theory.schemes` (one colour and label per scheme
across every figure) plus :data:`VARIANTS` for the run variants its rules cannot express."""

from __future__ import annotations

import csv
import logging
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are files, never windows
import matplotlib.colors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from dca_theory import schemes  # noqa: E402
from dca_theory.io import read_json, write_json  # noqa: E402

# fontTools logs a harmless note on every TrueType embedding in PDFs
logging.getLogger("fontTools").setLevel(logging.ERROR)

COLUMN = 3.35  # ICML single-column width (inches)
FULL = 6.75  # ICML two-column width
HEIGHT = 2.5


def _shade(scheme: str, white: float) -> str:
    """``scheme``'s registry colour mixed with white (``white`` = 0: the colour itself)."""
    rgb = matplotlib.colors.to_rgb(schemes.color(scheme))
    return matplotlib.colors.to_hex([c + (1.0 - c) * white for c in rgb])


#: Run variants whose look the registry's naming rules (``k-`` prefix, ``_open`` suffix) cannot
#: express: name -> (colour, label or None for the registry's). k-DCA is drawn in shades of
#: DCA, lighter for a shorter stack; paper Table 9's GRN-v3 windows in shades of GRN-v3, lighter
#: for fewer inputs (``w``: the run's window, which the figure states).
VARIANTS: dict[str, tuple[str, str | None]] = {
    "1-dca": (_shade("dca", 0.6), None),
    "2-dca": (_shade("dca", 0.4), None),
    "4-dca": (_shade("dca", 0.2), None),
    "grn_v3_last": (_shade("grn_v3", 0.6), "GRN-v3 last w"),
    "grn_v3_input_last": (_shade("grn_v3", 0.3), "GRN-v3 input + last w-1"),
    "grn_v3_full": (schemes.color("grn_v3"), "GRN-v3 full stack"),
}


def scheme_color(name: str) -> str:
    """The colour of a scheme or run variant: :data:`VARIANTS`, else the registry's."""
    return VARIANTS[name][0] if name in VARIANTS else schemes.color(name)


def scheme_label(name: str) -> str:
    """The legend / tick label of a scheme or run variant: :data:`VARIANTS`, else the
    registry's (``2-dca`` -> ``2-DCA``, ``grn_v3_open`` -> ``GRN-v3 (open gate)``)."""
    if name in VARIANTS and VARIANTS[name][1] is not None:
        return VARIANTS[name][1]
    return schemes.label(name)


def difference_label(name: str, reference: str = "vanilla") -> str:
    """``DCA - vanilla``: the label of a paired difference of two schemes' values."""
    return f"{scheme_label(name)} - {scheme_label(reference)}"


#: one colour per GRN-v3 gate (dca_theory.gates): the literal gate grey, since it computes GRN-v2
GATE_COLORS = {"paper": "#7f7f7f", "open": "#1f77b4", "bias_inside": "#2ca02c",
               "small_init": "#d62728"}


def gate_color(gate: str) -> str:
    """The colour of a GRN-v3 gate (any spelling, e.g. ``relu`` = ``paper``)."""
    from dca_theory import gates

    return GATE_COLORS[gates.canonical(gate)]


def scheme_linestyle(name: str) -> str:
    """Dashed for an open-gate variant (drawn in its scheme's colour), solid otherwise."""
    return "--" if name.endswith("_open") else "-"


def wrap_label(label: str, width: int = 10) -> str:
    """A label over lines of about ``width`` characters for narrow ticks, broken at spaces and
    after hyphens (``GRN-v1`` -> ``GRN-`` / ``v1``), a parenthesised tail starting a new line
    (``GRN-v3 (open gate)`` -> ``GRN-v3`` / ``(open gate)``). Words are never split."""
    head, paren, tail = label.partition(" (")
    lines = []
    for part in [head] + ([f"({tail}"] if paren else []):
        line = ""
        for word in part.split(" "):
            for i, piece in enumerate(re.split(r"(?<=-)(?=.)", word)):
                joined = piece if not line else line + ("" if i else " ") + piece
                if line and len(joined) > width:
                    lines.append(line)
                    joined = piece
                line = joined
        lines.append(line)
    return "\n".join(lines)


#: sequential colours for a swept size (e.g. d = 100, 200, 300)
SWEEP_COLORS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e"]

RC = {
    "figure.dpi": 150,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 6.5,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "pdf.fonttype": 42,  # embed TrueType: editable text in the PDF
    "svg.fonttype": "none",
}


def figure(ncols: int = 1, *, nrows: int = 1, width: float | None = None, height: float = HEIGHT,
           **kwargs):
    """A figure with ``nrows`` x ``ncols`` panels in the house style."""
    plt.rcParams.update(RC)
    width = width or (COLUMN if ncols == 1 else FULL)
    return plt.subplots(nrows, ncols, figsize=(width, height), layout="constrained", **kwargs)


def save(fig, out_dir: Path, name: str, *, rows: list[dict] | None = None,
         data: dict | None = None) -> list[Path]:
    """Write ``name.png``, ``name.pdf`` and the data (``name.csv`` from ``rows`` and/or
    ``name.json`` from ``data``) into ``out_dir``; close the figure; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "pdf"):
        path = out_dir / f"{name}.{ext}"
        # fixed metadata keeps regenerated PDFs byte-stable in git
        fig.savefig(path, metadata={"CreationDate": None} if ext == "pdf" else None)
        paths.append(path)
    plt.close(fig)
    if rows is not None:
        path = out_dir / f"{name}.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        paths.append(path)
    if data is not None:
        paths.append(write_json(out_dir / f"{name}.json", data))
    return paths


def saved_summary(results_dir: Path, experiment: str) -> dict | None:
    """The ``summary.json`` of a saved experiment run, or None if it has not been run."""
    path = Path(results_dir) / experiment / "summary.json"
    return read_json(path) if path.is_file() else None
