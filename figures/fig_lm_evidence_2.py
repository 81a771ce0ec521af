"""The second evidence design's rates and verdicts (``experiments/lm_evidence_2``).

Top row, one panel per primary-corpus width: the registered rate sweeps. Validation
ln-perplexity x 100 at the sweep budget against the learning rate, one line per arm, as a gap
to the lowest point of the panel; the rate each arm's full-budget runs use is ringed, a best
rate at the edge of its grid drawn as a square.
Bottom row:
(a) H1 and H2: D = 100 (ln ppl_arm - ln ppl_base) on the test split against width; each DCA
    gate against the parameter-matched vanilla (H2) and ``dca_paper`` against vanilla (H1,
    its seed-clustered slope in the title); per seed (dots), mean and 95 % t-interval.
(b) H4: the gate pairs' D per width and their mean over the widths (the registered statistic),
    the default gate the rule picks in the title.
(c) Part D: D(``dca_paper`` at vanilla's rate - at its own rate) per width, the size of the
    rate confound (0 where the two rates coincide).
(d) H5: per width, the vanilla models' measured update rank r_*/d (per seed and mean) against
    Theorem 4.3's threshold/d for ``dca_paper`` (GRN-v2) at each registered kappa; below a
    threshold a gain is guaranteed. Each width's score at the headline kappa is printed.
Reads ``results_dir/lm_evidence_2/summary.json`` only; returns [] when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from dca_theory.lab import lm_evidence_analysis as A

from .style import FULL, RC, gate_color, save, saved_summary, scheme_color

KIND = "experiment"
NAME = "fig_lm_evidence_2"
GATES = ("paper", "open", "bias_inside")
#: arm -> colour; the DCA arms in their gate's colour
ARM_COLORS = {"vanilla": scheme_color("vanilla"), "vanilla_matched": "#d62728",
              **{f"dca_{g}": gate_color(g) for g in GATES}}
PAIR_COLORS = {"paper-open": "#1f77b4", "paper-bias_inside": "#2ca02c",
               "open-bias_inside": "#9467bd"}


def _color(arm: str) -> str:
    return ARM_COLORS.get(arm) or scheme_color(arm)  # related-work arms: their scheme's


def _interval(ax, x, g, colour, label=None) -> None:
    """Per-seed dots, then the mean with its 95 % t-interval (a bare mean without one)."""
    ax.scatter([x] * len(g["per_seed"]), g["per_seed"], s=5, color=colour, alpha=0.35)
    lo, hi = g.get("ci95") or [g["mean"], g["mean"]]
    ax.errorbar([x], [g["mean"]], yerr=[[g["mean"] - lo], [hi - g["mean"]]], color=colour,
                marker="o", ms=3, capsize=2, label=label)


def _gap_axes(ax, ticks, labels, ylabel: str, title: str | None, legend: bool,
              zero: bool = True) -> None:
    """The bottom row's common frame: a zero line, one tick per width, labels, legend."""
    if zero:
        ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(ticks, labels)
    ax.set_xlabel("width")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=7)
    if legend:
        ax.legend(fontsize=5.5)


def _sweep_cells(summary: dict) -> dict[int, dict[str, dict]]:
    """width -> arm -> sweep cell, on the primary corpus."""
    out: dict[int, dict[str, dict]] = {}
    for name, cell in summary["sweeps"].items():
        data, arm, w = name.split("/")
        if data == summary["primary_data"]:
            out.setdefault(int(w[1:]), {})[arm] = cell
    return dict(sorted(out.items()))


