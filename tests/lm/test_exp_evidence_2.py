"""lm_evidence_2: its full preset against the registered design (fast); every part end to end
at a tiny size through ``main`` with a synthetic trainer whose loss landscape is known (fast:
the machinery, sweeps, ranking check, H4's gate feeding the wide width, Holm); the committed
summary regenerated from the committed run cache (fast); and (slow) the quick mode with real
training."""

from __future__ import annotations

import math
import re
import zlib
from pathlib import Path

import numpy as np
import pytest

from dca_theory.cli import main as cli_main
from dca_theory.io import read_json, write_json
from dca_theory.lab import lm_evidence2 as L
from dca_theory.lab.statistics import holm
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.params import non_embedding_count
from experiments import lm_evidence_2


def test_full_preset_is_the_registered_design():
    s = lm_evidence_2.settings(False)
    assert s.arms() == ("vanilla", "vanilla_matched", "dca_paper", "dca_open",
                        "dca_bias_inside")
    # seeds (fresh, none of 0-5) per the design's table
    n = {(arm, w): len(s.main_seeds(arm, w)) for arm in s.arms() for w in (16, 32, 64, 128)}
    assert [n[("dca_paper", w)] for w in (16, 32, 64, 128)] == [12, 12, 8, 4]
    assert [n[("dca_open", w)] for w in (16, 32, 64)] == [8, 8, 8] and n[("dca_open", 128)] == 4
    assert min(s.seeds) == 100 and s.pool(s.common_seeds) == tuple(range(100, 108))
    assert s.pool(s.shared_seeds) == tuple(range(100, 106)) and s.sweep_seeds == (100, 101)
    # budgets: 8.19M tokens per full run, a quarter in a sweep run
    full = s.run_spec(False, "dca_paper", 32, "ptb-char", 0.016, s.pool(12))
    sweep = s.sweep_spec(False, "dca_paper", 32, "ptb-char", 0.016)
    t = full.train
    assert t.steps * t.batch_size * t.seq_len == 8_192_000 and t.eval_every == 250
    assert t.warmup_steps == 100 and t.eval_batches is None and full.final_batches is None
    assert sweep.train.steps * t.batch_size * t.seq_len == 2_048_000
    assert sweep.train.warmup_steps == 100 and sweep.seeds == (100, 101)
    # the matched vanilla's MLP: 72 / 136 / 264 / 520 (the design's numbers), DCA's count
    for w, mlp in ((16, 72), (32, 136), (64, 264), (128, 520)):
        m = s.run_spec(False, "vanilla_matched", w, "ptb-char", 1e-3, (100,)).model
        d = s.run_spec(False, "dca_paper", w, "ptb-char", 1e-3, (100,)).model
        assert m.d_mlp == mlp and d.d_mlp == 4 * w and m.n_layers == 4 and m.n_heads == 4
        gap = non_embedding_count(ModelConfig(**{**vars(m), "vocab_size": 50})) - \
            non_embedding_count(ModelConfig(**{**vars(d), "vocab_size": 50}))
        assert abs(gap) <= 4 * (2 * w + 1) / 2
    gates = {arm: s.run_spec(False, arm, 32, "ptb-char", 1e-3, (100,)).model.grn_gate
             for arm in s.arms()[2:]}
    assert gates == {"dca_paper": "paper", "dca_open": "open", "dca_bias_inside": "bias_inside"}
    # the sweep's starting rates: half, once and twice the first design's best
    assert [s.r0("vanilla", w) for w in (16, 32, 64)] == [0.064, 0.032, 0.016]
    assert [s.r0("dca_open", w) for w in (16, 32, 64)] == [0.032, 0.016, 0.008]
    assert s.r0("mhc", 32) == 0.016 and s.start_factors == (0.5, 1.0, 2.0) and s.max_extend == 4
    assert s.secondary_data == ("python-stdlib-bpe",) and s.parts == L.PARTS


