"""The registered statistics and decision rules of the second evidence design
(``paper/05_lm/evidence_design_2.md``), on the cached records of its runs.

``records`` maps ``(arm, width)`` to a run's record (its ``seeds`` and per-seed ``test_ppl``);
D = 100 (ln ppl_arm - ln ppl_base) per shared seed (:func:`lm_evidence_analysis.seed_aligned`).
Each function returns what the design reports; the rules are the design's, word for word where
they decide: H1 (the slope and H2 at the two smallest widths), H2 (per width, Holm over
``widths``), H3 (the gate gap's dependence on the corpus), H4 (the gate, Holm over the three
pairs) and the default gate that follows it, the ranking check and the shared-rate confound.
"""

from __future__ import annotations

import numpy as np

from dca_theory.lab import lm_evidence_analysis as A
from dca_theory.lab import statistics as st

LEVEL = 0.05
BEATS, WORSE, INCONCLUSIVE = "beats the matched vanilla", "the matched vanilla is better", \
    "inconclusive"


def restrict(record: dict, seeds) -> dict:
    """``record`` with its per-seed lists cut to ``seeds`` (those it has, in its order)."""
    keep = [i for i, s in enumerate(record["seeds"]) if s in set(seeds)]
    out = dict(record, seeds=[record["seeds"][i] for i in keep])
    for key in ("test_ppl", "valid_ppl", "test_loss", "valid_loss"):
        if key in record:
            out[key] = [record[key][i] for i in keep]
    return out


def h2_outcome(gap: dict, level: float = LEVEL) -> str:
    """H2's reading of one width: the interval below 0 with Holm p < ``level`` is a win for
    DCA, above 0 with Holm p < ``level`` a win for the matched vanilla, else inconclusive.
    Outside the Holm family (``p_holm`` None) the raw p stands in, reported beside."""
    p = gap["p_holm"] if gap.get("p_holm") is not None else gap["p_value"]
    if gap["ci95"] is None or p is None or p >= level:
        return INCONCLUSIVE
    return BEATS if gap["ci95"][1] < 0 else WORSE if gap["ci95"][0] > 0 else INCONCLUSIVE


def h2(records: dict, arm: str, family, base: str = "vanilla_matched") -> dict[str, dict]:
    """D(``arm`` - ``base``) per width over every seed both have, Holm over ``family``."""
    gaps = A.per_width_gaps(records, arm, base, family=family)
    return {w: g | {"outcome": h2_outcome(g)} for w, g in gaps.items()}


def seed_slope(records: dict, arm: str, base: str, widths, seeds) -> dict | None:
    """The seed-clustered slope of D(``arm`` - ``base``) on log2(width) over ``widths`` and
    ``seeds`` (None where a width or a seed is missing)."""
    cut = {k: restrict(r, seeds) for k, r in records.items() if k[1] in widths}
    gaps = A.per_width_gaps(cut, arm, base)
    if sorted(map(int, gaps)) != sorted(widths) or any(
            g["seeds"] != list(seeds) for g in gaps.values()):
        return None
    return A.slope(gaps, seeds)


def h1(records: dict, widths, wide_widths, common, wide_seeds) -> dict:
    """H1: the registered rule (:func:`lm_evidence_analysis.decision` with H2's Holm level)
    on the slope over ``widths`` and the ``common`` seeds; beside it the slope over every
    width on ``wide_seeds``."""
    primary = seed_slope(records, "dca_paper", "vanilla", widths, common)
    matched = h2(records, "dca_paper", widths)
    gaps = {w: g for w, g in A.per_width_gaps(records, "dca_paper", "vanilla").items()
            if int(w) in widths}
    out = A.decision(primary, {w: g for w, g in matched.items() if int(w) in widths}, widths,
                     gaps, holm_level=LEVEL)
    out["slope_all_widths_beside"] = (seed_slope(records, "dca_paper", "vanilla",
                                                 (*widths, *wide_widths), wide_seeds)
                                      if wide_widths else None)
    return out


def gate_pairs(gates) -> list[tuple[str, str]]:
    """H4's pairs in the design's order (paper - open, paper - bias_inside, open -
    bias_inside), restricted to ``gates``."""
    return [(a, b) for i, a in enumerate(gates) for b in gates[i + 1:]]


def h4(records: dict, gates, widths, seeds) -> dict:
    """H4: per pair (g1, g2) and seed, the mean over ``widths`` of D(dca_g1 - dca_g2); the
    mean of the seed means with its t-interval and p, Holm over the pairs; each gate's mean
    (100 ln ppl over seeds and widths); the winner and the default gate
    (:func:`default_gate`). Per width, each pair with Holm over the pairs of that width."""
    per_seed = {}
    for g in gates:
        rows = [100 * np.log(restrict(records[(f"dca_{g}", w)], seeds)["test_ppl"])
                for w in widths if (f"dca_{g}", w) in records]
        if len(rows) != len(widths) or any(len(r) != len(seeds) for r in rows):
            return {"verdict": "pending", "missing": f"dca_{g}"}
        per_seed[g] = np.mean(rows, axis=0)  # one value per seed: the mean over widths
    pairs = {f"{a}-{b}": st.paired(np.zeros(len(seeds)), per_seed[a] - per_seed[b])
             for a, b in gate_pairs(gates)}
    for r, p in zip(pairs.values(), st.holm([r["p_value"] for r in pairs.values()])):
        r["p_holm"] = p
    means = {g: float(v.mean()) for g, v in per_seed.items()}
    by_width = {}
    for w in widths:
        one = {f"{a}-{b}": A.per_width_gaps(records, f"dca_{a}", f"dca_{b}")[str(w)]
               for a, b in gate_pairs(gates)}
        for r, p in zip(one.values(), st.holm([r["p_value"] for r in one.values()])):
            r["p_holm"] = p
        by_width[str(w)] = one
    return {"pairs": pairs, "gate_mean": means, "by_width": by_width, "seeds": list(seeds),
            "widths": list(widths), **default_gate(pairs, means)}