def _sweep_panel(ax, width: int, cells: dict[str, dict], rates: dict, data: str) -> list[dict]:
    low = min(v for c in cells.values() for v in c["valid_ln_ppl"].values())
    rows = []
    for arm, cell in cells.items():
        lr = sorted(cell["valid_ln_ppl"], key=float)
        y = [100 * (cell["valid_ln_ppl"][r] - low) for r in lr]
        ax.plot([float(r) for r in lr], y, marker=".", ms=3, lw=1, color=_color(arm), label=arm)
        used = rates.get(f"{data}/{arm}/w{width}", {}).get("lr", cell["lr"])
        at = 100 * (cell["valid_ln_ppl"][next(r for r in lr if float(r) == used)] - low)
        ax.scatter([used], [at], s=28, facecolors="none", edgecolors=_color(arm),
                   marker="s" if cell["at_grid_edge"] else "o", lw=1)
        rows += [{"panel": "sweep", "width": width, "arm": arm, "lr": float(r),
                  "value": cell["valid_ln_ppl"][r], "chosen": float(r) == used} for r in lr]
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=2)
    ax.set_xlabel("learning rate")
    ax.set_title(f"sweep, width {width}", fontsize=7)
    return rows


def _pseudo_records(summary: dict) -> dict[tuple[str, int], dict]:
    """The main runs' per-seed test perplexities in the form the gap functions read."""
    out = {}
    for name, row in summary["rows"].get(summary["primary_data"], {}).items():
        arm, w = name.rsplit("-w", 1)
        out[(arm, int(w))] = {"seeds": row["seeds"], "test_ppl": row["test_ppl_per_seed"]}
    return out


def _h1_h2(ax, summary: dict) -> list[dict]:
    shown = {f"dca_{g}": summary["H2"].get(f"dca_{g}", {}) for g in GATES}
    shown["dca_paper vs vanilla"] = A.per_width_gaps(_pseudo_records(summary), "dca_paper",
                                                     "vanilla")
    rows, widths = [], sorted({int(w) for gaps in shown.values() for w in gaps})
    for j, (name, gaps) in enumerate(shown.items()):
        colour = "k" if name.endswith("vanilla") else _color(name)
        label = ("paper vs vanilla" if name.endswith("vanilla")
                 else f"{name.removeprefix('dca_')} vs matched")
        xs = []
        for k, w in enumerate(sorted(gaps, key=int)):
            xs.append(np.log2(int(w)) + 0.07 * (j - 1.5))
            _interval(ax, xs[-1], gaps[w], colour, label if k == 0 else None)
            rows.append({"panel": "H1/H2", "width": int(w), "arm": name,
                         "lr": None, "value": gaps[w]["mean"], "chosen": None})
        ax.plot(xs, [gaps[w]["mean"] for w in sorted(gaps, key=int)], color=colour, lw=0.8)
    h1 = summary["H1"]
    title = (f"H1: {h1['verdict']}\nslope {h1['slope']:+.2f} [{h1['ci'][0]:+.2f}, "
             f"{h1['ci'][1]:+.2f}] per doubling" if h1.get("slope") is not None else None)
    _gap_axes(ax, np.log2(widths), [str(w) for w in widths], "D (test)", title, False)
    if rows:
        ax.legend(fontsize=5.5, loc="upper left")
    return rows


def _h4(ax, h4: dict) -> list[dict]:
    by = h4.get("by_width") or {}
    columns = [*sorted(by, key=int), "mean"]
    rows = []
    for j, (pair, colour) in enumerate(PAIR_COLORS.items()):
        for i, col in enumerate(columns):
            g = (h4.get("pairs") or {}).get(pair) if col == "mean" else by[col].get(pair)
            if g:
                _interval(ax, i + 0.15 * (j - 1), g, colour, pair if i == 0 else None)
                rows.append({"panel": "H4", "width": col, "arm": pair, "lr": None,
                             "value": g["mean"], "chosen": None})
    title = (f"H4: {h4.get('winner') or 'no gate'} wins\ndefault gate {h4['default_gate']}"
             if h4.get("default_gate") else None)
    _gap_axes(ax, range(len(columns)), columns, "D(g1 - g2), test", title, bool(rows))
    return rows


