"""Retrofitting DCA into a trained Transformer (``experiments/lm_retrofit``; paper Table 4 at
CPU scale).

Left: validation perplexity of the continuations (Transformer continued as a Transformer, and
converted to DCA) against continuation step, mean ± std over seeds; step 0 is the pretrained
model (identical for both, measured), open markers the periodic evaluations on the first
validation batches, filled markers the last, whole-split evaluation (with the pretrained
model's whole-split value as a dotted line). Right: the seed-paired DCA - Transformer
difference per seed and its mean. With one seed there is no spread: no band or error bar is
drawn, the left title says so and the CSV's ``valid_ppl_std`` is empty. Reads
``results_dir/lm_retrofit/summary.json`` only; writes PNG, PDF and a CSV of the plotted numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import (
    difference_label,
    figure,
    save,
    saved_summary,
    scheme_color,
    scheme_label,
    scheme_linestyle,
)

KIND = "experiment"
NAME = "fig_lm_retrofit"
KINDS = ("vanilla", "dca")


def _sd(a: np.ndarray, axis: int | None = None):
    """The sample standard deviation over seeds (``axis``), or None for one seed (no spread)."""
    n = a.size if axis is None else a.shape[axis]
    return a.std(axis=axis, ddof=1) if n > 1 else None


def make(out_dir: Path, results_dir: Path) -> list[Path]:
    summary = saved_summary(results_dir, "lm_retrofit")
    if summary is None:
        return []
    curves = summary["valid_curves"]
    fig, (ax, ax_d) = figure(2, height=2.4)
    rows = []
    for kind in KINDS:
        pts = curves[kind]
        step = np.array([p["step"] for p in pts])
        vals = np.array([p["valid_ppl"] for p in pts])  # steps x seeds
        whole = np.array([p["whole_split"] for p in pts])
        mean, std = vals.mean(axis=1), _sd(vals, axis=1)
        part = ~whole
        label = f"continued as {scheme_label(kind)}" + (" (retrofit)" if kind == "dca" else "")
        ax.plot(step[part], mean[part], color=scheme_color(kind), marker="o", ms=2.5, mfc="white",
                label=label, ls=scheme_linestyle(kind), zorder=3)
        if std is not None:
            ax.fill_between(step[part], (mean - std)[part], (mean + std)[part],
                            color=scheme_color(kind), alpha=0.15, lw=0)
        shift = (-0.015 if kind == "vanilla" else 0.015) * step.max()  # side by side
        ax.errorbar(step[whole] + shift, mean[whole], yerr=None if std is None else std[whole],
                    fmt="o", ms=3.5, color=scheme_color(kind), capsize=2)
        rows += [{"kind": kind, "step": int(s), "whole_split": bool(w), "valid_ppl_mean": m,
                  "valid_ppl_std": None if std is None else std[i],
                  "per_seed": " ".join(f"{v:.4f}" for v in row)}
                 for i, (s, w, m, row) in enumerate(zip(step, whole, mean, vals))]
    pre = np.array(curves["pretrained_whole_split"])
    last = max(p["step"] for p in curves["vanilla"])
    ax.hlines(pre.mean(), 0, last, colors="0.5", linestyles=":", lw=0.8,
              label="pretrained (whole split)")
    ax.set(xlabel="continuation step", ylabel="validation perplexity")
    if pre.size == 1:
        ax.set_title("one seed: no spread shown")
    ax.legend(loc="upper right")
    rows.append({"kind": "pretrained", "step": 0, "whole_split": True,
                 "valid_ppl_mean": pre.mean(), "valid_ppl_std": _sd(pre),
                 "per_seed": " ".join(f"{v:.4f}" for v in pre)})
    van = {p["step"]: np.array(p["valid_ppl"]) for p in curves["vanilla"]}
    steps = sorted(van)
    diff = np.array([np.array(next(p["valid_ppl"] for p in curves["dca"] if p["step"] == s))
                     - van[s] for s in steps])  # steps x seeds
    for j in range(diff.shape[1]):
        ax_d.plot(steps, diff[:, j], color=scheme_color("dca"), lw=0.6, alpha=0.5)
    ax_d.plot(steps, diff.mean(axis=1), color=scheme_color("dca"), marker="o", ms=2.5,
              label="mean")
    ax_d.axhline(0.0, color="0.5", lw=0.7)
    pres = summary["preservation"]["worst"]
    ax_d.set(xlabel="continuation step", ylabel=f"valid ppl, {difference_label('dca')}",
             title=f"at step 0: max rel. logit diff {pres['rel_logit_diff']:.1e}")
    rows += [{"kind": "dca-vanilla", "step": int(s), "whole_split": "", "valid_ppl_mean": d.mean(),
              "valid_ppl_std": _sd(d),
              "per_seed": " ".join(f"{v:.4f}" for v in d)} for s, d in zip(steps, diff)]
    return save(fig, out_dir, NAME, rows=rows)
