"""One module per reproduced paper or homework: build the neighbouring data sets (or the
canaries), train, score, call :mod:`dpaudit.bounds`, and assemble the result table.

- :mod:`.gaussian_sum`  one-run audits of the Gaussian sum mechanism (the HW3 homework, Q2)
- :mod:`.ridge`         one-run audits of private ridge regression (the HW3 homework, Q1)
- :mod:`.jagielski`     DP-SGD audits of Jagielski, Ullman, Oprea 2020 (Figure 2, Table 2)
- :mod:`.tramer`        the buggy and the fixed DP-SGD of Tramer et al. 2022, and any
                        training function a user names
- :mod:`.onerun`        one-run audits of DP-SGD (Steinke, Nasr, Jagielski 2023; Mahloujifar,
                        Melis, Chaudhuri 2025) beside the many-model audits

The reusable pieces live in concept modules: :mod:`dpaudit.bounds` (score -> epsilon),
:mod:`dpaudit.canaries`, :mod:`dpaudit.dpsgd`, :mod:`dpaudit.trials` (the train-and-score
loop), :mod:`dpaudit.seeds`, :mod:`dpaudit.device`, :mod:`dpaudit.accounting`.
"""
