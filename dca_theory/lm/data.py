r"""Language-modelling corpora, tokenizers and deterministic batching.

Sources of real text, each a :class:`Corpus` of three integer token streams
(train / valid / test) plus the :class:`Tokenizer` that produced them:

* ``"ptb"``: Penn Treebank, Mikolov split, word level. Tokens are whitespace-separated words
  with ``<eos>`` appended at each line end; the vocabulary is built from the training split
  (10,000 words including ``<unk>`` and ``<eos>``), most frequent first, ties alphabetical.
* ``"shakespeare"``: Tiny Shakespeare, character level (65 symbols, vocabulary from the whole
  file). The last 10 % of characters are held out: the first 5 % of that tail is the
  validation split, the last 5 % the test split.
* ``"ptb-char"``: the three PTB files read as characters (newlines included, so a
  line end is one symbol as ``<eos>`` is one word). The vocabulary is the 50 characters of the
  training file, sorted; a character of the validation or test file outside it is an error
  naming the file, not an unknown symbol (the shipped files have none, which the tests check),
  so the scored text is exactly the files' text.
* ``"python-stdlib"``: the CPython standard library's decompressed sources by **byte** (256
  symbols). Code mixes ASCII with rare non-ASCII characters (the test suite's Unicode tables);
  a character vocabulary would hold thousands of symbols seen a handful of times, whose
  embeddings never train, and would need a rule for unseen ones. Bytes need neither, are
  lossless, and make the token counts the README's decompressed sizes.
* ``"python-stdlib-bpe"``: the same text through a byte-level BPE of ``bpe_vocab_size``
  symbols trained on the first :data:`BPE_TRAIN_CHARS` characters of the training split (all
  28M take minutes; the prefix gives the same frequent merges). The tokenizer and the encoded
  splits are cached (:func:`dca_theory.lm.corpus_files.cache_dir`) under a name holding the
  vocabulary size and the training file's checksum: a second load neither trains nor encodes.
* a path to any UTF-8 text file: a byte-level BPE tokenizer (Hugging Face ``tokenizers``) is
  trained on the first 90 % of the file and saved with the run; valid / test are split as for
  Tiny Shakespeare.

The known corpora are verified by sha256 (values from ``shared/data/README.md``).

**Batching.** Training examples are random windows of ``seq_len + 1`` consecutive tokens of the
training stream (inputs = first ``seq_len``, targets = last ``seq_len``). The window starts of
step ``s`` depend only on ``(seed, s)``, so the data position of a run *is* its step: a
checkpoint that stores the step resumes the data stream exactly. Evaluation covers a split with
non-overlapping windows; the last, partial window is padded and masked out by ``weights`` so that
every token of the split is scored exactly once.
"""

from __future__ import annotations

import collections
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dca_theory.lm.corpus_files import (
    SPLITS,
    cache_dir,
    load_cached_ids,
    read_xz_bytes,
    save_cached_ids,
)
from dca_theory.paths import data_dir as resolve_data_dir

#: the evidence experiment's corpora
EVIDENCE_CORPORA: tuple[str, ...] = ("ptb-char", "python-stdlib", "python-stdlib-bpe")
KNOWN_CORPORA: tuple[str, ...] = ("ptb", "shakespeare", *EVIDENCE_CORPORA)
EOS, UNK = "<eos>", "<unk>"
PTB_VOCAB_SIZE = 10_000
BPE_TRAIN_CHARS = 4_000_000
STDLIB_DIR = "python-stdlib"

# sha256 of every file we read; a mismatch means a different (or corrupted) corpus.
SHA256: dict[str, str] = {
    "ptb/ptb.train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "ptb/ptb.valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "ptb/ptb.test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
    "tinyshakespeare/input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    # python-stdlib: of the decompressed text
    "python-stdlib/train.txt.xz":
        "dd2a43d1df516ef168980ab03b05dece4e5f9dffbdc78605fe696f4a8772a85a",
    "python-stdlib/valid.txt.xz":
        "300e5cbe22e3db89363a7852696ece341072457bd3a897a4a3cd68d12b69d629",
    "python-stdlib/test.txt.xz":
        "a896bdd038f803de63ada91e642e4f1e15a0319680e8db9f4a9233d307f9a0a2",
}


