r"""Report rows for Lemma C.1, Theorem 4.3 (i) thresholds (4.1)–(4.3) and (ii) gains G1–G3,
Proposition 4.4, Figure 5 and Proposition 4.5 (see :mod:`.verify` for verdicts).

Targets for Theorem 4.3 / Prop. 4.4 are symmetric with :math:`A - I \succeq 0` and spectrum in
:math:`[\lambda_{min}, \lambda_{max}]`, both endpoints attained. A GRN "beats" the ResNet when
a *certificate* — a value known to be :math:`\ge ER^*(C_{GRN})` — is below the exact
:math:`ER^*(C_{res})`. Certificates: the exact GRN-v1 optimum (every GRN class contains
:math:`\alpha I + M` at the same rank, Thm 4.1) and, for v3, Theorem 4.2's corrected bound.
"Every depth": all depths T whose integer matched rank is feasible (each layer rank >= 1).
"""

from __future__ import annotations

import functools

import numpy as np
import sympy as sp

from dca_theory import theory as TH
from dca_theory.theory import reference as R
from dca_theory.theory import symbolic as S
from dca_theory.theory.verdicts import Row, verdict

GRN = ("grn_v1", "grn_v2", "grn_v3")
THRESH_RTOL = 1e-12  # symbolic vs closed-form threshold, relative to max(1, |threshold|)


def _overhead(kind: str, d: int, T: np.ndarray) -> np.ndarray | np.floating:
    """Parameters a depth-T GRN adds to 2 d r' (Lemma C.1 / paper §4.2)."""
    pairs = T * (T - 1) / 2
    return {"grn_v1": pairs, "grn_v2": d * pairs, "grn_v3": d * pairs + d * T}[kind]


def matched_ranks(kind: str, d: int, r: int, integer: bool) -> np.ndarray:
    """Independent count: matched rank r'(T) for every feasible depth T (r' >= T)."""
    T = np.arange(1, r + 1, dtype=float)
    rp = (2 * d * r - _overhead(kind, d, T)) / (2 * d)
    if integer:
        rp = np.floor(rp + 1e-12)
    return rp[rp >= T]


def check_lemma_c1(quick: bool) -> list[Row]:
    dims = list(range(2, 25 if quick else 41)) + ([] if quick else [64, 100, 200, 300])
    rng = np.random.default_rng(4300)
    rows = []
    for kind in GRN:
        cases = v_real = v_int = v_intfix = v_tight = mism = 0
        for d in dims:
            for r in range(1, d):
                real, integ = matched_ranks(kind, d, r, False), matched_ranks(kind, d, r, True)
                if integ.size == 0:
                    continue
                cases += 1
                bound = TH.rank_loss_bound(kind, d, r, lemma="paper")
                v_real += (r - real.min()) > bound + 1e-9
                v_int += (r - integ.min()) > bound + 1e-9
                v_intfix += (r - integ.min()) > TH.rank_loss_bound(kind, d, r, lemma="integer")
                v_tight += (r - real.min()) > TH.rank_loss_bound(kind, d, r, lemma="tight") + 1e-9
                if rng.random() < 0.05:  # spot-check the package's matched_rank, exact ints
                    T = int(rng.integers(1, r + 1))
                    mine = (2 * d * r - _overhead(kind, d, np.array(float(T)))) // (2 * d)
                    got = TH.matched_rank(kind, d, r, T)
                    mism += (got is None) != (mine < T) or (got is not None and got != mine)
        ok = v_real == 0 and v_intfix == 0 and v_tight == 0 and mism == 0
        rows.append(Row(
            f"Lemma C.1 ({kind})",
            "rank loss r*-r' of a matched-budget GRN, every feasible depth, vs the printed bound"
            f" (d<={dims[-1]}, all r*<d); real relaxation and integer ranks; package's "
            "matched_rank vs an independent count", cases,
            f"{v_real} real, {v_int} integer violations; {mism} count mismatches",
            verdict(ok, corrected=v_int > 0),
            (f"with integer ranks the printed bound fails in {v_int} cases; its ceiling "
             "(lemma='integer') holds" if v_int else "") + (
                "; v3's 1.6 is loose: exact (sqrt(r+25/16)-1)^2-1/16 also holds"
                if kind == "grn_v3" else "")))
    return rows


