"""Adapters that turn a DP training library's own training into a function of the
``audit-impl`` contract (:mod:`dpaudit.subjects`), in every mode of the audit.

- :mod:`.opacus`  Opacus (Yousefpour et al. 2021): :class:`~.opacus.OpacusTrainer`
"""
