"""Every trunk by residual kind, and :func:`Trunk`, which builds the one ``cfg.residual`` names.

The trunks themselves live in :mod:`dca_theory.lm.trunk` (vanilla, GRN-v1/v2/v3, DCA),
:mod:`dca_theory.lm.baselines` (the paper's related work), :mod:`dca_theory.lm.rivals`
(Attention Residuals, MUDDFormer, value residuals) and :mod:`dca_theory.lm.mhc` (mHC), all built
on the first's ``AbstractTrunk``; the factory sits here, above them, so that none has to import
another back.
"""

from __future__ import annotations

from jaxtyping import PRNGKeyArray

from dca_theory import schemes
from dca_theory.lm.baselines import BASELINE_TRUNKS
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.mhc import ManifoldHyperConnectionsTrunk
from dca_theory.lm.rivals import RIVAL_TRUNKS
from dca_theory.lm.scanned import ScannedTrunk
from dca_theory.lm.trunk import AbstractTrunk, DCATrunk, ResidualTrunk


def Trunk(cfg: ModelConfig, *, key: PRNGKeyArray) -> AbstractTrunk:  # noqa: N802 (a constructor)
    """Build the trunk for ``cfg.residual`` (see :mod:`dca_theory.lm.trunk`); with
    ``cfg.layer_loop == "scan"`` the scanned trunk (:mod:`dca_theory.lm.scanned`)."""
    if cfg.layer_loop == "scan":
        return ScannedTrunk.init(cfg, key=key)
    if schemes.get(cfg.residual).family in ("plain", "grn"):
        return ResidualTrunk.init(cfg, key=key)
    if cfg.residual == "dca":
        return DCATrunk.init(cfg, key=key)
    if cfg.residual in BASELINE_TRUNKS:
        return BASELINE_TRUNKS[cfg.residual].init(cfg, key=key)
    if cfg.residual in RIVAL_TRUNKS:
        return RIVAL_TRUNKS[cfg.residual].init(cfg, key=key)
    if cfg.residual == "mhc":
        return ManifoldHyperConnectionsTrunk.init(cfg, key=key)
    raise ValueError(f"unknown residual {cfg.residual!r}")  # unreachable: config validates
