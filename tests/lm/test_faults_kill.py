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
# each finished step is announced on stdout, so that the test can kill at a chosen moment
lm_train.train_and_evaluate(model, cfg, sys.argv[1], build=build_bigram,
                            hooks=[lambda done: print(done, flush=True)])
"""


def start(script: Path, workdir: Path, corpus: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, str(script), str(workdir), str(corpus)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


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
    proc = start(script, reference, corpus)
    proc.stdout.read()
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()

    # Each kill comes 1-8 steps into the process, 0-300 ms after a step ends: inside a checkpoint
    # save (orbax writes asynchronously, so a save often spans several steps), an evaluation or
    # a step. The checkpoint folders seen after each kill are printed (pytest -s).
    workdir, kills, seen = tmp_path / "killed", 0, []
    rng = np.random.default_rng(17)
    for _ in range(7):
        proc = start(script, workdir, corpus)
        steps = [proc.stdout.readline() for _ in range(int(rng.integers(1, 9)))]
        if steps[-1]:  # still running
            time.sleep(float(rng.uniform(0.0, 0.3)))
            proc.send_signal(signal.SIGKILL)
            kills += 1
            folder = workdir / "checkpoints"
            seen.append(sorted(p.name for p in folder.iterdir()) if folder.is_dir() else [])
        proc.stdout.read()
        proc.wait(timeout=300)
        proc.stdout.close()
        proc.stderr.close()
    proc = start(script, workdir, corpus)
    proc.stdout.read()
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()

    assert kills >= 3, seen  # the steps per try are seeded; how far each save got is not
    in_saves = sum(any("tmp" in name for name in names) for names in seen)
    print(f"{kills} kills; {in_saves} left an interrupted checkpoint save; folders: {seen}")
    for a, b in zip(params(reference), params(workdir)):
        np.testing.assert_array_equal(a, b)  # bitwise
    assert history(workdir) == history(reference)  # complete: no lost or repeated line
    ref, got = (json.loads((d / "summary.json").read_text()) for d in (reference, workdir))
    for key in ("valid_loss", "test_loss", "final_train_loss", "valid_ppl_history"):
        assert got[key] == ref[key], key
