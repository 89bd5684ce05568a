"""Black-box audit of DP-SGD from worst-case initial parameters (Annamalai and De
Cristofaro 2024, "Nearly Tight Black-Box Auditing of Differentially Private Machine
Learning"; code ``spalabucr/bb-audit-dpsgd``).

Threat model: the auditor sees only the final model, but chooses the initial parameters,
which DP-SGD's privacy analysis allows to be anything fixed in advance. The worst case it
chooses is a model pre-trained without noise on auxiliary data (the first rows of the task,
disjoint from the audited ones): the audited rows then have small gradients and the
canary's gradient stands out (:func:`worst_case_init`). The canary (:func:`canary`) is a
blank (all-zero) input, or the task's ClipBKD point, labelled with the class the initial
model finds least likely, so its gradient is large.

Mechanism audited: full-batch DP-SGD, the paper's setting (every row at every step, sample
rate 1): ``theta_{t+1} = theta_t - eta (sum_{i in D} clip_C(grad_i) + N(0, sigma^2 C^2 I))``
for ``steps`` steps, the sum scaled by a step size ``eta`` that does not depend on |D|
(:class:`FullBatch`), so the analysis of add/remove neighbours applies unchanged. D0 is
the audited rows, D1 the same rows plus the canary: add/remove neighbours, drawn against
the add/remove eps (``eps_th``: the PLD accountant's, the tightest upper bound, as in
:mod:`.whitebox`, so a certified bound above it refutes the guarantee; ``eps_rdp``
Jagielski et al.'s ``rdp_classic`` beside it). With sample rate 1 the mechanism is exactly ``mu``-GDP with
``mu = sqrt(steps) / sigma`` (adaptive composition of Gaussian mechanisms of sensitivity C,
Dong, Roth and Su 2022), the reference the simulation tests draw ``mu_lb`` against.

Runs: ``runs`` models per side, on the wide trainer, each side's calls training every init
of :data:`INITS` as columns of one call (paired: run r of every init has the same noise).
Score: minus the final model's loss on the canary (higher = "in"). Statistics
(:mod:`dpaudit.bounds`), per init: the first half of each side's runs choose the threshold,
the second half give the certified Clopper-Pearson ``eps_lb`` at ``1 - alpha``, and the
GDP ``mu_lb`` at the same split; ``eps_lb_gdp`` (the eps of ``mu_lb``) is an estimate
(``certified`` False in its own row), as it assumes the Gaussian trade-off curve.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ... import accounting, bounds, dpsgd, seeds, trials
from ...device import reproduce_key, resolve
from ...io import array_digest, source_digest
from .. import jagielski

#: Initial parameters: ``worst-case`` (the auditor's pre-trained model, every run),
#: ``glorot`` (each run its own Glorot-normal draw, the usual average case).
INITS = ("worst-case", "glorot")
#: Canary inputs: an all-zero input, or the task's ClipBKD point (Jagielski et al. 2020).
CANARIES = ("blank", "clipbkd")
THREAT_MODEL = "black-box"
RELATION = "add/remove"
#: Pre-training of the worst-case init: plain SGD, batch 32 as the paper's MNIST setting,
#: but 50 epochs at lr 0.1 where it trains 5 at 0.01 on 30,000 rows: on FMNIST's 3,000
#: rows its setting leaves the model unsure of the data, whose gradients then answer the
#: noise and hide the canary (FMNIST logistic regression at eps 10, 200 runs per side, the
#: same seeds: AUC 0.80 against 0.89, certified eps_lb 0.05 against 1.02).
PRETRAIN = {"epochs": 50, "batch_size": 32, "lr": 0.1}
#: A clipping norm no per-example gradient of these models reaches: pre-training is plain SGD.
_NO_CLIP = 1e12


@dataclass(frozen=True)
class FullBatch:
    """Full-batch DP-SGD: ``steps`` steps of ``theta -= lr * (sum of the clipped gradients
    + N(0, (noise_multiplier * clip)^2 I))``; ``lr`` multiplies the sum, so the step does
    not depend on the number of rows (the paper's ``eta / B`` of a fixed ``B``)."""

    steps: int
    lr: float
    clip: float
    noise_multiplier: float

    def __post_init__(self):
        if isinstance(self.steps, bool) or int(self.steps) != self.steps or self.steps < 1:
            raise ValueError(f"FullBatch.steps={self.steps!r}: must be an integer >= 1")
        for name in ("lr", "clip"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"FullBatch.{name}={getattr(self, name)!r}: must be > 0 "
                                 f"and finite")
        if not 0 <= self.noise_multiplier < math.inf:
            raise ValueError(f"FullBatch.noise_multiplier={self.noise_multiplier!r}: must be "
                             f">= 0 and finite")

    def config(self, rows: int, init: str) -> dpsgd.DPSGDConfig:
        """The trainer's config on ``rows`` rows: one batch of every row per step (the
        trainer divides the sum by ``batch_size``, so its lr is ``lr * rows``)."""
        return dpsgd.DPSGDConfig(self.steps, rows, self.lr * rows, self.clip,
                                 self.noise_multiplier, "shuffle",
                                 "fixed" if init == "worst-case" else "glorot")

    def epsilons(self, delta: float) -> dict:
        """``eps_th`` (PLD) and ``eps_rdp`` (``rdp_classic``) of add/remove neighbours at
        sample rate 1."""
        eps = accounting.dpsgd_epsilons(self.noise_multiplier, 1.0, self.steps, delta)
        return {"eps_th": eps["eps_pld"], "eps_rdp": eps["eps_th"]}


@dataclass(frozen=True)
class Auditor:
    """What the auditor of :func:`audit` chooses: the initial parameters compared
    (``inits``, names of :data:`INITS`), the ``canary`` (:func:`canary`), the rows of the
    task that pre-train the worst-case init (``n_aux``) and the audited rows after them
    (``n``; :func:`split`), and the pre-training (``pretrain``, :func:`worst_case_init`)."""

    inits: tuple[str, ...] = INITS
    canary: str = "blank"
    n_aux: int | None = None
    n: int | None = None
    pretrain: dict | None = None

    def __post_init__(self):
        object.__setattr__(self, "inits", tuple(self.inits))
        inits = self.inits
        if not inits or any(i not in INITS for i in inits) or len(set(inits)) != len(inits):
            raise ValueError(f"inits={inits!r}: must be distinct names from {INITS}")
        if self.canary not in CANARIES:
            raise ValueError(f"canary kind={self.canary!r}: must be one of {CANARIES}")


def split(task: jagielski.Task, n_aux: int | None = None, n: int | None = None
          ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(aux, audited)``: the first ``n_aux`` rows of the task (default half) pre-train the
    worst-case init; the next ``n`` (default the rest) are D0. Disjoint, as in the paper."""
    total = len(task.X)
    n_aux = total // 2 if n_aux is None else n_aux
    n = total - n_aux if n is None else n
    if isinstance(n_aux, bool) or int(n_aux) != n_aux or n_aux < 1:
        raise ValueError(f"n_aux={n_aux!r}: must be an integer >= 1 (rows to pre-train on)")
    if isinstance(n, bool) or int(n) != n or n < 1 or n_aux + n > total:
        raise ValueError(f"n={n!r}: must be an integer >= 1 with n_aux + n <= {total} rows "
                         f"of the task (n_aux={n_aux})")
    aux = slice(0, n_aux)
    audited = slice(n_aux, n_aux + n)
    return (task.X[aux], task.y[aux]), (task.X[audited], task.y[audited])


def worst_case_init(task: jagielski.Task, model: dpsgd.ModelSpec, seed: int,
                    n_aux: int | None = None, pretrain: dict | None = None,
                    device=None) -> dpsgd.Params:
    """The auditor's initial parameters (one model): Glorot-normal weights pre-trained by
    plain SGD (no clipping, no noise; :data:`PRETRAIN` unless ``pretrain`` gives
    ``epochs``, ``batch_size``, ``lr``) on the first ``n_aux`` rows (:func:`split`),
    seeded by ``seed``. On the wide trainer (one model)."""
    (X, y), _ = split(task, n_aux)
    hp = {**PRETRAIN, **(pretrain or {})}
    unknown = set(hp) - set(PRETRAIN)
    if unknown:
        raise ValueError(f"pretrain: unknown keys {sorted(unknown)}; allowed {sorted(PRETRAIN)}")
    cfg = dpsgd.DPSGDConfig(hp["epochs"], min(hp["batch_size"], len(X)), hp["lr"], _NO_CLIP,
                            0.0, "shuffle")
    pre_seed = seeds.int_seeds(1, seed, "tight/blackbox/pretrain")
    return dpsgd.train(torch.as_tensor(X), torch.as_tensor(y), model, cfg, pre_seed,
                       device=device)


def canary(task: jagielski.Task, model: dpsgd.ModelSpec, init: dpsgd.Params,
           kind: str = "blank") -> tuple[np.ndarray, int]:
    """The canary ``(x (d,), label)``: an all-zero input (``blank``, the paper's) or the
    task's ClipBKD point (``clipbkd``), labelled with the class of the smallest logit of
    the initial model ``init`` (the largest loss gradient; the paper uses this label for
    its ClipBKD and fine-tuning canaries, and a fixed class, 9, for the blank one)."""
    if kind not in CANARIES:
        raise ValueError(f"canary kind={kind!r}: must be one of {CANARIES}")
    x = np.zeros(task.X.shape[1], np.float32) if kind == "blank" else \
        np.asarray(task.x_p, np.float32)
    z = dpsgd.logits(init, torch.as_tensor(x)[None].to(init.W[0].device), model)
    return x, int(torch.argmin(z[0, 0]).item())


def _method(init: str) -> str:
    return f"blackbox-{init}-init"


def _bounds(pos: np.ndarray, neg: np.ndarray, alpha: float, delta: float
            ) -> tuple[dict, dict]:
    """One init's certified row (Clopper-Pearson at the held-out threshold) and its GDP
    row (``mu_lb`` at its own held-out threshold, ``eps_lb`` its eps: an estimate)."""
    halves = bounds.split_trials(pos, neg, 0.5)  # select, select, eval, eval

    def cp(ct_pos, n_pos, ct_neg, n_neg, a):
        return bounds.eps_lb_clopper_pearson(ct_pos, n_pos, ct_neg, n_neg, a, delta, 1)

    auc = bounds.auc(*halves[2:])
    out = []
    for bound in (cp, bounds.mu_lb_gdp):
        got = bounds.threshold_holdout_audit(*halves, bound, alpha)
        out.append({"tpr": got.ct_pos / got.n_pos, "fpr": got.ct_neg / got.n_neg, "auc": auc,
                    "threshold": float(got.threshold), "value": float(got.value)})
    certified, gdp = out
    eps_lb, mu_lb = certified.pop("value"), gdp.pop("value")
    eps_gdp = bounds.eps_gdp_estimate(mu_lb, delta)
    extra = {"mu_lb": mu_lb, "eps_lb_gdp": eps_gdp}
    return ({**certified, "eps_lb": eps_lb, **extra, "certified": True},
            {**gdp, "eps_lb": eps_gdp, **extra, "certified": False})


def train_scores(X: np.ndarray, y: np.ndarray, model: dpsgd.ModelSpec, setting: FullBatch,
                 inits: tuple[str, ...], init: dpsgd.Params | None, x_c: np.ndarray,
                 y_c: int, run_seeds: list[int], per_call: int, device=None
                 ) -> dict[str, np.ndarray]:
    """Minus the canary's loss of the final model of every run of ``run_seeds`` on (X, y),
    for each init of ``inits`` (columns of one wide call per ``per_call`` seeds)."""
    cfgs = [setting.config(len(X), i) for i in inits]
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    xc, yc = torch.as_tensor(x_c)[None], torch.tensor([y_c])
    out = {i: [] for i in inits}
    for start in range(0, len(run_seeds), per_call):
        cols = dpsgd.train(Xt, yt, model, cfgs, run_seeds[start:start + per_call],
                           init=init if "worst-case" in inits else None, device=device)
        for i, params in zip(inits, cols):
            loss = dpsgd.losses(params, xc.to(params.W[0].device), yc, model)[:, 0]
            out[i].append(-loss.double().cpu().numpy())
    return {i: np.concatenate(v) for i, v in out.items()}


def trainer_digest() -> str:
    """SHA-256 of the code that turns a run's seed into its score (the trainer, the seed
    derivation, the trials loop and this module): kept batches of runs are reused only
    under the same digest."""
    return source_digest(dpsgd, seeds, trials, sys.modules[__name__])


def audit(task: jagielski.Task, model: dpsgd.ModelSpec, setting: FullBatch, runs: int,
          seed: int, auditor: Auditor = Auditor(), alpha: float = 0.05, delta: float = 1e-5,
          execution: trials.Execution = trials.Execution()) -> list[dict]:
    """The black-box audit: ``runs`` models per side (D0 = the audited rows, D1 = them plus
    the canary) for every init of ``auditor.inits``. Returns one row per init and bound kind
    (certified Clopper-Pearson, then the GDP estimate), each with ``method``,
    ``threat_model``, ``relation``, ``eps_th`` (add/remove, PLD), ``eps_rdp``, ``eps_lb``,
    ``certified``, ``runs`` (per side), ``mu_lb``, ``eps_lb_gdp``, ``tpr``, ``fpr``, ``auc``
    (the evaluation half), and what they were trained with. ``models_per_s``: training
    speed of the runs trained here (both sides, every init; NaN if all were restored).

    ``execution``: where the runs train and what is said (:func:`dpaudit.trials.run`);
    with its ``store`` (a folder), each block's runs (:func:`dpaudit.dpsgd.seeds_per_block`,
    ``per_call`` if given) are kept there under a key of everything they depend on (the
    audited rows, the canary, the initial model, the set-up, the trainer code, the device
    kind) and a rerun restores them (checked: key, trials, seeds, columns, content hash)
    and trains the rest."""
    _check_audit(auditor, runs, setting)
    inits, canary_kind = auditor.inits, auditor.canary
    per_call, dev = execution.per_call, resolve(execution.device)
    (X_aux, _), (X0, y0) = split(task, auditor.n_aux, auditor.n)
    t0 = time.perf_counter()
    start = worst_case_init(task, model, seed, len(X_aux), auditor.pretrain, dev)
    t_pre = time.perf_counter() - t0
    # The canary is fixed before any audited run, from the auditor's model: the same under
    # every init, so the inits are compared on one canary.
    x_c, y_c = canary(task, model, start, canary_kind)
    X1 = np.concatenate([X0, x_c[None]]).astype(np.float32)
    y1 = np.concatenate([y0, [y_c]]).astype(np.int64)
    data = {"D0": (X0, y0), "D1": (X1, y1)}
    trained = {"models": 0, "s": 0.0}

    def train_score(side: trials.Side, _, chunk: list[int]) -> dict:
        t = time.perf_counter()
        X, y = data[side.name]
        k = per_call or dpsgd.seeds_per_call(model, len(X), setting.config(len(X), "glorot"),
                                             len(inits), dev, len(chunk))
        got = train_scores(X, y, model, setting, inits, start, x_c, y_c, chunk, k, dev)
        trained["models"] += len(chunk) * len(inits)
        trained["s"] += time.perf_counter() - t
        return got

    # The initial model's digest covers its pre-training; the canary is in the data's.
    key = None if execution.store is None else {
        "audit": "tight-blackbox", "model": asdict(model), "setting": asdict(setting),
        "inits": list(inits), "seed": int(seed), "init_sha256": start.digest(),
        "data_sha256": array_digest({"X0": X0, "y0": y0, "x_c": x_c, "y_c": np.int64(y_c)}),
        "trainer": trainer_digest(), "device": reproduce_key(dev)}
    sides = [trials.Side(side, seeds.int_seeds(runs, seed, f"tight/blackbox/{side}"))
             for side in data]
    block = per_call or dpsgd.seeds_per_block(len(inits), dev, runs)
    table = trials.run(sides, train_score, block, execution.log, execution.what,
                       store=execution.store, key=key)
    scores = {side: {i: table.loc[table.side == side, i].to_numpy() for i in inits}
              for side in data}
    speed = trained["models"] / trained["s"] if trained["models"] else math.nan
    common = {"threat_model": THREAT_MODEL, "relation": RELATION, **setting.epsilons(delta),
              "runs": runs, "alpha": alpha, "delta": delta, "canary": canary_kind,
              "canary_label": y_c, "n": len(X0), "n_aux": len(X_aux), "arch": model.arch,
              "steps": setting.steps, "lr": setting.lr, "clip": setting.clip,
              "noise_multiplier": setting.noise_multiplier, "seed": seed,
              "models_per_s": speed, "pretrain_s": t_pre}
    rows = []
    for i in inits:
        certified, gdp = _bounds(scores["D1"][i], scores["D0"][i], alpha, delta)
        rows.append({"method": _method(i), "init": i, **common, **certified})
        rows.append({"method": _method(i) + "-gdp", "init": i, **common, **gdp})
    return rows


def _check_audit(auditor: Auditor, runs: int, setting) -> None:
    """ValueError, naming the argument, unless :func:`audit` can run with these."""
    if not isinstance(auditor, Auditor):
        raise ValueError(f"auditor: must be an Auditor, not {type(auditor).__name__}")
    if isinstance(runs, bool) or int(runs) != runs or runs < 4:
        raise ValueError(f"runs={runs!r}: must be an integer >= 4 (per side; half choose "
                         f"the threshold, half evaluate it)")
    if not isinstance(setting, FullBatch):
        raise ValueError(f"setting: must be a FullBatch, not {type(setting).__name__}")


def blackbox_noise(label: str, steps: int, delta: float) -> float:
    """The noise multiplier of full-batch DP-SGD (sample rate 1, ``steps`` steps) whose
    add/remove eps at ``delta`` by PLD is the eps label (the rows' ``eps_th``); 0 for
    ``inf``."""
    eps = float(label)
    return 0.0 if eps == math.inf else accounting.noise_multiplier(eps, 1.0, steps, delta,
                                                                   "pld")


__all__ = ["INITS", "CANARIES", "THREAT_MODEL", "RELATION", "PRETRAIN", "FullBatch", "Auditor",
           "split", "worst_case_init", "canary", "train_scores", "trainer_digest", "audit",
           "blackbox_noise"]
