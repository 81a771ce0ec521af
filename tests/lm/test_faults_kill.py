"""Fault suite, ``kill -9``: a tiny run killed at random moments (while training, writing a
checkpoint, evaluating) and started again until it finishes ends with bitwise the parameters, the
history and the scores of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest
from lm_train_helpers import build_bigram, float32

from dca_theory.lm import train as lm_train

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# One run of the stand-in model: checkpoints at every step and evaluations at every second one,
# so that most moments of the run are inside a checkpoint write or an evaluation.
WORKER = """
import sys
sys.path.insert(0, {here!r})
import jax
jax.config.update("jax_enable_x64", False)
from lm_train_helpers import build_bigram
from dca_theory.lm import train as lm_train
from dca_theory.lm.config import PRESETS
from dca_theory.lm.train_config import TRAIN_PRESETS

cfg = TRAIN_PRESETS["tiny"].replace(
    data=sys.argv[2], bpe_vocab_size=260, batch_size=4, steps=12, warmup_steps=2, log_every=1,
    eval_every=2, eval_batches=2, checkpoint_every=1, keep_checkpoints=3, progress=False)
model = PRESETS["tiny"].replace(d_model=16, max_len=16, dropout=0.2)
lm_train.train_and_evaluate(model, cfg, sys.argv[1], build=build_bigram)
"""


def start(script: Path, workdir: Path, corpus: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, str(script), str(workdir), str(corpus)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def params(workdir: Path):
    with float32():
        model, *_ = lm_train.load_run(workdir, build=build_bigram)
        return [np.asarray(x) for x in
                jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_inexact_array))]


def history(workdir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "tokens_per_s"}
            for r in lm_train._read_lines(workdir / "metrics.jsonl")]


@pytest.mark.slow  # about a dozen process starts: 1-2 minutes on 2 cores
def test_random_kills_then_resume_are_bitwise_the_uninterrupted_run(tmp_path):
    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(5)
    words = ["north", "south", "east", "west", "up", "down", "left"]
    corpus.write_text("\n".join(" ".join(rng.choice(words, 9)) for _ in range(200)) + "\n")
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(here=str(HERE)))

    reference = tmp_path / "reference"
    t0 = time.perf_counter()
    proc = start(script, reference, corpus)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    proc.stderr.close()
    duration = time.perf_counter() - t0

    workdir, kills, seen = tmp_path / "killed", 0, []
    delays = np.random.default_rng(17).uniform(0.3, 1.0, size=7) * duration
    for delay in delays:
        proc = start(script, workdir, corpus)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            folder = workdir / "checkpoints"
            seen.append(sorted(p.name for p in folder.iterdir()) if folder.is_dir() else [])
        proc.stderr.close()
    proc = start(script, workdir, corpus)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    proc.stderr.close()

    assert kills >= 5, seen  # most delays end inside the run
    for a, b in zip(params(reference), params(workdir)):
        np.testing.assert_array_equal(a, b)  # bitwise
    assert history(workdir) == history(reference)  # complete: no lost or repeated line
    ref, got = (json.loads((d / "summary.json").read_text()) for d in (reference, workdir))
    for key in ("valid_loss", "test_loss", "final_train_loss", "valid_ppl_history"):
        assert got[key] == ref[key], key
