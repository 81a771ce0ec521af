"""Vision Transformer configuration and presets.

A ViT (Dosovitskiy et al. 2021) cuts an ``image_size x image_size x channels`` image into
``(image_size / patch_size)**2`` non-overlapping patches, embeds each patch with one Dense layer,
adds positions, runs the *same* non-causal residual trunk as the language model
(:func:`dca_theory.lm.trunks.Trunk`, so every residual kind of the LM, DCA included, is available)
and classifies from a class token or the mean over tokens.

The paper's vision result (Table 8, ``shared/reference/dca-paper.md`` §3.13) is ViT-S/16 on
ImageNet following Beyer et al. (2022): global average pooling and fixed 2-D sin-cos positions,
which is what the ``"s16"`` preset uses.

Letters used for shapes in ``vit/``: B batch, H/W image height/width, C channels, N patches
(tokens), P flattened patch size, D model width, K classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dca_theory import gates, schemes
from dca_theory.gates import LM_DEFAULT_GATE
from dca_theory.lm.config import ModelConfig

POSITIONS: tuple[str, ...] = ("learned", "sincos2d")
POOLINGS: tuple[str, ...] = ("cls", "gap")


@dataclass(frozen=True)
class ViTConfig:
    """A ViT classifier. ``residual`` and ``k`` have the LM's meaning (``schemes.names(lm=True)``);
    ``param_dtype`` is the dtype of every parameter and of the computation."""

    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    num_classes: int = 1000
    d_model: int = 384
    n_heads: int = 6
    d_mlp: int = 1536
    n_layers: int = 12
    dropout: float = 0.0
    attn_dropout: float = 0.0
    residual: str = "vanilla"
    k: int | None = None
    positions: str = "sincos2d"
    pool: str = "gap"
    param_dtype: str = "float32"
    grn_gate: str = LM_DEFAULT_GATE  # GRN-v3's gate for grn_v3 / dca: the LM trunk's default
    layer_loop: str = "unroll"  # the LM's: "unroll" (per-block trunks) or "scan" (one driver)

    def __post_init__(self):
        for name in ("image_size", "patch_size", "channels", "num_classes", "d_model",
                     "n_heads", "d_mlp", "n_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ViTConfig.{name} must be an integer >= 1, got {value!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size "
                             f"{self.patch_size}")
        schemes.check(self.residual, schemes.names(lm=True), what="residual")
        object.__setattr__(self, "residual", schemes.canonical(self.residual))
        object.__setattr__(self, "grn_gate", gates.canonical(self.grn_gate))
        self.trunk_config()  # the trunk's own checks: heads divide d_model, k only with dca, ...
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, "
                             f"got {self.positions!r}")
        if self.pool not in POOLINGS:
            raise ValueError(f"pool must be one of {', '.join(POOLINGS)}, got {self.pool!r}")
        if self.positions == "sincos2d" and self.d_model % 4:
            raise ValueError(f"2-D sin-cos positions need d_model divisible by 4, "
                             f"got {self.d_model}")

    @property
    def grid(self) -> int:
        """Patches per image side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid**2

    @property
    def num_tokens(self) -> int:
        """Sequence length seen by the trunk (patches, plus one class token with ``pool="cls"``)."""
        return self.num_patches + (self.pool == "cls")

    @property
    def patch_dim(self) -> int:
        return self.patch_size**2 * self.channels

    def trunk_config(self) -> ModelConfig:
        """The LM trunk configuration (vocabulary and ``max_len`` are unused by the trunk)."""
        return ModelConfig(
            vocab_size=1, max_len=self.num_tokens, d_model=self.d_model, n_heads=self.n_heads,
            d_mlp=self.d_mlp, n_layers=self.n_layers, dropout=self.dropout,
            attn_dropout=self.attn_dropout, residual=self.residual, k=self.k,
            param_dtype=self.param_dtype, compute_dtype=self.param_dtype, grn_gate=self.grn_gate,
            layer_loop=self.layer_loop,
        )

    def replace(self, **changes) -> ViTConfig:
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, ViTConfig] = {
    # ViT-S/16 as in the paper's Table 8 (Beyer et al. 2022: GAP, fixed 2-D sin-cos positions).
    "s16": ViTConfig(),
    # scikit-learn digits (8x8 grey): 2x2 patches -> 16 tokens. Used by experiments/vit_digits.
    "digits": ViTConfig(image_size=8, patch_size=2, channels=1, num_classes=10, d_model=32,
                        n_heads=4, d_mlp=64, n_layers=4, positions="learned", pool="gap"),
    # Smallest useful model: for tests and the quick mode.
    "digits_tiny": ViTConfig(image_size=8, patch_size=2, channels=1, num_classes=10,
                             d_model=16, n_heads=2, d_mlp=32, n_layers=2, positions="learned",
                             pool="cls"),
}


def preset(name: str, **changes) -> ViTConfig:
    """A preset by name, optionally with fields replaced."""
    if name not in PRESETS:
        raise ValueError(f"unknown ViT preset {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**changes)
