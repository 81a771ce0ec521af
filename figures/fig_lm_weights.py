"""Learned GRN biases per stack slot (``experiments/lm_weights``; paper Figure 10 at CPU scale).

Two figures, ``fig_lm_weights_grn_v3`` (GRN-v3: one panel per block GRN from block 2 on, and
the output GRN) and ``fig_lm_weights_dca`` (DCA: the query GRN of each block from block 2 on,
and the output GRN). In each panel the x-axis is the GRN's stack slot (``in`` = model input,
``j`` = block j's output, 1-based), the line is the median of b over the features (averaged
over seeds) and the band the 5-95% range (seed-averaged percentiles), one colour per GRN-v3
gate (:mod:`dca_theory.gates`: the paper's literal gate, open, bias inside, small init); with
the bias inside, b < 0 switches an entry off (Figure 10's reading); dotted: the initial b = 1;
dash-dotted: where b = 1 would end under AdamW's weight decay alone (no gradient). A second row
shows the effective weight per entry once the gate acts (token mean, median over features).
Figure 10 itself shows a 30-layer model. Reads ``results_dir/lm_weights/summary.json`` only;
writes PNG, PDF and a CSV per figure.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from dca_theory import gates

from .style import FULL, figure, gate_color, save, saved_summary, scheme_label

KIND = "experiment"
NAME = "fig_lm_weights"
#: the rows of each figure: the paper's literal gate first, then the live ones
FAMILIES = {f: (f, f"{f}_open", f"{f}_bias_inside", f"{f}_small_init") for f in ("grn_v3", "dca")}
GATE_LABELS = {"paper": "b + ReLU(w.h), paper (w frozen)", "open": "open: ReLU'(0) = 1",
               "bias_inside": "ReLU(b + w.h)", "small_init": "small init w"}


def panel_grns(names: list[str]) -> list[str]:
    """The GRNs drawn: block GRNs (DCA: query GRNs) with >= 2 slots, then the output GRN."""
    keep = [n for n in names
            if (m := re.fullmatch(r"block_(\d+)(\.q)?", n)) and int(m.group(1)) >= 1]
    return keep + (["output"] if "output" in names else [])


def slot_ticks(slots: list[str]) -> list[str]:
    """``input`` -> ``in``, ``out_j`` -> ``j+1`` (1-based layer numbers, as in Figure 10)."""
    return ["in" if s == "input" else str(int(s.split("_")[1]) + 1) if s.startswith("out_")
            else s for s in slots]


def _panel_title(grn: str) -> str:
    layer = re.match(r"block_(\d+)", grn)
    title = "Outputs" if layer is None else f"Layer {int(layer.group(1)) + 1}"
    return title + (" (q)" if grn.endswith(".q") else "")


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_weights")
    if summary is None:
        return []
    kinds, decay_only = summary["kinds"], summary.get("decay_only_b")
    paths = []
    for family, members in FAMILIES.items():
        present = [k for k in members if k in kinds]
        if not present:
            continue
        profiles = {k: {r["grn"]: r for r in kinds[k]["profile_seed_mean"]} for k in present}
        effective = {k: {r["grn"]: r for r in kinds[k].get("effective_seed_mean") or []}
                     for k in present}
        grns = panel_grns(list(profiles[present[0]]))
        has_effective = all(effective[k] for k in present)
        # with a second row: what the GRN weights each entry by, gate included
        fig, axes = figure(len(grns), nrows=2 if has_effective else 1, width=FULL,
                           height=3.6 if has_effective else 1.9, sharey="row", squeeze=False)
        rows = []
        for col, grn in enumerate(grns):
            ax = axes[0, col]
            for k in present:
                r, gate = profiles[k][grn], gates.canonical(kinds[k]["grn_gate"])
                x = np.arange(len(r["slots"]))
                color = gate_color(gate)
                ax.plot(x, r["median"], color=color, marker="o", ms=2.5, label=GATE_LABELS[gate])
                ax.fill_between(x, r["low"], r["high"], color=color, alpha=0.12, lw=0)
                eff = effective[k].get(grn) if has_effective else None
                if eff is not None:
                    axes[1, col].plot(x, eff["median_coefficient"], color=color, marker="o",
                                      ms=2.5)
                rows += [{"family": family, "kind": k, "gate": gate, "grn": grn, "slot": sl,
                          "median_b": md, "p5_b": lo, "p95_b": hi,
                          **({"median_coefficient": eff["median_coefficient"][i],
                              "frac_switched_off": eff["frac_switched_off"][i]} if eff else {})}
                         for i, (sl, md, lo, hi) in enumerate(zip(r["slots"], r["median"],
                                                                  r["low"], r["high"]))]
            ax.axhline(1.0, color="0.6", lw=0.6, ls=":")  # the initial value b = 1
            if decay_only is not None:  # where b = 1 ends under weight decay alone
                ax.axhline(decay_only, color="0.3", lw=0.7, ls="-.",
                           label="decay only" if col == 0 else None)
            ticks = slot_ticks(profiles[present[0]][grn]["slots"])
            ax.set(xticks=x, xticklabels=ticks, title=_panel_title(grn))
            if has_effective:
                axes[1, col].axhline(1.0, color="0.6", lw=0.6, ls=":")
                axes[1, col].axhline(0.0, color="0.3", lw=0.6)
                axes[1, col].set(xticks=x, xticklabels=ticks, xlabel="stack entry")
            else:
                ax.set_xlabel("stack entry")
        axes[0, 0].set_ylabel("bias value b")
        axes[0, 0].legend(loc="lower left", fontsize=5)
        if has_effective:
            axes[1, 0].set_ylabel("effective weight c\n(token mean)")
        fig.suptitle(f"{scheme_label(family)}: learned bias per stack entry (median over "
                     "features, 5-95% band)" + ("; below: the weight with the gate acting"
                                                if has_effective else ""), fontsize=7)
        paths += save(fig, out_dir, f"{NAME}_{family}", rows=rows)
    return paths
