"""Auditing a DP training implementation with a canary (Tramer et al. 2022).

The test of "Debugging Differential Privacy: A Case Study for Privacy Auditing": train
many models on the data set D (negative runs) and on D' = D + {(x', y')} (positive runs),
with one *canary* (x', y') inserted once, and record the canary's loss
``l(x', y') = -log softmax(f(x'))_{y'}`` in every run.  The attack says "canary in" when
that loss is below a threshold tau, chosen on separate *validation* runs so that the
*evaluation* runs that give the counts are independent of the choice.  With ``ct_pos`` of
``n`` positive and ``ct_neg`` of ``n`` negative evaluation runs said "in":

* Clopper-Pearson (Tramer et al. 2022): an (eps, delta)-DP algorithm has
  ``TPR <= e^eps FPR + delta`` (and the same for the complementary event), so the
  one-sided Clopper-Pearson bounds ``TPR_lo`` and ``FPR_hi`` refute every
  ``eps < ln((TPR_lo - delta) / FPR_hi)``.  The CSCI 699 Week 4 lecture notes' worked
  check of Tramer et al. 2022 states its result "with p = 1e-10" and takes each of the
  two one-sided bounds at p/2 = 5e-11: that reproduces its ``alpha^+ <= 0.95509`` (FNR)
  and ``beta^- >= 0.00274`` (written for the FPR's upper bound) from TPR 4922 / 1e5 and
  FPR 174 / 1e5.  :func:`dpaudit.bounds.eps_lb_clopper_pearson` splits ``alpha`` in the
  same way, so ``alpha = 1e-10`` here is the lecture's p.
* GDP test ([NHSB23]; also in the same lecture): a mu-GDP algorithm has
  ``mu >= Phi^-1(TPR) - Phi^-1(FPR)``; the same two bounds give ``mu_LB``
  (:func:`dpaudit.bounds.mu_lb_gdp`), reported with the eps it implies at the claimed
  delta and with the mu a Gaussian mechanism claiming (eps, delta) would have.  It
  assumes the mechanism's trade-off curve is Gaussian; the verdict rests on the
  assumption-free Clopper-Pearson bound.
* For comparison, from the same counts: the approximate Katz bound
  (:func:`dpaudit.bounds.eps_lb_katz`, asymptotic) and the lower end of the Bayesian
  credible interval of Zanella-Beguelin et al. 2023 (:func:`dpaudit.bounds.eps_lb_bayes`);
  and the attack's ROC measures on the evaluation runs (Carlini et al. 2022): TPR at
  FPR <= 0.1% and <= 1%, and the AUC of minus the loss.  Neither enters the verdict.

The verdict "violates its claimed guarantee" is given when ``eps_LB`` exceeds the
claimed eps: then, unless an event of probability at most ``alpha`` occurred, the
implementation is not (eps, delta)-DP.

Where the spec says the sample rate and steps (:func:`dpaudit.subjects.claimed_dpsgd`),
the same runs also test the claimed *privacy profile* (:func:`claimed_profile`,
:func:`dpaudit.bounds.profile_audit`): an implementation that claims (eps, delta) with the
noise its accountant calibrates for (q, T) claims to be as private as correct DP-SGD at
that noise, at every e at once. Its own threshold is chosen on the validation runs; where
it refutes that (and the eps test does not) the verdict is "violates the claimed DP-SGD
privacy profile": certified at 1 - alpha too, but a statement about the profile, not about
the point (eps, delta). Each test errs with probability at most ``alpha``, so an
implementation as private as claimed is flagged by either with probability at most
``2 alpha``.

Training functions follow the contract of :mod:`dpaudit.subjects`:
``train(X, y, seeds, spec) -> predict``, ``predict(x) -> logits (len(seeds), m, C)``.

Modes (:data:`MODES`): the default ``black-box`` is the procedure above. Two tight modes
audit a function that accepts one more keyword argument, with the same runs, threshold
choice and bounds:

* ``worst-case-init`` (Annamalai and De Cristofaro 2024, "Nearly Tight Black-Box Auditing
  of Differentially Private Machine Learning"): every run starts from ``init=``, the
  auditor's initial parameters (:func:`pretrained_init`: a model pre-trained without noise
  on auxiliary rows disjoint from the training data), which DP-SGD's analysis allows to be
  anything fixed in advance; the score is still the final model's canary loss.
* ``white-box`` (Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini and Terzis 2023,
  "Tight Auditing of Differentially Private Machine Learning"): no input canary; on the
  "in" side a Dirac gradient canary of norm C is added to the clipped gradient sum at
  every step where Poisson sampling at the data's rate picks it (``canaries=``, a
  :class:`dpaudit.dpsgd.GradientCanaries`), and every iterate is observed: the function
  returns the :class:`dpaudit.dpsgd.CanaryRun` of its runs, whose per-step likelihood
  ratio ``llr`` (or, without noise, the dot-sum ``scores``) is the run's score.

Both insert (add) the canary: add/remove neighbours, so the claim is read as an add/remove
eps. The Clopper-Pearson ``eps_lb`` holds for any score (``certified``); ``eps_lb_gdp``
assumes the Gaussian trade-off curve (an estimate).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy import optimize

from .. import accounting, bounds, canaries, dpsgd, seeds, subjects, trials
from ..trials import Side, run as run_trials
from ..canaries import Canary

#: The confidence of the lecture's worked check of Tramer et al. 2022: each claim holds
#: with probability at least 1 - 1e-10.
ALPHA = 1e-10
VIOLATES = "violates its claimed guarantee"
#: The verdict where only the profile test fired (:func:`dpaudit.bounds.profile_audit`).
VIOLATES_PROFILE = "violates the claimed DP-SGD privacy profile"
NO_VIOLATION = "no violation detected"
#: The grid of e on which the profile test compares the claimed profile: beyond e = 20 no
#: count of at most 10^7 runs per side could show a delta above 0 (FPR_hi e^e > 1).
PROFILE_GRID = np.linspace(0.0, 20.0, 2001)

#: Keys of the ``tramer`` config section each audit depends on (``dpaudit tramer-audit
#: --target``): the rule passes only these, so editing one audit never reruns the other.
SPEC_KEYS = {
    "case-study": ("implementations", "eps", "delta", "alpha", "canary", "classes", "n_train",
                   "runs", "val_runs", "batch_runs", "model"),
    "user": ("user", "alpha", "classes", "n_train", "batch_runs"),
}

Progress = Callable[[str], None]

#: Modes of the audit (module docstring), the default first.
MODES = ("black-box", "worst-case-init", "white-box")
#: The keyword argument each tight mode passes to the training function, and what it is.
MODE_KEYWORDS = {"worst-case-init": ("init", "the auditor's initial parameters, a "
                                     "dpaudit.dpsgd.Params of one model"),
                 "white-box": ("canaries", "a dpaudit.dpsgd.GradientCanaries to insert, the "
                               "function returning the runs' dpaudit.dpsgd.CanaryRun")}
#: The tight modes insert (add) a canary: the claim is an add/remove eps.
RELATION = "add/remove"


def check_mode(train_fn, mode: str) -> None:
    """ValueError naming ``mode`` unless it is one of :data:`MODES` and ``train_fn``
    accepts the keyword argument it passes (:data:`MODE_KEYWORDS`), by name or ``**kwargs``."""
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
    from .tight.blackbox import PRETRAIN

    cfg = dpsgd.DPSGDConfig(PRETRAIN["epochs"], min(PRETRAIN["batch_size"], len(X_aux)),
                            PRETRAIN["lr"], 1e12, 0.0, "shuffle")  # no gradient reaches 1e12
    return dpsgd.train(torch.as_tensor(X_aux), torch.as_tensor(y_aux), model, cfg,
                       seeds.int_seeds(1, int(seed), "tramer/worst-case-init"), device=device)


# ---- training runs --------------------------------------------------------------------

def run_seeds(seed: int, split: str, canary_in: bool, count: int) -> list[int]:
    """Distinct 63-bit seeds of the ``count`` runs of one (split, side) under ``seed``
    (:func:`dpaudit.seeds.int_seeds`, keyed by the split and the side)."""
    return seeds.int_seeds(count, int(seed), f"tramer/{split}/{'in' if canary_in else 'out'}")


def _with_canary(X: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
                 insert_label: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The training data, with (x, insert_label) appended once unless the label is None."""
    if insert_label is None:
        return X, y
    return (torch.cat([X, x[None].to(X.dtype)]),
            torch.cat([y, torch.tensor([insert_label], dtype=y.dtype)]))


