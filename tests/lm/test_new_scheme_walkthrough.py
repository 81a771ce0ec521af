"""CONTRIBUTING.md's two worked mixer examples, executed as printed.

The text claims that a new stack scheme and a new stream scheme are each a registry row plus a
mixer class. This test takes both snippets from the markdown, registers each for the test only
(the row added to the registry by ``monkeypatch``, the class's module put in ``sys.modules``
under the path its row names; no file and no permanent row), and checks what the text
promises follows from those two pieces, in float64:

* the LM builds it (``layer_loop="scan"``) and its logits are finite;
* one gradient step works: every gradient finite, the scheme's own parameters get a nonzero
  one, and a small step lowers the loss (what a gradient is for);
* ``collect`` gives every per-layer state, and block 0's input is what the scheme's rule says
  (1e-12 relative);
* cached decoding, one token and three tokens at a time, equals the full pass at every
  position (1e-10 relative to the largest output; float64 summation-order differences are
  ~1e-15, a wrong state O(1));
* the class's closed-form ``overhead`` equals the arrays the trunk holds beyond vanilla's, and
  ``dca-theory lm info`` lists the kind.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decode_helpers import decoded
from zoo_helpers import perturb

from dca_theory import schemes
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.model import build_model
from dca_theory.lm.paper_param_counts import info_rows
from dca_theory.lm.params import count_params, overhead, param_count
from dca_theory.lm.scanned import ScannedTrunk
from dca_theory.lm.scanned import param_count as trunk_count

REPO = Path(__file__).resolve().parents[2]
CFG = ModelConfig(vocab_size=11, max_len=6, d_model=8, n_heads=2, d_mlp=16, n_layers=3,
                  param_dtype="float64", compute_dtype="float64", layer_loop="scan")
EXAMPLES = {"mean_stack": "Worked example of a stack scheme",
            "two_streams": "Worked example of a stream scheme"}


def _snippets(title: str) -> tuple[str, str, str]:
    """The example's registry row, its module's dotted name and the module's source."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    block = re.search(re.escape(title) + r".*?```python\n(.*?)```", text, re.S).group(1)
    row, module = block.split("# dca_theory/schemes.py, in SCHEMES\n")[1].split(
        "\n\n# dca_theory/lm/zoo/")
    path, _, source = module.partition("\n")
    return row, f"dca_theory.lm.zoo.{path.removesuffix('.py')}", source


@pytest.fixture(params=sorted(EXAMPLES))
def scheme(request, monkeypatch) -> schemes.Scheme:
    """One example registered for this test: its row in the registry, its module importable."""
    row, module_name, source = _snippets(EXAMPLES[request.param])
    (new,) = eval(row, {"Scheme": schemes.Scheme})  # "Scheme(...)," as printed: a 1-tuple
    assert new.name == request.param and new.mixer.startswith(module_name + ":")
    module = types.ModuleType(module_name)
    monkeypatch.setitem(sys.modules, module_name, module)  # before the class: dataclasses look
    exec(compile(source, f"CONTRIBUTING.md ({module_name})", "exec"), module.__dict__)
    monkeypatch.setattr(schemes, "SCHEMES", (*schemes.SCHEMES, new))
    monkeypatch.setattr(schemes, "_BY_SPELLING",
                        {**schemes._BY_SPELLING, **{s: new for s in new.spellings}})
    return new


def _max_rel(got, want) -> float:
    got, want = np.asarray(got), np.asarray(want)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


def _loss(model, tokens_L):
    logp_LxV = jax.nn.log_softmax(model(tokens_L[:-1], inference=True))
    return -jnp.mean(jnp.take_along_axis(logp_LxV, tokens_L[1:, None], axis=1))


def _block0_input(name, mixer, embed_LxD):
    """Block 0's input by the example's rule: ``s_0 · mean(x)``, or ``(w_00 + w_01) x`` for
    two streams that both hold x."""
    if name == "mean_stack":
        return mixer.layers[0] * embed_LxD
    return (mixer.layers[0, 0] + mixer.layers[0, 1]) * embed_LxD


def test_worked_mixer_example_runs_as_written(scheme):
    cfg = CFG.replace(residual=scheme.name)
    assert cfg.residual == scheme.name  # ModelConfig accepts the registered name
    key = jax.random.PRNGKey(0)
    model = build_model(cfg, key=key)
    assert isinstance(model.trunk, ScannedTrunk)
    model = eqx.tree_at(lambda m: m.trunk, model, perturb(model.trunk, jax.random.PRNGKey(1)))
    tokens = jax.random.randint(jax.random.PRNGKey(2), (cfg.max_len,), 0, cfg.vocab_size)

    logits = eqx.filter_jit(lambda m, t: m(t, inference=True))(model, tokens)
    assert logits.shape == (cfg.max_len, cfg.vocab_size) and bool(jnp.all(jnp.isfinite(logits)))

    loss, grads = eqx.filter_jit(eqx.filter_value_and_grad(_loss))(model, tokens)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    assert float(jnp.max(jnp.abs(grads.trunk.mixer.layers))) > 0, "the scheme does not learn"
    stepped = eqx.apply_updates(model, jax.tree.map(lambda g: -1e-3 * g, grads))
    assert float(eqx.filter_jit(_loss)(stepped, tokens)) < float(loss)

    states = eqx.filter_jit(lambda m, t: m.forward_with_states(t, inference=True)[1])(
        model, tokens)
    for name in ("embed", "final", *(f"block_{t}_{io}" for t in range(cfg.n_layers)
                                     for io in ("in", "out")),
                 *(f"stream_{t}" for t in range(cfg.n_layers))):
        assert states[name].shape == (cfg.max_len, cfg.d_model), name
        assert bool(jnp.all(jnp.isfinite(states[name]))), name
    want = _block0_input(scheme.name, model.trunk.mixer, states["embed"])
    assert _max_rel(states["block_0_in"], want) < 1e-12
    if scheme.name == "mean_stack":  # the stack it records: x, then the block outputs
        for t in range(cfg.n_layers):
            assert states[f"stack_{t}"].shape == (t + 1, cfg.max_len, cfg.d_model)
            assert _max_rel(states[f"stack_{t}"][-1], states[f"block_{t - 1}_out"]
                            if t else states["embed"]) < 1e-12

    trunk = model.trunk
    x_LxD = jax.random.normal(jax.random.PRNGKey(3), (cfg.max_len, cfg.d_model), jnp.float64)
    full = eqx.filter_jit(lambda t, x: t(x, causal=True))(trunk, x_LxD)
    for chunk in (1, 3):
        assert _max_rel(decoded(trunk, x_LxD, chunk), full) < 1e-10, chunk

    vanilla = ScannedTrunk.init(cfg.replace(residual="vanilla"), key=key)
    assert overhead(cfg) == trunk_count(trunk) - trunk_count(vanilla) == trunk.mixer.layers.size
    assert param_count(cfg) == count_params(model)
    assert scheme.name in {r["residual"] for r in info_rows(cfg)}
