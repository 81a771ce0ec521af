"""The DCA transformer language model (Equinox). See :mod:`dca_theory.lm.config`."""
