"""The residual schemes of the LM as mixers for :mod:`dca_theory.lm.driver`, one module each.

A scheme's row in :mod:`dca_theory.schemes` names its mixer class (``Scheme.mixer``, a
``module:Class`` path, so the registry stays free of jax); :func:`mixer_class` resolves it.
"""

from __future__ import annotations

import importlib

from dca_theory import schemes


def mixer_class(kind: str) -> type:
    """The mixer class of residual kind ``kind`` (from its registry row)."""
    scheme = schemes.get(kind)
    if not scheme.mixer:
        raise ValueError(f"residual {kind!r} has no mixer yet; valid: "
                         f"{', '.join(s.name for s in schemes.SCHEMES if s.mixer)}")
    module, _, name = scheme.mixer.partition(":")
    return getattr(importlib.import_module(module), name)
