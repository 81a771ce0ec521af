"""Corpora, tokenizers and batching (``dca_theory.lm.data``)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from dca_theory.lm import data as lm_data


@pytest.fixture(scope="module")
def ptb(data_dir):
    return lm_data.load_corpus("ptb", data_dir)


def test_ptb_is_the_standard_mikolov_split(ptb):
    # Published sizes of the Mikolov PTB split (shared/data/README.md): 10k vocabulary and
    # 929k / 73k / 82k tokens including one <eos> per line.
    assert ptb.vocab_size == 10_000
    assert {"<unk>", "<eos>", "N"} <= set(ptb.tokenizer.vocab)
    assert (len(ptb.train), len(ptb.valid), len(ptb.test)) == (929_589, 73_760, 82_430)
    for split in (ptb.train, ptb.valid, ptb.test):
        assert split.dtype == np.int32 and split.min() >= 0 and split.max() < 10_000


def test_word_tokenizer_round_trips_a_ptb_line(ptb, data_dir):
    line = (data_dir / "ptb" / "ptb.valid.txt").read_text().splitlines()[3]
    ids = ptb.tokenizer.encode(line)
    assert ids[-1] == ptb.tokenizer.vocab.index("<eos>")
    assert ptb.tokenizer.decode(ids).split() == line.split()


def test_shakespeare_char_level_90_5_5(data_dir):
    c = lm_data.load_corpus("shakespeare", data_dir)
    total = len(c.train) + len(c.valid) + len(c.test)
    assert c.vocab_size == 65 and total == 1_115_394  # one token per character
    assert len(c.train) == int(total * 0.9) and len(c.valid) == int(total * 0.95) - len(c.train)
    assert c.tokenizer.decode(c.train[:14]) == "First Citizen:"


def test_bpe_on_any_utf8_file_round_trips_and_reloads(tmp_path):
    text = "".join(f"Grüße {i}, naïve café — ✓ line {i % 7}\n" for i in range(400))
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    c = lm_data.load_corpus(str(path), bpe_vocab_size=300)
    assert c.vocab_size <= 300
    # byte-level BPE is lossless on arbitrary UTF-8
    assert c.tokenizer.decode(c.train) + c.tokenizer.decode(c.valid) + \
        c.tokenizer.decode(c.test) == text
    c.tokenizer.save(tmp_path / "tok.json")
    again = lm_data.Tokenizer.load(tmp_path / "tok.json")
    np.testing.assert_array_equal(again.encode(text), c.tokenizer.encode(text))


# ----------------------------------------------------------------------------- bad input


def test_missing_data_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        lm_data.load_corpus("ptb", tmp_path / "nowhere")


def test_missing_file_says_where_it_looked(tmp_path):
    (tmp_path / "ptb").mkdir()
    with pytest.raises(FileNotFoundError, match=r"ptb\.train\.txt not found \(looked in .*ptb"):
        lm_data.load_corpus("ptb", tmp_path)


def test_wrong_checksum_names_file_expected_and_actual(tmp_path, data_dir):
    shutil.copytree(data_dir / "tinyshakespeare", tmp_path / "tinyshakespeare")
    target = tmp_path / "tinyshakespeare" / "input.txt"
    target.chmod(0o644)
    target.write_text(target.read_text() + "extra\n")
    with pytest.raises(ValueError, match=r"checksum mismatch for .*input\.txt: expected sha256 "
                                         r"86c4e6aa.*, got [0-9a-f]{64}"):
        lm_data.load_corpus("shakespeare", tmp_path)


def test_empty_and_non_utf8_files(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        lm_data.load_corpus(str(empty))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café au lait\n".encode("latin-1"))
    with pytest.raises(ValueError, match="not valid UTF-8 .*offset 3"):
        lm_data.load_corpus(str(latin1))


def test_unknown_corpus_and_missing_text_file(tmp_path):
    with pytest.raises(ValueError, match="unknown corpus 'wiki'"):
        lm_data.load_corpus("wiki")
    with pytest.raises(FileNotFoundError, match="missing.txt not found"):
        lm_data.load_corpus(str(tmp_path / "missing.txt"))


def test_seq_len_longer_than_data():
    tok = lm_data.Tokenizer(kind="char", vocab=("a", "b"))
    c = lm_data.Corpus("toy", tok, np.zeros(100, np.int32), np.zeros(10, np.int32),
                       np.zeros(50, np.int32))
    lm_data.check_seq_len(c, 9)
    with pytest.raises(ValueError, match="seq_len 10 is longer than the valid split .*10 tokens"):
        lm_data.check_seq_len(c, 10)


# ----------------------------------------------------------------------------- batching


def test_train_batches_are_contiguous_windows_determined_by_seed_and_step():
    tokens = np.arange(1000, dtype=np.int32)  # token value = its position
    b = lm_data.train_batch(tokens, seq_len=16, batch_size=8, seed=3, step=7)
    assert b["inputs"].shape == (8, 16) and b["inputs"].dtype == np.int32
    np.testing.assert_array_equal(b["targets"], b["inputs"] + 1)  # next token
    np.testing.assert_array_equal(np.diff(b["inputs"], axis=1), 1)  # contiguous windows
    again = lm_data.train_batch(tokens, seq_len=16, batch_size=8, seed=3, step=7)
    np.testing.assert_array_equal(again["inputs"], b["inputs"])
    other = lm_data.train_batch(tokens, seq_len=16, batch_size=8, seed=3, step=8)
    assert not np.array_equal(other["inputs"], b["inputs"])


def test_train_windows_reach_both_ends_of_the_stream():
    tokens = np.arange(20, dtype=np.int32)
    starts = np.concatenate([lm_data.train_batch(tokens, seq_len=4, batch_size=64, seed=0,
                                                 step=s)["inputs"][:, 0] for s in range(4)])
    assert starts.min() == 0 and starts.max() == 20 - 4 - 1  # last window ends at token 19


@pytest.mark.parametrize("n", [2, 37, 64, 65])
def test_eval_batches_score_every_target_exactly_once(n):
    tokens = np.arange(100, 100 + n, dtype=np.int32)
    scored = [b["targets"][b["weights"] > 0] for b in
              lm_data.eval_batches(tokens, seq_len=8, batch_size=4)]
    np.testing.assert_array_equal(np.concatenate(scored), tokens[1:])
    for b in lm_data.eval_batches(tokens, seq_len=8, batch_size=4):
        real = b["weights"] > 0
        np.testing.assert_array_equal(b["targets"][real], b["inputs"][real] + 1)
