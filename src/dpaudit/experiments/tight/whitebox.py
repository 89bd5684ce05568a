"""The white-box multi-run audit of DP-SGD (Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski,
Carlini & Terzis 2023, "Tight Auditing of Differentially Private Machine Learning").

Many training runs per side: on D1 one Dirac gradient canary of norm C
(:func:`dpaudit.dpsgd.dirac_canaries`, on a first-layer weight of the input feature the
data uses least, :func:`dpaudit.experiments.onerun.quiet_coordinates`) is added to the
clipped gradient sum at every step where Poisson sampling at the data's rate q = B / n picks
it (:class:`dpaudit.dpsgd.GradientCanaries`), on D0 it is absent; the auditor sees every
iterate. Neighbouring relation: add/remove (the canary is added), so a run's theoretical
eps is the add/remove eps of the subsampled Gaussian mechanism at (noise multiplier, q, T):
``eps_th`` the PLD accountant's (the tightest upper bound, so a bound above it refutes the
guarantee), ``eps_rdp`` Jagielski et al.'s ``rdp_classic`` beside it.

Two scores per run (higher = "canary in"), one output row each:

``whitebox-llr`` (threat model ``all-iterates``)
    :attr:`dpaudit.dpsgd.CanaryRun.llr`: the sum over steps of the log likelihood ratio
    log(1 - q + q exp(mu z_t - mu^2 / 2)) of "sampled at rate q" against "absent" for the
    step's normalised update along the canary z_t, mu = 1 / noise multiplier. With the data
    ignored, this is the Neyman-Pearson test of the T-fold subsampled Gaussian mechanism the
    accountant analyses, so its ROC curve is the accountant's trade-off curve: the audit
    this module is for.
``whitebox-dot-sum`` (threat model ``last-iterate``)
    The paper's statistic, the sum over steps of <theta_t - theta_{t+1}, g>, which
    telescopes to <theta_0 - theta_T, g>: it needs only the first and last iterates and
    weighs a step without the canary as much as one with it. Where a step's mu is small
    the likelihood ratio is nearly linear in z_t and the two scores agree; where it is
    large and q < 1 the likelihood ratio is stronger, as it weighs only the steps that
    sampled the canary; at q = 1 they are the same test. Kept as the comparison the paper
    draws (measured: docs/tight.md).

Statistics (:mod:`dpaudit.bounds`), runs in seed order, the first ``select_frac`` of each
side choosing the threshold and the rest evaluating it: ``eps_lb``, the Clopper-Pearson
bound of Jagielski et al. 2020 at ``1 - alpha`` and ``delta`` (``certified``: it holds for
any score); ``mu_lb``, the Gaussian-DP lower bound at the same split, and ``eps_lb_gdp``, the
eps at ``delta`` of a ``mu_lb``-GDP mechanism: an estimate, as subsampled DP-SGD is not
exactly Gaussian; ``tpr``, ``fpr`` and ``auc`` on the evaluation runs.

How many runs: at Jagielski et al.'s noise the composed mechanism is close to mu-GDP with a
small mu, so the runs per side needed to certify a positive eps grow fast as eps_th falls;
a mechanism that leaks more per run needs fewer (docs/tight.md, "How many runs").
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import torch

from ... import bounds, dpsgd, seeds, trials
from ..onerun import quiet_coordinates

#: Each method's score and the threat model it needs (module docstring).
METHODS = {"whitebox-llr": "all-iterates", "whitebox-dot-sum": "last-iterate"}
#: The canary is added to D0's runs: add/remove neighbours.
RELATION = "add/remove"


def canary(X: np.ndarray, model: dpsgd.ModelSpec, clip: float, seed: int,
           device=None) -> torch.Tensor:
    """The Dirac canary (1, P) of norm ``clip`` on a first-layer weight of the input
    feature with the least mean square over ``X`` (its data gradients are the smallest),
    the weight drawn from ``seed``'s stream."""
    return dpsgd.dirac_canaries(model, 1, clip, seeds.rng(seed, "tight/whitebox/canary")
                                .integers(2**63), quiet_coordinates(X, model, 1),
                                device=device)


def run_seeds(runs: int, seed: int, arch: str) -> dict[str, list[int]]:
    """Each side's run seeds, ``{"in": [...], "out": [...]}``: one stream per side, so
    more runs extend a side without changing its first ones."""
    if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs < 2:
        raise ValueError(f"runs={runs!r}: must be an integer >= 2 (runs per side, split "
                         f"into threshold selection and evaluation)")
    out = {side: seeds.int_seeds(int(runs), seed, f"tight/whitebox/{arch}/{side}")
           for side in ("in", "out")}
    if set(out["in"]) & set(out["out"]):  # probability ~ runs^2 / 2^63
        raise RuntimeError(f"seed collision between the sides of seed {seed}; change it")
    return out


def trainer_digest() -> str:
    """SHA-256 of the code that turns a run's seed into its scores (the trainer, the seed
    derivation, the trials loop, the canary's coordinate and this module): kept batches of
    runs are reused only under the same digest."""
    import sys

    from ...io import source_digest

    return source_digest(dpsgd, seeds, trials, quiet_coordinates, sys.modules[__name__])


