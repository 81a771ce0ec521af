"""Width scaling of DCA's gain with the measured per-layer rank (``experiments/lm_width``;
paper Table 2 at CPU scale, plus the reviewers' rank question).

(a) Test perplexity against width, vanilla and DCA (mean ± std over seeds).
(b) Relative DCA - vanilla test-ppl difference (%) against width: ours (per seed and mean with
    95% CI) next to the paper's Table 2 (12-layer LM1B, widths 64-1024).
(c) Per-layer rank of the residual branches' per-token Jacobians as a fraction of the width
    (mean over layers; vanilla solid, DCA dashed): numerical rank (rtol 1e-2), effective and
    stable rank.
(d) Gain against collective rank / width: the normalised G2 guarantee of Theorem 4.3(ii) for
    three task complexities kappa (lines; 0 for r_*/d >= 1) and our relative gain (points, right
    axis; one colour per width, one marker per rank measure).
Reads ``results_dir/lm_width/summary.json`` only; returns [] when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import NullFormatter, NullLocator

from dca_theory.theory import normalised_gain_guarantee

from .style import SWEEP_COLORS, figure, save, saved_summary, scheme_color, scheme_label

KIND = "experiment"
NAME = "fig_lm_width"
#: the G2 bound's kind, as in the experiment's config (DCA with the ReLU gate trains as GRN-v2)
THEORY_KIND = "grn_v2"
MEASURES = {"rank_rtol_mean": ("rank (rtol 1e-2)", "o"),
            "effective_rank_mean": ("effective rank", "s"),
            "stable_rank_mean": ("stable rank", "^")}


def rows_of(summary: dict) -> list[dict]:
    """One CSV row per width: perplexities, paired differences and vanilla's rank fractions."""
    rows = []
    for w, r in sorted(summary["widths"].items(), key=lambda kv: int(kv[0])):
        row = {"width": int(w), "params_vanilla": r["vanilla"]["params"],
               "params_dca": r["dca"]["params"]}
        for k in ("vanilla", "dca"):
            row |= {f"{k}_test_ppl_mean": r[k]["test_ppl"]["mean"],
                    f"{k}_test_ppl_std": r[k]["test_ppl"]["std"]}
        p, rel = r["paired_test_ppl"], r["relative_pct"]
        row |= {"diff_mean": p["mean"], "diff_std": p["std"], "diff_p": p["p_value"],
                "rel_pct_mean": rel["mean"], "rel_pct_std": rel["std"]}
        for kind in ("vanilla", "dca"):
            layers = summary["ranks"].get(w, {}).get(kind, [])
            for m in ("rank_eps_mean", *MEASURES):
                row[f"{kind}_{m}_frac"] = (float(np.mean([x[f"{m}_frac"] for x in layers]))
                                           if layers else None)
        rows.append(row)
    return rows


def theory_curves(summary: dict) -> dict:
    """Normalised G2 guarantee on a grid of collective rank / width, per kappa, at d = 64."""
    d, frac = 64, np.geomspace(0.01, 5.0, 241)
    kappas = summary.get("theory_kappas") or ["0.3", "0.5", "0.8"]
    return {"d": d, "collective_frac": frac.tolist(),
            "guaranteed_gain_norm": {
                str(k): normalised_gain_guarantee(THEORY_KIND, d, frac * d, float(k)).tolist()
                for k in kappas}}


def _width_ticks(ax, widths):
    ax.set_xticks(widths, [str(x) for x in widths])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _panel_ppl(ax, rows):
    w = np.array([r["width"] for r in rows])
    for k in ("vanilla", "dca"):
        m = np.array([r[f"{k}_test_ppl_mean"] for r in rows])
        s = np.array([r[f"{k}_test_ppl_std"] for r in rows])
        ax.errorbar(w, m, yerr=s, color=scheme_color(k), marker="o", ms=3, capsize=2,
                    label=scheme_label(k))
    ax.set(xscale="log", xlabel="width", ylabel="test ppl", title="(a) perplexity")
    _width_ticks(ax, w)
    ax.legend()


