"""Orbax checkpoints of a training run: parameters, optimiser state, step, RNG, data position.

A checkpoint is the folder ``WORKDIR/checkpoints/<step>/`` with two items:

* ``state``: every array leaf of ``(params, opt_state, rng_key)`` saved as a flat, ordered dict
  (the tree *structure* is rebuilt from a freshly initialised model, so Equinox modules and
  optax named tuples need no special serialisation);
* ``meta``: JSON with ``step``, ``data_step`` (the position of the deterministic data stream,
  see :mod:`dca_theory.lm.data`), the seed and the configs.

Orbax writes each step into a temporary folder and renames it when complete, so a run killed
while saving leaves the previous checkpoint intact and the partial one is never restored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


def _flat(tree) -> dict[str, Any]:
    leaves = jax.tree_util.tree_leaves(tree)
    return {f"{i:05d}": leaf for i, leaf in enumerate(leaves)}


class Checkpointer:
    """Periodic, atomic checkpoints in ``workdir/checkpoints`` (keeps the newest ``keep``)."""

    def __init__(self, workdir: str | Path, *, keep: int = 2):
        self.directory = Path(workdir).resolve() / "checkpoints"
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state, meta: dict) -> None:
        """Start an (asynchronous) save of ``state`` at ``step``; see :meth:`wait`."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(_flat(state)),
                                  meta=ocp.args.JsonSave(meta))
        self._manager.save(step, args=args, force=True)

    def restore(self, template, step: int | None = None) -> tuple[Any, dict]:
        """Restore into the structure, dtypes and shardings of ``template``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _flat(template))
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                  meta=ocp.args.JsonRestore())
        restored = self._manager.restore(step, args=args)
        flat = restored["state"]
        leaves = [flat[k] for k in sorted(flat)]
        treedef = jax.tree_util.tree_structure(template)
        return jax.tree_util.tree_unflatten(treedef, leaves), dict(restored["meta"])

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()
