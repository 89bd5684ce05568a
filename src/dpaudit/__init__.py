"""dpaudit: empirical privacy auditing of differentially private machine learning.

Concept modules, one concept each:

- :mod:`dpaudit.bounds`       scores and counts -> empirical lower bounds on epsilon (higher
                              score = "in"; every bound of the project goes through it)
- :mod:`dpaudit.accounting`   theoretical upper bounds (composition, RDP, PLD, GDP)
- :mod:`dpaudit.shuffle_accounting`  theory lines for DP-SGD that shuffles its batches: the
                              eps Poisson accounting claims, and a lower bound on the true one
- :mod:`dpaudit.last_iterate` the last-iterate heuristic (eps of releasing the final model)
- :mod:`dpaudit.canaries`     ClipBKD, pixel-pattern backdoor, membership inference,
                              checkerboard: neighbouring data sets and their statistics
- :mod:`dpaudit.dpsgd`        batched DP-SGD trainer (K models at once, gradient canaries)
- :mod:`dpaudit.trials`       the train-and-score loop of many-model audits
- :mod:`dpaudit.seeds`        the one seed derivation
- :mod:`dpaudit.device`       the one device choice
- :mod:`dpaudit.data`, :mod:`dpaudit.features`, :mod:`dpaudit.io`, :mod:`dpaudit.config`
                              data loading, CIFAR features, result files, the config schema
- :mod:`dpaudit.subjects`     registry of DP training implementations to audit
- :mod:`dpaudit.adapters`     a DP library's own training (Opacus) as an audited function
- :mod:`dpaudit.user_code`    the audited function's calls, in a worker process or in this one
- :mod:`dpaudit.testing`      :func:`~dpaudit.testing.assert_private`, a privacy check for a
                              test suite
- :mod:`dpaudit.lazy`, :mod:`dpaudit.locks`
                              package attributes imported on first use; one writer per
                              result folder

:mod:`dpaudit.experiments` holds one short module per reproduced paper; :mod:`dpaudit.cli`,
:mod:`dpaudit.plots` and ``workflow/`` only wire these together.
"""

__version__ = "0.2.0"
