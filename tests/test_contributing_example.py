"""CONTRIBUTING.md's worked example of a new GRN-like scheme, executed as written.

The example claims that a GRN-like scheme is a registry row plus a combiner class (two files).
This test pastes its two snippets into a copy of the package, exactly where the text says they
go, and checks in a fresh interpreter that everything the text promises follows: the toy net
accepts the name, equals the plain ResNet at init (float64, 1e-12), counts its parameters from
the registry, knows it is not linear (its gate depends on the input), and the LM builds it, runs
it, and offers ``--grn-gate`` for it; the scanned trunk runs it through the GRN mixer its row
names, with the per-block trunk's values and gradients under the paper's gate.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHECKS = textwrap.dedent('''
    import jax, jax.numpy as jnp, equinox as eqx
    jax.config.update("jax_enable_x64", True)
    from dca_theory import schemes
    from dca_theory.nets import DeepLinear
    from dca_theory.residual import COMBINERS, make_combiner

    assert "grn_v1_gated" in COMBINERS and schemes.get("grn_v1_gated").gated
    key = jax.random.PRNGKey(0)
    net = DeepLinear(6, 2, 3, kind="grn_v1_gated", dtype=jnp.float64, key=key)
    res = DeepLinear(6, 2, 3, kind="res", dtype=jnp.float64, key=key)
    x = jax.random.normal(jax.random.PRNGKey(1), (6,), jnp.float64)
    assert float(jnp.max(jnp.abs(net(x) - res(x)))) < 1e-12, "not the plain sum at init"
    for c in net.combiners:
        arrays = sum(a.size for a in jax.tree_util.tree_leaves(eqx.filter(c, eqx.is_array)))
        assert c.param_count() == arrays, (c.param_count(), arrays)
    assert not net.linear
    try:
        net.end_to_end_matrix()
        raise AssertionError("end_to_end_matrix accepted a gated combiner")
    except ValueError as e:
        assert "not linear" in str(e)
    c = make_combiner("grn_v1_gated", 3, 6, dtype=jnp.float64, init="random", key=key)
    stack = jax.random.normal(key, (3, 6), jnp.float64)
    assert float(jnp.max(jnp.abs(c(stack) - jnp.sum(stack, 0)))) > 1e-3, "gate has no effect"

    import contextlib, io
    from dca_theory.lm import cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["info", "--preset", "tiny"]) == 0
    assert "grn_v1_gated" in out.getvalue() or "GRN-v1 gated" in out.getvalue(), out.getvalue()
    args = cli.build_parser().parse_args(["train", "--residual", "grn_v1_gated",
                                          "--grn-gate", "paper"])
    model_cfg, _ = cli._configs(args)
    assert model_cfg.residual == "grn_v1_gated"
    from dca_theory.lm.config import ModelConfig
    from dca_theory.lm.model import build_model
    cfg = ModelConfig(residual="grn_v1_gated", d_model=8, n_layers=2, n_heads=2, d_mlp=16,
                      vocab_size=11, max_len=8)
    logits = build_model(cfg, key=key)(jnp.arange(8) % 11)
    assert logits.shape == (8, 11) and bool(jnp.all(jnp.isfinite(logits)))

    # The scanned trunk runs it through the GRN mixer its row names: the per-block trunk's
    # function and gradients (weights perturbed off init so the gate acts) under the paper's
    # gate (not the default), to 1e-10 of the largest magnitude in float64.
    from dca_theory.lm.params import overhead
    from dca_theory.lm.scanned import ScannedTrunk, param_count
    from dca_theory.lm.trunks import Trunk
    def perturbed(tree):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        keys = jax.random.split(jax.random.PRNGKey(5), len(leaves))
        return jax.tree_util.tree_unflatten(treedef, [
            x + 0.3 * jax.random.normal(k, x.shape, x.dtype) if eqx.is_inexact_array(x) else x
            for x, k in zip(leaves, keys)])
    def loss(trunk, x):
        return jnp.sum(jnp.sin(trunk(x, causal=True)))
    def close(a, b):
        a, b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
        scale = max(float(jnp.max(jnp.abs(y))) for y in b)
        return len(a) == len(b) and all(
            float(jnp.max(jnp.abs(x - y))) <= 1e-10 * scale for x, y in zip(a, b))
    c64 = cfg.replace(param_dtype="float64", compute_dtype="float64", grn_gate="paper")
    old = perturbed(Trunk(c64, key=key))
    new = ScannedTrunk.from_trunk(old)
    vanilla = ScannedTrunk.init(c64.replace(residual="vanilla", grn_gate="bias_inside"), key=key)
    assert param_count(new) - param_count(vanilla) == overhead(c64)
    x = jax.random.normal(key, (8, 8), jnp.float64)
    grad = eqx.filter_jit(eqx.filter_value_and_grad(loss))
    (l_old, g_old), (l_new, g_new) = grad(old, x), grad(new, x)
    assert close(l_new, l_old), (l_new, l_old)
    assert close(eqx.filter(g_new, eqx.is_array),
                 eqx.filter(ScannedTrunk.from_trunk(g_old), eqx.is_array))
    print("example ok")
''')


def _snippets() -> tuple[str, str]:
    """The registry row and the class of the worked example, as printed."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    block = re.search(r"Worked example \(a GRN-v1 with a gate.*?```python\n(.*?)```", text,
                      re.S).group(1)
    row = block.split("# dca_theory/schemes.py, in SCHEMES\n")[1].split("\n\n# dca_theory/")[0]
    cls = block.split("# dca_theory/residual.py\n")[1].split("# ... and ")[0]
    return row, cls


def _insert(path: Path, anchor: str, text: str) -> None:
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path.name}: anchor {anchor!r} not found exactly once"
    path.write_text(source.replace(anchor, text + anchor))


def test_worked_example_of_a_new_grn_scheme_runs_as_written(tmp_path):
    row, cls = _snippets()
    pkg = tmp_path / "dca_theory"
    shutil.copytree(REPO / "dca_theory", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    _insert(pkg / "schemes.py", ")\n\n_BY_SPELLING", textwrap.indent(row, "    ") + "\n")
    _insert(pkg / "residual.py", "#: the combiner class of each scheme", cls + "\n\n")
    residual = pkg / "residual.py"
    tuple_line = "(NewestOnly, PlainSum, GRNv1, GRNv2, GRNv3, SoftmaxOverDepth)"
    assert tuple_line in residual.read_text(), "the COMBINERS tuple moved: update this test"
    residual.write_text(residual.read_text().replace(
        tuple_line, tuple_line[:-1] + ", GRNv1Gated)"))

    env = {**os.environ, "PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", CHECKS], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "example ok" in out.stdout
