"""Orbax checkpoints of a training run: parameters, optimiser state, step, RNG, data position.

A checkpoint is the folder ``WORKDIR/checkpoints/<step>/`` with two items:

* ``state``: every array leaf of ``(params, opt_state, rng_key)`` saved as a flat, ordered dict
  (the tree *structure* is rebuilt from a freshly initialised model, so Equinox modules and
  optax named tuples need no special serialisation);
* ``meta``: JSON with ``step``, ``data_step`` (the position of the deterministic data stream,
  see :mod:`dca_theory.lm.data`), the seed and ``model`` (the model config, so that a
  ``config.json`` edited later is named as the error, not the checkpoints).

Orbax writes each step into a temporary folder and renames it when complete, so a run killed
while saving leaves the previous checkpoint intact and the partial one is never restored (such a
``<step>.orbax-checkpoint-tmp-*`` folder is ignored and named in one line).

A checkpoint damaged after it was written (a truncated array file, a deleted ``state`` folder, an
empty ``_METADATA``) fails to restore; :meth:`Checkpointer.restore_newest` then falls back to the
next older one, saying which one it skipped and why. Nothing here deletes a damaged checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


def _flat(tree) -> dict[str, Any]:
    leaves = jax.tree_util.tree_leaves(tree)
    return {f"{i:05d}": leaf for i, leaf in enumerate(leaves)}


class Checkpointer:
    """Periodic, atomic checkpoints in ``workdir/checkpoints`` (keeps the newest ``keep``)."""

    def __init__(self, workdir: str | Path, *, keep: int = 2, seed_stacked: bool = False):
        self.seed_stacked = seed_stacked  # see restore
        self.directory = Path(workdir).resolve() / "checkpoints"
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def steps(self) -> list[int]:
        """Every finished checkpoint's step, oldest first."""
        return sorted(self._manager.all_steps())

    def unfinished(self) -> list[Path]:
        """Folders of saves that a kill interrupted (orbax never restores them)."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if ".orbax-checkpoint-tmp" in p.name)

    def restore_newest(self, template, *, step: int | None = None,
                       notify: Callable[[str], None] = print) -> tuple[int, Any, dict]:
        """``(step, state, meta)`` of the newest checkpoint that restores cleanly, or of
        ``step`` if given. Each damaged checkpoint passed over is named through ``notify``."""
        available = self.steps()
        if step is not None and step not in available:
            listed = ", ".join(map(str, available)) or "none"
            raise ValueError(f"no checkpoint at step {step} in {self.directory}; "
                             f"available: {listed}")
        for candidate in [step] if step is not None else available[::-1]:
            try:
                state, meta = self.restore(template, candidate)
                return candidate, state, meta
            except Exception as err:  # orbax / TensorStore / JSON errors of a damaged folder
                reason = damage_reason(err)
            _collect_abandoned_reads()
            if step is not None:
                raise ValueError(f"checkpoint step {step} in {self.directory} does not restore: "
                                 f"{reason}")
            notify(f"skipping checkpoint step {candidate} in {self.directory}: it does not "
                   f"restore ({reason}); kept on disk, trying an older one")
        if available:
            raise ValueError(f"no checkpoint in {self.directory} restores cleanly (steps "
                             f"{', '.join(map(str, available))}); they are kept on disk")
        raise FileNotFoundError(f"no checkpoint in {self.directory}")

    def meta(self, step: int) -> dict | None:
        """The ``meta`` item of checkpoint ``step`` alone, or None if it does not read."""
        try:
            with _draining_loops():
                restored = self._manager.restore(
                    step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            return dict(restored["meta"])
        except Exception:  # a damaged checkpoint: restore_newest names it
            return None

    def save(self, step: int, state, meta: dict) -> None:
        """Start an (asynchronous) save of ``state`` at ``step``; see :meth:`wait`."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(_flat(state)),
                                  meta=ocp.args.JsonSave(meta))
        self._manager.save(step, args=args, force=True)

    def restore(self, template, step: int | None = None) -> tuple[Any, dict]:
        """Restore into the structure, dtypes and shardings of ``template``.

        With ``seed_stacked`` the state is stacked over seeds (:mod:`dca_theory.lm.seed_loop`,
        whose checkpoints list ``seeds`` in their meta); a checkpoint without ``seeds`` holds
        one seed's state without that axis (the CLI's checkpoints before the seed axis): it is
        restored into ``template``'s first seed and given the axis."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        meta = self.meta(step) if self.seed_stacked else None
        if meta is not None and "seeds" not in meta:
            one = jax.tree_util.tree_map(lambda x: x[0], template)
            state, meta = self._restore(one, step)
            shardings = jax.tree_util.tree_map(lambda x: x.sharding, template)
            add_axis = jax.jit(lambda t: jax.tree_util.tree_map(lambda x: x[None], t),
                               out_shardings=shardings)
            return add_axis(state), meta
        return self._restore(template, step)

    def _restore(self, template, step: int) -> tuple[Any, dict]:
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _flat(template))
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                  meta=ocp.args.JsonRestore())
        with _draining_loops():
            restored = self._manager.restore(step, args=args)
        flat = restored["state"]
        leaves = [flat[k] for k in sorted(flat)]
        treedef = jax.tree_util.tree_structure(template)
        return jax.tree_util.tree_unflatten(treedef, leaves), dict(restored["meta"])

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


class _DrainingLoop(asyncio.SelectorEventLoop):
    """An event loop that lets its unfinished tasks finish before it closes.

    Orbax runs a restore in a fresh loop and closes it as soon as one array read fails; the
    reads of the other arrays were still running in TensorStore's threads, and each posted its
    completion to the closed loop ("Event loop is closed", printed from those threads after the
    one line naming the damaged checkpoint). Draining them first leaves nothing to complain."""

    def close(self) -> None:
        if not self.is_running() and not self.is_closed():
            pending = [t for t in asyncio.all_tasks(self) if not t.done()]
            if pending:
                self.run_until_complete(asyncio.wait(pending, timeout=_DRAIN_TIMEOUT_S))
            for task in pending:  # retrieved here, so asyncio never logs them as lost
                if task.done() and not task.cancelled():
                    task.exception()
        super().close()


_DRAIN_TIMEOUT_S = 60.0


class _DrainingPolicy(asyncio.DefaultEventLoopPolicy):
    _loop_factory = _DrainingLoop


@contextlib.contextmanager
def _draining_loops():
    """Orbax's restores inside the block run in :class:`_DrainingLoop` s."""
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_DrainingPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(previous)


