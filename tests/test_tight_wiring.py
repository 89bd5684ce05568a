"""The tight audits in the pipeline: the black-box CLI, ``tight-table`` (its columns, the
estimates and theory rows it labels as such, the last-iterate heuristic against the
Gaussian mechanism in closed form, the ClipBKD and one-run rows it joins from a Figure 2
and a one-run table, each with the eps_th of its own relation), ``tight-plot``'s legend,
and the ``tight`` config."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import optimize, stats

from dpaudit.cli import main
from dpaudit.cli.tight import TABLE_COLUMNS, assemble
from dpaudit.io import read_table, write_table

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
# The one-run audit of the same task: Dirac canaries only, eps label 2 (so the tight cell
# at inf has no one-run row).
ONERUN = {"m": 8, "repeats": 2, "archs": ["lr"], "eps": ["2"], "canaries": ["dirac"],
          "input_kind": "pca", "init": 1.0, "max_k": 500, "beta": 0.05, "delta": DELTA}


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


def _fig2(path: Path) -> Path:
    """The paper-scale Figure 2 table's rows at eps labels 2 and 16 (both data sets, models
    and attacks; 1000 models per side), written as jagielski-audit writes them."""
    df, meta = read_table(ROOT / "reference/jagielski_fig2.csv")
    write_table(df[df.eps_label.isin([2.0, 16.0])], path, meta)
    return path


#: Each tight audit: its table's name and its arguments besides the common ones.
AUDITS = {"tight-whitebox-audit": ("wb", ["--spec", json.dumps(WHITEBOX),
                                          "--train", json.dumps(TRAIN)]),
          "tight-blackbox-audit": ("bb", ["--spec", json.dumps(BLACKBOX)])}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Both audits, a one-run audit, the table (with a Figure 2 table's ClipBKD rows) and
    the figure through the CLI, as the rules call them."""
    d = tmp_path_factory.mktemp("tight")
    task = _task(d / "task.npz")
    common = ["--task", str(task), "--seed", "2", "--device", "cpu"]
    for command, (name, args) in AUDITS.items():
        assert main([command, *common, *args, "--out", str(d / f"{name}.csv"),
                     "--store", str(d / "trained" / name)]) == 0
    assert main(["onerun-audit", *common, "--spec", json.dumps(ONERUN), "--train",
                 json.dumps(TRAIN), "--out", str(d / "onerun.csv")]) == 0
    assert main(["tight-table", "--whitebox", str(d / "wb.csv"), "--blackbox",
                 str(d / "bb.csv"), "--clipbkd", str(_fig2(d / "fig2.csv")), "--onerun",
                 str(d / "onerun.csv"), "--out", str(d / "tight_audit.csv")]) == 0
    assert main(["tight-plot", "--table", str(d / "tight_audit.csv"), "--out",
                 str(d / "tight_audit.pdf")]) == 0
    return d


def test_cli_end_to_end_rows_columns_and_labels(run):
    df, meta = read_table(run / "tight_audit.csv")
    assert list(df.columns) == list(TABLE_COLUMNS)
    assert meta["command"] == "tight-table" and meta["blackbox_table"]["spec"] == BLACKBOX
    assert meta["onerun_table"]["spec"] == ONERUN
    assert meta["clipbkd_table"]["command"] == "jagielski-audit"
    assert (run / "tight_audit.pdf").stat().st_size and (run / "tight_audit.png").exists()
    clipbkd = df.method.str.startswith("blackbox-clipbkd")
    assert (df[clipbkd].relation == "replace-one").all()
    assert (df[~clipbkd].relation == "add/remove").all()
    methods = set(df.method)
    assert methods == {"whitebox-llr", "whitebox-llr-gdp", "whitebox-dot-sum",
                       "whitebox-dot-sum-gdp", "blackbox-worst-case-init",
                       "blackbox-worst-case-init-gdp", "blackbox-glorot-init",
                       "blackbox-glorot-init-gdp", "last-iterate-heuristic",
                       "blackbox-clipbkd", "blackbox-clipbkd-gdp", "onerun-whitebox-llr",
                       "onerun-whitebox-llr-gdp", "onerun-whitebox-dot-sum",
                       "onerun-whitebox-dot-sum-gdp"}
    # Only the Clopper-Pearson rows claim a bound; estimates and theory never do.
    assert (df.certified == ~(df.method.str.endswith("-gdp")
                              | (df.method == "last-iterate-heuristic"))).all()
    theory = df[df.kind == "theory"]
    assert set(theory.method) == {"last-iterate-heuristic"} and (theory.runs == 0).all()
    assert len(theory) == 4  # (poisson, full-batch) x eps labels 2 and inf, one model
    tight = df[df.method.str.startswith(("whitebox", "blackbox-worst", "blackbox-glorot"))]
    assert (tight.runs == 6).all()
    assert (df[clipbkd].runs == 1000).all()
    assert (df[df.method.str.startswith("onerun")].runs == 1).all()
    # only the tight cells' rows join: LR at eps label 2 (neither table has inf; the
    # Figure 2 table's 2-layer net and eps 16 are no tight cell)
    joined = df[clipbkd | df.method.str.startswith("onerun")]
    assert len(joined) == 6 and set(joined.arch) == {"lr"} and set(joined.eps_label) == {2}
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