def check_lemma_c1_v3_gap(quick: bool) -> list[Row]:
    """How far the printed v3 rank-loss bound (sqrt(1.6 + r) - 1)^2 lies above the exact
    (sqrt(r + 25/16) - 1)^2 - 1/16: at r* = 0 the exact one is 0 and the gap is (sqrt(1.6) -
    1)^2; as r* grows it rises to 1.6 - 25/16 + 1/16 = 0.1 (the square roots' difference -> 0)."""
    r = np.concatenate([np.linspace(0.0, 10.0, 1001), np.logspace(1, 8, 200)])
    gap = (TH.rank_loss_bound("grn_v3", 10**9, r, lemma="paper")
           - TH.rank_loss_bound("grn_v3", 10**9, r, lemma="tight"))
    at0, limit = (np.sqrt(1.6) - 1.0) ** 2, 0.1
    ok = (abs(gap[0] - at0) <= 1e-15 and bool(np.all(np.diff(gap) > -1e-15))
          and abs(gap[-1] - limit) <= 1e-4 and bool(np.all(gap >= 0)) and gap.max() <= limit)
    at = {x: float(np.interp(x, r, gap)) for x in (0.0, 1.0, 10.0)}
    at[100.0] = float(gap[np.argmin(np.abs(r - 100.0))])
    return [Row("Lemma C.1 v3: printed-exact", "printed (sqrt(1.6+r*)-1)^2 minus exact "
                "(sqrt(r*+25/16)-1)^2-1/16 on r* in [0, 1e8]: = (sqrt(1.6)-1)^2 at 0, "
                "nondecreasing, >= 0, -> 0.1 (within 1e-4 at 1e8)", int(r.size),
                "gap " + ", ".join(f"{v:.3f} at r*={k:g}" for k, v in at.items()), verdict(ok),
                "the printed bound is valid but loose by 0.070 to 0.1 ranks")]


def _first_uncertified(
    kind: str, A: np.ndarray | None, eigs: np.ndarray, ranks, target: float
):  # A is read for grn_v3 only (its bound); callers pass None for grn_v1/v2
    """The smallest rank in ``ranks`` whose certificate is not below ``target``, or None.

    The exact v1 value is nonincreasing in the rank (a rank-r' fit is also a rank-(r'+1)
    fit), so once it is below ``target`` every larger rank is certified too; only then is
    the (costlier) v3 bound needed."""
    for rp in sorted({int(x) for x in ranks}):
        if R.v1_exact_symmetric(eigs, rp)[0] < target:
            return None
        if kind == "grn_v3" and rp < A.shape[0] and TH.excess_risk_bound(
                "grn_v3", A, rp, constant="corrected") < target:
            continue
        return rp
    return None


def _certificate(kind: str, A: np.ndarray, eigs: np.ndarray, rp: int) -> float:
    """A value >= ER*(C_kind) at collective rank rp (see module docstring)."""
    cert = R.v1_exact_symmetric(eigs, rp)[0]
    if kind == "grn_v3" and rp < A.shape[0]:
        cert = min(cert, TH.excess_risk_bound("grn_v3", A, rp, constant="corrected"))
    return cert


def _er_res(eigs: np.ndarray, r: int) -> float:
    lam = np.sort(eigs - 1.0)[::-1]  # eigenvalues of A - I (= singular values, A - I >= 0)
    return float(np.sum(lam[r:] ** 2))


def _psd_case(rng, d_lo=4, d_hi=80):
    d = int(rng.integers(d_lo, d_hi + 1))
    kappa = float(rng.uniform(0.05, 1.0)) if rng.random() < 0.9 else 1.0
    lam_max = float(rng.uniform(1.0, 10.0))
    A = R.random_target(d, rng, kind="shifted_psd", lam_min=kappa * lam_max, lam_max=lam_max)
    return d, kappa, lam_max, A


@functools.lru_cache(maxsize=1)
def _symbolic_thresholds() -> dict:
    return S.thresholds()


def _symbolic_threshold_error(kind: str, constant: str) -> float:
    thr = _symbolic_thresholds()[kind]["threshold"]
    sym = "eta" if kind == "grn_v3" else "kappa"
    f = sp.lambdify((sp.Symbol(sym, positive=True), sp.Symbol("d", positive=True)), thr, "numpy")
    worst = 0.0
    for d in (2, 10, 100, 1000):
        kappa = np.linspace(0.01, 1.0, 60)
        q = TH.eta(kappa, d, constant) if kind == "grn_v3" else kappa
        got = TH.threshold(kind, kappa, d, constant=constant, lemma="paper")
        worst = max(worst, float(np.max(np.abs(f(q, d) - got) / np.maximum(1, np.abs(got)))))
    return worst


