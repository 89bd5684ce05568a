"""Wrong input on the command line: a table or file of another command, a cell the grid
cannot hold, a file where a folder goes (and the reverse), a figure path that is not a
.pdf, the same table twice. Each ends in one line and exit 2 before anything is written;
a folder made for an output is named."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from dpaudit.cli import main
from dpaudit.experiments import abadi, jagielski
from dpaudit.experiments.jagielski import TASK_ARRAYS
from dpaudit.features import save_features
from dpaudit.io import write_table

CONFIG = yaml.safe_load((Path(__file__).parents[1] / "config" / "config.yaml").read_text())
JAG = CONFIG["jagielski"]
EPS = sorted(JAG["datasets"]["fmnist"]["noise"])[0]
TRAIN_SPEC = json.dumps(jagielski.train_spec(JAG, "fmnist", [EPS]))


def _task(path: Path, **prov) -> Path:
    rng = np.random.default_rng(0)
    arrays = {k: rng.random((4, 6)).astype(np.float32) for k in TASK_ARRAYS}
    arrays.update(y=np.array([0, 1, 0, 1]), y_test=np.array([0, 1, 0, 1]),
                  pool_y=np.array([0, 1, 0, 1]), bkd_test_y=np.array([0, 1, 0, 1]),
                  x_p=rng.random(6).astype(np.float32), y_p=np.array(1))
    save_features(path, arrays, {"command": "jagielski-task", **prov})
    return path


def _table(path: Path, prov: dict, **columns) -> Path:
    write_table(pd.DataFrame(columns or {"a": [1.0, 2.0]}), path, prov)
    return path


@pytest.fixture
def files(tmp_path):
    """Files of the kinds the cases below give to the wrong command."""
    d = tmp_path / "in"
    d.mkdir()
    level = {"name": "small", "sigma": 2.0}
    summary = {c: [1] for c in abadi.SUMMARY_COLUMNS}
    summary.update(figure=["fig3"], dataset=["mnist"], level=["small"])
    return {
        "ridge": _table(d / "ridge_audit.csv", {"command": "ridge-audit"}),
        "hw3_eps": _table(d / "hw3_eps.csv", {"command": "hw3-audit", "grid": "eps"}),
        "task": _task(d / "task_fmnist.npz", dataset="fmnist"),
        "features": _features(d / "features.npz"),
        "level": _table(d / "level.csv", {"command": "abadi-train", "figure": "fig3",
                                          "level": level}, **summary),
        "file": _table(d / "a_file.csv", {"command": "ridge-audit"}),
        "dir": d,
        "bad_tar": _bytes(d / "bad.tar.gz", gzip.compress(b"not a tarball")),
    }


def _features(path: Path) -> Path:
    """Features of abadi-features: the arrays a task's reader asks for, another command."""
    arrays = {"X": np.zeros((2, 3), np.float32), "X_test": np.zeros((2, 3), np.float32),
              "y": np.zeros(2, int), "y_test": np.zeros(2, int)}
    save_features(path, arrays, {"command": "abadi-features", "pretrained_on": "cifar100"})
    return path


