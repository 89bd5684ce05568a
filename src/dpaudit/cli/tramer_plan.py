"""The checks of an audit's request into its plan: every bad input fails before any training."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

from ..config import SpecError

#: Default ``--call-timeout`` (:data:`dpaudit.experiments.tramer.CALL_LIMIT`; not
#: imported from there, which would load torch for every command's --help).
CALL_LIMIT = 3600.0

#: Fewest validation runs per side (``--val-runs``, config ``tramer.val_runs``). The
#: threshold is the distinct validation decision "loss < tau" with the largest validation
#: eps_LB (ties: the largest TPR - FPR). One run per side gives one decision other than
#: "all in" and "all out" (tau between the two losses), so the validation chooses nothing;
#: two per side are the fewest that give it thresholds to choose among.
MIN_VAL_RUNS = 2
#: Spec keys the audit sets for registry subjects, from the claim and the data.
_INJECTED = ("eps", "delta", "n")


def _number(text, name: str, low: float, high: float | None = None) -> float:
    """``text`` as a finite float in (low, high), else a SpecError naming ``name``."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > low and (high is None or value < high)):
        where = f"> {low:g}" + (f" and < {high:g}" if high is not None else "")
        raise SpecError(f"{name}={text!r}: must be a number {where}")
    return value


def positive_int(value: int, name: str, low: int = 1) -> int:
    if value < low:
        raise SpecError(f"{name}={value}: must be an integer >= {low}")
    return value


@dataclass(frozen=True)
class Request:
    """The inputs of an audit as given (``audit-impl``'s options or ``tramer-audit``'s
    config section), before :func:`check`: ``train`` the targets; ``eps``, ``delta``,
    ``alpha`` as given (text or numbers); ``device``: where the registry subjects train
    unless ``spec`` names a device; ``seed_check`` None: the default number of seeds;
    ``call_limit``: seconds per call of a training function (0: none); ``mates``: the
    white-box canary's crafted batch mates; ``opacus_loop``: each ``--train`` a user's
    ``train(X, y, seed) -> (model, reported_eps)``
    (:class:`dpaudit.adapters.opacus_loop.OpacusLoop`), its claim the eps it reports
    (``eps`` None or only recorded), its spec measured (``spec`` must be empty)."""

    train: list
    eps: object
    delta: object
    alpha: object
    runs: int
    val_runs: int
    n_train: int
    batch_runs: int
    classes: list
    label: int | None
    spec: dict
    device: str | None = None
    seed_check: int | None = None
    max_diverged: float = 0.0
    mode: str = "black-box"
    n_aux: int = 500
    call_limit: float = CALL_LIMIT
    mates: float = 0.0
    opacus_loop: bool = False


def check(r: Request) -> dict:
    """Every check that can fail before training: claim, run counts, functions, specs,
    the integrity checks' options, the mode and whether each function allows it; the
    plan :func:`dpaudit.cli.tramer_run.run` follows. With ``opacus_loop`` the runs are
    checked against the claim by :func:`enough` once it is known."""
    if r.eps is None and not r.opacus_loop:
        raise SpecError("--eps (claimed epsilon): required (optional only with --opacus-loop, "
                        "whose claim is the eps the training reports)")
    eps = None if r.eps is None else _number(r.eps, "--eps (claimed epsilon)", 0.0)
    delta = _number(r.delta, "--delta (claimed delta)", 0.0, 1.0)
    alpha = _number(r.alpha, "--alpha (1 - confidence)", 0.0, 1.0)
    need = None if r.opacus_loop else enough(r.runs, eps, delta, alpha)
    if r.opacus_loop and r.spec:
        raise SpecError(f"--spec {json.dumps(r.spec)}: not with --opacus-loop, whose spec is "
                        "measured from the training itself")
    seed_check = _check_options(r)
    plans, claims = [], {}
    for target in r.train:
        target_plan, claims[target] = _plan_one(r, target, eps, delta)
        plans.append(target_plan)
    return {"eps": eps, "delta": delta, "alpha": alpha, "min_runs": need, "classes": r.classes,
            "plans": plans, "claims": claims, "runs": r.runs, "val_runs": r.val_runs,
            "n_train": r.n_train, "batch_runs": r.batch_runs, "label": r.label,
            "seed_check": seed_check, "max_diverged": r.max_diverged, "mode": r.mode,
            "n_aux": r.n_aux, "call_limit": r.call_limit, "mates": r.mates,
            "opacus_loop": r.opacus_loop}


