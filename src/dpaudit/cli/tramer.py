"""``dpaudit audit-impl``, ``tramer-audit``, ``tramer-reaudit`` and ``tramer-plot``: audit a
DP training implementation.

``audit-impl`` trains a training function (a registry subject, ``buggy`` or ``fixed``, or a
user's ``module.path:function``; contract in :mod:`dpaudit.subjects`) many times on
Fashion-MNIST with and without a canary and tests its claimed (eps, delta) as in Tramer
et al. 2022, or in a tight mode (``--mode worst-case-init`` or ``white-box``,
:mod:`dpaudit.experiments.tramer`); see ``docs/audit_your_implementation.md``.  Every input is
checked before any training starts.  ``tramer-reaudit`` recomputes an audit table from its
per-run losses (e.g. a GPU run's, on a CPU) and ``tramer-plot`` draws it.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ..config import SpecError, subset_schema, validate_section
from ..device import DEVICES
from . import FIGURE_HELP, figure_out, out_dir, out_file, seed_arg, spec_arg

#: ``--mode`` of audit-impl (:data:`dpaudit.experiments.tramer.MODES`; not imported from
#: there, which would load torch for every command's --help).
MODES = ("black-box", "worst-case-init", "white-box")
#: Default ``--call-timeout`` (:data:`dpaudit.experiments.tramer.CALL_LIMIT`, likewise).
CALL_LIMIT = 3600.0

#: Keys of the ``tramer`` config section each audit depends on (``dpaudit tramer-audit
#: --target``): the rule passes only these, so editing one audit never reruns the other.
SPEC_KEYS = {
    "case-study": ("implementations", "eps", "delta", "alpha", "canary", "classes", "n_train",
                   "runs", "val_runs", "batch_runs", "model"),
    "user": ("user", "alpha", "classes", "n_train", "batch_runs"),
}

#: Fewest validation runs per side (``--val-runs``, config ``tramer.val_runs``). The
#: threshold is the distinct validation decision "loss < tau" with the largest validation
#: eps_LB (ties: the largest TPR - FPR). One run per side gives one decision other than
#: "all in" and "all out" (tau between the two losses), so the validation chooses nothing;
#: two per side are the fewest that give it thresholds to choose among.
MIN_VAL_RUNS = 2
#: Leading columns of the audit table, in a fixed order; more follow.
COLUMNS = ["implementation", "claimed_eps", "delta", "runs", "tpr", "fpr", "threshold",
           "eps_lb", "mu_lb", "verdict"]
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


def _positive_int(value: int, name: str, low: int = 1) -> int:
    if value < low:
        raise SpecError(f"{name}={value}: must be an integer >= {low}")
    return value


@dataclass(frozen=True)
class Request:
    """The inputs of an audit as given (``audit-impl``'s options or ``tramer-audit``'s
    config section), before :func:`_check`: ``train`` the targets; ``eps``, ``delta``,
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


def _check(r: Request) -> dict:
    """Every check that can fail before training: claim, run counts, functions, specs,
    the integrity checks' options, the mode and whether each function allows it; the
    plan :func:`_run` follows. With ``opacus_loop`` the runs are checked against the claim
    by :func:`_enough` once it is known."""
    if r.eps is None and not r.opacus_loop:
        raise SpecError("--eps (claimed epsilon): required (optional only with --opacus-loop, "
                        "whose claim is the eps the training reports)")
    eps = None if r.eps is None else _number(r.eps, "--eps (claimed epsilon)", 0.0)
    delta = _number(r.delta, "--delta (claimed delta)", 0.0, 1.0)
    alpha = _number(r.alpha, "--alpha (1 - confidence)", 0.0, 1.0)
    need = None if r.opacus_loop else _enough(r.runs, eps, delta, alpha)
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
    _positive_int(r.n_train, "--n-train", 2)
    _positive_int(r.batch_runs, "--batch-runs")
    if not (r.call_limit == 0 or 0 < r.call_limit < math.inf):
        raise SpecError(f"--call-timeout={r.call_limit!r}: must be a number of seconds > 0 "
                        "(0: no limit)")
    if r.mode == "worst-case-init":
        _positive_int(r.n_aux, "--n-aux")
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


def _enough(runs: int, eps: float, delta: float, alpha: float) -> int:
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


