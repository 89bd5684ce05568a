"""The start-up check of the limits that relate several config keys, or a key and the data
it is used on: values that each satisfy the schema but together would fail late in a job
or produce a number that means nothing (a batch larger than its training set, a grid with
fewer points than asked for). ``workflow/rules/common.smk`` calls :func:`check_config`
once, after the Snakefile's schema validation and before any job runs; each message names
the keys and what is allowed."""

from __future__ import annotations

import json
import math

from ..config import SpecError
from ..dpsgd import ModelSpec
from . import abadi, jagielski
from .shuffle_settings import trains

#: Sizes of the data the experiments use: the training rows of the Jagielski et al. tasks
#: (Fashion-MNIST: the reference code's random half of the 12,000 T-shirt and trouser
#: images; CIFAR-10: the 10,000 airplane and automobile images), the training images of
#: each Fashion-MNIST class in the reference subset (half of its 6,000), the Fashion-MNIST
#: / MNIST and CIFAR-10 training sets, and the input dimension of (Fashion-)MNIST.
JAGIELSKI_N = {"fmnist": 6000, "cifar": 10000}
TRAMER_PER_CLASS = 3000
MNIST_TRAIN = 60_000
CIFAR10_TRAIN = 50_000
MNIST_DIMS = 784
#: Most DP-SGD steps of the accountant curves (max_epochs / sample_rate): the accountants'
#: time and memory grow with them (on 2 CPU cores one point of the curve took 1 s at 1e6
#: steps, 166 s at 1e7).
MAX_ACCOUNTING_STEPS = 1_000_000
#: Most canary coordinates m x d of one HW3 grid point (time grows with them; the
#: homework's largest point, m = 16384 at d = 1e4 or m = 1000 at d = 1e5, has 1.6e8).
MAX_HW3_COORDINATES = 10**10
#: ``tramer.user.n_aux`` where it is not given (``dpaudit audit-impl --n-aux``'s default).
USER_N_AUX = 500
#: The registry names ``tramer.user.train`` may give instead of a module
#: (:data:`dpaudit.subjects.SUBJECTS`, which imports torch; tests/test_integrity_config.py
#: keeps the two equal).
USER_REGISTRY = ("fixed", "buggy", "half-steps", "half-noise", "shuffle", "shuffle-once",
                 "easgm", "asgm")


def problems(config: dict) -> list[str]:
    """One line per violated cross-key limit of ``config`` (a whole config that satisfies
    the schema); empty if none."""
    jag = config["jagielski"]
    return [*_hw3_problems(config["hw3"]), *_accounting_problems(config["accounting"]),
            *_ridge_problems(config["ridge"]),
            *_jagielski_problems(jag, config["trials_needed"], config["onerun"]),
            *_onerun_problems(config["onerun"], jag), *_tramer_config_problems(config["tramer"]),
            *_abadi_problems(config["abadi"]), *_tight_problems(config["tight"], jag),
            *_shuffle_config_problems(config["shuffle"])]


def _hw3_problems(hw3: dict) -> list[str]:
    """The ``hw3`` section: canary coordinates of each grid's largest point."""
    found = []
    for grid, axes in hw3["grids"].items():
        largest = max(axes["m"]) * max(axes["d"])
        if largest > MAX_HW3_COORDINATES:
            found.append(f"hw3.grids.{grid}.m x hw3.grids.{grid}.d = {largest:.3g} canary "
                         f"coordinates at the largest point: must be <= "
                         f"{MAX_HW3_COORDINATES:.0e}")
    return found


def _accounting_problems(acc: dict) -> list[str]:
    """The ``accounting`` section: the accountants' steps and the composition grid."""
    found = []
    steps = acc["abadi"]["max_epochs"] / acc["abadi"]["sample_rate"]
    if steps > MAX_ACCOUNTING_STEPS:
        found.append(f"accounting.abadi.max_epochs / sample_rate = {steps:.3g} DP-SGD steps: "
                     f"must be <= {MAX_ACCOUNTING_STEPS:.0e}")
    comp = acc["composition"]
    if comp["num_k"] > comp["max_k"]:
        found.append(f"accounting.composition.num_k={comp['num_k']}: must be <= "
                     f"accounting.composition.max_k={comp['max_k']} (whole k in [1, max_k])")
    return found


def _ridge_problems(ridge: dict) -> list[str]:
    """The ``ridge`` section: at most d orthonormal canaries."""
    found = []
    if ridge["m"] > ridge["d"]:
        found.append(f"ridge.m={ridge['m']}: must be <= ridge.d={ridge['d']} (the canaries "
                     "are orthonormal directions of R^d)")
    return found


