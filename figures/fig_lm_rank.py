"""Effective rank of the LM's sublayer Jacobians beside DCA's gain (``experiments/lm_rank``).

(a) Effective rank / width of the attention, MLP and residual-update Jacobians against width
    (mean over layers and seeds; vanilla solid, DCA dashed).
(b) The same per layer for the residual update (vanilla), one line per width: where in depth
    the spectrum is concentrated.
(c) D = 100 (ln ppl_DCA - ln ppl_vanilla) against vanilla's update rank fraction, one point per
    (seed, width): the pre-stated statistic (Pearson r with its Fisher-z 95% interval in the
    title). The bottleneck argument predicts a rising cloud.
Reads ``results_dir/lm_rank/summary.json`` only; returns [] when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import SWEEP_COLORS, figure, save, saved_summary, scheme_label

KIND = "experiment"
NAME = "fig_lm_rank"
SUBLAYERS = ("attn", "mlp", "update")
MARKERS = {"attn": "o", "mlp": "s", "update": "^"}


def rows_of(summary: dict) -> list[dict]:
    """The summary's (seed, width) cells: D and both models' layer-mean rank fractions."""
    return [dict(c) for c in summary["cells"]]


def _panel_sublayers(ax, rows):
    widths = sorted({r["width"] for r in rows})
    for i, part in enumerate(SUBLAYERS):
        for kind, ls in (("vanilla", "-"), ("dca", "--")):
            y = [np.mean([r[f"{kind}_{part}_eff_rank_frac"] for r in rows if r["width"] == w])
                 for w in widths]
            ax.plot(widths, y, color=SWEEP_COLORS[i], ls=ls, marker=MARKERS[part], ms=3,
                    label=f"{part} ({scheme_label(kind)})")
    ax.set(xscale="log", xlabel="width", ylabel="effective rank / width", ylim=(0, 1.0),
           title="(a) sublayer Jacobians")
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.minorticks_off()
    ax.legend(fontsize=5.5, ncols=2)


def _panel_layers(ax, summary):
    widths = sorted({int(k.split("-w")[1]) for k in summary["profiles"]})
    for j, w in enumerate(widths):
        per_seed = summary["profiles"][f"vanilla-w{w}"]
        layers = np.mean([[x["update_eff_rank_frac"] for x in seed] for seed in per_seed], 0)
        ax.plot(np.arange(len(layers)), layers, color=SWEEP_COLORS[j % len(SWEEP_COLORS)],
                marker="o", ms=3, label=f"width {w}")
    ax.set_xticks(np.arange(len(layers)))
    ax.set(xlabel="layer", ylabel="update effective rank / width", ylim=(0, 1.0),
           title=f"(b) per layer ({scheme_label('vanilla')})")
    ax.legend()


def _panel_gain(ax, summary, rows):
    widths = sorted({r["width"] for r in rows})
    for j, w in enumerate(widths):
        sel = [r for r in rows if r["width"] == w]
        ax.scatter([r["vanilla_update_eff_rank_frac"] for r in sel], [r["D"] for r in sel],
                   color=SWEEP_COLORS[j % len(SWEEP_COLORS)], s=14, label=f"width {w}")
    ax.axhline(0, color="0.3", lw=0.6)
    p = summary["primary"]
    ci = f" [{p['ci'][0]:+.2f}, {p['ci'][1]:+.2f}]" if p["ci"] else ""
    ax.set(xlabel=f"{scheme_label('vanilla')} update effective rank / width",
           ylabel="D = 100 Δ ln ppl", title=f"(c) r = {p['pearson_r']:+.2f}{ci}")
    ax.legend(fontsize=5.5, markerscale=0.8)


def draw(summary: dict | None, out_dir: Path, name: str) -> list[Path]:
    """The three panels of ``summary`` (an ``lm_rank``-shaped summary) saved as ``name``; []
    without cells."""
    if summary is None or not summary.get("cells"):
        return []
    rows = rows_of(summary)
    fig, axes = figure(3, height=2.3)
    _panel_sublayers(axes[0], rows)
    _panel_layers(axes[1], summary)
    _panel_gain(axes[2], summary, rows)
    return save(fig, out_dir, name, rows=rows,
                data={"primary": summary["primary"],
                      "slope_vs_log2_width": summary["slope_vs_log2_width"]})


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    return draw(saved_summary(results_dir, "lm_rank"), out_dir, NAME)