def _panel_relative(ax, summary, rows):
    for r in rows:
        per_seed = summary["widths"][str(r["width"])]["relative_pct"]["per_seed"]
        ax.scatter(np.full(len(per_seed), r["width"]), per_seed, s=6, color=scheme_color("dca"),
                   alpha=0.4, lw=0)
    w = np.array([r["width"] for r in rows])
    ci = [summary["widths"][str(x)]["relative_pct"]["ci95"] for x in w]
    mean = np.array([r["rel_pct_mean"] for r in rows])
    err = np.array([[m - c[0], c[1] - m] if c else [0, 0] for m, c in zip(mean, ci)]).T
    ax.errorbar(w, mean, yerr=err, color=scheme_color("dca"), marker="o", ms=3, capsize=2,
                label="ours (95% CI)")
    paper = summary["paper_table2"]
    pw = np.array(sorted(int(x) for x in paper))
    ax.plot(pw, [paper[str(x)]["relative_pct"] for x in pw], color="0.5", marker="s", ms=3,
            ls="--", label="paper Table 2")
    ax.axhline(0, color="0.3", lw=0.6)
    ax.set(xscale="log", xlabel="width",
           ylabel=f"{scheme_label('dca')} vs {scheme_label('vanilla')} (%)",
           title="(b) relative test-ppl change")
    ax.legend()


def _panel_rank(ax, rows):
    w = np.array([r["width"] for r in rows])
    for i, (m, (label, marker)) in enumerate(MEASURES.items()):
        for kind, ls in (("vanilla", "-"), ("dca", "--")):
            y = [r[f"{kind}_{m}_frac"] for r in rows]
            if any(v is None for v in y):
                continue
            ax.plot(w, y, color=SWEEP_COLORS[i], ls=ls, marker=marker, ms=3,
                    label=label if kind == "vanilla" else None)
    ax.set(xscale="log", xlabel="width", ylabel="rank / width", ylim=(0, 1.05),
           title="(c) branch Jacobian rank")
    _width_ticks(ax, w)
    ax.legend(loc="center right")


def _panel_theory(ax, summary, curves):
    frac = np.array(curves["collective_frac"])
    for i, (k, g) in enumerate(curves["guaranteed_gain_norm"].items()):
        ax.plot(frac, g, color=f"{0.15 + 0.25 * i:.2f}", label=f"theory G2, κ={k}")
    ax.axvspan(1.0, frac[-1], color="0.9", lw=0)  # r* >= d: outside the theorem, no gain
    ax.set(xscale="log", xlim=(frac[0], frac[-1]), xlabel="collective rank / width (r*/d)",
           ylabel="guaranteed gain (norm.)", title="(d) gain vs rank", ylim=(-0.05, 1.05))
    twin = ax.twinx()
    widths = sorted(summary["theory"], key=int)
    for j, w in enumerate(widths):
        gain = -summary["widths"][w]["relative_pct"]["mean"] if w in summary["widths"] else None
        if gain is None:
            continue
        for m, (_, marker) in MEASURES.items():
            twin.scatter(summary["theory"][w][m]["collective_frac"], gain, marker=marker, s=14,
                         color=SWEEP_COLORS[j % len(SWEEP_COLORS)],
                         label=f"w={w}" if m == "rank_rtol_mean" else None)
    lo, hi = twin.get_ylim()
    twin.set_ylim(min(lo, 0.0), hi + 0.1 * (hi - min(lo, 0.0)))  # 0 visible: gains comparable
    twin.set_ylabel("our gain: -(DCA/vanilla - 1) (%)")
    twin.spines["right"].set_visible(True)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="lower left", fontsize=5.5)


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_width")
    if summary is None:
        return []
    rows = rows_of(summary)
    if not rows:
        return []
    curves = theory_curves(summary)
    fig, axes = figure(4, height=2.4)
    _panel_ppl(axes[0], rows)
    _panel_relative(axes[1], summary, rows)
    _panel_rank(axes[2], rows)
    _panel_theory(axes[3], summary, curves)
    return save(fig, out_dir, NAME, rows=rows, data={"theory_curves": curves,
                                                     "theory_points": summary["theory"]})
