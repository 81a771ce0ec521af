"""Retrofitting DCA into a trained Transformer (paper Table 4), on Tiny Shakespeare (char) at
CPU scale: is the function preserved, and does continued training as DCA beat continued training
as a Transformer?

**Claim tested.** Paper Table 4 (6-layer LM1B Transformer pre-trained for 500k steps):
"identical to a standard residual network at initialization, adding DCA to a pre-trained model
does not alter its function"; continued for 20k / 40k / 60k more steps, test perplexity
Transformer 18.98 -> 18.96 / 18.96 / 18.96, DCA 18.98 -> 18.81 / 18.79 / 18.79, i.e.
DCA - Transformer -0.15 / -0.17 / -0.17 (continuations of 4% / 8% / 12% of the pre-training
steps).

**Design.** The runs of :func:`dca_theory.lab.lm_grid.retrofit_specs` (shared run cache): the
standard width-64, depth-4 vanilla model (400 steps, seeds 0, 1, 2), continued for
``RETROFIT_STEPS`` = 200 more steps (at the learning rate its inverse-square-root schedule had
reached, constant, no new warm-up; the paper's continuation schedule is NOT FOUND) once as
vanilla and once converted by :func:`dca_theory.lm.retrofit.retrofit` into DCA (GRNs at b = 1,
w = 0). Both continuations see the same batches, so differences are paired by seed.
Function preservation is MEASURED here: the pretrained models are loaded, retrofitted, and both
are run on the first 6 validation batches (16 x 64 characters each; float32): the largest
logit difference (absolute and relative to the largest logit) and the loss difference.
Table-4-like rows: validation perplexity at +50 / +100 (periodic evaluations on the first 6
validation batches; the pretrained reference is recomputed on the same 6 batches) and at +200
(whole split), and the final whole-split test perplexity.

**Command.** ``dca-theory run lm_retrofit`` (full; reads / fills ``experiments/results/lm_runs``,
writes ``experiments/results/lm_retrofit``) or ``dca-theory run lm_retrofit --quick`` (width 16,
depth 2, 30 + 20 steps, seeds 0, 1; cache ``runs/lm_runs``). Figure:
``figures/fig_lm_retrofit.py``.

**Runtime.** Full, from an empty cache: one 400-step run and two 200-step runs x 3 seeds, about
5-8 CPU-minutes on 2 cores, seconds on a GPU; with the cache filled (by ``python -m
dca_theory.lab.lm_grid``) the preservation check takes under a minute (two compilations).
Quick, from an empty quick cache: about 1 minute on an idle 2-core machine.

Measured: with the cache filled, 3 min 13 s wall (21 s CPU) on the shared, heavily loaded
2-core machine; quick mode 3 min 55 s wall (79 s CPU) there.

**Expected result** (measured, committed run; see ``paper/05_lm/retrofit.md``): the retrofitted
models match the pretrained ones to 8.5e-7 of the largest logit (loss to 1.7e-9 relative,
float32). After +200 steps, test perplexity Transformer 9.666 ± 0.117, DCA 9.642 ± 0.114
(pretrained 10.468); paired DCA - Transformer -0.0246 ± 0.0065 (p = 0.023, 3/3 seeds; paper
-0.17). The validation gap grows with continuation steps: -0.003 (+50), -0.011 (+100),
-0.024 (+200).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dca_theory.io import RunDir
from dca_theory.lab.lm_grid import RETROFIT_STEPS, retrofit_specs
from dca_theory.lab.lm_runs import cached_corpus, ensure_run, load_models, ppl
from dca_theory.lab.lm_settings import RetrofitSettings, experiment_settings, run_cache, run_config
from dca_theory.lab.statistics import mean_std, paired
from dca_theory.overrides import run_dir, summary_entry

NAME = "lm_retrofit"
KINDS: tuple[str, ...] = ("vanilla", "dca")
ROW_STEPS: tuple[int, ...] = (50, 100, RETROFIT_STEPS)  # Table 4's +20k / +40k / +60k analogue
#: paper Table 4: continuation steps -> test perplexity (Transformer, DCA), 500k pre-training
PAPER_TABLE4 = [{"steps": 0, "vanilla": 18.98, "dca": 18.98},
                {"steps": 20_000, "vanilla": 18.96, "dca": 18.81},
                {"steps": 40_000, "vanilla": 18.96, "dca": 18.79},
                {"steps": 60_000, "vanilla": 18.96, "dca": 18.79}]
PAPER_PRETRAIN_STEPS = 500_000


def _logits_fn():
    import equinox as eqx
    import jax

    @eqx.filter_jit
    def logits(model, inputs_BxL):
        return jax.vmap(lambda t: model(t, inference=True))(inputs_BxL)

    return logits


def nll_sum(logits_BxLxV: np.ndarray, batch: dict) -> tuple[float, float]:
    """Summed token NLL (float64) and summed weight of one evaluation batch."""
    z = logits_BxLxV.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    tok = np.take_along_axis(logp, batch["targets"][..., None].astype(np.int64), -1)[..., 0]
    w = batch["weights"].astype(np.float64)
    return float(-(tok * w).sum()), float(w.sum())


def preservation(pairs, batches: list[dict]) -> dict:
    """Compare ``(vanilla, retrofitted)`` model pairs (one per seed) on ``batches``: largest
    |logit difference| (absolute, and relative to the largest |logit|) and the mean-NLL
    difference, per seed; also each model's mean NLL."""
    logits = _logits_fn()
    per_seed = []
    for van, dca in pairs:
        max_diff = scale = 0.0
        sums = np.zeros((2, 2))  # model x (nll, weight)
        for batch in batches:
            la = np.asarray(logits(van, batch["inputs"]))
            lb = np.asarray(logits(dca, batch["inputs"]))
            max_diff = max(max_diff, float(np.max(np.abs(la - lb))))
            scale = max(scale, float(np.max(np.abs(la))))
            sums += [nll_sum(la, batch), nll_sum(lb, batch)]
        loss_v, loss_d = sums[:, 0] / sums[:, 1]
        per_seed.append({"max_abs_logit_diff": max_diff, "max_abs_logit": scale,
                         "rel_logit_diff": max_diff / scale, "vanilla_loss": float(loss_v),
                         "dca_loss": float(loss_d), "abs_loss_diff": float(abs(loss_d - loss_v)),
                         "rel_loss_diff": float(abs(loss_d - loss_v) / loss_v)})
    worst = {k: max(s[k] for s in per_seed)
             for k in ("max_abs_logit_diff", "rel_logit_diff", "abs_loss_diff", "rel_loss_diff")}
    return {"per_seed": per_seed, "worst": worst, "n_batches": len(batches)}