def _check_options(r: Request) -> int:
    """The checks of ``r``'s options other than the claim and the functions; the number of
    seeds of the seed check."""
    from ..experiments import tramer

    if r.val_runs < MIN_VAL_RUNS:
        raise SpecError(f"--val-runs={r.val_runs}: must be an integer >= {MIN_VAL_RUNS} "
                        "(validation runs per side that choose the threshold)")
    positive_int(r.n_train, "--n-train", 2)
    positive_int(r.batch_runs, "--batch-runs")
    if not (r.call_limit == 0 or 0 < r.call_limit < math.inf):
        raise SpecError(f"--call-timeout={r.call_limit!r}: must be a number of seconds > 0 "
                        "(0: no limit)")
    if r.mode == "worst-case-init":
        positive_int(r.n_aux, "--n-aux")
    if not -1 <= r.mates <= 1:  # nan fails too
        raise SpecError(f"--mates={r.mates!r}: must be a number in [-1, 1] (each batch mate's "
                        f"gradient along the canary, in units of it)")
    if r.mates and r.mode != "white-box":
        raise SpecError(f"--mates={r.mates:g}: only with --mode white-box (the gradient "
                        f"canary's batch mates), not --mode {r.mode}")
    seed_check = tramer.SEED_CHECK if r.seed_check is None else r.seed_check
    try:
        tramer.check_options(seed_check, r.max_diverged)
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
    classes, label = r.classes, r.label
    if (len(classes) < 2 or len(set(classes)) != len(classes)
            or not all(0 <= c <= 9 for c in classes)):
        raise SpecError(f"--classes={classes!r}: must be >= 2 distinct FMNIST classes in 0..9")
    if label is not None and not 0 <= label < len(classes):
        raise SpecError(f"--label={label}: must be a class index in 0..{len(classes) - 1}")
    if len(set(r.train)) != len(r.train):
        raise SpecError(f"--train {r.train}: each implementation at most once")
    return seed_check


def _plan_one(r: Request, target: str, eps: float | None, delta: float):
    """((target, training function, spec), claimed DP-SGD or None) of one ``--train``
    target, checked; the claim None with --opacus-loop too (the profile test's, from the
    claim the training reports)."""
    from .. import subjects
    from ..experiments import tramer

    try:
        fn = subjects.load_train_fn(target)
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
    if r.opacus_loop:
        if fn in subjects.SUBJECTS.values():
            raise SpecError(f"--train {target} --opacus-loop: a registry subject, not a "
                            "user's train(X, y, seed) -> (model, reported_eps)")
        from ..adapters.opacus_loop import OpacusLoop

        return (target, OpacusLoop(target), {}), None
    try:
        tramer.check_mode(fn, r.mode)
    except ValueError as exc:
        raise SpecError(f"--train {target} --mode {r.mode}: {exc}") from exc
    if r.mode == "white-box":
        try:
            tramer.whitebox_clip(r.spec)
        except ValueError as exc:
            raise SpecError(f"--spec for {target!r} --mode white-box: {exc}") from exc
    spec = _registry_spec(r, target, fn, eps, delta) if fn in subjects.SUBJECTS.values() \
        else dict(r.spec)
    try:
        claim = subjects.claimed_dpsgd(spec, eps, delta, r.n_train)
    except ValueError as exc:
        raise SpecError(f"--spec for {target!r}: {exc}") from exc
    print(f"audit-impl: {target}: " + (
        "no profile test: the spec names neither q and steps nor batch_size and epochs"
        if claim is None else "profile test against correct DP-SGD at noise "
        "multiplier {:.4g}, q = {:g}, T = {}".format(*claim)), file=sys.stderr)
    return (target, fn, spec), claim


def _registry_spec(r: Request, target: str, fn, eps: float, delta: float) -> dict:
    """The spec of registry subject ``target``: ``r.spec`` with the claim, the data size
    and the device the audit sets, its noise multiplier calibrated to the claim."""
    from .. import subjects

    clash = sorted(set(r.spec) & set(_INJECTED))
    if clash:
        raise SpecError(f"--spec keys {clash} are set by the audit for registry subject "
                        f"{target!r} (from --eps, --delta and --n-train); remove them")
    spec = {**r.spec, "eps": eps, "delta": delta, "n": r.n_train}
    if r.device is not None:
        spec.setdefault("device", r.device)
    try:
        sigma = subjects.claimed_noise_multiplier(spec, r.n_train, fn)
    except ValueError as exc:
        raise SpecError(f"--spec for {target!r}: {exc}") from exc
    print(f"audit-impl: {target}: noise multiplier {sigma:.4g} calibrated to "
          f"({eps:g}, {delta:g})-DP", file=sys.stderr)
    return spec


def enough(runs: int, eps: float, delta: float, alpha: float) -> int:
    """The fewest evaluation runs per side that can refute ``eps`` (a SpecError naming
    ``--runs`` where ``runs`` is fewer)."""
    from ..experiments import tramer

    need = tramer.min_runs(eps, delta, alpha)
    if runs < need:
        best = tramer.max_eps_lb(max(runs, 1), delta, alpha)
        raise SpecError(
            f"--runs={runs}: too few evaluation runs per side for the claimed eps={eps:g} "
            f"at confidence 1 - {alpha:g}: even a perfect attack (TPR = 1, FPR = 0) on "
            f"{runs} runs certifies at most eps_LB={best:.3g}; need --runs >= {need}")
    return need
