"""The files of an LM run directory besides its checkpoints: ``config.json`` (read and validated),
``metrics.jsonl`` (read, truncated on resume, appended), the corpus fingerprint, and the clean-up
of a start that failed before its first checkpoint.

Everything here raises one-line ``ValueError``s that name the file (and the line of a JSON-lines
file), so the CLI can print them as they are.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

from dca_theory.io import atomic_write_text, read_json, to_jsonable
from dca_theory.lm import data as lm_data
from dca_theory.lm import distributed
from dca_theory.lm.checkpoint import Checkpointer
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.train_config import LMTrainConfig

# Settings that may change when a run is resumed: how long it trains, where the data lives,
# how often it logs, evaluates and checkpoints, and the peak learning rate (a diverged run
# continues from its last good checkpoint at a lower rate; the change is logged in
# metrics.jsonl). Everything else defines the run.
RESUMABLE_CHANGES: tuple[str, ...] = (
    "steps", "data_dir", "progress", "fsdp", "log_every", "eval_every", "eval_batches",
    "checkpoint_every", "keep_checkpoints", "lr")
CONFIG_KEYS: tuple[str, ...] = ("model", "train", "corpus_sha256")


def check_workdir(workdir: Path) -> None:
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"workdir {workdir} is a file, not a directory; choose another --workdir")


def holds_run(workdir: Path) -> bool:
    """A run can be resumed only from a finished checkpoint; ``config.json`` alone (a start
    killed before its first checkpoint) is started afresh."""
    folder = workdir / "checkpoints"
    return (workdir / "config.json").is_file() and folder.is_dir() and any(
        p.name.isdigit() for p in folder.iterdir())


# ----------------------------------------------------------------------------- config.json


def normalise_data(data: str) -> str:
    """A corpus file as an absolute path (a relative path to the same file resumes); names
    that are not files stay as given, for :func:`lm_data.load_corpus` to judge."""
    path = Path(data).expanduser()
    return str(path.resolve()) if data not in lm_data.KNOWN_CORPORA and path.is_file() else data


def corpus_fingerprint(data: str) -> str | None:
    """sha256 of a corpus file (the known corpora are checked against fixed sums)."""
    path = Path(data)
    return lm_data.sha256_of(path) if data not in lm_data.KNOWN_CORPORA and path.is_file() else None


def config_record(model_cfg: ModelConfig, train_cfg: LMTrainConfig,
                  corpus_sha256: str | None) -> dict:
    return {"model": to_jsonable(model_cfg), "train": to_jsonable(train_cfg),
            "corpus_sha256": corpus_sha256}


def _build(cls, values, path: Path, section: str):
    if not isinstance(values, dict):
        raise ValueError(f"{path}: '{section}' must be an object, got {type(values).__name__}")
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"{path}: unknown {section} key {unknown[0]!r}; valid: "
                         f"{', '.join(fields)}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {section}: {err}") from None


def load_record(workdir: str | Path) -> tuple[ModelConfig, LMTrainConfig, str | None]:
    """The run's configs and corpus fingerprint, validated as the CLI flags are."""
    path = Path(workdir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no training run in {workdir} (missing {path})")
    record = read_json(path)
    if not isinstance(record, dict):
        raise ValueError(f"{path}: expected an object with keys {', '.join(CONFIG_KEYS)}")
    unknown = sorted(set(record) - set(CONFIG_KEYS))
    missing = [k for k in ("model", "train") if k not in record]
    if unknown or missing:
        bad = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
        raise ValueError(f"{path}: {bad}; valid: {', '.join(CONFIG_KEYS)}")
    model_cfg = _build(ModelConfig, record["model"], path, "model")
    train_cfg = _build(LMTrainConfig, record["train"], path, "train")
    try:
        train_cfg.validate()
    except ValueError as err:
        raise ValueError(f"{path}: train: {err}") from None
    sha = record.get("corpus_sha256")
    if sha is not None and not isinstance(sha, str):
        raise ValueError(f"{path}: corpus_sha256 must be a string or null, got {sha!r}")
    return model_cfg, train_cfg, sha


def check_resume_compatible(workdir: Path, model_cfg: ModelConfig, train_cfg: LMTrainConfig,
                            corpus_sha256: str | None) -> None:
    """Refuse (one line, naming the stored values) to resume a run with other settings."""
    saved_model, saved_train, saved_sha = load_record(workdir)
    diffs = [(f"model.{k}", v, getattr(model_cfg, k)) for k, v in vars(saved_model).items()
             if getattr(model_cfg, k) != v]
    saved_data = normalise_data(saved_train.data)
    diffs += [(f"train.{k}", v, getattr(train_cfg, k)) for k, v in vars(saved_train).items()
              if k not in RESUMABLE_CHANGES and k != "data" and getattr(train_cfg, k) != v]
    if saved_data != train_cfg.data:
        diffs.append(("train.data", saved_data, train_cfg.data))
    if diffs:
        listed = ", ".join(f"{name} (stored {old!r}, given {new!r})" for name, old, new in diffs)
        raise ValueError(f"workdir {workdir} holds a run with a different {listed}; resume with "
                         "the same settings or choose a new --workdir")
    if saved_sha is not None and corpus_sha256 != saved_sha:
        raise ValueError(f"corpus {train_cfg.data} changed since the run in {workdir} started "
                         f"(sha256 {corpus_sha256}, stored {saved_sha}); restore the file or "
                         "choose a new --workdir")


def check_checkpoints_match(workdir: Path, model_cfg: ModelConfig, ckpt: Checkpointer) -> None:
    """A ``config.json`` edited after the checkpoints were written (another residual, another
    width) is named with the field and both values; otherwise every checkpoint would fail to
    restore and be blamed. Checkpoints record their model config (older ones do not: skipped)."""
    current = to_jsonable(model_cfg)
    for step in ckpt.steps()[::-1]:
        saved = (ckpt.meta(step) or {}).get("model")
        if not isinstance(saved, dict):
            continue
        for key in sorted(saved):
            if key in current and saved[key] != current[key]:
                raise ValueError(f"{Path(workdir) / 'config.json'}: model.{key} is "
                                 f"{current[key]!r} but checkpoint step {step} was trained with "
                                 f"{saved[key]!r}; restore config.json (the checkpoints are "
                                 "intact)")
        return


# ----------------------------------------------------------------------------- metrics.jsonl


def read_metrics(path: Path) -> list[dict]:
    """Every record of ``metrics.jsonl``. An unterminated, unreadable last line is what a kill
    during a write leaves: it is dropped. Any other bad line is an error naming the line."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines) and not text.endswith("\n"):
                break  # the partial line of an interrupted append
            raise ValueError(f"{path} line {number}: not valid JSON ({err.msg}); fix or delete "
                             "that line") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path} line {number}: expected an object with an integer 'step'")
        for key, value in record.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{path} line {number}: {key} must be a number, got "
                                 f"{value!r}; fix or delete that line")
        records.append(record)
    return records


def check_history(path: Path, records: list[dict], start: int, steps: int) -> None:
    """Refuse to resume from step ``start`` without the history that the checkpoint continues
    (a fresh start creates ``metrics.jsonl`` at once, so a missing file was removed): training
    losses cannot be rebuilt from a checkpoint, and a summary without them would claim NaN."""
    if start == 0:
        return
    remedy = ("restore it, or train afresh in another --workdir (the checkpoints here are "
              "kept)")
    if not path.is_file():
        raise ValueError(f"{path} is missing but the run has a checkpoint at step {start}; "
                         f"{remedy}")
    if start == steps and not any(r["step"] == start and "loss" in r for r in records):
        raise ValueError(f"{path} has no training loss at step {start}, the run's last step "
                         f"(the file was cut short or edited); {remedy}")


def rewrite_metrics(path: Path, keep: Callable[[dict], bool], *, write: bool = True) -> list[dict]:
    """Atomically keep only the records for which ``keep`` is true; returns them (and only
    reads, if not ``write``: a process other than process 0)."""
    records = [r for r in read_metrics(path) if keep(r)]
    if write and path.is_file():
        atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return records


def append_metrics(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(to_jsonable(record), sort_keys=True) + "\n")


def logged_eval(records: list[dict], step: int, split: str) -> dict | None:
    """The evaluation of ``split`` at ``step`` if the history holds a complete one."""
    for r in records:
        if r["step"] == step and all(f"{split}_{k}" in r for k in ("loss", "ppl", "tokens")):
            loss = float(r[f"{split}_loss"])
            if math.isfinite(loss):
                return {"loss": loss, "ppl": float(r[f"{split}_ppl"]),
                        "tokens": int(r[f"{split}_tokens"])}
    return None


# ----------------------------------------------------------------------------- resume, failures


def resume(workdir: Path, train_cfg: LMTrainConfig, template, *,
           move_damaged: bool = True) -> tuple[int, object]:
    """Restore the newest checkpoint that restores cleanly; move damaged newer ones aside (to
    ``damaged_checkpoints/``, never deleted) so that the resumed run can save those steps.
    Of several processes, all restore and only process 0 (``move_damaged``) moves, once every
    process has restored."""
    ckpt = Checkpointer(workdir, keep=train_cfg.keep_checkpoints, seed_stacked=True)
    try:
        for folder in ckpt.unfinished():
            print(f"ignoring {folder}: a checkpoint save that a kill interrupted (never restored)")
        check_checkpoints_match(workdir, load_record(workdir)[0], ckpt)
        start, state, meta = ckpt.restore_newest(template)
        damaged = [s for s in ckpt.steps() if s > start]
    finally:
        ckpt.close()
    if meta["data_step"] != start:
        raise ValueError(f"checkpoint step {start} in {ckpt.directory} records data position "
                         f"{meta['data_step']}; it does not belong to this run")
    distributed.barrier("lm-resume-restored")
    for step in damaged if move_damaged else ():
        target = workdir / "damaged_checkpoints" / str(step)
        while target.exists():
            target = target.with_name(target.name + "+")
        target.parent.mkdir(exist_ok=True)
        (ckpt.directory / str(step)).rename(target)
        print(f"moved the damaged checkpoint step {step} to {target} (kept, not deleted)")
    print(f"resuming from step {start} of {train_cfg.steps} in {workdir}")
    return start, state


def out_of_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or (
        "RESOURCE_EXHAUSTED" in str(err)[:2000] and not disk_full(err))


def disk_full(err: BaseException) -> bool:
    """ENOSPC, raised by Python or reported by TensorStore (which calls it RESOURCE_EXHAUSTED)."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    text = str(err)[:4000]
    return "No space left on device" in text or "os_error_code='28'" in text


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:160]


