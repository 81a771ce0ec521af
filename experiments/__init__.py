"""Experiments: one file per claim. Each module has a docstring (claim, command, runtime,
expected result) and ``main(quick=False, out=None, overwrite=False) -> Path`` that writes a run
directory (see :mod:`dca_theory.io`). Run with ``dca-theory run NAME [--quick]``."""
