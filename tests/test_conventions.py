"""The Snakemake conventions a user relies on: named targets, start-up errors, the data
rule (profiles and cluster jobs: test_slurm.py; the report: test_workflow.py)."""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from test_workflow import ROOT, _fake_image_data, snakemake


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


def test_md_html_renders_the_pipe_table(tmp_path):
    from dpaudit.cli import main

    import pandas as pd

    from dpaudit.io import write_markdown, write_table

    md, table = tmp_path / "t.md", tmp_path / "t.csv"
    write_markdown("Title line\n\n| eps_th | fixed, C=1 |\n|---|---|\n"
                   "| 4 (1.55) | 0.90 (0.75) [0.41] |\n", md,
                   write_table(pd.DataFrame({"eps_th": [4]}), table, {"seed": 0}))
    assert main(["md-html", "--md", str(md), "--table", str(table), "--out",
                 str(tmp_path / "t.html")]) == 0
    page = (tmp_path / "t.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<p>Title line</p>" in page
    assert "<th>eps_th</th>" in page and "<td>0.90 (0.75) [0.41]</td>" in page


_WITHOUT = """
import atexit, runpy, sys

tried = []

class Refuse:  # torch, the accountants and scipy.stats cannot be imported in this process
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "dp_accounting") or name == "scipy.stats":
            tried.append(name)  # also where an ImportError would be caught
            raise ImportError(f"{name} imported at the workflow's start-up")

atexit.register(lambda: tried and print("IMPORTED", *tried, file=sys.stderr))
sys.meta_path.insert(0, Refuse())
sys.argv = ["snakemake", *sys.argv[1:]]
runpy.run_module("snakemake", run_name="__main__")
"""


def test_start_up_imports_neither_torch_nor_the_accountants(tmp_path):
    """Snakemake reads the whole workflow (every rule file, the config checks, the GPU
    count with the GPUs hidden) without importing torch or dp_accounting, which took about
    4 of its 5 seconds of start-up in every dry run, cluster job and test, or scipy.stats
    (a third of what was left: the bounds of dpaudit.experiments.jagielski)."""
    import os
    import subprocess
    import sys

    targets = ["reference", "all", "shuffle"]
    out = subprocess.run([sys.executable, "-c", _WITHOUT, "-s", str(ROOT / "Snakefile"), "-n",
                          "--cores", "1", "--directory", str(tmp_path), "--", *targets],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0 and "IMPORTED" not in out.stderr, out.stderr[-3000:]
    assert "rule tramer_audit:" in out.stdout and "rule shuffle_audit:" in out.stdout


def test_lazy_packages_give_each_public_name_from_its_module():
    """dpaudit.dpsgd and dpaudit.experiments.jagielski import their torch modules on first
    use (dpaudit.lazy), serving the names of their ``TYPE_CHECKING`` imports (which static
    tools read): every name of ``__all__`` is there, the object of its module; a name that
    is not is an AttributeError, as from any module."""
    import importlib

    from dpaudit import dpsgd, lazy
    from dpaudit.experiments import jagielski

    for package in (dpsgd, jagielski):
        where, submodules = lazy.type_checking_imports(
            Path(package.__file__).read_text(), package.__name__)
        assert set(where) <= set(package.__all__), package  # the rest imported eagerly:
        assert {n for n in package.__all__ if n not in where} <= set(vars(package)), package
        for name in package.__all__:
            assert name in dir(package), name
            if name in where:
                module = importlib.import_module(f"{package.__name__}.{where[name]}")
                assert getattr(package, name) is getattr(module, name), name
    assert dpsgd.philox is importlib.import_module("dpaudit.dpsgd.philox")
    with pytest.raises(AttributeError, match="module 'dpaudit.dpsgd' has no attribute 'nope'"):
        dpsgd.nope
    with pytest.raises(ValueError, match="only `from .module import name` lines, not "
                                         "'from .wide import logits as f'"):
        lazy.type_checking_imports("if TYPE_CHECKING:\n    from .wide import logits as f\n",
                                   "p")


#: What a command line's parser, the workflow's grid and a model's shape never import.
HEAVY = ("torch", "scipy", "statsmodels", "dp_accounting", "opacus")


@contextmanager
def fresh_dpaudit(refused=HEAVY):
    """dpaudit imported anew in this process while the packages ``refused`` cannot be
    (those loaded are hidden meanwhile); yields the names whose import was tried (also where
    an ImportError would be caught). ``sys.modules`` is as before afterwards."""
    tried = []

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in refused:
                tried.append(name)
                raise ImportError(f"{name} is refused here")

    saved = dict(sys.modules)
    for name in saved:
        if name.split(".")[0] in ("dpaudit", *refused):
            del sys.modules[name]
    finder = Refuse()
    sys.meta_path.insert(0, finder)
    try:
        yield tried
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - set(saved):
            del sys.modules[name]
        sys.modules.update(saved)


def test_command_lines_parse_without_torch_or_scipy(capsys):
    """Importing dpaudit.cli and building every subcommand's parser (what `dpaudit --help`
    and each job of the workflow do first), or reading the jagielski grid and a model's
    shape, imports neither torch nor scipy nor the accountants; each is seconds of every
    job's start-up. The names served on first use still come, with their imports."""
    import importlib

    with fresh_dpaudit() as tried:
        cli = importlib.import_module("dpaudit.cli")
        assert len(cli.build_parser()._actions[-1].choices) >= 30
        with pytest.raises(SystemExit):
            cli.main(["tight-plot", "--help"])
        jagielski = importlib.import_module("dpaudit.experiments.jagielski")
        dpsgd = importlib.import_module("dpaudit.dpsgd")
        assert jagielski.PAPER_TOL == 0.5 and dpsgd.ModelSpec.__name__ == "ModelSpec"
        assert tried == []
        with pytest.raises(ImportError):
            jagielski.eps_label  # .paper: scipy.stats, refused here
        assert tried[0].split(".")[0] == "scipy"
    assert "--out" in capsys.readouterr().out
    assert importlib.import_module("dpaudit.cli") is sys.modules["dpaudit.cli"] is not cli


def test_the_schema_read_fast_is_the_schema():
    """dpaudit.config reads the schema with libyaml's safe loader (every command line and
    Snakemake's start-up read it): the same dict as the pure-Python safe loader's."""
    from dpaudit import config

    assert config.schema() == yaml.safe_load(config.SCHEMA_PATH.read_text())


def test_dpaudit_help_starts_without_torch_or_scipy():
    """`dpaudit --help`, the console script as installed, lists every subcommand and
    imports none of :data:`HEAVY`."""
    import subprocess

    out = subprocess.run([sys.executable, "-X", "importtime", "-c",
                          "import sys; from dpaudit.cli import main; sys.argv[0] = 'dpaudit';"
                          " main(['--help'])"], capture_output=True, text=True, timeout=120)
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0]
                for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert out.returncode == 0 and "audit-impl" in out.stdout, out.stderr[-2000:]
    assert "dpaudit" in imported and not imported & set(HEAVY), imported & set(HEAVY)


#: A function longer than this many lines, or with more parameters than that, is split or
#: given a parameter object (a frozen dataclass): a newcomer reads it whole.
LONGEST, MOST_PARAMETERS = 80, 12
#: The functions allowed over either limit, as "module:function": (lines, parameters): none
#: now. An entry only ever shrinks: one that grows, or a new function over a limit, fails;
#: one that no longer exceeds its limits must leave it.
OVER_LIMITS: dict[str, tuple[int, int]] = {}


def _function_sizes() -> dict[str, tuple[int, int]]:
    """{"module:function": (lines, parameters)} of every function under src/dpaudit
    (methods as Class.method; ``self`` and ``cls`` not counted)."""
    import ast

    src = ROOT / "src" / "dpaudit"
    sizes = {}
    for path in sorted(src.rglob("*.py")):
        def visit(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    named = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
                    n = len(named) - bool(named[:1] in (["self"], ["cls"]) and prefix)
                    n += bool(a.vararg) + bool(a.kwarg)
                    name = f"{path.relative_to(src)}:{prefix}{child.name}"
                    sizes[name] = (child.end_lineno - child.lineno + 1, n)
                    visit(child, f"{prefix}{child.name}.")
        visit(ast.parse(path.read_text()), "")
    return sizes


def test_functions_stay_short_with_few_parameters():
    sizes = _function_sizes()
    over = {name: size for name, size in sizes.items()
            if size[0] > LONGEST or size[1] > MOST_PARAMETERS}
    grown = {name: (size, OVER_LIMITS.get(name)) for name, size in over.items()
             if name not in OVER_LIMITS or any(s > a for s, a in zip(size, OVER_LIMITS[name]))}
    assert not grown, f"over {LONGEST} lines or {MOST_PARAMETERS} parameters: {grown}"
    within = sorted(set(OVER_LIMITS) - set(over))
    assert not within, f"within the limits now (or gone): drop them from OVER_LIMITS: {within}"


def test_every_subcommand_module_and_rule_file_is_registered():
    """What a newcomer adds for a new step (docs/contributing.md) and forgets to
    register fails here, naming the line to add: a module of ``dpaudit.cli`` with a
    ``register`` function is in ``cli.COMMANDS``, a rule file is included by the
    Snakefile."""
    import importlib
    import pkgutil

    from dpaudit import cli

    modules = {importlib.import_module(f"dpaudit.cli.{m.name}")
               for m in pkgutil.iter_modules(cli.__path__)}
    commands = {m.__name__ for m in modules if hasattr(m, "register")}
    missing = sorted(commands - {m.__name__ for m in cli.COMMANDS})
    assert not missing, f"add {missing} to dpaudit.cli.COMMANDS (src/dpaudit/cli/__init__.py)"
    included = set(re.findall(r'^include: "(workflow/rules/[^"]+)"$',
                              (ROOT / "Snakefile").read_text(), re.M))
    rules = {f"workflow/rules/{p.name}" for p in (ROOT / "workflow" / "rules").glob("*.smk")}
    assert rules - included == set(), f"include them in the Snakefile: {sorted(rules - included)}"
    assert included - rules == set(), sorted(included - rules)