def _jagielski_problems(jag: dict, tn: dict, onerun: dict) -> list[str]:
    """The ``jagielski`` section (with ``trials_needed``, and ``onerun`` where it compares
    with the many-model cells): noise and batch of each data set, the trials' splits, the
    grid."""
    found = []
    for name, n in JAGIELSKI_N.items():
        # A cell is named and plotted by its label: a finite label trained without noise
        # would claim an eps it does not have (eps = inf).
        free = [e for e, sigma in jag["datasets"][name]["noise"].items()
                if e != "inf" and sigma == 0]
        for label in free:
            found.append(f"jagielski.datasets.{name}.noise.{label}=0: a finite eps label needs "
                         "a noise multiplier > 0 (only the label inf trains without noise)")
        batch = jag["datasets"][name]["batch_size"]
        if batch > n:
            found.append(f"jagielski.datasets.{name}.batch_size={batch}: must be <= {n}, "
                         "the rows of its training set")
    # Every split of trials into threshold-choosing and evaluating ones keeps one of each,
    # at the full count and at the fewest trials the trials-needed study subsamples.
    for key, n in (("jagielski.trials", jag["trials"]), ("trials_needed.n_min", tn["n_min"])):
        found += split_problems("jagielski.select_frac", jag["select_frac"], key, n)
    if tn["n_min"] > jag["trials"]:
        found.append(f"trials_needed.n_min={tn['n_min']}: must be <= jagielski.trials="
                     f"{jag['trials']} (the study subsamples the trained trials)")
    try:
        jagielski.check_grid(jag, onerun if onerun["compare_many_model"] else None)
    except ValueError as err:
        found.append(str(err).removeprefix("config "))
    return found


def _onerun_problems(onerun: dict, jag: dict) -> list[str]:
    """The ``onerun`` section: the many-model cells it compares with, the Dirac canaries
    the first layer holds."""
    found = []
    if onerun["compare_many_model"]:
        trained = set(jag["fig2"]["eps"]) | set(jag["table2"]["eps"])
        extra = [e for e in onerun["eps"] if e not in trained]
        if extra:
            found.append(f"onerun.eps: {extra} are not labels of jagielski.fig2.eps or "
                         f"jagielski.table2.eps ({sorted(trained)}), which "
                         "onerun.compare_many_model compares with; add them there or set "
                         "onerun.compare_many_model to false")
        # Likewise the init: the comparison's cells are at an init Figure 2 or Table 2
        # trains, whose label a reader can look up there.
        inits = [jag["fig2"]["init"], *jag["table2"]["inits"]]
        if jagielski.init_label(onerun["init"]) not in map(jagielski.init_label, inits):
            found.append(f"onerun.init={onerun['init']}: not jagielski.fig2.init "
                         f"({jag['fig2']['init']}) or one of jagielski.table2.inits "
                         f"({jag['table2']['inits']}), the inits the training jobs train and "
                         "onerun.compare_many_model compares with; use one of them or set "
                         "onerun.compare_many_model to false")
    if "dirac" in onerun["canaries"]:
        hidden = jag["datasets"]["fmnist"]["hidden"]
        for arch in onerun["archs"]:
            fan_in, fan_out = ModelSpec(arch, MNIST_DIMS, hidden).shapes[0]
            if onerun["m"] > fan_in * fan_out:
                found.append(f"onerun.m={onerun['m']}: must be <= {fan_in * fan_out}, the "
                             f"first-layer weights of the {arch} model (one Dirac canary "
                             "each)")
    return found


def _tramer_config_problems(tramer: dict) -> list[str]:
    """The ``tramer`` section: :func:`tramer_problems`, the training set and batch, the
    user spec."""
    found = []
    found += tramer_problems(tramer)
    most = TRAMER_PER_CLASS * len(tramer["classes"])
    if tramer["n_train"] > most:
        found.append(f"tramer.n_train={tramer['n_train']}: must be <= {most}, the "
                     f"Fashion-MNIST images of tramer.classes={tramer['classes']} in the "
                     "reference subset")
    if tramer["model"]["batch_size"] > tramer["n_train"]:
        found.append(f"tramer.model.batch_size={tramer['model']['batch_size']}: must be <= "
                     f"tramer.n_train={tramer['n_train']}")
    try:
        spec = json.loads(tramer["user"]["spec"])
    except json.JSONDecodeError as err:
        found.append(f"tramer.user.spec: not JSON ({err})")
    else:
        if not isinstance(spec, dict):
            found.append(f"tramer.user.spec={tramer['user']['spec']!r}: must be a JSON object")
    return found


