"""The Snakemake conventions a user relies on: named targets, start-up errors, the data
rule and the report (a tiny run of the whole DAG); profiles and cluster jobs: test_slurm.py."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
import yaml

from test_workflow import ROOT, _fake_image_data, load, snakemake, write_config


def _jobs(dry_run: str) -> list[tuple[str, str, str]]:
    """(``rule`` or ``localrule``, rule name, block) of every job of a dry run."""
    return re.findall(r"^(rule|localrule) (\w+):\n(.*?)(?=\n\n|\Z)", dry_run, re.S | re.M)


def test_config_typo_is_one_line(tmp_path):
    overlay = tmp_path / "typo.yaml"
    overlay.write_text("jagielski: {trails: 10}\n")
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path), "--configfile",
                    str(overlay))
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "invalid config: config.jagielski.trails: unknown key; allowed keys are [" in text
    assert "trials" in text.split("config.jagielski.trails")[1].splitlines()[0]
    assert len(text.splitlines()) < 15, text  # not a dump of the schema


def test_sdm_conda_is_refused_with_the_way_that_works(tmp_path):
    out = snakemake("-n", "--cores", "1", "--sdm", "conda", "--directory", str(tmp_path))
    assert out.returncode != 0
    assert "conda env create -f environment.yml" in out.stdout + out.stderr
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "dpaudit" and {"pip": ["-e ."]} in env["dependencies"]


def test_named_targets_after_the_separator(tmp_path):
    """`--configfile` takes several files: targets after it need `--`."""
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path), "--configfile",
                    str(ROOT / "config/quick.yaml"), "--", "tramer", "onerun")
    assert out.returncode == 0, out.stderr
    rules = {rule for _, rule, _ in _jobs(out.stdout)}
    assert {"tramer", "tramer_audit", "tramer_plot", "onerun", "onerun_audit"} <= rules
    assert "hw3_audit" not in rules


def test_data_rule_runs_once_per_data_set_before_its_readers(tmp_path):
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path), "--configfile",
                    str(ROOT / "config/quick.yaml"))
    assert out.returncode == 0, out.stderr
    jobs = _jobs(out.stdout)
    data = sorted(re.search(r"output: (.*)", b).group(1) for _, r, b in jobs if r == "data")
    assert data == ["results/data/cifar.csv", "results/data/fmnist.csv"]
    readers = {r: re.search(r"input: (.*)", b).group(1) for _, r, b in jobs
               if r in ("jagielski_task", "tramer_audit")}
    assert set(readers) == {"jagielski_task", "tramer_audit"}
    assert "results/data/fmnist.csv" in readers["tramer_audit"]
    for _, rule, block in jobs:
        if rule == "jagielski_task":
            dataset = re.search(r"wildcards: dataset=(\w+)", block).group(1)
            assert f"results/data/{dataset}.csv" in block


def test_data_cli_checks_local_copies_and_names_what_is_missing(tmp_path):
    import tarfile

    import numpy as np

    from dpaudit.cli import main
    from dpaudit.io import read_table
    from fakedata import write_tree

    _fake_image_data(tmp_path / "a")  # FMNIST in torchvision's layout + a CIFAR-10 tree
    spec = {"root": str(tmp_path / "a"), "download": False, "cifar10_tarball": None,
            "cifar100_root": None}
    assert main(["data", "--dataset", "fmnist", "--data", _json(spec), "--out",
                 str(tmp_path / "fmnist.csv")]) == 0
    df, meta = read_table(tmp_path / "fmnist.csv")
    assert meta["data"] == spec and list(df.n) == [120, 40] and list(df.split) == ["train", "test"]
    assert main(["data", "--dataset", "cifar", "--data", _json(spec), "--out",
                 str(tmp_path / "cifar.csv")]) == 0
    df, _ = read_table(tmp_path / "cifar.csv")
    assert list(df.data_set) == ["cifar10", "cifar10"] and list(df.n) == [180, 180]
    assert df.source.str.startswith("imagefolder:").all()

    # A tarball is unpacked once into an empty root.
    tree = tmp_path / "tree"
    write_tree(tree, np.random.default_rng(1), per_class=2)
    tarball = tmp_path / "cifar.tar.gz"
    with tarfile.open(tarball, "w:gz") as tf:
        tf.add(tree / "train", "train")
        tf.add(tree / "test", "test")
    spec_b = {**spec, "root": str(tmp_path / "b"), "cifar10_tarball": str(tarball)}
    assert main(["data", "--dataset", "cifar", "--data", _json(spec_b), "--out",
                 str(tmp_path / "b.csv")]) == 0
    assert list(read_table(tmp_path / "b.csv")[0].n) == [6, 6]
    assert (tmp_path / "b/train/cat").is_dir()

    # Offline and absent: one DataNotFound message naming where it looked, exit 2.
    empty = {**spec, "root": str(tmp_path / "empty")}
    assert main(["data", "--dataset", "cifar", "--data", _json(empty), "--out",
                 str(tmp_path / "c.csv")]) == 2
    assert not (tmp_path / "c.csv").exists()


def _json(value) -> str:
    import json

    return json.dumps(value)


def _tiny_config(tmp_path: Path) -> dict:
    """Every figure of the DAG at the smallest sizes that still run (seconds per job)."""
    _fake_image_data(tmp_path / "data")
    cfg = load("quick.yaml")
    cfg["data"].update(root=str(tmp_path / "data"), download=False)
    cfg["hw3"].update(repeats=1, grids={"eps": {"eps": [2, 8], "m": [100], "d": [100]},
                                        "m": {"eps": [8], "m": [50, 100], "d": [100]},
                                        "d": {"eps": [8], "m": [100], "d": [10, 100]}})
    cfg["accounting"]["abadi"].update(num_epochs=4, max_epochs=40)
    cfg["accounting"]["composition"].update(num_k=5, max_k=50)
    cfg["ridge"].update(n=40, d=40, m=40, lam=320.0, rho=[0.5, 5.0], repeats=1)
    jag = cfg["jagielski"]
    jag.update(trials=8, ks=[1, 2])
    jag["datasets"]["fmnist"].update(epochs=1, batch_size=10)
    jag["datasets"]["cifar"].update(epochs=1, batch_size=8, pretrain_epochs=1,
                                    pretrain_images=0)
    jag["fig2"].update(datasets=["fmnist"], archs=["lr"], eps=["4"], init=1.0)
    jag["table2"].update(clips=[1.0], inits=["fixed"], eps=["4"])
    cfg["trials_needed"].update(eps=["4"], n_min=4, n_points=2, subsamples=2)
    cfg["onerun"].update(eps=["4"], archs=["lr"], repeats=1, m=20, max_k=10,
                         canaries=["dirac"], init=1.0)
    cfg["tramer"].update(runs=40, val_runs=10, batch_runs=40, n_train=40)
    cfg["tramer"]["model"].update(epochs=2, batch_size=20)
    cfg["abadi"]["fig3"].update(n_train=100, n_test=0, pca_dims=8, hidden=8, lot_size=20,
                                max_epochs=1)
    cfg["abadi"]["fig6"].update(public_images=60, private_images=80, test_images=40,
                                hidden=[8], max_epochs=1,
                                levels=[{"name": n, "lot_size": 20, "eps": e}
                                        for n, e in (("eps2", 2.0), ("eps8", 8.0))])
    return cfg


@pytest.mark.slow
def test_report_holds_every_figure_with_its_caption(tmp_path):
    """A tiny run of the whole DAG, then `--report report.zip`: every figure of `all` (and
    Table 2 as an HTML table) is in it, with its caption rendered from the config."""
    conf = str(write_config(tmp_path, _tiny_config(tmp_path)))
    out = snakemake("--cores", "2", "--directory", str(tmp_path), "--configfile", conf,
                    timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    out = snakemake("--report", str(tmp_path / "report.zip"), "--directory", str(tmp_path),
                    "--configfile", conf)
    assert out.returncode == 0, out.stderr[-3000:]
    with zipfile.ZipFile(tmp_path / "report.zip") as zf:
        names = zf.namelist()
        index = next(zf.read(n).decode() for n in names if n.endswith("report.html"))
    figures = sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    assert len(figures) == 13
    for name in figures + ["jagielski_table2.html"]:
        assert any(n.endswith("/" + name) for n in names), name
    assert "<table" in (tmp_path / "results/jagielski_table2.html").read_text()
    # captions are rendered with the config: the tiny run's 8 trials, its Tramer claim
    assert "8 trials per side" in index and "0.21" in index
    assert "How to read a bound" in index


def test_md_html_renders_the_pipe_table(tmp_path):
    from dpaudit.cli import main

    md = tmp_path / "t.md"
    md.write_text("Title line\n\n| eps_th | fixed, C=1 |\n|---|---|\n| 4 (1.55) | 0.90 (0.75) [0.41] |\n")
    assert main(["md-html", "--md", str(md), "--out", str(tmp_path / "t.html")]) == 0
    page = (tmp_path / "t.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<p>Title line</p>" in page
    assert "<th>eps_th</th>" in page and "<td>0.90 (0.75) [0.41]</td>" in page
