r"""Analysis hooks: learned GRN weights per layer (paper Appendix H, Figure 10) and per-layer
residual-stream states.

Figure 10 shows, for every GRN of a trained GRN-v3 model ("Layer 2" … "Layer 30" and
"Outputs"), the bias ``b`` over the GRN's stack entries: the median over the D features (solid
line) and a 90% band (shaded; we use the 5th–95th percentiles). :func:`bias_profile` computes
exactly these numbers; :func:`grn_weights` exports the raw ``b`` (``S×D``, or ``S`` for
GRN-v1) and ``w`` (``D``) of every GRN; :func:`save_grn_analysis` writes both to a folder
(``grn_weights.npz`` and ``grn_bias_profile.json``) for a figure module to plot.

Stack slots are labelled by what they hold (:func:`slot_labels`): ``input`` (the embedded
model input), ``out_j`` (block j's output, 0-based) and, for k-DCA, ``middle_0..m`` (the sum of
block outputs 0..m that left the last-k window). With ``cfg.grn_window`` (Table 9) only the
window's entries are listed.

Names: ``block_{t}`` for block t's GRN (``block_{t}.q|k|v`` for DCA's three GRNs) and
``output`` for the GRN before the final LayerNorm.
"""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, ArrayLike, Int

from dca_theory.io import write_json
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.model import TransformerLM
from dca_theory.lm.scanned import ScannedTrunk
from dca_theory.residual import AbstractCombiner, stack_size


def slot_labels(cfg: ModelConfig, num_outputs: int) -> list[str]:
    """Labels of the stack entries a GRN sees after ``num_outputs`` block outputs."""
    # ModelConfig takes grn_window only for the registry's grn_window schemes and k only for
    # its takes_k ones (k-DCA), so the config alone says which stack this is
    if cfg.grn_window is not None:  # Table 9: a window, no middle
        return ["input" if i == 0 else f"out_{i - 1}" for i in cfg.grn_slots(num_outputs)]
    k = cfg.k  # None: the full stack
    size = stack_size(num_outputs, k)
    if size == num_outputs + 1:
        return ["input"] + [f"out_{j}" for j in range(num_outputs)]
    n_mid = num_outputs - k  # outputs 0..n_mid-1 were summed into the middle slot
    return ["input", f"middle_0..{n_mid - 1}"] + [f"out_{j}" for j in range(n_mid, num_outputs)]


def stacked_trunk(trunk):
    """``trunk`` in the stacked layout (:class:`~dca_theory.lm.scanned.ScannedTrunk`),
    converted exactly if per-block, so that every analysis reads one layout."""
    return trunk if isinstance(trunk, ScannedTrunk) else ScannedTrunk.from_trunk(trunk)


def named_grns(model: TransformerLM) -> dict[str, tuple[AbstractCombiner, int]]:
    """Every GRN of the model with the number of block outputs its stack holds (its mixer
    names them, :meth:`~dca_theory.lm.driver.Mixer.named_combiners`)."""
    out = stacked_trunk(model.trunk).mixer.named_combiners()
    if not out:
        raise ValueError(f"residual={model.cfg.residual!r} has no GRNs; valid: grn_v1, grn_v2, "
                         "grn_v3, dca")
    return out


def grn_weights(model: TransformerLM) -> dict[str, np.ndarray]:
    """``{"<name>.b": b, "<name>.w": w}`` for every GRN (``w`` only for GRN-v3)."""
    arrays = {}
    for name, (grn, _) in named_grns(model).items():
        arrays[f"{name}.b"] = np.asarray(grn.b)
        if grn.w is not None:
            arrays[f"{name}.w"] = np.asarray(grn.w)
    return arrays


def bias_profile(model: TransformerLM, band: tuple[float, float] = (5.0, 95.0)) -> list[dict]:
    """Figure 10's data: per GRN and stack slot, the median of ``b`` over features and a band."""
    rows = []
    for name, (grn, n_out) in named_grns(model).items():
        b_SxD = np.asarray(grn.b, dtype=np.float64).reshape(grn.size, -1)
        lo, med, hi = np.percentile(b_SxD, [band[0], 50.0, band[1]], axis=1)
        rows.append({"grn": name, "num_outputs": n_out, "slots": slot_labels(model.cfg, n_out),
                     "median": med.tolist(), "low": lo.tolist(), "high": hi.tolist(),
                     "band_percentiles": list(band)})
    return rows


