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