@dataclass(frozen=True)
class _Data:
    """The data of an audit: ``X``, ``y`` the training set, the first --n-train rows of
    ``X_all``, ``y_all``; ``aux`` the rows after them the worst-case init is pre-trained on
    (None in the other modes); ``test`` the test split of the same classes."""

    X_all: object
    y_all: object
    X: object
    y: object
    aux: slice | None
    test: tuple


def _load(plan: dict, root, download: bool) -> _Data:
    """The data of a checked ``plan``; a SpecError where the classes have too few rows."""
    import torch

    from ..data import load_fmnist

    X_all, y_all = load_fmnist(root, classes=plan["classes"], download=download)
    n_train, mode = plan["n_train"], plan["mode"]
    X, y = torch.as_tensor(X_all[:n_train]), torch.as_tensor(y_all[:n_train])
    if len(X) < n_train:
        raise SpecError(f"--n-train={n_train}: only {len(X)} examples of classes "
                        f"{plan['classes']} in the reference subset")
    # The worst-case init is pre-trained on the next rows, disjoint from the training data.
    aux = slice(n_train, n_train + plan["n_aux"]) if mode == "worst-case-init" else None
    if aux is not None and len(X_all) < aux.stop:
        raise SpecError(f"--n-aux={plan['n_aux']}: only {len(X_all) - n_train} examples of "
                        f"classes {plan['classes']} after the first --n-train={n_train}")
    # Every model's accuracy on the whole test split of the same classes.
    test = tuple(torch.as_tensor(a) for a in load_fmnist(root, classes=plan["classes"],
                                                         train=False, download=download))
    return _Data(X_all, y_all, X, y, aux, test)


def _run(plan: dict, canary_kind: str, root, download: bool, seed: int, out: Path,
         losses_path: Path | None, provenance: dict, store: Path | None = None) -> None:
    """Train, audit and write the two tables of a checked ``plan``; with ``store``, keep
    each implementation's batches of runs in ``store/<implementation>`` (the registry
    subjects of one spec trained as columns of the same calls)."""
    import functools

    from .. import canaries, subjects
    from ..device import describe

    data = _load(plan, root, download)
    canary = canaries.make_canary(canary_kind, data.X, data.y, plan["label"])
    # Where dpaudit's trainer runs each registry subject (its spec's `device`); a user's
    # function chooses its own.
    registry = [(t, s) for t, fn, s in plan["plans"] if fn in subjects.SUBJECTS.values()]
    devices = {t: describe(s.get("device", "auto")) for t, s in registry}
    kept = {} if store is None else _kept(plan, registry, store, seed, data, canary_kind)
    rows, losses = [], []
    for target, fn, spec in plan["plans"]:
        _, where, key = kept.get(target, (fn, None, None))
        # Trained beside it where both are registry subjects (subjects.train_columns).
        together = {t: kept[t] for t, _, s in plan["plans"] if t != target and t in kept
                    and s == spec and plan["mode"] == "black-box"}
        loop = {}  # --opacus-loop: the claim the training reports, once measured
        more = ({"prepare": functools.partial(_loop_prepare, plan, target, data, canary, seed,
                                              loop)} if plan["opacus_loop"]
                else _inputs(plan, data, seed, spec, plan["claims"][target]))
        row, loss = _audit_or_refuse(plan, target, fn, data, canary, spec, seed, store=where,
                                     key=key, together=together, **more)
        _report(plan, target, row)
        if loop:  # the claim's source, both reports and the relation actually trained
            row.update(claim_source="reported by train", reported_eps_n=loop["reported"][0],
                       reported_eps_n1=loop["reported"][1], rows_without=loop["rows"][0],
                       rows_with=loop["rows"][1], relation=loop["relation"],
                       given_eps=math.nan if plan["eps"] is None else plan["eps"],
                       measured_spec=json.dumps(loop["spec"], sort_keys=True),
                       measured=json.dumps(loop["measured"]))
        rows.append({"implementation": target, **row, "min_runs": loop.get(
            "min_runs", plan["min_runs"]), "n_train": plan["n_train"]})
        losses.append(loss.assign(implementation=target))
    _write(rows, losses, devices, provenance, out, losses_path)


