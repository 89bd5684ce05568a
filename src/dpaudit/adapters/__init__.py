"""Adapters that turn a DP training library's own training into a function of the
``audit-impl`` contract (:mod:`dpaudit.subjects`), in every mode of the audit.

- :mod:`.opacus_loop`  a user's own Opacus loop, unmodified, in every mode, its reported
  eps the claim: :class:`~.opacus_loop.OpacusLoop` (``audit-impl --opacus-loop``)
- :mod:`.opacus`  Opacus (Yousefpour et al. 2021): :class:`~.opacus.OpacusTrainer`,
  dpaudit's reconstruction of ``make_private``
- :mod:`.opacus_probe`  a user's own Opacus training run as it is, its parameters measured
  on n and n + 1 rows against the epsilon it reports (``dpaudit opacus-check``)
- :mod:`.opacus_flaws`  Opacus trainings of that contract with the flaws found in the wild,
  each beside its fix (the flaws table, ``dpaudit flaws``)
"""
