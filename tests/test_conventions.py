"""The Snakemake conventions a user relies on: profiles, the SLURM submission line, named
targets, start-up errors, the data rule (the report: tests/test_workflow.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from test_workflow import ROOT, _fake_image_data, snakemake


def snakemake_env(env: dict, *args):
    """:func:`test_workflow.snakemake` with the environment ``env``."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=env)

GPU_RULES = ("jagielski_task", "jagielski_train", "tramer_audit", "onerun_audit")
# Aggregation and plotting: run on the submitting host, never as cluster jobs.
LOCAL_RULES = ("data", "jagielski_fig2_table", "jagielski_table2_table",
               "jagielski_table2_html", "jagielski_plot", "onerun_many_model", "onerun_plot",
               "tramer_plot", "hw3_plot", "ridge_plot", "accounting_abadi_plot",
               "accounting_composition_plot", "trials_needed_table", "trials_needed_plot",
               "jagielski_reference_md")


def _jobs(dry_run: str) -> list[tuple[str, str, str]]:
    """(``rule`` or ``localrule``, rule name, block) of every job of a dry run."""
    return re.findall(r"^(rule|localrule) (\w+):\n(.*?)(?=\n\n|\Z)", dry_run, re.S | re.M)


def test_aggregation_and_plot_rules_are_local():
    """`localrule: True` on exactly these (a dry run does not tell local jobs apart; the
    sbatch test below sees one run locally under the SLURM executor)."""
    text = "\n".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    blocks = re.findall(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", text, re.S | re.M)
    assert {rule for rule, body in blocks if "    localrule: True" in body} == set(LOCAL_RULES)


def test_slurm_profile_keeps_its_cluster_settings(monkeypatch):
    """profiles/default is loaded on every run and wins key by key over --profile: it must
    not undo what the SLURM profile sets (latency-wait 60 s, not the local 5 s)."""
    from snakemake.cli import parse_args

    monkeypatch.chdir(ROOT)
    _, args = parse_args(["--profile", "profiles/slurm", "-n"])
    slurm = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    assert args.latency_wait == slurm["latency-wait"] == 60
    assert (args.executor, args.jobs, args.retries) == ("slurm", slurm["jobs"], slurm["retries"])
    assert args.printshellcmds and args.rerun_incomplete
    default = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert not set(default) & {"latency-wait", "jobs", "executor", "retries", "set-resources",
                               "default-resources", "resources"}
    _, local = parse_args(["-n"])  # the default profile alone
    assert local.executor is None and local.latency_wait == 5


def test_slurm_dry_run_gpu_rules_ask_for_a_gpu_4_cpus_and_a_partition(tmp_path):
    """Under the SLURM profile every GPU job asks for gpu=1, 4 CPUs per task and the GPU
    partition, even on a submitting host without a GPU; aggregation and plots are local."""
    out = snakemake("-n", "--profile", str(ROOT / "profiles/slurm"), "--directory",
                    str(tmp_path), "--configfile", str(ROOT / "config/quick.yaml"))
    assert out.returncode == 0, out.stderr
    seen = set()
    for kind, rule, block in _jobs(out.stdout):
        resources = re.search(r"resources: (.*)", block).group(1)
        if rule in GPU_RULES:
            seen.add(rule)
            assert kind == "rule", rule
            for item in ("gpu=1", "cpus_per_task=4", "slurm_partition=gpu"):
                assert item in resources.split(", "), (rule, resources)
        else:
            assert "gpu=" not in resources, (rule, resources)
    assert seen == set(GPU_RULES)


def _fake_slurm(bin_dir: Path) -> None:
    """An sbatch that records its command line and refuses the job, and SLURM query tools
    that fail (the plugin then proceeds without a guessed account)."""
    bin_dir.mkdir()
    for tool in ("sinfo", "sacct", "squeue", "sacctmgr", "sshare", "scontrol", "scancel"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "sbatch").write_text('#!/bin/sh\necho "sbatch $*" >> "$SBATCH_LOG"\n'
                                    'echo "test: not submitted" >&2\nexit 1\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)


@pytest.mark.slow
def test_slurm_plugin_sbatch_line_of_gpu_jobs(tmp_path):
    """The installed executor plugin turns the profile into the sbatch line: one GPU,
    --cpus-per-task=4 (the plugin prefers cpus_per_task to cpus_per_gpu) and the GPU
    partition. sbatch is a stub that records the call and refuses the job."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    run = tmp_path / "run"
    (run / "results/data").mkdir(parents=True)
    (run / "results/jagielski").mkdir()
    for i, path in enumerate(("results/data/fmnist.csv", "results/data/cifar.csv",
                              "results/jagielski/task_fmnist.npz",  # inputs, oldest first
                              "results/ridge_audit.csv")):
        (run / path).write_text("")
        os.utime(run / path, (1e9 + i, 1e9 + i))
    _fake_slurm(tmp_path / "bin")
    log = tmp_path / "sbatch.log"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "SBATCH_LOG": str(log)}
    targets = ["results/jagielski/task_cifar.npz", "results/onerun_dpsgd.csv",
               "results/tramer_audit.csv", "figures/ridge_audit.pdf"]
    out = snakemake_env(env, "--profile", str(ROOT / "profiles/slurm"), "--retries", "0",
                        "--keep-going", "--directory", str(run), "--configfile",
                        str(ROOT / "config/quick.yaml"), "--", *targets)
    assert out.returncode != 0  # every submission refused
    calls = {re.search(r"--comment rule_([a-z_]+?)(?:_wildcards|\s)", line).group(1): line
             for line in log.read_text().splitlines()}
    assert set(calls) == {"jagielski_task", "onerun_audit", "tramer_audit"}
    assert "localrule ridge_plot:" in out.stdout + out.stderr  # ran here, not submitted
    for rule, line in calls.items():
        args = line.split()
        assert "--gpus=1" in args, (rule, line)
        assert "--cpus-per-task=4" in args and not any(a.startswith("--cpus-per-gpu")
                                                       for a in args), (rule, line)
        assert args[args.index("-p") + 1] == "gpu", (rule, line)


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


def test_md_html_renders_the_pipe_table(tmp_path):
    from dpaudit.cli import main

    md = tmp_path / "t.md"
    md.write_text("Title line\n\n| eps_th | fixed, C=1 |\n|---|---|\n| 4 (1.55) | 0.90 (0.75) [0.41] |\n")
    assert main(["md-html", "--md", str(md), "--out", str(tmp_path / "t.html")]) == 0
    page = (tmp_path / "t.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<p>Title line</p>" in page
    assert "<th>eps_th</th>" in page and "<td>0.90 (0.75) [0.41]</td>" in page
