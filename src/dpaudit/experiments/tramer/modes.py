"""The tight modes of the audit (the package docstring): ``worst-case-init``, the auditor's
initial parameters, and ``white-box``, a gradient canary at every sampled step and every
iterate scored, with the check that the canary went in."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

from ... import dpsgd, seeds, subjects, user_code
from ...trials import Side, run as run_trials
from .claim import Design
from .recheck import recheck_whitebox
from .rounds import evaluation_rounds, sequential_columns
from .runs import Batches, Checks, Unauditable, run_seeds, run_side
from .statistics import GROUPS, audit_scores, run_columns


#: Modes of the audit (module docstring), the default first.
MODES = ("black-box", "worst-case-init", "white-box")


#: The keyword argument each tight mode passes to the training function, and what it is.
MODE_KEYWORDS = {"worst-case-init": ("init", "the auditor's initial parameters, a "
                                     "dpaudit.dpsgd.Params of one model"),
                 "white-box": ("canaries", "a dpaudit.dpsgd.GradientCanaries to insert, the "
                               "function returning the runs' dpaudit.dpsgd.CanaryRun")}


#: The tight modes insert (add) a canary: the claim is an add/remove eps.
RELATION = "add/remove"


@dataclass(frozen=True)
class Mode:
    """The mode of an audit (:data:`MODES`) and what it passes the training function:
    ``init``, the auditor's initial parameters (e.g. :func:`pretrained_init`), which mode
    ``worst-case-init`` passes to every call and the others take none of; ``mates``, the
    white-box canary's crafted batch mates (docs/shuffle.md; mode ``white-box`` only)."""

    name: str = "black-box"
    init: dpsgd.Params | None = None
    mates: float = 0.0

    def __post_init__(self):
        if (self.name == "worst-case-init") != (self.init is not None):
            raise ValueError(f"init: given in mode {self.name!r}; mode 'worst-case-init' "
                             "needs it (the auditor's initial parameters) and the others "
                             "take none")
        if self.mates and self.name != "white-box":
            raise ValueError(f"mates: only in mode 'white-box', not {self.name!r}")

    @property
    def extra(self) -> dict | None:
        """The keyword arguments of the black-box modes' calls: ``init`` where given."""
        return None if self.init is None else {"init": self.init}


def check_mode(train_fn, mode: str) -> None:
    """ValueError naming ``mode`` unless it is one of :data:`MODES` and ``train_fn`` (or a
    :class:`dpaudit.user_code.Worker`'s function) accepts the keyword argument it passes
    (:data:`MODE_KEYWORDS`), by name or ``**kwargs``."""
    train_fn = user_code.function_of(train_fn)
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: must be one of {MODES}")
    if mode not in MODE_KEYWORDS:
        return
    name, what = MODE_KEYWORDS[mode]
    try:
        params = inspect.signature(train_fn).parameters
    except (TypeError, ValueError):
        params = {}
    ok = any(p.kind is p.VAR_KEYWORD for p in params.values()) or (
        name in params and params[name].kind in (params[name].POSITIONAL_OR_KEYWORD,
                                                 params[name].KEYWORD_ONLY))
    if not ok:
        fn = getattr(train_fn, "__qualname__", repr(train_fn))
        raise ValueError(f"mode {mode!r}: the training function {fn} takes no keyword "
                         f"argument {name!r}; this mode calls train(X, y, seeds, spec, "
                         f"{name}=...) with {what} (docs/audit_your_implementation.md)")