def _kept(plan: dict, registry: list, store: Path, seed: int, data: _Data,
          canary_kind: str) -> dict:
    """{implementation: (training function, its folder in ``store``, what a kept batch of
    its runs depends on)} of the registry subjects of ``plan`` (the digest does not cover
    a user's code)."""
    import re

    from ..device import reproduce_key
    from ..experiments import tramer
    from ..io import array_digest

    mode = plan["mode"]
    common = {"seed": seed, "data_sha256": array_digest({"X": data.X, "y": data.y}),
              "canary": [canary_kind, plan["label"]], "trainer": tramer.trainer_digest()}
    # Those of one spec train as columns of one call, which the key names (a column's
    # models equal a subject's alone to float rounding only).
    return {target: (fn, store / re.sub(r"[^A-Za-z0-9]+", "_", target),
                     {"implementation": target, "spec": spec, **common,
                      **({} if mode == "black-box" else {"mode": mode, "n_aux": plan["n_aux"]}),
                      **({"mates": plan["mates"]} if plan["mates"] else {}),
                      "device": reproduce_key(spec.get("device", "auto")),
                      "columns": sorted(t for t, s in registry if s == spec)})
            for target, fn, spec in plan["plans"] if (target, spec) in registry}


def _inputs(plan: dict, data: _Data, seed: int, spec: dict, claim) -> dict:
    """The profile test of ``claim`` and the worst-case init of ``spec``'s model."""
    import torch

    from .. import subjects
    from ..experiments import tramer

    init = None
    if data.aux is not None:
        model = subjects.model_spec(spec, data.X.shape[1], len(plan["classes"]))
        init = tramer.pretrained_init(torch.as_tensor(data.X_all[data.aux]),
                                      torch.as_tensor(data.y_all[data.aux]), model, seed)
    return {"init": init, "profile": None if claim is None else tramer.claimed_profile(*claim)}


def _loop_prepare(plan: dict, target: str, data: _Data, canary, seed: int, loop: dict,
                  train_fn):
    """--opacus-loop: (plan, spec, more keyword arguments) of ``target`` once its claim is
    measured (:func:`_loop_claim`, kept in ``loop``)."""
    from .. import subjects

    loop.update(_loop_claim(plan, target, train_fn, data.X, data.y, canary, seed))
    spec = loop["spec"]
    claim = subjects.claimed_dpsgd(spec, loop["eps"], plan["delta"], plan["n_train"]) \
        if "q" in spec else None
    print(f"audit-impl: {target}: " + (
        f"no profile test: {loop['profile']}" if claim is None else "profile test "
        "against correct DP-SGD at noise multiplier {:.4g}, q = {:g}, T = {}".format(
            *claim)), file=sys.stderr)
    return {**plan, "eps": loop["eps"]}, spec, _inputs(plan, data, seed, spec, claim)


def _audit_or_refuse(plan: dict, target: str, fn, data: _Data, canary, spec: dict,
                     seed: int, **more):
    """:func:`_audit_one` of ``target``; a SpecError naming it where it cannot be audited
    or its code fails (a user's frames printed; dpaudit's own code's error raised as is)."""
    from .. import subjects
    from ..experiments import tramer

    try:
        return _audit_one(plan, target, fn, data.X, data.y, canary, spec, seed,
                          test=data.test, **more)
    except tramer.Unauditable as exc:
        raise SpecError(f"--train {target}: cannot be audited, no result written: "
                        f"{exc}") from exc
    except tramer.UserCodeFailed as exc:
        if exc.timed_out:
            raise SpecError(f"--train {target}: {exc.call} ran past the per-call time "
                            f"limit of {exc.limit:g} s (--call-timeout); no result "
                            "written") from None
        if exc.__cause__ is not None and fn in subjects.SUBJECTS.values():
            raise exc.__cause__  # dpaudit's own code: its traceback
        if exc.trace:  # the user's frames (and their libraries'), not dpaudit's
            print(exc.trace, end="", file=sys.stderr)
        raise SpecError(f"--train {target}: {exc.call} {exc.what}; no result "
                        "written") from None


