"""The worst-case-initialisation black-box audit (Annamalai and De Cristofaro 2024) on a
tiny task, against the closed form of full-batch DP-SGD: with sample rate 1, ``steps``
steps of noise multiplier sigma are exactly ``sqrt(steps) / sigma``-GDP (add/remove)."""

import math

import numpy as np
import pytest
import torch

from dpaudit import bounds, dpsgd, seeds
from dpaudit.experiments.jagielski import make_task
from dpaudit.experiments.tight import blackbox as bb
from dpaudit.trials import Execution

CPU = Execution("cpu")
MODEL = dpsgd.ModelSpec("lr", 20)
#: Pre-training long enough that the tiny task's model is confident on its data.
PRETRAIN = {"epochs": 100, "lr": 1.0}
STEPS, LR, RUNS = 10, 0.01, 200


def _task(n=200, d=20, seed=0):
    """Two separated Gaussian classes: the first half pre-trains, the second is D0."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = (rng.normal(size=(n, d)) * 0.3 + y[:, None] * 0.5).astype(np.float32)
    return make_task(X, y, X[:50], y[:50], X[:16], np.ones(16, np.int64), X[:4],
                     np.ones(4, np.int64), clipbkd_norm=3.0)


TASK = _task()


@pytest.fixture(scope="module")
def audits():
    """The audit at three noise levels (sigma: rows)."""
    return {sigma: bb.audit(TASK, MODEL, bb.FullBatch(STEPS, LR, 1.0, sigma), RUNS, 0,
                            bb.Auditor(pretrain=PRETRAIN), execution=Execution("cpu", 100))
            for sigma in (1.0, 2.0, 4.0)}


def _row(rows, init, certified=True):
    (row,) = [r for r in rows if r["init"] == init and r["certified"] == certified]
    return row


def test_one_step_moves_the_canary_margin_by_the_clipped_gradient():
    """Closed form of one full-batch step from the worst-case init: D1 and D0 runs of the
    same seed share their noise, so the canary's logit margin differs by exactly the
    clipped canary gradient's push, sqrt(2) * lr * C (2 classes, blank input: only the
    biases move, along e_y - e_other)."""
    start = bb.worst_case_init(TASK, MODEL, 0, pretrain=PRETRAIN, device="cpu")
    x_c, y_c = bb.canary(TASK, MODEL, start, "blank")
    assert x_c.shape == (20,) and not x_c.any()
    z0 = dpsgd.logits(start, torch.as_tensor(x_c)[None], MODEL)[0, 0]
    assert y_c == int(z0.argmin())  # the least likely class: the larger gradient
    _, (X0, y0) = bb.split(TASK)
    X1, y1 = np.concatenate([X0, x_c[None]]), np.concatenate([y0, [y_c]])
    clip, lr = 0.5, 0.3
    setting = bb.FullBatch(1, lr, clip, 2.0)
    run_seeds = seeds.int_seeds(8, 5, "one-step")
    s0, s1 = (bb.train_scores(X, y, MODEL, setting, ("worst-case",), start, x_c, y_c,
                              run_seeds, 8, "cpu")["worst-case"] for X, y in ((X0, y0),
                                                                              (X1, y1)))
    margin = [-np.log(np.expm1(-s)) for s in (s0, s1)]  # loss = log(1 + e^-margin)
    np.testing.assert_allclose(margin[1] - margin[0], math.sqrt(2) * lr * clip, rtol=1e-3)
    assert np.ptp(margin[0]) > 1  # the noise moves it far more than the canary


def test_certified_bounds_never_exceed_the_theory(audits):
    """Soundness: every certified eps_lb below eps_th (the tight PLD eps, below eps_rdp), every
    mu_lb below the exact sqrt(steps) / sigma; the audit is no vacuous one."""
    for sigma, rows in audits.items():
        for row in rows:
            assert row["relation"] == "add/remove" and row["threat_model"] == "black-box"
            assert row["eps_th"] <= row["eps_rdp"]
            assert row["runs"] == RUNS
            if row["certified"]:
                assert row["eps_lb"] <= row["eps_th"], (sigma, row)
            assert row["mu_lb"] <= math.sqrt(STEPS) / sigma, (sigma, row)
        ref = bounds.eps_from_mu(math.sqrt(STEPS) / sigma, 1e-5)
        assert abs(rows[0]["eps_th"] - ref) < 0.05 * ref  # PLD is tight at rate 1
    strong = _row(audits[1.0], "worst-case")
    assert strong["eps_lb"] > 1.5 and strong["mu_lb"] > 1.5
    # weaker noise certifies more
    lbs = [_row(audits[s], "worst-case")["eps_lb"] for s in (1.0, 2.0, 4.0)]
    assert lbs[0] > lbs[1] >= lbs[2]


def test_gdp_rows_are_estimates(audits):
    rows = audits[1.0]
    for init in bb.INITS:
        cert, est = _row(rows, init), _row(rows, init, certified=False)
        assert est["method"] == cert["method"] + "-gdp"
        assert est["eps_lb"] == est["eps_lb_gdp"] == bounds.eps_gdp_estimate(est["mu_lb"], 1e-5)


def test_worst_case_init_audits_more_than_glorot(audits):
    """The paper's point: from the auditor's pre-trained parameters the canary's gradient
    is not drowned by the data's, from a random init it is."""
    worst, glorot = _row(audits[1.0], "worst-case"), _row(audits[1.0], "glorot")
    assert worst["auc"] > 0.95 and glorot["auc"] < 0.85
    assert worst["mu_lb"] > glorot["mu_lb"] + 1.0
    assert worst["eps_lb"] > glorot["eps_lb"] + 1.5


