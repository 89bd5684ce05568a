"""Fault injection on input files: every subcommand that reads a table, ``.npz``, weights or
Markdown file, given a missing, empty, header-only or foreign one (a table reader also a
well-formed table of another command), and the data sets given truncated, corrupt or
misplaced files, stops with one line that names the file and what is wrong, exit status 2,
and leaves no output or temporary file behind."""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from dpaudit import data
from dpaudit.cli import main
from dpaudit.dpsgd import ModelSpec, init_params, save_params
from dpaudit.experiments import abadi, jagielski
from dpaudit.experiments.jagielski import TASK_ARRAYS
from dpaudit.features import save_features
from dpaudit.io import BadInputFile, read_table, write_markdown, write_table
from fakedata import FMNIST_FILES, fake_fmnist, idx_bytes, write_idx_gz, write_tree

CONFIG = yaml.safe_load((Path(__file__).parents[1] / "config" / "config.yaml").read_text())
JAG = CONFIG["jagielski"]
FMNIST = JAG["datasets"]["fmnist"]
EPS = sorted(FMNIST["noise"])[0]


def _j(value) -> str:
    return json.dumps(value)


def _valid_specs() -> dict[str, str]:
    """The config sections (as the rules pass them) the commands check before any file."""
    onerun_cli = __import__("dpaudit.cli.onerun", fromlist=["AUDIT_KEYS"])
    return {
        "audit": _j(jagielski.table_spec(JAG, "fig2")),
        "train": _j(jagielski.train_spec(JAG, "fmnist", [EPS])),
        "tn": _j(CONFIG["trials_needed"]),
        "tn_audit": _j({k: JAG[k] for k in jagielski.AUDIT_KEYS}),
        "onerun": _j({k: CONFIG["onerun"][k] for k in onerun_cli.AUDIT_KEYS}),
        "onerun_train": _j({**{k: FMNIST[k] for k in ("epochs", "batch_size", "lr", "hidden")},
                            "noise": {e: FMNIST["noise"][e] for e in CONFIG["onerun"]["eps"]},
                            "clip": JAG["fig2"]["clip"]}),
        "fig6": _j(abadi.job_spec(CONFIG["abadi"], "fig6")),
        "fig6_level": _j(CONFIG["abadi"]["fig6"]["levels"][0]),
    }


SPECS = _valid_specs()

#: Subcommand -> (kind of file it reads, its arguments; F: the file under test, O: an output).
READERS = {
    "hw3-plot": ("table", ["--grid", "eps", "--table", "F", "--out", "O.pdf"]),
    "accounting-plot": ("table", ["--figure", "abadi", "--table", "F", "--out", "O.pdf"]),
    "ridge-plot": ("table", ["--table", "F", "--out", "O.pdf"]),
    "jagielski-audit": ("table", ["--experiment", "fig2", "--scores", "F", "--spec",
                                  SPECS["audit"], "--seed", "0", "--out", "O.csv"]),
    "jagielski-md": ("table", ["--table", "F", "--out", "O.md"]),
    "jagielski-plot": ("table", ["--experiment", "fig2", "--table", "F", "--out", "O.pdf"]),
    "trials-needed": ("table", ["--scores", "F", "--spec", SPECS["tn"], "--audit",
                                SPECS["tn_audit"], "--seed", "0", "--out", "O.csv",
                                "--summary", "O2.csv", "--md", "O3.md"]),
    "trials-needed-plot": ("table", ["--table", "F", "--summary", "F", "--out", "O.pdf"]),
    "tramer-reaudit": ("table", ["--table", "F", "--losses", "F", "--out", "O.csv",
                                 "--hist", "O2.csv"]),
    "tramer-plot": ("table", ["--table", "F", "--losses", "F", "--out", "O.pdf"]),
    "onerun-plot": ("table", ["--table", "F", "--out", "O.pdf"]),
    "abadi-table": ("table", ["--tables", "F", "--out", "O.csv"]),
    "abadi-plot": ("table", ["--figure", "fig3", "--table", "F", "--out", "O.pdf"]),
    "jagielski-init": ("npz", ["--dataset", "fmnist", "--arch", "lr", "--task", "F",
                               "--seed", "0", "--out", "O.pt"]),
    "jagielski-train": ("npz", ["--task", "F", "--dataset", "fmnist", "--arch", "lr",
                                "--attack", "mi", "--cells", _j([[1.0, "g1", EPS]]),
                                "--spec", SPECS["train"], "--seed", "0", "--device", "cpu",
                                "--out-dir", "O"]),
    "onerun-audit": ("npz", ["--task", "F", "--spec", SPECS["onerun"], "--train",
                             SPECS["onerun_train"], "--seed", "0", "--device", "cpu",
                             "--out", "O.csv"]),
    "abadi-train": ("npz", ["--figure", "fig6", "--spec", SPECS["fig6"], "--level",
                            SPECS["fig6_level"], "--features", "F", "--seed", "0",
                            "--device", "cpu", "--out", "O.csv"]),
    # the init file, read after a good task file (G)
    "jagielski-train --init-file": ("pt", [
        "--task", "G", "--dataset", "fmnist", "--arch", "lr", "--attack", "mi",
        "--cells", _j([[1.0, "fixed", EPS]]), "--init-file", "F", "--spec", SPECS["train"],
        "--seed", "0", "--device", "cpu", "--out-dir", "O"]),
    "md-html": ("md", ["--md", "F", "--table", "T", "--out", "O.html"]),
}