def _report(plan: dict, target: str, row: dict) -> None:
    """The audit of ``target`` in a few lines on stderr."""
    checked = (f"{row['seed_check']} seeds re-trained before the runs, and "
               f"{row['seed_check']} runs of each side after them: deterministic"
               if row["seed_check"] else "seeds not checked")
    accuracy = (f"test accuracy {row['test_acc_mean']:.3f} ({row['test_acc_min']:.3f}-"
                f"{row['test_acc_max']:.3f})" if "test_acc_mean" in row
                else "no test accuracy (white-box runs return no model)")
    tested = (f"; profile test: delta_LB {row['delta_lb']:.4g} against the claimed "
              f"{row['delta_claim_at_eps_star']:.4g} at eps {row['eps_star']:.2f}, "
              f"{'violated' if row['profile_violated'] else 'not violated'}"
              if "profile_violated" in row else "")
    print(f"audit-impl: {target}: TPR {row['tpr']:.4f} FPR {row['fpr']:.4f} eps_LB "
          f"{row['eps_lb']:.3f} (claimed eps {row['claimed_eps']:g}){tested}: "
          f"{row['verdict']}; "
          f"{row['usable_runs']} of {row['total_runs']} runs usable "
          f"({row['diverged_runs']} diverged, counted as out); {checked}; {accuracy}",
          file=sys.stderr)
    if "looks" in row:
        print(f"audit-impl: {target}: sequential: stopped ({row['stop_reason']}) at look "
              f"{row['looks']}, {row['runs_in']} + {row['runs_out']} evaluation runs "
              f"(in + out) of at most {plan['runs']} per side; bounds anytime-valid at "
              f"confidence 1 - {plan['alpha']:g}", file=sys.stderr)


def _write(rows: list, losses: list, devices: dict, provenance: dict, out: Path,
           losses_path: Path | None) -> None:
    """The audit table of ``rows`` at ``out`` and the per-run losses at ``losses_path``
    (default: beside it), with ``provenance`` and the registry subjects' ``devices``."""
    import pandas as pd

    from ..io import write_table

    table = pd.DataFrame(rows)
    table = table[COLUMNS + [c for c in table.columns if c not in COLUMNS]]
    loss_table = pd.concat(losses, ignore_index=True)
    loss_table = loss_table[["implementation"] + [c for c in loss_table if c != "implementation"]]
    # The device dpaudit's trainer used for the registry subjects: with CUDA the same seeds
    # draw the same numbers as on the CPU, but the products round differently.
    if devices:
        provenance = {**provenance, "device": next(iter(devices.values())) if len(
            {d["device"] for d in devices.values()}) == 1 else devices}
    write_table(loss_table, losses_path or out.with_name(f"{out.stem}_losses.csv"), provenance)
    write_table(table, out, provenance)


def _audit_one(plan: dict, target: str, fn, X, y, canary, spec: dict, seed: int,
               prepare=None, **more):
    """:func:`dpaudit.experiments.tramer.audit_implementation` of one implementation of
    ``plan`` (``more``: its keyword arguments of this implementation): a user's function
    in a worker process of its own (:class:`dpaudit.user_code.Worker`, killed with its
    process group when the audit ends, however it ends); the registry subjects, dpaudit's
    own code, here, where those of one spec train as columns of the same calls.
    ``prepare(train_fn)``: in the worker, before the audit, (plan, spec, more keyword
    arguments) of this implementation (--opacus-loop's claim)."""
    import contextlib

    from .. import subjects, user_code
    from ..experiments import tramer

    own = fn in subjects.SUBJECTS.values()
    # An adapter object (--opacus-loop) travels to the worker as itself (it pickles by the
    # user's target); a user's function by its "module:function".
    with (contextlib.nullcontext(fn) if own else
          user_code.Worker(fn if plan.get("opacus_loop") else target, fn,
                           plan.get("threads", 1))) as train_fn:
        if prepare is not None:
            plan, spec, extra = prepare(train_fn)
            more.update(extra)
        return tramer.audit_implementation(
            train_fn, X, y, canary, plan["eps"], plan["delta"], plan["runs"],
            plan["val_runs"], spec, seed, plan["alpha"], plan["batch_runs"],
            progress=lambda msg: print(f"audit-impl: {target}: {msg}", file=sys.stderr),
            seed_check=plan["seed_check"], max_diverged=plan["max_diverged"],
            mode=plan["mode"], refuse_at_chance=not own,
            call_limit=plan["call_limit"] or None, mates=plan["mates"],
            schedule=None if not plan.get("sequential") else tramer.schedule_of(
                plan["runs"], plan["budget"]), **more)