def pretrained_init(X_aux: torch.Tensor, y_aux: torch.Tensor, model: dpsgd.ModelSpec,
                    seed: int, device="cpu") -> dpsgd.Params:
    """The worst-case initial parameters of one model: Glorot-normal weights pre-trained by
    plain SGD (no clipping, no noise; the settings of the black-box tight audit,
    :data:`dpaudit.experiments.tight.blackbox.PRETRAIN`) on auxiliary rows, seeded by
    ``seed``; by default on the CPU, so that every machine starts its runs from the same
    init bit for bit (the draws are the same on every device, the products' rounding is
    not)."""
    from ..tight.blackbox import PRETRAIN

    cfg = dpsgd.DPSGDConfig(PRETRAIN["epochs"], min(PRETRAIN["batch_size"], len(X_aux)),
                            PRETRAIN["lr"], 1e12, 0.0, "shuffle")  # no gradient reaches 1e12
    return dpsgd.train(torch.as_tensor(X_aux), torch.as_tensor(y_aux), model, cfg,
                       seeds.int_seeds(1, int(seed), "tramer/worst-case-init"), device=device)


def _tight_columns(mode: str, method: str, threat_model: str, claimed_eps: float,
                   relation: str = RELATION) -> dict:
    """The columns a tight mode adds to the row (the tight-audit table's convention)."""
    return {"mode": mode, "method": method, "threat_model": threat_model,
            "relation": relation, "eps_th": claimed_eps, "certified": True}


def _canary_scores(reply: dict, count: int) -> dict:
    """The per-run scores of a white-box call's ``reply`` (:func:`dpaudit.user_code.serve`:
    its CanaryRun's ``scores`` and ``llr``, (count, 1) float64, and its recorded
    insertions): ``score`` the likelihood ratio ``llr`` (the dot-sum ``scores`` where it
    is None, without noise), ``is_llr`` which, ``dot_sum``, and ``insertions``, how many
    times each run recorded the canary inserted."""
    def column(v):
        return np.nan_to_num(v[:, 0].numpy(), nan=-np.inf, posinf=np.inf, neginf=-np.inf)

    dot, llr = column(reply["scores"]), reply["llr"]
    inserted = sum((np.asarray(c)[:, 0] for _, _, c in reply["insertions"]
                    if tuple(np.shape(c)) == (count, 1)), np.zeros(count, np.int64))
    return {"score": dot if llr is None else column(llr), "is_llr": np.full(count, llr is not None),
            "dot_sum": dot, "insertions": inserted}


def whitebox_clip(spec: dict) -> float:
    """The clipping norm C of a white-box audit, the gradient canary's norm: ``spec["clip"]``,
    else a ValueError naming the key."""
    clip = spec.get("clip")
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0 < clip < np.inf:
        raise ValueError(f"spec.clip={clip!r}: white-box mode needs the clipping norm C the "
                         "function clips to (> 0, finite): the gradient canary's norm")
    return float(clip)


#: How unlikely a count of canary insertions may be under the draws at its rate before
#: :func:`check_insertions` refuses it.
INSERTION_ALPHA = 1e-10


def check_insertions(given: dpsgd.GradientCanaries, runs: int, inside: bool,
                     call: str) -> None:
    """Refuse (:class:`Unauditable`) a white-box ``call`` of ``runs`` runs after which the
    canaries object it was ``given`` does not record (:meth:`dpaudit.dpsgd.GradientCanaries.
    record`) that the canary went in: no training call took it; counts of another shape;
    insertions into runs without it; or, on runs with it (``inside``), a total so far from
    the ``steps * runs`` draws at its rate (Binomial) that its probability is below
    :data:`INSERTION_ALPHA` on either side (e.g. none at all where dozens were due). Scores
    of runs without the canary on both sides would otherwise read "no violation"."""
    from scipy import stats

    if not given.insertions:
        raise Unauditable(
            f"white-box mode: the gradient canary never went in: after {call} the canaries "
            "object passed records no training call (GradientCanaries.insertions is empty); "
            "pass it on as dpaudit.dpsgd.train(..., canaries=canaries), or, with another "
            "trainer, insert it and call canaries.record(steps, rate, counts)")
    for ins in given.insertions:
        if tuple(ins.counts.shape) != (runs, 1):
            raise Unauditable(f"white-box mode: after {call} the canaries object records "
                              f"insertion counts of shape {tuple(ins.counts.shape)}, not "
                              f"(len(seeds)={runs}, 1)")
        total, draws = int(ins.counts.sum()), ins.steps * runs
        if not inside and total:
            raise Unauditable(f"white-box mode: {call} inserted the canary {total} times "
                              "into runs without it")
        if inside and min(stats.binom.cdf(total, draws, ins.rate),
                          stats.binom.sf(total - 1, draws, ins.rate)) < INSERTION_ALPHA:
            raise Unauditable(
                f"white-box mode: {call} inserted the canary {total} times in {ins.steps} "
                f"steps of {runs} runs, where sampling at rate {ins.rate:g} inserts about "
                f"{draws * ins.rate:.4g} (probability of so few or so many below "
                f"{INSERTION_ALPHA:g})")


