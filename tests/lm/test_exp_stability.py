"""``experiments/lm_stability`` + its figure on a synthetic run cache with planted spikes
(default tests: no training), and its quick mode (slow)."""

from __future__ import annotations

import numpy as np
import pytest

from dca_theory.io import read_json, write_json
from experiments import lm_stability
from figures import fig_lm_stability

STEPS, WARMUP = 400, 40


def smooth_curves(n_seeds: int, seed: int, steps: int = STEPS) -> np.ndarray:
    """Decaying loss with 0.03-nat Gaussian batch noise: no spike under the c >= 4 rules."""
    t = np.arange(steps)
    rng = np.random.default_rng(seed)
    return 1.5 + 3.0 * np.exp(-t / 30) + 0.03 * rng.standard_normal((n_seeds, steps))


def add_run(cache, key, residual, *, spikes=(), d_model=64, n_layers=4, data="shakespeare",
            init_from=None, seed=0, k=None, steps=STEPS):
    """A cached 3-seed run; ``spikes``: (seed index, step) pairs raised by 0.6 nats (about 20
    noise sigmas: found at every c in {4, 6, 8})."""
    loss = smooth_curves(3, seed, steps)
    for i, t in spikes:
        loss[i, t] += 0.6
    grad = np.ones((3, steps))
    grad[:, min(200, steps - 1)] = 3.0 if spikes else 1.5
    folder = cache / key
    folder.mkdir(parents=True)
    np.savez(folder / "curves.npz", loss=loss, grad_norm=grad)
    model = {"residual": residual, "k": k, "grn_gate": "relu", "d_model": d_model,
             "n_layers": n_layers}
    # PTB is LMTrainConfig's default dataset, so its records omit "data" (non-default fields only)
    train = {"warmup_steps": WARMUP, "steps": steps} | ({} if data == "ptb" else {"data": data})
    write_json(folder / "record.json", {"key": key, "label": key, "seeds": [0, 1, 2],
                                        "init_from": init_from, "resolved_model": model,
                                        "train": train})


@pytest.fixture
def cache(tmp_path):
    c = tmp_path / "lm_runs"
    add_run(c, "v4", "vanilla", spikes=[(0, 100), (0, 101), (0, 200), (1, 300), (2, 150)],
            seed=1)
    add_run(c, "v8", "vanilla", n_layers=8, spikes=[(0, 250)], seed=2)
    add_run(c, "d4", "dca", seed=3)
    add_run(c, "d8", "dca", n_layers=8, seed=4)
    add_run(c, "g2", "grn_v2", seed=5)
    add_run(c, "hc", "hyper_connections", spikes=[(1, 330)], seed=6)
    add_run(c, "ptb-v", "vanilla", data="ptb", seed=7)
    add_run(c, "retro", "dca", init_from="v4", spikes=[(0, 60)], seed=8)
    (c / "unfinished").mkdir()  # no record.json: ignored
    return c


def test_counts_planted_spikes_by_group(cache):
    rows = lm_stability.analyse_seed_runs(lm_stability.load_cached_runs(cache))
    assert len(rows) == 8 * 3
    by = {(r["key"], r["seed"]): r for r in rows}
    # 100 and 101 are consecutive: one event
    assert by[("v4", 0)]["n_events"] == {"4.0": 2, "6.0": 2, "8.0": 2}
    assert [(e["start"], e["end"]) for e in by[("v4", 0)]["events"]["6.0"]] == [
        (100, 101), (200, 200)]
    assert by[("ptb-v", 0)]["data"] == "ptb"
    assert by[("retro", 0)]["group"] == "retrofit" and by[("g2", 0)]["group"] == "dca_family"
    assert by[("v4", 0)]["tested_steps"] == STEPS - WARMUP
    summary = lm_stability.summarise(rows)
    g = summary["headline"]["groups"]
    assert g["vanilla"]["count"] == 5 and g["vanilla"]["exposure"] == 9 * (STEPS - WARMUP)
    assert g["dca_family"]["count"] == 0 and g["baselines"]["count"] == 1
    assert g["retrofit"]["count"] == 1  # counted, but in no comparison
    comp = summary["headline"]["dca_family_vs_vanilla"]
    # 5 vs 0 events at exposures 9:9 seed runs: exact p = 2 * 0.5^5 = 0.0625 > 0.05
    assert comp["rate_ratio"]["p_value"] == pytest.approx(0.0625)
    assert comp["too_few_to_tell"]
    # matched configurations: shakespeare w64 at depth 4 and 8 (PTB vanilla has no DCA twin)
    m = summary["headline"]["matched_groups"]
    assert m["vanilla"]["seed_runs"] == 6 and m["dca_family"]["seed_runs"] == 6
    assert summary["grad_norm_ratio"]["vanilla"]["max"] == pytest.approx(3.0)


