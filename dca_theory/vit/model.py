r"""The Vision Transformer around the LM's residual trunk (paper Table 8: "ViT + DCA").

.. math::
    z_0 = [\,x_{\text{cls}};\ E\,p_1; \dots; E\,p_N\,] + P, \qquad
    h = \mathrm{Trunk}(z_0), \qquad
    \text{logits} = W\,\mathrm{pool}(\mathrm{LN}(h)) + c

* patches :math:`p_i \in R^{P}` (``P = patch_size^2 * channels``) are non-overlapping squares;
  a stride-``patch_size`` convolution with a ``patch_size`` kernel is the same map as
  "reshape into patches, then one Dense layer", which is what :class:`PatchEmbed` does;
* positions :math:`P` are learned (N(0, 0.02^2) init) or the fixed 2-D sin-cos table of
  Beyer et al. 2022 (``posemb_sincos_2d`` in big_vision);
* the trunk is :func:`dca_theory.lm.trunks.Trunk` with ``causal=False``: every residual kind of
  the LM (vanilla, GRN-v1/v2/v3, DCA, k-DCA) is available and "DCA is inserted in the same way
  as for the language models" (paper §5, Table 8). No transformer block is redefined here;
* ``pool`` is the class token (``"cls"``) or the mean over patch tokens (``"gap"``);
* the head is zero-initialised (big_vision's ``head_zeroinit``), so every class starts at
  probability 1/K; the patch embedding is Xavier-uniform with zero bias.

**Retrofitting** (:func:`retrofit`): a vanilla ViT becomes a GRN/DCA/k-DCA ViT computing the same
function with the LM's parameter map (:mod:`dca_theory.lm.retrofit`): block weights copied,
``LN_1`` becomes ``LN_q = LN_k = LN_v`` and ``LN_2`` becomes ``LN_h``, GRNs at b = 1, w = 0.

A model maps one image ``(H, W, C)`` to logits ``(K,)``; batch with ``jax.vmap``. Letters: see
:mod:`dca_theory.vit.config`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from dca_theory import random_draws as draws
from dca_theory import schemes
from dca_theory.lm.blocks import LayerNorm, dtype_of, last_axis, xavier_uniform
from dca_theory.lm.retrofit import check_retrofit_gate, check_retrofit_target, retrofit_trunk
from dca_theory.lm.trunk import AbstractTrunk, States
from dca_theory.lm.trunks import Trunk
from dca_theory.vit.config import ViTConfig


def patchify(image_HxWxC: Float[Array, "H W C"], patch_size: int) -> Float[Array, "N P"]:
    """Non-overlapping ``patch_size`` squares in row-major order, each flattened (row, col, ch)."""
    h, w, c = image_HxWxC.shape
    if h % patch_size or w % patch_size:
        raise ValueError(f"image {h}x{w} is not divisible into {patch_size}x{patch_size} "
                         "patches")
    gh, gw = h // patch_size, w // patch_size
    x = image_HxWxC.reshape(gh, patch_size, gw, patch_size, c)
    return x.transpose(0, 2, 1, 3, 4).reshape(gh * gw, patch_size * patch_size * c)


def sincos_2d(grid: int, dim: int, temperature: float = 10_000.0) -> Float[Array, "N D"]:
    """Fixed 2-D sin-cos positions (big_vision ``posemb_sincos_2d``): for patch (row y, col x)
    the row is ``[sin(x w), cos(x w), sin(y w), cos(y w)]`` with ``w_j = T^{-j/(D/4 - 1)}``."""
    if dim % 4:
        raise ValueError(f"2-D sin-cos positions need dim divisible by 4, got {dim}")
    quarter = dim // 4
    y, x = jnp.mgrid[:grid, :grid]
    omega = 1.0 / temperature ** (jnp.arange(quarter) / max(quarter - 1, 1))
    y_NxQ = jnp.outer(y.reshape(-1).astype(omega.dtype), omega)
    x_NxQ = jnp.outer(x.reshape(-1).astype(omega.dtype), omega)
    return jnp.concatenate([jnp.sin(x_NxQ), jnp.cos(x_NxQ), jnp.sin(y_NxQ), jnp.cos(y_NxQ)],
                           axis=1)


class ViT(eqx.Module):
    """ViT classifier: patch embedding, positions, optional class token, LM trunk, LN, head."""

    w_patch_PxD: Array
    b_patch_D: Array
    pos_NxD: Array | None  # learned positions; None for fixed sin-cos
    cls_D: Array | None  # class token; None for global average pooling
    trunk: AbstractTrunk
    final_norm: LayerNorm
    w_head_DxK: Array
    b_head_K: Array
    cfg: ViTConfig = eqx.field(static=True)

    def __init__(self, cfg: ViTConfig, *, key: PRNGKeyArray):
        # The trunk gets its own key: ViTs of every residual kind built from one key share all
        # weights (the trunk draws block weights from per-layer keys independent of the kind).
        k_patch, k_pos, k_trunk = jax.random.split(key, 3)
        dtype = dtype_of(cfg.param_dtype)
        self.cfg = cfg
        self.w_patch_PxD = xavier_uniform(k_patch, cfg.patch_dim, cfg.d_model, dtype)
        self.b_patch_D = jnp.zeros((cfg.d_model,), dtype)
        self.pos_NxD = (draws.normal(k_pos, (cfg.num_patches, cfg.d_model), dtype, scale=0.02)
                        if cfg.positions == "learned" else None)
        self.cls_D = jnp.zeros((cfg.d_model,), dtype) if cfg.pool == "cls" else None
        tcfg = cfg.trunk_config()
        self.trunk = Trunk(tcfg, key=k_trunk)
        self.final_norm = LayerNorm.init(cfg.d_model, tcfg.ln_eps, dtype)
        self.w_head_DxK = jnp.zeros((cfg.d_model, cfg.num_classes), dtype)
        self.b_head_K = jnp.zeros((cfg.num_classes,), dtype)

    def positions(self) -> Float[Array, "N D"]:
        if self.pos_NxD is not None:
            return self.pos_NxD
        return sincos_2d(self.cfg.grid, self.cfg.d_model).astype(self.w_patch_PxD.dtype)

    def embed(self, image_HxWxC: Float[Array, "H W C"]) -> Float[Array, "N D"]:
        """Patch embedding plus positions, with the class token prepended for ``pool="cls"``."""
        expected = (self.cfg.image_size, self.cfg.image_size, self.cfg.channels)
        if image_HxWxC.shape != expected:
            raise ValueError(f"image shape {image_HxWxC.shape} does not match the config: "
                             f"expected {expected}")
        p_NxP = patchify(image_HxWxC.astype(self.w_patch_PxD.dtype), self.cfg.patch_size)
        x_NxD = p_NxP @ self.w_patch_PxD
        x_NxD = x_NxD + last_axis(self.b_patch_D, x_NxD) + self.positions()
        if self.cls_D is not None:
            x_NxD = jnp.concatenate([self.cls_D[None, :], x_NxD], axis=0)
        return x_NxD

    def head(self, h_NxD: Float[Array, "N D"]) -> Float[Array, " K"]:
        """Final LayerNorm, pooling (class token or mean over tokens) and the linear head."""
        h_NxD = self.final_norm(h_NxD)
        pooled_D = h_NxD[0] if self.cls_D is not None else jnp.mean(h_NxD, axis=0)
        return pooled_D @ self.w_head_DxK + self.b_head_K

    def __call__(self, image_HxWxC: Float[Array, "H W C"], *, key: PRNGKeyArray | None = None,
                 inference: bool = True) -> Float[Array, " K"]:
        """Logits for one image. Dropout is active iff ``not inference and key is not None``."""
        h_NxD = self.trunk(self.embed(image_HxWxC), causal=False, key=key, inference=inference)
        return self.head(h_NxD)

    def forward_with_states(self, image_HxWxC: Float[Array, "H W C"]
                            ) -> tuple[Float[Array, " K"], States]:
        """Logits and the trunk's per-layer states (see :mod:`dca_theory.lm.trunk`), at
        inference."""
        h_NxD, states = self.trunk.forward_with_states(self.embed(image_HxWxC), causal=False,
                                                       inference=True)
        return self.head(h_NxD), states


def retrofit(source: ViT, residual: str, k: int | None = None) -> ViT:
    """The ``residual``-kind ViT computing the same function as the vanilla ``source``."""
    if source.cfg.residual != "vanilla":
        raise ValueError(f"retrofit needs a vanilla source ViT, got residual="
                         f"{source.cfg.residual!r}")
    residual = schemes.canonical(check_retrofit_target(residual))
    cfg = source.cfg.replace(residual=residual, k=k)
    check_retrofit_gate(residual, cfg.grn_gate)
    fresh = ViT(cfg, key=jax.random.PRNGKey(0))  # shapes and identity GRNs
    trunk = retrofit_trunk(source.trunk, fresh.trunk, cfg.trunk_config())
    out = eqx.tree_at(lambda m: m.trunk, fresh, trunk)
    rest = lambda m: (m.w_patch_PxD, m.b_patch_D, m.pos_NxD, m.cls_D,  # noqa: E731
                      m.final_norm, m.w_head_DxK, m.b_head_K)
    return eqx.tree_at(rest, out, rest(source), is_leaf=lambda x: x is None)


def count_params(model: eqx.Module) -> int:
    """Trainable (inexact array) parameters of a model."""
    leaves = jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_inexact_array))
    return int(sum(leaf.size for leaf in leaves))


def param_count(cfg: ViTConfig) -> int:
    """Parameters of ``ViT(cfg)`` without allocating them (shape evaluation only)."""
    shapes = eqx.filter_eval_shape(ViT, cfg, key=jax.random.PRNGKey(0))
    leaves = jax.tree_util.tree_leaves(shapes)
    return int(sum(leaf.size for leaf in leaves
                   if isinstance(leaf, jax.ShapeDtypeStruct)
                   and jnp.issubdtype(leaf.dtype, jnp.inexact)))