def store_key(X, y, model: dpsgd.ModelSpec, cfg: dpsgd.DPSGDConfig, seed: int,
              init: dpsgd.Params | None = None, device=None, mates: float = 0.0) -> dict:
    """What a kept batch of runs depends on besides its seeds: the data, model, DP-SGD
    set-up, run seed, initial parameters, batch mates, trainer code and the device kind (a
    seed trains the same model only on the same kind of device, torch and CUDA)."""
    from dataclasses import asdict

    from ...device import reproduce_key
    from ...io import array_digest

    return {"audit": "tight-whitebox", "model": asdict(model), "dpsgd": asdict(cfg),
            "seed": int(seed), "data_sha256": array_digest({"X": X, "y": y}),
            "init_sha256": None if init is None else init.digest(), "mates": float(mates),
            "trainer": trainer_digest(), "device": reproduce_key(device)}


def whitebox_scores(X, y, model: dpsgd.ModelSpec, cfg: dpsgd.DPSGDConfig, runs: int,
                    seed: int, init: dpsgd.Params | None = None, mates: float = 0.0,
                    execution: trials.Execution = trials.Execution()) -> dict:
    """Train ``runs`` models per side on ``(X, y)`` by DP-SGD (``cfg``), the canary
    (:func:`canary`) inserted on the ``"in"`` side (with crafted batch ``mates``,
    :class:`dpaudit.dpsgd.GradientCanaries`); both sides' runs share the wide calls,
    ``execution.per_call`` models each (default :func:`dpaudit.dpsgd.seeds_per_call` within
    blocks of :func:`dpaudit.dpsgd.seeds_per_block`), and a run's draws depend on its seed
    alone. Returns ``{side: {score: (runs,) float64}}`` with scores ``"llr"`` (None without
    noise, where it is undefined) and ``"dot_sum"`` (module docstring). With
    ``execution.store`` (a folder), each block's runs are kept there under
    :func:`store_key` and a rerun restores them (checked: key, trials, seeds, columns,
    content hash) and trains the rest."""
    device, per_call, store = execution.device, execution.per_call, execution.store
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    sides = run_seeds(runs, seed, model.arch)
    # Sides alternate (run r of "in" at 2r, of "out" at 2r + 1), so every call trains both
    # and a partial run is balanced.
    all_seeds = [s for pair in zip(sides["in"], sides["out"]) for s in pair]
    if per_call is not None and (isinstance(per_call, bool)
                                 or not isinstance(per_call, (int, np.integer)) or per_call < 1):
        raise ValueError(f"per_call={per_call!r}: must be an integer >= 1")
    direction = canary(X.numpy(), model, cfg.clip, seed, device=device)

    def train_score(_, start: int, chunk: list[int]) -> dict:
        # A block's runs in as few calls as the memory holds (one on the CPU).
        k = per_call or dpsgd.seeds_per_call(model, len(X), cfg, limit=len(chunk), device=device)
        got = {"dot_sum": [], "llr": []}
        for at in range(0, len(chunk), k):
            part = chunk[at:at + k]
            included = torch.tensor([(start + at + i) % 2 == 0 for i in range(len(part))])
            run = dpsgd.train(X, y, model, cfg, part, init=init, device=device,
                              canaries=dpsgd.GradientCanaries(direction, included.view(-1, 1),
                                                              mates=mates))
            got["dot_sum"].append(run.scores[:, 0].cpu().numpy())
            if run.llr is not None:
                got["llr"].append(run.llr[:, 0].cpu().numpy())
        return {name: np.concatenate(v) for name, v in got.items() if v}

    key = None if store is None else store_key(X, y, model, cfg, seed, init, device, mates)
    block = per_call or dpsgd.seeds_per_block(1, device, len(all_seeds))
    table = trials.run([trials.Side("in/out", all_seeds)], train_score, int(block),
                       execution.log, execution.what, store=store, key=key)
    return {side: {"llr": table.llr.to_numpy()[part] if "llr" in table else None,
                   "dot_sum": table.dot_sum.to_numpy()[part]}
            for side, part in (("in", slice(0, None, 2)), ("out", slice(1, None, 2)))}


def audit_scores(pos, neg, alpha: float, delta: float, select_frac: float = 0.5) -> dict:
    """The bounds of one score's runs (module docstring): ``pos`` the D1 side, ``neg`` D0,
    each in run order."""
    halves = bounds.split_trials(pos, neg, select_frac)  # select, select, eval, eval
    cp = bounds.threshold_holdout_audit(
        *halves, partial(bounds.eps_lb_clopper_pearson, delta=delta), alpha)
    gdp = bounds.threshold_holdout_audit(*halves, bounds.mu_lb_gdp, alpha)
    return {"eps_lb": float(cp.value), "certified": True, "mu_lb": float(gdp.value),
            "eps_lb_gdp": bounds.eps_gdp_estimate(gdp.value, delta),
            "tpr": cp.ct_pos / cp.n_pos, "fpr": cp.ct_neg / cp.n_neg,
            "auc": bounds.auc(halves[2], halves[3]), "threshold": cp.threshold,
            "ct_eval_pos": cp.ct_pos, "n_eval_pos": cp.n_pos, "ct_eval_neg": cp.ct_neg,
            "n_eval_neg": cp.n_neg}