# ----------------------------------------------------------------------------- file reading


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_text(path: Path, *, expected_sha256: str | None = None) -> str:
    """Read a UTF-8 file; one-line errors for missing, wrong-checksum, empty, non-UTF-8 files."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"corpus file {path} is a directory, not a text file")
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} not found (looked in {path.parent})")
    if expected_sha256 is not None:
        actual = sha256_of(path)
        if actual != expected_sha256:
            raise ValueError(f"checksum mismatch for {path}: expected sha256 {expected_sha256}, "
                             f"got {actual}")
    raw = path.read_bytes()
    if not raw.strip():
        raise ValueError(f"corpus file {path} is empty")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"corpus file {path} is not valid UTF-8 (bad byte at offset "
                         f"{err.start})") from None


# ----------------------------------------------------------------------------- tokenizers


@dataclass(frozen=True)
class Tokenizer:
    """Word-, char-, byte- or BPE-level tokenizer; ``save``/``load`` round-trip through one
    JSON file.

    ``kind`` is ``"word"`` (tokens joined by spaces, ``<eos>`` shown as a newline), ``"char"``,
    ``"byte"`` (the 256 byte values of the UTF-8 text) or ``"bpe"`` (``spec`` holds the Hugging
    Face tokenizer JSON).
    """

    kind: str
    vocab: tuple[str, ...] = ()
    spec: str = ""

    @property
    def vocab_size(self) -> int:
        if self.kind == "byte":
            return 256
        return len(self.vocab) if self.kind != "bpe" else self._hf().get_vocab_size()

    def _hf(self):
        from tokenizers import Tokenizer as HFTokenizer

        return HFTokenizer.from_str(self.spec)

    def encode(self, text: str) -> np.ndarray:
        if self.kind == "bpe":
            return np.asarray(self._hf().encode(text).ids, dtype=np.int32)
        if self.kind == "byte":
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        index = {tok: i for i, tok in enumerate(self.vocab)}
        if self.kind == "char":
            unknown = sorted(set(text) - index.keys())
            if unknown:
                raise ValueError(f"characters {unknown!r} are not in the {len(index)}-symbol "
                                 "vocabulary")
            return np.asarray([index[c] for c in text], dtype=np.int32)
        unk = index[UNK]
        ids = []
        for line in text.splitlines():
            ids.extend(index.get(w, unk) for w in line.split())
            ids.append(index[EOS])
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if self.kind == "bpe":
            return self._hf().decode(ids)
        if self.kind == "byte":  # a window may cut a character: show it as U+FFFD
            return bytes(ids).decode("utf-8", errors="replace")
        toks = [self.vocab[i] for i in ids]
        if self.kind == "char":
            return "".join(toks)
        return " ".join(toks).replace(f" {EOS} ", "\n").replace(EOS, "\n")

    def save(self, path: Path) -> Path:
        from dca_theory.io import atomic_write_text

        return atomic_write_text(path, json.dumps(
            {"kind": self.kind, "vocab": list(self.vocab), "spec": self.spec}))

    @classmethod
    def load(cls, path: Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} not found")
        from dca_theory.io import read_json

        d = read_json(path)
        if not isinstance(d, dict) or not {"kind", "vocab", "spec"} <= d.keys():
            raise ValueError(f"{path}: expected an object with keys kind, vocab, spec")
        return cls(kind=d["kind"], vocab=tuple(d["vocab"]), spec=d["spec"])


def word_vocab(text: str, size: int | None = None) -> tuple[str, ...]:
    """Words by descending frequency (ties alphabetical), ``<eos>`` counted once per line."""
    counts = collections.Counter(text.split())
    counts[EOS] = len(text.splitlines())
    counts.setdefault(UNK, 0)
    words = sorted(counts, key=lambda w: (-counts[w], w))
    if size is not None:
        words = words[:size]
        if UNK not in words:
            words[-1] = UNK
    return tuple(words)


def train_bpe(text: str, vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer (lossless on any UTF-8 text) trained on ``text``."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"BPE vocab_size must be >= 257 (256 bytes + merges), got {vocab_size}")
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return Tokenizer(kind="bpe", spec=hf.to_str())


# ----------------------------------------------------------------------------- corpora


@dataclass(frozen=True)
class Corpus:
    """Token streams of one corpus (int32, 1-D) and the tokenizer that produced them."""

    name: str
    tokenizer: Tokenizer
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def split(self, name: str) -> np.ndarray:
        if name not in ("train", "valid", "test"):
            raise ValueError(f"unknown split {name!r}; valid: train, valid, test")
        return getattr(self, name)


def _tail_splits(n: int) -> tuple[int, int]:
    """Boundaries (train_end, valid_end) for 90 % / 5 % / 5 % splits of ``n`` symbols."""
    return int(n * 0.9), int(n * 0.95)


def load_ptb(root: Path) -> Corpus:
    texts = {s: read_text(root / "ptb" / f"ptb.{s}.txt",
                          expected_sha256=SHA256[f"ptb/ptb.{s}.txt"])
             for s in ("train", "valid", "test")}
    tok = Tokenizer(kind="word", vocab=word_vocab(texts["train"], PTB_VOCAB_SIZE))
    return Corpus("ptb", tok, *(tok.encode(texts[s]) for s in ("train", "valid", "test")))


def load_shakespeare(root: Path) -> Corpus:
    text = read_text(root / "tinyshakespeare" / "input.txt",
                     expected_sha256=SHA256["tinyshakespeare/input.txt"])
    tok = Tokenizer(kind="char", vocab=tuple(sorted(set(text))))
    ids = tok.encode(text)
    a, b = _tail_splits(len(ids))
    return Corpus("shakespeare", tok, ids[:a], ids[a:b], ids[b:])


def load_ptb_char(root: Path) -> Corpus:
    texts = {s: read_text(root / "ptb" / f"ptb.{s}.txt",
                          expected_sha256=SHA256[f"ptb/ptb.{s}.txt"]) for s in SPLITS}
    tok = Tokenizer(kind="char", vocab=tuple(sorted(set(texts["train"]))))
    for s, text in texts.items():
        unknown = sorted(set(text) - set(tok.vocab))
        if unknown:
            raise ValueError(f"ptb/ptb.{s}.txt holds characters {unknown!r} that are not in "
                             f"the {len(tok.vocab)}-character vocabulary of ptb/ptb.train.txt")
    return Corpus("ptb-char", tok, *(tok.encode(texts[s]) for s in SPLITS))


def _stdlib_bytes(root: Path) -> dict[str, bytes]:
    return {s: read_xz_bytes(root / STDLIB_DIR / f"{s}.txt.xz",
                             expected_sha256=SHA256[f"{STDLIB_DIR}/{s}.txt.xz"]) for s in SPLITS}


def load_stdlib_bytes(root: Path) -> Corpus:
    ids = {s: np.frombuffer(b, dtype=np.uint8).astype(np.int32)
           for s, b in _stdlib_bytes(root).items()}
    return Corpus("python-stdlib", Tokenizer(kind="byte"), *(ids[s] for s in SPLITS))


def load_stdlib_bpe(root: Path, vocab_size: int) -> Corpus:
    """Byte-level BPE over the standard library: trained once, then read from the cache."""
    folder = cache_dir() / (f"python-stdlib-bpe{vocab_size}-"
                            f"{SHA256[f'{STDLIB_DIR}/train.txt.xz'][:12]}")
    ids = load_cached_ids(folder)
    if ids is not None and (folder / "tokenizer.json").is_file():
        tok = Tokenizer.load(folder / "tokenizer.json")
    else:
        texts = {s: b.decode("utf-8") for s, b in _stdlib_bytes(root).items()}
        tok = train_bpe(texts["train"][:BPE_TRAIN_CHARS], vocab_size)
        ids = {s: tok.encode(t) for s, t in texts.items()}
        save_cached_ids(folder, ids)
        tok.save(folder / "tokenizer.json")
    return Corpus("python-stdlib-bpe", tok, *(ids[s] for s in SPLITS))


def load_text_file(path: Path, *, bpe_vocab_size: int,
                   tokenizer: Tokenizer | None = None) -> Corpus:
    """Any UTF-8 file through byte-level BPE; ``tokenizer`` reuses a saved one (resuming)."""
    text = read_text(path)
    a, b = _tail_splits(len(text))
    tok = tokenizer or train_bpe(text[:a], bpe_vocab_size)
    return Corpus(Path(path).name, tok, tok.encode(text[:a]), tok.encode(text[a:b]),
                  tok.encode(text[b:]))


def load_corpus(name: str, data_dir: str | Path | None = None, *, bpe_vocab_size: int = 8192,
                tokenizer: Tokenizer | None = None) -> Corpus:
    """``name`` is one of :data:`KNOWN_CORPORA` or a path to a UTF-8 text file."""
    if name in KNOWN_CORPORA:
        root = resolve_data_dir(data_dir)
        if name == "ptb-char":
            return load_ptb_char(root)
        if name == "python-stdlib":
            return load_stdlib_bytes(root)
        if name == "python-stdlib-bpe":
            return load_stdlib_bpe(root, bpe_vocab_size)
        return load_ptb(root) if name == "ptb" else load_shakespeare(root)
    path = Path(name)
    if path.is_file() or path.is_dir() or path.suffix or path.parent != Path("."):
        if path.is_dir():
            raise ValueError(f"text corpus {path} is a directory; give a UTF-8 text file")
        if not path.is_file():
            raise FileNotFoundError(f"text corpus {path} not found (looked in "
                                    f"{path.resolve().parent})")
        return load_text_file(path, bpe_vocab_size=bpe_vocab_size, tokenizer=tokenizer)
    raise ValueError(f"unknown corpus {name!r}; valid: {', '.join(KNOWN_CORPORA)} or a path to "
                     "a UTF-8 .txt file")


# ----------------------------------------------------------------------------- batching


def check_seq_len(corpus: Corpus, seq_len: int) -> None:
    """Every split must hold at least one window of ``seq_len + 1`` tokens."""
    sizes = {split: len(corpus.split(split)) for split in ("train", "valid", "test")}
    split = min(sizes, key=sizes.get)
    n = sizes[split]
    if n < 2:
        raise ValueError(f"the {split} split of {corpus.name} has {n} token(s); every split "
                         "needs at least 2 (valid and test are each 5 % of a text file): use a "
                         "longer corpus")
    if n < seq_len + 1:
        raise ValueError(f"seq_len {seq_len} is longer than the {split} split of "
                         f"{corpus.name} ({n} tokens); use seq_len <= {n - 1}")


def train_starts(n_tokens: int, *, seq_len: int, batch_size: int, seed: int,
                 step: int) -> np.ndarray:
    """The first token of every window of one step's batch; a pure function of ``(seed,
    step)``."""
    n_starts = n_tokens - seq_len
    if n_starts < 1:
        raise ValueError(f"seq_len {seq_len} is longer than the data ({n_tokens} tokens)")
    rng = np.random.default_rng(np.random.SeedSequence([seed, step]))
    return rng.integers(0, n_starts, size=batch_size)


def train_batch(tokens: np.ndarray, *, seq_len: int, batch_size: int, seed: int,
                step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    """Random windows for one step; a pure function of ``(seed, step)``. ``rows`` picks the
    rows of the batch to build (one process's share, the same windows as in the whole batch)."""
    starts_B = train_starts(len(tokens), seq_len=seq_len, batch_size=batch_size, seed=seed,
                            step=step)[rows]
    windows_BxL1 = tokens[starts_B[:, None] + np.arange(seq_len + 1)[None, :]]
    return {"inputs": windows_BxL1[:, :-1], "targets": windows_BxL1[:, 1:],
            "weights": np.ones((len(starts_B), seq_len), np.float32)}


def eval_batches(tokens: np.ndarray, *, seq_len: int, batch_size: int,
                 max_batches: int | None = None):
    """Non-overlapping windows covering the split; the tail is zero-padded with weight 0."""
    n_targets = len(tokens) - 1
    n_windows = -(-n_targets // seq_len)
    n_batches = -(-n_windows // batch_size)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    padded = np.zeros(n_batches * batch_size * seq_len + 1, np.int32)
    keep = min(len(tokens), len(padded))
    padded[:keep] = tokens[:keep]
    weights = np.zeros(len(padded) - 1, np.float32)
    weights[: keep - 1] = 1.0
    shape = (n_batches, batch_size, seq_len)
    inputs, targets = padded[:-1].reshape(shape), padded[1:].reshape(shape)
    weights = weights.reshape(shape)
    for i in range(n_batches):
        yield {"inputs": inputs[i], "targets": targets[i], "weights": weights[i]}