def _two_level(d: int, r: int, kappa: float, rng, rotate: bool = True):
    """Adversarial target for (C.2): A - I has r eigenvalues 1 (= lam_max) and d - r equal to
    kappa (= lam_min), in a random basis. The ResNet keeps all of the top r; a GRN that lost
    r - r' ranks pays (r - r') lam_max^2 and gains only on a flat tail. Returns (A, eigs);
    ``rotate=False`` skips building A (only the v3 bound needs the matrix)."""
    lam = np.full(d, kappa)
    lam[:r] = 1.0
    if not rotate:
        return None, 1.0 + lam
    rot, Rq = np.linalg.qr(rng.standard_normal((d, d)))
    rot = rot * np.sign(np.diag(Rq))
    return np.eye(d) + (rot * lam) @ rot.T, 1.0 + lam


def _scan(kind: str, d_max: int, n_kappa: int, bound_of):
    """Every depth, on two-level targets, over a (d, kappa, r*) grid: yields
    (d, kappa, r, A, eigs, ranks) for all r* in 1..min(r_max(d, kappa), d-1)."""
    rng = np.random.default_rng(4340 + GRN.index(kind))
    for d in range(3, d_max + 1):
        for kappa in np.linspace(0.02, 1.0, n_kappa):
            for r in range(1, min(bound_of(d, kappa), d - 1) + 1):
                ranks = matched_ranks(kind, d, r, True)
                if ranks.size:
                    A, eigs = _two_level(d, r, float(kappa), rng, rotate=kind == "grn_v3")
                    yield d, float(kappa), r, A, eigs, ranks


def _r_max(kind, d, kappa, lemma, constant="corrected"):
    thr = float(TH.threshold(kind, kappa, d, constant=constant, lemma=lemma))
    return min(int(np.ceil(thr)) - 1, d - 1)


def check_thresholds(kind: str):
    eq = {"grn_v1": "(4.1)", "grn_v2": "(4.2)", "grn_v3": "(4.3)"}[kind]

    def run(quick: bool) -> list[Row]:
        rng = np.random.default_rng(4310 + GRN.index(kind))
        consts = ("corrected", "paper") if kind == "grn_v3" else ("corrected",)
        sym_err = max(_symbolic_threshold_error(kind, c) for c in consts)
        n, done = (40 if quick else 150), 0
        viol = {"paper": 0, "integer": 0}
        while done < n:  # generic spectra
            d, kappa, _, A = _psd_case(rng)
            r_max = _r_max(kind, d, kappa, "paper", consts[done % len(consts)])
            if r_max < 1:
                continue
            r = r_max if rng.random() < 0.5 else int(rng.integers(1, r_max + 1))
            eigs = np.linalg.eigvalsh(A)
            target = _er_res(eigs, r) * (1 - 1e-12)  # strictly better, beyond round-off
            viol["paper"] += _first_uncertified(
                kind, A, eigs, matched_ranks(kind, d, r, True), target) is not None
            done += 1
        example = None
        grid = (16, 13) if quick else (32, 17)
        for d, kappa, r, A, eigs, ranks in _scan(
                kind, *grid, lambda d, k: _r_max(kind, d, k, "paper")):
            n += 1
            bad = _first_uncertified(kind, A, eigs, ranks, _er_res(eigs, r) * (1 - 1e-12))
            if bad is not None:
                viol["paper"] += 1
                example = example or f"d={d}, kappa={kappa:.2f}, r*={r}, depth with r'={bad}"
                viol["integer"] += r <= _r_max(kind, d, kappa, "integer")
        ok = sym_err <= THRESH_RTOL and viol["integer"] == 0
        corrected = kind == "grn_v3" or viol["paper"] > 0
        note = ("c corrected to 1/(pi(d+2)), so xi0 = 1/(pi(d+2)(d-1)) in eta; thresholds with "
                "both c were tested. " if kind == "grn_v3" else "")
        if viol["paper"]:
            note += (f"printed threshold fails for integer ranks at the worst depth (e.g. "
                     f"{example}): Lemma C.1 is violated by integer ranks; "
                     "threshold(lemma='integer') has 0 violations")
        return [Row(f"Thm 4.3(i) {eq} {kind}",
                    "sympy solves (C.2)+Lemma C.1 -> threshold, = threshold() on a grid "
                    f"(rtol {THRESH_RTOL:g}); r* < threshold: the matched GRN beats ResNet at "
                    "EVERY feasible depth (exact v1 / Thm 4.2 certificate); random A-I>=0 "
                    "and a two-level worst-case scan", n,
                    f"sym err {sym_err:.1e}; {viol['paper']} printed, {viol['integer']} "
                    "integer-form violations", verdict(ok, corrected=corrected), note.strip())]
    return run


