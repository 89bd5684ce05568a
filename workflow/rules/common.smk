# Shared helpers for the rule files.  Rules call the `dpaudit` CLI with their config
# section as JSON (`--spec`) and write into results/ and figures/.
import json
import shlex

# Every rule file appends the figures (PDF; a PNG is written beside each) it renders.
FIGURES = []
ENV = "../../environment.yml"


def quoted_json(value):
    """`value` as a shell-quoted JSON string."""
    return shlex.quote(json.dumps(value, sort_keys=True))


def spec(*keys, **extra):
    """The config section at `keys` (plus `extra`) as a shell-quoted JSON string."""
    section = config
    for key in keys:
        section = section[key]
    return quoted_json({**section, **extra})


# `dpaudit audit-impl` options for the data section (Fashion-MNIST).
DATA_ARGS = " ".join(
    ([f"--data-root {shlex.quote(config['data']['root'])}"] if config["data"]["root"] else [])
    + (["--download"] if config["data"]["download"] else [])
)


# ---- Jagielski et al. (workflow/rules/jagielski.smk) ----
from dpaudit.cli.jagielski import init_label

JAG = config["jagielski"]


def _check_eps_labels(where, dataset, labels):
    noise = JAG["datasets"][dataset]["noise"]
    for label in labels:
        if label not in noise:
            raise ValueError(
                f"config jagielski.{where}.eps: {label!r} is not a key of "
                f"jagielski.datasets.{dataset}.noise (allowed: {sorted(noise)})"
            )


def jag_cell(dataset, arch, clip, init, eps, attack):
    """Score table of one cell (see rule jagielski_train)."""
    return (
        f"results/jagielski/scores/{dataset}_{arch}_c{float(clip):g}_{init_label(init)}"
        f"_e{eps}_{attack}.csv"
    )


def _train_spec(wc):
    ds = JAG["datasets"][wc.dataset]
    if wc.eps not in ds["noise"]:
        raise ValueError(
            f"eps label {wc.eps!r} is not a key of jagielski.datasets.{wc.dataset}.noise"
            f" (allowed: {sorted(ds['noise'])})"
        )
    keys = ("trials", "ks", "sampling", "clipbkd_d0")
    return quoted_json(
        {
            **{k: JAG[k] for k in keys},
            **{k: ds[k] for k in ("epochs", "batch_size", "lr", "hidden")},
            "noise": ds["noise"][wc.eps],
        }
    )


def _train_inputs(wc):
    inputs = {"task": f"results/jagielski/task_{wc.dataset}.npz"}
    if wc.init == "fixed":
        inputs["init"] = f"results/jagielski/init_{wc.dataset}_{wc.arch}.pt"
    return inputs