def trainer_digest() -> str:
    """SHA-256 of the code that turns a run's seed into its statistics (the trainer, the
    subjects, the canaries, the seed derivation, the trials loop and this module): kept
    batches of runs are reused only under the same digest."""
    import sys

    from .. import dpsgd
    from ..io import source_digest

    return source_digest(dpsgd, subjects, canaries, seeds, trials, sys.modules[__name__])


class Unauditable(ValueError):
    """The training function's runs cannot be audited (they break the contract, diverge,
    learn nothing or do not follow their seeds): any verdict on them would certify nothing."""


#: Seeds :func:`check_seeds` re-trains by default before an audit.
SEED_CHECK = 3
#: The contract of a training function's output, for messages.
CONTRACT = ("train(X, y, seeds, spec) must return predict, and predict(x) a floating-point "
            "torch tensor of logits of shape (len(seeds), len(x), n_classes)")


def _trained(train_fn, X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict,
             extra: dict | None = None):
    """``logits_of(rows)``: the logits (runs, rows, C) of ``train_fn``'s runs on (X, y)
    (``extra``: the mode's keyword arguments), refused (:class:`Unauditable`) unless they
    keep the contract, C = max label + 1."""
    predict = train_fn(X, y, list(seeds), spec, **(extra or {}))
    if not callable(predict):
        raise Unauditable(f"train returned {type(predict).__name__}, not a function; {CONTRACT}")
    runs, n_classes = len(seeds), int(y.max()) + 1

    def logits_of(rows: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            z = predict(rows.to(X.dtype))
        shape = tuple(getattr(z, "shape", ()))
        if not (isinstance(z, torch.Tensor) and z.is_floating_point()
                and shape == (runs, len(rows), n_classes)):
            got = type(z).__module__ + "." + type(z).__name__
            if hasattr(z, "shape"):
                got += f" of shape {shape}, dtype {getattr(z, 'dtype', '?')}"
            raise Unauditable(f"predict(x) returned {got}; the contract is a floating-point "
                              f"torch tensor of shape (len(seeds)={runs}, "
                              f"len(x)={len(rows)}, n_classes={n_classes})")
        return z

    return logits_of


def train_runs(train_fn, X: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
               seeds: Sequence[int], spec: dict, insert_label: int | None = None,
               test: tuple[torch.Tensor, torch.Tensor] | None = None,
               extra: dict | None = None) -> dict:
    """Train ``len(seeds)`` models at once with ``train_fn`` (``extra``: the mode's keyword
    arguments; with ``insert_label``, the
    canary (x, insert_label) appended once to the training data) and return
    ``log_prob``, the log-probabilities (runs, C) they give the canary input ``x``, and,
    with ``test = (X_test, y_test)``, ``test_acc``, each model's accuracy (runs,) on it.
    Output that breaks the contract (:data:`CONTRACT`) is refused (:class:`Unauditable`).

    NaN outputs (a diverged run) become -inf log-probabilities, i.e. infinite loss: a
    fixed decision; a test prediction with a non-finite logit counts as wrong.
    """
    X, y = _with_canary(X, y, x, insert_label)
    logits_of = _trained(train_fn, X, y, seeds, spec, extra)
    # The canary in a call of its own: its logits do not depend on the test set's size
    # (a matmul's rounding does), so the losses stay those of an audit without it.
    lp = torch.log_softmax(logits_of(x[None])[:, 0].to(torch.float64), dim=-1).cpu().numpy()
    out = {"log_prob": np.nan_to_num(lp, nan=-np.inf, posinf=np.inf, neginf=-np.inf)}
    if test is not None:
        z = logits_of(test[0])
        right = (z.argmax(-1) == test[1].to(z.device)) & torch.isfinite(z).all(-1)
        out["test_acc"] = right.to(torch.float64).mean(1).cpu().numpy()
    return out


def check_options(seed_check: int, max_diverged: float) -> None:
    """ValueError naming the option unless ``seed_check`` (seeds of :func:`check_seeds`)
    is 0 (no check) or >= 2 and ``max_diverged`` is a fraction in [0, 1)."""
    if seed_check == 1 or seed_check < 0:
        raise ValueError(f"seed_check={seed_check}: must be 0 (no check) or >= 2 seeds")
    if not 0 <= max_diverged < 1:
        raise ValueError(f"max_diverged={max_diverged!r}: must be a fraction in [0, 1)")


def check_seeds(train_fn, X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict,
                rows: torch.Tensor, extra: dict | None = None) -> None:
    """Refuse (:class:`Unauditable`) a function whose runs do not follow their seeds.

    Trains the runs of ``seeds`` (at least 2) twice, the second time in reverse order, and
    compares their logits on ``rows`` (the canary first): a run must give the same logits
    (to 1e-4 of their largest magnitude, which GPU reductions' rounding stays within)
    wherever its seed stands in the call, or its randomness does not come from its seed
    alone (a global generator, or one seeded by the call); and the runs of different seeds
    must not all give identical logits (one fixed seed for every run), or they are not
    independent runs and no count of them bounds a probability.  Refuses first when every
    run's canary logits are non-finite (diverged), as the audit would later.
    """
    seeds = list(seeds)
    if len(seeds) < 2:
        raise ValueError(f"seeds: the check needs at least 2, got {len(seeds)}")
    z = _trained(train_fn, X, y, seeds, spec, extra)(rows).to(torch.float64).cpu()
    if not torch.isfinite(z[:, 0]).all(-1).any():
        raise Unauditable(f"all {len(seeds)} runs of the seed check diverged (non-finite "
                          "logits on the canary input)")
    again = _trained(train_fn, X, y, seeds[::-1], spec, extra)(rows).to(
        torch.float64).cpu().flip(0)
    finite = z[torch.isfinite(z)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    for k, seed in enumerate(seeds):
        if not torch.allclose(z[k], again[k], rtol=0.0, atol=1e-4 * scale, equal_nan=True):
            raise Unauditable(
                f"not deterministic in its seed: the run of seed {seed} gave other logits "
                f"when trained again (seeds {seeds}, then reversed; largest difference "
                f"{float((z[k] - again[k]).abs().nan_to_num(nan=np.inf).max()):.3g} at "
                f"logit scale {scale:.3g}); take all of a run's randomness from its own "
                "seed, e.g. torch.Generator().manual_seed(seed)")
    if all(torch.equal(z[k], z[0]) for k in range(1, len(seeds))):
        raise Unauditable(f"the runs of {len(seeds)} different seeds {seeds} gave identical "
                          "logits: the function ignores its seeds (one fixed seed for every "
                          "run?); runs must be independent, one per seed")


def accuracy_columns(test_acc, source: str) -> dict:
    """The audit row's test-accuracy columns from the per-model accuracies ``test_acc``:
    mean, min and max, how many models, and ``source`` (which models they are)."""
    acc = np.asarray(test_acc, float)
    if acc.size == 0 or not np.isfinite(acc).all():
        raise ValueError(f"test_acc: need finite accuracies of at least one model; got "
                         f"{acc.size} values")
    return {"test_acc_mean": float(acc.mean()), "test_acc_min": float(acc.min()),
            "test_acc_max": float(acc.max()), "test_acc_models": int(acc.size),
            "test_acc_source": source}


# ---- statistics -----------------------------------------------------------------------

def mu_claimed(eps: float, delta: float) -> float:
    """mu of the Gaussian mechanism that is exactly (eps, delta)-DP: the root of
    ``delta_from_mu(mu, eps) = delta`` ([DRS19] Corollary 2.13; increasing in mu)."""
    f = lambda mu: bounds.delta_from_mu(mu, eps) - delta  # noqa: E731
    hi = 1.0
    while f(hi) < 0:
        hi *= 2
    return float(optimize.brentq(f, 1e-12, hi, xtol=1e-14, rtol=1e-12))


@dataclass(frozen=True)
class ClaimedProfile:
    """The privacy profile an implementation claims with (eps, delta) in its setting: that
    of correct DP-SGD, T = ``steps`` Poisson-subsampled Gaussian steps at rate ``q`` with
    the noise multiplier ``sigma`` its accountant calibrates, ``deltas`` on ``epsilons``
    (add/remove, :func:`dpaudit.accounting.privacy_profile`: an upper bound)."""

    sigma: float
    q: float
    steps: int
    epsilons: np.ndarray
    deltas: np.ndarray


def claimed_profile(sigma: float, q: float, steps: int) -> ClaimedProfile:
    """The :class:`ClaimedProfile` of correct DP-SGD at noise multiplier ``sigma``, sample
    rate ``q`` and ``steps`` steps, on :data:`PROFILE_GRID`."""
    return ClaimedProfile(float(sigma), float(q), int(steps), PROFILE_GRID,
                          accounting.privacy_profile(sigma, q, int(steps), PROFILE_GRID))


def verdict(eps_lb: float, claimed_eps: float, profile_violated: bool = False) -> str:
    """The verdict, naming the test that fired: the eps test (``eps_lb`` above the claimed
    eps) before the profile test, which refutes less."""
    if eps_lb > claimed_eps:
        return VIOLATES
    return VIOLATES_PROFILE if profile_violated else NO_VIOLATION


def profile_columns(val_in, val_out, eval_in, eval_out, profile: ClaimedProfile,
                    alpha: float = ALPHA) -> dict:
    """The profile test (:func:`dpaudit.bounds.profile_audit`; "in" iff score > threshold)
    as row columns: ``profile_violated``, the violation V, ``delta_lb`` and
    ``delta_claim_at_eps_star`` at ``eps_star``, its threshold and evaluation rates, and the
    claimed DP-SGD it tests against (``profile_sigma``, ``profile_q``, ``profile_steps``)."""
    res = bounds.profile_audit(val_in, val_out, eval_in, eval_out, profile.epsilons,
                               profile.deltas, alpha)
    return {"profile_violated": res.violated, "profile_violation": res.violation,
            "eps_star": res.eps_star, "delta_lb": res.delta_lb,
            "delta_claim_at_eps_star": res.delta_claim, "profile_threshold": res.threshold,
            "profile_tpr": res.ct_pos / res.n_pos, "profile_fpr": res.ct_neg / res.n_neg,
            "profile_sigma": profile.sigma, "profile_q": profile.q,
            "profile_steps": profile.steps}


def audit_counts(ct_pos: int, n_pos: int, ct_neg: int, n_neg: int, claimed_eps: float,
                 delta: float, alpha: float = ALPHA) -> dict:
    """eps_LB (Clopper-Pearson), mu_LB (GDP) and the verdict from evaluation counts; the
    approximate Katz bound and the Bayesian credible bound beside them (not in the verdict)."""
    counts = (ct_pos, n_pos, ct_neg, n_neg, alpha, delta)
    eps_lb = bounds.eps_lb_clopper_pearson(*counts)
    mu_lb = bounds.mu_lb_gdp(ct_pos, n_pos, ct_neg, n_neg, alpha)
    return {"eps_lb": eps_lb, "mu_lb": mu_lb,
            "eps_lb_gdp": bounds.eps_gdp_estimate(mu_lb, delta),
            "eps_lb_katz": bounds.eps_lb_katz(*counts),
            "eps_lb_bayes": bounds.eps_lb_bayes(*counts),
            "mu_claimed": mu_claimed(claimed_eps, delta),
            "verdict": verdict(eps_lb, claimed_eps)}


def audit_scores(val_in, val_out, eval_in, eval_out, claimed_eps: float, delta: float,
                 alpha: float = ALPHA, profile: ClaimedProfile | None = None) -> dict:
    """The attack "in iff score > tau" (higher = with the canary): tau chosen on the
    validation scores, counts and bounds on the evaluation scores
    (:func:`dpaudit.bounds.threshold_holdout_audit`, ``pos`` = with the canary, ``neg`` =
    without).

    Over every distinct decision on the validation runs, tau maximizes the
    Clopper-Pearson eps_LB the validation counts would give at the same ``alpha``; ties
    (e.g. all zero, as for a correct implementation) go to the largest ``TPR - FPR``, and
    tau lies midway between two validation scores, a margin on both sides for the
    evaluation runs.  NaN scores are refused; a score of -inf is "out".

    With ``profile``, the same runs also test the claimed privacy profile
    (:func:`profile_columns`, its own threshold chosen the same way for its own statistic),
    and the verdict names the test that fired (:func:`verdict`).
    """
    scores_in, scores_out = np.asarray(eval_in, float), np.asarray(eval_out, float)
    val_in, val_out = np.asarray(val_in, float), np.asarray(val_out, float)
    res = bounds.threshold_holdout_audit(
        val_in, val_out, scores_in, scores_out,
        partial(bounds.eps_lb_clopper_pearson, delta=delta), alpha, ties="youden")
    row = {"tpr": res.ct_pos / res.n_pos, "fpr": res.ct_neg / res.n_neg,
           "threshold": res.threshold, "ct_pos": res.ct_pos, "ct_neg": res.ct_neg,
           "tpr_at_fpr_0_1pct": bounds.tpr_at_fpr(scores_in, scores_out, 0.001),
           "tpr_at_fpr_1pct": bounds.tpr_at_fpr(scores_in, scores_out, 0.01),
           "auc": bounds.auc(scores_in, scores_out),
           **audit_counts(res.ct_pos, res.n_pos, res.ct_neg, res.n_neg, claimed_eps, delta,
                          alpha)}
    if profile is not None:
        row.update(profile_columns(val_in, val_out, scores_in, scores_out, profile, alpha))
        row["verdict"] = verdict(row["eps_lb"], claimed_eps, row["profile_violated"])
    return row


def audit_losses(val_in, val_out, eval_in, eval_out, claimed_eps: float, delta: float,
                 alpha: float = ALPHA, profile: ClaimedProfile | None = None) -> dict:
    """The attack "in iff loss < tau": :func:`audit_scores` of the scores ``-loss``, with
    tau a loss (and the profile test's threshold too). An infinite loss (a diverged run) is
    "out"."""
    out = audit_scores(*(-np.asarray(v, float) for v in (val_in, val_out, eval_in, eval_out)),
                       claimed_eps, delta, alpha, profile)
    for key in ("threshold", "profile_threshold"):
        if key in out:
            out[key] = -out[key]
    return out


def max_eps_lb(runs: int, delta: float, alpha: float = ALPHA) -> float:
    """eps_LB of a perfect attack (TPR = 1, FPR = 0) on ``runs`` evaluation runs per side."""
    return bounds.eps_lb_clopper_pearson(runs, runs, 0, runs, alpha, delta)


def min_runs(claimed_eps: float, delta: float, alpha: float = ALPHA) -> int:
    """Fewest evaluation runs per side at which a perfect attack's eps_LB exceeds ``claimed_eps``.

    With all n positive and no negative runs "in", the one-sided bounds are
    ``TPR_lo = (alpha/2)^(1/n)`` and ``FPR_hi = 1 - TPR_lo``, so the best possible
    ``eps_LB = ln((TPR_lo - delta) / (1 - TPR_lo))`` grows with n; below the returned n no
    attack can refute the claim at confidence ``1 - alpha`` (e.g. 40 for (0.21, 1e-5) at
    alpha = 1e-10).
    """
    hi = 1
    while max_eps_lb(hi, delta, alpha) <= claimed_eps:
        hi *= 2
    lo = hi // 2  # max_eps_lb(lo) <= claimed_eps (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if max_eps_lb(mid, delta, alpha) > claimed_eps else (mid, hi)
    return hi


#: The four groups of an implementation's runs, in the order of the losses table.
GROUPS = (("validation", False), ("validation", True), ("evaluation", False),
          ("evaluation", True))
#: ``test_acc_source`` of an audit whose accuracies are those of its own runs.
OWN_RUNS = "the audited runs"
#: The columns of the audit table that :func:`reaudit` reads (the rest it keeps).
REAUDIT_COLUMNS = ("implementation", "claimed_eps", "delta", "alpha", "runs", "val_runs")
#: The columns that name one run in a losses table: re-trained runs are matched on them.
RUN_KEY = ("implementation", "split", "canary_in", "run", "seed")


def audit_loss_table(losses: pd.DataFrame, claimed_eps: float, delta: float,
                     alpha: float = ALPHA, profile: ClaimedProfile | None = None) -> dict:
    """:func:`audit_losses` of one implementation's per-run losses (columns ``split``,
    ``canary_in``, ``loss``: the layout :func:`audit_implementation` returns)."""
    groups = {key: grp.loss.to_numpy(float)
              for key, grp in losses.groupby(["split", "canary_in"])}
    missing = [key for key in GROUPS if key not in groups]
    if missing:
        raise ValueError(f"losses: no runs of (split, canary_in) {missing}")
    return audit_losses(groups[("validation", True)], groups[("validation", False)],
                        groups[("evaluation", True)], groups[("evaluation", False)],
                        claimed_eps, delta, alpha, profile)


def audit_implementation(train_fn, X: torch.Tensor, y: torch.Tensor, canary: Canary,
                         claimed_eps: float, delta: float, runs: int, val_runs: int,
                         spec: dict, seed: int, alpha: float = ALPHA, batch_runs: int = 1000,
                         progress: Progress | None = None,
                         test: tuple[torch.Tensor, torch.Tensor] | None = None, store=None,
                         key: dict | None = None, together: dict | None = None,
                         seed_check: int = SEED_CHECK, max_diverged: float = 0.0,
                         mode: str = "black-box", init: dpsgd.Params | None = None,
                         refuse_at_chance: bool = True, profile: ClaimedProfile | None = None
                         ) -> tuple[dict, pd.DataFrame]:
    """Audit ``train_fn`` against its claimed (eps, delta) with ``canary``.

    ``val_runs`` runs per side choose the canary label (if not given: least likely under
    the validation runs without it) and the threshold; ``runs`` further runs per side give
    the counts.  Returns the audit row (claim, runs, TPR, FPR, threshold, eps_LB, mu_LB,
    verdict, ...) and the per-run losses (split, canary_in, run, seed, loss).  With
    ``test = (X_test, y_test)`` every model's accuracy on it is recorded too: ``test_acc``
    in the losses, its mean, min and max over all runs in the row
    (:func:`accuracy_columns`).

    ``store`` (a folder): each batch of ``batch_runs`` runs is kept there under ``key``
    (what the runs depend on: implementation, spec, seed, data, device, trainer; the
    canary label is added for the runs with the canary) and a rerun restores it instead
    of training (:func:`dpaudit.trials.run`).  ``together``: {name: (train_fn, store,
    key)} of other implementations audited with the same spec; where
    :func:`dpaudit.subjects.train_columns` can train them beside this one (registry
    subjects), every batch trains them all as the columns of one call and keeps their
    statistics in their stores under their keys, where their own audit finds them (with
    the same canary label) instead of training.

    The audit refuses (:class:`Unauditable`, before writing anything) what it cannot
    audit: output that breaks the contract; runs that do not follow their seeds
    (:func:`check_seeds` on ``seed_check`` seeds of their own before any run; 0 skips
    it); more than a fraction ``max_diverged`` of runs with a non-finite canary loss
    (diverged: they count as "out", a fixed decision); and, with ``test`` and
    ``refuse_at_chance``, models whose mean test accuracy is no better than always
    predicting the most frequent test class (a user's function that learns nothing is
    broken; dpaudit's own subjects are not, and at a tiny scale may still learn nothing).
    The row says how many runs were usable (``usable_runs``, finite canary loss, of
    ``total_runs``), how many diverged and how many seeds were checked.

    ``mode`` (:data:`MODES`): ``worst-case-init`` passes ``init`` (the auditor's initial
    parameters, e.g. :func:`pretrained_init`) to every call of ``train_fn``;
    ``white-box`` is :func:`audit_whitebox` (``canary`` and ``test`` unused). A tight
    mode's row adds ``mode``, ``method``, ``threat_model``, ``relation``, ``eps_th`` (the
    claimed eps, of add/remove neighbours) and ``certified``. ``together`` is for the
    default mode only.

    ``profile`` (:func:`claimed_profile`, from the spec; every mode inserts the canary, so
    add/remove neighbours): the same runs also test the claimed DP-SGD privacy profile
    (:func:`profile_columns`), and the verdict names the test that fired.
    """
    if runs < 1 or val_runs < 1:
        raise ValueError("runs and val_runs must be >= 1")
    check_options(seed_check, max_diverged)
    check_mode(train_fn, mode)
    if (mode == "worst-case-init") != (init is not None):
        raise ValueError(f"init: given in mode {mode!r}; mode 'worst-case-init' needs it "
                         "(the auditor's initial parameters) and the others take none")
    if together and mode != "black-box":
        raise ValueError(f"together: only in mode 'black-box', not {mode!r}")
    if mode == "white-box":
        return audit_whitebox(train_fn, X, y, claimed_eps, delta, runs, val_runs, spec, seed,
                              alpha, batch_runs, progress, store, key, seed_check,
                              max_diverged, profile)
    extra = None if init is None else {"init": init}
    label = canary.label
    if seed_check:  # before any run: a function that ignores its seeds fails in seconds
        check_seeds(train_fn, X, y, run_seeds(seed, "seed-check", False, seed_check), spec,
                    torch.cat([canary.x[None].to(X.dtype), X[:100]]), extra)

    def side(split: str, canary_in: bool, n: int) -> Side:
        return Side(f"{split} runs {'with' if canary_in else 'without'} canary",
                    run_seeds(seed, split, canary_in, n),
                    {"split": split, "canary_in": canary_in})

    together = together or {}

    def keyed(base: dict | None, canary_in: bool) -> dict:
        return {**(base or {}), "test_acc": test is not None,
                **({"canary_label": int(label)} if canary_in else {}),
                **({} if mode == "black-box" else {"mode": mode})}

    def train_score(side: Side, start: int, chunk: list[int]) -> dict:
        insert = label if side.columns["canary_in"] else None
        fns = {None: train_fn}
        if together:  # the others as columns of the same call, when they can be
            trained = subjects.train_columns(
                [train_fn] + [fn for fn, _, _ in together.values()],
                *_with_canary(X, y, canary.x, insert), chunk, spec)
            if trained is not None:
                fns = {name: lambda *_, p=p: p for name, p in zip([None, *together], trained)}
        stats = {name: {k: list(v) for k, v in train_runs(fn, X, y, canary.x, chunk, spec,
                                                          insert, test, extra).items()}
                 for name, fn in fns.items()}
        for name, (_, other_store, other_key) in together.items():
            if name in stats:
                trials.keep(other_store, keyed(other_key, insert is not None), side,
                            start, chunk, stats[name])
        return stats[None]

    log = progress
    # Without the canary first: its validation runs choose the label (when not given).
    out = run_trials([side("validation", False, val_runs), side("evaluation", False, runs)],
                     train_score, batch_runs, log, store=store, key=keyed(key, False))
    if label is None:
        label = canaries.least_likely_label(
            np.stack(out[out.split == "validation"].log_prob.to_numpy()))
    out = pd.concat([out, run_trials([side("validation", True, val_runs),
                                      side("evaluation", True, runs)],
                                     train_score, batch_runs, log, store=store,
                                     key=keyed(key, True))], ignore_index=True)
    out["loss"] = [-lp[label] for lp in out.log_prob]
    keep = ["split", "canary_in", "run", "seed", "loss"] + (["test_acc"] if test is not None else [])
    out = out.rename(columns={"trial": "run"})[keep]
    groups = dict(list(out.groupby(["split", "canary_in"])))
    losses = pd.concat([groups[key] for key in GROUPS], ignore_index=True)
    diverged = int((~np.isfinite(losses.loss)).sum())
    if diverged > max_diverged * len(losses):
        raise Unauditable(f"{diverged} of {len(losses)} runs diverged (non-finite canary "
                          f"loss); at most max_diverged={max_diverged:g} of them may")
    if test is not None and refuse_at_chance:
        chance = float(np.bincount(np.asarray(test[1])).max() / len(test[1]))
        if losses.test_acc.mean() <= chance:
            raise Unauditable(
                f"the models' mean test accuracy {losses.test_acc.mean():.4f} is at chance "
                f"(always predicting the most frequent test class scores {chance:.4f}): "
                "they learnt nothing, and an audit of them shows nothing")
    row = {"claimed_eps": claimed_eps, "delta": delta, "runs": runs, "val_runs": val_runs,
           "alpha": alpha, "canary": canary.kind, "canary_label": label, "seed": seed,
           "total_runs": len(losses), "usable_runs": len(losses) - diverged,
           "diverged_runs": diverged, "seed_check": seed_check,
           **audit_loss_table(losses, claimed_eps, delta, alpha, profile)}
    if mode != "black-box":
        from .tight.blackbox import THREAT_MODEL

        row.update(_tight_columns(mode, "blackbox-worst-case-init", THREAT_MODEL, claimed_eps))
    if test is not None:
        row.update(accuracy_columns(losses.test_acc, OWN_RUNS))
    return row, losses


def _tight_columns(mode: str, method: str, threat_model: str, claimed_eps: float,
                   relation: str = RELATION) -> dict:
    """The columns a tight mode adds to the row (the tight-audit table's convention)."""
    return {"mode": mode, "method": method, "threat_model": threat_model,
            "relation": relation, "eps_th": claimed_eps, "certified": True}


def _canary_scores(run, count: int) -> dict:
    """The per-run scores of a white-box call's ``run`` (a CanaryRun): ``score`` the
    likelihood ratio ``llr`` (the dot-sum ``scores`` where it is None, without noise),
    ``is_llr`` which, ``dot_sum``; refused (:class:`Unauditable`) unless they are (count, 1)
    floating tensors."""
    def column(name: str):
        v = getattr(run, name, None)
        if v is None and name == "llr":
            return None
        if not (isinstance(v, torch.Tensor) and v.is_floating_point()
                and tuple(v.shape) == (count, 1)):
            got = type(v).__name__ + (f" of shape {tuple(v.shape)}" if hasattr(v, "shape")
                                      else "")
            raise Unauditable(f"white-box mode: train(..., canaries=...) returned {name} "
                              f"{got}; the contract is a dpaudit.dpsgd.CanaryRun whose "
                              f"{name} is a floating tensor (len(seeds)={count}, 1)")
        return np.nan_to_num(v[:, 0].double().cpu().numpy(), nan=-np.inf, posinf=np.inf,
                             neginf=-np.inf)

    dot, llr = column("scores"), column("llr")
    return {"score": dot if llr is None else llr, "is_llr": np.full(count, llr is not None),
            "dot_sum": dot}


def audit_whitebox(train_fn, X: torch.Tensor, y: torch.Tensor, claimed_eps: float,
                   delta: float, runs: int, val_runs: int, spec: dict, seed: int,
                   alpha: float = ALPHA, batch_runs: int = 1000,
                   progress: Progress | None = None, store=None, key: dict | None = None,
                   seed_check: int = SEED_CHECK, max_diverged: float = 0.0,
                   profile: ClaimedProfile | None = None) -> tuple[dict, pd.DataFrame]:
    """The white-box mode (module docstring): ``train_fn(X, y, seeds, spec,
    canaries=GradientCanaries(g, included))`` with one Dirac canary g of norm ``spec["clip"]``
    (:func:`dpaudit.experiments.tight.whitebox.canary`, in the layout of the model of
    ``spec``, :func:`dpaudit.subjects.model_spec`), ``included`` True on the runs with the
    canary; each run's score is its ``llr`` (``scores`` without noise), and the runs,
    threshold and bounds are those of :func:`audit_implementation` on it. Returns the row
    and the per-run scores (split, canary_in, run, seed, score). Refuses
    (:class:`Unauditable`) what breaks the contract, runs that do not follow their seeds
    (``seed_check`` of them trained twice, the second time in reverse order, must give the
    same scores, and different seeds different ones) and more than ``max_diverged`` runs
    with a non-finite score. ``profile``: as in :func:`audit_implementation`."""
    from .tight.whitebox import METHODS, canary as dirac_canary

    if runs < 1 or val_runs < 1:
        raise ValueError("runs and val_runs must be >= 1")
    check_options(seed_check, max_diverged)
    check_mode(train_fn, "white-box")
    clip = spec.get("clip")
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0 < clip < np.inf:
        raise ValueError(f"spec.clip={clip!r}: white-box mode needs the clipping norm C the "
                         "function clips to (> 0, finite): the gradient canary's norm")
    model = subjects.model_spec(spec, X.shape[1], int(y.max()) + 1)
    # On the CPU: the same canary on every machine; the trainer moves it where it trains.
    direction = dirac_canary(X.numpy(), model, float(clip), seed, device="cpu")

    def scores_of(chunk: list[int], inside: bool) -> dict:
        inc = torch.full((len(chunk), 1), bool(inside))
        run = train_fn(X, y, list(chunk), spec,
                       canaries=dpsgd.GradientCanaries(direction, inc))
        return _canary_scores(run, len(chunk))

    if seed_check:
        check = run_seeds(seed, "seed-check", False, seed_check)
        a = scores_of(check, True)["dot_sum"]
        b = scores_of(check[::-1], True)["dot_sum"][::-1]
        scale = float(np.abs(a[np.isfinite(a)]).max(initial=0.0))
        if not np.allclose(a, b, rtol=0.0, atol=1e-4 * scale, equal_nan=True):
            raise Unauditable(f"not deterministic in its seed: the runs of seeds {check} "
                              f"gave other canary scores when trained again in reverse "
                              f"order ({a} then {b}); take all of a run's randomness from "
                              "its own seed")
        if np.all(a == a[0]):
            raise Unauditable(f"the runs of {len(check)} different seeds {check} gave "
                              "identical canary scores: the function ignores its seeds")

    def side(split: str, canary_in: bool, n: int) -> Side:
        return Side(f"{split} runs {'with' if canary_in else 'without'} canary",
                    run_seeds(seed, split, canary_in, n),
                    {"split": split, "canary_in": canary_in})

    out = run_trials([side(sp, c, n) for sp, c in GROUPS
                      for n in [val_runs if sp == "validation" else runs]],
                     lambda s, start, chunk: scores_of(chunk, s.columns["canary_in"]),
                     batch_runs, progress, store=store, key={**(key or {}), "mode": "white-box"})
    is_llr = bool(out.is_llr.all())
    if out.is_llr.any() != is_llr:
        raise Unauditable("white-box mode: some calls returned llr and others None")
    table = out.rename(columns={"trial": "run"})[["split", "canary_in", "run", "seed",
                                                   "score"]]
    diverged = int((~np.isfinite(table.score)).sum())
    if diverged > max_diverged * len(table):
        raise Unauditable(f"{diverged} of {len(table)} runs diverged (non-finite canary "
                          f"score); at most max_diverged={max_diverged:g} of them may")
    groups = {k: g.score.to_numpy(float) for k, g in table.groupby(["split", "canary_in"])}
    method = "whitebox-llr" if is_llr else "whitebox-dot-sum"
    row = {"claimed_eps": claimed_eps, "delta": delta, "runs": runs, "val_runs": val_runs,
           "alpha": alpha, "canary": "dirac-gradient", "seed": seed,
           "total_runs": len(table), "usable_runs": len(table) - diverged,
           "diverged_runs": diverged, "seed_check": seed_check,
           **audit_scores(groups[("validation", True)], groups[("validation", False)],
                          groups[("evaluation", True)], groups[("evaluation", False)],
                          claimed_eps, delta, alpha, profile),
           **_tight_columns("white-box", method, METHODS[method], claimed_eps,
                            subjects.canary_relation(train_fn))}
    return row, table


def reaudit(table: pd.DataFrame, losses: pd.DataFrame, accuracy: pd.DataFrame | None = None,
            source: str = OWN_RUNS) -> pd.DataFrame:
    """The audit ``table`` (one row per implementation, as written by ``dpaudit
    tramer-audit``) recomputed from its per-run ``losses``, with the test-accuracy columns
    (:func:`accuracy_columns`) from the ``test_acc`` of ``accuracy`` (labelled ``source``)
    or, without it, of ``losses``.

    ``accuracy`` may hold fewer runs than ``losses`` (e.g. some of them re-trained), but
    each of its runs must be one of ``losses`` (same implementation, split, side, run
    number and seed); a ValueError says which is not.  Columns of ``table`` that the
    losses do not determine (claim, canary, label, seed) are kept; the profile test is
    recomputed where the table has it (its ``profile_sigma``, ``profile_q``,
    ``profile_steps``).
    """
    acc = losses if accuracy is None else accuracy
    if "test_acc" not in acc:
        raise ValueError("no test accuracy: neither the losses nor an accuracy table has a "
                         "test_acc column (audits before test accuracy was recorded: pass "
                         "the losses table of a re-training of some of the same runs)")
    key = list(RUN_KEY)
    if accuracy is not None:
        found = accuracy[key].merge(losses[key], how="left", indicator=True)
        stray = found[found._merge != "both"]
        if len(stray):
            raise ValueError(f"accuracy: {len(stray)} runs are not runs of the losses table "
                             f"(first: {stray.iloc[0][key].to_dict()}); re-train the same "
                             "runs (same seed and config)")
    rows = []
    for row in table.to_dict("records"):
        impl = row["implementation"]
        mine = losses[losses.implementation == impl]
        counts = mine.groupby(["split", "canary_in"]).size().to_dict()
        want = {("validation", s): row["val_runs"] for s in (False, True)}
        want.update({("evaluation", s): row["runs"] for s in (False, True)})
        if counts != want:
            raise ValueError(f"losses of {impl!r}: runs per (split, canary_in) {counts}, but "
                             f"the table says {row['runs']} evaluation and {row['val_runs']} "
                             "validation runs per side")
        # A table with the profile test names the claimed DP-SGD it was tested against.
        profile = (claimed_profile(row["profile_sigma"], row["profile_q"], row["profile_steps"])
                   if pd.notna(row.get("profile_sigma")) else None)
        row.update(audit_loss_table(mine, row["claimed_eps"], row["delta"], row["alpha"],
                                    profile))
        row.update(accuracy_columns(acc.test_acc[acc.implementation == impl], source))
        rows.append(row)
    return pd.DataFrame(rows)


def compare_retrained(losses: pd.DataFrame, retrained: pd.DataFrame) -> pd.DataFrame:
    """How the canary losses of re-trained runs compare with those of the same runs (same
    implementation, split, side, run and seed) in ``losses``: per group, the number of runs,
    and the two-sample Kolmogorov-Smirnov statistic and p-value (scipy.stats.ks_2samp).
    Where the products round differently (e.g. a CPU re-training of a GPU run: the same
    draws, other kernels), or the draws differ (runs trained before the counter-based
    generator), the pairs differ but the distributions should not."""
    from scipy import stats

    key = list(RUN_KEY)
    both = retrained[key + ["loss"]].merge(losses[key + ["loss"]], on=key,
                                           suffixes=("_retrained", ""))
    rows = []
    for (impl, split, canary_in), grp in both.groupby(key[:3], sort=False):
        ks = stats.ks_2samp(grp.loss_retrained, grp.loss)
        rows.append({"implementation": impl, "split": split, "canary_in": canary_in,
                     "runs": len(grp), "ks": float(ks.statistic), "p": float(ks.pvalue)})
    return pd.DataFrame(rows)


__all__ = ["ALPHA", "VIOLATES", "VIOLATES_PROFILE", "NO_VIOLATION", "PROFILE_GRID",
           "SPEC_KEYS", "GROUPS", "OWN_RUNS", "REAUDIT_COLUMNS", "RUN_KEY", "SEED_CHECK",
           "CONTRACT", "MODES", "MODE_KEYWORDS", "RELATION", "Unauditable", "ClaimedProfile",
           "run_seeds", "trainer_digest", "check_mode", "pretrained_init", "train_runs",
           "check_options", "check_seeds", "accuracy_columns", "mu_claimed", "claimed_profile",
           "verdict", "profile_columns", "audit_counts", "audit_scores", "audit_losses",
           "audit_loss_table", "max_eps_lb", "min_runs", "audit_implementation",
           "audit_whitebox", "reaudit", "compare_retrained"]
