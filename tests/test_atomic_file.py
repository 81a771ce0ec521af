"""``dca_theory.io.atomic_file``: the content appears whole or not at all."""

import numpy as np
import pytest

from dca_theory.io import atomic_file, atomic_write_text


def test_an_error_mid_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_file(target) as fh:
        fh.write("half")
        raise RuntimeError
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_binary_content_replaces_the_file_readable_by_others(tmp_path):
    target = tmp_path / "a.npz"
    with atomic_file(target, "wb") as fh:
        np.savez(fh, x=np.arange(4))
    np.testing.assert_array_equal(np.load(target)["x"], np.arange(4))
    assert target.stat().st_mode & 0o777 == 0o644
