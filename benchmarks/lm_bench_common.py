"""Shared set-up for the LM benchmarks: the variants, the train step, the machine record.

A *variant* is one residual scheme of the LM zoo at a given width and depth: ``vanilla`` (pre-LN
transformer), ``dca`` (full DCA, paper §3.2) and ``2-dca`` (k-DCA with k = 2, paper §3.1/§5,
Table 1), and the rivals ``attn_res``, ``mhc``, ``muddformer``, ``value_residual``
(:mod:`dca_theory.lm.rivals`, :mod:`dca_theory.lm.mhc`). The train step is the project's own
(``dca_theory.lm.steps.make_train_step``: forward, backward, AdamW update), jitted. (No buffer
donation: the DCA retrofit shares LayerNorm weights between LN_1 and LN_q/LN_k/LN_v, so one
buffer appears several times in the parameters.) Dropout is 0 by default so that random-number
generation (identical work for every variant) does not dilute the ratios; pass ``dropout`` to
change that.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import jax

from dca_theory import schemes
from dca_theory.io import atomic_write_text
from dca_theory.lab.steptime import synthetic_batch, train_step_setup  # noqa: F401 (re-export)
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.train_config import LMTrainConfig

# variant name -> (residual, k, grn_impl). The "-ref" variants run the straightforward GRN
# path (stacked array + combiner calls, autodiff backward) that the fused default replaced.
VARIANTS: dict[str, tuple[str, int | None, str]] = {
    "vanilla": ("vanilla", None, "fused"),
    "dca": ("dca", None, "fused"),
    "2-dca": ("dca", 2, "fused"),
    "dca-ref": ("dca", None, "reference"),
    "2-dca-ref": ("dca", 2, "reference"),
    "attn_res": ("attn_res", None, "fused"),
    "mhc": ("mhc", None, "fused"),
    "muddformer": ("muddformer", None, "fused"),
    "value_residual": ("value_residual", None, "fused"),
    # One GRN-v3 gate each, whatever the LM's default (gates.LM_DEFAULT_GATE): the paper's
    # literal b + ReLU(w·h) and ReLU(b + w·h), whose backward pass adds a per-feature ReLU
    # mask; timed in the same rounds, they give each gate's own step cost, paired.
    "dca-paper-gate": ("dca", None, "fused"),
    "2-dca-paper-gate": ("dca", 2, "fused"),
    "dca-bias-inside-gate": ("dca", None, "fused"),
    "2-dca-bias-inside-gate": ("dca", 2, "fused"),
    # The scanned trunk (layer_loop="scan", dca_theory.lm.scanned): blocks stacked over
    # layers in one lax.scan body, compile time flat in depth. GRN-v3 (one GRN per block,
    # Table 7's ablation) scans like full DCA.
    "grn_v3": ("grn_v3", None, "fused"),
    # the rest of the registry's LM kinds, each at its defaults (decode latency covers them all)
    "grn_v1": ("grn_v1", None, "fused"),
    "grn_v2": ("grn_v2", None, "fused"),
    "denseformer": ("denseformer", None, "fused"),
    "hyper_connections": ("hyper_connections", None, "fused"),
    "laurel_lr": ("laurel_lr", None, "fused"),
    "laurel_pa": ("laurel_pa", None, "fused"),
    "grn_v3-scan": ("grn_v3", None, "fused"),
    "vanilla-scan": ("vanilla", None, "fused"),
    "dca-scan": ("dca", None, "fused"),
    "2-dca-scan": ("dca", 2, "fused"),
}
#: variants that name their GRN-v3 gate (the others run the LM's default)
VARIANT_GATE: dict[str, str] = {"dca-paper-gate": "paper", "2-dca-paper-gate": "paper",
                                "dca-bias-inside-gate": "bias_inside",
                                "2-dca-bias-inside-gate": "bias_inside"}
#: variants whose blocks run in a lax.scan (``layer_loop="scan"``)
SCAN_VARIANTS: tuple[str, ...] = ("vanilla-scan", "dca-scan", "2-dca-scan", "grn_v3-scan")
DEFAULT_VARIANTS: tuple[str, ...] = ("vanilla", "dca", "2-dca")
#: one variant per LM kind of the registry (``lm=True``), plus 2-DCA: "every kind"
KIND_VARIANTS: tuple[str, ...] = (*[s.name for s in schemes.SCHEMES if s.lm], "2-dca")
# Today's comparison set beside DCA: Attention Residuals, mHC, MUDDFormer, ResFormer.
# The step-time and memory benchmarks time them by default, next to DEFAULT_VARIANTS.
RIVAL_VARIANTS: tuple[str, ...] = ("attn_res", "mhc", "muddformer", "value_residual")

# Paper, Table 1 (24 layers, LM1B, TPU): training speed in batches/s.
PAPER_BATCHES_PER_S = {"vanilla": 8.14, "2-dca": 5.39, "dca": 3.72}
PAPER_STEP_TIME_RATIO = {k: PAPER_BATCHES_PER_S["vanilla"] / v
                         for k, v in PAPER_BATCHES_PER_S.items()}
# Paper, rebuttal/appendix: training peak memory 5.3 GB -> 6.6 GB on a 179M model (+25%).
PAPER_MEMORY_RATIO = 6.6 / 5.3


def apply_preset(args, on: bool, preset: dict):
    """``args`` with ``preset``'s values set when ``on`` (a ``--quick`` / ``--smoke`` flag)."""
    if on:
        for name, value in preset.items():
            setattr(args, name, value)
    return args