def _abadi_problems(abadi_cfg: dict) -> list[str]:
    """The ``abadi`` section: Figure 3's and Figure 6's sizes and levels."""
    found = []
    fig3 = abadi_cfg["fig3"]
    n3 = fig3["n_train"] or MNIST_TRAIN
    for key in ("lot_size", "train_eval_images"):
        if fig3[key] > n3:
            found.append(f"abadi.fig3.{key}={fig3[key]}: must be <= the training images, "
                         f"abadi.fig3.n_train={fig3['n_train']} (0: {MNIST_TRAIN})")
    for level in fig3["levels"]:
        try:
            abadi.check_fig3_level(level)
        except SpecError as err:
            found.append(str(err))
    fig6 = abadi_cfg["fig6"]
    # The private set without CIFAR-100: CIFAR-10's training images less the public ones.
    n6 = fig6["private_images"] or CIFAR10_TRAIN - fig6["public_images"]
    if fig6["train_eval_images"] > n6:
        found.append(f"abadi.fig6.train_eval_images={fig6['train_eval_images']}: must be <= "
                     f"the private images, {n6} (abadi.fig6.private_images, or when 0 "
                     f"{CIFAR10_TRAIN} - public_images)")
    for i, level in enumerate(fig6["levels"]):
        if level["lot_size"] > n6:
            found.append(f"abadi.fig6.levels[{i}].lot_size={level['lot_size']}: must be <= "
                         f"the private images, {n6} (abadi.fig6.private_images, or when 0 "
                         f"{CIFAR10_TRAIN} - public_images)")
    for i, level in enumerate(fig3["levels"]):
        if level["sigma"] == 0 and level["eps"] is not None:
            found.append(f"abadi.fig3.levels[{i}].sigma=0 with abadi.fig3.levels[{i}].eps="
                         f"{level['eps']}: without noise eps = inf, so no target can stop "
                         "the level; set its eps to null or its sigma > 0")
    for i, level in enumerate(fig6["levels"]):
        if fig6["sigma"] == 0 and level["eps"] is not None:
            found.append(f"abadi.fig6.sigma=0 with abadi.fig6.levels[{i}].eps={level['eps']}: "
                         "without noise eps = inf, so no target can stop the level; set its "
                         "eps to null or abadi.fig6.sigma > 0")
    return found


def _tight_problems(tight: dict, jag: dict) -> list[str]:
    """The ``tight`` section: eps labels with a noise multiplier, the black box's rows,
    the runs' split."""
    found = []
    noise = {**tight["noise"], **jag["datasets"]["fmnist"]["noise"]}
    for label in tight["eps"]:
        try:
            value = float(label)
        except ValueError:
            value = math.nan
        if not value > 0:
            found.append(f"tight.eps: {label!r} is not an eps label (a number > 0 or \"inf\")")
        elif label not in noise:
            found.append(f"tight.eps: {label!r} has no noise multiplier: add it to "
                         f"tight.noise (keys of jagielski.datasets.fmnist.noise: "
                         f"{sorted(jag['datasets']['fmnist']['noise'])})")
    bb = tight["blackbox"]
    if bb["n_aux"] + bb["n"] > JAGIELSKI_N["fmnist"]:
        found.append(f"tight.blackbox.n_aux + tight.blackbox.n = {bb['n_aux'] + bb['n']}: "
                     f"must be <= {JAGIELSKI_N['fmnist']}, the rows of the FMNIST task")
    found += split_problems("tight.select_frac", tight["select_frac"], "tight.runs",
                            tight["runs"])
    return found


def _shuffle_config_problems(section: dict) -> list[str]:
    """The ``shuffle`` section: :func:`shuffle_problems` and the FMNIST rows of each
    setting."""
    found = []
    found += shuffle_problems(section)
    rows = JAGIELSKI_N["fmnist"]
    for i, setting in enumerate(section["settings"]):
        n = setting["batch_size"] * setting["steps_per_epoch"]
        if n > rows:
            found.append(f"shuffle.settings[{i}]: batch_size x steps_per_epoch = {n}: must be "
                         f"<= {rows}, the rows of the FMNIST task")
    return found


def split_problems(frac_key: str, frac: float, runs_key: str, runs: int) -> list[str]:
    """The line (a list of at most one) saying that the first ``frac`` of ``runs`` trials
    per side, which choose the threshold, leave none of a kind to choose or to evaluate
    (the split of :func:`dpaudit.bounds.split_trials`)."""
    cut = int(runs * frac)
    if min(cut, runs - cut) >= 1:
        return []
    return [f"{frac_key}={frac} of {runs_key}={runs}: must leave at least one run per side to "
            f"choose the threshold and one to evaluate it (between {1 / runs:.3g} and "
            f"{1 - 1 / runs:.3g})"]


