"""Model configuration and presets for the transformer LM.

Letters used for shapes across ``lm/``: B batch, L sequence length, D model width, H heads,
K head width, F MLP width, V vocabulary, S residual-stack size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

LM_RESIDUALS: tuple[str, ...] = (
    "vanilla", "grn_v1", "grn_v2", "grn_v3", "dca",
    "denseformer", "hyper_connections", "laurel_lr", "laurel_pa",
)


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer. Defaults follow the Flax lm1b example (the paper's baseline).

    ``residual`` selects the residual scheme (see LM_RESIDUALS); ``k`` (only with "dca") keeps
    the model input, the sum of the middle outputs and the last k outputs (k-DCA); ``None`` is
    the full stack.
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

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, ModelConfig] = {
    # The paper's 6-layer LM1B model (Flax lm1b defaults): 49,653,040 parameters for "vanilla".
    "paper": ModelConfig(),
    # For CPU tests: a few thousand parameters, compiles in seconds.
    "tiny": ModelConfig(vocab_size=64, max_len=32, d_model=32, n_heads=4, d_mlp=64, n_layers=3,
                        dropout=0.0, attn_dropout=0.0),
}
