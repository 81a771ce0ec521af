"""lm_evidence_lr: the post-hoc rate check's statistic on hand-made records, and its refusals
(its run on a tiny grid is in tests/test_user_commands_evidence.py, on the quick grid in the
slow test of tests/lm/test_exp_evidence.py)."""

from __future__ import annotations

import math

import pytest

from dca_theory.lab.lm_evidence_analysis import rate_check
from experiments import lm_evidence_lr as L


def _rec(*valid_loss):
    return {"valid_loss": list(valid_loss)}


def test_rate_check_finds_each_arms_best_rate_handicap_and_gaps():
    records = {("vanilla", 64, 0.008): _rec(1.70, 1.72), ("vanilla", 64, 0.016): _rec(1.64, 1.66),
               ("vanilla", 64, 0.032): _rec(1.68, 1.70),
               ("dca", 64, 0.008): _rec(1.62, 1.64), ("dca", 64, 0.016): _rec(1.66, 1.68),
               ("dca", 64, 0.032): None,  # diverged: worse than any rate
               ("dca", 32, 0.016): _rec(9.0, 9.0)}  # another width: ignored
    r = rate_check(records, 64, 0.016)
    van, dca = r["arms"]["vanilla"], r["arms"]["dca"]
    assert van["best_rate"] == 0.016 and van["handicap"] == pytest.approx(0.0, abs=1e-12)
    assert not van["best_at_edge"]
    assert dca["best_rate"] == 0.008 and dca["best_at_edge"]
    # mean ln ppl 1.67 at the shared rate against 1.63 at 0.008: 4 points
    assert dca["handicap"] == pytest.approx(4.0, abs=1e-9)
    assert math.isinf(dca["valid_ln_ppl"]["0.032"])
    assert r["D_at_shared_rate"]["D_per_seed"] == pytest.approx([2.0, 2.0], abs=1e-9)
    assert r["D_at_own_best_rates"]["D_mean"] == pytest.approx(-2.0, abs=1e-9)
    assert r["D_at_own_best_rates"]["rates"] == {"dca": 0.008, "vanilla": 0.016}
    with pytest.raises(ValueError, match="no run at the shared rate 0.004"):
        rate_check(records, 64, 0.004)


@pytest.mark.parametrize("override, message", [
    ("factors=0.5,2", "factors must be > 0 and include 1"),
    ("factors=0,1", "factors must be > 0 and include 1"),
    ("arms=dca,transformer", "arms transformer invalid; valid: vanilla,dca"),
    ("widths=48", "widths 48 are not grid widths; valid: 16,32,64"),
    ("full_widths=24", "full_widths 24 are not grid widths; valid: 16,32,64"),
    ("widths=16,32", "full_widths 64 must be among widths 16,32"),
])
def test_bad_settings_are_refused_in_one_line(override, message):
    with pytest.raises(ValueError, match=message):
        L.settings(False, [override])


def test_without_the_grids_sweep_it_refuses_and_writes_nothing(tmp_path):
    out = tmp_path / "results" / "lm_evidence_lr"
    with pytest.raises(ValueError, match=r"the lm_evidence sweep has not run .* run "
                                         r"`dca-theory run lm_evidence --quick` first"):
        L.main(quick=True, out=out)
    assert not out.exists()


def test_a_grid_run_that_no_lm_evidence_run_wrote_is_refused_in_one_line(tmp_path, capsys):
    """``--set grid_run=DIR`` names the folder of an lm_evidence run: another folder is bad
    input (exit 2, one line naming it), before anything is written."""
    from dca_theory import cli
    from dca_theory.io import write_json

    other = tmp_path / "results" / "lm_depth"
    write_json(other / "config.json", {"experiment": "lm_depth", "quick": True})
    for bad in (tmp_path / "absent", other):
        out = tmp_path / "results" / "lm_evidence_lr"
        assert cli.main(["run", "lm_evidence_lr", "--quick", "--out", str(out),
                         "--set", f"grid_run={bad}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"dca-theory: error: grid_run {bad} is not a folder an "
                              "lm_evidence run wrote") and "\n" not in err
        assert not out.exists()
    # the rank experiment reads its grid the same way
    with pytest.raises(ValueError, match=f"grid_run {other} is not a folder"):
        from experiments import lm_evidence_rank

        lm_evidence_rank.settings(True, [f"grid_run={other}"])
