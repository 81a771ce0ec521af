"""Training and measurement for the toy networks: targets, optax training, rank tools."""

from dca_theory.sim.rank import JacobianRank, jacobian_rank, residual_jacobians
from dca_theory.sim.targets import (
    BottleneckTeacher,
    LinearTarget,
    gaussian_target,
    identity_target,
    spectral_target,
)
from dca_theory.sim.train import ToyTrainConfig, evaluate_toy, fit, fit_many, train
from dca_theory.spectra import effective_rank, numerical_rank, stable_rank

__all__ = [
    "BottleneckTeacher", "JacobianRank", "LinearTarget", "ToyTrainConfig", "effective_rank",
    "evaluate_toy", "fit", "fit_many", "gaussian_target", "identity_target", "jacobian_rank",
    "numerical_rank", "residual_jacobians", "spectral_target", "stable_rank", "train",
]
