"""Shared test setup: float64, strict rank and dtype promotion, the data directory, markers.

No compilation cache on disk: JAX's persistent cache, LRU-bounded so that its file lock keeps
the two workers from reading a half-written entry, made ``.ci/run``'s pytest take 14 min 16 s
against 8 min 46 s without it on the same tree (sys time 2 min 24 s against 26 s: each write
scans the cache folder under the shared lock); unbounded, on tests/test_user_commands.py alone
it took 252 s against 203 s (a cold cache: almost no program of a session compiles twice).

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

import os
from pathlib import Path

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
# Mixed dtypes must be cast explicitly (weak-typed Python scalars still promote as usual).
jax.config.update("jax_numpy_dtype_promotion", "strict")

REPO = Path(__file__).resolve().parents[1]


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
