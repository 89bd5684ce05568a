"""The grid of Jagielski et al. 2020: its cells, the config keys of its jobs, its paths."""

from __future__ import annotations

ATTACKS = ("mi", "backdoor", "clipbkd")
DATASETS = ("fmnist", "cifar")
#: Statistic columns of a score table, by attack (the first is the attack's primary one).
STATISTICS = {"mi": ("mi",), "backdoor": ("backdoor",), "clipbkd": ("clipbkd", "clipbkd_logit")}
#: Keys of ``jagielski-train --spec``: what a job's models depend on (the rule passes only
#: these; ``noise``: the multiplier of each eps label the job trains; ``matmul_precision``
#: from the ``jagielski`` section, the rest before ``hidden`` too, the others from the data
#: set's).
TRAIN_KEYS = ("trials", "ks", "sampling", "clipbkd_d0", "epochs", "batch_size", "lr", "hidden",
              "noise", "matmul_precision")
#: Keys of a data set's section that its task depends on (``jagielski-task --spec``).
TASK_KEYS = ("clipbkd_norm", "pretrain_epochs", "pretrain_images")
#: Keys of ``jagielski-audit --spec``.
AUDIT_KEYS = ("alpha", "delta", "select_frac")
#: Keys of the ``jagielski`` section that a Figure 2 or Table 2 table records besides
#: :data:`AUDIT_KEYS` (with its own grid, ``fig2`` or ``table2``): what its cells were
#: trained with, which ``snakemake --report`` compares with the config its captions quote.
MADE_WITH_KEYS = ("trials", "ks", "sampling", "clipbkd_d0", "matmul_precision", "datasets")
#: Distance from the paper's value within which a Table 2 cell counts as reproduced
#: (:mod:`.paper`; here, torch- and scipy-free, for ``jagielski-md --tolerance``'s default).
PAPER_TOL = 0.5


def init_label(value) -> str:
    """File-name form of a config init: ``fixed`` or ``g<s>`` (Glorot-normal weights times s);
    a label is returned as it is."""
    if value == "fixed" or (isinstance(value, str) and value.startswith("g")):
        return value
    return f"g{float(value):g}"


def group_dir(dataset: str, arch: str, attack: str) -> str:
    """Folder of a training group's score tables (an output of the workflow's
    ``jagielski_train``): one group is every cell of one data set, model and attack, the
    cells whose models share their seeds, hence their batches and noise draws."""
    return f"results/jagielski/scores/{dataset}_{arch}_{attack}"


def group_dirs(cells) -> list[str]:
    """The group folders holding ``cells`` (tuples as in :func:`grid_cells`)."""
    return sorted({group_dir(c[0], c[1], c[5]) for c in cells})


def cell_file(clip, init, eps: str) -> str:
    """File name of a cell's score table in its group's folder."""
    return f"c{float(clip):g}_{init_label(init)}_e{eps}.csv"


def cell_path(dataset: str, arch: str, clip, init, eps: str, attack: str) -> str:
    """Score table of one cell (written by its group's ``jagielski_train`` job)."""
    return f"{group_dir(dataset, arch, attack)}/{cell_file(clip, init, eps)}"


#: Where ``jagielski-train`` keeps what it trained, one folder per group and one table per
#: side and block of trials (a column per cell), so that a job Snakemake reruns (the grid
#: grew, the job was interrupted) trains only the blocks and cells it has not finished.
TRAINED_DIR = "results/jagielski/trained"


def check_grid(jag: dict, onerun: dict | None = None) -> None:
    """A ValueError naming the config key if an eps label of Figure 2, Table 2 or the
    one-run comparison (config section ``onerun``) has no noise multiplier in its data
    set's table."""
    f2, t2 = jag["fig2"], jag["table2"]
    wanted = [("jagielski.fig2.eps", d, e) for d in f2["datasets"] for e in f2["eps"]]
    wanted += [("jagielski.table2.eps", t2["dataset"], e) for e in t2["eps"]]
    wanted += [("onerun.eps", "fmnist", e) for e in (onerun or {}).get("eps", [])]
    for key, dataset, label in wanted:
        noise = jag["datasets"][dataset]["noise"]
        if label not in noise:
            raise ValueError(f"config {key}: {label!r} is not a key of "
                             f"jagielski.datasets.{dataset}.noise "
                             f"(allowed: {sorted(noise)})")