def test_enough_spikes_resolve_a_difference(tmp_path):
    c = tmp_path / "lm_runs"
    add_run(c, "v", "vanilla", spikes=[(i, t) for i in range(3) for t in (160, 240, 320, 380)])
    add_run(c, "d", "dca")
    summary = lm_stability.summarise(
        lm_stability.analyse_seed_runs(lm_stability.load_cached_runs(c)))
    comp = summary["headline"]["dca_family_vs_vanilla"]
    # 12 vs 0 events at equal exposure: p = 2 * 0.5^12
    assert comp["rate_ratio"]["p_value"] == pytest.approx(2 * 0.5**12)
    assert not comp["too_few_to_tell"]


def test_shared_events_point_at_hard_batches(tmp_path):
    c = tmp_path / "lm_runs"
    add_run(c, "v", "vanilla", spikes=[(1, 300), (2, 150)])
    add_run(c, "d", "dca", spikes=[(1, 301)], seed=1)  # same seed, next step: shared
    add_run(c, "v8", "vanilla", n_layers=8, spikes=[(2, 150)], seed=2)  # same kind: not shared
    add_run(c, "p", "dca", data="ptb", spikes=[(2, 150)], seed=3)  # other dataset: not shared
    rows = lm_stability.analyse_seed_runs(lm_stability.load_cached_runs(c))
    out = lm_stability.shared_events(rows, 6.0)
    assert out == {"events": 5, "shared_with_other_kind": 2, "tolerance_steps": 2}


def test_full_mode_scans_cache_and_draws(cache, tmp_path):
    path = lm_stability.main(out=tmp_path / "lm_stability")
    summary = read_json(path / "summary.json")
    assert summary["n_cached_runs"] == 8 and summary["n_seed_runs"] == 24
    # the vanilla run with the most spikes, paired with the DCA run of the same size and seed
    pair = summary["example_pair"]
    assert (pair["vanilla"]["key"], pair["dca"]["key"], pair["dca"]["seed"]) == ("v4", "d4", 0)
    files = fig_lm_stability.make(tmp_path / "fig", tmp_path)
    assert {p.suffix for p in files} == {".png", ".pdf", ".csv", ".json"}


def test_runs_the_rule_cannot_test_are_skipped_with_a_note(cache, tmp_path, capsys):
    """A run no longer than its warm-up (40 steps here, above the 25-step window) has no tested
    step: skipped and named, the others counted as before; only such runs: a one-line error."""
    from dca_theory import cli

    add_run(cache, "short", "vanilla", steps=WARMUP, seed=9)
    summary = read_json(lm_stability.main(out=tmp_path / "lm_stability") / "summary.json")
    assert summary["skipped_too_short"] == [{"key": "short", "steps": 40, "min_steps": 41}]
    assert summary["n_cached_runs"] == 8 and summary["n_seed_runs"] == 24
    assert "skipped short: 40 steps" in capsys.readouterr().out
    alone = tmp_path / "alone" / "lm_runs"
    add_run(alone, "short", "vanilla", steps=30)
    out = alone.parent / "lm_stability"
    assert cli.main(["run", "lm_stability", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("short has 30 steps, at least 41 are needed; lower --set window or "
                        "train longer runs") and "\n" not in err
    assert not (out / "summary.json").exists()


def test_full_mode_without_runs_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no cached runs"):
        lm_stability.main(out=tmp_path / "lm_stability")
    assert fig_lm_stability.make(tmp_path / "fig", tmp_path / "nothing") == []


@pytest.mark.slow
def test_quick_mode_trains_and_draws(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    path = lm_stability.main(quick=True, out=tmp_path / "lm_stability")
    summary = read_json(path / "summary.json")
    assert summary["n_cached_runs"] == 2
    assert {"vanilla", "dca_family"} <= set(summary["headline"]["groups"])
    assert fig_lm_stability.make(tmp_path / "fig", tmp_path)
