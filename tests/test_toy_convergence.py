"""toy_convergence: full-batch L-BFGS converges where it must, the gain bookkeeping, and a tiny
quick run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dca_theory.nets import MLPResNet
from experiments import toy_convergence as E


def test_lbfgs_fits_a_target_the_net_represents_exactly(getkey):
    """Teacher = a trained-size copy of the student's class (another MLPResNet): L-BFGS on a
    full batch must drive the training MSE far below its starting value (to < 1e-3 of it)."""
    dim, width = 6, 3
    teacher = MLPResNet(dim, width, 2, kind="res", key=getkey())
    student = MLPResNet(dim, width, 2, kind="res", key=getkey())
    x = jax.random.normal(getkey(), (256, dim), jnp.float32)
    _, losses = jax.jit(lambda m: E.lbfgs_fit(m, x, jax.vmap(teacher)(x), 300))(student)
    losses = np.asarray(losses)
    assert losses[-1] < 1e-3 * losses[0]


def test_aggregate_gain_and_survival():
    cfg = E.ConvergenceConfig(widths=(4,), restarts=2)
    rows = []
    for arm, res, grn in (("adamw_short", (1.0, 2.0), (0.5, 0.6)),
                          ("adam_long", (0.4, 0.5), (0.3, 0.9)),
                          ("lbfgs", (0.2, 0.2), (0.2, 0.3))):
        for kind, mses in (("res", res), ("grn_v1", grn)):
            rows += [{"arm": arm, "kind": kind, "width": 4, "restart": r, "test_mse": m,
                      "tail_relative_fall": 0.0} for r, m in enumerate(mses)]
    cells = E.aggregate(rows, cfg)
    assert cells["adamw_short/r=4"]["gain_grn_v1"] == pytest.approx(0.5)  # best 0.5 vs 1.0
    assert cells["adam_long/r=4"]["gain_grn_v1"] == pytest.approx(0.25)
    assert cells["adam_long/r=4"]["survives_grn_v1"] == pytest.approx(0.5)
    assert cells["lbfgs/r=4"]["survives_grn_v1"] == pytest.approx(0.0)
    assert cells["adam_long/r=4"]["grn_v1"]["mean_mse"] == pytest.approx(0.6)


def test_settings_errors():
    with pytest.raises(ValueError, match="widths must be non-empty integers in"):
        E.settings(True, ["widths=0,4"])
    with pytest.raises(ValueError, match="teacher_rank <= teacher_pad_rank"):
        E.settings(True, ["teacher_rank=8"])


@pytest.mark.slow
def test_quick_mode_tiny(tmp_path):
    from dca_theory.io import read_json

    run = E.main(quick=True, out=tmp_path / "tc", overrides=[
        "widths=2", "short_steps=20", "adam_steps=20", "lbfgs_steps=5", "train_size=64",
        "test_inputs=64", "restarts=1"])
    summary = read_json(run / "summary.json")
    assert set(summary["cells"]) == {f"{a}/r=2" for a in E.ARMS}
    assert all(np.isfinite(r["test_mse"]) and r["test_mse"] > 0 for r in summary["runs"])
    assert "survives_grn_v1" in summary["cells"]["lbfgs/r=2"]


def test_kinds_need_the_resnet_baseline():
    with pytest.raises(ValueError, match="kinds must include the baseline 'res'"):
        E.settings(True, ["kinds=grn_v1"])