def train_spec(jag: dict, dataset: str, labels) -> dict:
    """The ``jagielski-train --spec`` of a group: :data:`TRAIN_KEYS` from the ``jagielski``
    config section and its data set's section, ``noise`` only for ``labels``, nothing else
    (:func:`check_grid` has checked the labels)."""
    ds = jag["datasets"][dataset]
    spec = {**jag, **ds, "noise": {e: ds["noise"][e] for e in labels}}
    return {k: spec[k] for k in TRAIN_KEYS}


def table_spec(jag: dict, experiment: str) -> dict:
    """The ``jagielski-audit --spec`` of ``experiment`` (``fig2`` or ``table2``): the keys
    it uses, :data:`AUDIT_KEYS`, and those it records, :data:`MADE_WITH_KEYS` and its
    grid."""
    return {k: jag[k] for k in (*AUDIT_KEYS, *MADE_WITH_KEYS, experiment)}


def grid_cells(jag: dict, onerun: dict | None = None) -> dict[str, list[tuple]]:
    """The cells (dataset, arch, clip, init label, eps label, attack) of Figure 2, Table 2
    and, given the ``onerun`` config section, of the one-run figure's many-model
    comparison (FMNIST ClipBKD at Figure 2's clip); ``all``: every cell trained, a cell in
    several grids once."""
    f2, t2 = jag["fig2"], jag["table2"]
    fig2 = [(d, a, float(f2["clip"]), init_label(f2["init"]), e, att) for d in f2["datasets"]
            for a in f2["archs"] for e in f2["eps"] for att in f2["attacks"]]
    table2 = [(t2["dataset"], t2["arch"], float(c), init_label(i), e, "clipbkd")
              for c in t2["clips"] for i in t2["inits"] for e in t2["eps"]]
    one = [("fmnist", a, float(f2["clip"]), init_label(onerun["init"]), e, "clipbkd")
           for a in onerun["archs"] for e in onerun["eps"]] if onerun else []
    return {"fig2": fig2, "table2": table2, "onerun": one, "all": sorted(set(fig2 + table2 + one))}


def groups(cells) -> dict[tuple[str, str, str], list[tuple]]:
    """The training groups (dataset, arch, attack) of ``cells`` (tuples as in
    :func:`grid_cells`), each with its sorted cells (clip, init label, eps label)."""
    out: dict[tuple, set] = {}
    for d, a, clip, init, eps, att in cells:
        out.setdefault((d, a, att), set()).add((float(clip), init, eps))
    return {g: sorted(c, key=lambda c: (c[0], c[1], float(c[2])))  # float("inf") is inf
            for g, c in sorted(out.items())}


def grid_models(jag: dict, onerun: dict | None = None) -> dict[str, int]:
    """Models each grid of :func:`grid_cells` trains: ``trials`` per side, sides = D0 and
    one D1 per k (MI: D0 and D1)."""
    per_cell = lambda cell: jag["trials"] * len(side_names(cell[5], jag["ks"]))  # noqa: E731
    return {name: sum(map(per_cell, cells))
            for name, cells in grid_cells(jag, onerun).items() if name != "onerun"}


def side_names(attack: str, ks) -> list[str]:
    """The sides of ``attack`` (training's :func:`sides`), D0 first: ``out``, then ``in``
    (MI) or ``k<k>`` for each k."""
    return ["out", "in"] if attack == "mi" else ["out", *(f"k{k}" for k in ks)]


def score_columns(attack: str) -> tuple[str, ...]:
    """The columns training's :func:`score_models` gives each model of ``attack``: its
    :data:`STATISTICS`, ``mi_yeom`` (MI) and ``test_acc``."""
    return (*STATISTICS[attack], *(("mi_yeom",) if attack == "mi" else ()), "test_acc")
