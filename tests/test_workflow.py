"""The Snakemake workflow: lint, config validation, DAGs, the slurm profile, end to end.

Snakemake is run as ``python -m snakemake`` in a subprocess (its Python API changes
between releases), with ``--directory`` pointing at a temporary folder.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpaudit.io import read_table

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ["hw3_eps_vs_eps", "hw3_eps_vs_m", "hw3_eps_vs_d", "abadi_fig2", "composition",
           "ridge_audit", "jagielski_fig2", "jagielski_table2", "tramer_canary_losses"]


def snakemake(*args, cwd=ROOT, timeout=900):
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                           *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())


def write_config(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_lint_is_clean():
    out = snakemake("--lint")
    assert out.returncode == 0, out.stderr
    assert "Lints for" not in out.stdout + out.stderr


def test_every_figure_has_a_target_in_the_full_dag(tmp_path):
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path))
    assert out.returncode == 0, out.stderr
    for name in FIGURES:
        assert f"figures/{name}.pdf" in out.stdout, name


@pytest.mark.parametrize("cfg", ["config.yaml", "quick.yaml"])
def test_configs_validate_against_schema(cfg):
    import jsonschema

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    jsonschema.validate(load(cfg), schema)


@pytest.mark.parametrize("path,value,words", [
    (("ridge", "lam"), -1.0, ["lam", "0"]),
    (("ridge", "bogus"), 1, ["bogus"]),
    (("seed",), "zero", ["seed", "integer"]),
])
def test_bad_config_stops_naming_the_key(tmp_path, path, value, words):
    cfg = load("quick.yaml")
    section = cfg
    for key in path[:-1]:
        section = section[key]
    section[path[-1]] = value
    out = snakemake("-n", "--cores", "1", "--directory", str(tmp_path),
                    "--configfile", str(write_config(tmp_path, cfg)))
    assert out.returncode != 0
    for word in words:
        assert word in out.stdout + out.stderr


def test_slurm_profile_dry_run(tmp_path):
    out = snakemake("-n", "--profile", str(ROOT / "profiles" / "slurm"), "--directory",
                    str(tmp_path), "--configfile", str(ROOT / "config" / "quick.yaml"))
    assert out.returncode == 0, out.stderr
    assert "figures/ridge_audit.pdf" in out.stdout


def test_single_figure_target_end_to_end(tmp_path):
    """One figure and what it needs, and nothing else; the table records config and seed."""
    cfg = load("quick.yaml")
    cfg["seed"] = 7
    cfg["ridge"].update(n=40, d=40, m=40, lam=320.0, rho=[0.5, 5.0], repeats=1)
    # targets before --configfile, which takes several values
    out = snakemake("figures/ridge_audit.pdf", "--cores", "2", "--directory", str(tmp_path),
                    "--configfile", str(write_config(tmp_path, cfg)))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "figures/ridge_audit.pdf").stat().st_size > 0
    assert (tmp_path / "figures/ridge_audit.png").stat().st_size > 0
    df, meta = read_table(tmp_path / "results/ridge_audit.csv")
    assert meta["seed"] == 7 and meta["spec"]["rho"] == [0.5, 5.0]
    assert sorted(df.rho.unique()) == [0.5, 5.0]
    assert not (tmp_path / "figures/hw3_eps_vs_m.pdf").exists()
    rerun = snakemake("figures/ridge_audit.pdf", "-n", "--cores", "1", "--directory",
                      str(tmp_path), "--configfile", str(write_config(tmp_path, cfg)))
    assert "Nothing to be done" in rerun.stdout + rerun.stderr