class _QuietOrbaxErrors(logging.Filter):
    """Drop orbax's own error logs (a traceback from each of its background threads): every
    failure they report also reaches the caller as an exception, which the CLI prints as one
    line (a full disk printed 54 tracebacks before the one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and "orbax" in record.pathname)


def _quiet_orbax() -> None:
    logger = logging.getLogger("absl")  # orbax logs through absl.logging
    if not any(isinstance(f, _QuietOrbaxErrors) for f in logger.filters):
        logger.addFilter(_QuietOrbaxErrors())


_quiet_orbax()


def _collect_abandoned_reads() -> None:
    """A failed restore leaves orbax's other pending array reads behind; silence their
    "Event loop is closed" complaints, so that the one line naming the damaged checkpoint is all
    a user sees.

    Two kinds arrive: the abandoned coroutines, collected here; and TensorStore reads still in
    flight, whose completions post to orbax's already closed event loop from TensorStore's own
    threads, later and at a time set by the load on the machine. Only a standing filter catches
    the second kind (it printed tracebacks, and failed tests, on a loaded 2-core machine)."""
    _drop_closed_loop_complaints()
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


def _is_closed_loop_complaint(unraisable) -> bool:
    err = unraisable.exc_value
    return isinstance(err, RuntimeError) and str(err) == "Event loop is closed"


def _drop_closed_loop_complaints() -> None:
    """Wrap ``sys.unraisablehook`` (once) so that it drops exactly the unraisable
    ``RuntimeError("Event loop is closed")``; everything else reaches the previous hook."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_loop_complaints", False):
        return

    def hook(unraisable) -> None:
        if not _is_closed_loop_complaint(unraisable):
            previous(unraisable)

    hook.drops_closed_loop_complaints = True
    sys.unraisablehook = hook


def damage_reason(err: BaseException) -> str:
    """One short line saying why a checkpoint failed to restore."""
    text = str(err).split(" See full TensorStore details")[0].strip().splitlines()
    reason = f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")
    return reason if len(reason) <= 160 else reason[:157] + "..."
