"""The evidence experiment's corpora (``dca_theory.lm.data`` with the files of
``dca_theory.lm.corpus_files``): PTB by character, the CPython standard library by byte and by
byte-level BPE."""

from __future__ import annotations

import hashlib
import lzma
import shutil

import numpy as np
import pytest

from dca_theory.lm import corpus_files
from dca_theory.lm import data as lm_data


def test_ptb_char_sizes_and_vocabulary(data_dir):
    c = lm_data.load_corpus("ptb-char", data_dir)
    # one token per character of the three files (ASCII: characters = bytes of the README)
    assert (len(c.train), len(c.valid), len(c.test)) == (5_101_618, 399_782, 449_945)
    assert c.vocab_size == 50 and {"\n", " ", "N", "<", ">"} <= set(c.tokenizer.vocab)
    line = (data_dir / "ptb" / "ptb.valid.txt").read_text().splitlines(keepends=True)[0]
    assert c.tokenizer.decode(c.valid[: len(line)]) == line


def test_ptb_char_rejects_a_character_outside_the_training_vocabulary(tmp_path, data_dir,
                                                                       monkeypatch):
    shutil.copytree(data_dir / "ptb", tmp_path / "ptb")
    target = tmp_path / "ptb" / "ptb.test.txt"
    target.chmod(0o644)
    target.write_text(target.read_text() + "É\n")
    monkeypatch.setitem(lm_data.SHA256, "ptb/ptb.test.txt",
                        hashlib.sha256(target.read_bytes()).hexdigest())
    with pytest.raises(ValueError, match=r"ptb/ptb\.test\.txt holds characters \['É'\] that "
                                         r"are not in the 50-character vocabulary"):
        lm_data.load_corpus("ptb-char", tmp_path)


def test_python_stdlib_is_byte_level_with_the_readme_sizes(data_dir):
    c = lm_data.load_corpus("python-stdlib", data_dir)
    assert c.vocab_size == 256
    assert (len(c.train), len(c.valid), len(c.test)) == (28_014_268, 2_368_080, 1_191_749)
    assert c.train.dtype == np.int32 and 0 <= c.train.min() and c.train.max() <= 255
    assert c.tokenizer.decode(c.train[:8]) == "# file: "


def _fake_stdlib(root, texts: dict[str, str], monkeypatch) -> None:
    folder = root / lm_data.STDLIB_DIR
    folder.mkdir(parents=True)
    for split, text in texts.items():
        raw = text.encode("utf-8")
        (folder / f"{split}.txt.xz").write_bytes(lzma.compress(raw))
        monkeypatch.setitem(lm_data.SHA256, f"{lm_data.STDLIB_DIR}/{split}.txt.xz",
                            hashlib.sha256(raw).hexdigest())


def test_stdlib_bad_checksum_names_the_file(tmp_path, monkeypatch):
    _fake_stdlib(tmp_path, {s: f"x = {s!r}\n" for s in corpus_files.SPLITS}, monkeypatch)
    monkeypatch.setitem(lm_data.SHA256, "python-stdlib/valid.txt.xz", "0" * 64)
    with pytest.raises(ValueError, match=r"checksum mismatch for .*python-stdlib/valid\.txt\.xz "
                                         r"\(decompressed\): expected sha256 0{64}, got "
                                         r"[0-9a-f]{64}"):
        lm_data.load_corpus("python-stdlib", tmp_path)


def test_stdlib_missing_file_says_where_it_looked(tmp_path):
    (tmp_path / "python-stdlib").mkdir()
    with pytest.raises(FileNotFoundError, match=r"train\.txt\.xz not found \(looked in "
                                                r".*python-stdlib\)"):
        lm_data.load_corpus("python-stdlib", tmp_path)


def test_stdlib_corrupt_xz_is_a_one_line_error(tmp_path, monkeypatch):
    _fake_stdlib(tmp_path, {s: "pass\n" for s in corpus_files.SPLITS}, monkeypatch)
    (tmp_path / "python-stdlib" / "train.txt.xz").write_bytes(b"not xz at all")
    with pytest.raises(ValueError, match=r"train\.txt\.xz is not a valid xz file"):
        lm_data.load_corpus("python-stdlib", tmp_path)


def test_stdlib_bpe_round_trips_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(corpus_files.CACHE_ENV, str(tmp_path / "cache"))
    code = "".join(f"def f{i}(x):\n    return x * {i}  # café ✓\n" for i in range(300))
    texts = {"train": code, "valid": code[:500], "test": code[-400:]}
    _fake_stdlib(tmp_path / "data", texts, monkeypatch)
    c = lm_data.load_corpus("python-stdlib-bpe", tmp_path / "data", bpe_vocab_size=300)
    assert c.vocab_size <= 300 and len(c.train) < len(code) / 2  # merges shorten the text
    for split, text in texts.items():  # byte-level BPE is lossless
        assert c.tokenizer.decode(c.split(split)) == text
    # the second load reads the cache: neither trains nor encodes
    monkeypatch.setattr(lm_data, "train_bpe", lambda *a: pytest.fail("retrained"))
    again = lm_data.load_corpus("python-stdlib-bpe", tmp_path / "data", bpe_vocab_size=300)
    np.testing.assert_array_equal(again.train, c.train)
    assert list((tmp_path / "cache").iterdir())[0].name.startswith("python-stdlib-bpe300-")


def test_byte_tokenizer_round_trips_utf8():
    tok = lm_data.Tokenizer(kind="byte")
    text = "naïve — ✓\n"
    ids = tok.encode(text)
    assert tok.vocab_size == 256 and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