def method_rows(scores: dict, runs: int, alpha: float, delta: float,
                select_frac: float = 0.5) -> list[dict]:
    """One row per method of :data:`METHODS` whose score :func:`whitebox_scores` gave (only
    ``whitebox-dot-sum`` without noise): ``method``, ``threat_model``, ``eps_lb``,
    ``certified``, ``runs`` (per side) and the rest of :func:`audit_scores`."""
    rows = []
    for method, key in (("whitebox-llr", "llr"), ("whitebox-dot-sum", "dot_sum")):
        if scores["in"][key] is None:
            continue
        stats = audit_scores(scores["in"][key], scores["out"][key], alpha, delta, select_frac)
        rows.append({"method": method, "threat_model": METHODS[method],
                     "eps_lb": stats.pop("eps_lb"), "certified": stats.pop("certified"),
                     "runs": int(runs), **stats})
    return rows


def theoretical_eps(cfg: dpsgd.DPSGDConfig, n: int, delta: float) -> tuple[float, float]:
    """``(eps_th, eps_rdp)`` of the canary's add/remove relation at ``delta``: the PLD and
    ``rdp_classic`` eps of T = ``cfg.steps(n)`` Gaussian steps (noise multiplier
    ``cfg.noise_multiplier``) Poisson-subsampled at q = B / n; ``inf`` without noise."""
    from ... import accounting  # dp_accounting takes ~1 s to import: only where needed

    if cfg.noise_multiplier == 0:
        return math.inf, math.inf
    q, T = cfg.batch_size / n, cfg.steps(n)
    return (accounting.epsilon(cfg.noise_multiplier, q, T, delta, "pld"),
            accounting.epsilon(cfg.noise_multiplier, q, T, delta, "rdp_classic"))


def hidden_cell(model: dpsgd.ModelSpec) -> str:
    """The hidden widths as a table cell: "" for "lr", "32", "384x384"."""
    if model.arch == "lr":
        return ""
    widths = model.hidden if isinstance(model.hidden, tuple) else (model.hidden,)
    return "x".join(str(int(w)) for w in widths)


def audit(X, y, model: dpsgd.ModelSpec, cfg: dpsgd.DPSGDConfig, runs: int, seed: int,
          alpha: float, delta: float, select_frac: float = 0.5,
          init: dpsgd.Params | None = None,
          execution: trials.Execution = trials.Execution()) -> list[dict]:
    """The white-box audit of DP-SGD ``cfg`` on ``(X, y)``: one row (dict) per method of
    :data:`METHODS` (only ``whitebox-dot-sum`` without noise), with the set-up, the
    theoretical eps of the add/remove relation (``eps_th`` PLD, ``eps_rdp``; ``inf``
    without noise) and the bounds of :func:`audit_scores`; ``eps_lb_ratio`` = eps_lb /
    eps_th, how tight the audit is. The arguments are checked before any training;
    ``execution`` as in :func:`whitebox_scores`."""
    for name, value in (("alpha", alpha), ("select_frac", select_frac)):
        if not isinstance(value, (int, float)) or not 0 < value < 1:
            raise ValueError(f"{name}={value!r}: must be in (0, 1)")
    if not isinstance(delta, (int, float)) or not 0 <= delta < 1:
        raise ValueError(f"delta={delta!r}: must be in [0, 1)")
    scores = whitebox_scores(X, y, model, cfg, runs, seed, init, execution=execution)
    n = len(X)
    eps_th, eps_rdp = theoretical_eps(cfg, n, delta)
    setup = {"eps_rdp": eps_rdp, "arch": model.arch, "hidden": hidden_cell(model), "n": n,
             "noise": float(cfg.noise_multiplier), "clip": float(cfg.clip),
             "q": cfg.batch_size / n, "steps": cfg.steps(n), "sampling": cfg.sampling,
             "init": cfg.init, "alpha": float(alpha), "delta": float(delta),
             "select_frac": float(select_frac), "seed": int(seed)}
    rows = []
    for row in method_rows(scores, runs, alpha, delta, select_frac):
        rows.append({"method": row.pop("method"), "threat_model": row.pop("threat_model"),
                     "relation": RELATION, "eps_th": eps_th, **row, **setup})
        rows[-1]["eps_lb_ratio"] = rows[-1]["eps_lb"] / eps_th  # 0 where eps_th is inf
    return rows


__all__ = ["METHODS", "RELATION", "canary", "run_seeds", "trainer_digest", "store_key",
           "whitebox_scores", "audit_scores", "method_rows", "theoretical_eps", "hidden_cell",
           "audit"]