def _bytes(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def _argv(argv, files, tmp_path):
    return [str(files[a[1:]]) if a.startswith("@") else
            str(tmp_path / "out" / a[1:]) if a.startswith("^") else a for a in argv]


SCORE_CELL = {"dataset": "fmnist", "arch": "lr", "clip": 1.0, "init": "fixed",
              "attack": "clipbkd", "eps": "8"}

#: (command line, what the one line says): ``@name`` a file of the fixture, ``^name`` an
#: output under tmp_path/out.
USAGE = [
    (["tight-plot", "--table", "@ridge", "--out", "^t.pdf"],
     "@ridge: not a file of `dpaudit tight-table` (made by `dpaudit ridge-audit`)"),
    (["tight-table", "--whitebox", "@ridge", "--out", "^t.csv"],
     "@ridge: not a file of `dpaudit tight-whitebox-audit` (made by `dpaudit ridge-audit`)"),
    (["tight-table", "--blackbox", "@ridge", "--out", "^t.csv"],
     "@ridge: not a file of `dpaudit tight-blackbox-audit` (made by `dpaudit ridge-audit`)"),
    (["abadi-train", "--figure", "fig6", "--spec",
      json.dumps(abadi.job_spec(CONFIG["abadi"], "fig6")), "--level",
      json.dumps(CONFIG["abadi"]["fig6"]["levels"][0]), "--features", "@task", "--seed", "0",
      "--device", "cpu", "--out", "^l.csv"],
     "@task: not a file of `dpaudit abadi-features` (made by `dpaudit jagielski-task`)"),
    *[(["jagielski-train", "--task", "@task", "--dataset", "fmnist", "--arch", "lr", "--attack",
        "mi", "--cells", cells, "--spec", TRAIN_SPEC, "--seed", "0", "--device", "cpu",
        "--out-dir", "^o"], line) for cells, line in (
        (f'[[NaN, "fixed", "{EPS}"]]', "--cells: clip nan: must be a finite number > 0"),
        (f'[[-1.0, "fixed", "{EPS}"]]', "--cells: clip -1.0: must be a finite number > 0"),
        (f'[[1.0, "bogus", "{EPS}"]]', "--cells: init 'bogus': must be 'fixed' or 'g<Glorot "
                                       "scale>'"),
        (f'[[1.0, "g-1", "{EPS}"]]', "--cells: init 'g-1': must be 'fixed' or"))],
    (["hw3-plot", "--grid", "m", "--table", "@hw3_eps", "--out", "^h.pdf"],
     "@hw3_eps: a file of hw3-audit with grid 'eps', not 'm'"),
    (["jagielski-init", "--dataset", "fmnist", "--arch", "lr", "--task", "@features",
      "--seed", "0", "--out", "^i.pt"],
     "@features: not a file of `dpaudit jagielski-task` (made by `dpaudit abadi-features`)"),
    (["jagielski-init", "--dataset", "cifar", "--arch", "lr", "--task", "@task", "--seed",
      "0", "--out", "^i.pt"], "@task: a file of jagielski-task with dataset 'fmnist', not "
                              "'cifar'"),
    (["abadi-table", "--tables", "@level", "@level", "--out", "^a.csv"],
     "--tables: @level and @level are both the table of fig3 level {'name': 'small', "
     "'sigma': 2.0}; give each level once"),
    (["data", "--dataset", "cifar", "--data", "DATA", "--out", "^d.csv"],
     "@bad_tar: not a readable tarball"),
    (["runs-needed", "--eps", "2", "--delta", "1e-5", "--factor", "0.5"],
     "runs-needed: config error: factor=0.5: out of range"),
]


@pytest.mark.parametrize("argv, line", USAGE, ids=[" ".join(a[:1] + a[-4:-2]) + f" {i}"
                                                  for i, (a, _) in enumerate(USAGE)])
def test_wrong_input_is_one_line_and_exit_2(argv, line, files, tmp_path, capsys):
    root = tmp_path / "new_root"
    argv = [json.dumps({"root": str(root), "download": False,
                        "cifar10_tarball": str(files["bad_tar"]), "cifar100_root": None})
            if a == "DATA" else a for a in argv]
    code = main(_argv(argv, files, tmp_path))
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2, err
    assert len(err) == 1 and re.sub(r"@(\w+)", lambda m: str(files[m[1]]), line) in err[0], err
    # nothing written, no data root made for a tarball that cannot be read
    out = tmp_path / "out"
    assert not out.exists() or not [p for p in out.rglob("*") if p.suffix != ".lock"]
    assert not root.exists()


def test_a_trials_needed_cell_must_be_the_sections(files, tmp_path, capsys):
    sides = jagielski.side_names("clipbkd", [1])
    scores = pd.DataFrame({"side": np.repeat(sides, 2), "trial": [0, 1] * len(sides),
                           "test_acc": 0.5})
    for column in jagielski.score_columns("clipbkd"):
        scores[column] = np.arange(len(scores)) / 10
    spec = {**CONFIG["trials_needed"], "arch": "fnn"}
    path = _table(tmp_path / "lr_cell.csv", {"command": "jagielski-train", "cell": SCORE_CELL,
                                             "spec": {"trials": 2, "ks": [1]}},
                  **scores.to_dict("list"))
    code = main(["trials-needed", "--scores", str(path), "--spec", json.dumps(spec), "--audit",
                 json.dumps({k: JAG[k] for k in jagielski.AUDIT_KEYS}), "--seed", "0",
                 "--out", str(tmp_path / "o.csv"), "--summary", str(tmp_path / "s.csv"),
                 "--md", str(tmp_path / "s.md")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"{path}: a score table of the cell with arch 'lr', but trials_needed.arch is " \
           "'fnn'" in err[0]
    assert not (tmp_path / "o.csv").exists()


#: A path argument of the wrong kind, refused by the parser: (command line, argument, why).
PATHS = [
    (["jagielski-train", "--task", "@task", "--dataset", "fmnist", "--arch", "lr", "--attack",
      "mi", "--cells", "[]", "--spec", "{}", "--seed", "0", "--out-dir", "^o", "--store",
      "@file"], "--store", "is a file, not a folder"),
    (["jagielski-train", "--task", "@task", "--dataset", "fmnist", "--arch", "lr", "--attack",
      "mi", "--cells", "[]", "--spec", "{}", "--seed", "0", "--out-dir", "@file"],
     "--out-dir", "is a file, not a folder"),
    (["tramer-audit", "--target", "user", "--spec", "{}", "--data", "{}", "--seed", "0",
      "--out", "^t.csv", "--losses", "^l.csv", "--store", "@file"], "--store",
     "is a file, not a folder"),
    (["data", "--dataset", "cifar", "--data", "{}", "--out", "@dir"], "--out", "is a folder"),
    (["hw3-plot", "--grid", "eps", "--table", "@hw3_eps", "--out", "^adir"], "--out",
     "must be a .pdf file"),
    (["hw3-plot", "--grid", "eps", "--table", "@hw3_eps", "--out", "^out/p.txt"], "--out",
     "must be a .pdf file"),
    (["tight-plot", "--table", "@ridge", "--out", "@dir"], "--out", "is a folder"),
]


@pytest.mark.parametrize("argv, name, why", PATHS)
def test_a_path_of_the_wrong_kind_is_refused_by_the_parser(argv, name, why, files, tmp_path,
                                                          capsys):
    with pytest.raises(SystemExit) as exit_:
        main(_argv(argv, files, tmp_path))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {name}: " in err and why in err, err
    assert not (tmp_path / "out").exists()


def test_a_folder_made_for_an_output_is_named(tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "r.csv"
    code = main(["md-html", "--md", str(_md(tmp_path)), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"dpaudit md-html: created folder {out.parent}" in err and out.exists()
    # an existing folder is not announced
    assert main(["md-html", "--md", str(_md(tmp_path)), "--out", str(out)]) == 0
    assert "created folder" not in capsys.readouterr().err


def _md(tmp_path: Path) -> Path:
    path = tmp_path / "t.md"
    path.write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    return path


def test_each_command_line_imports_its_own_module_only():
    """``COMMAND_MODULES`` names, for every subcommand, the module that registers it (so a
    command line imports that module alone), and a plot command starts without torch or
    dp_accounting (seconds per job of a workflow)."""
    import argparse
    import importlib
    import subprocess
    import sys

    from dpaudit import cli

    found = {}
    for name in cli.COMMANDS:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"dpaudit.cli.{name}").register(sub)
        found.update(dict.fromkeys(sub.choices, name))
    assert found == cli.COMMAND_MODULES
    code = ("import sys; from dpaudit.cli import main\n"
            "try:\n    main(['tight-plot', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'dp_accounting') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "[]", out
