"""Data-parallel and FSDP sharding on forced CPU host devices, against a single device.

``--xla_force_host_platform_device_count`` only takes effect before JAX initialises, so the
multi-device check runs in a fresh subprocess with 4 CPU devices.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from lm_train_helpers import host_devices_env

from dca_theory.lm import sharding as shd

HERE = Path(__file__).resolve().parent

SCRIPT = r"""
import json, sys
import equinox as eqx, jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, sys.argv[1])
from lm_train_helpers import build_bigram
from dca_theory.lm import data as lm_data, sharding as shd
from dca_theory.lm.config import PRESETS
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.steps import make_eval_step, make_train_step
from dca_theory.lm.train_config import LMTrainConfig

assert len(jax.devices()) == 4, jax.devices()
cfg = PRESETS["tiny"].replace(vocab_size=64, d_model=16, max_len=16)
tcfg = LMTrainConfig(batch_size=8, grad_accum=2, warmup_steps=1)
tokens = np.random.default_rng(0).integers(0, 64, 4000).astype(np.int32)
out = {}
for name, n, fsdp in [("single", 1, False), ("dp4", 4, False), ("fsdp4", 4, True)]:
    mesh = shd.make_mesh(jax.devices()[:n])
    params, static = eqx.partition(build_bigram(cfg, key=jax.random.PRNGKey(0)),
                                   eqx.is_inexact_array)
    opt = make_lm_optimizer(tcfg)
    opt_state = opt.init(params)
    psh = shd.state_shardings(params, mesh, fsdp=fsdp)
    osh = shd.state_shardings(opt_state, mesh, fsdp=fsdp)
    rep, bsh = shd.replicated(mesh), shd.batch_sharding(mesh)
    params, opt_state = shd.put_state(params, psh), shd.put_state(opt_state, osh)
    step = jax.jit(make_train_step(static, opt, tcfg), in_shardings=(psh, osh, rep, bsh, rep),
                   out_shardings=(psh, osh, rep), donate_argnums=(0, 1))
    losses = []
    for s in range(3):
        batch = shd.put_batch(lm_data.train_batch(tokens, seq_len=16, batch_size=8, seed=0,
                                                  step=s), mesh)
        assert len(batch["inputs"].sharding.device_set) == n
        params, opt_state, m = step(params, opt_state, jax.random.PRNGKey(1), batch,
                                    jnp.int32(s))
        losses.append(float(m["loss"]))
    eval_fn = jax.jit(make_eval_step(static, tcfg))
    eb = next(lm_data.eval_batches(tokens, seq_len=16, batch_size=8))
    nll, w = eval_fn(params, shd.put_batch(eb, mesh))
    sharded = [str(x.sharding.spec) for x in jax.tree_util.tree_leaves(params)]
    out[name] = {"losses": losses, "eval": float(nll / w), "specs": sharded,
                 "params": [np.asarray(x).ravel()[:50].tolist()
                            for x in jax.tree_util.tree_leaves(params)]}
print("RESULT" + json.dumps(out))
"""


def test_sharded_training_matches_single_device():
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(HERE)], env=host_devices_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    single = out["single"]
    for name in ("dp4", "fsdp4"):
        # f32: the sharded run sums per-device partial gradients in a different order, so
        # agreement is to rounding (~1e-7 relative per op, a few ops deep) rather than bitwise
        np.testing.assert_allclose(out[name]["losses"], single["losses"], rtol=1e-5)
        np.testing.assert_allclose(out[name]["eval"], single["eval"], rtol=1e-5)
        for a, b in zip(out[name]["params"], single["params"]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert any("'data'" in s for s in out["fsdp4"]["specs"])  # FSDP really shards something
    assert not any("'data'" in s for s in out["dp4"]["specs"])  # DP replicates params


def test_fsdp_spec_shards_the_largest_divisible_axis():
    assert shd._fsdp_spec((64, 16), 4) == P("data", None)
    assert shd._fsdp_spec((6, 16), 4) == P(None, "data")
    assert shd._fsdp_spec((3, 5), 4) == P()
    assert shd._fsdp_spec((), 4) == P()
    assert shd._fsdp_spec((64, 16), 1) == P()


def test_batch_must_divide_over_devices(unchecked):  # a stand-in mesh
    mesh = shd.make_mesh()
    shd.check_batch_divisible(8, 2, mesh)
    with pytest.raises(ValueError, match="micro-batch size 3 .* divisible by the"):
        shd.check_batch_divisible(6, 2, SimpleNamespace(size=4))  # only .size is read

