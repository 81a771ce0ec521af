"""lm_retrofit (paper Table 4): the NLL, preservation and table helpers on synthetic inputs; the
figure of a synthetic summary with one seed and with two; one slow test runs the quick mode and
draws the figure."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array

from experiments import lm_retrofit as E


class TableLM(eqx.Module):
    """A stand-in LM: the logits of token t are row t of a fixed table (no context)."""

    table_VxV: Array

    def __call__(self, tokens_L, *, inference: bool = False):
        return self.table_VxV[tokens_L]


def batch(rng, b=2, length=5, vocab=4) -> dict:
    w = np.ones((b, length), np.float32)
    w[-1, -2:] = 0.0  # a zero-padded tail, as in the last evaluation batch
    return {"inputs": rng.integers(0, vocab, (b, length)).astype(np.int32),
            "targets": rng.integers(0, vocab, (b, length)).astype(np.int32), "weights": w}


def test_nll_of_uniform_logits_is_log_vocab():
    bt = batch(np.random.default_rng(0))
    nll, weight = E.nll_sum(np.zeros((2, 5, 4), np.float32), bt)
    assert weight == 8.0  # 10 tokens, 2 padded
    assert nll / weight == pytest.approx(np.log(4.0), rel=1e-12)  # float64 log-softmax


def test_nll_matches_a_direct_log_softmax():
    rng = np.random.default_rng(1)
    bt, z = batch(rng), rng.normal(size=(2, 5, 4))
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    direct = -sum(logp[i, j, bt["targets"][i, j]] * bt["weights"][i, j]
                  for i in range(2) for j in range(5))
    assert E.nll_sum(z, bt)[0] == pytest.approx(direct, rel=1e-12)


def test_preservation_measures_the_logit_difference():
    rng = np.random.default_rng(2)
    table = jnp.asarray(rng.normal(size=(4, 4)))
    delta = 1e-3
    same = (TableLM(table), TableLM(table))
    shifted = (TableLM(table), TableLM(table.at[2, 1].add(delta)))
    bt = [batch(rng), batch(rng)]
    exact = E.preservation([same], bt)
    assert exact["worst"]["max_abs_logit_diff"] == 0.0 and exact["worst"]["abs_loss_diff"] == 0.0
    moved = E.preservation([same, shifted], bt)
    token_2_seen = any((b["inputs"] == 2).any() for b in bt)
    # float64 tables: the one changed entry is the largest difference, to rounding
    expect = delta if token_2_seen else 0.0
    assert moved["worst"]["max_abs_logit_diff"] == pytest.approx(expect, abs=1e-12)
    assert moved["per_seed"][1]["rel_logit_diff"] == pytest.approx(
        expect / float(np.max(np.abs(np.asarray(table)[np.unique(
            np.concatenate([b["inputs"].ravel() for b in bt]))]))), rel=1e-9)


def records():
    pre = {"valid_ppl": [10.0, 11.0, 12.0], "test_ppl": [10.5, 11.5, 12.5]}
    van = {"valid_history": [{"step": 50, "valid_ppl": [10.2, 11.1, 12.3]},
                             {"step": 200, "valid_ppl": [9.8, 10.9, 11.8]}]}
    dca = {"valid_history": [{"step": 50, "valid_ppl": [10.0, 10.9, 12.0]},
                             {"step": 200, "valid_ppl": [9.5, 10.5, 11.6]}]}
    return {"pretrained": pre, "vanilla": van, "dca": dca}


def test_curves_start_at_the_pretrained_model_and_mark_the_whole_split():
    c = E.valid_curves(records(), pre_partial=[10.4, 11.4, 12.4], pre_whole=[10.0, 11.0, 12.0])
    for kind in E.KINDS:
        assert [p["step"] for p in c[kind]] == [0, 50, 200]
        assert c[kind][0]["valid_ppl"] == [10.4, 11.4, 12.4]
        assert [p["whole_split"] for p in c[kind]] == [False, False, True]


def test_table_rows_pair_with_the_matching_reference():
    c = E.valid_curves(records(), pre_partial=[10.4, 11.4, 12.4], pre_whole=[10.0, 11.0, 12.0])
    rows = {r["step"]: r for r in E.table_rows(c, (50, 100, 200))}
    assert set(rows) == {50, 200}  # no evaluation at 100 in these records: row left out
    # +50 (partial split) is compared with the pretrained partial value, +200 with the whole
    assert rows[50]["dca_change"]["per_seed"] == pytest.approx([-0.4, -0.5, -0.4], abs=1e-12)
    assert rows[200]["dca_change"]["per_seed"] == pytest.approx([-0.5, -0.5, -0.4], abs=1e-12)
    assert rows[200]["dca_minus_vanilla"]["per_seed"] == pytest.approx([-0.3, -0.4, -0.2],
                                                                       abs=1e-12)
    assert rows[200]["dca_minus_vanilla"]["b_lower_seeds"] == 3


@pytest.mark.slow
def test_quick_mode_and_figure(tmp_path, monkeypatch, data_dir):
    from dca_theory.io import read_json
    from figures import fig_lm_retrofit

    monkeypatch.setenv("DCA_DATA_DIR", str(data_dir))
    s = read_json(E.main(quick=True, out=tmp_path / "lm_retrofit") / "summary.json")
    # float32 models: the retrofit differs only in summation order (a few ulps of the logits)
    assert s["preservation"]["worst"]["rel_logit_diff"] < 1e-5
    assert s["preservation"]["worst"]["rel_loss_diff"] < 1e-5
    assert [r["step"] for r in s["table"]] == [10, 20]
    paths = fig_lm_retrofit.make(tmp_path / "fig", tmp_path)
    assert {q.suffix for q in paths} == {".png", ".pdf", ".csv"}


@pytest.mark.parametrize("n_seeds", [1, 2])
def test_figure_shows_a_spread_only_with_more_than_one_seed(tmp_path, monkeypatch, n_seeds):
    """One seed has no standard deviation: no band or error bar, an empty CSV cell and a title
    that says so (and no degrees-of-freedom warning, an error under the test settings)."""
    import csv

    from dca_theory.io import write_json
    from figures import fig_lm_retrofit

    def curve(offset):
        return [{"step": s, "whole_split": s == 4,
                 "valid_ppl": [30.0 - s + offset + seed for seed in range(n_seeds)]}
                for s in (0, 2, 4)]

    write_json(tmp_path / "lm_retrofit" / "summary.json",
               {"valid_curves": {"vanilla": curve(0.0), "dca": curve(-0.5),
                                 "pretrained_whole_split": [30.0 + k for k in range(n_seeds)]},
                "preservation": {"worst": {"rel_logit_diff": 1e-7}}})
    titles = []
    save = fig_lm_retrofit.save
    monkeypatch.setattr(fig_lm_retrofit, "save", lambda fig, *a, **k: (
        titles.append(fig.axes[0].get_title()), save(fig, *a, **k))[1])
    paths = fig_lm_retrofit.make(tmp_path / "fig", tmp_path)
    with open(next(p for p in paths if p.suffix == ".csv"), encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 3 + 1 + 3  # two curves, the pretrained model, three differences
    stds = {r["valid_ppl_std"] for r in rows}
    if n_seeds == 1:
        assert stds == {""} and titles == ["one seed: no spread shown"]
    else:  # per-seed values 1 apart: sample std 1/sqrt(2); the differences are equal per seed
        assert sorted(map(float, stds)) == pytest.approx([0.0, np.sqrt(0.5)], abs=1e-12)
        assert titles == [""]
