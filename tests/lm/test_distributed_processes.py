"""Two processes of ``dca-theory lm train`` on 127.0.0.1 (``jax.distributed``, gloo collectives
over loopback) against one process: the same parameters, each process its own rows of every
batch, process 0 alone writing the run's files, and a kill of either process followed by a
restart resuming from the last checkpoint.

The processes run :mod:`dist_worker` (the CLI with the tiny stand-in model and probes that log
the batches built and the files written). The pieces (flags, row assignment) have fast tests in
``test_distributed.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest
from lm_train_helpers import build_bigram, float32, write_word_corpus

from dca_theory.lm import train as lm_train
from dca_theory.lm.distributed import process_rows

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BATCH, STEPS = 8, 10
TRAIN = ["train", "--preset", "tiny", "--bpe-vocab", "260", "--batch-size", str(BATCH),
         "--steps", str(STEPS), "--warmup", "2", "--log-every", "1", "--eval-every", "5",
         "--eval-batches", "2", "--checkpoint-every", "2", "--keep", "3", "--d-model", "16",
         "--max-len", "16", "--dropout", "0.1", "--no-progress"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """``n`` worker processes training in ``workdir``; stdout/stderr go to files beside it."""

    def __init__(self, workdir: Path, corpus: Path, n: int, env: dict, *,
                 pause: dict | None = None, extra: tuple[str, ...] = ()):
        self.workdir, self.procs, self.logs = workdir, [], []
        port = free_port()
        for pid in range(n):
            flags = ([] if n == 1 else ["--coordinator", f"127.0.0.1:{port}",
                                        "--num-processes", str(n), "--process-id", str(pid)])
            log = workdir.parent / f"{workdir.name}.p{pid}.{len(list(workdir.parent.glob('*')))}"
            out, err = open(f"{log}.out", "w"), open(f"{log}.err", "w")
            penv = {**env, **({"DIST_WORKER_PAUSE_AT": str(pause[pid])}
                              if pause and pid in pause else {})}
            self.procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "dist_worker.py"), *TRAIN, "--data", str(corpus),
                 "--workdir", str(workdir), *flags, *extra], stdout=out, stderr=err, env=penv))
            out.close()
            err.close()
            self.logs.append(Path(f"{log}.out"))

    def wait(self, timeout: float = 600) -> list[str]:
        for pid, proc in enumerate(self.procs):
            code = proc.wait(timeout=timeout)
            err = self.logs[pid].with_suffix(".err").read_text()
            assert code == 0, f"process {pid} exited {code}: {err[-3000:]}"
        return [log.read_text() for log in self.logs]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)


def batches(out: str) -> list[dict]:
    return [json.loads(line[6:]) for line in out.splitlines() if line.startswith("BATCH ")]


def written(out: str) -> list[tuple[str, str]]:
    line = next(line for line in out.splitlines() if line.startswith("WRITES "))
    return [tuple(w) for w in json.loads(line[7:])]


def params(workdir: Path) -> list[np.ndarray]:
    with float32():
        model, *_ = lm_train.load_run(workdir, build=build_bigram)
        return [np.asarray(x) for x in
                jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_inexact_array))]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    corpus = write_word_corpus(root / "corpus.txt", seed=5,
                               words=["north", "south", "east", "west", "up", "down", "left"])
    # one compilation cache for every process of the module: later runs skip XLA compiles
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           "JAX_ENABLE_X64": "0", "JAX_COMPILATION_CACHE_DIR": str(root / "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    one, two = root / "one", root / "two"
    started = time.perf_counter()
    one_out = Run(one, corpus, 1, env).wait()
    two_out = Run(two, corpus, 2, env).wait()
    print(f"one-process run, then two-process run: {time.perf_counter() - started:.1f} s")
    return {"root": root, "corpus": corpus, "env": env, "one": one, "two": two,
            "one_out": one_out, "two_out": two_out}


@pytest.mark.slow  # 7 runs of 1-2 processes: about 4 minutes on a loaded 2-core machine
def test_two_processes_train_as_one(setup):
    # f32: the two processes all-reduce per-process partial gradients, a different summation
    # order than one process: agreement to rounding (~1e-7 per op, a few ops deep), not bitwise
    for a, b in zip(params(setup["two"]), params(setup["one"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    read = lm_train._read_lines
    one_hist, two_hist = read(setup["one"] / "metrics.jsonl"), read(setup["two"] / "metrics.jsonl")
    keys = [(r["step"], sorted(r)) for r in two_hist]
    assert keys == [(r["step"], sorted(r)) for r in one_hist]  # each line once: not twice
    np.testing.assert_allclose([r.get("loss", r.get("valid_loss", r.get("test_loss")))
                                for r in two_hist],
                               [r.get("loss", r.get("valid_loss", r.get("test_loss")))
                                for r in one_hist], rtol=1e-5)


@pytest.mark.slow
def test_each_process_builds_only_its_rows_of_every_batch(setup):
    whole = batches(setup["one_out"][0])
    assert [b["step"] for b in whole] == list(range(STEPS))
    for pid, out in enumerate(setup["two_out"]):
        mine = process_rows(BATCH, pid, 2)
        assert f"process {pid} of 2: rows {mine.start}:{mine.stop}" in out
        got = batches(out)
        assert [b["step"] for b in got] == list(range(STEPS))
        for b, w in zip(got, whole, strict=True):
            assert b["rows"] == [mine.start, mine.stop]
            assert b["sums"] == w["sums"][mine]  # the same windows as that slice of the batch


@pytest.mark.slow
def test_only_process_0_writes_the_run_files_and_commits_checkpoints(setup):
    w0, w1 = (written(out) for out in setup["two_out"])
    assert {"metrics.jsonl", "config.json", "summary.json", "tokenizer.json"} <= {
        path for _, path in w0}
    # process 0 commits each checkpoint: renames its temporary folder to checkpoints/<step>
    commits = {p for e, p in w0 if e == "os.rename" and re.fullmatch(r"checkpoints/\d+", p)}
    assert commits == {f"checkpoints/{s}" for s in range(2, STEPS + 1, 2)}
    # process 1 writes nothing outside the checkpoints, commits none, writes no checkpoint
    # metadata: only its share of the array data, as orbax's multi-process saving does
    assert all(p.startswith("checkpoints/") for _, p in w1), w1
    assert not [p for e, p in w1 if e == "os.rename"], w1
    assert not [p for _, p in w1 if re.search(r"_CHECKPOINT_METADATA|commit_success|/meta", p)]
    assert all("process_1" in p for e, p in w1 if e == "open"), w1


def _paused_then_killed(setup, victim: int, name: str) -> tuple[Path, int]:
    """A two-process run stopped while ``victim`` builds step 5's batch (after the checkpoint
    of step 4), then ``victim`` killed (SIGKILL) and the other process too (the job ends)."""
    workdir = setup["root"] / name
    run = Run(workdir, setup["corpus"], 2, setup["env"], pause={victim: 5})
    deadline = time.monotonic() + 600
    try:
        while not ("PAUSED 5" in run.logs[victim].read_text()
                   and (workdir / "checkpoints" / "4").is_dir()):
            assert time.monotonic() < deadline, "the run never reached step 5"
            assert all(p.poll() is None for p in run.procs), "a process ended early"
            time.sleep(0.05)
    finally:
        run.procs[victim].send_signal(signal.SIGKILL)
        run.kill()
    finished = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    return workdir, max(finished)


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_kill_either_process_then_restart_both_resumes(setup, victim):
    workdir, last = _paused_then_killed(setup, victim, f"killed{victim}")
    assert last == 4
    outs = Run(workdir, setup["corpus"], 2, setup["env"]).wait()
    for out in outs:
        assert f"resuming from step {last} of {STEPS}" in out
        assert [b["step"] for b in batches(out)] == list(range(last, STEPS))
    # the resumed run is the uninterrupted two-process run, bitwise (same processes, same
    # reduction order), with a complete history: no lost or repeated line
    for a, b in zip(params(workdir), params(setup["two"]), strict=True):
        np.testing.assert_array_equal(a, b)
    strip = [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in
             lm_train._read_lines(workdir / "metrics.jsonl")]
    assert strip == [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in
                     lm_train._read_lines(setup["two"] / "metrics.jsonl")]


@pytest.mark.slow
def test_two_processes_with_fsdp_train_as_one(setup):
    workdir = setup["root"] / "fsdp"
    Run(workdir, setup["corpus"], 2, setup["env"], extra=("--fsdp",)).wait()
    for a, b in zip(params(workdir), params(setup["one"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