def shuffle_problems(section: dict) -> list[str]:
    """The cross-key limits of the ``shuffle`` section (as ``dpaudit shuffle-audit --spec``
    gets it, schema-valid) that need no data: each setting's runs split by
    ``select_frac``, and something to audit (``shuffle-once`` at one epoch is ``shuffle``
    and is not trained again)."""
    found = []
    for i, setting in enumerate(section["settings"]):
        runs, key = ((setting["runs"], f"shuffle.settings[{i}].runs") if "runs" in setting
                     else (section["runs"], "shuffle.runs"))
        found += split_problems("shuffle.select_frac", section["select_frac"], key, runs)
    if not any(trains(subject, s["epochs"]) for subject in section["subjects"]
               for s in section["settings"]):
        found.append("shuffle.subjects: [shuffle-once] alone must come with a setting of "
                     "epochs > 1; at one epoch shuffle-once is shuffle and is not trained "
                     "again, so nothing would be audited (add a subject or such a setting)")
    return found


def perfect_attack_runs(eps: float, delta: float, alpha: float) -> int:
    """:func:`dpaudit.bounds.runs_to_exceed` in closed form, without scipy (whose import is
    most of Snakemake's start-up): a perfect attack's Clopper-Pearson bounds on n trials per
    side are ``TPR_lo = (alpha/2)^(1/n)`` and ``FPR_hi = 1 - TPR_lo``, so its eps_LB is
    ``ln((TPR_lo - delta) / FPR_hi)``, increasing in n (tested equal to the bounds')."""
    def eps_lb(n: int) -> float:
        lo = (alpha / 2) ** (1 / n)
        return math.log((lo - delta) / (1 - lo)) if lo > delta else -math.inf

    hi = 1
    while eps_lb(hi) <= eps:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if eps_lb(mid) > eps else (mid, hi)
    return hi


def tramer_problems(section: dict) -> list[str]:
    """The cross-key limits of the ``tramer`` section: evaluation runs enough for a
    perfect attack to refute each claim at ``alpha`` (:func:`perfect_attack_runs`,
    as ``dpaudit audit-impl`` requires), and a
    ``user.train`` whose module can be found (looked up, not imported: importing it may
    import torch or run its code)."""
    from importlib.util import find_spec

    found = []
    for where, claim in (("tramer", section), ("tramer.user", section["user"])):
        need = perfect_attack_runs(claim["eps"], claim["delta"], section["alpha"])
        if claim["runs"] < need:
            found.append(f"{where}.runs={claim['runs']}: must be >= {need}, the fewest "
                         f"evaluation runs per side at which even a perfect attack refutes "
                         f"the claim eps={claim['eps']:g}, delta={claim['delta']:g} at "
                         f"confidence 1 - tramer.alpha={section['alpha']:g}")
    user = section["user"]
    if user.get("mode") == "worst-case-init":  # pre-trained on the rows after n_train
        most = TRAMER_PER_CLASS * len(section["classes"])
        n_aux = user.get("n_aux", USER_N_AUX)
        if section["n_train"] + n_aux > most:
            found.append(f"tramer.n_train + tramer.user.n_aux = {section['n_train'] + n_aux}: "
                         f"must be <= {most}, the Fashion-MNIST images of tramer.classes in "
                         "the reference subset (the worst-case init is pre-trained on the "
                         "images after the training set)")
    train = user["train"]
    module, sep, name = train.partition(":")
    if train in USER_REGISTRY:
        return found
    if not sep or not module or not name:
        found.append(f"tramer.user.train={train!r}: must be 'module.path:function' or one of "
                     f"{sorted(USER_REGISTRY)}")
        return found
    try:
        spec = find_spec(module)
    except (ImportError, ValueError) as err:  # a parent package that fails to import
        spec, why = None, f" ({err})"
    else:
        why = ""
    if spec is None:
        found.append(f"tramer.user.train={train!r}: must name an importable module; "
                     f"{module!r} is not found on the Python path{why} (put its folder on "
                     "PYTHONPATH)")
    return found


def check_config(config: dict) -> None:
    """A :class:`SpecError` listing every :func:`problems` of ``config``, one per line."""
    found = problems(config)
    if found:
        raise SpecError("\n".join(found))


__all__ = ["problems", "check_config", "split_problems", "shuffle_problems",
           "tramer_problems", "USER_REGISTRY", "JAGIELSKI_N", "MAX_ACCOUNTING_STEPS",
           "MAX_HW3_COORDINATES"]