def whitebox_runs(train_fn, X: torch.Tensor, y: torch.Tensor, seeds: list[int], spec: dict,
                  direction: torch.Tensor, inside: bool, mates: float = 0.0,
                  runs: str = "runs", limit: float | None = None) -> dict:
    """The white-box runs of ``seeds`` of one side: ``train_fn(X, y, seeds, spec,
    canaries=GradientCanaries(direction, included=inside, mates=mates))`` (a
    :class:`dpaudit.user_code.Worker` or a function called here; ``runs`` names the call,
    ``limit`` bounds it) and their statistics (:func:`_canary_scores`: ``score``,
    ``is_llr``, ``dot_sum``, ``insertions``), refused (:class:`Unauditable`) where the
    output breaks the contract or the recorded insertions are implausible
    (:func:`check_insertions`)."""
    call = f"train(X, y, seeds, spec, canaries=...) of the {runs}"
    reply = user_code.call(train_fn, X, y, {
        "names": (call, call), "seeds": [int(s) for s in seeds], "spec": spec,
        "canaries": (direction, torch.full((len(seeds), 1), bool(inside)), mates)}, limit)
    check_insertions(SimpleNamespace(insertions=[dpsgd.Insertions(*i)
                                                 for i in reply["insertions"]]),
                     len(seeds), inside, call)
    return _canary_scores(reply, len(seeds))


def audit_whitebox(train_fn, X: torch.Tensor, y: torch.Tensor, design: Design, spec: dict,
                   mates: float = 0.0, checks: Checks = Checks(),
                   batches: Batches = Batches()) -> tuple[dict, pd.DataFrame]:
    """The white-box mode (module docstring): ``train_fn(X, y, seeds, spec,
    canaries=GradientCanaries(g, included, mates=mates))`` with one Dirac canary g of norm
    ``spec["clip"]`` (:func:`dpaudit.experiments.tight.whitebox.canary`, in the layout of the
    model of ``spec``, :func:`dpaudit.subjects.model_spec`), ``included`` True on the runs
    with the canary, and crafted batch ``mates`` (docs/shuffle.md; the row records them);
    each run's score is its ``llr`` (``scores`` without noise), and the runs, threshold and
    bounds of ``design`` are those of :func:`audit_implementation` on it. Returns the row
    and the per-run scores (split, canary_in, run, seed, score). Refuses
    (:class:`Unauditable`) what breaks the contract, what ``checks`` refuses (the seed
    check: its runs trained twice, the second time in reverse order, must give the same
    scores, and different seeds different ones; after the runs, :func:`recheck_whitebox` on
    runs drawn from them, with the probes of the canary and the mates), and calls after
    which the canaries object passed does not record that the canary went in as its draws
    make likely (:func:`check_insertions`). ``batches``: as in
    :func:`audit_implementation`, the mode added to the key."""
    from ..tight.whitebox import canary as dirac_canary

    check_mode(train_fn, "white-box")
    clip = whitebox_clip(spec)
    model = subjects.model_spec(spec, X.shape[1], int(y.max()) + 1)
    # On the CPU: the same canary on every machine; the trainer moves it where it trains.
    direction = dirac_canary(X.numpy(), model, clip, design.seed, device="cpu")

    def scores_of(chunk: list[int], inside: bool, runs: str, mates: float = mates) -> dict:
        return whitebox_runs(train_fn, X, y, chunk, spec, direction, inside, mates, runs,
                             checks.call_limit)

    if checks.seed_check:
        _check_seeds_whitebox(scores_of, run_seeds(design.seed, "seed-check", False,
                                                   checks.seed_check))

    def train_score(s: Side, start: int, chunk: list[int]) -> dict:
        return scores_of(chunk, s.columns["canary_in"],
                         f"{s.name} {start}-{start + len(chunk) - 1}")

    fixed = design.schedule is None  # else the evaluation runs come in rounds, after the validation
    out = run_trials([run_side(design.seed, sp, c, design.val_runs if sp == "validation"
                               else design.runs)
                      for sp, c in GROUPS if fixed or sp == "validation"],
                     train_score, batches.size, batches.progress, store=batches.store,
                     key={**(batches.key or {}), "mode": "white-box"})
    seq = None
    if not fixed:
        seq, evaluation = evaluation_rounds(
            train_score, lambda runs: runs.score.to_numpy(float), out, design, batches)
        out = pd.concat([out, evaluation], ignore_index=True)
    if checks.seed_check:  # on seeds drawn from all the runs' scores, and probes of the canary
        recheck_whitebox(scores_of, out, design.seed, checks.seed_check, mates)
    return _whitebox_row(train_fn, out, design, checks, mates, seq)


