"""dpaudit: empirical privacy auditing of differentially private machine learning.

Concept modules, one concept each:

- :mod:`dpaudit.bounds`       scores and counts -> empirical lower bounds on epsilon (higher
                              score = "in"; every bound of the project goes through it)
- :mod:`dpaudit.accounting`   theoretical upper bounds (composition, RDP, PLD, GDP)
- :mod:`dpaudit.canaries`     ClipBKD, pixel-pattern backdoor, membership inference,
                              checkerboard: neighbouring data sets and their statistics
- :mod:`dpaudit.dpsgd`        batched DP-SGD trainer (K models at once, gradient canaries)
- :mod:`dpaudit.trials`       the train-and-score loop of many-model audits
- :mod:`dpaudit.seeds`        the one seed derivation
- :mod:`dpaudit.device`       the one device choice
- :mod:`dpaudit.data`, :mod:`dpaudit.features`, :mod:`dpaudit.io`, :mod:`dpaudit.config`
                              data loading, CIFAR features, result files, the config schema
- :mod:`dpaudit.subjects`     registry of DP training implementations to audit

:mod:`dpaudit.experiments` holds one short module per reproduced paper; :mod:`dpaudit.cli`,
:mod:`dpaudit.plots` and ``workflow/`` only wire these together.
"""

__version__ = "0.2.0"
