"""The tight audits in the pipeline: the black-box CLI, ``tight-table`` (its columns, the
estimates and theory rows it labels as such, the last-iterate heuristic against the
Gaussian mechanism in closed form), ``tight-plot``'s legend, and the ``tight`` config."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import optimize, stats

from dpaudit.cli import main
from dpaudit.cli.tight import TABLE_COLUMNS, assemble
from dpaudit.io import read_table

ROOT = Path(__file__).parents[1]
DELTA = 1e-5
WHITEBOX = {"runs": 6, "archs": ["lr"], "eps": ["2", "inf"], "alpha": 0.05, "delta": DELTA,
            "select_frac": 0.5}
TRAIN = {"epochs": 1, "batch_size": 10, "lr": 0.5, "hidden": 4, "noise": {"2": 2.0,
                                                                          "inf": 0.0},
         "clip": 1.0}
BLACKBOX = {"runs": 6, "archs": ["lr"], "eps": ["2", "inf"], "alpha": 0.05, "delta": DELTA,
            "hidden": 4, "n_aux": 20, "n": 16, "steps": 3, "lr": 0.01, "clip": 1.0,
            "canary": "blank", "inits": ["worst-case", "glorot"]}


def _task(path: Path) -> Path:
    """A 40-row, 8-feature two-class Jagielski task file."""
    from dpaudit import features
    from dpaudit.experiments.jagielski import make_task

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 40)
    X = (rng.normal(size=(40, 8)) * 0.3 + y[:, None] * 0.5).astype(np.float32)
    task = make_task(X, y, X[:8], y[:8], X[:4], np.ones(4, np.int64), X[:2],
                     np.ones(2, np.int64), clipbkd_norm=5.0)
    features.save_features(path, task.arrays(), {"command": "test"})
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Both audits, the table and the figure through the CLI, as the rules call them."""
    d = tmp_path_factory.mktemp("tight")
    task = _task(d / "task.npz")
    common = ["--task", str(task), "--seed", "2", "--device", "cpu"]
    assert main(["tight-whitebox-audit", *common, "--spec", json.dumps(WHITEBOX),
                 "--train", json.dumps(TRAIN), "--out", str(d / "wb.csv")]) == 0
    assert main(["tight-blackbox-audit", *common, "--spec", json.dumps(BLACKBOX),
                 "--out", str(d / "bb.csv")]) == 0
    assert main(["tight-table", "--whitebox", str(d / "wb.csv"), "--blackbox",
                 str(d / "bb.csv"), "--out", str(d / "tight_audit.csv")]) == 0
    assert main(["tight-plot", "--table", str(d / "tight_audit.csv"), "--out",
                 str(d / "tight_audit.pdf")]) == 0
    return d


def test_cli_end_to_end_rows_columns_and_labels(run):
    df, meta = read_table(run / "tight_audit.csv")
    assert list(df.columns) == list(TABLE_COLUMNS)
    assert meta["command"] == "tight-table" and meta["blackbox_table"]["spec"] == BLACKBOX
    assert (run / "tight_audit.pdf").stat().st_size and (run / "tight_audit.png").exists()
    assert (df.relation == "add/remove").all()
    methods = set(df.method)
    assert methods == {"whitebox-llr", "whitebox-llr-gdp", "whitebox-dot-sum",
                       "whitebox-dot-sum-gdp", "blackbox-worst-case-init",
                       "blackbox-worst-case-init-gdp", "blackbox-glorot-init",
                       "blackbox-glorot-init-gdp", "last-iterate-heuristic"}
    # Only the Clopper-Pearson rows claim a bound; estimates and theory never do.
    assert (df.certified == ~(df.method.str.endswith("-gdp")
                              | (df.method == "last-iterate-heuristic"))).all()
    theory = df[df.kind == "theory"]
    assert set(theory.method) == {"last-iterate-heuristic"} and (theory.runs == 0).all()
    assert len(theory) == 4  # (poisson, full-batch) x eps labels 2 and inf, one model
    assert (df[df.kind == "measurement"].runs == 6).all()
    cert = df[df.certified]
    assert (cert.eps_lb <= cert.eps_th).all()
    # The black box calibrates its noise so that eps_th (PLD, sample rate 1) is the label.
    bb = df[(df.setting == "full-batch") & (df.eps_label == 2)]
    assert np.allclose(bb.eps_th, 2.0, atol=0.01) and (bb.q == 1.0).all()
    wb = df[(df.setting == "poisson") & (df.eps_label == 2)]
    assert (wb.noise == 2.0).all() and np.allclose(wb.q, 10 / 40)
    assert np.isinf(df[df.eps_label == np.inf].eps_th).all()


def _gaussian_eps(mu: float, delta: float) -> float:
    """eps at ``delta`` of the mu-GDP Gaussian mechanism (Balle and Wang 2018, Theorem 8),
    by root finding on its exact delta(eps)."""
    def gap(eps):
        return (stats.norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta)
    return optimize.brentq(gap, 0.0, 50.0, xtol=1e-12)


def test_last_iterate_row_at_full_batch_is_the_gaussian_mechanism(run):
    """At sample rate 1 the last iterate of T linear steps of noise sigma is the Gaussian
    mechanism with mu = sqrt(T) / sigma: the heuristic row must be its eps."""
    bb, _ = read_table(run / "bb.csv")
    bb = bb.assign(noise_multiplier=2.0, steps=4)  # mu = 1
    df = assemble(None, bb)
    li = df[df.method == "last-iterate-heuristic"]
    assert len(li) == 2 and (li.kind == "theory").all() and not li.certified.any()
    assert li.eps_lb.iloc[0] == pytest.approx(_gaussian_eps(1.0, DELTA), abs=1e-6)


