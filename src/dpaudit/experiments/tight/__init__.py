"""Tight audits of DP-SGD: how close to eps an audit gets under each threat model.

``whitebox``: many training runs per side with one Dirac gradient canary, every iterate
observed (Nasr et al. 2023). ``blackbox``: only the final model's loss on a canary input,
from initial parameters the auditor chooses (Annamalai and De Cristofaro 2024). Both turn
one score per run into the certified bounds of :mod:`dpaudit.bounds`; the theory they are
drawn against is :mod:`dpaudit.accounting` and :mod:`dpaudit.last_iterate`. ``joined``:
the rows of two audits run for other pages (ClipBKD of Jagielski et al. 2020, the one-run
white box of Steinke et al. 2023) beside them, each with the eps_th of its own relation.
"""