def _good_task(path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {k: rng.random((4, 6)).astype(np.float32) for k in TASK_ARRAYS}
    arrays.update(y=np.array([0, 1, 0, 1]), y_test=np.array([0, 1, 0, 1]),
                  pool_y=np.array([0, 1, 0, 1]), bkd_test_y=np.array([0, 1, 0, 1]),
                  x_p=rng.random(6).astype(np.float32), y_p=np.array(1))
    save_features(path, arrays, {"command": "jagielski-task"})


def _real_bytes(kind: str, tmp: Path) -> bytes:
    """A good file of ``kind``, as bytes."""
    path = tmp / f"good.{kind}"
    if kind == "table":
        write_table(pd.DataFrame({"eps": [1.0, 2.0], "eps_lb": [0.5, 0.7]}), path, {"seed": 0})
    elif kind == "npz":
        _good_task(path)
    elif kind == "pt":
        model = ModelSpec("lr", 6, 32)
        save_params(path, init_params(model, 1, [0], device="cpu"), model)
    else:
        write_markdown("| a | b |\n|---|---|\n| 1 | 2 |\n", path, "0" * 64)
    return path.read_bytes()


def _bad(kind: str, fault: str, tmp: Path) -> Path | None:
    """The file of ``kind`` with ``fault``: None (missing), empty, header-only (what is left
    of a good file cut after its first line or bytes) or foreign (another kind's file)."""
    good = _real_bytes(kind, tmp)
    foreign = {"table": "npz", "npz": "table", "pt": "table", "md": "npz"}[kind]
    content = {"missing": None, "empty": b"",
               "header-only": (good.split(b"\n", 1)[0] + b"\n" if kind in ("table", "md")
                               else good[:64]),
               "foreign": _real_bytes(foreign, tmp)}[fault]
    path = tmp / f"bad_{fault}.{kind}"
    if content is not None:
        path.write_bytes(content)
    return path


def _run(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = main(argv)
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("fault", ["missing", "empty", "header-only", "foreign"])
@pytest.mark.parametrize("command", sorted(READERS))
def test_every_reader_names_a_bad_input_file_and_exits_2(command, fault, tmp_path, capsys):
    kind, args = READERS[command]
    bad = _bad(kind, fault, tmp_path)
    _good_task(tmp_path / "good_task.npz")
    good = {"G": tmp_path / "good_task.npz", "T": tmp_path / "good_table.csv"}
    good["T"].write_bytes(_real_bytes("table", tmp_path))
    out = tmp_path / "out"
    argv = [command.split()[0]] + [str(bad) if a == "F" else str(good[a]) if a in good
                                   else str(out / a) if a.startswith("O") else a
                                   for a in args]
    code, err = _run(argv, capsys)
    assert code == 2, err
    assert len(err) == 1 and str(bad) in err[0], err
    assert {"missing": f"{bad}: no such file", "empty": f"{bad}: empty file"}.get(
        fault, f"{bad}: ") in err[0] and "Traceback" not in err[0], err
    # a trainer's advisory lock beside its folder (dpaudit.locks) is no output
    written = [p for p in out.rglob("*") if not (p.name.startswith(".") and p.suffix == ".lock")]
    assert not written, written


MD_TEXT = "Title\n\n| eps_th | eps_lb |\n|---|---|\n| 4 | 0.90 |\n"


@pytest.mark.parametrize("fault", ["edited-number", "no-hash-line", "another-table",
                                   "hash-line-edited"])
def test_md_html_renders_only_the_markdown_of_the_table_given(fault, tmp_path, capsys):
    """A Markdown table ends in a line with its own hash and its table's: an edited number,
    a hand-written table, one of another table or an edited hash line are refused."""
    table, other, md = tmp_path / "t.csv", tmp_path / "u.csv", tmp_path / "t.md"
    digest = write_table(pd.DataFrame({"eps_th": [4], "eps_lb": [0.9]}), table, {"seed": 0})
    write_table(pd.DataFrame({"eps_th": [4], "eps_lb": [0.8]}), other, {"seed": 0})
    write_markdown(MD_TEXT, md, digest)
    html = tmp_path / "out" / "t.html"
    assert main(["md-html", "--md", str(md), "--table", str(table), "--out", str(html)]) == 0
    assert "<td>0.90</td>" in html.read_text()
    html.unlink()
    capsys.readouterr()
    given = table
    if fault == "edited-number":
        md.write_text(md.read_text().replace("0.90", "0.99"))
    elif fault == "no-hash-line":
        md.write_text(MD_TEXT)
    elif fault == "another-table":
        given = other
    else:
        md.write_text(md.read_text().replace('"md_sha256": "', '"md_sha256": "0'))
    code, err = _run(["md-html", "--md", str(md), "--table", str(given), "--out", str(html)],
                     capsys)
    assert code == 2 and len(err) == 1 and f"bad input file {md}: " in err[0], err
    assert {"edited-number": "its text does not match the hash recorded when it was written",
            "no-hash-line": "no hash line",
            "another-table": "renders another table than the one given",
            "hash-line-edited": "its text does not match the hash"}[fault] in err[0], err
    assert not html.exists()


def test_read_table_says_what_is_wrong(tmp_path):
    """The reason, per fault, from the shared reader (what the CLI prints after the path)."""
    cases = {"missing": "no such file", "empty": "empty file",
             # the header records the hash of the rows that were cut off
             "header-only": "no table after the provenance header|truncated since",
             "foreign": "not a text file"}
    for fault, words in cases.items():
        path = _bad("table", fault, tmp_path)
        with pytest.raises(BadInputFile, match=words) as err:
            read_table(path)
        assert err.value.path == str(path) and isinstance(err.value, ValueError)
    no_rows = tmp_path / "no_rows.csv"
    write_table(pd.DataFrame({"eps": []}), no_rows, {"seed": 0})
    with pytest.raises(BadInputFile, match="no rows"):
        read_table(no_rows)
    plain = tmp_path / "plain.csv"
    plain.write_text("eps,eps_lb\n1,0.5\n")
    with pytest.raises(BadInputFile, match="no provenance header"):
        read_table(plain)
    cut = tmp_path / "cut.csv"
    cut.write_text('# dpaudit-provenance: {"seed": 0, "spe\n')
    with pytest.raises(BadInputFile, match="not a JSON object"):
        read_table(cut)


def test_a_task_file_of_another_step_is_named_with_the_arrays_it_lacks(tmp_path, capsys):
    feats = tmp_path / "features.npz"
    save_features(feats, {"X": np.zeros((2, 3)), "y": np.zeros(2)}, {"command": "x"})
    code, err = _run([
        "onerun-audit", "--task", str(feats), "--spec", SPECS["onerun"], "--train",
        SPECS["onerun_train"], "--seed", "0", "--device", "cpu", "--out",
        str(tmp_path / "o.csv")], capsys)
    assert code == 2 and len(err) == 1 and str(feats) in err[0] and "'X_test'" in err[0], err


# ------------------------------------------------------------ well-formed, of another kind

REFERENCE = Path(__file__).parents[1] / "reference"
#: Table reader -> a well-formed table of another command it is given: a committed
#: reference table, or ``scores`` (a score table of jagielski-train, written here).
WRONG_KIND = {
    "hw3-plot": "tramer_audit.csv",
    "accounting-plot": "trials_needed.csv",
    "ridge-plot": "jagielski_fig2.csv",
    "jagielski-audit": "jagielski_fig2.csv",
    "jagielski-md": "trials_needed_summary.csv",
    "jagielski-plot": "scores",
    "trials-needed": "trials_needed.csv",
    "trials-needed-plot": "tramer_audit.csv",
    "tramer-reaudit": "jagielski_fig2.csv",
    "tramer-plot": "jagielski_table2.csv",
    "onerun-plot": "jagielski_table2.csv",
    "abadi-table": "tramer_audit_hist.csv",
    "abadi-plot": "trials_needed.csv",
}


def _wrong_kind(command: str, tmp: Path) -> Path:
    """The well-formed table of another command that :data:`WRONG_KIND` gives ``command``."""
    path = tmp / f"wrong_kind_{command}.csv"
    source = WRONG_KIND[command]
    if source == "scores":
        scores = pd.DataFrame({"side": ["out", "out", "in", "in"], "trial": [0, 1, 0, 1],
                               "loss": [0.3, 0.2, 0.1, 0.4], "test_acc": [0.8] * 4})
        write_table(scores, path, {"command": "jagielski-train", "seed": 0,
                                   "cell": {"attack": "mi"}, "spec": {"trials": 2, "ks": [1]}})
    else:
        path.write_bytes((REFERENCE / source).read_bytes())
    return path


def test_every_table_reader_has_a_wrong_kind_case():
    assert set(WRONG_KIND) == {c for c, (kind, _) in READERS.items() if kind == "table"}


@pytest.mark.parametrize("command", sorted(WRONG_KIND))
def test_a_table_of_another_command_is_named_with_the_columns_it_lacks(command, tmp_path,
                                                                       capsys):
    bad = _wrong_kind(command, tmp_path)
    table, prov = read_table(bad)  # well formed: only its kind is wrong
    out = tmp_path / "out"
    argv = [command] + [str(bad) if a == "F" else str(out / a) if a.startswith("O") else a
                        for a in READERS[command][1]]
    code, err = _run(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert f"bad input file {bad}: not a table of " in err[0], err
    assert err[0].endswith(f" (made by `dpaudit {prov['command']}`)"), err
    lacks = err[0].split(": it lacks column(s) ", 1)[1].rsplit(" (made by", 1)[0].split(", ")
    assert lacks and not set(lacks) & set(table.columns), (lacks, list(table.columns))
    # a trainer's advisory lock beside its folder (dpaudit.locks) is no output
    written = [p for p in out.rglob("*") if not (p.name.startswith(".") and p.suffix == ".lock")]
    assert not written, written


def test_read_table_names_the_columns_a_caller_needs(tmp_path):
    path = tmp_path / "t.csv"
    write_table(pd.DataFrame({"eps": [1.0], "eps_lb": [0.5]}), path, {"command": "ridge-audit"})
    table, _ = read_table(path, columns=["eps", "eps_lb"], what="ridge-audit")
    assert list(table.columns) == ["eps", "eps_lb"]
    with pytest.raises(BadInputFile) as err:
        read_table(path, columns=["rho", "eps", "delta", "rho"], what="hw3-audit")
    assert err.value.reason == ("not a table of hw3-audit: it lacks column(s) rho, delta "
                                "(made by `dpaudit ridge-audit`)")
    write_table(pd.DataFrame({"eps": [1.0]}), path, {"seed": 0})
    with pytest.raises(BadInputFile, match=r"lacks column\(s\) rho \(its provenance names no "
                                           r"command\)$"):
        read_table(path, columns=["rho"], what="hw3-audit")


@pytest.mark.parametrize("argv, name", [
    (["hw3-audit", "--grid", "eps", "--spec", "{}", "--seed", "0", "--out", "o.csv",
      "--threads", "0"], "--threads"),
    (["ridge-audit", "--spec", "{}", "--seed", "-1", "--out", "o.csv"], "--seed"),
    (["jagielski-train", "--task", "t.npz", "--dataset", "fmnist", "--arch", "lr", "--attack",
      "mi", "--cells", "[]", "--spec", "{}", "--seed", "0", "--out-dir", "o",
      "--block-trials", "0"], "--block-trials"),
    (["jagielski-init", "--dataset", "fmnist", "--arch", "fnn", "--task", "t.npz",
      "--hidden", "0", "--seed", "0", "--out", "o.pt"], "--hidden"),
    (["jagielski-train", "--task", "t.npz", "--dataset", "fmnist", "--arch", "lr", "--attack",
      "mi", "--cells", "[]", "--spec", "{}", "--seed", "0", "--out-dir", "o",
      "--save-models", "-2"], "--save-models"),
])
def test_bad_numeric_arguments_are_refused_by_the_parser(argv, name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {name}: " in err and "must be an integer >=" in err


# ----------------------------------------------------------------------------- data sets

def _spec(root, **kw) -> str:
    return _j({"root": str(root), "download": False, "cifar10_tarball": None,
               "cifar100_root": None, **kw})


def _fmnist_gz(root: Path) -> Path:
    """Fashion-MNIST as .gz copies in torchvision's raw folder; returns that folder."""
    raw = root / "FashionMNIST" / "raw"
    write_idx_gz(raw, fake_fmnist(np.random.default_rng(0)))
    return raw


def _data(dataset: str, spec: str, tmp_path: Path, capsys) -> tuple[int, list[str]]:
    code, err = _run(["data", "--dataset", dataset, "--data", spec, "--out",
                      str(tmp_path / "out.csv")], capsys)
    assert not any("Traceback" in line for line in err), err
    return code, err


def test_truncated_fmnist_gz_is_named_and_leaves_no_temporary_file(tmp_path, capsys):
    raw = _fmnist_gz(tmp_path / "root")
    gz = raw / f"{FMNIST_FILES[0]}.gz"
    gz.write_bytes(gz.read_bytes()[:-200])
    for _ in range(2):  # every attempt
        code, err = _data("fmnist", _spec(tmp_path / "root"), tmp_path, capsys)
        assert code == 2 and len(err) == 1 and str(gz) in err[0] and "truncated" in err[0], err
    assert sorted(p.name for p in raw.iterdir()) == sorted(f"{n}.gz" for n in FMNIST_FILES)
    assert not (tmp_path / "out.csv").exists()
    # the same from Debian's folder, which the data API takes as an argument
    root = tmp_path / "root2"
    root.mkdir()
    debian = _fmnist_gz(tmp_path / "deb")
    (debian / f"{FMNIST_FILES[2]}.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(BadInputFile, match="reinstall") as err:
        data.fmnist_raw(root, debian_dir=debian)
    assert err.value.path == str(debian / f"{FMNIST_FILES[2]}.gz")
    assert not [p for p in root.rglob("*") if p.is_file() and p.name.startswith(".")]


@pytest.mark.parametrize("cut", ["truncated", "labels-short", "not-idx"])
def test_truncated_idx_file_is_named(tmp_path, capsys, cut):
    raw = tmp_path / "root" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    arrays = fake_fmnist(np.random.default_rng(0))
    for name, arr in arrays.items():
        (raw / name).write_bytes(idx_bytes(arr))
    bad = raw / (FMNIST_FILES[1] if cut == "labels-short" else FMNIST_FILES[0])
    if cut == "truncated":
        bad.write_bytes(bad.read_bytes()[:1000])
    elif cut == "labels-short":
        bad.write_bytes(idx_bytes(arrays[FMNIST_FILES[1]][:-5]))
    else:
        bad.write_bytes(b"<html>not found</html>" * 100)
    code, err = _data("fmnist", _spec(tmp_path / "root"), tmp_path, capsys)
    assert code == 2 and len(err) == 1 and str(bad) in err[0], err
    assert {"truncated": "truncated IDX", "labels-short": "labels for the",
            "not-idx": "not an IDX file"}[cut] in err[0]


@pytest.mark.parametrize("fault", ["label-200", "real-size-altered"])
def test_altered_idx_file_is_refused(tmp_path, capsys, fault):
    """A label out of 0..9 in any IDX file, and a file of the official one's size whose
    bytes are not the official ones (its md5), are refused naming the file."""
    raw = tmp_path / "root" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    arrays = fake_fmnist(rng)
    if fault != "label-200":  # the test split at its real size: 10,000 items
        arrays["t10k-images-idx3-ubyte"] = rng.integers(0, 256, (10_000, 28, 28), np.uint8)
        arrays["t10k-labels-idx1-ubyte"] = rng.integers(0, 10, 10_000).astype(np.uint8)
    name = FMNIST_FILES[1 if fault == "label-200" else 2]
    if fault == "label-200":
        arrays[name][7] = 200
    for n, arr in arrays.items():
        (raw / n).write_bytes(idx_bytes(arr))
    assert (raw / FMNIST_FILES[2]).stat().st_size == (data.IDX_SIZES[FMNIST_FILES[2]]
                                                      if fault != "label-200" else 15_696)
    code, err = _data("fmnist", _spec(tmp_path / "root"), tmp_path, capsys)
    assert code == 2 and len(err) == 1 and str(raw / name) in err[0], err
    assert ("label 200 at item 7" if fault == "label-200" else
            "altered FashionMNIST file: the size of the official one but not its md5") in err[0]
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("dataset", ["fmnist", "cifar"])
def test_a_data_root_that_cannot_be_made_is_one_line(dataset, tmp_path, capsys):
    """Data decompressed, downloaded or unpacked into a root that cannot be made (under
    /proc, even for root): one line naming data.root, before anything is read."""
    tarball = tmp_path / "cifar10.tar.gz"
    tarball.write_bytes(b"checked after the root")
    spec = _spec("/proc/dpaudit/data", download=dataset == "fmnist",
                 cifar10_tarball=str(tarball) if dataset == "cifar" else None)
    code, err = _data(dataset, spec, tmp_path, capsys)
    assert code == 2 and len(err) == 1, err
    assert "data.root = /proc/dpaudit/data: must be a folder that exists or can be made and " \
           "written" in err[0] and "nothing can be made in /proc" in err[0], err


def test_decompressed_idx_files_have_the_umask_mode(tmp_path, capsys):
    _fmnist_gz(tmp_path / "root")
    old = os.umask(0o022)
    try:
        code, err = _data("fmnist", _spec(tmp_path / "root"), tmp_path, capsys)
    finally:
        os.umask(old)
    assert code == 0, err
    for name in FMNIST_FILES:
        mode = stat.S_IMODE((tmp_path / "root" / "FashionMNIST" / "raw" / name).stat().st_mode)
        assert mode == 0o644, (name, oct(mode))


def test_a_missing_data_root_without_download_is_refused_naming_the_key(tmp_path, capsys):
    typo = tmp_path / "dta"
    for dataset in ("fmnist", "mnist"):
        code, err = _data(dataset, _spec(typo), tmp_path, capsys)
        assert code == 2 and len(err) == 1, err
        assert f"data.root = {typo}: no such folder" in err[0], err
    assert not typo.exists()
    # the Debian fallback does not decompress into a mistyped root either
    with pytest.raises(data.DataNotFound, match="data.root"):
        data.fmnist_raw(typo, debian_dir=_fmnist_gz(tmp_path / "deb"))
    assert not typo.exists()


def _tarball(tmp_path: Path, mode: str = "w:gz") -> Path:
    tree = tmp_path / "tree"
    write_tree(tree, np.random.default_rng(1), per_class=20)
    tar = tmp_path / ("cifar.tar.gz" if mode == "w:gz" else "cifar.tar")
    with tarfile.open(tar, mode) as tf:
        tf.add(tree / "train", "train")
        tf.add(tree / "test", "test")
    return tar


def _flip_mid_header(tar: Path) -> None:
    """Alter a member header in the middle of an uncompressed tarball (tarfile reads a
    damaged header as the end of the archive)."""
    with tarfile.open(tar) as tf:
        members = tf.getmembers()
    offset = members[len(members) // 2].offset
    raw = bytearray(tar.read_bytes())
    raw[offset + 148:offset + 156] = b"99999999"  # the header checksum
    tar.write_bytes(bytes(raw))


@pytest.mark.parametrize("fault", ["truncated", "random", "flipped-gz", "flipped-tar",
                                   "no-test-folder"])
def test_a_bad_cifar_tarball_is_named_and_nothing_is_left(tmp_path, capsys, fault):
    tar = _tarball(tmp_path, "w" if fault == "flipped-tar" else "w:gz")
    raw = tar.read_bytes()
    if fault == "truncated":
        tar.write_bytes(raw[:len(raw) * 2 // 3])
    elif fault == "random":
        tar.write_bytes(np.random.default_rng(0).bytes(len(raw)))
    elif fault == "flipped-gz":
        mid = len(raw) // 2
        tar.write_bytes(raw[:mid] + bytes(b ^ 0xFF for b in raw[mid:mid + 16]) + raw[mid + 16:])
    elif fault == "flipped-tar":
        _flip_mid_header(tar)
    else:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            tf.add(tmp_path / "tree" / "train", "train")
        tar.write_bytes(buf.getvalue())
    root = tmp_path / "root"
    code, err = _data("cifar", _spec(root, cifar10_tarball=str(tar)), tmp_path, capsys)
    assert code == 2 and len(err) == 1 and str(tar) in err[0], err
    assert "data.cifar10_tarball" in err[0]
    if fault != "no-test-folder":
        assert "no top-level" not in err[0] and "not a readable tarball" in err[0], err
    assert not root.exists() or not list(root.iterdir())  # no half tree, no temporary folder


def test_a_corrupt_image_or_cifar_batch_is_named(tmp_path):
    root = tmp_path / "root"
    write_tree(root, np.random.default_rng(2))
    bad = root / "train" / "cat" / "0001.png"
    bad.write_bytes(bad.read_bytes()[:40])
    with pytest.raises(BadInputFile, match="not a readable image") as err:
        data.load_cifar10(root, train=True)
    assert err.value.path == str(bad)
    batches = tmp_path / "r2" / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    (batches / "data_batch_1").write_bytes(b"cut")
    with pytest.raises(BadInputFile, match="md5") as err:
        data.load_cifar10(tmp_path / "r2", train=True)
    assert err.value.path == str(batches)


def test_a_corrupt_data_file_in_a_training_job_is_named_with_exit_2(tmp_path, capsys):
    raw = _fmnist_gz(tmp_path / "root")
    with gzip.open(raw / f"{FMNIST_FILES[0]}.gz") as fh:
        whole = fh.read()
    (raw / f"{FMNIST_FILES[0]}.gz").write_bytes(gzip.compress(whole[:5000]))
    spec = {k: FMNIST[k] for k in jagielski.TASK_KEYS if k in FMNIST}
    code, err = _run(["jagielski-task", "--dataset", "fmnist", "--data", _spec(tmp_path / "root"),
                      "--spec", _j(spec), "--seed", "0", "--device", "cpu", "--out",
                      str(tmp_path / "task.npz")], capsys)
    bad = raw / FMNIST_FILES[0]
    assert code == 2 and len(err) == 1 and str(bad) in err[0] and "truncated IDX" in err[0], err
    assert not (tmp_path / "task.npz").exists()