def test_a_rerun_restores_every_kept_run_and_writes_the_same_rows(run, tmp_path, capsys):
    capsys.readouterr()
    for command, (name, args) in AUDITS.items():
        assert main([command, "--task", str(run / "task.npz"), "--seed", "2", "--device",
                     "cpu", *args, "--out", str(tmp_path / f"{name}.csv"), "--store",
                     str(run / "trained" / name)]) == 0
        assert sorted(p.name for p in (run / "trained" / name).iterdir()) == \
            ["lr_eps2", "lr_epsinf"]  # one folder per cell
        err = capsys.readouterr().err
        assert err.count(" models restored, 0 to train") == 2, err
        again, first = (read_table(d / f"{name}.csv")[0] for d in (tmp_path, run))
        speed = [c for c in ("models_per_s", "pretrain_s") if c in first]
        pd.testing.assert_frame_equal(again.drop(columns=speed), first.drop(columns=speed))
        if speed:  # nothing was trained, so no training speed
            assert again.models_per_s.isna().all() and (first.models_per_s > 0).all()


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


def test_clipbkd_rows_carry_the_replace_one_eps_of_their_cell(run):
    """A Figure 2 cell's row: its certified bound, the PLD eps of replace-one neighbours as
    eps_th (D0 and D1 differ in k replaced rows; the bound is per row by group privacy),
    its rdp_classic eps (add/remove) beside it, and its GDP estimate as a row of its own."""
    from dpaudit import accounting

    df, _ = read_table(run / "tight_audit.csv")
    fig2, _ = read_table(run / "fig2.csv")
    src = fig2[(fig2.dataset == "fmnist") & (fig2.arch == "lr") & (fig2.attack == "clipbkd")
               & (fig2.eps_label == 2)].iloc[0]
    got = df[df.method == "blackbox-clipbkd"].iloc[0]
    assert (got.eps_th, got.eps_rdp, got.eps_lb, got.mu_lb, got.tpr, got.fpr, got.auc) == (
        src.eps_pld_replace, src.eps_th, src.eps_lb, src.mu_lb, src.tpr, src.fpr, src.auc)
    assert (got.eps_th, got.eps_rdp, got.eps_lb) == (3.1259845625941316, 2.0036755499200476,
                                                     0.14929718439931355)
    # the accountant, independently: noise 2.68, q = 250 / 6000, 24 epochs
    assert got.eps_th == pytest.approx(
        accounting.epsilon_replace_one(2.68, 250 / 6000, 576, DELTA), rel=1e-9)
    assert (got.threat_model, got.setting, got.kind, got.certified, got.alpha) == (
        "black-box", "shuffle; Glorot x 1", "measurement", True, 0.01)
    assert (got.runs, got.noise, got.q, got.steps, got.n) == (1000, 2.68, 250 / 6000, 576,
                                                              6000)
    assert got.eps_lb_ratio == got.eps_lb / got.eps_th
    gdp = df[df.method == "blackbox-clipbkd-gdp"].iloc[0]
    assert gdp.eps_lb == src.eps_lb_gdp == 0.41671175144896566 and not gdp.certified


