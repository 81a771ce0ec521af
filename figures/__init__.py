"""Figures. Every ``figures/fig_*.py`` module defines ``KIND`` ("theory" or "experiment") and
``make(out_dir: Path, results_dir: Path) -> list[Path]``. Theory figures use closed forms only;
experiment figures read saved run directories only and never train.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from dca_theory.io import make_dirs


def figure_modules(kind: str | None = None):
    """The figure modules, sorted by name, optionally only those of one KIND."""
    mods = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("fig_"):
            mod = importlib.import_module(f"{__name__}.{info.name}")
            if kind is None or mod.KIND == kind:
                mods.append(mod)
    return mods


def make_all(out_dir: Path, results_dir: Path, *, experiments: bool = False) -> list[Path]:
    """Draw the theory figures (and, with ``experiments=True``, those of saved results)."""
    make_dirs(out_dir)
    paths: list[Path] = []
    for mod in figure_modules("theory"):
        paths += mod.make(out_dir, results_dir)
    if experiments:
        for mod in figure_modules("experiment"):
            paths += mod.make(out_dir, results_dir)
    return paths
