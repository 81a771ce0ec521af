"""Analysis hooks: GRN weight export (Figure 10 data), slot labels and residual states."""

import json

import equinox as eqx
import jax
import numpy as np
import pytest

from dca_theory.lab.analysis import (
    bias_profile,
    grn_weights,
    residual_states,
    save_grn_analysis,
    slot_labels,
)
from dca_theory.lm.config import PRESETS
from dca_theory.lm.model import build_model

TINY = PRESETS["tiny"]


def test_slot_labels_full_and_k():
    full = TINY.replace(residual="dca")
    assert slot_labels(full, 3) == ["input", "out_0", "out_1", "out_2"]
    k1 = TINY.replace(residual="dca", k=1)
    assert slot_labels(k1, 1) == ["input", "out_0"]
    assert slot_labels(k1, 3) == ["input", "middle_0..1", "out_2"]


def test_grn_weights_and_profile(tmp_path, getkey):
    model = build_model(TINY.replace(residual="dca", k=1), key=getkey())
    arrays = grn_weights(model)
    # 3 GRNs per block + the output GRN, each with b and w.
    assert len(arrays) == 2 * (3 * TINY.n_layers + 1)
    assert arrays["block_2.q.b"].shape == (3, TINY.d_model)
    assert arrays["output.w"].shape == (TINY.d_model,)
    prof = {r["grn"]: r for r in bias_profile(model)}
    # At init b = 1 everywhere: median and band are exactly 1.
    assert prof["output"]["median"] == [1.0, 1.0, 1.0]
    assert prof["output"]["slots"] == ["input", "middle_0..1", "out_2"]
    out = save_grn_analysis(model, tmp_path / "grn")
    with np.load(out / "grn_weights.npz") as z:
        np.testing.assert_array_equal(z["block_0.k.b"], arrays["block_0.k.b"])
    saved = json.loads((out / "grn_bias_profile.json").read_text())
    assert saved["k"] == 1 and len(saved["grns"]) == 3 * TINY.n_layers + 1


def test_profile_percentiles_of_known_bias(getkey):
    model = build_model(TINY.replace(residual="grn_v2"), key=getkey())
    b = np.tile(np.arange(TINY.d_model, dtype=np.float32), (TINY.n_layers + 1, 1))
    model = eqx.tree_at(lambda m: m.trunk.grns[-1].b, model, b)
    row = [r for r in bias_profile(model) if r["grn"] == "output"][0]
    np.testing.assert_allclose(row["median"], np.median(np.arange(TINY.d_model)))
    np.testing.assert_allclose(row["low"], np.percentile(np.arange(TINY.d_model), 5))


def test_no_grn_model_is_an_error(getkey):
    with pytest.raises(ValueError, match="has no GRNs"):
        grn_weights(build_model(TINY, key=getkey()))


def test_residual_states_numpy(getkey):
    model = build_model(TINY.replace(residual="dca"), key=getkey())
    states = residual_states(model, np.arange(16) % TINY.vocab_size)
    assert states["stack_2"].shape == (3, 16, TINY.d_model)
    assert isinstance(states["final"], np.ndarray)


@pytest.mark.parametrize("residual,k,window", [("dca", 1, None), ("grn_v3", None, 2)])
def test_per_block_and_scanned_models_export_equal_grns(residual, k, window):
    """One key, either layout: the same GRN names and bit-equal weights (the per-block model
    is read through its exact stacked-layout conversion)."""
    cfg = TINY.replace(residual=residual, k=k, grn_window=window, n_layers=4)
    key = jax.random.PRNGKey(3)
    per_block = grn_weights(build_model(cfg, key=key))
    scanned = grn_weights(build_model(cfg.replace(layer_loop="scan"), key=key))
    assert list(per_block) == list(scanned)
    for name, x in per_block.items():
        np.testing.assert_array_equal(scanned[name], x)


def test_scanned_model_without_grns_is_an_error(getkey):
    with pytest.raises(ValueError, match=r"^residual='vanilla' has no GRNs; valid: "):
        grn_weights(build_model(TINY.replace(layer_loop="scan"), key=getkey()))
