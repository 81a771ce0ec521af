"""The evidence experiment's primary result (``experiments/lm_evidence``).

(a) D = 100 (ln ppl_arm - ln ppl_vanilla) on the test split against width, per comparison
    (DCA with the default gate, DCA with the paper's gate, DCA against the parameter-matched
    vanilla): per seed (dots) and mean with its 95 % t-interval; the primary comparison's
    seed-clustered slope and its CI in the title.
(b) D of the primary comparison on the whole validation split along training, against
    training tokens (log scale), one line per width (mean over seeds).
(c) By corpus at the secondary width: each DCA arm against vanilla and the gate gap
    D(dca - dca_paper) (H3), per seed and mean with its 95 % t-interval; the pairwise
    corpus comparison of the gate gap (Welch, Holm) in the title once two corpora have it.
Reads ``results_dir/lm_evidence/summary.json`` only; returns [] when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import SWEEP_COLORS, figure, save, saved_summary, scheme_color

KIND = "experiment"
NAME = "fig_lm_evidence"
#: comparison -> (label, colour)
SHOWN = {"dca-vanilla": ("DCA (default gate) - vanilla", scheme_color("dca")),
         "dca_paper-vanilla": ("DCA (paper gate) - vanilla", "#7f7f7f"),
         "dca-vanilla_matched": ("DCA - param.-matched vanilla", "#d62728")}
PRIMARY = "dca-vanilla"
#: comparison -> (label, colour) of panel (c)
BY_CORPUS = {"dca-vanilla": SHOWN["dca-vanilla"], "dca_paper-vanilla": SHOWN["dca_paper-vanilla"],
             "dca-dca_paper": ("gate gap: default - paper", "#9467bd")}


def rows_of(summary: dict) -> list[dict]:
    """One CSV row per (dataset, comparison, width)."""
    rows = []
    for name, data in summary["datasets"].items():
        for comp, c in data.get("comparisons", {}).items():
            for w, g in c["test_D"].items():
                rows.append({"data": name, "comparison": comp, "width": int(w),
                             "D_mean": g["mean"], "ci_low": (g["ci95"] or [None, None])[0],
                             "ci_high": (g["ci95"] or [None, None])[1], "p_holm": g["p_holm"],
                             "n_seeds": g["n"]})
    return rows


def _mean_and_interval(ax, x, g, colour, label=None):
    ax.scatter([x] * len(g["per_seed"]), g["per_seed"], s=6, color=colour, alpha=0.4)
    lo, hi = g["ci95"] or [g["mean"], g["mean"]]
    ax.errorbar([x], [g["mean"]], yerr=[[g["mean"] - lo], [hi - g["mean"]]], color=colour,
                marker="o", ms=3, capsize=2, label=label)


def _by_corpus(ax, summary: dict) -> None:
    """Panel (c): the secondary width's comparisons on every corpus that has them."""
    across = summary.get("gate_by_tokenisation") or {}
    width = str(across.get("width", 32))
    names = [n for n, d in summary["datasets"].items()
             if any(width in d["comparisons"].get(c, {}).get("test_D", {}) for c in BY_CORPUS)]
    labelled = set()
    for i, name in enumerate(names):
        comps = summary["datasets"][name]["comparisons"]
        for j, (comp, (label, colour)) in enumerate(BY_CORPUS.items()):
            g = comps.get(comp, {}).get("test_D", {}).get(width)
            if g is not None:
                _mean_and_interval(ax, i + 0.2 * (j - 1), g, colour,
                                   None if comp in labelled else label)
                labelled.add(comp)
    ax.axhline(0, color="k", lw=0.6)
    # corpus names run long ("python-stdlib-bpe"): break after the first hyphen so they fit
    ax.set_xticks(range(len(names)), [n.replace("-", "-\n", 1) for n in names], fontsize=6)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel(f"D (test), width {width}")
    if labelled:
        ax.legend(fontsize=6)
    tested = {k: r for k, r in (across.get("pairs") or {}).items() if r["p_holm"] is not None}
    title = "by corpus"
    if tested:
        name, r = min(tested.items(), key=lambda kv: kv[1]["p_holm"])
        title += (f"\ngate gap, most different:\n{name} {r['mean']:+.2f} "
                  f"(Holm p {r['p_holm']:.2g})")
    ax.set_title(title, fontsize=7)


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_evidence")
    if summary is None:
        return []
    data = summary["datasets"].get(summary["primary_data"])
    if not data:
        return []
    comps = data["comparisons"]
    fig, (ax_w, ax_t, ax_c) = figure(3, height=2.6)
    for j, (comp, (label, colour)) in enumerate(SHOWN.items()):
        if comp not in comps:
            continue
        widths = sorted(comps[comp]["test_D"], key=int)
        x = np.log2([int(w) for w in widths]) + 0.08 * (j - 1)
        for k, (xi, w) in enumerate(zip(x, widths)):
            _mean_and_interval(ax_w, xi, comps[comp]["test_D"][w], colour,
                               label if k == 0 else None)
        ax_w.plot(x, [comps[comp]["test_D"][w]["mean"] for w in widths], color=colour, lw=1)
    ax_w.axhline(0, color="k", lw=0.6)
    ax_w.set_xticks(np.log2([int(w) for w in sorted(comps[PRIMARY]["test_D"], key=int)]))
    ax_w.set_xticklabels(sorted(comps[PRIMARY]["test_D"], key=int))
    ax_w.set_xlabel("width")
    ax_w.set_ylabel("D (100 x log-ppl gap, test)")
    slope = comps[PRIMARY]["slope"]
    decision = data.get("decision", {})
    if slope:
        verdict = decision.get("verdict", "")
        if verdict == "pending":  # a slope over fewer than the registered widths
            verdict = (f"interim ({len(comps[PRIMARY]['test_D'])} widths), "
                       "registered verdict pending")
        ax_w.set_title(f"slope {slope['slope']:+.2f} [{slope['ci'][0]:+.2f}, "
                       f"{slope['ci'][1]:+.2f}] per doubling: {verdict}", fontsize=7)
    ax_w.legend(fontsize=6)
    for i, (w, points) in enumerate(sorted(comps[PRIMARY]["trajectory"].items(),
                                           key=lambda kv: int(kv[0]))):
        if points:
            ax_t.plot([p["tokens"] for p in points], [p["D_mean"] for p in points],
                      marker="o", ms=2, color=SWEEP_COLORS[i % len(SWEEP_COLORS)],
                      label=f"width {w}")
    ax_t.axhline(0, color="k", lw=0.6)
    ax_t.set_xscale("log")
    ticks = [0.5e6, 1e6, 2e6, 4e6, 8e6]  # the registered trajectory points
    ax_t.set_xticks(ticks, [f"{t / 1e6:g}M" for t in ticks])
    ax_t.minorticks_off()
    ax_t.set_xlabel("training tokens")
    ax_t.set_ylabel("D (validation), DCA - vanilla")
    if ax_t.get_legend_handles_labels()[0]:  # no trajectory before the first evaluation
        ax_t.legend(fontsize=6)
    _by_corpus(ax_c, summary)
    return save(fig, out_dir, NAME, rows=rows_of(summary),
                data={"trajectory": comps[PRIMARY]["trajectory"],
                      "decision": decision,
                      "gate_by_tokenisation": summary.get("gate_by_tokenisation")})
