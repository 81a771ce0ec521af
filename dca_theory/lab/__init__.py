"""Where experiments are run: the support the claim experiments (``experiments/``) share.

Models live in :mod:`dca_theory.lm`, :mod:`dca_theory.vit` and :mod:`dca_theory.nets`; this
package holds what it takes to *measure* them, so that an experiment file only declares its
sweep, reads the measurements and writes its summary. Nothing here imports ``experiments`` or
``figures``.

Language-model runs:

* :mod:`.lm_runs`: the experiments' standard LM scale (CPU and quick settings), the
  :class:`~.lm_runs.RunSpec` of one multi-seed run, and the run cache every experiment shares
  (``<results>/lm_runs/<label>-<hash>/``: train once, read many times);
* :mod:`.lm_grid`: the runs of every ``lm_*`` experiment as ``RunSpec`` lists, and
  ``python -m dca_theory.lab.lm_grid [--quick]``, which trains them all into the cache;
* :mod:`.lm_settings`: each ``lm_*`` experiment's settings (seeds, training config, its
  sweep) as a frozen dataclass with quick and full presets, changed with ``--set``;
* :mod:`.seeds`: train several seeds of one LM config at once (``vmap`` over seeds), with every
  step's loss, gradient norm and wall time;
* :mod:`.lm_tables`: summaries of a table of cached runs (one row per architecture) and its
  comparison with a table of the paper.

Measurements and statistics:

* :mod:`.statistics`: mean ± std over seeds and seed-paired differences (paired t-test);
* :mod:`.verdicts`: the LM verdict table's statistics from the committed results (Holm per
  claim, pooled configurations, one verdict rule);
* :mod:`.time_to_reach`: the time a run takes to reach another's final quality (Table 1);
* :mod:`.stability`: a precise definition of a loss spike, and rate statistics;
* :mod:`.steptime`: alternated train-step timing, shared with ``benchmarks/``;
* :mod:`.jacobian_rank`: the per-layer Jacobian rank of a trained LM's residual branches;
* :mod:`.branch_rank`: the effective rank of its attention, MLP and update Jacobians;
* :mod:`.analysis`: learned GRN weights per layer (Figure 10's data) and residual-stream states.
"""
