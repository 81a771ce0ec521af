"""The rivals (Attention Residuals, mHC, MUDDFormer, value residuals) train data-parallel and
FSDP-sharded on 4 forced CPU devices as on one (the pattern of ``test_sharding.py``, with the
real LM of each kind instead of the bigram stand-in)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from lm_train_helpers import host_devices_env

SCRIPT = r"""
import json, sys
import equinox as eqx, jax, jax.numpy as jnp, numpy as np
from dca_theory.lm import data as lm_data, sharding as shd
from dca_theory.lm.config import PRESETS
from dca_theory.lm.model import build_model
from dca_theory.lm.optim import make_lm_optimizer
from dca_theory.lm.steps import make_train_step
from dca_theory.lm.train_config import LMTrainConfig

assert len(jax.devices()) == 4, jax.devices()
tcfg = LMTrainConfig(batch_size=8, grad_accum=1, warmup_steps=1)
tokens = np.random.default_rng(0).integers(0, 64, 4000).astype(np.int32)
out = {}
for kind in sys.argv[1].split(","):
    cfg = PRESETS["tiny"].replace(residual=kind, d_model=16, n_layers=2, max_len=16)
    for name, n, fsdp in [("single", 1, False), ("dp4", 4, False), ("fsdp4", 4, True)]:
        mesh = shd.make_mesh(jax.devices()[:n])
        params, static = eqx.partition(build_model(cfg, key=jax.random.PRNGKey(0)),
                                       eqx.is_inexact_array)
        opt = make_lm_optimizer(tcfg)
        opt_state = opt.init(params)
        psh = shd.state_shardings(params, mesh, fsdp=fsdp)
        osh = shd.state_shardings(opt_state, mesh, fsdp=fsdp)
        rep = shd.replicated(mesh)
        params, opt_state = shd.put_state(params, psh), shd.put_state(opt_state, osh)
        step = jax.jit(make_train_step(static, opt, tcfg),
                       in_shardings=(psh, osh, rep, shd.batch_sharding(mesh), rep),
                       out_shardings=(psh, osh, rep))
        losses = []
        for s in range(2):
            batch = shd.put_batch(lm_data.train_batch(tokens, seq_len=16, batch_size=8, seed=0,
                                                      step=s), mesh)
            params, opt_state, m = step(params, opt_state, jax.random.PRNGKey(1), batch,
                                        jnp.int32(s))
            losses.append(float(m["loss"]))
        out[f"{kind}/{name}"] = losses
print("RESULT" + json.dumps(out))
"""

RIVALS = ("attn_res", "mhc", "muddformer", "value_residual")


@pytest.mark.slow  # 12 compilations in a fresh process (~1 min on 2 cores)
def test_rivals_train_sharded_as_on_one_device():
    proc = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(RIVALS)], env=host_devices_env(),
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    for kind in RIVALS:
        single = out[f"{kind}/single"]
        assert np.all(np.isfinite(single)) and single[1] != single[0]  # it trained a step
        for name in ("dp4", "fsdp4"):
            # f32: per-device partial gradients are summed in another order (see test_sharding)
            np.testing.assert_allclose(out[f"{kind}/{name}"], single, rtol=1e-5)
