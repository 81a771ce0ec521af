"""Fault suite, other processes and the runtime: a second trainer on a run directory is turned
away at once (one line naming the holder) and a killed holder's lock file does not block the
resume; a process that runs out of address space loses nothing; with every checkpoint damaged,
``lm eval`` prints exactly one line, run after run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest
from lm_train_helpers import build_bigram, float32, write_word_corpus

from dca_theory.cli import main
from dca_theory.lm import train as lm_train
from dca_theory.lm.config import PRESETS
from dca_theory.lm.train_config import TRAIN_PRESETS
from dca_theory.lm.workdir_lock import LOCK_NAME

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODEL = PRESETS["tiny"].replace(d_model=16, max_len=16)

# A trainer of the stand-in model, run as its own process. argv: workdir corpus steps mode;
# mode "block" stops after step 2 until stdin closes (a trainer that holds the directory),
# "limit:KIB" caps the address space after the imports (as `ulimit -v` would, but past the
# start-up that a shell-wide limit can already break), "eval" runs `dca-theory lm eval`.
WORKER = """
import functools, resource, sys
sys.path.insert(0, {here!r})
import jax
jax.config.update("jax_enable_x64", False)
from lm_train_helpers import build_bigram
from dca_theory import cli
from dca_theory.lm import train as lm_train
from dca_theory.lm.config import PRESETS
from dca_theory.lm.train_config import TRAIN_PRESETS

workdir, corpus, steps, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if mode == "eval":  # the CLI builds the zoo's model; this run holds the stand-in
    lm_train.evaluate_run = functools.partial(lm_train.evaluate_run, build=build_bigram)
    sys.exit(cli.main(["lm", "eval", "--workdir", workdir, "--split", "valid"]))
cfg = TRAIN_PRESETS["tiny"].replace(
    data=corpus, bpe_vocab_size=260, batch_size=4, steps=steps, warmup_steps=2, log_every=1,
    eval_every=2, eval_batches=1, checkpoint_every=1, keep_checkpoints=10, progress=False)
model = PRESETS["tiny"].replace(d_model=16, max_len=16)

def hook(done):
    print(done, flush=True)
    if mode == "block" and done == 2:
        sys.stdin.read()
if mode.startswith("limit:"):
    kib = int(mode.split(":")[1])
    resource.setrlimit(resource.RLIMIT_AS, (kib * 1024, kib * 1024))