def _gain_violation(kind, A, eigs, r, ranks, g_bound) -> int | None:
    er_res = _er_res(eigs, r)
    # tolerance 1e-10 x ER*(res): round-off in sums of d squares
    return _first_uncertified(kind, A, eigs, ranks, er_res - g_bound + 1e-10 * er_res)


def check_gains(quick: bool) -> list[Row]:
    rng = np.random.default_rng(4320)
    rows = []
    for kind in GRN:
        n, done, viol, viol_int, example = (30 if quick else 120), 0, 0, 0, None
        while done < n:  # generic spectra
            d, kappa, lam_max, A = _psd_case(rng)
            r = int(rng.integers(1, d))
            ranks = matched_ranks(kind, d, r, True)
            if ranks.size == 0:  # no GRN of this kind fits the budget
                continue
            done += 1
            g = float(TH.gain_lower_bound(kind, d, r, kappa * lam_max, lam_max))
            viol += _gain_violation(kind, A, np.linalg.eigvalsh(A), r, ranks, g) is not None
        grid = (12, 7) if quick else (20, 9)
        for d, kappa, r, A, eigs, ranks in _scan(kind, *grid, lambda d, k: d - 1):
            n += 1
            g = float(TH.gain_lower_bound(kind, d, r, kappa, 1.0))
            bad = _gain_violation(kind, A, eigs, r, ranks, g)
            if bad is not None:
                viol += 1
                example = example or f"d={d}, kappa={kappa:.2f}, r*={r}, depth with r'={bad}"
            g_int = float(TH.gain_lower_bound(kind, d, r, kappa, 1.0, lemma="integer"))
            viol_int += _gain_violation(kind, A, eigs, r, ranks, g_int) is not None
        name = {"grn_v1": "G1", "grn_v2": "G2", "grn_v3": "G3 (ours)"}[kind]
        note = ("G3's formula is not visible in the paper; checked is the package's "
                "derivation. " if kind == "grn_v3" else "")
        if viol:
            note += (f"printed bound fails for integer ranks at the worst depth (e.g. "
                     f"{example}); with lemma='integer' 0 violations")
        rows.append(Row(
            f"Thm 4.3(ii) {name}",
            f"gain_lower_bound('{kind}') <= ER*(res) - certificate at EVERY feasible depth "
            "(v1: exact gain; v2, v3: certified lower bound); random A-I>=0 and a two-level "
            "worst-case scan", n, f"{viol} printed, {viol_int} integer-form violations",
            verdict(viol_int == 0, corrected=viol > 0), note.strip()))
    return rows


def check_rank_savings(quick: bool) -> list[Row]:
    rng = np.random.default_rng(4330)
    n, viol, not_smaller = (40 if quick else 150), 0, 0
    for i in range(n):
        kind = GRN[i % 3]
        d, kappa = int(rng.integers(4, 81)), float(rng.uniform(0.05, 0.999))
        A = R.random_target(d, rng, kind="shifted_psd", lam_min=kappa, lam_max=1.0)
        r = int(rng.integers(1, d))
        rs = float(TH.rank_savings(kind, r, d, kappa, clip=False))
        not_smaller += rs >= r
        rp = max(0, int(np.floor(rs)) + 1)  # smallest integer rank strictly above r'_*
        eigs = np.linalg.eigvalsh(A)
        target = _er_res(eigs, r) * (1 - 1e-12)
        viol += _first_uncertified(kind, A, eigs, [min(rp, d - 1)], target) is not None
    sym = S.eta_identity()["ok"]
    return [Row("Prop 4.4 rank savings",
                "GRN with collective rank just above r'=(r*-d k^2)/(1-k^2) (eta for v3) beats "
                "the rank-r* ResNet (exact v1 / Thm 4.2 certificate), and r' < r*", n,
                f"{viol} violations; {not_smaller} with r' >= r*", verdict(sym and viol == 0
                                                                           and not_smaller == 0))]


