"""dpaudit.config: the report's check that the results at hand were made with the config
that captions them, and nested ``--config`` values read back as the schema wants."""
import copy

import pandas as pd

from dpaudit.config import results_mismatch
from dpaudit.io import write_table


def test_results_mismatch_compares_nested_spec_keys_and_recorded_levels(tmp_path):
    """Every value a caption quotes is compared key by key, nested sections and an Abadi
    level included; the same values recorded as 2.0 and given as 2 are equal."""
    jag = {"trials": 40, "alpha": 0.01, "ks": [1, 4],
           "fig2": {"init": "fixed", "eps": ["4", "inf"], "clip": 1.0},
           "datasets": {"fmnist": {"epochs": 4, "noise": {"4": 1.55, "inf": 0.0}}}}
    fig2, level_table = tmp_path / "fig2.csv", tmp_path / "fig6_eps2.csv"
    write_table(pd.DataFrame({"trials": [40, 40]}), fig2, {"seed": 0, "spec": jag})
    write_table(pd.DataFrame({"epoch": [0]}), level_table,
                {"seed": 0, "level": {"name": "eps2", "lot_size": 100, "eps": 2.0},
                 "spec": {"delta": 1e-5, "lr": 0.5}})
    config = {"seed": 0, "jagielski": copy.deepcopy(jag),
              "abadi": {"delta": 1e-5, "fig6": {"lr": 0.5, "levels": [
                  {"name": "eps2", "lot_size": 100, "eps": 2}]}}}
    level = config["abadi"]["fig6"]["levels"][0]

    def tables():
        return {str(fig2): ("jagielski", {"trials": "trials"}),
                str(level_table): ("abadi.fig6", {}, {
                    "level": ("abadi.fig6.levels.eps2", level),
                    "spec.delta": ("abadi.delta", config["abadi"]["delta"])})}

    assert results_mismatch(config, tables()) == []
    config["jagielski"].update(ks=[1, 2, 8], trials=50)
    config["jagielski"]["fig2"].update(init=2.0, eps=["1", "8"])
    config["jagielski"]["datasets"]["fmnist"]["epochs"] = 24
    level.update(lot_size=999, eps=3)
    config["abadi"]["delta"] = 1e-6
    assert sorted(results_mismatch(config, tables())) == sorted([
        f"jagielski.ks: [1, 4] in {fig2}, [1, 2, 8] in this config",
        f"jagielski.trials: 40 in {fig2}, 50 in this config",
        f"jagielski.fig2.init: 'fixed' in {fig2}, 2.0 in this config",
        f"jagielski.fig2.eps: ['4', 'inf'] in {fig2}, ['1', '8'] in this config",
        f"jagielski.datasets.fmnist.epochs: 4 in {fig2}, 24 in this config",
        f"abadi.fig6.levels.eps2.lot_size: 100 in {level_table}, 999 in this config",
        f"abadi.fig6.levels.eps2.eps: 2.0 in {level_table}, 3 in this config",
        f"abadi.delta: 1e-05 in {level_table}, 1e-06 in this config",
    ])


def test_nested_config_text_is_read_only_where_the_schema_type_asks():
    """Snakemake passes nested `--config` values as text: null and ~ become None where the
    schema allows null, numbers are read by their plain spellings only (no YAML 1.1 0x10
    or 1_000), and an enum without a type keeps the text (and then fails validation)."""
    import pytest
    from snakemake.cli import parse_config

    from dpaudit.config import SpecError, subset_schema, typed_from_text, validate_section

    given = parse_config(["data={cifar10_tarball: null, cifar100_root: ~, download: false}",
                          "jagielski={trials: 0x10, alpha: 1e-2, fig2: {init: '2.5'}}",
                          "tramer={batch_runs: 1_000}", "abadi={device: 0}"])
    cfg = typed_from_text(given)
    assert cfg["data"] == {"cifar10_tarball": None, "cifar100_root": None, "download": False}
    assert cfg["jagielski"]["alpha"] == 0.01 and cfg["jagielski"]["fig2"]["init"] == 2.5
    assert cfg["jagielski"]["trials"] == "0x10" and cfg["tramer"]["batch_runs"] == "1_000"
    assert cfg["abadi"]["device"] == "0"
    for section, key in (("jagielski", "trials"), ("tramer", "batch_runs"), ("abadi", "device")):
        with pytest.raises(SpecError, match=f"{section}.{key}="):
            validate_section({key: cfg[section][key]}, section,
                             schema_node=subset_schema([key], section))


def test_start_up_runs_check_equals_the_bounds():
    """The start-up check's scipy-free count of runs a perfect attack needs is the bounds'
    (dpaudit.bounds.runs_to_exceed, by Clopper-Pearson) wherever it is below 10^8."""
    from dpaudit.bounds import runs_to_exceed
    from dpaudit.experiments.checks import perfect_attack_runs

    for eps in (0.01, 0.21, 1, 2, 4, 8):
        for delta in (0, 1e-5, 1e-3, 0.1):
            for alpha in (1e-10, 1e-3, 0.05, 0.5):
                assert perfect_attack_runs(eps, delta, alpha) == runs_to_exceed(eps, delta, alpha)
