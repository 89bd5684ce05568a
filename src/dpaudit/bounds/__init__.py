"""Audit statistics: from attack outcomes to empirical lower bounds on epsilon, one kind per module.

Pure functions (numpy, scipy, statsmodels; no torch), kept apart from training as in
jax_privacy's ``auditing.py``.  Conventions: a *positive* trial trains on the data set
with the canary (D1), a *negative* one without it (D0); the attack says "canary in" when
a trial's score exceeds the threshold.  ``ct_pos`` of ``n_pos`` positive and ``ct_neg``
of ``n_neg`` negative trials said "in", so ``ct_pos / n_pos`` estimates the TPR and
``ct_neg / n_neg`` the FPR.  Every bound here holds with probability at least
``1 - alpha`` (or ``1 - beta``) over the trials: it exceeds the mechanism's true epsilon
at most that often, which ``tests/test_bounds.py`` checks by simulation.  Two
exceptions, named so wherever they appear: :func:`eps_lb_katz` is approximate (an
asymptotic interval) and :func:`eps_lb_bayes` is the lower end of a Bayesian credible
interval, not a confidence bound.  Two results are no bounds either: the maximum over k of
:func:`eps_lb_paper_rule` (each per-k value is one) and the spread of
:func:`eps_lb_resplits` over re-splits of the same trials (a diagnostic of the split).
Every public function refuses a bad argument by name (:mod:`._checks`).

Modules, each one kind of statistic; every public name is re-exported here:

- :mod:`.counts`: counts to eps (Clopper-Pearson, Katz, Bayes; group privacy).
- :mod:`.gdp`: Gaussian DP (mu from counts, mu to (eps, delta)).
- :mod:`.roc`: ROC measures (TPR at low FPR, AUC).
- :mod:`.thresholds`: choosing the decision threshold (held out, split, scanned).
- :mod:`.paper_rule`: the reference code's Table 2 procedure of [JUO20].
- :mod:`.resplits`: the bound on seeded re-splits of the same trials (a diagnostic).
- :mod:`.one_run`: one-run audits of [SNJ23] (guess grid and counts, the sweep).
- :mod:`.fdp`: one-run audits in f-DP ([MMC25]).
- :mod:`.profile`: a certified test of a claimed privacy profile (every (e, delta(e)) at once).
- :mod:`.sequential`: time-uniform bounds (a confidence sequence per rate): eps_LB and the
  profile test valid at every look at once, for audits that stop when the evidence suffices.

References
----------
The keys every module of the package cites.

- [JUO20] Jagielski, Ullman, Oprea. Auditing Differentially Private Machine Learning: How
  Private is Private SGD? NeurIPS 2020 (Algorithm 2, Lemma 1).
- [DRS19] Dong, Roth, Su. Gaussian Differential Privacy. JRSS-B 2022, Corollary 2.13.
- [NHSB23] Nasr, Hayes, Steinke, Balle et al. Tight Auditing of Differentially Private
  Machine Learning. USENIX Security 2023 (the GDP audit, as presented in the CSCI 699
  Week 4 lecture notes, Gaussian DP and Privacy Auditing).
- [SNJ23] Steinke, Nasr, Jagielski. Privacy Auditing with One (1) Training Run. NeurIPS
  2023: Theorem 1 (pure eps; eq. (1) of the DA 5001/6400 HW3 homework, IIT Madras 2024)
  and Appendix D (eps, delta).
- [MMC25] Mahloujifar, Melis, Chaudhuri. Auditing f-Differential Privacy in One Run.
  ICML 2025 (arXiv:2410.22235): the one-run guessing-game bound for any f-DP curve.
- [KBAS78] Katz, Baptista, Azen, Pike. Obtaining Confidence Intervals for the Risk Ratio
  in Cohort Studies. Biometrics 1978: the log interval for a ratio of two proportions.
- [ZBJ+23] Zanella-Beguelin, Wutschitz, Tople, Salem, Ruehle, Paverd, Naseri, Koepf,
  Jones. Bayesian Estimation of Differential Privacy. ICML 2023.
- [HRMS21] Howard, Ramdas, McAuliffe, Sekhon. Time-uniform, nonparametric, nonasymptotic
  confidence sequences. Annals of Statistics 2021: the beta-binomial mixture.
- [Rob70] Robbins. Statistical methods related to the law of the iterated logarithm.
  Annals of Mathematical Statistics 1970: mixture martingales.
- [CCN+22] Carlini, Chien, Nasr, Song, Terzis, Tramer. Membership Inference Attacks From
  First Principles. IEEE S&P 2022: attacks compared by TPR at low FPR.
"""

from __future__ import annotations

from ._checks import scores_array
from .counts import (claim_p_value, clopper_pearson, eps_from_rate_bounds, eps_lb_bayes,
                     eps_lb_clopper_pearson, eps_lb_katz, perfect_eps_lb, runs_to_exceed)
from .fdp import eps_lb_one_run_fdp, mu_lb_one_run_gdp
from .gdp import delta_from_mu, eps_from_mu, eps_gdp_estimate, mu_lb_gdp
from .one_run import (GUESS_GRID_SIZE, SWEEP_COLUMNS, eps_lb_hoeffding, eps_lb_one_run,
                      guess_counts, guess_grid, one_run_sweep)
from .paper_rule import (PAPER_ALPHA, PAPER_BOOTSTRAPS, PAPER_SELECT_ALPHA, PaperRuleAudit,
                         eps_lb_paper_rule, paper_rule_bootstrap)
from .profile import ProfileAudit, profile_audit, profile_from_rate_bounds, profile_violation
from .resplits import eps_lb_resplits
from .sequential import (N_OPT, bernoulli_confidence_sequence, eps_lb_sequential,
                         mixture_concentration, profile_violation_sequential,
                         running_confidence_sequence)
from .roc import auc, tpr_at_fpr
from .thresholds import (TIES, Bound as Bound, ThresholdAudit, choose_threshold, split_trials,
                         threshold_holdout_audit, threshold_scan_audit, threshold_split_audit)

__all__ = [
    "clopper_pearson",
    "claim_p_value",
    "eps_lb_clopper_pearson",
    "perfect_eps_lb",
    "runs_to_exceed",
    "eps_lb_katz",
    "eps_lb_bayes",
    "tpr_at_fpr",
    "auc",
    "mu_lb_gdp",
    "eps_from_mu",
    "eps_gdp_estimate",
    "delta_from_mu",
    "eps_lb_one_run",
    "mu_lb_one_run_gdp",
    "eps_lb_one_run_fdp",
    "eps_lb_hoeffding",
    "scores_array",
    "ThresholdAudit",
    "TIES",
    "threshold_holdout_audit",
    "GUESS_GRID_SIZE",
    "guess_grid",
    "guess_counts",
    "one_run_sweep",
    "SWEEP_COLUMNS",
    "split_trials",
    "threshold_split_audit",
    "threshold_scan_audit",
    "PAPER_SELECT_ALPHA",
    "PAPER_ALPHA",
    "PaperRuleAudit",
    "eps_lb_paper_rule",
    "PAPER_BOOTSTRAPS",
    "paper_rule_bootstrap",
    "eps_lb_resplits",
    "profile_violation",
    "profile_audit",
    "ProfileAudit",
    "profile_from_rate_bounds",
    "eps_from_rate_bounds",
    "choose_threshold",
    "N_OPT",
    "mixture_concentration",
    "bernoulli_confidence_sequence",
    "running_confidence_sequence",
    "eps_lb_sequential",
    "profile_violation_sequential",
]
