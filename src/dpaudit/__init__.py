"""dpaudit: empirical privacy auditing of differentially private machine learning.

The science lives in plain, importable modules:

- :mod:`dpaudit.bounds`      scores/counts -> empirical lower bounds on epsilon
- :mod:`dpaudit.accounting`  theoretical upper bounds (composition, RDP, PLD, GDP)
- :mod:`dpaudit.gaussian`    Gaussian sum-mechanism audits (HW3, seed 004 section 2)
- :mod:`dpaudit.dpsgd`       batched DP-SGD trainer (K models at once)
- :mod:`dpaudit.canaries`    ClipBKD, pixel-pattern backdoor, membership inference
- :mod:`dpaudit.ridge`       private ridge regression by output perturbation

:mod:`dpaudit.cli` and ``workflow/`` only wire these together.
"""

__version__ = "0.1.0"
