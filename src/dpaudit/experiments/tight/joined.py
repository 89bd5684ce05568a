"""Rows of the tight table (``results/tight_audit.csv``) from two audits run elsewhere in
the project, each with the ``eps_th`` of its own relation and mechanism:

``blackbox-clipbkd`` (threat model ``black-box``)
    ClipBKD of Jagielski et al. 2020, a cell of their Figure 2 (``jagielski-audit
    --experiment fig2``): ``trials`` models per side. D0 holds one poison row with the
    flipped label (or none), D1 the poison with its least likely label in place of k
    random rows: D0 and D1 differ in k *replaced* rows, and the cell's ``eps_lb`` is already
    the per-row bound by group privacy over them (Lemma 1 of the paper). Relation
    ``replace-one``: ``eps_th`` is the table's ``eps_pld_replace``, the PLD eps of
    replace-one neighbours, the tightest upper bound for it that the project computes;
    ``eps_rdp`` its ``eps_th``, ``rdp_classic`` for add/remove (the accountant that
    calibrated the noise table). Both assume Poisson sampling; Figure 2 trains shuffled
    batches by default (``setting`` says which), for which the accountant's eps is the
    standard reference, not a proven bound.
``onerun-whitebox-llr``, ``onerun-whitebox-dot-sum`` (``all-iterates``, ``last-iterate``)
    The one-run audit with m Dirac gradient canaries (Steinke, Nasr and Jagielski 2023;
    ``onerun-audit``): each canary is added or not (Poisson-sampled at the data's rate),
    an add/remove relation per canary, so ``eps_th`` is the table's ``eps_pld`` (PLD) and
    ``eps_rdp`` its ``eps_th`` (``rdp_classic``). One run: the row is the cell's first
    repeat (fixed in advance; the others are in the one-run table), ``eps_lb`` its f-DP
    bound ``eps_lb_fdp`` (Mahloujifar, Melis and Chaudhuri 2025) at ``1 - beta``.

Each certified row has a ``-gdp`` row beside it: the GDP estimate of the same runs
(``certified`` False), as the tight audits have. Only the cells of the tight table (arch x
eps label) are taken; a cell the table read lacks is skipped with one log line.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import pandas as pd

from ...io import BadInputFile
from ..jagielski import eps_label, init_label, init_name

#: The columns :func:`clipbkd_rows` reads from a Figure 2 table.
CLIPBKD_COLUMNS = ("dataset", "arch", "attack", "init", "eps_label", "eps_th",
                   "eps_pld_replace", "eps_lb", "mu_lb", "eps_lb_gdp", "tpr", "fpr", "auc",
                   "trials", "noise", "steps", "n")
#: The columns :func:`onerun_rows` reads from a one-run table.
ONERUN_COLUMNS = ("arch", "canary", "threat_model", "eps_label", "repeat", "eps_th",
                  "eps_pld", "eps_lb_fdp", "mu_lb", "eps_gdp", "noise", "sample_rate",
                  "steps", "n", "m", "delta", "beta")
#: The initialisation of the tight white box (each run its own Glorot draw, scale 1):
#: the Figure 2 cells taken where the table has several inits.
WHITEBOX_INIT = "g1"
#: One-run threat model -> method.
ONERUN_METHODS = {"all-iterates": "onerun-whitebox-llr",
                  "last-iterate": "onerun-whitebox-dot-sum"}


def _spec(provenance: dict, source, *keys):
    """``provenance["spec"][keys[0]]...``, or BadInputFile naming ``source`` and the key."""
    node = provenance.get("spec")
    for i, key in enumerate(keys):
        if not isinstance(node, dict) or key not in node:
            raise BadInputFile(source, f"its provenance lacks spec.{'.'.join(keys[:i + 1])}")
        node = node[key]
    return node


def _cell_rows(df: pd.DataFrame, cells: Iterable[tuple[str, str]], what: str,
               log: Callable[[str], None]) -> pd.DataFrame:
    """The rows of ``df`` in ``cells`` (arch, eps label); a cell without rows is skipped
    with a log line."""
    labels = df.eps_label.map(eps_label)
    keep = []
    for arch, label in cells:
        hit = (df.arch == arch) & (labels == label)
        if not hit.any():
            log(f"no {what} cell for {arch} eps {label}: no row")
        keep.append(hit)
    return df[pd.concat(keep, axis=1).any(axis=1)] if keep else df.iloc[:0]


def clipbkd_rows(table: pd.DataFrame, provenance: dict, cells, log=lambda msg: None,
                 source="the Figure 2 table") -> pd.DataFrame:
    """The FMNIST ClipBKD rows of a Figure 2 table (module docstring) in ``cells``, at the
    tight white box's init :data:`WHITEBOX_INIT` where the table has it, else at its only
    init. BadInputFile naming ``source`` if it has several others, several rows of one
    cell, or a provenance without the set-up the rows need."""
    alpha, delta = _spec(provenance, source, "alpha"), _spec(provenance, source, "delta")
    sampling = _spec(provenance, source, "sampling")
    batch = _spec(provenance, source, "datasets", "fmnist", "batch_size")
    df = table[(table.dataset == "fmnist") & (table.attack == "clipbkd")]
    inits = sorted(set(df.init))
    if len(inits) > 1 and WHITEBOX_INIT not in inits:
        raise BadInputFile(source, f"FMNIST ClipBKD cells at the inits {inits}, none the "
                                   f"tight white box's ({WHITEBOX_INIT}): which to take is "
                                   f"not clear")
    df = df[df.init == (WHITEBOX_INIT if WHITEBOX_INIT in inits else inits[0])] if inits else df
    df = _cell_rows(df, cells, "FMNIST ClipBKD (Figure 2)", log).reset_index(drop=True)
    twice = df.assign(label=df.eps_label.map(eps_label)).duplicated(["arch", "label"])
    if twice.any():
        raise BadInputFile(source, f"several FMNIST ClipBKD rows of {df[twice].arch.iloc[0]} "
                                   f"eps {eps_label(df[twice].eps_label.iloc[0])} at one init")
    rows = pd.DataFrame({
        "method": "blackbox-clipbkd", "threat_model": "black-box", "relation": "replace-one",
        "setting": [f"{sampling}; {init_name(i)}" for i in df.init], "arch": df.arch,
        "eps_label": df.eps_label, "eps_th": df.eps_pld_replace, "eps_rdp": df.eps_th,
        "eps_lb": df.eps_lb, "certified": True, "runs": df.trials, "mu_lb": df.mu_lb,
        "eps_lb_gdp": df.eps_lb_gdp, "tpr": df.tpr, "fpr": df.fpr, "auc": df.auc,
        "noise": df.noise, "q": batch / df.n, "steps": df.steps, "n": df.n, "alpha": alpha,
        "delta": delta, "seed": provenance.get("seed", math.nan)})
    return _with_gdp(rows)


def onerun_rows(table: pd.DataFrame, provenance: dict, cells, log=lambda msg: None,
                source="the one-run table") -> pd.DataFrame:
    """The white-box (Dirac canary) rows of a one-run table (module docstring) in
    ``cells``: the first repeat of each cell and threat model. BadInputFile naming
    ``source`` if its provenance lacks the init."""
    init = init_name(init_label(_spec(provenance, source, "init")))
    df = table[(table.canary == "dirac") & (table.repeat == 0)
               & table.threat_model.isin(list(ONERUN_METHODS))]
    df = _cell_rows(df, cells, "one-run white-box", log).reset_index(drop=True)
    rows = pd.DataFrame({
        "method": df.threat_model.map(ONERUN_METHODS), "threat_model": df.threat_model,
        "relation": "add/remove",
        "setting": [f"poisson; 1 run, {m} canaries; {init}" for m in df.m], "arch": df.arch,
        "eps_label": df.eps_label, "eps_th": df.eps_pld, "eps_rdp": df.eps_th,
        "eps_lb": df.eps_lb_fdp, "certified": True, "runs": 1, "mu_lb": df.mu_lb,
        "eps_lb_gdp": df.eps_gdp, "tpr": math.nan, "fpr": math.nan, "auc": math.nan,
        "noise": df.noise, "q": df.sample_rate, "steps": df.steps, "n": df.n,
        "alpha": df.beta, "delta": df.delta, "seed": provenance.get("seed", math.nan)})
    return _with_gdp(rows)


def _with_gdp(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` and, for each, its GDP estimate as a row of its own (``<method>-gdp``)."""
    gdp = rows.assign(method=rows.method + "-gdp", eps_lb=rows.eps_lb_gdp, certified=False)
    return pd.concat([rows, gdp], ignore_index=True)


__all__ = ["CLIPBKD_COLUMNS", "ONERUN_COLUMNS", "WHITEBOX_INIT", "ONERUN_METHODS",
           "clipbkd_rows", "onerun_rows"]
