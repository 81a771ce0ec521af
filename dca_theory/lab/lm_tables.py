"""Summaries of a table of cached LM runs (one row per architecture), shared by
``lm_ablation`` (paper Table 7) and ``lm_related_work`` (paper Table 5).

A row is the cached record of one multi-seed run (see :mod:`dca_theory.lab.lm_runs`); all rows
of a table share the seeds, so every comparison between two rows is paired by seed.
"""

from __future__ import annotations

import numpy as np

from dca_theory.lab.lm_runs import ppl
from dca_theory.lab.statistics import mean_std, paired


def row_summary(record: dict) -> dict:
    """Per-seed and mean ± std test / valid perplexity, parameters and step time of one run."""
    return {"key": record["key"], "label": record["label"], "params": record["n_params"],
            "seeds": record["seeds"],
            "test_ppl": mean_std(ppl(record, "test")), "test_ppl_per_seed": ppl(record, "test"),
            "valid_ppl": mean_std(ppl(record, "valid")),
            "valid_ppl_per_seed": ppl(record, "valid"),
            "final_train_loss": mean_std(record["final_train_loss"]),
            "median_step_s": record["median_step_s"]}


def summarise_table(records: dict[str, dict], pairs: list[tuple[str, str]],
                    reference: str = "vanilla") -> dict:
    """Rows, the paired test-ppl differences ``b - a`` for each pair (``"b-a"``, skipped when a
    row is missing), each row's relative change against ``reference`` (%) and the rows ordered
    from lowest to highest mean test perplexity."""
    rows = {k: row_summary(r) for k, r in records.items()}
    seeds = {tuple(r["seeds"]) for r in rows.values()}
    if len(seeds) > 1:
        raise ValueError(f"rows must share their seeds to be paired, got {sorted(seeds)}")
    diffs = {f"{b}-{a}": paired(ppl(records[a], "test"), ppl(records[b], "test"))
             for a, b in pairs if a in records and b in records}
    rel = {}
    if reference in rows:
        base = rows[reference]["test_ppl"]["mean"]
        rel = {k: 100.0 * (r["test_ppl"]["mean"] / base - 1.0) for k, r in rows.items()}
    order = sorted(rows, key=lambda k: rows[k]["test_ppl"]["mean"])
    return {"rows": rows, "paired_test_ppl": diffs, "relative_to_reference_pct": rel,
            "order_by_test_ppl": order}


def paper_summary(table: dict[str, dict], pairs: list[tuple[str, str]],
                  reference: str = "vanilla") -> dict:
    """The same differences for the paper's table (``{kind: {"ppl", "std", "params_m"}}``)."""
    diffs = {f"{b}-{a}": table[b]["ppl"] - table[a]["ppl"]
             for a, b in pairs if a in table and b in table}
    base = table[reference]["ppl"]
    rel = {k: 100.0 * (v["ppl"] / base - 1.0) for k, v in table.items()}
    return {"rows": table, "differences": diffs, "relative_to_reference_pct": rel,
            "order_by_ppl": sorted(table, key=lambda k: table[k]["ppl"])}


def same_order(ours: list[str], paper: list[str]) -> dict:
    """Kendall's tau between our ordering and the paper's over the rows both have."""
    from scipy import stats

    common = [k for k in paper if k in ours]
    if len(common) < 2:
        return {"rows": common, "kendall_tau": None, "identical": None}
    rank_ours = [ours.index(k) for k in common]
    tau = stats.kendalltau(np.arange(len(common)), rank_ours).statistic
    return {"rows": common, "kendall_tau": float(tau),
            "identical": [k for k in ours if k in common] == common}
