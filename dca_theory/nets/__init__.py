"""Toy networks of Section 4: the low-rank deep linear net and the MLP-ResNet, each usable with
every residual kind of :mod:`dca_theory.residual`."""

from dca_theory.nets.deep_linear import DeepLinear
from dca_theory.nets.mlp import ACTIVATIONS, MLPResNet

__all__ = ["ACTIVATIONS", "DeepLinear", "MLPResNet"]
