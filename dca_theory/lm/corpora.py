r"""The corpora of the evidence experiment (issue 16): PTB at character level and the CPython
standard library at byte and subword level. :func:`dca_theory.lm.data.load_corpus` dispatches
the names here; the word-level PTB and Tiny Shakespeare stay in :mod:`dca_theory.lm.data`.

* ``"ptb-char"``: the three PTB files read as characters (newlines included, so a line end is
  one symbol as ``<eos>`` is one word). The vocabulary is the 50 characters of the training
  file, sorted; a character of the validation or test file outside it is an error naming the
  file, not an unknown symbol (the shipped files have none, which the tests check), so the
  scored text is exactly the files' text.
* ``"python-stdlib"``: the decompressed sources at **byte** level (256 symbols). Code mixes
  ASCII with rare non-ASCII characters (the test suite's Unicode tables); a character
  vocabulary would hold thousands of symbols seen a handful of times, whose embeddings never
  train, and would need a rule for unseen ones. Bytes need neither, are lossless, and make the
  token counts the README's decompressed sizes.
* ``"python-stdlib-bpe"``: the same text through a byte-level BPE (Hugging Face
  ``tokenizers``, the size given by ``bpe_vocab_size``), trained on the first
  :data:`BPE_TRAIN_CHARS` characters of the training split (training on all 28M characters
  takes minutes; the prefix gives the same frequent merges). The trained tokenizer and the
  encoded splits are cached in :func:`cache_dir` under a name that holds the vocabulary size
  and the training file's checksum, so a second load skips both training and encoding.

Every file is verified by the sha256 in :data:`dca_theory.lm.data.SHA256` (of the decompressed
text for the ``.xz`` files) with a one-line error naming the file.
"""

from __future__ import annotations

import lzma
import os
from pathlib import Path

import numpy as np

from dca_theory.lm.data import SHA256, Corpus, Tokenizer, read_text, train_bpe

SPLITS: tuple[str, ...] = ("train", "valid", "test")
STDLIB_DIR = "python-stdlib"
BPE_TRAIN_CHARS = 4_000_000
CACHE_ENV = "DCA_CACHE_DIR"


def cache_dir() -> Path:
    """Where derived data (trained tokenizers, encoded splits) is kept: ``$DCA_CACHE_DIR`` or
    ``~/.cache/dca_theory/derived`` (never the repository, never the read-only data folder)."""
    explicit = os.environ.get(CACHE_ENV)
    return Path(explicit) if explicit else Path.home() / ".cache" / "dca_theory" / "derived"


def read_xz_bytes(path: Path, *, expected_sha256: str) -> bytes:
    """The decompressed bytes of an ``.xz`` file, checked against the sha256 of the
    decompressed text; one-line errors for a missing, corrupt or wrong-checksum file."""
    import hashlib

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} not found (looked in {path.parent})")
    try:
        raw = lzma.decompress(path.read_bytes())
    except lzma.LZMAError as err:
        raise ValueError(f"corpus file {path} is not a valid xz file ({err})") from None
    actual = hashlib.sha256(raw).hexdigest()
    if actual != expected_sha256:
        raise ValueError(f"checksum mismatch for {path} (decompressed): expected sha256 "
                         f"{expected_sha256}, got {actual}")
    return raw


def load_ptb_char(root: Path) -> Corpus:
    texts = {s: read_text(root / "ptb" / f"ptb.{s}.txt",
                          expected_sha256=SHA256[f"ptb/ptb.{s}.txt"]) for s in SPLITS}
    tok = Tokenizer(kind="char", vocab=tuple(sorted(set(texts["train"]))))
    index = {c: i for i, c in enumerate(tok.vocab)}
    ids = {}
    for s, text in texts.items():
        unknown = sorted(set(text) - index.keys())
        if unknown:
            raise ValueError(f"ptb/ptb.{s}.txt holds characters {unknown!r} that are not in "
                             f"the {len(index)}-character vocabulary of ptb/ptb.train.txt")
        ids[s] = tok.encode(text)
    return Corpus("ptb-char", tok, ids["train"], ids["valid"], ids["test"])


def _stdlib_bytes(root: Path) -> dict[str, bytes]:
    return {s: read_xz_bytes(root / STDLIB_DIR / f"{s}.txt.xz",
                             expected_sha256=SHA256[f"{STDLIB_DIR}/{s}.txt.xz"])
            for s in SPLITS}


def load_stdlib_bytes(root: Path) -> Corpus:
    raw = _stdlib_bytes(root)
    ids = {s: np.frombuffer(b, dtype=np.uint8).astype(np.int32) for s, b in raw.items()}
    return Corpus("python-stdlib", Tokenizer(kind="byte"), ids["train"], ids["valid"],
                  ids["test"])


def load_stdlib_bpe(root: Path, vocab_size: int) -> Corpus:
    """Byte-level BPE over the standard library; trained once, then read from the cache."""
    key = f"python-stdlib-bpe{vocab_size}-{SHA256[f'{STDLIB_DIR}/train.txt.xz'][:12]}"
    folder = cache_dir() / key
    tok_path, ids_path = folder / "tokenizer.json", folder / "ids.npz"
    if tok_path.is_file() and ids_path.is_file():
        with np.load(ids_path) as f:
            ids = {s: f[s] for s in SPLITS}
        return Corpus("python-stdlib-bpe", Tokenizer.load(tok_path), ids["train"],
                      ids["valid"], ids["test"])
    texts = {s: b.decode("utf-8") for s, b in _stdlib_bytes(root).items()}
    tok = train_bpe(texts["train"][:BPE_TRAIN_CHARS], vocab_size)
    ids = {s: tok.encode(t) for s, t in texts.items()}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"ids.{os.getpid()}.npz"
    np.savez(tmp, **ids)
    tmp.replace(ids_path)  # atomic: a concurrent reader sees the whole file or none
    tok.save(tok_path)
    return Corpus("python-stdlib-bpe", tok, ids["train"], ids["valid"], ids["test"])


def load(name: str, root: Path, *, bpe_vocab_size: int) -> Corpus:
    """One of :data:`dca_theory.lm.data.EVIDENCE_CORPORA` from the data folder ``root``."""
    if name == "ptb-char":
        return load_ptb_char(root)
    if name == "python-stdlib":
        return load_stdlib_bytes(root)
    if name == "python-stdlib-bpe":
        return load_stdlib_bpe(root, bpe_vocab_size)
    raise ValueError(f"unknown corpus {name!r}; valid: ptb-char, python-stdlib, "
                     "python-stdlib-bpe")
