"""The pieces of training across processes, in one process: the flags and environment that name
the processes (with their one-line errors), and the rows of each batch that a process reads.
Two real processes train in ``test_distributed_processes.py`` (slow)."""

from __future__ import annotations

import numpy as np
import pytest

from dca_theory.cli import main
from dca_theory.lm import data as lm_data
from dca_theory.lm import sharding as shd
from dca_theory.lm.distributed import Launch, process_rows, resolve

NO_ENV: dict[str, str] = {}


def test_flags_name_the_processes():
    assert resolve("127.0.0.1:1234", 2, 1, environ=NO_ENV) == Launch("127.0.0.1:1234", 2, 1)
    assert resolve(environ=NO_ENV) is None  # nothing given: a plain run
    assert resolve(None, 1, 0, environ=NO_ENV) is None  # one process needs no coordinator
    # a coordinator (or --distributed) alone leaves count and id to JAX's cluster detection
    assert resolve("host:1", environ=NO_ENV) == Launch("host:1", None, None)
    assert resolve(force=True, environ=NO_ENV) == Launch(None, None, None)


def test_environment_fills_what_the_flags_leave_out():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:99", "JAX_NUM_PROCESSES": "4",
           "JAX_PROCESS_ID": "3"}
    assert resolve(environ=env) == Launch("10.0.0.1:99", 4, 3)
    assert resolve(process_id=0, environ=env) == Launch("10.0.0.1:99", 4, 0)  # flags first
    with pytest.raises(ValueError, match=r"\$JAX_NUM_PROCESSES must be an integer, got 'two'"):
        resolve(environ={"JAX_NUM_PROCESSES": "two"})


@pytest.mark.parametrize(("coord", "count", "pid", "message"), [
    ("h:1", 2, 2, r"--process-id 2 must be < --num-processes 2 \(valid: 0..1\)"),
    ("h:1", 2, -1, r"--process-id must be >= 0, got -1"),
    ("h:1", 0, 0, r"--num-processes must be >= 1, got 0"),
    (None, 2, 0, r"--num-processes needs the coordinator's address: --coordinator HOST:PORT"),
    ("h:1", 2, None, r"--num-processes 2 needs this process's id: --process-id 0..1"),
    ("h:1", None, 1, r"--process-id 1 needs the number of processes: --num-processes N"),
    ("localhost", 2, 0, r"--coordinator 'localhost' must be HOST:PORT"),
    ("h:99999", 2, 0, r"--coordinator 'h:99999' must be HOST:PORT with a port in 1..65535"),
])
def test_bad_process_settings_are_one_line_errors(coord, count, pid, message):
    with pytest.raises(ValueError, match=message):
        resolve(coord, count, pid, environ=NO_ENV)


@pytest.mark.parametrize(("flags", "names"), [
    (["--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "2"],
     "--process-id 2 must be < --num-processes 2"),
    (["--num-processes", "2", "--process-id", "0"], "needs the coordinator's address"),
])
def test_cli_rejects_bad_process_flags_before_touching_anything(tmp_path, capsys, monkeypatch,
                                                                flags, names):
    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(var, raising=False)
    workdir = tmp_path / "run"
    assert main(["lm", "train", "--workdir", str(workdir), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dca-theory: error: ") and names in err
    assert not workdir.exists()


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_processes_read_disjoint_contiguous_rows_covering_the_batch(count):
    rows = [process_rows(8, p, count) for p in range(count)]
    assert [i for r in rows for i in range(8)[r]] == list(range(8))  # in order, each row once
    assert {r.stop - r.start for r in rows} == {8 // count}


def test_row_assignment_rejects_what_cannot_be_split():
    with pytest.raises(ValueError, match="batch size 6 must be divisible by the 4 processes"):
        process_rows(6, 0, 4)
    with pytest.raises(ValueError, match=r"process index 2 must be in 0..1"):
        process_rows(8, 2, 2)


def test_a_process_builds_exactly_its_slice_of_the_global_batch():
    tokens = np.random.default_rng(0).integers(0, 50, 500).astype(np.int32)
    kw = {"seq_len": 12, "batch_size": 8, "seed": 3, "step": 7}
    whole = lm_data.train_batch(tokens, **kw)
    parts = [lm_data.train_batch(tokens, **kw, rows=process_rows(8, p, 2)) for p in range(2)]
    for key in whole:
        np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])


def test_one_process_holds_the_whole_batch():
    mesh = shd.make_mesh()
    batch = {"inputs": np.zeros((4, 3), np.int32)}
    assert shd.put_batch(batch, mesh, global_rows=4)["inputs"].shape == (4, 3)
    with pytest.raises(ValueError, match="one process holds a batch of 4 rows, not all 8"):
        shd.put_batch(batch, mesh, global_rows=8)
