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

import numpy as np

from .. import dpsgd
from .tight import whitebox

#: Subject name (as in :mod:`dpaudit.subjects`) -> the trainer's sampling.
SUBJECTS = {"fixed": "poisson", "shuffle": "shuffle", "shuffle-once": "shuffle-once"}
#: Chua et al.'s shuffling of each shuffled subject.
SHUFFLING = {"shuffle": "dynamic", "shuffle-once": "persistent"}
RELATION = "zero-out"
#: What every subject reports: Poisson subsampling at q = B / n, PLD.
ACCOUNTING = "poisson-pld"


@dataclass(frozen=True)
class Setting:
    """One setting of the audit (module docstring); ``n = batch_size * steps_per_epoch``."""

    arch: str
    batch_size: int
    steps_per_epoch: int
    epochs: int
    eps: float

    def __post_init__(self):
        for name in ("batch_size", "steps_per_epoch", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        if self.arch not in dpsgd.ARCHS:
            raise ValueError(f"arch={self.arch!r}: must be one of {list(dpsgd.ARCHS)}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) \
                or not 0 < self.eps < math.inf:
            raise ValueError(f"eps={self.eps!r}: must be a finite number > 0")

    @property
    def n(self) -> int:
        return self.batch_size * self.steps_per_epoch

    def label(self) -> str:
        return (f"{self.arch} B={self.batch_size} S={self.steps_per_epoch} "
                f"E={self.epochs} eps={self.eps:g}")


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
          alpha: float, delta: float, select_frac: float = 0.5, *, hidden=32,
          lr: float = 0.1, clip: float = 1.0, lines: dict | None = None, device=None,
          per_call: int | None = None, log: Callable[[str], None] | None = None, store=None,
          what: str = "") -> list[dict]:
    """The white-box audit of ``subject`` at ``setting`` on the first ``setting.n`` rows of
    ``(X, y)``: one row per method of :data:`dpaudit.experiments.tight.whitebox.METHODS`,
    with the theory lines (:func:`theory`, or ``lines`` from it) and ``violation``: a
    certified ``eps_lb`` above ``claimed_eps``. ``per_call``, ``log``, ``store`` and ``what``
    as in :func:`dpaudit.experiments.tight.whitebox.whitebox_scores`."""
    if subject not in SUBJECTS:
        raise ValueError(f"subject={subject!r}: must be one of {list(SUBJECTS)}")
    if setting.n > len(X):
        raise ValueError(f"{setting.label()}: n = batch_size x steps_per_epoch = {setting.n} "
                         f"rows, but the task has {len(X)}")
    lines = lines or theory(setting, delta)
    model = dpsgd.ModelSpec(setting.arch, X.shape[1], hidden)
    cfg = dpsgd.DPSGDConfig(setting.epochs, setting.batch_size, lr, clip, lines["noise"],
                            SUBJECTS[subject])
    X, y = X[:setting.n], y[:setting.n]
    scores = whitebox.whitebox_scores(X, y, model, cfg, runs, seed, device=device,
                                      per_call=per_call, log=log, store=store, what=what,
                                      mates=mates)
    shuffle_lb, eps_upper = lines[subject]
    setup = {"subject": subject, "sampling": SUBJECTS[subject], "accounting": ACCOUNTING,
             "relation": RELATION, "mates": float(mates), "claimed_eps": lines["claimed_eps"],
             "shuffle_lb": shuffle_lb, "eps_upper": eps_upper, "arch": setting.arch,
             "hidden": whitebox.hidden_cell(model), "n": setting.n,
             "batch_size": setting.batch_size, "steps_per_epoch": setting.steps_per_epoch,
             "epochs": setting.epochs, "steps": cfg.steps(setting.n),
             "noise": lines["noise"], "clip": float(clip), "alpha": float(alpha),
             "delta": float(delta), "select_frac": float(select_frac), "seed": int(seed)}
    rows = []
    for method, key in (("whitebox-llr", "llr"), ("whitebox-dot-sum", "dot_sum")):
        stats = whitebox.audit_scores(scores["in"][key], scores["out"][key], alpha, delta,
                                      select_frac)
        eps_lb = stats.pop("eps_lb")
        rows.append({"method": method, "threat_model": whitebox.METHODS[method],
                     "eps_lb": eps_lb, "certified": stats.pop("certified"),
                     "violation": eps_lb > lines["claimed_eps"], "runs": int(runs),
                     **stats, **setup})
    return rows


__all__ = ["SUBJECTS", "SHUFFLING", "RELATION", "ACCOUNTING", "Setting", "theory", "audit"]