def valid_curves(records: dict[str, dict], pre_partial: list[float], pre_whole: list[float]):
    """``{kind: [{"step", "valid_ppl" (per seed), "whole_split"}]}`` of the continuations, with
    step 0 the pretrained model (the partial-split value, same batches as the periodic ones)."""
    out = {}
    for kind in KINDS:
        hist = records[kind]["valid_history"]
        last = hist[-1]["step"]
        out[kind] = [{"step": 0, "valid_ppl": list(pre_partial), "whole_split": False}]
        out[kind] += [{"step": e["step"], "valid_ppl": e["valid_ppl"],
                       "whole_split": e["step"] == last} for e in hist]
    out["pretrained_whole_split"] = list(pre_whole)
    return out


def table_rows(curves: dict, row_steps) -> list[dict]:
    """Table 4's rows: per continuation step, each kind's valid perplexity, the seed-paired
    DCA - vanilla difference, and each kind's change since the pretrained model (on the same
    batches: partial split for periodic steps, whole split for the last)."""
    rows = []
    for step in row_steps:
        at = {k: next((e for e in curves[k] if e["step"] == step), None) for k in KINDS}
        if any(v is None for v in at.values()):
            continue
        whole = at["vanilla"]["whole_split"]
        ref = curves["pretrained_whole_split"] if whole else curves["vanilla"][0]["valid_ppl"]
        row = {"step": step, "whole_split": whole, "pretrained": mean_std(ref)}
        for k in KINDS:
            row[k] = mean_std(at[k]["valid_ppl"])
            row[f"{k}_change"] = paired(ref, at[k]["valid_ppl"])
        row["dca_minus_vanilla"] = paired(at["vanilla"]["valid_ppl"], at["dca"]["valid_ppl"])
        rows.append(row)
    return rows