@pytest.mark.parametrize("item, message", [
    ("gates=paper,relu6", "unknown gate 'relu6'; valid: paper, open, bias_inside"),
    ("gates=open,bias_inside", "gates must include paper"),
    ("core_seeds=12,12,8", "core_seeds needs one count per width and wide width (4)"),
    ("gate_seeds=20", "gate_seeds must lie in 2..12 (the seed pool), got 20"),
    ("parts=A,H", "unknown part 'H'; valid: A, B, C, D, E, F, G"),
    ("wide_widths=48", "wide_widths 48 must be wider than every width"),
    ("r0_dca=0.1,0.2", "r0_dca needs one rate > 0 per width (3), got 0.1,0.2"),
    ("secondary_width=128", "secondary_width 128 must be one of widths 16,32,64"),
])
def test_bad_settings_are_one_line_errors(item, message, capsys):
    assert cli_main(["run", "lm_evidence_2", "--set", item, "--show"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


# ------------------------------------------------------------------- a synthetic trainer

#: the best rate of each arm's loss landscape: vanilla's lies 32x above its start at width 8,
#: beyond the 2 extensions the test allows, so its sweep must end flagged at the edge
OPTIMUM = {"vanilla": 0.256, "vanilla_matched": 0.01, "dca_paper": 0.004, "dca_open": 0.004,
           "dca_bias_inside": 0.004, "attn_res": 0.002, "mhc": 0.008}
#: points of test ln ppl each arm sits from vanilla: bias_inside clearly the best gate
OFFSET = {"vanilla": 0.0, "vanilla_matched": -0.5, "dca_paper": -1.0, "dca_open": -1.5,
          "dca_bias_inside": -4.0, "attn_res": 0.5, "mhc": 0.0}


def fake_train(s, cache, log=None):
    """A record from the landscape, kept in ``cache`` like a trained run's."""
    path = Path(cache) / s.key / "record.json"
    if path.is_file():
        return read_json(path)
    arm, width = re.search(r"ev2-(.+)-w(\d+)-lr", s.label).groups()
    lr, steps = s.train.lr, s.train.steps
    rng = np.random.default_rng(zlib.crc32(repr((arm, width, s.train.data, lr, steps)).encode()))
    ln = []
    for seed in s.seeds:
        noise = np.random.default_rng(seed).normal(0, 0.002) + rng.normal(0, 0.001)
        ln.append(2.0 - 0.1 * math.log2(int(width)) + 0.02 * math.log2(lr / OPTIMUM[arm]) ** 2
                  + OFFSET[arm] / 100 + noise + 1.0 / steps)
    ppl = np.exp(ln).tolist()
    record = {"key": s.key, "label": s.label, "seeds": list(s.seeds), "n_params": 1,
              "valid_loss": ln, "test_loss": ln, "valid_ppl": ppl, "test_ppl": ppl,
              "final_train_loss": ln, "median_step_s": 0.01, "valid_history": [],
              "environment": {"git": "abc1234"}}
    write_json(path, record)
    return record


TINY = ["seeds=100,101,102,103", "sweep_steps=6", "core_seeds=4,4,3", "gate_seeds=3",
        "common_seeds=3",
        "shared_seeds=3", "secondary_seeds=3", "related_seeds=3",
        "gates=paper,open,bias_inside", "wide_widths=32", "r0_vanilla=0.008,0.004",
        "r0_dca=0.004,0.002", "start_factors=0.5,1,2", "max_extend=2",
        "secondary_data=python-stdlib-bpe", "related_arms=attn_res,mhc"]


def test_every_part_runs_in_order_and_the_rules_apply(tmp_path):
    out = tmp_path / "results" / "lm_evidence_2"
    ranks = lambda s: {"update_frac": [0.3] * len(s.seeds), "layers": 1}  # noqa: E731
    path = lm_evidence_2.main(quick=True, out=out, overrides=TINY, train=fake_train,
                              rank_of=ranks)
    s = read_json(path / "summary.json")
    assert s["complete"] and s["missing_runs"] == [] and s["parts_run"] == list("ABCDEFG")
    # every sweep ends interior or flagged; vanilla at width 8 ran out of extensions
    for name, cell in s["sweeps"].items():
        rates = sorted(map(float, cell["valid_ln_ppl"]))
        assert len(rates) <= 3 + 2
        interior = rates[0] < cell["lr"] < rates[-1]
        assert interior != cell["at_grid_edge"], name
        # the best tried is the one nearest the landscape's optimum (in log2 rate)
        arm = name.split("/")[1]
        assert cell["lr"] == min(rates, key=lambda r: abs(math.log2(r / OPTIMUM[arm])))
    assert s["sweeps"]["ptb-char/vanilla/w8"]["at_grid_edge"]
    assert s["sweeps"]["ptb-char/vanilla/w8"]["lr"] == pytest.approx(0.064)  # 0.008 x 2 x 2^2
    # the ranking check ran (its full-budget losses favour the sweep's best here)
    assert s["ranking_check"]["passed"] is True
    # every registered arm at every width, each at its own sweep's rate
    rows = s["rows"]["ptb-char"]
    for w in (8, 16):
        for arm in L.ARMS:
            assert f"{arm}-w{w}" in rows
            assert rows[f"{arm}-w{w}"]["lr"] == s["rates"][f"ptb-char/{arm}/w{w}"]["lr"]
        assert len(rows[f"dca_paper-w{w}"]["seeds"]) == 4
        assert len(rows[f"dca_open-w{w}"]["seeds"]) == 3
    # H4 on this landscape: bias_inside wins and is the default; so it trains at width 32
    assert s["H4"]["winner"] == "bias_inside" and s["H4"]["default_gate"] == "bias_inside"
    assert {k for k in rows if k.endswith("-w32")} == {
        "vanilla-w32", "vanilla_matched-w32", "dca_paper-w32", "dca_bias_inside-w32"}
    # width 32 started from half of width 16's best rate
    for arm in ("vanilla", "dca_paper"):
        assert s["sweeps"][f"ptb-char/{arm}/w32"]["r0"] == pytest.approx(
            s["sweeps"][f"ptb-char/{arm}/w16"]["lr"] / 2)
    # H2: Holm over widths 8 and 16 only (32 beside); H1 decided with both widths
    h2 = s["H2"]["dca_paper"]
    assert [h2[w]["p_holm"] for w in ("8", "16")] == holm([h2[w]["p_value"] for w in ("8", "16")])
    assert h2["32"]["p_holm"] is None
    assert s["H1"]["verdict"] in ("supported", "contradicted at this scale", "inconclusive")
    assert s["H1"]["slope_all_widths_beside"]["n_seeds"] == 3  # the wide width's seeds
    # shared rate: dca_paper at vanilla's (different) rate, worse than at its own
    assert all(c["mean"] > 0 for c in s["shared_rate"]["confound"].values())
    # the secondary corpus and H3; related work against vanilla and dca_paper, Holm per width
    assert set(s["rows"]["python-stdlib-bpe"]) == {f"{a}-w8" for a in L.ARMS}
    assert set(s["H3"]["G"]) == {"ptb-char", "python-stdlib-bpe"}
    rel = s["related"]["dca_paper"]
    assert set(rel) == {"attn_res-w8", "mhc-w8"}
    assert [r["p_holm"] for r in rel.values()] == holm([r["p_value"] for r in rel.values()])
    # H5: a cell per corpus, width and DCA arm, scored
    assert {c["score"] for c in s["H5"]["cells"].values()} <= {
        "hit", "miss against", "unexplained gain", "consistent"}
    assert "ptb-char/dca_paper/w32" in s["H5"]["cells"]
    assert s["code_versions"]["ptb-char/w8"] == {"versions": ["abc1234"], "mixed": False}
    _check_figure(s, tmp_path)


def _check_figure(s: dict, tmp_path: Path) -> None:
    """``figures/fig_lm_evidence_2`` drawn from that summary: its data file holds every swept
    rate with the chosen one marked as the summary's rate, and the H2, H4, part D and H5 values."""
    import csv

    from figures import fig_lm_evidence_2

    paths = fig_lm_evidence_2.make(tmp_path / "fig", tmp_path / "results")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv", ".json"}
    assert all(p.stat().st_size > 0 for p in paths)
    with open(tmp_path / "fig" / "fig_lm_evidence_2.csv") as f:
        rows = list(csv.DictReader(f))
    swept = [r for r in rows if r["panel"] == "sweep"]
    primary = {k: c for k, c in s["sweeps"].items() if k.startswith("ptb-char/")}
    assert len(swept) == sum(len(c["valid_ln_ppl"]) for c in primary.values())
    for r in swept:
        if r["chosen"] == "True":
            assert float(r["lr"]) == s["rates"][f"ptb-char/{r['arm']}/w{r['width']}"]["lr"]
    h2 = {(r["arm"], r["width"]): float(r["value"]) for r in rows if r["panel"] == "H1/H2"}
    assert h2[("dca_paper", "16")] == pytest.approx(s["H2"]["dca_paper"]["16"]["mean"], abs=1e-9)
    h4 = {(r["arm"], r["width"]): float(r["value"]) for r in rows if r["panel"] == "H4"}
    assert h4[("paper-open", "mean")] == pytest.approx(s["H4"]["pairs"]["paper-open"]["mean"])
    ranks = {r["arm"] + "/w" + r["width"]: float(r["value"]) for r in rows if r["panel"] == "H5"}
    assert ranks and ranks == pytest.approx({k: c["r_frac_mean"] for k, c in
                                             s["H5"]["cells"].items() if c["arm"] == "dca_paper"})
    shared = [float(r["value"]) for r in rows if r["panel"] == "shared rate"]
    assert shared == pytest.approx([g["mean"] for _, g in sorted(
        s["shared_rate"]["confound"].items(), key=lambda kv: int(kv[0]))]) and shared


def test_sittings_run_parts_in_turn_and_nothing_trains_before_the_ranking_check(tmp_path):
    calls = []

    def counting(s, cache, log=None):
        if not (Path(cache) / s.key / "record.json").is_file():
            calls.append(s.key)
        return fake_train(s, cache, log)

    out = tmp_path / "results" / "lm_evidence_2"

    def sitting(parts):
        calls.clear()
        path = lm_evidence_2.main(quick=True, out=out, overwrite=True,
                                  overrides=[*TINY, f"parts={parts}"], train=counting)
        return read_json(path / "summary.json")

    s = sitting("A")
    # part A alone trains exactly its sweeps' runs, one per rate tried
    assert sorted(calls) == sorted(k for c in s["sweeps"].values() for k in c["keys"].values())
    assert s["rows"] == {} and s["H4"]["verdict"] == "pending" and not s["complete"]
    # no full-budget run trains at a rate before the ranking check has had its say
    assert s["waiting_for_ranking_check"] and s["rates"] == {}
    s = sitting("C")
    assert calls == [] and s["rows"] == {} and s["waiting_for_ranking_check"]
    s = sitting("B")
    assert len(calls) == 4 and s["ranking_check"]["passed"] is True  # 2 arms x 2 rates
    s = sitting("C")
    assert len(calls) == 2 * 5 and len(s["rows"]["ptb-char"]) == 10  # 2 widths x 5 arms
    assert not s["waiting_for_ranking_check"] and s["H4"]["default_gate"] == "bias_inside"


@pytest.mark.slow  # real training: about 8 tiny runs, 1-3 minutes on the shared 2-core CPU
def test_quick_mode_trains_and_summarises(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    path = lm_evidence_2.main(quick=True, out=tmp_path / "results" / "lm_evidence_2")
    s = read_json(path / "summary.json")
    assert s["complete"] and set(s["rows"]["ptb-char"]) == {
        f"{a}-w{w}" for a in ("vanilla", "vanilla_matched", "dca_paper", "dca_bias_inside")
        for w in (8, 16)}
    assert all(c["at_grid_edge"] for c in s["sweeps"].values())  # one rate, no extension
    assert s["H4"]["default_gate"] in ("paper", "bias_inside")
    assert set(s["H5"]["cells"]) and s["cpu_hours"] > 0


def test_the_update_rank_is_saved_beside_the_record_and_outlives_the_parameters(
        tmp_path, monkeypatch, data_dir):
    """H5 reads each vanilla model's rank; the cache commits records, not parameters, so the
    measurement is saved beside the record and read back once the parameters are gone."""
    from dca_theory.lab.lm_evidence import run_unless_diverged
    from dca_theory.lab.lm_evidence2_runs import RANK_FILE, Grid2, measure_update_rank

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    s = lm_evidence_2.settings(True)
    spec = s.run_spec(True, "vanilla", 8, "ptb-char", 0.01, (100, 101), steps=3)
    assert measure_update_rank(spec, tmp_path, 2) is None  # not trained
    assert run_unless_diverged(spec, tmp_path) is not None
    r = measure_update_rank(spec, tmp_path, 2)
    assert len(r["update_frac"]) == 2 and all(0 < f <= 1 for f in r["update_frac"])
    assert r["layers"] == spec.model.n_layers and r["positions"] == 2
    (tmp_path / spec.key / "params.npz").unlink()
    assert measure_update_rank(spec, tmp_path, 2) == r  # read back from RANK_FILE
    assert (tmp_path / spec.key / RANK_FILE).is_file()
    assert measure_update_rank(spec, tmp_path, 3) is None  # another setting; no parameters
    # with h5_retrain the grid restores the parameters (retrained, checked against the record)
    (tmp_path / spec.key / RANK_FILE).unlink()
    cfg = lm_evidence_2.settings(True, ["h5_retrain=true"])
    assert cfg.rank_positions == 2
    assert Grid2(cfg, True, tmp_path, only_cached=True).rank_of(spec) is None
    restored = Grid2(cfg, True, tmp_path).rank_of(spec)
    assert {k: v for k, v in restored.items() if k != "models"} == r
    assert restored["models"]["test"]["per_seed"] == [0.0, 0.0]  # the replicate's gaps


def _differences(new, old, path="", rel=1e-9) -> list[str]:
    """Where two summaries differ (numbers beyond ``rel``), the run's environment and the cache
    path aside."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = [f"{path}/{k}: only in one" for k in set(old) ^ set(new)]
        for k in set(old) & set(new) - {"environment", "cache"}:
            out += _differences(new[k], old[k], f"{path}/{k}", rel)
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(new)} items, committed {len(old)}"]
        return [d for i, (a, b) in enumerate(zip(new, old))
                for d in _differences(a, b, f"{path}[{i}]", rel)]
    if isinstance(old, float) and isinstance(new, float):
        same = math.isclose(new, old, rel_tol=rel, abs_tol=1e-12) or (new != new and old != old)
        return [] if same else [f"{path}: {new!r}, committed {old!r}"]
    return [] if new == old else [f"{path}: {new!r}, committed {old!r}"]


def test_the_committed_summary_regenerates_from_the_committed_run_cache(tmp_path):
    """The committed summary is what today's code computes from the committed records and
    update ranks (numbers to relative 1e-9), with the committed overrides; reading trains
    nothing and writes nothing into the committed cache."""
    from dca_theory.lab.lm_evidence2_runs import RANK_FILE

    results = Path(lm_evidence_2.__file__).parent / "results"
    committed = read_json(results / "lm_evidence_2" / "config.json")
    cache = results / "lm_runs"
    (tmp_path / "lm_runs").symlink_to(cache)

    def files():  # what the cache commits (a run training beside the test adds others)
        return {(p, p.stat().st_mtime_ns) for name in ("record.json", "curves.npz", RANK_FILE)
                for p in cache.glob(f"*/{name}")}

    before = files()
    out = lm_evidence_2.main(out=tmp_path / "lm_evidence_2", only_cached=True,
                             overrides=[f"{k}={v}" for k, v in committed["overrides"].items()])
    assert files() == before
    new = read_json(out / "summary.json")
    old = read_json(results / "lm_evidence_2" / "summary.json")
    assert _differences(new, old) == []
