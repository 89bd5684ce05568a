"""The shuffling gap, audited (docs/shuffle.md): DP-SGD that cuts a shuffle of the data
into fixed-size batches yet reports the epsilon of Poisson subsampling, against correct
Poisson DP-SGD, by the white-box multi-run audit of :mod:`dpaudit.experiments.tight.whitebox`.

A setting is a model, a batch size ``B``, ``S`` batches per epoch (``n = S B`` rows of the
task's training set), ``E`` epochs and a claimed eps; the noise multiplier is the one at
which Poisson subsampling at ``q = 1 / S`` for ``T = E S`` steps has that eps (PLD), and
every subject trains at it, so a row compares the sampling alone:

``fixed`` (``DPSGDConfig.sampling`` "poisson")
    correct DP-SGD, the control: its claim is an upper bound on its epsilon;
``shuffle`` ("shuffle")
    a fresh permutation each epoch (Chua et al.'s dynamic shuffling);
``shuffle-once`` ("shuffle-once")
    one permutation for every epoch (persistent shuffling).

Neighbouring relation: zero-out. The Dirac canary (on a weight no example moves) is in the
runs of one side; on the other its slot holds the ghost, which contributes nothing. For
Poisson sampling zero-out has the add/remove pair, so the claim is the eps of this
relation. ``mates`` -1 makes every other example's gradient -C along the canary (Chua et
al.'s worst case; :class:`dpaudit.dpsgd.GradientCanaries`): under shuffling the canary's
batch is then the one with a mate missing, which Poisson sampling's random batch sizes
hide; ``mates`` 0 leaves the canary's batch mates invisible (the standard tight audit).

Theory beside each row: ``claimed_eps``; ``shuffle_lb``, Chua et al.'s lower bound on the
subject's epsilon (dynamic for ``shuffle``, persistent for ``shuffle-once``, none for
``fixed``); ``eps_upper``, what is known above it (the claim for ``fixed``, the
no-amplification eps for the shuffled subjects: their true epsilon is not known). A
certified ``eps_lb`` above ``claimed_eps`` is a violation of the claim, never a
measurement of the subject's epsilon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .. import dpsgd, trials
from .shuffle_settings import ACCOUNTING, RELATION, SHUFFLING, SUBJECTS, Setting, trains
from .tight import whitebox


@dataclass(frozen=True)
class Job:
    """What every audit of one ``shuffle-audit`` job shares: its training (``hidden``,
    ``lr``, ``clip``) and its bounds (``alpha``, ``delta``, ``select_frac``), the config
    section's keys, and where its runs train (``device``; ``per_call`` models per wide call)
    and report progress (``log``)."""

    alpha: float
    delta: float
    select_frac: float = 0.5
    hidden: int = 32
    lr: float = 0.1
    clip: float = 1.0
    device: object = None
    per_call: int | None = None
    log: Callable[[str], None] | None = None


def theory(setting: Setting, delta: float) -> dict:
    """The noise multiplier of the setting's claim and the theory lines of every subject."""
    from .. import accounting, shuffle_accounting as sa

    S, E = setting.steps_per_epoch, setting.epochs
    sigma = accounting.noise_multiplier(setting.eps, 1 / S, S * E, delta, "pld")
    upper = sa.no_amplification_eps(sigma, E, delta)
    lines = {"noise": sigma, "claimed_eps": sa.claimed_poisson_eps(sigma, S, E, delta)}
    for subject in SUBJECTS:
        if subject in SHUFFLING:
            lines[subject] = (sa.shuffle_eps_lower(sigma, S, E, delta, SHUFFLING[subject]),
                              upper)
        else:
            lines[subject] = (math.nan, lines["claimed_eps"])
    return lines


def audit(X, y, setting: Setting, subject: str, mates: float, runs: int, seed: int,
          job: Job, lines: dict | None = None, store=None, what: str = "") -> list[dict]:
    """The white-box audit of ``subject`` at ``setting`` on the first ``setting.n`` rows of
    ``(X, y)``, with ``job``'s training and bounds: one row per method of
    :data:`dpaudit.experiments.tight.whitebox.METHODS`, with the theory lines
    (:func:`theory`, or ``lines`` from it) and ``violation``: a certified ``eps_lb`` above
    ``claimed_eps``. ``store`` and ``what`` as in
    :func:`dpaudit.experiments.tight.whitebox.whitebox_scores`."""
    if subject not in SUBJECTS:
        raise ValueError(f"subject={subject!r}: must be one of {list(SUBJECTS)}")
    if setting.n > len(X):
        raise ValueError(f"{setting.label()}: n = batch_size x steps_per_epoch = {setting.n} "
                         f"rows, but the task has {len(X)}")
    lines = lines or theory(setting, job.delta)
    model = dpsgd.ModelSpec(setting.arch, X.shape[1], job.hidden)
    cfg = dpsgd.DPSGDConfig(setting.epochs, setting.batch_size, job.lr, job.clip,
                            lines["noise"], SUBJECTS[subject])
    X, y = X[:setting.n], y[:setting.n]
    scores = whitebox.whitebox_scores(X, y, model, cfg, runs, seed, mates=mates,
                                      execution=trials.Execution(job.device, job.per_call,
                                                                 job.log, store, what))
    shuffle_lb, eps_upper = lines[subject]
    setup = {"subject": subject, "sampling": SUBJECTS[subject], "accounting": ACCOUNTING,
             "relation": RELATION, "mates": float(mates), "claimed_eps": lines["claimed_eps"],
             "shuffle_lb": shuffle_lb, "eps_upper": eps_upper, "arch": setting.arch,
             "hidden": whitebox.hidden_cell(model), "n": setting.n,
             "batch_size": setting.batch_size, "steps_per_epoch": setting.steps_per_epoch,
             "epochs": setting.epochs, "steps": cfg.steps(setting.n),
             "noise": lines["noise"], "clip": float(job.clip), "alpha": float(job.alpha),
             "delta": float(job.delta), "select_frac": float(job.select_frac),
             "seed": int(seed)}
    return [{**row, "violation": row["eps_lb"] > lines["claimed_eps"], **setup}
            for row in whitebox.method_rows(scores, runs, job.alpha, job.delta,
                                            job.select_frac)]


__all__ = ["SUBJECTS", "SHUFFLING", "RELATION", "ACCOUNTING", "Setting", "trains", "Job",
           "theory", "audit"]
