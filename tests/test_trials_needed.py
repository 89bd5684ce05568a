"""The trials-needed study: grid, subsampling, summary, config check, CLI and figure."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dpaudit.cli import main
from dpaudit.experiments import jagielski
from dpaudit.experiments import trials_needed as tn
from dpaudit.io import read_table, write_table
from test_workflow import load

AUDIT = {"alpha": 0.01, "delta": 1e-5, "select_frac": 0.5}


def score_table(n: int, shift: float, seed: int = 0, ks=(1, 4)) -> pd.DataFrame:
    """A ClipBKD score table in jagielski-train's layout: D0 scores N(0, 1), D1 (each k)
    N(shift * k, 1)."""
    rng = np.random.default_rng(seed)
    sides = [("out", 0, 0, 0.0)] + [(f"k{k}", 1, k, shift * k) for k in ks]
    rows = []
    for side, label, k, mean in sides:
        s = rng.normal(mean, 1.0, n)
        rows.append(pd.DataFrame({"side": side, "label": label, "k": k, "trial": np.arange(n),
                                  "seed": rng.integers(0, 2**62, n), "clipbkd": s,
                                  "clipbkd_logit": s + rng.normal(0, 0.1, n),
                                  "test_acc": 0.9}))
    return pd.concat(rows, ignore_index=True)


CELL = {"dataset": "fmnist", "arch": "fnn", "clip": 1.0, "init": "fixed", "eps": "inf",
        "attack": "clipbkd"}


def test_n_grid_is_geometric_and_ends_at_the_full_count():
    assert tn.n_grid(50, 1000, 8) == [50, 77, 118, 181, 277, 425, 652, 1000]
    assert tn.n_grid(10, 40, 5) == [10, 14, 20, 28, 40]
    assert tn.n_grid(50, 8, 5) == [8]  # fewer trials than n_min: the full count only
    assert tn.n_grid(4, 8, 1) == [4, 8]


def test_subsample_draws_each_side_without_replacement_in_random_order():
    scores = score_table(30, 1.0)
    rng = np.random.default_rng(0)
    sub = tn.subsample(scores, 12, rng)
    assert sub.groupby("side").size().to_dict() == {"k1": 12, "k4": 12, "out": 12}
    for side, grp in sub.groupby("side"):
        assert list(grp.trial) == list(range(12))
        original = scores[scores.side == side].set_index("seed")
        assert grp.seed.is_unique and set(grp.seed) <= set(original.index)
        assert np.allclose(original.loc[grp.seed, "clipbkd"], grp.clipbkd)  # rows kept whole
    assert not sub[sub.side == "out"].seed.equals(
        scores[scores.side == "out"].seed.iloc[:12].reset_index(drop=True))
    with pytest.raises(ValueError, match="fewer than 31"):
        tn.subsample(scores, 31, rng)


def test_study_at_the_full_count_of_separated_sides_is_the_cell_row():
    # perfectly separated sides: every permutation gives the same counts, so each full-count
    # subsample reproduces summarize_cell of the table itself
    scores = score_table(64, 100.0)
    ref = jagielski.summarize_cell(scores, "clipbkd", **AUDIT)
    out = tn.study([(scores, CELL)], AUDIT["alpha"], AUDIT["delta"], AUDIT["select_frac"],
                   n_min=16, n_points=3, subsamples=3, seed=0)
    assert sorted(out.n.unique()) == [16, 32, 64] and len(out) == 9
    full = out[out.n == 64]
    for method in tn.METHODS:
        assert ref[method] > 0 and np.allclose(full[method], ref[method]), method
    # a perfect attack: what each method gives grows with the trials
    assert (out.groupby("n")[list(tn.METHODS)].median().diff().dropna() >= 0).all().all()
    again = tn.study([(scores, CELL)], AUDIT["alpha"], AUDIT["delta"], AUDIT["select_frac"],
                     16, 3, 3, seed=0)
    pd.testing.assert_frame_equal(out, again)  # reproducible from the seed


def test_crossing_interpolates_in_log_n():
    # 10 -> 1, 100 -> 3: the median 2 is reached halfway in log n, at sqrt(10 * 100)
    assert tn.crossing([10, 100], [1.0, 3.0], 2.0) == (pytest.approx(math.sqrt(1000)), False)
    assert tn.crossing([10, 100, 1000], [1.0, 3.0, 5.0], 3.0) == (pytest.approx(100), False)
    assert tn.crossing([10, 100], [2.0, 3.0], 1.5) == (10.0, True)  # at most 10
    n, first = tn.crossing([10, 100], [1.0, 3.0], 3.5)
    assert math.isnan(n) and not first


def _rows(values: dict, subs: int = 3) -> pd.DataFrame:
    rows = []
    for n, (cp, katz, bayes, gdp) in values.items():
        for sub in range(subs):
            rows.append({**{k: CELL[k] for k in ("dataset", "arch", "clip", "init", "attack")},
                         "eps_label": "inf", "n_full": 80, "n": n, "subsample": sub,
                         "eps_lb": cp, "eps_lb_katz": katz, "eps_lb_bayes": bayes,
                         "eps_lb_gdp": gdp if sub else 100.0})
    return pd.DataFrame(rows)


def test_summary_compares_every_method_with_the_certified_bounds_target():
    table = _rows({10: (0.0, 1.0, 0.0, 0.5), 20: (0.5, 2.0, 0.1, 0.6),
                   40: (0.95, 2.0, 0.2, 0.92), 80: (1.0, 2.0, 0.3, 1.0)})
    summ = tn.summary(table, 0.9).set_index("method")
    assert (summ.target == 0.9).all() and summ.full.to_dict() == {
        "eps_lb": 1.0, "eps_lb_katz": 2.0, "eps_lb_bayes": 0.3, "eps_lb_gdp": 1.0}
    # 0.5 at 20 and 0.95 at 40: 0.9 is reached at 20 * 2^(0.4 / 0.45) trials
    assert summ.n_needed["eps_lb"] == pytest.approx(20 * 2 ** (0.4 / 0.45))
    # the median ignores the outlying draw (100): 0.6 at 20, 0.92 at 40
    assert summ.n_needed["eps_lb_gdp"] == pytest.approx(20 * 2 ** (0.3 / 0.32))
    assert summ.n_needed["eps_lb_katz"] == 10 and summ.at_first["eps_lb_katz"]
    assert math.isnan(summ.n_needed["eps_lb_bayes"])  # never reaches the common target
    md = tn.markdown(summ.reset_index(), 0.9, 0.01, 3)
    assert "| 80 | 0.90 | 37 (1.00) | <= 10 (2.00) | not reached (0.30) | 38 (1.00) |" in md
    # no certified bound at the full count: no target, nothing needed
    zero = tn.summary(_rows({10: (0.0, 1.0, 0.0, 0.5), 80: (0.0, 2.0, 0.3, 1.0)}), 0.9)
    assert zero.target.isna().all() and zero.n_needed.isna().all()
    assert "| 80 | - | - (0.00) | - (2.00) | - (0.30) | - (1.00) |" in tn.markdown(
        zero, 0.9, 0.01, 3)


def test_cells_must_be_trained_by_the_grids():
    cfg = load("quick.yaml")
    cells = tn.cells(cfg["trials_needed"], cfg["jagielski"], cfg["onerun"])
    assert [jagielski.cell_path(*c) for c in cells] == [
        "results/jagielski/scores/fmnist_fnn_clipbkd/c1_fixed_einf.csv"]
    full = load("config.yaml")
    assert len(tn.cells(full["trials_needed"], full["jagielski"], full["onerun"])) == 2
    bad = {**cfg["trials_needed"], "clip": 0.5}
    with pytest.raises(ValueError, match="trials_needed.*fmnist_fnn_clipbkd/c0.5_fixed_einf"):
        tn.cells(bad, cfg["jagielski"], cfg["onerun"])


def test_cli_writes_tables_markdown_and_figure(tmp_path):
    paths = []
    for eps, shift in (("inf", 3.0), ("4", 0.5)):
        path = tmp_path / f"cell_{eps}.csv"
        write_table(score_table(12, shift, seed=len(paths)), path,
                    {"command": "jagielski-train", "cell": {**CELL, "eps": eps}, "seed": 0,
                     "spec": {"trials": 12, "ks": [1, 4]}})
        paths.append(str(path))
    spec = {"dataset": "fmnist", "arch": "fnn", "clip": 1.0, "init": "fixed",
            "attack": "clipbkd", "eps": ["inf", "4"], "n_min": 6, "n_points": 2,
            "subsamples": 2, "fraction": 0.9}
    out = {name: tmp_path / f"tn_{name}" for name in ("table.csv", "summary.csv", "md.md")}
    assert main(["trials-needed", "--scores", *paths, "--spec", json.dumps(spec), "--audit",
                 json.dumps(AUDIT), "--seed", "5", "--out", str(out["table.csv"]),
                 "--summary", str(out["summary.csv"]), "--md", str(out["md.md"])]) == 0
    table, meta = read_table(out["table.csv"])
    assert meta["seed"] == 5 and meta["spec"] == spec and meta["audit"] == AUDIT
    assert len(table) == 2 * 2 * 2 and set(table.columns) >= set(tn.METHODS)
    summ, _ = read_table(out["summary.csv"])
    assert len(summ) == 2 * len(tn.METHODS)
    assert "fmnist fnn clipbkd" in out["md.md"].read_text()
    fig = tmp_path / "trials_needed.pdf"
    assert main(["trials-needed-plot", "--table", str(out["table.csv"]), "--summary",
                 str(out["summary.csv"]), "--out", str(fig)]) == 0
    assert fig.stat().st_size > 0 and fig.with_suffix(".png").stat().st_size > 0
    # a bad spec stops naming the key
    assert main(["trials-needed", "--scores", *paths, "--spec",
                 json.dumps({**spec, "n_min": 2}), "--audit", json.dumps(AUDIT), "--seed",
                 "5", "--out", str(out["table.csv"]), "--summary", str(out["summary.csv"]),
                 "--md", str(out["md.md"])]) == 2

