"""Does a GRN need the model input? GRN-v3 over the last entries of the stack with and without
the model input x (paper Table 9), on Tiny Shakespeare (char) at CPU scale.

**Claim tested.** Paper Table 9 (6-layer GRN-v3, LM1B, embedding 512, a shorter budget than the
other tables): test perplexity Transformer 20.878, "GRN-v3 (last 4 layers)" 20.301,
"GRN-v3 (model inputs + last 3 layers)" **20.227**. The authors' reading (response to
reviewers, ``dca-paper.md`` §8): removing the explicit model input from the GRN stacks
"performs notably worse"; the input "matters for all hidden layers, most in early training".
Paper differences: last-4 - Transformer -0.577 (-2.8%), input+last-3 - last-4 -0.074 (-0.36%).

**Design.** The runs of :func:`dca_theory.lab.lm_grid.inputs_specs` (shared run cache): the
width-64, depth-4 pre-LN transformer of :mod:`dca_theory.lab.lm_runs` (400 steps, 3 seeds with
paired data order), as vanilla, as GRN-v3 over the full stack, and as GRN-v3 restricted by
``ModelConfig.grn_window = w`` (every GRN, the output GRN included): ``grn_input=False`` reads
the last w entries of ``[x, f_1, ..., f_{t-1}]`` ("last w layers"), ``grn_input=True`` reads x
plus the last w - 1 outputs ("model inputs + last w - 1 layers"); dropped entries are not summed.
The paper's w = 4 at depth 6 restricts 3 of the 7 GRNs; at depth 4 we use w = 3, which
restricts 2 of 5 (block 4 and the output GRN; a window of 4 would restrict the output GRN only).
Reported: whole-split test perplexity per seed and mean ± std, seed-paired differences with
paired t-test p-values and 95% intervals, and the validation-perplexity gap
(input+last - last) along training (the "most in early training" claim; periodic evaluations
on 6 validation batches, the last point on the whole split).

**Command.** ``dca-theory run lm_inputs`` (full; reads / fills ``experiments/results/lm_runs``,
writes ``experiments/results/lm_inputs``) or ``dca-theory run lm_inputs --quick`` (width 16,
depth 2, window 2, 30 steps, seeds 0, 1; cache ``runs/lm_runs``). Figure:
``figures/fig_lm_inputs.py``.

**Runtime.** Full, from an empty cache: 4 runs x 3 seeds, about 2-4 minutes per run on 2 CPU
cores, seconds on a GPU; with the cache filled (by ``python -m dca_theory.lab.lm_grid``) it only
reads records (seconds). Quick, from an empty quick cache: about 1 minute on an idle 2-core
machine (4 small compilations).

Measured: with the cache filled, 32 s wall (4.5 s CPU); quick mode 2 min 8 s wall (60 s CPU)
on the shared, heavily loaded 2-core machine.

**Expected result** (measured, committed run; see ``paper/05_lm/inputs.md``): test perplexity
Transformer 10.468 ± 0.149, GRN-v3 last-3 10.375 ± 0.106, GRN-v3 input+last-2 10.360 ± 0.133,
full-stack GRN-v3 10.440 ± 0.144 (3 seeds). Paired (input+last-2) - (last-3): -0.015 ± 0.229
(p = 0.92, lower on 2/3 seeds; paper -0.074): inconclusive. The validation gap is positive early
(+0.84 at step 25, +1.22 at step 50, 3/3 seeds) and about 0 from step 150 on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.io import RunDir
from dca_theory.lab.lm_grid import inputs_specs
from dca_theory.lab.lm_runs import ensure_run, ppl
from dca_theory.lab.lm_settings import InputsSettings, experiment_settings, run_cache, run_config
from dca_theory.lab.statistics import mean_std, paired
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_inputs"
KINDS: tuple[str, ...] = ("vanilla", "grn_v3_last", "grn_v3_input_last", "grn_v3_full")
#: seed-paired test-perplexity differences ``b - a``
PAIRS: list[tuple[str, str]] = [
    ("vanilla", "grn_v3_last"), ("vanilla", "grn_v3_input_last"), ("vanilla", "grn_v3_full"),
    ("grn_v3_last", "grn_v3_input_last"), ("grn_v3_input_last", "grn_v3_full"),
]
#: paper Table 9 (6-layer GRN-v3, LM1B, window 4): test perplexity
PAPER_TABLE9 = {"vanilla": 20.878, "grn_v3_last": 20.301, "grn_v3_input_last": 20.227}


def row(record: dict) -> dict:
    """One run: per-seed and mean ± std test / valid perplexity, parameters, window."""
    model = record["resolved_model"]
    return {"key": record["key"], "label": record["label"], "params": record["n_params"],
            "seeds": record["seeds"], "grn_window": model.get("grn_window"),
            "grn_input": model.get("grn_input", True),
            "test_ppl": mean_std(ppl(record, "test")), "test_ppl_per_seed": ppl(record, "test"),
            "valid_ppl": mean_std(ppl(record, "valid")),
            "valid_ppl_per_seed": ppl(record, "valid")}


def valid_gap(a: dict, b: dict) -> list[dict]:
    """Per evaluation step, the seed-paired validation-perplexity difference ``b - a`` of two
    runs with the same evaluation schedule (mean, std, per seed)."""
    steps_a = [e["step"] for e in a["valid_history"]]
    steps_b = [e["step"] for e in b["valid_history"]]
    if steps_a != steps_b:
        raise ValueError(f"evaluation steps differ: {steps_a} vs {steps_b}")
    out = []
    for ea, eb in zip(a["valid_history"], b["valid_history"]):
        d = np.subtract(eb["valid_ppl"], ea["valid_ppl"])
        out.append({"step": ea["step"], **mean_std(d), "per_seed": d.tolist()})
    return out


def summarise(records: dict[str, dict]) -> dict:
    """Rows, paired differences, relative changes against vanilla and the paper's numbers."""
    rows = {k: row(r) for k, r in records.items()}
    if len({tuple(r["seeds"]) for r in rows.values()}) > 1:
        raise ValueError("runs must share their seeds to be paired")
    diffs = {f"{b}-{a}": paired(ppl(records[a], "test"), ppl(records[b], "test"))
             for a, b in PAIRS if a in records and b in records}
    base = rows["vanilla"]["test_ppl"]["mean"] if "vanilla" in rows else None
    rel = {k: 100.0 * (r["test_ppl"]["mean"] / base - 1.0) for k, r in rows.items()} if base else {}
    paper_diffs = {f"{b}-{a}": PAPER_TABLE9[b] - PAPER_TABLE9[a]
                   for a, b in PAIRS if a in PAPER_TABLE9 and b in PAPER_TABLE9}
    paper_rel = {k: 100.0 * (v / PAPER_TABLE9["vanilla"] - 1.0) for k, v in PAPER_TABLE9.items()}
    out = {"rows": rows, "paired_test_ppl": diffs, "relative_to_vanilla_pct": rel,
           "order_by_test_ppl": sorted(rows, key=lambda k: rows[k]["test_ppl"]["mean"]),
           "paper_table9": {"test_ppl": PAPER_TABLE9, "differences": paper_diffs,
                            "relative_to_vanilla_pct": paper_rel}}
    if "grn_v3_last" in records and "grn_v3_input_last" in records:
        out["valid_gap_input_minus_last"] = valid_gap(records["grn_v3_last"],
                                                      records["grn_v3_input_last"])
    return out


def settings(quick: bool = False, overrides=()) -> InputsSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(InputsSettings, quick, overrides, inputs_specs)


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    cfg = settings(quick, overrides)
    specs = inputs_specs(quick, cfg)
    config = {"experiment": NAME, "quick": quick, "seeds": list(cfg.seeds),
              "runs": {k: s.describe()
                       for k, s in specs.items()},
              "pairs": PAIRS}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    records = {}
    for kind in KINDS:
        s = specs[kind]
        records[kind] = r = ensure_run(s, cache)
        run.log(kind=kind, key=s.key, params=r["n_params"], grn_window=s.model.grn_window,
                grn_input=s.model.grn_input, test_ppl=r["test_ppl"], valid_ppl=r["valid_ppl"],
                median_step_s=r["median_step_s"])
    summary = summarise(records)
    summary |= {"window": specs["grn_v3_last"].model.grn_window,
                "n_layers": specs["vanilla"].model.n_layers, "cache": str(cache),
                **summary_entry(overrides)}
    run.finish(summary)
    return run.path
