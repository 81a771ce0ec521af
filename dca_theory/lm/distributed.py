"""Training across several processes with ``jax.distributed``: who the processes are, and which
rows of each global batch a process reads.

A run of ``N`` processes (one per host, or several on one host) is started by running the same
``dca-theory lm train`` command ``N`` times, each with its own process id::

    dca-theory lm train ... --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0
    dca-theory lm train ... --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 1

Each flag falls back to an environment variable: ``$JAX_COORDINATOR_ADDRESS`` (read by JAX
itself), ``$JAX_NUM_PROCESSES`` and ``$JAX_PROCESS_ID`` (read here, with the same prefix). With
only a coordinator (or ``--distributed``) the count and id are left to JAX's cluster detection
(SLURM, Open MPI, Kubernetes). Process 0 hosts the coordinator.

On CPU the processes exchange gradients through gloo collectives (TCP; over loopback on one
machine). Every process then holds one slice of the mesh of :mod:`dca_theory.lm.sharding` and
builds only its own contiguous rows of every global training batch (:func:`process_rows`), so the
run sees the same batches, in the same order, as one process would.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import jax

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


@dataclass(frozen=True)
class Launch:
    """What ``jax.distributed.initialize`` is called with (``None``: JAX detects it)."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None


def add_flags(parser) -> None:
    """The ``--coordinator``, ``--num-processes`` and ``--process-id`` flags of ``lm train``."""
    parser.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="several processes: address of process 0, which hosts the "
                        f"coordinator (default: ${ENV_COORDINATOR})")
    parser.add_argument("--num-processes", type=int, default=None, metavar="N",
                        help=f"several processes: how many in all (default: ${ENV_NUM_PROCESSES};"
                        " 1 = a plain single-process run)")
    parser.add_argument("--process-id", type=int, default=None, metavar="I",
                        help=f"several processes: this one's id, 0..N-1 (default: "
                        f"${ENV_PROCESS_ID})")


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {text!r}") from None


def _check_address(address: str, source: str) -> None:
    host, sep, port = address.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{source} {address!r} must be HOST:PORT with a port in 1..65535, "
                         "e.g. 127.0.0.1:1234")


def resolve(coordinator: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, *, force: bool = False,
            environ: Mapping[str, str] | None = None) -> Launch | None:
    """The processes of this run from flags (first) or the environment; ``None`` for a plain
    single-process run. Bad or missing values raise a one-line ``ValueError`` naming them."""
    environ = os.environ if environ is None else environ
    coord_src = "--coordinator" if coordinator is not None else f"${ENV_COORDINATOR}"
    count_src = "--num-processes" if num_processes is not None else f"${ENV_NUM_PROCESSES}"
    id_src = "--process-id" if process_id is not None else f"${ENV_PROCESS_ID}"
    coordinator = coordinator if coordinator is not None else environ.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _env_int(environ, ENV_NUM_PROCESSES)
    if process_id is None:
        process_id = _env_int(environ, ENV_PROCESS_ID)

    if num_processes is not None and num_processes < 1:
        raise ValueError(f"{count_src} must be >= 1, got {num_processes}")
    if process_id is not None and process_id < 0:
        raise ValueError(f"{id_src} must be >= 0, got {process_id}")
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise ValueError(f"{id_src} {process_id} must be < {count_src} {num_processes} "
                         f"(valid: 0..{num_processes - 1})")
    if coordinator is not None:
        _check_address(coordinator, coord_src)
    if num_processes == 1 and not force:
        return None  # one process needs no coordinator
    if num_processes is not None or process_id is not None:
        if coordinator is None:
            raise ValueError(f"{count_src if num_processes else id_src} needs the coordinator's "
                             f"address: --coordinator HOST:PORT (or ${ENV_COORDINATOR})")
        if num_processes is None:
            raise ValueError(f"{id_src} {process_id} needs the number of processes: "
                             f"--num-processes N (or ${ENV_NUM_PROCESSES})")
        if process_id is None:
            raise ValueError(f"{count_src} {num_processes} needs this process's id: "
                             f"--process-id 0..{num_processes - 1} (or ${ENV_PROCESS_ID})")
    elif coordinator is None and not force:
        return None
    return Launch(coordinator, num_processes, process_id)


def initialize(launch: Launch) -> None:
    """Join the run: ``jax.distributed.initialize`` (before anything touches a device).

    Cross-process collectives on CPU need an implementation; JAX versions before gloo became
    the default had none, so name it unless the user already chose one (e.g. ``mpi``)."""
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=launch.coordinator,
                               num_processes=launch.num_processes,
                               process_id=launch.process_id)


def setup(args) -> Launch | None:
    """Resolve and join the processes named by ``lm train``'s flags (see :func:`add_flags`)."""
    launch = resolve(args.coordinator, args.num_processes, args.process_id,
                     force=args.distributed)
    if launch is not None:
        initialize(launch)
    return launch


def process_rows(batch_size: int, process_index: int, process_count: int) -> slice:
    """The rows of a global batch that process ``process_index`` of ``process_count`` reads:
    equal, contiguous slices in process order (the order of the mesh's devices, see
    :func:`dca_theory.lm.sharding.make_mesh`)."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process index {process_index} must be in 0..{process_count - 1}")
    if batch_size % process_count:
        raise ValueError(f"batch size {batch_size} must be divisible by the {process_count} "
                         "processes")
    rows = batch_size // process_count
    return slice(process_index * rows, (process_index + 1) * rows)


def is_primary() -> bool:
    """Process 0 alone writes the run's files (checkpoint arrays are written by whichever
    process holds them, see :mod:`dca_theory.lm.checkpoint`)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches ``name`` (nothing to wait for in one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