def save_grn_analysis(model: TransformerLM, directory: str | Path) -> Path:
    """Write ``grn_weights.npz`` and ``grn_bias_profile.json`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / "grn_weights.npz", **grn_weights(model))
    write_json(directory / "grn_bias_profile.json",
               {"residual": model.cfg.residual, "k": model.cfg.k, "grns": bias_profile(model)})
    return directory


@eqx.filter_jit
def _states(model: TransformerLM, tokens_L: Array):
    return model.forward_with_states(tokens_L, inference=True)[1]


def residual_states(
    model: TransformerLM, tokens_L: Int[ArrayLike, " L"]
) -> dict[str, np.ndarray]:
    """Per-layer residual-stream states of one sequence (no dropout), as numpy arrays.

    Keys are described in :mod:`dca_theory.lm.trunk` (``embed``, ``block_{t}_in``,
    ``block_{t}_out``, ``stream_{t}``, ``stack_{t}``, ``final``).
    """
    return {k: np.asarray(v) for k, v in jax.device_get(_states(model, tokens_L)).items()}


def _grn_stacks(model: TransformerLM, states: dict) -> dict[str, np.ndarray]:
    """The stack ``(S, L, D)`` each GRN of ``named_grns`` reads, from the collected states
    (full stacks only: the output GRN's stack is the last block's plus its output)."""
    names, out = named_grns(model), {}
    last = model.cfg.n_layers - 1
    for name in names:
        if name == "output":
            out[name] = np.concatenate([states[f"stack_{last}"],
                                        states[f"block_{last}_out"][None]])
        else:
            out[name] = states[f"stack_{int(name.split('_')[1].split('.')[0])}"]
    return out


def effective_profile(model: TransformerLM, tokens_NxL: Int[ArrayLike, "N L"]) -> list[dict]:
    """What each GRN-v3 actually weights its stack entries by, over the tokens of ``N``
    sequences: per stack slot, the median over features of the token-mean coefficient c_i
    (``b_i`` plus the gate's term, :mod:`dca_theory.gates`), the token-mean gate input w·h_i and
    its mean absolute value, and the fraction of (token, feature) coefficients that are 0 (an
    entry switched off: possible with the bias inside the ReLU only). Full stacks only
    (``k=None``, no ``grn_window``); GRNs without a gate are left out."""
    from dca_theory import gates as gate_registry
    from dca_theory import grn_formula

    if model.cfg.k is not None or model.cfg.grn_window is not None:
        raise ValueError("effective_profile needs full stacks; valid: k=None, grn_window=None")
    per_seq = [_grn_stacks(model, residual_states(model, np.asarray(t)))
               for t in np.asarray(tokens_NxL)]
    rows = []
    for name, (grn, n_out) in named_grns(model).items():
        if grn.w is None:
            continue
        gate = gate_registry.get(grn.gate)
        stack = np.concatenate([stacks[name] for stacks in per_seq], axis=1)
        b, w = np.asarray(grn.b, np.float64), np.asarray(grn.w, np.float64)
        stack = stack.astype(np.float64)
        pre = stack @ w  # (S, tokens)
        relu = lambda x: np.maximum(x, 0.0)  # noqa: E731  values only: no derivative needed
        c = grn_formula.coefficients(b, w, relu, stack, gate.bias_inside)  # (S, tokens, D)
        rows.append({"grn": name, "num_outputs": n_out, "gate": gate.name,
                     "slots": slot_labels(model.cfg, n_out),
                     "median_coefficient": np.median(c.mean(axis=1), axis=1).tolist(),
                     "mean_gate_input": pre.mean(axis=1).tolist(),
                     "mean_abs_gate_input": np.abs(pre).mean(axis=1).tolist(),
                     "frac_switched_off": (c == 0).mean(axis=(1, 2)).tolist()})
    return rows
