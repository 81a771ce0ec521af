"""Table 9's restricted GRN stacks: ``ModelConfig.grn_window`` / ``grn_input``.

Paper Table 9 compares "GRN-v3 (last 4 layers)" with "GRN-v3 (model inputs + last 3 layers)".
With the full stack ``G_t = [x, f_1, ..., f_{t-1}]``, ``grn_input=False`` feeds GRN t the last
``grn_window`` entries; ``grn_input=True`` feeds x plus the last ``grn_window - 1`` outputs.
Dropped entries are not summed (no k-DCA middle slot).
"""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from zoo_helpers import F64, logits, perturb, tokens

from dca_theory.lab.analysis import slot_labels
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.model import build_model
from dca_theory.lm.params import count_params, param_count

DEEP = F64.replace(residual="grn_v3", n_layers=6)

# Hand-written from the definition for depth 6, window 4: GRN t (t = 6 is the final GRN)
# reads these indices of the full stack [x, f_0, ..., f_{t-1}] (index 0 is x).
LAST_4 = [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3), (1, 2, 3, 4), (2, 3, 4, 5), (3, 4, 5, 6)]
INPUT_LAST_3 = [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3), (0, 2, 3, 4), (0, 3, 4, 5), (0, 4, 5, 6)]


@pytest.mark.parametrize("grn_input, expected", [(False, LAST_4), (True, INPUT_LAST_3)])
def test_hand_checked_selection_depth_6_window_4(grn_input, expected):
    cfg = DEEP.replace(grn_window=4, grn_input=grn_input)
    assert [cfg.grn_slots(t) for t in range(7)] == expected
    names = ["input"] + [f"out_{j}" for j in range(6)]
    assert slot_labels(cfg, 6) == [names[i] for i in expected[6]]


@eqx.filter_jit
def states(model, toks):
    return model.forward_with_states(toks, inference=True)[1]


@pytest.mark.parametrize("grn_input", [False, True])
def test_trunk_feeds_each_grn_its_window(grn_input, getkey):
    """The stack each GRN reads (and the final output) are the hand-selected entries."""
    cfg = DEEP.replace(grn_window=4, grn_input=grn_input)
    expected = INPUT_LAST_3 if grn_input else LAST_4
    model = perturb(build_model(cfg, key=getkey()), getkey())  # GRNs away from the plain sum
    assert [g.size for g in model.trunk.grns] == [len(s) for s in expected]
    st = states(model, tokens())
    full = [st["embed"]] + [st[f"block_{j}_out"] for j in range(6)]
    for t in range(6):
        np.testing.assert_array_equal(st[f"stack_{t}"], jnp.stack([full[i] for i in expected[t]]))
    final = model.trunk.grns[-1](jnp.stack([full[i] for i in expected[6]]))
    # float64, same entries and weights; the trunk's fused GRN sums in another order than the
    # Combiner: 1e-12 relative to the largest output.
    np.testing.assert_allclose(st["final"], final, rtol=0,
                               atol=1e-12 * float(jnp.max(jnp.abs(final))))


def test_window_covering_the_stack_is_the_full_model(getkey):
    """window >= depth + 1 (with the input) selects every entry: same parameters, same
    logits. Depth 3 (``F64``), window 4; plus a control: window 3 gives another function."""
    key, noise = getkey(), getkey()
    cfg = F64.replace(residual="grn_v3")
    full = perturb(build_model(cfg, key=key), noise)
    covering = perturb(build_model(cfg.replace(grn_window=cfg.n_layers + 1), key=key), noise)
    toks = tokens()
    # Same arrays in the same order and the same ops: exact equality, no tolerance.
    np.testing.assert_array_equal(logits(covering, toks), logits(full, toks))
    narrow = perturb(build_model(cfg.replace(grn_window=cfg.n_layers), key=key), noise)
    # The final GRN drops out_0 (an O(1) entry): far more than rounding changes the logits.
    assert float(jnp.max(jnp.abs(logits(narrow, toks) - logits(full, toks)))) > 1e-3


@pytest.mark.parametrize("residual", ["grn_v1", "grn_v2", "grn_v3"])
@pytest.mark.parametrize("window, grn_input", [(1, False), (2, True), (3, False), (4, True)])
def test_parameter_count_follows_window(residual, window, grn_input, getkey):
    cfg = F64.replace(residual=residual, grn_window=window, grn_input=grn_input)
    assert count_params(build_model(cfg, key=getkey())) == param_count(cfg)


@pytest.mark.parametrize("changes, match", [
    ({"residual": "vanilla", "grn_window": 4}, "only valid with residual"),
    ({"residual": "dca", "grn_input": False, "grn_window": 4}, "only valid with residual"),
    ({"residual": "grn_v3", "grn_window": 0, "grn_input": False}, ">= 1"),
    ({"residual": "grn_v3", "grn_window": 1}, ">= 2"),
    ({"residual": "grn_v3", "grn_window": True}, ">= 2"),
    ({"residual": "grn_v3", "grn_window": 2.0}, ">= 2"),
    ({"residual": "grn_v3", "grn_input": False}, "needs grn_window"),
    ({"residual": "grn_v3", "grn_input": 1}, "True or False"),
])
def test_bad_values_raise(changes, match, unchecked):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**changes)


def test_defaults_are_the_full_stack():
    cfg = ModelConfig(residual="grn_v3", n_layers=3)
    assert cfg.grn_window is None and cfg.grn_input is True
    assert [cfg.grn_slots(t) for t in range(4)] == [tuple(range(t + 1)) for t in range(4)]
    assert ModelConfig(residual="grn_v1", grn_window=1, grn_input=False).grn_slots(3) == (3,)
    with pytest.raises(ValueError, match="num_outputs"):
        cfg.grn_slots(-1)
