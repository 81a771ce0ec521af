"""Scaling out with ``jax.sharding``: data parallelism over every device, optional FSDP.

One 1-D mesh with axis ``"data"`` spans all devices of all processes. Batches are sharded along
their leading (batch) axis; parameters and optimiser state are replicated (data parallel) or,
with ``fsdp=True``, each array is split along its largest axis divisible by the device count
(ZeRO-3 / FSDP style: XLA all-gathers them where a layer needs them). The same jitted step runs
unchanged on one CPU, one GPU, or many hosts; XLA inserts the gradient all-reduce.

Several processes (:mod:`dca_theory.lm.distributed` joins them before anything touches a
device): the mesh lists the devices process by process, so that each process holds a contiguous
block of every batch's rows and builds only those (:func:`put_batch` with ``global_rows``).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dca_theory.lm.distributed import process_rows

AXIS = "data"


def make_mesh(devices=None) -> Mesh:
    """A 1-D ``"data"`` mesh over ``devices`` (default: every device of every process, in
    process order: process ``p`` holds the ``p``-th contiguous block of a batch's rows)."""
    if devices is None:
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.asarray(devices), (AXIS,))


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
    """Place ``tree`` with ``shardings``; every leaf gets its own buffer (a copy) because a
    model or optimiser may share one array between leaves, and a donated buffer must be unique.

    Each leaf goes through host memory: with several processes, ``device_put`` of a
    ``jax.Array`` onto devices of other processes makes an array whose local buffer claims
    every device, which orbax then cannot save (JAX 0.10); a NumPy value is placed correctly."""
    return jax.tree_util.tree_map(
        lambda x, s: x if s is None else jax.device_put(np.array(x), s), tree, shardings)


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh, *,
              global_rows: int | None = None) -> dict[str, jax.Array]:
    """Place a batch on the mesh. ``batch`` is the whole global batch (each process keeps its own
    rows), or, given ``global_rows``, only this process's rows of a global batch of that many
    (:func:`dca_theory.lm.distributed.process_rows`)."""
    sharding = batch_sharding(mesh)
    n = next(iter(batch.values())).shape[0]
    total = n if global_rows is None else global_rows
    if jax.process_count() == 1:
        if n != total:
            raise ValueError(f"one process holds a batch of {n} rows, not all {total}")
        return {k: jax.device_put(v, sharding) for k, v in batch.items()}
    mine = process_rows(total, jax.process_index(), jax.process_count())
    held = sorted(i[0].indices(total)[:2] for i in
                  sharding.addressable_devices_indices_map((total,)).values())
    if (held[0][0], held[-1][1]) != (mine.start, mine.stop):  # a mesh not in process order
        raise ValueError(f"process {jax.process_index()} holds rows {held[0][0]}:{held[-1][1]} "
                         f"of the mesh but reads rows {mine.start}:{mine.stop}")
    out = {}
    for k, v in batch.items():
        local = v if global_rows is not None else v[mine]
        out[k] = jax.make_array_from_process_local_data(sharding, local, (total, *v.shape[1:]))
    return out
