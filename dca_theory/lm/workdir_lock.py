"""One trainer per run directory: ``with hold(workdir): ...`` takes an exclusive ``flock`` on
``WORKDIR/.train-lock`` or fails at once naming the holder.

Two trainers writing one run would interleave ``metrics.jsonl`` and collide on checkpoint
steps. The lock is the kernel's ``flock``, so it dies with its process: the file that a killed
trainer leaves behind (holding a pid no longer alive) never blocks the resume. The file holds
``pid host start-time`` only for the message of a trainer that is turned away; it is removed
when the holder finishes or fails, together with the folders that taking the lock created if
nothing else was written there (a start refused for bad input leaves nothing behind).

Being turned away is an :class:`OSError` (exit status 1, like any file in use): the command was
right, it only has to wait for the other trainer or use another ``--workdir``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from dca_theory.io import make_dirs

LOCK_NAME = ".train-lock"


class WorkdirBusyError(OSError):
    """Another live process trains in this run directory."""


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _acquire(path: Path) -> int:
    """The descriptor of ``path`` with an exclusive lock on it, or :class:`WorkdirBusyError`."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").split()
            os.close(fd)
            pid, host, since = (holder + ["?", "?", "?"])[:3]
            raise WorkdirBusyError(
                f"workdir {path.parent} is in use by another trainer (pid {pid} on {host}, "
                f"since {since}); wait for it to finish or stop it, or choose another "
                "--workdir") from None
        try:  # the holder may have removed the file between our open and our lock: retry
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@contextlib.contextmanager
def hold(workdir: str | Path) -> Iterator[Path]:
    """Hold the run directory ``workdir`` (created if missing) for the duration of the block."""
    workdir = Path(workdir)
    created = _missing_folders(workdir.absolute())
    make_dirs(workdir)
    path = workdir / LOCK_NAME
    try:
        fd = _acquire(path)
    except BaseException:
        _remove_empty(created)
        raise
    try:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {stamp}\n".encode(), 0)
        yield workdir
    finally:
        path.unlink(missing_ok=True)  # while still locked, so no one locks a removed file
        os.close(fd)
        _remove_empty(created)


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()  # only if empty
        except OSError:
            return