def _shared(ax, shared: dict) -> list[dict]:
    confound = shared.get("confound") or {}
    rows = []
    for w, g in sorted(confound.items(), key=lambda kv: int(kv[0])):
        _interval(ax, np.log2(int(w)), g, ARM_COLORS["dca_paper"])
        rows.append({"panel": "shared rate", "width": int(w), "arm": "dca_paper",
                     "lr": None, "value": g["mean"], "chosen": None})
    widths = sorted(int(w) for w in confound)
    if not confound:
        ax.text(0.5, 0.5, "part D not run yet", transform=ax.transAxes, ha="center")
    _gap_axes(ax, np.log2(widths), [str(w) for w in widths], "D(vanilla's rate - own rate)",
              "part D: rate confound\n(dca_paper)", False)
    return rows


def _h5(ax, h5: dict) -> list[dict]:
    cells = sorted((c for c in (h5.get("cells") or {}).values() if c["arm"] == "dca_paper"),
                   key=lambda c: (c["corpus"], c["width"]))
    rows = []
    for c in cells:
        x = np.log2(c["width"])
        ax.scatter([x] * len(c["r_frac_per_seed"]), c["r_frac_per_seed"], s=5, color="k",
                   alpha=0.35)
        ax.plot([x], [c["r_frac_mean"]], "ko", ms=3)
        ax.annotate(c["score"].replace(" ", "\n", 1), (x, c["r_frac_mean"]), fontsize=5,
                    xytext=(3, 3), textcoords="offset points")
        rows.append({"panel": "H5", "width": c["width"], "arm": f"{c['corpus']}/dca_paper",
                     "lr": None, "value": c["r_frac_mean"], "chosen": None})
    xs = [np.log2(c["width"]) for c in cells]
    for k, colour in zip(sorted({k for c in cells for k in c["prediction"]}, key=float),
                         ("#9ecae1", "#3182bd", "#08519c")):
        ax.plot(xs, [c["prediction"][k]["threshold_frac"] for c in cells], color=colour,
                lw=1, label=f"threshold, κ = {k}")
    widths = [c["width"] for c in cells]
    if not cells:
        ax.text(0.5, 0.5, "ranks not measured yet", transform=ax.transAxes, ha="center")
    _gap_axes(ax, xs, [str(w) for w in widths], "r_* / d (vanilla)",
              f"H5: Thm 4.3 threshold (GRN-v2)\nscored at κ = {h5.get('headline_kappa')}",
              False, zero=False)
    if cells:
        ax.legend(fontsize=5.5, loc="center right")
    return rows


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_evidence_2")
    if summary is None or not summary.get("sweeps"):
        return []
    sweeps = _sweep_cells(summary)
    plt.rcParams.update(RC)
    fig = plt.figure(figsize=(FULL, 5.0), layout="constrained")
    top, bottom = fig.subfigures(2, 1)
    rows = []
    for ax, (w, cells) in zip(np.atleast_1d(top.subplots(1, len(sweeps))), sweeps.items()):
        rows += _sweep_panel(ax, w, cells, summary["rates"], summary["primary_data"])
    fig.axes[0].set_ylabel("100 (ln ppl - panel's lowest), valid")
    fig.axes[0].legend(fontsize=5.5)
    gaps, gates, shared, ranks = bottom.subplots(1, 4, width_ratios=[1.3, 1.1, 0.8, 1.1])
    rows += _h1_h2(gaps, summary)
    rows += _h4(gates, summary["H4"])
    rows += _shared(shared, summary["shared_rate"])
    rows += _h5(ranks, summary["H5"])
    return save(fig, out_dir, NAME, rows=rows,
                data={"H1": summary["H1"], "H4_default_gate": summary["H4"].get("default_gate"),
                      "shared_rate": summary["shared_rate"].get("confound"),
                      "H5_scores": {k: c["score"] for k, c in summary["H5"]["cells"].items()}})
