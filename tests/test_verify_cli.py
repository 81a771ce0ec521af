"""``dca-theory verify``: exit status, JSON shape, verdicts, and failure handling.

One quick report (about 10 s) is computed once per module and shared."""

import json

import pytest

from dca_theory import cli
from dca_theory.theory import verify as V


@pytest.fixture(scope="module")
def quick_json():
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main(["verify", "--json", "--quick"])
    return code, buf.getvalue()


def test_exit_code_zero_and_json_parses(quick_json):
    code, out = quick_json
    report = json.loads(out)
    assert code == 0
    assert report["summary"]["ok"] is True and report["summary"]["FAILED"] == 0
    assert report["summary"]["rows"] == len(report["checks"])


def test_every_row_has_a_verdict_and_fields(quick_json):
    checks = json.loads(quick_json[1])["checks"]
    for row in checks:
        assert row["verdict"] in V.VERDICTS
        assert row["claim"] and row["checked"] and row["worst"]
        assert isinstance(row["cases"], int) and row["cases"] >= 0


def test_every_section4_claim_is_reported(quick_json):
    claims = " | ".join(r["claim"] for r in json.loads(quick_json[1])["checks"])
    for needle in ["Thm 4.1 C_base", "Thm 4.1 C_res", "Thm 4.1 C_grn_v1", "Thm 4.1 C_grn_v2",
                   "Thm 4.1 C_grn_v3", "(A.1)", "Lemma B.1", "v3 constant", "res, base",
                   "Thm 4.2 GRN-v1", "Thm 4.2 GRN-v2", "Thm 4.2 GRN-v3", "Lemma C.1",
                   "(4.1)", "(4.2)", "(4.3)", "G1", "G2", "G3", "Prop 4.4", "Figure 5",
                   "Prop 4.5", "AttnRes ⊇ C_res/(T+1)", "AttnRes skip", "AttnRes excess risk",
                   "mHC (static) = n·C_res", "mHC excess risk"]:
        assert needle in claims, needle


def test_known_corrections_are_flagged(quick_json):
    rows = {r["claim"]: r["verdict"] for r in json.loads(quick_json[1])["checks"]}
    # The paper's c = 1/(pi(d+1)) is wrong (d+2); its GRN-v3 construction needs a fix.
    assert rows["Thm 4.2 v3 constant c"] == "corrected"
    assert rows["Thm 4.1 C_grn_v3"] == "corrected"
    assert rows["Prop 4.5 (bottleneck rank)"] == "open"


def test_table_output(capsys, monkeypatch):
    monkeypatch.setattr(V, "_checks", lambda: [("Fake", lambda q: [
        V.Row("Fake claim", "something", 3, "0 violations", "confirmed")])])
    assert V.main(as_json=False, quick=True) == 0
    out = capsys.readouterr().out
    assert "Fake claim" in out and "confirmed" in out and "1 checks" in out


def test_failure_gives_nonzero_exit(capsys, monkeypatch):
    def boom(quick):
        raise RuntimeError("broken closed form")

    monkeypatch.setattr(V, "_checks", lambda: [
        ("Good", lambda q: [V.Row("Good", "x", 1, "0", "corrected")]), ("Bad", boom)])
    assert cli.main(["verify", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    bad = [r for r in report["checks"] if r["claim"] == "Bad"][0]
    assert bad["verdict"] == "FAILED" and "broken closed form" in bad["worst"]
    # A "corrected" verdict alone is not a failure.
    assert report["summary"]["corrected"] == 1 and report["summary"]["ok"] is False


def test_row_rejects_unknown_verdict():
    with pytest.raises(ValueError, match="verdict must be one of"):
        V.Row("c", "x", 0, "-", "maybe")