def settings(quick: bool = False, overrides=()) -> RetrofitSettings:
    """The quick or full preset with ``--set key=value`` overrides applied (validated)."""
    return experiment_settings(RetrofitSettings, quick, overrides, retrofit_specs)


def main(quick: bool = False, out=None, overwrite: bool = False, overrides=()) -> Path:
    from dca_theory.lm import data as lm_data
    from dca_theory.lm.retrofit import retrofit

    cfg = settings(quick, overrides)
    specs = retrofit_specs(quick, cfg)
    # Table 4's rows (full mode): with --set, those of ROW_STEPS within the continuation, and
    # its last step
    row_steps = ROW_STEPS if not overrides else (
        *[n for n in ROW_STEPS[:-1] if n < cfg.continue_steps], cfg.continue_steps)
    config = {"experiment": NAME, "quick": quick, "seeds": list(cfg.seeds),
              "runs": {k: s.describe()
                       for k, s in specs.items()},
              "row_steps": list(row_steps)}
    run = RunDir(out or run_dir(NAME, quick, overrides), run_config(config, cfg, overrides),
                 overwrite=overwrite)
    cache = run_cache(NAME, quick, out, overrides)
    records = {k: ensure_run(s, cache) for k, s in specs.items()}
    for k, r in records.items():
        run.log(kind=k, key=specs[k].key, params=r["n_params"], test_ppl=r["test_ppl"],
                valid_ppl=r["valid_ppl"], steps=specs[k].train.steps)

    pre = specs["pretrained"]
    vanilla_models = load_models(pre, cache)
    dca_cfg = specs["dca"].model
    pairs = [(m, retrofit(m, dca_cfg.replace(vocab_size=m.cfg.vocab_size)))
             for m in vanilla_models]
    valid = cached_corpus(pre.train.data).valid
    kw = {"seq_len": pre.train.seq_len, "batch_size": pre.train.batch_size}
    # The batches of the periodic evaluations: the check, and the pretrained models' reference
    # for the +50 / +100 rows (the continuations were evaluated on exactly these batches).
    batches = list(lm_data.eval_batches(valid, **kw,
                                        max_batches=specs["vanilla"].train.eval_batches))
    check = preservation(pairs, batches)
    run.log(kind="preservation", **check["worst"])
    pre_partial = [float(np.exp(s["vanilla_loss"])) for s in check["per_seed"]]

    curves = valid_curves(records, pre_partial, ppl(records["pretrained"], "valid"))
    steps = row_steps if not quick else [e["step"] for e in curves["vanilla"][1:]]
    summary = {
        "preservation": check,
        "pretrained": {"test_ppl": mean_std(ppl(records["pretrained"], "test")),
                       "test_ppl_per_seed": ppl(records["pretrained"], "test"),
                       "valid_ppl_per_seed": ppl(records["pretrained"], "valid"),
                       "valid_ppl_partial_per_seed": pre_partial,
                       "steps": pre.train.steps},
        "continued": {k: {"test_ppl": mean_std(ppl(records[k], "test")),
                          "test_ppl_per_seed": ppl(records[k], "test"),
                          "params": records[k]["n_params"], "lr": specs[k].train.lr,
                          "steps": specs[k].train.steps} for k in KINDS},
        "test_dca_minus_vanilla": paired(ppl(records["vanilla"], "test"),
                                         ppl(records["dca"], "test")),
        "test_change_vs_pretrained": {k: paired(ppl(records["pretrained"], "test"),
                                                ppl(records[k], "test")) for k in KINDS},
        "valid_curves": curves, "table": table_rows(curves, steps),
        "paper_table4": {"rows": PAPER_TABLE4, "pretrain_steps": PAPER_PRETRAIN_STEPS},
        "cache": str(cache), **summary_entry(overrides),
    }
    run.finish(summary)
    return run.path
