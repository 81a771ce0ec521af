"""Shared test setup: float64, strict rank and dtype promotion, the data directory, markers.

A compilation cache per pytest process: many tests build the same program again (a resumed run,
a retrained tiny model), and JAX's own persistent cache, keyed by the program's content, serves
those from memory-backed disk. Each process (each xdist worker) has its own folder, made at
start and deleted at exit: no lock, no entry shared while half-written, nothing kept between
pytest runs (every program still compiles once per process), and subprocesses, which do not
inherit ``jax.config``, compile alone. The default suite on a fresh clone, 2 cores, nothing else
running: 12 min 28 s with it, 13 min 40 s without (one run each; CPU time 23 min 24 s against 25
min 43 s). The repeats are in the training tests (five of those files in one process: 64 s of
their 125 s of compilation are repeats); the tiny end-to-end runs of tests/test_user_commands.py
repeat almost nothing (6 of 651 programs read back). A cache shared by the workers is slower
or unsafe: bounded, its file lock made ``.ci/run``'s pytest take 14 min 16 s against 8 min 46 s
(each write scans the folder under the lock); unbounded, JAX writes entries without a lock, so a
worker could read one half-written.

The tests compile with LLVM's optimisation passes off (``--xla_backend_optimization_level=0``,
added to ``XLA_FLAGS`` unless it names a level already; subprocesses inherit it): their models
are tiny, so compiling is most of the suite's time and running them little of it. XLA builds the
same programs at every level, and level 0 only leaves each kernel's machine code unoptimised, so
values agree to rounding: every test passes at both levels (the float64 trunk equalities to
1e-10 included). On this 2-core machine, with two workers, the default suite took 10 min 17 s
at level 0 against 11 min 47 s at XLA's default level 3 (CPU time 17 min 21 s against 22 min
2 s; one run each, same tree). CI's slow tests (``.ci/run``) compile at level 3, as users'
programs do. Level 0 once found a fragile gradient: mHC's Sinkhorn took the gradient of its
overflow shift through ``max``'s tie count, which came out 0 where XLA computed the logits twice
with different rounding (:func:`dca_theory.lm.mhc.sinkhorn`).

The data directory for tests is ``$DCA_DATA_DIR`` if set, else ``../shared/data`` next to the
checkout (where CI lays it). Tests that need it skip with a message when it is absent.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import jax
import pytest


def _compile_without_llvm_passes() -> None:
    """Level 0 for this process and its subprocesses (module docstring). ``XLA_FLAGS`` is read
    when the first backend starts, so this must run before anything touches a device."""
    from jax._src import xla_bridge

    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()
    # a plugin started one first: the flag would silently not apply (a private name: where a
    # JAX release renames it, the check is skipped rather than the suite stopped)
    if getattr(xla_bridge, "_backends", None):
        raise RuntimeError("a JAX backend started before tests/conftest.py set XLA_FLAGS")


_compile_without_llvm_passes()
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
# Mixed dtypes must be cast explicitly (weak-typed Python scalars still promote as usual).
jax.config.update("jax_numpy_dtype_promotion", "strict")

REPO = Path(__file__).resolve().parents[1]


def _private_compilation_cache() -> None:
    """This process's compilation cache (module docstring), on tmpfs where there is one."""
    shm = Path("/dev/shm")
    where = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    folder = tempfile.mkdtemp(prefix="dca-theory-tests-xla-", dir=where)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_compilation_cache_max_size", -1)  # unbounded: no lock, no eviction
    # programs that compile faster than this are not worth a write
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)


_private_compilation_cache()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("DCA_DATA_DIR", REPO.parent / "shared" / "data"))
    if not (path / "ptb").is_dir():
        pytest.skip(f"no corpora at {path}; set DCA_DATA_DIR")
    return path


@pytest.fixture
def unchecked():
    """Switch jaxtyping's annotation checks off for one test: for tests of the one-line
    ValueErrors a user gets for a wrongly typed value (outside the tests no annotation is
    checked, so the code's own checks are what stands)."""
    import jaxtyping

    jaxtyping.config.update("jaxtyping_disable", True)
    yield
    jaxtyping.config.update("jaxtyping_disable", False)


@pytest.fixture
def getkey():
    """A fresh PRNG key per call, deterministic per test."""
    state = {"key": jax.random.PRNGKey(0)}

    def _next():
        state["key"], sub = jax.random.split(state["key"])
        return sub

    return _next


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() != "gpu":
        skip = pytest.mark.skip(reason="needs a GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
