"""Where data and results live. Nothing here is hard-coded to a machine.

The data directory comes from, in order: an explicit argument (a ``--data-dir`` flag), the
``DCA_DATA_DIR`` environment variable, then ``~/.cache/dca_theory/data``.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "DCA_DATA_DIR"


def data_dir(explicit: str | Path | None = None) -> Path:
    """Resolve the data directory; raise FileNotFoundError naming where it looked."""
    if explicit is not None:
        path, source = Path(explicit), "--data-dir"
    elif os.environ.get(DATA_ENV):
        path, source = Path(os.environ[DATA_ENV]), f"${DATA_ENV}"
    else:
        path, source = Path.home() / ".cache" / "dca_theory" / "data", "default cache"
    if not path.is_dir():
        raise FileNotFoundError(
            f"data directory {path} (from {source}) does not exist; pass --data-dir DIR or set "
            f"{DATA_ENV} to a folder holding ptb/ and tinyshakespeare/"
        )
    return path


def default_run_dir(name: str, quick: bool) -> Path:
    """Full runs go to ``experiments/results/NAME`` (committed); quick runs to
    ``runs/NAME-quick`` (git-ignored)."""
    return Path("runs") / f"{name}-quick" if quick else Path("experiments") / "results" / name
