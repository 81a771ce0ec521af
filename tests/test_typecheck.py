"""The test run checks annotations and dtypes: jaxtyping's import hook (``--jaxtyping-packages``
in pyproject's pytest addopts) wraps every ``dca_theory`` function with beartype, and
``tests/conftest.py`` turns on strict dtype promotion. Both must be active in every xdist
worker, which is where these tests run."""

import jax
import jax.numpy as jnp
import pytest
from jaxtyping import TypeCheckError


def test_import_hook_checks_shapes_and_dtypes_of_dca_theory_functions():
    from dca_theory.vit.train import cross_entropy  # (logits: Float[B K], labels: Int[B])

    logits = jnp.zeros((3, 10), jnp.float32)
    loss, _ = cross_entropy(logits, jnp.zeros(3, jnp.int32))
    assert loss.shape == (3,)
    with pytest.raises(TypeCheckError, match="cross_entropy"):
        cross_entropy(logits, jnp.zeros(4, jnp.int32))  # B differs between the arguments
    with pytest.raises(TypeCheckError, match="cross_entropy"):
        cross_entropy(logits, jnp.zeros(3, jnp.float32))  # labels must be integers


def test_import_hook_checks_plain_annotations():
    from dca_theory.vit.model import sincos_2d  # (grid: int, dim: int)

    with pytest.raises(TypeCheckError, match="sincos_2d"):
        sincos_2d("4", 8)


def test_strict_dtype_promotion():
    with pytest.raises(jax.dtypes.TypePromotionError):
        jnp.ones(2, jnp.float32) + jnp.ones(2, jnp.int32)
    with pytest.raises(jax.dtypes.TypePromotionError):
        jnp.ones(2, jnp.float32) + jnp.ones(2, jnp.float64)
    # weakly typed Python scalars still take the array's dtype
    assert (2.0 * jnp.ones(2, jnp.float32)).dtype == jnp.float32
    assert (jnp.arange(3, dtype=jnp.int32) + 1).dtype == jnp.int32
