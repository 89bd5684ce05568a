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

Modules: :mod:`.claim` (the claim under test, the verdicts, the runs a claim needs, an
audit's :class:`Design`), :mod:`.profile` (the profile test), :mod:`.statistics`
(threshold, counts and bounds of the runs' scores), :mod:`.runs` (the calls of the training
function, their limits and the seed check, what an audit refuses, :class:`Checks`, and how
its runs are batched and kept, :class:`Batches`; a user's function runs in a
:class:`dpaudit.user_code.Worker`), :mod:`.recheck` (the checks after the runs, on seeds
the function cannot predict, and the probes of what each mode passes), :mod:`.modes` (the
tight modes, :class:`Mode`), :mod:`.audit` (the ``audit-impl`` procedure),
:mod:`.sequential` (the anytime-valid audit in rounds), :mod:`.rounds` (its evaluation runs
in any mode: ``audit-impl --sequential``) and :mod:`.reaudit` (an audit table recomputed
from its losses); this package re-exports their public names.
"""

from __future__ import annotations

from .audit import audit_implementation
from .claim import (ALPHA, NO_VIOLATION, VIOLATES, VIOLATES_PROFILE, Design, max_eps_lb,
                    min_runs, mu_claimed, verdict)
from .modes import (INSERTION_ALPHA, MODE_KEYWORDS, MODES, RELATION, Mode, audit_whitebox,
                    check_insertions, check_mode, pretrained_init, whitebox_clip,
                    whitebox_runs)
from .profile import PROFILE_GRID, ClaimedProfile, claimed_profile, profile_columns
from .recheck import recheck_blackbox, recheck_whitebox
from .reaudit import REAUDIT_COLUMNS, RUN_KEY, compare_retrained, reaudit
from .rounds import schedule_of
from .runs import (CALL_LIMIT, CONTRACT, SEED_CHECK, Batches, Checks, Unauditable,
                   UserCodeFailed, check_options, check_seeds, run_seeds, train_runs,
                   trainer_digest, user_call)
from .sequential import Schedule, sequential_audit
from .statistics import (GROUPS, OWN_RUNS, accuracy_columns, audit_counts, audit_loss_table,
                         audit_losses, audit_scores)

__all__ = ["ALPHA", "VIOLATES", "VIOLATES_PROFILE", "NO_VIOLATION", "PROFILE_GRID",
           "GROUPS", "OWN_RUNS", "REAUDIT_COLUMNS", "RUN_KEY", "SEED_CHECK",
           "CONTRACT", "MODES", "MODE_KEYWORDS", "RELATION", "Unauditable", "ClaimedProfile",
           "run_seeds", "trainer_digest", "check_mode", "pretrained_init", "train_runs",
           "check_options", "check_seeds", "accuracy_columns", "mu_claimed", "claimed_profile",
           "verdict", "profile_columns", "audit_counts", "audit_scores", "audit_losses",
           "audit_loss_table", "max_eps_lb", "min_runs", "audit_implementation",
           "audit_whitebox", "reaudit", "compare_retrained", "CALL_LIMIT", "UserCodeFailed",
           "user_call", "whitebox_clip", "INSERTION_ALPHA", "check_insertions",
           "recheck_blackbox", "recheck_whitebox", "whitebox_runs", "Schedule",
           "schedule_of", "sequential_audit", "Design", "Mode", "Checks", "Batches"]