def _loop_claim(plan: dict, target: str, train_fn, X, y, canary, seed: int) -> dict:
    """--opacus-loop: the claim of ``target``, the eps its training reports on X and on X
    with the mode's canary row (:meth:`dpaudit.adapters.opacus_loop.OpacusLoop.claim`, in
    the worker), printed with both reports; a SpecError where the runs are too few to
    refute it."""
    from .. import seeds as seeding, user_code

    call = "train(X, y, seed) of the claim's runs on n and n + 1 rows"
    row = None if plan["mode"] == "white-box" else (
        canary.x, 0 if canary.label is None else int(canary.label))
    c = user_code.call(train_fn, X, y, {
        "names": (call, call), "seeds": seeding.int_seeds(1, seed, "opacus-loop/claim"),
        "spec": {"delta": plan["delta"]}, "method": "claim", "extra": {"row": row}},
        plan["call_limit"] or None)["value"]
    (n0, n1), (e0, e1) = c["rows"], c["reported"]
    given = plan["eps"]
    print(f"audit-impl: {target}: claim eps {c['eps']:.6g} at delta {plan['delta']:g}: the "
          f"eps train reports on the n = {n0} rows without the canary ({e1:.6g} on the "
          f"n + 1 = {n1} with it{'' if e0 == e1 else '; the larger is the claim'}; "
          f"relation {c['relation']})" + ("" if given is None or given == c["eps"] else
                                          f"; --eps {given:g} differs: recorded, not tested"),
          file=sys.stderr)
    c["min_runs"] = _enough(plan["runs"], c["eps"], plan["delta"], plan["alpha"])
    return c


def _interruptible(command: str, run) -> None:
    """``run()``; Ctrl-C ends it with one line and exit status 130 (a worker process is
    killed on the way out), not a traceback."""
    try:
        run()
    except KeyboardInterrupt:
        print(f"dpaudit {command}: interrupted; no result written", file=sys.stderr)
        raise SystemExit(130) from None


def _sequential(args) -> dict:
    """``--sequential`` and ``--budget`` of audit-impl, checked."""
    if args.budget is not None and not args.sequential:
        raise SpecError(f"--budget={args.budget!r}: only with --sequential")
    if args.sequential and args.store is not None:
        raise SpecError("--store: not with --sequential (a sequential audit keeps no batches)")
    budget = math.inf if args.budget is None else args.budget
    if not budget > 0:  # nan fails too
        raise SpecError(f"--budget={args.budget!r}: must be a number of seconds > 0")
    return {"sequential": args.sequential, "budget": budget}


def _audit_impl(args) -> None:
    try:
        classes = [int(c) for c in args.classes.split(",")]
    except ValueError:
        classes = []
    sequential = _sequential(args)
    plan = _check(Request(args.train, args.eps, args.delta, args.alpha, args.runs,
                          args.val_runs, args.n_train, args.batch_runs, classes, args.label,
                          args.spec, seed_check=args.seed_check,
                          max_diverged=args.max_diverged, mode=args.mode, n_aux=args.n_aux,
                          call_limit=args.call_timeout, mates=args.mates,
                          opacus_loop=args.opacus_loop))
    if args.opacus_loop and args.store is not None:
        raise SpecError("--store: not with --opacus-loop (it keeps the registry subjects' "
                        "runs only)")
    plan["threads"] = _positive_int(args.threads, "--threads")
    plan.update(sequential)
    # The default mode's provenance is as before the tight modes (and batch mates): byte-
    # identical files; a time limit changes no number.
    tight = () if args.mode == "black-box" else ("mode", "n_aux")
    provenance = {"command": "audit-impl", "spec": args.spec, "seed": args.seed,
                  "args": {k: v for k, v in vars(args).items()
                           if k not in ("func", "call_timeout")
                           and (k not in ("mode", "n_aux") or k in tight)
                           and (k != "mates" or args.mates)
                           and (k != "threads" or args.threads != 1)
                           and (k != "opacus_loop" or args.opacus_loop)
                           and (k not in ("sequential", "budget") or args.sequential)}}
    _interruptible("audit-impl", lambda: _run(plan, args.canary, args.data_root,
                                              args.download, args.seed, args.out,
                                              args.losses, provenance, args.store))