def check_eta(quick: bool) -> list[Row]:
    sym = S.eta_identity()
    worst, vacuous_viol = 0.0, 0
    for d in (2, 3, 10, 100, 1000):
        x0 = 1.0 / (np.pi * (d * d - 1))
        kappa = np.linspace(x0 / (1 + x0), 1.0, 200)
        printed = np.sqrt(((kappa * (1 + x0) - x0) ** 2 + x0) / (1 + x0))
        worst = max(worst, float(np.max(np.abs(TH.eta(kappa, d, "paper") - printed))))
        small = np.linspace(1e-6, x0 / (1 + x0), 20)
        for c in ("paper", "corrected"):  # where the eta step is not justified ...
            vacuous_viol += int(np.any(TH.threshold("grn_v3", small, d, constant=c) >= 1))
    ok = sym["ok"] and worst <= 1e-14 and vacuous_viol == 0
    return [Row("Prop 4.4 / (C.10) eta",
                "sympy: (1+xi)u^2-2xi u+xi = [((1+xi)u-xi)^2+xi]/(1+xi) = u^2+xi(1-u)^2; "
                "eta() = printed eta with xi0=1/(pi(d^2-1)) (abs 1e-14)", 5,
                f"max |diff| {worst:.1e}", verdict(ok),
                "the step u >= kappa => RHS >= eta^2 needs kappa >= xi/(1+xi) (vertex); "
                "below it (4.3) admits no integer r* >= 1, so nothing changes")]


def _g_recon(kind, d, r, lo, hi):
    k2 = (lo / hi) ** 2
    loss = (np.sqrt(d + r) - np.sqrt(d)) ** 2 if kind == "grn_v1" else (np.sqrt(1 + r) - 1) ** 2
    return hi**2 * ((d - r) * k2 - (1 - k2) * loss)


def check_figure5(quick: bool) -> list[Row]:
    r = np.linspace(0, 100, 101)
    lam = np.linspace(2, 10, 161)
    left, right, worst = [], [], 0.0
    for kind in ("grn_v1", "grn_v2"):
        for d in (100, 200, 300):
            gl = np.asarray(TH.gain_lower_bound(kind, d, r, 5.0, 10.0))
            gr = np.asarray(TH.gain_lower_bound(kind, d, 50, lam, 10.0))
            worst = max(worst, float(np.max(np.abs(gl - _g_recon(kind, d, r, 5.0, 10.0)))),
                        float(np.max(np.abs(gr - _g_recon(kind, d, 50, lam, 10.0)))))
            left.append(gl)
            right.append(gr)
    top, bottom, peak = max(map(np.max, left)), min(map(np.min, left)), max(map(np.max, right))
    expect_bottom = -75 * (np.sqrt(101) - 1) ** 2
    ok = (abs(top - 7500) <= 1e-9 and abs(peak - 25000) <= 1e-9
          and abs(bottom - expect_bottom) <= 1e-9 and -6200 < bottom < -6000 and worst < 1e-8)
    return [Row("Figure 5 extremes", "G1/G2 bounds on the paper's grids (left: lam 5..10, "
                "d=100..300, r*=0..100; right: r*=50, lam_min 2..10) = RECON formulas; "
                "extremes vs 7500 / -6143 / 25000 and the axis ticks", 12,
                f"max {top:.1f}, min {bottom:.1f}, right peak {peak:.1f}", verdict(ok))]


def check_prop45(quick: bool) -> list[Row]:
    return [Row("Prop 4.5 (bottleneck rank)", "nonlinear classes via rank_BN: only '⊆' claimed;"
                " not decidable from closed forms", 0, "-", "open",
                "checked by trained nets, see experiments/")]


CHECKS = [
    ("Lemma C.1", check_lemma_c1),
    ("Lemma C.1 v3: printed-exact", check_lemma_c1_v3_gap),
    *[(f"Thm 4.3(i) {k}", check_thresholds(k)) for k in GRN],
    ("Thm 4.3(ii)", check_gains),
    ("Prop 4.4 rank savings", check_rank_savings),
    ("Prop 4.4 / (C.10) eta", check_eta),
    ("Figure 5 extremes", check_figure5),
    ("Prop 4.5", check_prop45),
]