def test_audit_is_deterministic():
    setting = bb.FullBatch(3, LR, 1.0, 1.0)
    kw = dict(auditor=bb.Auditor(pretrain={"epochs": 3}), execution=Execution("cpu", 4))
    drop = ("models_per_s", "pretrain_s")
    a, b = ([{k: v for k, v in r.items() if k not in drop}
             for r in bb.audit(TASK, MODEL, setting, 8, 3, **kw)] for _ in range(2))
    assert a == b
    # the scores: a function of the seeds alone, whatever is trained beside them
    start = bb.worst_case_init(TASK, MODEL, 3, pretrain={"epochs": 3}, device="cpu")
    x_c, y_c = bb.canary(TASK, MODEL, start)
    _, (X0, y0) = bb.split(TASK)

    def scores(run_seeds, per_call):
        return bb.train_scores(X0, y0, MODEL, setting, bb.INITS, start, x_c, y_c, run_seeds,
                               per_call, "cpu")

    s1, s2, s3 = scores([1, 2, 3, 4], 4), scores([1, 2, 3, 4], 3), scores([5, 6, 7, 8], 4)
    for init in bb.INITS:
        np.testing.assert_allclose(s1[init], s2[init], rtol=1e-6)
        assert np.abs(s1[init] - s3[init]).min() > 1e-4
        assert len(np.unique(s1[init])) == 4


def test_kept_runs_are_restored_and_a_changed_init_retrains(tmp_path, monkeypatch, capsys):
    setting = bb.FullBatch(3, LR, 1.0, 1.0)
    kw = dict(auditor=bb.Auditor(pretrain={"epochs": 3}))
    drop = ("models_per_s", "pretrain_s")

    def rows(**more):
        return [{k: v for k, v in r.items() if k not in drop}
                for r in bb.audit(TASK, MODEL, setting, 8, 3, **kw,
                                  execution=Execution("cpu", 4, **more))]

    fresh = rows()
    real, calls = bb.train_scores, []

    def counted(*a):
        calls.append(len(a[8]))
        return real(*a)

    monkeypatch.setattr(bb, "train_scores", counted)
    assert rows(store=tmp_path) == fresh and calls == [4] * 4  # two calls a side, kept
    calls.clear()
    got = bb.audit(TASK, MODEL, setting, 8, 3, **kw,
                   execution=Execution("cpu", 4, log=print, store=tmp_path))
    assert [{k: v for k, v in r.items() if k not in drop} for r in got] == fresh
    assert calls == [] and math.isnan(got[0]["models_per_s"])
    assert "16 models restored, 0 to train" in capsys.readouterr().out
    # Another worst-case init (longer pre-training): another key, nothing reused.
    kw["auditor"] = bb.Auditor(pretrain={"epochs": 4})
    rows(store=tmp_path)
    assert calls == [4] * 4


def test_bad_arguments_are_named():
    setting = bb.FullBatch(3, LR, 1.0, 1.0)
    with pytest.raises(ValueError, match="inits="):
        bb.Auditor(inits=("fixed",))
    with pytest.raises(ValueError, match="runs="):
        bb.audit(TASK, MODEL, setting, 2, 0, execution=CPU)
    with pytest.raises(ValueError, match="n="):
        bb.audit(TASK, MODEL, setting, 8, 0, bb.Auditor(n=150), execution=CPU)
    with pytest.raises(ValueError, match="canary kind="):
        bb.Auditor(canary="white")
    with pytest.raises(ValueError, match="auditor: must be an Auditor, not dict"):
        bb.audit(TASK, MODEL, setting, 8, 0, {"canary": "blank"}, execution=CPU)
    with pytest.raises(ValueError, match="pretrain: unknown keys"):
        bb.worst_case_init(TASK, MODEL, 0, pretrain={"epoch": 3}, device="cpu")
    with pytest.raises(ValueError, match="FullBatch.steps"):
        bb.FullBatch(0, LR, 1.0, 1.0)
    with pytest.raises(ValueError, match="FullBatch.noise_multiplier"):
        bb.FullBatch(3, LR, 1.0, -1.0)
