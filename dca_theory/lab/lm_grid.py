"""The training runs of every ``lm_*`` experiment, as :class:`~dca_theory.lab.lm_runs.RunSpec`
lists (one function per experiment, built from the experiment's settings in
:mod:`dca_theory.lab.lm_settings`; by default the quick or full preset), and ``python -m
dca_theory.lab.lm_grid [--quick]``, which trains the presets' runs into the cache in priority
order (so that later experiments only read it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dca_theory.lab.lm_runs import RunSpec, ensure_run, model_config, spec
from dca_theory.lab.lm_settings import (
    AblationSettings,
    DepthSettings,
    InputsSettings,
    KSettings,
    RelatedSettings,
    RetrofitSettings,
    WidthSettings,
)

# The full presets' sweeps (dca_theory.lab.lm_settings holds them with the quick ones).
_FULL = {cls: cls.preset(False) for cls in (AblationSettings, RelatedSettings, WidthSettings,
                                             DepthSettings, KSettings, RetrofitSettings)}
ABLATION_KINDS: tuple[str, ...] = _FULL[AblationSettings].kinds
RELATED_KINDS: tuple[str, ...] = _FULL[RelatedSettings].kinds
OPEN_GATE_KINDS: tuple[str, ...] = _FULL[AblationSettings].open_gate_kinds  # open gate: w trains
WIDTHS: tuple[int, ...] = _FULL[WidthSettings].widths  # 128 did not fit the CPU budget
DEPTHS: tuple[int, ...] = _FULL[DepthSettings].depths
K_DEPTH: int = _FULL[KSettings].depth
KS: tuple[int | None, ...] = _FULL[KSettings].ks
RETROFIT_STEPS: int = _FULL[RetrofitSettings].continue_steps


def ablation_specs(quick: bool, data: str = "shakespeare",
                   settings: AblationSettings | None = None) -> dict[str, RunSpec]:
    """Table 7: the five residual kinds (paper gate), plus GRN-v3 / DCA with the open gate."""
    s = settings or AblationSettings.preset(quick)
    out = {k: spec(k, data, quick, grid=s, residual=k) for k in s.kinds}
    out |= {f"{k}_open": spec(f"{k}_open", data, quick, grid=s, residual=k,
                              grn_gate="open")
            for k in s.open_gate_kinds}
    return out


def related_specs(quick: bool, data: str = "shakespeare",
                  settings: RelatedSettings | None = None) -> dict[str, RunSpec]:
    """Table 5: vanilla, 1x1 DenseFormer, Hyper-Connections, LAuReL-PA, DCA."""
    s = settings or RelatedSettings.preset(quick)
    kinds = ("vanilla", *s.kinds, "dca")
    return {k: spec(k, data, quick, grid=s, residual=k) for k in kinds}


def width_specs(quick: bool,
                settings: WidthSettings | None = None) -> dict[tuple[str, int], RunSpec]:
    """Table 2: vanilla and DCA across widths (4 heads, MLP 4x width) at the standard depth."""
    s = settings or WidthSettings.preset(quick)
    std = model_config(quick).d_model  # its runs are the standard ones of the other tables
    return {(k, w): spec(k if w == std else f"{k}-w{w}", s.train.data, quick, grid=s,
                         residual=k, d_model=w, n_heads=s.n_heads, d_mlp=s.mlp_ratio * w)
            for w in s.widths for k in ("vanilla", "dca")}


def depth_specs(quick: bool,
                settings: DepthSettings | None = None) -> dict[tuple[str, int], RunSpec]:
    """Figure 6: vanilla and DCA across depths at the standard width."""
    s = settings or DepthSettings.preset(quick)
    std = model_config(quick).n_layers
    return {(k, d): spec(k if d == std else f"{k}-L{d}", s.train.data, quick, grid=s,
                         residual=k, n_layers=d)
            for d in s.depths for k in ("vanilla", "dca")}


def k_specs(quick: bool, settings: KSettings | None = None) -> dict[str, RunSpec]:
    """Table 1: vanilla and k-DCA, k in KS (None = full DCA), at the deepest depth."""
    s = settings or KSettings.preset(quick)
    depth, data = s.depth, s.train.data
    out = {"vanilla": spec(f"vanilla-L{depth}", data, quick, grid=s, n_layers=depth)}
    for k in s.ks:
        name = "dca" if k is None else f"{k}-dca"
        label = f"dca-L{depth}" if k is None else f"{k}dca-L{depth}"
        out[name] = spec(label, data, quick, grid=s, residual="dca", k=k, n_layers=depth)
    return out


def retrofit_specs(quick: bool, settings: RetrofitSettings | None = None) -> dict[str, RunSpec]:
    """Table 4: the trained vanilla model continued as vanilla and as DCA at the learning rate
    the schedule had reached (constant, no new warm-up; the paper's is NOT FOUND)."""
    s = settings or RetrofitSettings.preset(quick)
    base = spec("vanilla", s.train.data, quick, grid=s, residual="vanilla")
    t = base.train
    lr_end = t.lr * (t.warmup_steps / t.steps) ** 0.5  # inverse-sqrt value at the last step
    cont = {"steps": s.continue_steps, "warmup_steps": 0, "lr": lr_end}
    return {"pretrained": base,
            **{k: spec(f"retrofit-{k}", s.train.data, quick, grid=s, residual=k,
                       train_changes=cont, init_from=base) for k in ("vanilla", "dca")}}


def inputs_specs(quick: bool, settings: InputsSettings | None = None) -> dict[str, RunSpec]:
    """Table 9: vanilla, and GRN-v3 over a window of stack entries without / with the model
    input (``grn_window=w``; ``grn_input=False``: the last w entries of [x, f_1, ...];
    ``True``: x plus the last w - 1 outputs); the paper's w = 4 (depth 6), ours below."""
    # The paper's window 4 at depth 6 restricts 3 of 7 GRNs (blocks 5, 6, output); at our
    # depth 4 a window of 4 would restrict only the output GRN, so the window shrinks with
    # depth: 3 at depth 4 (block 4 and output, 2 of 5), 2 at the quick depth 2.
    s = settings or InputsSettings.preset(quick)
    window, data = s.window, s.train.data
    return {"vanilla": spec("vanilla", data, quick, grid=s, residual="vanilla"),
            "grn_v3_last": spec(f"grn_v3-last{window}", data, quick, grid=s,
                                residual="grn_v3", grn_window=window, grn_input=False),
            "grn_v3_input_last": spec(f"grn_v3-input-last{window - 1}", data, quick, grid=s,
                                      residual="grn_v3", grn_window=window, grn_input=True),
            "grn_v3_full": spec("grn_v3", data, quick, grid=s, residual="grn_v3")}


def _maybe(specs_fn, quick: bool) -> list[RunSpec]:
    try:  # a config field the model does not have yet: leave those runs out
        return list(specs_fn(quick).values())
    except TypeError as err:
        print(f"skipping {specs_fn.__name__}: {err}", flush=True)
        return []


def priority_order(quick: bool) -> list[RunSpec]:
    """Every run, cheapest-and-most-shared first (duplicates removed by key)."""
    # Cheap runs that complete a claim first; the depth-8 runs (Table 1, Figure 6) last.
    groups = [
        [ablation_specs(quick, "shakespeare")[k] for k in ABLATION_KINDS],
        *([[ablation_specs(quick, "ptb")[k] for k in ABLATION_KINDS]] if not quick else []),
        [s for (k, d), s in depth_specs(quick).items() if d != max(depth_specs(quick))[1]],
        [s for (k, w), s in width_specs(quick).items() if w != max(WIDTHS)],
        list(retrofit_specs(quick).values()),
        _maybe(inputs_specs, quick),
        [related_specs(quick)[k] for k in RELATED_KINDS],
        [ablation_specs(quick)[f"{k}_open"] for k in OPEN_GATE_KINDS],
        list(depth_specs(quick).values()),
        list(k_specs(quick).values()),
        list(width_specs(quick).values()),
        *([[related_specs(quick, "ptb")[k] for k in RELATED_KINDS]] if not quick else []),
    ]
    seen, order = set(), []
    for group in groups:
        for s in group:
            if s.key not in seen:
                seen.add(s.key)
                order.append(s)
    return order


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cache", default=None, help="cache folder (default: by mode)")
    parser.add_argument("--skip", default="", help="comma-separated label substrings to skip")
    args = parser.parse_args(argv)
    cache = Path(args.cache or ("runs/lm_runs" if args.quick else "experiments/results/lm_runs"))
    skip = [s for s in args.skip.split(",") if s]
    for s in priority_order(args.quick):
        if any(x in s.label for x in skip):
            continue
        try:
            r = ensure_run(s, cache)
        except TypeError as err:  # a config field not implemented yet: skip, report
            print(f"SKIP {s.label}: {err}", flush=True)
            continue
        print(f"{s.key}: test ppl {[round(x, 3) for x in r['test_ppl']]} "
              f"step {r['median_step_s']:.3f}s", flush=True)


if __name__ == "__main__":
    main()