def memory_message(err: BaseException, workdir: Path, ckpt, finished: bool) -> str:
    if not finished:
        return (f"out of memory before the first checkpoint ({_first_line(err)}); nothing was "
                f"kept in {workdir}: retry with a smaller --batch-size or more --grad-accum")
    return (f"out of memory ({_first_line(err)}); the run in {workdir} resumes from its newest "
            f"checkpoint (step {max(ckpt.steps())}) with the same command, or remove it with: "
            f"rm -r {workdir}")


def disk_full_message(workdir: Path, ckpt, finished: bool) -> str:
    if not finished:
        return (f"disk full (no space left on device) before the first checkpoint; nothing was "
                f"kept in {workdir}: free some space or choose a --workdir on another disk")
    return (f"disk full (no space left on device); the run in {workdir} resumes from its "
            f"newest checkpoint (step {max(ckpt.steps())}) with the same command once space "
            "is freed")


class StartFiles:
    """Remembers what a fresh start creates so that a start failing before its first
    checkpoint can remove exactly that (never files that were there before)."""

    NAMES = ("config.json", "tokenizer.json", "metrics.jsonl", "checkpoints")

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.new_dir = not workdir.exists()
        self.new = [n for n in self.NAMES if not (workdir / n).exists()]
        self.new += [n for n in ("config.json", "tokenizer.json", "metrics.jsonl")
                     if n not in self.new]  # stale files of a start killed before: replaced

    def remove(self) -> None:
        for name in self.new:
            target = self.workdir / name
            if target.is_dir():
                if not any(p.name.isdigit() for p in target.iterdir()):
                    shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        if self.new_dir:
            try:
                self.workdir.rmdir()  # only if empty
            except OSError:
                pass