def _tramer_audit(args) -> None:
    sec = validate_section(args.spec, "tramer",
                           schema_node=subset_schema(SPEC_KEYS[args.target], "tramer"))
    data = validate_section(args.data, "data")
    if args.target == "case-study":
        train, claim, spec = sec["implementations"], sec, sec["model"]
    else:
        claim = sec["user"]
        train, spec = [claim["train"]], json.loads(claim["spec"])
        if not isinstance(spec, dict):
            raise SpecError(f"tramer.user.spec={claim['spec']!r}: must be a JSON object")
    plan = _check(Request(train, claim["eps"], claim["delta"], sec["alpha"], claim["runs"],
                          claim["val_runs"], sec["n_train"], sec["batch_runs"], sec["classes"],
                          None, spec, args.device, claim.get("seed_check"),
                          claim.get("max_diverged", 0.0), claim.get("mode", "black-box"),
                          claim.get("n_aux", 500)))
    provenance = {"command": "tramer-audit", "target": args.target, "spec": sec, "data": data,
                  "seed": args.seed}
    _interruptible("tramer-audit", lambda: _run(plan, claim["canary"], data["root"],
                                                data["download"], args.seed, args.out,
                                                args.losses, provenance, args.store))


def _reaudit(args) -> None:
    import pandas as pd

    from ..experiments import tramer
    from ..io import read_table, write_table
    from ..plots.tramer import LOSS_COLUMNS, loss_histogram

    table, table_prov = read_table(args.table, columns=(*tramer.REAUDIT_COLUMNS, "eps_lb"),
                                   what="tramer-audit")
    # the run key matches the re-trained runs (--accuracy) to these
    retrained = tramer.RUN_KEY if args.accuracy is not None else ()
    losses, losses_prov = read_table(args.losses, columns=(*LOSS_COLUMNS, *retrained),
                                     what="tramer-audit --losses")
    accuracy, acc_prov, source = None, None, tramer.OWN_RUNS
    if args.accuracy is not None:
        accuracy, acc_prov = read_table(args.accuracy,
                                        columns=(*tramer.RUN_KEY, "loss", "test_acc"),
                                        what="tramer-audit --losses (of re-trained runs)")
        where = acc_prov.get("device", {}).get("device")
        source = f"re-trained{f' on {where}' if where else ''} with the same seeds"
    try:
        new = tramer.reaudit(table, losses, accuracy, source)
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
    for old, row in zip(table.to_dict("records"), new.to_dict("records")):
        print(f"tramer-reaudit: {row['implementation']}: eps_LB {row['eps_lb']:.6g} (table "
              f"{old['eps_lb']:.6g}), TPR {row['tpr']:.6g}, FPR {row['fpr']:.6g}: "
              f"{row['verdict']}; test accuracy {row['test_acc_mean']:.3f} "
              f"({row['test_acc_min']:.3f}-{row['test_acc_max']:.3f}) of "
              f"{row['test_acc_models']} models, {source}", file=sys.stderr)
    provenance = {"command": "tramer-reaudit", "table": str(args.table), "losses":
                  str(args.losses), "accuracy": None if args.accuracy is None
                  else str(args.accuracy), "audit": table_prov,
                  "accuracy_audit": acc_prov, "seed": table_prov.get("seed")}
    if accuracy is not None:  # are the re-trained models like the audited ones?
        check = tramer.compare_retrained(losses, accuracy)
        for row in check.itertuples():
            print(f"tramer-reaudit: {row.implementation} {row.split} runs "
                  f"{'with' if row.canary_in else 'without'} the canary: {row.runs} "
                  f"re-trained, canary losses against the same runs' in the losses table: "
                  f"KS {row.ks:.3f} (p = {row.p:.2g})",
                  file=sys.stderr)
        provenance["retrained_vs_audited"] = check.to_dict("records")
    write_table(loss_histogram(losses), args.hist, {**provenance, "of": "evaluation runs"})
    write_table(pd.DataFrame(new), args.out, provenance)


def _plot(args) -> None:
    from ..plots.tramer import plot_canary_losses

    if (args.losses is None) == (args.hist is None):
        raise SpecError("tramer-plot: give exactly one of --losses and --hist")
    plot_canary_losses(args.table, args.out, losses=args.losses, hist=args.hist)


