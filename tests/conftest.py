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
repeat almost nothing (6 of 651 programs read back). A cache shared by the two workers is slower
or unsafe: bounded, its file lock made ``.ci/run``'s pytest take 14 min 16 s against 8 min 46 s
(each write scans the folder under the lock); unbounded, JAX writes entries without a lock, so a
worker could read one half-written.

The tests compile with XLA's default backend optimisation, as users' programs do. Compiling
without LLVM's passes (``--xla_backend_optimization_level=0``) would cut the CPU time of
tests/test_user_commands.py by about a third, but it is not the same machine code: at level 0
the float64 gradient of a 3-layer mHC trunk (tests/lm/test_scanned.py) comes out NaN in every
parameter, where the default level gives finite values equal to 1e-10 across two
implementations.

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
