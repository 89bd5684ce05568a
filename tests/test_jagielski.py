"""Jagielski et al. 2020 audits: neighbouring data sets, model seeds, scores, cell bounds."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from dpaudit import bounds, dpsgd
from dpaudit.experiments import jagielski


def _task(rng, n=40, d=6, n_test=10):
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    X_test = rng.normal(size=(n_test, d)).astype(np.float32)
    pool = rng.normal(size=(16, d)).astype(np.float32)
    return jagielski.make_task(X, y, X_test, (X_test[:, 0] > 0).astype(np.int64), pool,
                               np.ones(16, np.int64), X_test[:4], np.ones(4, np.int64),
                               clipbkd_norm=5.0)


def _n_diff_rows(A, B):
    (XA, yA), (XB, yB) = A, B
    return int(((XA != XB).any(axis=1) | (yA != yB)).sum())


@pytest.mark.parametrize("attack", ["backdoor", "clipbkd"])
def test_poisoned_sides_differ_from_d0_in_k_rows(attack):
    task = _task(np.random.default_rng(0))
    plan = jagielski.sides(task, attack, [1, 2, 8])
    (_, label0, _, D0), *d1s = plan
    assert label0 == 0 and [(lab, k) for _, lab, k, _ in d1s] == [(1, 1), (1, 2), (1, 8)]
    for _, _, k, D1 in d1s:
        assert len(D1[0]) == len(D0[0]) == len(task.X)
        assert _n_diff_rows(D0, D1) == k
    if attack == "clipbkd":  # flipped D0: the poison with the other label in the last row
        np.testing.assert_allclose(D0[0][-1], task.x_p)
        assert D0[1][-1] == 1 - task.y_p
        assert np.linalg.norm(task.x_p) == pytest.approx(5.0, rel=1e-5)


def test_mi_sides_remove_the_last_row():
    task = _task(np.random.default_rng(1))
    (_, _, _, D0), (_, _, _, D1) = jagielski.sides(task, "mi", [1, 4])
    assert len(D0[0]) == len(task.X) - 1
    np.testing.assert_array_equal(D1[0], task.X)
    np.testing.assert_array_equal(D0[0], task.X[:-1])


def test_unknown_attack_is_refused():
    with pytest.raises(ValueError, match="attack='bogus'"):
        jagielski.sides(_task(np.random.default_rng(0)), "bogus", [1])


def test_model_seeds_distinct_deterministic_and_side_specific():
    a = jagielski.model_seeds(0, "fmnist", "fnn", "clipbkd", "k1", 500)
    assert len(set(a)) == 500 and all(s >= 0 for s in a)
    assert a == jagielski.model_seeds(0, "fmnist", "fnn", "clipbkd", "k1", 500)
    assert a[:10] == jagielski.model_seeds(0, "fmnist", "fnn", "clipbkd", "k1", 10)
    assert not set(a) & set(jagielski.model_seeds(0, "fmnist", "fnn", "clipbkd", "out", 500))
    assert not set(a) & set(jagielski.model_seeds(1, "fmnist", "fnn", "clipbkd", "k1", 500))


def test_scores_match_a_direct_torch_computation():
    task = _task(np.random.default_rng(2))
    model = dpsgd.ModelSpec("fnn", 6, hidden=5)
    params = dpsgd.init_params(model, 3, [1, 2, 3], device="cpu")
    got = {k: v for attack in jagielski.ATTACKS
           for k, v in jagielski.score_models(params, model, task, attack).items()}
    # each attack keeps only what its audit reads
    assert set(jagielski.score_models(params, model, task, "clipbkd")) == {
        "clipbkd", "clipbkd_logit", "test_acc"}
    assert set(jagielski.score_models(params, model, task, "mi")) == {"mi", "mi_yeom", "test_acc"}
    with pytest.raises(ValueError, match="attack='bogus'"):
        jagielski.score_models(params, model, task, "bogus")
    for k in range(3):
        net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        with torch.no_grad():
            for lin, W, b in zip((net[0], net[2]), params.W, params.b):
                lin.weight.copy_(W[k].T)
                lin.bias.copy_(b[k])
            f = lambda x: net(torch.as_tensor(x)).double()  # noqa: E731
            ce = torch.nn.functional.cross_entropy
            yp = task.y_p
            want_clip = float(f(task.x_p[None])[0, yp] - f(np.zeros((1, 6), np.float32))[0, yp])
            want_bkd = -float(ce(f(task.bkd_test_X), torch.as_tensor(task.bkd_test_y),
                                 reduction="sum"))
            want_mi = -float(ce(f(task.X[-1:]), torch.as_tensor(task.y[-1:])))
            want_acc = float((f(task.X_test).argmax(1).numpy() == task.y_test).mean())
            want_logit = float(f(task.x_p[None])[0, yp])
            # Yeom et al.: member iff true-class confidence >= the members' mean confidence
            conf_in = torch.softmax(f(task.X[:10]), 1)[torch.arange(10), task.y[:10]]
            conf_out = torch.softmax(f(task.X_test), 1)[torch.arange(10), task.y_test]
            thr = conf_in.mean()
            want_yeom = math.log(float((conf_in >= thr).double().mean()
                                       + (conf_out < thr).double().mean()))
        assert got["clipbkd"][k] == pytest.approx(want_clip, abs=1e-5)
        assert got["clipbkd_logit"][k] == pytest.approx(want_logit, abs=1e-5)
        assert got["backdoor"][k] == pytest.approx(want_bkd, rel=1e-5)
        assert got["mi"][k] == pytest.approx(want_mi, rel=1e-5, abs=1e-6)
        assert got["test_acc"][k] == pytest.approx(want_acc)
        assert got["mi_yeom"][k] == pytest.approx(want_yeom)


def _group_cfgs():
    base = dict(epochs=2, batch_size=10, lr=0.5)
    return {"a": dpsgd.DPSGDConfig(clip=1.0, noise_multiplier=0.5, **base),
            "b": dpsgd.DPSGDConfig(clip=2.0, noise_multiplier=0.0, init_scale=0.5, **base)}


def test_run_group_cells_are_what_each_cell_trains_alone_in_any_blocks(tmp_path):
    """A group's cells trained as columns of one wide step score as each cell trained on
    its own (same seeds, same models, to float rounding), whatever the block size; a
    store then gives every block back without training."""
    task = _task(np.random.default_rng(3))
    model = dpsgd.ModelSpec("fnn", 6, hidden=4)
    cfgs = _group_cfgs()
    kw = dict(ks=[1, 2], trials=6, seed=0, name=("toy", "fnn"))
    both = jagielski.run_group(task, "clipbkd", model, cfgs, **kw,
                               calls=jagielski.Calls(block=4, device="cpu"))
    for c, cfg in cfgs.items():
        alone = jagielski.run_group(task, "clipbkd", model, {c: cfg}, **kw,
                                    calls=jagielski.Calls(block=6, device="cpu"))[c]
        assert len(alone) == 3 * 6 and sorted(alone.side.unique()) == ["k1", "k2", "out"]
        assert list(alone.columns[:5]) == ["side", "label", "k", "trial", "seed"]
        assert (alone.groupby("side").trial.apply(list) == [list(range(6))] * 3).all()
        pd.testing.assert_frame_equal(both[c], alone, rtol=1e-5, atol=1e-6)
    msgs = []
    key = {"what": 1}
    calls = jagielski.Calls(block=4, device="cpu", log=msgs.append)
    first = jagielski.run_group(task, "clipbkd", model, cfgs, **kw, calls=calls,
                                store=jagielski.Store(tmp_path, key))
    again = jagielski.run_group(task, "clipbkd", model, cfgs, **kw, calls=calls,
                                store=jagielski.Store(tmp_path, key))
    assert "0 models restored, 36 to train" in msgs[0] and "36 models restored, 0 to" in _summary(msgs)
    for c in cfgs:
        pd.testing.assert_frame_equal(first[c], again[c])
        pd.testing.assert_frame_equal(first[c], both[c])
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        f"{side}_{r}.csv" for side in ("k1", "k2", "out") for r in ("000000-000004",
                                                                     "000004-000006")]


def test_run_group_trains_only_missing_blocks_and_cells(tmp_path):
    """A grown grid trains only its new cells; an interrupted job loses at most the block
    it was in; another key (device, trainer, task) or cell key (noise) retrains."""
    from dpaudit.io import read_table

    task = _task(np.random.default_rng(3))
    model = dpsgd.ModelSpec("lr", 6)
    cfgs = _group_cfgs()
    msgs = []
    kw = dict(ks=[1], trials=6, seed=0, name=("toy", "lr"),
              calls=jagielski.Calls(block=3, device="cpu", log=msgs.append))
    store = jagielski.Store(tmp_path, {"k": 1})
    full = jagielski.run_group(task, "mi", model, cfgs, **kw, store=store)
    jagielski.run_group(task, "mi", model, {"a": cfgs["a"]}, **kw, store=store)
    assert "12 models restored, 0 to train" in _summary(msgs)  # 2 sides x 6 trials
    # a lost block (an interruption) and a new cell: the block's 3 trials x 3 cells, and
    # the new cell's 3 trials in each of the 3 other blocks
    (tmp_path / "in_000003-000006.csv").unlink()
    cfgs["c"] = dpsgd.DPSGDConfig(epochs=2, batch_size=10, lr=0.5, clip=0.5, noise_multiplier=2.0)
    grown = jagielski.run_group(task, "mi", model, cfgs, **kw, store=store)
    assert "18 models restored, 18 to train" in _summary(msgs)
    for c in ("a", "b"):
        pd.testing.assert_frame_equal(grown[c], full[c])
    table, prov = read_table(tmp_path / "out_000000-000003.csv")
    assert sorted(prov["cells"]) == ["a", "b", "c"] and len(table) == 9
    jagielski.run_group(task, "mi", model, cfgs, **kw, store=jagielski.Store(tmp_path, {"k": 2}))
    assert "0 models restored, 36 to train" in _summary(msgs)
    jagielski.run_group(task, "mi", model, cfgs, **kw,
                        store=jagielski.Store(tmp_path, {"k": 2},
                                              {"a": {"noise": 9}, "b": {}, "c": {}}))
    assert "24 models restored, 12 to train" in _summary(msgs)


def test_run_group_is_bit_identical_whatever_the_calls_and_blocks(tmp_path, monkeypatch):
    """Calls of any size, spanning blocks or splitting them, train the same models bit for
    bit with shuffle sampling (each model's draws and products are its own), and write the
    same kept blocks byte for byte; Poisson calls never span two blocks (padding to the
    call's largest batch changes the summation order), nor do calls on shared data (one
    product for all models, whose kernel a GPU may pick by its size), and the device's
    memory sets K."""
    task = _task(np.random.default_rng(5))
    model = dpsgd.ModelSpec("fnn", 6, hidden=4)
    cfgs = _group_cfgs()
    kw = dict(ks=[1], trials=7, seed=2, name=("toy", "fnn"))
    first = None
    monkeypatch.setattr(dpsgd.sampling, "shares_data", lambda *args: False)  # gathered
    for block, per_call in ((7, None), (7, 2), (3, 7), (3, 5), (2, 1)):
        store = tmp_path / f"b{block}_k{per_call}"
        got = jagielski.run_group(task, "clipbkd", model, cfgs, **kw,
                                  calls=jagielski.Calls(block, "cpu", per_call),
                                  store=jagielski.Store(store, {"k": 1}))
        files = {f.name: f.read_bytes() for f in sorted(store.iterdir())}
        if first is None:
            first = got
        for c in cfgs:
            pd.testing.assert_frame_equal(got[c], first[c], check_exact=True)
        if block == 3:
            if per_call == 7:
                files3 = files
            assert files == files3  # the same kept blocks, byte for byte
    calls = []
    real = dpsgd.train
    monkeypatch.setattr(dpsgd, "train", lambda X, y, m, c, seeds, **k: calls.append(
        len(seeds)) or real(X, y, m, c, seeds, **k))
    three = jagielski.Calls(block=3, device="cpu")
    jagielski.run_group(task, "clipbkd", model, cfgs, **kw, calls=three)  # K = 32/2 columns = 16
    assert calls == [7, 7]  # gathered: one call per side, all its blocks
    monkeypatch.undo()
    monkeypatch.setattr(dpsgd, "train", lambda X, y, m, c, seeds, **k: calls.append(
        len(seeds)) or real(X, y, m, c, seeds, **k))
    calls.clear()
    assert dpsgd.sampling.shares_data(model, cfgs["a"], 40, 2)  # 40 rows, batches of 10
    shared = jagielski.run_group(task, "clipbkd", model, cfgs, **kw, calls=three)
    assert calls == [3, 3, 1] * 2  # shared data: one call per block
    for c in cfgs:  # the same models, to float rounding (one product over the call's models)
        pd.testing.assert_frame_equal(shared[c], first[c], check_exact=False, rtol=1e-5)
    poisson = {c: dpsgd.DPSGDConfig(**{**vars(v), "sampling": "poisson"}) for c, v in cfgs.items()}
    calls.clear()
    jagielski.run_group(task, "clipbkd", model, poisson, **kw, calls=three)
    assert calls == [3, 3, 1] * 2  # one call per block
    with pytest.raises(ValueError, match="per_call=0: must be an integer >= 1"):
        jagielski.Calls(per_call=0)


def _summary(msgs):
    return [m for m in msgs if "restored" in m][-1]


def _cell(pos_by_k, neg):
    rows = [pd.DataFrame({"label": 0, "k": 0, "trial": np.arange(len(neg)), "clipbkd": neg,
                          "clipbkd_logit": neg, "test_acc": 0.9})]
    for k, pos in pos_by_k.items():
        rows.append(pd.DataFrame({"label": 1, "k": k, "trial": np.arange(len(pos)),
                                  "clipbkd": pos, "clipbkd_logit": pos, "test_acc": 0.9}))
    return pd.concat(rows, ignore_index=True)


def test_cell_bound_is_clopper_pearson_on_the_evaluation_half():
    """Perfectly separated scores: the threshold from the first half separates the second
    half too, so eps_LB = ln(p1_lo / p0_hi) / k with exact binomial (scipy) bounds."""
    rng = np.random.default_rng(4)
    neg, pos = rng.normal(size=200), rng.normal(size=200) + 100
    row = jagielski.summarize_cell(_cell({2: pos}, neg), "clipbkd", alpha=0.01, delta=0.0)
    ci = stats.binomtest(100, 100).proportion_ci(0.99, "exact")
    p1_lo, p0_hi = ci.low, 1 - ci.low
    want = max(math.log(p1_lo / p0_hi), math.log((1 - p0_hi) / (1 - p1_lo))) / 2
    assert row["eps_lb_best_k"] == pytest.approx(want, rel=1e-9)
    assert row["best_k"] == 2 and row["tpr"] == 1 and row["fpr"] == 0 and row["trials"] == 200
    assert row["eps_lb"] == pytest.approx(want)  # one k: no correction
    assert row["eps_lb_scan"] > 0 and row["eps_lb_gdp"] > 0


def test_best_over_k_and_its_bonferroni_version():
    rng = np.random.default_rng(5)
    neg = rng.normal(size=400)
    cell = _cell({1: rng.normal(size=400) + 0.5, 4: rng.normal(size=400) + 3.0}, neg)
    row = jagielski.summarize_cell(cell, "clipbkd", alpha=0.01, delta=1e-5)
    per_k = jagielski.audit_scores(cell, "clipbkd", 0.01, 1e-5)
    assert row["eps_lb_best_k"] == pytest.approx(per_k.eps_lb.max()) and row["best_k"] == 4
    assert 0 < row["eps_lb"] <= row["eps_lb_best_k"]
    split = bounds.threshold_split_audit(cell[cell.k == 4].clipbkd, neg,
                                         lambda *a: bounds.eps_lb_clopper_pearson(*a, 1e-5, 4),
                                         0.01 / 2)
    assert row["eps_lb"] == pytest.approx(split.value)


def _columns_of_summarize_cell(pos_by_k, neg, alpha, delta, columns):
    """The ``columns`` (of ``eps_lb``, ``eps_lb_scan``, ``mu_lb``) as
    :func:`jagielski.summarize_cell` derives them (every k at ``alpha / len(ks)``, the
    largest over k), from the bounds module alone: a simulated audit in tens of ms instead
    of a second (the tests check them equal to its row)."""
    level = alpha / len(pos_by_k)
    per_k = {column: [] for column in columns}
    for k, pos in pos_by_k.items():
        def cp(*counts, k=k):
            return bounds.eps_lb_clopper_pearson(*counts, delta, k)
        halves = bounds.split_trials(pos, neg)
        compute = {
            "eps_lb": lambda: bounds.threshold_holdout_audit(*halves, cp, level).value,
            "eps_lb_scan": lambda: bounds.threshold_scan_audit(pos, neg, cp, level).value,
            "mu_lb": lambda: bounds.threshold_holdout_audit(*halves, bounds.mu_lb_gdp,
                                                            level).value / k}
        for column, values in per_k.items():
            values.append(compute[column]())
    return {column: max(values) for column, values in per_k.items()}


def test_cell_bounds_are_sound_on_a_gaussian_mechanism():
    """Scores of a mechanism whose privacy is known: the statistic is N(k mu, 1) with the
    k canaries in and N(0, 1) without, i.e. mu-GDP per canary, so every eps_LB at delta must
    stay below eps(mu, delta) but in about an alpha fraction of audits. The bounds of each
    simulated cell are summarize_cell's, computed from the bounds module (the first cells
    check them equal to its row)."""
    mu, delta, alpha, T = 1.0, 1e-5, 0.05, 200
    true_eps = bounds.eps_from_mu(mu, delta)
    rng = np.random.default_rng(6)
    over = {"eps_lb": 0, "eps_lb_scan": 0}
    best = 0.0
    sims = 200
    for sim in range(sims):
        pos, neg = {k: rng.normal(size=T) + k * mu for k in (1, 2)}, rng.normal(size=T)
        row = _columns_of_summarize_cell(pos, neg, alpha, delta, list(over))
        if sim < 3:
            full = jagielski.summarize_cell(_cell(pos, neg), "clipbkd", alpha, delta)
            assert {key: full[key] for key in row} == row
        for key in over:
            over[key] += row[key] > true_eps
        best = max(best, row["eps_lb"])
    slack = stats.binom.ppf(0.999, sims, alpha)
    assert all(v <= slack for v in over.values()), over
    # Not vacuous: 100 evaluation trials per side cap a CP bound near ln(100 / 5.3) = 2.9.
    assert best > 0.25 * true_eps


def test_per_row_mu_lb_holds_at_one_minus_alpha():
    """Group scores of a per-row mu-GDP mechanism: k canaries shift the statistic by k mu
    (N(k mu, 1) against N(0, 1)), the group is k mu-GDP. The reported per-row ``mu_lb``
    must exceed mu in at most about an alpha fraction of cells (the old column, the
    largest group-level mu over k, had median 2.65 at mu = 0.5 and exceeded it always).
    Each cell's ``mu_lb`` is summarize_cell's, computed from the bounds module (the first
    cells check it equal to its row), so that 300 cells take seconds."""
    mu, alpha, T, sims = 0.5, 0.05, 200, 300
    rng = np.random.default_rng(8)
    over, values = 0, []
    for sim in range(sims):
        pos, neg = {k: rng.normal(size=T) + k * mu for k in (1, 2, 4, 8)}, rng.normal(size=T)
        mu_lb = _columns_of_summarize_cell(pos, neg, alpha, 1e-5, ["mu_lb"])["mu_lb"]
        if sim < 3:
            assert jagielski.summarize_cell(_cell(pos, neg), "clipbkd", alpha,
                                            1e-5)["mu_lb"] == mu_lb
        values.append(mu_lb)
        over += mu_lb > mu
    assert over <= stats.binom.ppf(0.999, sims, alpha), over
    assert np.median(values) > 0.2 * mu  # not vacuous: k = 8 separates well
    per_k = jagielski.audit_scores(_cell(pos, neg), "clipbkd", alpha, 1e-5)
    assert np.allclose(per_k.mu_lb * per_k.k, per_k.mu_lb_group)


def test_one_threshold_per_k_keeps_the_certified_bound_below_the_best_over_k():
    """Each k's threshold is chosen once and evaluated at alpha (best over k) and at
    alpha / len(ks) (certified), so the certified bound never exceeds the best over k
    (thresholds chosen separately at the two levels gave 0.73 > 0.62 for seed 9)."""
    for seed in range(8, 12):
        rng = np.random.default_rng(seed)
        neg = rng.normal(size=100)
        cell = _cell({k: rng.normal(size=100) + rng.uniform(0, 3) for k in (1, 2, 4, 8)}, neg)
        row = jagielski.summarize_cell(cell, "clipbkd", 0.01, 1e-5)
        assert 0 < row["eps_lb"] <= row["eps_lb_best_k"]
        per_k = jagielski.audit_scores(cell, "clipbkd", 0.01 / 4, 1e-5)
        best = per_k[per_k.k == row["best_k"]].iloc[0]
        assert row["eps_lb_best_k"] == pytest.approx(bounds.eps_lb_clopper_pearson(
            best.ct_eval_pos, best.n_eval_pos, best.ct_eval_neg, best.n_eval_neg, 0.01, 1e-5,
            row["best_k"]))
        assert row["threshold"] == best.threshold and row["eps_lb"] == per_k.eps_lb.max()


def test_paper_rule_reads_the_raw_logit_and_resplits_bracket_the_certified_bound():
    """ClipBKD's paper rule reads clipbkd_logit (the reference's statistic), the certified
    bound clipbkd; the re-split range is a spread of that certified bound, seeded."""
    rng = np.random.default_rng(11)
    neg = rng.normal(size=200)
    cell = _cell({1: rng.normal(size=200) + 1.0, 2: rng.normal(size=200) + 1.5}, neg)
    cell.loc[cell.label == 1, "clipbkd_logit"] += 10  # separable only by the raw logit
    row = jagielski.summarize_cell(cell, "clipbkd", 0.01, 1e-5, resplits=50, seed=1)
    pos = {k: cell[cell.k == k].clipbkd_logit.to_numpy() for k in (1, 2)}
    assert row["eps_lb_paper_rule"] == bounds.eps_lb_paper_rule(pos, neg).value > 2
    assert 0 < row["eps_lb"] < 1 and row["eps_lb_best_k"] < 1
    spread = bounds.eps_lb_resplits({k: cell[cell.k == k].clipbkd.to_numpy() for k in (1, 2)},
                                    neg, 0.01, 1e-5, splits=50, seed=1)
    assert (row["eps_lb_split_lo"], row["eps_lb_split_hi"]) == tuple(np.percentile(spread,
                                                                                   [5, 95]))
    assert row["eps_lb_split_lo"] < row["eps_lb_split_hi"]
    assert "eps_lb_split_lo" not in jagielski.summarize_cell(cell, "clipbkd", 0.01, 1e-5)
    # the paper rule's sampling spread: the bootstrap of the raw-logit statistic, seeded
    row = jagielski.summarize_cell(cell, "clipbkd", 0.01, 1e-5, boots=30, boot_seed=2)
    assert row["eps_lb_paper_rule_sd"] == np.std(bounds.paper_rule_bootstrap(
        pos, neg, boots=30, seed=2), ddof=1) > 0
    assert "eps_lb_paper_rule_sd" not in jagielski.summarize_cell(cell, "clipbkd", 0.01, 1e-5)


@pytest.mark.parametrize("column,value,match", [
    ("clipbkd", np.nan, "NaN"), ("clipbkd_logit", np.nan, "NaN"),
])
def test_nan_scores_are_refused_naming_the_column(column, value, match):
    rng = np.random.default_rng(9)
    cell = _cell({1: rng.normal(size=20) + 1}, rng.normal(size=20))
    cell.loc[3, column] = value
    with pytest.raises(ValueError, match=match) as err:
        jagielski.summarize_cell(cell, "clipbkd", 0.05, 1e-5)
    assert column in str(err.value)


def test_paper_table2_values_and_markdown():
    assert jagielski.paper_table2("inf", "fixed", 1.0) == 4.54
    assert jagielski.paper_table2("8", "g2", 2.0) == 0.20
    assert jagielski.paper_table2("1", "g0.5", 0.5) == 0.13
    assert math.isnan(jagielski.paper_table2("3", "g1", 1.0))
    assert math.isnan(jagielski.paper_table2("8", "g1", 4.0))
    table = pd.DataFrame({"eps_label": ["inf", "inf", "8"], "init": ["fixed", "g1", "g1"],
                          "clip": [1.0, 1.0, 1.0], "noise": [0.0, 0.0, 1.01],
                          "eps_lb_paper_rule": [3.2, 0.3, 0.2],
                          "eps_lb_best_k": [4.4, 1.0, 0.3], "eps_lb": [3.1, 0.25, 0.0],
                          "eps_lb_split_lo": [3.0, 0.2, 0.0], "eps_lb_split_hi": [3.3, 0.4, 0.1]})
    table = jagielski.with_paper_table2(table)
    assert list(table.paper_eps_lb) == [4.54, 0.42, 0.25]
    assert list(table.columns[4:6]) == ["eps_lb_paper_rule", "paper_eps_lb"]
    md = jagielski.table2_markdown(table)
    assert "| eps_th label (noise) | fixed init | Glorot x 1 |" in md
    assert "| inf (0) | 3.20 (4.54) [3.10; 3.00-3.30] | 0.30 (0.42) [0.25; 0.20-0.40] |" in md
    assert "| 8 (1.01) | - | 0.20 (0.25) [0.00; 0.00-0.10] |" in md
    assert "not itself a 99% bound" in md and "init_mult" in md and "eps_pld_replace" in md
    assert "not a bound" in md and "DKW" in md
    # paper rule - paper: -1.34, -0.12, -0.05; within 0.5: the last two
    agree = jagielski.paper_agreement(table)
    assert (agree["cells"], agree["within"]) == (3, 2)
    assert agree["rms"] == pytest.approx(math.sqrt((1.34 ** 2 + 0.12 ** 2 + 0.05 ** 2) / 3))
    assert agree["mean_diff"]["init"]["fixed"] == pytest.approx(-1.34)
    assert agree["mean_diff"]["eps_label"]["inf"] == pytest.approx((-1.34 - 0.12) / 2)
    assert agree["mean_diff"]["clip"][1.0] == pytest.approx((-1.34 - 0.12 - 0.05) / 3)
    # within 0.1: only the last (-0.05); relative: 1.34/4.54, 0.12/0.42, 0.05/0.25 -> median 0.2857
    assert agree["within_fine"] == 1 and agree["median_rel"] == pytest.approx(0.12 / 0.42)
    assert ("Against the paper, by its procedure: 2 of 3 cells (67%) within +-0.5 of its "
            "value, 1 within +-0.1; median relative difference 29%; RMS of ours - paper "
            "0.78. Mean") in md
    assert "within_sd" not in agree  # no sampling spread in this table
    # with one: |diff| / (sqrt(2) sd) = 1.34 / (1.414 * 1.0) = 0.95, 0.12 / 0.0283 = 4.24,
    # 0.05 / 0.0141 = 3.54 -> 1 within 1, 1 within 2, 1 within 3; 0 sd with 0 diff counts as 0
    sd = table.assign(eps_lb_paper_rule_sd=[1.0, 0.02, 0.01])
    agree = jagielski.paper_agreement(sd)
    assert agree["within_sd"] == {1: 1, 2: 1, 3: 1}
    assert agree["expected_sd"][2] == pytest.approx(3 * 0.9544997, rel=1e-6)
    assert "1, 1 and 1 cells lie within 1, 2 and 3 spreads" in jagielski.table2_markdown(sd)
    exact = sd.assign(eps_lb_paper_rule=sd.paper_eps_lb, eps_lb_paper_rule_sd=0.0)
    assert jagielski.paper_agreement(exact)["within_sd"] == {1: 3, 2: 3, 3: 3}
    assert jagielski.paper_agreement(sd, column="eps_lb").get("within_sd") is None
    agree = jagielski.paper_agreement(table)
    assert "by init: fixed init -1.34," in md and "by eps_th label: 8 -0.05, inf -0.73;" in md
    # the certified and best-over-k columns are counted too (certified - paper: -1.44,
    # -0.17, -0.25; best - paper: -0.14, 0.58, 0.05)
    assert jagielski.paper_agreement(table, column="eps_lb_best_k")["within"] == 2
    assert "certified eps_lb 2 of 3 (RMS 0.85); eps_lb_best_k" in md and "2 of 3 (RMS 0.35)" in md
    assert jagielski.paper_agreement(table, tol=2.0)["within"] == 3
    # without the split columns the cells hold the certified bound alone
    bare = jagielski.table2_markdown(table.drop(columns=["eps_lb_split_lo", "eps_lb_split_hi"]))
    assert "| inf (0) | 3.20 (4.54) [3.10] | 0.30 (0.42) [0.25] |" in bare
    # cells the paper lacks are left out of the count; cells we lack are counted apart
    extra = pd.concat([table, table.iloc[:1].assign(clip=4.0, paper_eps_lb=math.nan)])
    assert jagielski.paper_agreement(extra)["cells"] == 3
    lost = table.assign(eps_lb_paper_rule=[math.nan, 0.3, 0.2])
    agree = jagielski.paper_agreement(lost)
    assert (agree["cells"], agree["within"], agree["unmeasured"]) == (2, 2, 1)
    assert "fixed init" not in agree["mean_diff"]["init"]
    assert "(1 more cells of the paper have no value here)" in jagielski.table2_markdown(lost)
    # eps labels read back from a CSV as numbers are the config's labels again
    read_back = table.assign(eps_label=[math.inf, math.inf, 8.0])
    assert set(jagielski.paper_agreement(read_back)["mean_diff"]["eps_label"]) == {"8", "inf"}
    with pytest.raises(ValueError, match="tol=-1"):
        jagielski.paper_agreement(table, tol=-1)
    with pytest.raises(ValueError, match="column='nope'"):
        jagielski.paper_agreement(table, column="nope")
    with pytest.raises(ValueError, match="no column paper_eps_lb"):
        jagielski.table2_markdown(table.drop(columns="paper_eps_lb"))


def test_cli_md_writes_table2_from_its_csv_and_refuses_other_tables(tmp_path):
    from dpaudit.cli import main
    from dpaudit.io import write_table

    table = jagielski.with_paper_table2(pd.DataFrame(
        {"eps_label": ["inf", "8"], "init": ["fixed", "g1"], "clip": [1.0, 1.0],
         "noise": [0.0, 1.01], "eps_lb_paper_rule": [4.4, 0.2], "eps_lb": [4.3, 0.1]}))
    write_table(table, tmp_path / "t2.csv", {"command": "test"})
    out = tmp_path / "t2.md"
    assert main(["jagielski-md", "--table", str(tmp_path / "t2.csv"), "--out", str(out)]) == 0
    md = out.read_text()
    # the CSV's eps labels read back as numbers; the Markdown shows the config's labels
    assert "| inf (0) | 4.40 (4.54) [4.30] | - |" in md and "| 8 (1.01) |" in md
    assert "2 of 2 cells (100%) within +-0.5" in md
    with pytest.raises(SystemExit, match="2"):
        main(["jagielski-md", "--table", str(tmp_path / "t2.csv"), "--out", str(out),
              "--tolerance", "-1"])
    write_table(table.drop(columns="paper_eps_lb"), tmp_path / "bad.csv", {"command": "test"})
    assert main(["jagielski-md", "--table", str(tmp_path / "bad.csv"), "--out", str(out)]) == 2


def test_reference_tables_agree_with_the_paper_as_the_docs_say():
    """The committed paper-scale tables (reference/, one H100 run re-audited on a CPU): by
    the paper's procedure every Table 2 cell within 0.5 of the paper (RMS 0.09), the
    certified bound never above the best over k, the re-split range ordered, and the
    Markdown the one `jagielski-md` writes from the CSV."""
    from pathlib import Path

    from dpaudit.io import BODY_SHA256, read_markdown, read_table

    ref = Path(__file__).parents[1] / "reference"
    t2, prov = read_table(ref / "jagielski_table2.csv")
    fig2, _ = read_table(ref / "jagielski_fig2.csv")
    assert prov["resplits"] == jagielski.RESPLITS and prov["spec"]["alpha"] == 0.01
    agree = jagielski.paper_agreement(t2)
    assert (agree["cells"], agree["within"], round(agree["rms"], 2)) == (72, 72, 0.09)
    assert jagielski.paper_agreement(t2, column="eps_lb")["within"] == 69
    for table in (t2, fig2):
        assert (table.eps_lb <= table.eps_lb_best_k).all()
        assert (table.eps_lb_split_lo <= table.eps_lb_split_hi).all()
        assert (table.trials == 1000).all()
    assert len(fig2) == 72 and set(fig2.attack) == {"mi", "backdoor", "clipbkd"}
    assert read_markdown(ref / "jagielski_table2.md", prov[BODY_SHA256]) == \
        jagielski.table2_markdown(t2)


def test_theoretical_eps_reproduces_the_papers_calibration():
    """CIFAR: n = 10,000, batch 500, 20 epochs: the paper's noise 1.02 is eps 8 by
    rdp_classic (about 7.95); the tight PLD accountant gives less."""
    cfg = dpsgd.DPSGDConfig(epochs=20, batch_size=500, lr=0.8, clip=1.0, noise_multiplier=1.02)
    th = jagielski.theoretical_eps(1.02, 10_000, cfg, 1e-5)
    assert th["eps_th"] == pytest.approx(7.95, abs=0.02)
    assert 0.5 * th["eps_th"] < th["eps_pld"] < th["eps_th"]
    assert jagielski.theoretical_eps(0.0, 10_000, cfg, 1e-5)["eps_th"] == math.inf


def _train_cli(tmp_path, spec, cells, *extra, attack="clipbkd", arch="fnn"):
    import json

    from dpaudit.cli import main

    return main(["jagielski-train", "--task", str(tmp_path / "task.npz"), "--dataset", "fmnist",
                 "--arch", arch, "--attack", attack, "--cells", json.dumps(cells),
                 "--spec", json.dumps(spec), "--seed", "5", "--out-dir", str(tmp_path / "out"),
                 "--device", "cpu", *extra])


TRAIN_SPEC = {"trials": 4, "ks": [1, 2], "sampling": "shuffle", "clipbkd_d0": "flipped",
              "epochs": 2, "batch_size": 10, "lr": 0.5, "hidden": 5,
              "noise": {"4": 0.7, "inf": 0.0}, "matmul_precision": "fp32"}


def test_cli_train_scores_table_and_saved_models_reproduce_the_scores(tmp_path):
    from dpaudit import features
    from dpaudit.io import read_table

    task = _task(np.random.default_rng(7))
    features.save_features(tmp_path / "task.npz", task.arrays(), {"dataset": "toy"})
    assert _train_cli(tmp_path, TRAIN_SPEC, [[1, "g2", "4"]], "--save-models", "2") == 0
    out = tmp_path / "out" / "c1_g2_e4.csv"
    scores, prov = read_table(out)
    assert prov["seed"] == 5 and prov["cell"]["noise"] == 0.7 and prov["dpsgd"]["init_scale"] == 2
    assert prov["spec"]["noise"] == 0.7 and prov["cell"]["eps"] == "4"
    # the device actually used, the torch version and the trainer's code are recorded
    assert prov["trainer"]["device"] == "cpu" and prov["trainer"]["torch"] == torch.__version__
    assert prov["trainer"]["digest"] == jagielski.trainer_digest()
    assert len(scores) == 3 * 4
    params, model = dpsgd.load_params(out.with_name("c1_g2_e4_models_k2.pt"))
    assert params.K == 2 and model.hidden == 5
    again = jagielski.score_models(params, model, task, "clipbkd")["clipbkd"]
    want = scores[scores.side == "k2"].sort_values("trial").clipbkd.to_numpy()[:2]
    np.testing.assert_allclose(again, want, rtol=1e-6)
    bad = {k: v for k, v in TRAIN_SPEC.items() if k != "noise"}
    assert _train_cli(tmp_path, bad, [[1, "g2", "4"]], attack="mi", arch="lr") == 2
    assert _train_cli(tmp_path, TRAIN_SPEC, [[1, "g2", "8"]]) == 2  # no noise for label 8
    assert _train_cli(tmp_path, TRAIN_SPEC, [[1, "g2", "4"]] * 2) == 2  # a cell twice
    assert _train_cli(tmp_path, TRAIN_SPEC, [[1, "g2"]]) == 2
    assert _train_cli(tmp_path, TRAIN_SPEC, [[1, "fixed", "4"]]) == 2  # no --init-file


def test_cli_train_keeps_blocks_and_retrains_only_what_changed(tmp_path, capsys):
    """One job, two cells: each cell is what a one-cell job writes; a rerun with a new
    cell reuses the kept blocks (same bytes) and trains only the new cell; another task,
    trainer digest or device retrains."""
    from dpaudit import features
    from dpaudit.io import read_table

    task = _task(np.random.default_rng(7))
    features.save_features(tmp_path / "task.npz", task.arrays(), {"dataset": "toy"})
    store = ["--store", str(tmp_path / "trained"), "--block-trials", "3"]
    out = tmp_path / "out"
    cells = [[1, "g2", "4"], [1, "g2", "inf"]]
    assert _train_cli(tmp_path, TRAIN_SPEC, cells, *store) == 0
    a, b = out / "c1_g2_e4.csv", out / "c1_g2_einf.csv"
    before = {p.name: p.read_bytes() for p in (a, b)}
    alone = read_table(b)[0]
    assert _train_cli(tmp_path, TRAIN_SPEC, cells[1:]) == 0
    pd.testing.assert_frame_equal(read_table(b)[0], alone, rtol=1e-5)
    capsys.readouterr()

    # Snakemake removes a job's outputs before it reruns it
    import shutil

    shutil.rmtree(out)
    spec = {**TRAIN_SPEC, "noise": {**TRAIN_SPEC["noise"], "1": 3.0}}
    assert _train_cli(tmp_path, spec, [[1, "g2", "1"], *cells], *store) == 0
    err = capsys.readouterr().err
    assert "24 models restored, 12 to train" in err
    assert {p.name: p.read_bytes() for p in (a, b)} == before
    assert read_table(out / "c1_g2_e1.csv")[1]["cell"]["noise"] == 3.0

    # More trials: the full block [0, 3) is reused, the last one (now [3, 5)) trains;
    # another task: everything again
    assert _train_cli(tmp_path, {**TRAIN_SPEC, "trials": 5}, cells, *store) == 0
    assert "18 models restored, 12 to train" in capsys.readouterr().err
    assert read_table(a)[0].trial.max() == 4
    other = _task(np.random.default_rng(8))
    features.save_features(tmp_path / "task.npz", other.arrays(), {"dataset": "toy"})
    assert _train_cli(tmp_path, TRAIN_SPEC, cells, *store) == 0
    assert "0 models restored, 24 to train" in capsys.readouterr().err


def test_cli_train_restores_only_on_the_same_device_and_trainer(tmp_path, capsys, monkeypatch):
    """CUDA random streams differ between the CPU and GPU models: a block kept from another
    device kind, GPU model or torch version, from other trainer code or matmul precision,
    trains again."""
    from dpaudit import device, features
    from dpaudit.io import read_table

    task = _task(np.random.default_rng(7))
    features.save_features(tmp_path / "task.npz", task.arrays(), {"dataset": "toy"})
    store = ["--store", str(tmp_path / "trained")]
    assert _train_cli(tmp_path, TRAIN_SPEC, [[1, "g2", "4"]], *store) == 0
    real = device.describe
    monkeypatch.setattr(device, "describe", lambda d=None: {**real(d), "gpu_name": "other"})
    capsys.readouterr()
    assert _train_cli(tmp_path, TRAIN_SPEC, [[1, "g2", "4"]], *store) == 0
    assert "0 models restored, 12 to train" in capsys.readouterr().err
    monkeypatch.setattr(jagielski, "trainer_digest", lambda: "edited")
    assert _train_cli(tmp_path, TRAIN_SPEC, [[1, "g2", "4"]], *store) == 0
    assert "0 models restored, 12 to train" in capsys.readouterr().err
    assert _train_cli(tmp_path, TRAIN_SPEC, [[1, "g2", "4"]], *store) == 0
    assert "12 models restored, 0 to train" in capsys.readouterr().err
    # TF32 asked for: kept apart from fp32 blocks (the CPU has no TF32: recorded as fp32)
    tf32 = {**TRAIN_SPEC, "matmul_precision": "tf32"}
    assert _train_cli(tmp_path, tf32, [[1, "g2", "4"]], *store) == 0
    assert "0 models restored, 12 to train" in capsys.readouterr().err
    prov = read_table(tmp_path / "out" / "c1_g2_e4.csv")[1]
    assert prov["spec"]["matmul_precision"] == "tf32"
    assert prov["trainer"]["matmul_precision"] == "fp32"
    assert _train_cli(tmp_path, {**TRAIN_SPEC, "matmul_precision": "bf16"}, [[1, "g2", "4"]]) == 2
    assert "jagielski.matmul_precision='bf16': 'bf16' is not one of ['fp32', 'tf32']" in \
        capsys.readouterr().err


def test_cli_missing_cifar_is_one_clear_message(tmp_path, capsys):
    import json

    from dpaudit.cli import main

    data = {"root": str(tmp_path / "nothing"), "download": False, "cifar10_tarball": None,
            "cifar100_root": None}
    spec = {"clipbkd_norm": None, "pretrain_epochs": 1, "pretrain_images": 0}
    code = main(["jagielski-task", "--dataset", "cifar", "--data", json.dumps(data), "--spec",
                 json.dumps(spec), "--seed", "0", "--device", "cpu", "--out",
                 str(tmp_path / "task.npz")])
    err = capsys.readouterr().err
    assert code == 2 and "CIFAR-10 not found" in err and "Traceback" not in err
    assert str(tmp_path / "nothing") in err and not (tmp_path / "task.npz").exists()


def test_grid_groups_and_the_papers_models():
    """The paper's grids: 72 Figure 2 cells (2 data sets x 2 models x 6 eps x 3 attacks),
    72 Table 2 cells (3 clips x 4 inits x 6 eps), 6 in both, and the one-run comparison's
    12, all Figure 2's; one group (a training job) per data set, model and attack."""
    import copy
    from pathlib import Path

    import yaml

    cfg = yaml.safe_load((Path(__file__).parents[1] / "config" / "config.yaml").read_text())
    jag, one = cfg["jagielski"], cfg["onerun"]
    cells = jagielski.grid_cells(jag, one)
    assert [len(cells[k]) for k in ("fig2", "table2", "onerun", "all")] == [72, 72, 12, 138]
    assert set(cells["onerun"]) <= set(cells["fig2"])
    groups = jagielski.groups(cells["all"])
    assert len(groups) == 12 and len(groups[("fmnist", "fnn", "clipbkd")]) == 72
    assert len(groups[("cifar", "lr", "mi")]) == 6
    assert groups[("cifar", "lr", "mi")][0] == (1.0, "g1", "1")
    assert groups[("cifar", "lr", "mi")][-1] == (1.0, "g1", "inf")
    # sides: MI 2, backdoor and ClipBKD 1 + len(ks) = 5; 1000 trials each
    assert jagielski.grid_models(jag, one) == {"fig2": 6 * 4 * 12_000, "table2": 72 * 5_000,
                                               "all": 6 * 4 * 12_000 + 66 * 5_000}
    assert jagielski.cell_path("fmnist", "fnn", 0.5, 2.0, "8", "clipbkd") == \
        "results/jagielski/scores/fmnist_fnn_clipbkd/c0.5_g2_e8.csv"
    small = copy.deepcopy(jag)
    small["fig2"]["eps"], small["table2"]["eps"] = ["4"], ["8", "4"]
    # at the fixed init the one-run lr cells join the lr ClipBKD group
    fixed = {**one, "eps": ["8"], "init": "fixed"}
    trained = jagielski.grid_cells(small, fixed)["all"]
    assert len(trained) == 12 + 3 * 4 * 2 - 1 + 1 and len(set(trained)) == len(trained)
    assert ("fmnist", "lr", 1.0, "fixed", "8", "clipbkd") in trained
    jagielski.check_grid(small, fixed)
    with pytest.raises(ValueError, match=r"onerun\.eps: '3' is not a key"):
        jagielski.check_grid(small, {**fixed, "eps": ["3"]})
    del small["datasets"]["fmnist"]["noise"]["8"]
    with pytest.raises(ValueError, match=r"jagielski\.table2\.eps: '8' .*datasets\.fmnist"):
        jagielski.check_grid(small)