#: ``--store`` of ``audit-impl`` and ``tramer-audit``.
STORE_HELP = ("folder that keeps every finished batch of runs of the registry subjects (buggy, "
              "fixed, half-steps, half-noise), so that a rerun trains only what it lacks; the "
              "subjects of one spec train as columns of the same calls")


def _claim_options(p) -> None:
    """audit-impl's options of the claim and the canary: what is tested."""
    p.add_argument("--train", action="extend", nargs="+", required=True, metavar="TARGET",
                   help="'buggy', 'fixed', 'half-steps', 'half-noise' or 'module.path:function' "
                        "(several: one table row each)")
    p.add_argument("--eps", default=None,
                   help="claimed epsilon (required, but with --opacus-loop, whose claim is "
                        "the eps the training reports; given there, it is recorded)")
    p.add_argument("--delta", required=True, help="claimed delta")
    p.add_argument("--canary", choices=["checkerboard", "clipbkd"], default="checkerboard")
    p.add_argument("--label", type=int, default=None,
                   help="canary label (default: least likely on validation runs without it)")
    p.add_argument("--runs", type=int, required=True, help="evaluation runs per side")
    p.add_argument("--val-runs", type=int, default=100, help="validation runs per side")
    p.add_argument("--alpha", default="1e-10", help="1 - confidence of eps_LB and mu_LB")
    p.add_argument("--spec", type=spec_arg, default={},
                   help="JSON object passed to the training function as `spec`")


def _runs_options(p) -> None:
    """audit-impl's options of the data, the runs, the seed and where the results go."""
    p.add_argument("--classes", default="0,1", help="FMNIST classes, comma-separated")
    p.add_argument("--n-train", type=int, default=500,
                   help="training-set size: the first N of the reference FMNIST subset")
    p.add_argument("--data-root", default=None, help="data folder (default $DPAUDIT_DATA)")
    p.add_argument("--download", action="store_true",
                   help="let torchvision download Fashion-MNIST if no local copy is found")
    p.add_argument("--batch-runs", type=int, default=1000, help="runs per training call")
    p.add_argument("--seed", type=seed_arg, required=True, help="master seed of the runs")
    p.add_argument("--out", type=out_file, required=True, help="audit table CSV")
    p.add_argument("--losses", type=out_file, default=None,
                   help="per-run canary losses CSV (default: OUT with suffix _losses)")
    p.add_argument("--store", type=out_dir, default=None, help=STORE_HELP)


def _integrity_options(p) -> None:
    """audit-impl's options of the checks of the runs' integrity."""
    p.add_argument("--seed-check", type=int, default=None, metavar="K",
                   help="before the runs, train K seeds twice (the second time in reverse "
                        "order) and refuse the function unless each seed gives the same "
                        "logits and different seeds differ; after them, re-train K runs of "
                        "each side drawn from their outputs, and probe that the mode's "
                        "init, canary and mates change the runs; 0 skips these (default 3)")
    p.add_argument("--max-diverged", type=float, default=0.0, metavar="F",
                   help="largest fraction of runs that may diverge (non-finite canary loss; "
                        "they count as 'out'); more, and the audit refuses (default 0)")


def _mode_options(p) -> None:
    """audit-impl's options of the mode: black-box or a tight one, and its inputs."""
    p.add_argument("--mode", choices=MODES, default="black-box",
                   help="black-box: the Tramer et al. 2022 procedure (default); "
                        "worst-case-init: every run starts from the auditor's pre-trained "
                        "parameters, passed as init= (Annamalai and De Cristofaro 2024); "
                        "white-box: a gradient canary inserted at every sampled step, "
                        "passed as canaries=, every iterate scored (Nasr et al. 2023)")
    p.add_argument("--mates", type=float, default=0.0, metavar="M",
                   help="white-box: every example sampled with the canary adds M times its "
                        "direction (Chua et al.'s crafted batch mates, -1; docs/shuffle.md), "
                        "so that shuffled batches under Poisson accounting are caught "
                        "(default 0: none)")
    p.add_argument("--n-aux", type=int, default=500, metavar="N",
                   help="worst-case-init: pre-train the init on the N examples after the "
                        "first --n-train of the reference subset (default 500)")


