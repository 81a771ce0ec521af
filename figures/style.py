"""Shared look of the figures: sizes, rcParams, colours, and one ``save`` helper that writes
PNG + PDF + the data behind the figure (CSV or JSON) side by side."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are files, never windows
import matplotlib.pyplot as plt  # noqa: E402

from dca_theory.io import read_json, write_json  # noqa: E402

# fontTools logs a harmless note on every TrueType embedding in PDFs
logging.getLogger("fontTools").setLevel(logging.ERROR)

COLUMN = 3.35  # ICML single-column width (inches)
FULL = 6.75  # ICML two-column width
HEIGHT = 2.5

#: one colour per architecture, shared by every figure
ARCH_COLORS = {"res": "#4c4c4c", "grn_v1": "#1f77b4", "grn_v2": "#d62728", "grn_v3": "#2ca02c",
               "base": "#9467bd"}
ARCH_LABELS = {"base": "baseline", "res": "ResNet", "grn_v1": "GRN-v1", "grn_v2": "GRN-v2",
               "grn_v3": "GRN-v3"}
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


def figure(ncols: int = 1, *, width: float | None = None, height: float = HEIGHT, **kwargs):
    """A figure with ``ncols`` panels in the house style."""
    plt.rcParams.update(RC)
    width = width or (COLUMN if ncols == 1 else FULL)
    return plt.subplots(1, ncols, figsize=(width, height), layout="constrained", **kwargs)


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