def check_positive(name: str, value: int) -> int:
    if value < 1:
        raise SystemExit(f"error: --{name} must be >= 1, got {value}")
    return value


def model_config(variant: str, *, width: int, depth: int, seq: int, vocab: int,
                 dropout: float = 0.0, param_dtype: str = "float32") -> ModelConfig:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    residual, k, grn_impl = VARIANTS[variant]
    gate = {"grn_gate": VARIANT_GATE[variant]} if variant in VARIANT_GATE else {}
    if variant in SCAN_VARIANTS:
        gate["layer_loop"] = "scan"
    return ModelConfig(vocab_size=vocab, max_len=seq, d_model=width, n_heads=max(1, width // 64),
                       d_mlp=4 * width, n_layers=depth, dropout=dropout, attn_dropout=dropout,
                       residual=residual, k=k, param_dtype=param_dtype, grn_impl=grn_impl,
                       **gate)


def train_config(cfg: ModelConfig, batch: int, compute_dtype: str = "float32") -> LMTrainConfig:
    return LMTrainConfig(batch_size=batch, seq_len=cfg.max_len, warmup_steps=10,
                         compute_dtype=compute_dtype)


def train_setup(cfg: ModelConfig, batch: int, compute_dtype: str = "float32"):
    """Return ``(step_fn, args)`` with ``step_fn(*args) -> (params, opt_state, metrics)``."""
    return train_step_setup(cfg, train_config(cfg, batch, compute_dtype))


def model_flops_per_step(cfg, batch: int) -> float:
    """The transformer's training FLOPs per step (PaLM's count).

    6 T N + 12 T L d s: T = batch·seq tokens, N the matmul weights (per layer 4 d² + 2 d d_mlp,
    plus the d × V output projection), L layers, width d, sequence s. The GRNs' work is not
    counted, so DCA's overhead shows as a lower model FLOP utilisation."""
    d, L, s = cfg.d_model, cfg.n_layers, cfg.max_len
    n_matmul = L * (4 * d * d + 2 * d * cfg.d_mlp) + d * cfg.vocab_size
    tokens = batch * s
    return 6.0 * tokens * n_matmul + 12.0 * tokens * L * d * s


def save_partial(record: dict, json_path: str | None) -> None:
    """Write the record so far (atomically) so that an interrupted run keeps its results."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(json_path, json.dumps(record, indent=2))


def emit(record: dict, json_path: str | None) -> dict:
    """Print the record as one JSON line and, if asked, write it (atomically) to a file."""
    print(json.dumps(record))
    save_partial(record, json_path)
    return record


def machine() -> dict:
    """Where and under what load the numbers were taken (other processes may share the CPU)."""
    return {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "loadavg_1_5_15": list(os.getloadavg()), "jax": jax.__version__,
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
