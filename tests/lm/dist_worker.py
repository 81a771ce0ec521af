"""One process of ``dca-theory lm train`` as the several-process tests run it (not a test).

``python dist_worker.py ARGS...`` runs ``dca-theory lm ARGS...`` with three test probes:

* the tiny stand-in model of :mod:`lm_train_helpers` in place of the transformer (the same
  training machinery; the compile takes seconds, not a minute);
* each training batch this process builds is printed as ``BATCH {"step", "rows", "sums"}``
  (``sums``: the token-id sum of every row, to compare with the batch of a one-process run);
* every file this process creates, writes, renames or removes under ``--workdir`` is recorded
  (Python's audit events: ``open`` for writing, ``os.mkdir``, ``os.rename``, ``os.remove``,
  ``os.rmdir``) and printed at the end as ``WRITES [[event, path], ...]``.

``$DIST_WORKER_PAUSE_AT=N`` makes the process stop (sleep) when it is about to build the batch of
step ``N``, after printing ``PAUSED N``: the test kills it there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

args = sys.argv[1:]
workdir = Path(args[args.index("--workdir") + 1]).resolve()
writes: list[tuple[str, str]] = []
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _under_workdir(path) -> str | None:
    if isinstance(path, int):
        return None
    path = Path(os.fsdecode(path)).resolve()
    return str(path.relative_to(workdir)) if path.is_relative_to(workdir) else None


def audit(event: str, event_args) -> None:
    if event == "open":
        path, mode, flags = event_args
        if not ((mode and any(c in mode for c in "wax+")) or (flags & WRITE_FLAGS)):
            return
        paths = [path]
    elif event in ("os.mkdir", "os.remove", "os.rmdir"):
        paths = [event_args[0]]
    elif event == "os.rename":
        paths = [event_args[0], event_args[1]]
    else:
        return
    for path in paths:
        rel = _under_workdir(path)
        if rel is not None:
            writes.append((event, rel))


sys.addaudithook(audit)

from lm_train_helpers import build_bigram  # noqa: E402

import dca_theory.lm.model as lm_model  # noqa: E402
from dca_theory.cli import main  # noqa: E402
from dca_theory.lm import data as lm_data  # noqa: E402

lm_model.build_model = build_bigram  # train.default_builder looks it up at call time
pause_at = int(os.environ.get("DIST_WORKER_PAUSE_AT", "-1"))
train_batch = lm_data.train_batch


def logged_train_batch(tokens, **kw):
    if kw["step"] == pause_at:
        print(f"PAUSED {pause_at}", flush=True)
        time.sleep(3600)
    batch = train_batch(tokens, **kw)
    rows = kw.get("rows", slice(None)).indices(kw["batch_size"])[:2]
    print("BATCH " + json.dumps({"step": kw["step"], "rows": list(rows),
                                 "sums": batch["inputs"].sum(axis=1).tolist()}), flush=True)
    return batch


lm_data.train_batch = logged_train_batch
code = main(["lm", *args])
print("WRITES " + json.dumps(sorted(set(writes))), flush=True)
sys.exit(code)
