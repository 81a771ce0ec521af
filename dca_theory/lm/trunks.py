"""Every trunk by residual kind, and :func:`Trunk`, which builds the one ``cfg.residual`` names.

The trunks themselves live in :mod:`dca_theory.lm.trunk` (vanilla, GRN-v1/v2/v3, DCA) and
:mod:`dca_theory.lm.baselines` (related work, built on the former's ``AbstractTrunk``); the
factory sits here, above both, so that neither has to import the other back.
"""

from __future__ import annotations

from jaxtyping import PRNGKeyArray

from dca_theory import schemes
from dca_theory.lm.baselines import BASELINE_TRUNKS
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.trunk import AbstractTrunk, DCATrunk, ResidualTrunk


def Trunk(cfg: ModelConfig, *, key: PRNGKeyArray) -> AbstractTrunk:  # noqa: N802 (a constructor)
    """Build the trunk for ``cfg.residual`` (see :mod:`dca_theory.lm.trunk`)."""
    if schemes.get(cfg.residual).family in ("plain", "grn"):
        return ResidualTrunk.init(cfg, key=key)
    if cfg.residual == "dca":
        return DCATrunk.init(cfg, key=key)
    if cfg.residual in BASELINE_TRUNKS:
        return BASELINE_TRUNKS[cfg.residual].init(cfg, key=key)
    raise ValueError(f"unknown residual {cfg.residual!r}")  # unreachable: config validates