def _worker_options(p) -> None:
    """audit-impl's options of how a user's training function runs."""
    p.add_argument("--call-timeout", type=float, default=CALL_LIMIT, metavar="SECONDS",
                   help="longest one call of a training function (or of its predict) may "
                        "take; past it the audit stops, naming the call; 0: no limit "
                        f"(default {CALL_LIMIT:g})")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch (and OpenMP) threads of the worker process that runs a "
                        "user's training function (default 1; docs/audit_your_implementation.md)")
    p.add_argument("--opacus-loop", action="store_true",
                   help="each --train is a user's own Opacus training, train(X, y, seed) -> "
                        "(model, reported_eps), run unmodified with its Opacus objects "
                        "instrumented, in every mode; the claim is the eps it reports "
                        "(docs/audit_your_implementation.md#opacus-trainings)")


def _sequential_options(p) -> None:
    """audit-impl's options of a sequential audit."""
    p.add_argument("--sequential", action="store_true",
                   help="train the evaluation runs in rounds and stop at the first certified "
                        "violation, anytime-valid (confidence sequences); --runs is then the "
                        "most evaluation runs per side (docs/audit_your_implementation.md)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="--sequential: no new round of evaluation runs after SECONDS of them "
                        "(wall clock, after the validation runs; default: none)")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "audit-impl", help="audit a DP training function's claimed (eps, delta) with a canary",
        description="Train TARGET on Fashion-MNIST with and without a canary, RUNS times per "
                    "side (plus VAL_RUNS per side to pick the label and threshold), and test "
                    "the claimed (eps, delta) with Clopper-Pearson at confidence 1 - ALPHA and "
                    "the GDP test (Tramer et al. 2022); where the spec names q and steps (or "
                    "batch_size and epochs), also the claimed DP-SGD privacy profile.")
    _claim_options(p)
    _runs_options(p)
    _integrity_options(p)
    _mode_options(p)
    _worker_options(p)
    _sequential_options(p)
    p.set_defaults(func=_audit_impl)

    p = subparsers.add_parser(
        "tramer-audit", help="the audits of the tramer config section (the rules' entry point)")
    p.add_argument("--target", choices=["case-study", "user"], required=True,
                   help="case-study: tramer.implementations at the section's claim; "
                        "user: tramer.user")
    p.add_argument("--spec", type=spec_arg, required=True,
                   help="the keys of the tramer config section the target depends on")
    p.add_argument("--data", type=spec_arg, required=True, help="the data config section")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where the registry subjects train (tramer.device), unless the "
                        "target's spec names a device")
    p.add_argument("--seed", type=seed_arg, required=True, help="master seed of the runs")
    p.add_argument("--out", type=out_file, required=True, help="audit table CSV")
    p.add_argument("--losses", type=out_file, required=True, help="per-run canary losses CSV")
    p.add_argument("--store", type=out_dir, default=None, help=STORE_HELP)
    p.set_defaults(func=_tramer_audit)

    p = subparsers.add_parser(
        "tramer-reaudit", help="an audit table recomputed from its per-run losses",
        description="Recompute the audit table TABLE of tramer-audit or audit-impl from its "
                    "per-run losses LOSSES (same threshold choice, counts and bounds), add the "
                    "models' test accuracy (from LOSSES, or from ACCURACY: the losses table "
                    "of a re-training of some of the same runs), and write the histogram of "
                    "the evaluation losses that tramer-plot --hist draws.")
    p.add_argument("--table", type=Path, required=True, help="audit table CSV")
    p.add_argument("--losses", type=Path, required=True, help="its per-run losses CSV")
    p.add_argument("--accuracy", type=Path, default=None,
                   help="losses CSV with test_acc of a re-training of some of the same runs "
                        "(same seed and config)")
    p.add_argument("--out", type=out_file, required=True, help="the recomputed audit table CSV")
    p.add_argument("--hist", type=out_file, required=True,
                   help="histogram CSV of the evaluation losses (for tramer-plot --hist)")
    p.set_defaults(func=_reaudit)

    p = subparsers.add_parser("tramer-plot", help="histograms of the canary loss with/without")
    p.add_argument("--table", type=Path, required=True, help="CSV from audit-impl")
    p.add_argument("--losses", type=Path, default=None, help="losses CSV from audit-impl")
    p.add_argument("--hist", type=Path, default=None,
                   help="instead of --losses: histogram CSV from tramer-reaudit")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
