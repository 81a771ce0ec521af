r"""Mid-run checkpoints for :func:`dca_theory.lab.seeds.train_lm_seeds`.

A run of the evidence grid (six vmapped seeds, 4000 steps) takes one to several CPU-hours, longer
than a sitting may last. Without a checkpoint an interrupted run starts again from step 0; with
one it continues from the last checkpoint and ends with the *same* parameters, losses and
evaluations as an uninterrupted run (same compiled step, same inputs: the batches and dropout keys
are functions of the seed and the step only; ``tests/lab/test_seed_checkpoint.py`` checks the
equality bit for bit).

One file, ``partial.npz``, written through a temporary file and ``os.replace`` so that a kill
during the write leaves the previous checkpoint intact. It holds

* ``leaf_{i}``: the leaves of ``(params, opt_state)`` (stacked over seeds);
* ``loss``, ``grad_norm``, ``step_time``: the per-step arrays up to the checkpoint;
* ``meta``: JSON with the step reached, the evaluations so far, the steps at which a process
  started (their step time includes compilation) and a fingerprint of the run (configs, seeds,
  leaf shapes). A checkpoint whose fingerprint differs from the run's is refused in one line
  instead of being resumed into the wrong run. Config fields are compared where both sides have
  them, so a field added to a config class later (at a value that computes the same result,
  e.g. how the trunk loops over its blocks) does not orphan the checkpoints written before it.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from dca_theory.io import atomic_file, to_jsonable


@dataclass
class Partial:
    """What a checkpoint restores: the state after ``step`` steps."""

    step: int
    state: tuple  # (params, opt_state), the same tree structure as the run's
    loss_SxT: np.ndarray  # [S, step]
    grad_norm_SxT: np.ndarray
    step_time_T: np.ndarray  # [step]
    evals: list[dict]
    restart_steps: list[int]


def fingerprint(model_cfg, train_cfg, seeds, state) -> str:
    """A JSON string identifying the run a checkpoint belongs to (``progress`` and the logging
    intervals excluded: they do not change the trained result)."""
    train = to_jsonable(train_cfg)
    for volatile in ("progress", "log_every", "data_dir"):
        train.pop(volatile, None)
    shapes = [[list(x.shape), str(x.dtype)] for x in jax.tree_util.tree_leaves(state)]
    return json.dumps({"model": to_jsonable(model_cfg), "train": train, "seeds": list(seeds),
                       "leaves": shapes}, sort_keys=True)


def same_run(stored: str, current: str) -> bool:
    """Whether two fingerprints name one run: equal seeds and leaf shapes, and equal values of
    every config field that both record."""
    a, b = json.loads(stored), json.loads(current)
    if a["seeds"] != b["seeds"] or a["leaves"] != b["leaves"]:
        return False
    return all(a[part][k] == b[part][k] for part in ("model", "train")
               for k in a[part].keys() & b[part].keys())


def save(path: str | Path, step: int, state, loss_SxT, grad_norm_SxT, step_time_T,
         evals: list[dict], restart_steps: list[int], fp: str) -> Path:
    """Write the checkpoint after ``step`` steps atomically (see the module docstring)."""
    path = Path(path)
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(state)]
    # bfloat16 has no numpy file format: store its bits, restored by view in `load`.
    arrays = {f"leaf_{i}": (x.view(np.uint16) if x.dtype.kind == "V" or x.dtype.name == "bfloat16"
                            else x) for i, x in enumerate(leaves)}
    meta = {"step": int(step), "fingerprint": fp, "restart_steps": [int(s) for s in restart_steps],
            "evals": [{"step": int(e["step"]), "valid_loss": np.asarray(e["valid_loss"]).tolist()}
                      for e in evals]}
    with atomic_file(path, "wb") as fh:
        np.savez(fh, meta=np.array(json.dumps(meta)), loss=loss_SxT[:, :step],
                 grad_norm=grad_norm_SxT[:, :step], step_time=step_time_T[:step], **arrays)
    return path


def load(path: str | Path, template, fp: str) -> Partial | None:
    """The checkpoint at ``path`` restored into ``template``'s tree structure, or ``None`` if
    there is none. A checkpoint of another run is a one-line ``ValueError``."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as fh, np.load(fh) as f:
            meta = json.loads(str(f["meta"]))
            files = {k: f[k] for k in f.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: unreadable checkpoint ({err}); move it aside to start the "
                         "run from step 0") from None
    if not same_run(meta["fingerprint"], fp):
        raise ValueError(f"{path} belongs to a different run (configuration, seeds or parameter "
                         "shapes differ); move it aside to start this run from step 0")
    leaves_t, treedef = jax.tree_util.tree_flatten(template)
    leaves = [jax.numpy.asarray(files[f"leaf_{i}"].view(t.dtype)) for i, t in enumerate(leaves_t)]
    evals = [{"step": e["step"], "valid_loss": np.asarray(e["valid_loss"])} for e in meta["evals"]]
    return Partial(step=int(meta["step"]), state=jax.tree_util.tree_unflatten(treedef, leaves),
                   loss_SxT=files["loss"], grad_norm_SxT=files["grad_norm"],
                   step_time_T=files["step_time"], evals=evals,
                   restart_steps=list(meta["restart_steps"]))
