"""Fault injection into the config: every numeric key of the schema given NaN, infinity, 0,
a negative and a huge value, and values that each pass the schema but conflict with other
keys or with the data. Each is refused at start-up (the schema validation of the Snakefile
and the cross-key check of ``dpaudit.experiments.checks``) with a message naming the key,
or accepted where the value means something (listed below with the reason)."""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpaudit.config import SpecError, schema, typed_from_text, validate_section
from dpaudit.experiments.checks import check_config

ROOT = Path(__file__).resolve().parents[1]
HUGE = 10**12

#: (key, value) -> why the start-up accepts it: values that mean something.
MEANINGFUL = {
    ("seed", 0): "any non-negative integer is a seed",
    ("seed", "huge"): "any non-negative integer is a seed",
    ("hw3.cache_mb", 0): "keeps no canaries between the passes (regenerates them)",
    ("hw3.cache_mb", "huge"): "keeps every canary block in memory (at most all of them)",
    ("hw3.max_m1", "huge"): "a cap on the guess count: above m/2 it does not bind",
    ("onerun.max_k", "huge"): "a cap on the guess count: above m/2 it does not bind",
    ("ridge.label_noise", 0): "noise-free labels",
    ("shuffle.mates", "negative"): "-1: Chua et al.'s batch mates, each -C along the canary",
    ("tramer.classes", 0): "Fashion-MNIST class 0 (T-shirt/top)",
    ("tramer.user.seed_check", 0): "skips the determinism re-check",
    ("tramer.user.max_diverged", 0): "no run may diverge (the default)",
    ("jagielski.datasets.fmnist.noise.inf", 0): "the label `inf` is training without noise",
    ("jagielski.datasets.cifar.noise.inf", 0): "the label `inf` is training without noise",
    ("jagielski.datasets.cifar.pretrain_images", 0): "pretrain on every image",
    ("abadi.fig3.n_train", 0): "all 60,000 training images",
    ("abadi.fig3.n_test", 0): "all 10,000 test images",
    ("abadi.fig3.train_eval_images", 0): "training accuracy on every training image",
    ("abadi.fig3.lr_decay_epochs", 0): "a constant learning rate",
    ("abadi.fig6.private_images", 0): "every CIFAR-10 training image not used as public",
    ("abadi.fig6.test_images", 0): "all 10,000 test images",
    ("abadi.fig6.train_eval_images", 0): "training accuracy on every private image",
}


def load(name: str) -> dict:
    """``config/config.yaml``, or an overlay merged over it as Snakemake merges them."""
    def merge(base, over):
        for key, value in over.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = value
        return base

    full = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    return full if name == "config.yaml" else merge(full, yaml.safe_load(
        (ROOT / "config" / name).read_text()))


def startup(cfg: dict) -> None:
    """What the workflow checks before any job runs: the schema, then the cross-key limits."""
    validate_section(typed_from_text(cfg))
    check_config(cfg)


def numeric_keys(node: dict, instance, path: tuple = ()):
    """``(path in the config, schema node)`` of every place the schema accepts a number,
    found from the schema itself: mapping keys, the first item of a list, every entry of
    a map (``additionalProperties``), the number branch of a ``oneOf``."""
    kinds = node.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    branches = [b for b in node.get("oneOf", []) if b.get("type") in ("number", "integer")]
    if {"number", "integer"} & set(kinds) or branches:
        yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from numeric_keys(sub, (instance or {}).get(key) if isinstance(instance, dict)
                                else None, (*path, key))
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and isinstance(instance, dict):
        for key in instance:
            yield from numeric_keys(extra, instance[key], (*path, key))
    if isinstance(node.get("items"), dict) and isinstance(instance, list) and instance:
        yield from numeric_keys(node["items"], instance[0], (*path, 0))


def dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path if not isinstance(p, int))


def with_value(cfg: dict, path: tuple, value) -> dict:
    cfg = copy.deepcopy(cfg)
    node = cfg
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return cfg


def refusal(cfg: dict) -> str | None:
    """The start-up's message for ``cfg``, with list indices dropped; None if accepted."""
    try:
        startup(cfg)
    except SpecError as err:
        return re.sub(r"\[[^\]]*\]", "", str(err))
    return None


