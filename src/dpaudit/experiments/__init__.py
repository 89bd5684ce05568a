"""One module per reproduced paper, homework or study: build the neighbouring data sets (or
the canaries), train, score, call :mod:`dpaudit.bounds`, and assemble the result table.

- :mod:`.gaussian_sum`  one-run audits of the Gaussian sum mechanism (the HW3 homework, Q2)
- :mod:`.ridge`         one-run audits of private ridge regression (the HW3 homework, Q1)
- :mod:`.jagielski`     DP-SGD audits of Jagielski, Ullman, Oprea 2020 (Figure 2, Table 2)
- :mod:`.tramer`        the buggy and the fixed DP-SGD of Tramer et al. 2022, and any
                        training function a user names
- :mod:`.onerun`        one-run audits of DP-SGD (Steinke, Nasr, Jagielski 2023; Mahloujifar,
                        Melis, Chaudhuri 2025) beside the many-model audits
- :mod:`.tight`         tight audits of DP-SGD under each threat model (Nasr et al. 2023;
                        Annamalai and De Cristofaro 2024)
- :mod:`.shuffle`       the shuffling gap: shuffled batches accounted as Poisson sampling,
                        audited white box
- :mod:`.shuffle_settings`  the shuffle audit's settings and which of them train (torch-free,
                        read at the workflow's start-up)
- :mod:`.abadi`         the training curves of Abadi et al. 2016 (Figures 3 and 6)
- :mod:`.trials_needed` how many trials each way from counts to epsilon needs
- :mod:`.runs_needed`   how many runs per side would catch a bug, before they are spent
- :mod:`.flaws`         the flaws table: flaws found in real DP-SGD code, each through the
                        checks that see it, beside its fix
- :mod:`.checks`        the start-up check of limits that relate several config keys

The reusable pieces live in concept modules: :mod:`dpaudit.bounds` (score -> epsilon),
:mod:`dpaudit.canaries`, :mod:`dpaudit.dpsgd`, :mod:`dpaudit.trials` (the train-and-score
loop), :mod:`dpaudit.seeds`, :mod:`dpaudit.device`, :mod:`dpaudit.accounting`.
"""
