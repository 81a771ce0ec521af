"""dca_theory: the theory, toy networks and transformer of DeepCrossAttention (Heddes et al. 2025).

Sub-packages: ``theory`` (closed forms and sympy; imports no training code), ``nets`` and
``sim`` (toy networks, training, rank tools), ``lm`` (the DCA transformer language model).
The residual operator shared by all of them is :mod:`dca_theory.residual`.
"""

__version__ = "0.1.0"
