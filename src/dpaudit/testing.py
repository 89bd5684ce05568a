"""Privacy checks for a test suite: :func:`assert_private` audits a DP training function
sequentially (``dpaudit audit-impl --sequential``) and fails the test on a certified
violation of its claimed (eps, delta).

The training function runs in this process (:func:`dpaudit.user_code.in_process`, the same
contract checks as the CLI's worker): a test's function is often a closure or a local
function that a worker process could not import, and a test suite already trusts the code
it tests. The audit is the CLI's, run by run and bound by bound: the same seeds, rounds,
thresholds and anytime-valid bounds, so a failure names the command line that reproduces
its numbers (on Fashion-MNIST; with arrays of your own, the call with the same seed does).

Passing means only that no violation was detected in the runs the budget allowed: a lower
bound below the claim is not a proof that the implementation is private.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass

import pandas as pd
import torch

from . import canaries, subjects
from .experiments import tramer

#: What passing means, in every passing result's message.
NOT_A_PROOF = ("no violation detected is not a proof of privacy: an audit bounds eps from "
               "below, and a bound below the claim shows only that these runs could not refute it")


@dataclass(frozen=True)
class PrivacyCheck:
    """A passed :func:`assert_private`: the audit ``row`` (the CLI table's columns), the
    per-run ``losses`` (or white-box scores) of the runs trained, the reproducing
    ``command`` (None where the CLI cannot rerun it) and a ``message`` that says what
    passing means."""

    row: dict
    losses: pd.DataFrame
    command: str | None
    message: str


@dataclass(frozen=True)
class Options:
    """The rarely changed settings of :func:`assert_private`: ``val_runs`` validation runs
    per side choose the threshold; the ``canary`` (a kind of :func:`dpaudit.canaries.
    make_canary`); without data of your own, the first ``n_train`` examples of the audit's
    Fashion-MNIST subset of ``classes``, from ``data_root`` as the CLI loads it."""

    val_runs: int = 50
    canary: str = "checkerboard"
    n_train: int = 500
    classes: tuple = (0, 1)
    data_root: object = None


def _target(train) -> tuple[object, str | None, bool]:
    """The function, its CLI ``--train`` target (None where the CLI cannot import it) and
    whether it is a registry subject."""
    if isinstance(train, str):
        return subjects.load_train_fn(train), train, train in subjects.SUBJECTS
    own = {fn: name for name, fn in subjects.SUBJECTS.items()}
    if train in own:
        return train, own[train], True
    module, name = getattr(train, "__module__", None), getattr(train, "__qualname__", "")
    ok = module not in (None, "__main__") and "<" not in name
    return train, f"{module}:{name}" if ok else None, False


def _data(X, y, options: Options, mode: str):
    """(X, y, aux): the user's arrays, or the CLI's FMNIST subset of ``options`` (``aux``:
    the rows after the first ``n_train``, where worst-case init is pre-trained)."""
    if (X is None) != (y is None):
        raise ValueError("X, y: give both (your data) or neither (the audit's FMNIST subset)")
    if X is not None:
        if mode == "worst-case-init":
            raise ValueError("mode 'worst-case-init': only on the audit's FMNIST subset "
                             "(X=None), whose rows after the training set pre-train the init")
        return torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y).long(), None
    from .data import load_fmnist

    n_train, classes = options.n_train, options.classes
    X_all, y_all = (torch.as_tensor(a) for a in load_fmnist(options.data_root,
                                                            classes=list(classes)))
    if len(X_all) < n_train + (500 if mode == "worst-case-init" else 0):
        raise ValueError(f"n_train={n_train}: only {len(X_all)} examples of classes "
                         f"{list(classes)} in the FMNIST subset")
    return X_all[:n_train], y_all[:n_train], (X_all[n_train:n_train + 500],
                                              y_all[n_train:n_train + 500])


def _command(target: str | None, eps, delta, spec: dict, mode: str, runs: int, alpha: float,
             seed: int, options: Options) -> str | None:
    """The ``dpaudit audit-impl --sequential`` line with the same runs (no --budget: it
    only cuts rounds short, and the rounds before a certified one are the same)."""
    if target is None:
        return None
    args = ["dpaudit", "audit-impl", "--sequential", "--train", target, "--eps", f"{eps!r}",
            "--delta", f"{delta!r}", "--mode", mode, "--runs", str(runs), "--val-runs",
            str(options.val_runs), "--alpha", f"{alpha!r}", "--seed", str(seed), "--canary",
            options.canary, "--n-train", str(options.n_train), "--classes",
            ",".join(str(c) for c in options.classes), "--spec", json.dumps(spec), "--out",
            "audit.csv"]
    return shlex.join(args)


def assert_private(train, eps: float, delta: float, spec: dict, X=None, y=None,
                   mode: str = "black-box", budget_s: float | None = 60.0, alpha: float = 0.01,
                   runs: int = 1000, seed: int = 0,
                   options: Options = Options()) -> PrivacyCheck:
    """Audit ``train`` (a training function of the :mod:`dpaudit.subjects` contract, or a
    registry name / ``"module.path:function"``) against its claimed (``eps``, ``delta``)
    with ``audit-impl --sequential``'s procedure in ``mode``, and raise AssertionError on
    a certified violation, naming eps_LB (or the profile test's V), the runs it took and
    the command line that reproduces them.

    ``X``, ``y``: the training data (None: the audit's Fashion-MNIST subset,
    :class:`Options`). The validation runs choose the threshold; then evaluation runs in
    rounds, at most ``runs`` per side, no new round after ``budget_s`` seconds of them
    (None: no limit); each test holds at confidence ``1 - alpha`` however many rounds it
    took. A registry subject gets ``eps``, ``delta`` and ``n`` in its spec as the CLI
    gives them; a spec that names q and steps (or batch_size and epochs) also tests the
    claimed DP-SGD privacy profile. ``options``: the rarely changed settings
    (:class:`Options`). Returns a :class:`PrivacyCheck` whose message says that passing
    is not a proof. A function the audit cannot audit (breaks the contract, ignores its
    seeds, diverges) raises :class:`dpaudit.user_code.Unauditable`, not a pass.
    """
    if not isinstance(options, Options):
        raise ValueError(f"assert_private(options={options!r}): must be a "
                         "dpaudit.testing.Options(...)")
    fn, target, own = _target(train)
    need = tramer.min_runs(eps, delta, alpha)
    if runs < need:
        raise ValueError(f"runs={runs}: too few for eps={eps:g} at alpha={alpha:g}; even a "
                         f"perfect attack needs runs >= {need}")
    data_X, data_y, aux = _data(X, y, options, mode)
    n = len(data_X)
    full = {**spec, "eps": eps, "delta": delta, "n": n} if own else dict(spec)
    claim = subjects.claimed_dpsgd(full, eps, delta, n)
    init = None
    if aux is not None and mode == "worst-case-init":
        model = subjects.model_spec(full, data_X.shape[1], len(options.classes))
        init = tramer.pretrained_init(*aux, model, seed)
    row, losses = tramer.audit_implementation(
        fn, data_X, data_y, canaries.make_canary(options.canary, data_X, data_y, None),
        tramer.Design(eps, delta, runs, options.val_runs, seed, alpha,
                      None if claim is None else tramer.claimed_profile(*claim),
                      tramer.schedule_of(runs, budget_s if budget_s else math.inf)),
        full, mode=tramer.Mode(mode, init))
    command = (_command(target, eps, delta, spec, mode, runs, alpha, seed, options)
               if X is None else None)
    done = (f"{row['runs_in']} + {row['runs_out']} evaluation runs (in + out) of at most "
            f"{runs} per side, {row['looks']} looks, stopped: {row['stop_reason']}")
    if row["verdict"] != tramer.NO_VIOLATION:
        profile = (f", profile test V = {row['profile_violation']:+.4g} (> 0 refutes the "
                   f"claimed DP-SGD profile)" if "profile_violation" in row else "")
        again = (f"reproduce: {command}" if command else
                 f"reproduce: assert_private with the same data and seed={seed}")
        raise AssertionError(
            f"{target or getattr(fn, '__qualname__', fn)} {row['verdict']}: certified "
            f"eps_LB = {row['eps_lb']:.4g} against the claimed eps = {eps:g} (delta "
            f"{delta:g}){profile}, at confidence 1 - {alpha:g} (anytime-valid); {done}; "
            f"{again}")
    message = f"{done}; eps_LB = {row['eps_lb']:.4g} <= claimed {eps:g}: {NOT_A_PROOF}"
    return PrivacyCheck(row, losses, command, message)
