"""Model configuration and presets for the transformer LM.

Letters used for shapes across ``lm/``: B batch, L sequence length, D model width, H heads,
K head width, F MLP width, V vocabulary, S residual-stack size, N hyper-connection streams.

Every field is validated when the config is built (``ModelConfig(...)`` or ``cfg.replace``), so
a bad value fails at once with a one-line ``ValueError`` naming the value and the valid range.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dca_theory import gates, schemes

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")


GRN_IMPLS: tuple[str, ...] = ("fused", "reference")
LAYER_LOOPS: tuple[str, ...] = ("unroll", "scan")


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer. Defaults follow the Flax lm1b example (the paper's baseline).

    ``residual`` selects the residual scheme (``schemes.names(lm=True)``); ``k`` (only with
    "dca") keeps the model input, the sum of the middle outputs and the last k outputs
    (k-DCA); ``None`` is the full stack. ``hc_expansion`` is the expansion rate n of
    Hyper-Connections and mHC, ``laurel_rank`` the rank r of the LAuReL low-rank maps.

    Precision: parameters, the residual stream / stack, GRN combinations, LayerNorm statistics
    and the attention softmax are kept in ``param_dtype``; matmuls (attention projections,
    scores, MLP, output layer) run in ``compute_dtype`` (e.g. ``"bfloat16"``); with the default
    ``None`` they run in the weights' own dtype, which suits a trainer that casts the whole
    model to bfloat16 for the forward pass (LayerNorm statistics and the softmax still use
    float32). Logits are returned in the output layer's weight dtype.
    """

    vocab_size: int = 30_000
    max_len: int = 128
    d_model: int = 512
    n_heads: int = 8
    d_mlp: int = 2048
    n_layers: int = 6
    dropout: float = 0.1
    attn_dropout: float = 0.1
    residual: str = "vanilla"
    k: int | None = None
    hc_expansion: int = 4
    laurel_rank: int = 16
    param_dtype: str = "float32"
    compute_dtype: str | None = None
    ln_eps: float = 1e-6  # Flax LayerNorm default
    # GRN-v3 gate (dca_theory.gates): "paper" b + relu(w.h) as printed, whose w = 0 never
    # trains (the LM's default, chosen by the LM evidence: gates.LM_DEFAULT_GATE); "bias_inside"
    # relu(b + w.h), exact at init and every parameter trains; "open", "small_init".
    # Aliases: relu = paper, relu_open = open.
    grn_gate: str = gates.LM_DEFAULT_GATE
    # Table 9's restricted GRN stacks (grn_v1/v2/v3 only): ``grn_window`` entries per GRN
    # (None: the whole stack); ``grn_input`` keeps the model input x plus the last
    # ``grn_window - 1`` outputs, otherwise the last ``grn_window`` entries. See grn_slots.
    grn_window: int | None = None
    grn_input: bool = True
    # How stack-reading GRNs run (same function, value and gradient): "fused" computes a
    # block's GRNs in one pass over the stack entries with a hand-written backward that keeps
    # only the entries (dca_theory.lm.fast.fused_grn); "reference" stacks the entries into one
    # array per block and applies each Combiner (autodiff keeps every stacked copy). "fused"
    # has custom VJPs, so it supports reverse mode only: use "reference" for jax.jvp/jacfwd.
    grn_impl: str = "fused"
    # Which trunk runs the blocks (same function, value and gradient): "unroll", the per-block
    # trunks (one traced copy of the block per layer, so XLA compiles one copy per layer);
    # "scan", the one scanned trunk of every kind (dca_theory.lm.scanned: blocks stacked over
    # layers, one lax.scan body, so compile time hardly grows with depth). The parameter
    # layout follows (per block or stacked), and so does a checkpoint's.
    layer_loop: str = "unroll"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "n_heads", "d_mlp", "n_layers",
                     "hc_expansion", "laurel_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}"
            )
        for name in ("dropout", "attn_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        schemes.check(self.residual, schemes.names(lm=True), what="residual")
        # One spelling from here on (an alias such as "res" becomes "vanilla").
        object.__setattr__(self, "residual", schemes.canonical(self.residual))
        if self.k is not None:
            if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
                raise ValueError(f"k must be None (full stack) or an integer >= 0, got {self.k!r}")
            if not schemes.get(self.residual).takes_k:
                raise ValueError(
                    f"k={self.k} is only valid with residual="
                    f"{' or '.join(map(repr, schemes.names(lm=True, takes_k=True)))}, "
                    f"got residual={self.residual!r}"
                )
        low = schemes.get(self.residual).min_hc_expansion  # mHC: one stream has nothing to mix
        if self.hc_expansion < low:
            raise ValueError(f"residual={self.residual!r} needs hc_expansion >= {low}, "
                             f"got {self.hc_expansion}")
        for name in ("param_dtype", "compute_dtype"):
            value = getattr(self, name)
            if value not in DTYPES and not (name == "compute_dtype" and value is None):
                raise ValueError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r}")
        if not self.ln_eps > 0:
            raise ValueError(f"ln_eps must be > 0, got {self.ln_eps!r}")
        object.__setattr__(self, "grn_gate", gates.canonical(self.grn_gate))
        if self.grn_impl not in GRN_IMPLS:
            raise ValueError(f"unknown grn_impl {self.grn_impl!r}; valid: {', '.join(GRN_IMPLS)}")
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(f"unknown layer_loop {self.layer_loop!r}; valid: "
                             f"{', '.join(LAYER_LOOPS)}")
        self._check_grn_window()

    def _check_grn_window(self) -> None:
        if not isinstance(self.grn_input, bool):
            raise ValueError(f"grn_input must be True or False, got {self.grn_input!r}")
        if self.grn_window is None and self.grn_input:
            return
        if not schemes.get(self.residual).grn_window:
            raise ValueError(
                f"grn_window/grn_input are only valid with residual in "
                f"{', '.join(schemes.names(lm=True, grn_window=True))}, "
                f"got residual={self.residual!r}"
            )
        if self.grn_window is None:  # grn_input=False alone would be the full stack again
            raise ValueError("grn_input=False needs grn_window (an integer >= 1), got None")
        low = 2 if self.grn_input else 1  # the input slot plus at least one output
        w = self.grn_window
        if isinstance(w, bool) or not isinstance(w, int) or w < low:
            raise ValueError(
                f"grn_window must be None or an integer >= {low} with grn_input="
                f"{self.grn_input}, got {w!r}"
            )

    def grn_slots(self, num_outputs: int) -> tuple[int, ...]:
        """Which entries of the full stack ``[x, f_0, ..., f_{n-1}]`` (index 0 is x) a GRN
        reads after ``num_outputs = n`` block outputs (paper Table 9). Entries outside the
        window are dropped, not summed (summing them is k-DCA's middle slot)."""
        if num_outputs < 0:
            raise ValueError(f"num_outputs must be >= 0, got {num_outputs}")
        full = tuple(range(num_outputs + 1))
        if self.grn_window is None:
            return full
        if self.grn_input:  # x, then the last grn_window - 1 outputs
            return (0,) + full[1:][-(self.grn_window - 1):]
        return full[-self.grn_window:]

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, ModelConfig] = {
    # The paper's 6-layer LM1B model (Flax lm1b defaults): 49,653,040 parameters for "vanilla".
    "paper": ModelConfig(),
    # For CPU tests: a few thousand parameters, compiles in seconds.
    "tiny": ModelConfig(vocab_size=64, max_len=32, d_model=32, n_heads=4, d_mlp=64, n_layers=3,
                        dropout=0.0, attn_dropout=0.0),
}