def test_whitebox_gdp_estimates_get_rows_of_their_own(run):
    wb, _ = read_table(run / "wb.csv")
    df = assemble(wb, None)
    for method in ("whitebox-llr", "whitebox-dot-sum"):
        got = df[(df.method == method + "-gdp") & (df.eps_label == "2")].iloc[0]
        src = wb[(wb.method == method) & (wb.eps_label == 2)].iloc[0]
        assert got.eps_lb == src.eps_lb_gdp and not got.certified
        assert got.eps_lb_ratio == pytest.approx(src.eps_lb_gdp / src.eps_th)
    assert set(df.setting) == {"poisson"}


def test_table_without_audits_is_refused(tmp_path, capsys):
    assert main(["tight-table", "--out", str(tmp_path / "x.csv")]) == 2
    assert "--whitebox, --blackbox" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("change, match", [
    ({"bogus": 1}, r"--spec.bogus: unknown key"), ({"eps": ["two"]}, r"--spec.eps="),
    ({"archs": ["cnn"]}, "--spec.archs="), ({"runs": 2}, "runs=2"),
    ({"n": 30}, "n=30"), ({"canary": "dirac"}, "canary kind='dirac'")])
def test_blackbox_cli_names_the_bad_key(tmp_path, capsys, change, match):
    import re

    out = tmp_path / "bb.csv"
    assert main(["tight-blackbox-audit", "--task", str(_task(tmp_path / "t.npz")), "--spec",
                 json.dumps({**BLACKBOX, **change}), "--seed", "0", "--device", "cpu",
                 "--out", str(out)]) == 2
    assert re.search(match, capsys.readouterr().err)
    assert not out.exists()


def test_figure_legend_names_only_drawn_lines_certified_solid_estimates_dashed(run,
                                                                                monkeypatch):
    from dpaudit.plots import tight

    from test_figures import _assert_legend_is_drawn, _legend_labels

    figures = []
    monkeypatch.setattr(tight, "save", lambda fig, out: figures.append(fig))
    tight.plot_tight(run / "tight_audit.csv", run / "unused.pdf")
    fig = figures[0]
    _assert_legend_is_drawn(fig)
    labels = _legend_labels(fig)
    assert any("last-iterate heuristic" in lab for lab in labels)
    assert any(lab.startswith("eps_th") for lab in labels)
    lines = [ln for ax in fig.axes for ln in ax.get_lines()]
    for line in lines:
        label = line.get_label()
        if label.endswith("certified bound"):
            assert line.get_linestyle() == "-"
        if "GDP estimate" in label:
            assert line.get_linestyle() == "--"
    # 2 set-ups x 1 model; the cells without noise are not drawn (no ratio).
    assert len([ax for ax in fig.axes if ax.get_visible() and ax.get_lines()]) == 2
    assert all(np.isfinite(ln.get_xdata()).all() for ln in lines if len(ln.get_xdata()) > 2)


@pytest.mark.parametrize("fault", ["missing", "foreign"])
@pytest.mark.parametrize("command", ["tight-blackbox-audit", "tight-table", "tight-plot"])
def test_a_bad_input_file_is_named_and_nothing_is_written(run, tmp_path, capsys, command,
                                                         fault):
    """A missing file, or a file of another step (a result table where the task belongs,
    a task where a table belongs), stops with exit 2 naming it."""
    bad = tmp_path / "bad"
    if fault == "foreign":
        bad.write_bytes((run / ("wb.csv" if command == "tight-blackbox-audit"
                                else "task.npz")).read_bytes())
    out = tmp_path / "out.csv"
    argv = {"tight-blackbox-audit": ["--task", str(bad), "--spec", json.dumps(BLACKBOX),
                                     "--seed", "0", "--device", "cpu"],
            "tight-table": ["--whitebox", str(bad)], "tight-plot": ["--table", str(bad)]}
    assert main([command, *argv[command], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
    assert not out.exists()


def _config(name="config.yaml") -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())


def test_config_noise_of_eps_10_is_the_noise_tables_accountant():
    """The FMNIST noise table is calibrated by rdp_classic at q = 250 / 6000 over 24 epochs:
    eps 8 gives its 1.01, and eps 10 gives tight.noise's value."""
    from dpaudit import accounting

    cfg = _config()
    fmnist = cfg["jagielski"]["datasets"]["fmnist"]
    q, steps = fmnist["batch_size"] / 6000, fmnist["epochs"] * 6000 // fmnist["batch_size"]
    for label, noise in (("8", fmnist["noise"]["8"]), ("10", cfg["tight"]["noise"]["10"])):
        assert accounting.noise_multiplier(float(label), q, steps, DELTA, "rdp_classic") \
            == pytest.approx(noise, abs=0.006)
    assert cfg["tight"]["eps"] == ["1", "2", "4", "8", "10"] and cfg["tight"]["runs"] == 1000


def test_startup_check_names_tight_keys():
    from dpaudit.experiments.checks import problems

    cfg = _config()
    assert not [p for p in problems(cfg) if p.startswith("tight")]
    cfg["tight"]["eps"] = ["10", "12"]
    cfg["tight"]["blackbox"]["n"] = 4000
    found = [p for p in problems(cfg) if p.startswith("tight")]
    assert len(found) == 2
    assert "'12' has no noise multiplier" in found[0]
    assert "tight.blackbox.n_aux + tight.blackbox.n = 7000" in found[1]