lm_train.train_and_evaluate(model, cfg, workdir, build=build_bigram, hooks=[hook])
"""


@pytest.fixture(autouse=True)
def _f32():
    with float32():
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_word_corpus(tmp_path_factory.mktemp("data") / "corpus.txt", seed=7,
                             words=["red", "green", "blue", "cyan", "pink", "grey", "gold"])


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    script = tmp_path_factory.mktemp("worker") / "worker.py"
    script.write_text(WORKER.format(here=str(HERE)))
    return script


def run_cfg(corpus, steps=4):
    return TRAIN_PRESETS["tiny"].replace(
        data=str(corpus), bpe_vocab_size=260, batch_size=4, steps=steps, warmup_steps=2,
        log_every=1, eval_every=2, eval_batches=1, checkpoint_every=1, keep_checkpoints=10,
        progress=False)


def start(worker: Path, workdir: Path, corpus: Path, steps: int, mode: str,
          **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, str(worker), str(workdir), str(corpus), str(steps),
                             mode], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)


def params(workdir: Path, step: int | None = None):
    model, *_ = lm_train.load_run(workdir, build=build_bigram, step=step)
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(eqx.filter(model,
                                                                        eqx.is_inexact_array))]


def test_second_trainer_is_turned_away_and_a_killed_holder_does_not_block(worker, corpus,
                                                                         tmp_path, capsys,
                                                                         monkeypatch):
    workdir = tmp_path / "run"
    holder = start(worker, workdir, corpus, 6, "block", stdin=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "1", holder.stderr.read()
        assert holder.stdout.readline().strip() == "2"  # now blocked, holding the directory
        history = (workdir / "metrics.jsonl").read_text()
        monkeypatch.setattr(lm_train, "_load_corpus", None)  # turned away before any work
        status = main(["lm", "train", "--preset", "tiny", "--workdir", str(workdir),
                       "--data", str(corpus), "--no-progress"])
        monkeypatch.undo()
        err = capsys.readouterr().err.strip()
        assert status == 1 and len(err.splitlines()) == 1, err
        assert err.startswith(f"dca-theory: error: workdir {workdir} is in use by another "
                              f"trainer (pid {holder.pid} on "), err
        assert (workdir / "metrics.jsonl").read_text() == history  # untouched
        deadline = time.time() + 60
        while not (workdir / "checkpoints" / "1").is_dir():  # orbax saves asynchronously
            assert time.time() < deadline, "checkpoint 1 never appeared"
            time.sleep(0.05)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        holder.kill()
        holder.wait(timeout=60)
        for stream in (holder.stdin, holder.stdout, holder.stderr):
            stream.close()
    stale = (workdir / LOCK_NAME).read_text().split()
    assert stale[0] == str(holder.pid)  # the killed holder's file is still there...
    summary = lm_train.train_and_evaluate(MODEL, run_cfg(corpus, steps=6), workdir,
                                          build=build_bigram)
    assert summary["resumed_from"] >= 1  # ...and blocks nothing: the run resumed and finished
    assert np.isfinite(summary["final_train_loss"]) and not (workdir / LOCK_NAME).exists()


# How a process can die when its address space runs out, with the stderr line required of
# each: Python's MemoryError (the CLI's one line), the XLA runtime's ``std::bad_alloc``
# (SIGABRT, whose message varies, so none is required), or glibc's loader failing to give a
# new thread its thread-local storage (it prints this and exits with 127).
OUT_OF_ADDRESS_SPACE = {1: "out of memory", -signal.SIGABRT: "",
                        127: "cannot allocate memory for thread-local data"}


def test_running_out_of_address_space_loses_nothing(worker, corpus, tmp_path):
    """Under ``ulimit -v`` the process dies in one of the ways of ``OUT_OF_ADDRESS_SPACE``,
    most of which no Python code can catch; what must hold is that the run on disk is intact
    and resumes."""
    workdir = tmp_path / "run"
    lm_train.train_and_evaluate(MODEL, run_cfg(corpus, steps=4), workdir, build=build_bigram)
    before = params(workdir)
    history = (workdir / "metrics.jsonl").read_text()
    proc = start(worker, workdir, corpus, 8, "limit:1500000")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in OUT_OF_ADDRESS_SPACE, (proc.returncode, err[-2000:])
    assert OUT_OF_ADDRESS_SPACE[proc.returncode] in err, (proc.returncode, err[-2000:])
    for a, b in zip(params(workdir, step=4), before, strict=True):  # intact, bitwise
        np.testing.assert_array_equal(a, b)
    params(workdir)  # and the newest checkpoint (4, or one the process wrote before) restores
    assert (workdir / "metrics.jsonl").read_text().startswith(history.rstrip("\n"))
    summary = lm_train.train_and_evaluate(MODEL, run_cfg(corpus, steps=8), workdir,
                                          build=build_bigram)
    assert summary["resumed_from"] >= 4 and np.isfinite(summary["final_train_loss"])


@pytest.mark.parametrize("runs", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_every_checkpoint_damaged_is_exactly_one_line_run_after_run(worker, corpus, tmp_path,
                                                                    runs):
    """Orbax's abandoned background reads once printed "Event loop is closed" tracebacks after
    the one line, in some runs only: each run must print the one line alone (the source is
    tested in-process: test_faults_checkpoints, a failed restore leaves no read behind)."""
    workdir = tmp_path / "run"
    lm_train.train_and_evaluate(MODEL, run_cfg(corpus, steps=3), workdir, build=build_bigram)
    for step in (1, 2, 3):  # a truncated array file in each (the biggest, so it is read)
        state = workdir / "checkpoints" / str(step) / "state"
        target = max(state.rglob("d/*"), key=lambda p: p.stat().st_size)
        target.write_bytes(target.read_bytes()[:10])
    for _ in range(runs):
        proc = start(worker, workdir, corpus, 0, "eval")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        assert err.strip() == (f"dca-theory: error: no checkpoint in {workdir / 'checkpoints'} "
                               "restores cleanly (steps 1, 2, 3); they are kept on disk"), err
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1", "2", "3"]
    shutil.rmtree(workdir)
