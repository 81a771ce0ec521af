"""Shared test setup: float64, strict rank and dtype promotion, the data directory, markers.

The data directory for tests is ``$DCA_DATA_DIR`` if set, else ``../shared/data`` next to the
checkout (where CI lays it). Tests that need it skip with a message when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A compilation cache on disk, shared by both test workers and the CLI subprocesses they start
# (set before JAX is imported, so the subprocesses inherit it): many tests build the same small
# models, and every fresh closure would otherwise compile the same program again. On 2 cores it
# took tests/lm from 9 min 10 s to 7 min 17 s from an empty cache. LRU-bounded; the bound makes
# JAX lock the folder, so the two workers never read a half-written entry. Point
# JAX_COMPILATION_CACHE_DIR elsewhere, or set JAX_ENABLE_COMPILATION_CACHE=false, to override.
for _name, _value in {"JAX_COMPILATION_CACHE_DIR": REPO / ".pytest_cache" / "jax-compilation",
                      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": 0,
                      "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": -1,
                      "JAX_COMPILATION_CACHE_MAX_SIZE": 2**30}.items():
    os.environ.setdefault(_name, str(_value))

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
# Mixed dtypes must be cast explicitly (weak-typed Python scalars still promote as usual).
jax.config.update("jax_numpy_dtype_promotion", "strict")


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