def test_onerun_rows_are_the_first_run_with_the_add_remove_eps(run):
    """A one-run cell's rows: the first run's f-DP bound under each threat model, the PLD
    eps of add/remove neighbours (each canary is added or not) as eps_th, one run."""
    from dpaudit import accounting

    df, _ = read_table(run / "tight_audit.csv")
    one, _ = read_table(run / "onerun.csv")
    for threat, method in (("all-iterates", "onerun-whitebox-llr"),
                           ("last-iterate", "onerun-whitebox-dot-sum")):
        src = one[(one.threat_model == threat) & (one.repeat == 0)].iloc[0]
        got = df[df.method == method].iloc[0]
        assert (got.eps_th, got.eps_rdp, got.eps_lb, got.mu_lb) == (
            src.eps_pld, src.eps_th, src.eps_lb_fdp, src.mu_lb)
        assert (got.threat_model, got.relation, got.runs, got.alpha, got.certified) == (
            threat, "add/remove", 1, 0.05, True)
        assert got.setting == "poisson; 1 run, 8 canaries; Glorot x 1"
        gdp = df[df.method == method + "-gdp"].iloc[0]
        assert gdp.eps_lb == src.eps_gdp and not gdp.certified
    # noise 2 over 4 Poisson steps at q = 10 / 40: the same training as the tight white
    # box's cell, so the same eps_th
    assert got.eps_th == pytest.approx(accounting.epsilon(2.0, 0.25, 4, DELTA, "pld"),
                                       rel=1e-9)
    wb = df[(df.method == "whitebox-llr") & (df.eps_label == 2)].iloc[0]
    assert got.eps_th == wb.eps_th


def test_absent_cells_are_skipped_with_a_log_line_and_the_white_box_init_is_taken(run):
    wb, _ = read_table(run / "wb.csv")
    fig2, meta = read_table(run / "fig2.csv")
    one, one_meta = read_table(run / "onerun.csv")
    said = []
    df = assemble(wb, None, clipbkd=(fig2, meta, "f.csv"), onerun=(one, one_meta, "o.csv"),
                  log=said.append)
    assert said == ["no FMNIST ClipBKD (Figure 2) cell for lr eps inf: no row",
                    "no one-run white-box cell for lr eps inf: no row"]
    assert len(df[df.method == "blackbox-clipbkd"]) == 1
    # beside cells at a fixed init, the Glorot x 1 cells of the tight white box are taken
    fixed = fig2.assign(init="fixed", eps_lb=9.0)
    both = assemble(wb, None, clipbkd=(pd.concat([fixed, fig2]), meta, "f.csv"))
    assert both[both.method == "blackbox-clipbkd"].eps_lb.tolist() == [0.14929718439931355]
    # a fixed init alone is taken, and the setting says so
    alone = assemble(wb, None, clipbkd=(fixed, meta, "f.csv"))
    row = alone[alone.method == "blackbox-clipbkd"].iloc[0]
    assert (row.eps_lb, row.setting) == (9.0, "shuffle; fixed init")


@pytest.mark.parametrize("fault, match", [
    ("altered", "do not match the content hash"), ("unhashed", "no content hash recorded"),
    ("foreign", "not a table of jagielski-audit --experiment fig2: it lacks column"),
    ("two-inits", r"at the inits \['fixed', 'g2'\], none the tight white box's"),
    ("no-sampling", "its provenance lacks spec.sampling")])
