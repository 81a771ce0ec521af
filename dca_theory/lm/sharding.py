"""Scaling out with ``jax.sharding``: data parallelism over every device, optional FSDP.

One 1-D mesh with axis ``"data"`` spans all devices of all processes. Batches are sharded along
their leading (batch) axis; parameters and optimiser state are replicated (data parallel) or,
with ``fsdp=True``, each array is split along its largest axis divisible by the device count
(ZeRO-3 / FSDP style: XLA all-gathers them where a layer needs them). The same jitted step runs
unchanged on one CPU, one GPU, or many hosts; XLA inserts the gradient all-reduce.

Multi-host: call :func:`maybe_initialize_distributed` before anything touches a device. It runs
``jax.distributed.initialize()`` when asked to (``--distributed``) or when the standard
environment says so (``JAX_COORDINATOR_ADDRESS``; or a SLURM / Open MPI job, which JAX detects
itself). Each process then builds only its own rows of the global batch.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "data"


def maybe_initialize_distributed(force: bool = False) -> bool:
    """Initialise multi-host JAX if ``force`` or ``$JAX_COORDINATOR_ADDRESS`` is set."""
    if not (force or os.environ.get("JAX_COORDINATOR_ADDRESS")):
        return False
    jax.distributed.initialize()
    return True


def make_mesh(devices=None) -> Mesh:
    """A 1-D ``"data"`` mesh over ``devices`` (default: every device of every process)."""
    return Mesh(np.asarray(jax.devices() if devices is None else devices), (AXIS,))


def check_batch_divisible(batch_size: int, grad_accum: int, mesh: Mesh) -> None:
    n = mesh.size
    micro = batch_size // grad_accum
    if micro % n:
        raise ValueError(f"micro-batch size {micro} (batch_size {batch_size} / grad_accum "
                         f"{grad_accum}) must be divisible by the {n} devices")


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(AXIS))


def _fsdp_spec(shape: tuple[int, ...], n: int) -> P:
    """Shard the largest axis divisible by ``n``; replicate small or indivisible arrays."""
    axes = [i for i in np.argsort(shape)[::-1] if shape[i] % n == 0 and shape[i] >= n]
    if not axes or n == 1:
        return P()
    spec = [None] * len(shape)
    spec[int(axes[0])] = AXIS
    return P(*spec)


def state_shardings(tree, mesh: Mesh, *, fsdp: bool = False):
    """A sharding for every array leaf of ``tree`` (params or optimiser state)."""

    def one(leaf):
        if not hasattr(leaf, "shape"):
            return None
        if fsdp:
            return NamedSharding(mesh, _fsdp_spec(tuple(leaf.shape), mesh.size))
        return replicated(mesh)

    return jax.tree_util.tree_map(one, tree)


def put_state(tree, shardings):
    """Place ``tree`` with ``shardings``; every leaf gets its own buffer (``jnp.copy``) because a
    model or optimiser may share one array between leaves, and a donated buffer must be unique."""
    return jax.tree_util.tree_map(
        lambda x, s: x if s is None else jax.device_put(jnp.copy(x), s), tree, shardings)


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Place a *global* host batch on the mesh, each process contributing its own rows."""
    sharding = batch_sharding(mesh)
    if jax.process_count() == 1:
        return {k: jax.device_put(v, sharding) for k, v in batch.items()}
    pid, nproc = jax.process_index(), jax.process_count()
    out = {}
    for k, v in batch.items():
        rows = v.shape[0] // nproc
        local = v[pid * rows:(pid + 1) * rows]
        out[k] = jax.make_array_from_process_local_data(sharding, local, v.shape)
    return out
