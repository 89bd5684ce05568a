"""One-run audits of DP-SGD (Steinke, Nasr, Jagielski 2023; the f-DP analysis of
Mahloujifar, Melis, Chaudhuri 2025), on the FMNIST task of Jagielski et al. 2020.

One training run audits m canaries at once: canary j is included with probability 1/2
(independently), the model is trained once, every canary is scored (higher = "in"), the
auditor guesses the k highest "in" and the k lowest "out" for the at most 10 k of
:func:`dpaudit.bounds.guess_grid` (fixed in advance), and
:func:`dpaudit.bounds.one_run_sweep` turns the correct guesses into bounds. Canary types:

``input`` (black box)
    m training examples the model would not fit without them, added to the n = 6000
    training rows when included; score = minus the final model's loss on the canary. The
    repeats of a cell are trained at once and share one canary draw and inclusion.
    ``pca`` (the default): points along the m least-variance principal directions of the
    training data, at ClipBKD's norm, with random labels (ClipBKD's direction, many times
    over; at most d = 784 of them); ``mislabelled``: held-out images (the 2-class test
    split) with the other label. On the full FMNIST grid (24 epochs, eps_th = 8 and inf)
    pca certified a small positive bound in 5 of 12 runs, mislabelled in none of 60: a
    mislabelled image's loss depends more on the image than on its inclusion.
``dirac`` (white box)
    m gradient canaries of norm C, one coordinate each (Nasr et al. 2023), on the
    first-layer weights of the pixels with the least energy (their data gradients are
    smallest), added to the clipped gradient sum at each step where Poisson sampling at the
    data's rate B / n picks them (:class:`dpaudit.dpsgd.GradientCanaries`). Two threat
    models: ``last-iterate`` (score <theta_0 - theta_T, g_j>) and ``all-iterates`` (every
    update observed: the per-step likelihood ratio of "sampled at rate q" against "absent"
    under the Gaussian noise, :attr:`dpaudit.dpsgd.CanaryRun.llr`; without noise it is
    undefined and the last-iterate score is used).

Initialisation (``init``): every run draws its own Glorot-normal weights times a scale, or
all start from the one saved initialisation (``fixed``) that the many-model cells of
Jagielski et al. at ``fixed`` share.

Accounting (``eps_th`` by ``rdp_classic``, Jagielski et al.'s accountant, and ``eps_pld``):
training samples Poisson batches at rate B / N over the trained steps, N the rows of the
trained set: n plus the included input canaries (about n + m/2), or n with gradient
canaries, which are Poisson-sampled at B / n like each row; add/remove neighbours.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pandas as pd
import torch

from .. import bounds, dpsgd, seeds
from .jagielski import Task, theoretical_eps

INPUT_KINDS = ("mislabelled", "pca")


def input_count(task: Task, m: int, kind: str) -> int:
    """How many input canaries of ``kind`` a run gets: ``m``, or as many as the kind allows
    (``pca``: one per dimension; ``mislabelled``: one per held-out image)."""
    return min(m, task.X.shape[1] if kind == "pca" else len(task.X_test))


def input_canaries(task: Task, m: int, kind: str, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
    """m input canaries ``(X (m, d), y (m,))`` of ``kind`` (module docstring)."""
    if kind == "mislabelled":
        if not 2 <= m <= len(task.X_test):
            raise ValueError(f"m={m}: the mislabelled canaries need 2 <= m <= "
                             f"{len(task.X_test)} held-out images")
        pick = rng.choice(len(task.X_test), m, replace=False)
        return task.X_test[pick].astype(np.float32), 1 - task.y_test[pick]
    if kind == "pca":
        d = task.X.shape[1]
        if not 2 <= m <= d:
            raise ValueError(f"m={m}: the pca canaries need 2 <= m <= d={d} directions")
        Xc = task.X - task.X.mean(0)
        _, _, vt = np.linalg.svd(Xc.astype(np.float64), full_matrices=False)
        norm = float(np.linalg.norm(task.x_p))
        return (norm * vt[-m:]).astype(np.float32), rng.integers(0, 2, m)
    raise ValueError(f"kind={kind!r}: must be one of {INPUT_KINDS}")


def quiet_coordinates(X: np.ndarray, model: dpsgd.ModelSpec, count: int) -> np.ndarray:
    """First-layer weight coordinates (flattened layout) of the input features with the
    least mean square over the data, at least ``count`` of them: their data gradients
    (``x_i g``) are the smallest, so a Dirac canary there competes least with the data."""
    fan_out = model.shapes[0][1]
    order = np.argsort((np.asarray(X, np.float64) ** 2).mean(0), kind="stable")
    rows = order[:max(1, -(-count // fan_out))]
    return (rows[:, None] * fan_out + np.arange(fan_out)).ravel()


def _bounds(scores: np.ndarray, included: np.ndarray, max_k: int, delta: float,
            beta: float) -> dict:
    counts = bounds.guess_counts(scores, included, min(len(included) // 2, max_k))
    res = bounds.one_run_sweep(len(included), counts, delta, beta)
    out = {k: float(v) for k, v in res.items() if k not in ("best_k", "correct")}
    return {**out, "best_k": int(res["best_k"]), "r": 2 * int(res["best_k"]),
            "v": int(res["correct"])}


def audit_input(task: Task, model: dpsgd.ModelSpec, cfg: dpsgd.DPSGDConfig, m: int, kind: str,
                repeat_seeds: list[int], delta: float, beta: float, max_k: int,
                device=None, init: dpsgd.Params | None = None) -> list[dict]:
    """Black-box audits with input canaries: the runs of ``repeat_seeds`` trained at once on
    one canary draw and inclusion (from the first seed; the trainer takes one data set per
    call), each run with its own batches, noise and (Glorot) initialisation; ``init``: the
    shared initial weights of ``cfg.init == "fixed"``."""
    rng = seeds.rng(repeat_seeds[0], "input-canaries")
    Xc, yc = input_canaries(task, m, kind, rng)
    inc = rng.random(m) < 0.5
    X = torch.cat([torch.as_tensor(task.X), torch.as_tensor(Xc[inc])])
    y = torch.cat([torch.as_tensor(task.y), torch.as_tensor(yc[inc]).to(torch.int64)])
    params = dpsgd.train(X, y, model, cfg, repeat_seeds, init=init, device=device)
    losses = dpsgd.losses(params, torch.as_tensor(Xc).to(params.W[0].device),
                          torch.as_tensor(yc), model)
    scores = -losses.cpu().numpy().astype(np.float64)
    return [{"threat_model": "black-box", "seed": seed, "n": len(X),
             **_bounds(scores[k], inc, max_k, delta, beta)}
            for k, seed in enumerate(repeat_seeds)]


def audit_dirac(task: Task, model: dpsgd.ModelSpec, cfg: dpsgd.DPSGDConfig, m: int,
                repeat_seeds: list[int], delta: float, beta: float, max_k: int,
                device=None, init: dpsgd.Params | None = None) -> list[dict]:
    """White-box audits with Dirac gradient canaries: the runs of ``repeat_seeds`` trained
    at once (one model each), scored under both threat models; ``init`` as in
    :func:`audit_input`."""
    rng = seeds.rng(repeat_seeds[0], "dirac-canaries")
    dirs = dpsgd.dirac_canaries(model, m, cfg.clip, rng.integers(2**63),
                                quiet_coordinates(task.X, model, 2 * m), device=device)
    inc = torch.as_tensor(np.stack([seeds.rng(s, "dirac-inclusion").random(m) < 0.5
                                    for s in repeat_seeds]))
    X, y = torch.as_tensor(task.X), torch.as_tensor(task.y)
    # Poisson-sampled at B / n at every step, as the accounting assumes, whatever the
    # sampling of the rows (a rate given: not once an epoch under shuffled batches)
    run = dpsgd.train(X, y, model, cfg, repeat_seeds, init=init, device=device,
                      canaries=dpsgd.GradientCanaries(dirs, inc, cfg.batch_size / len(X)))
    # The summed step scores telescope to the last-iterate score <theta_0 - theta_T, g>;
    # without noise the per-step likelihood ratio is undefined and they stand in for it.
    scores = {"all-iterates": (run.scores if run.llr is None else run.llr).cpu().numpy(),
              "last-iterate": run.scores.cpu().numpy()}
    rows = []
    for threat, sc in scores.items():
        for k, seed in enumerate(repeat_seeds):
            rows.append({"threat_model": threat, "seed": seed, "n": len(X),
                         **_bounds(sc[k], inc[k].numpy(), max_k, delta, beta)})
    return rows


def audit_grid(task: Task, spec: dict, train: dict, seed: int, device=None,
               log: Callable[[str], None] | None = None,
               inits: dict[str, dpsgd.Params] | None = None) -> pd.DataFrame:
    """Every (arch, canary type, eps label, repeat) of the ``onerun`` config section
    ``spec``, with the DP-SGD set-up ``train`` (epochs, batch_size, lr, hidden, clip,
    noise table). ``inits``: with ``spec["init"] == "fixed"``, the saved initialisation of
    each arch. One row per run and threat model."""
    say = log or (lambda msg: None)
    fixed = spec["init"] == "fixed"
    missing = [a for a in spec["archs"] if a not in (inits or {})] if fixed else []
    if missing:
        raise ValueError(f"init 'fixed': no saved initialisation for the archs {missing}")
    rows, t0, trained = [], time.perf_counter(), 0
    m = spec["m"]
    for arch in spec["archs"]:
        model = dpsgd.ModelSpec(arch, task.X.shape[1], train["hidden"])
        init = inits[arch] if fixed else None
        for canary in spec["canaries"]:
            # Paired across eps: a repeat's seed (inclusions, batches, noise) depends on the
            # arch, the canary type and the repeat only.
            repeat_seeds = seeds.int_seeds(spec["repeats"], seed, f"onerun/{arch}/{canary}")
            for label in spec["eps"]:
                noise = float(train["noise"][label])
                # Poisson batches: what the accountant of eps_th assumes, for the input
                # canaries as for the data (gradient canaries are Poisson-sampled anyway).
                cfg = dpsgd.DPSGDConfig(train["epochs"], train["batch_size"], train["lr"],
                                        train["clip"], noise, "poisson",
                                        *(("fixed",) if fixed else ("glorot", spec["init"])))
                if canary == "input":
                    m_run = input_count(task, m, spec["input_kind"])
                    got = audit_input(task, model, cfg, m_run, spec["input_kind"],
                                      repeat_seeds, spec["delta"], spec["beta"], spec["max_k"],
                                      device, init)
                else:
                    m_run = m
                    got = audit_dirac(task, model, cfg, m, repeat_seeds, spec["delta"],
                                      spec["beta"], spec["max_k"], device, init)
                # The trained set: n rows, plus the included input canaries (one draw for
                # all repeats); canaries are add/remove neighbours, so no replace-one eps.
                n_acc = got[0]["n"]
                th = theoretical_eps(noise, n_acc, cfg, spec["delta"])
                th.pop("eps_pld_replace")
                trained += len(repeat_seeds)
                for i, row in enumerate(got):
                    rows.append({"arch": arch, "canary": canary,
                                 "input_kind": spec["input_kind"] if canary == "input" else "",
                                 "eps_label": label, "noise": noise, **th,
                                 "sample_rate": cfg.batch_size / n_acc,
                                 "steps": cfg.steps(n_acc), "m": m_run, "delta": spec["delta"],
                                 "beta": spec["beta"],
                                 "repeat": i % len(repeat_seeds), **row,
                                 "models_trained": 1})
                best = max(r["eps_lb"] for r in got)
                say(f"{arch} {canary} eps {label}: best eps_lb {best:.3f} (eps_th "
                    f"{th['eps_th']:.3g}); {trained} models in {time.perf_counter() - t0:.0f} s")
    return pd.DataFrame(rows)


__all__ = ["INPUT_KINDS", "input_count", "input_canaries",
           "quiet_coordinates", "audit_input", "audit_dirac", "audit_grid"]