def test_a_damaged_or_foreign_figure2_table_is_named(run, tmp_path, capsys, fault, match):
    import re

    bad = tmp_path / "fig2.csv"
    head, body = (run / "fig2.csv").read_text().split("\n", 1)
    meta = json.loads(head.split(": ", 1)[1])
    fig2, _ = read_table(run / "fig2.csv")
    if fault == "altered":
        bad.write_text(head + "\n" + body.replace("0.14929718439931355", "0.14929718439931356"))
    elif fault == "unhashed":
        meta.pop("body_sha256")
        bad.write_text("# dpaudit-provenance: " + json.dumps(meta) + "\n" + body)
    elif fault == "foreign":
        bad.write_bytes((run / "wb.csv").read_bytes())
    elif fault == "two-inits":
        write_table(pd.concat([fig2.assign(init="fixed"), fig2.assign(init="g2")]), bad, meta)
    else:
        write_table(fig2, bad, {**meta, "spec": {k: v for k, v in meta["spec"].items()
                                                 if k != "sampling"}})
    out = tmp_path / "out.csv"
    assert main(["tight-table", "--whitebox", str(run / "wb.csv"), "--clipbkd", str(bad),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and re.search(match, err) and "Traceback" not in err
    assert not out.exists()


def test_table_without_audits_is_refused(tmp_path, capsys):
    assert main(["tight-table", "--out", str(tmp_path / "x.csv")]) == 2
    assert "--whitebox, --blackbox" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("change, match", [
    ({"bogus": 1}, r"tight.bogus: unknown key"), ({"eps": ["two"]}, r"tight.eps="),
    ({"archs": ["cnn"]}, r"tight.archs\[0\]='cnn'"), ({"runs": 2}, "runs=2"),
    ({"n": 30}, "n=30"), ({"canary": "dirac"}, "tight.canary='dirac'")])
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
    assert sum("last-iterate heuristic" in lab for lab in labels) == 2  # both set-ups
    assert any(lab.startswith("eps_th") for lab in labels)
    lines = [ln for ax in fig.axes for ln in ax.get_lines()]
    for line in lines:
        label = line.get_label()
        if "certified at" in label:
            assert line.get_linestyle() == "-"
        if "GDP estimate" in label:
            assert line.get_linestyle() == "--" and line.get_markerfacecolor() == "none"
    # the joined audits with markers of their own, each certified at its own level
    markers = {m: {ln.get_marker() for ln in lines if ln.get_label().startswith(name + ",")}
               for m, (name, _, _) in tight.METHODS.items()}
    assert markers["blackbox-clipbkd"] == {"^"} and markers["onerun-whitebox-llr"] == {"v"}
    assert not {"^", "v"} & (markers["whitebox-llr"] | markers["blackbox-worst-case-init"])
    assert any("ClipBKD" in lab and "1000 runs per side: certified at 99%" in lab
               for lab in labels)
    assert any("all iterates (Steinke et al. 2023), 1 run: certified at 95%" in lab
               for lab in labels)
    # one panel per model; the cells without noise are not drawn (no ratio)
    assert len([ax for ax in fig.axes if ax.get_visible() and ax.get_lines()]) == 1
    assert all(np.isfinite(ln.get_xdata()).all() for ln in lines if len(ln.get_xdata()) > 2)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["2"]


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
    out = tmp_path / ("out.pdf" if command == "tight-plot" else "out.csv")
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


def test_the_reference_tight_tables_are_the_full_config_and_draw_without_training(tmp_path):
    """reference/tight_{whitebox,blackbox}.csv: the full config's tight section (every arch
    x eps label, 1000 runs per side, the set-ups the rules pass) measured on 2 CPU cores;
    `tight_reference` joins them with the paper-scale Figure 2's ClipBKD rows and draws
    them, training nothing. No certified bound above its eps_th, and every cell of
    docs/tight.md's table of them is the kept tables'."""
    import re

    from test_workflow import snakemake

    ref = ROOT / "reference"
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    tight, fmnist = config["tight"], config["jagielski"]["datasets"]["fmnist"]
    noise = {**tight["noise"], **fmnist["noise"]}
    cells = {(a, float(e)) for a in tight["archs"] for e in tight["eps"]}
    wb, wb_meta = read_table(ref / "tight_whitebox.csv")
    bb, bb_meta = read_table(ref / "tight_blackbox.csv")
    assert wb_meta["train"] == {  # as rule tight_whitebox builds it
        **{k: fmnist[k] for k in ("epochs", "batch_size", "lr", "hidden")},
        "noise": {e: noise[e] for e in tight["eps"]}, "clip": config["jagielski"]["fig2"]["clip"]}
    assert bb_meta["spec"] == {  # as rule tight_blackbox builds it
        **{k: tight[k] for k in ("runs", "archs", "eps", "alpha", "delta")},
        **tight["blackbox"], "hidden": fmnist["hidden"]}
    assert [p["spec"]["archs"] for p in wb_meta["joined_from"]] == [["lr"]] * 2 + [["fnn"]] * 2
    for table, meta, methods in ((wb, wb_meta, 2), (bb, bb_meta, 4)):
        assert meta["seed"] == 0 and meta["spec"]["runs"] == tight["runs"] == 1000
        assert set(zip(table.arch, table.eps_label.astype(float))) == cells
        assert len(table) == methods * len(cells) and (table.runs == 1000).all()
    out = snakemake("-n", "--directory", str(tmp_path), "tight_reference")
    assert out.returncode == 0, out.stderr
    assert set(re.findall(r"^(?:local)?rule (\w+):", out.stdout, re.M)) == {
        "tight_reference_table", "tight_reference_plot", "tight_reference"}
    assert main(["tight-table", "--whitebox", str(ref / "tight_whitebox.csv"), "--blackbox",
                 str(ref / "tight_blackbox.csv"), "--clipbkd", str(ref / "jagielski_fig2.csv"),
                 "--out", str(tmp_path / "tight_audit.csv")]) == 0
    assert main(["tight-plot", "--table", str(tmp_path / "tight_audit.csv"), "--out",
                 str(tmp_path / "tight_audit.pdf")]) == 0
    assert (tmp_path / "tight_audit.png").stat().st_size > 0
    df, _ = read_table(tmp_path / "tight_audit.csv")
    certified = df[(df.kind == "measurement") & df.certified]
    assert (certified.eps_lb <= certified.eps_th).all()
    assert set(certified.method) == {"whitebox-llr", "whitebox-dot-sum", "blackbox-clipbkd",
                                     "blackbox-worst-case-init", "blackbox-glorot-init"}

    def row(arch, label, method):
        (got,) = df[(df.arch == arch) & (df.eps_label.astype(float) == label)
                    & (df.method == method)].itertuples()
        return got

    def cell(arch, label, method):  # "certified (GDP estimate; AUC)"
        c, g = row(arch, label, method), row(arch, label, method + "-gdp")
        return f"{c.eps_lb:.2f} ({g.eps_lb:.2f}; {c.auc:.2f})"

    docs = (ROOT / "docs/tight.md").read_text()
    section = docs[docs.index("## Results at the full config's settings"):]
    section = section[:section.index("\n## ")]
    rows = re.findall(r"^\| (LR|FNN) \| (\d+) \| (.*) \|$", section, re.M)
    assert len(rows) == len(cells)
    for arch, label, rest in rows:
        arch, label = arch.lower(), float(label)
        wb_th = row(arch, label, "whitebox-llr").eps_th
        heuristic = df[(df.arch == arch) & (df.eps_label.astype(float) == label)
                       & (df.method == "last-iterate-heuristic") & (df.setting == "poisson")]
        assert rest.split(" | ") == [
            f"{label:.2f}", cell(arch, label, "blackbox-worst-case-init"),
            cell(arch, label, "blackbox-glorot-init"), f"{wb_th:.2f}",
            cell(arch, label, "whitebox-llr"), cell(arch, label, "whitebox-dot-sum"),
            f"{heuristic.eps_lb.item():.2f}"], (arch, label)


def test_docs_tight_sentences_say_what_the_reference_tables_show():
    """docs/tight.md's sentences on the full table, against the kept tables: the black
    box's ideal AUC Phi(mu / sqrt 2) and the measured ones, the largest certified share of
    eps_th (measured, the ideal tests' means and draws from the page's own ideal table), the
    19 of 20 rows inside the ideal ranges, Clopper-Pearson's cap at 500 evaluation runs per
    side, and the eps of mu = 2."""
    import re

    from dpaudit.bounds import eps_from_mu, eps_lb_clopper_pearson

    docs = " ".join((ROOT / "docs/tight.md").read_text().split())
    wb, _ = read_table(ROOT / "reference/tight_whitebox.csv")
    bb, _ = read_table(ROOT / "reference/tight_blackbox.csv")
    labels = [1, 2, 4, 8, 10]

    def mu_of(eps):
        return optimize.brentq(lambda m: eps_from_mu(m, DELTA) - eps, 1e-6, 20)

    def listed(values):
        *head, last = [f"{v:.2f}" for v in values]
        return ", ".join(head) + " and " + last

    ideal_auc = [stats.norm.cdf(mu_of(e) / math.sqrt(2)) for e in labels]
    assert f"Phi(mu / sqrt 2): {listed(ideal_auc)} at labels 1 to 10" in docs
    worst = bb[bb.method == "blackbox-worst-case-init"].set_index(["arch", "eps_label"]).auc
    fnn, lr = [worst[("fnn", e)] for e in labels], [worst[("lr", e)] for e in labels]
    assert f"FNN rows measure {listed(fnn)};" in docs
    gaps = np.subtract(ideal_auc, lr)
    assert np.round(gaps.min(), 2) == 0.01 and np.round(gaps.max(), 2) == 0.02
    assert (f"({lr[0]:.2f} against {ideal_auc[0]:.2f} at label 1, {lr[1]:.2f} against "
            f"{ideal_auc[1]:.2f} at label 2, then {lr[2]:.2f}, {lr[3]:.2f}, {lr[4]:.2f})") in docs

    certified = pd.concat([wb[wb.certified], bb[bb.certified]], ignore_index=True)
    share = certified.eps_lb / certified.eps_th
    top = certified.loc[share.idxmax()]
    assert (top.arch, top.method, top.eps_label) == ("lr", "blackbox-worst-case-init", 8)
    assert f"at most {share.max():.2f} of eps_th (the black box's LR row, {top.eps_lb:.2f}" \
        in docs

    # the page's table of what the ideal tests certify: "mean (low-high); GDP ..." per side
    rows = re.findall(r"^  \| (\d+) \| (.*) \|$", (ROOT / "docs/tight.md").read_text(), re.M)
    ideal = {int(e): [tuple(map(float, m)) for m in re.findall(
        r"([\d.]+) \(([\d.]+)-([\d.]+)\); [\d.]+ \([\d.]+-[\d.]+\)", rest)]
        for e, rest in rows}
    assert sorted(ideal) == labels and all(len(v) == 2 for v in ideal.values())
    eps_th = {"blackbox-worst-case-init": dict(zip(bb.eps_label, bb.eps_th)),
              "whitebox-llr": dict(zip(wb.eps_label, wb.eps_th))}
    means = [m / eps_th[meth][e] for e in labels
             for (m, _, _), meth in zip(ideal[e], eps_th)]
    draws = [hi / eps_th[meth][e] for e in labels
             for (_, _, hi), meth in zip(ideal[e], eps_th)]
    assert f"the ideal tests' means at most {max(means):.2f}" in docs
    assert f"single draws of the ideal test reach {max(draws):.2f}" in docs
    outside = [(r.arch, r.eps_label) for side, meth in enumerate(eps_th)
               for r in certified[certified.method == meth].itertuples()
               if not ideal[r.eps_label][side][1] <= round(r.eps_lb, 2)
               <= ideal[r.eps_label][side][2]]
    assert outside == [("fnn", 8)] and "in 19 of the 20 rows" in docs

    cap = eps_lb_clopper_pearson(500, 500, 0, 500, alpha=0.05, delta=DELTA)
    top_th = wb.eps_th.max()
    assert (f"certifies at most eps {cap:.2f}, {cap / top_th:.2f} of the white box's eps_th "
            f"{top_th:.2f} and {cap / 10:.2f} of 10") in docs
    assert f"(mu = 2, eps {eps_from_mu(2.0, DELTA):.3f} at delta 1e-5)" in docs
    assert "strongest test there is" not in docs and "exactly eps 10" not in docs
