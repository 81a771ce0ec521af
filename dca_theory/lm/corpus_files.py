"""Files behind the evidence experiment's corpora, for :mod:`dca_theory.lm.data`:
``.xz`` files read whole and checked by the sha256 of their decompressed text, and the cache of
derived data (trained BPE tokenizers, encoded splits), kept out of the repository and out of the
read-only data folder. :mod:`dca_theory.lm.data` builds the corpora from them (it says how each
is tokenised and why).
"""

from __future__ import annotations

import hashlib
import lzma
import os
from pathlib import Path

import numpy as np

SPLITS: tuple[str, ...] = ("train", "valid", "test")
CACHE_ENV = "DCA_CACHE_DIR"


def cache_dir() -> Path:
    """Where derived data lives: ``$DCA_CACHE_DIR`` or ``~/.cache/dca_theory/derived``."""
    explicit = os.environ.get(CACHE_ENV)
    return Path(explicit) if explicit else Path.home() / ".cache" / "dca_theory" / "derived"


def read_xz_bytes(path: Path, *, expected_sha256: str) -> bytes:
    """The decompressed bytes of an ``.xz`` file, checked against the sha256 of the
    decompressed text; one-line errors for a missing, corrupt or wrong-checksum file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} not found (looked in {path.parent})")
    try:
        raw = lzma.decompress(path.read_bytes())
    except lzma.LZMAError as err:
        raise ValueError(f"corpus file {path} is not a valid xz file ({err})") from None
    actual = hashlib.sha256(raw).hexdigest()
    if actual != expected_sha256:
        raise ValueError(f"checksum mismatch for {path} (decompressed): expected sha256 "
                         f"{expected_sha256}, got {actual}")
    return raw


def load_cached_ids(folder: Path) -> dict[str, np.ndarray] | None:
    """The encoded splits saved in ``folder``, or None when there are none yet."""
    path = Path(folder) / "ids.npz"
    if not path.is_file():
        return None
    with np.load(path) as f:
        return {s: f[s] for s in SPLITS}


def save_cached_ids(folder: Path, ids: dict[str, np.ndarray]) -> None:
    """Write the encoded splits atomically (a concurrent reader sees all of them or none)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"ids.{os.getpid()}.npz"
    np.savez(tmp, **ids)
    tmp.replace(folder / "ids.npz")