def _check_seeds_whitebox(scores_of, check: list[int]) -> None:
    """Refuse (:class:`Unauditable`) white-box runs that do not follow their seeds: the runs
    of ``check`` trained twice, the second time in reverse order, must give the same
    dot-sum scores, and different seeds different ones (``scores_of`` as in
    :func:`audit_whitebox`)."""
    runs_name = f"seed check's {len(check)} runs"
    a = scores_of(check, True, runs_name)["dot_sum"]
    b = scores_of(check[::-1], True, runs_name)["dot_sum"][::-1]
    scale = float(np.abs(a[np.isfinite(a)]).max(initial=0.0))
    if not np.allclose(a, b, rtol=0.0, atol=1e-4 * scale, equal_nan=True):
        raise Unauditable(f"not deterministic in its seed: the runs of seeds {check} "
                          f"gave other canary scores when trained again in reverse "
                          f"order ({a} then {b}); take all of a run's randomness from "
                          "its own seed")
    if np.all(a == a[0]):
        raise Unauditable(f"the runs of {len(check)} different seeds {check} gave "
                          "identical canary scores: the function ignores its seeds")


def _whitebox_row(train_fn, out: pd.DataFrame, design: Design, checks: Checks, mates: float,
                  seq: dict | None) -> tuple[dict, pd.DataFrame]:
    """The row and the per-run scores of the white-box runs ``out`` (the sequential audit's
    row ``seq`` where it ran), refused where some calls returned llr and others not, or
    too many runs diverged."""
    from ..tight.whitebox import METHODS

    is_llr = bool(out.is_llr.all())
    if out.is_llr.any() != is_llr:
        raise Unauditable("white-box mode: some calls returned llr and others None")
    table = out.rename(columns={"trial": "run"})[["split", "canary_in", "run", "seed",
                                                   "score"]]
    diverged = checks.diverged(table.score, "score")
    groups = {k: g.score.to_numpy(float) for k, g in table.groupby(["split", "canary_in"])}
    method = "whitebox-llr" if is_llr else "whitebox-dot-sum"
    row = {**run_columns(design, {"canary": "dirac-gradient"}, len(table), diverged,
                         checks.seed_check),
           **(audit_scores(groups[("validation", True)], groups[("validation", False)],
                           groups[("evaluation", True)], groups[("evaluation", False)],
                           design.claimed_eps, design.delta, design.alpha, design.profile)
              if seq is None else {"max_runs": design.runs,
                                   **sequential_columns(seq, losses=False)}),
           **_tight_columns("white-box", method, METHODS[method], design.claimed_eps,
                            subjects.canary_relation(user_code.function_of(train_fn))),
           **({"mates": float(mates)} if mates else {})}
    return row, table
