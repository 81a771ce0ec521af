"""Run directories: the contract between experiments and figures.

A run directory holds ``config.json`` (written first), ``metrics.jsonl`` (one JSON object per
logged step, appended as the run goes) and ``summary.json`` (written last, atomically). A
directory without ``summary.json`` is an unfinished run. Every JSON file is written through a
temporary file and ``os.replace`` so that an interrupted run never leaves a half-written file.
A run that fails inside :func:`failed_runs_discarded` (as every ``dca-theory run`` does) removes
its ``config.json`` and ``metrics.jsonl`` again, and its folder if it made it and nothing else is
left, so that a crash leaves no directory that looks like a run; what an experiment caches to
resume (its own files) stays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np


def to_jsonable(obj: Any) -> Any:
    """Convert dataclasses, numpy/jax scalars and arrays to plain JSON types."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy or jax array / scalar
        return np.asarray(obj).tolist()
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)  # JSON has no NaN/Inf
    return obj


def make_dirs(path: str | Path) -> Path:
    """``mkdir -p path``. A file system that refuses new folders (``/proc``, ``/sys``) answers
    "No such file or directory" although every parent exists: that is reported as the OS error
    it is (exit 1), not as a missing input file (exit 2)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileNotFoundError as err:
        raise OSError(f"cannot create the folder {path}: {err.strerror} (the file system "
                      f"refuses new folders there)") from None
    return path


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A file handle whose content appears at ``path`` only when the block ends without an
    error: written to a temporary file in the same folder, then ``os.replace`` d over ``path``
    (a kill mid-write leaves the previous file intact). ``mode`` is ``"w"`` or ``"wb"``."""
    path = Path(path)
    make_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_file`)."""
    with atomic_file(path) as fh:
        fh.write(text)
    return Path(path)


def write_json(path: str | Path, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON."""
    return atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; a bad file is a one-line ValueError naming the file and the line."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} line {err.lineno}: not valid JSON ({err.msg})") from None


def read_jsonl(path: str | Path) -> list[dict]:
    """One JSON value per non-blank line; a bad line is a ValueError naming the file and line."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {number}: not valid JSON ({err.msg})") from None
    return records


def environment() -> dict[str, str]:
    """Versions and machine facts recorded in every summary."""
    info = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import jax

        info["jax"] = jax.__version__
        info["backend"] = jax.default_backend()
    except Exception:  # theory-only runs need not import jax
        pass
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        if sha.returncode == 0:
            info["git"] = sha.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


# the runs started inside each open failed_runs_discarded() block, innermost last
_watched: list[list[RunDir]] = []


@contextlib.contextmanager
def failed_runs_discarded() -> Iterator[None]:
    """Within this block, a :class:`RunDir` opened and not finished when an exception (or an
    interrupt) leaves the block is discarded (:meth:`RunDir.discard`); the exception goes on."""
    started: list[RunDir] = []
    _watched.append(started)
    try:
        yield
    except BaseException:
        for run in started:
            run.discard()
        raise
    finally:
        _watched.remove(started)


class RunDir:
    """A run directory: ``config.json`` at start, ``metrics.jsonl`` as it goes,
    ``summary.json`` at the end.

    Starting a run in a folder that already holds a finished run raises unless
    ``overwrite=True``, so committed results are never clobbered by accident.
    """

    def __init__(self, path: str | Path, config: Any, *, overwrite: bool = False):
        self.path = Path(path)
        self.finished = False
        self._made_folder = not self.path.exists()
        if (self.path / "summary.json").exists() and not overwrite:
            raise FileExistsError(
                f"run directory {self.path} already holds a finished run (summary.json); "
                "pass overwrite=True / --overwrite or choose another --out"
            )
        make_dirs(self.path)
        (self.path / "summary.json").unlink(missing_ok=True)
        (self.path / "metrics.jsonl").unlink(missing_ok=True)
        for started in _watched:
            started.append(self)
        write_json(self.path / "config.json", config)

    def discard(self) -> None:
        """Undo the start of a run that failed: remove ``config.json`` and ``metrics.jsonl``
        (a restart rewrites both), then the folder if this run made it and it is empty. A
        finished run is left alone."""
        if self.finished:
            return
        for name in ("config.json", "metrics.jsonl"):
            (self.path / name).unlink(missing_ok=True)
        if self._made_folder:
            with contextlib.suppress(OSError):  # not empty: an experiment's resume cache
                self.path.rmdir()

    def log(self, **metrics: Any) -> None:
        """Append one JSON line; each line is flushed whole."""
        line = json.dumps(to_jsonable(metrics), sort_keys=True)
        with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def save_arrays(self, name: str, **arrays: Any) -> Path:
        """Atomically save ``arrays.npz``-style data next to the summary."""
        target = self.path / name
        with atomic_file(target, "wb") as fh:
            np.savez_compressed(fh, **{k: np.asarray(v) for k, v in arrays.items()})
        return target

    def finish(self, summary: dict) -> Path:
        summary = dict(summary)
        summary.setdefault("environment", environment())
        written = write_json(self.path / "summary.json", summary)
        self.finished = True
        return written
