"""``experiments/lm_ablation`` and ``lm_related_work`` (+ their figures) on synthetic cached
records with planted effects (default tests: no training), and their quick modes (slow)."""

from __future__ import annotations

import numpy as np
import pytest

from dca_theory.io import read_json, write_json
from dca_theory.lab.lm_tables import paper_summary, same_order, summarise_table
from experiments import lm_ablation, lm_related_work
from figures import fig_lm_ablation, fig_lm_related_work

SEEDS = [0, 1, 2]
# planted test perplexities: a seed effect shared by all kinds (seed-paired design) plus a
# per-kind shift, so every paired difference is exactly the shift difference
SEED_EFFECT = np.array([0.0, 1.5, -0.8])
SHIFT = {"vanilla": 0.0, "grn_v1": -0.1, "grn_v2": -0.3, "grn_v3": -0.35, "dca": -0.9,
         "grn_v3_open": -0.5, "dca_open": -1.0, "denseformer": -0.2, "hyper_connections": -0.4,
         "laurel_pa": 0.05}


def fake_record(key: str, kind: str, params: int, noise: float = 0.0, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    test = 20.0 + SEED_EFFECT + SHIFT[kind] + noise * rng.standard_normal(3)
    return {"key": key, "label": key.rsplit("-", 1)[0], "n_params": params, "seeds": SEEDS,
            "test_ppl": test.tolist(), "valid_ppl": (test + 0.5).tolist(),
            "final_train_loss": [3.0, 3.0, 3.0], "median_step_s": 0.1, "init_from": None}


def fill_cache(cache, specs_by_data, noise=0.0):
    for d, specs in specs_by_data.items():
        for i, (kind, s) in enumerate(specs.items()):
            write_json(cache / s.key / "record.json",
                       fake_record(s.key, kind, 1000 + i, noise, seed=i))


def test_summarise_table_recovers_planted_differences():
    records = {k: fake_record(f"{k}-x", k, 10) for k in ("vanilla", "grn_v1", "dca")}
    table = summarise_table(records, [("vanilla", "grn_v1"), ("vanilla", "dca"),
                                      ("grn_v1", "dca"), ("vanilla", "missing")])
    d = table["paired_test_ppl"]
    assert set(d) == {"grn_v1-vanilla", "dca-vanilla", "dca-grn_v1"}  # missing row skipped
    # exact shifts: the seed effect cancels in a paired difference (float rounding only)
    assert d["dca-vanilla"]["per_seed"] == pytest.approx([-0.9] * 3, abs=1e-12)
    assert d["dca-vanilla"]["b_lower_seeds"] == 3
    assert table["order_by_test_ppl"] == ["dca", "grn_v1", "vanilla"]
    base = records["vanilla"]["test_ppl"]
    assert table["relative_to_reference_pct"]["dca"] == pytest.approx(
        100 * (np.mean(base) - 0.9) / np.mean(base) - 100)


def test_summarise_table_rejects_unpaired_rows():
    a, b = fake_record("a-x", "vanilla", 1), fake_record("b-x", "dca", 1)
    b["seeds"] = [3, 4, 5]
    with pytest.raises(ValueError, match="share their seeds"):
        summarise_table({"vanilla": a, "dca": b}, [("vanilla", "dca")])


def test_paper_summary_and_ordering():
    paper = paper_summary(lm_ablation.PAPER_TABLE7, lm_ablation.PAIRS)
    assert paper["differences"]["dca-vanilla"] == pytest.approx(18.06 - 18.98)
    assert paper["differences"]["grn_v3-grn_v2"] == pytest.approx(-0.02)
    assert paper["order_by_ppl"] == ["dca", "grn_v3", "grn_v2", "grn_v1", "vanilla"]
    same = same_order(paper["order_by_ppl"], paper["order_by_ppl"])
    assert same["kendall_tau"] == pytest.approx(1) and same["identical"]
    rev = same_order(paper["order_by_ppl"][::-1], paper["order_by_ppl"])
    assert rev["kendall_tau"] == pytest.approx(-1) and rev["identical"] is False


def test_ablation_full_mode_reads_cache_and_draws(tmp_path):
    # records at the full-mode keys: main() must only read them (no training in this test)
    fill_cache(tmp_path / "lm_runs", lm_ablation.dataset_specs(quick=False), noise=0.01)
    path = lm_ablation.main(out=tmp_path / "lm_ablation")
    summary = read_json(path / "summary.json")
    assert set(summary["datasets"]) == {"shakespeare", "ptb"}
    assert "dca_open" in summary["datasets"]["shakespeare"]["rows"]
    assert "dca_open" not in summary["datasets"]["ptb"]["rows"]  # open gate: Shakespeare only
    for table in summary["datasets"].values():
        d = table["paired_test_ppl"]["dca-vanilla"]
        # planted shift -0.9 with per-seed noise 0.01 on both rows: |error| < 5 noise sigmas
        assert d["mean"] == pytest.approx(-0.9, abs=0.05) and d["p_value"] < 1e-3
        assert table["order_vs_paper"]["identical"]
    files = fig_lm_ablation.make(tmp_path / "fig", tmp_path)
    assert {p.suffix for p in files} == {".png", ".pdf", ".csv", ".json"}
    # 7 Shakespeare rows + 5 PTB rows, 3 seeds each
    assert len((tmp_path / "fig" / "fig_lm_ablation.csv").read_text().splitlines()) == 1 + 36


def test_ablation_full_mode_leaves_out_uncached_optional_rows(tmp_path):
    specs = lm_ablation.dataset_specs(quick=False)
    specs["shakespeare"].pop("dca_open")
    fill_cache(tmp_path / "lm_runs", specs)
    summary = read_json(lm_ablation.main(out=tmp_path / "lm_ablation") / "summary.json")
    assert [x["kind"] for x in summary["left_out"]] == ["dca_open"]
    rows = summary["datasets"]["shakespeare"]["rows"]
    assert "dca_open" not in rows and "grn_v3_open" in rows
    assert "dca-dca_open" not in summary["datasets"]["shakespeare"]["paired_test_ppl"]


def test_related_work_full_mode_reads_cache_and_draws(tmp_path):
    fill_cache(tmp_path / "lm_runs", lm_related_work.dataset_specs(quick=False), noise=0.01)
    path = lm_related_work.main(out=tmp_path / "lm_related_work")
    summary = read_json(path / "summary.json")
    table = summary["datasets"]["shakespeare"]
    assert set(table["rows"]) == set(lm_related_work.KINDS)
    d = table["paired_test_ppl"]["dca-hyper_connections"]
    assert d["mean"] == pytest.approx(-0.5, abs=0.05)  # planted -0.9 - (-0.4)
    assert fig_lm_related_work.make(tmp_path / "fig", tmp_path)


def test_figures_skip_absent_results(tmp_path):
    assert fig_lm_ablation.make(tmp_path / "fig", tmp_path) == []
    assert fig_lm_related_work.make(tmp_path / "fig", tmp_path) == []


@pytest.mark.slow
def test_quick_modes_train_and_draw(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    for mod, fig in ((lm_ablation, fig_lm_ablation), (lm_related_work, fig_lm_related_work)):
        path = mod.main(quick=True, out=tmp_path / mod.NAME)
        summary = read_json(path / "summary.json")
        rows = summary["datasets"]["shakespeare"]["rows"]
        assert all(np.isfinite(r["test_ppl"]["mean"]) for r in rows.values())
        # identity-initialised GRNs add parameters; DCA adds the most of the ablation kinds
        assert rows["dca"]["params"] > rows["vanilla"]["params"]
        assert fig.make(tmp_path / "fig", tmp_path)
