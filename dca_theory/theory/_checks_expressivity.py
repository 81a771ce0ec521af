r"""Report rows for Theorem 4.1 (constructively), eq. (A.1), Lemma B.1, the GRN-v3 constant
and Theorem 4.2 (see :mod:`.verify` for verdicts). Each check takes ``quick`` and returns
rows; tolerances are stated next to each comparison.
"""

from __future__ import annotations

import numpy as np

from dca_theory import theory as TH
from dca_theory.theory import constructions as C
from dca_theory.theory import montecarlo as MC
from dca_theory.theory import reference as R
from dca_theory.theory import symbolic as S
from dca_theory.theory.verdicts import Row, verdict

CONSTRUCT_RTOL = 1e-9  # end-to-end map vs target, relative Frobenius (brief: 1e-9)
CLOSED_RTOL = 1e-10  # a closed form vs the same quantity assembled from its definition
Z_MAX = 4.0  # Monte Carlo: agreement within 4 standard errors ...
Z_MAX_MATRIX = 5.0  # ... or 5 when taking the max over <= 25 matrix entries (Bonferroni)


def _rel(a, b, scale: float | None = None) -> float:
    """|a - b| / |b|, or / ``scale`` when given (for risks that can vanish, the scale is the
    target's energy |A - I|_F^2, so round-off near 0 is not blown up)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    den = np.linalg.norm(b) if scale is None else scale
    return float(np.linalg.norm(a - b) / max(den, 1e-300))


def _random_ranks(rng, d_max=16):
    while True:
        d, T = int(rng.integers(3, d_max + 1)), int(rng.integers(1, 6))
        ranks = [int(rng.integers(1, 4)) for _ in range(T)]
        if sum(ranks) < d:
            return d, ranks


def _residual_rank(kind: str, net: C.LinearNet) -> tuple[int, int]:
    """(rank of the part Thm 4.1 says is low rank, its allowed rank) for a random network."""
    W = C.end_to_end_matrix(net)
    d, r_star = net.dim, sum(C.numerical_rank(V) for V in net.V)
    low = {"base": W, "res": W - np.eye(d)}.get(kind)
    if kind == "grn_v1":
        low = W - net.b[-1][0] * np.eye(d)
    elif kind == "grn_v2":
        low = W - np.diag(net.b[-1][0])
    allowed = min(C.numerical_rank(V) for V in net.V) if kind == "base" else r_star
    return C.numerical_rank(low, rtol=1e-9), allowed


def check_thm41(kind: str):
    def run(quick: bool) -> list[Row]:
        rng = np.random.default_rng(4100 + C.KINDS.index(kind))
        n = 10 if quick else 40
        worst, rank_viol, subset_viol, paper_fail, paper_perp = 0.0, 0, 0, 0, 0.0
        for _ in range(n):
            d, ranks = _random_ranks(rng)
            m = min(ranks) if kind == "base" else sum(ranks)
            m = int(rng.integers(max(1, m - 1), m + 1))  # rank(M) = bound or one less
            M = rng.standard_normal((d, m)) @ rng.standard_normal((m, d)) / np.sqrt(d)
            args = dict(alpha=float(rng.normal()), D=rng.normal(size=d), w=rng.normal(size=d))
            X = rng.standard_normal((20, d))
            net = C.realise(kind, M, ranks, rng=rng, **args)
            worst = max(worst, _rel(C.forward(net, X), C.target_map(kind, M, X, **args)))
            rank_viol += sum(C.numerical_rank(V) > r for V, r in zip(net.V, ranks))
            if kind == "grn_v3":
                # The paper's output weights (all ones) fail unless w^T M = 0 ...
                pnet = C.realise(kind, M, ranks, paper_v3=True, **args)
                paper_fail += _rel(C.forward(pnet, X), C.target_map(kind, M, X, **args)) > 1e-6
                # ... and are exact when w is orthogonal to the column space of M.
                U = np.linalg.svd(M)[0]
                w_perp = U[:, C.numerical_rank(M):] @ rng.normal(size=d - C.numerical_rank(M))
                args_p = {**args, "w": w_perp}
                pnet = C.realise(kind, M, ranks, paper_v3=True, **args_p)
                paper_perp = max(paper_perp, _rel(C.forward(pnet, X),
                                                  C.target_map(kind, M, X, **args_p)))
            else:
                got, allowed = _residual_rank(kind, C.random_net(kind, d, ranks, rng))
                subset_viol += got > allowed
        ok = worst <= CONSTRUCT_RTOL and rank_viol == 0 and subset_viol == 0
        cls = {"base": "{Mx: rank M <= min r_t}", "res": "{(I+M)x: rank M <= r*}",
               "grn_v1": "{(aI+M)x: rank M <= r*}", "grn_v2": "{(D+M)x: rank M <= r*}",
               "grn_v3": "{(D+M)x + relu(w.x)x} (subset)"}[kind]
        checked = (f"built layer weights realising C_{kind} = {cls}; end-to-end map vs target"
                   f" (rel. Frobenius <= {CONSTRUCT_RTOL:g}); layer ranks <= r_t")
        worst_s = f"rel err {worst:.1e}; {rank_viol} rank violations"
        note = ""
        if kind == "grn_v3":
            ok = ok and paper_perp <= CONSTRUCT_RTOL
            note = (f"paper's construction (output weights all 1) fails in {paper_fail}/{n} "
                    "generic cases: the output gate also multiplies the layer slots, adding "
                    "relu(w.V_t x)V_t x; it is exact iff w^T M = 0 (rel err "
                    f"{paper_perp:.1e} then). Corrected: per-feature output bias beta with "
                    "V_t = diag(1/beta)M_t and w^T diag(1/beta) M = 0 (constructions.py)")
        else:
            checked += "; converse: random nets' maps lie in the class (numerical rank)"
            worst_s += f"; {subset_viol} class violations"
        return [Row(f"Thm 4.1 C_{kind}", checked, n, worst_s,
                    verdict(ok, corrected=kind == "grn_v3"), note)]
    return run


def check_woodbury(quick: bool) -> list[Row]:
    sym = S.woodbury_step()
    rng = np.random.default_rng(4101)
    n, worst_v, viol = (20 if quick else 100), 0.0, 0
    for _ in range(n):
        d = int(rng.integers(3, 20))
        r = int(rng.integers(2, d))
        rT = int(rng.integers(1, r))
        P, Q = rng.standard_normal((d, r)), rng.standard_normal((d, r)) / np.sqrt(d)
        P1, Q1 = P[:, :rT], Q[:, :rT]
        B = P1 @ np.linalg.inv(np.eye(rT) + Q1.T @ P1)
        Cm = Q1 @ (np.eye(rT) + P1.T @ Q1)
        V = B @ Cm.T
        worst_v = max(worst_v, _rel(V, P1 @ Q1.T))
        rest = np.linalg.solve(np.eye(d) + V, np.eye(d) + P @ Q.T) - np.eye(d)
        viol += C.numerical_rank(rest, rtol=1e-9) > r - rT
    ok = sym["ok"] and viol == 0 and worst_v <= CLOSED_RTOL
    return [Row("Thm 4.1 proof, eq. (A.1)",
                "B=P1(I+Q1'P1)^-1, C=Q1(I+P1'Q1), V=BC': sympy (d=3,r=2) proves V=P1Q1', "
                "Woodbury, (I+V)^-1(I+M)-I = (I+V)^-1 P2 Q2' (rank <= r-r_T); random numeric",
                n, f"|V-P1Q1'| rel {worst_v:.1e}; {viol} rank violations", verdict(ok),
                "the RECON (A.1) is consistent but reduces to V = P1 Q1^T; needs I+Q1'P1 "
                "invertible (generic)")]


def check_lemma_b1(quick: bool) -> list[Row]:
    sym_ok = all(S.lemma_b1(d)["ok"] for d in (1, 2, 3, 5))
    rng = np.random.default_rng(4102)
    n_mc, zmax, cases = (20_000 if quick else 100_000), 0.0, 0
    for d in (3, 5):
        for w in (np.eye(d)[0], rng.normal(size=d)):
            est = MC.relu_outer_moment(w, n_mc, rng)
            zmax = max(zmax, float(np.max(est.zscore(MC.relu_outer_closed_form(w)))))
            cases += 1
    ok = sym_ok and zmax <= Z_MAX_MATRIX
    return [Row("Lemma B.1", "E[relu(x1) x x'] = (I+e1e1')/sqrt(2pi): sympy via 1-D moments "
                "(d=1,2,3,5); Monte Carlo for e1 and random w (rotated form) at d=3,5, "
                f"{n_mc} samples, every entry within {Z_MAX_MATRIX:g} SE",
                cases, f"max z = {zmax:.2f}", verdict(ok))]


def check_v3_constant(quick: bool) -> list[Row]:
    mom, cst = S.relu_norm_moment(), S.v3_constant()
    rng = np.random.default_rng(4103)
    # 200k samples even in quick mode: rejecting (d+1) at d=20 needs them (cheap, vectorised).
    n_mc, z_good, z_bad, z_risk, cases = 200_000, 0.0, np.inf, 0.0, 0
    for d in (2, 5, 10, 20):
        w = rng.normal(size=d)
        est = MC.relu_norm_moment(w, n_mc, rng)
        z_good = max(z_good, float(est.zscore(MC.relu_norm_closed_form(w, 2))))
        z_bad = min(z_bad, float(est.zscore(MC.relu_norm_closed_form(w, 1))))
        B = rng.normal(size=(d, d))
        risk = MC.v3_risk(B, w, n_mc, rng)
        z_risk = max(z_risk, float(risk.zscore(MC.v3_risk_closed_form(B, w))))
        cases += 2
    ok = (mom["ok"] and cst["ok"] and mom["slip_gives_d_plus_1"] and z_good <= Z_MAX
          and z_risk <= Z_MAX and z_bad > 2 * Z_MAX)
    return [Row("Thm 4.2 v3 constant c", "sympy: E[relu(w.x)^2|x|^2] = |w|^2(d+2)/2, min over "
                "|w| gives reduction (tr B+lam)_+^2/(pi(d+2)); Monte Carlo "
                f"({n_mc} samples, d=2,5,10,20) of the moment and of E|Bx-relu(w.x)x|^2",
                cases, f"z(d+2) <= {z_good:.2f}, risk z <= {z_risk:.2f}; z(d+1) >= {z_bad:.0f}",
                verdict(ok, corrected=True),
                "c = 1/(pi(d+2)), not the 1/(pi(d+1)) implied by xi in App. C; (d+1) results "
                "iff E[relu(x1)^2 x1^2] = 3/2 is taken as 1 (Gaussian 4th moment 2 not 3)")]


def _decomp(A, r):
    d = A.shape[0]
    U, s, Vt = np.linalg.svd(A - np.eye(d))
    delta = (U[:, r:] * s[r:]) @ Vt[r:]
    return U, s, Vt, delta


def check_thm42_res_base(quick: bool) -> list[Row]:
    rng = np.random.default_rng(4200)
    n, worst, beaten = (15 if quick else 60), 0.0, 0
    for i in range(n):
        d = int(rng.integers(3, 25))
        r = int(rng.integers(0, d))
        A = R.random_target(d, rng)
        worst = max(worst, _rel(TH.excess_risk("res", A, r), R.tail_sq(A - np.eye(d), r)),
                    _rel(TH.excess_risk_bound("res", A, r), R.tail_sq(A - np.eye(d), r)),
                    _rel(TH.excess_risk("base", A, r), R.tail_sq(A, r)))
        if i < 3 and 0 < r and d <= 10:  # a local search over (P, Q) must not beat E-Y
            B = A - np.eye(d)
            from scipy.optimize import minimize

            def f(z, B=B, d=d, r=r):
                P, Q = z[:d * r].reshape(d, r), z[d * r:].reshape(d, r)
                E = B - P @ Q.T
                return float(np.sum(E * E)), np.concatenate([(-2 * E @ Q).ravel(),
                                                             (-2 * E.T @ P).ravel()])
            res = minimize(f, rng.normal(size=2 * d * r), jac=True, method="L-BFGS-B")
            beaten += res.fun < TH.excess_risk("res", A, r) * (1 - 1e-9)
    ok = worst <= 1e-12 and beaten == 0  # 1e-12: same SVD, round-off only
    return [Row("§4.2 / Thm 4.2 res, base", "ER*(res) = bound = tail of SVD(A-I), ER*(base) = "
                "tail of SVD(A) (Eckart-Young, rtol 1e-12); L-BFGS over (P,Q) never beats it",
                n, f"rel err {worst:.1e}; {beaten} beaten", verdict(ok))]


def check_thm42_v1(quick: bool) -> list[Row]:
    sym_ok = S.grn_v1_alpha()["ok"]
    rng = np.random.default_rng(4201)
    n, worst_pt, bound_viol, not_exact, weaker, res_viol = (15 if quick else 50), 0.0, 0, 0, 0, 0
    for i in range(n):
        d = int(rng.integers(3, 20))
        r = int(rng.integers(0, d))
        A = R.random_target(d, rng)
        if i % 2:
            A = (A + A.T) / 2  # symmetric targets exercise the exact window formula
        U, s, Vt, delta = _decomp(A, r)
        alpha = 1.0 + np.trace(delta) / (d - r)
        A_tilde = U[:, :r] @ (s[:r, None] * Vt[:r] + (1 - alpha) * U[:, :r].T)
        bound = TH.excess_risk_bound("grn_v1", A, r)
        energy = float(np.sum((A - np.eye(d)) ** 2))
        worst_pt = max(worst_pt, _rel(np.sum((A - alpha * np.eye(d) - A_tilde) ** 2), bound,
                                      energy))
        exact = TH.excess_risk("grn_v1", A, r)
        tol = 1e-9 * energy  # both are optima of the same 1-D function
        if i % 2:
            mine = R.v1_exact_symmetric(np.linalg.eigvalsh(A), r)[0]
        else:
            mine = R.v1_search_general(A, r)[0]
        bound_viol += exact > bound + tol
        not_exact += mine < exact - tol
        weaker += exact < mine - tol
        res_viol += exact > TH.excess_risk("res", A, r) + tol
    ok = sym_ok and worst_pt <= CLOSED_RTOL and bound_viol == not_exact == res_viol == 0
    return [Row("Thm 4.2 GRN-v1", "sympy: alpha = 1+tr(D)/(d-r*), bound |D|^2-tr(D)^2/(d-r*); "
                "bound attained by App. B's A~ (1e-10 of |A-I|^2); exact ER* <= bound <= ER*(res); "
                "independent alpha search (grid+Brent / window brute force) never beats "
                "excess_risk (tol 1e-9)", n,
                f"attain rel {worst_pt:.1e}; {bound_viol}+{res_viol} bound, {not_exact} "
                f"exactness violations", verdict(ok),
                f"independent search was weaker in {weaker}/{n} cases" if weaker else "")]


def check_thm42_v2(quick: bool) -> list[Row]:
    rng = np.random.default_rng(4202)
    n, worst_pt, viol, gap = (4 if quick else 10), 0.0, 0, 0.0
    for _ in range(n):
        d = int(rng.integers(3, 11))
        r = int(rng.integers(0, d))
        A = R.random_target(d, rng)
        U, s, Vt, delta = _decomp(A, r)
        D2, M2 = np.diag(1.0 + np.diag(delta)), (U[:, :r] * s[:r]) @ Vt[:r]
        choice2 = np.sum(delta**2) - np.sum(np.diag(delta) ** 2)
        energy = float(np.sum((A - np.eye(d)) ** 2))
        worst_pt = max(worst_pt, _rel(np.sum((A - D2 - M2) ** 2), choice2, energy))
        bound = TH.excess_risk_bound("grn_v2", A, r)
        choice1 = TH.excess_risk_bound("grn_v1", A, r)
        worst_pt = max(worst_pt, _rel(bound, min(choice1, choice2), energy))
        best = TH.excess_risk("grn_v2", A, r)
        tol = 1e-9 * energy
        viol += best > bound + tol or best > TH.excess_risk("grn_v1", A, r) + tol
        alpha = 1 + np.trace(delta) / (d - r)
        mine = R.v2_minimise(A, r, [np.diag(A), 1 + np.diag(delta), np.full(d, alpha)])[0]
        gap = max(gap, (best - mine) / energy)
    ok = worst_pt <= CLOSED_RTOL and viol == 0
    return [Row("Thm 4.2 GRN-v2", "bound = |D|^2 - max(sum D_ii^2, tr(D)^2/(d-r*)) attained by "
                "App. B's D=diag(I+Delta) (rtol 1e-10); best-found ER* <= bound and <= "
                "ER*(v1); independent L-BFGS over D compared", n,
                f"attain rel {worst_pt:.1e}; {viol} violations", verdict(ok),
                f"excess_risk('grn_v2') is a search (an upper bound on ER*); our L-BFGS over D "
                f"found values lower by up to {max(gap, 0):.1e} x |A-I|^2")]


def _v3_choice_points(A, r):
    """(D, M, B) of App. B's two choices; trace(B) = 0 for both."""
    d = A.shape[0]
    U, s, Vt, delta = _decomp(A, r)
    low = (U[:, :r] * s[:r]) @ Vt[:r]
    alpha = 1.0 + np.trace(delta) / (d - r)
    M1 = low - (alpha - 1.0) * U[:, :r] @ U[:, :r].T
    return [(np.full(d, alpha), M1), (1.0 + np.diag(delta), low)]


