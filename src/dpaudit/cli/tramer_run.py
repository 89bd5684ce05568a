"""The running of a checked audit plan: data, training and audit of each implementation, tables."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ..config import SpecError
from .tramer_plan import enough

#: Leading columns of the audit table, in a fixed order; more follow.
COLUMNS = ["implementation", "claimed_eps", "delta", "runs", "tpr", "fpr", "threshold",
           "eps_lb", "mu_lb", "verdict"]


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


def run(plan: dict, canary_kind: str, root, download: bool, seed: int, out: Path,
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
    ``plan`` (``more``: its ``test`` split, ``init``, ``profile``, and where its batches
    are kept, ``store``, ``key``, ``together``): a user's function
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
            train_fn, X, y, canary, tramer.Design(
                plan["eps"], plan["delta"], plan["runs"], plan["val_runs"], seed, plan["alpha"],
                more["profile"], None if not plan.get("sequential") else tramer.schedule_of(
                    plan["runs"], plan["budget"])), spec, test=more["test"],
            mode=tramer.Mode(plan["mode"], more["init"], plan["mates"]),
            checks=tramer.Checks(plan["seed_check"], plan["max_diverged"], not own,
                                 plan["call_limit"] or None),
            batches=tramer.Batches(plan["batch_runs"], lambda msg: print(
                f"audit-impl: {target}: {msg}", file=sys.stderr), more["store"], more["key"],
                more["together"]))


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
    c["min_runs"] = enough(plan["runs"], c["eps"], plan["delta"], plan["alpha"])
    return c


def interruptible(command: str, run) -> None:
    """``run()``; Ctrl-C ends it with one line and exit status 130 (a worker process is
    killed on the way out), not a traceback."""
    try:
        run()
    except KeyboardInterrupt:
        print(f"dpaudit {command}: interrupted; no result written", file=sys.stderr)
        raise SystemExit(130) from None