def test_every_numeric_key_refuses_nan_inf_zero_negatives_and_huge_values_naming_itself():
    full = load("config.yaml")
    startup(full)
    keys = {dotted(p) for p, _ in numeric_keys(schema(), full)}
    assert {"seed", "hw3.grids.m.d", "jagielski.datasets.cifar.noise.16",  # the walk's reach
            "jagielski.table2.inits", "abadi.fig6.levels.lot_size", "tramer.model.hidden",
            "accounting.composition.eps0"} <= keys and len(keys) > 100
    wrong = []
    for path, node in numeric_keys(schema(), full):
        integer = "integer" in str(node.get("type"))
        for name, value in (("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf),
                            (0, 0), ("negative", -1), ("huge", HUGE if integer else 1e12)):
            key = dotted(path)
            message = refusal(with_value(full, path, value))
            if (key, name) in MEANINGFUL:
                if message is not None:
                    wrong.append(f"{key}={value!r} is meaningful but refused: {message}")
            elif message is None:
                wrong.append(f"{key}={value!r} accepted")
            elif key not in message:
                wrong.append(f"{key}={value!r} refused without naming the key: {message}")
            elif name in ("nan", "inf", "-inf") and "finite" not in message:
                wrong.append(f"{key}={value!r}: the message does not say finite: {message}")
    assert not wrong, "\n".join(wrong)


def test_non_finite_numbers_given_as_config_text_are_refused_as_such():
    """`--config` text: Snakemake reads a top-level `nan` as a float and every nested value
    as text; `.nan`, `inf` and a number too large for a float are refused as not finite."""
    from snakemake.cli import parse_config

    given = parse_config(["hw3={delta: .nan}", "ridge={lam: 1e999}",
                          "accounting={abadi: {sigma: inf}}", "tramer={eps: -.inf}"])
    for key, text in (("hw3.delta", ".nan"), ("ridge.lam", "1e999"),
                      ("accounting.abadi.sigma", "inf"), ("tramer.eps", "-.inf")):
        section, *rest = key.split(".")
        part = {section: copy.deepcopy(given[section])}
        cfg = load("config.yaml")
        node, value = cfg[section], part[section]
        for k in rest[:-1]:
            node, value = node[k], value[k]
        node[rest[-1]] = value[rest[-1]]
        with pytest.raises(SpecError, match=rf"config\.{re.escape(key)}=.*must be a finite"):
            startup(cfg)
    assert math.isnan(parse_config(["seed=nan"])["seed"])  # Snakemake's reading
    with pytest.raises(SpecError, match=r"config\.seed=nan: must be a finite"):
        startup({**load("config.yaml"), **parse_config(["seed=nan"])})


@pytest.mark.parametrize("key,value,words", [
    ("abadi.fig3.lot_size", 2001, ["abadi.fig3.lot_size", "abadi.fig3.n_train=2000"]),
    ("abadi.fig3.pca_dims", 785, ["abadi.fig3.pca_dims", "maximum of 784"]),
    ("abadi.fig6.levels.0.lot_size", 1501, ["abadi.fig6.levels[0].lot_size", "1500"]),
    ("jagielski.datasets.fmnist.batch_size", 6001,
     ["jagielski.datasets.fmnist.batch_size", "<= 6000"]),
    ("tramer.model.batch_size", 501, ["tramer.model.batch_size", "tramer.n_train=500"]),
    ("tramer.n_train", 6001, ["tramer.n_train", "<= 6000"]),
    ("jagielski.select_frac", 0.01, ["jagielski.select_frac", "jagielski.trials=40"]),
    ("abadi.fig3.max_epochs", 10**12, ["abadi.fig3.max_epochs", "maximum of 10000"]),
    ("accounting.abadi.max_epochs", 1e12, ["accounting.abadi.max_epochs", "maximum"]),
    ("accounting.abadi.sample_rate", 1e-6, ["accounting.abadi.max_epochs / sample_rate"]),
    ("accounting.abadi.sigma", 1e-6, ["accounting.abadi.sigma", "minimum of 0.5"]),
    ("tramer.user.spec", "{arch: lr}", ["tramer.user.spec", "not JSON"]),
    ("tramer.user.spec", "[1, 2]", ["tramer.user.spec", "JSON object"]),
    ("trials_needed.n_min", 41, ["trials_needed.n_min", "jagielski.trials=40"]),
    ("accounting.composition.num_k", 51, ["accounting.composition.num_k",
                                          "accounting.composition.max_k=50"]),
    ("hw3.grids.eps.eps", [1e308], ["hw3.grids.eps.eps[0]", "maximum of 100"]),
    ("jagielski.datasets.fmnist.lr", 1e30, ["jagielski.datasets.fmnist.lr", "maximum"]),
    ("jagielski.datasets.cifar.pretrain_images", 10**9,
     ["jagielski.datasets.cifar.pretrain_images", "maximum of 50000"]),
    ("ridge.m", 201, ["ridge.m", "ridge.d=200"]),
    ("hw3.grids.m", {"eps": [16], "m": [10**6], "d": [10**5]},
     ["hw3.grids.m.m x hw3.grids.m.d = 1e+11", "<= 1e+10"]),
    ("jagielski.datasets.fmnist.noise.4", 0, ["jagielski.datasets.fmnist.noise.4=0", "> 0"]),
    ("onerun.m", 1569, ["onerun.m", "1568", "lr model"]),
    ("abadi.fig6.sigma", 0, ["abadi.fig6.levels[0].eps", "null"]),
])
def test_values_that_conflict_with_other_keys_or_the_data_are_refused_naming_them(
        key, value, words):
    cfg = load("quick.yaml")
    cfg["accounting"]["composition"]["max_k"] = 50
    cfg = with_value(cfg, tuple(int(p) if p.isdigit() else p for p in key.split(".")), value)
    with pytest.raises(SpecError) as err:
        startup(cfg)
    for word in words:
        assert word in str(err.value), str(err.value)


ONE_EPOCH = {"arch": "lr", "batch_size": 5, "steps_per_epoch": 20, "epochs": 1, "eps": 2}


@pytest.mark.parametrize("overlay,words", [
    ({"shuffle": {"settings": [{**ONE_EPOCH, "batch_size": 100, "steps_per_epoch": 100}]}},
     ["shuffle.settings[0]: batch_size x steps_per_epoch = 10000: must be <= 6000"]),
    ({"shuffle": {"subjects": ["shuffle-once"], "settings": [ONE_EPOCH]}},
     ["shuffle.subjects: [shuffle-once] alone must come with a setting of epochs > 1"]),
    ({"shuffle": {"select_frac": 0.001}},
     ["shuffle.select_frac=0.001 of shuffle.runs=400: must leave at least one run per side"]),
    ({"shuffle": {"settings": [{**ONE_EPOCH, "runs": 4}], "select_frac": 0.2}},
     ["shuffle.select_frac=0.2 of shuffle.settings[0].runs=4"]),
    ({"tight": {"runs": 4, "select_frac": 0.1}},
     ["tight.select_frac=0.1 of tight.runs=4: must leave at least one run per side"]),
    ({"tramer": {"runs": 5}},
     ["tramer.runs=5: must be >= 40, the fewest evaluation runs per side at which even a "
      "perfect attack refutes the claim eps=0.21, delta=1e-05 at confidence 1 - "
      "tramer.alpha=1e-10"]),
    ({"tramer": {"user": {"runs": 39}}}, ["tramer.user.runs=39: must be >= 40"]),
    ({"tramer": {"user": {"train": "nomodule:train"}}},
     ["tramer.user.train='nomodule:train': must name an importable module; 'nomodule' is "
      "not found on the Python path"]),
    ({"tramer": {"user": {"train": "dpaudit.nomodule:train"}}},
     ["'dpaudit.nomodule' is not found"]),
    ({"tramer": {"user": {"train": "nomodule.sub:train"}}}, ["'nomodule.sub' is not found"]),
    ({"tramer": {"user": {"train": "nocolon"}}},
     ["tramer.user.train='nocolon': must be 'module.path:function' or one of"]),
    ({"tramer": {"n_train": 5800, "user": {"mode": "worst-case-init"}}},
     ["tramer.n_train + tramer.user.n_aux = 6300: must be <= 6000"]),
    ({"tramer": {"user": {"mode": "worst-case-init", "n_aux": 5600}}},
     ["tramer.n_train + tramer.user.n_aux = 6100: must be <= 6000"]),
    ({"tramer": {"val_runs": 1}}, ["tramer.val_runs=1", "minimum of 2"]),
    ({"tramer": {"user": {"val_runs": 1}}}, ["tramer.user.val_runs=1", "minimum of 2"]),
])
def test_overlays_refused_only_when_their_job_ran_are_refused_at_start_up(overlay, words):
    """Cross-key limits that once stopped a job after its start (or after training):
    checked at start-up, naming the keys; the overlay's other keys keep quick.yaml's."""
    cfg = load("quick.yaml")

    def merge(base, over):
        for key, value in over.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = value
    merge(cfg, copy.deepcopy(overlay))
    with pytest.raises(SpecError) as err:
        startup(cfg)
    for word in words:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize("eps, delta, alpha", [(0.21, 1e-5, 1e-10), (2.0, 1e-5, 0.05),
                                               (8.0, 0.0, 0.01)])
def test_the_runs_a_claim_needs_are_the_closed_forms(eps, delta, alpha):
    """A perfect attack on n runs per side certifies ln((p - delta) / (1 - p)) with
    p = (alpha/2)^(1/n), the Clopper-Pearson ends of n of n and 0 of n: the start-up's
    least n is the first at which that exceeds the claim (40 for the paper's claim)."""
    from dpaudit.bounds import perfect_eps_lb, runs_to_exceed

    def closed(n):
        p = (alpha / 2) ** (1 / n)
        return math.log((p - delta) / (1 - p)) if p > delta else -math.inf

    need = runs_to_exceed(eps, delta, alpha)
    assert closed(need) > eps >= closed(need - 1)
    # scipy's beta quantiles against the closed form
    assert perfect_eps_lb(need, delta, alpha) == pytest.approx(closed(need), rel=1e-6)
    if eps == 0.21:
        assert need == 40


def test_start_up_finds_user_modules_without_importing_them(tmp_path, monkeypatch):
    """A module on the path is accepted without being run (its code could be slow or import
    torch), a registry subject by name; the registry list is the subjects module's."""
    from dpaudit import subjects
    from dpaudit.experiments.checks import USER_REGISTRY

    assert sorted(USER_REGISTRY) == sorted(subjects.SUBJECTS)
    (tmp_path / "mytrainer.py").write_text("raise SystemExit('imported at start-up')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for train in ("mytrainer:train", "half-noise", "dpaudit.subjects:dpsgd_fixed"):
        cfg = load("quick.yaml")
        cfg["tramer"]["user"]["train"] = train
        startup(cfg)
    assert "mytrainer" not in sys.modules


def test_one_run_comparison_reads_cells_the_training_grids_train():
    """With `compare_many_model`, each one-run eps label and the init are ones Figure 2 or
    Table 2 trains; both configs compare Figure 2's own FMNIST ClipBKD cells (quick: at
    the fixed initialisation), which the training jobs train anyway."""
    from dpaudit.experiments import jagielski

    quick = load("quick.yaml")
    startup(quick)
    for cfg, init in ((quick, "fixed"), (load("config.yaml"), "g1")):
        jag = cfg["jagielski"]
        grid = jagielski.grid_cells(jag, cfg["onerun"])
        assert {c[3] for c in grid["onerun"]} == {init}
        assert {c[2] for c in grid["onerun"]} == {float(jag["fig2"]["clip"])}
        assert set(grid["onerun"]) <= set(grid["fig2"])
        assert grid["all"] == jagielski.grid_cells(jag)["all"]  # no extra training
    cfg = with_value(quick, ("onerun", "eps"), ["8", "inf"])
    with pytest.raises(SpecError, match=r"onerun\.eps: \['8'\].*onerun\.compare_many_model"):
        startup(cfg)
    startup(with_value(cfg, ("onerun", "compare_many_model"), False))
    # an init no grid trains: refused, naming the keys
    cfg = with_value(quick, ("onerun", "init"), 0.5)
    with pytest.raises(SpecError, match=r"onerun\.init=0\.5: not jagielski\.fig2\.init "
                       r"\(fixed\) or one of jagielski\.table2\.inits \(\['fixed', 1\.0\]\)"):
        startup(cfg)
    startup(with_value(cfg, ("onerun", "compare_many_model"), False))
    startup(with_value(quick, ("onerun", "init"), 1.0))  # Table 2's Glorot x 1 cells


def test_the_workflow_stops_at_start_up_on_a_cross_key_conflict(tmp_path):
    overlay = tmp_path / "bad.yaml"
    overlay.write_text(yaml.safe_dump({
        "jagielski": {"select_frac": 0.01}, "trials_needed": {"n_min": 50},
        "shuffle": {"subjects": ["shuffle-once"],
                    "settings": [{**ONE_EPOCH, "batch_size": 100, "steps_per_epoch": 100}]},
        "tramer": {"runs": 5, "user": {"train": "nomodule:train"}}}))
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-n", "--cores", "1",
         "--directory", str(tmp_path), "--configfile", str(ROOT / "config" / "quick.yaml"),
         str(overlay)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "invalid config: jagielski.select_frac=0.01 of jagielski.trials=40" in text, text
    assert "trials_needed.n_min=50: must be <= jagielski.trials=40" in text, text
    for line in ("shuffle.settings[0]: batch_size x steps_per_epoch = 10000: must be <= 6000",
                 "shuffle.subjects: [shuffle-once] alone must come with a setting of epochs > 1",
                 "tramer.runs=5: must be >= 40",
                 "tramer.user.train='nomodule:train': must name an importable module"):
        assert line in text, text
