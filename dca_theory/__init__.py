"""dca_theory: the theory, toy networks and transformer of DeepCrossAttention (Heddes et al. 2025).

Sub-packages: ``theory`` (closed forms and sympy; imports no training code), ``nets`` and
``sim`` (toy networks, training, rank tools), ``lm`` (the DCA transformer language model),
``vit`` (the same trunk on images), ``lab`` (what the experiments share to measure them).
The residual operator shared by all of them is :mod:`dca_theory.residual`.
"""

__version__ = "0.1.0"
