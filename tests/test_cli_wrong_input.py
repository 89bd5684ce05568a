"""Wrong input on the command line: a table or file of another command, a cell the grid
cannot hold, a file where a folder goes (and the reverse), a figure path that is not a
.pdf, the same table twice. Each ends in one line and exit 2 before anything is written;
a folder made for an output is named."""

from __future__ import annotations

import gzip
import json
import math
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
        (f'[[NaN, "fixed", "{EPS}"]]', "--cells[0][0]=nan: must be a finite number"),
        (f'[[-1.0, "fixed", "{EPS}"]]', "--cells[0][0]=-1.0: -1.0 is less than or equal to "
                                        "the minimum of 0 (Clipping norm C."),
        (f'[[1.0, "bogus", "{EPS}"]]', "--cells[0][1]='bogus': 'bogus' does not match "
                                       "'^(fixed|g.+)$' (fixed or g<Glorot scale>"),
        (f'[[1.0, "g-1", "{EPS}"]]', "--cells[0][1] (Glorot scale of 'g-1')=-1.0: -1.0 is "
                                     "less than or equal to the minimum of 0"),
        (f'[[1.0, "g1e999", "{EPS}"]]', "--cells[0][1] (Glorot scale of 'g1e999')=inf: must "
                                        "be a finite number"),
        ('[[1.0, "g1", "eight"]]', "--cells[0][2]='eight': 'eight' does not match"),
        ('[]', "--cells=[]: [] should be non-empty"),
        (f'[[1.0, "g1", "{EPS}"], [1, "g1", "{EPS}"]]', "has non-unique elements"))],
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
    code = main(["md-html", *_md(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"dpaudit md-html: created folder {out.parent}" in err and out.exists()
    # an existing folder is not announced
    assert main(["md-html", *_md(tmp_path), "--out", str(out)]) == 0
    assert "created folder" not in capsys.readouterr().err


def _md(tmp_path: Path) -> list[str]:
    """``--md`` and ``--table`` of md-html: a table and its Markdown."""
    from dpaudit.io import write_markdown

    path, table = tmp_path / "t.md", tmp_path / "t.csv"
    write_markdown("| a | b |\n|---|---|\n| 1 | 2 |\n", path,
                   write_table(pd.DataFrame({"a": [1], "b": [2]}), table, {"seed": 0}))
    return ["--md", str(path), "--table", str(table)]


# --------------------------------------------------------- one schema for every entry point

SCHEMA = yaml.safe_load((Path(__file__).parents[1] / "src" / "dpaudit" /
                         "schema.yaml").read_text())


def _keys(*path: str) -> set[str]:
    """The keys of the schema section at ``path`` (``[]``: a list's items)."""
    node = SCHEMA
    for part in path:
        node = node["items"] if part == "[]" else node["properties"][part]
    return set(node["properties"])


FMNIST = ("jagielski", "datasets", "fmnist")
#: ``--train`` of the audits on Figure 2's FMNIST cells: the data set's DP-SGD set-up and
#: Figure 2's clip.
FMNIST_TRAIN = {"epochs", "batch_size", "lr", "hidden", "noise", "clip"}
DATA = CONFIG["data"]
SH = {k: v for k, v in CONFIG["shuffle"].items() if k != "device"}
TIGHT = CONFIG["tight"]
TIGHT_TRAIN = {**{k: JAG["datasets"]["fmnist"][k] for k in ("epochs", "batch_size", "lr",
                                                          "hidden")},
               "noise": {"4": 1.55}, "clip": JAG["fig2"]["clip"]}
TIGHT_SPEC = {k: TIGHT[k] for k in ("runs", "archs", "alpha", "delta", "select_frac")}
TIGHT_SPEC["eps"] = ["4"]
BLACKBOX = {**{k: TIGHT[k] for k in ("runs", "archs", "alpha", "delta")}, "eps": ["4"],
            **TIGHT["blackbox"], "hidden": 32}
OUT = ["--seed", "0", "--out", "OUT.csv"]

#: (command line with JSON arguments by flag, the flag under test, the keys it must accept:
#: a schema section's, less those a rule passes as their own argument, or named parts of
#: several sections where the job depends on those alone).
ENTRY_POINTS = [
    (["data", "--dataset", "fmnist", "--out", "OUT.csv"], {"--data": DATA}, "--data",
     _keys("data")),
    (["hw3-audit", "--grid", "eps", *OUT], {"--spec": CONFIG["hw3"]}, "--spec", _keys("hw3")),
    *[(["accounting-curves", "--figure", f, *OUT], {"--spec": CONFIG["accounting"][f]},
       "--spec", _keys("accounting", f)) for f in ("abadi", "composition")],
    (["ridge-audit", *OUT], {"--spec": CONFIG["ridge"]}, "--spec", _keys("ridge")),
    *[(["jagielski-task", "--dataset", ds, *OUT],
       {"--spec": {k: v for k, v in JAG["datasets"][ds].items() if k in keys},
        "--data": DATA}, flag, want)
      for ds, keys in (("fmnist", {"clipbkd_norm"}),
                       ("cifar", {"clipbkd_norm", "pretrain_epochs", "pretrain_images"}))
      for flag, want in (("--spec", keys), ("--data", _keys("data")))],
    (["jagielski-train", "--task", "NONE.npz", "--dataset", "fmnist", "--arch", "lr",
      "--attack", "mi", "--cells", f'[[1.0, "g1", "{EPS}"]]', "--seed", "0", "--device",
      "cpu", "--out-dir", "OUTDIR"], {"--spec": json.loads(TRAIN_SPEC)}, "--spec",
     # the jagielski section's training keys, the data set's DP-SGD set-up
     {"trials", "ks", "sampling", "clipbkd_d0", "matmul_precision",
      *(_keys(*FMNIST) - {"clipbkd_norm"})}),
    # what its cells were trained with is recorded; block_trials and device are arguments
    (["jagielski-audit", "--experiment", "fig2", "--scores", "NONE.csv", *OUT],
     {"--spec": jagielski.table_spec(JAG, "fig2")}, "--spec",
     _keys("jagielski") - {"block_trials", "device"}),
    *[(["trials-needed", "--scores", "NONE.csv", "--seed", "0", "--out", "OUT.csv",
        "--summary", "S.csv", "--md", "S.md"],
       {"--spec": CONFIG["trials_needed"],
        "--audit": {k: JAG[k] for k in jagielski.AUDIT_KEYS}}, flag, want)
      for flag, want in (("--spec", _keys("trials_needed")),
                         ("--audit", {"alpha", "delta", "select_frac"}))],
    *[(["tramer-audit", "--target", target, "--losses", "L.csv", *OUT],
       {"--spec": {k: CONFIG["tramer"][k] for k in keys}, "--data": DATA}, flag, want)
      for target, keys in (
          ("case-study", _keys("tramer") - {"device", "user"}),
          # the user's audit shares the data and the run batching with the case study
          ("user", {"user", "alpha", "classes", "n_train", "batch_runs"}))
      for flag, want in (("--spec", keys), ("--data", _keys("data")))],
    *[(["onerun-audit", "--task", "NONE.npz", *OUT],
       {"--spec": {k: v for k, v in CONFIG["onerun"].items() if k != "compare_many_model"},
        "--train": TIGHT_TRAIN}, flag, want)
      for flag, want in (("--spec", _keys("onerun") - {"compare_many_model"}),
                         ("--train", FMNIST_TRAIN))],
    *[(["abadi-features", *OUT],
       {"--spec": abadi.job_spec(CONFIG["abadi"], "fig6", abadi.FEATURE_KEYS),
        "--data": DATA}, flag, want)
      for flag, want in (("--spec", {*abadi.FEATURE_KEYS, "delta", "accountant"}),
                         ("--data", _keys("data")))],
    *[(["abadi-train", "--figure", "fig3", "--device", "cpu", *OUT],
       {"--spec": abadi.job_spec(CONFIG["abadi"], "fig3"),
        "--level": CONFIG["abadi"]["fig3"]["levels"][0], "--data": DATA}, flag, want)
      for flag, want in (("--spec", _keys("abadi", "fig3") - {"levels"} | {"delta",
                                                                           "accountant"}),
                         ("--level", _keys("abadi", "fig3", "levels", "[]")),
                         ("--data", _keys("data")))],
    *[(["tight-whitebox-audit", "--task", "NONE.npz", *OUT],
       {"--spec": TIGHT_SPEC, "--train": TIGHT_TRAIN}, flag, want)
      for flag, want in (("--spec", _keys("tight") - {"noise", "device", "blackbox"}),
                         ("--train", FMNIST_TRAIN))],
    (["tight-blackbox-audit", "--task", "NONE.npz", *OUT], {"--spec": BLACKBOX}, "--spec",
     {"runs", "archs", "eps", "alpha", "delta", "hidden", *_keys("tight", "blackbox")}),
    (["shuffle-audit", "--task", "NONE.npz", *OUT], {"--spec": SH}, "--spec",
     _keys("shuffle") - {"device"}),
]
#: JSON arguments that are no config section: the user's own spec, passed verbatim to the
#: user's training function.
FREE_FORM = {("audit-impl", "--spec")}


def _json_flags() -> set[tuple[str, str]]:
    """(subcommand, flag) of every argument parsed as a JSON object."""
    import argparse

    from dpaudit import cli

    found = set()
    for module in cli.COMMANDS:
        sub = argparse.ArgumentParser().add_subparsers()
        module.register(sub)
        for command, parser in sub.choices.items():
            found |= {(command, a.option_strings[0]) for a in parser._actions
                      if a.type is cli.spec_arg}
    return found


def test_every_json_argument_is_checked_against_the_schema():
    assert {(argv[0], flag) for argv, _, flag, _ in ENTRY_POINTS} | FREE_FORM == _json_flags()


@pytest.mark.parametrize("argv, given, flag, want", ENTRY_POINTS,
                         ids=[f"{a[0]} {f} {i}" for i, (a, _, f, _) in enumerate(ENTRY_POINTS)])
def test_each_command_accepts_exactly_its_schema_sections_keys(argv, given, flag, want,
                                                               tmp_path, capsys):
    """A valid value of every JSON argument, with one unknown key added to the one under
    test: refused in one line that lists the keys accepted, which are the schema's (a key
    list of the command's own would drift from the workflow's)."""
    import ast

    values = {f: json.dumps({**v, "zz_unknown": 1} if f == flag else v)
              for f, v in given.items()}
    line = [str(tmp_path / a) if a.startswith(("OUT", "NONE", "S.")) else a for a in argv]
    for f, v in values.items():
        line += [f, v]
    code = main(line)
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2 and len(err) == 1 and ".zz_unknown: unknown key; allowed keys are " \
        in err[0], err
    allowed = ast.literal_eval(err[0].split("allowed keys are ", 1)[1])
    assert set(allowed) == want, sorted(set(allowed) ^ want)
    assert not [p for p in tmp_path.rglob("*") if p.suffix != ".lock"]


# ------------------------------------------------- refused before any work, in one line

def _out_arguments() -> list[tuple[str, str, str]]:
    """(subcommand, flag, a path under /proc of its kind) of every output argument."""
    import argparse

    from dpaudit import cli

    found = []
    for module in cli.COMMANDS:
        sub = argparse.ArgumentParser().add_subparsers()
        module.register(sub)
        for command, parser in sub.choices.items():
            for a in parser._actions:
                if a.type in (cli.out_file, cli.figure_out, cli.out_dir):
                    path = "/proc/dpaudit/o" + ("" if a.type is cli.out_dir else ".pdf")
                    found.append((command, a.option_strings[0], path))
    return found


def test_every_output_argument_is_checked():
    found = _out_arguments()
    assert {("ridge-plot", "--out"), ("hw3-plot", "--out"), ("accounting-plot", "--out"),
            ("jagielski-train", "--out-dir"), ("tramer-audit", "--store"),
            ("trials-needed", "--md")} <= {(c, f) for c, f, _ in found}
    assert len(found) >= 40


@pytest.mark.parametrize("command, flag, path", _out_arguments())
def test_an_output_that_cannot_be_made_is_refused_by_the_parser(command, flag, path, capsys):
    """Every output argument of every subcommand, under /proc (where nothing can be made,
    even by root): refused while parsing, naming the argument, before any other check."""
    with pytest.raises(SystemExit) as exit_:
        main([command, flag, path])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and "Traceback" not in "\n".join(err), err
    assert err[-1].endswith(f"argument {flag}: {path!r}: must be a path whose folder can be "
                            "made and written; nothing can be made in /proc (No such file or "
                            "directory)"), err


def test_an_output_under_a_file_is_refused_by_the_parser(tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit):
        main(["ridge-plot", "--table", "t.csv", "--out", str(tmp_path / "a_file" / "f.pdf")])
    err = capsys.readouterr().err
    assert f"must be a path whose folder can be made and written; {tmp_path / 'a_file'} is " \
           "a file, not a folder" in err, err


def _with(section: dict, **change) -> str:
    return json.dumps({**section, **change})


SETTING = CONFIG["shuffle"]["settings"][0]
#: (command line, the one line), each refused before a task file is read (there is none)
#: or anything is trained or written.
SPEC_VALUES = [
    *[(["shuffle-audit", "--spec", _with(SH, **change)], line) for change, line in (
        ({"delta": -0.1}, "config error: shuffle.delta=-0.1: -0.1 is less than or equal to "
                          "the minimum of 0"),
        ({"delta": math.inf}, "config error: shuffle.delta=inf: must be a finite number"),
        ({"alpha": 0}, "config error: shuffle.alpha=0: 0 is less than or equal to the "
                       "minimum of 0"),
        ({"alpha": math.nan}, "config error: shuffle.alpha=nan: must be a finite number"),
        ({"select_frac": 1.0}, "config error: shuffle.select_frac=1.0: 1.0 is greater than or "
                               "equal to the maximum of 1"),
        ({"select_frac": 0.0001}, "config error: shuffle.select_frac=0.0001 of "
                                  "shuffle.settings[1].runs=3000: must leave at least one run "
                                  "per side"),
        ({"runs": 3}, "config error: shuffle.runs=3: 3 is less than the minimum of 4"),
        ({"settings": [{**SETTING, "eps": 1000}]},
         "config error: shuffle.settings[0].eps=1000: 1000 is greater than the maximum of 100"),
        ({"settings": [{**SETTING, "batch_size": 0}]},
         "config error: shuffle.settings[0].batch_size=0: 0 is less than the minimum of 1"),
        ({"subjects": ["shuffle-once"], "settings": [{**SETTING, "epochs": 1}]},
         "config error: shuffle.subjects: [shuffle-once] alone must come with a setting of "
         "epochs > 1"),
        ({"mates": [2]}, "config error: shuffle.mates[0]=2: 2 is greater than the maximum of 1"),
    )],
    *[(["tight-whitebox-audit", "--spec", json.dumps(TIGHT_SPEC), "--train",
        _with(TIGHT_TRAIN, **change)], line) for change, line in (
        ({"noise": {"4": math.nan}}, "config error: --train.noise.4=nan: must be a finite "
                                     "number"),
        ({"batch_size": 0}, "config error: --train.batch_size=0: 0 is less than the minimum "
                            "of 1"),
        ({"epochs": -1}, "config error: --train.epochs=-1: -1 is less than the minimum of 1"),
        ({"lr": math.inf}, "config error: --train.lr=inf: must be a finite number"),
    )],
    (["tight-whitebox-audit", "--spec", _with(TIGHT_SPEC, runs=4, select_frac=0.1), "--train",
      json.dumps(TIGHT_TRAIN)], "config error: tight.select_frac=0.1 of tight.runs=4: must "
                                "leave at least one run per side"),
    (["tight-whitebox-audit", "--spec", _with(TIGHT_SPEC, eps=["8"]), "--train",
      json.dumps(TIGHT_TRAIN)], "config error: tight.eps: ['8'] must be keys of --train.noise"),
    (["tight-blackbox-audit", "--spec", _with(BLACKBOX, steps=0)],
     "config error: tight.steps=0: 0 is less than the minimum of 1"),
    (["tight-blackbox-audit", "--spec", _with(BLACKBOX, delta=math.nan)],
     "config error: tight.delta=nan: must be a finite number"),
]


@pytest.mark.parametrize("argv, line", SPEC_VALUES,
                         ids=[f"{a[0]} {i}" for i, (a, _) in enumerate(SPEC_VALUES)])
def test_a_bad_value_is_refused_before_the_task_is_read(argv, line, tmp_path, capsys):
    code = main([*argv, "--task", str(tmp_path / "none.npz"), "--seed", "0", "--device", "cpu",
                 "--out", str(tmp_path / "o.csv")])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2 and len(err) == 1 and line in err[0], err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("val_runs, ok", [(1, False), (0, False), (-3, False), (2, True)])
def test_audit_impl_needs_two_validation_runs_per_side(val_runs, ok, tmp_path, capsys):
    """One validation run per side leaves one threshold (between its two losses) and nothing
    to choose: at least two (dpaudit.cli.tramer_plan.MIN_VAL_RUNS)."""
    from dpaudit.cli.tramer_plan import MIN_VAL_RUNS

    assert MIN_VAL_RUNS == 2
    code = main(["audit-impl", "--train", "nomodule:train", "--eps", "1", "--delta", "1e-5",
                 "--alpha", "0.05", "--runs", "100", "--val-runs", str(val_runs), "--seed",
                 "0", "--out", str(tmp_path / "o.csv")])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2 and len(err) == 1, err
    assert (f"--val-runs={val_runs}: must be an integer >= 2" in err[0]) != ok, err
    assert ok == ("cannot import module 'nomodule'" in err[0]), err  # the next check


def test_dpaudit_alone_lists_its_commands_with_audit_impl_first(capsys):
    from dpaudit import cli

    assert cli.main([]) == 2
    err = capsys.readouterr().err
    listed = re.findall(r"^    ([a-z][-a-z0-9]+)", err, flags=re.M)
    commands = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    assert listed[0] == "audit-impl" and set(listed) == set(commands), err
    assert "docs/audit_your_implementation.md" in err and "``" not in err
