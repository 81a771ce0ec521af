"""Training configuration: a frozen dataclass whose defaults are the paper's recipe.

Paper §3.3 / Flax lm1b example (``shared/reference/dca-paper.md``): AdamW with β1 = 0.9,
β2 = 0.98, eps = 1e-9, weight decay 0.1; learning rate 0.0016 with 1000 linear warm-up steps,
then inverse square root decay; 2048 sequences per batch. ``TRAIN_PRESETS["tiny"]`` shrinks the
run so that it finishes in minutes on a 2-core CPU (short warm-up, small batch, frequent eval).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

COMPUTE_DTYPES: tuple[str, ...] = ("float32", "bfloat16")


@dataclass(frozen=True)
class LMTrainConfig:
    """Everything about a training run except the model.

    ``seq_len=None`` uses the model's ``max_len``. ``batch_size`` is the global batch (summed
    over devices and accumulation micro-batches); ``grad_accum`` splits it into that many
    sequential micro-batches whose gradients are summed before one optimiser step.
    ``eval_batches=None`` scores the whole split; periodic evaluations can use fewer batches,
    the final one always uses the whole split. ``clip_norm=None`` disables clipping.
    """

    data: str = "ptb"
    data_dir: str | None = None
    bpe_vocab_size: int = 8192
    seq_len: int | None = None
    batch_size: int = 2048
    steps: int = 500_000
    grad_accum: int = 1
    lr: float = 0.0016
    warmup_steps: int = 1000
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-9
    weight_decay: float = 0.1
    clip_norm: float | None = None
    compute_dtype: str = "float32"
    seed: int = 0
    log_every: int = 100
    eval_every: int = 1000
    eval_batches: int | None = 20
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    fsdp: bool = False
    progress: bool = True

    def replace(self, **changes) -> LMTrainConfig:
        return dataclasses.replace(self, **changes)

    def validate(self) -> LMTrainConfig:
        """Raise a one-line ValueError naming the first bad field and its valid range."""
        positive = ("batch_size", "steps", "grad_accum", "log_every", "eval_every",
                    "checkpoint_every", "keep_checkpoints", "bpe_vocab_size")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("data", "compute_dtype"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.data_dir is not None and not isinstance(self.data_dir, str):
            raise ValueError(f"data_dir must be a string or None, got {self.data_dir!r}")
        for name in ("fsdp", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("seq_len", "eval_batches", "warmup_steps", "seed"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if not 0 <= self.seed < 2**31:  # numpy's SeedSequence and PRNGKey both accept these
            raise ValueError(f"seed must be in [0, 2**31), got {self.seed}")
        for name in ("lr", "b1", "b2", "eps", "weight_decay", "clip_norm"):
            value = getattr(self, name)
            if value is None and name == "clip_norm":
                continue
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.seq_len is not None and self.seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {self.seq_len}")
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ValueError(f"eval_batches must be >= 1 or None, got {self.eval_batches}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by grad_accum "
                             f"{self.grad_accum}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("b1", "b2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0 or self.weight_decay < 0:
            raise ValueError(f"need eps > 0 and weight_decay >= 0, got {self.eps}, "
                             f"{self.weight_decay}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0 or None, got {self.clip_norm}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got "
                             f"{self.compute_dtype!r}")
        return self


TRAIN_PRESETS: dict[str, LMTrainConfig] = {
    # The paper's LM1B recipe (500k steps of 2048 x 128 tokens): for accelerators.
    "paper": LMTrainConfig(),
    # A few minutes on a 2-core CPU with the tiny model: validation perplexity visibly falls.
    "tiny": LMTrainConfig(batch_size=32, steps=600, warmup_steps=100, log_every=20,
                          eval_every=100, eval_batches=20, checkpoint_every=200),
}