def _best_w(B):
    lam, vec = np.linalg.eigh((B + B.T) / 2)
    t = max(np.trace(B) + lam[-1], 0.0)
    return 2.0 * t / (MC.SQRT_2PI * (B.shape[0] + 2)) * vec[:, -1]


def check_thm42_v3(quick: bool) -> list[Row]:
    rng = np.random.default_rng(4203)
    n, worst_pt, viol, beats_paper, z_worst, best_viol = (2 if quick else 5), 0.0, 0, 0, 0.0, 0
    for i in range(n):
        d = int(rng.integers(3, 6))
        r = int(rng.integers(1, min(3, d)))
        A = R.random_target(d, rng)
        bound = TH.excess_risk_bound("grn_v3", A, r, constant="corrected")
        paper = TH.excess_risk_bound("grn_v3", A, r, constant="paper")
        starts, vals = [], []
        for D, M in _v3_choice_points(A, r):
            w = _best_w(A - np.diag(D) - M)
            starts.append((D, M, w))
            vals.append(R.v3_objective(A, D, M, w))
        worst_pt = max(worst_pt, _rel(min(vals), bound))  # the bound is the better choice
        if i < 3:  # Monte Carlo of the attained risk at the better choice
            D, M, w = starts[int(np.argmin(vals))]
            est = MC.v3_risk(A - np.diag(D) - M, w, 100_000, rng)
            z_worst = max(z_worst, float(est.zscore(min(vals))))
        joint = R.v3_minimise(A, r, starts)
        viol += joint > bound * (1 + 1e-9)
        beats_paper += joint <= paper
        best_viol += TH.excess_risk("grn_v3", A, r) > bound * (1 + 1e-9)
    ok = worst_pt <= CLOSED_RTOL and viol == 0 and best_viol == 0 and z_worst <= Z_MAX
    return [Row("Thm 4.2 GRN-v3", "bound (c=1/(pi(d+2))) attained by App. B's choices with "
                "the optimal w (closed form, rtol 1e-10; Monte Carlo within 4 SE); joint "
                "L-BFGS over (D,M,w) and excess_risk('grn_v3') <= bound (d<=5)", n,
                f"attain rel {worst_pt:.1e}, MC z {z_worst:.2f}; {viol + best_viol} violations",
                verdict(ok, corrected=True),
                f"with the paper's c=1/(pi(d+1)) the bound is not attained by its own proof; "
                f"the joint optimum is below it in {beats_paper}/{n} cases (so not refuted)")]


CHECKS = [
    *[(f"Thm 4.1 C_{k}", check_thm41(k)) for k in C.KINDS],
    ("Thm 4.1 proof, eq. (A.1)", check_woodbury),
    ("Lemma B.1", check_lemma_b1),
    ("Thm 4.2 v3 constant c", check_v3_constant),
    ("§4.2 / Thm 4.2 res, base", check_thm42_res_base),
    ("Thm 4.2 GRN-v1", check_thm42_v1),
    ("Thm 4.2 GRN-v2", check_thm42_v2),
    ("Thm 4.2 GRN-v3", check_thm42_v3),
]