def _gap(pairs: dict, a: str, b: str) -> tuple[float, float | None]:
    """``(mean of D(a - b), Holm p)`` whichever way round the pair is stored."""
    if f"{a}-{b}" in pairs:
        r = pairs[f"{a}-{b}"]
        return r["mean"], r["p_holm"]
    r = pairs[f"{b}-{a}"]
    return -r["mean"], r["p_holm"]


def default_gate(pairs: dict, means: dict[str, float], level: float = LEVEL) -> dict:
    """The design's rule. A gate *wins* if each of its gaps lies below 0 with Holm p <
    ``level``; the winner becomes the LM default. Else: among the gates not resolved worse than
    the one with the lowest mean (Holm p >= ``level`` against it), ``paper`` if it is among
    them, else the lowest."""
    gates = list(means)

    def resolved_better(a: str, b: str) -> bool:
        mean, p = _gap(pairs, a, b)
        return mean < 0 and p is not None and p < level

    winners = [g for g in gates if all(resolved_better(g, o) for o in gates if o != g)]
    lowest = min(means, key=means.get)
    tied = [g for g in gates if g == lowest or not resolved_better(lowest, g)]
    if winners:
        default, reason = winners[0], "wins"
    elif "paper" in tied:
        default, reason = "paper", "no winner; paper is not resolved worse than the lowest"
    else:
        default, reason = lowest, "no winner; the lowest mean (paper is resolved worse)"
    return {"winner": winners[0] if winners else None, "lowest_mean": lowest,
            "not_resolved_worse": tied, "default_gate": default, "default_reason": reason}


def h3(by_corpus: dict[str, dict], width: int) -> dict:
    """H3: per corpus the gate gap G = D(dca_bias_inside - dca_paper) at ``width`` (tested
    against 0, Holm over the corpora), and the corpora's difference with Welch's interval
    (:func:`lm_evidence_analysis.gate_by_tokenisation`)."""
    name = "dca_bias_inside-dca_paper"
    data = {c: {"comparisons": {name: {"test_D": A.per_width_gaps(recs, "dca_bias_inside",
                                                                  "dca_paper")}}}
            for c, recs in by_corpus.items()}
    out = A.gate_by_tokenisation(data, width, comparison=name)
    own = {c: g for c, g in out["G"].items()}
    full = {c: data[c]["comparisons"][name]["test_D"][str(width)] for c in own}
    for c, p in zip(own, st.holm([full[c]["p_value"] for c in own])):
        own[c] = dict(own[c], p_value=full[c]["p_value"], p_holm=p)
    return out | {"G": own}


def ranking_check(full_loss: dict[str, dict[float, float]], sweep_best: dict[str, float],
                  tolerance: float) -> dict:
    """Per arm: the full-budget mean validation ln ppl at its sweep's best and second-best
    rate; the check passes if, for every arm, the best is also better at the full budget or
    within ``tolerance`` points (100 x ln ppl) of the other."""
    arms = {}
    for arm, losses in full_loss.items():
        best = sweep_best[arm]
        other = next(lr for lr in losses if lr != best)
        gap = 100 * (losses[best] - losses[other])
        arms[arm] = {"best": best, "second": other, "points_best_minus_second": gap,
                     "holds": bool(gap <= tolerance)}
    return {"arms": arms, "tolerance": tolerance,
            "passed": all(a["holds"] for a in arms.values())}


def shared_rate(records: dict, shared: dict, widths, seeds) -> dict:
    """Part D: per width, D(dca_paper at vanilla's rate - dca_paper at its own) on ``seeds``
    (``shared[w]`` the record at vanilla's rate), and beside it the H1 slope and H2 gaps at
    the shared rate. Reported, not decided on."""
    at_shared = {k: r for k, r in records.items() if k[0] != "dca_paper"}
    at_shared |= {("dca_paper", w): shared[w] for w in widths if w in shared}
    own = {("own", w): restrict(records[("dca_paper", w)], seeds) for w in widths
           if ("dca_paper", w) in records}
    confound = A.per_width_gaps({**own, **{("shared", w): restrict(shared[w], seeds)
                                           for w in widths if w in shared}}, "shared", "own")
    return {"confound": confound,
            "slope_at_shared_rate": seed_slope(at_shared, "dca_paper", "vanilla", widths, seeds),
            "h2_at_shared_rate": h2({k: restrict(r, seeds) for k, r in at_shared.items()},
                                    "dca_paper", widths)}
